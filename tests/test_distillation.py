"On-policy distillation (opd): the per-token signal, its gradient, the registry entry and the teacher in `train`."
import pytest
import torch

from rlnb.algorithms import (aggregate_loss, compute_batch_advantages, compute_loss_by_algorithm,
                             create_algorithm_config, grpo_loss)
from rlnb.core import CollatedBatch, TrainingConfig, set_seed
from rlnb.distillation import compute_distillation_advantages, compute_opd_advantages
from rlnb.kl import attach_teacher, check_same_tokenizer, check_teacher_model, load_teacher, teacher_metrics
from rlnb.models import MODEL_LOADERS, TOKENIZER_LOADERS
from rlnb.tiny import create_tiny_model, create_tiny_tokenizer, load_tiny_model
from rlnb.step import create_training_state, training_step
from rlnb.training import train

torch.set_num_threads(1)
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=2, max_new_tokens=6, eval_every=0, seed=0)


def batch_of(old, teacher, mask):
    "A CollatedBatch around (B, C) log-probs; the token ids do not matter to the loss."
    B, C = old.shape
    ids = torch.zeros(B, 1 + C, dtype=torch.long)
    return CollatedBatch(ids, torch.ones_like(ids), ids[:, 1:], mask.float(), mask.float(), torch.zeros(B),
                         torch.arange(B), old, None, 1, teacher_logprobs=teacher)


