"""Triton kernels for the fused ops, with launch parameters passed in from config.

Importing this package registers the ``triton`` backend of each op in
``workbench.ops`` (``rmsnorm``, ``swiglu``, ``rope``, ``loss``, and ``rmsnorm_add``, the
fused residual add that follows the ``rmsnorm`` backend), so that
``workbench.ops.resolve({"rmsnorm": "triton", ...})`` finds them.

Launch parameters (``num_warps``, ``num_stages``, block sizes, rows per chunk) are
never chosen by ``@triton.autotune``: :func:`configure` takes
``loongforge.compute_domain.kernels`` and each launcher reads them through
``kernels.registry``, which also holds each kernel's tunable space and its
validity constraints as data (:data:`LAUNCH_SPACES`).

The kernels run on CUDA tensors; on a CPU they run only under
``TRITON_INTERPRET=1`` set before this package is imported (the tests), and the
training loop uses the ``torch`` backends there.

Benchmark: ``python -m kernels.bench`` (on a CUDA machine).
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
from workbench.ops import register

__all__ = [
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

register("rmsnorm", "triton", rms_norm_triton)
register("rmsnorm_add", "triton", rms_norm_add_triton)
register("swiglu", "triton", swiglu_triton)
register("rope", "triton", rope_triton)
register("loss", "triton", linear_cross_entropy_triton)
