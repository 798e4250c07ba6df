"""Off-policy (bounded staleness) against the synchronous loop: iterations per second and learning, same seeds.

    .venv/bin/python benchmarks/off_policy.py [--iterations 100] [--seeds 0 1 2]                 # the tiny model
    .venv-vllm/bin/python benchmarks/off_policy.py --model smollm2 --generator vllm_server --iterations 8 --seeds 0
    .venv-vllm/bin/python benchmarks/off_policy.py --model smollm2 --generator vllm_bf16 --iterations 12 --seeds 0
    .venv-vllm/bin/python benchmarks/off_policy.py --model smollm2 --correction tis_token --iterations 10 --seeds 0 1

Each run is `train` for `--iterations` iterations at a constant learning rate, once with `off_policy_steps=0` (sample,
then update) and once for each lag of `--lags` (default 1: the next batch sampled in a thread while this one trains),
one torch thread per side, so two cores can overlap them. `--generator vllm_server` starts a vLLM server on this
machine first (rlnb.vllm_server, from this Python: .venv-vllm) and samples from it: the sampler is then a process of
its own, and the thread only moves the adapter and waits on HTTP. The tiny model runs the README's defaults (GRPO, 16
prompts x 8 samples, LoRA); `--model smollm2` the chat task of chapter 56 (8 prompts x 8, 40 new tokens, T 0.7, lr
2e-4, micro-batches of 16). `--generator` picks the sampler (`TrainingConfig.generator`: hf, hf_bf16, vllm,
vllm_bf16, vllm_server; the vLLM ones need .venv-vllm), `--correction` the off-policy run's `rollout_correction` and
`--mixed-precision` both runs' `mixed_precision`. Printed: seconds per iteration (after the first, which builds what
is cached), the sampled reward over the last quarter, the final greedy accuracy on 64 held-out prompts, the mean
mismatch KL (the sampler's own, plus the lag when off-policy) and the seconds spent sampling a batch (in the thread
when off-policy).
"""
import argparse, statistics, time

from _common import setup_torch

SMOLLM2 = dict(model="smollm2", prompts_per_step=8, group_size=8, max_new_tokens=40, temperature=0.7,
               learning_rate=2e-4, micro_batch_size=16)  # chapter 56's run


def run(seed: int, iterations: int, off: int, args) -> dict:
    from rlnb import create_training_config, train
    rows, stamps = [], []
    model = SMOLLM2 if args.model == "smollm2" else {}
    config = create_training_config(num_iterations=iterations, seed=seed, off_policy_steps=off, lr_schedule="constant",
                                    eval_every=iterations, eval_size=64, num_threads=1, generator=args.generator,
                                    generator_url=args.url,
                                    rollout_correction=args.correction if off else "none",
                                    mixed_precision=args.mixed_precision, **model)
    train(config, logger=lambda s, st: (rows.append(st.custom_metrics), stamps.append(time.perf_counter())),
          progress=False)
    steps = [r for r in rows if "reward/mean" in r]
    times = [t for r, t in zip(rows, stamps) if "reward/mean" in r]
    tail = steps[-max(1, len(steps) // 4):]
    return {"s_per_it": (times[-1] - times[0]) / (len(times) - 1),
            "reward": statistics.mean(r["reward/mean"] for r in tail),
            "accuracy": [r for r in rows if "eval/accuracy" in r][-1]["eval/accuracy"],
            "lag_kl": statistics.mean(r.get("mismatch/kl", 0.0) for r in steps[1:]),
            "sampling_s": statistics.mean(r.get("time/sampling_s", r["time/rollout_s"]) for r in steps[1:])}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--generator", default="hf", choices=["hf", "hf_bf16", "vllm", "vllm_bf16", "vllm_server"])
    parser.add_argument("--lags", type=int, nargs="+", default=[1], help="the off_policy_steps to compare with 0")
    parser.add_argument("--correction", default="none", help="the off-policy run's rollout_correction")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"],
                        help="TrainingConfig.mixed_precision of both runs (bf16: the update's forwards in autocast)")
    args = parser.parse_args()
    setup_torch(1)
    server, args.url = None, None
    if args.generator == "vllm_server":  # the base model and LoRA rank that train() builds, served on localhost
        from rlnb import build_policy, create_training_config, start_vllm_server
        policy, tok = build_policy(create_training_config(**(SMOLLM2 if args.model == "smollm2" else {})))
        server = start_vllm_server(policy, tok, kv_cache_memory_bytes=2**29)
        args.url = server.url
        del policy
    try:
        results = {off: [run(seed, args.iterations, off, args) for seed in args.seeds] for off in (0, *args.lags)}
    finally:
        if server is not None: server.stop()
    for off, rs in results.items():
        name = f"off-policy ({off} step{'s' if off > 1 else ''}, {args.correction})" if off else "synchronous"
        mean = {k: statistics.mean(r[k] for r in rs) for k in rs[0]}
        sd = {k: statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0 for k in rs[0]}
        print(f"{name:30s} {mean['s_per_it']:.3f} ± {sd['s_per_it']:.3f} s/it  reward (last quarter) "
              f"{mean['reward']:.3f} ± {sd['reward']:.3f}  accuracy {mean['accuracy']:.3f} ± {sd['accuracy']:.3f}  "
              f"mismatch KL {mean['lag_kl']:.2e}  sampling {mean['sampling_s']:.2f} s/it")
    for off in args.lags:
        per_it = {lag: statistics.mean(r["s_per_it"] for r in results[lag]) for lag in (0, off)}
        speed = per_it[0] / per_it[off]
        print(f"{args.model}, generator {args.generator}: iterations per second, off_policy_steps={off} / "
              f"synchronous: {speed:.2f}x")


if __name__ == "__main__":
    main()
