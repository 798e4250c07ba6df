"The dashboard logger and the rollout viewer, headless: widget state after calls and clicks, escaping, real runs."
import time

import pytest
import torch

from rlnb.algorithms import compute_grpo_advantages
from rlnb.core import (Batch, Conversation, Generation, GenerationConfig, Message, Rollout, TrainingState,
                       TrainingStats, create_training_config, rollouts_to_jsonl, set_seed)
from rlnb.kl import create_reference_model
from rlnb.models import apply_lora
from rlnb.rollouts import create_batch_rollouts, score_rollouts
from rlnb.sft import tokenize_sft_example
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.training import train
from rlnb.viewer import group_html, token_values, tokens_html, view_rollouts
from rlnb.widgets import create_dashboard_logger, metrics_html

HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def step(iteration, total=None, **metrics):
    "The (state, stats) pair train would log after `iteration` iterations (with the run's config if `total`)."
    metadata = {"config": create_training_config(num_iterations=total)} if total else None
    metrics = {"reward/mean": 0.1 * iteration, "kl/mean": 0.001, "loss/total": 0.0, "grad_norm": 1.0,
               "time/step_s": 0.1, "time/rollout_s": 0.05, **metrics}
    stats = TrainingStats(0.0, 1.0, 1e-3, 0.0, 0.0, 0.0, metrics)
    return TrainingState(iteration, iteration, None, None, metadata=metadata), stats


def parts(dash):
    "The dashboard's plots (PNG bytes), metrics HTML and samples HTML."
    (plots, text), samples = dash.widget.children[0].children, dash.widget.children[1]
    return bytes(plots.value), text.value, samples.value


# ---------------------------------------------------------------- the dashboard

@pytest.mark.slow
def test_dashboard_updates_on_every_call_when_unthrottled():
    dash = create_dashboard_logger(every_s=0, max_overhead=1.0, display=False)
    seen = set()
    for it in range(1, 6):
        dash(*step(it, total=5))
        png, text, _ = parts(dash)
        assert png.startswith(b"\x89PNG") and f"iteration {it} of 5" in text
        seen.add(png)
    assert len(seen) == 5  # a new picture each time
    assert dash.timing["calls"] == dash.timing["draws"] == dash.timing["text_updates"] == 5 and len(dash.records) == 5
    reward_line = dash.figure.axes[0].lines[1]
    assert list(reward_line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])  # the latest records are drawn


@pytest.mark.slow
def test_dashboard_throttles_to_the_first_and_last_pictures():
    dash = create_dashboard_logger(every_s=1e9, display=False)
    for it in range(1, 21): dash(*step(it, total=20))
    dash(*step(20, total=20, **{"eval/accuracy": 0.75}))  # the final evaluation, after the last step
    assert dash.timing["calls"] == 21 and len(dash.records) == 21
    assert dash.timing["draws"] == 3 and dash.timing["text_updates"] == 3  # first, last step, final evaluation
    _, text, _ = parts(dash)
    assert "iteration 20 of 20" in text and "0.75" in text


@pytest.mark.slow
def test_dashboard_keeps_drawing_within_its_time_budget():
    "With redraws allowed every call by time, the plots still take at most max_overhead of the wall time."
    dash = create_dashboard_logger(every_s=0, max_overhead=0.25, display=False)
    t0, it = time.perf_counter(), 0
    while dash.timing["draws"] < 4 and time.perf_counter() - t0 < 30:
        it += 1
        dash(*step(it))
        time.sleep(0.005)
    elapsed = time.perf_counter() - t0
    assert dash.timing["draws"] >= 4 and it > 4 * dash.timing["draws"]  # most calls did not redraw
    one_draw = dash.timing["draw_s"] / dash.timing["draws"]
    assert dash.timing["busy_s"] - dash.timing["forced_s"] <= 0.25 * elapsed + 2 * one_draw


