"""The learnable reward run that several test files share: the SFT tiny addition model learns to start its answers
with '1' (a mean reward of about 0.4 at the start, about 1 after 20 iterations)."""
from rlnb.core import TrainingState, create_training_config, set_seed
from rlnb.kl import create_reference_model
from rlnb.models import apply_lora
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.step import create_optimizer
from rlnb.training import train

TASK = get_task("addition")
RUN = dict(num_iterations=20, group_size=8, eval_every=0)  # 8 prompts x 8 completions an iteration


def starts_with_1(rollout) -> float:
    "The learnable reward: 1.0 for an answer that starts with '1', else 0.0."
    return float(rollout.generation.text.startswith("1"))


def lora_policy(seed=0, lr=3e-3):
    "(state, tok): after set_seed(seed), the SFT tiny model with fresh LoRA adapters, AdamW at `lr`, its LoRA reference"
    set_seed(seed)
    model, tok = load_tiny_model("addition", progress=False)
    model = apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules=None)
    opt, sched = create_optimizer(model, learning_rate=lr)
    return TrainingState(0, 0, model, opt, sched, ref_model=create_reference_model(model)), tok


def learnable_run(state=None, tok=None, **changes) -> tuple[list[dict], TrainingState]:
    """`RUN` with the TrainingConfig `changes` on the learnable reward, from `state` and `tok` (None: train's own
    start): each logged iteration's custom_metrics, and the state train returns."""
    rows = []
    out = train(create_training_config(**{**RUN, **changes}), initial_state=state, tokenizer=tok,
                prompt_loader=lambda it: TASK.sample(8, seed=it), reward_fn=starts_with_1,
                logger=lambda s, st: rows.append(st.custom_metrics), progress=False)
    return rows, out


def first_and_last(rows, key="reward/mean") -> tuple[float, float]:
    "The mean of `key` over the first 3 rows and over the last 3."
    values = [row[key] for row in rows]
    return sum(values[:3]) / 3, sum(values[-3:]) / 3
