"""Batched multi-turn rollouts vs one conversation at a time (issue 12's target: >= 10x at 64 conversations x 3 turns).

Both sides run the same code, `rlnb.multiturn.create_multiturn_rollout`, on the same tiny model with greedy decoding:
  - one at a time: `create_multiturn_rollout(model, tok, [prompt], ...)` called once per conversation, so each turn
    is a `model.generate` call on one sequence;
  - batched: one call over all conversations, so each turn is one `batch_generate` call over every running episode
    (left-padded micro-batches of `--batch-size`).
The environment is `rlnb.environments.create_conversation_environment` with a scripted user who asks twice whether
the answer is right ("Are you sure?", "Really?") and leaves after the third turn, so every episode has exactly
3 assistant turns and 2 inserted user turns. Printed: wall time of each side (median of `--repeats`), episodes/s and
sampled tokens/s (tokens the policy generated, loss mask 1), their ratio, and the share of episodes whose whole token
stream (sampled and inserted ids) is identical on both sides.

Two workloads, as in benchmarks/generation.py: by default the SFT tiny model, which answers a sum in ~4 tokens, so
each turn is mostly the prefill of the conversation so far; with `--random-weights` the same architecture randomly
initialised, which never says EOS, so every turn decodes `--max-new-tokens` tokens (completions longer than the
user's turns, as in RL on real models).

    python benchmarks/multiturn.py                      # 64 conversations x 3 turns, 16 new tokens a turn, 1 thread
    python benchmarks/multiturn.py --conversations 16   # a quick look
    python benchmarks/multiturn.py --random-weights --max-new-tokens 32   # long completions
"""
from __future__ import annotations
import argparse, importlib.util, json, statistics, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
from _common import setup_torch  # noqa: E402  (this folder is on sys.path when run as a script)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="addition", help="rlnb task the prompts come from (the tiny model knows it)")
    p.add_argument("--conversations", type=int, default=64, help="episodes (one per prompt)")
    p.add_argument("--turns", type=int, default=3, help="assistant turns per episode (the scripted user leaves after)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="token budget of each assistant turn")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per model.generate call on the batched side")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each side (the median is reported)")
    p.add_argument("--random-weights", action="store_true", help="the tiny architecture, randomly initialised (seed 0)")
    p.add_argument("--json", default="", help="write the measurements to this JSON file")
    return p.parse_args(argv)


def setup(args):
    "The tiny model, its tokenizer, the prompts, a 3-turn scripted-user environment and the greedy config."
    from rlnb.core import GenerationConfig
    from rlnb.environments import create_conversation_environment, scripted_user
    from rlnb.tasks import get_task
    from rlnb.tiny import load_tiny_model
    model, tok = load_tiny_model(args.task, progress=False)
    if args.random_weights:
        import copy, torch
        torch.manual_seed(0)
        model = type(model)(copy.deepcopy(model.config))
    model.eval()
    prompts = get_task(args.task).sample(args.conversations, seed=0)
    lines = ["Are you sure?", "Really?", "Once more?", "Certain?"] * args.turns
    env = create_conversation_environment(scripted_user(lines[:args.turns - 1]))
    return model, tok, prompts, env, GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False)


def timed(fn, repeats: int):
    "fn()'s result (of the last run) and the median wall time over `repeats` runs."
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter(); out = fn(); times.append(time.perf_counter() - t0)
    return out, statistics.median(times), times


def main(argv=None):
    args = parse_args(argv)
    setup_torch(args.threads)
    from rlnb.multiturn import create_multiturn_rollout
    model, tok, prompts, env, cfg = setup(args)
    run = lambda ps, **kw: create_multiturn_rollout(model, tok, ps, cfg, env=env, max_turns=args.turns, **kw).rollouts
    run(prompts[:4], batch_size=args.batch_size); run(prompts[:1])  # warm-up
    one_at_a_time = lambda: [r for p in prompts for r in run([p])]
    batched = lambda: run(prompts, batch_size=args.batch_size)
    singles, t_single, single_times = timed(one_at_a_time, args.repeats)
    batch, t_batch, batch_times = timed(batched, args.repeats)
    turns = [r.metadata["num_turns"] for r in batch]
    sampled = lambda rs: sum(sum(r.loss_mask) for r in rs)
    same = sum(list(a.token_ids) == list(b.token_ids) for a, b in zip(batch, singles))
    n = len(prompts)
    out = dict(conversations=n, turns=args.turns, random_weights=args.random_weights,
               max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, threads=args.threads,
               repeats=args.repeats, turns_per_episode=sum(turns) / n,
               single_s=t_single, single_runs_s=single_times, batched_s=t_batch, batched_runs_s=batch_times,
               single_episodes_per_s=n / t_single, batched_episodes_per_s=n / t_batch,
               single_tokens_per_s=sampled(singles) / t_single, batched_tokens_per_s=sampled(batch) / t_batch,
               sampled_tokens_single=sampled(singles), sampled_tokens_batched=sampled(batch), identical=same)
    out["episodes_speedup"] = out["batched_episodes_per_s"] / out["single_episodes_per_s"]
    out["tokens_speedup"] = out["batched_tokens_per_s"] / out["single_tokens_per_s"]
    weights = "randomly initialised tiny" if args.random_weights else f"tiny '{args.task}'"
    print(f"# multi-turn rollouts: {n} conversations x {args.turns} turns ({out['turns_per_episode']:.2f} on average), "
          f"{weights} model, greedy, {args.max_new_tokens} new tokens a turn, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"{'one conversation at a time':28} {t_single:7.2f} s {out['single_episodes_per_s']:8.1f} episodes/s "
          f"{out['single_tokens_per_s']:8.0f} sampled tokens/s")
    print(f"{f'batched (batch_size={args.batch_size})':28} {t_batch:7.2f} s "
          f"{out['batched_episodes_per_s']:8.1f} episodes/s {out['batched_tokens_per_s']:8.0f} sampled tokens/s")
    print(f"speed-up: {out['episodes_speedup']:.1f}x episodes/s, {out['tokens_speedup']:.1f}x sampled tokens/s; "
          f"identical token streams: {same}/{n} ({same / n:.0%}); sampled tokens {out['sampled_tokens_batched']} "
          f"batched vs {out['sampled_tokens_single']} one at a time")
    if args.json: Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
