"""Triton kernels for the fused ops, with launch parameters passed in from config.

Importing this package registers the ``triton`` backend of each op in
``workbench.train.ops`` (``rmsnorm``, ``swiglu``, ``rope``, ``loss``, and ``rmsnorm_add``, the
fused residual add that follows the ``rmsnorm`` backend), so that
``workbench.train.ops.resolve({"rmsnorm": "triton", ...})`` finds them.

Launch parameters (``num_warps``, ``num_stages``, block sizes, rows per chunk) are
never chosen by ``@triton.autotune``: :func:`configure` takes
``loongforge.compute_domain.kernels`` and each launcher reads them through
``kernels.registry``, which also holds each kernel's tunable space and its
validity constraints as data (:data:`LAUNCH_SPACES`).

The kernels run on CUDA tensors; on a CPU they run only under
``TRITON_INTERPRET=1`` set before this package is imported (the tests), and the
training loop uses the ``torch`` backends there.

Benchmark: ``python benchmarks/kernels_bench.py`` (on a CUDA machine).
"""

from __future__ import annotations

from kernels._launch import poison_outputs
from kernels.fused_linear_ce import linear_cross_entropy_triton
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
from kernels.rmsnorm import rms_norm_add_triton, rms_norm_triton
from kernels.rope import rope_triton
from kernels.swiglu import swiglu_triton

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

TRITON_OPS = {"rmsnorm": rms_norm_triton, "rmsnorm_add": rms_norm_add_triton, "swiglu": swiglu_triton,
              "rope": rope_triton, "loss": linear_cross_entropy_triton}
"""op name -> its Triton backend (workbench.train.ops registers them as ``"triton"``)."""
