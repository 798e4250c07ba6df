"""Checks of rlnb.mismatch: every correction mode against a hand-written loop, the TIS-by-advantage identity on the
losses (gradients included), errors for bad input, micro-batches that add up to the full batch, and the bf16 sampler."""
import math

import pytest
import torch

import rlnb
from rlnb.algorithms import (ALGORITHMS, aggregate_loss, compute_batch_advantages, compute_loss_by_algorithm,
                             create_algorithm_config, grpo_loss)
from rlnb.core import GenerationConfig, Rollout, collate, set_seed
from rlnb.generation import batch_generate
from rlnb.rollouts import create_batch_rollouts
from rlnb.logprobs import compute_logprobs_for_tokens
from rlnb.mismatch import create_hf_generator, mismatch_metrics, sampler_copy
from rlnb.rollout_corrections import ROLLOUT_CORRECTIONS, apply_rollout_correction, rollout_correction
from rlnb.models import apply_lora
from rlnb.tiny import load_tiny_model

torch.set_num_threads(1)
MODES = ("none", "tis_token", "tis_seq", "mis_token", "mis_seq", "icepop", "geo_rs")


def loop_correction(old, roll, mask, mode, cap, low, high):
    "Each mode's definition, one row and one token at a time: (weights, keep) as nested lists."
    weights, keep = [], []
    for o_row, r_row, m_row in zip(old, roll, mask):
        log_r = [o - r for o, r, m in zip(o_row, r_row, m_row) if m]  # the row's tokens on the mask
        seq = math.exp(sum(log_r))
        geo = math.exp(sum(log_r) / len(log_r)) if log_r else 1.0
        w_row, k_row = [], []
        for o, r, m in zip(o_row, r_row, m_row):
            rho = math.exp(o - r) if m else 1.0
            w, k = {"none": (1.0, True), "tis_token": (min(rho, cap), True), "tis_seq": (min(seq, cap), True),
                    "mis_token": (rho, rho <= cap), "mis_seq": (seq, seq <= cap),
                    "icepop": (rho, low <= rho <= high), "geo_rs": (1.0, low <= geo <= high)}[mode]
            k = bool(m) and k
            w_row.append(w if k else 0.0)
            k_row.append(k)
        weights.append(w_row)
        keep.append(k_row)
    return weights, keep


def random_batch(seed=0, B=7, C=10, spread=0.4):
    set_seed(seed)
    roll = -torch.rand(B, C) * 3
    old = roll + torch.randn(B, C) * spread
    mask = (torch.rand(B, C) > 0.3).float()
    mask[0] = 0  # a row without tokens
    return old, roll, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("knobs", [(2.0, 0.5, 2.0), (1.1, 0.9, 1.2), (1.5, 0.3, 3.0)])
def test_every_mode_equals_the_loop(mode, knobs):
    old, roll, mask = random_batch()
    old_pad, roll_pad = old.clone(), roll.clone()
    old_pad[mask == 0], roll_pad[mask == 0] = -math.inf, math.nan  # padding that must not leak
    weights, kept, metrics = rollout_correction(old_pad, roll_pad, mask, mode, *knobs)
    w_loop, k_loop = loop_correction(old.tolist(), roll.tolist(), mask.tolist(), mode, *knobs)
    torch.testing.assert_close(weights, torch.tensor(w_loop), rtol=1e-5, atol=1e-6)
    assert torch.equal(kept.bool(), torch.tensor(k_loop)) and kept.dtype == torch.float32
    kept_n, total = sum(map(sum, k_loop)), int(mask.sum())
    assert metrics["mismatch/masked_fraction"] == pytest.approx(1 - kept_n / total, abs=1e-6)
    assert metrics["mismatch/weight_mean"] == pytest.approx(sum(map(sum, w_loop)) / max(kept_n, 1), rel=1e-5)
    assert all(math.isfinite(v) for v in metrics.values())


