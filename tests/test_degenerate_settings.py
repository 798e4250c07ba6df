"""Settings under which an algorithm would train on nothing (every advantage or every token's weight 0) are refused
before anything loads, naming the setting; the spec's `check_config` says which."""
import re

import pytest
import torch

import rlnb.training as training
from rlnb.algorithms import get_algorithm_config
from rlnb.core import TrainingConfig
from rlnb.training import train

RUN = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


@pytest.mark.parametrize("algorithm, options, message", [
    ("dppo", {"ratio_cap": 0.0}, "`ratio_cap`=0.0 caps every token's weight"),
    ("dppo", {"ratio_cap": -1.0}, "`ratio_cap`=-1.0"),
    ("opd", {"teacher_coef": 0.0}, "`teacher_coef`=0 multiplies every advantage by 0"),
    ("grpo_passk", {"k": 4}, "`k`=4 with group_size=4"),
    ("gdpo", {"weights": [0.0, 0.0]}, "`weights`=[0.0, 0.0] are all 0"),
])
def test_a_setting_that_trains_nothing_is_refused_before_anything_loads(monkeypatch, algorithm, options, message):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        train(TrainingConfig(algorithm=algorithm, algorithm_options=options, teacher="tiny" if algorithm == "opd"
                             else None, **RUN), progress=False)


def test_a_schedule_is_checked_at_every_iteration(monkeypatch):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    schedule = lambda it: get_algorithm_config(it, {0: "grpo", 1: {"name": "grpo_passk", **_passk(k=4)}})
    with pytest.raises(ValueError, match="`k`=4 with group_size=4"):
        train(TrainingConfig(**RUN), algorithm_config=schedule, progress=False)


def _passk(**changes):
    from rlnb.algorithms import create_algorithm_config
    return {k: v for k, v in create_algorithm_config("grpo_passk", **changes).items() if k != "name"}


@pytest.mark.parametrize("algorithm, options, message", [
    ("ppo", {"whiten": "False"}, "`whiten` of 'ppo' must be True or False"),  # a truthy string: whitening stayed on
    ("grpo", {"clip_eps": "0.2"}, "`clip_eps` of 'grpo' must be a number"),
    ("grpo", {"aggregation": 1}, "`aggregation` of 'grpo' must be a str"),
])
def test_a_knob_of_another_kind_than_its_default_is_refused(algorithm, options, message):
    with pytest.raises(TypeError, match=message):
        train(TrainingConfig(algorithm=algorithm, algorithm_options=options, **RUN), progress=False)


@pytest.mark.parametrize("algorithm, options, message", [
    ("grpo", {"clip_eps": 1.0}, "grpo: `clip_eps`=1.0 must be in [0, 1): the ratio is clipped below at 1 - clip_eps"),
    ("grpo", {"clip_eps": 1e6}, "`clip_eps`=1000000.0 must be in [0, 1)"),
    ("dr_grpo", {"clip_eps": -0.1}, "every token with A < 0 would get no gradient"),
    ("dapo", {"clip_eps_high": -0.1}, "dapo: `clip_eps_high`=-0.1 must be >= 0"),
    ("grpo", {"log_ratio_clip": 0.0}, "grpo: `log_ratio_clip`=0.0 must be > 0"),
    ("ppo", {"clip_eps": 2.0}, "ppo: `clip_eps`=2.0"),
    ("gspo", {"clip_eps_high": -1e-4}, "gspo: `clip_eps_high`=-0.0001"),
    ("rloo", {"clip_eps": 1.0}, "rloo: `clip_eps`=1.0"),
    ("reinforce++", {"clip_eps": 1.0}, "reinforce++: `clip_eps`=1.0"),
    ("clip_cov", {"log_ratio_clip": -1.0}, "clip_cov: `log_ratio_clip`=-1.0"),
    ("maxrl", {"clip_eps": 1.0}, "maxrl: `clip_eps`=1.0"),
    ("remax", {"clip_eps": 1.0}, "remax: `clip_eps`=1.0"),
    ("gdpo", {"clip_eps": 1.0}, "gdpo: `clip_eps`=1.0"),
    ("grpo_passk", {"k": 2, "clip_eps": 1.0}, "grpo_passk: `clip_eps`=1.0"),
    ("opd", {"log_ratio_clip": 0.0}, "opd: `log_ratio_clip`=0.0"),
])
def test_a_clip_that_clips_nothing_or_leaves_no_gradient_is_refused_up_front(monkeypatch, algorithm, options, message):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=re.escape(message)):
        train(TrainingConfig(algorithm=algorithm, algorithm_options=options, teacher="tiny" if algorithm == "opd"
                             else None, **RUN), progress=False)


