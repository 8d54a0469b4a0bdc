"""FP8 tensorwise scaling as Triton kernels: the amax, then one pass that scales, casts and writes the FP8 tensor
both row-major and transposed.

Shape legend: M rows, N columns of the 2-D tensor cast (a Linear's input is M tokens x K features).

A Linear in FP8 needs each operand twice: row-major for one matmul, transposed for another (the input for the
forward and for the weight gradient, the output gradient for the input gradient and for the weight gradient).
torchao casts from the high-precision tensor once per use, so a tensor is read for its amax and then once per
layout; here the cast kernel reads each tile once and stores it in both layouts, and the amax is one read.

Numerics are torchao.float8's tensorwise cast, bit for bit (``float8_utils.amax_to_scale``, ``to_fp8_saturated``):

    amax  = max |x|                          (NaN where any element is NaN)
    scale = fp32(fp8_max / max(fp64(amax), 1e-12))
    q     = fp8(clamp(fp32(x) * scale, -fp8_max, fp8_max))     rounded to nearest, ties to even

On the GPU the last step is the hardware's conversion (``cvt.rn.satfinite``); under ``TRITON_INTERPRET=1``, where
Triton's ``.to(float8)`` does not round as CUDA's does, it is integer arithmetic on the fp32 bits (c10's
``fp8e4m3fn_from_fp32_value`` and ``fp8e5m2_from_fp32_value``). The tests check both against torchao bit for bit,
the GPU's on a GPU. Inputs must be 2-D with both dims
multiples of 16 (the FP8 matmul's rule, refused here with the shape named). Launch parameters come from
``kernels.registry`` (kernels ``fp8_amax`` and ``fp8_cast``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_tensor, interpreted, num_sms
from kernels.registry import launch_params

__all__ = ["FP8_FORMATS", "INTERPRETED", "fp8_amax", "fp8_cast_transpose"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

FP8_FORMATS: dict[torch.dtype, tuple[float, int, int]] = {
    torch.float8_e4m3fn: (448.0, 3, 7),
    torch.float8_e5m2: (57344.0, 2, 15),
}
"""FP8 dtype -> (largest finite value, mantissa bits, exponent bias)."""

_TL_FP8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}
"""The Triton dtype of each FP8 format, for the GPU's own conversion."""

EPS = 1e-12
"""torchao.float8.float8_utils.EPS: the smallest amax a scale is computed from."""


# --------------------------------------------------------------------------- kernels


@triton.jit
def _amax_kernel(X, AMAX, n, BLOCK: tl.constexpr):
    # max |x| as the int32 bits of the fp32 value: with the sign bit cleared the bits order as the magnitudes do,
    # and a NaN (exponent all ones, mantissa non-zero) sorts above +inf, so one NaN makes the amax NaN as
    # torch.max does
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid.to(tl.int64) * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, x.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    tl.atomic_max(AMAX, tl.max(acc, 0))


