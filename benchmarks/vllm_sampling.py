"""Sampling speed of vLLM (rlnb.engines.create_vllm_generator) against transformers' generate (rlnb.batch_generate):
the same prompts and settings through both, on SmolLM2-135M-Instruct (8 chat prompts x 8 samples, up to 64 new tokens)
and on the tiny model (64 chat-formatted addition prompts x 8 samples, up to 16 tokens), temperature 1. Tokens
counted are those returned (through EOS); each sampler is warmed up once, then the best of --repeats timed calls
counts; vLLM's time includes the weight sync that precedes every call in training.
Needs .venv-vllm (`bash scripts/install.sh vllm`).

    .venv-vllm/bin/python benchmarks/vllm_sampling.py                        # float32 both, 1 thread, ~3 minutes
    .venv-vllm/bin/python benchmarks/vllm_sampling.py --dtype bfloat16       # the engine in bf16 (trainer float32)
    .venv-vllm/bin/python benchmarks/vllm_sampling.py --dtype bfloat16 --compile   # and vLLM's torch.compile

Results: benchmarks/README.md, "vLLM as the sampler".
"""
from __future__ import annotations
import argparse, importlib.util, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
sys.path.insert(0, str(HERE))
from _common import setup_torch  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child.",
             "List three fruits.", "What is 12 times 7?", "Tell me a joke.", "Name a famous painter.",
             "How do birds fly?"]


def tokens_per_second(model, tok, prompts, config, generator, repeats):
    "Best tokens/s of batch_generate over `repeats` calls after a warm-up, and that call's token count."
    from rlnb import batch_generate
    batch_generate(model, tok, prompts, config, generator=generator)
    best = (0.0, 0)
    for _ in range(repeats):
        start = time.perf_counter()
        gens = batch_generate(model, tok, prompts, config, generator=generator)
        tokens = sum(len(g.token_ids) for g in gens)
        best = max(best, (tokens / (time.perf_counter() - start), tokens))
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch threads for both samplers")
    p.add_argument("--dtype", default="float32", help="the engine's dtype (transformers stays float32)")
    p.add_argument("--compile", action="store_true",
                   help="build the engine with vLLM's torch.compile (enforce_eager=False; slower to build)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--models", default="smollm2,tiny")
    args = p.parse_args(argv)
    setup_torch(args.threads)
    from rlnb import GenerationConfig, create_vllm_generator, load_model, load_tiny_model, load_tokenizer
    for name in args.models.split(","):
        if name == "smollm2":
            model, tok = load_model("smollm2"), load_tokenizer("smollm2")
            prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                               add_generation_prompt=True) for q in QUESTIONS]
            config = GenerationConfig(max_new_tokens=64, num_return_sequences=8)
        else:
            model, tok = load_tiny_model(progress=False)
            prompts = [tok.apply_chat_template([{"role": "user", "content": f"{a}+{b}="}], tokenize=False,
                                               add_generation_prompt=True)  # the format the tiny model was trained on
                       for a, b in zip(range(10, 74), range(74, 10, -1))]
            config = GenerationConfig(max_new_tokens=16, num_return_sequences=8)
        start = time.perf_counter()
        engine = create_vllm_generator(model, dtype=args.dtype, enforce_eager=not args.compile)
        build = time.perf_counter() - start
        hf, hf_tokens = tokens_per_second(model, tok, prompts, config, None, args.repeats)
        fast, fast_tokens = tokens_per_second(model, tok, prompts, config, engine, args.repeats)
        sync = min(t["sync_s"] for t in engine.timings)
        kind = args.dtype + (" compiled" if args.compile else "")
        print(f"{name:8} {len(prompts)} prompts x {config.num_return_sequences}, <= {config.max_new_tokens} tokens, "
              f"{args.threads} thread(s): transformers float32 {hf:6.0f} tok/s ({hf_tokens} tokens) | vLLM "
              f"{kind} {fast:6.0f} tok/s ({fast_tokens} tokens, sync {sync:.2f} s, build {build:.1f} s) | "
              f"x{fast / hf:.2f}", flush=True)
        del engine


if __name__ == "__main__":
    main()
