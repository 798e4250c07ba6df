"""A sweep of short training runs on 1 and on 2 workers: how much a second worker process buys.

The same 8 runs (the papermill training notebook, `--lrs` learning rates x `--seeds` seeds, `--iterations` iterations
each, no evaluation) are run by `rlnb.experiments.run_sweep` once per configuration, each time into a fresh folder:

  - local-1: the default executor (a ProcessPoolExecutor, processes started with 'spawn') with 1 worker;
  - local-2: the same with 2 workers;
  - dask-2:  a Dask LocalCluster of 2 worker processes with 1 thread each (`--no-dask` skips it).

Every run's kernel gets one CPU thread (OMP_NUM_THREADS=1, RLNB_NUM_THREADS=1), the sweep's default. The wall time
of each sweep includes starting the workers and the kernels, importing torch and loading the tiny model in every run:
what an experimenter waits for. One line per configuration: wall time, seconds per run, and the ratio to local-1.
The target (issue 13): local-2 <= 0.6x local-1 on 2 cores. The load average (`os.getloadavg`) is printed before and
after, since the machine may be shared.

    python benchmarks/sweep.py                    # 8 runs of 10 iterations per configuration (~2-3 min in all)
    python benchmarks/sweep.py --iterations 30 --no-dask
"""
from __future__ import annotations
import argparse, importlib.util, os, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("rlnb") is None: sys.path.insert(0, str(HERE.parent))  # a checkout, not installed
NOTEBOOK = HERE.parent / "nbs" / "experiments" / "grpo_training.ipynb"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs", default="1e-3,2e-3,3e-3,4e-3", help="learning rates (comma-separated)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per learning rate")
    p.add_argument("--iterations", type=int, default=10, help="training iterations per run")
    p.add_argument("--no-dask", action="store_true", help="skip the Dask LocalCluster configuration")
    return p.parse_args(argv)


def timed_sweep(grid: dict, seeds: int, root: Path, workers: int | None = None, executor=None) -> tuple[float, list]:
    "Wall seconds of one sweep into `root`, and its results (every run must complete)."
    from rlnb.experiments import run_sweep
    t0 = time.perf_counter()
    results = run_sweep(NOTEBOOK, grid, seeds=seeds, executor=executor, output_root=root, workers=workers, log_fn=None)
    seconds = time.perf_counter() - t0
    failed = [(r.run_id, r.error) for r in results if r.status != "completed"]
    if failed: raise SystemExit(f"runs failed: {failed}")
    return seconds, results


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("RLNB_CACHE", str(HERE.parent / ".cache" / "rlnb"))  # the checkout's tiny-model cache
    grid = {"learning_rate": [float(x) for x in args.lrs.split(",")],
            "num_iterations": args.iterations, "eval_every": 0}
    n_runs = len(grid["learning_rate"]) * args.seeds
    print(f"{n_runs} runs of {args.iterations} iterations (tiny model, addition, GRPO + LoRA), {os.cpu_count()} cores, "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    configs = [("local-1", dict(workers=1)), ("local-2", dict(workers=2))]
    if not args.no_dask: configs.append(("dask-2", None))
    base = None
    with tempfile.TemporaryDirectory(prefix="rlnb-sweep-bench-") as tmp:
        for name, kw in configs:
            if kw is None:
                from distributed import Client, LocalCluster
                t0 = time.perf_counter()
                with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
                        Client(cluster) as client:
                    start = time.perf_counter() - t0
                    seconds, results = timed_sweep(grid, args.seeds, Path(tmp) / name, executor=client.get_executor())
                extra = f" (+ {start:.1f} s to start the cluster, not counted)"
            else:
                (seconds, results), extra = timed_sweep(grid, args.seeds, Path(tmp) / name, **kw), ""
            base = base or seconds
            train = sum(r.summary["train_seconds"] for r in results) / len(results)
            print(f"{name:8s} wall {seconds:6.1f} s  {seconds / n_runs:5.2f} s/run  "
                  f"ratio {seconds / base:.2f}x local-1  "
                  f"(mean run: {sum(r.seconds for r in results) / len(results):.1f} s, "
                  f"of which training {train:.1f} s){extra}",
                  flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__": main()
