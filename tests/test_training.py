"End-to-end checks of rlnb.training: a short GRPO run learns, checkpoints round-trip atomically, runs resume."
import json

import pytest
import torch

from rlnb.core import GenerationConfig, TrainingConfig, TrainingState, set_seed
from rlnb.algorithms import create_algorithm_config
from rlnb.inference import apply_lora
from rlnb.kl import create_reference_model
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.training import (create_jsonl_logger, create_optimizer, evaluate_accuracy, load_checkpoint, load_metrics,
                           quick_start_training, save_checkpoint, train, training_step)
from rlnb.rollouts import create_batch_rollouts

torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and far faster on a shared, busy CPU
TASK = get_task("addition")


def lora_policy(seed=0, lr=3e-3):
    set_seed(seed)
    model, tok = load_tiny_model("addition", progress=False)
    model = apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules=None)
    opt, sched = create_optimizer(model, learning_rate=lr)
    return TrainingState(0, 0, model, opt, sched, ref_model=create_reference_model(model)), tok


def lora_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_short_grpo_run_learns(tmp_path):
    "Greedy held-out accuracy rises clearly and the LoRA weights moved: fails if no gradient reaches the model."
    held_out = TASK.sample(128, seed=424242)
    base, tok = load_tiny_model("addition", progress=False)
    acc_before = evaluate_accuracy(base, tok, held_out, TASK.check, max_new_tokens=8)
    # 60 x 16 prompts: at 40 iterations a seed's greedy accuracy still swings by +-0.1; here seeds 0-3 gained 0.08-0.13
    state, df = quick_start_training(num_iterations=60, prompts_per_step=16, eval_every=0, output_dir=tmp_path / "run", progress=False, seed=0)
    acc_after = evaluate_accuracy(state.model, tok, held_out, TASK.check, max_new_tokens=8)
    lora_b = [p for n, p in state.model.named_parameters() if "lora_B" in n]  # peft initialises B to zero
    assert lora_b and any(p.abs().max() > 0 for p in lora_b), "LoRA B matrices are still zero: no update reached the model"
    first, last = df["reward/mean"].head(10).mean(), df["reward/mean"].tail(10).mean()
    print(f"greedy accuracy {acc_before:.3f} -> {acc_after:.3f}; sampled reward (10 iterations) {first:.3f} -> {last:.3f}")
    assert acc_after >= acc_before + 0.05, (acc_before, acc_after)
    assert last > first, (first, last)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[-1])["step"] == 60
    assert (tmp_path / "run" / "checkpoint" / "state.json").exists()


def test_grpo_learns_a_learnable_reward_by_a_wide_margin():
    "A reward the tiny model can reach fast (answers starting with '1'): the mean reward climbs from ~0.4 to ~1."
    state, tok = lora_policy(lr=3e-3)
    reward = lambda rollout: float(rollout.generation.text.startswith("1"))
    gen = GenerationConfig(max_new_tokens=8, temperature=1.0, num_return_sequences=8)
    rewards = []
    train(state, lambda it: TASK.sample(8, seed=it), 20, gen, create_algorithm_config("grpo"), reward, tok,
          logger=lambda s, st: rewards.append(st.custom_metrics["reward/mean"]), progress=False)
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"reward 'starts with 1': {first:.2f} -> {last:.2f}")
    assert last >= first + 0.3 and last >= 0.85, (first, last)


def test_training_step_refuses_a_loss_without_gradient():
    state, tok = lora_policy()
    gen = GenerationConfig(max_new_tokens=6, num_return_sequences=2)
    batch = create_batch_rollouts(state.model, tok, TASK.sample(2, seed=0), gen, reward_fn=TASK.reward_fn)
    constant_loss = lambda cb, logprobs, cfg, advantages=None: (torch.tensor(0.5), {})
    with pytest.raises(RuntimeError, match="no gradient path"):
        training_step(state, batch, create_algorithm_config("grpo"), tokenizer=tok, loss_fn=constant_loss)