def test_dashboard_shows_samples_escaped():
    dash = create_dashboard_logger(every_s=0, max_overhead=1.0, display=False, num_groups=2, per_group=2)
    bad = [Rollout(HOSTILE, Generation(HOSTILE), prompt_token_ids=[1], token_ids=[2], rewards=float(k % 2),
                   group_index=0, answer=HOSTILE, metadata={"question": HOSTILE}) for k in range(4)]
    dash.iteration_hook(TrainingState(0, 0, None, None), Batch(bad))
    dash(*step(1))
    _, _, samples = parts(dash)
    assert "<script" not in samples.lower() and "<img" not in samples.lower()
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
    assert samples.count(escaped) == 1 + 2 + 2  # the prompt once, two completions, two answers
    assert "&lt;script&gt;" in metrics_html([{"iteration": 1, "step": 1, HOSTILE: 1.0}])


def test_dashboard_refuses_bad_arguments():
    with pytest.raises(ValueError, match="max_overhead"): create_dashboard_logger(max_overhead=0, display=False)
    with pytest.raises(ValueError, match="`total`"): create_dashboard_logger(total=0, display=False)
    with pytest.raises(ValueError, match="every_s"): create_dashboard_logger(every_s=-1, display=False)


@pytest.mark.slow
def test_dashboard_in_a_real_run():
    dash = create_dashboard_logger(display=False)
    config = create_training_config(num_iterations=3, prompts_per_step=2, group_size=4, eval_every=3, eval_size=8)
    train(config, logger=dash, iteration_hook=dash.iteration_hook, progress=False)
    png, text, samples = parts(dash)
    assert len(dash.records) == 3 + 2  # three steps, evaluations before the first and after the last
    assert len(dash.rollouts) == 2 * 4 and png.startswith(b"\x89PNG") and dash.timing["draws"] >= 2
    assert "iteration 3 of 3" in text and "held-out accuracy" in text
    assert dash.rollouts[0].metadata["question"] in samples


# ---------------------------------------------------------------- the viewer

@pytest.fixture(scope="module")
def batch():
    "A real batch: the tiny model with LoRA adapters, 3 addition prompts x 4 samples; its reference and tokenizer."
    set_seed(0)
    model, tok = load_tiny_model("addition")
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None)
    with torch.no_grad():  # move the adapters away from zero, so the policy differs from its reference
        for name, p in model.named_parameters():
            if "lora_B" in name: p.normal_(0, 0.05)
    task = get_task("addition")
    gen = GenerationConfig(max_new_tokens=6, num_return_sequences=4)
    rollouts = create_batch_rollouts(model, tok, task.sample(3, seed=1), gen, reward_fn=task.reward_fn).rollouts
    return rollouts, model, create_reference_model(model), tok


def test_token_values_are_the_librarys(batch):
    rollouts, model, ref, tok = batch
    vals = token_values(rollouts, model, tok, ref_model=ref)
    scored = score_rollouts(rollouts, model, tok, ref_model=ref)
    for i, r in enumerate(scored):
        assert vals["logprob"][i] == pytest.approx(r.logprobs, abs=1e-5)
        assert vals["kl"][i] == pytest.approx(r.per_token_kl, abs=1e-5)
    assert max(max(row) for row in vals["kl"]) > 0  # the policy really differs from its reference
    adv = compute_grpo_advantages([r.rewards for r in rollouts], [r.group_index for r in rollouts])
    assert [row[0] for row in vals["advantage"]] == pytest.approx(adv.tolist(), abs=1e-6)
    assert all(len(vals[k][i]) == len(r.token_ids) for k in vals for i, r in enumerate(rollouts))
    custom = token_values(rollouts, advantage_fn=lambda r, g: r * 10)
    assert [row[0] for row in custom["advantage"]] == [10 * r.rewards for r in rollouts]
    assert "logprob" not in custom and "entropy" not in custom  # no model, no log-probs on the records


def test_viewer_follows_the_chosen_group_and_quantity(batch):
    rollouts, model, ref, tok = batch
    v = view_rollouts(rollouts, tok, model=model, ref_model=ref)
    assert v.quantity.options == ("logprob", "entropy", "kl", "advantage", "loss_mask")
    first = v.html.value
    assert rollouts[0].metadata["question"] in first and rollouts[4].metadata["question"] not in first
    v.group.value = 1
    assert v.html.value != first and rollouts[4].metadata["question"] in v.html.value
    assert v.html.value == group_html(rollouts, v.tokens, v.values, 1, "logprob")
    v.quantity.value = "kl"
    assert v.html.value == group_html(rollouts, v.tokens, v.values, 1, "kl")
    assert v.html.value != group_html(rollouts, v.tokens, v.values, 1, "logprob")
    assert 'title="kl = ' in v.html.value and 'title="logprob = ' not in v.html.value
    assert v.html.value.count('class="rlnb-rollout"') == 4
    assert v.html.value.count('class="rlnb-tok"') == sum(len(r.token_ids) for r in rollouts[4:8])


