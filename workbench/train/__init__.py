"""The training loop: the model and its ops, the Trainer (compile, CUDA graphs, the overlap scheduler, FP8,
activation checkpointing), the allocator settings, the phase timer, metrics and the memory model.
``python -m workbench.train`` (``__main__``) runs it from a config.

The names below load on first use (PEP 562), so that ``python -m workbench.train`` can set the environment
torch reads at import (``OMP_WAIT_POLICY``) before anything imports torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["NanLossError", "Trainer", "build_model_args", "load_run_config", "synthetic_data_dir"]

_WHERE = {"NanLossError": "workbench.train.context", "Trainer": "workbench.train.trainer",
          "build_model_args": "workbench.train.trainer", "load_run_config": "workbench.train.run",
          "synthetic_data_dir": "workbench.train.run"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'workbench.train' has no attribute {name!r}")
