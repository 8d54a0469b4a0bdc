#!/usr/bin/env bash
# Sets up .venv with the project (what `python -m workbench.tune` needs); with --dev also the test tools
# (pytest, Triton for the kernel tests, torchao, PostgreSQL client, import-linter). Uses the CPU build of torch
# where no NVIDIA GPU is present (a bare `torch` requirement would pull a
# multi-GB CUDA build); where a GPU is present, the torch already installed (or
# pip's default) is used. Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=""
if [ "${1:-}" = "--dev" ]; then EXTRAS="[dev]"; fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q torch==2.13.0  # the CPU build
  fi
fi
python -m pip install -q -e ".${EXTRAS}"
# the project's own bytecode, written once: every trial, CLI and test process imports these modules, and where
# PYTHONDONTWRITEBYTECODE is set (CI's machine) each process would otherwise compile them again (~0.3 s each)
python -m compileall -q -j 0 workbench loaders kernels reports examples benchmarks >/dev/null
python -c "import torch, optuna, zstandard; print(f'setup ok: torch {torch.__version__}, optuna {optuna.__version__}, zstandard {zstandard.__version__}')"
