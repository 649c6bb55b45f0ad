#!/usr/bin/env bash
# Create .venv-bench, the environment of the peers bench/router_overhead.py measures pdserve's
# router against (sglang-router). It is separate from .venv so that a benchmark peer never
# shapes the pins pdserve itself is tested with. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv=.venv-bench
sglang_router=0.3.2

step() { printf '\n[install-bench] %s\n' "$*"; }

if [ ! -x "$venv/bin/python" ]; then
  step "creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang-router"))' \
  2>/dev/null || true)
if [ "$installed" = "$sglang_router" ]; then
  step "sglang-router $sglang_router already installed"
else
  step "installing sglang-router $sglang_router"
  "$venv/bin/python" -m pip --disable-pip-version-check install --quiet "sglang-router==$sglang_router"
fi
"$venv/bin/python" -c 'import sglang_router.launch_router'
step "done"
