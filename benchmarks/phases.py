"""Tokens per second in each phase of a GRPO step on SmolLM2-135M-Instruct, on a CPU: rlnb beside TRL's GRPOTrainer.

A step has three phases, timed the same way on both sides:
- **sampling**: the model generating the completions (rlnb: the `generator` hook, transformers' `generate` with the
  LoRA adapters folded in; TRL: `GRPOTrainer._generate`). Tokens = completion tokens generated.
- **scoring**: the passes without gradient before the update, here the reference's (adapters disabled). rlnb keeps
  that reference as `train` does under LoRA; at beta 0 the `rlnb_auto` side scores it every 25 iterations (`train`'s
  `eval_every`, to log `kl/mean`; the first, a warm-up, is left out of the means) and the other rlnb sides never;
  TRL loads none at beta 0. rlnb: `time/scoring_s`; TRL: its `_get_per_token_logps_and_entropies` calls inside
  `_generate_and_score_completions`. Tokens = the batch's prompt + completion tokens, no padding.
- **update**: the forward and backward passes and the optimizer step. rlnb: `time/update_s`; TRL: the step's time
  less `_generate_and_score_completions`. Tokens as for scoring.
What is left of the step (rewards, tokenizing, collating) is reported as "other".

The settings are those of benchmarks/vllm_step.py (the helpers of benchmarks/grpo_vs_trl.py: same model, task, chat
prompts, reward, LoRA r 8 on every linear projection, AdamW at a constant 2e-4, one torch thread), with --beta 0.04 by
default so that both sides run a reference pass. The `_bf16` sides, asked for by name, run the update's forwards under
bf16 autocast over float32 weights: rlnb's `mixed_precision="bf16"`, TRL's `bf16=True` (TRL's default, which the
float32 `trl` side turns off). The `rlnb_auto` side runs rlnb's defaults: `mixed_precision` and `generator` "auto"
(bf16 autocast where measured faster; the bf16 vLLM engine where vLLM is installed, as in .venv-vllm, else
transformers), and the correction `train` pairs with the sampler (`tis_token` for the engine). Each side runs in a
fresh child process, one after the other, for --steps steps; the first step (warm-up) is left out of the means. Each
phase also gets its **FLOP floor**: the arithmetic the phase cannot avoid, at the rate of the best one-thread float32
matmul measured in the same process. A forward pass costs 2 N FLOPs per token for N parameters, the backward through
frozen weights (LoRA) another 2 N; the floor counts each distinct prompt once and the completion tokens without
padding, so that work a trainer repeats (a prompt per row, padded positions) shows as distance from the floor.

    python benchmarks/phases.py                          # both sides, 6 steps each (~6 minutes on 2 cores)
    python benchmarks/phases.py --sides rlnb --steps 3   # a quick look
    python benchmarks/phases.py --sides rlnb,rlnb_bf16,trl,trl_bf16 --json benchmarks/phases_smollm2.json  # chapter 56
    python benchmarks/phases.py --sides rlnb,rlnb_bf16,rlnb_auto,trl_bf16 --beta 0 \
        --json benchmarks/phases_smollm2_defaults.json   # each library's defaults: rlnb_auto beside trl_bf16
    .venv-vllm/bin/python benchmarks/phases.py --sides rlnb_auto,trl_bf16 --beta 0 \
        --json benchmarks/phases_smollm2_defaults_vllm.json   # the same where vLLM is installed

Needs TRL (`pip install trl`, the venv's torch and transformers pinned). Results: benchmarks/README.md, "Tokens per
second, phase by phase"; chapter `56_grpo_smollm2` prints the recorded JSON.
"""
from __future__ import annotations
import argparse, importlib.util, json, os, platform, statistics, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
sys.path.insert(0, str(HERE))
from _common import add_step_arguments, run_side_in_child, setup_torch  # noqa: E402
import grpo_vs_trl as pair  # noqa: E402  the shared setup: model, task, prompts, reward, TRL's config

