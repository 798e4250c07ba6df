"""rlnb's GRPO loop vs TRL's GRPOTrainer: same tiny model, task, LoRA, batch, completion length and learning rate.

Both sides run in this one process, each on a fresh copy of the SFT tiny model (`rlnb.tiny.load_tiny_model`), on the
CPU with the same number of torch threads. Each optimizer step consumes the same prompts (`--prompts` per step,
drawn as `quick_start_training` draws them) with `--group` samples each. By default the two are interleaved step by
step (one rlnb step between TRL's steps, outside TRL's timed window) so both see the same machine load; repeated
for each of `--seeds`. Printed: seconds per step (and its split into sampling + scoring and the update), the reward
at the start and after N steps, greedy accuracy on held-out prompts, and the ratios rlnb / TRL. Then, in child
processes (so each has its own peak), the peak memory of rlnb with no reference (beta = 0), with the LoRA reference
(adapters disabled, beta > 0) and, for contrast, with a frozen full copy.

    python benchmarks/grpo_vs_trl.py                       # 3 seeds x 30 steps of 8 prompts x 8, 8 new tokens (~5 min)
    python benchmarks/grpo_vs_trl.py --steps 10 --seeds 0 --skip-memory   # a quick look
    python benchmarks/grpo_vs_trl.py --algorithm dapo --skip-memory --plot ""  # DAPO vs GRPOTrainer(loss_type="dapo")
    python benchmarks/grpo_vs_trl.py --algorithm rloo --skip-memory --plot ""  # RLOO vs RLOOTrainer
    python benchmarks/grpo_vs_trl.py --model smollm2 --prompts 4 --group 8 --max-new-tokens 16 --lr 2e-4 \
        --temperature 0.7 --steps 8 --seeds 0 --skip-memory --eval-size 32 --plot benchmarks/grpo_vs_trl_smollm2.png

`--model smollm2` runs both sides on SmolLM2-135M-Instruct (`rlnb.load_model("smollm2")`, float32) instead of the
tiny model, on the chat version of the task (`rlnb.tasks.chat_task`: the question in words, the task's system prompt
on both sides, reward (correct + 0.5 * form) / 1.5 on both sides, greedy accuracy with the system prompt). The memory
probes are tiny-model only (skipped with a note for smollm2). Each step also records the process's peak RSS during
that step (VmHWM reset just before it): both sides' models are resident throughout, so it is the process's peak while
that side steps, and its growth over the RSS just before the step is the side's own transient memory.

`--algorithm` picks the pair (ALGORITHM_PAIRS below): grpo (default) = rlnb's `grpo` vs `GRPOTrainer`; dapo = rlnb's
`dapo` (decoupled clip 0.2 / 0.28, token-level loss, beta 0) vs `GRPOTrainer(loss_type="dapo", epsilon_high=0.28,
beta=0)`, with rlnb's dynamic sampling and overlong penalty OFF, because TRL has neither; rloo = rlnb's `rloo`
(leave-one-out baseline) vs TRL's `RLOOTrainer` (beta 0, no advantage normalisation), with rlnb's loss summed over each
completion's tokens as RLOOTrainer's is (its sequence log-ratio is the sum of the token log-ratios; at one update per
batch the ratio is 1 and the two gradients are equal).

TRL is installed only for benchmarks (`pip install trl`); rlnb itself does not depend on it.
Results: benchmarks/README.md.
"""
from __future__ import annotations
import argparse, gc, importlib.util, json, os, platform, resource, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
# (this folder is on sys.path when run as a script)
from _common import reset_peak_rss, setup_torch, status_mib  # noqa: E402
LOSS_TYPES = {"grpo": "sequence_mean", "dapo": "token_mean", "dr_grpo": "constant"}  # TRL loss_type -> rlnb aggregation


def sequence_sum(per_token_loss, loss_mask):
    "Aggregation = RLOOTrainer's: each completion's token losses summed, averaged over completions (B, C) -> scalar."
    import torch
    keep = loss_mask.to(per_token_loss.device) > 0
    return torch.where(keep, per_token_loss, torch.zeros_like(per_token_loss)).sum() / per_token_loss.shape[0]


