"""SwiGLU activation ``silu(gate) * up``: forward and backward Triton kernels.

Shape legend: n elements (gate and up flattened; any shape, e.g. B x T x F).

    y = silu(g) * u = g * sigmoid(g) * u                                         (fp32 inside)
    dg = dy * u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),   du = dy * silu(g)

Elementwise over the flattened tensors, ``block_size`` elements per program. The
backward recomputes sigmoid(g) from the saved inputs instead of saving silu(g):
one fewer tensor kept between forward and backward, and the kernel is memory
bound either way (reads g, u, dy; writes dg, du). Launch parameters come from
``kernels.registry`` (kernel ``swiglu``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_tensor, empty, interpreted
from kernels.registry import launch_params

__all__ = ["swiglu_triton"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _swiglu_fwd_kernel(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _swiglu_bwd_kernel(DY, G, U, DG, DU, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    du = dy * silu
    tl.store(DG + offs, dg.to(DG.dtype.element_ty), mask=ok)
    tl.store(DU + offs, du.to(DU.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------- launchers

_INTERPRETED = interpreted(_swiglu_fwd_kernel)  # decorated under TRITON_INTERPRET=1: runs on CPU tensors


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)


def _check_inputs(gate: torch.Tensor, up: torch.Tensor) -> None:
    check_tensor("swiglu", "gate", gate, _INTERPRETED)
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(f"kernels.swiglu: gate and up must have the same shape, dtype and device, got "
                         f"{gate.dtype} {tuple(gate.shape)} on {gate.device} and {up.dtype} {tuple(up.shape)} "
                         f"on {up.device}")
    if gate.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"kernels.swiglu: gate must be float32/bfloat16/float16, got {gate.dtype}")


def _launch_args(n: int) -> tuple[tuple[int], dict[str, int]]:
    p = launch_params("swiglu", {"numel": n})
    return (triton.cdiv(n, p["block_size"]),), {"BLOCK": p["block_size"], "num_warps": p["num_warps"]}


def _swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_inputs(gate, up)
    g_n, u_n = _flat(gate), _flat(up)
    n = g_n.numel()
    grid, kw = _launch_args(n)
    y_n = empty((n,), gate.dtype, gate.device)
    if n:
        _swiglu_fwd_kernel[grid](g_n, u_n, y_n, n, **kw)
    return y_n.view(gate.shape)


def _swiglu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dy_n, g_n, u_n = _flat(dy), _flat(gate), _flat(up)
    n = g_n.numel()
    grid, kw = _launch_args(n)
    dg_n = empty((n,), gate.dtype, gate.device)
    du_n = empty((n,), up.dtype, up.device)
    if n:
        _swiglu_bwd_kernel[grid](dy_n, g_n, u_n, dg_n, du_n, n, **kw)
    return dg_n.view(gate.shape), du_n.view(up.shape)


# --------------------------------------------------------------------------- custom ops
# (opaque to torch.compile, launch parameters resolved from the concrete shapes when they run: see
# kernels/rmsnorm.py)


@torch.library.custom_op("wb_kernels::swiglu_fwd", mutates_args=())
def _swiglu_fwd_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _swiglu_fwd(gate, up)


@_swiglu_fwd_op.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("wb_kernels::swiglu_bwd", mutates_args=())
def _swiglu_bwd_op(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _swiglu_bwd(dy, gate, up)


@_swiglu_bwd_op.register_fake
def _(dy, gate, up):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


# --------------------------------------------------------------------------- autograd


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        y = _swiglu_fwd_op(gate, up)
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        gate, up = ctx.saved_tensors
        return _swiglu_bwd_op(dy, gate, up)


# --------------------------------------------------------------------------- functional


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in the inputs' dtype (fp32 inside, one rounding): the ``triton`` backend of op
    ``swiglu`` (same signature as ``workbench.train.ops.swiglu_torch``; gate and up must have the same shape)."""
    return _SwiGLU.apply(gate, up)
