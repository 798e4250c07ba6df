"""PPO end to end: GAE against a loop and Stable-Baselines3, the value head in training, switching, checkpoints and
exact resume, learning."""
import math

import numpy as np
import pytest
import torch

from rlnb.algorithms import ALGORITHMS, create_algorithm_config
from rlnb.checkpoints import checkpoint_metadata
from rlnb.core import create_training_config
from rlnb.ppo import compute_gae, compute_ppo_advantages, compute_value_loss
from rlnb.training import train
from learnable import first_and_last, learnable_run, lora_policy

torch.set_num_threads(1)
SMALL = dict(num_iterations=3, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


def loop_gae(tr, v, m, gamma, lam):
    adv = torch.zeros_like(tr)
    for i in range(tr.shape[0]):
        nxt, run = 0.0, 0.0
        for t in reversed([t for t in range(tr.shape[1]) if m[i, t]]):
            run = tr[i, t].item() + gamma * nxt - v[i, t].item() + gamma * lam * run
            adv[i, t], nxt = run, v[i, t].item()
    return adv


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.0), (0.97, 1.0)])
def test_gae_matches_a_loop_and_stable_baselines3(gamma, lam):
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer
    g = torch.Generator().manual_seed(int(gamma * 100 + lam * 10))
    B, C = 7, 10
    tr, v = torch.randn(B, C, generator=g), torch.randn(B, C, generator=g)
    m = (torch.rand(B, C, generator=g) > 0.3).float()
    adv, ret = compute_gae(tr, v, m, gamma, lam)
    torch.testing.assert_close(adv, loop_gae(tr, v, m, gamma, lam), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, (adv + v) * m)
    buf = RolloutBuffer(C, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gamma=gamma, gae_lambda=lam,
                        n_envs=B)
    buf.rewards[:], buf.values[:], buf.episode_starts[:] = 0, 0, 0
    steps = [[t for t in range(C) if m[i, t]] for i in range(B)]
    for i, s in enumerate(steps):
        buf.rewards[:len(s), i], buf.values[:len(s), i] = tr[i, s].numpy(), v[i, s].numpy()
        if len(s) < C: buf.episode_starts[len(s), i] = 1.0
    buf.compute_returns_and_advantage(last_values=torch.zeros(B), dones=np.ones(B))
    for i, s in enumerate(steps):
        np.testing.assert_allclose(adv[i, s].numpy(), buf.advantages[:len(s), i], atol=1e-5)


def test_gae_skips_positions_the_policy_did_not_write():
    "Tool output between two policy tokens changes nothing, whatever its rewards and values."
    tr, v = torch.tensor([[0., 0, 1]]), torch.tensor([[.5, .6, .8]])
    adv, _ = compute_gae(tr, v, torch.ones(1, 3), 1.0, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[.25, .3, .2]]))
    adv_gap, _ = compute_gae(torch.tensor([[0., 5, 5, 0, 1]]), torch.tensor([[.5, -9, 9, .6, .8]]),
                             torch.tensor([[1., 0, 0, 1, 1]]), 1.0, 0.5)
    torch.testing.assert_close(adv_gap, torch.tensor([[.25, 0, 0, .3, .2]]))


