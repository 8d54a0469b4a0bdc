"""workbench: the tuner (``workbench.tune``), the training loop (``workbench.train``), the memory tool
(``workbench.memory``) and the config schema (``workbench.config``).

``workbench.run()`` is the run API of a training loop of one's own (docs/trial-contract.md); it loads on first
use, so that ``import workbench`` imports no torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["run"]


def __getattr__(name: str) -> Any:
    if name == "run":
        return importlib.import_module("workbench.train.session").run
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
