"""Screenshots of rlnb's widgets as a real browser draws them: nbs/images/dashboard.png, rollout_viewer*.png.

    python tools/screenshots.py [--out nbs/images] [--html DIR] [--keep DIR]

1. Executes nbs/81_widgets.ipynb and nbs/82_viewer.ipynb in fresh kernels (cells flagged `#| slow` skipped) with
   nbclient's `store_widget_state`, so every widget's final state (the dashboard's PNG, the viewer's HTML, ...) is
   saved in the notebook.
2. Builds one small page per widget: the widget state, a view of the widget, and the JavaScript that renders saved
   widgets, `@jupyter-widgets/html-manager` (what nbconvert's HTML export loads from a CDN), served from a local
   copy installed with npm, beside requirejs. Nothing is fetched from a CDN.
3. Opens each page in headless Chromium (Debian's `chromium`; installed with apt-get if missing and we are root),
   takes a screenshot and crops it to the widget.

`--html DIR` also writes each executed chapter as nbconvert HTML, with the widgets live (rendered by the same local
html-manager), to read the whole chapter in a browser. Not part of CI: it installs what it needs (npm packages into
~/.cache/rlnb-screenshots, chromium with apt-get) and takes two to three minutes.
"""
import argparse, functools, http.server, json, os, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("RLNB_SCREENSHOT_CACHE", Path.home() / ".cache" / "rlnb-screenshots"))
NPM_PACKAGES = ("@jupyter-widgets/html-manager@^1.0", "requirejs@^2.3")
SHOTS = (  # (notebook, css class of the widget's root, which one of them (0: the first displayed), output file, width)
    ("81_widgets.ipynb", "rlnb-dashboard", 0, "dashboard.png", 1160),
    ("82_viewer.ipynb", "rlnb-viewer", 0, "rollout_viewer.png", 1000),
    ("82_viewer.ipynb", "rlnb-viewer", 1, "rollout_viewer_tools.png", 1000),
)
STATE_MIME, VIEW_MIME = "application/vnd.jupyter.widget-state+json", "application/vnd.jupyter.widget-view+json"


def chromium() -> str:
    "Path to a Chromium binary, installing Debian's package if none is found (as root)."
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name): return shutil.which(name)
    if os.geteuid() != 0: sys.exit("no chromium found: install it (Debian: apt-get install -y chromium)")
    subprocess.run(["apt-get", "install", "-y", "chromium"], check=True)
    return shutil.which("chromium")


def widget_js() -> Path:
    "The folder holding html-manager's dist/ and require.js, installed with npm on first use."
    node = CACHE / "node_modules"
    needed = (node / "@jupyter-widgets/html-manager/dist/embed-amd.js", node / "requirejs/require.js")
    if not all(p.exists() for p in needed):
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", *NPM_PACKAGES], check=True)
    return node


def execute(name: str, workdir: Path):
    "The chapter, executed in a fresh kernel with its widget state stored (slow cells skipped)."
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT / "nbs" / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "#| slow" in cell.source: cell.source = "# (slow cell skipped)"
    env = {"OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    os.environ.update({k: os.environ.get(k, v) for k, v in env.items()})
    t0 = time.time()
    NotebookClient(nb, timeout=900, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(ROOT / "nbs")}}).execute()
    nbformat.write(nb, workdir / name)
    print(f"executed {name} in {time.time() - t0:.0f} s", flush=True)
    return nb


