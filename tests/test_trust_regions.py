"""Checks of rlnb.trust_regions (INTELLECT-2's two-sided clip, DRO, TOPR, M2PO): hand numbers, a naive loop, the
formula of the library that ships each (TRL, verl, ROLL, AReaL, written here in a few lines from their source),
autograd, bad knobs refused before a model loads, micro-batches equal to the full batch, and runs by name in `train`,
switched to from GRPO mid-run and from the papermill notebook."""
import math

import pytest
import torch

import rlnb
from rlnb import training
from rlnb.algorithms import ALGORITHMS, create_algorithm_config, grpo_loss
from rlnb.core import collate, create_training_config
from rlnb.logprobs import compute_logprobs_for_tokens
from rlnb.training import train
from rlnb.trust_regions import (check_delta, compute_m2po_advantages, dro_loss, intellect2_loss, m2po_keep, m2po_loss,
                                topr_loss)
from test_micro_batches import accumulated_grads, setting  # noqa: F401 (a fixture)

torch.set_num_threads(1)
KEYS = ("intellect2", "dro", "topr", "m2po")

# the running example of chapter 35: ratios [[1.5, 1.0, 0.5], [0.7, 1.1, (masked)]], advantages (+1, -2)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]])
RATIO = torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.1, 1.3]])
LP = OLD + RATIO.log()
ADV, MSK = torch.tensor([1.0, -2.0]), torch.tensor([[1., 1, 1], [1, 1, 0]])


def random_batch(seed=1, B=6, C=7, spread=0.8):
    "Log-probs whose ratios reach well past the clips (e^{+-2}), signed advantages, a ragged mask."
    g = torch.Generator().manual_seed(seed)
    old = (torch.randn(B, C, generator=g) * 0.5 - 1.5).clamp(max=-1e-3)
    lp = (old + torch.randn(B, C, generator=g) * spread).clamp(max=-1e-3)
    adv, msk = torch.randn(B, generator=g), (torch.rand(B, C, generator=g) > 0.3).float()
    msk[:, 0] = 1  # no row without tokens
    return lp, old, adv, msk


def grad_of(loss_fn, lp, *args, **knobs):
    x = lp.clone().requires_grad_()
    loss_fn(x, *args, **knobs)[0].backward()
    return x.grad


def token_mean(per_token, msk):
    return (per_token * msk).sum() / msk.sum()


def sequence_mean(per_token, msk):
    return ((per_token * msk).sum(-1) / msk.sum(-1).clamp(min=1)).mean()


# ---- INTELLECT-2 ----
def test_intellect2_by_hand_and_gradient():
    # A = -1, ratios 0.5, 2, 6: |A| max(min(r, 4), clip(r)) = 0.8, 2, 4 -> 6.8 / 3; GRPO: 0.8, 2, 6 -> 8.8 / 3
    old, adv, msk = torch.full((1, 3), -1.0), torch.tensor([-1.0]), torch.ones(1, 3)
    lp = old + torch.tensor([[0.5, 2.0, 6.0]]).log()
    loss, m = intellect2_loss(lp, old, adv, msk)
    assert (loss.item(), m["clip/dual_ratio"]) == pytest.approx((6.8 / 3, 1 / 3), abs=1e-6)
    assert grpo_loss(lp, old, adv, msk, aggregation="token_mean")[0].item() == pytest.approx(8.8 / 3, abs=1e-6)
    torch.testing.assert_close(grad_of(intellect2_loss, lp, old, adv, msk), torch.tensor([[0, 2 / 3, 0]]))


