"""Checks of rlnb.off_policy_masks: OPSM, K3-RS and TRM against hand numbers, a loop, and the formulas of TRL, slime,
verl and SkyRL; DeepSeek-V3.2's importance-weighted KL against TRL's and slime's formula and the exact KL gradient;
micro-batches equal to the full batch through the step's three correction call sites; knobs refused by name; runs
by name in `train`, in the papermill notebook and switched to mid-run."""
import math
import sys

import pytest
import torch

import rlnb
from rlnb.algorithms import (aggregate_loss, compute_batch_advantages, compute_loss_by_algorithm,
                             create_algorithm_config, grpo_loss, token_kl)
from rlnb.core import GenerationConfig, Rollout, collate, create_training_config, set_seed
from rlnb.kl import KL_ESTIMATORS, kl_k2, kl_k3
from rlnb.mismatch import create_hf_generator
from rlnb.rollout_corrections import (ROLLOUT_CORRECTIONS, apply_rollout_correction, check_rollout_correction,
                                      find_rollout_correction, rollout_correction)
from rlnb.off_policy_masks import importance_weighted_kl, kl_k3_is
from rlnb.policy_losses import cispo_loss
from rlnb.training import train
from test_micro_batches import accumulated_grads

torch.set_num_threads(1)
MODES = ("opsm", "k3_rs", "trm")
KNOBS = {"opsm": (0.1, 0.5, 2.0), "k3_rs": (0.05, 0.5, 2.0), "trm": (2.0, 0.6, 1.5)}  # (cap, low, high)


def loop_keep(old, roll, mask, adv, mode, cap, low, high):
    "Each mode's definition, one row and one token at a time: keep as nested lists (adv: one per token)."
    keep = []
    for o_row, r_row, m_row, a_row in zip(old, roll, mask, adv):
        log_rho = [o - r for o, r, m in zip(o_row, r_row, m_row) if m]
        n = max(len(log_rho), 1)
        opsm_div = -sum(log_rho) / n
        mean_k3 = sum(math.exp(x) - 1 - x for x in log_rho) / n
        inside = all(low <= math.exp(x) <= high for x in log_rho)
        keep.append([bool(m) and {"opsm": not (a < 0 and opsm_div > cap), "k3_rs": mean_k3 <= cap,
                                  "trm": inside}[mode] for m, a in zip(m_row, a_row)])
    return keep


def random_batch(seed=0, B=24, C=10):
    "Trainer and sampler log-probs with rows from on-policy to far off, a mask with an empty row, advantages."
    set_seed(seed)
    roll = -torch.rand(B, C) * 3
    old = roll + torch.randn(B, C) * torch.rand(B, 1) * 0.6
    mask = (torch.rand(B, C) > 0.25).float()
    mask[0] = 0
    return old, roll, mask, torch.randn(B)


def hand_example():
    "The chapter's 4x4 example: ratios, sampler log-probs, mask, advantages."
    rho = torch.tensor([[1.0, 0.5, 0.8, 1.0], [1.0, 0.5, 0.8, 1.0], [1.0, 1.0, 1.0, 1.7], [0.7, 0.7, 1.4, 1.0]])
    mu = torch.tensor([[-1.0, -0.5, -2.0, -0.3], [-1.0, -0.5, -2.0, -0.3], [-0.2, -1.5, -0.7, -2.2],
                       [-0.9, -0.4, -1.1, -0.6]])
    msk = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    return mu + rho.log(), mu, msk, torch.tensor([-1.0, 1.0, -1.0, -1.0])


