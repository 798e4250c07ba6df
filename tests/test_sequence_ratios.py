"""Checks of rlnb.sequence_ratios (GSPO-token, LUSPO, VESPO): hand numbers, a naive loop, the formula verl or TRL
writes, autograd, bad knobs (in the loss and before a run loads anything), micro-batches, rollout corrections, and
runs by name in `train`, switched to from GRPO mid-run and in the papermill notebook."""
import math

import pytest
import torch

import rlnb
import rlnb.training as training
from rlnb.algorithms import ALGORITHMS, compute_loss_by_algorithm, create_algorithm_config
from rlnb.catalogue import gspo_loss
from rlnb.core import Rollout, TrainingConfig, collate, create_training_config
from rlnb.rollout_corrections import apply_rollout_correction
from rlnb.sequence_ratios import (gspo_token_loss, luspo_loss, rows_as_units, sequence_sum, vespo_loss,
                                  vespo_weight)
from rlnb.training import train
from test_micro_batches import accumulated_grads, setting  # noqa: F401 (a fixture)

torch.set_num_threads(1)
KEYS = ("gspo_token", "luspo", "vespo")

# the running example of the chapters: ratios [[1.5, 1.0, 0.5], [0.7, 1.1, (masked)]], advantages (+1, -2)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]])
LP = OLD + torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.1, 1.3]]).log()
ADV, MSK = torch.tensor([1.0, -2.0]), torch.tensor([[1., 1, 1], [1, 1, 0]])
S0, S1 = 0.75 ** (1 / 3), 0.77 ** 0.5  # the sequence ratios (geometric means)


def random_batch(seed=1, B=6, C=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, C, generator=g) * 0.4 - 1.2
    lp = old + torch.randn(B, C, generator=g) * spread / math.sqrt(C)  # sequence ratios of a few percent
    adv, msk = torch.randn(B, generator=g), (torch.rand(B, C, generator=g) > 0.3).float()
    msk[:, 0] = 1  # every row has a token
    return lp, old, adv, msk


def grad_of(loss_fn, lp, *args, **knobs):
    x = lp.clone().requires_grad_()
    loss_fn(x, *args, **knobs)[0].backward()
    return x.grad


# ---- naive loops (plain Python, over real tokens) ----
def seq_ratio(lp, old, msk, i, power=None):
    ts = [t for t in range(len(msk[i])) if msk[i][t]]
    d = sum(lp[i][t] - old[i][t] for t in ts)
    return math.exp(d / len(ts) if power is None else d), ts


def loop_gspo_token(lp, old, adv, msk, lo, hi):
    rows = []
    for i in range(len(msk)):
        s, ts = seq_ratio(lp, old, msk, i)
        a = adv[i] if isinstance(adv[i], list) else [adv[i]] * len(msk[i])
        rows.append(sum(-min(s * a[t], min(max(s, 1 - lo), 1 + hi) * a[t]) for t in ts) / len(ts))
    return sum(rows) / len(rows)


def loop_luspo(lp, old, adv, msk, lo, hi):
    total = 0.0
    for i in range(len(msk)):
        s, ts = seq_ratio(lp, old, msk, i)
        total += -len(ts) * min(s * adv[i], min(max(s, 1 - lo), 1 + hi) * adv[i])
    return total / len(msk)


def loop_vespo(lp, old, adv, msk, kp=2.0, lam_p=3.0, kn=3.0, ln=2.0):
    total, n = 0.0, 0
    for i in range(len(msk)):
        w, ts = seq_ratio(lp, old, msk, i, power=1)
        k, lam = (kp, lam_p) if adv[i] >= 0 else (kn, ln)
        phi = math.exp(lam) * w ** k * math.exp(-lam * w)
        total, n = total - sum(phi * adv[i] * lp[i][t] for t in ts), n + len(ts)
    return total / n


