"""Settings under which an algorithm would train on nothing (every advantage or every token's weight 0) are refused
before anything loads, naming the setting; the spec's `check_config` says which."""
import pytest

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
