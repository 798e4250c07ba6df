"""Checks of rlnb.dpo: pairs and the DPO loss against hand numbers, a naive loop and TRL's formula, gradients, the
registry entry, and a short run that learns."""
import math

import pytest
import torch
import torch.nn.functional as F

import rlnb.dpo  # registers "dpo" in ALGORITHMS
from rlnb.algorithms import ALGORITHMS, _DATA_ARGS, compute_loss_by_algorithm, create_algorithm_config
from rlnb.core import CollatedBatch, Rollout, collate, set_seed
from rlnb.dpo import PAIR_SELECTORS, compute_dpo_advantages, compute_dpo_loss, compute_dpo_pairs, dpo_loss
from learnable import first_and_last, learnable_run

torch.set_num_threads(1)


# ---- pairs ----
def naive_pairs(rewards, group_ids, selector="best_vs_worst", min_margin=0.0):
    groups = {}
    for i, g in enumerate(group_ids):
        if g >= 0: groups.setdefault(g, []).append(i)
    pairs = []
    for g in sorted(groups):
        rows = groups[g]
        if selector == "best_vs_worst":
            best, worst = max(rows, key=lambda i: (rewards[i], -i)), min(rows, key=lambda i: (rewards[i], i))
            if rewards[best] - rewards[worst] > min_margin: pairs.append([best, worst])
        else: pairs += [[i, j] for i in rows for j in rows if rewards[i] - rewards[j] > min_margin]
    return pairs if selector == "best_vs_worst" else sorted(pairs)


def test_pairs_by_hand():
    r, g = torch.tensor([1., 0, .5, 1, 2, 2, 2, 2, 0, 3, 1, 3]), torch.arange(12) // 4
    # first of tied bests / worsts; the all-2 group has no pair
    assert compute_dpo_pairs(r, g).tolist() == [[0, 1], [9, 8]]
    assert compute_dpo_pairs(r, g, "all_pairs").tolist() == [[0, 1], [0, 2], [2, 1], [3, 1], [3, 2],
                                                             [9, 8], [9, 10], [10, 8], [11, 8], [11, 10]]
    assert compute_dpo_pairs(r, g, "all_pairs", min_margin=0.5).tolist()[:2] == [[0, 1], [3, 1]]
    assert compute_dpo_pairs(r, g, min_margin=2.0).tolist() == [[9, 8]]  # group 0's margin 1 is not more than 2
    assert compute_dpo_pairs(r, g, min_margin=3.0).tolist() == []  # nor group 2's 3 more than 3
    assert compute_dpo_pairs([1., 0, 1, 0], [-1, -1, 0, 0]).tolist() == [[2, 3]]  # ungrouped rows are never paired
    assert compute_dpo_advantages(r, g).tolist() == [1, -1, 0, 0, 0, 0, 0, 0, -1, 1, 0, 0]
    assert set(PAIR_SELECTORS) == {"best_vs_worst", "all_pairs"}


def test_pairs_against_a_loop():
    set_seed(0)
    for _ in range(100):
        B = int(torch.randint(1, 24, ()))
        r, g = torch.randint(0, 4, (B,)).float() / 2, torch.randint(-1, 5, (B,))
        for sel in ("best_vs_worst", "all_pairs"):
            for mm in (0.0, 0.5):
                assert compute_dpo_pairs(r, g, sel, mm).tolist() == naive_pairs(r.tolist(), g.tolist(), sel, mm)


