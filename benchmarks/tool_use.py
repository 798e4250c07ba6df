"""The tool-use task, measured: RL from the brief SFT start for a budget of CPU time, three seeds.

Each seed is its own child process with one torch thread (OMP_NUM_THREADS=1, RLNB_NUM_THREADS=1). It loads the SFT'd
model (`rlnb.load_tool_use_model()`: the tiny addition model after SFT on calculator demonstrations, stopped once
half-learned, cached),
measures it on held-out prompts (`evaluate_tool_use`: 128 prompts x 2 sampled episodes, temperature 1), trains with
`quick_start_training(tool_use_config(seed=SEED, num_iterations=10_000), rollout_fn=create_tool_use_rollout_fn(), ...)`
until the process has used `--cpu-seconds` of CPU time (time.process_time, rollouts included; the first iteration
that ends past it is the last), and measures the same held-out episodes again. CPU time, not wall time, is the budget
because the benchmark machine may be shared; both are printed, with the iterations done.

    python benchmarks/tool_use.py                          # 3 seeds, 180 CPU-seconds each, 1 worker
    python benchmarks/tool_use.py --seeds 0 --cpu-seconds 30   # a quick look
    python benchmarks/tool_use.py --workers 2              # two seeds side by side (one thread each)

Printed per seed: held-out reward at the SFT start and at the end, their ratio, sampled reward over the first and
last 10 iterations, tool calls per episode, first calls with the prompt's expression, replies copying the tool's
answer; then mean +- std over seeds.
"""
from __future__ import annotations
import argparse, importlib.util, json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated RL seeds (the SFT model is the same for all)")
    p.add_argument("--cpu-seconds", type=float, default=180.0, help="CPU seconds of each RL loop (rollouts included)")
    p.add_argument("--workers", type=int, default=1, help="runs in parallel, one torch thread each (at most the cores)")
    p.add_argument("--eval-prompts", type=int, default=128, help="held-out prompts (2 episodes each), start and end")
    p.add_argument("--json", default="", help="write every run (curves included) to this JSON file ('' = none)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: run one seed and print JSON
    return p.parse_args(argv)


def run_one(spec: dict) -> dict:
    "In this (child) process: evaluate the SFT start, RL for the CPU budget, evaluate again."
    import torch
    import rlnb
    from _common import setup_torch
    setup_torch(1)
    model, tokenizer = rlnb.load_tool_use_model()
    start = rlnb.evaluate_tool_use(model, tokenizer, n=spec["eval_prompts"])
    cpu0, wall0 = time.process_time(), time.perf_counter()
    over = lambda state, metrics: time.process_time() - cpu0 >= spec["cpu_seconds"]
    task = rlnb.products_task()
    config = rlnb.tool_use_config(seed=spec["seed"], num_iterations=10_000)
    prompts = task.sample(20_000, seed=spec["seed"])
    state, metrics = rlnb.quick_start_training(config, model=model, tokenizer=tokenizer, prompts=prompts, stop_fn=over,
                                               rollout_fn=rlnb.create_tool_use_rollout_fn(), progress=False)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    end = rlnb.evaluate_tool_use(state.model, tokenizer, n=spec["eval_prompts"])
    cols = ["reward/mean", "tools/calls_per_episode", "tool_use/right_call", "tool_use/copied_result"]
    return dict(seed=spec["seed"], start=start, end=end, iterations=int(state.iteration), cpu_s=cpu_s, wall_s=wall_s,
                threads=torch.get_num_threads(), curves={c: metrics[c].tolist() for c in cols})


def launch(spec: dict) -> dict:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])  # `_common` importable in the child
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    command = [sys.executable, __file__, "--child", json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode or not line: return dict(seed=spec["seed"], error=f"rc={proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def mean_std(xs: list[float]) -> str:
    m = sum(xs) / len(xs)
    s = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {s:.3f}"


def report(runs: list[dict]) -> str:
    lines, rows = [], []
    for r in runs:
        if "error" in r: lines.append(f"seed {r['seed']}: FAILED {r['error'][-400:]}"); continue
        rew = r["curves"]["reward/mean"]
        start, end = r["start"]["reward"], r["end"]["reward"]
        row = dict(start=start, end=end, ratio=end / max(start, 1e-9),
                   first10=sum(rew[:10]) / len(rew[:10]), last10=sum(rew[-10:]) / len(rew[-10:]),
                   calls_start=r["start"]["calls_per_episode"], calls_end=r["end"]["calls_per_episode"],
                   right_start=r["start"]["tool_use/right_call"], right_end=r["end"]["tool_use/right_call"],
                   copied_start=r["start"]["tool_use/copied_result"], copied_end=r["end"]["tool_use/copied_result"],
                   iterations=r["iterations"], cpu_s=r["cpu_s"], wall_s=r["wall_s"])
        rows.append(row)
        arrow = lambda key, f="{:.2f}": f"{f.format(row[key + '_start'])} -> {f.format(row[key + '_end'])}"
        lines.append(f"seed {r['seed']}: held-out reward {row['start']:.3f} -> {row['end']:.3f} ({row['ratio']:.2f}x); "
                     f"sampled first/last 10 it {row['first10']:.3f} -> {row['last10']:.3f}; "
                     f"calls/episode {arrow('calls')}; "
                     f"right call {arrow('right')}; reply = tool answer {arrow('copied')}; "
                     f"{row['iterations']} it, {row['cpu_s']:.0f} CPU s, {row['wall_s']:.0f} wall s")
    if rows:
        keys = ("start", "end", "ratio", "calls_end", "right_end", "copied_end", "iterations", "cpu_s", "wall_s")
        lines.append("mean ± std over seeds: " + ", ".join(f"{k} {mean_std([r[k] for r in rows])}" for k in keys))
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(argv)
    if a.child is not None:
        print("RESULT " + json.dumps(run_one(json.loads(a.child)))); return
    import rlnb
    rlnb.load_tool_use_model()  # train and cache the SFT model once, before the children load it
    specs = [dict(seed=int(s), cpu_seconds=a.cpu_seconds, eval_prompts=a.eval_prompts) for s in a.seeds.split(",")]
    t = time.perf_counter()
    with ThreadPoolExecutor(a.workers) as pool: runs = list(pool.map(launch, specs))
    print(f"tool use: {len(specs)} seeds, {a.cpu_seconds:.0f} CPU-s each, {a.workers} worker(s), "
          f"{time.perf_counter() - t:.0f} s in all")
    print(report(runs))
    if a.json: Path(a.json).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
