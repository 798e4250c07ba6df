"""The algorithm zoo, measured: every registered algorithm for the same number of iterations on the same task.

Each (algorithm, seed) run is its own child process with one torch thread (OMP_NUM_THREADS=1, RLNB_NUM_THREADS=1;
`--threads` changes it) and trains for `--iterations` iterations with TrainingConfig's cosine schedule (a linear
warm-up of `--warmup` optimizer steps, then a cosine decay to 10% of the peak at the last iteration), that
algorithm's settings from `SETTINGS` below and its registered defaults otherwise. `--workers` runs go side by side
(on a 2-core machine use at most 2). The tasks (`--task`):

- `addition` (default): the tiny model's README main job, `rlnb.quick_start_training(algorithm=NAME,
  num_iterations=N, lr_schedule="cosine", warmup_steps=W, eval_every=E, eval_size=128, seed=SEED, ...)`: 16 prompts
  x 8 samples, 8 new tokens, LoRA r=8; the evaluation is greedy accuracy on 128 held-out sums.
- `tool_use`: the tool-use chapter's task as benchmarks/tool_use.py runs it: the SFT'd model
  (`rlnb.load_tool_use_model()`), `rlnb.tool_use_config(algorithm=NAME, ...)` (8 prompts x 8 episodes, 40 new
  tokens, full fine-tuning), `rollout_fn=rlnb.create_tool_use_rollout_fn()`, 2-digit products with a calculator;
  the evaluation is `rlnb.evaluate_tool_use` (128 held-out prompts x 2 episodes at temperature 1, as tool_use.py):
  its reward (the product right), its share of first calls holding the prompt's expression, of replies copying the
  tool's result.
- `smollm2`: a shorter column on a real chat model as benchmarks/smollm2_learning.py runs it:
  `TrainingConfig(model="smollm2")`, 2-digit sums in words, reward (correct + 0.5 form) / 1.5, 8 prompts x 8
  samples, 40 new tokens, temperature 0.7, LoRA r=8, micro-batches of 16; greedy accuracy on 64 held-out prompts.

Learning rates: `SETTINGS` holds the addition task's (measured there). On the other tasks each algorithm gets the
task's GRPO learning rate (tool_use 2e-4, smollm2 2e-4) times its SETTINGS rate over GRPO's (so DPO runs at half).
`opd` learns from a teacher, the task's own start trained further with GRPO and cached (built here once if missing,
see `teacher_dir`): on addition the tiny model after 300 iterations (as chapter 54 caches it), on the tool task the
SFT'd model after 200, on SmolLM2 the model after 30 (LoRA merged). Sweeps saved before every task had a teacher
hold "skipped" opd rows; `--report` prints them as such. On the tool task ReMax's baseline is each prompt's greedy
EPISODE (calls included), and DAPO runs without its overlong penalty (train applies it only with its own rollout_fn).

Recorded per run: every iteration's sampled reward (the task's reward over EVERY completion sampled in the
iteration, including groups that dynamic sampling dropped, so DAPO's number means the same as the others') and its
seconds, and the evaluation every `--eval-every` iterations (also before the first and after the last). Printed: a
markdown table, mean ± std over seeds of the evaluation at the end and at its best, the sampled reward over the
last 10 iterations, seconds per iteration (the iterations' own time, `time/step_s`, the first left out) and that
relative to GRPO's; the tool task adds the right-call and copied-result shares at the end. The last two columns
compare each algorithm's mean end evaluation with GRPO's: the difference, and whether it exceeds the seed noise by
this rule: |difference| > 2 x its standard error, sqrt(s_a^2 / n_a + s_grpo^2 / n_grpo) with s the std over seeds
("yes"), else "no"; an algorithm run with one seed takes GRPO's s (the same seed noise assumed), and with one
seed of both there is no noise estimate ("?"). Drawn: one PNG, sampled reward (top row) and
the evaluation (bottom row) against the iteration, one column per family of algorithms, GRPO in each for
reference, mean ± std over seeds.

    python benchmarks/algorithms.py                                   # all, addition, 200 iterations, seeds 0,1,2
    python benchmarks/algorithms.py --task tool_use --workers 2       # all, the tool task (150 iterations)
    python benchmarks/algorithms.py --task smollm2 --seeds 0 --algorithms grpo,cispo   # SmolLM2, 20 iterations
    .venv-vllm/bin/python benchmarks/algorithms.py --task smollm2 --set all.generator=vllm_bf16 \
        --set all.mixed_precision=bf16 --workers 2   # SmolLM2, sampled by the bf16 engine, bf16 autocast update
    python benchmarks/algorithms.py --algorithms grpo,cispo,remax --iterations 20 --seeds 0 --eval-every 10  # a look
    python benchmarks/algorithms.py --algorithms grpo --set grpo.learning_rate=5e-3   # change one setting
    python benchmarks/algorithms.py --task tool_use --workers 2 --json zoo.json   # saved as each run ends, then
    python benchmarks/algorithms.py --report zoo.json     # the table and zoo.png again (also of a stopped sweep)
    python benchmarks/algorithms.py --workers 2 --json zoo.json --resume   # run only what zoo.json lacks (a stopped
                                                          # sweep, or algorithms registered since)
    python benchmarks/algorithms.py --json zoo.json.gz    # the same, gzip-compressed (a tenth of the size)

Results: benchmarks/README.md, "The algorithm zoo".
"""
from __future__ import annotations
import argparse, gzip, importlib.util, json, math, os, platform, shlex, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed

