"""Where a GRPO update's time goes on a CPU, and what cuts it: SmolLM2-135M-Instruct with LoRA, one sampled batch.

One batch is sampled once (the settings of benchmarks/phases.py: 4 prompts x 8 samples, up to 32 new tokens, chat
addition, LoRA r 8 on every linear projection, beta 0.04, one torch thread). Then `training_step` runs on that same
batch again and again, its optimizer step replaced by one that only clears the gradients (so every run sees the same
weights), and each variant's `time/scoring_s` (the reference's pass) and `time/update_s` (forward, backward) are
the medians over --repeats runs after a warm-up:
- `float32`: the default;
- `bf16`: `TrainingConfig(mixed_precision="bf16")`, the forwards under bf16 autocast over float32 weights;
- `micro16`: micro-batches of 16 rows (the same gradient, two passes);
- `beta0`: no reference (beta 0, the state without a reference model: with one, rlnb scores it to log `kl/mean`);
- `fused_lora`: each LoRA projection as `addmm(W x, A x, (s B)^T)`, the adapter's product, scale and sum in one
  call instead of peft's `result + lora_B(lora_A(x)) * scaling` (two element-wise passes over the output);
- `compiled`: the policy's forward compiled with `torch.compile` (inductor, CPU), compile time reported apart.
The profile: torch.profiler over one float32 step, its operators' own CPU time grouped into matrix products,
attention, softmax and log-softmax, element-wise work, and data movement (copies, cat, index, view changes), with the
top operators listed. The FLOP floor is that of benchmarks/phases.py (2 N per token forward, 2 N more backward
through frozen weights, each distinct prompt once, completions without padding, at the best one-thread matmul rate).

    python benchmarks/update_profile.py                      # every variant, 5 repeats (~6 minutes)
    python benchmarks/update_profile.py --variants float32,bf16 --repeats 3

Results: benchmarks/README.md, "Where the update's time goes".
"""
from __future__ import annotations
import argparse, importlib.util, statistics, sys, time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
sys.path.insert(0, str(HERE))
from _common import setup_torch  # noqa: E402
import grpo_vs_trl as pair  # noqa: E402
from phases import matmul_gflops  # noqa: E402

VARIANTS = ("float32", "bf16", "micro16", "beta0", "fused_lora", "compiled")
CATEGORIES = {  # operator name fragments -> category (first match wins)
    "matrix products": ("mm", "matmul", "linear", "bmm", "baddbmm"),
    "attention": ("attention", "sdpa", "_flash"),
    "softmax, log-softmax": ("softmax", "logsumexp"),
    "data movement": ("copy", "cat", "index", "gather", "scatter", "clone", "contiguous", "expand", "select", "slice",
                      "view", "reshape", "permute", "transpose", "stack", "fill", "zero", "empty", "to", "narrow"),
}


def no_update(state, max_grad_norm):
    "An optimizer_step_fn that only clears the gradients: every timed step sees the same weights."
    state.optimizer.zero_grad(set_to_none=True)
    return 0.0


def fuse_lora(model) -> list:
    "Give each peft LoRA Linear (one adapter, no dropout) a fused forward; return the (module, forward) to restore."
    import torch
    import torch.nn.functional as F
    from peft.tuners.lora import Linear as LoraLinear
    restore = []
    for module in model.modules():
        if not isinstance(module, LoraLinear) or len(module.lora_A) != 1: continue
        name = next(iter(module.lora_A))
        if not isinstance(module.lora_dropout[name], torch.nn.Identity) or module.lora_variant: continue
        peft_forward = module.forward

        def fused(x, *args, _m=module, _name=name, _peft=peft_forward, **kwargs):
            if _m.disable_adapters or _m.merged or args or kwargs: return _peft(x, *args, **kwargs)  # the reference
            base = _m.base_layer(x)  # (..., out)
            A, B = _m.lora_A[_name].weight, _m.lora_B[_name].weight  # (r, in), (out, r)
            xa = F.linear(x, A).reshape(-1, A.shape[0])  # (tokens, r)
            out = torch.addmm(base.reshape(-1, base.shape[-1]), xa, (B * _m.scaling[_name]).T)  # (tokens, out)
            return out.view(base.shape)
        module.forward = fused
        restore.append((module, peft_forward))
    return restore


def category(name: str) -> str:
    "The category of an operator (aten::mm -> matrix products); element-wise work is what matches nothing else."
    op = name.split("::")[-1].lower()
    for cat, parts in CATEGORIES.items():
        if any(part == op or op.startswith(part + "_") or op.endswith("_" + part) or part in op.split("_")
               for part in parts): return cat
    return "element-wise and other"