def displayed(nb, css_class: str, which: int) -> str:
    "The model id of the `which`-th displayed widget whose root carries `css_class` (0: the first)."
    state = nb.metadata["widgets"][STATE_MIME]["state"]
    views = [out["data"][VIEW_MIME]["model_id"] for cell in nb.cells for out in cell.get("outputs", [])
             if VIEW_MIME in out.get("data", {})]
    found = [m for m in views if css_class in state.get(m, {}).get("state", {}).get("_dom_classes", [])]
    if len(found) <= which: raise SystemExit(f"only {len(found)} displayed widgets with class {css_class!r}")
    return found[which]


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body {{ margin: 12px; font-family: sans-serif; background: #fff; width: {width}px; }}</style>
<script>window.__jupyter_widgets_assets_path__ = "{js}/@jupyter-widgets/html-manager/dist/";</script>
<script src="{js}/requirejs/require.js"></script>
<script type="{state_mime}">{state}</script>
</head><body>
<div class="shot"><script type="{view_mime}">{view}</script></div>
<script src="{js}/@jupyter-widgets/html-manager/dist/embed-amd.js"></script>
</body></html>
"""


def page(nb, model_id: str, width: int, title: str) -> str:
    "A page showing one saved widget, rendered by the local html-manager."
    state = json.dumps(nb.metadata["widgets"][STATE_MIME]).replace("</", "<\\/")
    view = json.dumps({"version_major": 2, "version_minor": 0, "model_id": model_id})
    return PAGE.format(title=title, width=width - 40, js="/js", state_mime=STATE_MIME, state=state,
                       view_mime=VIEW_MIME, view=view)


def serve(folder: Path, js: Path) -> tuple:
    "An HTTP server on localhost for `folder`, with `js` mounted at /js. Returns (server, port)."
    root = folder / "site"
    root.mkdir(exist_ok=True)
    if not (root / "js").exists(): (root / "js").symlink_to(js)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1], root


def screenshot(browser: str, url: str, out: Path, width: int, height: int = 2400) -> None:
    "Headless Chromium's picture of `url` (scripts given 20 s of virtual time to render)."
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
                 "--force-device-scale-factor=1", f"--window-size={width},{height}", "--virtual-time-budget=20000"]
        subprocess.run([browser, *flags, f"--screenshot={out}", url], check=True, capture_output=True, timeout=180)


def crop(path: Path, margin: int = 10) -> tuple:
    "Cut the white border off a screenshot (keeping `margin` pixels). Returns the new (width, height)."
    import matplotlib.image as mpimg, numpy as np
    img = mpimg.imread(path)  # (H, W, 4) floats in [0, 1]
    ink = (img[..., :3] < 0.97).any(-1)
    rows, cols = np.where(ink.any(1))[0], np.where(ink.any(0))[0]
    if not len(rows): raise SystemExit(f"{path}: the screenshot is blank (did the widget render?)")
    top, bottom = max(rows[0] - margin, 0), min(rows[-1] + margin + 1, img.shape[0])
    left, right = max(cols[0] - margin, 0), min(cols[-1] + margin + 1, img.shape[1])
    mpimg.imsave(path, img[top:bottom, left:right])
    return right - left, bottom - top


def export_html(nb, out: Path, js: Path) -> None:
    "The executed chapter as nbconvert HTML, its widgets rendered by the local html-manager (linked beside it as js/)."
    from nbconvert import HTMLExporter
    exporter = HTMLExporter(template_name="lab", require_js_url="js/requirejs/require.js", mathjax_url="",
                            widget_renderer_url="js/@jupyter-widgets/html-manager/dist/embed-amd.js")
    out.write_text(exporter.from_notebook_node(nb)[0])
    if not (out.parent / "js").exists(): (out.parent / "js").symlink_to(js)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "nbs" / "images", help="where the PNGs go")
    ap.add_argument("--html", type=Path, help="also write the executed chapters as HTML here")
    ap.add_argument("--keep", type=Path, help="keep the executed notebooks and pages here (default: a temp folder)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: use the notebooks executed there before")
    a = ap.parse_args()
    browser, js = chromium(), widget_js()
    work = a.keep or Path(tempfile.mkdtemp(prefix="rlnb-shots-"))
    work.mkdir(parents=True, exist_ok=True)
    server, port, site = serve(work, js)
    try:
        executed = {}
        for name, css, which, png, width in SHOTS:
            if name not in executed and a.reuse and a.keep and (work / name).exists():
                import nbformat
                executed[name] = nbformat.read(work / name, as_version=4)
            elif name not in executed: executed[name] = execute(name, work)
            nb = executed[name]
            (site / png.replace(".png", ".html")).write_text(page(nb, displayed(nb, css, which), width, png))
            a.out.mkdir(parents=True, exist_ok=True)
            screenshot(browser, f"http://127.0.0.1:{port}/{png.replace('.png', '.html')}", a.out / png, width)
            print(f"{a.out / png}: {crop(a.out / png)} pixels", flush=True)
            if a.html and not (a.html / name.replace(".ipynb", ".html")).exists():
                a.html.mkdir(parents=True, exist_ok=True)
                export_html(nb, a.html / name.replace(".ipynb", ".html"), js)
    finally:
        server.shutdown()
        if a.keep is None: shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