def test_pairs_from_rollouts_batches_and_custom_selectors():
    ros = [Rollout("p", prompt_token_ids=[0], token_ids=[1], rewards=x, group_index=i // 2)
           for i, x in enumerate([0., 1, 1, 1])]
    assert compute_dpo_pairs(ros).tolist() == [[1, 0]]
    assert compute_dpo_pairs(collate(ros, 0)).tolist() == [[1, 0]]
    assert compute_dpo_pairs(torch.tensor([0., 1, 2, 3]), pair_selector=lambda r, g, m: [[3, 0]]).tolist() == [[3, 0]]
    with pytest.raises(ValueError, match="itself"):
        compute_dpo_pairs(torch.tensor([0., 1]), pair_selector=lambda r, g, m: [[1, 1]])
    with pytest.raises(ValueError, match="expected one of"):
        compute_dpo_pairs(torch.tensor([0., 1]), pair_selector="best")
    with pytest.raises(ValueError, match="min_margin"): compute_dpo_pairs(torch.tensor([0., 1]), min_margin=-1.0)
    with pytest.raises(ValueError, match="rewards"): compute_dpo_pairs(torch.tensor([0., math.nan]))


# ---- the loss ----
def test_loss_by_hand_two_pairs():
    "beta 0.5; log-ratios chosen (1, -0.5), rejected (-1, 3.5): z = (1, -2); losses log(1+e^-1), log(1+e^2)."
    c, rj = torch.tensor([1., -0.5], requires_grad=True), torch.tensor([-1., 3.5], requires_grad=True)
    loss, m = compute_dpo_loss(c, rj, beta=0.5)
    assert loss.item() == pytest.approx((0.313262 + 2.126928) / 2, abs=1e-6)
    assert m == pytest.approx({"loss/dpo": 1.220095, "dpo/margin": -0.5, "dpo/accuracy": 0.5, "dpo/pairs": 2.0},
                              abs=1e-6)
    loss.backward()  # d loss / d chosen = -beta sigmoid(-z) / P
    assert c.grad.tolist() == pytest.approx([-0.5 * 0.268941 / 2, -0.5 * 0.880797 / 2], abs=1e-6)
    assert rj.grad.tolist() == pytest.approx((-c.grad).tolist(), abs=1e-7)


def test_loss_against_a_loop_over_pairs():
    set_seed(1)
    B, C, beta = 24, 6, 0.3
    lp, ref = torch.randn(B, C) - 1, torch.randn(B, C) - 1
    mask = (torch.arange(C)[None] < torch.randint(1, C + 1, (B, 1))).float()
    rewards, groups = torch.randint(0, 3, (B,)).float(), torch.arange(B) // 6
    for sel in ("best_vs_worst", "all_pairs"):
        pairs = naive_pairs(rewards.tolist(), groups.tolist(), sel)
        seq = [sum((lp[i, t] - ref[i, t]).item() for t in range(C) if mask[i, t] > 0) for i in range(B)]
        naive = sum(math.log1p(math.exp(-beta * (seq[c] - seq[r]))) for c, r in pairs) / len(pairs)
        loss, m = dpo_loss(lp, lp, None, mask, ref, groups, rewards, beta=beta, pair_selector=sel)
        assert loss.item() == pytest.approx(naive, abs=1e-5) and m["dpo/pairs"] == len(pairs)


def test_loss_is_stable_at_huge_margins():
    big = torch.tensor([1e4, -1e4], requires_grad=True)
    loss, m = compute_dpo_loss(big, torch.zeros(2), beta=1.0)
    loss.backward()
    assert loss.item() == 5000.0 and big.grad.tolist() == [0.0, -0.5]
    assert m["dpo/accuracy"] == 0.5 and m["dpo/margin"] == 0.0
    naive = -torch.log(torch.sigmoid(torch.tensor([-1e4])))
    assert naive.item() == math.inf  # what softplus avoids
    empty = torch.zeros(0, requires_grad=True)
    loss0, m0 = compute_dpo_loss(empty, torch.zeros(0))
    assert loss0.requires_grad and loss0.item() == 0.0 and m0["dpo/pairs"] == 0.0
    with pytest.raises(ValueError, match="beta"): compute_dpo_loss(big, torch.zeros(2), beta=0)


def trl_online_dpo(logprobs, ref_logprobs, mask, rewards, beta):
    """TRL's online DPO (sigmoid) re-derived: rows are [first completions..., second completions...], chosen = first
    if r1 >= r2."""
    n = len(rewards) // 2
    first, second = rewards.split(n)
    first_wins = first >= second
    chosen, rejected = torch.arange(n) + (~first_wins) * n, torch.arange(n) + first_wins * n
    seq = lambda x, idx: (x[idx] * mask[idx]).sum(1)
    pi_c, pi_r, ref_c, ref_r = (seq(logprobs, chosen), seq(logprobs, rejected),
                                seq(ref_logprobs, chosen), seq(ref_logprobs, rejected))
    margin = beta * (pi_c - ref_c) - beta * (pi_r - ref_r)
    return -F.logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r))).mean(), margin.mean(), (margin > 0).float().mean()


