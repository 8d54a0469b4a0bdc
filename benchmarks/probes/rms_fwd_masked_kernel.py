"""kernels.rmsnorm's forward kernel as of commit 9b5819b, every access masked (the baseline of GPU run AJ,
benchmarks/probes/rms_even_probe.py; a record of what ran, not used by the package)."""

import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(
    X, R, W, Y, S, RSTD,
    M, D, stride_x, stride_r, stride_y, stride_s, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TWO_PASS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < M
    if TWO_PASS:  # BLOCK_D < D: sum of squares over column chunks, then a second read (from L2) to normalise
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            mask = row_ok[:, None] & (cols < D)[None, :]
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                s = (x + r).to(S.dtype.element_ty)
                tl.store(S + rows[:, None] * stride_s + cols[None, :], s, mask=mask)
                x = s.to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            mask = row_ok[:, None] & col_ok[None, :]
            if HAS_RESIDUAL:
                x = tl.load(S + rows[:, None] * stride_s + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
            else:
                x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:  # one pass: the tile holds whole rows
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = (x + r).to(S.dtype.element_ty)  # rounded like the unfused add, then normalised
            tl.store(S + rows[:, None] * stride_s + cols[None, :], s, mask=mask)
            x = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
