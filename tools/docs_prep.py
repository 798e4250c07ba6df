"""The docs site's source, built from nbs/ into a build folder (default _docs/src); the notebooks are not touched.

    python tools/docs_prep.py [--nbs nbs] [--pkg rlnb] [--out _docs/src]

1. Every notebook is copied with its saved outputs, its nbdev directives (`#| ...` lines at the top of a cell) taken
   out of the shown code and turned into myst-nb cell tags: `#| hide`, `#| include: false` and the `#| default_exp`
   cell are not shown (`remove-cell`); `#| echo: false` / `#| hide_input` hide the code but keep its outputs
   (`remove-input`); `#| output: false` / `#| hide_output` hide the outputs (`remove-output`); `#| code-fold` folds the
   code (`hide-input`); the others (`#| export`, `#| exporti`, `#| eval: false`, `#| slow`, ...) are only taken out.
   Saved widget views (their state is not saved, so nothing could draw them) become a short note, and the notebook's
   widget metadata goes, so no page loads the widget JavaScript from a CDN.
2. One API reference page per module, api/<module>.md (tools/docs_api.py: read from rlnb/*.py, nothing imported),
   added to the table of contents (nbs/_toc.yml) as the part "API reference".
3. `_extra/`, copied as it is into the site's root: `<module>.html.md` for every chapter (the chapter as markdown, its
   code, text outputs and the module's API; what the `Docs:` links in rlnb's module docstrings point at, as nbdev
   writes them) and llms.txt.
4. `_mathjax/mathjax/` (the site's `_static/mathjax/`): MathJax 3 from the django-static-mathjax wheel in the docs
   venv, so math renders offline (not in `_static/`: Jupyter Book would load every .js file there on every page).
Files whose content did not change are not rewritten, so Sphinx rebuilds only the pages that changed.
"""
import argparse, copy, json, re, shutil, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_api  # noqa: E402

DIRECTIVE = re.compile(r"^\s*#\s*\|\s*(.*?)\s*$")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = "*(A live ipywidgets widget: it draws in Jupyter. This chapter's screenshot shows what it looks like.)*"


def directives(source: str) -> tuple[dict, str]:
    "The directives at the top of a cell ({name: value}) and the source without them."
    lines, found = source.splitlines(), {}
    while lines and (m := DIRECTIVE.match(lines[0])):
        text = m.group(1)
        key, sep, value = text.partition(":") if re.match(r"[\w-]+\s*:", text) else text.partition(" ")
        found[key.strip()] = value.strip()
        lines.pop(0)
    while lines and not lines[0].strip(): lines.pop(0)
    return found, "\n".join(lines)


def tags_for(found: dict) -> list[str]:
    "The myst-nb tags that give a cell's directives their effect in the docs."
    false = lambda k: found.get(k, "").lower() == "false"  # noqa: E731
    tags = []
    if "hide" in found or "default_exp" in found or false("include"): tags.append("remove-cell")
    if false("echo") or "hide_input" in found: tags.append("remove-input")
    if false("output") or "hide_output" in found: tags.append("remove-output")
    if found.get("code-fold", "false").lower() in ("true", "show"): tags.append("hide-input")
    return tags


def convert(nb: dict) -> dict:
    "The notebook as the docs show it: directives out, their effect as tags, widget views as a note."
    nb = copy.deepcopy(nb)
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        found, src = directives(src)
        tags = tags_for(found)
        if cell["cell_type"] == "code" and not src.strip() and not cell.get("outputs"): tags.append("remove-cell")
        cell["source"] = src
        if tags:
            meta = cell.setdefault("metadata", {})
            meta["tags"] = list(dict.fromkeys(meta.get("tags", []) + tags))
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}): out["data"] = {"text/markdown": WIDGET_NOTE}
    return nb


def shown(cell: dict) -> bool:
    return "remove-cell" not in cell.get("metadata", {}).get("tags", [])


