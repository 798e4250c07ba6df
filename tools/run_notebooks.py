"""Execute notebooks top to bottom in place, so they are committed with their outputs (plots show on GitHub).

    python tools/run_notebooks.py nbs/20b_generation.ipynb [more.ipynb ...] [--timeout 900]

Each runs in a fresh kernel from its own folder with one torch thread (the tests' setting); cells tagged by nbdev
flags (`#| slow`, `#| gpu`, `#| vllm`, `#| notest`) are run too, unless --skip-flagged (not run, their outputs
cleared) or --keep-flagged (not run, their saved outputs kept: for cells that need what this machine lacks, e.g. a GPU,
and depend on nothing the run changes). nbdev-clean is applied afterwards."""
import argparse, os, subprocess, sys, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

FLAGS = ("#| slow", "#| gpu", "#| vllm", "#| notest")


def run(path: Path, timeout: int, skip_flagged: bool, keep_flagged: bool = False) -> float:
    nb = nbformat.read(path, as_version=4)
    skipped = []
    if skip_flagged or keep_flagged:
        for cell in nb.cells:
            if cell.cell_type == "code" and any(f in cell.source for f in FLAGS):
                skipped.append(cell)
                cell.metadata["_skip_source"] = cell.source
                cell.metadata["_skip_outputs"] = cell.outputs
                cell.source = "# (skipped: flagged cell)"
    t0 = time.time()
    # widget state: megabytes, no use on GitHub
    NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in skipped:
        cell.source, saved = cell.metadata.pop("_skip_source"), cell.metadata.pop("_skip_outputs")
        cell.outputs = saved if keep_flagged else []
    nbformat.write(nb, path)
    return time.time() - t0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--skip-flagged", action="store_true", help="do not run flagged cells; clear their outputs")
    ap.add_argument("--keep-flagged", action="store_true", help="do not run flagged cells; keep their outputs")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1"); os.environ.setdefault("RLNB_NUM_THREADS", "1")
    # plots saved inline, whatever the caller set
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    failed = []
    for p in a.notebooks:  # a failing notebook is left as it was, and the others still run
        try: print(f"{p}: {run(p.resolve(), a.timeout, a.skip_flagged, a.keep_flagged):.0f} s", flush=True)
        except Exception as e:
            failed.append(p)
            print(f"{p}: FAILED, left unchanged: {str(e)[-2000:]}", flush=True)
    for p in a.notebooks:
        subprocess.run([str(Path(sys.executable).parent / "nbdev-clean"), "--fname", str(p)], check=False)
    if failed: sys.exit(f"failed: {' '.join(map(str, failed))}")
