#!/usr/bin/env bash
# Install rlnb with its dev tools into .venv, then run every test: the notebooks (tools/test_notebooks.py, as
# nbdev-test) and tests/ (pytest). Both always run; a summary of both is printed last, and the exit status is 1 if
# either failed.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/install.sh dev
. .venv/bin/activate
# Lines <= 120 characters in notebooks, tests and tools (ruff, seconds): fails before the long part, not after it
ruff check
# Notebooks are tested two at a time on small machines: one torch thread each, and threads that sleep instead of
# spinning while they wait (spinning OpenMP threads on a busy CPU made steps 10-30x slower here).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" RLNB_NUM_THREADS="${RLNB_NUM_THREADS:-1}"
# Every model a chapter builds, built once here (the tiny models come with the package; SmolLM2's GGUF file is
# converted into the cache), so the notebooks tested in parallel all load them instead of each building them.
python -c "import rlnb; rlnb.load_gguf(rlnb.smollm2_gguf_path())"
results=$(mktemp -d)
set +e
# nbs/experiments/ holds papermill templates: tests/test_experiment.py runs them the way papermill does
python tools/test_notebooks.py --workers 2 --summary "$results/notebooks"
notebooks=$?
python -m pytest tests -q -p no:cacheprovider 2>&1 | tee "$results/pytest"
pytest=${PIPESTATUS[0]}
set -e
echo "== summary ($(( $(date +%s) - start )) s in all)"
cat "$results/notebooks"
echo "pytest: $(grep -E '(passed|failed|error|no tests ran)' "$results/pytest" | tail -1 | tr -d '=' | xargs)"
rm -rf "$results"
if [ "$notebooks" -ne 0 ] || [ "$pytest" -ne 0 ]; then echo "FAILED"; exit 1; fi
echo "all passed"
