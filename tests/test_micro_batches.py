"Gradient accumulation is exact for every registered algorithm and aggregation: micro-batches add up to the full batch."
import pytest
import torch

from rlnb.algorithms import ALGORITHMS, create_algorithm_config
from rlnb.core import GenerationConfig, TrainingConfig, TrainingState, set_seed
from rlnb.kl import create_reference_model
from rlnb.models import apply_lora
from rlnb.rollouts import create_batch_rollouts
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.step import create_optimizer, training_step

GROUP = 4


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    base, tok = load_tiny_model("addition")
    set_seed(0)
    policy = apply_lora(base, r=4)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p))  # a policy away from its reference
    examples = get_task("addition").sample(4, seed=3)
    batch = create_batch_rollouts(policy, tok, examples, GenerationConfig(max_new_tokens=6, num_return_sequences=GROUP))
    lengths = [len(r.token_ids) for r in batch.rollouts]
    assert len(set(lengths)) > 1, lengths  # rows of different lengths: token and row weights differ
    # distinct: every group pairs
    rewards = torch.rand(len(batch.rollouts), generator=torch.Generator().manual_seed(1)).tolist()
    baselines = torch.rand(len(batch.rollouts), generator=torch.Generator().manual_seed(2)).tolist()  # ReMax's
    # opsd's and sdpo's hinted-prompt log-probs, as their rollout_wrapper writes them
    teachers = [(-torch.rand(len(r.token_ids), generator=torch.Generator().manual_seed(3 + i)) * 3).tolist()
                for i, r in enumerate(batch.rollouts)]
    batch = batch._replace(rollouts=[r._replace(rewards=x, metadata={**(r.metadata or {}), "baseline_reward": b,
                                                                      "teacher_logprobs": t})
                                     for r, x, b, t in zip(batch.rollouts, rewards, baselines, teachers)])
    return policy, tok, batch


def accumulated_grads(setting, name: str, options: dict, micro_batch_size, metrics: dict | None = None, **config):
    """The gradient one training_step accumulates (policy and value head), captured instead of stepping. `config`: more
    TrainingConfig fields; `metrics`, if given, receives the step's metrics."""
    policy, tok, batch = setting
    seen = {}
    def capture(state, max_grad_norm):
        for k, group in enumerate(state.optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is not None: seen[(k, j)] = p.grad.clone()
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0
    torch.manual_seed(0)  # PPO's value head is created inside the step: the same initial head both times
    opt, _ = create_optimizer(policy, learning_rate=1e-3)
    ref = create_reference_model(policy)
    state = TrainingState(0, 0, policy, opt, None, ref_model=ref, teacher=ref)  # opd distills from it; others measure
    _, stats = training_step(state, batch, create_algorithm_config(name, **options), optimizer_step_fn=capture,
                             tokenizer=tok,
                             config=TrainingConfig(micro_batch_size=micro_batch_size, **config))
    if metrics is not None: metrics.update(stats.custom_metrics)
    return seen


SIGNAL = {"grpo_passk": {"k": 2, "threshold": 0.5}}  # pass@4 of groups of 4 (its default k) has no signal at all
CASES = [(name, SIGNAL.get(name, {})) for name in sorted(ALGORITHMS)] + [
    (name, {"aggregation": agg})
    for name in ("grpo", "ppo", "rloo") for agg in ("token_mean", "sequence_mean", "constant")
] + [("dpo", {"pair_selector": "all_pairs"}), ("grpo", {"beta": 0.04})]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_micro_batches_give_the_full_batch_gradient(setting, name, options):
    full = accumulated_grads(setting, name, options, None)
    micro = accumulated_grads(setting, name, options, GROUP)  # whole groups (DPO pairs within a group)
    assert full and full.keys() == micro.keys()
    assert any(g.abs().sum() > 0 for g in full.values()), f"{name} {options}: a zero gradient compares nothing"
    for key in full:
        torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name} {options} {key}: {m}")
