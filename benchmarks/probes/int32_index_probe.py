"""Do 64-bit offsets cost the last 1-2% against torch.compile? (GPU run AD; a record of what ran, not a test.)

kernels.rmsnorm and kernels.swiglu compute every address in int64 (``program_id(0).to(tl.int64)``), which is
safe for any size; inductor indexes in int32 whenever the tensors have fewer than 2**31 elements. The variants
here are the kernels' own code (fp32 RMSNorm forward, one pass and two passes; SwiGLU forward and backward in
bf16) with the offsets in int64 or int32, timed against torch.compile of the reference in interleaved rounds
(kernels.bench.do_bench, L2 flushed; each round's ratio paired). A torch.profiler trace gives each kernel's
grid, block and registers per thread.

Usage: python benchmarks/probes/int32_index_probe.py rmsnorm|swiglu OUT_CSV [ROUNDS]
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import tempfile
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
def _rms_fwd(X, W, Y, RSTD, M, D, eps, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TWO_PASS: tl.constexpr,
             I64: tl.constexpr):
    if I64:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    else:
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
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
            y = x * rstd[:, None] * w[None, :]
            tl.store(Y + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        cols = tl.arange(0, BLOCK_D)
        col_ok = cols < D
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_fwd(G, U, Y, n, BLOCK: tl.constexpr, I64: tl.constexpr):
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _swiglu_bwd(DY, G, U, DG, DU, n, BLOCK: tl.constexpr, I64: tl.constexpr):
    if I64:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    tl.store(DG + offs, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DG.dtype.element_ty), mask=ok)
    tl.store(DU + offs, (dy * g * sig).to(DU.dtype.element_ty), mask=ok)


def rms_cases(dev):
    """(shape label, mode, bytes, {variant: call}) for the fp32 forward at hidden 2,048 and 4,096."""
    for D in (2048, 4096):
        x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
        M = x.numel() // D
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
        y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
        calls = {"torch.compile": lambda x=x, w=w, ref=ref: ref(x, w)}
        for br, chunk, nw, ns in ((2, None, 8, 2), (1, None, 4, 2), (1, 1024, 8, 2), (2, 1024, 16, 3)):
            for i64 in (True, False):
                def call(br=br, chunk=chunk, nw=nw, ns=ns, i64=i64, x=x, w=w, y=y, rstd=rstd, M=M, D=D):
                    _rms_fwd[(triton.cdiv(M, br),)](x, w, y, rstd, M, D, 1e-5, BLOCK_ROWS=br, BLOCK_D=chunk or D,
                                                    TWO_PASS=chunk is not None, I64=i64, num_warps=nw,
                                                    num_stages=ns)
                call()
                torch.testing.assert_close(y, ref(x, w).reshape(M, D), rtol=1e-5, atol=1e-5)
                name = f"{'two-pass c' + str(chunk) if chunk else 'one-pass'} r{br} w{nw} {'i64' if i64 else 'i32'}"
                calls[name] = call
        yield f"8x2048x{D}", "fwd", 2 * M * D * 4, calls


def swiglu_cases(dev):
    for F in (5632, 11008):
        n = 8 * 2048 * F
        g, u, dy = (torch.randn(8, 2048, F, device=dev, dtype=torch.bfloat16) for _ in range(3))
        ref = torch.compile(ops.swiglu_torch, dynamic=False)
        gg, ug = g.detach().requires_grad_(), u.detach().requires_grad_()
        out = ref(gg, ug)
        y, dg, du = (torch.empty_like(g) for _ in range(3))
        fwd = {"torch.compile": lambda g=g, u=u, ref=ref: ref(g, u)}
        bwd = {"torch.compile": lambda out=out, gg=gg, ug=ug, dy=dy:
               torch.autograd.grad(out, (gg, ug), dy, retain_graph=True)}
        for block, nw in ((2048, 8), (4096, 8), (1024, 4)):
            for i64 in (True, False):
                tag = f"b{block} w{nw} {'i64' if i64 else 'i32'}"
                grid = (triton.cdiv(n, block),)
                fwd[tag] = lambda grid=grid, block=block, nw=nw, i64=i64, g=g, u=u, y=y, n=n: _swiglu_fwd[grid](
                    g, u, y, n, BLOCK=block, I64=i64, num_warps=nw)
                bwd[tag] = lambda grid=grid, block=block, nw=nw, i64=i64, g=g, u=u, dy=dy, dg=dg, du=du, n=n: \
                    _swiglu_bwd[grid](dy, g, u, dg, du, n, BLOCK=block, I64=i64, num_warps=nw)
                fwd[tag]()
                bwd[tag]()
                with torch.no_grad():
                    torch.testing.assert_close(y, ref(g, u), rtol=2e-2, atol=2e-2)
                rg, ru = torch.autograd.grad(out, (gg, ug), dy, retain_graph=True)
                torch.testing.assert_close(dg, rg, rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(du, ru, rtol=2e-2, atol=2e-2)
        yield f"8x2048x{F}", "fwd", 3 * n * 2, fwd
        yield f"8x2048x{F}", "bwd", 5 * n * 2, bwd


def launch_configs(calls) -> dict[str, str]:
    """Each variant's kernels as the profiler saw them: name, grid, block, registers per thread."""
    out = {}
    for name, call in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.load(open(f.name))["traceEvents"]
        ks = [e for e in events if e.get("cat") == "kernel"]
        out[name] = "; ".join(f"{e['name'][:40]} grid={e['args'].get('grid')} block={e['args'].get('block')} "
                              f"regs={e['args'].get('registers per thread')}" for e in ks)
    return out