def test_ppo_advantages_reduce_to_dr_grpo_with_a_group_mean_value():
    r, g = torch.tensor([1., 0, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    m = torch.tensor([[1., 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1]])
    mean_value = lambda r_, g_, m_: torch.stack([r_[g_ == k].mean() for k in g_])[:, None].expand_as(m_)
    adv, _ = compute_ppo_advantages(r, g, m, gamma=1.0, lam=1.0, whiten=False, value_fn=mean_value)
    torch.testing.assert_close(adv, (r - torch.tensor([1 / 3] * 3 + [2 / 3] * 3))[:, None] * m)


def test_value_clip_by_hand_and_gradient():
    v = torch.tensor([[0.6, 0.9]], requires_grad=True)
    loss, m = compute_value_loss(v, torch.full((1, 2), 0.5), torch.ones(1, 2), torch.ones(1, 2), value_clip=0.2)
    assert math.isclose(loss.item(), (0.08 + 0.045) / 2, rel_tol=1e-6) and m["value/clip_frac"] == 0.5
    loss.backward()
    torch.testing.assert_close(v.grad, torch.tensor([[-0.2, 0.0]]))


@pytest.mark.slow
def test_ppo_learns_a_learnable_reward_and_its_value_head_learns_too():
    """The reward of tests/learnable.py climbs; the value head's prediction follows the reward up. 30 iterations, not
    the 20 that GRPO needs: the advantages wait for the zero-initialised value head (0.53 -> 0.79 after 20, 0.98 after
    30, on both AVX2 and AVX-512)."""
    state, tok = lora_policy(lr=3e-3)
    rows, out = learnable_run(state, tok, algorithm="ppo", num_iterations=30)
    first, last = first_and_last(rows)
    v_first, v_last = rows[0]["value/mean"], sum(r["value/mean"] for r in rows[-3:]) / 3
    print(f"ppo: reward 'starts with 1' {first:.2f} -> {last:.2f}; mean value {v_first:.2f} -> {v_last:.2f}")
    assert last >= first + 0.3 and last >= 0.85, (first, last)
    assert v_first == 0.0 and v_last > 0.3, (v_first, v_last)  # zero-initialised head learned to predict the reward
    assert out.value_head is not None and len(out.optimizer.param_groups) == 2


def test_switching_grpo_to_ppo_creates_the_value_head_and_back():
    names = ["grpo", "ppo", "ppo", "grpo"]
    seen = []
    state = train(create_training_config(**{**SMALL, "num_iterations": 4}),
                  algorithm_config=lambda it: create_algorithm_config(names[it]),
                  reward_fn=lambda r: len(r.token_ids) / 6,  # never all 0: the value head always has something to learn
                  logger=lambda s, st: seen.append((st.custom_metrics["algorithm"], "loss/value" in st.custom_metrics,
                                                    s.value_head is not None)),
                  progress=False)
    assert seen == [("grpo", False, False), ("ppo", True, True), ("ppo", True, True), ("grpo", False, True)], seen
    assert len(state.optimizer.param_groups) == 2 and state.value_head.weight.abs().sum() > 0


@pytest.mark.slow
def test_ppo_checkpoint_holds_the_value_head_and_resume_is_exact(tmp_path):
    """A GRPO -> PPO run stopped after 3 iterations and resumed to 5 ends with the same adapters and value head as a run
    of 5."""
    schedule = {0: "grpo", 2: "ppo"}
    cfg = {**SMALL, "num_iterations": 5}
    algo = lambda it: create_algorithm_config(schedule[max(k for k in schedule if k <= it)])
    full = train(create_training_config(**cfg, output_dir=str(tmp_path / "a")), algorithm_config=algo, progress=False)
    # the same config (the cosine schedule's length is part of the run), stopped as if it died
    train(create_training_config(**cfg, output_dir=str(tmp_path / "b")), algorithm_config=algo,
          stop_fn=lambda s, m: s.iteration >= 3, progress=False)
    assert checkpoint_metadata(tmp_path / "b" / "checkpoint")["value_head"]
    resumed = train(create_training_config(**cfg, output_dir=str(tmp_path / "b"), resume=True), algorithm_config=algo,
                    progress=False)
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        if "lora_" in n: assert torch.equal(a, b), n
    assert (torch.equal(full.value_head.weight, resumed.value_head.weight)
            and torch.equal(full.value_head.bias, resumed.value_head.bias))


def test_ppo_runs_with_groups_of_one_and_kl_in_the_loss():
    assert not ALGORITHMS["ppo"].group_relative and ALGORITHMS["ppo"].value_head
    rows = []
    train(create_training_config(**{**SMALL, "group_size": 1, "prompts_per_step": 4}, algorithm="ppo",
                                 algorithm_options={"kl_penalty": "loss"}, beta=0.05),
          logger=lambda s, st: rows.append(st.custom_metrics), progress=False)
    assert all("loss/kl" in r and "loss/value" in r for r in rows)
    with pytest.raises(ValueError, match="kl_penalty"):
        compute_ppo_advantages([1.], None, torch.ones(1, 2), torch.zeros(1, 2), kl_penalty="both")
