"""Where SmolLM2's sampling time goes: one GRPO sampling call (8 prompts x 8 samples, 40 new tokens, T = 0.7) on the
LoRA policy with its adapters live (`GenerationConfig(merge_lora=False)`), folded into the weights (the default) and
disabled, then a torch profile of the default call.

    python benchmarks/smollm2_sampling.py            # 2 threads (torch's default here), about a minute

Results: benchmarks/README.md, "Where SmolLM2's sampling time goes".
"""
from __future__ import annotations
import argparse, importlib.util, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None, help="torch threads (None: torch's default)")
    p.add_argument("--rows", type=int, default=18, help="profile rows to print")
    args = p.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile
    from rlnb import (GenerationConfig, ModelConfig, chat_task, create_batch_rollouts, get_task, load_model,
                      load_tokenizer)
    if args.threads: torch.set_num_threads(args.threads)
    model = load_model(ModelConfig("smollm2", use_lora=True, lora_r=8)).eval()
    tok = load_tokenizer("smollm2")
    task = chat_task(get_task("addition"))
    prompts, gen = task.sample(8, seed=1), GenerationConfig(max_new_tokens=40, temperature=0.7, num_return_sequences=8)

    def run(label: str, config: GenerationConfig = gen) -> None:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        batch = create_batch_rollouts(model, tok, prompts, config, system_prompt=task.system_prompt)
        tokens = sum(len(r.token_ids) for r in batch.rollouts)
        print(f"{label:18s} {time.perf_counter() - t0:6.2f} s, {tokens} tokens", flush=True)

    print(f"{torch.get_num_threads()} threads")
    run("warm-up")
    run("adapters live", gen._replace(merge_lora=False))
    run("adapters folded in")
    with model.disable_adapter(): run("adapters disabled")
    with profile(activities=[ProfilerActivity.CPU]) as prof: run("folded, profiled")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
