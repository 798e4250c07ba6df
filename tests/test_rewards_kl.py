"rlnb.rewards, rlnb.reward_transforms and rlnb.kl as a programmer uses them: composed, and failing loudly on bad input."
import copy, math

import pytest
import torch

import rlnb.kl as kl
import rlnb.reward_transforms as rt
import rlnb.rewards as rw
from rlnb.core import Generation, Rollout, collate
from rlnb.logprobs import naive_logprobs
from rlnb.models import apply_lora


# ---------------------------------------------------------------- rewards

def _rollouts(texts, answer="46"):
    return [Rollout("12+34=", Generation(t), answer=answer, group_index=i // 2) for i, t in enumerate(texts)]


def test_bad_reward_names_function_and_rollout():
    def flaky_reward(rollout): return float("nan") if rollout.generation.text == "x" else 1.0
    with pytest.raises(ValueError, match=r"`flaky_reward` returned nan for rollout 2"):
        rw.compute_batch_rewards(_rollouts(["46", "45", "x"]), flaky_reward)

    def vector_reward(rollout): return [1.0] * len(rollout.generation.text)
    with pytest.raises(ValueError, match=r"`vector_reward` returned 1 components for rollout 1"):
        rw.compute_batch_rewards(_rollouts(["46", "4"]), vector_reward, is_vector=True)

    def string_reward(rollout): return "1"
    with pytest.raises(ValueError, match=r"`string_reward` returned a str for rollout 0"):
        rw.compute_batch_rewards(_rollouts(["46"]), string_reward)


def test_batch_rewards_aggregate_and_normalise():
    rs = _rollouts(["46", "45", "46", "46"])
    R = rw.compute_batch_rewards(rs, [rw.exact_match_reward, rw.format_reward(r"^\d+$")], is_vector=True)
    assert R.shape == (4, 2) and R[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
    scalar = rt.aggregate_vector_rewards(R, weights=[1.0, 0.5])
    assert torch.allclose(scalar, torch.tensor([1.5, 0.5, 1.5, 1.5]))
    z = rt.normalize_rewards(scalar, group_ids=torch.tensor([r.group_index for r in rs]))
    # std with n - 1, as torch.std: (1.5 - 1) / sqrt(0.5); the constant second group gives 0, not NaN
    assert torch.allclose(z, torch.tensor([0.5, -0.5, 0.0, 0.0]) / 0.5**0.5)
    for method in ("zscore", "minmax", "rank"):
        assert torch.isfinite(rt.normalize_rewards(torch.full((3, 2), 7.0), method)).all()


def test_zscore_is_grpos_group_statistic():
    "One group z-score in rlnb: zscore_normalizer and GRPO's advantages agree (up to GRPO's eps on the std)."
    from rlnb.algorithms import compute_grpo_advantages
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0.5, 3, -1])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4])  # a mixed group, a constant one, groups of one
    z = rt.zscore_normalizer(r, g)
    assert torch.allclose(z, compute_grpo_advantages(r, g), atol=1e-3)
    assert torch.allclose(z[8:12], (r[8:12] - r[8:12].mean()) / r[8:12].std())  # torch.std's statistic
    assert z[4:8].eq(0).all() and z[12:].eq(0).all()  # no spread: 0, not NaN
    tied = rt.pareto_reward(torch.ones(4, 2))  # one front: every rollout 1.0, so no signal for GRPO either
    assert compute_grpo_advantages(tied, [0] * 4).eq(0).all()


# ---------------------------------------------------------------- KL estimators

def test_estimators_hand_computed_and_batch_mean():
    lp, ref = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-1.5, -0.2]])  # log r = -0.5, 0.3
    assert torch.allclose(kl.kl_estimator("k1")(lp, ref), torch.tensor([[0.5, -0.3]]))
    k3 = torch.tensor([[math.exp(-0.5) + 0.5 - 1, math.exp(0.3) - 0.3 - 1]])
    assert torch.allclose(kl.KL_ESTIMATORS["k3"](lp, ref), k3)
    assert torch.allclose(kl.compute_batch_kl(lp, ref, torch.tensor([[1.0, 0.0]])), k3[0, 0])
    with pytest.raises(ValueError, match="unknown estimator"): kl.kl_estimator("k9")


# ---------------------------------------------------------------- reference models

