"""The algorithm zoo, measured: every registered algorithm on the tiny model's addition task, same wall-clock budget.

Each (algorithm, seed) run is its own child process with one torch thread (OMP_NUM_THREADS=1, RLNB_NUM_THREADS=1),
calling `rlnb.quick_start_training(algorithm=NAME, num_iterations=10_000, max_seconds=SECONDS, eval_every=N,
eval_size=128, seed=SEED, output_dir=<a temp folder>)` plus that algorithm's settings from `SETTINGS` below. `--workers`
runs go side by side (on a 2-core machine use at most 2: each run is one thread). Recorded per run: every iteration's
sampled reward (the task's correctness over EVERY completion sampled in the iteration, including groups that dynamic
sampling dropped, so DAPO's number means the same as the others') with its wall-clock time, and the greedy held-out
accuracy every `--eval-every` iterations with its wall-clock time. Printed: a markdown table (mean +- std over seeds);
drawn: one PNG with two rows of panels (sampled reward and greedy accuracy against seconds of training).

    python benchmarks/algorithms.py                                  # all algorithms, 120 s each, seeds 0,1,2, 1 worker
    python benchmarks/algorithms.py --seconds 60 --seeds 0,1 --workers 2
    python benchmarks/algorithms.py --algorithms grpo,rloo --seconds 20 --seeds 0   # a quick look
    python benchmarks/algorithms.py --algorithms grpo --set grpo.learning_rate=5e-3  # change one setting

The budget is `TrainingConfig.max_seconds`: the loop stops after the first iteration that ends past it, and the
evaluations inside the loop count against it (the one before the first iteration does not). The time axis of the
curves is training seconds: the sum of the iterations' own times (`time/step_s`), evaluations left out. Results:
benchmarks/README.md.
"""
from __future__ import annotations
import argparse, importlib.util, json, math, os, platform, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed

