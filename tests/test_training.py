"End-to-end checks of rlnb.training: a short GRPO run learns, runs resume, and run errors name the user's parameter."
import json

import pytest
import torch

from rlnb.core import GenerationConfig, create_training_config
from rlnb.algorithms import create_algorithm_config
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.step import training_step
from rlnb.training import train
from rlnb.rollouts import evaluate_accuracy
from rlnb.quickstart import quick_start_training
from rlnb.loggers import load_metrics
from rlnb.rollouts import create_batch_rollouts
from learnable import first_and_last, learnable_run, lora_policy

torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and far faster on a shared, busy CPU
TASK = get_task("addition")
SMALL = dict(num_iterations=3, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.slow
def test_short_grpo_run_learns(tmp_path):
    "Greedy held-out accuracy rises clearly and the LoRA weights moved: fails if no gradient reaches the model."
    held_out = TASK.sample(128, seed=424242)
    base, tok = load_tiny_model("addition", progress=False)
    acc_before = evaluate_accuracy(base, tok, held_out, TASK.check, max_new_tokens=8)
    # 60 x 16 prompts: at 40 iterations a seed's greedy accuracy still swings by +-0.1
    state, df = quick_start_training(num_iterations=60, eval_every=0, output_dir=str(tmp_path / "run"), progress=False,
                                     seed=0)
    acc_after = evaluate_accuracy(state.model, tok, held_out, TASK.check, max_new_tokens=8)
    lora_b = [p for n, p in state.model.named_parameters() if "lora_B" in n]  # peft initialises B to zero
    assert lora_b and any(p.abs().max() > 0 for p in lora_b), (
        "LoRA B matrices are still zero: no update reached the model")
    first, last = df["reward/mean"].head(10).mean(), df["reward/mean"].tail(10).mean()
    print(f"greedy accuracy {acc_before:.3f} -> {acc_after:.3f}; "
          f"sampled reward (10 iterations) {first:.3f} -> {last:.3f}")
    assert acc_after >= acc_before + 0.05, (acc_before, acc_after)
    assert last > first, (first, last)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[-1])["step"] == 60


@pytest.mark.slow
def test_grpo_learns_a_learnable_reward_by_a_wide_margin():
    "A reward the tiny model can reach fast (answers starting with '1'): the mean reward climbs from ~0.4 to ~1."
    state, tok = lora_policy(lr=3e-3)
    rows, _ = learnable_run(state, tok)
    first, last = first_and_last(rows)
    print(f"reward 'starts with 1': {first:.2f} -> {last:.2f}")
    assert last >= first + 0.3 and last >= 0.85, (first, last)


def test_training_step_refuses_a_loss_without_gradient():
    state, tok = lora_policy()
    batch = create_batch_rollouts(state.model, tok, TASK.sample(2, seed=0),
                                  GenerationConfig(max_new_tokens=6, num_return_sequences=2), reward_fn=TASK.reward_fn)
    constant_loss = lambda cb, logprobs, cfg: (torch.tensor(0.5), {})
    with pytest.raises(RuntimeError, match="no gradient path"):
        training_step(state, batch, create_algorithm_config("grpo"), tokenizer=tok, loss_fn=constant_loss)


def test_nan_loss_stops_the_step_before_the_weights():
    state, tok = lora_policy()
    batch = create_batch_rollouts(state.model, tok, TASK.sample(2, seed=0),
                                  GenerationConfig(max_new_tokens=6, num_return_sequences=2), reward_fn=TASK.reward_fn)
    before = {n: p.detach().clone() for n, p in state.model.named_parameters() if p.requires_grad}
    nan_loss = lambda cb, logprobs, cfg: (logprobs.sum() * float("nan"), {})
    with pytest.raises(FloatingPointError, match="loss is nan"):
        training_step(state, batch, create_algorithm_config("grpo"), tokenizer=tok, loss_fn=nan_loss)
    assert all(torch.equal(p, before[n]) for n, p in state.model.named_parameters() if p.requires_grad)


@pytest.mark.slow
def test_resume_continues_the_step_count_and_the_log_without_duplicates(tmp_path, capsys):
    cfg = create_training_config(**SMALL, output_dir=str(tmp_path), checkpoint_every=1)
    state = train(cfg, progress=False)
    assert (state.iteration, state.global_step) == (3, 3)
    with pytest.raises(ValueError, match="already holds a run; pass resume=True"):
        train(cfg._replace(num_iterations=5), progress=False)
    # a run that died after iteration 3's checkpoint but logged iteration 4: the resumed run must not log it twice
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"iteration": 4, "step": 4, "reward/mean": 0.0}) + "\n")
    state = train(cfg._replace(num_iterations=5, resume=True), progress=False)
    assert "resumed from" in capsys.readouterr().out
    assert (state.iteration, state.global_step, len(state.stats_history)) == (5, 5, 5)
    df = load_metrics(tmp_path / "metrics.jsonl")
    assert df["iteration"].tolist() == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
    """A run of 4 stopped after 2 iterations (a checkpoint, as at a crash) and resumed ends with the same weights as a
    run of 4."""
    cfg = {**SMALL, "num_iterations": 4}  # the same config throughout: the cosine schedule's length is part of the run
    full = train(create_training_config(**cfg, output_dir=str(tmp_path / "a")), progress=False)
    train(create_training_config(**cfg, output_dir=str(tmp_path / "b")), stop_fn=lambda s, m: s.iteration >= 2,
          progress=False)
    resumed = train(create_training_config(**cfg, output_dir=str(tmp_path / "b"), resume=True), progress=False)
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        if "lora_" in n: assert torch.equal(a, b), n