# Per-algorithm settings on top of TrainingConfig's defaults (the README main job: tiny model, addition, 16 prompts x 8
# samples, 8 new tokens, LoRA r=8, one update per batch; this script sets the schedule: cosine over the run with a
# short warm-up). Keys are TrainingConfig fields;
# anything else goes into `algorithm_options`. Every algorithm keeps its registered defaults otherwise (DAPO: clip
# 0.2/0.28, token-level loss, dynamic sampling with 3x over-sampling and up to 3 rounds, overlong buffer 4;
# REINFORCE++: beta 0.01; DPO: beta 0.1, best vs worst of each group). A registered name missing here gets
# DEFAULT_SETTINGS (GRPO's learning rate).
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
    # on-policy distillation (nbs/54_distillation.ipynb): GRPO's clipped loss with the teacher's per-token signal
    "opd": dict(learning_rate=2e-3),
    # pass@k training (nbs/53_passk.ipynb): GRPO's clipped loss with pass@k advantages (k=4 of each group of 8)
    "grpo_passk": dict(learning_rate=2e-3),
    # sequence-level ratios (nbs/35a_sequence_ratios.ipynb), GRPO's learning rate (not tuned separately): GSPO-token
    # (GSPO's ratio, per-token gradients), LUSPO (GSPO's term times the length), VESPO (a Gamma weight, no clip)
    "gspo_token": dict(learning_rate=2e-3),
    "luspo": dict(learning_rate=2e-3),
    "vespo": dict(learning_rate=2e-3),
    # the 2025-2026 baselines (nbs/52_baselines.ipynb), GRPO's learning rate (not tuned separately)
    "reinforce++_baseline": dict(learning_rate=2e-3),  # group mean, then whitened over the batch's tokens
    "opo": dict(learning_rate=2e-3),  # the group's length-weighted mean reward as baseline
    "gpg": dict(learning_rate=2e-3),  # -A log pi, no clip, advantages scaled by B over the non-zero rewards
    "lite_ppo": dict(learning_rate=2e-3),  # group mean, batch std, token-level loss
    "otb": dict(learning_rate=2e-3),  # a baseline per token, weighted by the realized energy
    # the trust regions of nbs/35b_trust_regions.ipynb, with GRPO's learning rate (not tuned separately): INTELLECT-2's
    # two-sided clip (delta 4), DRO (quadratic log-ratio penalty), TOPR (truncated weight on negatives), M2PO (second
    # moment mask; with the trainer as sampler it masks nothing)
    "intellect2": dict(learning_rate=2e-3),
    "dro": dict(learning_rate=2e-3),
    "topr": dict(learning_rate=2e-3),
    "m2po": dict(learning_rate=2e-3),
    # on-policy self-distillation (nbs/54_distillation.ipynb): opd's signal, the teacher the policy shown the answer
    # (opsd) or a solved sibling (sdpo); GRPO's rate, not measured
    "opsd": dict(learning_rate=2e-3),
    "sdpo": dict(learning_rate=2e-3),
}
DEFAULT_SETTINGS = dict(learning_rate=2e-3)  # GRPO's


# The tasks: the base config of every run (TrainingConfig fields), GRPO's learning rate there, the defaults of the
# command line, and what the evaluation is called in the table and the plot.
TASKS: dict[str, dict] = {
    "addition": dict(config=dict(), grpo_lr=None, iterations=200, eval_every=20, eval_size=128,
                     eval_name="greedy accuracy", eval_short="greedy acc"),
    # DAPO's overlong penalty shapes the reward train hands its own rollout_fn; the tool task's rollout_fn scores
    # episodes itself, so train refuses it there: DAPO runs without it (the rest of the recipe unchanged)
    "tool_use": dict(config=dict(), grpo_lr=2e-4, iterations=150, eval_every=25, eval_size=128,
                     eval_name="held-out reward (2 episodes / prompt, T=1)", eval_short="held-out reward",
                     settings=dict(dapo=dict(overlong_buffer=0))),
    "smollm2": dict(config=dict(model="smollm2", prompts_per_step=8, group_size=8, max_new_tokens=40,
                                temperature=0.7, micro_batch_size=16),
                    grpo_lr=2e-4, iterations=20, eval_every=5, eval_size=64,
                    eval_name="greedy accuracy", eval_short="greedy acc"),
}
# families of algorithms, one plot column each (GRPO drawn in every column); unlisted names go to a last column
FAMILIES = [("GRPO and its variants", ("grpo", "dr_grpo", "dapo", "gspo", "grpo_passk")),
            ("policy losses (chapter 35)", ("cispo", "sapo", "gmpo", "dppo", "clip_cov", "kl_cov")),
            ("sequence-level ratios (chapter 35a)", ("gspo_token", "luspo", "vespo")),
            ("trust regions (chapter 35b)", ("intellect2", "dro", "topr", "m2po")),
            ("advantage baselines", ("maxrl", "gdpo", "remax", "reinforce", "reinforce++", "rloo")),
            ("advantage baselines, 2025-2026", ("reinforce++_baseline", "opo", "gpg", "lite_ppo", "otb")),
            ("DPO, PPO", ("dpo", "ppo")),
            ("distillation (chapter 54)", ("opd", "opsd", "sdpo"))]
