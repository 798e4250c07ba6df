"""An algorithm a user registers in one place runs through every path of the loop, with no other registration: by
name, micro-batches, a sampler correction, one-step off-policy and resume, switching mid-run, two processes."""
import json, os, sys

import pytest
import torch

from rlnb.algorithms import (ALGORITHMS, AlgorithmSpec, compute_batch_advantages, create_algorithm_config, grpo_loss,
                             register_algorithm)
from rlnb.core import Rollout, TrainingConfig, collate, create_training_config
from rlnb.training import train
from test_micro_batches import accumulated_grads, setting  # noqa: F401 (a fixture)
from test_distributed import WORLD, _spawned
from test_off_policy import lora_weights

torch.set_num_threads(1)


def median_advantages(rewards, group_ids, baseline_rewards=None, scale=1.0):
    "Each reward minus its group's median (set by the spec's prepare_batch as the batch's baseline_rewards), scaled."
    return scale * (rewards - baseline_rewards)


def group_medians(state, batch, algorithm_config):
    "prepare_batch: each row's group median (the lower middle one, as torch.median), once per batch."
    _, inverse, counts = batch.group_ids.unique(return_inverse=True, return_counts=True)  # (B,), (groups,)
    by_reward = batch.rewards.argsort(stable=True)
    order = by_reward[inverse[by_reward].argsort(stable=True)]  # (B,): by group, then by reward
    middle = counts.cumsum(0) - counts + (counts - 1) // 2  # (groups,): each group's median position
    return batch._replace(baseline_rewards=batch.rewards[order[middle]][inverse])


DEFAULTS = dict(scale=1.0, clip_eps=0.2, clip_eps_high=None, beta=0.0, aggregation="token_mean",
                max_completion_length=None, kl_fn=None, log_ratio_clip=None, dual_clip=None)


def register_median():
    "The whole registration: after it, every path runs 'median' by name."
    register_algorithm("median", AlgorithmSpec(median_advantages, grpo_loss, DEFAULTS, prepare_batch=group_medians))


@pytest.fixture(autouse=True, scope="module")
def median():
    "Registered for this module's tests only: the other tests' `ALGORITHMS` hold the built-in ones."
    register_median()
    yield
    del ALGORITHMS["median"]

RUN = dict(algorithm="median", num_iterations=4, prompts_per_step=4, group_size=4, max_new_tokens=6, eval_every=0,
           seed=2, learning_rate=1e-2)


