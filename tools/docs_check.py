"""Check a built docs site: every `Docs:` link in rlnb's module docstrings, every link in llms.txt, every image and
every local link of every page must point at a file of the site, every module must have its API page, and the index
(genindex.html) must list every exported name as `name (rlnb.module)`. Exits 1, naming each one missing.

    python tools/docs_check.py _docs/_build/html [--pkg rlnb]

The links' common prefix, the site's address (e.g. https://rlnb.github.io/rlnb/), is read from pyproject.toml's
[project.urls] Documentation and stripped: `Docs: https://rlnb.github.io/rlnb/core.html.md` -> core.html.md."""
import argparse, ast, html as html_lib, re, sys, tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Links(HTMLParser):
    "The local targets of a page's <a href>, <img src>, <script src> and <link href>."
    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        url = attrs.get("src") if tag in ("img", "script") else attrs.get("href") if tag in ("a", "link") else None
        if url and not urlsplit(url).scheme and not url.startswith(("#", "//")): self.found.append((tag, url))


def site_links(html: Path) -> list[str]:
    "The problems of the pages' own links: a local file they point at that does not exist."
    problems = []
    for page in sorted(html.rglob("*.html")):
        if page.relative_to(html).parts[0] == "_static": continue  # the themes' template fragments
        parser = Links()
        parser.feed(page.read_text(errors="replace"))
        for tag, url in parser.found:
            path = unquote(urlsplit(url).path)
            if path and not (page.parent / path).resolve().exists():
                problems.append(f"{page.relative_to(html)}: <{tag}> {url} does not exist")
    return problems


def doc_links(html: Path, pkg: Path, base: str) -> tuple[int, list[str]]:
    "How many `Docs:` / llms.txt links there are, and those that point at no file of the site."
    urls = [(f.name, u) for f in sorted(pkg.glob("*.py")) for u in re.findall(r"Docs: (\S+?)\"*$", f.read_text(), re.M)]
    llms = html / "llms.txt"
    if llms.exists(): urls += [("llms.txt", u) for u in re.findall(r"\]\((https?://[^)]+)\)", llms.read_text())]
    problems = []
    for where, url in urls:
        if not url.startswith(base): problems.append(f"{where}: {url} is not under the site's address {base}")
        else:  # core.html.md: the page itself, core.html and, for a module, its API page api/core.html
            rel = url[len(base):]
            api = [f"api/{rel.removesuffix('.html.md')}.html"] if where.endswith(".py") else []
            for rel in dict.fromkeys([rel, rel.removesuffix(".md"), *api]):
                if not (html / rel).is_file(): problems.append(f"{where}: {url} -> no {rel} in the site")
    return len(urls), problems


def index_missing(html: Path, pkg: Path) -> list[str]:
    "The names in the modules' `__all__` that the site's index (genindex.html) does not list as `name (pkg.module)`."
    index = html_lib.unescape((html / "genindex.html").read_text()) if (html / "genindex.html").exists() else ""
    missing = []
    for f in sorted(pkg.glob("*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                names = ast.literal_eval(node.value)
                missing += [f"genindex.html: no entry {n} ({pkg.name}.{f.stem})" for n in names
                            if f"{n} ({pkg.name}.{f.stem})" not in index]
    return missing


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path, nargs="?", default=Path("_docs/_build/html"))
    ap.add_argument("--pkg", type=Path, default=Path("rlnb"))
    a = ap.parse_args()
    base = tomllib.loads(Path("pyproject.toml").read_text())["project"]["urls"]["Documentation"].rstrip("/") + "/"
    n, problems = doc_links(a.html, a.pkg, base)
    problems += site_links(a.html) + index_missing(a.html, a.pkg)
    for p in problems: print("docs_check:", p, file=sys.stderr)
    if problems: sys.exit(f"docs_check: {len(problems)} broken links or missing index entries (above)")
    print(f"docs_check: {n} Docs:/llms.txt links and every page's images and local links resolve; the index lists "
          "every exported name")
