"""Checks of rlnb.policy_losses: each loss against hand numbers, a naive loop, the formula TRL or verl writes, autograd,
bad options, micro-batches for every aggregation, and runs by name in `train` (switching from GRPO mid-run)."""
import math

import pytest
import torch

import rlnb
from rlnb.algorithms import ALGORITHMS, compute_loss_by_algorithm, create_algorithm_config, grpo_loss
from rlnb.core import create_training_config
from rlnb.policy_losses import (cispo_loss, clip_cov_select, compute_clip_cov_advantages, dppo_loss, dppo_moved,
                                gmpo_loss, kl_cov_loss, sapo_loss, token_covariance)
from rlnb.training import train
from test_micro_batches import accumulated_grads, setting  # noqa: F401 (a fixture)

torch.set_num_threads(1)
KEYS = ("cispo", "sapo", "gmpo", "dppo", "clip_cov", "kl_cov")

# the running example of the chapter: ratios [[1.5, 1.0, 0.5], [0.7, 1.1, (masked)]], advantages (+1, -2)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]])
LP = OLD + torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.1, 1.3]]).log()
ADV, MSK = torch.tensor([1.0, -2.0]), torch.tensor([[1., 1, 1], [1, 1, 0]])


def random_batch(seed=1, B=6, C=7):
    g = torch.Generator().manual_seed(seed)
    lp, old = (torch.randn(B, C, generator=g) * 0.4 - 1.2 for _ in range(2))
    adv, msk = torch.randn(B, generator=g), (torch.rand(B, C, generator=g) > 0.3).float()
    return lp.clamp(max=-1e-3), old.clamp(max=-1e-3), adv, msk


def sig(x): return 1 / (1 + math.exp(-x))


# ---- naive loops (plain Python, over real tokens) ----
def loop_token_mean(per_token, msk):
    toks = [per_token(i, t) for i in range(len(msk)) for t in range(len(msk[i])) if msk[i][t]]
    return sum(toks) / max(len(toks), 1)


def loop_sequence_mean(per_token, msk):
    rows = []
    for i in range(len(msk)):
        toks = [per_token(i, t) for t in range(len(msk[i])) if msk[i][t]]
        rows.append(sum(toks) / len(toks) if toks else 0.0)
    return sum(rows) / len(rows)


def loop_cispo(lp, old, adv, msk, lo, hi):
    def tok(i, t):
        w = min(math.exp(lp[i][t] - old[i][t]), 1 + hi)
        return -(w if lo is None else max(w, 1 - lo)) * adv[i] * lp[i][t]
    return loop_token_mean(tok, msk)


def loop_sapo(lp, old, adv, msk, tau_pos, tau_neg):
    def tok(i, t):
        tau = tau_pos if adv[i] > 0 else tau_neg
        return -(4 / tau) * sig(tau * (math.exp(lp[i][t] - old[i][t]) - 1)) * adv[i]
    return loop_sequence_mean(tok, msk)


def loop_gmpo(lp, old, adv, msk, lo, hi):
    total = 0.0
    for i in range(len(lp)):
        logs = []
        for t in range(len(lp[i])):
            if not msk[i][t]: continue
            d = lp[i][t] - old[i][t]
            c = min(max(d, -lo), hi)
            logs.append(min(d, c) if adv[i] > 0 else max(d, c) if adv[i] < 0 else 0.0)
        if logs: total += -adv[i] * math.exp(sum(logs) / len(logs))
    return total / len(lp)


def loop_dppo(lp, old, adv, msk, delta, divergence="tv"):
    def tok(i, t):
        p, q = math.exp(lp[i][t]), math.exp(old[i][t])
        if divergence == "tv": up, down = p - q > delta, p - q < -delta
        else:
            kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
            up, down = kl > delta and p > q, kl > delta and p < q
        out = up if adv[i] > 0 else down
        return 0.0 if out else -math.exp(lp[i][t] - old[i][t]) * adv[i] * lp[i][t]
    return loop_token_mean(tok, msk)


