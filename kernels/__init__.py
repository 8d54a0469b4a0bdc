"""Triton kernels for the fused ops, with launch parameters passed in from config.

``TRITON_OPS`` maps each op of ``workbench.train.ops`` (``rmsnorm``, ``swiglu``, ``rope``, ``loss``, and
``rmsnorm_add``, the fused residual add that follows the ``rmsnorm`` backend) to its Triton kernel;
``workbench.train.ops`` registers them as the ``triton`` backends the first time one is asked for.

Launch parameters (``num_warps``, ``num_stages``, block sizes, rows per chunk) are
never chosen by ``@triton.autotune``: :func:`configure` takes
``loongforge.compute_domain.kernels`` and each launcher reads them through
``kernels.registry``, which also holds each kernel's tunable space and its
validity constraints as data (:data:`LAUNCH_SPACES`).

Importing this package imports the registry only (plain Python), so a config's launch parameters are checked on
every machine, Triton or not; the kernels themselves, and torch and Triton with them, are imported at their first
use (PEP 562 ``__getattr__``). The kernels run on CUDA tensors; on a CPU they run only under
``TRITON_INTERPRET=1`` set before their first use (the tests), and the training loop uses the ``torch`` backends
there.

Benchmark: ``python benchmarks/kernels_bench.py`` (on a CUDA machine).
"""

from __future__ import annotations

import importlib
from typing import Any

from kernels.registry import (
    KERNEL_OF_OP,
    LAUNCH_SPACES,
    LaunchConfigError,
    LaunchParam,
    LaunchSpace,
    active_config,
    configure,
    get_space,
    launch_params,
    launch_record,
    reset,
    using,
)

__all__ = [
    "TRITON_OPS",
    "KERNEL_OF_OP",
    "LAUNCH_SPACES",
    "LaunchConfigError",
    "LaunchParam",
    "LaunchSpace",
    "active_config",
    "configure",
    "get_space",
    "launch_params",
    "launch_record",
    "linear_cross_entropy_triton",
    "poison_outputs",
    "reset",
    "rms_norm_add_triton",
    "rms_norm_triton",
    "rope_triton",
    "swiglu_triton",
    "using",
]

_LAZY = {"poison_outputs": "kernels._launch", "linear_cross_entropy_triton": "kernels.fused_linear_ce",
         "rms_norm_triton": "kernels.rmsnorm", "rms_norm_add_triton": "kernels.rmsnorm",
         "rope_triton": "kernels.rope", "swiglu_triton": "kernels.swiglu"}
"""Names whose modules import torch or Triton: imported at their first use."""

_TRITON_OPS = {"rmsnorm": "rms_norm_triton", "rmsnorm_add": "rms_norm_add_triton", "swiglu": "swiglu_triton",
               "rope": "rope_triton", "loss": "linear_cross_entropy_triton"}
"""op name -> the name of its Triton backend (``TRITON_OPS``: op name -> the kernel; workbench.train.ops registers
them as ``"triton"``)."""


_SUBMODULES = ("fp8_cast", "fused_linear_ce", "rmsnorm", "rope", "swiglu")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "TRITON_OPS":
        value = {op: __getattr__(fn) for op, fn in _TRITON_OPS.items()}
    elif name in _SUBMODULES:  # ``kernels.rmsnorm`` without importing it first, as before the package was lazy
        value = importlib.import_module(f"kernels.{name}")
    else:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    globals()[name] = value
    return value
