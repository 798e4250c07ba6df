#!/usr/bin/env bash
# Install rlnb with its dev tools into .venv, then run every test: the notebooks (nbdev-test) and tests/ (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
. .venv/bin/activate
# Train and cache the tiny model once, so the notebooks tested in parallel all load it instead of each training it.
python -c "import rlnb; rlnb.load_tiny_model()"
nbdev-test
python -m pytest tests -q
