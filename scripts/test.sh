#!/usr/bin/env bash
# Install rlnb with its dev tools into .venv, then run every test: the notebooks (nbdev-test) and tests/ (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
. .venv/bin/activate
# Lines <= 120 characters in notebooks, tests and tools (ruff, seconds): fails before the long part, not after it
ruff check
# Notebooks are tested two at a time on small machines: one torch thread each, and threads that sleep instead of
# spinning while they wait (spinning OpenMP threads on a busy CPU made steps 10-30x slower here).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" RLNB_NUM_THREADS="${RLNB_NUM_THREADS:-1}"
# Train and cache the tiny model, and convert SmolLM2's GGUF file, once, so the notebooks tested in parallel all load
# them instead of each building them.
python -c "import rlnb; rlnb.load_tiny_model(); rlnb.load_gguf(rlnb.smollm2_gguf_path())"
# nbs/experiments/ holds papermill templates: tests/test_experiment.py runs them the way papermill does
nbdev-test --skip-folder-re '^([_.]|experiments$)'
python -m pytest tests -q
