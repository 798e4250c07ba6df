"""Never through a link: every file rlnb writes or moves in a run folder is replaced whole or refused when a
symbolic link stands in its place, so nothing lands outside the folder (a test per writer)."""
import json, os
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
import torch

from rlnb.cache import write_atomically
from rlnb.checkpoints import save_checkpoint
from rlnb.cli import train_command
from rlnb.experiments import STATUS_FILE, run_experiment
from rlnb.loggers import create_jsonl_logger, save_figure
from rlnb.core import TrainingStats, TrainingState

torch.set_num_threads(1)
NOTEBOOK = Path(__file__).parents[1] / "nbs" / "experiments" / "grpo_training.ipynb"


@pytest.fixture
def outside(tmp_path) -> Path:
    "A file outside the run folder, which no write may reach."
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_text("precious")
    return path


def test_write_atomically_replaces_a_link_and_removes_one_at_its_temporary_name(tmp_path, outside):
    target = tmp_path / "status.json"
    target.symlink_to(outside)
    (tmp_path / f".status.json.{os.getpid()}.tmp").symlink_to(outside)
    write_atomically(target, "{}")
    assert outside.read_text() == "precious" and not target.is_symlink() and target.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "status.json"]


def test_save_figure_replaces_a_link(tmp_path, outside):
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    (tmp_path / "reward_curve.png").symlink_to(outside)
    save_figure(fig, tmp_path / "reward_curve.png", dpi=30)
    plt.close(fig)
    assert outside.read_text() == "precious"
    assert (tmp_path / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_metrics_logger_refuses_a_link_put_in_its_place_during_a_run(tmp_path, outside):
    log = create_jsonl_logger(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").symlink_to(outside)
    state = TrainingState(model=None, optimizer=None, iteration=1, global_step=1)
    with pytest.raises(ValueError, match="is a symbolic link"): log(state, TrainingStats(0.0, 0.0, 1e-3, 0.0, 0.5, 0.1))
    assert outside.read_text() == "precious"


def test_save_checkpoint_refuses_a_link_in_place_of_its_folder(tmp_path, outside):
    (tmp_path / "checkpoint").symlink_to(outside.parent)
    with pytest.raises(ValueError, match="is a symbolic link"): save_checkpoint(None, tmp_path / "checkpoint")
    assert outside.read_text() == "precious"


@pytest.mark.parametrize("name", ["run.ipynb", "summary.json", "reward_curve.png", "attempts", "metrics.jsonl",
                                  "checkpoint", STATUS_FILE])
def test_a_run_folder_with_a_link_in_it_is_refused_before_anything_runs(tmp_path, outside, name):
    out = tmp_path / "run"
    out.mkdir()
    if name != STATUS_FILE:
        (out / STATUS_FILE).write_text(json.dumps({"status": "failed", "params": {"seed": 0}}))
    (out / name).symlink_to(outside.parent if name in ("attempts", "checkpoint") else outside)
    with pytest.raises(ValueError, match=rf"holds symbolic links \({name}\)|{STATUS_FILE} does not hold"):
        run_experiment(NOTEBOOK, {"num_iterations": 2, "seed": 0}, out)
    assert outside.read_text() == "precious" and [p.name for p in outside.parent.iterdir()] == ["precious.txt"]


def test_rlnb_train_writes_its_summary_in_place_of_a_link(tmp_path, outside):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").symlink_to(outside)
    (out / "summary.json.tmp").symlink_to(outside)  # the temporary name older versions wrote through
    (out / f".summary.json.{os.getpid()}.tmp").symlink_to(outside)  # and the one write_atomically uses
    train_command({"num_iterations": 0, "output_dir": str(out)})
    assert outside.read_text() == "precious"
    assert json.loads((out / "summary.json").read_text())["final_step"] == 0
