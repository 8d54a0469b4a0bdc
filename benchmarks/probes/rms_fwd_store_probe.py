"""Can the fp32-in, fp32-out RMSNorm forward pass torch.compile with streaming stores? (GPU run AC; a record of what
ran, not a test.)

The forward's output is written once and not read again by this kernel, yet its lines stay in L2 and compete with
the rows the two-pass variant re-reads from there. Variants of kernels.rmsnorm's forward (same code, fp32 in and
out, no residual) that differ in one thing: ``cs`` stores y with ``cache_modifier=".cs"`` (streaming, evict
first). Each is timed against torch.compile of the reference in interleaved rounds (kernels.bench.do_bench, L2
flushed), so run-to-run drift cancels in each round's ratio.

Usage: python benchmarks/probes/rms_fwd_store_probe.py OUT_CSV [ROUNDS]
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.bench import copy_ceiling_gb_per_s, do_bench  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402
from paired import write_csv  # noqa: E402


@triton.jit
def _fwd(X, W, Y, RSTD, M, D, eps, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TWO_PASS: tl.constexpr,
         CS: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
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
        tl.store(RSTD + rows, rstd, mask=row_ok)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            mask = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
            if CS:
                tl.store(Y + rows[:, None] * D + cols[None, :], y, mask=mask, cache_modifier=".cs")
            else:
                tl.store(Y + rows[:, None] * D + cols[None, :], y, mask=mask)
    else:
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
        if CS:
            tl.store(Y + rows[:, None] * D + cols[None, :], y, mask=mask, cache_modifier=".cs")
        else:
            tl.store(Y + rows[:, None] * D + cols[None, :], y, mask=mask)


# name -> (block_rows, chunk (None: one pass), num_warps, num_stages, cs)
VARIANTS = {
    "one-pass r2 w8": (2, None, 8, 2, False),
    "one-pass r2 w8 cs": (2, None, 8, 2, True),
    "one-pass r1 w4 cs": (1, None, 4, 2, True),
    "two-pass c1024 r2 w16 s3": (2, 1024, 16, 3, False),
    "two-pass c1024 r2 w16 s3 cs": (2, 1024, 16, 3, True),
    "two-pass c1024 r1 w8 s2 cs": (1, 1024, 8, 2, True),
    "two-pass c512 r1 w4 s2 cs": (1, 512, 4, 2, True),
}


def main() -> None:
    out_csv, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 6
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows = []
    for D in (2048, 4096):
        x = torch.randn(8, 2048, D, device=dev)
        w = torch.randn(D, device=dev)
        M = x.numel() // D
        nbytes = 2 * M * D * 4
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
        y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
        calls = {"torch.compile": lambda x=x, w=w, ref=ref: ref(x, w)}
        for name, (br, chunk, nw, ns, cs) in VARIANTS.items():
            def call(br=br, chunk=chunk, nw=nw, ns=ns, cs=cs, x=x, w=w, y=y, rstd=rstd, M=M, D=D):
                _fwd[(triton.cdiv(M, br),)](x, w, y, rstd, M, D, 1e-5, BLOCK_ROWS=br, BLOCK_D=chunk or D,
                                            TWO_PASS=chunk is not None, CS=cs, num_warps=nw, num_stages=ns)
            call()
            with torch.no_grad():
                torch.testing.assert_close(y, ref(x, w).reshape(M, D), rtol=1e-5, atol=1e-5)
            calls[name] = call
        for r in range(rounds):
            order = list(calls) if r % 2 == 0 else list(reversed(calls))
            for name in order:
                with torch.no_grad():
                    med, p20, p80 = do_bench(calls[name], False)
                rows.append({"kernel": "rmsnorm", "shape": f"8x2048x{D}", "mode": "fwd", "dtype": "float32",
                             "variant": name, "round": r, "median_ms": med, "p20_ms": p20, "p80_ms": p80,
                             "pct_of_copy_ceiling": 100 * nbytes / (med * 1e-3) / 1e9 / ceiling,
                             "copy_ceiling_gb_per_s": ceiling, "timestamp": stamp,
                             "gpu": torch.cuda.get_device_name(), **{k: ver[k] for k in ("torch", "triton", "cuda")}})
        del x, y, rstd
        torch.cuda.empty_cache()
    write_csv(out_csv, rows)
    print(f"copy ceiling {ceiling:.0f} GB/s; {rounds} interleaved rounds; x compile = median over rounds of "
          "(compile ms / variant ms) in the same round")
    print(f"{'D':>5} {'variant':>30} {'median ms':>9} {'% copy':>6} {'x compile':>9} {'min-max':>13} {'wins':>5}")
    for D in (2048, 4096):
        sel = [r for r in rows if r["shape"].endswith(f"x{D}")]
        comp = {r["round"]: r["median_ms"] for r in sel if r["variant"] == "torch.compile"}
        for name in ["torch.compile", *VARIANTS]:
            v = [r for r in sel if r["variant"] == name]
            ratios = [comp[r["round"]] / r["median_ms"] for r in v]
            print(f"{D:>5} {name:>30} {statistics.median(r['median_ms'] for r in v):9.4f} "
                  f"{statistics.median(r['pct_of_copy_ceiling'] for r in v):6.1f} {statistics.median(ratios):9.3f} "
                  f"{min(ratios):6.3f}-{max(ratios):6.3f} {sum(x > 1 for x in ratios):>2}/{len(ratios)}")


if __name__ == "__main__":
    main()