@pytest.mark.parametrize("run, message", [
    (dict(rollout_correction="tis_token", rollout_correction_cap=0.5), "`rollout_correction_cap`=0.5 gives weight 0.5"),
    (dict(rollout_correction="tis_seq", rollout_correction_cap=0.99), "`rollout_correction_cap`=0.99 gives weight"),
    (dict(rollout_correction="mis_token", rollout_correction_cap=0.5), "`rollout_correction_cap`=0.5 drops a token"),
    (dict(rollout_correction="mis_seq", rollout_correction_cap=0.9), "nothing would train"),
    (dict(rollout_correction="icepop", rollout_correction_low=1.2, rollout_correction_high=3.0),
     "mode 'icepop' with `rollout_correction_low`=1.2, `rollout_correction_high`=3.0 drops a token"),
    (dict(rollout_correction="geo_rs", rollout_correction_low=0.1, rollout_correction_high=0.9),
     "mode 'geo_rs' with `rollout_correction_low`=0.1, `rollout_correction_high`=0.9 drops a token"),
])
def test_a_correction_that_drops_or_scales_on_policy_tokens_is_refused_up_front(monkeypatch, run, message):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        train(TrainingConfig(**{**RUN, **run}), progress=False)


def test_corrections_that_keep_an_on_policy_token_are_accepted():
    from rlnb.rollout_corrections import check_rollout_correction
    for mode in ("none", "tis_token", "tis_seq", "mis_token", "mis_seq"): check_rollout_correction(mode, cap=1.0)
    for mode in ("icepop", "geo_rs"): check_rollout_correction(mode, cap=0.1, low=1.0, high=1.5)  # cap unused


def test_a_group_relative_algorithm_later_in_a_schedule_refuses_groups_of_one(monkeypatch):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    schedule = lambda it: get_algorithm_config(it, {0: "reinforce", 1: "grpo"})
    with pytest.raises(ValueError, match="`group_size`=1 with 'grpo': each completion is compared"):
        train(TrainingConfig(**{**RUN, "group_size": 1}), algorithm_config=schedule, progress=False)


def test_dpo_with_beta_0_is_refused_before_anything_loads(monkeypatch):
    monkeypatch.setattr(training, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match="dpo: `beta`=0 makes the loss the constant log 2"):
        train(TrainingConfig(algorithm="dpo", beta=0.0, **RUN), progress=False)


@pytest.mark.parametrize("value", [0, -5, 2.5, True])
def test_a_max_completion_length_that_is_no_length_is_refused_for_every_algorithm(value):
    from rlnb.algorithms import ALGORITHMS, create_algorithm_config
    for name, spec in ALGORITHMS.items():
        if "max_completion_length" not in spec.default_config: continue
        with pytest.raises(TypeError, match="`max_completion_length` .* must be an int >= 1"):
            create_algorithm_config(name, max_completion_length=value)


@pytest.mark.parametrize("name, knob, value", [("ppo", "value_fn", 5), ("dpo", "pair_selector", 5),
                                               ("reinforce", "baseline_fn", "mean"), ("dppo", "ratio_cap", "1"),
                                               ("gdpo", "weights", "1,1")])
def test_a_knob_whose_default_is_none_refuses_what_it_cannot_use(name, knob, value):
    from rlnb.algorithms import create_algorithm_config
    with pytest.raises(TypeError, match=f"`{knob}` of '{name}' must be"):
        create_algorithm_config(name, **{knob: value})


@pytest.mark.parametrize("ratio", [1.5, 0.0])
def test_a_clip_cov_share_outside_0_1_is_refused(ratio):
    from rlnb.policy_losses import compute_clip_cov_advantages
    lp, mask = torch.zeros(4, 3), torch.ones(4, 3)
    with pytest.raises(ValueError, match=r"`clip_cov_ratio`=.* must be in \(0, 1\]"):
        compute_clip_cov_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), old_logprobs=lp,
                                    loss_mask=mask, clip_cov_ratio=ratio)