# asked for by name: rlnb_bf16 = TrainingConfig(mixed_precision="bf16"); trl_bf16 = GRPOConfig(bf16=True), TRL's
# default; rlnb_auto = rlnb's defaults: mixed_precision and generator "auto", the reference (beta 0) every eval_every
SIDES = ("rlnb", "rlnb_bf16", "rlnb_auto", "trl", "trl_bf16")
PARTNERS = {"rlnb": "trl", "rlnb_bf16": "trl_bf16", "rlnb_auto": "trl_bf16"}  # same precision; defaults with defaults
DEFAULT_SIDES = ("rlnb", "trl")
PHASES = ("sampling", "scoring", "update")


def describe_machine() -> dict:
    "The CPU (name, cores, torch's kernels, bf16 support) and the library versions: what the figures belong to."
    import torch, transformers
    try: info = open("/proc/cpuinfo").read()
    except OSError: info = ""
    names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    versions = dict(torch=torch.__version__, transformers=transformers.__version__)
    if importlib.util.find_spec("trl"): versions["trl"] = importlib.import_module("trl").__version__
    return dict(cpu=names[0] if names else platform.processor() or platform.machine(), cores=os.cpu_count(),
                kernels=torch.backends.cpu.get_cpu_capability(), avx512_bf16="avx512_bf16" in flags, **versions)


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    "The best rate of an (n, n) @ (n, n) float32 product at the current thread count, in GFLOP/s."
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def run_rlnb(args, task, prompts, mixed_precision: str = "no", eval_every: int = 0,
             generator: str = "hf") -> list[dict]:
    """rlnb's steps (`training_iteration`), sampling through a timed `generator` hook (a name in rlnb's SAMPLERS;
    "auto": the one `train` chooses here, with the correction it pairs with it), the update's forwards in
    `mixed_precision` ("auto": as `train` decides); at beta 0 the reference scores a step every `eval_every`
    iterations (0: never); one row of phase times a step, with the settings it ran with."""
    from rlnb.algorithms import find_algorithm
    from rlnb.generation import batch_generate
    from rlnb.logprobs import choose_mixed_precision
    from rlnb.rollout_corrections import choose_rollout_correction
    from rlnb.rollouts import create_rollout_fn
    from rlnb.step import SMALL_MODEL_PARAMS
    from rlnb.training import SAMPLERS, choose_generator, training_iteration
    ctx = pair.setup_rlnb(args, task, seed=0, ref_kind="lora")  # as `train` keeps it under LoRA, even at beta 0
    model = ctx["state"].model
    name = choose_generator(model) if generator == "auto" else generator
    settings = dict(mixed_precision=choose_mixed_precision(model, mixed_precision, SMALL_MODEL_PARAMS),
                    rollout_correction=choose_rollout_correction("auto" if generator == "auto" else "none",
                                                                 name != "hf", [find_algorithm(ctx["algo"]["name"])]))
    config = ctx["tcfg"]._replace(eval_every=eval_every, **settings)  # the config the steps read and the state records
    ctx["state"] = ctx["state"]._replace(metadata={**(ctx["state"].metadata or {}), "config": config})
    sampled = {}
    sample = SAMPLERS[name](config) or batch_generate  # None: transformers on the policy itself

    def timed_generator(model, tokenizer, prompt_texts, config):  # the sampler, timed
        t = time.perf_counter()
        out = sample(model, tokenizer, prompt_texts, config)
        sampled.update(s=time.perf_counter() - t, tokens=sum(len(g.token_ids) for g in out))
        return out
    rollout_fn = create_rollout_fn(task.reward_fn, generator=timed_generator, system_prompt=task.system_prompt)
    state, rows = ctx["state"], []
    for step in prompts:
        state, batch, stats = training_iteration(state, step, tokenizer=ctx["tok"], config=config,
                                                 rollout_fn=rollout_fn, algorithm_config=ctx["algo"])
        m = stats.custom_metrics
        distinct = {r.group_index: len(r.prompt_token_ids) for r in batch.rollouts}  # each prompt once
        rows.append(dict(step_s=m["time/step_s"], sampling_s=sampled["s"], scoring_s=m["time/scoring_s"],
                         update_s=m["time/update_s"], generated=sampled["tokens"], batch_tokens=m["tokens/batch"],
                         distinct_prompt_tokens=sum(distinct.values()), reward=m["reward/mean"], sampler=name,
                         **settings))
    return rows