# ---- each loss: hand numbers, loop, TRL / verl formula ----
def test_cispo_by_hand_loop_trl_and_gradient():
    # weights clip(1.5)=1.2, 1, clip(0.5)=0.8 | clip(0.7)=0.8, 1.1: loss = sum -w A log pi / 5
    by_hand = (-(1.2 * (-1 + math.log(1.5)) - 0.5 + 0.8 * (-2 + math.log(0.5)))
               + 2 * (0.8 * (-0.3 + math.log(0.7)) + 1.1 * (-1.2 + math.log(1.1)))) / 5
    loss, m = cispo_loss(LP, OLD, ADV, MSK, clip_eps=0.2, clip_eps_high=0.2)
    assert loss.item() == pytest.approx(by_hand, abs=1e-6)
    assert (m["clip/ratio"], m["clip/high_ratio"], m["clip/low_ratio"]) == pytest.approx((0.6, 0.2, 0.4), abs=1e-6)
    lpg = LP.clone().requires_grad_()
    cispo_loss(lpg, OLD, ADV, MSK, clip_eps=0.2, clip_eps_high=0.2)[0].backward()  # every token keeps a gradient
    torch.testing.assert_close(lpg.grad, torch.tensor([[-1.2, -1.0, -0.8], [1.6, 2.2, 0]]) / 5)
    lp, old, adv, msk = random_batch()
    for lo, hi in [(None, 4.0), (0.2, 0.28), (None, 0.1)]:
        assert cispo_loss(lp, old, adv, msk, clip_eps=lo, clip_eps_high=hi)[0].item() == pytest.approx(
            loop_cispo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), lo, hi), abs=1e-5)
    # TRL GRPOTrainer, loss_type="cispo", epsilon_high=5.0 (an absolute cap on the ratio = our 1 + clip_eps_high):
    # -clamp(coef_1, max=epsilon_high).detach() * A * logps, summed over the mask / the number of real tokens
    coef_1 = torch.exp(lp - old)
    trl = ((-torch.clamp(coef_1, max=5.0) * adv[:, None] * lp) * msk).sum() / msk.sum()
    torch.testing.assert_close(cispo_loss(lp, old, adv, msk)[0], trl)


def test_sapo_by_hand_loop_and_trl_formula():
    # row 1 (A = 1, tau 1): -4 (sig(.5) + sig(0) + sig(-.5)) / 3 = -2; row 2: (4 / 1.05)(sig(-.315) + sig(.105))
    loss, m = sapo_loss(LP, OLD, ADV, MSK)
    assert loss.item() == pytest.approx((-2 + (4 / 1.05) * (sig(-0.315) + sig(0.105))) / 2, abs=1e-6)
    lp, old, adv, msk = random_batch(3)
    for tp, tn in [(1.0, 1.05), (0.5, 3.0)]:
        assert sapo_loss(lp, old, adv, msk, tau_pos=tp, tau_neg=tn)[0].item() == pytest.approx(
            loop_sapo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), tp, tn), abs=1e-5)
        # TRL GRPOTrainer, loss_type="sapo": sigmoid(tau (coef_1 - 1)) 4 / tau, tau by A > 0, then the sequence mean
        coef_1 = torch.exp(lp - old)
        tau = torch.where(adv[:, None] > 0, tp, tn)
        ptl = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv[:, None]
        trl = ((ptl * msk).sum(-1) / msk.sum(-1).clamp(min=1.0)).mean()
        torch.testing.assert_close(sapo_loss(lp, old, adv, msk, tau_pos=tp, tau_neg=tn)[0], trl)
    # on-policy the gate's slope is 1: the gradient is GRPO's
    a, b = OLD.clone().requires_grad_(), OLD.clone().requires_grad_()
    sapo_loss(a, OLD, ADV, MSK)[0].backward()
    grpo_loss(b, OLD, ADV, MSK, aggregation="sequence_mean")[0].backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_sapo_defaults_are_trls():
    "The registry's temperatures are TRL's defaults (the paper's); TRL is a benchmark extra (`pip install trl`)."
    trl = pytest.importorskip("trl")
    fields = trl.GRPOConfig.__dataclass_fields__
    assert (fields["sapo_temperature_pos"].default, fields["sapo_temperature_neg"].default) == (
        ALGORITHMS["sapo"].default_config["tau_pos"], ALGORITHMS["sapo"].default_config["tau_neg"])


