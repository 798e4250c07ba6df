"""The book's order: no chapter uses a name taught in a later chapter.

Every public name of `rlnb` belongs to the chapter whose notebook exports its module (`#| default_exp`). Each code
cell of each chapter in `nbs/_toc.yml` is read (by `ast`, not by text) for the rlnb names it uses: `from rlnb.m
import x`, `import rlnb.m`, `rlnb.x`, `rlnb.m.x`. A use of a later chapter's name fails the test, with one exception:
the part *Under the hood* is the plumbing the library stands on (caches, locks, argument checks, how the tiny model is
made, `train`'s checks), so a chapter's exported code may import it, as it imports torch, while the cells a reader
runs (examples, tests, plots) never call it."""
import ast
import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

import rlnb

NBS = Path(__file__).parents[1] / "nbs"
UNDER_THE_HOOD = "Under the hood"
# (chapter, module): a use that reads forward on purpose, with the reason the chapter's prose gives
ALLOWED = {
    ("00_from_scratch", "tiny"): "the one-page GRPO loads the tiny model by name; chapter 12 shows what it is",
    ("00_from_scratch", "algorithms"): "its last cell checks the page's loss against rlnb's, taught in chapter 30",
}


@cache
def chapters() -> list[tuple[str, str]]:
    "[(chapter, part caption)] in reading order."
    toc = yaml.safe_load((NBS / "_toc.yml").read_text())
    return [(c["file"], p["caption"]) for p in toc["parts"] for c in p["chapters"]]


def code_cells(chapter: str) -> list[tuple[bool, str]]:
    "[(exported?, source)] of a chapter's code cells, magics and shell lines blanked so `ast` can read them."
    nb = json.loads((NBS / f"{chapter}.ipynb").read_text())
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code": continue
        source = "".join(cell["source"])
        exported = re.search(r"^#\|\s*export", source, re.M) is not None
        cells.append((exported, re.sub(r"^\s*[%!].*$", "", source, flags=re.M)))
    return cells


@cache
def module_chapters() -> dict[str, str]:
    "{module: the chapter that exports it}."
    found = {}
    for chapter, _ in chapters():
        for _, source in code_cells(chapter):
            m = re.search(r"^#\|\s*default_exp\s+(\S+)", source, re.M)
            if m: found[m.group(1)] = chapter
    return found


@cache
def name_modules() -> dict[str, str]:
    "{public name: its module}, from each module's `__all__`."
    found = {}
    for module in module_chapters():
        for name in getattr(__import__(f"rlnb.{module}", fromlist=["__all__"]), "__all__", []):
            found.setdefault(name, module)
    return found


def used_modules(source: str) -> set[str]:
    "The rlnb modules a cell uses: imported from, imported, or reached as `rlnb.name` / `rlnb.module.name`."
    modules, names = set(), name_modules()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "rlnb":
            modules |= {a.name if a.name in module_chapters() else names.get(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlnb."):
            modules.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            modules |= {a.name.split(".")[1] for a in node.names if a.name.startswith("rlnb.")}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "rlnb":
            modules.add(node.attr if node.attr in module_chapters() else names.get(node.attr))
    return modules & set(module_chapters())


def forward_uses() -> list[str]:
    "Each use of a later chapter's module, as 'chapter (cell kind) uses module (its chapter)'."
    position = {c: i for i, (c, _) in enumerate(chapters())}
    part = dict(chapters())
    problems = []
    for chapter, caption in chapters():
        for exported, source in code_cells(chapter):
            for module in sorted(used_modules(source)):
                home = module_chapters()[module]
                if position[home] <= position[chapter] or (chapter, module) in ALLOWED: continue
                if exported and UNDER_THE_HOOD in part[home] and UNDER_THE_HOOD not in caption: continue
                kind = "exported code" if exported else "a reader's cell"
                problems.append(f"{chapter} ({kind}) uses rlnb.{module}, taught later in {home}")
    return sorted(set(problems))


def test_every_module_and_name_has_a_chapter():
    assert len(module_chapters()) >= 50
    packaged = {p.stem for p in Path(rlnb.__file__).parent.glob("*.py") if not p.stem.startswith("_")}
    assert packaged == set(module_chapters()), packaged ^ set(module_chapters())
    assert {"train", "grpo_loss", "collate", "load_run", "build_atomically"} <= set(name_modules())


def test_the_reader_needs_nothing_taught_later():
    assert forward_uses() == []


def test_under_the_hood_is_the_last_part():
    captions = list(dict.fromkeys(caption for _, caption in chapters()))
    assert UNDER_THE_HOOD in captions[-1]


@pytest.mark.parametrize("source, chapter, expected", [
    ("from rlnb.training import train", "00_from_scratch", "uses rlnb.training"),
    ("import rlnb\nrlnb.train(config)", "10_core", "uses rlnb.training"),
    ("from rlnb import quick_start_training", "20b_generation", "uses rlnb.quickstart"),
    ("import rlnb.distributed", "60_tools", "uses rlnb.distributed"),
])
def test_a_forward_use_is_found(source, chapter, expected, monkeypatch):
    "Each way of using a name is seen: a chapter given this cell would fail the test."
    real = code_cells
    monkeypatch.setattr(sys.modules[__name__], "code_cells",
                        lambda c: real(c) + [(False, source)] if c == chapter else real(c))
    assert any(expected in p and p.startswith(chapter) for p in forward_uses())


def test_exported_code_may_stand_on_the_hood_but_a_reader_cell_may_not(monkeypatch):
    real = code_cells
    cell = "from rlnb.cache import build_atomically"
    monkeypatch.setattr(sys.modules[__name__], "code_cells",
                        lambda c: real(c) + [(True, cell)] if c == "20_decoding" else real(c))
    assert not any(p.startswith("20_decoding") for p in forward_uses())
    monkeypatch.setattr(sys.modules[__name__], "code_cells",
                        lambda c: real(c) + [(False, cell)] if c == "20_decoding" else real(c))
    assert "20_decoding (a reader's cell) uses rlnb.cache, taught later in 90_cache" in forward_uses()
