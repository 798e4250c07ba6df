"""Sweeps as an experimenter runs them: parameters checked first, a real Dask cluster, failures recorded and retried,
the tables, the plot, the command line."""
import json, os, re, subprocess, sys
import multiprocessing
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pytest

from rlnb.cli import main
from rlnb.experiments import STATUS_FILE, expand_grid, run_experiment, run_name, run_sweep
from rlnb.sweep_results import load_sweep, plot_sweep

ROOT = Path(__file__).resolve().parent.parent
TRAINING_NB = ROOT / "nbs" / "experiments" / "grpo_training.ipynb"
RLNB = Path(sys.executable).parent / "rlnb"
TINY = dict(num_iterations=4, eval_every=2, eval_size=8, prompts_per_step=4, group_size=4)  # a few seconds of training

TOY_BODY = """import json, math, os, random
from pathlib import Path
rng = random.Random(seed)
rewards = []
with open(Path(output_dir) / "metrics.jsonl", "w") as f:
    for step in range(1, num_iterations + 1):
        BUG
        rewards.append(0.9 - 0.8 * math.exp(-40 * learning_rate * step) + rng.gauss(0, 0.04))
        f.write(json.dumps({"step": step, "reward/mean": rewards[-1]}) + "\\n")
summary = dict(reward_start=rewards[0], reward_final=rewards[-1], omp=os.environ.get("OMP_NUM_THREADS"),
               rlnb_threads=os.environ.get("RLNB_NUM_THREADS"), cache=os.environ.get("RLNB_CACHE"))
(Path(output_dir) / "summary.json").write_text(json.dumps(summary))"""


def write_toy(path: Path, bug: bool) -> Path:
    "A papermill notebook faking a run in a blink; with `bug` it raises at step 3 when learning_rate > 2.5e-3."
    body = TOY_BODY.replace("BUG", 'if learning_rate > 2.5e-3 and step == 3: raise FloatingPointError("loss is nan")'
                            if bug else "pass")
    cells = [nbformat.v4.new_code_cell("learning_rate = 1e-3\nnum_iterations = 10\nseed = 0\noutput_dir = 'x'",
                                       metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell(body)]
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "language": "python", "display_name": "python3"}}), path)
    return path


class NoKernelExecutor(Executor):
    "An executor that must never be used: any submit is a test failure."
    def submit(self, fn, *args, **kwargs): raise AssertionError("a run was submitted")


