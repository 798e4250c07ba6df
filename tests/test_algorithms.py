"Tests for rlnb.algorithms: hand-computed losses, group handling, the registry and error messages."
import math

import pytest
import torch

from rlnb.algorithms import (ALGORITHMS, AGGREGATIONS, AlgorithmSpec, aggregate_loss, compute_advantages,
                             compute_grpo_advantages, compute_grpo_loss, compute_loss_by_algorithm,
                             compute_policy_gradient_loss, create_algorithm_config, create_grpo_config,
                             get_algorithm_config, grpo_loss)
from rlnb.core import Rollout, collate

torch.set_num_threads(1)


@pytest.fixture
def hand():
    "The 2x3 example: ratios [[1.5, 1, .5], [.7, 1.1, (1.3 masked)]], advantages (+1, -2), clip 0.2."
    old = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.8]])
    lp = old + torch.tensor([[1.5, 1.0, 0.5], [0.7, 1.1, 1.3]]).log()
    ref = lp + torch.tensor([[0.0, math.log(2), 0.0], [-math.log(2), 0.0, 5.0]])
    return dict(logprobs=lp, old_logprobs=old, advantages=torch.tensor([1.0, -2.0]),
                loss_mask=torch.tensor([[1.0, 1, 1], [1, 1, 0]]), ref_logprobs=ref)


# per-token losses by hand: [[-1.2, -1.0, -0.5], [1.6, 2.2, masked]]; row sums -2.7 and 3.8
@pytest.mark.parametrize("aggregation,kw,expected", [
    ("token_mean", {}, (-2.7 + 3.8) / 5),
    ("sequence_mean", {}, (-2.7 / 3 + 3.8 / 2) / 2),
    ("constant", {}, 1.1 / (2 * 3)),
    ("constant", {"max_completion_length": 5}, 1.1 / (2 * 5)),
])
def test_grpo_loss_aggregations_by_hand(hand, aggregation, kw, expected):
    loss, m = grpo_loss(**hand, aggregation=aggregation, **kw)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["loss/policy"] == pytest.approx(expected, abs=1e-6)
    assert m["clip/ratio"] == pytest.approx(0.4) and m["clip/low_ratio"] == pytest.approx(0.2)
    assert m["clip/high_ratio"] == pytest.approx(0.2) and m["ratio/mean"] == pytest.approx(0.96)
    assert "kl/mean" in m and "loss/kl" not in m  # ref given, beta = 0
    assert all(isinstance(v, float) for v in m.values())


def test_clip_higher_and_kl_by_hand(hand):
    loss, m = grpo_loss(**hand, clip_eps_high=0.6)
    assert loss.item() == pytest.approx(0.16, abs=1e-6) and m["clip/high_ratio"] == 0.0
    loss, m = grpo_loss(**hand, beta=0.1)  # k3 = 0.3069 + 0.1931 = 0.5 over 5 tokens
    assert (loss.item(), m["kl/mean"], m["loss/kl"]) == pytest.approx((0.23, 0.1, 0.01), abs=1e-6)


@pytest.mark.slow
def test_on_policy_gradient_is_policy_gradient(hand):
    lp = hand["logprobs"].clone().requires_grad_()
    A, mask = hand["advantages"], hand["loss_mask"]
    weights = {"token_mean": mask / 5, "sequence_mean": mask / (2 * mask.sum(1, keepdim=True)), "constant": mask / 6,
               "sequence_mean_token_sum": mask / 2}
    for agg in AGGREGATIONS:
        lp.grad = None
        loss, m = grpo_loss(lp, lp.detach(), A, mask, aggregation=agg)
        assert m["ratio/mean"] == 1.0 and m["clip/ratio"] == 0.0
        loss.backward()
        torch.testing.assert_close(lp.grad, -A[:, None] * weights[agg])


