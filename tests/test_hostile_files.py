"""rlnb's files as a careless or hostile hand may leave them: JSON nested too deeply for Python's parser or holding an
integer too long to read (every reader names the file, or skips the line and says so, instead of a raw
RecursionError), and a cache folder whose path runs through a file."""
import json
import warnings

import pytest

from rlnb.checkpoints import checkpoint_metadata
from rlnb.loggers import drop_metrics_after, load_metrics
from rlnb.tasks import load_jsonl_dataset

DEEP = "[" * 100_000 + "]" * 100_000  # a RecursionError in json.loads
LONG = "1" * 5_000  # an integer past Python's 4,300-digit limit


@pytest.mark.parametrize("bad", [DEEP, LONG])
def test_a_metrics_line_too_deep_or_too_long_is_skipped_and_said(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"iteration": 1, "step": 1}) + "\n" + bad + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_metrics(path)
    assert len(rows) == 1 and any("metrics.jsonl:2" in str(w.message) for w in caught)
    assert drop_metrics_after(path, 1) >= 0  # the resume path reads the same file


@pytest.mark.parametrize("bad", [DEEP, LONG])
def test_a_checkpoints_state_json_too_deep_or_too_long_names_the_file(tmp_path, bad):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "state.json").write_text(bad)
    with pytest.raises(ValueError, match="state.json is not valid JSON"):
        checkpoint_metadata(folder)


@pytest.mark.parametrize("bad", ['{"question": "1+1=", "answer": ' + LONG + "}", '{"question": ' + DEEP + "}"])
def test_a_dataset_line_too_deep_or_too_long_names_the_line(tmp_path, bad):
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "1+1=", "answer": "2"}\n' + bad + "\n")
    with pytest.raises(ValueError, match="data.jsonl, line 2: not valid JSON"):
        load_jsonl_dataset(path)


def test_a_cache_under_a_file_names_the_variable(tmp_path, monkeypatch):
    from rlnb.tiny import load_tiny_model
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.setenv("RLNB_CACHE", str(tmp_path / "a_file" / "cache"))
    with pytest.raises(ValueError, match=r"\$RLNB_CACHE is .* is a file, not a folder"):
        load_tiny_model(progress=False, steps=3)