def test_bad_parameters_fail_before_any_kernel_starts(tmp_path, monkeypatch):
    import papermill
    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: pytest.fail("papermill was called"))
    cases = [({"lerning_rate": 1e-3}, ValueError, "did you mean 'learning_rate'"),
             ({"learning_rate": "fast"}, ValueError, "`learning_rate` must be float"),
             ({"num_iterations": -3}, ValueError, "`num_iterations` must be >= 0"),
             ({"task": "adition"}, ValueError, "`task` must be one of"),
             ({"algorithm": "grp0"}, ValueError, "`algorithm` must be one of"),
             ({"output_dir": "elsewhere"}, ValueError, "must not set output_dir"),
             ({"algorithm_options": {"clip": float("nan")}}, TypeError,
              "parameter 'algorithm_options' must be a JSON value")]
    for params, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            run_experiment(TRAINING_NB, params, tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_experiment(tmp_path / "missing.ipynb", {}, tmp_path / "run")
    # a sweep checks every run before submitting any: the bad one is named
    with pytest.raises(ValueError,
                       match=re.escape("run learning_rate=-1.0,seed=0: TrainingConfig: `learning_rate` must be > 0")):
        run_sweep(TRAINING_NB, {"learning_rate": [1e-3, -1.0]}, seeds=2, executor=NoKernelExecutor(),
                  output_root=tmp_path / "s")
    assert not (tmp_path / "run").exists() and not (tmp_path / "s").exists()


def test_a_kernel_that_dies_before_starting_is_started_again_and_a_notebook_error_is_not(tmp_path, monkeypatch):
    """A kernel that dies or never answers before its first cell ran nothing: that run is retried; a failing notebook
    is recorded at once, even when its cell's error reads like a start failure."""
    import papermill
    from papermill.exceptions import PapermillExecutionError
    toy, calls = write_toy(tmp_path / "toy.ipynb", bug=False), []
    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1: raise RuntimeError("Kernel died before replying to kernel_info")
        if len(calls) == 2: raise RuntimeError("Kernel didn't respond in 60 seconds")
        if kwargs["parameters"]["learning_rate"] > 2: raise PapermillExecutionError(  # a cell's error: not retried
            1, 1, "serve()", "OSError", "[Errno 98] Address already in use", [])
        if kwargs["parameters"]["learning_rate"] > 1: raise FloatingPointError("loss is nan")
    monkeypatch.setattr(papermill, "execute_notebook", flaky)
    ok = run_experiment(toy, {"learning_rate": 1e-3}, tmp_path / "ok", check_params=None)
    assert (ok.status, ok.error, len(calls)) == ("completed", None, 3)
    bad = run_experiment(toy, {"learning_rate": 2.0}, tmp_path / "bad", check_params=None)
    assert (bad.status, bad.error, len(calls)) == ("failed", "FloatingPointError: loss is nan", 4)
    cell = run_experiment(toy, {"learning_rate": 3.0}, tmp_path / "cell", check_params=None)
    assert (cell.status, cell.error, len(calls)) == ("failed", "OSError: [Errno 98] Address already in use", 5)


@pytest.mark.slow
def test_a_runs_kernel_listens_on_unix_sockets_not_tcp_ports(tmp_path):
    "Over TCP two kernels starting at once can race for a port; a run's ipykernel kernel uses Unix sockets."
    body = ("import json\nfrom pathlib import Path\nfrom ipykernel.kernelapp import IPKernelApp\n"
            "app = IPKernelApp.instance()\n"
            "(Path(output_dir) / 'summary.json').write_text(json.dumps(dict(transport=app.transport, ip=app.ip)))")
    cells = [nbformat.v4.new_code_cell("output_dir = 'x'", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell(body)]
    notebook = tmp_path / "transport.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "language": "python", "display_name": "python3"}}), notebook)
    runs = [run_experiment(notebook, {}, tmp_path / name, check_params=None) for name in ("a", "b")]
    assert [r.status for r in runs] == ["completed", "completed"], [r.error for r in runs]
    assert [r.summary["transport"] for r in runs] == ["ipc", "ipc"]
    assert runs[0].summary["ip"] != runs[1].summary["ip"]
    if sys.platform == "linux": assert runs[0].summary["ip"].startswith("@")  # abstract sockets: no files left


def test_grid_expansion_and_run_names():
    plan = expand_grid({"learning_rate": [1e-3, 3e-3], "beta": [0.0, 0.04], "num_iterations": 30}, seeds=2)
    assert len(plan) == 8 and list(plan)[:3] == ["beta=0.0,learning_rate=0.001,num_iterations=30,seed=0",
                                                 "beta=0.0,learning_rate=0.001,num_iterations=30,seed=1",
                                                 "beta=0.04,learning_rate=0.001,num_iterations=30,seed=0"]
    assert all(p["num_iterations"] == 30 for p in plan.values())  # fixed: in every run and in every name
    assert plan["beta=0.04,learning_rate=0.003,num_iterations=30,seed=1"] == \
        {"learning_rate": 3e-3, "beta": 0.04, "num_iterations": 30, "seed": 1}
    assert list(expand_grid([{"task": "addition"}, {"task": "reverse", "lora_r": 0}], seeds=[3])) == \
        ["task=addition,seed=3", "lora_r=0,task=reverse,seed=3"]
    assert list(expand_grid({"seed": [5, 6]})) == ["seed=5", "seed=6"]
    assert list(expand_grid({})) == ["defaults"] and list(expand_grid({}, default_seed=0)) == ["seed=0"]
    # one scheme: a run's name does not depend on the order its parameters were given in, nor on how it was started
    assert run_name({"seed": 2, "b": 1, "a": 0}) == run_name({"a": 0, "b": 1, "seed": 2}) == "a=0,b=1,seed=2"
    assert list(expand_grid({"b": [1], "a": 0}, seeds=[2])) == [run_name({"a": 0, "b": 1, "seed": 2})]
    odd = run_name({"model": "org/model", "seed": 0})
    assert odd == run_name({"model": "org/model", "seed": 0}) != run_name({"model": "org-model", "seed": 0})
    assert "/" not in odd
    for grid, seeds, message in [({"lr": []}, None, "empty list"), ({"seed": [1]}, 2, "use one of them"),
                                 ({"lr": [1]}, 0, "`seeds` must be"),
                                 ([{"seed": 1}, {"seed": 1}], None, "runs must differ")]:
        with pytest.raises(ValueError, match=re.escape(message)): expand_grid(grid, seeds)


@pytest.fixture(scope="module")
def dask_sweep(tmp_path_factory):
    "The training notebook over two learning rates, tiny runs, on a real Dask LocalCluster of two worker processes."
    from distributed import Client, LocalCluster
    root, lines = tmp_path_factory.mktemp("dask") / "sweep", []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        results = run_sweep(TRAINING_NB, {"learning_rate": [1e-3, 4e-3], **TINY}, executor=client.get_executor(),
                            output_root=root, log_fn=lines.append)
    return root, results, lines, worker_pids


@pytest.mark.slow
def test_sweep_of_the_training_notebook_on_dask(dask_sweep):
    root, results, lines, worker_pids = dask_sweep
    assert [r.run_id for r in results] == [run_name({"learning_rate": lr, **TINY, "seed": 0}) for lr in (1e-3, 4e-3)]
    assert [r.status for r in results] == ["completed", "completed"], [r.error for r in results]
    pids = {json.loads((r.output_dir / STATUS_FILE).read_text())["pid"] for r in results}
    assert pids <= worker_pids and os.getpid() not in pids, "the runs did not run in the Dask workers"
    for r in results:
        assert ({"metrics.jsonl", "reward_curve.png", "run.ipynb", "status.json", "summary.json"}
                <= {p.name for p in r.output_dir.iterdir()})
        assert r.summary["steps"] == 4 and r.summary["params"]["learning_rate"] == r.params["learning_rate"]
        assert r.output_dir == root / r.run_id and r.seconds > 0
    assert len(lines) == 2 and all(re.fullmatch(r"\[[12]/2\] learning_rate=0\.00[14] ok \d+ s  "
                                                r"reward \d\.\d\d->\d\.\d\d  acc \d\.\d\d->\d\.\d\d", l)
                                   for l in lines), lines
    # the same sweep again: nothing to run, so nothing may be submitted
    again = run_sweep(TRAINING_NB, {"learning_rate": [1e-3, 4e-3], **TINY}, executor=NoKernelExecutor(),
                      output_root=root, log_fn=None)
    assert all(r.skipped and r.status == "completed" for r in again)
    with pytest.raises(AssertionError, match="a run was submitted"):  # a fixed value changed: another run, not a reuse
        run_sweep(TRAINING_NB, {"learning_rate": [1e-3], **TINY, "num_iterations": 5}, executor=NoKernelExecutor(),
                  output_root=root)
    with pytest.raises(ValueError, match="holds a completed run with other parameters"):  # a folder is one run's
        run_experiment(TRAINING_NB, {"learning_rate": 4e-3, **TINY}, results[0].output_dir)


@pytest.mark.slow
def test_load_sweep_tables(dask_sweep):
    root, results, _, _ = dask_sweep
    sweep = load_sweep(root)
    params = ["learning_rate", *TINY, "seed"]
    assert sweep.params == params
    assert list(sweep.runs.columns[:len(params) + 3]) == ["run_id", *params, "status", "seconds"]
    assert sweep.runs.shape[0] == 2 and sweep.runs["learning_rate"].tolist() == [1e-3, 4e-3]
    for column in ("steps", "reward_start", "reward_final", "accuracy_start", "accuracy_final", "kl_final", "error"):
        assert column in sweep.runs.columns, column
    assert sweep.runs["reward_final"].tolist() == [r.summary["reward_final"] for r in results]
    m = sweep.metrics
    assert list(m.columns[:len(params) + 1]) == ["run_id", *params]
    lines = sum(len((r.output_dir / "metrics.jsonl").read_text().splitlines()) for r in results)
    assert len(m) == lines
    for r in results:
        rows = m[m["run_id"] == r.run_id]
        assert rows["reward/mean"].notna().sum() == 4 and rows["eval/accuracy"].notna().sum() == 3  # evals at 0, 2, 4
        assert (rows["learning_rate"] == r.params["learning_rate"]).all()


@pytest.mark.slow
def test_plot_sweep_draws_one_line_per_setting(dask_sweep):
    root, results, _, _ = dask_sweep
    sweep = load_sweep(root)
    fig = plot_sweep(sweep, smooth=1)
    assert [ax.get_title() for ax in fig.axes] == ["mean reward", "greedy accuracy (held-out)",
                                                   "final value by learning_rate"]
    reward_lines = fig.axes[0].get_lines()
    assert [l.get_label() for l in reward_lines] == ["learning_rate=0.001 (n=1)", "learning_rate=0.004 (n=1)"]
    for line, r in zip(reward_lines, results):  # one seed each: the line is the run's own curve
        own = sweep.metrics.query("run_id == @r.run_id").dropna(subset=["reward/mean"])
        np.testing.assert_allclose(line.get_ydata(), own["reward/mean"].to_numpy())
    with pytest.raises(ValueError, match="not parameters of the sweep"): plot_sweep(sweep, by="lr")
    plt.close("all")


@pytest.mark.slow
def test_failed_run_is_recorded_others_finish_and_a_rerun_retries_it(tmp_path):
    notebook, root = write_toy(tmp_path / "toy.ipynb", bug=True), tmp_path / "sweep"
    grid = {"learning_rate": [1e-3, 3e-3], "num_iterations": 10}
    # a run killed earlier: status "running", a partial file
    killed = root / "learning_rate=0.001,num_iterations=10,seed=1"
    killed.mkdir(parents=True)
    (killed / STATUS_FILE).write_text('{"status": "running", "attempt": 1}')
    (killed / "metrics.jsonl").write_text("{")
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))  # any executor; one for both sweeps
    first = run_sweep(notebook, grid, seeds=2, executor=pool, output_root=root, log_fn=None)
    assert [r.status for r in first] == ["completed", "completed", "failed", "failed"]
    for r in first[2:]:
        assert r.error == "FloatingPointError: loss is nan" and r.summary is None
        assert json.loads((r.output_dir / STATUS_FILE).read_text())["status"] == "failed"
        failing = [c for c in nbformat.read(r.notebook, as_version=4).cells if c.get("outputs")][-1]
        assert failing.outputs[-1]["ename"] == "FloatingPointError"  # the executed notebook holds the traceback
    for r in first[:2]:  # one thread per run, and the caller's tiny-model cache
        assert (r.summary["omp"], r.summary["rlnb_threads"]) == ("1", "1")
        if os.environ.get("RLNB_CACHE"): assert r.summary["cache"] == str(Path(os.environ["RLNB_CACHE"]).resolve())
    assert (json.loads((killed / STATUS_FILE).read_text())["attempt"] == 2
            and len((killed / "metrics.jsonl").read_text().splitlines()) == 10)
    assert (killed / "attempts" / "1" / "metrics.jsonl").read_text() == "{"  # the killed attempt, kept
    stamps = [r.notebook.stat().st_mtime_ns for r in first[:2]]
    write_toy(notebook, bug=False)  # the fix
    second = run_sweep(notebook, grid, seeds=2, executor=pool, output_root=root, log_fn=None)
    pool.shutdown()
    assert [(r.status, r.skipped) for r in second] == [("completed", True)] * 2 + [("completed", False)] * 2
    assert [r.notebook.stat().st_mtime_ns for r in second[:2]] == stamps, "a completed run was run again"
    assert [json.loads((r.output_dir / STATUS_FILE).read_text())["attempt"] for r in second] == [1, 2, 2, 2]
    # two seeds per setting: the plotted line is the mean of the two runs, the band is there
    sweep = load_sweep(root)
    fig = plot_sweep(sweep, metrics=("reward/mean",), smooth=1)
    line = fig.axes[0].get_lines()[1]
    runs = sweep.metrics[sweep.metrics["learning_rate"] == 3e-3].pivot(index="step", columns="seed",
                                                                       values="reward/mean")
    np.testing.assert_allclose(line.get_ydata(), runs.mean(axis=1).to_numpy())
    assert len(fig.axes[0].collections) == 2  # a std band per setting
    plt.close("all")


