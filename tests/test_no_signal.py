"""A step whose batch carries nothing to learn from (every advantage 0, or an empty loss mask) says so once per run
and records `advantage/nonzero_frac` at every step; a run that learns says nothing."""
import warnings

import pytest

from rlnb.core import TrainingConfig
from rlnb.training import train

SMALL = dict(num_iterations=3, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


def said(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = run()
    return state, [str(w.message) for w in caught if "trains on nothing" in str(w.message)]


@pytest.mark.slow
def test_equal_rewards_everywhere_are_said_once_and_recorded_at_every_step():
    state, messages = said(lambda: train(TrainingConfig(**SMALL), reward_fn=lambda rollout: 1.0, progress=False))
    assert len(messages) == 1, messages
    assert "training_step: iteration 0 trains on nothing: every advantage is 0" in messages[0]
    assert [s.custom_metrics["advantage/nonzero_frac"] for s in state.stats_history] == [0.0, 0.0, 0.0]
    assert state.metadata["said_no_signal"] is True


@pytest.mark.slow
def test_a_run_with_a_signal_says_nothing_and_records_its_share():
    state, messages = said(lambda: train(TrainingConfig(**SMALL), progress=False))
    assert messages == []
    shares = [s.custom_metrics["advantage/nonzero_frac"] for s in state.stats_history]
    assert all(0 < x <= 1 for x in shares), shares