# ---- GSPO-token ----
def test_gspo_token_by_hand_and_loop():
    loss, m = gspo_token_loss(LP, OLD, ADV, MSK)
    assert loss.item() == pytest.approx((-S0 + 2 * 0.9997) / 2, abs=1e-6)  # sequence 1 clipped (A < 0, s < 0.9997)
    assert m["clip/ratio"] == pytest.approx(2 / 5) and m["ratio/sequence"] == pytest.approx((3 * S0 + 2 * S1) / 5)
    torch.testing.assert_close(grad_of(gspo_token_loss, LP, OLD, ADV, MSK),
                               torch.tensor([[-S0 / 6] * 3, [0, 0, 0]]))
    adv_tok = torch.tensor([[1.0, 0.0, 2.0], [-2.0, -2.0, 0.0]])
    g = grad_of(gspo_token_loss, LP, OLD, adv_tok, MSK, clip_eps=0.2, clip_eps_high=0.2)
    torch.testing.assert_close(g, torch.tensor([[-S0 / 6, 0, -2 * S0 / 6], [2 * S1 / 4, 2 * S1 / 4, 0]]))
    lp, old, adv, msk = random_batch(3)
    for lo, hi in ((3e-4, 4e-4), (0.05, 0.05), (0.2, 0.28)):
        for a in (adv, adv[:, None] * torch.rand(6, 7, generator=torch.Generator().manual_seed(4))):
            got = gspo_token_loss(lp, old, a, msk, clip_eps=lo, clip_eps_high=hi)[0].item()
            assert got == pytest.approx(loop_gspo_token(lp.tolist(), old.tolist(), a.tolist(), msk.tolist(), lo, hi),
                                        abs=1e-6)


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean", "constant"])
def test_gspo_token_with_one_advantage_per_sequence_is_gspo(aggregation):
    "Loss and gradient equal GSPO's, for each aggregation and clip, off-policy (some sequences clipped, some not)."
    lp, old, adv, msk = random_batch(5, B=8, spread=1.0)
    for lo, hi in ((3e-4, 4e-4), (0.02, 0.03), (0.2, 0.28)):
        knobs = dict(clip_eps=lo, clip_eps_high=hi, aggregation=aggregation)
        ours, ref = gspo_token_loss(lp, old, adv, msk, **knobs)[0], gspo_loss(lp, old, adv, msk, **knobs)[0]
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(grad_of(gspo_token_loss, lp, old, adv, msk, **knobs),
                                   grad_of(gspo_loss, lp, old, adv, msk, **knobs))


def test_gspo_token_against_verl_and_autograd():
    lp, old, adv, msk = random_batch(6, spread=1.0)
    adv_tok = adv[:, None] + torch.randn(6, 7, generator=torch.Generator().manual_seed(7))  # per-token advantages
    for lo, hi in ((3e-4, 4e-4), (0.1, 0.1)):
        # verl's compute_policy_loss_gspo: log s_it = log pi - sg(log pi) + sg(mean log ratio), clamped at 10,
        # max(-A s, -A clip(s)) per token, then seq-mean-token-mean
        x = lp.clone().requires_grad_()
        n = msk.sum(-1).clamp(min=1)
        log_seq = ((x - old) * msk).sum(-1) / n
        r = torch.exp(torch.clamp(x - x.detach() + log_seq.detach()[:, None], max=10.0))
        per_tok = torch.maximum(-adv_tok * r, -adv_tok * torch.clamp(r, 1 - lo, 1 + hi))
        verl = ((per_tok * msk).sum(-1) / n).mean()
        verl.backward()
        ours = gspo_token_loss(lp, old, adv_tok, msk, clip_eps=lo, clip_eps_high=hi)[0]
        torch.testing.assert_close(ours, verl.detach())
        torch.testing.assert_close(grad_of(gspo_token_loss, lp, old, adv_tok, msk, clip_eps=lo, clip_eps_high=hi),
                                   x.grad)
    # through a toy policy: the parameter gradient of the unclipped loss is that of
    # -(1/G) sum_i (1/|y_i|) sum_t A_it sg(s_i) log pi_t
    toks = torch.randint(0, 5, (6, 7), generator=torch.Generator().manual_seed(8))
    theta = torch.randn(6, 7, 5, generator=torch.Generator().manual_seed(9), requires_grad=True)
    toy_lp = lambda th: th.log_softmax(-1).gather(-1, toks[..., None])[..., 0]  # (B, C)
    old_t = toy_lp(theta).detach() + 0.02 * torch.randn(6, 7, generator=torch.Generator().manual_seed(10))
    g, = torch.autograd.grad(gspo_token_loss(toy_lp(theta), old_t, adv_tok, msk, clip_eps=0.5, clip_eps_high=0.5)[0],
                             theta)
    n = msk.sum(1, keepdim=True)
    s = torch.exp(((toy_lp(theta).detach() - old_t) * msk).sum(1, keepdim=True) / n)
    g_ref, = torch.autograd.grad(-((adv_tok * s * toy_lp(theta) * msk).sum(1, keepdim=True) / n).mean(), theta)
    torch.testing.assert_close(g, g_ref)


