"""generator='auto' (the default): the first FAST_SAMPLERS entry that can sample a real model here, else transformers;
rollout_correction='auto' follows it: token-level TIS for another sampler than the policy, else none."""
import pytest
import torch

import rlnb.step as step
import rlnb.training as training
from rlnb.core import create_training_config
from rlnb.generation import batch_generate
from rlnb.training import train

torch.set_num_threads(1)
SMALL = dict(num_iterations=1, prompts_per_step=2, group_size=4, max_new_tokens=4, eval_every=0, mixed_precision="no")


def counting(calls: list):
    "A generator hook: transformers' sampling with its log-probs (as an engine's), each call's prompts in `calls`."
    def generator(model, tokenizer, prompts, config):
        calls.append(len(prompts))
        return batch_generate(model, tokenizer, prompts, config._replace(logprobs=True))
    return generator


@pytest.fixture
def counted(monkeypatch) -> list:
    "A fast sampler 'counted' registered as the vLLM engine registers itself, behind one that cannot run here."
    calls = []
    monkeypatch.setitem(training.SAMPLERS, "counted", lambda config: counting(calls))
    monkeypatch.setattr(training, "FAST_SAMPLERS", {"unavailable": lambda m: False, "counted": lambda m: True})
    return calls


def test_the_tiny_model_samples_with_transformers(counted):
    state = train(create_training_config(**SMALL), progress=False)
    ran = state.metadata["config"]
    assert (ran.generator, ran.rollout_correction) == ("hf", "none") and counted == []


def test_a_real_model_takes_the_first_fast_sampler_that_can_run_here(counted, monkeypatch, capsys):
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)  # the tiny model stands in for a real one
    state = train(create_training_config(**SMALL), progress=True)
    ran = state.metadata["config"]
    assert (ran.generator, ran.rollout_correction) == ("counted", "tis_token") and counted
    assert "mismatch/weight_mean" in state.stats_history[0].custom_metrics  # the correction ran
    assert ("train: 'auto' for this model here: generator='counted', rollout_correction='tis_token'"
            in capsys.readouterr().out)


def test_a_named_sampler_or_a_hook_is_never_replaced(counted, monkeypatch):
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)
    assert train(create_training_config(**SMALL, generator="hf"), progress=False).metadata["config"].generator == "hf"
    mine = []
    state = train(create_training_config(**SMALL), generator=counting(mine), progress=False)
    assert mine and counted == [] and state.metadata["config"].generator == "hf"  # "hf": no name chose it


def test_none_that_can_run_here_means_transformers(monkeypatch):
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)
    monkeypatch.setattr(training, "FAST_SAMPLERS", {"unavailable": lambda m: False})
    assert train(create_training_config(**SMALL), progress=False).metadata["config"].generator == "hf"


def test_a_resumed_run_keeps_the_sampler_it_chose_where_it_can_still_run(counted, monkeypatch, tmp_path):
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)
    config = create_training_config(**SMALL, output_dir=str(tmp_path))
    train(config, progress=False)
    assert counted
    monkeypatch.setitem(training.FAST_SAMPLERS, "unavailable", lambda m: True)  # it would choose another now
    state = train(config._replace(num_iterations=2, resume=True), progress=False)
    ran = state.metadata["config"]
    assert state.global_step == 2 and (ran.generator, ran.rollout_correction) == ("counted", "tis_token")
    monkeypatch.setitem(training.FAST_SAMPLERS, "counted", lambda m: False)  # e.g. resumed where vLLM is missing
    monkeypatch.setitem(training.FAST_SAMPLERS, "unavailable", lambda m: False)
    with pytest.warns(UserWarning, match="sampled with 'counted', which cannot run here; generator='auto' chooses"):
        state = train(config._replace(num_iterations=3, resume=True), progress=False)
    ran = state.metadata["config"]
    assert state.global_step == 3 and (ran.generator, ran.rollout_correction) == ("hf", "none")


def test_dpo_takes_no_correction_from_another_sampler(counted, monkeypatch):
    monkeypatch.setattr(step, "SMALL_MODEL_PARAMS", 0)
    state = train(create_training_config(**SMALL, algorithm="dpo"), progress=False)
    ran = state.metadata["config"]
    assert (ran.generator, ran.rollout_correction) == ("counted", "none")  # DPO has no advantage to weight
