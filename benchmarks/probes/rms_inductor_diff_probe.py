"""What still separates our RMSNorm forward from inductor's at inductor's own launch? (GPU run AP; a record of what
ran, not a test.)

Run AO: with the row length a constexpr, kernels.rmsnorm's forward at inductor's launch (two passes over the whole
row; 2 rows, 16 warps at hidden 2,048 in fp32; 1 row x 2,048-column chunks, 16 warps at 4,096 with bf16 out) is
0.995x and 0.981x torch.compile. What is left of the difference in the code: our row offsets are int64 (inductor's
int32), the row stride is an argument (inductor's a literal) and we store rstd for the backward (inductor's
forward-only graph does not). A two-pass, unmasked copy of our forward with each of the three switchable, all 8
combinations, at inductor's launch (num_stages 1, as inductor), paired per round with torch.compile and with
kernels.rmsnorm's kernel at the same launch, 8 rounds; at hidden 2,048 and 4,096, fp32 out and bf16 out.

Usage: python benchmarks/probes/rms_inductor_diff_probe.py OUT_CSV
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.rmsnorm import _rmsnorm_fwd_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import Recorder, context, timed_rounds  # noqa: E402

ROUNDS = 8
# inductor's launches (run AN, from its code cache): (rows, chunk, warps)
INDUCTOR = {(2048, torch.float32): (2, 2048, 16), (4096, torch.float32): (1, 4096, 16),
            (2048, torch.bfloat16): (2, 2048, 16), (4096, torch.bfloat16): (1, 2048, 16)}


@triton.jit
def _fwd_variant(X, W, Y, RSTD, stride, eps, D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 I64: tl.constexpr, STORE_RSTD: tl.constexpr, LITERAL_STRIDE: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    if LITERAL_STRIDE:
        base = rows[:, None] * D
    else:
        base = rows[:, None] * stride
    acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, D, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        x = tl.load(X + base + cols[None, :], eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
    if STORE_RSTD:
        tl.store(RSTD + rows, rstd)
    for c0 in range(0, D, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        x = tl.load(X + base + cols[None, :], eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y + base + cols[None, :], (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty))


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(out_csv)
    for (D, out_dtype), (br, chunk, nw) in INDUCTOR.items():
        M = 8 * 2048
        x, w = torch.randn(M, D, device=dev), torch.randn(D, device=dev)
        y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
        ref = torch.compile(lambda x, w, o=out_dtype: ops.rms_norm_torch(x, w, 1e-5, o), dynamic=False)
        want = ref(x, w)
        nbytes = M * D * (4 + y.element_size())
        calls = {"torch.compile": lambda: ref(x, w),
                 f"kernels.rmsnorm r{br} c{chunk} w{nw} s1 2-pass": (
                     lambda: _rmsnorm_fwd_kernel[(M // br,)](
                         x, x, w, y, y, rstd, M, D, D, D, D, 1e-5, D=D, HAS_RESIDUAL=False, BLOCK_ROWS=br,
                         BLOCK_D=chunk, TWO_PASS=True, EVEN=True, num_warps=nw, num_stages=1))}
        for i64 in (True, False):
            for store in (True, False):
                for lit in (False, True):
                    name = f"{'i64' if i64 else 'i32'} {'rstd' if store else 'no rstd'} {'D' if lit else 'arg'} stride"
                    calls[name] = (lambda i64=i64, store=store, lit=lit: _fwd_variant[(M // br,)](
                        x, w, y, rstd, D, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=chunk, I64=i64, STORE_RSTD=store,
                        LITERAL_STRIDE=lit, num_warps=nw, num_stages=1))
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for name, call in calls.items():
            if name != "torch.compile":
                y.fill_(float("nan"))
                call()
                torch.testing.assert_close(y, want, **tol)
        label = f"fp32 in, {str(out_dtype)[6:]} out, hidden {D}, inductor's launch r{br} c{chunk} w{nw}"
        case_rows = timed_rounds(calls, ROUNDS, {"case": label}, nbytes, ceiling, base)
        rec.add(label, case_rows)
        del x, y, ref, calls
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    rec.print_tables(38)


if __name__ == "__main__":
    main()