def test_intellect2_is_trls_two_sided_clip_and_verls_dual_clip():
    "TRL (delta) and verl (clip_ratio_c) written from their source agree with intellect2_loss, value and gradient."
    lp, old, adv, msk = random_batch(3, spread=1.2)
    adv[0], old[0] = -1.0, -4.0  # a bad completion that the policy made more likely: ratios up to e^2 = 7.4
    lp[0] = old[0] + torch.tensor([0.1, 1.0, 1.5, 1.8, 2.0, -1.0, 0.5])
    for clip_eps, high, delta in [(0.2, None, 4.0), (0.2, 0.28, 1.28), (0.1, 0.3, 2.0), (0.2, None, 1.2)]:
        hi = clip_eps if high is None else high
        ours = intellect2_loss(lp, old, adv, msk, clip_eps=clip_eps, clip_eps_high=high, delta=delta)[0]
        x = lp.clone().requires_grad_()
        a = adv[:, None]
        # TRL GRPOTrainer._compute_loss, loss_type="dapo": coef_1 clamped at delta, -min(coef_1 A, coef_2 A), token mean
        coef_1 = torch.exp(x - old)
        coef_2 = torch.clamp(coef_1, 1 - clip_eps, 1 + hi)
        trl_tok = -torch.min(torch.clamp(coef_1, max=delta) * a, coef_2 * a)
        # verl compute_policy_loss_vanilla: dual clip, -A c caps the clipped loss where A < 0
        clipped = torch.maximum(-a * coef_1, -a * coef_2)
        verl_tok = torch.where(a < 0, torch.minimum(-a * delta, clipped), clipped)
        trl, verl = token_mean(trl_tok, msk), token_mean(verl_tok, msk)
        torch.testing.assert_close(ours, trl)
        torch.testing.assert_close(ours, verl)
        trl.backward()
        torch.testing.assert_close(grad_of(intellect2_loss, lp, old, adv, msk, clip_eps=clip_eps,
                                           clip_eps_high=high, delta=delta), x.grad)
    # the batch really has tokens past delta with A < 0 (otherwise this compares GRPO with GRPO)
    assert ((torch.exp(lp - old) > 4) & (adv[:, None] < 0) & (msk > 0)).any()


def test_below_the_upper_clip_trls_delta_is_another_clip_and_is_refused():
    "delta = 1.1 under 1 + 0.28: TRL would cap a token with A > 0 and r = 1.2 at 1.1; intellect2 refuses the setting."
    r, a = torch.tensor(1.2), 1.0
    trl = -min(min(r, torch.tensor(1.1)) * a, r.clamp(0.8, 1.28) * a)
    assert float(trl) == pytest.approx(-1.1) and float(-r.clamp(0.8, 1.28) * a) == pytest.approx(-1.2)
    with pytest.raises(ValueError, match=r"`delta`=1.1 must be > 1 and >= 1 \+ clip_eps_high = 1.28"):
        intellect2_loss(LP, OLD, ADV, MSK, clip_eps_high=0.28, delta=1.1)


def test_delta_is_trls_knob():
    trl = pytest.importorskip("trl")
    assert "delta" in trl.GRPOConfig.__dataclass_fields__  # TRL's name for the same knob
    assert ALGORITHMS["intellect2"].default_config["delta"] == 4.0  # INTELLECT-2's value


# ---- DRO ----
def loop_dro(lp, old, adv, msk, dro_beta):
    toks = [-(adv[i] * lp[i][t] - dro_beta / 2 * (lp[i][t] - old[i][t]) ** 2)
            for i in range(len(lp)) for t in range(len(lp[i])) if msk[i][t]]
    return sum(toks) / len(toks)


def test_dro_by_hand_loop_verl_and_gradient():
    # first token: -(1 (-1 + ln 1.5)) + 0.05 (ln 1.5)^2 = 0.6028; the five add up to 0.3040, a token mean of 0.0608
    loss, m = dro_loss(LP, OLD, ADV, MSK)
    assert loss.item() == pytest.approx(0.060802, abs=1e-5)
    assert m["dro/penalty"] == pytest.approx(0.05 * float((RATIO.log() ** 2 * MSK).sum()) / 5, abs=1e-7)
    lp, old, adv, msk = random_batch(5)
    for beta in (0.1, 1.0, 0.01):
        got = dro_loss(lp, old, adv, msk, dro_beta=beta)[0]
        assert got.item() == pytest.approx(loop_dro(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), beta),
                                           abs=1e-5)
        # verl compute_policy_loss_dro: -(log_prob A - 0.5 beta (log_prob - old_log_prob)^2), agg token-mean
        verl = token_mean(-(lp * adv[:, None] - 0.5 * beta * (lp - old).square()), msk)
        torch.testing.assert_close(got, verl)
        # the gradient on log pi: (-A + beta log r) / N
        torch.testing.assert_close(grad_of(dro_loss, lp, old, adv, msk, dro_beta=beta),
                                   (-adv[:, None] + beta * (lp - old)) * msk / msk.sum())


