"""The algorithm catalogue says the same everywhere: `rlnb.ALGORITHMS` as `import rlnb` fills it, the README's table
of algorithms, the zoo script (benchmarks/algorithms.py) and its saved reference runs (chapter 83)."""
import importlib.util, json, re, subprocess, sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("zoo_script", ROOT / "benchmarks" / "algorithms.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

SMOLLM2_REQUIRED = {"grpo", "dapo", "cispo", "gspo"}  # and at least one algorithm added in 2026


@lru_cache(maxsize=None)
def registered() -> tuple[str, ...]:
    "The names `import rlnb` registers, in a fresh process (no test's own algorithm among them)."
    out = subprocess.run([sys.executable, "-c", "import json, rlnb; print(json.dumps(list(rlnb.ALGORITHMS)))"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return tuple(json.loads(out.stdout))


def readme_algorithms() -> list[str]:
    "The names in the first column of the README's table under '## The algorithms'."
    text = (ROOT / "README.md").read_text()
    assert "\n## The algorithms\n" in text, "the README has no '## The algorithms' section"
    section = text.split("\n## The algorithms\n", 1)[1].split("\n## ", 1)[0]
    return [m[1] for line in section.splitlines() if (m := re.match(r"\| `([^`]+)` \|", line))]


def test_the_readme_lists_every_registered_algorithm_once():
    listed = readme_algorithms()
    assert len(listed) == len(set(listed)), [n for n in listed if listed.count(n) > 1]
    assert set(listed) == set(registered()), (set(registered()) - set(listed), set(listed) - set(registered()))


def test_the_zoo_runs_exactly_the_registry():
    in_families = [n for _, family in zoo.FAMILIES for n in family]
    assert len(in_families) == len(set(in_families))
    assert set(in_families) == set(registered()) == set(zoo.SETTINGS)


def _sweep(name: str) -> tuple[dict, dict]:
    info = zoo.read_json(str(ROOT / "benchmarks" / "reference" / name))
    by_algo = {}
    for run in zoo.finished(info["runs"]): by_algo.setdefault(run["algorithm"], []).append(run)
    return info, by_algo


def test_the_addition_reference_has_three_seeds_of_every_algorithm_at_todays_settings():
    info, by_algo = _sweep("addition.json.gz")
    assert set(by_algo) == set(registered())
    for name, runs in by_algo.items():
        assert sorted(r["seed"] for r in runs) == [0, 1, 2], name
        today = zoo.settings_for(name, info["args"]["set"], "addition")
        assert all(r["settings"] == today for r in runs), f"{name}: its reference ran other settings than SETTINGS"
        assert all(r["iterations"] == info["args"]["iterations"] for r in runs), name


def test_the_smollm2_reference_has_the_algorithms_that_matter_there():
    info, by_algo = _sweep("smollm2.json.gz")
    assert SMOLLM2_REQUIRED <= set(by_algo) <= set(registered())
    assert set(by_algo) - SMOLLM2_REQUIRED, "no algorithm beyond GRPO, DAPO, CISPO and GSPO"
    for name, runs in by_algo.items():
        assert sorted(r["seed"] for r in runs) == [0, 1, 2], name  # three seeds, as on the tiny model
        assert all(r["iterations"] == info["args"]["iterations"] for r in runs), name


@pytest.mark.parametrize("name", ["addition.json.gz", "smollm2.json.gz"])
def test_each_reference_says_how_it_was_made(name):
    info, _ = _sweep(name)
    assert info["command"].startswith("python benchmarks/algorithms.py") and not info["partial"]
    assert info["machine"]["cores"] >= 1 and info["commits"] and "?" not in info["commits"]


# the algorithms of 2026, one knob each changed through -p algorithm_options
ADDED_2026 = {"gspo_token": {"clip_eps": 1e-3}, "luspo": {"clip_eps_high": 1e-3}, "vespo": {"k_pos": 1.5},
              "intellect2": {"delta": 3.0}, "dro": {"dro_beta": 0.2}, "topr": {"negative_weight": 0.5},
              "m2po": {"m2_threshold": 0.02}, "reinforce++_baseline": {"eps": 1e-6}, "opo": {"clip_eps": 0.1},
              "gpg": {"f_norm": 0.5}, "lite_ppo": {"eps": 1e-3}, "otb": {"eps": 1e-6}, "opsd": {"teacher_coef": 0.5},
              "sdpo": {"teacher_coef": 0.5}}
TINY_RUN = ["-p", "num_iterations", "1", "-p", "prompts_per_step", "2", "-p", "group_size", "4", "-p", "eval_every",
            "0", "-p", "max_new_tokens", "4"]


def test_every_2026_algorithm_is_listed_here():
    assert set(ADDED_2026) <= set(registered())


@pytest.mark.slow
def test_each_2026_algorithm_trains_from_the_command_line_with_its_options(capsys):
    "`rlnb train -p algorithm NAME -p algorithm_options {...}`: one iteration each, the options reaching the spec."
    from rlnb.cli import main
    for name, options in ADDED_2026.items():
        code = main(["train", "-p", "algorithm", name, "-p", "algorithm_options", json.dumps(options), *TINY_RUN])
        out = capsys.readouterr()
        assert code == 0 and "trained 1 steps" in out.out, (name, out.err[-2000:])


@pytest.mark.parametrize("name, options, named", [("vespo", {"k_pos": -1.0}, "k_pos"), ("intellect2", {"delta": 0.5},
                         "delta"), ("m2po", {"m2_threshold": float("nan")}, "m2_threshold"),
                         ("gpg", {"f_norm": "one"}, "f_norm"), ("opsd", {"teacher_coef": 0.0}, "teacher_coef")])
def test_a_bad_option_stops_the_command_naming_it(capsys, name, options, named):
    "A bad knob is refused before anything trains: exit status 2, the knob named on stderr."
    from rlnb.cli import main
    assert main(["train", "-p", "algorithm", name, "-p", "algorithm_options", json.dumps(options), *TINY_RUN]) == 2
    assert named in capsys.readouterr().err