# --algorithm NAME -> (rlnb's registered algorithm, TRL trainer, what TRL's config and rlnb's algorithm config set)
ALGORITHM_PAIRS = {
    "grpo": dict(rlnb="grpo", trl="GRPOTrainer", trl_config={}, rlnb_config={}),
    "dapo": dict(rlnb="dapo", trl="GRPOTrainer", trl_config=dict(loss_type="dapo", epsilon_high=0.28),
                 rlnb_config=dict(clip_eps_high=0.28)),  # + scale_rewards / scale from --scale-rewards on both sides
    # beta > 0 differs: RLOOTrainer subtracts the KL from the reward
    "rloo": dict(rlnb="rloo", trl="RLOOTrainer", trl_config=dict(normalize_advantages=False),
                 rlnb_config=dict(aggregation=sequence_sum)),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="addition", help="rlnb task name (the tiny model is pre-trained on it)")
    p.add_argument("--model", default="tiny", choices=["tiny", "smollm2"],
                   help="tiny: the SFT tiny model on the task; smollm2: SmolLM2-135M-Instruct (float32) on "
                        "chat_task(task)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (= rollout batches) for each side")
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO group size)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="completion budget (TRL's max_completion_length)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (constant, no warm-up)")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank; alpha = 2 r, dropout 0, all linear projections")
    p.add_argument("--beta", type=float, default=0.0,
                   help="KL weight for the speed/reward comparison (0 = no reference pass on either side)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--algorithm", default="grpo", choices=sorted(ALGORITHM_PAIRS),
                   help="grpo: GRPO vs GRPOTrainer; dapo: rlnb's dapo (no dynamic sampling, no overlong penalty) "
                        "vs GRPOTrainer(loss_type='dapo'); "
                        "rloo: rlnb's rloo vs RLOOTrainer (beta 0 on both)")
    p.add_argument("--loss-type", default="grpo", choices=sorted(LOSS_TYPES),
                   help="--algorithm grpo: TRL loss_type; rlnb uses the matching aggregation")
    p.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"],
                   help="advantage std scaling (both sides)")
    p.add_argument("--seeds", default="0,1,2",
                   help="comma-separated seeds; each seeds the LoRA init, the sampling and the prompt stream")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (both sides); 1 by default: on a CPU shared with other work, "
                        "2 OpenMP threads made each forward ~10x slower on the 2-core machine this was written on")
    p.add_argument("--eval-size", type=int, default=128,
                   help="held-out prompts for greedy accuracy after training (0 = skip)")
    p.add_argument("--mode", default="interleaved", choices=["interleaved", "sequential"],
                   help="interleaved: one rlnb step between TRL's steps (same machine load for both); "
                        "sequential: one run after the other")
    p.add_argument("--order", default="trl,rlnb", help="sequential mode: which side runs first (comma-separated)")
    p.add_argument("--skip-memory", action="store_true", help="skip the peak-memory probes")
    p.add_argument("--memory-beta", type=float, default=0.04, help="beta used by the memory probes with a reference")
    p.add_argument("--memory-steps", type=int, default=3, help="rlnb steps per memory probe")
    p.add_argument("--memory-model", default="both", choices=["tiny", "wide", "both"],
                   help="probe the SFT tiny model, a randomly initialised wider one "
                        "(~25M params, so a copy is visible), or both")
    p.add_argument("--wide-batch", default="2x4",
                   help="prompts x group for the wide model's probes (small, so weights dominate)")
    p.add_argument("--plot", default=str(HERE / "grpo_vs_trl.png"), help="PNG of the reward curves ('' = none)")
    p.add_argument("--json", default="", help="write every measurement to this JSON file ('' = none)")
    p.add_argument("--target", type=float, default=0.35, help="speed target: rlnb's seconds per step / TRL's (issue 9)")
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # internal: run one memory probe and print JSON
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------------- setup
def load_sft(task: str):
    "A fresh copy of the SFT tiny model (from rlnb's cache; trained once on first use) and its tokenizer."
    from rlnb.tiny import load_tiny_model
    model, tok = load_tiny_model(task, progress=False)
    return model.float().train(), tok


def load_policy(args):
    "A fresh float32 copy of the model both sides train (`--model`), in train mode, and its tokenizer."
    if args.model == "tiny": return load_sft(args.task)
    from rlnb.models import load_model, load_tokenizer
    return load_model(args.model).float().train(), load_tokenizer(args.model)


def create_task(args):
    "The task: `--task` as is for the tiny model; its chat version (system prompt, form reward) for a chat model."
    from rlnb.tasks import get_task
    if args.model == "tiny": return get_task(args.task)
    from rlnb.tasks import chat_task
    return chat_task(get_task(args.task))


