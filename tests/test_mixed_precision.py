"Mixed precision (TrainingConfig.mixed_precision='bf16'): the update's forwards in bf16 autocast, float32 elsewhere."
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rlnb.training as training
from rlnb.algorithms import create_algorithm_config
from rlnb.core import TrainingConfig, TrainingState, create_training_config
from rlnb.kl import create_reference_model
from rlnb.logprobs import (AUTO_BF16_MAX_TIME, bf16_time_ratio, choose_mixed_precision, compute_logprobs_for_tokens,
                           precision_context)
from rlnb.step import create_optimizer, default_optimizer_step, training_step
from rlnb.training import train
from test_micro_batches import GROUP, accumulated_grads, setting  # noqa: F401  (`setting`: its fixture)
from learnable import first_and_last, learnable_run, lora_policy

torch.set_num_threads(1)
MATMULS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm}


class MatmulDtypes(TorchDispatchMode):
    "While active, count the matrix products that run, by the dtype they run in (after autocast's casts)."
    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in MATMULS: self.counts[out.dtype] += 1
        return out


def step_grads(setting, mixed_precision: str, micro_batch_size=None, name="grpo", options=None) -> tuple[dict, float]:
    "The gradients one training_step accumulates (captured instead of stepping), and its loss."
    metrics = {}
    grads = accumulated_grads(setting, name, options or {}, micro_batch_size, metrics, mixed_precision=mixed_precision)
    return grads, metrics["loss/total"]


def relative_difference(a: dict, b: dict) -> float:
    "|a - b| / |b| over all the gradients together."
    flat = lambda g: torch.cat([v.flatten() for v in g.values()])
    return float((flat(a) - flat(b)).norm() / flat(b).norm())


CASES = [("grpo", {"beta": 0.04}), ("ppo", {})]  # a reference pass; old log-probs and values from the value head


@pytest.mark.parametrize("name,options", CASES, ids=[n for n, _ in CASES])
def test_bf16_gradients_are_close_to_float32_but_not_equal(setting, name, options):
    fp32, loss32 = step_grads(setting, "no", name=name, options=options)
    bf16, loss16 = step_grads(setting, "bf16", name=name, options=options)
    assert fp32.keys() == bf16.keys() and fp32
    assert all(g.dtype == torch.float32 for g in bf16.values())
    relative = relative_difference(bf16, fp32)
    # measured: 1.9% (grpo, beta 0.04) and 1.4% (ppo) of the gradient's norm: bf16 keeps 8 bits of mantissa (~3
    # significant digits) in every matrix product, forward and backward, and the errors add up over the layers
    assert 0 < relative < 0.05, relative
    assert any(not torch.equal(bf16[k], fp32[k]) for k in fp32), "autocast changed nothing: it did not act"
    assert loss16 == pytest.approx(loss32, abs=1e-2)


def test_bf16_runs_the_updates_matrix_products_in_bf16(setting):
    counts = {}
    for mode in ("no", "bf16"):
        with MatmulDtypes() as seen: step_grads(setting, mode, name="grpo", options={"beta": 0.04})
        counts[mode] = seen.counts
    assert set(counts["no"]) == {torch.float32}, counts["no"]
    # the forward and backward products of the policy and reference passes: measured, all 246 of them in bf16
    total = counts["no"][torch.float32]
    assert sum(counts["bf16"].values()) == total and counts["bf16"][torch.bfloat16] >= 0.9 * total, counts["bf16"]


