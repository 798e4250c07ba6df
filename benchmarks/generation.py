"""rlnb's batched generation and log-prob pass vs the one-prompt-per-call loops of the seed designs.

Part 1, generation (one process, greedy decoding, the same `max_new_tokens` on both sides):
  - seeds: `model.generate` once per prompt, as the seeds' `batch_generate` does (it loops over `generate`);
  - rlnb:  `rlnb.generation.batch_generate`, left-padded micro-batches of `--batch-size` prompts (several sizes can
    be given), one `model.generate` call each.
  Both produce the same completions (checked, token by token); the ratio of wall-clock times is printed. Two
  workloads: (A) the SFT tiny model (`rlnb.tiny.load_tiny_model`) answering: ~3-token answers after a ~27-token
  chat prompt, so the prompt's forward pass dominates; (B) the same architecture with random weights, which rarely
  says EOS, so rows decode up to `--long-tokens` tokens: completions longer than prompts, as in RL on real models.

Part 2 (log-probs of those completions under no_grad, as for old/reference log-probs):
  - one sequence per forward pass (the seeds' loop), one forward over the full batch, and rlnb's micro-batched
    `compute_logprobs_for_tokens` (`--micro-batch` rows per pass).
  Timed in this process. Peak memory is measured in child processes, one per variant, so that each variant has
  its own high-water mark: the kernel's peak-RSS mark is reset just before the pass (`/proc/self/clear_refs`) and
  read after it (`VmHWM` in `/proc/self/status`), minus the RSS just before the pass. (tracemalloc cannot be used:
  it does not see torch's allocations.) The probes run on the tiny model (vocabulary 108, where the logits are
  too small to matter) and on a randomly initialised model of the same architecture with a 32k vocabulary
  (Llama-2-sized), where the (rows x positions x vocabulary) logits dominate.

    python benchmarks/generation.py                      # defaults: 256 prompts, 16 new tokens, 2 threads
    python benchmarks/generation.py --prompts 64 --skip-memory   # a quick look
"""
from __future__ import annotations
import argparse, importlib.util, json, os, platform, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
# (this folder is on sys.path when run as a script)
from _common import reset_peak_rss, setup_torch, status_mib  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="addition",
                   help="rlnb task the prompts come from (the tiny model is pre-trained on it)")
    p.add_argument("--prompts", type=int, default=256, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, default=16, help="completion budget, both sides")
    p.add_argument("--long-tokens", type=int, default=32,
                   help="max_new_tokens of part B, an untrained model that rarely stops early (0 = skip B)")
    p.add_argument("--batch-size", default="64,256",
                   help="prompts per model.generate call in rlnb's batch_generate (comma-separated: each is timed)")
    p.add_argument("--micro-batch", type=int, default=32,
                   help="rows per forward pass in the micro-batched log-prob pass")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed repeats of each batched generation and log-prob variant (the minimum is reported)")
    p.add_argument("--wide-vocab", type=int, default=32768,
                   help="vocabulary of the random model used for the memory probes (0 = skip it)")
    p.add_argument("--skip-memory", action="store_true", help="skip the child-process memory probes")
    p.add_argument("--json", default="", help="write every measurement to this JSON file")
    # internal: "<model>:<variant>", run one memory probe
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def load(args):
    "The SFT tiny model, its tokenizer and chat-formatted prompts."
    from rlnb.tiny import load_tiny_model
    from rlnb.tasks import get_task
    from rlnb.chat import format_prompt
    model, tok = load_tiny_model(args.task)
    model.eval()
    examples = get_task(args.task).sample(args.prompts, seed=0)
    return model, tok, [format_prompt(e.prompt, tok) for e in examples]


# ------------------------------------------------------------------------------------------------------ generation
def seeds_generate_loop(model, tok, prompts, max_new_tokens):
    "One model.generate call per prompt, as in the seed designs; returns completion ids through the first EOS."
    import torch
    out = []
    with torch.no_grad():
        for p in prompts:
            enc = tok(p, return_tensors="pt")
            seq = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)[0, enc["input_ids"].shape[1]:].tolist()
            out.append(seq[:seq.index(tok.eos_token_id) + 1] if tok.eos_token_id in seq else seq)
    return out


def batch_sizes(args) -> list[int]: return [int(b) for b in str(args.batch_size).split(",")]


