"""API reference pages for rlnb's modules, written as MyST markdown from the source files, without importing rlnb.

Why read the source with `ast` rather than import rlnb (sphinx.ext.autodoc, `inspect`): importing rlnb needs torch,
transformers and the rest, which the docs venv does not have; reading rlnb/*.py needs only the standard library, is
offline, takes well under a second and cannot run any code. What each page holds, for each name in the module's
`__all__`: its signature, its docstring, and a table of its parameters (or a NamedTuple's / dataclass's fields) with
the comment nbdev's docments style puts beside each one (or on the line above it); a class's public methods follow it.

    python tools/docs_api.py rlnb OUT_DIR     # writes OUT_DIR/<module>.md for every module rlnb/__init__.py imports
(tools/docs_prep.py also passes the modules the notebooks' `#| default_exp` name, e.g. rlnb.cli, not imported there)
"""
import ast, io, re, sys, tokenize
from pathlib import Path

SKIP_DECORATORS = {"staticmethod", "classmethod"}


def modules(pkg: Path) -> list[str]:
    "The modules `pkg/__init__.py` star-imports, in its order (rlnb's public modules)."
    return re.findall(r"^from \.(\w+) import \*", (pkg / "__init__.py").read_text(), re.M)


def comments(source: str) -> dict[int, tuple[str, bool]]:
    "line number -> (comment text, whether the comment is the whole line)."
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[:tok.start[1]].strip()
            found[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    return found


def comment_for(node, notes: dict, lines: list[str], first_allowed: int) -> str:
    "The docments comment of a parameter/field `node`: beside its last line, else alone on the line above it."
    text, alone = notes.get(node.end_lineno, ("", True))
    if text and not alone: return text
    above = node.lineno - 1
    if above > first_allowed and above in notes and notes[above][1]: return notes[above][0]
    return ""


def signature(args: ast.arguments, drop_first: bool = False) -> list[tuple]:
    "(shown name, arg node, annotation, default) for each parameter, `self`/`cls` dropped when `drop_first`."
    posonly, plain = list(args.posonlyargs), list(args.args)
    positional = posonly + plain
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for i, (a, d) in enumerate(zip(positional, defaults)):
        out.append((a.arg, a, a.annotation, d))
        if posonly and i == len(posonly) - 1: out.append(("/", None, None, None))
    if args.vararg: out.append(("*" + args.vararg.arg, args.vararg, args.vararg.annotation, None))
    elif args.kwonlyargs: out.append(("*", None, None, None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults): out.append((a.arg, a, a.annotation, d))
    if args.kwarg: out.append(("**" + args.kwarg.arg, args.kwarg, args.kwarg.annotation, None))
    return out[1:] if drop_first and out and out[0][1] is not None else out


def fmt_params(params: list[tuple]) -> str:
    parts = []
    for name, _, ann, default in params:
        s = name + (f": {ast.unparse(ann)}" if ann is not None else "")
        if default is not None: s += (" = " if ann is not None else "=") + short(ast.unparse(default))
        parts.append(s)
    return ", ".join(parts)


def short(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def wrap(sig: str, width: int = 100) -> str:
    "A signature on one line, or one parameter a line when it is longer than `width`."
    if len(sig.splitlines()[-1]) <= width: return sig
    head, _, rest = sig.partition("(")
    body, _, tail = rest.rpartition(")")
    parts, depth, cur = [], 0, ""
    for ch in body:  # split on top-level commas only
        if ch in "([{": depth += 1
        elif ch in ")]}": depth -= 1
        if ch == "," and depth == 0: parts.append(cur.strip()); cur = ""
        else: cur += ch
    if cur.strip(): parts.append(cur.strip())
    inner = "".join(f"    {p},\n" for p in parts)
    return f"{head}(\n{inner}){tail}"


def fence(code: str) -> str:
    return f"```python\n{code}\n```\n"


def cell(text: str) -> str:
    "Text safe inside a markdown table cell."
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: list[tuple], kind: str = "Parameter") -> str:
    "A markdown table: name, type, default, description (the docments comment)."
    rows = [r for r in rows if r[0] not in ("/", "*")]
    if not any(r[3] for r in rows): return ""  # no comments: the signature already says it all
    out = [f"| {kind} | Type | Default | Description |", "|---|---|---|---|"]
    for name, ann, default, doc in rows:
        t = f"`{cell(ast.unparse(ann))}`" if ann is not None else ""
        d = f"`{cell(short(ast.unparse(default), 60))}`" if default is not None else ""
        out.append(f"| `{cell(name)}` | {t} | {d} | {cell(doc)} |")
    return "\n".join(out) + "\n"


def docstring(node) -> str:
    doc = ast.get_docstring(node) or ""
    return doc.replace("$", "\\$")  # a `$` in a docstring is a dollar sign, not MyST math


def decorators(node) -> list[str]:
    return [ast.unparse(d) for d in getattr(node, "decorator_list", [])]


def document_function(node, notes, lines, title: str, level: int, method: bool = False) -> str:
    decs = decorators(node)
    is_static = "staticmethod" in decs
    params = signature(node.args, drop_first=method and not is_static)
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async def " if isinstance(node, ast.AsyncFunctionDef) else "def "
    shown = [f"@{d}" for d in decs if d not in SKIP_DECORATORS or d == "staticmethod"]
    if "property" in decs:
        out = [f"{'#' * level} `{title}`\n", f"```python\n@property\n{node.name}{ret}\n```\n"]
        if doc := docstring(node): out.append(doc + "\n")
        return "\n".join(out)
    sig = "\n".join(shown + [wrap(f"{prefix}{node.name}({fmt_params(params)}){ret}")])
    out = [f"{'#' * level} `{title}`\n", fence(sig)]
    if doc := docstring(node): out.append(doc + "\n")
    rows = [(n, ann, d, comment_for(a, notes, lines, node.lineno) if a is not None else "")
            for n, a, ann, d in params]
    if t := table(rows): out.append(t)
    if node.returns is not None:
        rtext, alone = notes.get(node.returns.end_lineno, ("", True))
        on_param_line = any(a is not None and a.end_lineno == node.returns.end_lineno for _, a, _, _ in params)
        if rtext and not alone and not on_param_line:
            out.append(f"**Returns** `{ast.unparse(node.returns)}`: {rtext}\n")
    return "\n".join(out)


FIELD_BASES = ("NamedTuple",)


def is_record(node: ast.ClassDef) -> bool:
    "A NamedTuple or a dataclass: its annotated class attributes are its constructor's fields."
    bases = [ast.unparse(b) for b in node.bases]
    return any(b.split(".")[-1] in FIELD_BASES for b in bases) or any("dataclass" in d for d in decorators(node))


def document_class(node: ast.ClassDef, notes, lines, level: int) -> str:
    bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
    decs = "".join(f"@{d}\n" for d in decorators(node))
    out = [f"{'#' * level} `{node.name}`\n"]
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if is_record(node):
        fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                  and "ClassVar" not in ast.unparse(n.annotation)]
        params = [(f.target.id, None, f.annotation, f.value) for f in fields]
        sig = fence(wrap(f"{decs}class {node.name}({fmt_params(params)})"))
        rows = [(f.target.id, f.annotation, f.value, comment_for(f, notes, lines, node.lineno)) for f in fields]
        kind = "Field"
    elif init is not None:
        params = signature(init.args, drop_first=True)
        sig = fence(wrap(f"{decs}class {node.name}({fmt_params(params)})"))
        rows = [(n, ann, d, comment_for(a, notes, lines, init.lineno) if a is not None else "")
                for n, a, ann, d in params]
        kind = "Parameter"
    else:
        sig, rows, kind = fence(f"{decs}class {node.name}" + (f"({bases})" if bases else "")), [], ""
    out.append(sig)
    if bases and (is_record(node) or init is not None): out.append(f"Bases: `{bases}`\n")
    if doc := docstring(node): out.append(doc + "\n")
    if rows: out.append(table(rows, kind))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
            out.append(document_function(item, notes, lines, f"{node.name}.{item.name}", level + 1, method=True))
    return "\n".join(out)


def document_value(node, name: str, notes, level: int) -> str:
    value = node.value if node.value is not None else None
    ann = f": {ast.unparse(node.annotation)}" if isinstance(node, ast.AnnAssign) else ""
    text = short(ast.unparse(value), 100) if value is not None else "..."
    out = [f"{'#' * level} `{name}`\n", f"```python\n{name}{ann} = {text}\n```\n"]
    note, alone = notes.get(node.lineno, ("", True))
    if not note and node.lineno - 1 in notes and notes[node.lineno - 1][1]: note = notes[node.lineno - 1][0]
    if note: out.append(note.replace("$", "\\$") + "\n")
    return "\n".join(out)


def definitions(tree: ast.Module) -> dict:
    "name -> its last top-level definition (a def, a class or an assignment)."
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): found[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name): found[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name): found[node.target.id] = node
    return found