@pytest.mark.parametrize("beta", [0.05, 0.1, 1.0])
def test_loss_matches_trl_online_dpo(beta):
    set_seed(3)
    n, C = 16, 7
    lp, ref = torch.randn(2 * n, C) * .3 - 1, torch.randn(2 * n, C) * .3 - 1
    mask = (torch.arange(C)[None] < torch.randint(1, C + 1, (2 * n, 1))).float()
    rewards = torch.rand(2 * n)
    order = torch.arange(2 * n).view(n, 2).T.flatten()  # rlnb's prompt-major rows -> TRL's layout
    ours, m = dpo_loss(lp, lp, None, mask, ref, torch.arange(2 * n) // 2, rewards, beta=beta)
    trl, trl_margin, trl_acc = trl_online_dpo(lp[order], ref[order], mask[order], rewards[order], beta)
    assert ours.item() == pytest.approx(trl.item(), abs=1e-6)
    assert m["dpo/margin"] == pytest.approx(trl_margin.item(), abs=1e-6) and m["dpo/accuracy"] == trl_acc.item()


def test_gradient_raises_chosen_and_lowers_rejected():
    set_seed(4)
    B, C = 12, 5
    lp = (torch.randn(B, C) - 1).requires_grad_()
    ref, mask = torch.randn(B, C) - 1, (torch.arange(C)[None] < torch.randint(1, C + 1, (B, 1))).float()
    rewards, groups = torch.rand(B), torch.arange(B) // 4
    loss, _ = dpo_loss(lp, lp.detach(), None, mask, ref, groups, rewards)
    loss.backward()
    pairs = compute_dpo_pairs(rewards, groups)
    chosen, rejected = pairs[:, 0], pairs[:, 1]
    real = mask > 0
    assert (lp.grad[chosen][real[chosen]] < 0).all()  # gradient descent raises the chosen tokens' log-probs
    assert (lp.grad[rejected][real[rejected]] > 0).all()  # and lowers the rejected ones'
    others = torch.ones(B, dtype=torch.bool); others[pairs.flatten()] = False
    assert (lp.grad[others] == 0).all() and (lp.grad[~real] == 0).all()
    with torch.no_grad(): lp2 = lp - 0.1 * lp.grad  # one small step lowers the loss
    assert dpo_loss(lp2, lp2, None, mask, ref, groups, rewards)[0] < loss


# ---- the registry entry ----
def small_batch():
    ref = [[-1., -2], [-1., 0], [-2., -1], [-1., 0]]
    delta = [[.5, .5], [-1., 0], [1.5, 2.], [-.5, 0]]
    n = [2, 1, 2, 1]
    ros = [Rollout("p", prompt_token_ids=[5], token_ids=[1] * k, logprobs=[a + b for a, b in zip(f, d)][:k],
                   ref_logprobs=f[:k], rewards=r, group_index=i // 2)
           for i, (k, f, d, r) in enumerate(zip(n, ref, delta, [1., 0, 0, 1]))]
    return collate(ros, pad_token_id=0)


def rows(cb, idx):
    return cb._replace(**{f: getattr(cb, f)[idx] if isinstance(getattr(cb, f), torch.Tensor) else getattr(cb, f)
                          for f in cb._fields})


def test_registry_passes_batch_fields_and_matches_the_hand_numbers():
    assert "dpo" in ALGORITHMS and ALGORITHMS["dpo"].group_relative
    assert set(CollatedBatch._fields) <= _DATA_ARGS
    cb = small_batch()  # log-ratios per row 1, -1, 3.5, -0.5: pairs (0, 1) and (3, 2), z = 1 and -2 at beta 0.5
    lp = torch.where(cb.loss_mask > 0, cb.old_logprobs, -math.inf).requires_grad_()
    loss, m = compute_loss_by_algorithm(cb, lp, create_algorithm_config("dpo", beta=0.5))
    assert loss.item() == pytest.approx(1.220095, abs=1e-6) and m["dpo/pairs"] == 2
    with pytest.raises(ValueError, match=r"no option\(s\) \['group_ids'\]"):
        create_algorithm_config("dpo", group_ids=[0])
    with pytest.raises(ValueError, match=r"no option\(s\) \['rewards'\]"):
        create_algorithm_config("dpo", rewards=[0])


def test_no_reference_is_a_clear_error():
    cb = small_batch()
    lp = cb.old_logprobs.clone().requires_grad_()
    with pytest.raises(ValueError, match="LoRA"):
        compute_loss_by_algorithm(cb._replace(ref_logprobs=None), lp, create_algorithm_config("dpo"))


def test_a_group_split_across_micro_batches_is_refused():
    cb = small_batch()
    whole = cb._replace(advantages=compute_dpo_advantages(cb.rewards, cb.group_ids))  # as training_step computes them
    lp = whole.old_logprobs
    cfg = create_algorithm_config("dpo", beta=0.5)
    halves = [compute_loss_by_algorithm(rows(whole, i), lp[i], cfg)[0].item() for i in (slice(0, 2), slice(2, 4))]
    assert sum(halves) / 2 == pytest.approx(1.220095, abs=1e-6)  # whole groups: the same pairs
    for cut in (slice(0, 3), slice(3, 4), slice(1, 3)):
        with pytest.raises(ValueError, match="split across micro-batches"):
            compute_loss_by_algorithm(rows(whole, cut), lp[cut], cfg)


# ---- a short run that learns ----
def dpo_run(learning_rate, **changes):
    "tests/learnable.py's learnable reward (~0.5 at the start) with DPO, from train's own start: (first, last)."
    rows, _ = learnable_run(**{"algorithm": "dpo", "learning_rate": learning_rate, **changes})
    return first_and_last(rows)


def learned(first, last): return last >= first + 0.3 and last >= 0.85


@pytest.mark.slow
def test_dpo_learns_a_learnable_reward():
    """Default LoRA policy (the reference is the model with adapters off), beta 0.1, best vs worst: 20 iterations at
    lr 5e-3."""
    first, last = dpo_run(5e-3)
    print(f"dpo: reward 'starts with 1' {first:.2f} -> {last:.2f}")
    assert learned(first, last), (first, last)
    first, last = dpo_run(1e-7)  # the same run with (almost) no learning must fail the assertion
    assert not learned(first, last), (first, last)


def test_training_refuses_micro_batches_that_cut_groups():
    with pytest.raises(ValueError, match="would split DPO.s groups"):
        dpo_run(5e-3, num_iterations=1, micro_batch_size=12)  # groups of 8 cut at rows 12, 24, ...
    dpo_run(5e-3, num_iterations=1, micro_batch_size=16)  # whole groups: fine


def test_bad_inputs_are_clear_errors():
    lp, mask = torch.zeros(4, 2), torch.ones(4, 2)
    with pytest.raises(ValueError, match="3 entries but `logprobs` has 4 rows"):
        dpo_loss(lp, lp, None, mask, lp, torch.zeros(3, dtype=torch.long), torch.zeros(3))
    with pytest.raises(ValueError, match="ref_logprobs"):
        dpo_loss(lp, lp, None, mask, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), torch.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        dpo_loss(lp, lp, None, mask, torch.full((4, 2), math.nan), torch.zeros(4, dtype=torch.long),
                        torch.zeros(4))