# Per-algorithm settings on top of TrainingConfig's defaults (the README main job: tiny model, addition, 16 prompts x 8
# samples, 8 new tokens, LoRA r=8, AdamW at 2e-3 constant, one update per batch). Keys are TrainingConfig fields;
# anything else goes into `algorithm_options`. Every algorithm keeps its registered defaults otherwise (DAPO: clip
# 0.2/0.28, token-level loss, dynamic sampling with 3x over-sampling and up to 3 rounds, overlong buffer 4;
# REINFORCE++: beta 0.01; DPO: beta 0.1, best vs worst of each group).
SETTINGS: dict[str, dict] = {
    "grpo": dict(learning_rate=2e-3),  # the README main job's default
    "dr_grpo": dict(learning_rate=2e-3),  # same family as GRPO: same learning rate
    "rloo": dict(learning_rate=2e-3),  # GRPO's clipped loss with the leave-one-out baseline: same learning rate
    "dapo": dict(learning_rate=2e-3),  # GRPO's family: same learning rate
    "gspo": dict(learning_rate=2e-3),  # GRPO's family: same learning rate
    # batch baselines and DPO: their 20-iteration learning tests run at 5e-3 (tests/test_catalogue.py,
    # tests/test_dpo.py), but over 60 s (~400 iterations) 5e-3 collapsed them (REINFORCE and DPO to reward 0 on both
    # seeds, REINFORCE++ on one), while 2e-3 (REINFORCE, REINFORCE++) and 1e-3 (DPO) learned as well as GRPO; GRPO
    # itself at 5e-3 learned less (greedy 0.44 at 60 s vs 0.71 at 2e-3). Measured with this script; see
    # benchmarks/README.md, "The algorithm zoo".
    "reinforce": dict(learning_rate=2e-3),
    "reinforce++": dict(learning_rate=2e-3),
    # pairs come from groups: group_size >= 2, no micro-batches cutting groups
    "dpo": dict(learning_rate=1e-3, group_size=8, micro_batch_size=None),
    # GRPO's clipped loss with GAE advantages and a value head (vf_coef 0.1, lambda 0.95, no KL)
    "ppo": dict(learning_rate=2e-3),
    # advantage baselines (rlnb.baselines), each with GRPO's clipped loss: GRPO's learning rate, not tuned separately
    "maxrl": dict(learning_rate=2e-3),  # centred reward over the group mean
    "gdpo": dict(learning_rate=2e-3),  # the task's scalar reward is one component: GRPO's advantages, batch z-scored
    "remax": dict(learning_rate=2e-3),  # the greedy completion's reward as baseline (one greedy decode per prompt)
    # the policy losses of nbs/35_policy_losses.ipynb, with GRPO's learning rate (not tuned separately): CISPO (the
    # weight clipped, detached), SAPO (sigmoid gate), GMPO (geometric mean), DPPO (TV trust region, Dr. GRPO's
    # advantages and averaging, like dr_grpo), Clip-Cov and KL-Cov (the high-covariance tokens)
    "cispo": dict(learning_rate=2e-3),
    "sapo": dict(learning_rate=2e-3),
    "gmpo": dict(learning_rate=2e-3),
    "dppo": dict(learning_rate=2e-3),
    "clip_cov": dict(learning_rate=2e-3),
    "kl_cov": dict(learning_rate=2e-3),
    # GRPO's clipped loss with pass@k advantages (k=4 of each group of 8): GRPO's family, same learning rate
    "grpo_passk": dict(learning_rate=2e-3),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", default="",
                   help="comma-separated registered names ('' = every one in rlnb.algorithms.ALGORITHMS)")
    p.add_argument("--seconds", type=float, default=120.0,
                   help="wall-clock training budget of each run (TrainingConfig.max_seconds)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--workers", type=int, default=1,
                   help="runs in parallel, one torch thread each (at most the number of cores)")
    p.add_argument("--eval-every", type=int, default=20,
                   help="iterations between greedy evaluations (also one before the first iteration)")
    p.add_argument("--eval-size", type=int, default=128, help="held-out prompts per evaluation")
    p.add_argument("--set", action="append", default=[], metavar="ALGO.FIELD=VALUE",
                   help="change a setting, e.g. grpo.learning_rate=5e-3 or dapo.overlong_buffer=0 "
                        "(VALUE is JSON; repeatable)")
    p.add_argument("--plot", default=str(HERE / "algorithms.png"), help="PNG of the curves ('' = none)")
    p.add_argument("--json", default="", help="write every run (curves included) to this JSON file ('' = none)")
    p.add_argument("--keep", action="store_true",
                   help="keep the runs' output folders (metrics.jsonl, checkpoint) and print where")
    # internal: run one (algorithm, seed) and print JSON
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def settings_for(name: str, changes: list[str]) -> dict:
    "SETTINGS[name] with the --set changes for `name` applied; non-TrainingConfig fields go to algorithm_options."
    from rlnb.core import TrainingConfig
    out = dict(SETTINGS.get(name, {}))
    for change in changes:
        key, _, value = change.partition("=")
        algo, _, field = key.partition(".")
        if algo != name: continue
        try: value = json.loads(value)
        except json.JSONDecodeError: pass  # a plain string
        if field in TrainingConfig._fields: out[field] = value
        else: out.setdefault("algorithm_options", {})[field] = value
    return out


