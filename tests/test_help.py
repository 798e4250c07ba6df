"`help()` on rlnb's public functions and records shows the comments written beside their parameters and fields."
import inspect, pydoc, sys, time

import pytest

import rlnb
from rlnb.docstrings import document_fields, document_parameters


@pytest.mark.parametrize("fn", [rlnb.train, rlnb.grpo_loss, rlnb.collate])
def test_help_lists_every_parameter_with_its_comment(fn):
    text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
    source = sys.modules[fn.__module__].__file__
    lines = open(source, encoding="utf-8").read().splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"def {fn.__name__}("))
    for name in inspect.signature(fn).parameters:
        # the comment beside the parameter, or on the line above it
        k = next(k for k in range(start + 1, start + 60) if lines[k].lstrip().startswith(f"{name}:")
                 or lines[k].lstrip().startswith(f"{name}=") or lines[k].strip() == f"{name},")
        comment = (lines[k].split("  # ", 1)[1] if "  # " in lines[k] else lines[k - 1].strip().removeprefix("# "))
        assert f"    {name}: {comment}" in fn.__doc__, (fn.__name__, name)
        assert f"{name}: {comment}" in text


def test_return_comment_and_known_texts():
    assert "Returns: (scalar loss, metrics)" in rlnb.grpo_loss.__doc__
    assert "    prompts: a fixed list of prompts (or TaskExamples) read in seeded epochs, or a DataBuffer" in \
        rlnb.train.__doc__  # a comment on the line above the parameter
    assert "    pad_token_id: id written into padding positions (may equal the EOS id)" in rlnb.collate.__doc__
    assert rlnb.collate.__doc__.startswith("Pad rollouts into training tensors")  # the docstring comes first
    assert "    folder: the folder to hold" in rlnb.folder_lock.__doc__  # a context manager: its wrapped function


def test_second_call_changes_nothing():
    before = rlnb.train.__doc__
    document_parameters(rlnb.train, rlnb.collate)
    assert rlnb.train.__doc__ == before and before.count("Parameters:") == 1


def test_function_without_source_file_is_left_alone():
    namespace = {}
    code = ('def mean_reward(\n    rollouts,  # a list of rollouts\n) -> float:  # their mean reward\n'
            '    "The mean reward."\n    return 0.0\n')
    exec(compile(code, "<ipython-input-1>", "exec"), namespace)  # as a notebook cell is compiled: no file
    exec(compile(code, "/tmp/ipykernel_1/0123.py", "exec"), namespace | {"x": 1})
    document_parameters(namespace["mean_reward"], len, 3, None, rlnb.Rollout)  # and things that are not functions
    assert namespace["mean_reward"].__doc__ == "The mean reward."


def test_function_in_a_file(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text('@staticmethod\ndef f(\n    a: int = 1,  # the first\n    # the second\n    b: str = "#",\n'
                    '    *rest,  # more\n    c: dict = {"x": (1,\n                    2)},\n    **kw,  # others\n'
                    ') -> int:  # a number\n    "Doc."\n    return a\n\n\ndef g(x, y) -> int:  # not a parameter\n'
                    '    return x\n')
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    f, g = namespace["f"].__func__, namespace["g"]
    document_parameters(f, g)
    assert f.__doc__ == ("Doc.\n\nParameters:\n    a: the first\n    b: the second\n    rest: more\n    kw: others\n"
                         "Returns: a number")
    assert g.__doc__ is None  # a one-line signature's comment belongs to no parameter


def test_fields_documented():
    assert rlnb.Rollout.prompt.__doc__ == "prompt text as shown to the model (after the chat template)"
    assert rlnb.Batch.rollouts.__doc__ == "the samples"  # a field of a base class
    assert all(not getattr(rlnb.TrainingConfig, f).__doc__.startswith("Alias") for f in rlnb.TrainingConfig._fields)


def test_cheap():
    functions = [getattr(m, n) for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("rlnb.")
                 for n in getattr(m, "__all__", ())]
    saved = {f: f.__doc__ for f in functions if callable(f) and hasattr(f, "__code__")}
    records = [f for f in functions if isinstance(f, type) and hasattr(f, "_fields")]
    try:
        for f in saved: f.__doc__ = (f.__doc__ or "").split("\n\nParameters:")[0].split("\n\nReturns:")[0]
        t0 = time.perf_counter()
        document_parameters(*functions)
        document_fields(*records)
        assert time.perf_counter() - t0 < 0.5  # about 30 ms; import budget: well under 50 ms on a quiet machine
    finally:
        for f, doc in saved.items(): f.__doc__ = doc
