"The docs build's own tools: nbdev directives become myst-nb tags, docments comments reach the API pages."
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import docs_api, docs_prep  # noqa: E402


def cell(source, outputs=()):
    return {"cell_type": "code", "source": source, "metadata": {}, "outputs": list(outputs)}


def test_directives_become_tags():
    shown = {"text/plain": "1"}
    nb = {"metadata": {"widgets": {}}, "cells": [
        cell("#| default_exp core"), cell("#| hide\nimport x"), cell("#| export\ndef f(): pass"),
        cell("#| echo: false\nplot()", [{"output_type": "display_data", "data": shown}]),
        cell("#| output: false\n#| eval: false\nrun()"), cell("#|include: false\ny = 1"),
        cell("x = 1  #| not a directive"),
        {"cell_type": "markdown", "source": "#| export\nText", "metadata": {}}]}
    out = docs_prep.convert(nb)
    tags = [c["metadata"].get("tags", []) for c in out["cells"]]
    assert tags == [["remove-cell"], ["remove-cell"], [], ["remove-input"], ["remove-output"], ["remove-cell"], [], []]
    assert [c["source"] for c in out["cells"]][2:] == ["def f(): pass", "plot()", "run()", "y = 1",
                                                      "x = 1  #| not a directive", "Text"]
    assert "widgets" not in out["metadata"] and "widgets" in nb["metadata"]  # the input is left as it was


def test_api_page_has_signature_docstring_and_comments(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .mod import *\n")
    (pkg / "mod.py").write_text('''"""A module.\n\nDocs: https://example.org/mod.html.md"""
__all__ = ['Cfg', 'f', 'K']
from typing import NamedTuple
class Cfg(NamedTuple):
    "A record."
    a: int = 1  # the a
    # the b, above it
    b: str | None = None
def f(x: int,  # the x
      y=2,  # the y
     ) -> int:
    "Add."
    return x + y
K = 3  # a constant
''')
    page = docs_api.module_page(pkg, "mod", "10_mod")
    assert "# pkg.mod" in page and "A module." in page and "Docs:" not in page and "[](../10_mod.ipynb)" in page
    assert "| `a` | `int` | `1` | the a |" in page and "| `b` | `str \\| None` | `None` | the b, above it |" in page
    assert "def f(x: int, y=2) -> int" in page and "| `x` | `int` |  | the x |" in page and "the y" in page
    assert "K = 3" in page and "a constant" in page