# opd's teacher on each task: the task's start after this many GRPO iterations (see teacher_dir; addition's is the one
# chapter 54 caches)
TEACHER_ITERATIONS = dict(addition=300, tool_use=200, smollm2=30)
# the --set all. settings the SmolLM2 teacher takes from its sweep: the sampler and the precision (its folder is named
# after them), which change its speed and, by rounding, its weights, not its recipe
TEACHER_SPEED_SETTINGS = ("generator", "mixed_precision")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="addition", choices=sorted(TASKS), help="the task and model (see above)")
    p.add_argument("--algorithms", default="",
                   help="comma-separated registered names ('' = every one in rlnb.algorithms.ALGORITHMS)")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations of each run (default: addition 200, tool_use 150, smollm2 20)")
    p.add_argument("--warmup", type=int, default=None,
                   help="linear warm-up, in optimizer steps, before the cosine decay (default: 5%% of the iterations)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--grpo-seeds", default=None,
                   help="GRPO's seeds, if not --seeds: the reference of every comparison, so more seeds of it tighten "
                        "them all (e.g. --seeds 0 --grpo-seeds 0,1,2)")
    p.add_argument("--workers", type=int, default=1,
                   help="runs in parallel (at most the cores divided by --threads)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument("--eval-every", type=int, default=None,
                   help="iterations between evaluations (default: addition 20, tool_use 25, smollm2 5); also one "
                        "before the first iteration and one after the last")
    p.add_argument("--eval-size", type=int, default=None,
                   help="held-out prompts per evaluation (default: 128; smollm2 64)")
    p.add_argument("--set", action="append", default=[], metavar="ALGO.FIELD=VALUE",
                   help="change a setting, e.g. grpo.learning_rate=5e-3 or dapo.overlong_buffer=0; 'all.' changes "
                        "it for every algorithm, e.g. all.generator=vllm_bf16 (VALUE: JSON, else text; repeatable)")
    p.add_argument("--plot", default=None, help="PNG of the curves ('' = none; default benchmarks/algorithms.png, "
                                                "algorithms_tool_use.png, algorithms_smollm2.png)")
    p.add_argument("--json", default="", help="write every run (curves included) to this JSON file ('' = none); "
                                               "rewritten as each run ends, marked partial until the sweep ends")
    p.add_argument("--resume", action="store_true",
                   help="with --json: keep the finished runs already in that file whose task, algorithm, seed and "
                        "settings are this sweep's, and run only the others (a stopped sweep, or new algorithms)")
    p.add_argument("--report", default="", metavar="JSON",
                   help="run nothing: print the table of a sweep saved with --json (a stopped one: the runs it "
                        "finished) and draw its plot at --plot (default: the JSON's name, .png); the other options "
                        "are the saved ones")
    p.add_argument("--keep", action="store_true",
                   help="keep the runs' output folders (metrics.jsonl, checkpoint) and print where")
    # internal: run one (algorithm, seed) and print JSON
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    task = TASKS[args.task]
    for key in ("iterations", "eval_every", "eval_size"):
        if getattr(args, key) is None: setattr(args, key, task[key])
    if args.warmup is None: args.warmup = max(1, round(0.05 * args.iterations))
    if args.grpo_seeds is None: args.grpo_seeds = args.seeds
    if args.plot is None and not args.report:
        args.plot = str(HERE / ("algorithms.png" if args.task == "addition" else f"algorithms_{args.task}.png"))
    if args.resume and not args.json: p.error("--resume needs --json FILE: the sweep to continue")
    if args.iterations < 1: p.error(f"--iterations must be >= 1, got {args.iterations}")
    if not 0 <= args.warmup <= args.iterations: p.error(f"--warmup must be in [0, --iterations], got {args.warmup}")
    return args


def settings_for(name: str, changes: list[str], task: str = "addition") -> dict:
    "SETTINGS[name] for `task` (the learning rate scaled to the task's), then the --set changes for `name` or 'all'."
    from rlnb.core import TrainingConfig
    out = dict(SETTINGS.get(name, DEFAULT_SETTINGS))
    grpo_lr = TASKS[task]["grpo_lr"]
    if grpo_lr is not None and "learning_rate" in out:
        out["learning_rate"] = grpo_lr * out["learning_rate"] / SETTINGS["grpo"]["learning_rate"]
    out.update(TASKS[task].get("settings", {}).get(name, {}))
    for change in changes:
        key, _, value = change.partition("=")
        algo, _, field = key.partition(".")
        if algo not in (name, "all"): continue
        try: value = json.loads(value)
        except json.JSONDecodeError: pass  # a plain string
        if field in TrainingConfig._fields: out[field] = value
        else: out.setdefault("algorithm_options", {})[field] = value
    return out


