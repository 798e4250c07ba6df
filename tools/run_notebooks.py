"""Execute notebooks top to bottom in place, so they are committed with their outputs (plots show on GitHub).

    python tools/run_notebooks.py nbs/20_generation.ipynb [more.ipynb ...] [--timeout 900]

Each runs in a fresh kernel from its own folder with one torch thread (the tests' setting); cells tagged by nbdev
flags (`#| slow`, `#| gpu`, `#| notest`) are run too unless --skip-flagged. nbdev-clean is applied afterwards."""
import argparse, os, subprocess, sys, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

FLAGS = ("#| slow", "#| gpu", "#| notest")


def run(path: Path, timeout: int, skip_flagged: bool) -> float:
    nb = nbformat.read(path, as_version=4)
    skipped = []
    if skip_flagged:
        for cell in nb.cells:
            if cell.cell_type == "code" and any(f in cell.source for f in FLAGS):
                skipped.append(cell)
                cell.metadata["_skip_source"] = cell.source
                cell.source = "# (skipped: flagged cell)"
    t0 = time.time()
    # widget state: megabytes, no use on GitHub
    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in skipped: cell.source = cell.metadata.pop("_skip_source"); cell.outputs = []
    nbformat.write(nb, path)
    return time.time() - t0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--skip-flagged", action="store_true", help="do not run #| slow / gpu / notest cells")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1"); os.environ.setdefault("RLNB_NUM_THREADS", "1")
    # plots saved inline, whatever the caller set
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    for p in a.notebooks:
        print(f"{p}: {run(p.resolve(), a.timeout, a.skip_flagged):.0f} s", flush=True)
    for p in a.notebooks:
        subprocess.run([str(Path(sys.executable).parent / "nbdev-clean"), "--fname", str(p)], check=False)
