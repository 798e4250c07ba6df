"Every extension point reaches a training run: one test per hook, each failing if `train` dropped the hook."
import pytest
import torch

import rlnb
from rlnb.core import Batch, Generation, TrainingConfig, create_training_config
from rlnb.algorithms import compute_loss_by_algorithm, create_algorithm_config
from rlnb.models import MODEL_LOADERS, TOKENIZER_LOADERS
from rlnb.rollouts import create_batch_rollouts
from rlnb.tasks import TaskExample, get_task
from rlnb.tiny import load_tiny_model
from rlnb.training import train

torch.set_num_threads(1)
TASK = get_task("addition")
CFG = create_training_config(num_iterations=3, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


def run(config=CFG, **hooks):
    rows = []
    user_logger = hooks.pop("logger", None)
    loggers = [lambda s, st: rows.append(dict(st.custom_metrics))] + ([user_logger] if user_logger else [])
    state = train(config, logger=loggers, progress=False, **hooks)
    return state, rows


def test_reward_fn():
    _, rows = run(reward_fn=lambda r: 0.7)
    assert all(r["reward/mean"] == pytest.approx(0.7) for r in rows)


@pytest.mark.slow
def test_prompt_loader_and_prompts():
    seen = []
    reward = lambda r: seen.append(r.metadata["question"]) or 0.0
    # the loader decides how many prompts: prompts_per_step stays at its default
    run(CFG._replace(prompts_per_step=TrainingConfig().prompts_per_step),
        prompt_loader=lambda it: [TaskExample(f"{it}+1=", str(it + 1))] * 2, reward_fn=reward)
    assert set(seen) == {"0+1=", "1+1=", "2+1="}
    seen.clear()
    run(prompts=["5+5=", "6+6=", "7+7="], reward_fn=reward)
    assert set(seen) <= {"5+5=", "6+6=", "7+7="} and len(seen) == 3 * 2 * 4


def test_generator():
    def fixed(model, tokenizer, prompts, config):
        ids = tokenizer("42", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [Generation("42", token_ids=ids, finish_reason="stop")
                for _ in range(len(prompts) * config.num_return_sequences)]
    texts = []
    run(generator=fixed, reward_fn=lambda r: texts.append(r.generation.text) or 0.0)
    assert texts and set(texts) == {"42"}


@pytest.mark.slow
def test_template_fn_and_system_prompt():
    prompts = []
    template = lambda conv, tok: "Q: " + conv.messages[-1].content + " A:"
    run(template_fn=template, reward_fn=lambda r: prompts.append(r.prompt) or 0.0)
    assert prompts and all(p.startswith("Q: ") and p.endswith(" A:") for p in prompts)
    prompts.clear()
    run(system_prompt="Be exact.", reward_fn=lambda r: prompts.append(r.prompt) or 0.0)
    assert prompts and all("Be exact." in p for p in prompts)


def test_tool_parser():
    calls = []
    run(tool_parser=lambda text: [{"name": "calc", "arguments": {"text": text}}],
        reward_fn=lambda r: calls.append(len(r.tool_calls)) or 0.0)
    assert calls and set(calls) == {1}


def test_rollout_fn():
    used = []
    def rollout_fn(model, tokenizer, prompts, config):
        used.append(config.group_size)
        gen = rlnb.GenerationConfig(max_new_tokens=4, num_return_sequences=config.group_size)
        return create_batch_rollouts(model, tokenizer, prompts, gen, reward_fn=lambda r: 0.25)
    _, rows = run(rollout_fn=rollout_fn)
    assert used == [4, 4, 4] and all(r["reward/mean"] == pytest.approx(0.25) for r in rows)


def test_loss_fn():
    def loss_fn(batch, logprobs, config):
        loss, metrics = compute_loss_by_algorithm(batch, logprobs, config)
        return loss, {**metrics, "custom/rows": float(batch.input_ids.shape[0])}
    _, rows = run(loss_fn=loss_fn)
    assert [r["custom/rows"] for r in rows] == [8.0, 8.0, 8.0]


def test_reward_transform():
    seen = []
    def transform(rewards, group_ids, rollouts):
        seen.append(len(rollouts))
        return torch.zeros_like(rewards)
    _, rows = run(reward_transform=transform)
    assert seen == [8, 8, 8] and all(r["reward/zero_std_frac"] == 1.0 for r in rows)


def test_kl_fn():
    _, rows = run(kl_fn=lambda lp, ref: torch.full_like(lp, 5.0))  # at beta 0 too: a kl_fn given is measured each step
    assert len(rows) == 3 and all(r["kl/mean"] == pytest.approx(5.0) for r in rows)


def test_ref_model_update_fn():
    steps = []
    run(ref_model_update_fn=lambda ref, policy, step: steps.append(step) or ref)
    assert steps == [1, 2, 3]


def test_optimizer_step_fn():
    def step(state, max_grad_norm):
        state.optimizer.zero_grad(set_to_none=True)
        return 0.123
    state, rows = run(optimizer_step_fn=step)
    assert all(r["grad_norm"] == pytest.approx(0.123) for r in rows)
    assert all((p == 0).all() for n, p in state.model.named_parameters() if "lora_B" in n)  # nothing was stepped


def test_eval_fn():
    evals = []
    run(CFG._replace(eval_every=1), eval_fn=lambda s: {"eval/it": float(s.iteration)},
        logger=lambda s, st: evals.append(st.custom_metrics.get("eval/it")))
    assert [e for e in evals if e is not None] == [0.0, 1.0, 2.0, 3.0]


def test_logger_and_checkpoint_fn():
    logged, saved = [], []
    run(CFG._replace(checkpoint_every=1), logger=lambda s, st: logged.append(s.iteration),
        checkpoint_fn=lambda s: saved.append(s.iteration))
    assert logged == [1, 2, 3] and saved == [1, 2, 3]


def test_iteration_hook_and_stop_fn():
    with pytest.warns(UserWarning, match="iteration 1 had nothing to train on"):
        state, rows = run(iteration_hook=lambda s, b: Batch([]) if s.iteration == 1 else None,
                          stop_fn=lambda s, m: s.iteration == 2)
    assert state.iteration == 2 and [r.get("skipped") for r in rows] == [None, 1.0]


def test_algorithm_config_switch():
    names = []
    run(algorithm_config=lambda it: create_algorithm_config("grpo" if it < 1 else "dr_grpo"),
        logger=lambda s, st: names.append(st.custom_metrics["algorithm"]))
    assert names == ["grpo", "dr_grpo", "dr_grpo"]


def test_model_loader_registry():
    calls = []
    def loader(config):
        calls.append(config.model_name_or_path)
        return load_tiny_model(progress=False)[0]
    MODEL_LOADERS["test-model"], TOKENIZER_LOADERS["test-model"] = loader, lambda c: load_tiny_model(progress=False)[1]
    try: run(CFG._replace(model="test-model"))
    finally: del MODEL_LOADERS["test-model"], TOKENIZER_LOADERS["test-model"]
    assert calls == ["test-model"]