STUDENT = torch.tensor([[-0.5, -2.0, -1.0], [-1.5, -0.1, -9.0]])
TEACHER = torch.tensor([[-0.2, -3.0, -1.0], [-0.5, -0.1, -1.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_hand_worked_numbers():
    adv = compute_distillation_advantages(STUDENT, TEACHER, MASK)
    torch.testing.assert_close(adv, torch.tensor([[0.3, -1.0, 0.0], [1.0, 0.0, 0.0]]))
    lp = STUDENT.clone().requires_grad_(True)
    loss, m = compute_loss_by_algorithm(batch_of(STUDENT, TEACHER, MASK), lp, create_algorithm_config("opd"))
    loss.backward()
    assert abs(loss.item() + 0.06) < 1e-6  # -(0.3 - 1 + 0 + 1 + 0) / 5 real tokens
    torch.testing.assert_close(lp.grad, -adv / 5)
    assert abs(teacher_metrics(STUDENT, TEACHER, MASK)["teacher/reverse_kl"] + 0.06) < 1e-6


def naive_loss(logprobs, old, teacher, mask, coef, clip_eps, aggregation):
    "Row by row, token by token: clipped surrogate with A_t = coef (log q - log pi_old)."
    rows, total, count = [], 0.0, 0
    for b in range(len(logprobs)):
        row, n = 0.0, 0
        for t in range(len(logprobs[b])):
            if not mask[b][t]: continue
            a = coef * (float(teacher[b][t]) - float(old[b][t]))
            r = torch.exp(logprobs[b][t] - float(old[b][t]))
            tok = -torch.minimum(r * a, r.clamp(1 - clip_eps, 1 + clip_eps) * a)
            row, n, total, count = row + tok, n + 1, total + tok, count + 1
        rows.append(row / max(n, 1))
    return total / count if aggregation == "token_mean" else sum(rows) / len(rows)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_equals_a_naive_loop(aggregation):
    set_seed(0)
    B, C = 5, 7
    old = -torch.rand(B, C) * 3
    teacher = old + torch.randn(B, C)
    mask = (torch.arange(C)[None] < torch.tensor([7, 3, 5, 1, 6])[:, None]).long()
    lp = (old + torch.randn(B, C) * 0.3).requires_grad_(True)  # after an update: ratios away from 1, some clipped
    cfg = create_algorithm_config("opd", teacher_coef=0.5, aggregation=aggregation)
    fast, m = compute_loss_by_algorithm(batch_of(old, teacher, mask), lp, cfg)
    slow = naive_loss(lp, old, teacher, mask, 0.5, 0.2, aggregation)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(torch.autograd.grad(fast, lp)[0], torch.autograd.grad(slow, lp)[0])
    assert m["clip/ratio"] > 0


def test_expected_gradient_is_the_reverse_kl_gradient():
    "On a (T, V) table whose full distributions are known: E_pi[policy-gradient] = grad KL(pi || q), exactly."
    torch.manual_seed(0)
    T, V = 4, 7
    logits, teacher_logits = torch.randn(T, V, requires_grad=True), torch.randn(T, V) * 2
    s, q = logits.log_softmax(-1), teacher_logits.log_softmax(-1)  # (T, V)
    exact, = torch.autograd.grad((s.exp() * (s - q)).sum(), logits, retain_graph=True)
    lp = s.T  # (V, T): row v is the completion (v, v, ..., v)
    probs = lp.detach().exp()
    weighted = lambda per_token, mask: (per_token * probs).sum()  # the expectation over the student's samples
    loss, _ = grpo_loss(lp, lp.detach(), compute_distillation_advantages(lp.detach(), q.T, torch.ones(V, T)),
                        torch.ones(V, T), aggregation=weighted)
    expected, = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(expected, exact, rtol=1e-5, atol=1e-6)
    # TRL's GKD loss with beta=1 is the full-vocabulary reverse KL: the same gradient
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    logits.grad = None
    trl_loss = gkd.GKDTrainer.generalized_jsd_loss(logits[None], teacher_logits[None], beta=1.0, reduction="sum")
    torch.testing.assert_close(torch.autograd.grad(trl_loss, logits)[0], exact, rtol=1e-5, atol=1e-6)


def test_sampled_gradient_converges():
    torch.manual_seed(1)
    T, V, n = 3, 5, 40_000
    logits, teacher_logits = torch.randn(T, V, requires_grad=True), torch.randn(T, V)
    s, q = logits.log_softmax(-1), teacher_logits.log_softmax(-1)
    exact, = torch.autograd.grad((s.exp() * (s - q)).sum(), logits)
    tokens = torch.distributions.Categorical(logits=logits.detach()).sample((n,))  # (n, T)
    lp = logits.log_softmax(-1)[torch.arange(T), tokens]
    adv = compute_distillation_advantages(lp.detach(), q[torch.arange(T), tokens], torch.ones(n, T))
    grad, = torch.autograd.grad(aggregate_loss(-adv * lp, torch.ones(n, T)), logits)
    assert (grad * T - exact).abs().max() < 0.05


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="compute_opd_advantages: `teacher_logprobs` is None"):
        compute_batch_advantages(batch_of(STUDENT, None, MASK), create_algorithm_config("opd"))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_distillation_advantages(STUDENT, TEACHER[:, :2], MASK)
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_distillation_advantages(STUDENT, torch.full_like(TEACHER, float("nan")), MASK)
    with pytest.raises(ValueError, match="teacher_coef"):
        compute_opd_advantages(torch.zeros(2), torch.arange(2), STUDENT, TEACHER, MASK, teacher_coef=float("inf"))
    with pytest.raises(ValueError, match="no option"):
        create_algorithm_config("opd", teacher_weight=1.0)


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model(progress=False)


def perturbed(model, scale=0.05, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters(): p.add_(scale * torch.randn_like(p))
    return model


def test_micro_batches_give_the_full_batch_gradient(tiny):
    "Every aggregation: micro-batches of 3 rows add up to the whole batch's gradient (the teacher differs)."
    from rlnb.core import GenerationConfig
    from rlnb.rollouts import create_batch_rollouts
    from rlnb.tasks import get_task
    model, tok = tiny
    teacher = perturbed(load_tiny_model(progress=False)[0])
    batch = create_batch_rollouts(model, tok, get_task("addition").sample(4, seed=3),
                                  GenerationConfig(max_new_tokens=6, num_return_sequences=2))
    for aggregation in ("token_mean", "sequence_mean", "constant"):
        grads = []
        for size in (None, 3):
            seen = {}
            def capture(state, max_grad_norm):
                for j, p in enumerate(state.model.parameters()):
                    if p.grad is not None: seen[j] = p.grad.clone()
                state.optimizer.zero_grad(set_to_none=True)
                return 0.0
            config = TrainingConfig(micro_batch_size=size, lora_r=0, max_new_tokens=6)
            state = create_training_state(model, config)._replace(teacher=teacher)
            cfg = create_algorithm_config("opd", aggregation=aggregation)
            training_step(state, batch, cfg, optimizer_step_fn=capture, tokenizer=tok, config=config)
            grads.append(seen)
        assert grads[0] and grads[0].keys() == grads[1].keys()
        for k in grads[0]: torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-4, atol=1e-6)


def test_runs_by_name_in_train_and_learns_toward_the_teacher(tiny):
    rows = []
    teacher = perturbed(load_tiny_model(progress=False)[0], 0.02)
    state = train(TrainingConfig(algorithm="opd", **SMALL), teacher=teacher, progress=False,
                  logger=lambda s, stats: rows.append(stats.custom_metrics))
    assert len(rows) == 2 and all(r["algorithm"] == "opd" for r in rows)
    assert all("teacher/reverse_kl" in r and r["grad_norm"] > 0 for r in rows)
    assert state.teacher is teacher


def test_teacher_by_name_and_switching(tiny):
    "config.teacher names a model; a schedule switches grpo -> opd mid-run (grpo only measures the KL)."
    rows = []
    schedule = lambda it: create_algorithm_config("grpo" if it == 0 else "opd")
    train(TrainingConfig(teacher="tiny", **SMALL), algorithm_config=schedule, progress=False,
          logger=lambda s, stats: rows.append(stats.custom_metrics))
    assert [r["algorithm"] for r in rows] == ["grpo", "opd"]
    assert all("teacher/reverse_kl" in r for r in rows)


def test_clear_errors(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="train: algorithm 'opd' learns from a teacher's log-probs"):
        train(TrainingConfig(algorithm="opd", **SMALL), progress=False)
    with pytest.raises(ValueError, match="not both"):
        train(TrainingConfig(algorithm="opd", teacher="tiny", **SMALL), teacher=model, progress=False)
    longer = create_tiny_tokenizer()
    longer.add_tokens(["<tool>"])
    wide = create_tiny_model(longer, hidden_size=32, num_layers=1)
    with pytest.raises(ValueError, match="train: the teacher scores 267 token ids, the student 266"):
        train(TrainingConfig(algorithm="opd", **SMALL), teacher=wide, progress=False)
    with pytest.raises(TypeError, match="nn.Module"):
        check_teacher_model(object(), model)


def shuffled_tokenizer(config):
    "The tiny tokenizer with two ids swapped: the same strings, other ids."
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    vocab = create_tiny_tokenizer().get_vocab()
    strings = sorted(vocab, key=vocab.get)
    strings[40], strings[41] = strings[41], strings[40]
    backend = Tokenizer(models.WordLevel({s: i for i, s in enumerate(strings)}, unk_token="<|pad|>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|pad|>", eos_token="<|im_end|>")


def test_a_teacher_with_another_tokenizer_is_refused(tiny):
    model, tok = tiny
    check_same_tokenizer(create_tiny_tokenizer(), tok)  # read back from a folder: one special token more, at the end
    MODEL_LOADERS["tiny-shuffled"], TOKENIZER_LOADERS["tiny-shuffled"] = (
        lambda c: load_tiny_model(progress=False)[0], shuffled_tokenizer)
    try:
        with pytest.raises(ValueError, match=r"train: the teacher's tokenizer is not the student's .*2 of the first"):
            train(TrainingConfig(algorithm="opd", teacher="tiny-shuffled", **SMALL), progress=False)
        with pytest.raises(ValueError, match="load_teacher"):
            load_teacher("tiny-shuffled", tok)
    finally:
        del MODEL_LOADERS["tiny-shuffled"], TOKENIZER_LOADERS["tiny-shuffled"]
    with pytest.raises(ValueError, match="must name a model"):
        load_teacher("  ", tok)


def test_attach_keeps_a_states_teacher(tiny):
    model, tok = tiny
    state = create_training_state(model, TrainingConfig(lora_r=0))._replace(teacher=model)
    assert attach_teacher(state, tok, None, needed_by="opd").teacher is model


@pytest.mark.slow
def test_checkpoint_and_resume_with_a_teacher(tiny, tmp_path):
    teacher = perturbed(load_tiny_model(progress=False)[0], 0.02)
    out = str(tmp_path / "run")
    train(TrainingConfig(algorithm="opd", output_dir=out, **SMALL), teacher=teacher, progress=False)
    rows = []
    config = TrainingConfig(algorithm="opd", output_dir=out, resume=True, **{**SMALL, "num_iterations": 3})
    with pytest.raises(ValueError, match="no teacher"):  # the teacher is not in the checkpoint: give it again
        train(config, progress=False)
    state = train(config, teacher=teacher, progress=False, logger=lambda s, stats: rows.append(stats.custom_metrics))
    assert state.iteration == 3 and state.teacher is teacher
    assert len(rows) == 1 and "teacher/reverse_kl" in rows[0]