def module_page(pkg: Path, mod: str, chapter: str | None) -> str:
    "The MyST page documenting `pkg.mod`: its docstring, then every name of its `__all__`."
    source = (pkg / f"{mod}.py").read_text()
    tree, notes, lines = ast.parse(source), comments(source), source.splitlines()
    defs = definitions(tree)
    names = ast.literal_eval(defs["__all__"].value) if "__all__" in defs else [n for n in defs if n[0] != "_"]
    doc = (ast.get_docstring(tree) or "").split("\nDocs:")[0].strip().replace("$", "\\$")
    out = [f"# {pkg.name}.{mod}\n", doc + "\n"]
    if chapter: out.append(f"The chapter that builds and explains it: [](../{chapter}.ipynb).\n")
    out.append("```python\nfrom " + f"{pkg.name}.{mod} import *  # or: import {pkg.name}\n```\n")
    for name in names:
        node = defs.get(name)
        out.append(f"```{{index}} single: {name} ({pkg.name}.{mod})\n```\n")  # an entry of the site's index page
        if node is None: out.append(f"## `{name}`\n\n(not defined in this module's source)\n")
        elif isinstance(node, ast.ClassDef): out.append(document_class(node, notes, lines, 2))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(document_function(node, notes, lines, name, 2))
        else: out.append(document_value(node, name, notes, 2))
    return "\n".join(out)


def write_pages(pkg: Path, out: Path, chapters: dict[str, str]) -> list[str]:
    "Write out/<module>.md for each module `pkg/__init__.py` imports or a chapter exports; returns them, in order."
    out.mkdir(parents=True, exist_ok=True)
    found = dict.fromkeys(modules(pkg) + [m for m in chapters if (pkg / f"{m}.py").exists()])  # + rlnb.cli
    mods = sorted(found, key=lambda m: (m not in chapters, chapters.get(m, "")))  # in the chapters' order
    for mod in mods: (out / f"{mod}.md").write_text(module_page(pkg, mod, chapters.get(mod)))
    return mods


if __name__ == "__main__":
    print(write_pages(Path(sys.argv[1]), Path(sys.argv[2]), {}))
