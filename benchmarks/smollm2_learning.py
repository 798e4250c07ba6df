"""Does GRPO teach SmolLM2-135M-Instruct on a CPU? Held-out greedy accuracy and form, before and after, over seeds.

Each seed trains `TrainingConfig(model="smollm2")` (2-digit sums asked in words, the reply to end with "The answer is
N.", reward = (correct + 0.5 form) / 1.5, GRPO + LoRA r=8) for at most `--minutes` of wall time, evaluating greedily on
the 64 held-out prompts every `--eval-every` iterations. The base model's figures are the iteration-0 evaluation (the
same prompts, greedy, so the same for every seed). Printed: per seed, accuracy and form at the start, at the end and
at the best evaluation; the target is form >= 0.9 and accuracy >= base + 0.10 at the same evaluation.

    python benchmarks/smollm2_learning.py                          # 3 seeds x 8 minutes, default threads
    python benchmarks/smollm2_learning.py --seeds 0 --minutes 3   # a quick look
    python benchmarks/smollm2_learning.py --iterations 15 --minutes 60 --mixed-precision bf16 --json b.json
    python benchmarks/smollm2_learning.py --compare float32=a.json bf16=b.json --plot benchmarks/smollm2_bf16.png
    .venv-vllm/bin/python benchmarks/smollm2_learning.py --iterations 15 --minutes 60 --mixed-precision bf16 \
        --generator vllm_bf16 --json c.json   # sampled by the bf16 vLLM engine

Results: benchmarks/README.md.
"""

from __future__ import annotations
import argparse, importlib.util, json, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None:
    sys.path.insert(0, str(HERE.parent))  # a checkout, not installed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (LoRA init, sampling, prompt stream)")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-time budget of each seed's training loop")
    p.add_argument(
        "--iterations", type=int, default=200, help="iterations at most (the time budget usually ends first)"
    )
    p.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=40, help="completion budget")
    p.add_argument("--lr", type=float, default=2e-4, help="learning rate (constant)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward pass (memory)")
    p.add_argument("--eval-every", type=int, default=5, help="iterations between greedy evaluations")
    p.add_argument("--dtype", default="auto", help="TrainingConfig.dtype")
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "auto"],
                   help="TrainingConfig.mixed_precision (bf16: the update's forwards under bf16 autocast)")
    p.add_argument("--generator", default="hf", help="TrainingConfig.generator (vllm_bf16: the bf16 vLLM engine)")
    p.add_argument("--plot", default=str(HERE / "smollm2_learning.png"), help="PNG of the curves ('' = none)")
    p.add_argument("--json", default="", help="write every measurement to this JSON file ('' = none)")
    p.add_argument("--compare", nargs="+", default=[], metavar="LABEL=JSON",
                   help="plot runs written by --json side by side (e.g. float32=a.json bf16=b.json) to --plot; "
                        "no training")
    return p.parse_args(argv)


def run_seed(args, seed: int) -> dict:
    "One training run; its evaluations and step metrics as lists of dicts."
    from rlnb.core import create_training_config
    from rlnb.loggers import metrics_record
    from rlnb.training import train

    config = create_training_config(
        model="smollm2",
        dtype=args.dtype,
        mixed_precision=args.mixed_precision,
        generator=args.generator,
        num_iterations=args.iterations,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        learning_rate=args.lr,
        lr_schedule="constant",
        micro_batch_size=args.micro_batch,
        eval_every=args.eval_every,
        eval_size=64,
        max_seconds=args.minutes * 60,
        seed=seed,
    )
    rows = []
    t0 = time.perf_counter()
    state = train(config, logger=lambda s, stats: rows.append(metrics_record(s, stats)), progress=False)
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "reward/mean" in r]
    ran = state.metadata["config"]._asdict()  # what the run ran with: its "auto" settings made concrete
    return dict(seed=seed, seconds=time.perf_counter() - t0, evals=evals, steps=steps, config=ran)