# ---- TOPR ----
def loop_topr(lp, old, adv, msk, pos=1.0, neg=1.0):
    rows = []
    for i in range(len(lp)):
        toks = [-(pos if adv[i] >= 0 else neg * min(math.exp(lp[i][t] - old[i][t]), 1.0)) * adv[i] * lp[i][t]
                for t in range(len(lp[i])) if msk[i][t]]
        rows.append(sum(toks) / len(toks))
    return sum(rows) / len(rows)


def test_topr_by_hand_loop_and_gradient():
    # row 1 (A = +1, no weight): (0.5945 + 0.5 + 2.6931) / 3; row 2 (A = -2): weights 0.7, min(1.1, 1) = 1
    loss, m = topr_loss(LP, OLD, ADV, MSK)
    assert loss.item() == pytest.approx((1.26253 - 1.56439) / 2, abs=1e-4)
    assert m["clip/ratio"] == pytest.approx(0.2) and m["topr/negative_share"] == pytest.approx(0.4)
    torch.testing.assert_close(grad_of(topr_loss, LP, OLD, ADV, MSK), torch.tensor([[-1 / 6] * 3, [0.35, 0.5, 0]]))
    lp, old, adv, msk = random_batch(7)
    for pos, neg in [(1.0, 1.0), (0.5, 2.0), (0.0, 1.0)]:
        got = topr_loss(lp, old, adv, msk, positive_weight=pos, negative_weight=neg)[0].item()
        assert got == pytest.approx(loop_topr(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), pos, neg),
                                    abs=1e-5)


def test_topr_is_rolls_formula():
    "ROLL ActorWorker._compute_topr_loss: split by score > 0; positives -A log p, negatives -clamp(r, 0, 1) A log p."
    lp, old, _, msk = random_batch(9, B=8, spread=1.0)
    scores = torch.tensor([1., 0, 0, 1, 1, 1, 0, 0])  # 0/1 rewards, two groups of 4
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = rlnb.compute_grpo_advantages(scores, groups, scale="none")
    ratio = torch.exp(lp - old)
    pos, neg = (scores > 0).float()[:, None], (scores <= 0).float()[:, None]
    for wp, wn in [(1.0, 1.0), (0.3, 1.7)]:
        roll_tok = (wp * -adv[:, None] * lp * pos
                    + wn * -torch.clamp(ratio, min=0.0, max=1.0) * adv[:, None] * lp * neg)
        for agg, ref in (("sequence_mean", sequence_mean), ("token_mean", token_mean)):
            got = topr_loss(lp, old, adv, msk, positive_weight=wp, negative_weight=wn, aggregation=agg)[0]
            torch.testing.assert_close(got, ref(roll_tok, msk))


# ---- M2PO ----
def areal_m2po_mask(old_logp, prox_logp, loss_mask, m2_threshold):
    "AReaL _apply_m2po_masking: m2 = (behaviour - proximal)^2 sorted, drop while the suffix mean is >= threshold."
    m2 = ((old_logp - prox_logp) ** 2)[loss_mask]
    sorted_m2, idx = torch.sort(m2, descending=True)
    suffix_mean = sorted_m2.flip(0).cumsum(0).flip(0) / torch.arange(len(m2), 0, -1)
    below = torch.where(suffix_mean < m2_threshold)[0]
    k = int(below[0]) if len(below) else len(m2) - 1
    keep_sorted = torch.ones(len(m2), dtype=torch.bool)
    keep_sorted[:k] = False
    out = torch.zeros_like(loss_mask)
    out[loss_mask] = keep_sorted[torch.argsort(idx)]
    return out


def loop_m2po_keep(d, msk, threshold):
    toks = sorted(((d[i][t] ** 2, (i, t)) for i in range(len(msk)) for t in range(len(msk[i])) if msk[i][t]),
                  reverse=True)
    dropped = set()
    while len(toks) > 1 and sum(v for v, _ in toks) / len(toks) >= threshold: dropped.add(toks.pop(0)[1])
    return [[bool(msk[i][t]) and (i, t) not in dropped for t in range(len(msk[i]))] for i in range(len(msk))]


