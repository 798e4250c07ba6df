"""The 2025-2026 baselines (rlnb.baselines): REINFORCE++-baseline, OPO, GPG, Lite PPO, OTB and the aggregation
sequence_mean_token_sum, by hand, against loops and against the reference libraries' formulas (verl's core_algos,
TRL's GRPOTrainer), written here in a few lines each; in training runs; their errors."""
import math

import pytest
import torch

from rlnb.algorithms import (ALGORITHMS, aggregate_loss, compute_batch_advantages, create_algorithm_config, grpo_loss)
from rlnb.baselines import (check_baseline_config, compute_gpg_advantages, compute_opo_advantages,
                            compute_otb_advantages, compute_reinforce_pp_baseline_advantages, compute_sum_pi_squared)
from rlnb.catalogue import reinforce_loss
from rlnb.core import Rollout, collate, create_training_config
from rlnb.tiny import load_tiny_model
from rlnb.training import train
from test_micro_batches import accumulated_grads, setting  # noqa: F401 (a fixture)

torch.set_num_threads(1)
KEYS = ("reinforce++_baseline", "opo", "gpg", "lite_ppo", "otb")
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


def random_batch(seed=0, B=12, C=7, groups=3):
    "Rewards with ties, group labels in any order, a loss mask of rows of different lengths (one empty row)."
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (B,), generator=g).float()
    ids = torch.randint(0, groups, (B,), generator=g)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C) < lengths[:, None]).float()
    return r, ids, mask


# --- the references' formulas, from verl's verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py ------

def verl_rpp_baseline(scores, response_mask, index):
    "compute_reinforce_plus_plus_baseline_outcome_advantage: group mean (0 for a group of one), masked_whiten."
    means = [torch.stack([scores[j] for j in range(len(scores)) if index[j] == index[i]]).mean()
             if (index == index[i]).sum() > 1 else 0.0 for i in range(len(scores))]  # all taken before subtracting
    scores = scores - torch.tensor([float(m) for m in means])
    tok = scores[:, None] * response_mask  # (B, C)
    mean = (tok * response_mask).sum() / (response_mask.sum() + 1e-8)
    var = ((tok - mean) ** 2 * response_mask).sum() / (response_mask.sum() + 1e-8)
    var = var * response_mask.sum() / (response_mask.sum() - 1)
    return (tok - mean) * torch.rsqrt(var + 1e-8) * response_mask  # (B, C)


def verl_opo(scores, response_mask, index):
    "compute_opo_outcome_advantage: the group's length-weighted mean score (0 for a group of one)."
    L = response_mask.sum(-1)
    out = scores.clone()
    for i in range(len(scores)):
        js = [j for j in range(len(scores)) if index[j] == index[i]]
        base = (L[js] * scores[js]).sum() / L[js].sum() if len(js) > 1 else 0.0
        out[i] = scores[i] - base
    return out[:, None] * response_mask


def verl_gpg(scores, response_mask, index, f_norm=1.0):
    "compute_gpg_outcome_advantage: alpha = bsz / count_nonzero(scores), alpha (score - group mean) / f_norm."
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    out = scores.clone()
    for i in range(len(scores)):
        js = [j for j in range(len(scores)) if index[j] == index[i]]
        out[i] = alpha * (scores[i] - (scores[js].mean() if len(js) > 1 else 0.0)) / f_norm
    return out[:, None] * response_mask


def verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, epsilon=1e-8):
    "compute_optimal_token_baseline_advantage without IS weights or the zero tail: per-position weighted baseline."
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    w = (1 - 2 * old_log_probs.exp() + sum_pi_squared) * response_mask
    W = w.cumsum(-1)
    base = torch.zeros_like(returns)
    for g in set(index.tolist()):
        js = torch.tensor([j for j in range(len(index)) if index[j] == g])
        if len(js) == 1: continue
        num = (returns[js] * W[js] * response_mask[js]).sum(0)
        den = (W[js] * response_mask[js]).sum(0) + epsilon
        base[js] = (num / den)[None].expand(len(js), -1)
    return (returns - base) * response_mask


def verl_agg_seq_mean_token_sum(loss_mat, loss_mask):
    "agg_loss(loss_agg_mode='seq-mean-token-sum'): token sums, mean over the sequences that have a token."
    seq = (loss_mat * loss_mask).sum(-1)
    seq_mask = (loss_mask.sum(-1) > 0).float()
    return (seq * seq_mask).sum() / seq_mask.sum()