# ---- LUSPO ----
def test_luspo_by_hand_loop_and_trl():
    loss, m = luspo_loss(LP, OLD, ADV, MSK)
    assert loss.item() == pytest.approx((3 * -S0 + 2 * 2 * 0.9997) / 2, abs=1e-6)  # 0.6366
    torch.testing.assert_close(grad_of(luspo_loss, LP, OLD, ADV, MSK), torch.tensor([[-S0 / 2] * 3, [0, 0, 0]]))
    lp, old, adv, msk = random_batch(11, spread=1.0)
    for lo, hi in ((3e-4, 4e-4), (0.05, 0.05), (0.2, 0.28)):
        got = luspo_loss(lp, old, adv, msk, clip_eps=lo, clip_eps_high=hi)[0]
        assert got.item() == pytest.approx(loop_luspo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), lo, hi),
                                           abs=1e-6)
        # TRL GRPOTrainer, loss_type="luspo", importance_sampling_level="sequence": the sequence-level clipped term,
        # (per_token_loss * mask).sum(-1).mean()
        x = lp.clone().requires_grad_()
        coef_1 = torch.exp(((x - old) * msk).sum(-1) / msk.sum(-1).clamp(min=1.0))[:, None]
        ptl = -torch.min(coef_1 * adv[:, None], torch.clamp(coef_1, 1 - lo, 1 + hi) * adv[:, None])
        trl = (ptl * msk).sum(-1).mean()
        trl.backward()
        torch.testing.assert_close(got, trl.detach())
        torch.testing.assert_close(grad_of(luspo_loss, lp, old, adv, msk, clip_eps=lo, clip_eps_high=hi), x.grad)
        # GSPO's gradient (sequence mean) times each sequence's length
        torch.testing.assert_close(x.grad, grad_of(gspo_loss, lp, old, adv, msk, clip_eps=lo, clip_eps_high=hi)
                                   * msk.sum(1, keepdim=True))


def test_luspo_kl_term_is_summed_per_sequence_like_trl():
    lp, old, adv, msk = random_batch(12)
    ref = old - 0.1
    loss, m = luspo_loss(lp, old, adv, msk, ref_logprobs=ref, beta=0.04)
    kl = torch.exp(ref - lp) - (ref - lp) - 1  # TRL's per-token k3, added to per_token_loss before the aggregation
    assert m["loss/kl"] == pytest.approx((0.04 * (kl * msk).sum(-1).mean()).item(), rel=1e-5)
    assert sequence_sum(torch.ones(2, 3), MSK).item() == 2.5  # (3 + 2) / 2


# ---- VESPO ----
def test_vespo_by_hand_loop_and_gradient():
    phi0, phi1 = 0.75 ** 2 * math.exp(0.75), 0.77 ** 3 * math.exp(0.46)  # 1.1908, 0.7232
    loss, m = vespo_loss(LP, OLD, ADV, MSK)
    assert m["vespo/phi"] == pytest.approx((3 * phi0 + 2 * phi1) / 5)
    assert loss.item() == pytest.approx(-(phi0 * LP[0].sum() - 2 * phi1 * LP[1, :2].sum()).item() / 5, abs=1e-6)
    torch.testing.assert_close(grad_of(vespo_loss, LP, OLD, ADV, MSK),
                               torch.tensor([[-phi0 / 5] * 3, [2 * phi1 / 5] * 2 + [0]]))
    lp, old, adv, msk = random_batch(13, spread=1.5)
    for knobs in ((2.0, 3.0, 3.0, 2.0), (1.0, 1.0, 0.0, 5.0)):  # TRL's defaults, then others
        got = vespo_loss(lp, old, adv, msk, **dict(zip(("k_pos", "lambda_pos", "k_neg", "lambda_neg"), knobs)))[0]
        want = loop_vespo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), *knobs)
        assert got.item() == pytest.approx(want, abs=1e-5)


