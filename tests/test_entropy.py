"Entropy control: the bonus, the high-entropy token mask and the adaptive weight, alone and inside training runs."
import math

import pytest
import torch

from rlnb.algorithms import aggregate_loss, create_algorithm_config
from rlnb.core import GenerationConfig, TrainingConfig, TrainingState, create_training_config, set_seed
from rlnb.entropy import adaptive_entropy_coef, entropy_bonus, high_entropy_mask, update_entropy_control
from rlnb.kl import create_reference_model
from rlnb.models import apply_lora
from rlnb.rollouts import create_batch_rollouts
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.step import create_optimizer, training_step
from rlnb.training import train

torch.set_num_threads(1)
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)
ALL_THREE = dict(entropy_coef=0.004, entropy_top_fraction=0.2, entropy_target=5.0, entropy_coef_step=1e-3)


def test_bonus_by_hand_and_its_gradient():
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)  # (B, C)
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    term, metrics = entropy_bonus(entropy, mask, 0.1)  # token mean of 1, 2, 4 = 7/3
    assert math.isclose(term.item(), -0.1 * 7 / 3, rel_tol=1e-6)
    assert math.isclose(metrics["entropy/mean"], 7 / 3, rel_tol=1e-6)
    term.backward()
    torch.testing.assert_close(entropy.grad, -0.1 * mask / 3)  # only the counted tokens, each with -coef / N
    seq, _ = entropy_bonus(entropy, mask, 0.1, "sequence_mean")  # rows: 1.5 and 4
    assert math.isclose(seq.item(), -0.1 * (1.5 + 4) / 2, rel_tol=1e-6)
    const, _ = entropy_bonus(entropy, mask, 0.1, "constant", max_completion_length=4)  # 7 / (2 x 4)
    assert math.isclose(const.item(), -0.1 * 7 / 8, rel_tol=1e-6)
    zero, metrics = entropy_bonus(entropy, mask, 0.0)
    assert zero.item() == 0 and not zero.requires_grad and math.isclose(metrics["entropy/mean"], 7 / 3, rel_tol=1e-6)


@pytest.mark.parametrize("args, message", [
    ((torch.ones(2, 3), torch.ones(2, 3), -0.1), "`coef` must be a finite number >= 0"),
    ((torch.ones(2, 3), torch.ones(2, 2), 0.1), "loss_mask"),
    ((torch.tensor([[1.0, float("nan")]]), torch.ones(1, 2), 0.1), "entropy"),
])
def test_bonus_refuses_bad_input(args, message):
    with pytest.raises((ValueError, TypeError), match=message):
        entropy_bonus(*args)


def naive_high_entropy_mask(entropy, mask, top_fraction):
    "Sort the counted tokens by entropy; keep the first ceil(fraction x N) (and any tied with the last kept)."
    counted = sorted(((e, b, t) for b, (er, mr) in enumerate(zip(entropy, mask)) for t, (e, m) in enumerate(zip(er, mr))
                      if m), reverse=True)
    k = max(1, math.ceil(top_fraction * len(counted)))
    threshold = counted[k - 1][0]
    return [[float(m and e >= threshold) for e, m in zip(er, mr)] for er, mr in zip(entropy, mask)]


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.99, 1.0])
def test_mask_equals_a_sorted_loop(fraction):
    g = torch.Generator().manual_seed(0)
    entropy, mask = torch.rand(6, 9, generator=g) * 3, (torch.rand(6, 9, generator=g) > 0.3).float()
    kept = high_entropy_mask(entropy, mask, fraction)
    assert kept.tolist() == naive_high_entropy_mask(entropy.tolist(), mask.tolist(), fraction)
    assert kept.sum() == max(1, math.ceil(fraction * mask.sum().item()))  # no ties among random floats


def test_mask_by_hand_and_errors():
    entropy = torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])  # 9.0 is padding: never kept
    assert high_entropy_mask(entropy, mask, 0.4).tolist() == [[0, 1, 0], [1, 0, 0]]  # ceil(0.4 x 5) = 2 tokens
    for bad in (0, 1.5, -0.2, True):
        with pytest.raises(ValueError, match="`top_fraction` must be a number in \\(0, 1\\]"):
            high_entropy_mask(entropy, mask, bad)


def test_adaptive_rule_follows_skywork():
    c, active = adaptive_entropy_coef(0.0, entropy=0.1, target=0.2, step=1e-4, max_coef=5e-3)  # below: up, on
    assert (c, active) == (1e-4, True)
    c, active = adaptive_entropy_coef(c, entropy=0.3, target=0.2, step=1e-4, max_coef=5e-3)  # above: down, off
    assert (c, active) == (0.0, False)
    assert adaptive_entropy_coef(0.0, 0.3, 0.2, 1e-4, 5e-3) == (0.0, False)  # never below 0
    assert adaptive_entropy_coef(5e-3, 0.1, 0.2, 1e-4, 5e-3) == (5e-3, True)  # never above the ceiling
    with pytest.raises(ValueError, match="`step`"):
        adaptive_entropy_coef(0.0, 0.1, 0.2, float("nan"), 5e-3)