def test_gmpo_by_hand_loop_and_verl():
    s1, s2 = math.exp((0.4 + 0 + math.log(0.5)) / 3), math.sqrt(0.77)  # ln 1.5 clipped to 0.4; ln 0.5 kept (A > 0)
    loss, m = gmpo_loss(LP, OLD, ADV, MSK)
    assert (loss.item(), m["clip/high_ratio"]) == pytest.approx(((-s1 + 2 * s2) / 2, 0.2), abs=1e-6)
    lp, old, adv, msk = random_batch(5)
    for lo, hi in [(0.4, 0.4), (0.1, 0.3)]:
        got = gmpo_loss(lp, old, adv, msk, clip_eps=lo, clip_eps_high=hi)[0]
        assert got.item() == pytest.approx(loop_gmpo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), lo, hi),
                                           abs=1e-5)
        # verl's compute_policy_loss_geo_mean: sign trick in log space, exp of the masked mean, mean over sequences
        d, sgn = lp - old, torch.sign(adv)[:, None]
        d_min = sgn * torch.minimum(sgn * d, sgn * d.clamp(-lo, hi))
        n = msk.sum(-1)
        verl = (-adv * torch.exp((d_min * msk).sum(-1) / (n + 1e-8))).mean()
        torch.testing.assert_close(got, verl, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="one advantage per sequence"): gmpo_loss(LP, OLD, torch.ones(2, 3), MSK)