# ---------------------------------------------------------------------------------------------------------- one run
def run_one(spec: dict) -> dict:
    "In this (child) process: one quick_start_training run, with a logger that stamps every iteration and evaluation."
    import torch
    import rlnb
    from rlnb.tasks import get_task
    task = get_task("addition")
    sampled: list[float] = []  # the task's reward of every completion sampled since the last iteration ended

    def reward_fn(rollout):  # the task's own reward; also seen for groups that dynamic sampling drops
        r = task.reward_fn(rollout)
        sampled.append(float(r))
        return r

    iters, evals = [], []
    clock = dict(start=None, last=None, train_s=0.0)
    t_call = time.perf_counter()

    def logger(state, stats):
        now = time.perf_counter()
        m = stats.custom_metrics or {}
        # the first record: the evaluation before iteration 1 (the loop's clock starts here)
        if clock["start"] is None: clock["start"] = now
        wall = now - clock["start"]
        if "eval/accuracy" in m:
            # since the iteration's own record: the evaluation's time
            eval_s = None if state.iteration == 0 else now - clock["last"]
            evals.append(dict(iteration=state.iteration, wall_s=wall, train_s=clock["train_s"],
                              accuracy=m["eval/accuracy"], eval_s=eval_s))
        else:
            clock["train_s"] += m.get("time/step_s", 0.0)
            iters.append(dict(iteration=state.iteration, wall_s=wall, train_s=clock["train_s"],
                              step_s=m.get("time/step_s"),
                              sampled_reward=sum(sampled) / len(sampled) if sampled else None, sampled_n=len(sampled),
                              batch_reward=m.get("reward/mean"), zero_std_frac=m.get("reward/zero_std_frac"),
                              groups_generated=m.get("sampling/groups_generated"), kl=m.get("kl/mean")))
            sampled.clear()
        clock["last"] = now

    settings = spec["settings"]
    state, _ = rlnb.quick_start_training(algorithm=spec["algorithm"], num_iterations=10_000,
                                         max_seconds=spec["seconds"], eval_every=spec["eval_every"],
                                         eval_size=spec["eval_size"], seed=spec["seed"],
                                         output_dir=spec["output_dir"], reward_fn=reward_fn, logger=logger,
                                         progress=False, **settings)
    return dict(algorithm=spec["algorithm"], seed=spec["seed"], settings=settings, seconds=spec["seconds"],
                iterations=state.iteration, total_s=time.perf_counter() - t_call, threads=torch.get_num_threads(),
                iters=iters, evals=evals)


def launch(spec: dict) -> dict:
    "One run in a child process with one torch thread; its JSON result (or the error)."
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode or not line:
        return dict(algorithm=spec["algorithm"], seed=spec["seed"],
                    error=f"rc={proc.returncode}: {proc.stderr[-3000:]}")
    out = json.loads(line[-1][7:])
    out["process_s"] = time.perf_counter() - t
    return out


