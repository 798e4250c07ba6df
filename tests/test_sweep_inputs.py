"""Inputs of runs and sweeps that used to pass silently: a notebook without a `parameters` cell, sweep values equal
once read, a misspelt `where` name."""
import json, re

import nbformat
import pytest

from rlnb.experiments import STATUS_FILE, expand_grid, run_experiment, run_sweep
from rlnb.sweep_results import load_sweep


def notebook(path, tagged: bool):
    cell = nbformat.v4.new_code_cell("learning_rate = 1e-3\noutput_dir = 'x'",
                                     metadata={"tags": ["parameters"]} if tagged else {})
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    return path


def test_a_notebook_without_a_parameters_cell_is_refused_before_its_kernel_starts(tmp_path):
    nb = notebook(tmp_path / "untagged.ipynb", tagged=False)
    with pytest.raises(ValueError, match="has no cell tagged `parameters`"):
        run_experiment(nb, {"learning_rate": 3e-3}, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="has no cell tagged `parameters`"):
        run_sweep(nb, {"learning_rate": [1e-3, 3e-3]}, output_root=tmp_path / "sweep")


@pytest.mark.parametrize("values", [[2, 2.0], [1, True], [[1, 2], [1.0, 2.0]]])
def test_sweep_values_equal_once_read_are_refused(values):
    with pytest.raises(ValueError, match="have equal parameters"): expand_grid({"num_iterations": values})


def test_equal_settings_from_a_list_of_dicts_are_refused():
    with pytest.raises(ValueError, match="have equal parameters"):
        expand_grid([{"learning_rate": 1e-3, "num_iterations": 2}, {"learning_rate": 0.001, "num_iterations": 2.0}])


def test_a_misspelt_where_name_is_refused_naming_the_known_ones(tmp_path):
    for lr in (1e-3, 3e-3):
        run = tmp_path / f"learning_rate={lr}"
        run.mkdir()
        (run / STATUS_FILE).write_text(json.dumps({"status": "completed", "params": {"learning_rate": lr, "seed": 0}}))
    with pytest.raises(ValueError, match=r"'learnin_rate'.*did you mean 'learning_rate'\?.*learning_rate, seed"):
        load_sweep(tmp_path, where={"learnin_rate": 1e-3})
    assert len(load_sweep(tmp_path, where={"learning_rate": 3e-3}).runs) == 1


@pytest.mark.parametrize("content", [b"", b"[]", b"[" * 100_000, b"\xff\xfe", b'{"cells": 5}'])
def test_a_file_that_is_not_a_notebook_is_refused_before_a_kernel_starts(tmp_path, content):
    nb = tmp_path / "nb.ipynb"
    nb.write_bytes(content)
    with pytest.raises(ValueError, match="nb.ipynb' is not a papermill notebook"):
        run_experiment(nb, {"learning_rate": 1e-3}, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, says", [("x: " + "[" * 100_000, "nested too deeply"),
                                        ("a: &k [1]\n*k : 2", "cannot read (unhashable"),
                                        ("seed: " + "1" * 5000, "cannot read (Exceeds the limit")])
def test_yaml_that_python_cannot_build_is_named_with_its_option(text, says):
    from rlnb.cli import yaml_params
    with pytest.raises(ValueError, match=rf"^-f p.yaml: .*{re.escape(says)}"): yaml_params(text, "-f p.yaml")