def trl_instrument(record: dict):
    "Wrap a GRPOTrainer's sampling, scoring and generate-and-score calls with timers that write into `record`."
    def instrument(trainer):
        generate, score, generate_and_score = (trainer._generate, trainer._get_per_token_logps_and_entropies,
                                               trainer._generate_and_score_completions)

        def timed_generate(prompts):
            t = time.perf_counter()
            out = generate(prompts)
            record.update(sampling_s=time.perf_counter() - t, generated=sum(len(ids) for ids in out[1]))
            return out

        def timed_score(*a, **kw):  # also the update's own forward: only counted inside generate-and-score
            t = time.perf_counter()
            out = score(*a, **kw)
            if record.get("inside"): record["scoring_s"] = record.get("scoring_s", 0.0) + time.perf_counter() - t
            return out

        def timed_generate_and_score(*a, **kw):
            record.update(inside=True, scoring_s=0.0)
            t = time.perf_counter()
            try: out = generate_and_score(*a, **kw)
            finally: record["inside"] = False
            prompt_mask, completion_mask = out["prompt_mask"], out["completion_mask"]
            record.update(generate_and_score_s=time.perf_counter() - t,
                          batch_tokens=float(prompt_mask.sum() + completion_mask.sum()),
                          distinct_prompt_tokens=float(prompt_mask[::trainer.num_generations].sum()))
            record.setdefault("steps", []).append({k: v for k, v in record.items() if k not in ("inside", "steps")})
            return out
        trainer._generate, trainer._get_per_token_logps_and_entropies = timed_generate, timed_score
        trainer._generate_and_score_completions = timed_generate_and_score
    return instrument


def run_trl(args, task, prompts, bf16: bool = False) -> list[dict]:
    """TRL's GRPOTrainer steps with the phase timers, `bf16` its mixed precision (its default; the comparisons above
    turn it off); one row a step (the update = the step less generate-and-score)."""
    record = {}
    out = pair.run_trl(args, task, prompts, seed=0, instrument=trl_instrument(record), config_overrides=dict(bf16=bf16))
    rows = []
    for step_s, reward, phases in zip(out["step_s"], out["rewards"], record["steps"]):
        rows.append(dict(step_s=step_s, sampling_s=phases["sampling_s"], scoring_s=phases["scoring_s"],
                         update_s=step_s - phases["generate_and_score_s"], generated=phases["generated"],
                         batch_tokens=phases["batch_tokens"],
                         distinct_prompt_tokens=phases["distinct_prompt_tokens"], reward=reward))
    return rows


def measure_side(args, side: str) -> dict:
    "One side here: its rows, the model's parameter count and the matmul rate the floors use."
    setup_torch(args.threads)
    bench = pair.parse_args(["--model", "smollm2", "--prompts", str(args.prompts), "--group", str(args.group),
                             "--max-new-tokens", str(args.max_new_tokens), "--lr", "2e-4", "--temperature", "1.0",
                             "--beta", str(args.beta), "--steps", str(args.steps), "--threads", str(args.threads)])
    task = pair.create_task(bench)
    pair.check_text_reward(task)  # TRL's reward function = task.reward_fn
    prompts = [task.sample(args.prompts, seed=1000 + k) for k in range(args.steps)]
    rate = matmul_gflops()
    if side.startswith("trl"): rows = run_trl(bench, task, prompts, bf16=side == "trl_bf16")
    elif side == "rlnb_auto":  # rlnb's own defaults: TrainingConfig's mixed_precision, eval_every and generator
        from rlnb.core import TrainingConfig
        defaults = TrainingConfig()
        rows = run_rlnb(bench, task, prompts, defaults.mixed_precision, defaults.eval_every, defaults.generator)
    else: rows = run_rlnb(bench, task, prompts, "bf16" if side == "rlnb_bf16" else "no")
    params = sum(p.numel() for p in pair.load_policy(bench)[0].parameters())
    return dict(side=side, rows=rows, params=params, matmul_gflops=rate)