def test_hand_worked_2x3():
    "The chapter's example: ratios [[1.5, 1, 0.4], [3, 0.8, (pad)]], cap 2, bounds [0.5, 2]."
    roll = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]])
    old = roll + torch.tensor([[1.5, 1.0, 0.4], [3.0, 0.8, 1.0]]).log()
    mask = torch.tensor([[1., 1, 1], [1, 1, 0]])
    m = mismatch_metrics(old, roll, mask)
    assert m["mismatch/kl"] == pytest.approx(1.335358 / 5, abs=1e-5)
    assert (m["mismatch/ratio_min"], m["mismatch/ratio_max"]) == pytest.approx((0.4, 3.0))
    assert m["mismatch/ratio_mean"] == pytest.approx(1.34)
    assert m["mismatch/logprob_abs_diff"] == pytest.approx(2.643512 / 5, abs=1e-5)
    expected = {"tis_token": [[1.5, 1, 0.4], [2, 0.8, 0]], "tis_seq": [[.6, .6, .6], [2, 2, 0]],
                "mis_token": [[1.5, 1, 0.4], [0, 0.8, 0]], "mis_seq": [[.6, .6, .6], [0, 0, 0]],
                "icepop": [[1.5, 1, 0], [0, 0.8, 0]], "geo_rs": [[1, 1, 1], [1, 1, 0]]}
    for mode, w in expected.items():
        torch.testing.assert_close(rollout_correction(old, roll, mask, mode)[0], torch.tensor(w, dtype=torch.float32))


def test_weights_carry_no_gradient_and_extreme_ratios_stay_finite():
    old, roll, mask = random_batch()
    old = old.requires_grad_()
    far = roll.clone()
    far[1, 0] -= 1000.0  # a ratio of e^1000: clamped to e^20 before exp
    for mode in MODES:
        w, kept, m = rollout_correction(old, far, mask, mode)
        assert not w.requires_grad and torch.isfinite(w).all() and all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize("call, message", [
    (lambda o, r, m: rollout_correction(o, r, m, "tis"), "unknown `mode`='tis'; the modes are"),
    (lambda o, r, m: rollout_correction(o, r, m, "tis_token", cap=0.0), "`cap`=0.0 must be > 0"),
    (lambda o, r, m: rollout_correction(o, r, m, "tis_token", cap=math.inf), "`cap` must be a finite number"),
    (lambda o, r, m: rollout_correction(o, r, m, "icepop", low=1.5, high=1.2), "`low`=1.5 must be < `high`=1.2"),
    (lambda o, r, m: rollout_correction(o, r[:, :3], m, "tis_token"), "`rollout_logprobs` has shape (7, 3)"),
    (lambda o, r, m: rollout_correction(o, r, m[:2], "tis_token"), "`mask` has shape (2, 10)"),
    (lambda o, r, m: rollout_correction(o[0], r, m, "tis_token"), "`old_logprobs` has shape (10,), expected (B, C)"),
    (lambda o, r, m: rollout_correction(o, r.tolist(), m), "`rollout_logprobs` must be a torch.Tensor"),
    (lambda o, r, m: mismatch_metrics(o, r * math.nan, m), "`rollout_logprobs` must be finite"),
])
def test_bad_input_is_named(call, message):
    old, roll, mask = random_batch()
    with pytest.raises((ValueError, TypeError)) as e: call(old, roll, mask)
    assert message in str(e.value)


def test_the_unknown_mode_error_lists_the_modes():
    with pytest.raises(ValueError) as e: rollout_correction(*random_batch(), mode="TIS")
    assert str(sorted(ROLLOUT_CORRECTIONS)) in str(e.value)


def test_every_registered_algorithm_declares_its_level():
    levels = {k: s.correction_level for k, s in ALGORITHMS.items()}
    assert {k for k, v in levels.items() if v is None} == {"dpo"}
    assert {k for k, v in levels.items() if v == "sequence"} == {"gspo", "gmpo", "luspo", "vespo"}


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
@pytest.mark.parametrize("mode", ["tis_token", "tis_seq", "mis_token", "icepop"])
def test_tis_by_advantage_scaling_is_the_weighted_grpo_loss(aggregation, mode):
    "w min(rA, clip(r)A) = min(r wA, clip(r) wA) for w >= 0: same loss and same gradient as the explicit weighting."
    old, roll, mask = random_batch(1)
    w, kept, _ = rollout_correction(old, roll, mask, mode, cap=1.3, low=0.8, high=1.25)
    set_seed(2)
    lp = (old + torch.randn_like(old) * 0.25).requires_grad_()  # the policy moved: some tokens clipped
    adv, ref = torch.randn(len(old)), old + torch.randn_like(old) * 0.2
    keep = mask * kept
    kw = dict(clip_eps=0.2, clip_eps_high=0.28, dual_clip=3.0, ref_logprobs=ref)
    explicit = grpo_loss(lp, old, adv, keep, aggregation=lambda l, m: aggregate_loss(l * w, m, aggregation), **kw)[0]
    scaled, metrics = grpo_loss(lp, old, adv[:, None] * w, keep, aggregation=aggregation, **kw)
    torch.testing.assert_close(scaled, explicit)
    g_explicit, = torch.autograd.grad(explicit, lp)
    g_scaled, = torch.autograd.grad(scaled, lp)
    torch.testing.assert_close(g_scaled, g_explicit)
    assert metrics["clip/ratio"] > 0  # the identity was tested where clipping is active
    # the KL term does not read the advantages: weighting leaves it as it was
    with_kl = dict(kw, beta=0.1)
    kl_scaled = grpo_loss(lp, old, adv[:, None] * w, keep, aggregation=aggregation, **with_kl)[1]["loss/kl"]
    kl_plain = grpo_loss(lp, old, adv, keep, aggregation=aggregation, **with_kl)[1]["loss/kl"]
    assert kl_scaled == kl_plain