def one_step(ctx: dict, batch, cfg, algo) -> dict:
    "One `training_step` on `batch` that leaves the weights as they were; its metrics."
    from rlnb.step import training_step
    _, stats = training_step(ctx["state"], batch, algo, tokenizer=ctx["tok"], config=cfg, optimizer_step_fn=no_update)
    return stats.custom_metrics


def step_times(ctx: dict, batch, repeats: int, cfg, algo) -> tuple[float, float]:
    "Medians of (time/scoring_s, time/update_s) over `repeats` training steps after one warm-up step."
    one_step(ctx, batch, cfg, algo)  # the warm-up
    steps = [one_step(ctx, batch, cfg, algo) for _ in range(repeats)]
    return (statistics.median(m["time/scoring_s"] for m in steps), statistics.median(m["time/update_s"] for m in steps))


def profile(ctx: dict, batch, cfg, algo, top: int) -> None:
    "Print the operators' own CPU seconds per category over one float32 step, and the top operators."
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof: one_step(ctx, batch, cfg, algo)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    by_cat = defaultdict(float)
    for e in events: by_cat[category(e.key)] += e.self_cpu_time_total
    print(f"profile of one float32 step: {total / 1e6:.2f} s of operators' own CPU time")
    for cat, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:24} {us / 1e6:6.2f} s  {us / total:6.1%}")
    print(f"  top {top} operators:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"    {e.key:40} {e.self_cpu_time_total / 1e6:6.2f} s  {e.count:6d} calls  {category(e.key)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per variant (after one warm-up)")
    p.add_argument("--top", type=int, default=12, help="operators listed in the profile")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    if any(v not in VARIANTS for v in variants): p.error(f"--variants: choose from {VARIANTS}, got {args.variants!r}")
    torch = setup_torch(args.threads)
    from rlnb.algorithms import create_algorithm_config
    bench = pair.parse_args(["--model", "smollm2", "--prompts", "4", "--group", "8", "--max-new-tokens", "32",
                             "--lr", "2e-4", "--temperature", "1.0", "--beta", "0.04", "--threads", str(args.threads)])
    task = pair.create_task(bench)
    ctx = pair.setup_rlnb(bench, task, seed=0)
    torch.manual_seed(0)
    batch = ctx["rollout_fn"](ctx["state"].model, ctx["tok"], task.sample(4, seed=1000), ctx["tcfg"])
    rate, N = matmul_gflops() * 1e9, sum(p.numel() for p in ctx["state"].model.parameters())
    distinct = {r.group_index: len(r.prompt_token_ids) for r in batch.rollouts}
    work = sum(distinct.values()) + sum(len(r.token_ids) for r in batch.rollouts)
    floor_scoring, floor_update = 2 * N * work / rate, 4 * N * work / rate
    print(f"batch: {len(batch)} rows, {sum(distinct.values())} distinct prompt tokens, "
          f"{work - sum(distinct.values())} completion tokens; matmul {rate / 1e9:.0f} GFLOP/s; floors: scoring "
          f"{floor_scoring:.2f} s, update {floor_update:.2f} s", flush=True)
    cfg, algo = ctx["tcfg"], ctx["algo"]
    if "float32" in variants: profile(ctx, batch, cfg, algo, args.top)
    results = {}
    for variant in variants:
        v_cfg, v_algo, note = cfg, algo, ""
        if variant == "bf16": v_cfg = cfg._replace(mixed_precision="bf16")
        if variant == "micro16": v_cfg = cfg._replace(micro_batch_size=16)
        if variant == "beta0":
            v_algo = create_algorithm_config("grpo", beta=0.0, clip_eps=0.2, scale="group", aggregation="sequence_mean")
        model, state, restore = ctx["state"].model, ctx["state"], []
        if variant == "beta0": ctx["state"] = state._replace(ref_model=None)
        if variant == "fused_lora": restore = fuse_lora(model)
        if variant == "compiled":
            inner = model.get_base_model()
            eager_forward = inner.forward
            inner.forward = torch.compile(eager_forward)
            t = time.perf_counter()
            one_step(ctx, batch, v_cfg, v_algo)  # compiles (and recompiles for the reference's shapes)
            note = f" (compiling: {time.perf_counter() - t:.0f} s)"
        try: scoring, update = step_times(ctx, batch, args.repeats, v_cfg, v_algo)
        finally:
            ctx["state"] = state
            for module, forward in restore: module.forward = forward
            if variant == "compiled": inner.forward = eager_forward
        results[variant] = (scoring, update)
        print(f"{variant:9} scoring {scoring:6.2f} s ({scoring / floor_scoring:4.2f}x floor) | update {update:6.2f} s "
              f"({update / floor_update:4.2f}x floor){note}", flush=True)
    base = results.get("float32")
    if base:
        for variant, (scoring, update) in results.items():
            print(f"{variant:9} scoring + update = {(scoring + update) / sum(base):.2f}x float32's")


if __name__ == "__main__":
    main()
