"""Self-distillation (opsd, sdpo): the hints, the hinted policy's log-probs, the signal against a loop and TRL's
sampled-token SDPO loss, collate, the spec check, bad knobs, and runs in `train`, a schedule and the notebook."""
import json
from pathlib import Path

import pytest
import torch

from rlnb.algorithms import (ALGORITHMS, AlgorithmSpec, check_algorithm_spec, compute_batch_advantages,
                             compute_loss_by_algorithm, create_algorithm_config, grpo_loss)
from rlnb.core import Batch, CollatedBatch, Generation, Rollout, TrainingConfig, collate, set_seed
from rlnb.distillation import (answer_hint, check_self_distillation_config, compute_self_distillation_advantages,
                               create_self_teacher_rollout_fn, self_teacher_logprobs, successful_attempt_hint)
from rlnb.logprobs import compute_logprobs_for_tokens
from rlnb.tiny import create_tiny_model, load_tiny_model
from rlnb.training import train

torch.set_num_threads(1)
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0, seed=0)
STUDENT = torch.tensor([[-0.5, -2.0, -1.0], [-1.5, -0.1, -9.0]])
TEACHER = torch.tensor([[-0.2, -3.0, -1.0], [-0.5, -0.1, -1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def batch_of(old, teacher, mask):
    "A CollatedBatch around (B, C) log-probs; the token ids do not matter to the loss."
    B, C = old.shape
    ids = torch.zeros(B, 1 + C, dtype=torch.long)
    return CollatedBatch(ids, torch.ones_like(ids), ids[:, 1:], mask.float(), mask.float(), torch.zeros(B),
                         torch.arange(B), old, None, 1, teacher_logprobs=teacher)


@pytest.mark.parametrize("name", ["opsd", "sdpo"])
def test_hand_worked_numbers(name):
    lp = STUDENT.clone().requires_grad_(True)
    loss, _ = compute_loss_by_algorithm(batch_of(STUDENT, TEACHER, MASK), lp, create_algorithm_config(name))
    loss.backward()
    assert abs(loss.item() + 0.06) < 1e-6  # -(0.3 - 1 + 0 + 1 + 0) / 5
    torch.testing.assert_close(lp.grad, -torch.tensor([[0.3, -1.0, 0.0], [1.0, 0.0, 0.0]]) / 5)
    unhinted = torch.stack([TEACHER[0], STUDENT[1]])  # row 1 scored under its own prompt: no signal
    loss, _ = compute_loss_by_algorithm(batch_of(STUDENT, unhinted, MASK), STUDENT.clone().requires_grad_(True),
                                        create_algorithm_config(name))
    assert abs(loss.item() - 0.14) < 1e-6  # -(0.3 - 1 + 0) / 5


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_equals_a_naive_loop(aggregation):
    set_seed(0)
    B, C = 5, 7
    old = -torch.rand(B, C) * 3
    teacher = old + torch.randn(B, C)
    mask = (torch.arange(C)[None] < torch.tensor([7, 3, 5, 1, 6])[:, None]).long()
    lp = (old + torch.randn(B, C) * 0.3).requires_grad_(True)
    fast, _ = compute_loss_by_algorithm(batch_of(old, teacher, mask), lp,
                                        create_algorithm_config("opsd", teacher_coef=0.5, aggregation=aggregation))
    rows, total, count = [], 0.0, 0
    for b in range(B):
        row, n = 0.0, 0
        for t in range(C):
            if not mask[b, t]: continue
            a = 0.5 * (float(teacher[b, t]) - float(old[b, t]))
            r = torch.exp(lp[b, t] - float(old[b, t]))
            tok = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a)
            row, n, total, count = row + tok, n + 1, total + tok, count + 1
        rows.append(row / max(n, 1))
    slow = total / count if aggregation == "token_mean" else sum(rows) / len(rows)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(torch.autograd.grad(fast, lp)[0], torch.autograd.grad(slow, lp)[0])


def test_gradient_equals_trls_sampled_token_sdpo_loss(monkeypatch):
    "TRL's SDPO (distillation_mode='sampled_token', the sequence mean over the mask) has our gradient on a fresh batch."
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    # TRL is a benchmark extra (`pip install trl`), not in the main install: skipped where it is missing
    loss_utils = pytest.importorskip("trl.experimental.sdpo.loss_utils")
    compute_sampled_token_self_distillation_loss = loss_utils.compute_sampled_token_self_distillation_loss
    torch.manual_seed(0)
    B, C, V = 3, 5, 7
    student_logits = torch.randn(B, C, V, requires_grad=True)
    teacher_logits = torch.randn(B, C, V) * 2
    ids = torch.randint(V, (B, C))
    mask = (torch.arange(C)[None] < torch.tensor([5, 2, 4])[:, None]).float()
    per_token = compute_sampled_token_self_distillation_loss(student_logits, teacher_logits, ids,
                                                             distillation_alpha=1.0)  # (B, C)
    trl = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    g_trl, = torch.autograd.grad(trl, student_logits)
    lp = student_logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]  # (B, C) with grad
    teacher = teacher_logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    ours, _ = compute_loss_by_algorithm(batch_of(lp.detach(), teacher, mask), lp,
                                        create_algorithm_config("sdpo", aggregation="sequence_mean"))
    g_ours, = torch.autograd.grad(ours, student_logits)
    torch.testing.assert_close(g_ours, g_trl)


def rollout(text, reward, group=0, answer="146"):
    return Rollout("p", Generation(text, [1]), [0], [1], rewards=reward, group_index=group, answer=answer,
                   metadata={"question": "49+97="})


def test_hints_read_the_task_record_and_the_group_never_the_completion():
    group = [rollout("135", 0.0), rollout("146", 1.0), rollout("155", 0.0)]
    assert answer_hint(group[0]) == "49+97=\n\nThe answer is: 146"
    assert "135" not in answer_hint(group[0])  # the student's own completion is not the hint
    assert answer_hint(group[0]._replace(answer=None)) is None
    assert "146" in successful_attempt_hint(group[0], group) and "155" not in successful_attempt_hint(group[2], group)
    assert successful_attempt_hint(group[1], group) is None  # its own success is no demonstration
    assert successful_attempt_hint(group[0], group, success_threshold=2.0) is None


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


def test_hinted_log_probs_equal_one_row_at_a_time(tiny):
    model, tok = tiny
    rows = [Rollout("p", prompt_token_ids=tok.encode("12+3="), token_ids=tok.encode("15") + [tok.eos_token_id]),
            Rollout("p", prompt_token_ids=tok.encode("7+7="), token_ids=tok.encode("4"))]
    prompts = ["12+3= is 15. 12+3=", tok.encode("7+7=")]
    batched = self_teacher_logprobs(model, tok, rows, prompts)  # (2, 3)
    for i, (r, p) in enumerate(zip(rows, prompts)):
        ids = tok.encode(p) if isinstance(p, str) else p
        full = torch.tensor([ids + list(r.token_ids)])
        with torch.no_grad():
            one = compute_logprobs_for_tokens(model, full, torch.ones_like(full), len(r.token_ids))[0]
        torch.testing.assert_close(batched[i, :len(r.token_ids)], one, rtol=1e-4, atol=1e-5)
        assert (batched[i, len(r.token_ids):] == 0).all()


def test_rollout_wrapper_writes_teacher_logprobs_and_collate_reads_them(tiny):
    model, tok = tiny
    def rollout_fn(model, tokenizer, prompts, config):
        return Batch([Rollout("p", Generation("15", [1]), tok.encode("12+3="), tok.encode("15"), rewards=r,
                              group_index=0, answer="15", metadata={"question": "12+3="}) for r in (1.0, 0.0)])
    plain = lambda conversation, tokenizer: conversation.messages[-1].content  # the hint as the whole prompt
    wrapped = create_self_teacher_rollout_fn(successful_attempt_hint)(rollout_fn, template_fn=plain)
    batch = wrapped(model, tok, ["12+3="], TrainingConfig())
    assert batch.batch_metadata["self_distillation/hinted_frac"] == 0.5  # only row 1 has a solved sibling
    cb = collate(batch, tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        own = compute_logprobs_for_tokens(model, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1])
    torch.testing.assert_close(cb.teacher_logprobs[0], own[0])  # no hint: the teacher is the student
    assert not torch.allclose(cb.teacher_logprobs[1], own[1])
    partial = [batch.rollouts[0], batch.rollouts[1]._replace(metadata={})]
    with pytest.raises(ValueError, match="teacher_logprobs"): collate(partial, tok.pad_token_id)


def test_a_frozen_teacher_model_reads_the_hint_in_place_of_the_policy(tiny):
    model, tok = tiny
    other = create_tiny_model(tok, seed=1)  # untrained: other weights
    def rollout_fn(model, tokenizer, prompts, config):
        return Batch([Rollout("p", Generation("15", [1]), tok.encode("12+3="), tok.encode("15"), answer="15",
                              metadata={"question": "12+3="})])
    plain = lambda conversation, tokenizer: conversation.messages[-1].content
    live = create_self_teacher_rollout_fn(answer_hint)(rollout_fn, template_fn=plain)(model, tok, [], TrainingConfig())
    base = create_self_teacher_rollout_fn(answer_hint, teacher_model=other)(rollout_fn, template_fn=plain)(
        model, tok, [], TrainingConfig())
    hinted = "12+3=\n\nThe answer is: 15"
    for batch, scorer in ((live, model), (base, other)):
        want = self_teacher_logprobs(scorer, tok, batch.rollouts, [hinted])[0, :2].tolist()
        assert batch.rollouts[0].metadata["teacher_logprobs"] == pytest.approx(want, abs=1e-5)
    assert live.rollouts[0].metadata["teacher_logprobs"] != pytest.approx(base.rollouts[0].metadata["teacher_logprobs"])


def test_spec_check_accepts_a_teacher_field_its_wrapper_fills():
    spec = AlgorithmSpec(compute_self_distillation_advantages, grpo_loss, dict(ALGORITHMS["opsd"].default_config),
                         needs_old_logprobs=True)
    with pytest.raises(ValueError, match="rollout_wrapper"): check_algorithm_spec(spec)
    check_algorithm_spec(spec._replace(rollout_wrapper=create_self_teacher_rollout_fn()))
    with pytest.raises(TypeError, match="hint_fn"): create_self_teacher_rollout_fn("answer")


@pytest.mark.parametrize("name", ["opsd", "sdpo"])
@pytest.mark.parametrize("options,error,match", [
    ({"teacher_coef": 0.0}, ValueError, "teacher_coef"), ({"teacher_coef": -1.0}, ValueError, "teacher_coef"),
    ({"teacher_coef": float("nan")}, ValueError, "teacher_coef"), ({"teacher_coef": "1"}, TypeError, "teacher_coef"),
    ({"clip_eps": 1.5}, ValueError, "clip_eps"), ({"hint": "x"}, ValueError, "hint")])
def test_bad_knobs_are_refused_before_any_model_loads(name, options, error, match, monkeypatch):
    import rlnb.training
    monkeypatch.setattr(rlnb.training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"), raising=False)
    with pytest.raises(error, match=match):
        train(TrainingConfig(algorithm=name, algorithm_options=options, **SMALL))
    if error is ValueError and "teacher_coef" in options:
        with pytest.raises(ValueError, match="teacher_coef"):
            check_self_distillation_config({"name": name, **options})


def test_a_run_without_the_rollouts_teacher_says_what_to_do():
    with pytest.raises(ValueError, match="create_self_teacher_rollout_fn"):
        compute_batch_advantages(batch_of(STUDENT, None, MASK), create_algorithm_config("opsd"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["opsd", "sdpo"])
def test_runs_by_name_and_after_grpo_in_a_schedule(name):
    state = train(TrainingConfig(algorithm=name, algorithm_options={"teacher_coef": 0.5}, **SMALL), progress=False)
    last = state.stats_history[-1].custom_metrics
    assert last["algorithm"] == name and "teacher/reverse_kl" in last and "self_distillation/hinted_frac" in last
    seen = []
    train(TrainingConfig(**SMALL), algorithm_config=lambda i: create_algorithm_config("grpo" if i < 1 else name),
          logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == ["grpo", name]


@pytest.mark.slow
def test_each_runs_in_the_papermill_notebook(tmp_path):
    import papermill as pm
    root = Path(__file__).resolve().parent.parent
    for name in ("opsd", "sdpo"):
        out = tmp_path / name
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), algorithm=name,
                                            algorithm_options={"teacher_coef": 0.5}, num_iterations=2,
                                            prompts_per_step=4, eval_every=0, seed=0))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["algorithm"] for r in rows if "reward/mean" in r] == [name, name], name