def collated(seed=3):
    set_seed(seed)
    lengths = [9, 4, 7, 9, 2, 5, 8, 6]
    old = -torch.rand(len(lengths), 9) * 3
    rows = [Rollout("q", prompt_token_ids=[1], token_ids=list(range(3, 3 + n)), logprobs=o[:n].tolist(),
                    rewards=float(i % 3), group_index=i // 2) for i, (o, n) in enumerate(zip(old, lengths))]
    cb = collate(rows, pad_token_id=0)
    return cb, cb.old_logprobs - torch.randn(cb.loss_mask.shape) * 0.3  # the batch, the sampler's log-probs


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce", "gspo"])
@pytest.mark.parametrize("mode", ["tis_token", "tis_seq", "mis_seq", "icepop"])
def test_apply_rollout_correction_equals_explicit_weights(name, mode):
    "Through the registry: the corrected batch's gradient is that of the loss with per-token weights."
    cb, roll = collated()
    B, C = cb.loss_mask.shape
    cfg = {**create_algorithm_config(name), "max_new_tokens": C}
    base = compute_batch_advantages(cb, cfg)
    w, kept, _ = rollout_correction(base.old_logprobs, roll, base.loss_mask, mode, cap=1.3, low=0.8, high=1.25)
    corrected = apply_rollout_correction(base, w, kept, cfg)
    assert corrected.advantages.shape == ((B,) if name == "gspo" else (B, C))
    weighted = {**cfg, "aggregation": lambda l, m: aggregate_loss(l * w, m, cfg["aggregation"], C)}
    lp = (base.old_logprobs + torch.randn(B, C) * 0.1).requires_grad_()
    g1, = torch.autograd.grad(compute_loss_by_algorithm(corrected, lp, cfg)[0], lp)
    g2, = torch.autograd.grad(compute_loss_by_algorithm(base._replace(loss_mask=base.loss_mask * kept), lp,
                                                        weighted)[0], lp)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("name", ["dapo", "reinforce++", "grpo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("mode", ["tis_token", "mis_token", "mis_seq", "geo_rs"])
def test_micro_batches_give_the_full_batch_gradient(name, aggregation, mode):
    "Correct once, then split rows: the shares read the corrected mask, and the gradients add up to the full batch's."
    cb, roll = collated()
    B, C = cb.loss_mask.shape
    cfg = create_algorithm_config(name, beta=0.05)
    if "aggregation" in cfg: cfg["aggregation"] = aggregation
    agg = cfg.get("aggregation", "token_mean")  # DAPO and REINFORCE++ average tokens, whatever the test asks
    base = compute_batch_advantages(cb, cfg)._replace(ref_logprobs=cb.old_logprobs + 0.1 * torch.randn(B, C))  # KL too
    w, kept, _ = rollout_correction(base.old_logprobs, roll, base.loss_mask, mode, cap=1.3, low=0.85, high=1.2)
    corrected = apply_rollout_correction(base, w, kept, cfg)
    lp = (base.old_logprobs + torch.randn(B, C) * 0.1).requires_grad_()
    full, = torch.autograd.grad(compute_loss_by_algorithm(corrected, lp, cfg)[0], lp)
    total = torch.zeros_like(lp)
    for rows in torch.arange(B).split(3):
        part = corrected._replace(**{f: getattr(corrected, f)[rows] for f in
                                     ("input_ids", "attention_mask", "completion_ids", "completion_mask", "loss_mask",
                                      "rewards", "group_ids", "old_logprobs", "ref_logprobs", "advantages")})
        # the same rows corrected on their own give the same weights: every mode is row-local
        w_part, kept_part, _ = rollout_correction(base.old_logprobs[rows], roll[rows], base.loss_mask[rows], mode,
                                                  cap=1.3, low=0.85, high=1.2)
        torch.testing.assert_close(w_part, w[rows])
        share = (part.loss_mask.sum() / corrected.loss_mask.sum() if agg == "token_mean" else len(rows) / B)
        loss = compute_loss_by_algorithm(part, lp[rows], cfg)[0] * share
        g, = torch.autograd.grad(loss, lp)
        total += g
    torch.testing.assert_close(total, full)


def test_apply_refuses_what_it_cannot_do():
    cb, roll = collated()
    base = compute_batch_advantages(cb, create_algorithm_config("grpo"))
    w, kept, _ = rollout_correction(base.old_logprobs, roll, base.loss_mask, "tis_token")
    with pytest.raises(ValueError, match="'dpo' has no advantage to weight"):
        apply_rollout_correction(base, w, kept, create_algorithm_config("dpo"))
    with pytest.raises(ValueError, match="unknown algorithm 'my_loss'"):
        apply_rollout_correction(base, w, kept, "my_loss")
    with pytest.raises(ValueError, match="`batch.advantages` is None"):
        apply_rollout_correction(cb, w, kept, "grpo")
    with pytest.raises(ValueError, match="`weights` must be >= 0"):
        apply_rollout_correction(base, -w - 1, kept, "grpo")
    with pytest.raises(ValueError, match="`mask` has shape"):
        apply_rollout_correction(base, w, kept[:, :2], "grpo")
    with pytest.raises(TypeError, match="CollatedBatch"):
        apply_rollout_correction(list(cb), w, kept, "grpo")
    with pytest.raises(ValueError, match="one advantage per sequence"):
        apply_rollout_correction(base._replace(advantages=torch.ones_like(w)), w, kept, "gspo")


def test_masking_drops_the_token_from_the_kl_and_the_token_count():
    cb, roll = collated()
    cfg = create_algorithm_config("grpo", aggregation="token_mean")
    base = compute_batch_advantages(cb, cfg)._replace(ref_logprobs=cb.old_logprobs - 0.1)
    w, kept, m = rollout_correction(base.old_logprobs, roll, base.loss_mask, "icepop", low=0.8, high=1.25)
    assert 0 < m["mismatch/masked_fraction"] < 1
    corrected = apply_rollout_correction(base, w, kept, cfg)
    assert corrected.loss_mask.sum() == (base.loss_mask * kept).sum() < base.loss_mask.sum()
    # a token_mean over the kept tokens only: every kept token with advantage A and ratio 1 costs -A w / n_kept
    lp = base.old_logprobs.clone().requires_grad_()
    g, = torch.autograd.grad(compute_loss_by_algorithm(corrected, lp, cfg)[0], lp)
    expected = -corrected.advantages * corrected.loss_mask / corrected.loss_mask.sum()
    torch.testing.assert_close(g, expected)


def test_bf16_sampler_returns_its_own_logprobs_and_an_exact_control():
    model, tok = load_tiny_model(progress=False)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("12+34=", "5+77=")]
    for dtype, tol in (("float32", 1e-4), ("bfloat16", None)):
        set_seed(0)
        config = GenerationConfig(max_new_tokens=6, num_return_sequences=4, temperature=0.7)
        gens = batch_generate(model, tok, prompts, config, generator=create_hf_generator(dtype))
        rows = [Rollout("p", prompt_token_ids=g.metadata["prompt_token_ids"], token_ids=g.token_ids,
                        logprobs=g.logprobs) for g in gens]
        cb = collate(rows, tok.pad_token_id, tok.eos_token_id)
        with torch.no_grad():
            trainer = compute_logprobs_for_tokens(model, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1],
                                                  temperature=0.7)
        m = mismatch_metrics(trainer, cb.old_logprobs, cb.loss_mask)
        if tol: assert m["mismatch/logprob_abs_diff_max"] < tol  # float32: the sampler is the trainer
        else: assert 0 < m["mismatch/kl"] < 0.01  # bf16: a small, real gap
    assert next(model.parameters()).dtype == torch.float32  # the policy itself is untouched


def test_sampler_copy_merges_lora_and_refuses_bad_dtypes():
    model = apply_lora(load_tiny_model(progress=False)[0], r=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad: p.add_(torch.randn_like(p) * 0.05)
    merged = sampler_copy(model, torch.float32)
    ids = torch.tensor([[2, 97, 95, 81, 94, 10]])
    with torch.no_grad(): torch.testing.assert_close(merged(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    assert not rlnb.is_peft_model(merged) and not any(p.requires_grad for p in merged.parameters())
    assert next(sampler_copy(model).parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="not a floating-point torch dtype"): sampler_copy(model, "int8")
    with pytest.raises(ValueError, match="not a floating-point torch dtype"): create_hf_generator("bf17")


def test_public_names_from_the_top_level():
    for name in ("mismatch_metrics", "rollout_correction", "ROLLOUT_CORRECTIONS", "apply_rollout_correction",
                 "sampler_copy", "create_hf_generator"):
        assert hasattr(rlnb, name), name


@pytest.mark.slow
def test_train_measures_and_corrects_the_mismatch():
    "`generator='hf_bf16'` logs mismatch/* every step; a correction changes the update; its knobs are checked."
    from rlnb import create_training_config, train
    base = dict(num_iterations=2, prompts_per_step=4, group_size=4, eval_every=0, seed=1)
    rows = {}
    for corr in ("none", "tis_token"):
        log = []
        config = create_training_config(**base, generator="hf_bf16", rollout_correction=corr,
                                        rollout_correction_cap=1.001 if corr != "none" else 2.0)
        train(config, logger=lambda state, stats: log.append(stats.custom_metrics), progress=False)
        rows[corr] = log
        assert all(0 < r["mismatch/kl"] < 0.01 and r["mismatch/ratio_min"] < 1 < r["mismatch/ratio_max"] for r in log)
    assert rows["none"][0]["mismatch/weight_mean"] == 1.0 and rows["tis_token"][0]["mismatch/weight_mean"] < 1.0
    assert rows["none"][0]["loss/total"] != rows["tis_token"][0]["loss/total"]
    with pytest.raises(ValueError, match="is not 'auto' or a key of rlnb.ROLLOUT_CORRECTIONS"):
        train(create_training_config(**base, rollout_correction="tis"), progress=False)
    with pytest.raises(ValueError, match="rollout_correction_low"):
        create_training_config(rollout_correction_low=2.0, rollout_correction_high=1.0)
    with pytest.raises(ValueError, match="generator"):
        create_training_config(generator="vllm-typo")


def test_a_correction_needs_the_samplers_logprobs():
    "A custom generator that returns no log-probs cannot be corrected: the error says what to return."
    from rlnb import batch_generate, create_training_config, train

    def plain(model, tokenizer, prompts, config):
        return [g._replace(logprobs=None) for g in batch_generate(model, tokenizer, prompts, config)]
    config = create_training_config(num_iterations=1, prompts_per_step=2, group_size=2, eval_every=0,
                                    rollout_correction="icepop")
    with pytest.raises(ValueError, match="needs the sampler's log-probs"):
        train(config, generator=plain, progress=False)
    with pytest.raises(ValueError, match="both choose the sampler"):
        train(config._replace(generator="hf_bf16"), generator=plain, progress=False)


def bf16_sampled_step_setup():
    """A LoRA policy, its starting weights and a batch sampled by its bf16 copy (so the rollouts carry log-probs), with
    random rewards (the task's are all 0 here: no advantage, no gradient to compare)."""
    model, tok = load_tiny_model(progress=False)
    policy = apply_lora(model, r=4)
    set_seed(0)
    batch = create_batch_rollouts(policy, tok, rlnb.get_task("addition").sample(4, seed=2),
                                  GenerationConfig(max_new_tokens=6, num_return_sequences=4),
                                  generator=create_hf_generator("bfloat16"))
    rewards = torch.rand(len(batch.rollouts)).tolist()
    rollouts = [r._replace(rewards=x) for r, x in zip(batch.rollouts, rewards)]
    return policy, tok, {k: p.detach().clone() for k, p in policy.named_parameters()}, rollouts


def one_step(policy, tok, start, rollouts, algorithm="grpo", **config):
    "training_step from `start`'s weights: (policy calls, its metrics, the gradients the optimizer step received)."
    from rlnb import TrainingConfig, TrainingState, create_algorithm_config, create_optimizer, training_step
    from rlnb.step import default_optimizer_step
    with torch.no_grad():
        for k, p in policy.named_parameters(): p.copy_(start[k])
    opt, _ = create_optimizer(policy, learning_rate=1e-3)
    calls, grads = [], {}

    def step_fn(state, max_grad_norm):  # the gradients, read before the step clears them
        grads.update({k: p.grad.clone() for k, p in policy.named_parameters() if p.grad is not None})
        return default_optimizer_step(state, max_grad_norm)
    hook = policy.register_forward_pre_hook(lambda m, a, k: calls.append(1), with_kwargs=True)
    try:
        _, stats = training_step(TrainingState(0, 0, policy, opt, None), rollouts, create_algorithm_config(algorithm),
                                 optimizer_step_fn=step_fn, tokenizer=tok, config=TrainingConfig(**config))
    finally: hook.remove()
    return len(calls), stats.custom_metrics, grads


def test_a_measured_or_weighing_correction_costs_no_extra_scoring_pass():
    """With one update per batch, the trainer's log-probs come from the update's own forward pass: measuring the
    mismatch ('none') or weighing tokens (TIS) makes as many model calls as a batch without the sampler's log-probs,
    fewer than a correction that drops tokens (it must act before the micro-batches are cut), same mismatch figures."""
    policy, tok, start, rollouts = bf16_sampled_step_setup()
    plain = [r._replace(generation=r.generation._replace(logprobs=None)) for r in rollouts]
    out = {mode: one_step(policy, tok, start, plain if mode == "plain" else rollouts,
                          rollout_correction="none" if mode == "plain" else mode,
                          rollout_correction_cap=100.0)[:2]  # the cap never binds: the figures are comparable
           for mode in ("plain", "none", "tis_token", "tis_seq", "mis_token")}
    assert out["plain"][0] == out["none"][0] == out["tis_token"][0] == out["tis_seq"][0] < out["mis_token"][0]
    assert "mismatch/kl" not in out["plain"][1]
    for mode in ("tis_token", "tis_seq", "mis_token"):
        for key in ("mismatch/kl", "mismatch/ratio_min", "mismatch/ratio_max", "mismatch/logprob_abs_diff_max"):
            assert out["none"][1][key] == pytest.approx(out[mode][1][key], rel=1e-4, abs=1e-7), (mode, key)
    assert out["none"][1]["mismatch/kl"] > 0


@pytest.mark.parametrize("mode, algorithm, top", [("tis_token", "grpo", 1.0), ("tis_seq", "grpo", 1.0),
                                                  ("tis_token", "gspo", 1.0), ("tis_seq", "dr_grpo", 1.0),
                                                  ("tis_seq", "gspo", 1.0), ("tis_token", "gspo", 0.5)])
def test_a_correction_in_the_update_pass_equals_the_rescored_one(mode, algorithm, top):
    """TIS taken from each micro-batch's own pass gives the gradients and figures of the same correction applied
    after a rescoring pass (a copy of the mode under another name takes that route), with the cap binding. With the
    high-entropy mask (top < 1) both take the rescoring route: GSPO's row weight must span all of the row's tokens."""
    policy, tok, start, rollouts = bf16_sampled_step_setup()
    ROLLOUT_CORRECTIONS["rescored_copy"] = lambda *args: ROLLOUT_CORRECTIONS[mode](*args)
    try:
        runs = [one_step(policy, tok, start, rollouts, algorithm, rollout_correction=name, micro_batch_size=5,
                         rollout_correction_cap=1.002, entropy_top_fraction=top)
                for name in (mode, "rescored_copy", "none")]
    finally: del ROLLOUT_CORRECTIONS["rescored_copy"]
    (calls, metrics, grads), (calls_rescored, metrics_rescored, grads_rescored), (_, _, grads_plain) = runs
    assert (calls < calls_rescored) == (top == 1.0)
    assert 0 < metrics["mismatch/weight_mean"] < 1  # the cap binds on some tokens
    for key in ("mismatch/kl", "mismatch/weight_mean", "loss/total", "grad_norm"):
        assert metrics[key] == pytest.approx(metrics_rescored[key], rel=1e-4, abs=1e-7), key
    assert grads and grads.keys() == grads_rescored.keys()
    for k in grads: torch.testing.assert_close(grads[k], grads_rescored[k], rtol=1e-4, atol=1e-7)
    flat = lambda g: torch.cat([g[k].flatten() for k in sorted(g)])  # LoRA's A matrices get 0 at the start (B = 0)
    changed = float((flat(grads) - flat(grads_plain)).norm() / flat(grads_plain).norm())
    assert changed > 1e-3, changed  # the correction did change the update
