"""Screenshots of the built docs site in headless Chromium, to check by eye that pages, plots, images and math render.

    python tools/docs_screenshots.py [--html _docs/_build/html] [--out _docs/screenshots]

Serves the site on localhost (nothing is fetched from the network) and takes one picture per page of SHOTS: the
landing page, a chapter with plots and math, one module's API page, a chapter with markdown images. Chromium is found
(or installed) as tools/screenshots.py does. Run after `bash scripts/docs.sh`; not part of the build.
"""
import argparse, functools, http.server, re, subprocess, sys, threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshots import chromium, screenshot  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's dependency)

SHOTS = (  # (page#where, what it shows, window height in pixels)
    ("index.html", "landing", 2600),
    ("23_kl.html#bias-and-variance-against-the-exact-kl", "chapter_plots", 2200),
    ("api/core.html", "api_core", 2600),
    ("82_viewer.html#view-rollouts", "markdown_images", 2600),
)

FRAME = """<!doctype html><body style="margin:0">
<iframe id="f" src="{0}" style="border:0;width:100%;height:100vh"></iframe>
<script>var f = document.getElementById("f");  // writes where `#where` lies in the page into the title
f.onload = function () {{ setTimeout(function () {{
  var w = f.contentWindow, el = w.document.getElementById(location.hash.slice(1));
  document.title = "top=" + (el ? Math.round(el.getBoundingClientRect().top + w.scrollY) : -1);
}}, 1000); }};</script>"""


def top_of(browser: str, url: str, width: int) -> int:
    "How far down the page at `url` (PAGE#where) the element `where` starts, in pixels, in a window `width` wide."
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},1000",
             "--force-device-scale-factor=1", "--virtual-time-budget=20000", "--dump-dom"]
    dom = subprocess.run([browser, *flags, url], check=True, capture_output=True, text=True, timeout=180).stdout
    m = re.search(r"<title>top=(-?\d+)</title>", dom)
    if not m or int(m.group(1)) < 0: raise SystemExit(f"{url}: no such element in the page")
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", type=Path, default=Path("_docs/_build/html"))
    ap.add_argument("--out", type=Path, default=Path("_docs/screenshots"))
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass

        def do_GET(self):  # /frame/PAGE: PAGE in an iframe, to measure where an element of it lies (top_of)
            if not self.path.startswith("/frame/"): return super().do_GET()
            body = FRAME.format(self.path[len("/frame"):]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(a.html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = chromium()
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        for page, name, height in SHOTS:
            out = a.out / f"{name}.png"
            site = f"http://127.0.0.1:{server.server_address[1]}"
            if "#" not in page: screenshot(browser, f"{site}/{page}", out, a.width, height)
            else:  # a window scrolled to `#where` paints blank in headless Chromium: shoot it tall, then crop
                top = max(top_of(browser, f"{site}/frame/{page}", a.width) - 20, 0)
                screenshot(browser, f"{site}/{page.split('#')[0]}", out, a.width, top + height)
                Image.open(out).crop((0, top, a.width, top + height)).save(out)
            print(out.resolve())
    finally: server.shutdown()


if __name__ == "__main__":
    main()
