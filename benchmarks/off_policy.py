"""One-step off-policy against the synchronous loop, on the tiny model: iterations per second and learning.

    .venv/bin/python benchmarks/off_policy.py [--iterations 100] [--seeds 0 1 2]

Each run is `train` with the README's defaults (GRPO, 16 prompts x 8 samples, LoRA) for `--iterations` iterations at
a constant learning rate, once with `off_policy_steps=0` (sample, then update) and once with `off_policy_steps=1`
(the next batch sampled in a thread while this one trains), one torch thread per side, so two cores can overlap
them. Printed: seconds per iteration (after the first, which builds what is cached), the sampled reward over the last
quarter, the final greedy accuracy on 64 held-out sums, and the off-policy run's mean mismatch KL (the lag).
"""
import argparse, statistics, time

from _common import setup_torch


def run(seed: int, iterations: int, off: int) -> dict:
    from rlnb import create_training_config, train
    rows, stamps = [], []
    config = create_training_config(num_iterations=iterations, seed=seed, off_policy_steps=off, lr_schedule="constant",
                                    eval_every=iterations, eval_size=64, num_threads=1)
    train(config, logger=lambda s, st: (rows.append(st.custom_metrics), stamps.append(time.perf_counter())),
          progress=False)
    steps = [r for r in rows if "reward/mean" in r]
    times = [t for r, t in zip(rows, stamps) if "reward/mean" in r]
    tail = steps[-max(1, len(steps) // 4):]
    return {"s_per_it": (times[-1] - times[0]) / (len(times) - 1),
            "reward": statistics.mean(r["reward/mean"] for r in tail),
            "accuracy": [r for r in rows if "eval/accuracy" in r][-1]["eval/accuracy"],
            "lag_kl": statistics.mean(r.get("mismatch/kl", 0.0) for r in steps[1:])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    setup_torch(1)
    results = {off: [run(seed, args.iterations, off) for seed in args.seeds] for off in (0, 1)}
    for off, rs in results.items():
        name = "off-policy (1 step)" if off else "synchronous"
        mean = {k: statistics.mean(r[k] for r in rs) for k in rs[0]}
        sd = {k: statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0 for k in rs[0]}
        print(f"{name:20s} {mean['s_per_it']:.3f} ± {sd['s_per_it']:.3f} s/it  reward (last quarter) "
              f"{mean['reward']:.3f} ± {sd['reward']:.3f}  accuracy {mean['accuracy']:.3f} ± {sd['accuracy']:.3f}  "
              f"lag KL {mean['lag_kl']:.2e}")
    speed = statistics.mean(r["s_per_it"] for r in results[0]) / statistics.mean(r["s_per_it"] for r in results[1])
    print(f"iterations per second, off-policy / synchronous: {speed:.2f}x")


if __name__ == "__main__":
    main()
