"""Is the hidden size as a compile-time constant what inductor's fp32 RMSNorm forward has over ours? (GPU run AF; a
record of what ran, not a test.)

Inductor compiles static shapes into the kernel (the row length is a literal: the loop's trip count and the masks
are known when compiling); kernels.rmsnorm passes D at run time. Variants of the fp32 forward (benchmarks/probes/
int32_index_probe.py's copy of kernels.rmsnorm's) with D at run time or as a tl.constexpr, and without the rstd
store, each against torch.compile in 6 interleaved rounds (ratios paired per round). Inductor's generated code
for the reference is written to $OUT/inductor_rmsnorm_fp32_<D>.py.

Usage: python benchmarks/probes/rms_fwd_constexpr_probe.py OUT_CSV
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from int32_index_probe import _rms_fwd  # noqa: E402
from paired import paired_lines, write_csv  # noqa: E402

from kernels.bench import copy_ceiling_gb_per_s, do_bench  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402


@triton.jit
def _rms_fwd_const(X, W, Y, RSTD, M, eps, D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                   TWO_PASS: tl.constexpr, STORE_RSTD: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < M
    if TWO_PASS:
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            mask = row_ok[:, None] & (cols < D)[None, :]
            x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
        if STORE_RSTD:
            tl.store(RSTD + rows, rstd, mask=row_ok)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            mask = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        if STORE_RSTD:
            tl.store(RSTD + rows, rstd, mask=row_ok)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def main() -> None:
    from torch._inductor.utils import run_and_get_code

    out_csv = Path(sys.argv[1])
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows = []
    for D in (2048, 4096):
        x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
        M = x.numel() // D
        nbytes = 2 * M * D * 4
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
        with torch.no_grad():
            _, code = run_and_get_code(ref, x, w)
        (Path(os.environ.get("OUT", "/tmp")) / f"inductor_rmsnorm_fp32_{D}.py").write_text("\n# ----\n".join(code))
        y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
        chunk = 1024 if D == 2048 else 2048
        calls = {"torch.compile": lambda x=x, w=w, ref=ref: ref(x, w)}
        for br, nw in ((1, 8), (2, 16), (1, 16)):
            grid = (triton.cdiv(M, br),)
            calls[f"two-pass c{chunk} r{br} w{nw} D runtime"] = (
                lambda grid=grid, br=br, nw=nw, x=x, w=w, y=y, rstd=rstd, M=M, D=D: _rms_fwd[grid](
                    x, w, y, rstd, M, D, 1e-5, BLOCK_ROWS=br, BLOCK_D=chunk, TWO_PASS=True, I64=True, num_warps=nw,
                    num_stages=1))
            for store in (True, False):
                calls[f"two-pass c{chunk} r{br} w{nw} D const{'' if store else ' no rstd'}"] = (
                    lambda grid=grid, br=br, nw=nw, store=store, x=x, w=w, y=y, rstd=rstd, M=M, D=D:
                    _rms_fwd_const[grid](x, w, y, rstd, M, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=chunk, TWO_PASS=True,
                                         STORE_RSTD=store, num_warps=nw, num_stages=1))
        calls["one-pass r2 w8 D const"] = (lambda x=x, w=w, y=y, rstd=rstd, M=M, D=D: _rms_fwd_const[(M // 2,)](
            x, w, y, rstd, M, 1e-5, D=D, BLOCK_ROWS=2, BLOCK_D=D, TWO_PASS=False, STORE_RSTD=True, num_warps=8))
        with torch.no_grad():
            for name, call in calls.items():
                y.fill_(float("nan"))
                call()
                if name != "torch.compile":
                    torch.testing.assert_close(y, ref(x, w).reshape(M, D), rtol=1e-5, atol=1e-5)
            for rnd in range(6):
                for name in (list(calls) if rnd % 2 == 0 else list(reversed(calls))):
                    ms = do_bench(calls[name], False)
                    rows.append({"kernel": "rmsnorm", "shape": f"8x2048x{D}", "mode": "fwd", "dtype": "float32",
                                 "variant": name, "round": rnd, "median_ms": ms[0], "p20_ms": ms[1],
                                 "p80_ms": ms[2], "pct_of_copy_ceiling": 100 * nbytes / (ms[0] * 1e-3) / 1e9 / ceiling,
                                 "copy_ceiling_gb_per_s": ceiling, "timestamp": stamp,
                                 "gpu": torch.cuda.get_device_name(), **{k: ver[k] for k in ("torch", "triton", "cuda")}})
        del x, y, rstd
        torch.cuda.empty_cache()
    write_csv(out_csv, rows)
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for D in (2048, 4096):
        print(f"hidden {D}")
        print("\n".join(paired_lines([r for r in rows if r["shape"].endswith(f"x{D}")], 40)))


if __name__ == "__main__":
    main()
