"The helpers of benchmarks/algorithms.py (the algorithm zoo): noise rule, smoothing, panels, settings, --json/--report."
import importlib.util, json, math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "algorithms.py"
_spec = importlib.util.spec_from_file_location("zoo_script", _PATH)
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def test_beyond_noise():
    # means 0.8 and 0.7, stds 0.01 and 0.01, n 3 each: 2 SE = 2 * sqrt(2 * 0.0001 / 3) = 0.01633
    diff, bound, verdict = zoo.beyond_noise([0.79, 0.80, 0.81], [0.69, 0.70, 0.71])
    assert diff == pytest.approx(0.1) and bound == pytest.approx(2 * (2 * 1e-4 / 3) ** 0.5) and verdict == "yes"
    diff, bound, verdict = zoo.beyond_noise([0.6, 0.8, 1.0], [0.7, 0.7, 0.7])  # std 0.2: 2 SE = 0.231 > 0.1
    assert diff == pytest.approx(0.1) and bound == pytest.approx(2 * 0.2 / 3 ** 0.5) and verdict == "no"
    diff, bound, verdict = zoo.beyond_noise([0.9], [0.5])  # one seed: no noise estimate
    assert diff == pytest.approx(0.4) and math.isnan(bound) and verdict == "?"
    diff, bound, verdict = zoo.beyond_noise([0.9], [0.6, 0.7, 0.8])  # one seed: GRPO's std 0.1 stands for both
    assert diff == pytest.approx(0.2) and bound == pytest.approx(2 * (0.01 + 0.01 / 3) ** 0.5) and verdict == "no"


def test_mean_std_moving_mean():
    assert zoo.mean([1.0, None, float("nan"), 3.0]) == 2.0 and math.isnan(zoo.mean([]))
    assert zoo.std([1.0, 3.0]) == pytest.approx(2 ** 0.5) and zoo.std([5.0]) == 0.0
    assert zoo.moving_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert zoo.moving_mean([1.0, 2.0], 1) == [1.0, 2.0]


def test_panels_put_grpo_in_each_family():
    got = zoo.panels(["grpo", "dapo", "cispo", "remax", "dpo", "newcomer"])
    assert [g for _, g in got] == [["grpo", "dapo"], ["grpo", "cispo"], ["grpo", "remax"], ["grpo", "dpo"],
                                   ["grpo", "newcomer"]]
    assert [g for _, g in zoo.panels(["grpo"])] == [["grpo"]]
    assert [g for _, g in zoo.panels(["cispo", "sapo"])] == [["cispo", "sapo"]]


def test_settings_for_scales_the_learning_rate_per_task():
    assert zoo.settings_for("grpo", [])["learning_rate"] == 2e-3
    assert zoo.settings_for("dpo", [], "tool_use")["learning_rate"] == pytest.approx(1e-4)  # half GRPO's 2e-4
    assert zoo.settings_for("dpo", [], "tool_use")["group_size"] == 8
    changed = zoo.settings_for("grpo", ["grpo.learning_rate=5e-3", "grpo.clip_eps=0.1", "dpo.beta=1"])
    assert changed["learning_rate"] == 5e-3 and changed["algorithm_options"] == {"clip_eps": 0.1}
    assert zoo.settings_for("not_listed", [])["learning_rate"] == zoo.DEFAULT_SETTINGS["learning_rate"]
    every = ["all.generator=vllm_bf16", "all.learning_rate=1e-3", "dpo.learning_rate=5e-4"]
    assert zoo.settings_for("grpo", every) == dict(learning_rate=1e-3, generator="vllm_bf16")
    assert zoo.settings_for("dpo", every)["learning_rate"] == 5e-4  # later changes win


def test_every_registered_algorithm_has_settings_and_a_family():
    from rlnb.algorithms import ALGORITHMS
    listed = {n for _, family in zoo.FAMILIES for n in family}
    assert set(ALGORITHMS) <= set(zoo.SETTINGS) and set(ALGORITHMS) <= listed


def _run(algorithm: str, seed: int, end: float) -> dict:
    "A finished run as launch returns it: 3 iterations, evaluations 0.1 -> `end`."
    iters = [dict(iteration=i, step_s=0.5, sampled_reward=0.2, sampled_n=8) for i in (1, 2, 3)]
    return dict(algorithm=algorithm, seed=seed, iterations=3, iters=iters, process_s=2.0,
                settings=zoo.settings_for(algorithm, []),
                evals=[dict(iteration=0, value=0.1), dict(iteration=3, value=end)])


