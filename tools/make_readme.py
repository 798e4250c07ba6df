"""Render nbs/index.ipynb to README.md (nbdev's own `nbdev-readme` needs the Quarto binary, which CI machines lack).

Markdown cells are copied; code cells are shown as Python blocks unless they start with `#| hide`; cell directives
(`#| ...`) are dropped and text outputs (stderr aside) are shown below their cell. `--check` exits 1 if README.md is
out of date.
"""
import json, re, sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
# links and images in index.ipynb are relative to nbs/ (so they work in JupyterLab and the docs); README.md sits one up
_RELATIVE_LINK = re.compile(r"(\]\()(?!https?:|/|#|nbs/)([^)\s]+\))")


def from_root(markdown: str) -> str:
    "Relative link targets of a markdown cell in nbs/, rewritten for README.md in the repository root."
    return _RELATIVE_LINK.sub(lambda m: m.group(1) + "nbs/" + m.group(2), markdown)


def render(nb_path=root/"nbs"/"index.ipynb") -> str:
    parts = []
    for cell in json.loads(Path(nb_path).read_text())["cells"]:
        src = "".join(cell["source"])
        lines = src.splitlines()
        directives = [l[2:].strip() for l in lines if l.startswith("#|")]
        body = "\n".join(l for l in lines if not l.startswith("#|")).strip()
        if any(d.split()[0] in ("hide", "exporti", "export") for d in directives if d) or not body: continue
        if cell["cell_type"] == "markdown": parts.append(from_root(body))
        elif cell["cell_type"] == "code":
            parts.append(f"```python\n{body}\n```")
            for out in cell.get("outputs", []):
                if out.get("name") == "stderr" or "application/vnd.jupyter.widget-view+json" in out.get("data", {}):
                    continue  # warnings and progress bars: not what the example shows
                text = out.get("text") or out.get("data", {}).get("text/plain")
                if text: parts.append("```\n" + "".join(text).rstrip() + "\n```")
    return "\n\n".join(parts) + "\n"

if __name__ == "__main__":
    readme = root/"README.md"
    text = render()
    if "--check" in sys.argv:
        if not readme.exists() or readme.read_text() != text:
            sys.exit("README.md is out of date: run `python tools/make_readme.py` and commit it")
    else: readme.write_text(text)
