"""rlnb.evaluation: one row per model on the held-out prompts of `train`'s evaluation. Greedy accuracy equal to
`create_eval_fn`'s, pass@k equal to `evaluate_pass_at_k`'s, reward, length and format recomputed from the rollouts in
a naive loop, the caller's random state kept, bad inputs refused before any model runs, and a trained model ahead of
its base."""
import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from rlnb.core import GenerationConfig, ModelConfig  # noqa: E402
from rlnb.evaluation import (HELD_OUT_SEED, MAX_EVAL_SAMPLES, MAX_EVAL_SIZE, evaluate_model,  # noqa: E402
                             evaluate_models, pass_at_k_ks, plot_evaluation)
from rlnb.models import load_model, load_tokenizer  # noqa: E402
from rlnb.passk import evaluate_pass_at_k  # noqa: E402
from rlnb.rollouts import create_batch_rollouts, create_eval_fn, greedy_rollouts  # noqa: E402
from rlnb.tasks import get_task  # noqa: E402

torch.set_num_threads(1)
TASK = get_task("addition")


@pytest.fixture(scope="module")
def tiny():
    "The tiny model as `train` builds it for the addition task, and its tokenizer."
    config = ModelConfig("tiny", custom_config={"task": "addition"})
    return load_model(config), load_tokenizer(config)


class _State:  # what an eval_fn reads: the model
    def __init__(self, model): self.model = model


@pytest.mark.parametrize("max_new_tokens", [None, 8])
def test_greedy_accuracy_is_what_train_logs(tiny, max_new_tokens):
    model, tok = tiny
    row = evaluate_model(model, tok, TASK, samples=2, size=40, max_new_tokens=max_new_tokens)
    logged = create_eval_fn(TASK, tok, 40, max_new_tokens=max_new_tokens)(_State(model))["eval/accuracy"]
    assert row["accuracy"] == logged and 0 < logged < 1  # neither trivially 0 nor 1: the comparison means something
    p = row["accuracy"]
    assert row["accuracy_se"] == pytest.approx(math.sqrt(p * (1 - p) / 39), rel=1e-12)


@pytest.mark.parametrize("samples,seed", [(8, 0), (6, 5)])
def test_pass_at_k_is_evaluate_pass_at_k_with_the_same_seed(tiny, samples, seed):
    model, tok = tiny
    row = evaluate_model(model, tok, TASK, samples=samples, size=24, seed=seed)
    ks = pass_at_k_ks(samples)
    curve = evaluate_pass_at_k(model, tok, TASK, n=samples, ks=ks, size=24, seed=seed).curve
    assert [c for c in row if c.startswith("pass@")] == [f"pass@{k}" for k in ks]
    for k in ks: assert row[f"pass@{k}"] == pytest.approx(curve[k], abs=1e-12)
    other = evaluate_model(model, tok, TASK, samples=samples, size=24, seed=seed + 1)
    assert [other[f"pass@{k}"] for k in ks] != [row[f"pass@{k}"] for k in ks]  # the seed is used


def test_reward_length_and_format_from_the_rollouts_by_hand(tiny):
    "A task whose reward is not its correctness and which has a format check: each number recomputed in a loop."
    model, tok = tiny
    two_characters = lambda text: len(text.strip()) == 2
    reward = lambda r: 0.75 * TASK.check(r.generation.text, r.answer) + 0.25 * (len(r.token_ids) == 3)
    task = TASK._replace(reward_fn=reward, format_check=two_characters)
    samples, size, budget = 4, 20, 6
    row = evaluate_model(model, tok, task, samples=samples, size=size, max_new_tokens=budget, temperature=1.3, seed=7)
    examples = task.sample(size, seed=HELD_OUT_SEED)
    greedy = greedy_rollouts(model, tok, examples, budget)
    caller = torch.random.get_rng_state()
    torch.manual_seed(7)
    sampled = create_batch_rollouts(model, tok, examples, GenerationConfig(max_new_tokens=budget, temperature=1.3,
                                                                           num_return_sequences=samples)).rollouts
    torch.random.set_rng_state(caller)
    rewards, lengths, right = [], [], []
    for r in sampled:
        rewards.append(reward(r))
        lengths.append(len(r.token_ids))
        right.append(TASK.check(r.generation.text, r.answer))
    formats = [two_characters(r.generation.text) for r in greedy.rollouts]
    assert row["reward"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-12)
    assert row["length"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-12)
    assert row["format"] == pytest.approx(sum(formats) / len(formats), abs=1e-12)
    assert row["pass@1"] == pytest.approx(sum(right) / len(right), abs=1e-12)
    assert row["reward"] != row["pass@1"] and 0 < row["format"] < 1  # the reward is the task's, not correctness
    assert (row["prompts"], row["samples"], row["temperature"]) == (size, samples, 1.3)
    shifted = task._replace(reward_fn=lambda r: reward(r) + 2)  # a reward beyond 1 still fits in the plot
    table = evaluate_models({"m": (model, tok)}, shifted, samples=samples, size=size, max_new_tokens=budget,
                            temperature=1.3, seed=7)
    assert table.loc["m", "reward"] == pytest.approx(row["reward"] + 2, abs=1e-12)
    ax = plot_evaluation(table).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()][-2:] == ["reward", "format"]
    assert ax.containers[0][-1].get_height() == pytest.approx(row["format"])
    assert ax.get_ylim()[1] > row["reward"] + 2 > 2


