#!/usr/bin/env bash
# Creates .venv beside this checkout with CPU PyTorch and edmem-hf (editable, with test extras).
#
# PyTorch goes in first and pinned: an unpinned `torch` pulled in by another package would fetch the newest
# CUDA build (gigabytes). Override with TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0") and, off this project's
# machines, TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU wheel; a GPU machine can set
# TORCH_SPEC to the CUDA build it wants.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-test}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$VENV/bin/python" -m pip install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
  else
    "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  fi
fi
"$VENV/bin/python" -m pip install -q -e ".[${EXTRAS}]"
"$VENV/bin/python" -c "import torch, transformers, edmem_hf; print('edmem-hf', edmem_hf.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