@pytest.mark.slow
def test_micro_batched_bf16_gradients_equal_the_full_batch_ones(setting):
    """Gradient accumulation is exact up to one bf16 rounding of each micro-batch's weight gradient.

    A weight's gradient is a matrix product over the rows (x^T dy); under autocast its result is rounded to bf16 once
    for the whole batch, or once per micro-batch before the float32 `.grad` adds them up. So the micro-batched gradient
    differs from the full-batch one by about bf16's resolution (2^-8 = 0.4%), where float32's test (test_micro_batches)
    allows rtol 1e-4 and measures ~1e-6. Measured: 0.36% (grpo) and 0.32% (ppo), a fifth of the bf16 vs float32 gap."""
    for name, options in CASES:
        full, _ = step_grads(setting, "bf16", None, name, options)
        micro, _ = step_grads(setting, "bf16", GROUP, name, options)
        assert full.keys() == micro.keys()
        between = relative_difference(micro, full)
        assert between < 0.01, (name, between)
        assert between < 0.5 * relative_difference(full, step_grads(setting, "no", None, name, options)[0]), name


def test_weights_gradients_and_optimizer_state_stay_float32(setting):
    policy, tok, batch = setting
    for name in ("grpo", "ppo"):
        opt, _ = create_optimizer(policy, learning_rate=1e-4)
        state = TrainingState(0, 0, policy, opt, None, ref_model=create_reference_model(policy))
        grads = []
        def step(state, max_grad_norm):
            grads.extend(p.grad.dtype for p in state.optimizer.param_groups[0]["params"] if p.grad is not None)
            return default_optimizer_step(state, max_grad_norm)
        state, _ = training_step(state, batch, create_algorithm_config(name), optimizer_step_fn=step,
                                 tokenizer=tok,
                                 config=TrainingConfig(mixed_precision="bf16"))
        assert grads and set(grads) == {torch.float32}
        assert {p.dtype for p in policy.parameters()} == {torch.float32}
        moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        assert moments and {v.dtype for v in moments} == {torch.float32}
        if name == "ppo": assert {p.dtype for p in state.value_head.parameters()} == {torch.float32}


@pytest.mark.slow
def test_train_reads_mixed_precision_from_the_config(monkeypatch):
    "`train` autocasts its update's products (sampling stays float32), and loads float32 weights for 'auto'."
    dtypes = []
    real_load = training.load_model
    monkeypatch.setattr(training, "load_model", lambda mc: (dtypes.append(mc.dtype), real_load(mc))[1])
    counts = {}
    for mode in ("no", "bf16"):
        with MatmulDtypes() as seen:
            train(create_training_config(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=4,
                                         eval_every=0, mixed_precision=mode), progress=False)
        counts[mode] = seen.counts
    assert torch.bfloat16 not in counts["no"] and counts["bf16"][torch.bfloat16] > 0
    assert dtypes == ["auto", "float32"]


def test_config_refusals():
    with pytest.raises(ValueError, match="`mixed_precision` must be one of"):
        create_training_config(mixed_precision="fp16")
    with pytest.raises(ValueError, match="`mixed_precision`='bf16' keeps float32 weights.*dtype='bfloat16'"):
        create_training_config(mixed_precision="bf16", dtype="bfloat16")
    create_training_config(mixed_precision="bf16", dtype="float32")  # the pair that makes sense
    with pytest.raises(ValueError, match="mixed_precision='bf16' needs bf16 autocast, which the 'meta' device"):
        precision_context("bf16", "meta")
    with pytest.raises(ValueError, match="precision_context: `mode`"):
        precision_context("bfloat16", "cpu")


def test_logprobs_stay_float32_under_autocast(setting):
    policy, tok, batch = setting
    from rlnb.core import collate
    cb = collate(batch.rollouts, tok.pad_token_id, tok.eos_token_id)
    C = cb.completion_ids.shape[1]
    with torch.no_grad():
        lp32 = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, C)
        with precision_context("bf16", "cpu"):
            lp16, ent16 = compute_logprobs_for_tokens(policy, cb.input_ids, cb.attention_mask, C, return_entropy=True)
    assert lp16.dtype == ent16.dtype == torch.float32
    gap = (lp16 - lp32)[cb.completion_mask.bool()].abs()
    assert 0 < float(gap.mean()) < 0.05, float(gap.mean())


