"Setup and memory readings shared by the benchmark scripts (imported as `_common` when a script runs from this folder)."
from __future__ import annotations
import os, warnings


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
