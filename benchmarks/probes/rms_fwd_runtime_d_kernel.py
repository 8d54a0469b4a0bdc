"""The RMSNorm forward kernel as of 1a5e719, before D became a constexpr: the baseline of GPU run AO.

A copy of kernels/rmsnorm.py's ``_load``, ``_store`` and ``_rmsnorm_fwd_kernel`` at that commit (the row length a
runtime argument), kept so the probe can time it in the same rounds as the kernel that replaced it.
"""

import triton
import triton.language as tl


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
    M, D, stride_x, stride_r, stride_y, stride_s, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TWO_PASS: tl.constexpr,
    EVEN: tl.constexpr,
):
    # EVEN: no access needs a mask (M % BLOCK_ROWS == 0 and D % BLOCK_D == 0), as in inductor's kernels for static
    # shapes. Run AJ (paired against the masked kernel): without the residual 0.3-3.1% faster at 8 of 12 launches,
    # level within 0.2% at the other 4; with it 0.2-0.5% slower at 4 of 4, so the launcher sets it only without.
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
        _store(RSTD + rows, rstd, row_ok, EVEN)
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
