"""SmolLM2's GRPO iteration on a busy CPU: seconds per iteration at load 0, 2 and 4 (that many processes spinning
beside the run), with rlnb's default threads against 1 and 2 threads, and OpenMP's own wait policy against the
passive one rlnb sets.

Each setting runs `rlnb train` in a fresh process with the README's SmolLM2 settings (8 prompts x 8 samples, 40 new
tokens, LoRA r=8, micro-batches of 16) and no evaluation; the figure is the median of `time/step_s` over iterations
2..N (the first warms caches). `--policy openmp` starts the run with OMP_WAIT_POLICY unset and torch imported before
rlnb, so OpenMP's default (spin a while, then sleep) applies; `passive` is what `import rlnb` sets.

    python benchmarks/threads.py                                        # loads 0 2 4 x threads default 1 2
    python benchmarks/threads.py --loads 4 --threads 2 --policy openmp passive --iterations 2

Results: benchmarks/README.md ("Threads under load").
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

SETTINGS = ["-p", "model", "smollm2", "-p", "prompts_per_step", "8", "-p", "max_new_tokens", "40",
            "-p", "temperature", "0.7", "-p", "learning_rate", "2e-4", "-p", "lr_schedule", "constant",
            "-p", "micro_batch_size", "16", "-p", "eval_every", "0"]
# a run whose OpenMP is loaded before rlnb can set its wait policy: OpenMP's own default applies
OPENMP_DEFAULT = "import sys, torch; from rlnb.cli import main; sys.exit(main(sys.argv[1:]))"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", type=int, nargs="+", default=[0, 2, 4], help="busy processes beside the run")
    p.add_argument("--threads", nargs="+", default=["default", "1", "2"], help="'default' = rlnb's choice")
    p.add_argument("--policy", nargs="+", default=["passive"], choices=["passive", "openmp"])
    p.add_argument("--iterations", type=int, default=3, help="iterations per run (the first is not counted)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a run may take before it is stopped")
    p.add_argument("--json", default="", help="write the measurements to this file")
    return p.parse_args(argv)


def spinners(n: int) -> list[subprocess.Popen]:
    "`n` processes that keep a core busy each (pure Python: no threads of their own)."
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run(threads: str, policy: str, iterations: int, timeout: float) -> dict:
    "One `rlnb train` run: its s/it (median after the first), the threads it used, the seconds to its first line."
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RLNB_NUM_THREADS", "OMP_WAIT_POLICY")}
    if policy == "passive": env["OMP_WAIT_POLICY"] = "PASSIVE"
    with tempfile.TemporaryDirectory() as out:
        args = [*SETTINGS, "-p", "num_iterations", str(iterations), "-p", "output_dir", out]
        if threads != "default": args += ["-p", "num_threads", threads]
        command = ([sys.executable, "-m", "rlnb.cli", "train"] if policy == "passive"
                   else [sys.executable, "-c", OPENMP_DEFAULT, "train"])
        t0 = time.time()
        try: done = subprocess.run(command + args, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired: return dict(seconds=time.time() - t0, s_per_it=None, error="timeout")
        rows = [json.loads(line) for line in open(Path(out) / "metrics.jsonl")] if done.returncode == 0 else []
        steps = [r["time/step_s"] for r in rows if "time/step_s" in r]
        median = statistics.median(steps[1:]) if len(steps) > 1 else None
        return dict(seconds=round(time.time() - t0, 1), s_per_it=median, steps=steps,
                    error=None if done.returncode == 0 else done.stderr[-500:])


def main(argv=None):
    args = parse_args(argv)
    results = []
    for load in args.loads:
        busy = spinners(load)
        try:
            time.sleep(5 if load else 0)  # let the load settle
            for policy in args.policy:
                for threads in args.threads:
                    r = dict(load=load, policy=policy, threads=threads,
                             **run(threads, policy, args.iterations, args.timeout))
                    results.append(r)
                    s = f"{r['s_per_it']:.1f} s/it" if r["s_per_it"] else r["error"]
                    print(f"load {load}  {policy:7s}  threads {threads:7s}  {s}  ({r['seconds']:.0f} s)", flush=True)
        finally:
            for p in busy: p.kill()
    idle = {(r["policy"], r["threads"]): r["s_per_it"] for r in results if r["load"] == 0 and r["s_per_it"]}
    print("\n| load | wait policy | threads | s/it | x idle |\n| --- | --- | --- | --- | --- |")
    for r in results:
        base = idle.get((r["policy"], r["threads"]))
        ratio = f"{r['s_per_it'] / base:.2f}" if base and r["s_per_it"] else "-"
        s = f"{r['s_per_it']:.1f}" if r["s_per_it"] else "-"
        print(f"| {r['load']} | {r['policy']} | {r['threads']} | {s} | {ratio} |")
    if args.json: Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