def summarize(out: dict) -> dict:
    "Means over the steps after the first: seconds, tokens per second and times the FLOP floor, per phase."
    rows, N, rate = out["rows"][1:], out["params"], out["matmul_gflops"] * 1e9
    mean = lambda key: statistics.mean(r[key] for r in rows)  # noqa: E731  means: the phases add up to the step
    work = mean("distinct_prompt_tokens") + mean("generated")  # each prompt once, the completions without padding
    floors = dict(sampling=2 * N * work / rate, scoring=2 * N * work / rate, update=4 * N * work / rate)
    table = {}
    for phase in PHASES:
        s = mean(f"{phase}_s")
        tokens = mean("generated") if phase == "sampling" else mean("batch_tokens")
        ran = s > 0.01  # scoring at beta 0: no pass, no rate
        table[phase] = dict(s=s, tokens=tokens, tokens_per_s=tokens / s if ran else None, floor_s=floors[phase],
                            x_floor=s / floors[phase] if ran else None)
    step = mean("step_s")
    table["other"] = dict(s=step - sum(table[p]["s"] for p in PHASES))
    table["step"] = dict(s=step, tokens=mean("batch_tokens"), tokens_per_s=mean("batch_tokens") / step)
    return table


def partners(sides) -> dict:
    "Each rlnb side -> the TRL side it is compared with: its PARTNERS entry if measured, else any TRL side measured."
    trl = [s for s in sides if s.startswith("trl")]
    return {s: PARTNERS[s] if PARTNERS[s] in trl else trl[0] for s in sides if s.startswith("rlnb") and trl}


def print_table(result: dict) -> None:
    "Phase by phase, each side's seconds, tokens per second and distance from the floor, then rlnb / TRL."
    sides = [s for s in SIDES if s in result["sides"]]
    pairs = partners(sides)
    print(f"{'phase':9}" + "".join(f"| {s:>9} s  tok/s  x floor " for s in sides)
          + "".join(f"| {a} / {b} " for a, b in pairs.items()))
    for phase in (*PHASES, "other", "step"):
        seconds = {s: result["sides"][s]["summary"][phase]["s"] for s in sides}
        cells = []
        for s in sides:
            t = result["sides"][s]["summary"][phase]
            tps, xf = t.get("tokens_per_s"), t.get("x_floor")
            tps, xf = "" if tps is None else str(round(tps)), "" if xf is None else f"{xf:.2f}"
            cells.append(f"| {t['s']:11.2f} {tps:>6} {xf:>7} ")
        for a, b in pairs.items():  # "other" (rewards, tokenizing) is too small for a ratio
            width = len(a) + len(b) + 3
            ratio = f"{seconds[a] / seconds[b]:.2f}" if phase != "other" and min(seconds[a], seconds[b]) > 0.01 else ""
            cells.append(f"| {ratio:>{width}} ")
        print(f"{phase:9}" + "".join(cells))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"comma-separated, of {SIDES}")
    add_step_arguments(p)
    p.add_argument("--beta", type=float, default=0.04, help="KL weight (> 0: a reference pass on both sides)")
    p.add_argument("--json", default="", help="write the machine, settings, rows and tables here ('' = none)")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    sides = args.sides.split(",")
    if any(side not in SIDES for side in sides): p.error(f"--sides: choose from {SIDES}, got {args.sides!r}")
    if args.steps < 2: p.error(f"--steps must be >= 2 (the first is the warm-up), got {args.steps}")
    if args.child:
        print(json.dumps(measure_side(args, sides[0])), flush=True)
        return
    result = dict(machine=describe_machine(), load_start=os.getloadavg()[0], command="python benchmarks/phases.py "
                  + " ".join(argv), settings=dict(prompts=args.prompts, group=args.group, threads=args.threads,
                  max_new_tokens=args.max_new_tokens, beta=args.beta, steps=args.steps), sides={})
    print(result["machine"], f"load average {result['load_start']:.2f}", flush=True)
    for side in sides:
        out = run_side_in_child(__file__, side, argv)
        out["summary"] = summarize(out)
        result["sides"][side] = out
        print(f"{side}: {out['summary']['step']['s']:.2f} s/step, matmul {out['matmul_gflops']:.0f} GFLOP/s",
              flush=True)
    result["load_end"] = os.getloadavg()[0]
    if args.json: Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"load average {result['load_start']:.2f} at the start, {result['load_end']:.2f} at the end")


if __name__ == "__main__":
    main()