def test_controller_state_moves_with_the_entropy():
    cfg = create_training_config(entropy_target=1.0, entropy_coef=0.002, entropy_coef_step=0.001)
    state = TrainingState(0, 0, None, None, metadata={"config": cfg})
    for entropy, want in ((0.5, (0.003, True)), (0.5, (0.004, True)), (2.0, (0.003, False))):
        state = update_entropy_control(state, cfg, entropy)
        c = state.metadata["entropy_control"]
        assert math.isclose(c["coef"], want[0]) and c["active"] is want[1]
    assert update_entropy_control(state, TrainingConfig(), 0.5) is state  # no target: nothing to adapt


@pytest.mark.parametrize("changes, message", [
    (dict(entropy_coef=-0.1), "`entropy_coef` must be >= 0"),
    (dict(entropy_top_fraction=0.0), "`entropy_top_fraction` must be > 0"),
    (dict(entropy_top_fraction=1.5), "`entropy_top_fraction` must be <= 1"),
    (dict(entropy_target=-1.0), "`entropy_target` must be > 0"),
    (dict(entropy_coef_step=0.0, entropy_target=1.0), "`entropy_coef_step` must be > 0"),
    (dict(entropy_coef=0.1, entropy_target=1.0), "`entropy_coef`=0.1 .* must be <= entropy_coef_max"),
    (dict(entropy_top_fraction="all"), "`entropy_top_fraction` must be float"),
])
def test_config_refuses_bad_entropy_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        create_training_config(**changes)


def test_config_warns_about_adaptive_knobs_without_a_target():
    with pytest.warns(UserWarning, match="entropy_coef_step ignored"):
        create_training_config(entropy_coef_step=1e-3)


@pytest.fixture(scope="module")
def setting():
    base, tok = load_tiny_model("addition", progress=False)
    set_seed(0)
    policy = apply_lora(base, r=4)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad: p.add_(0.05 * torch.randn_like(p))
    examples = get_task("addition").sample(4, seed=3)
    batch = create_batch_rollouts(policy, tok, examples, GenerationConfig(max_new_tokens=6, num_return_sequences=4))
    rewards = torch.rand(len(batch.rollouts), generator=torch.Generator().manual_seed(1)).tolist()
    return policy, tok, batch._replace(rollouts=[r._replace(rewards=x) for r, x in zip(batch.rollouts, rewards)])


def step_gradient(setting, name, options, config):
    "The gradient one training_step accumulates (captured instead of stepping), and its metrics."
    policy, tok, batch = setting
    seen = {}
    def capture(state, max_grad_norm):
        for k, group in enumerate(state.optimizer.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is not None: seen[(k, j)] = p.grad.clone()
        state.optimizer.zero_grad(set_to_none=True)
        return 0.0
    torch.manual_seed(0)
    opt, _ = create_optimizer(policy, learning_rate=1e-3)
    state = TrainingState(0, 0, policy, opt, None, ref_model=create_reference_model(policy))
    _, stats = training_step(state, batch, create_algorithm_config(name, **options), optimizer_step_fn=capture,
                             tokenizer=tok,
                             config=config)
    return seen, stats.custom_metrics


AGGREGATIONS = ("token_mean", "sequence_mean", "constant")
CASES = [(name, {"aggregation": agg}) for name in ("grpo", "ppo") for agg in AGGREGATIONS]
CASES += [(name, {}) for name in ("dapo", "rloo", "reinforce", "gspo")]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_micro_batches_give_the_full_batch_gradient_with_bonus_and_mask(setting, name, options):
    cfg = dict(entropy_coef=0.05, entropy_top_fraction=0.3)
    full, m_full = step_gradient(setting, name, options, TrainingConfig(**cfg))
    micro, m_micro = step_gradient(setting, name, options, TrainingConfig(**cfg, micro_batch_size=4))
    assert full and full.keys() == micro.keys()
    for key in full:
        torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6)
    assert m_full["entropy/masked_fraction"] == m_micro["entropy/masked_fraction"] > 0.5
    assert math.isclose(m_full["loss/total"], m_micro["loss/total"], rel_tol=1e-5, abs_tol=1e-7)