def test_m2po_mask_by_hand_loop_and_areal():
    # log r = [[.1, .1, .5], [.3, 0]]: squares mean .072; without the .25 the rest is .11 / 4 = .0275 < .04
    d = torch.tensor([[0.1, 0.1, 0.5], [0.3, 0.0, 7.0]])
    keep = m2po_keep(d, MSK > 0)
    assert keep.tolist() == [[True, True, False], [True, True, False]]
    assert m2po_keep(d[1:], MSK[1:] > 0).tolist() == [[False, True, False]]  # the row alone would drop (1, 0) too
    g = torch.Generator().manual_seed(0)
    for threshold in (0.005, 0.04, 0.2, 10.0):
        sampler, old = torch.randn(7, 9, generator=g) * 0.3 - 2, torch.randn(7, 9, generator=g) * 0.3 - 2
        msk = torch.rand(7, 9, generator=g) > 0.2
        got = m2po_keep(old - sampler, msk, threshold)
        assert got.tolist() == loop_m2po_keep((old - sampler).tolist(), msk.tolist(), threshold)
        assert torch.equal(got, areal_m2po_mask(sampler, old, msk, threshold))


def test_m2po_advantages_and_loss_by_hand_and_areals_objective():
    d = torch.tensor([[0.1, 0.1, 0.5], [0.3, 0.0, 7.0]])
    adv = compute_m2po_advantages(torch.tensor([1.0, 0.0]), [0, 0], OLD, MSK, rollout_logprobs=OLD - d, scale="none")
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]
    loss, m = m2po_loss(LP, OLD, adv, MSK)
    assert loss.item() == pytest.approx(-0.07, abs=1e-6)  # (-(1.5 + 1) 0.5 + (0.7 + 1.1) 0.5) / 5
    # AReaL's objective: sum of M r A over all tokens / their number (the masked ones count in the denominator)
    lp, old, a, msk = random_batch(4)
    sampler = old - torch.randn(old.shape, generator=torch.Generator().manual_seed(1)) * 0.4
    groups = [0, 0, 0, 1, 1, 1]
    adv = compute_m2po_advantages(a, groups, old, msk, rollout_logprobs=sampler, m2_threshold=0.04)
    M = areal_m2po_mask(sampler, old, msk > 0, 0.04).float()
    assert 0 < int((msk - M).sum()) < int(msk.sum())  # something masked, not everything
    grpo_a = rlnb.compute_grpo_advantages(a, groups)[:, None]
    x = lp.clone().requires_grad_()
    areal = -token_mean(M * torch.exp(x - old) * grpo_a, msk)
    torch.testing.assert_close(m2po_loss(lp, old, adv, msk)[0], areal)
    areal.backward()
    torch.testing.assert_close(grad_of(m2po_loss, lp, old, adv, msk), x.grad)


def test_without_sampler_logprobs_m2po_masks_nothing():
    adv = compute_m2po_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), [0, 0, 1, 1], torch.full((4, 3), -1.0),
                                  torch.ones(4, 3))
    torch.testing.assert_close(adv, rlnb.compute_grpo_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]),
                                                                 [0, 0, 1, 1])[:, None].expand(4, 3))


