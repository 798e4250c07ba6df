"""A stopped cell and Ctrl-C: the first interrupt ends a run after the iteration under way, with a checkpoint that
resumes exactly; `rlnb run` records the run as interrupted (never completed) and `-p resume True` continues it."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from rlnb.core import create_training_config
from rlnb.cache import loads_json
from rlnb.loggers import load_metrics
from rlnb.training import train

torch.set_num_threads(1)
RUN = dict(num_iterations=6, prompts_per_step=4, group_size=4, max_new_tokens=6)
RLNB = Path(sys.executable).parent / "rlnb"
NOTEBOOK = Path(__file__).parents[1] / "nbs" / "experiments" / "grpo_training.ipynb"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1"}


def checkpoint_iteration(out: Path) -> int:
    return loads_json((out / "checkpoint" / "state.json").read_text())["iteration"]


def lora(state):
    return {n: p.detach().clone() for n, p in state.model.named_parameters() if "lora_" in n}


def interrupt_at(iteration: int):
    "A stop_fn that presses Stop (SIGINT to this process) once, when `iteration` has just been trained."
    def stop_fn(state, metrics):
        if state.iteration == iteration: os.kill(os.getpid(), signal.SIGINT)
        return False
    return stop_fn


@pytest.mark.slow
def test_an_interrupted_train_saves_its_last_iteration_and_resumes_to_the_same_weights(tmp_path):
    whole = train(create_training_config(**RUN, output_dir=str(tmp_path / "whole")), progress=False)
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt, match=r"stopped after iteration 3 of 6; its checkpoint is in .*resume=True"):
        train(create_training_config(**RUN, output_dir=str(out)), stop_fn=interrupt_at(3), progress=False)
    assert checkpoint_iteration(out) == 3  # saved on the way out (no checkpoint_every)
    assert load_metrics(out / "metrics.jsonl")["iteration"].max() == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    resumed = train(create_training_config(**RUN, output_dir=str(out), resume=True), progress=False)
    assert resumed.iteration == 6
    for name, w in lora(whole).items(): torch.testing.assert_close(lora(resumed)[name], w, rtol=0, atol=0)


def start_run(out: Path, *params: str) -> subprocess.Popen:
    "`rlnb run` of the training notebook in a session of its own, as a terminal would start it."
    return subprocess.Popen([str(RLNB), "run", str(NOTEBOOK), "-o", str(out), *params], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_rows(out: Path, rows: int, proc: subprocess.Popen, limit: float = 120) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        path = out / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= rows: return
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    raise AssertionError(f"no {rows} metric rows in {limit} s")


@pytest.mark.slow
def test_ctrl_c_to_rlnb_run_records_an_interrupted_run_that_resumes(tmp_path):
    out = tmp_path / "run"
    proc = start_run(out, "-p", "num_iterations", "400")
    wait_for_rows(out, 3, proc)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the command's process group
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted" and "stopped after iteration" in status["error"], status
    stopped_at = checkpoint_iteration(out)
    assert 3 <= stopped_at < 400 and "-p resume True continues" in output
    assert load_metrics(out / "metrics.jsonl")["iteration"].max() == stopped_at  # nothing past the checkpoint
    again = subprocess.run([str(RLNB), "run", str(NOTEBOOK), "-o", str(out), "-p", "num_iterations",
                            str(stopped_at + 2), "-p", "resume", "True"], env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    status = json.loads((out / "status.json").read_text())
    assert (status["status"], status["attempt"]) == ("completed", 2)
    assert load_metrics(out / "metrics.jsonl")["iteration"].max() == stopped_at + 2


@pytest.mark.slow
def test_a_second_ctrl_c_stops_rlnb_run_at_once_and_says_so(tmp_path):
    out = tmp_path / "run"
    proc = start_run(out, "-p", "num_iterations", "400")
    wait_for_rows(out, 2, proc)
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130 and "Traceback" not in output, output
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "interrupted", status


def test_an_interrupt_while_adapters_are_folded_leaves_them_unfolded():
    from rlnb.generation import merged_lora
    from rlnb.models import apply_lora, load_model
    model = apply_lora(load_model("tiny"), r=4)
    for name, p in model.named_parameters():
        if "lora_B" in name: torch.nn.init.normal_(p)  # B = 0 at the start would fold into nothing
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(): logits = model(ids).logits  # (1, 4, V) with the adapters on
    with pytest.raises(KeyboardInterrupt):
        with merged_lora(model) as folded:
            assert folded
            raise KeyboardInterrupt  # Stop pressed while the sampler runs on the folded weights
    for name, p in model.named_parameters(): torch.testing.assert_close(p, before[name], rtol=0, atol=0)
    with torch.no_grad(): torch.testing.assert_close(model(ids).logits, logits, rtol=0, atol=0)  # adapters back on


def test_soft_interrupt_asks_first_stops_second_and_puts_the_handler_back():
    from rlnb.interrupts import SoftInterrupt
    before, passed_on = signal.getsignal(signal.SIGINT), []
    with pytest.raises(KeyboardInterrupt):
        with SoftInterrupt("stopping soon", on_first=lambda: passed_on.append(1)) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000): pass  # the handler runs between bytecodes
            assert stop.requested and passed_on == [1]
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
            for _ in range(1000): pass
    assert signal.getsignal(signal.SIGINT) is before


def test_soft_interrupt_leaves_an_ignored_sigint_ignored():
    from rlnb.interrupts import SoftInterrupt
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a job a shell started in the background
    try:
        with SoftInterrupt("never said") as stop:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000): pass
        assert not stop.requested and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally: signal.signal(signal.SIGINT, before)