def teacher_dir(task: str, iterations: int | None = None, changes: tuple[str, ...] = ()) -> Path:
    """opd's teacher on `task`, built once and cached: the task's own start trained further with GRPO.

    addition: the tiny model after TEACHER_ITERATIONS["addition"] GRPO iterations, LoRA merged, as chapter 54 caches
    it. tool_use: the SFT'd tool-use model after TEACHER_ITERATIONS["tool_use"] GRPO iterations of the task's own
    settings (`rlnb.tool_use_config`: full fine-tuning, 2e-4, seed 0), on prompts of seed 100 (the runs train on 0,
    1, 2). smollm2: SmolLM2 after TEACHER_ITERATIONS["smollm2"] iterations of the column's GRPO run (cosine, seed
    100), LoRA merged, with the sweep's `--set all.` values of TEACHER_SPEED_SETTINGS (`changes`), which name its
    folder."""
    from rlnb.cache import build_atomically, default_cache_dir
    n = TEACHER_ITERATIONS[task] if iterations is None else iterations
    speed = {}
    if task == "smollm2":
        changed = settings_for("grpo", [c for c in changes if c.startswith("all.")], "smollm2")
        speed = {k: changed[k] for k in TEACHER_SPEED_SETTINGS if k in changed}
    seed = 100 if task == "smollm2" else 0
    folder = default_cache_dir() / "-".join([f"opd-teacher-{task}-grpo{n}-seed{seed}",
                                             *(f"{k}_{v}" for k, v in sorted(speed.items()))])

    def build_addition(path):
        from rlnb.core import TrainingConfig
        from rlnb.tiny import create_tiny_tokenizer
        from rlnb.training import train
        state = train(TrainingConfig(num_iterations=n, eval_every=0, seed=0), progress=False)
        state.model.merge_and_unload().save_pretrained(path)
        create_tiny_tokenizer().save_pretrained(path)

    def build_tool_use(path):
        import rlnb
        model, tokenizer = rlnb.load_tool_use_model()
        products = rlnb.products_task()
        state, _ = rlnb.quick_start_training(rlnb.tool_use_config(num_iterations=n, seed=0), model=model,
                                             tokenizer=tokenizer, prompts=products.sample(20_000, seed=100),
                                             rollout_fn=rlnb.create_tool_use_rollout_fn(products), progress=False)
        state.model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    def build_smollm2(path):
        from rlnb.core import create_training_config
        from rlnb.models import load_tokenizer
        from rlnb.training import train
        config = create_training_config(**{
            **TASKS["smollm2"]["config"], **settings_for("grpo", [], "smollm2"), **speed, "num_iterations": n,
            "lr_schedule": "cosine", "warmup_steps": max(1, round(0.05 * n)), "eval_every": 0, "seed": seed})
        state = train(config, progress=False)
        state.model.merge_and_unload().save_pretrained(path)
        load_tokenizer(config.model).save_pretrained(path)
    build = dict(addition=build_addition, tool_use=build_tool_use, smollm2=build_smollm2)[task]
    if not folder.exists():
        print(f"building opd's teacher for {task} (once, then cached): {n} GRPO iterations -> {folder}", flush=True)
    return build_atomically(folder, build, lambda p: (p / "model.safetensors").exists())


# ---------------------------------------------------------------------------------------------------------- one run
def greedy_episode_baseline(rollout_fn, task):
    "ReMax on the tool task: each prompt's greedy EPISODE (calls and all) is scored as its rollouts' baseline."
    import torch
    from rlnb.core import GenerationConfig
    from rlnb.multiturn import create_multiturn_rollout
    from rlnb.tool_use import TOOL_SYSTEM_PROMPT
    from rlnb.tools import calculator

    def remax_rollout_fn(model, tokenizer, prompts, config):
        prompts = list(prompts)
        batch = rollout_fn(model, tokenizer, prompts, config)
        greedy = GenerationConfig(max_new_tokens=config.max_new_tokens, do_sample=False, num_return_sequences=1)
        with torch.no_grad():
            episodes = create_multiturn_rollout(model, tokenizer, prompts, greedy, tools={"calculator": calculator},
                                                reward_fn=task.reward_fn, timeout_s=None,
                                                system_prompt=TOOL_SYSTEM_PROMPT)
        base = {r.metadata["question"]: float(r.rewards) for r in episodes.rollouts}  # the prompt's '37*48='
        rollouts = [r._replace(metadata={**r.metadata, "baseline_reward": base[r.metadata["question"]]})
                    for r in batch.rollouts]
        stats = {"baseline/greedy_reward": sum(base.values()) / len(base)}
        return batch._replace(rollouts=rollouts, batch_metadata={**(batch.batch_metadata or {}), **stats})
    return remax_rollout_fn


def run_one(spec: dict) -> dict:
    "In this (child) process: one training run, with a logger that records every iteration and evaluation."
    import torch
    import rlnb
    from rlnb.tasks import task_for_policy
    torch.set_num_threads(spec["threads"])
    task_name, settings = spec["task"], spec["settings"]
    base = dict(TASKS[task_name]["config"], algorithm=spec["algorithm"], num_iterations=spec["iterations"],
                lr_schedule="cosine", warmup_steps=spec["warmup"], eval_every=spec["eval_every"],
                eval_size=spec["eval_size"], seed=spec["seed"], output_dir=spec["output_dir"])
    sampled: list[float] = []  # the task's reward of every completion sampled since the last iteration ended

    def counted(reward_fn):  # the task's own reward; also seen for groups that dynamic sampling drops
        def reward(rollout):
            r = reward_fn(rollout)
            sampled.append(float(r))
            return r
        return reward

    iters, evals = [], []

    def logger(state, stats):
        m = stats.custom_metrics or {}
        if any(k.startswith("eval/") for k in m):
            evals.append(dict(iteration=state.iteration, **{k[5:]: v for k, v in m.items() if k.startswith("eval/")}))
            return
        iters.append(dict(iteration=state.iteration, step_s=m.get("time/step_s"), lr=stats.learning_rate,
                          sampled_reward=sum(sampled) / len(sampled) if sampled else None, sampled_n=len(sampled),
                          batch_reward=m.get("reward/mean"), zero_std_frac=m.get("reward/zero_std_frac"),
                          right_call=m.get("tool_use/right_call"), copied_result=m.get("tool_use/copied_result"),
                          greedy_baseline=m.get("baseline/greedy_reward"), kl=m.get("kl/mean"),
                          teacher_kl=m.get("teacher/reverse_kl")))
        sampled.clear()

    t_call = time.perf_counter()
    if task_name == "tool_use":
        model, tokenizer = rlnb.load_tool_use_model()
        task = rlnb.products_task()
        base.pop("eval_size")  # eval_fn below decides it (train refuses a config field it would ignore)
        config = rlnb.tool_use_config(**{**base, **settings})

        def eval_fn(state):
            e = rlnb.evaluate_tool_use(state.model, tokenizer, task, n=spec["eval_size"])
            return dict(value=e["reward"], right_call=e["tool_use/right_call"],
                        copied_result=e["tool_use/copied_result"], calls_per_episode=e["calls_per_episode"])
        if spec["algorithm"] == "opd": config = config._replace(teacher=spec["teacher"])
        rollout_fn = rlnb.create_tool_use_rollout_fn(task._replace(reward_fn=counted(task.reward_fn)))
        if spec["algorithm"] == "remax": rollout_fn = greedy_episode_baseline(rollout_fn, task)
        state, _ = rlnb.quick_start_training(config, model=model, tokenizer=tokenizer,
                                             prompts=task.sample(20_000, seed=spec["seed"]), rollout_fn=rollout_fn,
                                             eval_fn=eval_fn, logger=logger, progress=False)
    else:
        from rlnb.core import create_training_config
        config = create_training_config(**{**base, **settings})
        if spec["algorithm"] == "opd": config = config._replace(teacher=spec["teacher"])
        task = task_for_policy(config.task, config.model, config.task_format)
        state, _ = rlnb.quick_start_training(config, reward_fn=counted(task.reward_fn), logger=logger, progress=False)
        for e in evals: e["value"] = e["accuracy"]
    return dict(algorithm=spec["algorithm"], seed=spec["seed"], task=task_name, settings=settings,
                iterations=int(state.iteration), total_s=time.perf_counter() - t_call,
                threads=torch.get_num_threads(), iters=iters, evals=evals)