# ---- bad knobs: named, and refused by `train` before any model loads ----
@pytest.mark.parametrize("name,options,error,message", [
    ("intellect2", {"delta": 1.1}, ValueError, "intellect2: `delta`=1.1 must be > 1 and >= 1 + clip_eps_high = 1.2"),
    ("intellect2", {"delta": 1.25, "clip_eps_high": 0.28}, ValueError, "must be > 1 and >= 1 + clip_eps_high = 1.28"),
    ("intellect2", {"delta": math.inf}, ValueError, "intellect2: `delta` must be a finite number"),
    ("intellect2", {"delta": math.nan}, ValueError, "intellect2: `delta` must be a finite number"),
    ("intellect2", {"delta": "4"}, TypeError, "`delta` of 'intellect2' must be a number"),
    ("intellect2", {"clip_eps": 1.5}, ValueError, "intellect2: `clip_eps`=1.5 must be in [0, 1)"),
    ("dro", {"dro_beta": 0.0}, ValueError, "dro: `dro_beta`=0 removes DRO's penalty"),
    ("dro", {"dro_beta": -0.1}, ValueError, "dro: `dro_beta` must be a finite number >= 0"),
    ("dro", {"dro_beta": math.nan}, ValueError, "dro: `dro_beta` must be a finite number"),
    ("dro", {"dro_beta": True}, TypeError, "`dro_beta` of 'dro' must be a number"),
    ("topr", {"positive_weight": 0.0, "negative_weight": 0.0}, ValueError, "are both 0"),
    ("topr", {"negative_weight": -1.0}, ValueError, "topr: `negative_weight` must be a finite number"),
    ("topr", {"positive_weight": math.inf}, ValueError, "topr: `positive_weight` must be a finite number"),
    ("m2po", {"m2_threshold": 0.0}, ValueError, "m2po: `m2_threshold`=0 is a bound"),
    ("m2po", {"m2_threshold": -0.04}, ValueError, "m2po: `m2_threshold` must be a finite number"),
    ("m2po", {"m2_threshold": "0.04"}, TypeError, "`m2_threshold` of 'm2po' must be a number"),
])
def test_bad_knobs_are_refused_before_a_model_loads(monkeypatch, name, options, error, message):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(error) as e:
        train(create_training_config(algorithm=name, algorithm_options=options, num_iterations=1), progress=False)
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("call,message", [
    (lambda: dro_loss(LP, OLD, ADV, MSK, dro_beta=0), "dro_loss: `dro_beta`=0"),
    (lambda: topr_loss(LP, OLD, ADV, MSK, negative_weight=math.nan), "topr_loss: `negative_weight` must be"),
    (lambda: intellect2_loss(LP, OLD, ADV, MSK, delta=0.5), "intellect2_loss: `delta`=0.5 must be > 1"),
    (lambda: check_delta("f", 1.0, clip_eps_high=0.0), "f: `delta`=1.0 must be > 1"),
    (lambda: compute_m2po_advantages([1., 0.], [0, 0], OLD, MSK, OLD, m2_threshold=math.inf), "`m2_threshold` must"),
    (lambda: compute_m2po_advantages([1., 0.], [0, 0], OLD, MSK, OLD[:, :2]), "`rollout_logprobs` has shape (2, 2)"),
    (lambda: compute_m2po_advantages([1., 0.], [0, 0]), "needs `old_logprobs` and `loss_mask`"),
    (lambda: m2po_loss(LP, OLD, ADV, MSK, beta=0.1), "`beta`=0.1 needs `ref_logprobs`"),
])
def test_bad_arguments_of_the_functions_name_the_argument(call, message):
    with pytest.raises(ValueError) as e: call()
    assert message in str(e.value), str(e.value)


# ---- gradient accumulation ----
CASES = [(name, {"aggregation": agg}) for name in KEYS for agg in ("token_mean", "sequence_mean", "constant")]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o['aggregation']}" for n, o in CASES])
def test_micro_batches_give_the_full_batch_gradient(setting, name, options):  # noqa: F811
    full = accumulated_grads(setting, name, options, None)
    micro = accumulated_grads(setting, name, options, 4)
    assert full and full.keys() == micro.keys()
    for key in full:
        torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name} {options} {key}: {m}")


@pytest.fixture(scope="module")
def stale_setting(setting):  # noqa: F811
    "The micro-batch setting, its rollouts carrying a sampler's log-probs that differ from the trainer's by noise."
    policy, tok, batch = setting
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        trainer = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1])
    noise = torch.randn(trainer.shape, generator=torch.Generator().manual_seed(5)) * 0.3
    sampler = (trainer + noise).clamp(max=-1e-4)
    rollouts = [r._replace(generation=r.generation._replace(logprobs=sampler[i, :len(r.token_ids)].tolist()))
                for i, r in enumerate(batch.rollouts)]
    return policy, tok, batch._replace(rollouts=rollouts), cb._replace(rollout_logprobs=sampler, old_logprobs=trainer)


def test_m2po_selects_once_per_batch_so_micro_batches_equal_the_full_batch(stale_setting):
    policy, tok, batch, cb = stale_setting
    adv = compute_m2po_advantages(cb.rewards, cb.group_ids, cb.old_logprobs, cb.loss_mask, cb.rollout_logprobs)
    masked = (adv == 0) & (cb.loss_mask > 0) & (rlnb.compute_grpo_advantages(cb.rewards, cb.group_ids) != 0)[:, None]
    assert 0 < int(masked.sum()) < int((cb.loss_mask > 0).sum())  # the mask acts in this setting
    full = accumulated_grads(stale_setting[:3], "m2po", {}, None)
    for size in (4, 3, 1):
        micro = accumulated_grads(stale_setting[:3], "m2po", {}, size)
        for key in full: torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6)
    unmasked = accumulated_grads(stale_setting[:3], "m2po", {"m2_threshold": 1e9}, None)
    assert any(not torch.allclose(unmasked[k], full[k]) for k in full)  # and the mask changes the update