def _tiny_qwen2(seed=0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    return transformers.Qwen2ForCausalLM(cfg)


def _batch():
    return collate([Rollout("a", prompt_token_ids=[1, 5, 6], token_ids=[10, 11, 2]),
                    Rollout("b", prompt_token_ids=[1], token_ids=[20, 2])], pad_token_id=0, eos_token_id=2)


def test_lora_reference_is_adapter_disabled_and_copies_nothing():
    peft = pytest.importorskip("peft")
    base = _tiny_qwen2()
    base_copy = copy.deepcopy(base)
    policy = apply_lora(base, r=4, target_modules=["q_proj", "v_proj"])  # peft, without its deprecation warning
    n_tensors, ptrs = len(list(policy.parameters())), {p.data_ptr() for p in policy.parameters()}
    ref = kl.create_reference_model(policy)
    assert isinstance(ref, kl.AdapterDisabledRef) and ref.model is policy
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name: p.normal_(0, 0.5)
    cb = _batch(); C = cb.completion_ids.shape[1]
    ref_lp = kl.get_reference_logprobs(ref, cb.input_ids, cb.attention_mask, C, logprob_extractor=naive_logprobs)
    with torch.no_grad():
        base_lp = naive_logprobs(base_copy, cb.input_ids, cb.attention_mask, C)
        policy_lp = naive_logprobs(policy, cb.input_ids, cb.attention_mask, C)
    assert torch.allclose(ref_lp, base_lp, atol=1e-5)
    # rlnb.logprobs' scorer
    default_lp = kl.get_reference_logprobs(ref, cb.input_ids, cb.attention_mask, C, micro_batch_size=1)
    assert torch.allclose(default_lp * cb.completion_mask, base_lp, atol=1e-5)  # the reference gives 0 on padding
    assert (policy_lp - base_lp).abs().max() > 1e-2  # adapters are back on after the reference pass
    assert len(list(policy.parameters())) == n_tensors and {p.data_ptr() for p in policy.parameters()} == ptrs
    with pytest.raises(ValueError, match="AdapterDisabledRef"):
        kl.update_reference_model(ref, policy, kl.create_ema_updater(0.9), step=1)


def test_frozen_copy_gets_no_gradient_and_ema_math():
    policy = _tiny_qwen2(seed=1)
    ref = kl.create_reference_model(policy)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    ids = torch.randint(3, 64, (2, 5))
    (policy(ids).logits.sum() + ref(ids).logits.sum()).backward()
    assert all(p.grad is None for p in ref.parameters())
    with torch.no_grad():
        policy.lm_head.weight.fill_(2.0); ref.lm_head.weight.zero_()
    ema = kl.create_ema_updater(decay=0.9)
    for step in (1, 2):
        ref = kl.update_reference_model(ref, policy, ema, step=step)
    assert torch.allclose(ref.lm_head.weight, torch.full_like(ref.lm_head.weight, 0.38))  # 0 -> 0.2 -> 0.38
    periodic = kl.create_periodic_updater(update_every=3)
    kl.update_reference_model(ref, policy, periodic, step=2)
    assert not torch.equal(ref.lm_head.weight, policy.lm_head.weight)
    kl.update_reference_model(ref, policy, periodic, step=3)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), policy.parameters()))


def test_abs_and_k3_plus_estimators():
    "abs: |log p - log q|, biased above; k3+: k3's value with k2's gradient (the reverse KL's, in expectation)."
    from rlnb.kl import KL_ESTIMATORS, kl_abs, kl_k2, kl_k3, kl_k3_plus
    lp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.2, -2.0]])
    assert KL_ESTIMATORS["abs"] is kl_abs and KL_ESTIMATORS["k3+"] is kl_k3_plus
    torch.testing.assert_close(kl_abs(lp, ref), torch.tensor([[0.5, 0.3, 0.0]]))
    torch.testing.assert_close(kl_k3_plus(lp, ref), kl_k3(lp, ref))
    g_plus = torch.autograd.grad(kl_k3_plus(lp, ref).sum(), lp)[0]
    g_k2 = torch.autograd.grad(kl_k2(lp, ref).sum(), lp)[0]
    torch.testing.assert_close(g_plus, g_k2)
    z = torch.randn(6, requires_grad=True)  # exact expectation over a 6-token vocabulary
    lq = torch.log_softmax(torch.randn(6), 0)
    lp6 = torch.log_softmax(z, 0)
    expected = torch.autograd.grad((lp6.exp().detach() * kl_k3_plus(lp6[None], lq[None])[0]).sum(), z)[0]
    lp6 = torch.log_softmax(z, 0)
    reverse = torch.autograd.grad((lp6.exp() * (lp6 - lq)).sum(), z)[0]
    torch.testing.assert_close(expected, reverse, atol=1e-6, rtol=1e-5)