def text_reward(task):
    """TRL's reward function: `task.reward_fn` computed from the completion text. For a chat task (one with
    `format_check`): (correct + w * form) / (1 + w), w = the task's format weight; else 1.0 if correct, 0.0 if not."""
    w, form = (task.params or {}).get("format_weight", 0.5), getattr(task, "format_check", None)
    def score(text: str, answer: str) -> float:
        if form is None: return 1.0 if task.check(text, answer) else 0.0
        return (bool(task.check(text, answer)) + w * bool(form(text))) / (1 + w)
    def reward(completions, answer, **kw) -> list[float]:
        return [score(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]
    reward.score, reward.__name__ = score, "correct" if form is None else "correct_and_form"
    return reward


def check_text_reward(task) -> None:
    "Assert that TRL's reward function gives what `task.reward_fn` gives rlnb's rollouts, on a few completion texts."
    from types import SimpleNamespace
    score = text_reward(task).score
    for e in task.sample(4, seed=1):
        for text in (e.answer, f"The answer is {e.answer}.", f"{e.answer}. The answer is {e.answer}.",
                     "The answer is 1000.", "I do not know", f"The answer is {e.answer}"):
            rollout = SimpleNamespace(answer=e.answer, generation=SimpleNamespace(text=text))
            assert abs(task.reward_fn(rollout) - score(text, e.answer)) < 1e-9, (text, e.answer)


def shares_prompts(model) -> bool | None:
    """Whether rlnb runs each distinct prompt once and shares its KV cache (in `batch_generate` and
    `compute_logprobs_for_tokens`) for this model: its check, so a silent fallback to full passes shows."""
    try: from rlnb.generation import _can_share_prompts
    except ImportError: return None
    return bool(_can_share_prompts(model))


def messages(task, prompt: str) -> list[dict]:
    "The chat messages of one prompt: the task's system prompt (if any), then the question."
    return ([{"role": "system", "content": task.system_prompt}] if task.system_prompt else []) + [
        {"role": "user", "content": prompt}]


def lora_targets(model) -> list[str]:
    "Every linear projection except the head: what rlnb's `apply_lora(target_modules=None)` picks."
    import torch.nn as nn
    head = model.get_output_embeddings()
    return sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head})


def greedy_accuracy(model, tok, examples, check, max_new_tokens: int, system_prompt: str | None = None,
                    format_check=None) -> float | tuple[float, float]:
    """Greedy accuracy with plain `model.generate` (the same code for both sides' final models), the prompts with
    `system_prompt` if given; with `format_check`, (accuracy, fraction of replies with the required form)."""
    import torch
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    texts = [tok.apply_chat_template(system + [{"role": "user", "content": e.prompt}], tokenize=False,
                                     add_generation_prompt=True) for e in examples]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    model.train(was_training)
    completions = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    accuracy = sum(bool(check(c, e.answer)) for c, e in zip(completions, examples)) / len(examples)
    if format_check is None: return accuracy
    return accuracy, sum(bool(format_check(c)) for c in completions) / len(examples)


def peak_rss_mb() -> float:
    "The peak RSS since the last `reset_peak_rss` (VmHWM), else since the process started."
    try: return status_mib("VmHWM")
    except (OSError, KeyError): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mb() -> float:
    "Resident memory now (VmRSS), in MiB: the baseline the peak is compared with."
    return status_mib("VmRSS")


# ----------------------------------------------------------------------------------------------------------------- rlnb
def setup_rlnb(args, task, seed: int, beta: float | None = None, model_tok=None, ref_kind: str | None = None) -> dict:
    "rlnb's pieces for a GRPO + LoRA run with the benchmark's settings: state, configs and an empty record."
    from rlnb.core import TrainingConfig, TrainingState, set_seed
    from rlnb.models import apply_lora
    from rlnb.rollouts import create_rollout_fn
    from rlnb.kl import create_frozen_copy, create_reference_model
    from rlnb.algorithms import create_algorithm_config
    from rlnb.step import create_optimizer

    beta = args.beta if beta is None else beta
    ref_kind = ref_kind or ("lora" if beta > 0 else "none")
    set_seed(seed)
    model, tok = model_tok if model_tok is not None else load_policy(args)
    targets = lora_targets(model)
    model = apply_lora(model, r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0, target_modules=targets)
    gc.collect()
    peak_reset = reset_peak_rss()  # so the peak is that of training, not of imports and loading
    rss_before_ref = current_rss_mb()
    make_ref = {"none": None, "lora": create_reference_model, "copy": create_frozen_copy}[ref_kind]
    ref = make_ref(model) if make_ref is not None else None  # "lora": AdapterDisabledRef(model), no copy
    optimizer, scheduler = create_optimizer(model, learning_rate=args.lr, weight_decay=0.0, warmup_steps=0)
    B = args.prompts * args.group
    pair = ALGORITHM_PAIRS[args.algorithm]
    # dynamic_sampling / overlong_buffer: TRL has neither, so they are off (they act in `train`'s rollout_fn, which this
    # script does not use: its rollout_fn below is the plain one; set here so the recorded config says so)
    tcfg = TrainingConfig(num_iterations=args.steps, prompts_per_step=args.prompts, group_size=args.group,
                          learning_rate=args.lr, max_grad_norm=1.0, updates_per_batch=1, micro_batch_size=B,
                          seed=seed, eval_every=0, beta=beta, temperature=args.temperature,
                          max_new_tokens=args.max_new_tokens, lora_r=args.lora_r, algorithm=pair["rlnb"],
                          dynamic_sampling=False, overlong_buffer=0, mixed_precision="no")  # float32 unless asked
    if args.algorithm == "grpo":
        algo = create_algorithm_config(
            "grpo", beta=beta, clip_eps=0.2, scale=args.scale_rewards, aggregation=LOSS_TYPES[args.loss_type],
            max_completion_length=args.max_new_tokens if args.loss_type == "dr_grpo" else None)
    else:
        extra = dict(scale=args.scale_rewards) if args.algorithm == "dapo" else {}
        algo = create_algorithm_config(pair["rlnb"], {**pair["rlnb_config"], **extra}, beta=beta, clip_eps=0.2)
    # top_p 1, top_k off: plain sampling
    rollout_fn = create_rollout_fn(task.reward_fn, system_prompt=task.system_prompt)
    state = TrainingState(0, 0, model, optimizer, scheduler, ref_model=ref, metadata={"config": tcfg})
    return dict(side="rlnb", state=state, tok=tok, task=task, rollout_fn=rollout_fn, algo=algo, tcfg=tcfg, ref=ref,
                ref_kind=ref_kind, targets=targets, rss_before_ref_mb=rss_before_ref, peak_reset=peak_reset,
                step_s=[], cpu_s=[], rewards=[], kl=[], rollout_s=[], track_rss=args.probe is None, step_rss=[])


