"Advantage baselines (rlnb.baselines): MaxRL, GDPO and ReMax by hand, against loops, in training runs; their errors."
import pytest
import torch

from rlnb.algorithms import ALGORITHMS, compute_batch_advantages, compute_grpo_advantages, create_algorithm_config
from rlnb.baselines import (compute_gdpo_advantages, compute_maxrl_advantages, compute_remax_advantages,
                            create_greedy_baseline_rollout_fn)
from rlnb.catalogue import compute_reinforce_pp_advantages
from rlnb.core import Batch, GenerationConfig, Rollout, TrainingConfig, collate, create_training_config, set_seed
from rlnb.rollouts import create_batch_rollouts, create_rollout_fn
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.training import train
from learnable import first_and_last, learnable_run, lora_policy

torch.set_num_threads(1)
TASK = get_task("addition")
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)
KEYS = ("maxrl", "gdpo", "remax")


def loop_maxrl(rewards, groups):
    out = []
    for r, g in zip(rewards, groups):
        group = [x for x, h in zip(rewards, groups) if h == g]
        mean = sum(group) / len(group)
        out.append(0.0 if mean == 0 or r == mean else (r - mean) / mean)
    return out


def loop_gdpo(rewards, groups, weights, eps=1e-4):
    "TRL's normalize_then_sum: per component group z-score (sample std + eps), weighted sum, batch z-score."
    def z(xs, x):
        m = sum(xs) / len(xs)
        s = (sum((v - m) ** 2 for v in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
        return 0.0 if x == m else (x - m) / (s + eps)
    sums = [sum(w * z([rewards[j][k] for j in range(len(rewards)) if groups[j] == groups[i]], rewards[i][k])
                for k, w in enumerate(weights)) for i in range(len(rewards))]
    return [z(sums, s) for s in sums]


def test_registered_with_grpo_loss():
    for key in KEYS:
        assert ALGORITHMS[key].policy_loss.__name__ == "grpo_loss"
    assert ALGORITHMS["remax"].group_relative is False and ALGORITHMS["remax"].rollout_wrapper is not None
    assert ALGORITHMS["gdpo"].vector_rewards


def test_maxrl_by_hand_and_loop():
    a = compute_maxrl_advantages(torch.tensor([1., 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]), group_size=4)
    torch.testing.assert_close(a, torch.tensor([3., -1, -1, -1, 1 / 3, 1 / 3, 1 / 3, -1, 0, 0, 0, 0]))
    g = torch.Generator().manual_seed(0)
    r, ids = torch.rand(40, generator=g), torch.randint(0, 7, (40,), generator=g)
    torch.testing.assert_close(compute_maxrl_advantages(r, ids), torch.tensor(loop_maxrl(r.tolist(), ids.tolist())))
    # binary rewards: the paper's estimator, mean over successes minus mean over all, equals mean_i A_i grad_i / N
    assert compute_maxrl_advantages([1., 0], group_size=2).tolist() == [1.0, -1.0]


def test_maxrl_errors():
    with pytest.raises(ValueError, match="compute_maxrl_advantages: `rewards` must be >= 0"):
        compute_maxrl_advantages(torch.tensor([0.5, -0.1]))
    with pytest.raises(ValueError, match="expected \\(B,\\)"):
        compute_maxrl_advantages(torch.ones(2, 2))


def test_gdpo_by_hand_loop_and_trl_formula():
    vector = torch.tensor([[1., 0], [1, 4], [0, 6], [0, 10]])
    torch.testing.assert_close(compute_gdpo_advantages(vector, group_size=4),
                               torch.tensor([-0.5781, 1.0795, -1.0795, 0.5781]), atol=1e-3, rtol=0)
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 3, (32, 3), generator=g).float()  # many ties
    ids = torch.randint(0, 6, (32,), generator=g)
    w = [1.0, 0.5, 2.0]
    torch.testing.assert_close(compute_gdpo_advantages(r, ids, weights=w),
                               torch.tensor(loop_gdpo(r.tolist(), ids.tolist(), w)), atol=1e-4, rtol=1e-4)


def test_gdpo_scalar_rewards_are_one_component():
    r = torch.tensor([1., 0, 0, 0, 1, 1, 0, 0])
    torch.testing.assert_close(compute_gdpo_advantages(r, group_size=4),
                               compute_reinforce_pp_advantages(compute_grpo_advantages(r, group_size=4)))
    torch.testing.assert_close(compute_gdpo_advantages(r, group_size=4),
                               compute_gdpo_advantages(r[:, None], group_size=4))


def test_gdpo_errors():
    with pytest.raises(ValueError, match="compute_gdpo_advantages: `weights` must be 2 finite numbers"):
        compute_gdpo_advantages(torch.ones(4, 2), weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="expected \\(B,\\) or \\(B, K\\)"):
        compute_gdpo_advantages(torch.ones(2, 2, 2))
    with pytest.raises(ValueError, match="finite"):
        compute_gdpo_advantages(torch.tensor([[1.0, float("inf")]]))


def test_summing_first_loses_the_small_component():
    vector = torch.tensor([[1., 0], [1, 4], [0, 6], [0, 10]])
    correct = vector[:, 0]
    corr = lambda a: torch.corrcoef(torch.stack([a, correct]))[0, 1].item()
    assert corr(compute_grpo_advantages(vector.sum(1), group_size=4)) < 0 < corr(compute_gdpo_advantages(vector))


def test_remax_by_hand_and_errors():
    a = compute_remax_advantages(torch.tensor([1., 0, 1, 1]), baseline_rewards=torch.tensor([1., 1, 0, 0]))
    assert a.tolist() == [0.0, -1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="no `baseline_rewards`.*create_greedy_baseline_rollout_fn"):
        compute_remax_advantages(torch.ones(2))
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        compute_remax_advantages(torch.ones(2), baseline_rewards=torch.ones(3))


def test_collate_with_and_without_baseline_rewards():
    rs = [Rollout("p", prompt_token_ids=[1], token_ids=[2, 3], rewards=x, group_index=0) for x in (1.0, 0.0)]
    assert collate(rs, pad_token_id=0).baseline_rewards is None
    with_b = [r._replace(metadata={"baseline_reward": 0.25, "other": 1}) for r in rs]
    cb = collate(with_b, pad_token_id=0)
    assert cb.baseline_rewards.tolist() == [0.25, 0.25]
    cb = compute_batch_advantages(cb, create_algorithm_config("remax"))
    assert cb.advantages.tolist() == [0.75, -0.25]
    with pytest.raises(ValueError, match="collate: rollouts \\[1\\] have no metadata\\['baseline_reward'\\]"):
        collate(with_b[:1] + rs[1:], pad_token_id=0)
    with pytest.raises(ValueError, match="finite"):
        collate([r._replace(metadata={"baseline_reward": float("nan")}) for r in rs], pad_token_id=0)


def test_the_greedy_reward_is_the_greedy_samples():
    model, tok = load_tiny_model("addition", progress=False)
    prompts = TASK.sample(6, seed=1)
    cfg = TrainingConfig(group_size=3, max_new_tokens=6)
    wrapped = create_greedy_baseline_rollout_fn(create_rollout_fn(TASK.reward_fn, system_prompt=TASK.system_prompt),
                                                TASK.reward_fn, system_prompt=TASK.system_prompt)
    set_seed(0)
    batch = wrapped(model, tok, prompts, cfg)
    assert len(batch.rollouts) == 18 and "baseline/greedy_reward" in batch.batch_metadata
    greedy = create_batch_rollouts(model, tok, prompts, GenerationConfig(max_new_tokens=6, do_sample=False),
                                   reward_fn=TASK.reward_fn, system_prompt=TASK.system_prompt)
    texts = {g.prompt: g.generation.text for g in greedy.rollouts}
    for r in batch.rollouts:
        assert r.metadata["baseline_reward"] == TASK.reward_fn(
            next(g for g in greedy.rollouts if g.prompt == r.prompt)) and r.prompt in texts
    # a reward that tells completions apart: the baseline is the greedy text's, not a sampled one's
    length = lambda r: float(len(r.generation.text))
    batch = create_greedy_baseline_rollout_fn(create_rollout_fn(length, system_prompt=TASK.system_prompt), length,
                                              system_prompt=TASK.system_prompt)(model, tok, prompts, cfg)
    assert all(r.metadata["baseline_reward"] == len(texts[r.prompt]) for r in batch.rollouts)


def test_greedy_wrapper_errors():
    with pytest.raises(TypeError, match="create_greedy_baseline_rollout_fn: `reward_fn`"):
        create_greedy_baseline_rollout_fn(lambda *a: None, None)
    model, tok = load_tiny_model("addition", progress=False)
    vec = lambda r: [1.0, 0.0]
    f = create_greedy_baseline_rollout_fn(create_rollout_fn(vec), vec)
    with pytest.raises(ValueError, match="one number per completion"):
        f(model, tok, ["1+1="], TrainingConfig(group_size=2, max_new_tokens=3))


@pytest.mark.parametrize("key", KEYS)
def test_runs_by_name_in_train(key):
    seen = []
    state = train(create_training_config(**SMALL, algorithm=key), progress=False,
                  logger=lambda s, st: seen.append(st.custom_metrics))
    assert state.global_step == 2 and [m["algorithm"] for m in seen] == [key, key]
    if key == "remax": assert all("baseline/greedy_reward" in m for m in seen)


@pytest.mark.parametrize("key", KEYS)
def test_switches_mid_run_from_grpo(key):
    names = ["grpo", key]
    seen = []
    state = train(create_training_config(**SMALL), algorithm_config=lambda it: create_algorithm_config(names[it]),
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 2 and [m["algorithm"] for m in seen] == names
    if key == "remax": assert "baseline/greedy_reward" in seen[1]  # the greedy pass was wired for the later remax


def test_remax_group_of_one():
    state = train(create_training_config(**{**SMALL, "group_size": 1, "prompts_per_step": 4}, algorithm="remax"),
                  progress=False)
    assert state.global_step == 2


def test_remax_with_a_custom_rollout_fn_without_baseline_says_so():
    default = create_rollout_fn(TASK.reward_fn, system_prompt=TASK.system_prompt)
    with pytest.raises(ValueError, match="no `baseline_rewards`.*wrap your own rollout_fn"):
        train(create_training_config(**SMALL, algorithm="remax"), rollout_fn=default, progress=False)
    # wrapped, it runs
    wrapped = create_greedy_baseline_rollout_fn(default, TASK.reward_fn, system_prompt=TASK.system_prompt)
    state = train(create_training_config(**SMALL, algorithm="remax"), rollout_fn=wrapped, progress=False)
    assert state.global_step == 2


def test_gdpo_trains_on_a_vector_reward():
    "A vector reward_fn with gdpo needs no reward_transform: the advantages see each component."
    seen = []
    def vector_reward(r):
        return [TASK.reward_fn(r), float(len(r.generation.text) > 3)]
    state = train(create_training_config(**SMALL, algorithm="gdpo"), reward_fn=vector_reward,
                  logger=lambda s, st: seen.append(st.custom_metrics), progress=False)
    assert state.global_step == 2 and "reward/component_1" in seen[-1]
    m = seen[-1]  # the logged reward is the components' sum
    assert m["reward/mean"] == pytest.approx(m["reward/component_0"] + m["reward/component_1"], abs=1e-6)
    with pytest.raises(ValueError, match="reward_transform"):  # grpo still asks for one number
        train(create_training_config(**SMALL, algorithm="grpo"), reward_fn=vector_reward, progress=False)


def test_micro_batches_give_the_full_batch_gradient_with_vector_rewards():
    "GDPO on a (B, K) reward and ReMax with its baselines: micro-batched gradients add up to the full batch's."
    from rlnb.models import apply_lora
    from rlnb.kl import create_reference_model
    from rlnb.core import TrainingState
    from rlnb.step import create_optimizer, training_step
    base, tok = load_tiny_model("addition", progress=False)
    set_seed(0)
    policy = apply_lora(base, r=4)
    batch = create_batch_rollouts(policy, tok, TASK.sample(4, seed=3), GenerationConfig(max_new_tokens=6,
                                                                                          num_return_sequences=4))
    g = torch.Generator().manual_seed(1)
    rollouts = [r._replace(rewards=torch.rand(3, generator=g).tolist(),
                           metadata={"baseline_reward": torch.rand(1, generator=g).item()}) for r in batch.rollouts]
    def grads(name, size, vector):
        rs = rollouts if vector else [r._replace(rewards=sum(r.rewards)) for r in rollouts]
        seen = {}
        def capture(state, max_grad_norm):
            for j, p in enumerate(state.optimizer.param_groups[0]["params"]):
                if p.grad is not None: seen[j] = p.grad.clone()
            state.optimizer.zero_grad(set_to_none=True)
            return 0.0
        opt, _ = create_optimizer(policy, learning_rate=1e-3)
        state = TrainingState(0, 0, policy, opt, None, ref_model=create_reference_model(policy))
        training_step(state, Batch(rs), create_algorithm_config(name), optimizer_step_fn=capture, tokenizer=tok,
                      config=TrainingConfig(micro_batch_size=size))
        return seen
    for name, vector in (("gdpo", True), ("remax", False), ("maxrl", False)):
        full, micro = grads(name, None, vector), grads(name, 4, vector)
        assert full and full.keys() == micro.keys()
        for k in full: torch.testing.assert_close(micro[k], full[k], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_each_baseline_learns_a_learnable_reward(key):
    "The learnable reward of tests/learnable.py (answers that start with '1', ~0.4 at first), 20 iterations."
    state, tok = lora_policy(lr=3e-3)
    rows, _ = learnable_run(state, tok, algorithm=key)
    first, last = first_and_last(rows)
    print(f"{key}: reward 'starts with 1' {first:.2f} -> {last:.2f}")
    assert last >= first + 0.3 and last >= 0.85, (key, first, last)


def test_remax_refuses_a_reward_transform():
    "The transform would reach the rewards but not the greedy baseline, and the advantages would mix two scales."
    scale = lambda rewards, group_ids, rollouts: 10 * rewards
    with pytest.raises(ValueError, match="`reward_transform` would change the rewards but not the baseline"):
        train(create_training_config(**SMALL, algorithm="remax"), reward_transform=scale, progress=False)
    state = train(create_training_config(**SMALL, algorithm="grpo"), reward_transform=scale, progress=False)
    assert state.global_step == 2  # the same transform is fine where there is no baseline reward
