"""Bounded staleness (`off_policy_steps=k`): up to k batches are sampled ahead in order while the update runs, each
from the weights of k updates before the one that trains on it; the staleness is logged, and a checkpoint keeps every
batch in flight so a resumed run is exact."""
import pytest
import torch

from rlnb.core import create_training_config
from rlnb.training import train

torch.set_num_threads(1)
BASE = dict(num_iterations=6, prompts_per_step=4, group_size=4, max_new_tokens=6, eval_every=0, seed=2,
            lr_schedule="constant", learning_rate=1e-2, off_policy_steps=1)


def lora_weights(state):
    return [p.detach().clone() for p in state.model.parameters() if p.requires_grad]


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
def test_batches_are_k_steps_stale_and_the_lag_is_measured(k):
    rows = []
    config = create_training_config(**{**BASE, "off_policy_steps": k})
    train(config, logger=lambda s, st: rows.append(st.custom_metrics), progress=False)
    assert len(rows) == 6
    # iteration i trains on a batch sampled at max(0, i - k): the first k + 1 from the starting weights
    assert [r["off_policy/staleness"] for r in rows] == [float(min(i, k)) for i in range(6)]
    assert rows[0]["mismatch/ratio_max"] == pytest.approx(1.0, abs=1e-4)  # the first batch: sampled on-policy
    assert all(r["mismatch/kl"] > 0 and r["mismatch/ratio_max"] > 1.001 for r in rows[1:])  # then behind
    assert all("time/sampling_s" in r for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_resume_is_exact_with_batches_in_flight(tmp_path, k):
    "A checkpoint keeps the k batches in flight; the resumed run trains on them first and ends with the same weights."
    base = {**BASE, "off_policy_steps": k}
    whole = train(create_training_config(**base, output_dir=str(tmp_path / "whole"), checkpoint_every=2),
                  progress=False)
    config = create_training_config(**base, output_dir=str(tmp_path / "cut"), checkpoint_every=2)
    cut = train(config, stop_fn=lambda state, metrics: state.iteration == 3, progress=False)
    assert cut.iteration == 3
    resumed = train(config._replace(resume=True), progress=False)
    assert resumed.iteration == 6
    for a, b in zip(lora_weights(whole), lora_weights(resumed)): assert torch.equal(a, b)
    synchronous = train(create_training_config(**{**BASE, "off_policy_steps": 0}), progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(lora_weights(whole), lora_weights(synchronous)))


def test_off_policy_steps_is_bounded():
    create_training_config(off_policy_steps=8)  # prime-rl's largest default lag
    with pytest.raises(ValueError, match="off_policy_steps"): create_training_config(off_policy_steps=9)
    with pytest.raises(ValueError, match="off_policy_steps"): create_training_config(off_policy_steps=-1)