def test_dppo_by_hand_loop_and_verl():
    # out: 0.368 -> 0.552 (A > 0, +0.18 > 0.15) and 0.741 -> 0.519 (A < 0, -0.22 < -0.15); the other three remain
    by_hand = (0.5 + 0.5 * (2 - math.log(0.5)) - 2.2 * (1.2 - math.log(1.1))) / 5
    loss, m = dppo_loss(LP, OLD, ADV, MSK)
    assert (loss.item(), m["clip/ratio"]) == pytest.approx((by_hand, 0.4), abs=1e-6)
    lp, old, adv, msk = random_batch(11)
    for divergence, delta in [("tv", 0.15), ("tv", 0.05), ("binary_kl", 0.05), ("binary_kl", 0.01)]:
        got = dppo_loss(lp, old, adv, msk, clip_eps=delta, divergence=divergence)[0]
        assert got.item() == pytest.approx(
            loop_dppo(lp.tolist(), old.tolist(), adv.tolist(), msk.tolist(), delta, divergence), abs=1e-5)
        # verl's compute_policy_loss_dppo_tv / dppo_kl (clip_ratio_c off): -A sg(r) log pi times the valid mask
        p, q, a = lp.exp(), old.exp(), adv[:, None]
        if divergence == "tv": valid_pos, valid_neg = p - q <= delta, p - q >= -delta
        else:
            bkl = q * (old - lp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
            valid_pos, valid_neg = (bkl <= delta) | (p <= q), (bkl <= delta) | (p >= q)
        valid = torch.where(a > 0, valid_pos, valid_neg).float()
        verl = ((-a * torch.exp(lp - old) * lp * valid) * msk).sum() / msk.sum()
        torch.testing.assert_close(got, verl, rtol=1e-4, atol=1e-6)
    # the gradient inside the region is PPO's unclipped -r A / N; outside it is 0
    lpg = LP.clone().requires_grad_()
    dppo_loss(lpg, OLD, ADV, MSK)[0].backward()
    torch.testing.assert_close(lpg.grad, torch.tensor([[0, -1.0, -0.5], [0, 2.2, 0]]) / 5)
    # ratio_cap caps the detached weight
    capped = dppo_loss(LP, OLD, ADV, MSK, ratio_cap=1.05)[0].item()
    assert capped == pytest.approx((0.5 + 0.5 * (2 - math.log(0.5)) - 2.1 * (1.2 - math.log(1.1))) / 5, abs=1e-6)
    # a rare token's tenfold rise stays inside the TV region; a common token's fall to 0.8 x leaves it
    up, down = dppo_moved(torch.tensor([[math.log(0.01), math.log(0.79)]]),
                          torch.tensor([[math.log(0.001), math.log(0.99)]]))
    assert up.tolist() == [[False, False]] and down.tolist() == [[False, True]]


def test_token_covariance_and_clip_cov_against_verl():
    cov = token_covariance(LP, ADV[:, None], MSK > 0)
    toks = [(i, t) for i in range(2) for t in range(3) if MSK[i, t]]
    mlp, madv = sum(LP[i, t] for i, t in toks) / 5, sum(ADV[i] for i, t in toks) / 5
    for i, t in toks: assert cov[i, t].item() == pytest.approx(((LP[i, t] - mlp) * (ADV[i] - madv)).item(), abs=1e-6)
    assert cov[1, 2] == 0  # padding
    # the pick: always inside the band, max(1, ratio N) of them, reproducible with the seed
    g = torch.Generator().manual_seed(0)
    c, msk = torch.rand(8, 9, generator=g) * 7 - 1, torch.rand(8, 9, generator=g) > 0.2
    torch.manual_seed(1)
    a = clip_cov_select(c, msk, 0.1, 1.0, 5.0)
    torch.manual_seed(1)
    assert torch.equal(a, clip_cov_select(c, msk, 0.1, 1.0, 5.0))
    assert int(a.sum()) == int(0.1 * int(msk.sum())) and ((c[a] > 1) & (c[a] < 5) & msk[a]).all()
    assert int(clip_cov_select(c, msk, 1e-6).sum()) == 1  # at least one
    assert int(clip_cov_select(c, msk, 0.1, 100.0, 200.0).sum()) == 0  # an empty band picks nothing
    # verl's clip_cov multiplies the picked tokens' loss by 0: the same loss and gradient as GRPO with A = 0 there
    lp, old, adv, msk = random_batch(2)
    torch.manual_seed(4)
    adv_tok = compute_clip_cov_advantages(adv, [0, 0, 0, 1, 1, 1], old, msk, scale="none", clip_cov_ratio=0.1,
                                          clip_cov_low=0.0, clip_cov_high=10.0)
    picked = adv_tok == 0
    assert 0 < int((picked & (msk > 0)).sum()) <= max(1, int(0.1 * msk.sum()))
    a2 = rlnb.compute_grpo_advantages(adv, [0, 0, 0, 1, 1, 1], scale="none")[:, None]
    ratio = torch.exp(lp - old)
    verl_tok = torch.maximum(-a2 * ratio, -a2 * ratio.clamp(0.8, 1.2)) * (~picked).float()
    verl = (verl_tok * msk).sum() / msk.sum()
    torch.testing.assert_close(grpo_loss(lp, old, adv_tok, msk)[0], verl)


def test_kl_cov_by_hand_and_verl():
    lp = (OLD + torch.tensor([[0, 0.1, 0], [0, 0, 0]])).requires_grad_()
    loss, m = kl_cov_loss(lp, OLD, ADV, MSK, kl_cov_ratio=0.2)  # top 1 of 5: row 1's second token, log r = 0.1
    loss.backward()
    assert loss.item() == pytest.approx((-(math.exp(0.1) + 2) + 4 + 0.1) / 5, abs=1e-6)
    torch.testing.assert_close(lp.grad, torch.tensor([[-1, 1 - math.exp(0.1), -1], [2, 2, 0]]) / 5)
    lp, old, adv, msk = random_batch(8)
    for k, coef in [(0.2, 1.0), (0.05, 0.5)]:
        got = kl_cov_loss(lp, old, adv, msk, kl_cov_ratio=k, kl_cov_coef=coef)[0]
        # verl's compute_policy_loss_kl_cov: cov over the valid tokens, topk(max(1, int(N k))), -A r + coef |log r|
        valid = msk > 0
        a_v, lp_v = adv[:, None].expand_as(lp)[valid], lp[valid]
        cov = (a_v - a_v.mean()) * (lp_v - lp_v.mean())
        idx = valid.flatten().nonzero().squeeze(1)[cov.topk(max(1, int(len(cov) * k))).indices]
        ptl = (-adv[:, None] * torch.exp(lp - old)).flatten()
        ptl[idx] += coef * (lp - old).abs().flatten()[idx]
        torch.testing.assert_close(got, (ptl.view_as(lp) * msk).sum() / msk.sum())


# ---- options ----
@pytest.mark.parametrize("call,message", [
    (lambda: cispo_loss(LP, OLD, ADV, MSK, clip_eps_high=-1.0), "cispo_loss: `clip_eps_high` must be"),
    (lambda: cispo_loss(LP, OLD, ADV, MSK, clip_eps=-0.2), "cispo_loss: `clip_eps` must be"),
    (lambda: sapo_loss(LP, OLD, ADV, MSK, tau_pos=-1.0), "sapo_loss: `tau_pos` must be"),
    (lambda: sapo_loss(LP, OLD, ADV, MSK, tau_neg=0), "sapo_loss: `tau_neg` must be > 0"),
    (lambda: gmpo_loss(LP, OLD, ADV, MSK, clip_eps=math.nan), "gmpo_loss: `clip_eps` must be"),
    (lambda: gmpo_loss(LP, OLD, ADV, MSK, clip_eps_high=-0.4), "gmpo_loss: `clip_eps_high` must be"),
    (lambda: dppo_loss(LP, OLD, ADV, MSK, clip_eps=-0.15), "dppo_loss: `clip_eps` must be"),
    (lambda: dppo_loss(LP, OLD, ADV, MSK, ratio_cap=-1.0), "dppo_loss: `ratio_cap` must be"),
    (lambda: dppo_loss(LP, OLD, ADV, MSK, divergence="js"), "dppo_loss: `divergence`='js'"),
    (lambda: kl_cov_loss(LP, OLD, ADV, MSK, kl_cov_ratio=-0.1), "kl_cov_loss: `kl_cov_ratio` must be"),
    (lambda: kl_cov_loss(LP, OLD, ADV, MSK, kl_cov_coef=math.inf), "kl_cov_loss: `kl_cov_coef` must be"),
    (lambda: compute_clip_cov_advantages([1., 0.], [0, 0], OLD, MSK, clip_cov_ratio=-1.0), "`clip_cov_ratio` must be"),
    (lambda: compute_clip_cov_advantages([1., 0.], [0, 0], OLD, MSK, clip_cov_high=0.5), "`clip_cov_high` must be"),
    (lambda: compute_clip_cov_advantages([1., 0.], [0, 0]), "needs `old_logprobs` and `loss_mask`"),
    (lambda: sapo_loss(LP, OLD, ADV, MSK, beta=0.1), "`beta`=0.1 needs `ref_logprobs`"),
    (lambda: cispo_loss(LP, OLD, ADV, MSK, aggregation="mean"), "`aggregation`='mean'"),
    (lambda: create_algorithm_config("cispo", epsilon_high=5.0), "has no option(s) ['epsilon_high']"),
])
def test_bad_options_name_the_argument(call, message):
    with pytest.raises(ValueError) as e: call()
    assert message in str(e.value), str(e.value)


def test_registry_metrics_and_reference_kl():
    from rlnb.core import Rollout, collate
    rs = [Rollout("q", prompt_token_ids=[1], token_ids=[5, 6, 2], logprobs=[-1., -.5, -2.],
                  ref_logprobs=[-1., -.4, -2.], rewards=r, group_index=0) for r in (1.0, 0.0, 0.0, 1.0)]
    cb = collate(rs, pad_token_id=0, eos_token_id=2)
    lp = cb.old_logprobs.clone().requires_grad_()
    for name in KEYS:
        spec = ALGORITHMS[name]
        assert spec.group_relative and spec.correction_level in ("token", "sequence")
        loss, m = compute_loss_by_algorithm(cb, lp, {**create_algorithm_config(name, beta=0.04), "max_new_tokens": 3})
        loss.backward()
        assert torch.isfinite(loss) and lp.grad.abs().sum() > 0, name
        assert {"loss/policy", "loss/kl", "clip/ratio", "ratio/mean", "entropy/sampled_nll", "kl/mean"} <= set(m), name
        lp.grad = None
    for n in "cispo_loss sapo_loss gmpo_loss dppo_loss kl_cov_loss compute_clip_cov_advantages".split():
        assert hasattr(rlnb, n), n  # the package imports the module


# ---- gradient accumulation: every key, every aggregation ----
CASES = [(name, {"aggregation": agg}) for name in KEYS for agg in ("token_mean", "sequence_mean", "constant")]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o['aggregation']}" for n, o in CASES])
def test_micro_batches_give_the_full_batch_gradient(setting, name, options):  # noqa: F811
    full = accumulated_grads(setting, name, options, None)
    micro = accumulated_grads(setting, name, options, 4)
    assert full and full.keys() == micro.keys()
    for key in full:
        torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name} {options} {key}: {m}")