def bench_generation(args, model, tok, prompts, max_new_tokens):
    "Time the seeds' loop, then batch_generate at each batch size; check every completion is identical."
    from rlnb.core import GenerationConfig
    from rlnb.generation import batch_generate
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
    # warm-up
    seeds_generate_loop(model, tok, prompts[:4], max_new_tokens); batch_generate(model, tok, prompts[:4], cfg)
    t0 = time.perf_counter()
    loop_ids = seeds_generate_loop(model, tok, prompts, max_new_tokens)
    t_loop = time.perf_counter() - t0
    tokens = sum(len(ids) for ids in loop_ids)
    out = dict(n=len(prompts), generated_tokens=tokens, seeds_loop_s=t_loop, seeds_tokens_per_s=tokens / t_loop,
               rlnb={})
    for bs in batch_sizes(args):
        times = []
        # the batched run is short: take the fastest of a few (the loop runs once, ~a minute)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            gens = batch_generate(model, tok, prompts, cfg, batch_size=bs)
            times.append(time.perf_counter() - t0)
        t = min(times)
        same = sum(list(g.token_ids) == ids for g, ids in zip(gens, loop_ids))
        out["rlnb"][bs] = dict(seconds=t, speedup=t_loop / t, identical=same, tokens_per_s=tokens / t)
    return gens, out


# ------------------------------------------------------------------------------------------------------ log-probs
def batch_tensors(tok, gens):
    "collate's layout for the generated completions."
    from rlnb.core import Rollout, collate
    rs = [Rollout("", prompt_token_ids=g.metadata["prompt_token_ids"], token_ids=g.token_ids) for g in gens]
    return collate(rs, tok.pad_token_id, tok.eos_token_id)


def logprob_variants(args):
    "name -> function(model, cb) running that variant of the no-grad log-prob pass."
    import torch
    from rlnb.logprobs import compute_logprobs_for_tokens
    C = lambda cb: cb.completion_ids.shape[1]

    def per_sequence(model, cb):  # the seeds: one prompt+completion per forward pass, unpadded
        out = []
        for i in range(cb.input_ids.shape[0]):
            keep = cb.attention_mask[i].bool()
            ids = cb.input_ids[i][keep][None]
            n = int(cb.completion_mask[i].sum())
            logits = model(input_ids=ids).logits[0, -n - 1:-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, -n:, None]).squeeze(-1))
        return out
    return {"per_sequence (seeds)": per_sequence,
            "full_batch": lambda m, cb: compute_logprobs_for_tokens(m, cb.input_ids, cb.attention_mask, C(cb)),
            f"micro_batch_{args.micro_batch} (rlnb)":
                lambda m, cb: compute_logprobs_for_tokens(m, cb.input_ids, cb.attention_mask, C(cb),
                                                          micro_batch_size=args.micro_batch)}


def bench_logprob_time(args, model, cb):
    import torch
    out = {}
    with torch.no_grad():
        for name, fn in logprob_variants(args).items():
            fn(model, cb)  # warm-up
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter(); fn(model, cb); times.append(time.perf_counter() - t0)
            out[name] = min(times)
    return out


def random_model(model, vocab: int | None = None):
    "The tiny model's architecture, randomly initialised; with `vocab`, a larger vocabulary (tiny ids are a subset)."
    import copy, torch
    config = copy.deepcopy(model.config)
    if vocab: config.vocab_size = vocab
    torch.manual_seed(0)
    return type(model)(config).eval()


def report_generation(title: str, g: dict, repeats: int):
    print(f"\n## Generation: {title}\n"
          f"(one process; same model, same greedy completions; rlnb: fastest of {repeats}, seeds loop: one run)")
    print(f"{'seeds loop (1 prompt per generate call)':42} {g['seeds_loop_s']:8.2f} s "
          f"{g['seeds_tokens_per_s']:8.0f} tokens/s")
    for bs, r in g["rlnb"].items():
        print(f"{f'rlnb batch_generate(batch_size={bs})':42} {r['seconds']:8.2f} s {r['tokens_per_s']:8.0f} tokens/s"
              f"   speed-up {r['speedup']:5.1f}x   identical completions {r['identical']}/{g['n']}")
    print(f"generated tokens: {g['generated_tokens']} (through the first EOS), "
          f"{g['generated_tokens'] / g['n']:.1f} per prompt")