def test_the_bonus_changes_the_gradient_by_its_own_gradient(setting):
    "Step gradient with the bonus = without it + coef x the gradient of minus the aggregated entropy."
    from rlnb.logprobs import compute_logprobs_for_tokens
    from rlnb.core import collate
    policy, tok, batch = setting
    without, _ = step_gradient(setting, "grpo", {}, TrainingConfig(max_grad_norm=0.0))
    with_bonus, _ = step_gradient(setting, "grpo", {}, TrainingConfig(entropy_coef=0.5))
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    policy.zero_grad(set_to_none=True)
    _, entropy = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1],
                                             return_entropy=True)
    (-0.5 * aggregate_loss(entropy, cb.loss_mask, "sequence_mean")).backward()  # GRPO averages rows
    params = [p for p in policy.parameters() if p.requires_grad]
    for (k, j), g in with_bonus.items():
        torch.testing.assert_close(g, without[(k, j)] + params[j].grad, rtol=1e-4, atol=1e-6)
    policy.zero_grad(set_to_none=True)


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "rloo", "reinforce", "ppo"])
def test_every_option_runs_by_name_in_train(algorithm):
    state = train(create_training_config(**SMALL, algorithm=algorithm, **ALL_THREE), progress=False)
    metrics = state.stats_history[-1].custom_metrics
    assert 0 < metrics["entropy/mean"] < math.log(64)
    assert 0.5 < metrics["entropy/masked_fraction"] < 1
    assert metrics["entropy/coef"] > 0 and metrics["loss/entropy"] < 0
    assert state.metadata["entropy_control"]["active"] is True  # the tiny model is below 5 nats per token


def test_entropy_is_logged_without_any_option():
    metrics = train(create_training_config(**SMALL), progress=False).stats_history[-1].custom_metrics
    assert metrics["entropy/mean"] > 0 and "entropy/coef" not in metrics and "entropy/masked_fraction" not in metrics


def test_an_algorithm_switch_mid_run_keeps_the_options():
    state = train(create_training_config(**SMALL, entropy_coef=0.01, entropy_top_fraction=0.5), progress=False,
                  algorithm_config=lambda it: create_algorithm_config("grpo" if it == 0 else "rloo"))
    assert [s.custom_metrics["algorithm"] for s in state.stats_history] == ["grpo", "rloo"]
    assert all(s.custom_metrics["entropy/masked_fraction"] > 0.3 for s in state.stats_history)


@pytest.mark.parametrize("option", [dict(entropy_coef=0.01), dict(entropy_top_fraction=0.2),
                                    dict(entropy_target=1.0)])
def test_pair_losses_refuse_the_options(option):
    with pytest.raises(ValueError, match="compares whole rollouts in pairs"):
        train(create_training_config(**SMALL, algorithm="dpo", **option), progress=False)


@pytest.mark.slow
def test_resume_continues_the_adaptive_weight_exactly(tmp_path):
    cfg = {**SMALL, "num_iterations": 4, "entropy_target": 5.0, "entropy_coef_step": 1e-3}
    full = train(create_training_config(**cfg, output_dir=str(tmp_path / "a")), progress=False)
    train(create_training_config(**cfg, output_dir=str(tmp_path / "b")), stop_fn=lambda s, m: s.iteration >= 2,
          progress=False)
    resumed = train(create_training_config(**cfg, output_dir=str(tmp_path / "b"), resume=True), progress=False)
    assert resumed.metadata["entropy_control"] == full.metadata["entropy_control"]
    assert math.isclose(full.metadata["entropy_control"]["coef"], 4e-3)  # four steps up, all below the target
    coefs = [s.custom_metrics["entropy/coef"] for s in resumed.stats_history]
    assert coefs == [s.custom_metrics["entropy/coef"] for s in full.stats_history]
    for (n, a), b in zip(full.model.named_parameters(), resumed.model.parameters()):
        if "lora_" in n: assert torch.equal(a, b), n


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_the_mask_keeps_every_response_token_in_the_average(setting, aggregation):
    """The paper's (and TRL's top_entropy_quantile) normaliser: the mask multiplies each token's policy loss and the
    average still runs over every response token, so the step is not ~1/rho larger and rows keep their weights."""
    from rlnb.algorithms import compute_grpo_advantages
    from rlnb.core import collate
    from rlnb.logprobs import compute_logprobs_for_tokens
    policy, tok, batch = setting
    got, _ = step_gradient(setting, "grpo", {"aggregation": aggregation},
                           TrainingConfig(entropy_top_fraction=0.3, max_grad_norm=0.0))
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    C = cb.completion_ids.shape[1]
    policy.zero_grad(set_to_none=True)
    with torch.no_grad():
        _, entropy = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, C, return_entropy=True)
    kept = high_entropy_mask(entropy, cb.loss_mask, 0.3)  # (B, C)
    assert 0 < kept.sum() < 0.5 * cb.loss_mask.sum()
    lp = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, C)  # (B, C) with grad
    A = compute_grpo_advantages(cb.rewards, cb.group_ids)[:, None]  # (B, 1)
    ratio = (lp - lp.detach()).exp()
    per_token = -torch.minimum(ratio * A, ratio.clamp(0.8, 1.2) * A) * kept * cb.loss_mask  # (B, C)
    loss = (per_token.sum() / cb.loss_mask.sum() if aggregation == "token_mean"
            else (per_token.sum(1) / cb.loss_mask.sum(1).clamp(min=1)).mean())
    loss.backward()
    params = [p for p in policy.parameters() if p.requires_grad]
    assert got
    for (k, j), g in got.items(): torch.testing.assert_close(g, params[j].grad, rtol=1e-4, atol=1e-7)
    policy.zero_grad(set_to_none=True)