def test_each_loss_adds_up_over_row_splits_off_policy():
    """Off-policy (ratio != 1, so clips, gates and masks act), the loss of a batch is the weighted sum of the losses of
    its row blocks, with the weights training_step gives micro-batches: what makes accumulation exact. KL-Cov is left
    out: its top tokens are picked among the rows it is given."""
    lp, old, adv, msk = random_batch(21, B=8, C=6)
    blocks = [slice(0, 3), slice(3, 4), slice(4, 8)]
    cases = [(cispo_loss, dict(clip_eps=0.2, clip_eps_high=0.2)), (sapo_loss, {}), (gmpo_loss, dict(clip_eps=0.1)),
             (dppo_loss, dict(clip_eps=0.05)), (dppo_loss, dict(clip_eps=0.01, divergence="binary_kl"))]
    for fn, knobs in cases:
        for agg in ("token_mean", "sequence_mean", "constant"):
            full = fn(lp, old, adv, msk, aggregation=agg, **knobs)[0]
            share = {"token_mean": lambda b: msk[b].sum() / msk.sum(), "sequence_mean": lambda b: len(range(8)[b]) / 8,
                     "constant": lambda b: len(range(8)[b]) / 8}[agg]
            parts = sum(share(b) * fn(lp[b], old[b], adv[b], msk[b], aggregation=agg, max_completion_length=6,
                                      **knobs)[0] for b in blocks)
            torch.testing.assert_close(parts, full, msg=lambda m: f"{fn.__name__} {agg}: {m}")


# ---- in train, by name and switched to mid-run ----
SMALL = dict(prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.parametrize("name", KEYS)
def test_each_key_runs_by_name_in_train(name):
    seen = []
    state = train(create_training_config(**SMALL, num_iterations=2, algorithm=name),
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
        options = {"tau_neg": 2.0} if name == "sapo" else None
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), algorithm=name, algorithm_options=options,
                                            num_iterations=2, prompts_per_step=4, eval_every=0, seed=0))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["algorithm"] for r in rows if "reward/mean" in r] == [name, name], name
