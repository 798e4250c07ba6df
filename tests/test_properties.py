"""Properties of the advantage and loss functions over random shapes, masks and group layouts (hypothesis):
finite in -> finite out; a group whose rewards are all equal gets advantage exactly 0; masked tokens get exactly zero
gradient."""
import math

import torch
from hypothesis import given, settings, strategies as st

from rlnb.algorithms import AGGREGATIONS, compute_grpo_advantages, compute_policy_gradient_loss, grpo_loss

torch.set_num_threads(1)
FAST = settings(max_examples=50, deadline=None)
reward = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def grouped_rewards(draw, min_size=1):
    "(rewards list, group_ids list): 1-6 groups of `min_size`-8 rollouts, labels shuffled into any order."
    sizes = draw(st.lists(st.integers(min_size, 8), min_size=1, max_size=6))
    labels = draw(st.lists(st.integers(-5, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    ids = [label for label, n in zip(labels, sizes) for _ in range(n)]
    rewards = draw(st.lists(reward, min_size=len(ids), max_size=len(ids)))
    order = draw(st.permutations(range(len(ids))))
    return [rewards[i] for i in order], [ids[i] for i in order]


@FAST
@given(grouped_rewards(), st.sampled_from(["group", "batch", "none"]), st.sampled_from([0.0, 1e-6, 1e-4]))
def test_advantages_finite(data, scale, eps):
    rewards, ids = data
    a = compute_grpo_advantages(rewards, ids, scale=scale, eps=eps)
    assert a.shape == (len(rewards),) and torch.isfinite(a).all()


@FAST
@given(grouped_rewards(min_size=2), reward, st.integers(2, 32), st.sampled_from(["group", "batch", "none"]),
       st.sampled_from([0.0, 1e-6, 1e-4]))
def test_constant_group_gets_exactly_zero(data, value, n, scale, eps):
    "A group whose rewards are all equal: advantage exactly 0, whatever the other groups hold."
    rewards, ids = data
    rewards, ids = rewards + [value] * n, ids + [-100] * n  # label -100 is not drawn by grouped_rewards
    a = compute_grpo_advantages(torch.tensor(rewards, dtype=torch.float32), ids, scale=scale, eps=eps)
    assert (a[-n:] == 0).all(), a[-n:]


def test_float32_rounding_of_the_mean_gives_no_advantage():
    "The issue's example: 2.1 sixteen times in float32 (its float mean is not exactly 2.1)."
    for eps in (1e-4, 1e-6, 0.0):
        a = compute_grpo_advantages(torch.full((16,), 2.1), group_size=16, eps=eps)
        assert (a == 0).all(), (eps, a.abs().max())
        a = compute_grpo_advantages(torch.tensor([2.1] * 16 + [0.0, 1.0] * 8), group_size=16, eps=eps)
        assert (a[:16] == 0).all() and torch.isfinite(a).all()


@st.composite
def token_batch(draw):
    """Random (logprobs with grad, old_logprobs, ref_logprobs, advantages (B,) or (B, C), loss_mask) with garbage off
    the mask."""
    B, C, seed = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, C, generator=g) < draw(st.floats(0.0, 1.0))).float()  # (B, C), rows may be all zero
    base = -torch.rand(B, C, generator=g) * 10  # (B, C) log-probs in (-10, 0]
    garbage = draw(st.sampled_from([float("nan"), -float("inf"), 0.0, 123.0]))
    pad = lambda x: torch.where(mask > 0, x, torch.full_like(x, garbage))  # masked positions hold garbage
    logprobs = pad(base).requires_grad_(True)
    old = pad(base + 0.5 * torch.randn(B, C, generator=g))
    ref = pad(base + 0.5 * torch.randn(B, C, generator=g))
    per_token = draw(st.booleans())
    adv = torch.randn((B, C) if per_token else (B,), generator=g) * draw(st.sampled_from([0.0, 1.0, 100.0]))
    return logprobs, old, ref, adv, mask


@FAST
@given(token_batch(), st.sampled_from(AGGREGATIONS), st.sampled_from([0.0, 0.04]), st.sampled_from([None, 0.28]))
def test_grpo_loss_finite_and_masked_tokens_get_no_gradient(batch, aggregation, beta, clip_eps_high):
    logprobs, old, ref, adv, mask = batch
    loss, metrics = grpo_loss(logprobs, old, adv, mask, ref_logprobs=ref, beta=beta, clip_eps_high=clip_eps_high,
                              aggregation=aggregation)
    assert loss.ndim == 0 and math.isfinite(loss.item())
    assert all(math.isfinite(v) for v in metrics.values())
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert torch.isfinite(grad).all()
    assert (grad[mask == 0] == 0).all()  # exactly zero, not merely small


@FAST
@given(token_batch(), st.sampled_from(AGGREGATIONS))
def test_policy_gradient_loss_finite_and_masked_tokens_get_no_gradient(batch, aggregation):
    logprobs, _, _, adv, mask = batch
    loss, metrics = compute_policy_gradient_loss(logprobs, adv, mask, aggregation=aggregation)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()


@FAST
@given(grouped_rewards(min_size=2), st.integers(1, 8), st.integers(0, 2**31 - 1), st.sampled_from(AGGREGATIONS))
def test_advantages_into_loss_end_to_end(data, C, seed, aggregation):
    "Advantages of random groups feed grpo_loss: finite, and a constant group's sequences get zero gradient."
    rewards, ids = data
    B = len(rewards)
    g = torch.Generator().manual_seed(seed)
    adv = compute_grpo_advantages(rewards, ids)
    logprobs = (-torch.rand(B, C, generator=g) * 5).requires_grad_(True)
    mask = torch.ones(B, C)
    loss, _ = grpo_loss(logprobs, logprobs.detach(), adv, mask, aggregation=aggregation)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert (grad[adv == 0] == 0).all()