def test_vespo_against_trls_formula_and_function():
    lp, old, adv, msk = random_batch(14, spread=2.0)
    # TRL GRPOTrainer.get_gamma_weights, written out: log w = sum of masked log-ratios (each clamped to +-20), clamped
    # to [log 1e-8, 20]; log phi = lambda + k log w - lambda w with (k, lambda) by A >= 0; then -phi A log pi,
    # summed over the mask and divided by the token count
    log_w = torch.clamp((torch.clamp(lp - old, -20, 20) * msk).sum(-1, keepdim=True), math.log(1e-8), 20.0)
    a = adv[:, None]
    k, lam = torch.where(a >= 0, 2.0, 3.0), torch.where(a >= 0, 3.0, 2.0)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    x = lp.clone().requires_grad_()
    trl = ((-phi * a * x) * msk).sum() / msk.sum()
    trl.backward()
    torch.testing.assert_close(vespo_loss(lp, old, adv, msk)[0], trl.detach())
    torch.testing.assert_close(grad_of(vespo_loss, lp, old, adv, msk), x.grad)
    trl_mod = pytest.importorskip("trl")  # and TRL's own function, where TRL is installed
    got = trl_mod.GRPOTrainer.get_gamma_weights(a, lp - old, msk, None, 2.0, 3.0, 3.0, 2.0)
    torch.testing.assert_close(vespo_weight(((lp - old) * msk).sum(-1, keepdim=True), a), got)


def test_vespo_defaults_are_trls():
    trl = pytest.importorskip("trl")
    fields = trl.GRPOConfig.__dataclass_fields__
    defaults = ALGORITHMS["vespo"].default_config
    for ours in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
        assert defaults[ours] == fields[f"vespo_{ours}"].default, ours


# ---- knobs ----
@pytest.mark.parametrize("call,message", [
    (lambda: gspo_token_loss(LP, OLD, ADV, MSK, clip_eps=math.nan), "gspo_token_loss: `clip_eps` must be"),
    (lambda: gspo_token_loss(LP, OLD, ADV, MSK, clip_eps_high=-1.0), "gspo_token_loss: `clip_eps_high` must be"),
    (lambda: gspo_token_loss(LP, OLD, ADV, MSK, aggregation="mean"), "`aggregation`='mean'"),
    (lambda: luspo_loss(LP, OLD, ADV, MSK, clip_eps=math.inf), "luspo_loss: `clip_eps` must be"),
    (lambda: luspo_loss(LP, OLD, torch.ones(2, 3), MSK), "luspo_loss: `advantages` has shape (2, 3)"),
    (lambda: luspo_loss(LP, OLD, ADV, MSK, beta=0.1), "`beta`=0.1 needs `ref_logprobs`"),
    (lambda: vespo_loss(LP, OLD, ADV, MSK, lambda_pos=0.0), "vespo_loss: `lambda_pos` must be > 0"),
    (lambda: vespo_loss(LP, OLD, ADV, MSK, lambda_neg=-2.0), "vespo_loss: `lambda_neg` must be a finite number"),
    (lambda: vespo_loss(LP, OLD, ADV, MSK, k_neg=-1.0), "vespo_loss: `k_neg` must be a finite number >= 0"),
    (lambda: vespo_loss(LP, OLD, ADV, MSK, k_pos=math.nan), "vespo_loss: `k_pos` must be a finite number"),
    (lambda: vespo_loss(LP, OLD, torch.ones(2, 3), MSK), "vespo_loss: `advantages` has shape (2, 3)"),
    (lambda: create_algorithm_config("luspo", aggregation="token_mean"), "has no option(s) ['aggregation']"),
    (lambda: create_algorithm_config("vespo", vespo_k_pos=2.0), "has no option(s) ['vespo_k_pos']"),
])
def test_bad_options_name_the_argument(call, message):
    with pytest.raises(ValueError) as e: call()
    assert message in str(e.value), str(e.value)