def test_a_run_whose_worker_dies_is_recorded_as_failed(tmp_path):
    class DeadWorkers(Executor):
        def submit(self, fn, *args, **kwargs):
            future = Future(); future.set_exception(BrokenProcessPool("a worker process died")); return future
    results = run_sweep(write_toy(tmp_path / "toy.ipynb", bug=False), {"learning_rate": [1e-3]}, executor=DeadWorkers(),
                        output_root=tmp_path / "sweep", log_fn=None)
    assert results[0].status == "failed" and results[0].error == "BrokenProcessPool: a worker process died"
    status = json.loads((tmp_path / "sweep" / "learning_rate=0.001,seed=0" / STATUS_FILE).read_text())
    assert status["status"] == "failed"  # so the next sweep retries it


@pytest.mark.slow
def test_command_line_run_and_sweep(tmp_path, monkeypatch, capsys):
    notebook = write_toy(tmp_path / "toy.ipynb", bug=True)
    # `python -m rlnb.cli` too
    run = subprocess.run([sys.executable, "-m", "rlnb.cli", "run", str(notebook), "-p", "learning_rate", "2e-3",
                          "-p", "seed", "1", "-o", str(tmp_path / "one")], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"\[1/1\] one ok \d+ s  reward \d\.\d\d->\d\.\d\d\n", run.stdout), run.stdout
    assert json.loads((tmp_path / "one" / STATUS_FILE).read_text())["params"] == {"learning_rate": 2e-3, "seed": 1}
    sweep = subprocess.run([str(RLNB), "sweep", str(notebook), "-p", "learning_rate", "1e-3", "3e-3",
                            "-p", "num_iterations", "5", "--seeds", "1", "--workers", "2", "-o", "sweep"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert sweep.returncode == 1, sweep.stderr  # a run failed
    out = sweep.stdout.splitlines()
    assert len(out) == 3 and sorted(l[:5] for l in out[:2]) == ["[1/2]", "[2/2]"], out
    assert re.search(r"\] learning_rate=0\.001 ok \d+ s  reward ", "\n".join(out[:2]))
    assert re.search(r"\] learning_rate=0\.003 FAILED \d+ s  FloatingPointError: loss is nan  \(", "\n".join(out[:2]))
    assert out[2] == (f"1 of 2 runs completed in {(tmp_path / 'sweep').resolve()}; "
                      "failed: learning_rate=0.003,num_iterations=5,seed=0 "
                      "(the same command again retries them)")
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == \
        ["learning_rate=0.001,num_iterations=5,seed=0", "learning_rate=0.003,num_iterations=5,seed=0"]
    # bad arguments, in this process (the same `main` the command calls): exit status 2, nothing run
    monkeypatch.chdir(tmp_path)
    for argv, message in [(["sweep", str(notebook), "-p", "lerning_rate", "1e-3"], "did you mean 'learning_rate'"),
                          (["run", str(notebook), "-p", "learning_rate", "1e-3", "3e-3"],
                           "takes one value per parameter"),
                          (["run", str(tmp_path / "missing.ipynb")], "does not exist")]:
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


SLOW_TOY = """import json, os, time
from pathlib import Path
if die: os.kill(os.getppid(), 9)  # kill the run's process (the kernel's parent) from inside the run
with open(Path(output_dir) / "metrics.jsonl", "w") as f:
    for step in range(1, num_iterations + 1):
        time.sleep(pause)
        f.write(json.dumps({"step": step, "reward/mean": step / num_iterations}) + "\\n"); f.flush()
(Path(output_dir) / "summary.json").write_text(json.dumps({"steps": num_iterations, "final_step": num_iterations}))"""


def write_slow_toy(path: Path) -> Path:
    "A papermill notebook that logs a step every `pause` seconds; with `die` it kills its own run's process."
    cells = [nbformat.v4.new_code_cell("num_iterations = 10\npause = 0.0\ndie = False\nseed = 0\noutput_dir = 'x'",
                                       metadata={"tags": ["parameters"]}), nbformat.v4.new_code_cell(SLOW_TOY)]
    kernelspec = {"name": "python3", "language": "python", "display_name": "python3"}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": kernelspec}), path)
    return path


def descendants(pid: int) -> set[int]:
    "Every live process below `pid`, from /proc."
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try: fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError: continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found: found.add(child); todo.append(child)
    return found


def alive(pid: int) -> bool:
    try: state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError: return False
    return state != "Z"  # a zombie has exited; it only waits for its parent to read its status


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is a Linux feature")
def test_killing_the_sweep_driver_kills_its_runs_and_the_same_sweep_finishes_them(tmp_path):
    import signal, time
    notebook, root = write_slow_toy(tmp_path / "slow.ipynb"), tmp_path / "sweep"
    grid = {"pause": 0.25, "num_iterations": 40}
    driver_code = (f"from rlnb.experiments import run_sweep\n"
                   f"run_sweep({str(notebook)!r}, {grid!r}, seeds=2, output_root={str(root)!r}, workers=2, "
                   f"check_params=None)")
    driver = subprocess.Popen([sys.executable, "-c", driver_code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = [root / run_name({**grid, "seed": s}) / "metrics.jsonl" for s in (0, 1)]
    deadline = time.time() + 120
    while not all(m.is_file() and m.read_text().count("\n") >= 2 for m in metrics):  # both kernels are training
        assert time.time() < deadline and driver.poll() is None, "the runs never started"
        time.sleep(0.2)
    below = descendants(driver.pid)
    assert len(below) >= 4, below  # two run processes and two kernels at least
    driver.send_signal(signal.SIGKILL); driver.wait()
    deadline = time.time() + 15
    while any(alive(p) for p in below) and time.time() < deadline: time.sleep(0.2)
    assert not [p for p in below if alive(p)], "orphans outlived the killed driver"
    rows = [m.read_text().count("\n") for m in metrics]
    time.sleep(1.0)
    assert [m.read_text().count("\n") for m in metrics] == rows, "something still writes the runs"
    assert all(r < 40 for r in rows)
    again = run_sweep(notebook, grid, seeds=2, output_root=root, workers=2, check_params=None, log_fn=None)
    assert [(r.status, r.skipped) for r in again] == [("completed", False)] * 2
    for r, cut in zip(again, rows):  # the killed attempts are kept, row for row, beside the finished runs
        assert (r.output_dir / "metrics.jsonl").read_text().count("\n") == 40
        assert (r.output_dir / "attempts" / "1" / "metrics.jsonl").read_text().count("\n") == cut


@pytest.mark.slow
def test_a_run_whose_process_dies_fails_alone(tmp_path):
    notebook = write_slow_toy(tmp_path / "slow.ipynb")
    results = run_sweep(notebook, {"die": [False, True], "pause": 0.05}, output_root=tmp_path / "sweep", workers=2,
                        check_params=None, log_fn=None)
    assert [r.status for r in results] == ["completed", "failed"]
    assert results[1].error == "RuntimeError: the run's process died (exit code -9)"
    assert (results[0].output_dir / "metrics.jsonl").read_text().count("\n") == 10


@pytest.mark.slow
def test_a_folder_in_use_is_never_touched(tmp_path):
    from rlnb.cache import folder_lock
    notebook, out = write_slow_toy(tmp_path / "slow.ipynb"), tmp_path / "sweep" / "seed=0"
    out.mkdir(parents=True)
    (out / STATUS_FILE).write_text('{"status": "running", "attempt": 1}')
    (out / "metrics.jsonl").write_text("{}\n")
    code = (f"from rlnb.cache import folder_lock\nimport time\nwith folder_lock({str(out)!r}, 'train'):\n"
            f"    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=f"in use by another process \\(purpose train, pid {holder.pid}"):
            run_experiment(notebook, {"seed": 0}, out, check_params=None)
        lines = []
        results = run_sweep(notebook, {"seed": [0]}, output_root=tmp_path / "sweep", check_params=None,
                            log_fn=lines.append)
    finally:
        holder.kill(); holder.wait(); holder.stdout.close()
    assert results[0].status == "running" and "in use, left alone" in lines[0], lines
    assert (out / "metrics.jsonl").read_text() == "{}\n" and not (out / "attempts").exists()  # untouched
    with folder_lock(out): pass  # free again once its holder died
    result = run_experiment(notebook, {"seed": 0}, out, check_params=None)
    assert result.status == "completed" and (out / "attempts" / "1" / "metrics.jsonl").read_text() == "{}\n"
