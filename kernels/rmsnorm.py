"""RMSNorm, optionally fused with the residual add: forward and backward Triton kernels.

Shape legend: M rows (every leading dim flattened: B x T), D hidden size.

    y_MD = x_MD * rstd_M * w_D,   rstd_M = 1 / sqrt(mean_D(x^2) + eps)        (fp32 inside)
    fused add:  s_MD = x_MD + r_MD, y_MD = rmsnorm(s_MD); returns (y, s)

The backward's formulas, the one- and two-pass forward tiles, the persistent backward and the dw partials' sum:
docs/kernel-notes.md, "RMSNorm". Launch parameters come from ``kernels.registry`` (kernel ``rmsnorm``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_tensor, empty, interpreted, num_sms
from kernels.registry import launch_params

__all__ = ["rms_norm_add_triton", "rms_norm_triton"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _load(ptrs, mask, EVEN: tl.constexpr, policy: tl.constexpr):
    """``tl.load`` masked (0 where off) unless EVEN: the tile lies wholly inside the tensor. ``policy``: the
    eviction policy, "" for the default (passed every time: Triton 3.6 does not take a constexpr's default)."""
    if EVEN:
        return tl.load(ptrs, eviction_policy=policy)
    else:
        return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=policy)


@triton.jit
def _store(ptrs, value, mask, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _rmsnorm_fwd_kernel(
    X, R, W, Y, S, RSTD,
    M, stride_x, stride_r, stride_y, stride_s, eps,
    D: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
    TWO_PASS: tl.constexpr, EVEN: tl.constexpr,
):
    # D is a constexpr, as inductor's literal row length. EVEN: no access needs a mask (M % BLOCK_ROWS == 0 and
    # D % BLOCK_D == 0); the launcher sets it only without the residual, where it is faster
    # (docs/kernel-notes.md, RMSNorm).
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < M
    if TWO_PASS:  # BLOCK_D < D: sum of squares over column chunks, then a second read (from L2) to normalise
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            mask = row_ok[:, None] & (cols < D)[None, :]
            x = _load(X + rows[:, None] * stride_x + cols[None, :], mask, EVEN, "evict_last").to(tl.float32)
            if HAS_RESIDUAL:
                r = _load(R + rows[:, None] * stride_r + cols[None, :], mask, EVEN, "").to(tl.float32)
                s = (x + r).to(S.dtype.element_ty)
                _store(S + rows[:, None] * stride_s + cols[None, :], s, mask, EVEN)
                x = s.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            mask = row_ok[:, None] & col_ok[None, :]
            if HAS_RESIDUAL:
                x = _load(S + rows[:, None] * stride_s + cols[None, :], mask, EVEN, "evict_first").to(tl.float32)
            else:
                x = _load(X + rows[:, None] * stride_x + cols[None, :], mask, EVEN, "evict_first").to(tl.float32)
            w = _load(W + cols, col_ok, EVEN, "evict_last").to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            _store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask, EVEN)
        # rstd is stored after the second pass, never between the passes (docs/kernel-notes.md, RMSNorm)
        _store(RSTD + rows, rstd, row_ok, EVEN)
    else:  # one pass: the tile holds whole rows
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        x = _load(X + rows[:, None] * stride_x + cols[None, :], mask, EVEN, "").to(tl.float32)
        if HAS_RESIDUAL:
            r = _load(R + rows[:, None] * stride_r + cols[None, :], mask, EVEN, "").to(tl.float32)
            s = (x + r).to(S.dtype.element_ty)  # rounded like the unfused add, then normalised
            _store(S + rows[:, None] * stride_s + cols[None, :], s, mask, EVEN)
            x = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        _store(RSTD + rows, rstd, row_ok, EVEN)
        w = _load(W + cols, col_ok, EVEN, "").to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        _store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask, EVEN)