RUN = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.parametrize("algorithm, options, message", [
    ("vespo", {"lambda_pos": 0.0}, "vespo: `lambda_pos` must be > 0"),
    ("vespo", {"lambda_neg": math.inf}, "vespo: `lambda_neg` must be a finite number"),
    ("vespo", {"k_pos": -2.0}, "vespo: `k_pos` must be a finite number >= 0"),
    ("luspo", {"clip_eps": 1.0}, "luspo: `clip_eps`=1.0 must be in [0, 1)"),
    ("luspo", {"clip_eps_high": math.nan}, "luspo: `clip_eps_high` must be a finite number"),
    ("gspo_token", {"clip_eps_high": -1e-4}, "gspo_token: `clip_eps_high`=-0.0001 must be >= 0"),
])
def test_bad_knobs_are_refused_before_anything_loads(monkeypatch, algorithm, options, message):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError) as e:
        train(TrainingConfig(algorithm=algorithm, algorithm_options=options, **RUN), progress=False)
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("algorithm, options, message", [
    ("vespo", {"k_neg": "3"}, "`k_neg` of 'vespo' must be a number"),
    ("luspo", {"clip_eps": True}, "`clip_eps` of 'luspo' must be a number"),
    ("gspo_token", {"aggregation": 1}, "`aggregation` of 'gspo_token' must be a str"),
])
def test_a_knob_of_the_wrong_type_is_refused(algorithm, options, message):
    with pytest.raises(TypeError, match=message):
        train(TrainingConfig(algorithm=algorithm, algorithm_options=options, **RUN), progress=False)


# ---- the registry: metrics, corrections, units ----
def test_registry_metrics_corrections_and_units():
    rs = [Rollout("q", prompt_token_ids=[1], token_ids=[5, 6, 2][:n], logprobs=[-1., -.5, -2.][:n],
                  ref_logprobs=[-1., -.4, -2.][:n], rewards=r, group_index=0)
          for r, n in ((1.0, 3), (0.0, 2), (0.0, 3), (1.0, 1))]
    cb = collate(rs, pad_token_id=0, eos_token_id=2)
    lp = cb.old_logprobs.clone().requires_grad_()
    for name in KEYS:
        loss, m = compute_loss_by_algorithm(cb, lp, {**create_algorithm_config(name, beta=0.04), "max_new_tokens": 3})
        loss.backward()
        assert torch.isfinite(loss) and lp.grad.abs().sum() > 0, name
        assert {"loss/policy", "loss/kl", "clip/ratio", "ratio/mean", "entropy/sampled_nll", "kl/mean"} <= set(m), name
        lp.grad = None
    assert {k: ALGORITHMS[k].correction_level for k in KEYS} == {"gspo_token": "token", "luspo": "sequence",
                                                                 "vespo": "sequence"}
    assert ALGORITHMS["luspo"].loss_units is rows_as_units and rows_as_units(cb).tolist() == [1.0] * 4
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    weights = torch.tensor([[0.5, 1.0, 1.5], [2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [3.0, 0.0, 0.0]])
    for name in KEYS:
        out = apply_rollout_correction(cb._replace(advantages=adv), weights, torch.ones(4, 3), name)
        if name == "gspo_token": torch.testing.assert_close(out.advantages, adv[:, None] * weights * cb.loss_mask)
        else: torch.testing.assert_close(out.advantages, adv * torch.tensor([1.0, 1.5, 1.0, 3.0]))  # row means
    for n in "gspo_token_loss luspo_loss vespo_loss vespo_weight sequence_sum rows_as_units".split():
        assert hasattr(rlnb, n), n  # the package imports the module


# ---- gradient accumulation ----
CASES = [("gspo_token", {"aggregation": agg}) for agg in ("token_mean", "sequence_mean", "constant")] + [
    ("luspo", {}), ("luspo", {"beta": 0.04}), ("vespo", {}), ("vespo", {"aggregation": "sequence_mean"}),
    ("vespo", {"aggregation": "constant"})]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_micro_batches_give_the_full_batch_gradient(setting, name, options):  # noqa: F811
    full = accumulated_grads(setting, name, options, None)
    micro = accumulated_grads(setting, name, options, 3)
    assert full and full.keys() == micro.keys()
    for key in full:
        torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name} {options} {key}: {m}")