def rss_mark(track: bool) -> float | None:
    "With `track`: reset the peak-RSS mark and return the RSS now (MiB), the start of one step's memory reading."
    if not track: return None
    reset_peak_rss(); return current_rss_mb()


def rss_read(before: float | None) -> tuple[float, float] | None:
    "(peak RSS since `rss_mark`, RSS just before it) in MiB, or None when not tracked."
    return None if before is None else (peak_rss_mb(), before)


def rlnb_step(ctx: dict, prompts) -> None:
    "One rlnb iteration (sample the group rollouts, score, one GRPO update): `training_iteration`, timed."
    from rlnb.training import training_iteration
    rss = rss_mark(ctx["track_rss"])  # not in the memory probes: they read the peak over all their steps
    t, c = time.perf_counter(), time.process_time()
    state, _, stats = training_iteration(ctx["state"], prompts, tokenizer=ctx["tok"], config=ctx["tcfg"],
                                         rollout_fn=ctx["rollout_fn"], algorithm_config=ctx["algo"])
    ctx["step_s"].append(time.perf_counter() - t); ctx["cpu_s"].append(time.process_time() - c)
    if rss is not None: ctx["step_rss"].append(rss_read(rss))
    m = stats.custom_metrics or {}
    ctx["state"] = state
    ctx["rewards"].append(m.get("reward/mean"))
    ctx["kl"].append(m.get("kl/mean"))
    ctx["rollout_s"].append(m.get("time/rollout_s"))


def finish_rlnb(ctx: dict) -> dict:
    model = ctx["state"].model
    return dict(side="rlnb", step_s=ctx["step_s"], cpu_s=ctx["cpu_s"], rewards=ctx["rewards"], kl=ctx["kl"],
                rollout_s=ctx["rollout_s"], step_rss=ctx["step_rss"],
                trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad), targets=ctx["targets"],
                ref_kind=ctx["ref_kind"], model=model, tok=ctx["tok"])