@triton.jit
def _rmsnorm_bwd_load(
    DY, X, RSTD, DS, tile, M, cols, col_ok, stride_dy, stride_x, stride_ds,
    HAS_DS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    """One row tile's inputs in their stored dtypes (every row masked past M): (x, dy, ds, rstd)."""
    rows = (tile * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    if HAS_DS:  # loaded with the others, so its latency is not exposed after the row reduction
        ds = tl.load(DS + rows[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0)
    else:
        ds = dy  # unused
    return x, dy, ds, rstd


@triton.jit
def _rmsnorm_bwd_kernel(
    DY, X, W, RSTD, DS, DX, DX2, DW_PARTIAL,
    M, D, stride_dy, stride_x, stride_ds, stride_dx,
    HAS_DS: tl.constexpr, HAS_DX2: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
    n_tiles = tl.cdiv(M, BLOCK_ROWS)
    if PREFETCH:  # the first tile's inputs; each step then loads the next tile's before working on its own
        x_next, dy_next, ds_next, rstd_next = _rmsnorm_bwd_load(
            DY, X, RSTD, DS, pid, M, cols, col_ok, stride_dy, stride_x, stride_ds, HAS_DS, BLOCK_ROWS)
    for tile in range(pid, n_tiles, n_programs):
        if PREFETCH:
            x, dy, ds, rstd = x_next, dy_next, ds_next, rstd_next
            x_next, dy_next, ds_next, rstd_next = _rmsnorm_bwd_load(
                DY, X, RSTD, DS, tile + n_programs, M, cols, col_ok, stride_dy, stride_x, stride_ds, HAS_DS,
                BLOCK_ROWS)
        else:
            x, dy, ds, rstd = _rmsnorm_bwd_load(
                DY, X, RSTD, DS, tile, M, cols, col_ok, stride_dy, stride_x, stride_ds, HAS_DS, BLOCK_ROWS)
        rows = (tile * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        mask = (rows < M)[:, None] & col_ok[None, :]
        xhat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        g = dy * w[None, :]
        c = tl.sum(xhat * g, axis=1) / D
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        if HAS_DS:
            dx += ds.to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DX2:  # the same gradient in a second dtype (the branch's, when the add mixed dtypes)
            tl.store(DX2 + rows[:, None] * stride_dx + cols[None, :], dx.to(DX2.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid.to(tl.int64) * D + cols, tl.sum(dw, axis=0), mask=col_ok)


@triton.jit
def _sum_rows_kernel(P, OUT, n_rows, D, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT[c] = sum_r P[r, c] for a block of BLOCK_C columns per program, rows in a fixed order (deterministic)."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < D
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for r0 in range(0, n_rows, BLOCK_P):
        rows = r0 + tl.arange(0, BLOCK_P)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        acc += tl.load(P + rows[:, None].to(tl.int64) * D + cols[None, :], mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_ok)


# --------------------------------------------------------------------------- launchers

_INTERPRETED = interpreted(_rmsnorm_fwd_kernel)  # decorated under TRITON_INTERPRET=1: runs on CPU tensors


def _rows(t: torch.Tensor, D: int) -> torch.Tensor:
    t = t.reshape(-1, D)
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_inputs(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    check_tensor("rmsnorm", "x", x, _INTERPRETED)
    if x.dim() < 1 or x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"kernels.rmsnorm: x must be float32/bfloat16/float16 with >= 1 dim, got "
                         f"{x.dtype} of shape {tuple(x.shape)}")
    D = x.shape[-1]
    if weight.shape != (D,) or weight.device != x.device or weight.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"kernels.rmsnorm: weight must be a float tensor of shape ({D},) on {x.device}, got "
                         f"{weight.dtype} {tuple(weight.shape)} on {weight.device}")
    if residual is not None and (residual.shape != x.shape or residual.device != x.device
                                 or residual.dtype not in _FLOAT_DTYPES):
        raise ValueError(f"kernels.rmsnorm: residual must be a float tensor shaped like x {tuple(x.shape)} on "
                         f"{x.device}, got {residual.dtype} {tuple(residual.shape)} on {residual.device}")


def _params(M: int, D: int) -> dict[str, int]:
    return launch_params("rmsnorm", {"rows": M, "hidden": D})


def _sum_dtype(x: torch.Tensor, residual: torch.Tensor | None) -> torch.dtype:
    return x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)


def _rmsnorm_fwd(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """-> (y_MD in ``out_dtype``, s_MD or None, rstd_M); s in the dtype of ``x + residual``."""
    _check_inputs(x, residual, weight)
    if out_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"kernels.rmsnorm: out_dtype must be one of {list(_FLOAT_DTYPES)}, got {out_dtype}")
    D = x.shape[-1]
    x_MD = _rows(x, D)
    M = x_MD.shape[0]
    p = _params(M, D)
    s_dtype = _sum_dtype(x, residual)
    y_MD = empty((M, D), out_dtype, x.device)
    s_MD = empty((M, D), s_dtype, x.device) if residual is not None else None
    rstd_M = empty((M,), torch.float32, x.device)
    if M == 0 or D == 0:
        return y_MD, s_MD, rstd_M
    r_MD = _rows(residual, D) if residual is not None else x_MD  # x_MD: unused placeholder without residual
    s_arg = s_MD if s_MD is not None else y_MD
    block_d = min(p["fwd_block_size"], p["block_size"])
    _rmsnorm_fwd_kernel[(triton.cdiv(M, p["block_rows"]),)](
        x_MD, r_MD, weight, y_MD, s_arg, rstd_M,
        M, x_MD.stride(0), r_MD.stride(0), y_MD.stride(0), s_arg.stride(0), float(eps),
        D=D, HAS_RESIDUAL=residual is not None, BLOCK_ROWS=p["block_rows"], BLOCK_D=block_d,
        TWO_PASS=p["fwd_block_size"] < D or p["fwd_passes"] == 2,
        EVEN=residual is None and M % p["block_rows"] == 0 and D % block_d == 0,
        num_warps=p["num_warps"], num_stages=p["num_stages"],
    )
    return y_MD, s_MD, rstd_M


def _rmsnorm_bwd(
    dy: torch.Tensor, x_MD: torch.Tensor, weight: torch.Tensor, rstd_M: torch.Tensor, ds: torch.Tensor | None,
    dx2_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """-> (dx_MD in x's dtype, dx_MD in ``dx2_dtype`` (None when that is x's), dw_D in weight's dtype); ``ds``
    is added to dx (fused residual). ``dy`` may be in another dtype than x (a norm written in autocast's dtype gets its
    gradient in that dtype). ``dx2_dtype``: the kernel also writes dx in that dtype (the fused add's branch
    input, bf16 where the residual stream is fp32), instead of a cast pass after it."""
    M, D = x_MD.shape
    x_MD, dy_MD = _rows(x_MD, D), _rows(dy, D)
    ds_MD = _rows(ds, D) if ds is not None else dy_MD  # dy_MD: unused placeholder without ds
    p = _params(M, D)
    dx_MD = empty((M, D), x_MD.dtype, x_MD.device)
    dx2_MD = empty((M, D), dx2_dtype, x_MD.device) if dx2_dtype != x_MD.dtype else None
    if M == 0 or D == 0:
        return dx_MD, dx2_MD, torch.zeros_like(weight)
    programs = min(triton.cdiv(M, p["bwd_block_rows"]), num_sms(x_MD.device) * p["programs_per_sm"])
    dw_partial = empty((programs, D), torch.float32, x_MD.device)
    _rmsnorm_bwd_kernel[(programs,)](
        dy_MD, x_MD, weight, rstd_M, ds_MD, dx_MD, dx2_MD if dx2_MD is not None else dx_MD, dw_partial,
        M, D, dy_MD.stride(0), x_MD.stride(0), ds_MD.stride(0), dx_MD.stride(0),
        HAS_DS=ds is not None, HAS_DX2=dx2_MD is not None, BLOCK_ROWS=p["bwd_block_rows"],
        BLOCK_D=p["block_size"], PREFETCH=p["bwd_tiles_in_flight"] == 2,
        num_warps=p["bwd_num_warps"], num_stages=p["num_stages"],
    )
    return dx_MD, dx2_MD, _sum_rows(dw_partial, weight.dtype)


def _sum_rows(partial: torch.Tensor, dtype: torch.dtype, block_p: int = 0, block_c: int = 16,
              num_warps: int = 4) -> torch.Tensor:
    """``partial.sum(0)`` ([P, D] fp32 -> [D] in ``dtype``) in one Triton kernel: the backward's dw partials.

    Each program sums ``block_c`` columns of every row, ``block_p`` rows per loop step (default: every row, up to
    256), and writes ``dtype`` directly; 16 columns a program was the fastest at every shape probed, about half
    of torch's column reduction (docs/kernel-notes.md, RMSNorm)."""
    P, D = partial.shape
    out = empty((D,), dtype, partial.device)
    block_p = block_p or min(256, triton.next_power_of_2(max(P, 1)))
    _sum_rows_kernel[(triton.cdiv(D, block_c),)](partial, out, P, D, BLOCK_P=block_p, BLOCK_C=block_c,
                                                 num_warps=num_warps)
    return out


# --------------------------------------------------------------------------- custom ops
#
# The launchers run as torch.library custom ops: torch.compile sees each as one opaque node whose output
# shapes come from the fake (meta) function below, and the launch parameters are resolved when it runs,
# from the concrete shapes. A symbolic sequence length (compile_shapes: dynamic) then never reaches the
# launch grid or a constexpr, and inductor neither re-generates nor caches the user kernels.


@torch.library.custom_op("wb_kernels::rmsnorm_fwd", mutates_args=())
def _rmsnorm_fwd_op(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (y_MD in ``out_dtype``, s_MD (an empty tensor without residual), rstd_M)."""
    y_MD, s_MD, rstd_M = _rmsnorm_fwd(x, residual, weight, eps, out_dtype)
    return y_MD, (s_MD if s_MD is not None else y_MD.new_empty(0)), rstd_M


@_rmsnorm_fwd_op.register_fake
def _(x, residual, weight, eps, out_dtype):
    D = x.shape[-1]
    M = x.numel() // D if D else 0
    s_dtype = _sum_dtype(x, residual)
    y_MD = x.new_empty((M, D), dtype=out_dtype)
    s_MD = x.new_empty((M, D) if residual is not None else (0,), dtype=s_dtype)
    return y_MD, s_MD, x.new_empty((M,), dtype=torch.float32)


@torch.library.custom_op("wb_kernels::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd_op(
    dy: torch.Tensor, x_MD: torch.Tensor, weight: torch.Tensor, rstd_M: torch.Tensor, ds: torch.Tensor | None,
    dx2_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx_MD, dx_MD in ``dx2_dtype`` (an empty tensor when that is x's dtype), dw_D)."""
    dx_MD, dx2_MD, dw = _rmsnorm_bwd(dy, x_MD, weight, rstd_M, ds, dx2_dtype)
    return dx_MD, (dx2_MD if dx2_MD is not None else dx_MD.new_empty(0)), dw


@_rmsnorm_bwd_op.register_fake
def _(dy, x_MD, weight, rstd_M, ds, dx2_dtype):
    dx_MD = torch.empty_like(x_MD, memory_format=torch.contiguous_format)
    dx2_MD = torch.empty_like(dx_MD, dtype=dx2_dtype) if dx2_dtype != x_MD.dtype else x_MD.new_empty(0)
    return dx_MD, dx2_MD, torch.empty_like(weight)


# --------------------------------------------------------------------------- autograd


# Saved for backward: inputs and outputs as they are (reshaped in backward), never a view of one made here:
# torch.compile rejects a saved intermediate that aliases an input or output.


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
        y_MD, _, rstd_M = _rmsnorm_fwd_op(x, None, weight, eps, out_dtype)
        ctx.save_for_backward(x, weight, rstd_M)
        return y_MD.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd_M = ctx.saved_tensors
        dx_MD, _, dw = _rmsnorm_bwd_op(dy, x.reshape(-1, x.shape[-1]), weight, rstd_M, None, x.dtype)
        return dx_MD.view(dy.shape), dw, None, None


class _RMSNormAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype):
        y_MD, s_MD, rstd_M = _rmsnorm_fwd_op(x, residual, weight, eps, out_dtype)
        s = s_MD.view(x.shape)
        ctx.save_for_backward(s, weight, rstd_M)
        ctx.dtypes = (x.dtype, residual.dtype)
        return y_MD.view(x.shape), s

    @staticmethod
    def backward(ctx, dy: torch.Tensor, ds: torch.Tensor | None):
        s, weight, rstd_M = ctx.saved_tensors
        x_dtype, r_dtype = ctx.dtypes
        other = x_dtype if x_dtype != s.dtype else r_dtype  # the kernel also writes dx in this dtype
        dsum_MD, dsum2_MD, dw = _rmsnorm_bwd_op(dy, s.reshape(-1, s.shape[-1]), weight, rstd_M, ds, other)
        dsum = dsum_MD.view(dy.shape)

        def grad(dt: torch.dtype) -> torch.Tensor:
            if dt == s.dtype:
                return dsum
            if dt == dsum2_MD.dtype and dsum2_MD.shape == dsum_MD.shape:
                return dsum2_MD.view(dy.shape)
            return dsum.to(dt)  # (bf16 + fp16: both differ from the fp32 sum; the second is cast here)

        return grad(x_dtype), grad(r_dtype), dw, None, None


# --------------------------------------------------------------------------- functional


def rms_norm_triton(
    x_BTD: torch.Tensor, weight_D: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim, fp32 inside, in ``out_dtype`` (default ``x``'s dtype): the ``triton`` backend
    of op ``rmsnorm`` (same signature and numerics as ``workbench.train.ops.rms_norm_torch``)."""
    return _RMSNorm.apply(x_BTD, weight_D, eps, out_dtype or x_BTD.dtype)


def rms_norm_add_triton(
    x_BTD: torch.Tensor, residual_BTD: torch.Tensor, weight_D: torch.Tensor, eps: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``s = x + residual; (rms_norm(s, weight, eps), s)``: one read of x and residual instead of
    three passes (add, then norm's read of s). y in ``out_dtype`` (default: s's dtype)."""
    return _RMSNormAdd.apply(x_BTD, residual_BTD, weight_D, eps, out_dtype or _sum_dtype(x_BTD, residual_BTD))
