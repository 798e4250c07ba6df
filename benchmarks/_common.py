"Setup and memory readings shared by the benchmark scripts (imported as `_common` when a script runs from this folder)."
from __future__ import annotations
import argparse, json, os, subprocess, sys, warnings


def setup_torch(threads: int):
    "Set torch's intra-op threads, silence tokenizer forks and library warnings; return the torch module."
    import torch
    torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    return torch


def status_mib(key: str) -> float:
    "A memory line of /proc/self/status (VmRSS = resident now, VmHWM = peak resident since the last reset), in MiB."
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"): return int(line.split()[1]) / 1024
    raise KeyError(key)


def reset_peak_rss() -> bool:
    "Reset peak RSS (VmHWM) to current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs); False if not allowed."
    try:
        with open("/proc/self/clear_refs", "w") as f: f.write("5")
        return True
    except OSError: return False


def add_step_arguments(p) -> None:
    "The GRPO step's size on SmolLM2 that benchmarks/vllm_step.py and phases.py share, and their hidden --child flag."
    p.add_argument("--steps", type=int, default=6, help="GRPO steps per side (the first is the warm-up)")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32, help="completion budget")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run the one side here, print JSON


def run_side_in_child(script: str, side: str, argv: list[str]) -> dict:
    """Run `script` for one side in a fresh Python process (`argv` with its --sides replaced by `side`, plus --child)
    and return the JSON object it prints last: no side inherits another's engine, memory or threads."""
    rest = [a for k, a in enumerate(argv) if a != "--sides" and (k == 0 or argv[k - 1] != "--sides")]
    out = subprocess.run([sys.executable, script, *rest, "--sides", side, "--child"], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        name = os.path.basename(script)
        raise RuntimeError(f"{name}: side {side} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])