def child_env(threads: int) -> dict:
    "The environment of a run's process: `threads` torch and OpenMP threads, no plot window."
    n = str(threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "RLNB_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}


def launch(spec: dict) -> dict:
    "One run in a child process with `spec['threads']` torch threads; its JSON result (or the error)."
    env = child_env(spec["threads"])
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode or not line:
        return dict(algorithm=spec["algorithm"], seed=spec["seed"],
                    error=f"rc={proc.returncode}: {proc.stderr[-3000:]}")
    out = json.loads(line[-1][7:])
    out["process_s"] = time.perf_counter() - t
    out["commit"] = spec.get("commit", "?")
    return out


# ------------------------------------------------------------------------------------------------------------ report
def finite(xs) -> list[float]:
    return [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]


def mean(xs) -> float:
    xs = finite(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def std(xs) -> float:
    "Sample standard deviation (n - 1); 0 for fewer than two values."
    xs = finite(xs)
    if len(xs) < 2: return 0.0
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def beyond_noise(a: list[float], b: list[float], z: float = 2.0) -> tuple[float, float, str]:
    """(mean(a) - mean(b), z x the difference's standard error, 'yes'/'no'). A side with one value takes the other
    side's std (the same seed noise assumed for both); '?' when neither side has two values."""
    a, b = finite(a), finite(b)
    diff = mean(a) - mean(b)
    if len(a) < 2 and len(b) < 2: return diff, float("nan"), "?"
    sa, sb = (std(a) if len(a) > 1 else std(b)), (std(b) if len(b) > 1 else std(a))
    bound = z * (sa ** 2 / len(a) + sb ** 2 / len(b)) ** 0.5
    return diff, bound, "yes" if abs(diff) > bound else "no"


def finished(runs: list[dict]) -> list[dict]:
    "The runs that ran to the end: not failed, not skipped (sweeps saved before every task had opd's teacher)."
    return [r for r in runs if "error" not in r and "skipped" not in r]


def summarize(run: dict, k: int = 10) -> dict:
    "One run's numbers: sampled reward over the first/last k iterations, the evaluation at start, end and best, speed."
    r = [i["sampled_reward"] for i in run["iters"]]
    ev = [e["value"] for e in run["evals"]]
    steps = [i["step_s"] for i in run["iters"]][1:] or [i["step_s"] for i in run["iters"]]  # the first: warm-up
    last = run["evals"][-1] if run["evals"] else {}
    return dict(reward_start=mean(r[:k]), reward_end=mean(r[-k:]), eval_start=ev[0] if ev else float("nan"),
                eval_end=ev[-1] if ev else float("nan"), eval_best=max(ev) if ev else float("nan"),
                right_call_end=last.get("right_call", float("nan")),
                copied_result_end=last.get("copied_result", float("nan")),
                iterations=run["iterations"], s_per_it=mean(steps),
                train_s=sum(finite(i["step_s"] for i in run["iters"])),
                completions_per_it=mean([i["sampled_n"] for i in run["iters"]]))


def columns(task: str) -> list[tuple[str, str, str]]:
    "(header, summary key, format) of the table's mean ± std columns for `task`."
    short = TASKS[task]["eval_short"]
    cols = [(f"{short}, start", "eval_start", "{:.3f}"), (f"{short}, end", "eval_end", "{:.3f}"),
            (f"{short}, best", "eval_best", "{:.3f}")]
    if task == "tool_use":
        cols += [("right call, end", "right_call_end", "{:.2f}"), ("copied result, end", "copied_result_end", "{:.2f}")]
    return cols + [("sampled reward, last 10 it", "reward_end", "{:.3f}"), ("s / it", "s_per_it", "{:.3f}")]


def cell(vals: list[float], f: str) -> str:
    vals = finite(vals)
    if not vals: return "-"
    return f.format(mean(vals)) + (" ± " + f.format(std(vals)) if len(vals) > 1 else "")


def table(by_algo: dict[str, list[dict]], task: str) -> str:
    "The markdown table: mean ± std over seeds per algorithm; s / it and the end evaluation against GRPO's."
    cols = columns(task)
    short = TASKS[task]["eval_short"]
    head = ["algorithm (lr)"] + [c[0] for c in cols] + ["s / it vs GRPO", f"{short} end - GRPO (2 SE)",
                                                          "beyond seed noise"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    sums = {n: [summarize(r) for r in finished(runs)] for n, runs in by_algo.items()}
    grpo = sums.get("grpo") or []
    grpo_speed = mean([s["s_per_it"] for s in grpo])
    for name, runs in by_algo.items():
        if "skipped" in runs[0]:
            lines.append(f"| {name} | skipped: {runs[0]['skipped']} |")
            continue
        ok = sums[name]
        if not ok:
            lines.append(f"| {name} | failed: {runs[0]['error'].strip().splitlines()[-1][:150]!r} |")
            continue
        first = next(r for r in runs if "error" not in r)
        lr = first["settings"].get("learning_rate", float("nan"))
        row = [f"{name} ({lr:g})"] + [cell([s[key] for s in ok], f) for _, key, f in cols]
        row.append(f"{mean([s['s_per_it'] for s in ok]) / grpo_speed:.2f}" if grpo else "-")
        if grpo and name != "grpo":
            diff, bound, verdict = beyond_noise([s["eval_end"] for s in ok], [s["eval_end"] for s in grpo])
            row += [f"{diff:+.3f} ({bound:.3f})" if not math.isnan(bound) else f"{diff:+.3f}", verdict]
        else: row += ["-", "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def caption(task: str, n_seeds: int, n_grpo: int) -> str:
    grpo = f" (GRPO: {n_grpo})" if n_grpo != n_seeds else ""
    return (f"Mean ± std over {n_seeds} seed(s){grpo}. \"{TASKS[task]['eval_short']} end - GRPO (2 SE)\": the "
            "difference of the mean end evaluations and, in brackets, twice its standard error "
            "sqrt(s_a^2/n_a + s_grpo^2/n_grpo) (s: the std over seeds; an algorithm with one seed takes GRPO's); "
            "\"beyond seed noise\" is yes when |difference| > 2 SE (? with one seed of both).")


def per_seed_lines(by_algo: dict[str, list[dict]], task: str) -> str:
    out, short = [], TASKS[task]["eval_short"]
    for name, runs in by_algo.items():
        for r in runs:
            if "skipped" in r: continue
            if "error" in r:
                out.append(f"{name:12s} seed {r['seed']}: FAILED {r['error'][-300:]}")
                continue
            s = summarize(r)
            out.append(f"{name:12s} seed {r['seed']}: sampled reward {s['reward_start']:.3f} -> {s['reward_end']:.3f}, "
                       f"{short} {s['eval_start']:.3f} -> {s['eval_end']:.3f} (best {s['eval_best']:.3f}), "
                       f"{s['iterations']} it, {s['s_per_it']:.3f} s/it")
    return "\n".join(out)


def moving_mean(values: list[float], window: int) -> list[float]:
    "The mean of each value and the (up to) window - 1 before it."
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window: total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def panels(names: list[str]) -> list[tuple[str, list[str]]]:
    "(title, algorithms) per plot column: the families present, GRPO first in each, the unlisted ones last."
    listed = {n for _, family in FAMILIES for n in family}
    groups = [(title, [n for n in family if n in names]) for title, family in FAMILIES]
    groups.append(("others", [n for n in names if n not in listed]))
    ref = ["grpo"] if "grpo" in names else []
    out = [(title, ref + [n for n in group if n != "grpo"]) for title, group in groups if set(group) - {"grpo"}]
    return out or [("GRPO", ref)]


def plot(by_algo: dict[str, list[dict]], args, path: str | None, by_row: bool = False):
    """Sampled reward and the evaluation against the iteration, mean ± std over seeds, one panel pair per family:
    columns (by_row=False: reward on top) or rows (by_row=True, or more than 4 families: reward left, for a page).
    Saved at `path` and closed; with path=None left open for a notebook to show."""
    import matplotlib
    if path: matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = {n: [r for r in finished(runs) if r["iters"]] for n, runs in by_algo.items()}
    names = [n for n in by_algo if ok[n]]
    if not names:
        print("no run finished: nothing to plot")
        return False
    groups = panels(names)
    count = len(groups)
    by_row = by_row or count > 4  # more families than fit side by side on a page
    fig, axes = (plt.subplots(count, 2, figsize=(11, 3.6 * count), squeeze=False) if by_row
                 else plt.subplots(2, count, figsize=(5.2 * count, 7.6), squeeze=False))
    cmap = plt.get_cmap("tab10")
    window = max(1, args.iterations // 20)
    task = TASKS[args.task]
    for col, (title, group) in enumerate(groups):
        ax, bx = (axes[col][0], axes[col][1]) if by_row else (axes[0][col], axes[1][col])
        for i, n in enumerate(group):
            runs = ok[n]
            style = dict(color="black", lw=1.5, ls="--", zorder=5) if n == "grpo" else dict(color=cmap(i % 10), lw=2)
            label = f"{n} (lr {runs[0]['settings'].get('learning_rate', float('nan')):g})"
            for axis, xs, curves in (
                    (ax, [it["iteration"] for it in runs[0]["iters"]],
                     [moving_mean([it["sampled_reward"] for it in r["iters"]], window) for r in runs]),
                    (bx, [e["iteration"] for e in runs[0]["evals"]], [[e["value"] for e in r["evals"]] for r in runs])):
                length = min(len(c) for c in curves)
                m = [mean([c[j] for c in curves]) for j in range(length)]
                s = [std([c[j] for c in curves]) for j in range(length)]
                axis.plot(xs[:length], m, label=label, marker="o" if axis is bx else None, ms=3, **style)
                if len(curves) > 1:
                    axis.fill_between(xs[:length], [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)],
                                      color=style["color"], alpha=0.12, lw=0)
        ax.set(title=f"{title}\nsampled reward (mean of the last {window} iterations)", ylabel="sampled reward")
        bx.set(title=f"{task['eval_name']}\n{args.eval_size} held-out prompts", xlabel="iteration",
               ylabel=task["eval_short"])
        bx.set_ylim(0, 1 if args.task == "addition" else None)
        ax.grid(alpha=0.3)
        bx.grid(alpha=0.3)
        bx.legend(fontsize=7, loc="lower right")  # one legend per column: the same lines in both rows
    seeds, grpo = map(len, seed_lists(args))
    over = f"{seeds} seed(s)" + (f" (GRPO {grpo})" if grpo != seeds else "")
    fig.suptitle(f"{args.task}: {args.iterations} iterations per run, cosine schedule (warm-up {args.warmup}), "
                 f"{args.threads} torch thread(s) per run\nmean ± std over {over}; GRPO dashed in each panel")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / fig.get_figheight()))  # room for the two-line title
    if path:
        fig.savefig(path, dpi=80)
        plt.close(fig)
    return True


def seed_lists(args) -> tuple[list[int], list[int]]:
    "The seeds of every algorithm, and GRPO's."
    return [int(s) for s in args.seeds.split(",")], [int(s) for s in args.grpo_seeds.split(",")]


def report(results: list[dict], names: list[str], args) -> None:
    "Print the table, its caption and the per-seed lines, and draw the plot, from the runs' results."
    by_algo = {n: [r for r in results if r["algorithm"] == n] for n in names}
    waiting = [n for n, runs in by_algo.items() if not runs]
    if waiting: print(f"no finished run yet: {', '.join(waiting)}\n")
    by_algo = {n: runs for n, runs in by_algo.items() if runs}
    seeds, grpo_seeds = seed_lists(args)
    print(table(by_algo, args.task))
    print("\n" + caption(args.task, len(seeds), len(grpo_seeds)))
    print("\n" + per_seed_lines(by_algo, args.task))
    if args.plot and plot(by_algo, args, args.plot): print(f"\nplot: {args.plot}")


def machine() -> dict:
    "The CPU the runs ran on: its model, cores, and whether it has AVX-512 (with bf16), from /proc/cpuinfo."
    info = dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count() or 1,
                system=platform.platform(terse=True), avx512=False, avx512_bf16=False)
    try: text = Path("/proc/cpuinfo").read_text()
    except OSError: return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name": info["cpu"] = value.strip()
        if key.strip() == "flags":
            flags = set(value.split())
            info.update(avx512="avx512f" in flags, avx512_bf16="avx512_bf16" in flags)
            break
    return info


def describe(m: dict) -> str:
    "One line for the machine: 'Intel(R) Xeon(R) ..., 2 cores, AVX-512 with bf16'."
    vector = "AVX-512 with bf16" if m.get("avx512_bf16") else "AVX-512" if m.get("avx512") else "no AVX-512"
    return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {vector}"


def source_commit() -> str:
    "The rlnb commit the runs ran (git describe of the checkout, '+changes' when it had uncommitted changes)."
    try:
        head = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError): return "?"
    return (head or "?") + ("+changes" if dirty else "")