def run_probe(args):
    "Child process: build the inputs, then measure one variant's peak RSS increase. Prints one JSON line."
    torch = setup_torch(args.threads)
    which, variant = args.probe.split(":", 1)
    model, tok, prompts = load(args)
    from rlnb.core import GenerationConfig
    from rlnb.generation import batch_generate
    gens = batch_generate(model, tok, prompts, GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False),
                          batch_size=batch_sizes(args)[0])
    # score the same completions under a 32k-vocabulary model
    if which == "wide": model = random_model(model, args.wide_vocab)
    cb = batch_tensors(tok, gens)
    fn = logprob_variants(args)[variant]
    with torch.no_grad():
        # warm-up on 2 rows
        fn(model, cb.__class__(*[x[:2] if isinstance(x, torch.Tensor) and x.dim() else x for x in cb]))
        import gc; gc.collect()
        exact = reset_peak_rss()  # without it, the peak of model loading could hide the pass's own peak
        before, peak_before = status_mib("VmRSS"), status_mib("VmHWM")
        fn(model, cb)
        peak_after = status_mib("VmHWM")
    print(json.dumps({"model": which, "variant": variant, "rss_before_mib": before, "peak_mib": peak_after,
                      "peak_increase_mib": peak_after - before, "exact": exact or peak_after > peak_before,
                      "vocab": model.config.vocab_size, "rows": cb.input_ids.shape[0],
                      "columns": cb.input_ids.shape[1]}))


def bench_memory(args):
    out = []
    models = ["tiny"] + (["wide"] if args.wide_vocab else [])
    for which in models:
        for variant in logprob_variants(args):
            cmd = [sys.executable, __file__, "--probe", f"{which}:{variant}", "--prompts", str(args.prompts),
                   "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size),
                   "--micro-batch", str(args.micro_batch),
                   "--threads", str(args.threads), "--task", args.task, "--wide-vocab", str(args.wide_vocab)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"memory probe {which}:{variant} failed:\n{proc.stderr[-3000:]}")
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.probe: return run_probe(args)
    torch = setup_torch(args.threads)
    t0 = time.perf_counter()
    model, tok, prompts = load(args)
    print(f"# rlnb generation benchmark: {args.prompts} chat-formatted '{args.task}' prompts, greedy, "
          f"torch threads={args.threads}, cpus={os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at start")
    print(f"# python {platform.python_version()}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}; model loaded in {time.perf_counter() - t0:.1f} s")

    gens, g = bench_generation(args, model, tok, prompts, args.max_new_tokens)
    report_generation(f"A. the SFT tiny model answers (short answers after a ~27-token chat prompt: prefill-bound), "
                      f"max_new_tokens={args.max_new_tokens}", g, args.repeats)
    g_long = None
    if args.long_tokens:
        _, g_long = bench_generation(args, random_model(model), tok, prompts, args.long_tokens)
        report_generation(f"B. the same architecture untrained (it rarely says EOS: rows decode {args.long_tokens} "
                          f"tokens, decode-bound like RL on real models)", g_long, args.repeats)

    cb = batch_tensors(tok, gens)
    times = bench_logprob_time(args, model, cb)
    print(f"\n## Log-prob pass, no_grad ({cb.input_ids.shape[0]} rows x {cb.input_ids.shape[1]} columns, "
          f"completion {cb.completion_ids.shape[1]}), min of {args.repeats}")
    base = times["per_sequence (seeds)"]
    for name, t in times.items(): print(f"{name:26} {t * 1000:9.1f} ms   {base / t:6.1f}x vs per-sequence")

    mem = [] if args.skip_memory else bench_memory(args)
    if mem:
        print("\n## Peak memory of the log-prob pass "
              "(a child process per row: peak RSS during the pass - RSS just before it)")
        for m in mem:
            flag = ("" if m["exact"]
                    else "  (upper bound: the peak mark could not be reset and was not exceeded)")
            print(f"{m['model']:5} V={m['vocab']:6d}  {m['variant']:26} +{m['peak_increase_mib']:8.1f} MiB{flag}")
    print(f"\n# load average {os.getloadavg()[0]:.1f} at the end "
          f"(2 cores; above ~2 means the CPU was shared while measuring)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "generation": g, "generation_long": g_long,
                                               "logprob_seconds": times, "memory": mem}, indent=1))


if __name__ == "__main__":
    main()