# ------------------------------------------------------------------------------------------------------------ report
def mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def std(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if len(xs) < 2: return 0.0
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def summarize(run: dict, k: int = 10) -> dict:
    "One run's numbers: sampled reward over the first/last k iterations, greedy accuracy at start, end and best, speed."
    r = [i["sampled_reward"] for i in run["iters"]]
    acc = [e["accuracy"] for e in run["evals"]]
    # the first includes warm-up
    steps = [i["step_s"] for i in run["iters"]][1:] or [i["step_s"] for i in run["iters"]]
    eval_s = [e["eval_s"] for e in run["evals"] if e["eval_s"] is not None]
    return dict(reward_start=mean(r[:k]), reward_end=mean(r[-k:]), acc_start=acc[0] if acc else float("nan"),
                acc_end=acc[-1] if acc else float("nan"), acc_best=max(acc) if acc else float("nan"),
                iterations=run["iterations"], s_per_it=mean(steps),
                train_s=run["iters"][-1]["train_s"] if run["iters"] else 0.0, eval_s=sum(eval_s),
                completions_per_it=mean([i["sampled_n"] for i in run["iters"]]))


COLUMNS = [("sampled reward, first 10 it", "reward_start", "{:.3f}"),
           ("sampled reward, last 10 it", "reward_end", "{:.3f}"),
           ("greedy acc, start", "acc_start", "{:.3f}"), ("greedy acc, end", "acc_end", "{:.3f}"),
           ("greedy acc, best", "acc_best", "{:.3f}"),
           ("iterations", "iterations", "{:.0f}"), ("s / iteration", "s_per_it", "{:.3f}"),
           ("completions / it", "completions_per_it", "{:.0f}"),
           ("training s (evals s)", "train_s", "{:.0f}")]


def table(by_algo: dict[str, list[dict]]) -> str:
    "The markdown table: mean +- std over seeds of every column, one row per algorithm."
    head = "| algorithm (lr) | " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (len(COLUMNS) + 1)]
    for name, runs in by_algo.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            lines.append(f"| {name} | failed: {runs[0]['error'][:80]!r} |"); continue
        sums = [summarize(r) for r in ok]
        cells = []
        for _, key, f in COLUMNS:
            vals = [s[key] for s in sums]
            cell = f.format(mean(vals)) + (" ± " + f.format(std(vals)) if len(vals) > 1 else "")
            if key == "train_s": cell += f" ({mean([s['eval_s'] for s in sums]):.0f})"
            cells.append(cell)
        lr = ok[0]["settings"].get("learning_rate", 2e-3)
        lines.append(f"| {name} ({lr:g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed_lines(by_algo: dict[str, list[dict]]) -> str:
    out = []
    for name, runs in by_algo.items():
        for r in runs:
            if "error" in r: out.append(f"{name:12s} seed {r['seed']}: FAILED {r['error'][-300:]}"); continue
            s = summarize(r)
            out.append(f"{name:12s} seed {r['seed']}: reward {s['reward_start']:.3f} -> {s['reward_end']:.3f} "
                       f"({s['reward_end'] / max(s['reward_start'], 1e-9):.2f}x), "
                       f"greedy acc {s['acc_start']:.3f} -> {s['acc_end']:.3f} (best {s['acc_best']:.3f}), "
                       f"{s['iterations']} it, {s['s_per_it']:.3f} s/it")
    return "\n".join(out)


def on_grid(points: list[tuple[float, float]], grid: list[float], hold: bool) -> list[float]:
    "Curve values (x ascending) at the grid's x: linear between points; NaN outside (or past the end unless `hold`)."
    out, j = [], 0
    for x in grid:
        while j + 1 < len(points) and points[j + 1][0] < x: j += 1
        if not points or x < points[0][0] or (x > points[-1][0] and not hold): out.append(float("nan")); continue
        if x >= points[-1][0]: out.append(points[-1][1]); continue
        (x0, y0), (x1, y1) = points[j], points[j + 1]
        out.append(y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1)
    return out


def smoothed(iters: list[dict], window_s: float) -> list[tuple[float, float]]:
    "Sampled reward averaged over the iterations of the last `window_s` training seconds, at each iteration's time."
    out, lo, acc, n = [], 0, 0.0, 0
    for i, it in enumerate(iters):
        acc += it["sampled_reward"]; n += 1
        while iters[lo]["train_s"] < it["train_s"] - window_s: acc -= iters[lo]["sampled_reward"]; n -= 1; lo += 1
        out.append((it["train_s"], acc / n))
    return out


def plot(by_algo: dict[str, list[dict]], args, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n, runs in by_algo.items() if any("error" not in r for r in runs)]
    family = [n for n in names if n in ("grpo", "dr_grpo", "rloo", "dapo", "gspo")]
    others = [n for n in names if n not in family]
    groups = [g for g in ([family, (["grpo"] if "grpo" in names and others else []) + others] if others else [family])
              if g]
    titles = ["GRPO and its variants (group baselines, clipped ratio)",
              "batch baselines and online DPO (GRPO for reference)"]
    fig, axes = plt.subplots(2, len(groups), figsize=(7.2 * len(groups), 8.4), squeeze=False)
    cmap = plt.get_cmap("tab10")
    color = {n: cmap(i % 10) for i, n in enumerate(names)}
    top = max(r["iters"][-1]["train_s"] for runs in by_algo.values() for r in runs if "error" not in r and r["iters"])
    grid = [top * i / 200 for i in range(201)]
    window = max(args.seconds / 20, 1.0)
    for col, group in enumerate(groups):
        ax, bx = axes[0][col], axes[1][col]
        for n in group:
            ok = [r for r in by_algo[n] if "error" not in r and r["iters"]]
            lr = ok[0]["settings"].get("learning_rate", 2e-3)
            for axis, curves, ylabel in (
                    (ax, [on_grid(smoothed(r["iters"], window), grid, hold=False) for r in ok], "sampled reward"),
                    (bx, [on_grid([(e["train_s"], e["accuracy"]) for e in r["evals"]], grid, hold=False) for r in ok],
                     "greedy accuracy")):
                m = [mean([c[i] for c in curves]) for i in range(len(grid))]
                s = [std([c[i] for c in curves]) for i in range(len(grid))]
                axis.plot(grid, m, color=color[n], lw=2,
                          label=f"{n} (lr {lr:g}, {len(ok)} seed{'s' if len(ok) > 1 else ''})")
                if len(ok) > 1:
                    axis.fill_between(grid, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                                      color=color[n], alpha=0.15, lw=0)
        ax.set(title=f"{titles[col] if len(groups) > 1 else 'all algorithms'}\n"
                     f"sampled reward (mean over the last {window:.0f} s of training)",
               ylabel="fraction of sampled completions correct", ylim=(0, 1))
        bx.set(title=f"greedy accuracy on {args.eval_size} held-out prompts",
               xlabel="training seconds (evaluations left out)", ylabel="greedy accuracy", ylim=(0, 1))
        for a in (ax, bx): a.grid(alpha=0.3); a.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Tiny model, addition: {args.seconds:g} s of training per run, 1 torch thread, "
                 f"{args.workers} run(s) at a time; mean ± std over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        import warnings; warnings.filterwarnings("ignore")
        print("RESULT " + json.dumps(run_one(json.loads(args.child))), flush=True)
        return
    import rlnb
    from rlnb.algorithms import ALGORITHMS
    names = [n for n in args.algorithms.split(",") if n] or list(ALGORITHMS)
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown: sys.exit(f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    cpus = os.cpu_count() or 1
    if args.workers > cpus:
        print(f"warning: {args.workers} workers on {cpus} cores: the runs will slow each other down")
    from rlnb.tiny import load_tiny_model
    load_tiny_model("addition", progress=False)  # build the cached SFT model once, before any child needs it
    tmp = Path(tempfile.mkdtemp(prefix="rlnb_algorithms_"))
    specs = [dict(algorithm=n, seed=s, seconds=args.seconds, eval_every=args.eval_every, eval_size=args.eval_size,
                  settings=settings_for(n, args.set), output_dir=str(tmp / f"{n}_seed{s}"))
             for s in seeds for n in names]
    load_start = os.getloadavg()
    import torch, transformers
    print(f"rlnb {getattr(rlnb, '__version__', '?')}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; {cpus} CPUs, "
          f"load average {load_start[0]:.2f} (1 min) at the start")
    print(f"{len(names)} algorithms x {len(seeds)} seeds, {args.seconds:g} s each, {args.workers} worker(s), "
          f"1 torch thread per run; "
          f"evaluation every {args.eval_every} iterations on {args.eval_size} prompts; runs in {tmp}", flush=True)
    t0 = time.perf_counter()
    results = []
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for r in pool.map(launch, specs):
            results.append(r)
            if "error" in r: print(f"  {r['algorithm']} seed {r['seed']}: FAILED\n{r['error']}", flush=True)
            else:
                s = summarize(r)
                print(f"  {r['algorithm']:12s} seed {r['seed']}: {s['iterations']:4d} it, {s['s_per_it']:.3f} s/it, "
                      f"reward {s['reward_start']:.3f} -> {s['reward_end']:.3f}, "
                      f"greedy acc {s['acc_start']:.3f} -> {s['acc_end']:.3f} (best {s['acc_best']:.3f})", flush=True)
    elapsed = time.perf_counter() - t0
    load_end = os.getloadavg()
    by_algo = {n: [r for r in results if r["algorithm"] == n] for n in names}
    print(f"\n{elapsed:.0f} s in all; load average {load_start[0]:.2f} at the start, "
          f"{load_end[0]:.2f} at the end (1 min)\n")
    print(table(by_algo))
    print("\n" + per_seed_lines(by_algo))
    if args.plot:
        plot(by_algo, args, args.plot); print(f"\nplot: {args.plot}")
    if args.json:
        info = dict(args=vars(args), settings={n: settings_for(n, args.set) for n in names}, cpus=cpus,
                    versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                                  python=platform.python_version()),
                    load_average=dict(start=load_start, end=load_end), elapsed_s=elapsed,
                    summary={n: [summarize(r) for r in runs if "error" not in r] for n, runs in by_algo.items()},
                    runs=results)
        Path(args.json).write_text(json.dumps(info, indent=1, default=str)); print(f"json: {args.json}")
    if args.keep: print(f"run folders kept in {tmp}")
    else:
        import shutil; shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
