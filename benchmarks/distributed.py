"""Two processes (torchrun, gloo) against one, at the same global batch, on the tiny model: iterations per second and
the reward curve.

    .venv/bin/python benchmarks/distributed.py [--iterations 20] [--seeds 0 1 2] [--prompts-per-step 64]
                                               [--single-threads 1]

Each run is the command a user types, `rlnb train` (the README's defaults otherwise: GRPO, 8 samples per prompt,
LoRA) at a constant learning rate, once as `python -m rlnb.cli train` (one process, `--single-threads` torch threads)
and once as `torchrun --standalone --nproc_per_node 2 -m rlnb.cli train` (two processes of one thread each, half the
prompts per rank). The global batch is larger than the README's 16 prompts: at 16 prompts x 8 samples the tiny model's
step is bound by Python overhead per token, not by the batch, so halving the batch per process saves little.
Printed: seconds per iteration from `time/step_s` (rank 0's, which waits for the other rank in the all-reduce; the first
iteration left out), the speed-up, the sampled reward over the last quarter and the final greedy accuracy on 64
held-out sums, mean ± std over seeds; and the reward curve per iteration, averaged over seeds, every tenth iteration.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(seed: int, iterations: int, processes: int, threads: int, prompts: int, folder: Path) -> dict:
    "One `rlnb train` run in a subprocess; its metrics rows."
    out = folder / f"p{processes}-s{seed}"
    params = dict(seed=seed, num_iterations=iterations, prompts_per_step=prompts, lr_schedule="constant",
                  eval_every=iterations, eval_size=64,
                  output_dir=str(out), num_threads=threads if processes == 1 else 1)
    args = [a for k, v in params.items() for a in ("-p", k, str(v))]
    bin_dir = Path(sys.executable).parent
    launch = ([sys.executable, "-m", "rlnb.cli"] if processes == 1 else
              [str(bin_dir / "torchrun"), "--standalone", "--nproc_per_node", str(processes), "-m", "rlnb.cli"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([*launch, "train", *args], check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == processes, summary["world_size"]
    steps = [r for r in rows if "reward/mean" in r]
    tail = steps[-max(1, len(steps) // 4):]
    return {"s_per_it": statistics.mean(r["time/step_s"] for r in steps[1:]),
            "reward": statistics.mean(r["reward/mean"] for r in tail),
            "accuracy": [r for r in rows if "eval/accuracy" in r][-1]["eval/accuracy"],
            "curve": [r["reward/mean"] for r in steps]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--prompts-per-step", type=int, default=64, help="the global batch's prompts (8 samples each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--single-threads", type=int, default=1, help="torch threads of the one-process run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {p: [run(s, args.iterations, p, args.single_threads, args.prompts_per_step, Path(tmp))
                       for s in args.seeds] for p in (1, 2)}
    for p, rs in results.items():
        name = f"1 process ({args.single_threads} thread{'s' if args.single_threads > 1 else ''})" if p == 1 \
            else "2 processes (torchrun)"
        mean = {k: statistics.mean(r[k] for r in rs) for k in ("s_per_it", "reward", "accuracy")}
        sd = {k: statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0 for k in mean}
        print(f"{name:26s} {mean['s_per_it']:.3f} ± {sd['s_per_it']:.3f} s/it  reward (last quarter) "
              f"{mean['reward']:.3f} ± {sd['reward']:.3f}  accuracy {mean['accuracy']:.3f} ± {sd['accuracy']:.3f}")
    speed = statistics.mean(r["s_per_it"] for r in results[1]) / statistics.mean(r["s_per_it"] for r in results[2])
    print(f"iterations per second, 2 processes / 1: {speed:.2f}x")
    print("iteration  " + "  ".join(f"{'reward, ' + str(p) + ' proc':>16s}" for p in results))
    for i in range(0, args.iterations, max(1, args.iterations // 10)):  # the curve, every tenth of the run
        cells = [statistics.mean(r["curve"][i] for r in results[p]) for p in results]
        print(f"{i + 1:9d}  " + "  ".join(f"{c:16.3f}" for c in cells))


if __name__ == "__main__":
    main()