def test_the_same_mask_chosen_inside_the_loss_would_depend_on_the_micro_batches(stale_setting):
    "The control: a loss that picks M2PO's tokens among the rows it is given (a micro-batch) breaks accumulation."
    from rlnb.algorithms import AlgorithmSpec, register_algorithm

    def per_micro_batch_m2po(logprobs, old_logprobs, advantages, loss_mask, ref_logprobs=None, rollout_logprobs=None,
                             m2_threshold=0.04):
        keep = m2po_keep(old_logprobs - rollout_logprobs, loss_mask > 0, m2_threshold)
        return m2po_loss(logprobs, old_logprobs, advantages[:, None] * keep, loss_mask)  # (B, C)

    register_algorithm("m2po_in_the_loss", AlgorithmSpec(rlnb.compute_grpo_advantages, per_micro_batch_m2po,
                                                         {"m2_threshold": 0.04}, needs_old_logprobs=True))
    try:
        full = accumulated_grads(stale_setting[:3], "m2po_in_the_loss", {}, None)
        micro = accumulated_grads(stale_setting[:3], "m2po_in_the_loss", {}, 4)
        assert any(not torch.allclose(micro[k], full[k], rtol=1e-4, atol=1e-6) for k in full)
        ours = accumulated_grads(stale_setting[:3], "m2po", {"scale": "group"}, None)
        for k in full: torch.testing.assert_close(full[k], ours[k], rtol=1e-4, atol=1e-6)  # the same mask when whole
    finally:
        del ALGORITHMS["m2po_in_the_loss"]


def test_registry_and_package():
    for name in KEYS:
        spec = ALGORITHMS[name]
        assert spec.group_relative and spec.correction_level == "token" and spec.check_config is not None
        assert set(create_algorithm_config(name)) - {"name"} == set(spec.default_config)
    assert ALGORITHMS["m2po"].needs_old_logprobs
    assert ALGORITHMS["intellect2"].policy_loss.__name__ == "intellect2_loss"
    for n in "intellect2_loss dro_loss topr_loss m2po_loss m2po_keep compute_m2po_advantages".split():
        assert hasattr(rlnb, n), n


# ---- in train, by name, from GRPO mid-run, and from papermill ----
SMALL = dict(prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", KEYS)
def test_each_key_runs_by_name_in_train(name):
    seen = []
    state = train(create_training_config(**SMALL, num_iterations=2, algorithm=name),
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 2 and [m["algorithm"] for m in seen] == [name, name]
    assert all(math.isfinite(m["loss/policy"]) for m in seen)


@pytest.mark.slow
def test_m2po_runs_on_stale_batches():
    "One step off-policy: the sampler's log-probs are kept, so M2PO's second moment has something to measure."
    seen = []
    train(create_training_config(**SMALL, num_iterations=3, algorithm="m2po", off_policy_steps=1,
                                 algorithm_options={"m2_threshold": 1e-6}),
          logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert len(seen) == 3 and all(math.isfinite(m["loss/policy"]) for m in seen)
    assert seen[-1]["mismatch/kl"] > 0  # the batch was sampled by older weights


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
    "The experiment notebook takes each key by name and its knobs as algorithm_options, two iterations each."
    import json
    from pathlib import Path

    import papermill as pm
    root = Path(__file__).resolve().parent.parent
    options = {"intellect2": {"delta": 3.0}, "dro": {"dro_beta": 0.2}, "topr": {"negative_weight": 0.5},
               "m2po": {"m2_threshold": 0.02}}
    for name in KEYS:
        out = tmp_path / name
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), algorithm=name, algorithm_options=options[name],
                                            num_iterations=2, prompts_per_step=4, eval_every=0, seed=0))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["algorithm"] for r in rows if "reward/mean" in r] == [name, name], name
