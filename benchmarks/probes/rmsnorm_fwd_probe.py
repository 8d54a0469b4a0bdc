"""Why is the RMSNorm forward at 0.92x torch.compile? (GPU run Q; a record of what ran, not a test.)

Writes inductor's generated code for the compiled reference (fp32 out, and bf16 out as the model now runs it)
to $OUT/inductor_rmsnorm_*.py, and times, with kernels.bench.do_bench (GPU time only, L2 flushed), the
compiled reference against variants of a one-pass forward that differ in one thing each:
  base     kernels.rmsnorm's forward kernel as launched by the workbench (block_rows, warps from the sweep)
  nomask   no masks (the tile covers the rows exactly: M % rows == 0, D == BLOCK_D)
  rsqrt    tl.rsqrt instead of 1 / tl.sqrt
  norstd   no rstd store (inductor's forward-only kernel does not write it)
  evict    x loaded with eviction_policy="evict_first", w with "evict_last" (inductor's hints)
Prints a table; writes $OUT/rmsnorm_fwd_probe.csv.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernels.bench import do_bench, versions  # noqa: E402
from workbench import ops  # noqa: E402


@triton.jit
def _fwd(X, W, Y, RSTD, M, D, eps, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr,
         RSQRT: tl.constexpr, STORE_RSTD: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    offs = rows[:, None] * D + cols[None, :]
    if MASK:
        mask = (rows < M)[:, None] & (cols < D)[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    elif EVICT:
        x = tl.load(X + offs, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(X + offs).to(tl.float32)
    ms = tl.sum(x * x, axis=1) / D + eps
    rstd = tl.rsqrt(ms) if RSQRT else 1.0 / tl.sqrt(ms)
    if STORE_RSTD:
        tl.store(RSTD + rows, rstd)
    if EVICT:
        w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
    else:
        w = tl.load(W + cols).to(tl.float32)
    y = (x * rstd[:, None] * w[None, :]).to(Y.dtype.element_ty)
    if MASK:
        tl.store(Y + offs, y, mask=mask)
    else:
        tl.store(Y + offs, y)


VARIANTS = {  # name -> (MASK, RSQRT, STORE_RSTD, EVICT)
    "base": (True, False, True, False),
    "nomask": (False, False, True, False),
    "rsqrt": (True, True, True, False),
    "norstd": (True, False, False, False),
    "nomask+rsqrt+norstd": (False, True, False, False),
    "evict": (False, False, True, True),
}


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp")) / "probeQ"
    out.mkdir(parents=True, exist_ok=True)
    from torch._inductor.utils import run_and_get_code

    ver = versions()
    rows = []
    for D in (2048, 4096):
        x = torch.randn(8, 2048, D, device="cuda")
        w = torch.randn(D, device="cuda")
        M = x.numel() // D
        for out_dtype in (torch.float32, torch.bfloat16):
            tag = f"{D}_{str(out_dtype).split('.')[-1]}"
            ref = torch.compile(lambda x, w, dt=out_dtype: ops.rms_norm_torch(x, w, 1e-5, dt), dynamic=False)
            with torch.no_grad():
                _, code = run_and_get_code(ref, x, w)
                (out / f"inductor_rmsnorm_{tag}.py").write_text("\n\n# ----\n\n".join(code))
                nbytes = M * D * (4 + out_dtype.itemsize)
                med, p20, p80 = do_bench(lambda: ref(x, w), False)  # noqa: B023
                rows.append({"variant": "torch.compile", "D": D, "out": str(out_dtype), "block_rows": "",
                             "num_warps": "", "median_ms": med, "p20_ms": p20, "p80_ms": p80,
                             "gb_per_s": nbytes / med / 1e6})
                y = torch.empty(M, D, device="cuda", dtype=out_dtype)
                rstd = torch.empty(M, device="cuda")
                for name, (mask, rsq, store, evict) in VARIANTS.items():
                    for br, nw in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)):
                        if D == 4096 and br == 4:
                            continue
                        def call(br=br, nw=nw, mask=mask, rsq=rsq, store=store, evict=evict):  # noqa: E306
                            _fwd[(M // br,)](x, w, y, rstd, M, D, 1e-5, BLOCK_ROWS=br, BLOCK_D=D, MASK=mask,
                                             RSQRT=rsq, STORE_RSTD=store, EVICT=evict, num_warps=nw,
                                             num_stages=2)
                        call()
                        torch.testing.assert_close(y.float(), ref(x, w).reshape(M, D).float(), rtol=2e-2,
                                                   atol=2e-2)
                        med, p20, p80 = do_bench(call, False)
                        rows.append({"variant": name, "D": D, "out": str(out_dtype), "block_rows": br,
                                     "num_warps": nw, "median_ms": med, "p20_ms": p20, "p80_ms": p80,
                                     "gb_per_s": nbytes / med / 1e6})
    for r in rows:
        r.update(ver)
    with open(out / "rmsnorm_fwd_probe.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    # the table: per (D, out) the compile reference and each variant's best launch
    print(f"{'D':>5} {'out':>15} {'variant':>22} {'rows':>4} {'warps':>5} {'ms':>8} {'GB/s':>7} {'x compile':>9}")
    for D in (2048, 4096):
        for od in ("torch.float32", "torch.bfloat16"):
            sel = [r for r in rows if r["D"] == D and r["out"] == od]
            ref_ms = next(r["median_ms"] for r in sel if r["variant"] == "torch.compile")
            for name in ["torch.compile", *VARIANTS]:
                cand = [r for r in sel if r["variant"] == name]
                b = min(cand, key=lambda r: r["median_ms"])
                print(f"{D:>5} {od:>15} {name:>22} {b['block_rows']!s:>4} {b['num_warps']!s:>5} "
                      f"{b['median_ms']:8.4f} {b['gb_per_s']:7.0f} {ref_ms / b['median_ms']:9.3f}")


if __name__ == "__main__":
    main()
