"""Run the notebooks' tests as nbdev-test does (nbdev's `test_nb`, the `tst_flags` cells skipped), several at a time,
printing a line per notebook as it ends and a summary; exit status 1 if any failed.

    python tools/test_notebooks.py [--workers 2] [--flags "slow"] [--summary FILE] [nbs/20b_generation.ipynb ...]

Without notebooks: every notebook in nbs/ but the papermill templates of nbs/experiments/ (tests/test_experiment.py
runs those as papermill does) and files starting with `_` or `.`. A failing notebook's traceback goes to stderr."""
import argparse, os, time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from nbdev.config import get_config
from nbdev.test import test_nb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8))
    ap.add_argument("--flags", default="", help="space-separated nbdev flags to run too, e.g. 'slow'")
    ap.add_argument("--summary", type=Path, help="also write the summary line to this file")
    args = ap.parse_args()
    cfg = get_config()
    paths = args.notebooks or sorted(p for p in Path(cfg.nbs_path).glob("*.ipynb") if not p.name.startswith(("_", ".")))
    skip = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags)
    options = dict(skip_flags=skip, force_flags=args.flags.split(), basepath=cfg.config_path,
                   cell_timeout=int(cfg.cell_timeout) or None)
    start, results = time.time(), {}
    # nbdev's own function, importable by the workers (a notebook run replaces a worker's __main__: not ours to pickle)
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        jobs = {pool.submit(test_nb, p.resolve(), **options): p for p in paths}
        for job in as_completed(jobs):
            path = jobs[job]
            try: passed, seconds = job.result()
            except Exception as e: passed, seconds = False, 0.0; print(f"{path.name}: {type(e).__name__}: {e}")
            results[path.stem] = passed
            print(f"{'ok  ' if passed else 'FAIL'} {seconds:5.0f} s  {path.stem}", flush=True)
    failed = sorted(name for name, ok in results.items() if not ok)
    line = (f"notebooks: {len(results) - len(failed)} passed, {len(failed)} failed"
            + (f" ({', '.join(failed)})" if failed else "") + f" in {time.time() - start:.0f} s")
    print(line)
    if args.summary: args.summary.write_text(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