def summarise(run: dict) -> dict:
    "Start, end and best (form >= 0.9, highest accuracy) evaluations of one run."
    evals = run["evals"]
    start, end = evals[0], evals[-1]
    formed = [e for e in evals[1:] if e["eval/format"] >= 0.9]
    best = max(formed, key=lambda e: e["eval/accuracy"]) if formed else end
    train_s = sum(r["time/step_s"] for r in run["steps"])
    return dict(
        seed=run["seed"],
        iterations=len(run["steps"]),
        train_min=train_s / 60,
        s_per_it=train_s / len(run["steps"]),
        acc_start=start["eval/accuracy"],
        form_start=start["eval/format"],
        acc_end=end["eval/accuracy"],
        form_end=end["eval/format"],
        best_iteration=best["iteration"],
        acc_best=best["eval/accuracy"],
        form_best=best["eval/format"],
        target_met=best["eval/format"] >= 0.9 and best["eval/accuracy"] >= start["eval/accuracy"] + 0.10,
    )


def plot(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    for run in runs:
        it = [e["iteration"] for e in run["evals"]]
        axes[0].plot(
            [r["iteration"] for r in run["steps"]],
            [r["reward/mean"] for r in run["steps"]],
            lw=1,
            label=f"seed {run['seed']}",
        )
        axes[1].plot(it, [e["eval/accuracy"] for e in run["evals"]], "o-", label=f"seed {run['seed']}")
        axes[2].plot(it, [e["eval/format"] for e in run["evals"]], "s-", label=f"seed {run['seed']}")
    for ax, title in zip(axes, ["mean reward (samples)", "greedy accuracy, 64 held-out", "greedy replies in form"]):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=8)
    axes[1].set_ylim(0, 1)
    axes[2].set_ylim(0, 1.02)
    plt.tight_layout()
    plt.savefig(path, dpi=80)


def compare(pairs: list[str], path: str) -> None:
    "Mean reward per iteration and greedy accuracy per evaluation, over seeds, of each labelled --json file; printed."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for pair in pairs:
        label, _, file = pair.partition("=")
        runs = json.loads(Path(file).read_text())
        rewards = np.array([[r["reward/mean"] for r in run["steps"]] for run in runs])  # (seeds, iterations)
        accuracy = np.array([[e["eval/accuracy"] for e in run["evals"]] for run in runs])  # (seeds, evaluations)
        its, evals = np.arange(1, rewards.shape[1] + 1), [e["iteration"] for e in runs[0]["evals"]]
        line = axes[0].plot(its, rewards.mean(0), lw=2, label=f"{label} (mean of {len(runs)})")[0]
        axes[0].plot(its, rewards.T, lw=0.6, alpha=0.4, color=line.get_color())
        axes[1].errorbar(evals, accuracy.mean(0), yerr=accuracy.std(0, ddof=1), marker="o", capsize=3, label=label)
        print(f"{label}: reward of the last 5 iterations {rewards[:, -5:].mean(1).round(3)}, final greedy accuracy "
              f"{accuracy[:, -1].round(3)} (mean {accuracy[:, -1].mean():.3f} +- {accuracy[:, -1].std(ddof=1):.3f})")
    for ax, title in zip(axes, ["mean reward (samples)", "greedy accuracy, 64 held-out (mean, sd over seeds)"]):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=8)
    plt.tight_layout()
    plt.savefig(path, dpi=80)


def main(argv=None):
    args = parse_args(argv)
    if args.compare:
        compare(args.compare, args.plot)
        return
    import torch
    import pandas as pd
    from rlnb.step import default_num_threads

    print(
        f"torch {torch.__version__}, {default_num_threads(None)} thread(s) for a small model, "
        f"{torch.get_num_threads()} for SmolLM2 (default)",
        flush=True,
    )
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        runs.append(run_seed(args, seed))
        print(summarise(runs[-1]), flush=True)
    table = pd.DataFrame([summarise(r) for r in runs])
    print(table.round(3).to_string(index=False))
    if args.plot:
        plot(runs, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":
    main()