def resumable(path: str, specs: list[dict]) -> list[dict]:
    "The finished runs saved in `path` that are runs of `specs` (same task, algorithm, seed, settings and lengths)."
    if not Path(path).exists(): return []
    info = read_json(path)
    keys = ("task", "iterations", "warmup", "eval_every", "eval_size", "threads")
    wanted = {(s["algorithm"], s["seed"]): s for s in specs}
    kept = []
    for r in finished(info.get("runs", [])):
        spec = wanted.get((r["algorithm"], r["seed"]))
        run_keys = dict(info["args"], task=r.get("task"), threads=r.get("threads"))
        if spec is None or r.get("settings") != spec["settings"]: continue
        if any(run_keys.get(k) != spec[k] for k in keys): continue
        kept.append(r)
    return kept


def save(path: str, args, names: list[str], results: list[dict], cpus: int, load_average: dict, elapsed: float,
         partial: bool = False) -> None:
    "Write every run (curves included), the settings and the machine to a JSON file; `--report` reads it back."
    import torch, transformers
    from rlnb.cache import write_atomically
    command = " ".join(["python", "benchmarks/algorithms.py", *map(shlex.quote, sys.argv[1:])])
    info = dict(command=command, args=vars(args), settings={n: settings_for(n, args.set, args.task) for n in names},
                cpus=cpus,
                versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                              python=platform.python_version()),
                machine=machine(), commits=sorted({r.get("commit", "?") for r in results}),
                load_average=load_average, elapsed_s=elapsed, partial=partial,
                summary={n: [summarize(r) for r in finished(results) if r["algorithm"] == n] for n in names},
                runs=results)
    text = json.dumps(rounded(info), separators=(",", ":"), default=str)
    write_atomically(path, gzip.compress(text.encode(), mtime=0) if path.endswith(".gz") else text)  # never half