# ---- the three masks: hand numbers, loop, references ----
def test_hand_worked_4x4():
    old, mu, msk, adv = hand_example()
    expected = {"opsm": [0, 1, 1, 0], "k3_rs": [0, 0, 1, 0], "trm": [0, 0, 0, 1]}
    for mode, rows in expected.items():
        w, kept, m = rollout_correction(old, mu, msk, mode, *KNOBS[mode], advantages=adv)
        assert kept.bool().any(1).int().tolist() == rows, mode
        assert torch.equal(w, kept)  # weight 1 on what is kept
    n = msk.sum(1)
    opsm_div = -(old - mu).mul(msk).sum(1) / n
    torch.testing.assert_close(opsm_div, torch.tensor([0.229073, 0.229073, -0.132657, 0.125626]), atol=1e-6, rtol=0)
    k3 = torch.where(msk > 0, (old - mu).exp() - 1 - (old - mu), 0.0).sum(1) / n
    torch.testing.assert_close(k3, torch.tensor([0.054073, 0.054073, 0.042343, 0.058959]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("knobs", [(0.1, 0.6, 1.5), (0.02, 0.8, 1.25), (0.3, 0.3, 3.0)])
@pytest.mark.parametrize("per_token", [False, True])
def test_every_mode_equals_the_loop(mode, knobs, per_token):
    old, roll, mask, adv = random_batch(1)
    adv_tok = adv[:, None] + (torch.randn(mask.shape) * 0.5 if per_token else torch.zeros(mask.shape))  # (B, C)
    old_pad, roll_pad = old.clone(), roll.clone()
    old_pad[mask == 0], roll_pad[mask == 0] = -math.inf, math.nan  # padding that must not leak
    w, kept, metrics = rollout_correction(old_pad, roll_pad, mask, mode, *knobs,
                                          advantages=adv_tok if per_token else adv)
    loop = loop_keep(old.tolist(), roll.tolist(), mask.tolist(), adv_tok.tolist(), mode, *knobs)
    assert torch.equal(kept.bool(), torch.tensor(loop))
    assert torch.equal(w, kept) and metrics["mismatch/masked_fraction"] < 1


def test_opsm_is_trls_and_slimes_formula():
    "TRL GRPOTrainer.get_off_policy_mask and slime compute_opsm_mask, written out, keep the same rows."
    old, roll, mask, adv = random_batch(2)
    for delta in (0.01, 0.1, 0.3):
        kept = rollout_correction(old, roll, mask, "opsm", cap=delta, advantages=adv)[1]
        # TRL: kl_div = sampling - per_token (detached); mean over the mask; keep if A >= 0 or mean <= delta
        kl_div = torch.nan_to_num(roll - old, nan=0.0)
        avg = (kl_div * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        trl = ((adv[:, None] >= 0) | (avg <= delta)).float()  # (B, 1)
        assert torch.equal(kept, (trl * mask)), delta
        # slime: per sample, seq_kl = mean((old_log_prob - log_prob) * mask) with old = rollout; drop if A < 0
        for i in range(len(adv)):
            seq_kl = ((roll[i] - old[i]) * mask[i]).sum() / mask[i].sum().clamp(min=1)
            dropped = bool((adv[i] < 0) & (seq_kl > delta))
            assert torch.equal(kept[i], mask[i] * (1 - float(dropped)))


def test_k3_rs_is_verls_seq_mean_k3():
    "verl compute_rollout_rejection_mask(rollout_rs='seq_mean_k3', threshold), written out."
    old, roll, mask, adv = random_batch(3)
    for threshold in (0.001, 0.01, 0.05):
        kept = rollout_correction(old, roll, mask, "k3_rs", cap=threshold, advantages=adv)[1]
        log_ratio = torch.clamp(old - roll, -20, 20)
        token_k3 = torch.exp(log_ratio) - 1.0 - log_ratio
        seq = (token_k3 * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # verl_F.masked_mean
        verl = mask * (seq <= threshold).float()[:, None]
        assert torch.equal(kept, verl), threshold
        assert 0 < kept.sum() < mask.sum()


def test_trm_is_skyrls_outlier_mask_and_verls_seq_max_k2():
    old, roll, mask, adv = random_batch(4)
    for low, high in ((0.6, 1.5), (0.8, 1.1), (0.3, 4.0)):
        kept = rollout_correction(old, roll, mask, "trm", low=low, high=high, advantages=adv)[1]
        # SkyRL compute_outlier_token_mask: a sequence is valid if all its tokens' ratios are in bounds
        ratio = torch.exp(torch.clamp(old - roll, -20, 20))
        over, under = (ratio > high) & (mask > 0), (ratio < low) & (mask > 0)
        valid = (~over & ~under | (mask == 0)).all(-1, keepdim=True).float()
        assert torch.equal(kept, mask * valid), (low, high)
    for delta in (0.005, 0.05, 0.2):  # verl seq_max_k2: max_t (log rho_t)^2 / 2 <= delta, i.e. a symmetric band
        high = math.exp(math.sqrt(2 * delta))
        kept = rollout_correction(old, roll, mask, "trm", low=1 / high, high=high, advantages=adv)[1]
        k2 = 0.5 * torch.clamp(old - roll, -20, 20) ** 2
        seq_max = k2.masked_fill(mask == 0, -math.inf).max(-1).values
        seq_max = torch.where(seq_max == -math.inf, torch.zeros_like(seq_max), seq_max)
        assert torch.equal(kept, mask * (seq_max <= delta).float()[:, None]), delta


def test_modes_are_found_however_rlnb_was_imported():
    "A name missing from the registry (here: the module never imported) loads the chapter that registers it."
    saved_module, saved = sys.modules.pop("rlnb.off_policy_masks"), {m: ROLLOUT_CORRECTIONS.pop(m) for m in MODES}
    saved_kl = KL_ESTIMATORS.pop("k3_is")
    try:
        assert find_rollout_correction("opsm") is not None and {"k3_rs", "trm"} <= set(ROLLOUT_CORRECTIONS)
        assert "k3_is" in KL_ESTIMATORS  # the same chapter registers the estimator
    finally:
        sys.modules["rlnb.off_policy_masks"] = saved_module
        ROLLOUT_CORRECTIONS.update(saved)
        KL_ESTIMATORS["k3_is"] = saved_kl
    assert find_rollout_correction("nope") is None and find_rollout_correction(3) is None


# ---- knobs refused by name ----
@pytest.mark.parametrize("call, message", [
    (lambda: check_rollout_correction("opsm", cap=0.0), "`cap`=0.0 must be > 0"),
    (lambda: check_rollout_correction("opsm", cap=-0.1), "`cap` must be a finite number >= 0"),
    (lambda: check_rollout_correction("k3_rs", cap=math.inf), "`cap` must be a finite number"),
    (lambda: check_rollout_correction("k3_rs", cap="0.01"), "`cap` must be a finite number"),
    (lambda: check_rollout_correction("k3_rs", cap=True), "`cap` must be a finite number"),
    (lambda: check_rollout_correction("trm", low=1.5, high=0.6), "`low`=1.5 must be < `high`=0.6"),
    (lambda: check_rollout_correction("trm", low=math.nan), "`low` must be a finite number"),
    (lambda: check_rollout_correction("trm", low=1.2, high=3.0), "mode 'trm' with `low`=1.2, `high`=3.0 drops"),
    (lambda: check_rollout_correction("trm", low=0.2, high=0.9), "mode 'trm' with `low`=0.2, `high`=0.9 drops"),
    (lambda: rollout_correction(*hand_example()[:3], "opsm"), "pass the batch's `advantages`"),
    (lambda: rollout_correction(*hand_example()[:3], "opsm", advantages=torch.ones(3)), "`advantages` has shape (3,)"),
    (lambda: rollout_correction(*hand_example()[:3], "opsm", advantages=torch.tensor([1.0, math.nan, 0, 0])),
     "`advantages` must be finite"),
])
def test_bad_knobs_are_named(call, message):
    with pytest.raises((ValueError, TypeError)) as e: call()
    assert message in str(e.value)


def test_train_refuses_bad_knobs_before_any_model_loads(monkeypatch):
    "The run's checks refuse each mode's bad knob, naming the TrainingConfig field, before a model is loaded."
    def no_load(*a, **k): raise AssertionError("a model was loaded")
    monkeypatch.setattr(rlnb.training, "load_model", no_load)
    small = dict(num_iterations=1, prompts_per_step=2, group_size=2, eval_every=0)
    cases = [(dict(rollout_correction="trm", rollout_correction_low=1.2, rollout_correction_high=3.0),
              "`rollout_correction_low`=1.2, `rollout_correction_high`=3.0"),
             (dict(rollout_correction="opsm", rollout_correction_cap=0.0), "rollout_correction_cap"),
             (dict(rollout_correction="k3_rs", rollout_correction_cap=math.nan), "rollout_correction_cap"),
             (dict(rollout_correction="trm", rollout_correction_low=2.0, rollout_correction_high=1.0),
              "rollout_correction_low"),
             (dict(rollout_correction="opsm", rollout_correction_cap="0.1"), "rollout_correction_cap")]
    for fields, message in cases:
        with pytest.raises((ValueError, TypeError)) as e:
            train(create_training_config(**small, **fields), progress=False)
        assert message in str(e.value), (fields, str(e.value))
    with pytest.raises(ValueError, match="the names are .*'k3_is'"):
        train(create_training_config(**small, algorithm_options={"beta": 0.04, "kl_fn": "k3_iss"}), progress=False)


# ---- the importance-weighted KL ----
def random_policy(seed=5, B=6, C=7):
    set_seed(seed)
    old = -torch.rand(B, C) * 3
    lp = (old + torch.randn(B, C) * 0.3).requires_grad_()
    ref = old + torch.randn(B, C) * 0.3
    mask = (torch.rand(B, C) > 0.2).float()
    return lp, old, ref, mask, torch.randn(B)


def test_k3_is_by_hand():
    "pi = 0.5, pi_old = 0.4, pi_ref = 0.25: KL 1.25 x 0.193147 = 0.241434, derivative 1.25 x 0.693147 = 0.866434."
    lp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    old, ref, keep = torch.tensor([[math.log(0.4)]]), torch.tensor([[math.log(0.25)]]), torch.ones(1, 1, dtype=bool)
    kl = token_kl(lp, ref, keep, "k3_is", log_ratio=lp - old)
    g, = torch.autograd.grad(kl.sum(), lp)
    assert kl.item() == pytest.approx(0.241434, abs=1e-6) and g.item() == pytest.approx(0.866434, abs=1e-6)
    assert kl_k3_is.importance_weighted and kl_k3_is.__name__ == "kl_k3_is" and KL_ESTIMATORS["k3_is"] is kl_k3_is
    torch.testing.assert_close(kl_k3_is(lp, ref), kl_k3(lp, ref))  # as a measurement: plain k3 (ratio 1 at sampling)


def test_k3_is_in_grpo_is_trls_and_slimes_formula():
    "GRPOTrainer with use_bias_correction_kl: per_token_kl * coef_1 added to the clipped loss, then the sequence mean."
    lp, old, ref, mask, adv = random_policy()
    beta = 0.1
    ours = grpo_loss(lp, old, adv, mask, ref_logprobs=ref, beta=beta, kl_fn="k3_is", aggregation="sequence_mean")[0]
    coef_1 = torch.exp(lp - old)
    coef_2 = torch.clamp(coef_1, 0.8, 1.2)
    per_token_kl = (torch.exp(ref - lp) - (ref - lp) - 1) * coef_1  # TRL
    slime = coef_1 * ((ref - lp).exp() - 1 - (ref - lp))  # slime compute_approx_kl(k3, importance_ratio)
    torch.testing.assert_close(per_token_kl, slime)
    ptl = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None]) + beta * per_token_kl
    trl = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    torch.testing.assert_close(ours, trl)
    g_ours, = torch.autograd.grad(ours, lp)
    g_trl, = torch.autograd.grad(trl, lp)
    torch.testing.assert_close(g_ours, g_trl)
    plain = grpo_loss(lp, old, adv, mask, ref_logprobs=ref, beta=beta, aggregation="sequence_mean")[0]
    assert not torch.allclose(torch.autograd.grad(plain, lp)[0], g_ours)  # the weight does change the gradient


def test_k3_is_in_cispo_through_finish_policy_loss():
    "Every loss built on finish_policy_loss passes its ratio: CISPO plus TRL's corrected KL, token mean."
    lp, old, ref, mask, adv = random_policy(6)
    ours = cispo_loss(lp, old, adv, mask, ref_logprobs=ref, beta=0.2, kl_fn="k3_is")[0]
    coef_1 = torch.exp(lp - old)
    per_token_kl = (torch.exp(ref - lp) - (ref - lp) - 1) * coef_1
    ptl = -torch.clamp(coef_1, max=5.0).detach() * adv[:, None] * lp + 0.2 * per_token_kl
    torch.testing.assert_close(ours, (ptl * mask).sum() / mask.sum())


def test_k3_is_expected_gradient_is_the_kls():
    "Summed over a small vocabulary, E_old[grad(r k3)] is grad KL(pi || ref) at any pi_old; E_old[grad k3] is not."
    V = 6
    for seed, drift in ((0, 0.0), (1, 0.3), (2, 1.0)):
        g = torch.Generator().manual_seed(seed)
        theta = torch.randn(V, generator=g).requires_grad_()
        ref = torch.log_softmax(torch.randn(V, generator=g), 0)
        old = torch.log_softmax(theta.detach() + drift * torch.randn(V, generator=g), 0)
        lp = torch.log_softmax(theta, 0)
        exact, = torch.autograd.grad((lp.exp() * (lp - ref)).sum(), theta, retain_graph=True)
        keep = torch.ones(1, V, dtype=torch.bool)
        weighted = token_kl(lp[None], ref[None], keep, "k3_is", log_ratio=(lp - old)[None])[0]
        g_is, = torch.autograd.grad((old.exp() * weighted).sum(), theta, retain_graph=True)
        torch.testing.assert_close(g_is, exact, rtol=1e-5, atol=1e-6)
        g_k3, = torch.autograd.grad((old.exp() * token_kl(lp[None], ref[None], keep, "k3")[0]).sum(), theta)
        assert (g_k3 - exact).norm() > 0.05 * exact.norm()
    k2_is = importance_weighted_kl(kl_k2)  # any estimator can be marked
    assert k2_is.importance_weighted and k2_is.__name__ == "kl_k2_is"


@pytest.mark.parametrize("name", ["grpo", "dapo", "cispo", "sapo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_k3_is_adds_up_over_row_splits(name, aggregation):
    "The weighted KL is aggregated like the policy term: row blocks weighted as training_step weighs micro-batches."
    lp, old, ref, mask, adv = random_policy(7, B=8, C=6)
    cfg = create_algorithm_config(name, beta=0.1, kl_fn="k3_is")
    if "aggregation" in cfg: cfg["aggregation"] = aggregation
    agg = cfg.get("aggregation", "token_mean")
    batch = collate([Rollout("q", prompt_token_ids=[1], token_ids=[3] * 6, logprobs=o.tolist(), rewards=0.0)
                     for o in old], pad_token_id=0)._replace(loss_mask=mask, ref_logprobs=ref, advantages=adv,
                                                             old_logprobs=old)
    kw = {**cfg, "max_completion_length": 6} if "max_completion_length" in cfg else cfg
    full, = torch.autograd.grad(compute_loss_by_algorithm(batch, lp, kw)[0], lp)
    total = torch.zeros_like(lp)
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):
        part = batch._replace(**{f: getattr(batch, f)[rows] for f in ("input_ids", "attention_mask", "completion_ids",
                                                                       "completion_mask", "loss_mask", "rewards",
                                                                       "group_ids", "old_logprobs", "ref_logprobs",
                                                                       "advantages")})
        share = mask[rows].sum() / mask.sum() if agg == "token_mean" else len(range(8)[rows]) / 8
        total += torch.autograd.grad(compute_loss_by_algorithm(part, lp[rows], kw)[0] * share, lp)[0]
    torch.testing.assert_close(total, full)


def test_k3_is_is_refused_where_a_loss_has_no_ratio():
    lp, old, ref, mask, adv = random_policy(8)
    batch = collate([Rollout("q", prompt_token_ids=[1], token_ids=[3] * 7, logprobs=o.tolist(), rewards=0.0)
                     for o in old], pad_token_id=0)._replace(loss_mask=mask, ref_logprobs=ref, advantages=adv)
    for name in ("gspo", "reinforce"):
        with pytest.raises(ValueError, match="kl_fn `kl_k3_is` weights each token's KL by pi/pi_old"):
            compute_loss_by_algorithm(batch, lp, create_algorithm_config(name, beta=0.1, kl_fn="k3_is"))


# ---- micro-batches through the step's three call sites ----
@pytest.fixture(scope="module")
def sampled():
    "A LoRA policy and a batch sampled by its bf16 copy, the sampler's log-probs moved further off, random rewards."
    from rlnb.models import apply_lora
    from rlnb.rollouts import create_batch_rollouts
    from rlnb.tiny import load_tiny_model
    base, tok = load_tiny_model("addition")
    set_seed(0)
    policy = apply_lora(base, r=4)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p))
    batch = create_batch_rollouts(policy, tok, rlnb.get_task("addition").sample(4, seed=3),
                                  GenerationConfig(max_new_tokens=6, num_return_sequences=4),
                                  generator=create_hf_generator("bfloat16"))
    g = torch.Generator().manual_seed(1)
    rows = []
    for r in batch.rollouts:
        noise = (torch.randn(len(r.generation.logprobs), generator=g) * torch.rand(1, generator=g) * 0.5).tolist()
        rows.append(r._replace(rewards=float(torch.rand(1, generator=g)),
                               generation=r.generation._replace(logprobs=[x + n for x, n in
                                                                         zip(r.generation.logprobs, noise)])))
    return policy, tok, batch._replace(rollouts=rows)


@pytest.mark.parametrize("mode", [*MODES, "tis_token", "none"])
@pytest.mark.parametrize("name", ["grpo", "gspo", "ppo"])
def test_step_micro_batches_give_the_full_batch_gradient(sampled, mode, name):
    """A correction taken once before the micro-batches (the masks) or in each micro-batch's own pass (TIS, none):
    the same gradient and figures whether the batch is split or not; the masks drop some rows and not all."""
    cap, low, high = KNOBS.get(mode, (1.05, 0.5, 2.0))
    config = dict(rollout_correction=mode, rollout_correction_cap=cap, rollout_correction_low=low,
                  rollout_correction_high=high)
    m_full, m_split = {}, {}
    full = accumulated_grads(sampled, name, {}, None, m_full, **config)
    split = accumulated_grads(sampled, name, {}, 5, m_split, **config)
    assert full.keys() == split.keys() and full
    for k in full: torch.testing.assert_close(split[k], full[k], rtol=1e-4, atol=1e-6)
    assert m_split["mismatch/seq_masked_fraction"] == pytest.approx(m_full["mismatch/seq_masked_fraction"])
    if mode in MODES: assert 0 < m_full["mismatch/seq_masked_fraction"] < 1, m_full["mismatch/seq_masked_fraction"]


def test_step_k3_is_micro_batches_and_change(sampled):
    "The weighted KL through a step: micro-batches add up, and the gradient differs from plain k3's."
    options = {"beta": 0.1, "kl_fn": "k3_is"}
    full = accumulated_grads(sampled, "grpo", options, None)
    split = accumulated_grads(sampled, "grpo", options, 5)
    plain = accumulated_grads(sampled, "grpo", {"beta": 0.1}, None)
    for k in full: torch.testing.assert_close(split[k], full[k], rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(full[k], plain[k]) for k in full)


def test_apply_opsm_through_the_registry_equals_explicit_masking():
    "OPSM's kept tokens, applied to a batch, give the loss of the batch with those tokens out of the mask."
    set_seed(3)
    lengths = [9, 4, 7, 9, 2, 5, 8, 6]
    old = -torch.rand(len(lengths), 9) * 3
    rows = [Rollout("q", prompt_token_ids=[1], token_ids=list(range(3, 3 + n)), logprobs=o[:n].tolist(),
                    rewards=float(i % 3), group_index=i // 2) for i, (o, n) in enumerate(zip(old, lengths))]
    cb = collate(rows, pad_token_id=0)
    roll = cb.old_logprobs + torch.randn(cb.loss_mask.shape) * 0.3  # rows 0 and 4: A < 0, mean log(mu/pi) > 0.2
    cfg = {**create_algorithm_config("grpo"), "max_new_tokens": 9}
    base = compute_batch_advantages(cb, cfg)
    w, kept, _ = rollout_correction(base.old_logprobs, roll, base.loss_mask, "opsm", 0.05, advantages=base.advantages)
    assert 0 < kept.sum() < base.loss_mask.sum()
    corrected = apply_rollout_correction(base, w, kept, cfg)
    lp = (base.old_logprobs + torch.randn(cb.loss_mask.shape) * 0.1).requires_grad_()
    g1, = torch.autograd.grad(compute_loss_by_algorithm(corrected, lp, cfg)[0], lp)
    explicit = {**cfg, "aggregation": lambda l, m: aggregate_loss(l, m, cfg["aggregation"], 9)}
    g2, = torch.autograd.grad(compute_loss_by_algorithm(base._replace(loss_mask=base.loss_mask * kept), lp,
                                                        explicit)[0], lp)
    torch.testing.assert_close(g1, g2)


# ---- runs ----
SMALL = dict(prompts_per_step=4, group_size=4, max_new_tokens=6, eval_every=0, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_runs_by_name_in_train(mode):
    cap, low, high = {"opsm": (1e-4, 0.5, 2.0), "k3_rs": (2e-5, 0.5, 2.0), "trm": (2.0, 0.99, 1.01)}[mode]
    seen = []
    state = train(create_training_config(**SMALL, num_iterations=2, generator="hf_bf16", rollout_correction=mode,
                                         rollout_correction_cap=cap, rollout_correction_low=low,
                                         rollout_correction_high=high),
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 2 and all(math.isfinite(m["loss/total"]) for m in seen)
    assert any(0 < m["mismatch/seq_masked_fraction"] < 1 for m in seen), [m["mismatch/seq_masked_fraction"]
                                                                        for m in seen]


@pytest.mark.slow
def test_switching_from_grpo_to_the_weighted_kl_and_masks_mid_run():
    "A schedule: GRPO, then GRPO with k3_is, then GSPO (one weight per row) under OPSM, in one run."
    configs = [create_algorithm_config("grpo"), create_algorithm_config("grpo", beta=0.04, kl_fn="k3_is"),
               create_algorithm_config("gspo")]
    seen = []
    state = train(create_training_config(**SMALL, num_iterations=3, generator="hf_bf16", rollout_correction="opsm",
                                         rollout_correction_cap=1e-4),
                  algorithm_config=lambda it: configs[it],
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 3 and [m["algorithm"] for m in seen] == ["grpo", "grpo", "gspo"]
    assert "loss/kl" in seen[1] and "mismatch/seq_masked_fraction" in seen[2]


@pytest.mark.slow
def test_each_key_runs_in_the_papermill_notebook(tmp_path):
    "The experiment notebook takes the masks by rollout_correction and the KL by algorithm_options."
    import json
    from pathlib import Path

    import papermill as pm
    root = Path(__file__).resolve().parent.parent
    runs = {"opsm": dict(rollout_correction="opsm", rollout_correction_cap=1e-4,
                         algorithm_options={"beta": 0.04, "kl_fn": "k3_is"}),
            "k3_rs": dict(rollout_correction="k3_rs", rollout_correction_cap=2e-5),
            "trm": dict(rollout_correction="trm", rollout_correction_low=0.99, rollout_correction_high=1.01)}
    for name, params in runs.items():
        out = tmp_path / name
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), generator="hf_bf16", num_iterations=2,
                                            prompts_per_step=4, eval_every=0, seed=0, **params))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "reward/mean" in r]
        assert len(steps) == 2 and all("mismatch/seq_masked_fraction" in r for r in steps), name
        if name == "opsm": assert all("loss/kl" in r for r in steps)