def main() -> None:
    kernel, out_csv = sys.argv[1], Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows = []
    for shape, mode, nbytes, calls in (rms_cases if kernel == "rmsnorm" else swiglu_cases)(dev):
        launches = launch_configs(calls)
        for r in range(rounds):
            for name in (list(calls) if r % 2 == 0 else list(reversed(calls))):
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    med, p20, p80 = do_bench(calls[name], False)
                rows.append({"kernel": kernel, "shape": shape, "mode": mode, "variant": name, "round": r,
                             "median_ms": med, "p20_ms": p20, "p80_ms": p80,
                             "pct_of_copy_ceiling": 100 * nbytes / (med * 1e-3) / 1e9 / ceiling,
                             "copy_ceiling_gb_per_s": ceiling, "launch": launches[name], "timestamp": stamp,
                             "gpu": torch.cuda.get_device_name(), **{k: ver[k] for k in ("torch", "triton", "cuda")}})
        torch.cuda.empty_cache()
    write_csv(out_csv, rows)
    print(f"copy ceiling {ceiling:.0f} GB/s; {rounds} interleaved rounds; x compile = median over rounds of "
          "(compile ms / variant ms) in the same round")
    for shape, mode in dict.fromkeys((r["shape"], r["mode"]) for r in rows):
        sel = [r for r in rows if r["shape"] == shape and r["mode"] == mode]
        comp = {r["round"]: r["median_ms"] for r in sel if r["variant"] == "torch.compile"}
        print(f"{shape} {mode}: torch.compile kernels: {sel[0]['launch'] if sel[0]['variant'] == 'torch.compile' else ''}")
        for name in dict.fromkeys(r["variant"] for r in sel):
            v = [r for r in sel if r["variant"] == name]
            ratios = [comp[r["round"]] / r["median_ms"] for r in v]
            print(f"  {name:>28} {statistics.median(r['median_ms'] for r in v):8.4f} ms "
                  f"{statistics.median(r['pct_of_copy_ceiling'] for r in v):6.1f}% {statistics.median(ratios):7.3f}x "
                  f"({min(ratios):.3f}-{max(ratios):.3f}) {sum(x > 1 for x in ratios)}/{len(ratios)}  "
                  f"{v[0]['launch'].split(' grid=')[-1][:60]}")


if __name__ == "__main__":
    main()