def outcome_rewards(r, mask):
    "verl's token_level_rewards: the score on each row's last valid token."
    out = torch.zeros_like(mask)
    last = mask.sum(1).long() - 1
    for i in range(len(r)):
        if last[i] >= 0: out[i, last[i]] = r[i]
    return out


def trl_batch_scaled(rewards, num_generations):
    "TRL GRPOTrainer, scale_rewards='batch': reward minus its group's mean, over the batch std + 1e-4."
    mean = rewards.view(-1, num_generations).mean(1).repeat_interleave(num_generations)
    return (rewards - mean) / (rewards.std().expand_as(rewards) + 1e-4)


# --- by hand, loops and references ----------------------------------------------------------------------------------

def test_registered():
    for key in KEYS: assert key in ALGORITHMS and ALGORITHMS[key].check_config is check_baseline_config
    assert ALGORITHMS["gpg"].policy_loss is reinforce_loss
    assert ALGORITHMS["otb"].needs_old_logprobs and ALGORITHMS["otb"].prepare_batch is not None
    assert all(create_algorithm_config(k)["aggregation"] == "token_mean" for k in KEYS)


def test_reinforce_pp_baseline_by_hand_and_verl():
    r, ids = torch.tensor([1., 0, 0, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    torch.testing.assert_close(compute_reinforce_pp_baseline_advantages(r, ids),
                               torch.tensor([1.620, -.540, -.540, -.540, .540, .540, .540, -1.620]), atol=1e-3, rtol=0)
    for seed in range(3):
        r, ids, mask = random_batch(seed)
        ours = compute_reinforce_pp_baseline_advantages(r, ids, mask)[:, None] * mask
        torch.testing.assert_close(ours, verl_rpp_baseline(r, mask, ids), atol=1e-5, rtol=1e-5)


def test_opo_by_hand_and_verl():
    mask = (torch.arange(8) < torch.tensor([2, 4, 6, 8])[:, None]).float()
    torch.testing.assert_close(compute_opo_advantages(torch.tensor([1., 0, 1, 0]), None, mask),
                               torch.tensor([0.6, -0.4, 0.6, -0.4]))
    for seed in range(3):
        r, ids, mask = random_batch(seed)
        torch.testing.assert_close(compute_opo_advantages(r, ids, mask)[:, None] * mask, verl_opo(r, mask, ids))
    # a group of one keeps its reward, as in verl
    assert compute_opo_advantages(torch.tensor([2., 1, 0]), torch.tensor([0, 1, 1])).tolist() == [2.0, 0.5, -0.5]


def test_gpg_by_hand_and_verl():
    r, ids = torch.tensor([1., 0, 0, 0, 0, 0, 0, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert compute_gpg_advantages(r, ids).tolist() == [6.0, -2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    for seed in range(3):
        r, ids, mask = random_batch(seed)
        for f_norm in (1.0, 2.5):
            torch.testing.assert_close(compute_gpg_advantages(r, ids, f_norm)[:, None] * mask,
                                       verl_gpg(r, mask, ids, f_norm))


def test_gpg_loss_is_verls_and_its_gradient():
    "verl's compute_policy_loss_gpg: agg_loss(-log_prob * advantages, token-mean); autograd: -A m / N per token."
    r, ids, mask = random_batch(4)
    adv = compute_gpg_advantages(r, ids)
    lp = (-torch.rand(mask.shape, generator=torch.Generator().manual_seed(5))).requires_grad_()
    loss, _ = reinforce_loss(lp, lp.detach() - 0.3, adv, mask)  # old log-probs are not read: no ratio, no clip
    torch.testing.assert_close(loss, (-lp * adv[:, None] * mask).sum() / mask.sum())
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv[:, None] * mask / mask.sum())


def test_lite_ppo_against_trl_batch_scaling():
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        r = torch.randint(0, 3, (16,), generator=g).float()
        cb = collate([Rollout("p", prompt_token_ids=[1], token_ids=[2, 3], rewards=x, group_index=i // 4)
                      for i, x in enumerate(r.tolist())], pad_token_id=0)
        ours = compute_batch_advantages(cb, create_algorithm_config("lite_ppo")).advantages
        torch.testing.assert_close(ours, trl_batch_scaled(r, 4), atol=1e-5, rtol=1e-5)
    r = torch.tensor([1., 0, 0, 0, 1, 1, 1, 0])
    torch.testing.assert_close(trl_batch_scaled(r, 4)[:2], torch.tensor([1.403, -0.468]), atol=1e-3, rtol=0)


def test_otb_by_hand_and_verl():
    mask = torch.tensor([[1., 1, 0], [1, 1, 1]])
    old = torch.tensor([[0.5, 0.5, 1.0], [0.5, 0.25, 1.0]]).log()
    spsq = torch.tensor([[0.5, 0.5, 1.0], [0.5, 0.25, 1.0]])
    torch.testing.assert_close(compute_otb_advantages(torch.tensor([1., 0]), None, mask, old, spsq),
                               torch.tensor([[0.5, 5 / 9, 0], [-0.5, -4 / 9, 0]]), atol=1e-6, rtol=0)
    for seed in range(3):
        r, ids, mask = random_batch(seed)
        g = torch.Generator().manual_seed(10 + seed)
        old = torch.rand(mask.shape, generator=g).clamp(min=0.01).log()
        spsq = torch.maximum(old.exp() ** 2, torch.rand(mask.shape, generator=g))
        torch.testing.assert_close(compute_otb_advantages(r, ids, mask, old, spsq),
                                   verl_otb(outcome_rewards(r, mask), mask, ids, old, spsq), atol=1e-5, rtol=1e-5)


def test_sum_pi_squared_is_the_softmax_square_sum():
    model, tok = load_tiny_model("addition", progress=False)
    rs = [Rollout("p", prompt_token_ids=tok(p)["input_ids"], token_ids=tok(t)["input_ids"], rewards=0.0)
          for p, t in (("12+7=", "19"), ("3+4=", "7"), ("100+1=", "10"))]  # different prompt and completion lengths
    cb = collate(rs, tok.pad_token_id)
    got = compute_sum_pi_squared(model, cb.input_ids, cb.attention_mask, cb.completion_ids.shape[1], 0.7, 2)
    with torch.no_grad():
        for i, r in enumerate(rs):
            seq = torch.tensor(r.prompt_token_ids + r.token_ids)[None]
            z = model(input_ids=seq).logits[0, len(r.prompt_token_ids) - 1:-1].float() / 0.7
            torch.testing.assert_close(got[i, :len(r.token_ids)], (z.softmax(-1) ** 2).sum(-1), atol=1e-5, rtol=1e-5)


def test_otb_prepare_batch_scores_at_the_runs_temperature():
    from rlnb.baselines import prepare_otb_batch
    from rlnb.core import TrainingConfig, TrainingState
    model, tok = load_tiny_model("addition", progress=False)
    cb = collate([Rollout("p", prompt_token_ids=tok("2+2=")["input_ids"], token_ids=tok(t)["input_ids"], rewards=0.0)
                  for t in ("4", "22")], tok.pad_token_id)
    state = TrainingState(0, 0, model, None, None, metadata={"config": TrainingConfig(temperature=0.7)})
    got = prepare_otb_batch(state, cb).sum_pi_squared
    C = cb.completion_ids.shape[1]
    torch.testing.assert_close(got, compute_sum_pi_squared(model, cb.input_ids, cb.attention_mask, C, 0.7))
    assert not torch.allclose(got, compute_sum_pi_squared(model, cb.input_ids, cb.attention_mask, C, 1.0))


def test_sequence_mean_token_sum_by_hand_verl_and_gradient():
    mask = torch.tensor([[1., 1, 0], [1, 1, 1]])
    loss_tok = torch.tensor([[1., 2, 99], [3, 4, 5]], requires_grad=True)
    out = aggregate_loss(loss_tok, mask, "sequence_mean_token_sum")
    assert out.item() == pytest.approx((3 + 12) / 2)
    out.backward()
    torch.testing.assert_close(loss_tok.grad, mask / 2)  # every token weighs 1/B
    for seed in range(3):
        _, _, m = random_batch(seed)
        m[m.sum(1) == 0] = 1  # verl divides by the rows with a token, rlnb by all rows: the same without empty rows
        lt = torch.randn(m.shape, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(aggregate_loss(lt, m, "sequence_mean_token_sum"), verl_agg_seq_mean_token_sum(lt, m))
    lp, adv = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]]), torch.tensor([1.0, -1.0])
    loss, _ = grpo_loss(lp, lp, adv, torch.tensor([[1., 1], [1, 0]]), aggregation="sequence_mean_token_sum")
    assert loss.item() == pytest.approx((-2 + 1) / 2)


SUMS = {"aggregation": "sequence_mean_token_sum"}


@pytest.mark.parametrize("name,options", [(k, {}) for k in KEYS] + [("grpo", SUMS), ("gpg", SUMS), ("otb", SUMS)])
def test_micro_batches_give_the_full_batch_gradient(setting, name, options):  # noqa: F811
    full = accumulated_grads(setting, name, options, None)
    for size in (3, 4):
        micro = accumulated_grads(setting, name, options, size)
        assert full and full.keys() == micro.keys() and any(g.abs().sum() > 0 for g in full.values())
        for k in full: torch.testing.assert_close(micro[k], full[k], rtol=1e-4, atol=1e-6)


# --- errors -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,knob,value,match", [
    ("reinforce++_baseline", "eps", -1e-8, "`eps` must be a finite number >= 0"),
    ("otb", "eps", math.nan, "`eps` must be a finite number >= 0"),
    ("gpg", "f_norm", 0.0, "`f_norm`=0.0 must be a finite number > 0"),
    ("gpg", "f_norm", math.inf, "`f_norm`=inf must be a finite number > 0"),
    ("opo", "clip_eps", 1.5, "`clip_eps`=1.5 must be in \\[0, 1\\)"),
    ("lite_ppo", "aggregation", "seq-mean-token-sum", "`aggregation`='seq-mean-token-sum'"),
])
def test_train_refuses_bad_knobs_before_loading(name, knob, value, match, monkeypatch):
    import rlnb.training
    monkeypatch.setattr(rlnb.training, "load_model", lambda *a, **k: pytest.fail("loaded a model"), raising=False)
    with pytest.raises(ValueError, match=match):
        train(create_training_config(**SMALL, algorithm=name, algorithm_options={knob: value}), progress=False)


def test_wrong_kinds_and_missing_fields():
    with pytest.raises(TypeError, match="`f_norm` of 'gpg' must be a number"):
        create_algorithm_config("gpg", f_norm="1")
    with pytest.raises(ValueError, match="`loss_mask` must be a \\(2, C\\) tensor"):
        compute_opo_advantages(torch.ones(2), None, torch.ones(3, 4))
    with pytest.raises(ValueError, match="no `old_logprobs`"):
        compute_otb_advantages(torch.ones(2), None, torch.ones(2, 3))
    with pytest.raises(ValueError, match="no `sum_pi_squared`.*prepare_otb_batch"):
        compute_otb_advantages(torch.ones(2), None, torch.ones(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="`f_norm`=0"):
        compute_gpg_advantages(torch.ones(2), None, f_norm=0)


# --- in training runs -------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_runs_by_name_and_switches_from_grpo(key):
    seen = []
    state = train(create_training_config(**SMALL, algorithm=key), progress=False,
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]))
    assert state.global_step == 2 and seen == [key, key]
    names, seen = ["grpo", key], []
    state = train(create_training_config(**SMALL), algorithm_config=lambda it: create_algorithm_config(names[it]),
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert state.global_step == 2 and seen == names


@pytest.mark.slow
def test_each_key_runs_in_the_papermill_notebook(tmp_path):
    "The experiment notebook takes each key by name (and a knob as algorithm_options), two iterations each."
    import json
    from pathlib import Path

    import papermill as pm
    root = Path(__file__).resolve().parent.parent
    for name in KEYS:
        out = tmp_path / name
        options = {"f_norm": 2.0} if name == "gpg" else {"aggregation": "sequence_mean_token_sum"}
        pm.execute_notebook(str(root / "nbs" / "experiments" / "grpo_training.ipynb"), str(tmp_path / f"{name}.ipynb"),
                            cwd=str(root), progress_bar=False,
                            parameters=dict(output_dir=str(out), algorithm=name, algorithm_options=options,
                                            num_iterations=2, prompts_per_step=4, eval_every=0, seed=0))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["algorithm"] for r in rows if "reward/mean" in r] == [name, name], name