def test_checkpoint_round_trip_and_atomic_failure(tmp_path):
    state, tok = lora_policy()
    gen = GenerationConfig(max_new_tokens=6, num_return_sequences=4)
    batch = create_batch_rollouts(state.model, tok, TASK.sample(2, seed=0), gen, reward_fn=TASK.reward_fn)
    state, _ = training_step(state, batch, create_algorithm_config("grpo"), tokenizer=tok)
    path = save_checkpoint(state._replace(iteration=5), tmp_path / "ckpt")
    saved = lora_weights(state.model)

    class Broken:  # an optimizer whose state cannot be written
        param_groups = []
        def state_dict(self): raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(state._replace(iteration=9, optimizer=Broken()), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary directory left behind
    assert json.loads((path / "state.json").read_text())["iteration"] == 5  # the previous checkpoint is intact

    fresh, _ = lora_policy(seed=1)
    loaded = load_checkpoint(path, fresh.model, fresh.optimizer, fresh.scheduler)
    assert (loaded.iteration, loaded.global_step) == (5, 1)
    for n, w in lora_weights(fresh.model).items(): assert torch.equal(w, saved[n]), n
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["exp_avg"], state.optimizer.state_dict()["state"][0]["exp_avg"])


def test_full_model_checkpoint_round_trip(tmp_path):
    "Without LoRA the whole model (with its tied embeddings) goes into model.safetensors."
    model, _ = load_tiny_model("addition", progress=False)
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.01)
    opt, _ = create_optimizer(model, learning_rate=1e-4)
    path = save_checkpoint(TrainingState(2, 7, model, opt), tmp_path / "full")
    assert (path / "model.safetensors").exists() and not (path / "adapter_model.safetensors").exists()
    other, _ = load_tiny_model("addition", progress=False)
    load_checkpoint(path, other)
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()): assert torch.equal(a, b), n


def test_resume_continues_the_step_count_and_the_log(tmp_path):
    gen = GenerationConfig(max_new_tokens=6, temperature=1.0, num_return_sequences=4)
    grpo = create_algorithm_config("grpo")
    loader = lambda it: TASK.sample(2, seed=100 + it)
    ckpt, log = tmp_path / "checkpoint", tmp_path / "metrics.jsonl"
    state, tok = lora_policy()
    state = train(state, loader, 2, gen, grpo, TASK.reward_fn, tok, checkpoint_fn=lambda s: save_checkpoint(s, ckpt),
                  checkpoint_every=1, logger=create_jsonl_logger(log), progress=False)
    assert (state.iteration, state.global_step) == (2, 2)
    restarted, tok = lora_policy(seed=3)  # a new process would rebuild the policy from scratch
    state = train(restarted, loader, 3, gen, grpo, TASK.reward_fn, tok, resume_from=ckpt,
                  checkpoint_fn=lambda s: save_checkpoint(s, ckpt), logger=create_jsonl_logger(log), progress=False)
    assert (state.iteration, state.global_step, len(state.stats_history)) == (3, 3, 3)
    df = load_metrics(log)
    assert df["step"].tolist() == [1, 2, 3] and df["iteration"].tolist() == [1, 2, 3]
    assert json.loads((ckpt / "state.json").read_text())["global_step"] == 3


def test_jsonl_logger_appends(tmp_path):
    from rlnb.core import TrainingStats
    log = create_jsonl_logger(tmp_path / "m.jsonl")
    state = TrainingState(0, 0, None, None)
    for i in range(3):
        log(state._replace(iteration=i, global_step=i), TrainingStats(0.1, 0.2, 1e-3, 0.0, 0.5, 0.1, {"reward/mean": i / 10}))
        assert len((tmp_path / "m.jsonl").read_text().splitlines()) == i + 1  # on disk at once
    again = create_jsonl_logger(tmp_path / "m.jsonl")  # a second logger on the same file appends
    again(state._replace(iteration=3, global_step=3), TrainingStats(0.1, 0.2, 1e-3, 0.0, 0.5, 0.1, {"reward/mean": 0.3}))
    assert load_metrics(tmp_path / "m.jsonl")["reward/mean"].tolist() == [0.0, 0.1, 0.2, 0.3]
