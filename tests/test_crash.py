"""What rlnb promises when a run dies: training processes really killed (SIGKILL) resume to the same weights, lose no
metric row and duplicate none; a non-finite loss stops the run with the last good checkpoint intact."""
import json, os, random, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from rlnb.core import create_training_config
from rlnb.checkpoints import checkpoint_exists
from rlnb.loggers import load_metrics
from rlnb.training import train

torch.set_num_threads(1)
RUN = dict(num_iterations=30, prompts_per_step=4, group_size=4, max_new_tokens=6, eval_every=4, eval_size=16,
           checkpoint_every=1)
SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from rlnb.core import create_training_config
from rlnb.checkpoints import checkpoint_exists
from rlnb.training import train
cfg = create_training_config(**{run}, output_dir=sys.argv[1], resume=sys.argv[2] == "1")
train(cfg, progress=False)
"""


def lora(state):
    return {n: p.detach().clone() for n, p in state.model.named_parameters() if "lora_" in n}


def start(out: Path, resume: bool) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", SCRIPT.format(run=RUN), str(out), "1" if resume else "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_to_the_uninterrupted_weights(tmp_path):
    reference = train(create_training_config(**RUN, output_dir=str(tmp_path / "reference")), progress=False)
    want = lora(reference)
    out, rng, killed = tmp_path / "killed", random.Random(0), 0
    for attempt in range(3):
        proc = start(out, resume=checkpoint_exists(out / "checkpoint"))
        deadline = time.time() + 120
        while not checkpoint_exists(out / "checkpoint") and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.0))  # somewhere in training, checkpointing or logging
        if proc.poll() is not None: break  # it finished first
        proc.send_signal(signal.SIGKILL); proc.wait(); killed += 1
    assert killed >= 1, "no run was killed mid-way: the test proved nothing"
    state = train(create_training_config(**RUN, output_dir=str(out), resume=True), progress=False)  # the rest, if any
    assert state.iteration == RUN["num_iterations"]
    got = lora(state)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), "resumed weights differ"
    df = load_metrics(out / "metrics.jsonl")
    steps = df.dropna(subset=["reward/mean"])["iteration"].tolist()
    assert steps == list(range(1, RUN["num_iterations"] + 1)), f"metric rows lost or duplicated: {steps}"
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name or ".old-" in p.name], (
        "temporary folders left behind")


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    from rlnb.algorithms import compute_loss_by_algorithm
    def poisoned(batch, logprobs, config):
        loss, metrics = compute_loss_by_algorithm(batch, logprobs, config)
        return (loss * float("nan"), metrics) if poisoned.calls == 3 else (loss, metrics)
    poisoned.calls = 0
    def count(state, batch): poisoned.calls += 1
    no_eval = {k: v for k, v in RUN.items() if k != "eval_size"}  # eval_size without evaluations would be warned about
    cfg = create_training_config(**{**no_eval, "eval_every": 0}, output_dir=str(tmp_path))
    with pytest.raises(FloatingPointError, match="loss is nan at iteration 2"):
        train(cfg, loss_fn=poisoned, iteration_hook=count, progress=False)
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["iteration"] == 2
    state = train(cfg._replace(resume=True), progress=False)  # the run continues from the last good checkpoint
    assert state.iteration == RUN["num_iterations"]
