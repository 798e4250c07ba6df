"The papermill training notebook, run the way an experimenter runs it."
import ast, json
from pathlib import Path

import papermill as pm
import pytest

from rlnb.core import TRAINING_CONFIG_SECTIONS, TrainingConfig

ROOT = Path(__file__).resolve().parent.parent
NB = ROOT / "nbs" / "experiments" / "grpo_training.ipynb"


def parameters_cell() -> str:
    cells = json.loads(NB.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell must be tagged `parameters`"
    return "".join(tagged[0]["source"])


def test_parameters_cell_is_the_config_flat():
    "Every TrainingConfig field, in order and by section, with its default (output_dir aside); papermill parses it."
    src = parameters_cell()
    tree = ast.parse(src)
    names = [node.targets[0].id for node in tree.body]
    assert names == list(TrainingConfig._fields)
    headers = [line[2:].split(":")[0] for line in src.splitlines() if line.startswith("# ")]
    assert headers == list(TRAINING_CONFIG_SECTIONS)  # a comment line opens each section
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body}
    defaults = TrainingConfig()._asdict()
    assert ({k: v for k, v in values.items() if k != "output_dir"}
            == {k: v for k, v in defaults.items() if k != "output_dir"})
    assert all(line.count("=") == 1 for line in src.splitlines() if line.strip() and not line.startswith("#")), (
        "papermill cannot parse a line with two '='")
    assert "#| export" not in NB.read_text()


@pytest.mark.parametrize("params, message", [({"lerning_rate": 1.0}, "did you mean 'learning_rate'"),
                                             ({"learning_rate": "abc"}, "`learning_rate` must be float")])
@pytest.mark.slow
def test_bad_parameters_stop_the_run_naming_them(tmp_path, params, message):
    with pytest.raises(pm.PapermillExecutionError, match=message):
        pm.execute_notebook(str(NB), str(tmp_path / "run.ipynb"), cwd=str(ROOT), progress_bar=False,
                            parameters=dict(output_dir=str(tmp_path / "out"), **params))


@pytest.mark.slow
def test_papermill_run_writes_outputs_and_learns(tmp_path):
    out = tmp_path / "run"
    pm.execute_notebook(str(NB), str(tmp_path / "run.ipynb"), cwd=str(ROOT), progress_bar=False,
                        parameters=dict(output_dir=str(out), num_iterations=40, eval_every=20, seed=0))
    for name in ("metrics.jsonl", "summary.json", "reward_curve.png"):
        assert (out / name).stat().st_size > 0, f"{name} missing or empty"
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum("reward/mean" in r for r in rows) == 40
    s = json.loads((out / "summary.json").read_text())
    assert s["params"]["num_iterations"] == 40 and s["steps"] == 40 and s["reward_window"] == 10
    # greedy accuracy on held-out prompts is deterministic for the seed; it would stay put if no gradient arrived
    assert s["accuracy_final"] > s["accuracy_start"], (
        f"accuracy did not rise: {s['accuracy_start']} -> {s['accuracy_final']}")
    executed = json.loads((tmp_path / "run.ipynb").read_text())
    text = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
                   for c in executed["cells"] for o in c.get("outputs", []))
    assert "[40/40 100%]" in text, "no text progress line in the executed notebook"