@triton.jit
def _fp8_bits(y, FMAX: tl.constexpr, MANT: tl.constexpr, BIAS: tl.constexpr):
    """fp32 ``y`` -> the uint8 bits of its saturated FP8 value, round to nearest even (c10's conversion)."""
    y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FMAX), FMAX))  # clamp; NaN stays NaN
    u = y.to(tl.int32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    SHIFT: tl.constexpr = 23 - MANT
    MIN_NORMAL: tl.constexpr = (127 - BIAS + 1) << 23  # the fp32 bits of FP8's smallest normal number
    DENORM: tl.constexpr = (127 - BIAS + SHIFT + 1) << 23  # 2^(SHIFT + 1 - BIAS): its add rounds the subnormals
    # subnormal FP8: the fp32 add aligns the value to FP8's subnormal step and rounds it (to nearest even)
    denorm = tl.full([], DENORM, tl.int32).to(tl.float32, bitcast=True)
    sub = (a.to(tl.float32, bitcast=True) + denorm).to(tl.int32, bitcast=True) - DENORM
    # normal FP8: rebias the exponent, add half an FP8 step less one (plus one where the kept mantissa is odd),
    # then drop the low bits
    odd = (a >> SHIFT) & 1
    norm = (a + (((BIAS - 127) << 23) + (1 << (SHIFT - 1)) - 1) + odd) >> SHIFT
    bits = tl.where(a < MIN_NORMAL, sub, norm)
    bits = tl.where(a > 0x7F800000, 0x7F, bits)  # NaN: every exponent and mantissa bit set
    return (bits | sign).to(tl.uint8)


@triton.jit
def _cast_transpose_kernel(X, Q, QT, AMAX, SCALE, M, N, FMAX: tl.constexpr, MANT: tl.constexpr,
                           BIAS: tl.constexpr, EPS_: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                           HW_CVT: tl.constexpr, FP8: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    amax = tl.load(AMAX).to(tl.float32, bitcast=True).to(tl.float64)
    # torch.clamp keeps a NaN amax (then every value is NaN, as torchao's are)
    scale = (FMAX / tl.where(amax != amax, amax, tl.maximum(amax, EPS_))).to(tl.float32)
    if (pid_m == 0) & (pid_n == 0):
        tl.store(SCALE, scale)
    rm = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
    rn = pid_n.to(tl.int64) * BN + tl.arange(0, BN)
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(X + rm[:, None] * N + rn[None, :], mask=ok, other=0.0).to(tl.float32)
    if HW_CVT:  # the GPU's saturating round-to-nearest-even conversion (cvt.rn.satfinite), then its bits
        y = x * scale
        y = tl.where(y != y, y, tl.minimum(tl.maximum(y, -FMAX), FMAX))
        q = y.to(FP8, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:  # the same rounding in integer arithmetic: the interpreter's conversion does not round as CUDA's does
        q = _fp8_bits(x * scale, FMAX, MANT, BIAS)
    tl.store(Q + rm[:, None] * N + rn[None, :], q, mask=ok)
    # through transposed pointers: Triton lays the store out for them (a tl.trans of the tile first timed the same)
    tl.store(QT + rn[None, :] * M + rm[:, None], q, mask=ok)


# --------------------------------------------------------------------------- launchers

INTERPRETED = interpreted(_amax_kernel)
"""Whether the kernels were decorated under TRITON_INTERPRET=1 (they then run on CPU tensors)."""


def _check(x: torch.Tensor, dtype: torch.dtype) -> None:
    check_tensor("fp8_cast", "x", x, INTERPRETED)
    if dtype not in FP8_FORMATS:
        raise ValueError(f"kernels.fp8_cast: dtype must be one of {[str(d) for d in FP8_FORMATS]}, got {dtype}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"kernels.fp8_cast: x must be float32/bfloat16/float16, got {x.dtype}")
    if x.dim() != 2 or x.shape[0] % 16 or x.shape[1] % 16:
        raise ValueError(f"kernels.fp8_cast: x must be 2-D with both dims multiples of 16 (the FP8 matmul's rule), "
                         f"got shape {tuple(x.shape)}")


def fp8_amax(x: torch.Tensor) -> torch.Tensor:
    """``max |x|`` as a 1-element fp32 tensor (NaN where x holds a NaN), in one read of ``x``."""
    x = x.contiguous()
    n = x.numel()
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    if n:
        p = launch_params("fp8_amax", {"numel": n})
        grid = (max(1, min(triton.cdiv(n, p["block_size"]), p["programs_per_sm"] * num_sms(x.device))),)
        _amax_kernel[grid](x, amax, n, BLOCK=p["block_size"], num_warps=p["num_warps"])
    return amax.view(torch.float32)


def _fp8_cast_transpose(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, dtype)
    x = x.contiguous()
    M, N = x.shape
    fmax, mant, bias = FP8_FORMATS[dtype]
    amax = fp8_amax(x).view(torch.int32)
    q = torch.empty((M, N), dtype=torch.uint8, device=x.device)
    qt = torch.empty((N, M), dtype=torch.uint8, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    if M and N:
        p = launch_params("fp8_cast", {"rows": M, "cols": N})
        grid = (triton.cdiv(M, p["block_m"]), triton.cdiv(N, p["block_n"]))
        _cast_transpose_kernel[grid](x, q, qt, amax, scale, M, N, FMAX=fmax, MANT=mant, BIAS=bias, EPS_=EPS,
                                     BM=p["block_m"], BN=p["block_n"], HW_CVT=not INTERPRETED, FP8=_TL_FP8[dtype], num_warps=p["num_warps"])
    else:
        scale.fill_(fmax / EPS)
    return q.view(dtype), qt.view(dtype), scale


# --------------------------------------------------------------------------- custom op
# (opaque to torch.compile, launch parameters resolved from the concrete shapes when it runs: see
# kernels/rmsnorm.py)


@torch.library.custom_op("wb_kernels::fp8_cast_transpose", mutates_args=())
def _fp8_cast_transpose_op(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _fp8_cast_transpose(x, dtype)


@_fp8_cast_transpose_op.register_fake
def _(x, dtype):
    M, N = x.shape
    return x.new_empty((M, N), dtype=dtype), x.new_empty((N, M), dtype=dtype), x.new_empty((), dtype=torch.float32)


def fp8_cast_transpose(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, q_t, scale)``: ``x`` (M x N) scaled by ``scale`` and cast to ``dtype``, row-major (M x N) and transposed
    (N x M, contiguous), as torchao's tensorwise recipe casts it; ``x / scale`` is what ``q`` holds. No gradient
    flows through it (the FP8 Linear's autograd owns the backward: workbench/train/fp8.py)."""
    return _fp8_cast_transpose_op(x, dtype)
