"""workbench: the tuner (``workbench.tune``), the training loop (``workbench.train``), the memory tool
(``workbench.memory``) and the config schema (``workbench.config``).

``workbench.run()`` is the run API of a training loop of one's own (docs/trial-contract.md); it loads on first
use, so that ``import workbench`` imports no torch."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["run"]


def _check_kernels_is_ours() -> None:
    """The top-level ``kernels`` must be this project's (the folder beside ``workbench``). Hugging Face's
    ``kernels`` distribution, which transformers >= 5.25 requires, installs a module of the same name; where it
    comes first on the path every import of ours would fail deep inside, so it fails here, by name."""
    ours = Path(__file__).resolve().parent.parent / "kernels"
    spec = importlib.util.find_spec("kernels")
    found = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if found != ours or not (ours / "registry.py").is_file():
        raise ImportError(
            f"the module 'kernels' resolves to {found or 'nothing'}, expected this project's {ours}: another "
            "distribution installs a top-level 'kernels' (Hugging Face's, which transformers >= 5.25 requires). "
            "Install 'transformers<5.25' and run 'pip uninstall kernels', or run from a separate environment")


_check_kernels_is_ours()


def __getattr__(name: str) -> Any:
    if name == "run":
        return importlib.import_module("workbench.train.session").run
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