def test_tokens_html_escapes_colours_and_masks():
    page = tokens_html(["<b>", HOSTILE, "ok\n"], [0.0, 1.0, float("nan")], [1, 0, 1], label='"><script>')
    assert "<script" not in page.lower() and "<img" not in page.lower() and "<b>" not in page
    assert page.count("not trained (loss_mask 0)") == 1  # the masked token
    assert "background:#440154" in page and "&quot;&gt;&lt;script&gt; = 0" in page  # value 0 at the map's first colour
    assert "ok↵\n" in page
    with pytest.raises(ValueError, match="`mask` has 2 entries, expected 3"): tokens_html(["a", "b", "c"], mask=[1, 0])


def test_viewer_on_a_multi_turn_rollout_and_from_jsonl(batch, tmp_path):
    rollouts, model, ref, tok = batch
    calls = ({"name": "calculator", "arguments": {"expression": "2+3"}},)
    results = ({"name": "calculator", "content": "5", "error": None},)
    conv = Conversation((Message("user", "2+3="), Message("assistant", '<tool_call>{"name": "calculator"}</tool_call>'),
                         Message("tool", "5"), Message("assistant", "5")))
    episode = tokenize_sft_example(conv, tok)._replace(tool_calls=calls, tool_results=results, rewards=1.0,
                                                       group_index=9)
    masked = list(episode.loss_mask).count(0)
    assert masked > 0
    v = view_rollouts([episode], tok, model=model, ref_model=ref, quantity="entropy")
    assert v.html.value.count("not trained (loss_mask 0)") == masked
    assert "calculator({&quot;expression&quot;: &quot;2+3&quot;})" in v.html.value and "tool results" in v.html.value
    saved = score_rollouts(list(rollouts) + [episode], model, tok, ref_model=ref)
    path = rollouts_to_jsonl(saved, tmp_path / "batch.jsonl")
    in_memory, from_file = view_rollouts(saved, tok, group=9), view_rollouts(path, tok, group=9)
    assert from_file.quantity.options == ("logprob", "kl", "advantage", "loss_mask")
    assert from_file.html.value == in_memory.html.value  # the file gives back exactly what was saved
    from_file.group.value = 2
    assert from_file.html.value == group_html(saved, in_memory.tokens, in_memory.values, 2, "logprob")


def test_viewer_escapes_hostile_records(batch):
    _, _, _, tok = batch
    ids = tok(HOSTILE, add_special_tokens=False)["input_ids"]
    r = Rollout(HOSTILE, Generation(HOSTILE), prompt_token_ids=[1], token_ids=ids,
                rewards=1.0, group_index=0, answer=HOSTILE, metadata={"question": HOSTILE},
                tool_calls=({"name": HOSTILE, "arguments": {"x": HOSTILE}},), tool_results=({"content": HOSTILE},))
    page = view_rollouts([r], tok, values={HOSTILE: [[0.5] * len(r.token_ids)]}, quantity=HOSTILE).html.value
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert page.count("&lt;script&gt;") >= 5  # question, prompt, tool call, tool result, colour bar label


def test_viewer_refuses_bad_input(batch):
    rollouts, _, _, tok = batch
    with pytest.raises(ValueError, match="`rollouts` is empty"): view_rollouts([], tok)
    with pytest.raises(TypeError, match=r"rollouts\[0\] is a str"): view_rollouts(["2+3="], tok)
    with pytest.raises(ValueError, match="choose one of"):
        view_rollouts(rollouts, tok, quantity="entropy")  # entropy needs a model
    with pytest.raises(ValueError, match="no group 7"): view_rollouts(rollouts, tok, group=7)
    with pytest.raises(ValueError, match=r"values\['x'\] has 1 rows, expected 12"):
        view_rollouts(rollouts, tok, values={"x": [[0.0]]})
    with pytest.raises(ValueError, match=r"values\['x'\]\[0\] has 0 entries"):
        view_rollouts(rollouts, tok, values={"x": [[]] * 12})