@pytest.mark.parametrize("name", KEYS)
@pytest.mark.parametrize("correction", ["tis_token", "tis_seq"])
def test_a_sampler_correction_enters_at_the_specs_level(setting, name, correction):  # noqa: F811
    "Through training_step's correction (token or sequence level, by the spec), micro-batches still add up."
    policy, tok, batch = setting
    g = torch.Generator().manual_seed(5)  # a sampler whose log-probs differ from the trainer's: weights != 1
    rollouts = [r._replace(generation=r.generation._replace(
        logprobs=(-1.5 + 0.5 * torch.randn(len(r.token_ids), generator=g)).tolist())) for r in batch.rollouts]
    corrected = (policy, tok, batch._replace(rollouts=rollouts))
    full_metrics = {}
    full = accumulated_grads(corrected, name, {}, None, full_metrics, rollout_correction=correction)
    micro = accumulated_grads(corrected, name, {}, 3, rollout_correction=correction)
    assert full_metrics["mismatch/weight_mean"] != 1.0 and full.keys() == micro.keys()
    for key in full: torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6)


def test_each_loss_adds_up_over_row_splits_off_policy():
    """Off-policy (clips and weights act), a batch's loss is the weighted sum of its row blocks' losses, with the
    weights training_step gives micro-batches: tokens for token_mean, rows otherwise and for LUSPO (its loss_units)."""
    lp, old, adv, msk = random_batch(21, B=8, C=6, spread=1.0)
    blocks = [slice(0, 3), slice(3, 4), slice(4, 8)]
    rows = lambda b: len(range(8)[b]) / 8
    share = {"token_mean": lambda b: msk[b].sum() / msk.sum(), "sequence_mean": rows, "constant": rows}
    cases = [(gspo_token_loss, dict(clip_eps=0.05, clip_eps_high=0.05, aggregation=agg), share[agg])
             for agg in share] + [(vespo_loss, dict(aggregation=agg), share[agg]) for agg in share] + [
             (luspo_loss, dict(clip_eps=0.05, clip_eps_high=0.05), rows)]
    for fn, knobs, part in cases:
        extra = {"max_completion_length": 6} if knobs.get("aggregation") == "constant" else {}
        full = fn(lp, old, adv, msk, **knobs, **extra)[0]
        parts = sum(part(b) * fn(lp[b], old[b], adv[b], msk[b], **knobs, **extra)[0] for b in blocks)
        torch.testing.assert_close(parts, full, msg=lambda m: f"{fn.__name__} {knobs}: {m}")
    # LUSPO weighted by tokens instead (no loss_units) would not add up: rows of different lengths
    tok = sum(share["token_mean"](b) * luspo_loss(lp[b], old[b], adv[b], msk[b])[0] for b in blocks)
    assert not torch.allclose(tok, luspo_loss(lp, old, adv, msk)[0])


# ---- in train, by name and switched to mid-run ----
SMALL = dict(prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", KEYS)
def test_each_key_runs_by_name_in_train(name):
    seen = []
    options = {"vespo": {"k_neg": 4.0}, "luspo": {"clip_eps_high": 0.01}}.get(name)
    state = train(create_training_config(**SMALL, num_iterations=2, algorithm=name, algorithm_options=options),
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 2 and [m["algorithm"] for m in seen] == [name, name]
    assert all(math.isfinite(m["loss/policy"]) and "clip/ratio" in m for m in seen)


@pytest.mark.slow
def test_switching_from_grpo_to_each_key_mid_run():
    names = ["grpo", *KEYS]
    seen = []
    state = train(create_training_config(**SMALL, num_iterations=len(names)),
                  algorithm_config=lambda it: create_algorithm_config(names[it]),
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == names and state.global_step == len(names)


@pytest.mark.slow
def test_each_key_runs_in_the_papermill_notebook(tmp_path):
    "The experiment notebook takes each key by name (and its options as algorithm_options), two iterations each."
    import json
    from pathlib import Path

    import papermill as pm
    root = Path(__file__).resolve().parent.parent
    for name in KEYS:
        out = tmp_path / name
        options = {"vespo": {"lambda_neg": 1.5}, "gspo_token": {"clip_eps": 0.01}}.get(name)
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), algorithm=name, algorithm_options=options,
                                            num_iterations=2, prompts_per_step=4, eval_every=0, seed=0))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["algorithm"] for r in rows if "reward/mean" in r] == [name, name], name