def test_gradient_only_through_logprobs_and_padding_is_safe(hand):
    h = {k: v.clone() for k, v in hand.items()}
    h["logprobs"][1, 2] = -math.inf; h["old_logprobs"][1, 2] = -math.inf; h["ref_logprobs"][1, 2] = math.nan
    for k in ("logprobs", "old_logprobs", "ref_logprobs", "advantages"): h[k].requires_grad_()
    loss, m = grpo_loss(**h, beta=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(0.23, abs=1e-6)
    assert torch.isfinite(h["logprobs"].grad).all() and all(math.isfinite(v) for v in m.values())
    assert all(h[k].grad is None for k in ("old_logprobs", "ref_logprobs", "advantages"))


def test_per_token_advantages_equal_broadcast(hand):
    per_token = hand["advantages"][:, None].expand(2, 3).clone()
    for agg in AGGREGATIONS:
        a = grpo_loss(**hand, aggregation=agg)[0]
        b = grpo_loss(**{**hand, "advantages": per_token}, aggregation=agg)[0]
        torch.testing.assert_close(a, b)


def test_aggregate_loss_callable_and_weights():
    mask = torch.zeros(2, 8); mask[0, :2] = 1; mask[1] = 1
    l = torch.zeros(2, 8, requires_grad=True)
    aggregate_loss(l, mask, "sequence_mean").backward()
    assert l.grad[0, 0].item() == pytest.approx(1 / 4) and l.grad[1, 0].item() == pytest.approx(1 / 16)
    assert aggregate_loss(torch.ones(2, 8), mask, lambda x, m: (x * m).max()).item() == 1.0


def test_advantages_by_hand():
    r = torch.tensor([1.0, 2, 3, 10])
    torch.testing.assert_close(compute_grpo_advantages(r, group_size=2, scale="none"),
                               torch.tensor([-0.5, 0.5, -3.5, 3.5]))
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(compute_grpo_advantages(r, group_size=2), torch.tensor([-s, s, -s, s]),
                               atol=1e-3, rtol=0)
    bstd = torch.tensor([1.0, 2, 3, 10]).std().item()
    torch.testing.assert_close(compute_grpo_advantages(r, group_size=2, scale="batch"),
                               torch.tensor([-0.5, 0.5, -3.5, 3.5]) / (bstd + 1e-4))


def test_advantages_arbitrary_group_order_equals_contiguous():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(24, generator=g)
    contiguous = compute_grpo_advantages(r, group_size=6)
    perm = torch.randperm(24, generator=g)
    labels = torch.tensor([10, -1, 7, 3])[torch.arange(24) // 6]  # arbitrary, non-contiguous labels
    for scale in ("group", "batch", "none"):
        torch.testing.assert_close(compute_grpo_advantages(r[perm], group_ids=labels[perm], scale=scale),
                                   compute_grpo_advantages(r, group_size=6, scale=scale)[perm])
    torch.testing.assert_close(compute_grpo_advantages(r[perm], labels[perm]), contiguous[perm])


def test_singleton_groups_and_batches():
    a = compute_grpo_advantages(torch.tensor([1.0, 0, 5]), group_ids=[0, 0, 1])
    assert a[2].item() == 0.0 and torch.isfinite(a).all()
    r = [Rollout("p", rewards=x, group_index=gi) for x, gi in [(1.0, 0), (0.0, 0), (2.0, None), (4.0, None)]]
    torch.testing.assert_close(compute_advantages(r, scale="none"), torch.tensor([0.5, -0.5, -1.0, 1.0]))


def test_error_messages(hand):
    with pytest.raises(ValueError, match=r"B=5 is not divisible by `group_size`=2"):
        compute_grpo_advantages(torch.ones(5), group_size=2)
    with pytest.raises(ValueError, match=r"`group_size`=1"):
        compute_grpo_advantages(torch.ones(4), group_size=1)
    with pytest.raises(ValueError, match=r"`rewards` has shape \(4, 2\), expected \(B,\)"):
        compute_grpo_advantages(torch.ones(4, 2))
    with pytest.raises(ValueError, match="NaN"):
        compute_grpo_advantages(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError,
                       match=r"grpo_loss: `loss_mask` has shape \(2, 2\), expected \(2, 3\) like `logprobs`"):
        grpo_loss(**{**hand, "loss_mask": hand["loss_mask"][:, :2]})
    with pytest.raises(ValueError,
                       match=r"`advantages` has shape \(3,\), expected \(2,\) per sequence or \(2, 3\) per token"):
        grpo_loss(**{**hand, "advantages": torch.ones(3)})
    with pytest.raises(ValueError, match="needs `ref_logprobs`"):
        grpo_loss(**{**hand, "ref_logprobs": None}, beta=0.1)
    with pytest.raises(ValueError, match="`aggregation`='mean'"):
        grpo_loss(**hand, aggregation="mean")
    with pytest.raises(TypeError, match="`logprobs` must be a torch.Tensor"):
        grpo_loss(**{**hand, "logprobs": [[0.0] * 3] * 2})
    with pytest.raises(ValueError, match=r"known: \[.*'dr_grpo', .*'grpo'"):
        create_algorithm_config("ppo_typo")
    with pytest.raises(ValueError, match=r"no option\(s\) \['clip_epsilon'\]"):
        create_grpo_config(clip_epsilon=0.1)


def _batch(hand):
    lp, old, ref = hand["logprobs"], hand["old_logprobs"], hand["ref_logprobs"]
    rs = [Rollout("q", prompt_token_ids=[1], token_ids=[5, 6, 2], logprobs=old[0].tolist(),
                  ref_logprobs=ref[0].tolist(), rewards=1.0, group_index=4),
          Rollout("q", prompt_token_ids=[1, 3], token_ids=[7, 2], logprobs=old[1, :2].tolist(),
                  ref_logprobs=ref[1, :2].tolist(), rewards=0.0, group_index=4)]
    return collate(rs, pad_token_id=0, eos_token_id=2)


def test_compute_grpo_loss_on_collated_batch(hand):
    cb = _batch(hand)
    loss, _ = compute_grpo_loss(cb, hand["advantages"], kl_coef=0.1, logprobs=hand["logprobs"])
    assert loss.item() == pytest.approx(0.23, abs=1e-5)
    _, m = compute_grpo_loss(cb._replace(old_logprobs=None), hand["advantages"], logprobs=hand["logprobs"])
    assert m["ratio/mean"] == 1.0
    with pytest.raises(TypeError, match="CollatedBatch"):
        compute_grpo_loss([1, 2], hand["advantages"], logprobs=hand["logprobs"])


def test_registry_dispatch_and_extension(hand):
    cb = _batch(hand)
    lp = hand["logprobs"]
    loss, m = compute_loss_by_algorithm(cb, lp, create_grpo_config(aggregation="token_mean"))
    adv = compute_grpo_advantages(cb.rewards, cb.group_ids)
    torch.testing.assert_close(loss, grpo_loss(lp, cb.old_logprobs, adv, cb.loss_mask)[0])
    assert create_algorithm_config("dr_grpo")["aggregation"] == "constant"

    def pg(logprobs, old_logprobs, advantages, loss_mask, ref_logprobs=None, aggregation="token_mean"):
        return compute_policy_gradient_loss(logprobs, advantages, loss_mask, aggregation=aggregation)
    ALGORITHMS["test_reinforce"] = AlgorithmSpec(lambda rewards, group_ids, baseline=0.0: rewards - baseline, pg,
                                                 {"baseline": 0.0, "aggregation": "token_mean"})
    try:
        cfg = create_algorithm_config("test_reinforce", {"baseline": 0.5})
        assert cfg == {"name": "test_reinforce", "baseline": 0.5, "aggregation": "token_mean"}
        loss, _ = compute_loss_by_algorithm(cb, lp, cfg)
        torch.testing.assert_close(loss, compute_policy_gradient_loss(lp, cb.rewards - 0.5, cb.loss_mask)[0])
        with pytest.raises(ValueError, match=r"\['typo'\]"):
            compute_loss_by_algorithm(cb, lp, {**cfg, "typo": 1})
    finally:
        del ALGORITHMS["test_reinforce"]
    assert "test_reinforce" not in ALGORITHMS


def test_configs_are_fresh_and_schedules():
    a = create_grpo_config(); a["clip_eps"] = 9.0
    assert create_grpo_config()["clip_eps"] == 0.2
    sched = [(0, "grpo"), (10, create_algorithm_config("dr_grpo"))]
    assert get_algorithm_config(9, sched)["name"] == "grpo" and get_algorithm_config(10, sched)["name"] == "dr_grpo"
    assert get_algorithm_config(3, switch_strategy=lambda it: "dr_grpo")["scale"] == "none"
    with pytest.raises(ValueError, match="not both"):
        get_algorithm_config(0, sched, lambda it: "grpo")


@pytest.mark.slow
def test_training_toy_learns():
    "GRPO through the registry raises the reward of a 1-position, 4-token bandit policy."
    torch.manual_seed(0)
    logits = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=1.0)
    cfg = create_grpo_config()
    for _ in range(30):
        with torch.no_grad(): toks = torch.multinomial(logits.softmax(-1), 32, replacement=True)  # (32,)
        rs = [Rollout("p", prompt_token_ids=[0], token_ids=[t], rewards=float(t == 3), group_index=i // 8)
              for i, t in enumerate(toks.tolist())]
        cb = collate(rs, pad_token_id=0)
        lp = logits.log_softmax(-1)[cb.completion_ids]  # (B, 1)
        loss, _ = compute_loss_by_algorithm(cb, lp, cfg)
        opt.zero_grad(); loss.backward(); opt.step()
    assert logits.softmax(-1)[3].item() > 0.9


def test_toy_run_learns_and_gives_a_value_head_to_ppo():
    "The toy problem of the algorithm chapters: a (T, V) logits table learns to emit token 3; PPO gets a value table."
    import rlnb.ppo  # noqa: F401  registers "ppo"
    from rlnb.algorithms import toy_run
    grpo = toy_run(create_grpo_config(), steps=12)
    assert grpo.reward.iloc[:2].mean() < 0.4 and grpo.reward.iloc[-3:].mean() > 0.8
    ppo = toy_run(create_algorithm_config("ppo"), steps=3, updates_per_batch=1)
    assert "value/mean" in ppo and len(ppo) == 3
    dr = toy_run(create_algorithm_config("dr_grpo"), steps=1)  # the budget: max_new_tokens = T
    assert "loss/policy" in dr