def test_the_medians_and_advantages_by_hand():
    rs = [1., 0, 0, 3, 2., 2, 5, 1]
    cb = collate([Rollout("p", prompt_token_ids=[1], token_ids=[2, 3], rewards=x, group_index=k // 4)
                  for k, x in enumerate(rs)], pad_token_id=0)
    cb = group_medians(None, cb, None)
    out = compute_batch_advantages(cb, create_algorithm_config("median", scale=2.0))
    # torch's median of an even count is the lower middle value: 0 and 2
    torch.testing.assert_close(out.advantages, 2 * (torch.tensor(rs) - torch.tensor([0.] * 4 + [2.] * 4)))


def test_the_step_prepares_the_batch_once_before_the_micro_batches(setting):  # noqa: F811
    calls = []
    def counted(state, batch, algorithm_config):
        calls.append(len(batch.rewards))
        return group_medians(state, batch, algorithm_config)
    register_algorithm("median_counted", ALGORITHMS["median"]._replace(prepare_batch=counted))
    try: accumulated_grads(setting, "median_counted", {}, 2)
    finally: del ALGORITHMS["median_counted"]
    assert calls == [len(setting[2].rollouts)]  # the whole batch, once


@pytest.mark.parametrize("size", [2, 3])
def test_micro_batches_add_up_for_a_registered_spec(setting, size):  # noqa: F811
    full = accumulated_grads(setting, "median", {}, None)
    parts = accumulated_grads(setting, "median", {}, size)
    assert full and full.keys() == parts.keys()
    for k in full: torch.testing.assert_close(parts[k], full[k], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_a_sampler_correction_enters_a_registered_spec_at_its_declared_level():
    rows = []
    config = create_training_config(**{**RUN, "num_iterations": 2}, generator="hf_bf16", rollout_correction="tis_token")
    train(config, logger=lambda s, st: rows.append(st.custom_metrics), progress=False)
    assert len(rows) == 2 and all("mismatch/kl" in r and "mismatch/weight_mean" in r for r in rows)
    # a variant of GSPO made from its spec keeps GSPO's sequence level: the correction scales its (B,) advantages
    register_algorithm("gspo_halved", ALGORITHMS["gspo"]._replace(
        policy_loss=lambda *a, **k: (lambda loss, m: (loss / 2, m))(*ALGORITHMS["gspo"].policy_loss(*a, **k))))
    try:
        train(config._replace(algorithm="gspo_halved"), logger=lambda s, st: rows.append(st.custom_metrics),
              progress=False)
    finally: del ALGORITHMS["gspo_halved"]
    assert len(rows) == 4 and rows[-1]["mismatch/weight_mean"] > 0


@pytest.mark.slow
def test_off_policy_and_resume_are_exact_for_a_registered_spec(tmp_path):
    base = dict(RUN, num_iterations=6, off_policy_steps=1, checkpoint_every=2)
    whole = train(create_training_config(**base, output_dir=str(tmp_path / "whole")), progress=False)
    config = create_training_config(**base, output_dir=str(tmp_path / "cut"))
    assert train(config, stop_fn=lambda state, metrics: state.iteration == 3, progress=False).iteration == 3
    resumed = train(config._replace(resume=True), progress=False)
    assert resumed.iteration == 6
    for a, b in zip(lora_weights(whole), lora_weights(resumed)): assert torch.equal(a, b)
    grpo = train(create_training_config(**{**base, "algorithm": "grpo", "checkpoint_every": 0}), progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(lora_weights(whole), lora_weights(grpo)))  # its own updates


@pytest.mark.slow
def test_a_run_switches_to_a_registered_spec_mid_run():
    seen = []
    schedule = lambda it: create_algorithm_config("grpo" if it < 2 else "median")
    train(TrainingConfig(**{**RUN, "algorithm": "grpo"}), algorithm_config=schedule,
          logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == ["grpo", "grpo", "median", "median"]


def _two_processes(rank, world, out):
    register_median()  # a spawned process imports this module, not its fixtures
    names = []
    state = train(TrainingConfig(**{**RUN, "num_iterations": 2}, output_dir=None), progress=False,
                  logger=lambda s, st: names.append(st.custom_metrics["algorithm"]))  # rank 0 logs
    w = torch.cat([p.detach().reshape(-1) for p in state.model.parameters() if p.requires_grad])
    torch.save((state.iteration, w, names), f"{out}.{rank}")


@pytest.mark.slow
def test_two_processes_run_a_registered_spec(tmp_path):
    "Each spawned process registers the spec once, as a user's training script would; nothing else is needed."
    out = str(tmp_path / "ranks.pt")
    _spawned(_two_processes, out)
    (i0, w0, names), (i1, w1, _) = (torch.load(f"{out}.{r}", weights_only=False) for r in range(WORLD))
    assert i0 == i1 == 2 and names == ["median", "median"]
    torch.testing.assert_close(w1, w0, rtol=0, atol=0)  # the ranks took the same updates


PLUGIN = '''
"A user's module: importing it registers a GRPO whose advantages are the group-centred rewards, unscaled."
from rlnb.algorithms import AlgorithmSpec, compute_grpo_advantages, grpo_loss, register_algorithm, ALGORITHMS

register_algorithm("centred_grpo", ALGORITHMS["grpo"]._replace(default_config={**ALGORITHMS["grpo"].default_config,
                                                                               "scale": "none"}))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    "A module on the Python path (of this process and of the processes it starts) that registers `centred_grpo`."
    (tmp_path / "user_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield tmp_path
    ALGORITHMS.pop("centred_grpo", None)
    sys.modules.pop("user_plugin", None)


def test_a_plugin_module_registers_an_algorithm_the_config_names(plugin):
    from rlnb.experiments import check_run_params
    with pytest.raises(ValueError, match="`algorithm` must be one of"):
        check_run_params({"algorithm": "centred_grpo"})  # not imported: unknown
    check_run_params({"algorithm": "centred_grpo", "plugins": "user_plugin"})
    state = train(TrainingConfig(**{**RUN, "algorithm": "centred_grpo", "num_iterations": 2}, plugins="user_plugin"),
                  progress=False)
    assert [s.custom_metrics["algorithm"] for s in state.stats_history] == ["centred_grpo"] * 2


@pytest.mark.slow
def test_a_papermill_run_imports_its_plugins(plugin, tmp_path):
    "The way a new process learns a user's algorithm: `-p plugins MODULE` (here through rlnb.run_experiment)."
    from rlnb.experiments import run_experiment
    from test_experiments import TRAINING_NB
    params = dict(plugins="user_plugin", algorithm="centred_grpo", num_iterations=2, prompts_per_step=2, group_size=4,
                  max_new_tokens=6, eval_every=0)
    result = run_experiment(TRAINING_NB, params, tmp_path / "run", env={"OMP_NUM_THREADS": "1"})
    assert result.status == "completed", result
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r.get("algorithm") for r in rows if "algorithm" in r} == {"centred_grpo"}