@pytest.mark.slow
def test_grpo_learns_a_learnable_reward_under_bf16():
    "tests/learnable.py's reward ('starts with 1'), with the update in bf16: the mean reward climbs as in float32."
    state, tok = lora_policy(lr=3e-3)
    rows, _ = learnable_run(state, tok, mixed_precision="bf16")
    first, last = first_and_last(rows)
    print(f"reward 'starts with 1' under bf16: {first:.2f} -> {last:.2f}")
    assert last >= first + 0.3 and last >= 0.85, (first, last)


def tiny_run(tmp_path, **changes):
    "A 2-iteration tiny run in tmp_path/run (a checkpoint at the end); its final state."
    settings = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=4, eval_every=0)
    return train(create_training_config(**{**settings, **changes}, output_dir=str(tmp_path / "run")), progress=False)


def test_auto_is_made_concrete_once_and_recorded(tmp_path, monkeypatch):
    "'auto' (the default) is decided once per run, recorded in the run's config, and a resumed run keeps its choice."
    assert TrainingConfig().mixed_precision == "auto"
    state = train(create_training_config(num_iterations=1, prompts_per_step=2, group_size=4, max_new_tokens=4,
                                         eval_every=0), progress=False)
    assert state.metadata["config"].mixed_precision == "no"  # the tiny model: under SMALL_MODEL_PARAMS, not timed
    asked = []
    def choose(model, mode, min_params):  # what the measurement said on this machine, replaced: either answer
        asked.append(mode)
        return answer
    monkeypatch.setattr(training, "choose_mixed_precision", choose)
    answer = "bf16"
    with MatmulDtypes() as seen:
        state = tiny_run(tmp_path)
    assert state.metadata["config"].mixed_precision == "bf16" and seen.counts[torch.bfloat16] > 0
    answer = "no"  # a resumed run is not measured again: it keeps the checkpoint's choice
    state = tiny_run(tmp_path, num_iterations=3, resume=True)
    assert asked == ["auto"] and state.global_step == 3 and state.metadata["config"].mixed_precision == "bf16"
    answer = "no"  # a setting that is not "auto" is not measured either
    assert tiny_run(tmp_path / "other", mixed_precision="bf16").metadata["config"].mixed_precision == "bf16"
    assert asked == ["auto"]


def test_auto_takes_bf16_only_if_every_process_measured_it_faster(setting, monkeypatch):
    policy, _, _ = setting
    class Processes:  # the seam's hook the choice uses: whether any process measured bf16 no faster
        def __init__(self, any_slower: bool): self.any_slower = any_slower
        def any_rank(self, flag): return bool(flag) or self.any_slower
    monkeypatch.setattr(training, "choose_mixed_precision", lambda model, mode, min_params: "bf16")  # this process
    state = TrainingState(0, 0, policy, None, None, metadata={})
    hooks = {"generator": None, "rollout_fn": None}
    for any_slower, expected in ((True, "no"), (False, "bf16")):
        config, chosen = training._chosen_settings(TrainingConfig(), state, None, Processes(any_slower), hooks, [],
                                                   False, "train")
        assert config.mixed_precision == expected == chosen.metadata["config"].mixed_precision


def test_choose_mixed_precision_measures_only_float32_models_over_the_threshold(setting):
    policy, _, _ = setting
    ratio = bf16_time_ratio(policy.config.hidden_size)
    assert ratio > 0 and ratio == bf16_time_ratio(policy.config.hidden_size)  # cached: one answer per process
    assert choose_mixed_precision(policy, "auto", 0) == ("bf16" if ratio < AUTO_BF16_MAX_TIME else "no")
    assert choose_mixed_precision(policy, "auto", 10**12) == "no"
    assert choose_mixed_precision(policy, "no", 0) == "no" and choose_mixed_precision(policy, "bf16", 10**12) == "bf16"
    with pytest.raises(ValueError, match="'auto' is made one of them by choose_mixed_precision"):
        precision_context("auto", "cpu")