def chapter_markdown(nb: dict, api: str | None, limit: int = 60) -> str:
    "A converted notebook as one markdown page (nbdev's `.html.md`): text, code, text outputs, then the module's API."
    out = []
    for cell in filter(shown, nb["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "markdown": out.append(cell["source"].strip()); continue
        if cell["cell_type"] != "code": continue
        if "remove-input" not in tags: out.append(f"```python\n{cell['source']}\n```")
        if "remove-output" in tags: continue
        for o in cell.get("outputs", []):
            text = "".join(o["text"]) if o.get("output_type") == "stream" else ""
            data = o.get("data", {})
            if not text and "text/markdown" in data: out.append("".join(data["text/markdown"]).strip()); continue
            if not text and "text/plain" in data: text = "".join(data["text/plain"])
            if not text and "image/png" in data: out.append("*(a figure)*"); continue
            lines = text.rstrip().splitlines()
            if len(lines) > limit: lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
            if lines: out.append("```\n" + "\n".join(lines) + "\n```")
    if api:  # the API page without its title and its link back to this chapter, its headings one level down
        body = re.sub(r"^The chapter that builds and explains it: .*\n", "", api.split("\n", 1)[1], flags=re.M)
        out.append("## API\n\n" + re.sub(r"^(#+) ", r"#\1 ", body, flags=re.M).strip())
    return "\n\n".join(out) + "\n"


def write(path: Path, text: str) -> None:
    "Write `text` unless `path` already holds it (an unchanged file keeps its time: Sphinx skips its page)."
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text: path.write_text(text)


def copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.stat().st_size != src.stat().st_size or dst.read_bytes() != src.read_bytes():
        shutil.copy2(src, dst)


MATHJAX_PARTS = ("tex-mml-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "ui")


def copy_mathjax(out: Path) -> None:
    "MathJax 3's TeX-to-HTML component and the files it loads, from the django-static-mathjax package."
    try:
        import mathjax
    except ImportError:
        sys.exit("docs_prep: MathJax is missing: pip install django-static-mathjax (scripts/docs.sh does)")
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    for part in MATHJAX_PARTS:
        src = es5 / part
        for f in ([src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())):
            copy_file(f, out / f.relative_to(es5))


def toc_with_api(toc: str, mods: list[str]) -> str:
    "nbs/_toc.yml with the part 'API reference' appended: one page per module."
    chapters = "".join(f"      - file: api/{m}\n" for m in mods)
    return toc.rstrip("\n") + '\n  - caption: "API reference"\n    chapters:\n' + chapters


def prepare(nbs: Path, pkg: Path, out: Path) -> dict:
    "Build the site's source in `out`; returns {module: chapter notebook name}."
    keep = set()
    exported = {}
    for src in sorted(nbs.rglob("*")):
        rel = src.relative_to(nbs)
        if src.is_dir() or any(p.startswith(".") or p == "_build" for p in rel.parts): continue
        keep.add(rel)
        if src.suffix != ".ipynb": copy_file(src, out / rel); continue
        nb = json.loads(src.read_text())
        for cell in nb["cells"]:
            found, _ = directives("".join(cell["source"]))
            if "default_exp" in found: exported[found["default_exp"]] = str(rel.with_suffix(""))
        write(out / rel, json.dumps(convert(nb), indent=1, ensure_ascii=False) + "\n")
    mods = docs_api.write_pages(pkg, out / "api", exported)
    keep |= {Path("api") / f"{m}.md" for m in mods}
    write(out / "_toc.yml", toc_with_api((nbs / "_toc.yml").read_text(), mods))
    extra = out / "_extra"
    for rel in sorted(keep):
        if rel.suffix != ".ipynb": continue
        name = re.sub(r"^\d+[a-z]?_", "", rel.stem)
        api = (out / "api" / f"{name}.md").read_text() if name in mods else None
        nb = json.loads((out / rel).read_text())
        write(extra / rel.parent / f"{name}.html.md", chapter_markdown(nb, api))
        keep.add(Path("_extra") / rel.parent / f"{name}.html.md")
    if (nbs / "llms.txt").exists():
        copy_file(nbs / "llms.txt", extra / "llms.txt")
        keep.add(Path("_extra") / "llms.txt")
    for stale in [p for p in out.rglob("*") if p.is_file() and p.relative_to(out).parts[0] != "_mathjax"]:
        if stale.relative_to(out) not in keep and stale.name != "_toc.yml": stale.unlink()
    copy_mathjax(out / "_mathjax" / "mathjax")
    return exported


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nbs", type=Path, default=Path("nbs"))
    ap.add_argument("--pkg", type=Path, default=Path("rlnb"))
    ap.add_argument("--out", type=Path, default=Path("_docs/src"))
    a = ap.parse_args()
    exported = prepare(a.nbs, a.pkg, a.out)
    print(f"docs source in {a.out}: {len(list(a.out.rglob('*.ipynb')))} notebooks, {len(exported)} module chapters")