def test_a_task_without_format_check_has_no_format_rate(tiny):
    model, tok = tiny
    assert evaluate_model(model, tok, TASK, samples=1, size=4)["format"] is None


def test_the_callers_random_state_is_kept_and_the_row_repeats(tiny):
    model, tok = tiny
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = evaluate_model(model, tok, TASK, samples=4, size=8, seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert evaluate_model(model, tok, TASK, samples=4, size=8, seed=3) == first


def test_the_table_has_a_row_per_model_in_a_fixed_order(tiny):
    model, tok = tiny
    table = evaluate_models({"a": (model, tok), "b": (model, tok)}, TASK, samples=4, size=8, seed=2)
    row = evaluate_model(model, tok, TASK, samples=4, size=8, seed=2)
    assert list(table.index) == ["a", "b"] and table.index.name == "model"
    assert list(table.columns) == ["accuracy", "accuracy_se", "pass@1", "pass@2", "pass@4", "reward", "length",
                                   "format", "prompts", "samples", "temperature"] == list(row)
    for name in ("a", "b"): assert table.loc[name].to_dict() == row
    fig = plot_evaluation(table)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["greedy\naccuracy", "pass@1", "pass@2", "pass@4", "reward"]
    assert [b.get_height() for b in ax.containers[0]] == pytest.approx(
        [row[c] for c in ("accuracy", "pass@1", "pass@2", "pass@4", "reward")])


@pytest.mark.parametrize("kwargs,message", [
    (dict(samples=0), "`samples` must be an int in [1, 1,024]"),
    (dict(samples=MAX_EVAL_SAMPLES + 1), "`samples` must be an int in [1, 1,024]"),
    (dict(samples=2.0), "`samples` must be an int"),
    (dict(size=0), "`size` must be an int in [1, 10,000]"),
    (dict(size=MAX_EVAL_SIZE + 1), "`size` must be an int in [1, 10,000]"),
    (dict(size=True), "`size` must be an int"),
    (dict(max_new_tokens=0), "`max_new_tokens` must be an int"),
    (dict(temperature=0.0), "`temperature`=0 is greedy decoding"),
    (dict(temperature=-1.0), "`temperature` must be a finite number"),
    (dict(seed="0"), "`seed` must be an int"),
])
def test_bad_knobs_are_refused_naming_the_argument(tiny, kwargs, message):
    model, tok = tiny
    with pytest.raises((ValueError, TypeError), match=None) as error:
        evaluate_model(model, tok, TASK, **kwargs)
    assert message in str(error.value) and "evaluate_model" in str(error.value)
    with pytest.raises((ValueError, TypeError)) as error:
        evaluate_models({"base": (model, tok)}, TASK, **kwargs)
    assert message in str(error.value) and "evaluate_models" in str(error.value)


def test_bad_tasks_and_mappings_are_refused(tiny):
    model, tok = tiny
    with pytest.raises(TypeError, match="pass the Task the model was trained on"):
        evaluate_model(model, tok, "addition")
    with pytest.raises(TypeError, match=r"`task` must be a Task with \.sample and \.check"):
        evaluate_model(model, tok, object())
    calls = []
    class NoCheck:  # sample only: refused before it is called
        def sample(self, n, seed=0): calls.append(n)
    with pytest.raises(TypeError, match="`task` must be a Task"): evaluate_models({"m": (model, tok)}, NoCheck())
    assert calls == []
    for models, message in [({}, "`models` is empty"), ([("m", (model, tok))], "`models` must be a dict"),
                            ({"m": model}, r"`models\['m'\]` must be a \(model, tokenizer\) tuple"),
                            ({"m": [model, tok]}, r"must be a \(model, tokenizer\) tuple, got list"),
                            ({"m": (model,)}, r"tuple, got tuple of 1"),
                            ({"m": ("tiny", tok)}, "model must be a torch module"),
                            ({"": (model, tok)}, "non-empty strings"), ({1: (model, tok)}, "non-empty strings")]:
        with pytest.raises((TypeError, ValueError), match=message): evaluate_models(models, TASK)
    with pytest.raises(TypeError, match="`table` must be evaluate_models' DataFrame"): plot_evaluation({"a": 1})


@pytest.mark.slow
def test_a_short_run_beats_its_base_and_its_logged_accuracy_is_the_table_s():
    from rlnb.quickstart import quick_start_training
    state, metrics = quick_start_training(num_iterations=60, progress=False)
    config = state.metadata["config"]
    base_config = ModelConfig("tiny", custom_config={"task": config.task})
    base, tok = load_model(base_config), load_tokenizer(base_config)
    table = evaluate_models({"base": (base, tok), "trained": (state.model, tok)}, TASK, size=config.eval_size,
                            max_new_tokens=config.max_new_tokens)
    assert table.loc["trained", "accuracy"] == metrics["eval/accuracy"].dropna().iloc[-1]
    assert table.loc["base", "accuracy"] == metrics["eval/accuracy"].dropna().iloc[0]  # the run's evaluation at step 0
    gap = table.loc["trained", "accuracy"] - table.loc["base", "accuracy"]
    assert gap > 2 * math.hypot(table.loc["trained", "accuracy_se"], table.loc["base", "accuracy_se"]), table
    with state.model.disable_adapter():  # the base, reached through the peft model
        off = evaluate_model(state.model, tok, TASK, size=config.eval_size, max_new_tokens=config.max_new_tokens)
    assert off == table.loc["base"].to_dict()
