"""Pareto rewards (rlnb.reward_transforms): non-dominated sorting of reward vectors within each group, the front as a
reward in [0, 1], and `create_reward_transform(aggregator="pareto")` in a real training run."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlnb.core import create_training_config
from rlnb.reward_transforms import create_reward_transform, pareto_ranks, pareto_reward
from rlnb.tasks import get_task
from rlnb.training import train

torch.set_num_threads(1)
FAST = settings(max_examples=60, deadline=None)


def dominates(a, b):
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def ranks_by_loop(rewards, group_ids, maximize=True):
    "The obvious O(n^2)-per-front peeling, written independently of rlnb."
    rows = [[x if maximize else -x for x in row] for row in rewards.tolist()]
    ranks, remaining, front = [None] * len(rows), set(range(len(rows))), 0
    while remaining:
        current = {i for i in remaining
                   if not any(group_ids[j] == group_ids[i] and dominates(rows[j], rows[i]) for j in remaining)}
        for i in current: ranks[i] = front
        remaining -= current
        front += 1
    return ranks


@st.composite
def grouped_vectors(draw, max_rows=12):
    "(rewards (B, K) with many ties, group_ids list): components from a small set so duplicates are common."
    B, K = draw(st.integers(1, max_rows)), draw(st.integers(1, 3))
    values = draw(st.lists(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=K, max_size=K),
                           min_size=B, max_size=B))
    group_ids = draw(st.lists(st.integers(-3, 3), min_size=B, max_size=B))
    return torch.tensor(values), group_ids


def test_by_hand():
    R = torch.tensor([[1.0, 0.2], [1.0, 0.8], [0.0, 0.9], [0.0, 0.5], [1.0, 0.8], [0.0, 0.1]])
    assert pareto_ranks(R).tolist() == [1, 0, 0, 1, 0, 2]  # duplicates (rows 1, 4) share front 0
    assert pareto_ranks(R, [9, 4, 4, 4, 4, 4]).tolist() == [0, 0, 0, 1, 0, 2]  # row 0 alone in its group
    assert pareto_ranks(-R, maximize=False).tolist() == [1, 0, 0, 1, 0, 2]
    assert torch.allclose(pareto_reward(R), torch.tensor([0.5, 1, 1, 0.5, 1, 0]))
    assert pareto_reward(torch.ones(5, 3)).tolist() == [1.0] * 5  # one front: all 1
    assert pareto_reward(torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist() == [1.0, 1.0]
    assert pareto_ranks(R).dtype == torch.long and pareto_reward(R).dtype == torch.float32


@FAST
@given(grouped_vectors(), st.booleans())
def test_vectorised_equals_loop(data, maximize):
    R, g = data
    assert pareto_ranks(R, g, maximize).tolist() == ranks_by_loop(R, g, maximize)


@FAST
@given(grouped_vectors())
def test_one_component_is_dense_rank_from_the_top(data):
    R, g = data
    x = R[:, 0]
    want = [len({float(v) for v, h in zip(x, g) if h == gi and v > xi}) for xi, gi in zip(x, g)]
    assert pareto_ranks(x, g).tolist() == want == pareto_ranks(x[:, None], g).tolist()


@FAST
@given(grouped_vectors(), st.randoms(use_true_random=False))
def test_permuting_rows_permutes_ranks(data, rnd):
    R, g = data
    perm = list(range(len(g)))
    rnd.shuffle(perm)
    assert pareto_ranks(R[perm], [g[i] for i in perm]).tolist() == [pareto_ranks(R, g).tolist()[i] for i in perm]


@FAST
@given(grouped_vectors(max_rows=10), st.lists(st.sampled_from([-2.0, 0.0, 0.5, 3.0]), min_size=3, max_size=3),
       st.integers(-3, 3))
def test_adding_a_point_that_dominates_nobody_changes_no_other_front(data, new, new_group):
    R, g = data
    new = new[:R.shape[1]]
    if any(h == new_group and dominates(new, row) for row, h in zip(R.tolist(), g)): return  # not this property's case
    before = pareto_ranks(R, g)
    after = pareto_ranks(torch.cat([R, torch.tensor([new])]), g + [new_group])
    assert after[:-1].tolist() == before.tolist()


def test_a_point_below_everyone_gets_the_last_front_and_reward_zero():
    R = torch.tensor([[3.0, 1.0], [1.0, 3.0], [2.0, 2.0], [1.0, 1.0]])
    worst = torch.cat([R, R.min(0).values[None] - 1])
    assert pareto_ranks(worst).tolist() == [0, 0, 0, 1, 2]
    assert pareto_reward(worst).tolist() == [1.0, 1.0, 1.0, 0.5, 0.0]


@FAST
@given(grouped_vectors())
def test_reward_in_unit_interval_and_one_per_group_on_top(data):
    R, g = data
    r, ranks = pareto_reward(R, g), pareto_ranks(R, g)
    assert ((r >= 0) & (r <= 1)).all() and torch.equal(r == 1, ranks == 0)
    for gi in set(g):
        in_group = torch.tensor([h == gi for h in g])
        assert r[in_group].min() == (0.0 if ranks[in_group].max() > 0 else 1.0)


def test_bad_inputs_name_the_argument():
    R = torch.ones(4, 2)
    with pytest.raises(ValueError, match="`group_ids` has shape"): pareto_ranks(R, [0, 1])
    with pytest.raises(ValueError, match="NaN"): pareto_reward(torch.tensor([[0.0, math.nan]]))
    with pytest.raises(ValueError, match="K >= 1"): pareto_ranks(torch.zeros(2, 0))
    with pytest.raises(TypeError, match="`maximize`"): pareto_ranks(R, maximize=1)
    with pytest.raises(ValueError, match="unknown `aggregator` 'nsga'"): create_reward_transform(aggregator="nsga")


def test_transform_zero_signal_for_a_tied_group():
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    g = torch.tensor([0, 0, 0, 1, 1])
    assert create_reward_transform(aggregator="pareto")(R, g, [None] * 5).tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    z = create_reward_transform(aggregator="pareto", normalizer="zscore")(R, g, [None] * 5)
    assert z[3:].tolist() == [0.0, 0.0] and z[0] > 0 > z[2]
    ranked = create_reward_transform(weights=[1.0, 1.0], normalizer="rank")(R, g, [None] * 5)  # relative rewards
    assert ranked.tolist() == [0.75, 0.75, 0.0, 0.5, 0.5]


def test_pareto_transform_in_a_training_run():
    "3 iterations with a 2-component reward (correct, short): the Pareto transform runs and every metric is finite."
    task = get_task("addition")
    vec = lambda r: [task.reward_fn(r), -len(r.token_ids) / 8]
    seen = []
    pareto = create_reward_transform(aggregator="pareto")
    def recording(rewards, group_ids, rollouts):
        out = pareto(rewards, group_ids, rollouts)
        seen.append((rewards.clone(), group_ids.clone(), out))
        return out
    config = create_training_config(num_iterations=3, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0,
                                    learning_rate=1e-3)
    state = train(config, reward_fn=vec, reward_transform=recording, progress=False)
    assert state.iteration == 3 and len(seen) >= 3
    for rewards, group_ids, out in seen:
        assert rewards.shape == (8, 2) and torch.equal(out, pareto_reward(rewards, group_ids))
        assert ((out >= 0) & (out <= 1)).all()
    assert any(out.min() < 1 for _, _, out in seen)  # some group had more than one front: the ranking did something
    for stats in state.stats_history:
        numbers = [stats.loss, stats.grad_norm, stats.rewards_mean, stats.rewards_std]
        numbers += [stats.kl_divergence] if stats.kl_divergence is not None else []  # None: not measured (beta 0)
        numbers += [v for v in (stats.custom_metrics or {}).values() if isinstance(v, (int, float))]
        assert all(math.isfinite(v) for v in numbers), stats
