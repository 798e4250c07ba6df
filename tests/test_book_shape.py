"""Every chapter of the book has the same shape: an opening that says what it follows and what it simplifies or drops,
and an ending with what it taught: a picture or a table its code made, a summary, then 2-4 exercises. Each loss
chapter shows its equation beside the code that computes it. Read from the notebooks' saved outputs."""
import json
import re
from pathlib import Path

import pytest
import yaml

NBS = Path(__file__).parents[1] / "nbs"
TOC = yaml.safe_load((NBS / "_toc.yml").read_text())
CHAPTERS = [c["file"] for p in TOC["parts"] for c in p["chapters"] if not c["file"].startswith("experiments/")]
# chapters that define a loss or an advantage: each shows its equation ($$ ... $$) and the lines that compute it
LOSS_CHAPTERS = ["00_from_scratch", "23_kl", "30_algorithms", "31_catalogue", "32_dpo", "33_ppo", "34_mismatch",
                 "35_policy_losses", "35a_sequence_ratios", "35b_trust_regions", "42_step", "44_sft", "51_entropy",
                 "52_baselines", "53_passk", "54_distillation", "55_off_policy_masks"]


def cells(chapter: str) -> list[dict]:
    return json.loads((NBS / f"{chapter}.ipynb").read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def heading_index(cells_: list[dict], title: str) -> int | None:
    "The index of the markdown cell whose level-2 heading is `title`, or None."
    found = [i for i, c in enumerate(cells_)
             if c["cell_type"] == "markdown" and re.search(rf"^## {title}\s*$", text(c), re.M)]
    return found[-1] if found else None


def shows_a_result(cell: dict) -> bool:
    "A code cell whose saved output is a picture or a table (a DataFrame, or a markdown/pandas table printed)."
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data or "text/html" in data: return True  # a figure, a table or a rendered view
        printed = "".join(out.get("text", [])) + "".join(data.get("text/plain", []))
        if re.search(r"^\|.*\|\s*$", printed, re.M) or re.search(r"^\s*\S+(\s{2,}\S+){2,}\s*$", printed, re.M):
            return True
    return False


def exercises(cells_: list[dict]) -> list[str]:
    "The exercises: the top-level items of the numbered list under '## Exercises'."
    i = heading_index(cells_, "Exercises")
    body = "\n".join(text(c) for c in cells_[i:] if c["cell_type"] == "markdown")
    return re.findall(r"^\d+\. .+$", body, re.M)


def test_the_book_has_every_chapter():
    assert len(CHAPTERS) >= 55 and len(set(CHAPTERS)) == len(CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_ends_with_what_it_taught(chapter):
    cs = cells(chapter)
    summary, exercise = heading_index(cs, "Summary"), heading_index(cs, "Exercises")
    assert summary is not None, f"{chapter}: no '## Summary'"
    assert exercise is not None and exercise >= summary, f"{chapter}: no '## Exercises' after the summary"
    assert cs[-1]["cell_type"] == "markdown", f"{chapter} ends on a code cell"
    assert all(c["cell_type"] == "markdown" for c in cs[summary:]), f"{chapter}: code after the summary"
    last_code = max(i for i, c in enumerate(cs[:summary]) if c["cell_type"] == "code")
    results = [i for i, c in enumerate(cs[:summary]) if c["cell_type"] == "code" and shows_a_result(c)]
    assert results and results[-1] >= last_code - 2, f"{chapter}: no picture or table just before the summary"
    assert 2 <= len(exercises(cs)) <= 4, f"{chapter}: {len(exercises(cs))} exercises (2-4)"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapter_says_what_it_follows(chapter):
    opening = "\n".join(text(c) for c in cells(chapter)[:4] if c["cell_type"] == "markdown")
    assert re.search(r"\b[Ff]ollows\b", opening), f"{chapter}: the opening does not say what it follows"
    assert re.search(r"\b([Ss]implif|[Dd]rops?\b|[Ll]eaves out)", opening), \
        f"{chapter}: the opening does not say what it simplifies or drops"


@pytest.mark.parametrize("chapter", LOSS_CHAPTERS)
def test_a_loss_chapter_shows_its_equation_beside_its_code(chapter):
    cs = cells(chapter)
    equations = [i for i, c in enumerate(cs) if c["cell_type"] == "markdown" and "$$" in text(c)]
    assert equations, f"{chapter}: no displayed equation"
    near_code = [i for i in equations if any(c["cell_type"] == "code" or "```" in text(c) or "`" in text(c)
                                             for c in cs[i:i + 2])]
    assert near_code, f"{chapter}: no equation beside the code that computes it"


def test_the_shape_checks_can_fail():
    "A chapter cut short (no exercises, ending on code) fails the checks above."
    cs = cells("00_from_scratch")
    cut = cs[:heading_index(cs, "Exercises")] + [{"cell_type": "code", "source": ["1"], "outputs": []}]
    assert heading_index(cut, "Exercises") is None and cut[-1]["cell_type"] == "code"
    assert not shows_a_result({"outputs": [{"output_type": "stream", "text": ["done\n"]}]})
    assert shows_a_result({"outputs": [{"data": {"image/png": "..."}}]})
