"""Redirect pages for a built docs site: `experiments.html` -> `80_experiments.html`, for every numbered chapter.

nbdev names a chapter's page after the notebook without its number (the `Docs:` links in rlnb's module docstrings
use those names); Jupyter Book names it after the file. Usage: python tools/docs_redirects.py _docs/_build/html"""
import re, sys
from pathlib import Path

PAGE = '<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={0}"><a href="{0}">{0}</a>\n'


def write_redirects(html: Path) -> list[str]:
    "One redirect page per numbered chapter page in `html`; returns the names written."
    written = []
    for page in sorted(html.glob("*.html")):
        m = re.fullmatch(r"\d+[a-z]?_(\w+)\.html", page.name)
        if m and not (html / f"{m.group(1)}.html").exists():
            (html / f"{m.group(1)}.html").write_text(PAGE.format(page.name))
            written.append(f"{m.group(1)}.html")
    return written


if __name__ == "__main__":
    names = write_redirects(Path(sys.argv[1] if len(sys.argv) > 1 else "_docs/_build/html"))
    print(f"{len(names)} redirect pages (e.g. {', '.join(names[:3])})")