# ------------------------------------------------------------------------------------------------------------------ TRL
def run_trl(args, task, prompts, seed: int, rlnb_ctx: dict | None = None,
            config_overrides: dict | None = None, instrument=None) -> dict:
    """TRL's GRPOTrainer on a fresh copy of the model (`load_policy`); per-step times and rewards from a callback.
    `config_overrides`: more TRL config fields (benchmarks/vllm_step.py: use_vllm=True, vllm_mode="colocate").
    `instrument(trainer)`, if given, runs before training (benchmarks/phases.py times the trainer's phases with it).
    With `rlnb_ctx`, one rlnb step runs between TRL's steps (before TRL's odd steps, after its even ones), outside
    TRL's timed window, so both sides see the same machine load over time."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    import trl
    pair = ALGORITHM_PAIRS[args.algorithm]
    Trainer = getattr(trl, pair["trl"])
    Config = getattr(trl, pair["trl"].replace("Trainer", "Config"))
    from rlnb.core import set_seed

    set_seed(seed)
    model, tok = load_policy(args)
    targets = lora_targets(model)
    rows = [{"prompt": messages(task, ex.prompt), "answer": ex.answer} for step in prompts for ex in step]
    dataset = Dataset.from_list(rows)  # in step order; shuffle_dataset=False keeps it so
    correct = text_reward(task)  # = task.reward_fn on the completion text (rlnb's rollout_fn calls task.reward_fn)

    class Timer(TrainerCallback):
        def __init__(self):
            self.t, self.c, self.step_s, self.cpu_s, self.logs, self.k = 0.0, 0.0, [], [], [], 0
            self.rss, self.step_rss = None, []  # peak RSS during each step (see rss_mark)
        def on_step_begin(self, a, state, control, **kw):
            if rlnb_ctx is not None and self.k % 2 == 1: rlnb_step(rlnb_ctx, prompts[self.k])
            self.rss = rss_mark(True)
            self.t, self.c = time.perf_counter(), time.process_time()
        def on_step_end(self, a, state, control, **kw):
            self.step_s.append(time.perf_counter() - self.t); self.cpu_s.append(time.process_time() - self.c)
            self.step_rss.append(rss_read(self.rss))
            if rlnb_ctx is not None and self.k % 2 == 0: rlnb_step(rlnb_ctx, prompts[self.k])
            self.k += 1
        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs: self.logs.append(dict(logs))

    B = args.prompts * args.group
    algo_kw = dict(loss_type=args.loss_type) if args.algorithm == "grpo" else dict(pair["trl_config"])
    if pair["trl"] == "GRPOTrainer": algo_kw["scale_rewards"] = args.scale_rewards
    algo_kw["beta"] = args.beta
    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="grpo_vs_trl_"), use_cpu=True, bf16=False, fp16=False, seed=seed,
        max_steps=args.steps, per_device_train_batch_size=B, gradient_accumulation_steps=1, generation_batch_size=B,
        num_generations=args.group, max_completion_length=args.max_new_tokens, temperature=args.temperature,
        top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, optim="adamw_torch", epsilon=0.2,
        num_iterations=1, mask_truncated_completions=False, **algo_kw,
        shuffle_dataset=False, gradient_checkpointing=False, disable_dropout=True, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
        remove_unused_columns=False)
    config = Config(**{**settings, **(config_overrides or {})})  # an override replaces a setting (e.g. bf16=True)
    peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules=targets,
                             bias="none", task_type="CAUSAL_LM")
    timer = Timer()
    t0 = time.perf_counter()
    trainer = Trainer(model=model, reward_funcs=correct, args=config, train_dataset=dataset, processing_class=tok,
                          peft_config=peft_config, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # no per-step print (disable_tqdm adds it); keeps TRL's overhead down
    rollout_s, generate_and_score = [], trainer._generate_and_score_completions
    # the same phase as rlnb's `time/rollout_s`: sample, reward, (reference log-probs)
    def timed_generate_and_score(*a, **kw):
        t = time.perf_counter()
        out = generate_and_score(*a, **kw)
        rollout_s.append(time.perf_counter() - t)
        return out
    trainer._generate_and_score_completions = timed_generate_and_score
    if instrument is not None: instrument(trainer)
    torch.set_num_threads(args.threads)  # in case anything reset it
    setup_s = time.perf_counter() - t0
    trainer.train()
    policy = trainer.model
    return dict(side="trl", setup_s=setup_s, step_s=timer.step_s, cpu_s=timer.cpu_s,
                rewards=[l["reward"] for l in timer.logs], kl=[l.get("kl") for l in timer.logs],
                rollout_s=rollout_s, step_rss=timer.step_rss,
                trainable_params=sum(p.numel() for p in policy.parameters() if p.requires_grad),
                targets=targets, model=policy, tok=tok)


def run_pair(args, task, seed: int, eval_examples) -> dict:
    "Both sides for one seed: interleaved step by step (default) or one after the other."
    prompts = [task.sample(args.prompts, seed=seed * 1_000_003 + it) for it in range(args.steps)]
    runs = {}
    if args.mode == "interleaved":
        ctx = setup_rlnb(args, task, seed)
        runs["trl"] = run_trl(args, task, prompts, seed, rlnb_ctx=ctx)
        runs["rlnb"] = finish_rlnb(ctx)
    else:
        for side in args.order.split(","):
            if side == "trl": runs["trl"] = run_trl(args, task, prompts, seed)
            else:
                ctx = setup_rlnb(args, task, seed)
                for k in range(args.steps): rlnb_step(ctx, prompts[k])
                runs["rlnb"] = finish_rlnb(ctx)
    for run in runs.values():
        if eval_examples:
            acc = greedy_accuracy(run["model"], run["tok"], eval_examples, task.check, args.max_new_tokens,
                                  task.system_prompt, getattr(task, "format_check", None))
            run["accuracy"], run["greedy_form"] = acc if isinstance(acc, tuple) else (acc, None)
        run.pop("model"); run.pop("tok")
    gc.collect()
    return runs


# --------------------------------------------------------------------------------------------------------------- memory
def storage_bytes(*modules) -> int:
    "Bytes of the distinct tensor storages behind `modules`' parameters and buffers (shared storage counted once)."
    seen, total = set(), 0
    for m in modules:
        if m is None: continue
        m = getattr(m, "model", m) if not hasattr(m, "parameters") else m  # AdapterDisabledRef -> the policy it wraps
        for t in list(m.parameters()) + list(m.buffers()):
            s = t.untyped_storage()
            if s.data_ptr() not in seen: seen.add(s.data_ptr()); total += s.nbytes()
    return total


def wide_model(tok):
    "A randomly initialised ~25M-parameter model with the tiny tokenizer: big enough that a copy shows in the RSS."
    from rlnb.tiny import create_tiny_model
    return create_tiny_model(tok, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                            intermediate_size=1536).train()


def memory_probe(args, spec: str) -> dict:
    "In a fresh process: a few rlnb steps with reference `kind` on `which` model; peak RSS and storage bytes."
    which, kind = spec.split(":")
    setup_torch(args.threads)
    from rlnb.tasks import get_task
    task = get_task(args.task)
    model, tok = load_sft(args.task)
    if which == "wide": model = wide_model(tok)
    base_params = sum(p.numel() for p in model.parameters())
    gc.collect()
    beta = 0.0 if kind == "none" else args.memory_beta
    seed = int(args.seeds.split(",")[0])
    ctx = setup_rlnb(args, task, seed, beta=beta, model_tok=(model, tok), ref_kind=kind)
    for k in range(args.memory_steps): rlnb_step(ctx, task.sample(args.prompts, seed=seed * 1_000_003 + k))
    policy, ref = ctx["state"].model, ctx["ref"]
    ref_module = getattr(ref, "model", ref)
    return dict(model=which, ref_kind=kind, beta=beta, base_params=base_params, ref_is_policy=ref_module is policy,
                ref_type=type(ref).__name__, policy_bytes=storage_bytes(policy),
                policy_plus_ref_bytes=storage_bytes(policy, ref_module),
                rss_before_ref_mb=ctx["rss_before_ref_mb"], peak_rss_mb=peak_rss_mb(), peak_reset=ctx["peak_reset"],
                step_s=ctx["step_s"], kl=ctx["kl"][-1])


def run_memory_probes(args) -> list[dict]:
    models = ["tiny", "wide"] if args.memory_model == "both" else [args.memory_model]
    out = []
    for which in models:
        for kind in ("none", "lora", "copy"):
            prompts, group = map(int, args.wide_batch.split("x")) if which == "wide" else (args.prompts, args.group)
            cmd = [sys.executable, __file__, "--probe", f"{which}:{kind}", "--task", args.task,
                   "--prompts", str(prompts), "--group", str(group), "--max-new-tokens", str(args.max_new_tokens),
                   "--lr", str(args.lr),
                   "--lora-r", str(args.lora_r), "--seeds", args.seeds, "--threads", str(args.threads),
                   "--memory-beta", str(args.memory_beta), "--memory-steps", str(args.memory_steps),
                   "--steps", str(max(args.memory_steps, 1)), "--loss-type", args.loss_type,
                   "--algorithm", args.algorithm]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
            if proc.returncode or not line:
                print(f"memory probe {which}:{kind} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
                continue
            out.append(json.loads(line[-1][6:]))
            r = out[-1]
            print(f"  probe {which:4s} ({prompts}x{group}) ref={kind:4s}: peak RSS {r['peak_rss_mb']:7.1f} MB "
                  f"({r['peak_rss_mb'] - r['rss_before_ref_mb']:+6.1f} over the RSS before the reference), "
                  f"weights+ref storage {r['policy_plus_ref_bytes'] / 2**20:6.1f} MB "
                  f"(policy {r['policy_bytes'] / 2**20:.1f} MB), ref is policy: {r['ref_is_policy']}")
    return out


# -------------------------------------------------------------------------------------------------------------- report
def mean(xs): xs = [x for x in xs if x is not None]; return sum(xs) / len(xs) if xs else float("nan")
def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2 if xs else float("nan")


def std(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2: return 0.0
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def summarize(run: dict, k: int = 5) -> dict:
    "One run's numbers: mean step time over steps 2..N (step 1 includes one-off warm-up), rewards at start and end."
    steady, cpu = run["step_s"][1:] or run["step_s"], run["cpu_s"][1:] or run["cpu_s"]
    rss = [r for r in (run.get("step_rss") or [])[1:] if r is not None]  # step 1 also pages in mmapped weights
    mem = dict(step_peak_rss_mb=max(p for p, _ in rss), step_rss_growth_mb=max(p - b for p, b in rss)) if rss else {}
    return dict(**mem,
                s_per_step=mean(steady), s_per_step_median=median(steady), cpu_s_per_step=mean(cpu),
                first_step_s=run["step_s"][0],
                reward_start=mean(run["rewards"][:k]), reward_end=mean(run["rewards"][-k:]),
                reward_mean=mean(run["rewards"]),
                accuracy=run.get("accuracy"), greedy_form=run.get("greedy_form"),
                rollout_s_per_step=mean(run["rollout_s"][1:]),
                update_s_per_step=mean([a - b for a, b in zip(run["step_s"][1:], run["rollout_s"][1:])]))


def over_seeds(per_seed: list[dict]) -> dict:
    "Mean and std over seeds of every number in the per-seed summaries."
    keys = [k for k, v in per_seed[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: (mean([s[k] for s in per_seed]), std([s[k] for s in per_seed])) for k in keys}


def plot(all_runs: list[dict], args, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = {"rlnb": "tab:blue", "trl": "tab:orange"}
    for side, label in (("rlnb", f"rlnb {ALGORITHM_PAIRS[args.algorithm]['rlnb']}"),
                        ("trl", f"TRL {ALGORITHM_PAIRS[args.algorithm]['trl']}")):
        curves = [runs[side]["rewards"] for runs in all_runs]
        times = [runs[side]["step_s"] for runs in all_runs]
        n = min(len(c) for c in curves)
        steps = list(range(1, n + 1))
        for c in curves: ax.plot(steps, c[:n], color=colors[side], alpha=0.25, lw=1)
        ax.plot(steps, [mean([c[i] for c in curves]) for i in range(n)], color=colors[side], lw=2.5,
                label=f"{label} (mean of {len(curves)} seeds)")
        bx.plot(steps, [mean([t[i] for t in times]) for i in range(n)], color=colors[side], lw=2, marker="o", ms=3,
                label=label)
    model = "" if args.model == "tiny" else f"{args.model}, "
    ylabel = "mean reward (fraction correct)" if args.model == "tiny" else "mean reward ((correct + 0.5 form) / 1.5)"
    ax.set(title=f"Mean sampled reward per step: {model}{args.task}, {args.prompts} prompts x {args.group}, "
                 f"LoRA r={args.lora_r}", xlabel="optimizer step", ylabel=ylabel, ylim=(-0.02, 1.02))
    bx.set(title=f"Seconds per step (CPU, {args.threads} thread(s), mean over seeds)", xlabel="optimizer step",
           ylabel="seconds", ylim=(0, None))
    for a in (ax, bx): a.grid(alpha=0.3); a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_table(summary: dict, nseeds: int):
    rows = [("seconds / step (mean of steps 2..N)", "s_per_step", "{:.3f}"),
            ("seconds / step (median)", "s_per_step_median", "{:.3f}"),
            ("  of which sampling + scoring", "rollout_s_per_step", "{:.3f}"),
            ("  of which the update", "update_s_per_step", "{:.3f}"),
            ("process CPU seconds / step", "cpu_s_per_step", "{:.3f}"),
            ("first step, s (warm-up)", "first_step_s", "{:.2f}"),
            ("mean reward, first 5 steps", "reward_start", "{:.3f}"),
            ("mean reward, last 5 steps", "reward_end", "{:.3f}"),
            ("mean reward, all steps", "reward_mean", "{:.3f}"),
            ("greedy accuracy after (held-out)", "accuracy", "{:.3f}"),
            ("greedy replies with the form", "greedy_form", "{:.3f}"),
            ("peak RSS during a step, MiB (process)", "step_peak_rss_mb", "{:.0f}"),
            ("  its growth over the RSS before, MiB", "step_rss_growth_mb", "{:.0f}")]
    r, t = summary["rlnb"], summary["trl"]
    pm = lambda v, f: f.format(v[0]) + (" ± " + f.format(v[1]) if nseeds > 1 else "")
    print(f"\n{'(mean ± std over %d seed%s)' % (nseeds, 's' if nseeds > 1 else ''):38s} "
          f"{'rlnb':>16s} {'TRL':>16s} {'rlnb/TRL':>9s}")
    for label, key, f in rows:
        if key not in r or key not in t: continue
        ratio = f"{r[key][0] / t[key][0]:9.2f}" if t[key][0] else ""
        print(f"{label:38s} {pm(r[key], f):>16s} {pm(t[key], f):>16s} {ratio}")


def main(argv=None):
    args = parse_args(argv)
    if args.probe:
        print("PROBE " + json.dumps(memory_probe(args, args.probe)))
        return
    torch = setup_torch(args.threads)
    import peft, transformers, trl
    task = create_task(args)
    check_text_reward(task)  # TRL's reward function = task.reward_fn
    seeds = [int(x) for x in args.seeds.split(",")]
    eval_examples = task.sample(args.eval_size, seed=987_654) if args.eval_size else []
    t_load = time.perf_counter()
    model = load_policy(args)[0]  # the cached model (SFT tiny or converted GGUF) exists before anything is timed
    t_load = time.perf_counter() - t_load
    shares = shares_prompts(model); del model
    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"peft {peft.__version__}; "
          f"{torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, load average {load_start[0]:.1f} (1 min)")
    chat = f" (chat; system prompt {task.system_prompt!r})" if task.system_prompt else ""
    print(f"model {args.model}, task {task.name}{chat}; rlnb's shared-prompt prefill (sampling and log-probs): "
          + {True: "on", False: "OFF (its check finds no KV-cache argument in the model's forward)", None: "?"}[shares])
    print(f"{args.steps} steps x {args.prompts} prompts x {args.group} samples, "
          f"{args.max_new_tokens} new tokens, lr {args.lr}, "
          f"LoRA r={args.lora_r} alpha={2 * args.lora_r}, beta {args.beta}, T={args.temperature}, "
          f"algorithm {args.algorithm} (rlnb {ALGORITHM_PAIRS[args.algorithm]['rlnb']} vs TRL "
          f"{ALGORITHM_PAIRS[args.algorithm]['trl']} {ALGORITHM_PAIRS[args.algorithm]['trl_config'] or ''})"
          + (f", loss {args.loss_type}" if args.algorithm == "grpo" else "") + f", "
          f"scale_rewards {args.scale_rewards}, seeds {seeds}, {args.mode}")
    all_runs, per_seed = [], {"rlnb": [], "trl": []}
    t0 = time.perf_counter()
    for seed in seeds:
        runs = run_pair(args, task, seed, eval_examples)
        all_runs.append(runs)
        for side in ("rlnb", "trl"):
            s = summarize(runs[side]); per_seed[side].append(s)
            print(f"seed {seed} {side:4s}: {s['s_per_step']:.3f} s/step (first {s['first_step_s']:.2f}), "
                  f"reward {s['reward_start']:.3f} -> {s['reward_end']:.3f}, "
                  f"greedy accuracy {s['accuracy'] if s['accuracy'] is None else round(s['accuracy'], 3)}",
                  flush=True)
    elapsed = time.perf_counter() - t0
    load_end = os.getloadavg()
    summary = {side: over_seeds(v) for side, v in per_seed.items()}
    print_table(summary, len(seeds))
    r, t = summary["rlnb"], summary["trl"]
    speed = r["s_per_step"][0] / t["s_per_step"][0]
    cpu = r["cpu_s_per_step"][0] / t["cpu_s_per_step"][0]
    print(f"\nspeed: rlnb takes {speed:.2f}x TRL's seconds per step, {cpu:.2f}x its CPU seconds per step "
          f"(target <= {args.target}x: {'met' if speed <= args.target else 'NOT met'})")
    print(f"reward: last 5 steps rlnb {r['reward_end'][0]:.3f} vs TRL {t['reward_end'][0]:.3f}; "
          f"all steps {r['reward_mean'][0]:.3f} vs {t['reward_mean'][0]:.3f} "
          f"(at least as good: {'yes' if r['reward_mean'][0] >= t['reward_mean'][0] - 1e-9 else 'no'})")
    print(f"{elapsed:.0f} s for the comparison; load average {load_start[0]:.1f} at start, "
          f"{load_end[0]:.1f} at end (1 min)")
    memory = []
    if not args.skip_memory and args.model != "tiny":
        print("\n(memory probes: tiny model only; skipped for --model " + args.model + ")")
    elif not args.skip_memory:
        print(f"\n== peak memory of rlnb, one process each: "
              f"no reference (beta 0) / LoRA reference (adapters off) / frozen copy; "
              f"beta {args.memory_beta}, {args.memory_steps} steps ==", flush=True)
        memory = run_memory_probes(args)
        for which in ("tiny", "wide"):
            by = {m["ref_kind"]: m for m in memory if m["model"] == which}
            if "none" in by and "lora" in by:
                d = lambda k: ((by[k]["peak_rss_mb"] - by[k]["rss_before_ref_mb"])
                               - (by["none"]["peak_rss_mb"] - by["none"]["rss_before_ref_mb"]))
                print(f"  {which}: training's peak RSS growth vs no reference: LoRA reference {d('lora'):+.1f} MB"
                      + (f", frozen copy {d('copy'):+.1f} MB" if "copy" in by else "")
                      + f" (the model's weights: {by['none']['policy_bytes'] / 2**20:.1f} MB)")
    if args.plot:
        plot(all_runs, args, args.plot); print(f"\nplot: {args.plot}")
    if args.json:
        info = dict(args=vars(args),
                    versions=dict(torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__,
                                  peft=peft.__version__, python=platform.python_version()),
                    cpus=os.cpu_count(), load_average=dict(start=load_start, end=load_end),
                    model_load_s=t_load, shared_prompt_prefill=shares,
                    elapsed_s=elapsed, summary=summary, per_seed=per_seed, runs=all_runs, memory=memory)
        Path(args.json).write_text(json.dumps(info, indent=1, default=str)); print(f"json: {args.json}")


if __name__ == "__main__":
    main()