def read_json(path: str) -> dict:
    "A sweep saved with --json (gzip-compressed when its name ends in .gz)."
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if path.endswith(".gz") else data)


def rounded(x, digits: int = 6):
    "`x` with every float rounded to `digits` significant digits (a sweep's curves in a file a repository can hold)."
    if isinstance(x, float): return float(f"{x:.{digits}g}")
    if isinstance(x, dict): return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)): return [rounded(v, digits) for v in x]
    return x


def main(argv=None):
    args = parse_args(argv)
    if args.report:  # the table and plot again from a saved sweep (a finished or a stopped one)
        info = read_json(args.report)
        if "task" not in info.get("args", {}):
            sys.exit(f"--report: {args.report} was not saved by this script's --json (no args.task in it)")
        plot = (args.report.removesuffix(".gz").removesuffix(".json") + ".png") if args.plot is None else args.plot
        saved = dict(info["args"], plot=plot)  # never the sweep's own plot: that one may be a recorded figure
        saved.setdefault("grpo_seeds", saved["seeds"])  # saved before --grpo-seeds existed
        saved = argparse.Namespace(**saved)
        if info.get("partial"):
            print(f"{args.report}: a stopped or still running sweep; the table holds the runs it finished, each row's "
                  "± over its finished seeds\n")
        report(info["runs"], list(info["settings"]), saved)
        return
    if args.child:
        import warnings
        warnings.filterwarnings("ignore")
        print("RESULT " + json.dumps(run_one(json.loads(args.child))), flush=True)
        return
    import rlnb
    from rlnb.algorithms import ALGORITHMS
    names = [n for n in args.algorithms.split(",") if n] or list(ALGORITHMS)
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown: sys.exit(f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}")
    seeds, grpo_seeds = seed_lists(args)
    seeds_of = lambda n: grpo_seeds if n == "grpo" else seeds
    cpus = os.cpu_count() or 1
    if args.workers * args.threads > cpus:
        print(f"warning: {args.workers} workers x {args.threads} threads on {cpus} cores: the runs will slow each "
              "other down")
    # build the cached models once, before any child needs them
    if args.task == "tool_use": rlnb.load_tool_use_model()
    elif args.task == "addition":
        from rlnb.tiny import load_tiny_model
        load_tiny_model("addition", progress=False)
    teacher = str(teacher_dir(args.task, changes=tuple(args.set))) if "opd" in names else None
    tmp = Path(tempfile.mkdtemp(prefix="rlnb_algorithms_"))
    specs = [dict(algorithm=n, seed=s, task=args.task, iterations=args.iterations, warmup=args.warmup,
                  eval_every=args.eval_every, eval_size=args.eval_size, threads=args.threads, teacher=teacher,
                  settings=settings_for(n, args.set, args.task), output_dir=str(tmp / f"{n}_seed{s}"))
             for s in sorted(set(seeds) | set(seeds_of("grpo"))) for n in names
             if s in seeds_of(n)]
    commit = source_commit()
    for spec in specs: spec["commit"] = commit
    done = resumable(args.json, specs) if args.resume else []
    if done:
        finished_keys = {(r["algorithm"], r["seed"]) for r in done}
        specs = [s for s in specs if (s["algorithm"], s["seed"]) not in finished_keys]
        print(f"--resume: {len(done)} finished run(s) kept from {args.json}; {len(specs)} to run")
    load_start = os.getloadavg()
    import torch, transformers
    print(f"rlnb {getattr(rlnb, '__version__', '?')}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; {cpus} CPUs, "
          f"load average {load_start[0]:.2f} (1 min) at the start; rlnb at {commit}\nmachine: {describe(machine())}")
    grpo_note = f" (GRPO {len(grpo_seeds)})" if grpo_seeds != seeds else ""
    print(f"task {args.task}: {len(names)} algorithms x {len(seeds)} seeds{grpo_note}, {args.iterations} iterations "
          f"each (cosine, warm-up {args.warmup}), {args.workers} worker(s) x {args.threads} torch thread(s); "
          f"evaluation every {args.eval_every} iterations on {args.eval_size} prompts; runs in {tmp}", flush=True)
    t0 = time.perf_counter()
    results = list(done)
    if args.json:  # a bad path fails now, not after the first run
        save(args.json, args, names, results, cpus, dict(start=load_start), 0.0, partial=True)
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for done in as_completed([pool.submit(launch, spec) for spec in specs]):
            r = done.result()
            results.append(r)
            if args.json:  # after every run, so that a stopped sweep keeps what it finished (see --report)
                save(args.json, args, names, results, cpus, dict(start=load_start), time.perf_counter() - t0,
                     partial=True)
            if "error" in r:
                print(f"  {r['algorithm']} seed {r['seed']}: FAILED\n{r['error']}", flush=True)
                continue
            s = summarize(r)
            print(f"  {r['algorithm']:12s} seed {r['seed']}: {s['iterations']:4d} it, {s['s_per_it']:.3f} s/it, "
                  f"sampled reward {s['reward_start']:.3f} -> {s['reward_end']:.3f}, {TASKS[args.task]['eval_short']} "
                  f"{s['eval_start']:.3f} -> {s['eval_end']:.3f} (best {s['eval_best']:.3f}), "
                  f"{r['process_s']:.0f} s", flush=True)
    elapsed = time.perf_counter() - t0
    load_end = os.getloadavg()
    print(f"\n{elapsed:.0f} s in all; load average {load_start[0]:.2f} at the start, "
          f"{load_end[0]:.2f} at the end (1 min)\n")
    report(results, names, args)
    if args.json:
        save(args.json, args, names, results, cpus, dict(start=load_start, end=load_end), elapsed)
        print(f"json: {args.json}")
    if args.keep: print(f"run folders kept in {tmp}")
    else:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