def test_save_and_report_a_stopped_sweep(tmp_path, capsys):
    "--json is written after every run; --report prints the table of the runs it holds (here 3 of 4)."
    path = tmp_path / "zoo.json"
    args = zoo.parse_args(["--algorithms", "grpo,cispo", "--seeds", "0,1", "--json", str(path), "--plot", ""])
    runs = [_run("grpo", 0, 0.5), _run("cispo", 0, 0.7), _run("grpo", 1, 0.6)]
    zoo.save(str(path), args, ["grpo", "cispo"], runs, cpus=2, load_average={}, elapsed=6.0, partial=True)
    assert [p.name for p in tmp_path.iterdir()] == ["zoo.json"]  # no temporary file left
    zoo.main(["--report", str(path)])
    out = capsys.readouterr().out
    assert "a stopped or still running sweep" in out
    assert "| grpo (0.002) | 0.100 ± 0.000 | 0.550 ± 0.071 |" in out  # both GRPO seeds: 0.5 and 0.6
    assert "| cispo (0.002) | 0.100 | 0.700 |" in out  # its one finished seed
    assert (tmp_path / "zoo.png").exists()  # drawn beside the JSON, not over the sweep's own plot


def test_report_while_some_algorithm_has_no_run(tmp_path, capsys):
    path = tmp_path / "zoo.json"
    args = zoo.parse_args(["--algorithms", "grpo,cispo", "--json", str(path)])
    zoo.save(str(path), args, ["grpo", "cispo"], [_run("grpo", 0, 0.5)], cpus=2, load_average={}, elapsed=1.0,
             partial=True)
    zoo.main(["--report", str(path), "--plot", ""])
    out = capsys.readouterr().out
    assert "no finished run yet: cispo" in out and "| grpo (0.002) |" in out and "| cispo" not in out


def test_resume_keeps_only_the_runs_of_this_sweep(tmp_path):
    "--resume: a saved run counts when its task, algorithm, seed, settings and lengths are the sweep's; others rerun."
    spec = dict(algorithm="grpo", seed=0, task="addition", iterations=3, warmup=1, eval_every=1, eval_size=8,
                threads=1, settings=dict(learning_rate=2e-3))
    run = dict(_run("grpo", 0, 0.5), task="addition", threads=1, settings=dict(learning_rate=2e-3))
    args = dict(iterations=3, warmup=1, eval_every=1, eval_size=8)
    path = tmp_path / "zoo.json"
    failed = dict(algorithm="dapo", seed=0, error="rc=1")
    path.write_text(json.dumps(dict(args=args, runs=[run, failed])))
    other = dict(spec, algorithm="dapo")
    assert zoo.resumable(str(path), [spec, other]) == [run]  # the failed dapo run is run again
    assert zoo.resumable(str(path), [dict(spec, settings=dict(learning_rate=1e-3))]) == []  # another setting
    assert zoo.resumable(str(path), [dict(spec, iterations=4)]) == []  # another length
    assert zoo.resumable(str(path), [dict(spec, seed=1)]) == []
    assert zoo.resumable(str(tmp_path / "missing.json"), [spec]) == []


def test_machine_is_described_and_floats_rounded():
    m = zoo.machine()
    assert m["cores"] >= 1 and isinstance(m["avx512"], bool)
    assert zoo.describe(dict(cpu="X", cores=2, avx512=True, avx512_bf16=False)) == "X, 2 cores, AVX-512"
    assert zoo.rounded({"a": [0.123456789, 2], "b": 1e-9 / 3}) == {"a": [0.123457, 2], "b": 3.33333e-10}


def test_a_gzip_sweep_reads_back(tmp_path):
    "--json NAME.gz writes the sweep gzip-compressed; --resume and --report read it back."
    import gzip
    info = dict(args=dict(iterations=3, warmup=1, eval_every=1, eval_size=8), runs=[])
    path = tmp_path / "zoo.json.gz"
    path.write_bytes(gzip.compress(json.dumps(info).encode()))
    assert zoo.read_json(str(path)) == info
    assert zoo.resumable(str(path), []) == []