@pytest.mark.parametrize("changes, hooks, message", [
    (dict(group_size=1), {}, "`group_size`=1 with 'grpo'"),
    (dict(prompts_per_step=3), dict(prompt_loader=lambda it: ["1+1="]), "`config.prompts_per_step`=3 would be ignored"),
    (dict(beta=0.1), dict(algorithm_config={"name": "grpo"}), "`config.beta`=0.1 would be ignored"),
    (dict(resume=True), {}, "nothing to resume from"),
    (dict(), dict(rollout_fn=lambda *a: None, reward_fn=lambda r: 1.0), "pass `rollout_fn`, or the hooks it binds"),
])
def test_errors_name_the_users_parameter(changes, hooks, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train(create_training_config(**{**SMALL, **changes}), progress=False, **hooks)


def test_group_size_zero_names_group_size():
    with pytest.raises(ValueError, match="`group_size` must be >= 1"):
        quick_start_training(group_size=0)


def test_vector_reward_trains_with_a_transform():
    from rlnb.reward_transforms import create_reward_transform
    vec = lambda r: [TASK.reward_fn(r), -len(r.token_ids) / 8]
    with pytest.raises(ValueError, match="reward_transform=create_reward_transform"):
        train(create_training_config(**SMALL), reward_fn=vec, progress=False)
    state = train(create_training_config(**SMALL), reward_fn=vec,
                  reward_transform=create_reward_transform(weights=[1, 0.5]), progress=False)
    assert "reward/component_1" in state.stats_history[-1].custom_metrics


def test_quick_start_takes_a_model_object():
    "`model=` is a config field (a name) when it is a str, and the policy itself otherwise."
    model, tok = load_tiny_model("addition", progress=False)
    state, df = quick_start_training(model=model, tokenizer=tok, num_iterations=2, prompts_per_step=2, group_size=4,
                                     eval_every=0, progress=False)
    assert state.iteration == 2 and len(df) == 2


def test_dr_grpo_normaliser_is_the_generation_budget():
    "Dr. GRPO divides by the budget (max_new_tokens), not by the longest completion of the batch."
    from rlnb.algorithms import compute_loss_by_algorithm
    seen = []
    def loss_fn(batch, logprobs, config):
        seen.append((config["max_completion_length"], batch.completion_ids.shape[1]))
        return compute_loss_by_algorithm(batch, logprobs, config)
    train(create_training_config(**SMALL, algorithm="dr_grpo"), loss_fn=loss_fn, progress=False)
    assert seen and all(budget == SMALL["max_new_tokens"] >= width for budget, width in seen), seen


def test_dapo_runs_with_the_papers_dynamic_sampling_and_overlong_penalty():
    """algorithm='dapo' switches on dynamic sampling (with its metrics) and the overlong penalty; the config can turn
    them off."""
    state = train(create_training_config(**SMALL, algorithm="dapo"), progress=False)
    m = state.stats_history[-1].custom_metrics
    assert (m["algorithm"] == "dapo" and m["sampling/rounds"] >= 1
            and m["sampling/groups_kept"] <= SMALL["prompts_per_step"])
    plain = train(create_training_config(**SMALL, algorithm="dapo", dynamic_sampling=False, overlong_buffer=0),
                  progress=False)
    assert "sampling/rounds" not in plain.stats_history[-1].custom_metrics


def test_dpo_refuses_micro_batches_that_split_its_groups():
    with pytest.raises(ValueError, match="`micro_batch_size`=3 would split DPO's groups"):
        train(create_training_config(**SMALL, algorithm="dpo", micro_batch_size=3), progress=False)


def test_switching_across_algorithms_mid_run():
    "GRPO -> DPO -> RLOO -> GSPO in one run, the KL reference shared; each record names the algorithm that ran."
    names = ["grpo", "dpo", "rloo", "gspo"]
    seen = []
    state = train(create_training_config(**{**SMALL, "num_iterations": 4}),
                  algorithm_config=lambda it: create_algorithm_config(names[it]),
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == names and state.global_step == 4


@pytest.mark.slow
def test_a_data_buffer_resumes_the_prompt_stream_exactly(tmp_path):
    """With dynamic sampling drawing extra prompts, a run resumed from iteration 2 draws the prompts (and ends with the
    weights) of a run of 4."""
    from rlnb.rollouts import DataBuffer
    data = TASK.sample(30, seed=7)
    cfg = dict(**{**SMALL, "num_iterations": 4}, dynamic_sampling=True, over_sampling_factor=2)

    def run(out, resume=False, stop_at=None):
        seen = []
        state = train(create_training_config(**cfg, output_dir=str(tmp_path / out), resume=resume),
                      prompts=DataBuffer(data, seed=3),
                      iteration_hook=lambda s, b: seen.append(sorted({r.prompt for r in b.rollouts})),
                      stop_fn=None if stop_at is None else lambda s, m: s.iteration >= stop_at, progress=False)
        return state, seen

    full, seen_full = run("a")
    run("b", stop_at=2)
    resumed, seen_resumed = run("b", resume=True)
    assert seen_resumed == seen_full[2:]
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        if "lora_" in n: assert torch.equal(a, b), n
