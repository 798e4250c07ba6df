"""Settings at the edges of a run: resuming with a new learning rate or weight decay applies them from the checkpoint
on, and says so; a total below the checkpoint's iteration is refused before anything loads; a run of no iterations
returns its first state, and the training notebook completes it."""
import pytest
import torch

from rlnb.core import TrainingConfig
from rlnb.loggers import load_metrics
from rlnb.training import train

torch.set_num_threads(1)
RUN = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0, seed=0,
           learning_rate=1e-2, lr_schedule="constant")


def test_a_new_learning_rate_and_weight_decay_apply_from_the_checkpoint_on(tmp_path, capsys):
    out = str(tmp_path / "run")
    train(TrainingConfig(output_dir=out, **RUN), progress=False)
    resumed = TrainingConfig(output_dir=out, resume=True, **{**RUN, "num_iterations": 4, "learning_rate": 1e-5},
                             weight_decay=0.1)
    state = train(resumed, progress=False)
    assert "learning_rate 0.01 -> 1e-05 from here on; weight_decay 0 -> 0.1 from here on" in capsys.readouterr().out
    rates = load_metrics(tmp_path / "run" / "metrics.jsonl").set_index("iteration")["lr"].to_dict()
    assert rates == {1: 1e-2, 2: 1e-2, 3: 1e-5, 4: 1e-5}
    assert [g["weight_decay"] for g in state.optimizer.param_groups] == [0.1]


def test_a_total_below_the_checkpoint_is_refused(tmp_path):
    out = str(tmp_path / "run")
    train(TrainingConfig(output_dir=out, **{**RUN, "num_iterations": 3}), progress=False)
    with pytest.raises(ValueError, match="num_iterations=2, but .* is at iteration 3; num_iterations is the run's"):
        train(TrainingConfig(output_dir=out, resume=True, **RUN), progress=False)


def test_a_run_of_no_iterations_returns_its_first_state():
    state = train(TrainingConfig(**{**RUN, "num_iterations": 0}), progress=True)
    assert (state.iteration, state.global_step, len(state.stats_history)) == (0, 0, 0)


@pytest.mark.slow
def test_the_training_notebook_completes_a_run_of_no_iterations(tmp_path):
    "`-p num_iterations 0` (or a run whose every group is filtered out) has no reward rows: its summary says so."
    from rlnb.experiments import run_experiment
    from test_experiments import TRAINING_NB
    result = run_experiment(TRAINING_NB, {"num_iterations": 0}, tmp_path / "run", env={"OMP_NUM_THREADS": "1"})
    assert result.status == "completed", result.error
    assert (result.summary["steps"], result.summary["reward_start"]) == (0, None)


def test_a_group_of_its_own_settings_keeps_them():
    "A custom optimizer's group with its own weight decay and rate (e.g. no decay on biases) is not overwritten."
    from rlnb.core import TrainingState
    from rlnb.resume import applied_optimizer_settings
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW([{"params": a.parameters()}, {"params": b.parameters(), "weight_decay": 0.0, "lr": 5.0}],
                            lr=1e-2, weight_decay=0.01)
    for g in opt.param_groups: g["initial_lr"] = g["lr"]
    saved = {"learning_rate": 1e-2, "weight_decay": 0.01}
    changed = applied_optimizer_settings(TrainingState(0, 0, a, opt, None), saved,
                                         TrainingConfig(learning_rate=1e-3, weight_decay=0.1))
    assert set(changed) == {"learning_rate", "weight_decay"}
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-3, 0.1), (5.0, 0.0)]


def test_other_changed_settings_apply_and_are_said_once(tmp_path):
    train(TrainingConfig(**RUN, output_dir=str(tmp_path)), progress=False)
    again = {**RUN, "num_iterations": 3, "temperature": 0.7, "max_grad_norm": 0.5}
    said = r"checkpoint.s run: temperature 1.0 -> 0.7, max_grad_norm 1.0 -> 0.5; they apply from iteration 3"
    with pytest.warns(UserWarning, match=said):
        train(TrainingConfig(**again, output_dir=str(tmp_path), resume=True), progress=False)


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_a_damaged_state_file_is_named_not_called_no_checkpoint(tmp_path, kind):
    train(TrainingConfig(**RUN, output_dir=str(tmp_path)), progress=False)
    state = tmp_path / "checkpoint" / "state.json"
    state.unlink()
    state.mkdir() if kind == "folder" else state.symlink_to(state)
    with pytest.raises(ValueError, match=f"state.json' is a {kind}, not the checkpoint's state file"):
        train(TrainingConfig(**{**RUN, "num_iterations": 3}, output_dir=str(tmp_path), resume=True), progress=False)
