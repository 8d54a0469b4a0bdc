"""Do masks, 64-bit offsets or the load path separate our level kernels from inductor's? (GPU run AI; a record of
what ran, not a test.)

Inductor compiles static shapes: where the row count and the row length are multiples of its block, its loads and
stores carry no mask, its offsets are int32 and the row length is a literal. kernels.rmsnorm and kernels.swiglu
mask every access and index in int64. Variants, each against torch.compile in 6 interleaved rounds (ratios paired
per round):

- the fp32 RMSNorm forward (fp32 in and out, rstd stored as for training) at hidden 2,048 and 4,096:
  kernels.rmsnorm's kernel as it is; the same with no masks, D a constexpr and int32 or int64 offsets, two passes
  or one; and with TMA (host-side tensor descriptors) for x and y;
- SwiGLU (bf16) at ffn 5,632, forward and backward: kernels.swiglu's kernels as they are; with no masks and int32
  offsets; with TMA over a (n / 1,024, 1,024) view.

Usage: python benchmarks/probes/mask_free_probe.py OUT_CSV
"""

from __future__ import annotations

import datetime as dt
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.bench import copy_ceiling_gb_per_s, do_bench  # noqa: E402
from kernels.rmsnorm import _rmsnorm_fwd_kernel  # noqa: E402
from kernels.swiglu import _swiglu_bwd_kernel, _swiglu_fwd_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402
from paired import paired_lines, write_csv  # noqa: E402

ROUNDS = 6


@triton.jit
def _rms_even(X, W, Y, RSTD, eps, D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
              I64: tl.constexpr):
    """No masks: M % BLOCK_ROWS == 0 and D % BLOCK_D == 0."""
    pid = tl.program_id(0)
    if I64:
        pid = pid.to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    if BLOCK_D < D:
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            x = tl.load(X + rows[:, None] * D + cols[None, :], eviction_policy="evict_last")
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd)
        for c0 in range(0, D, BLOCK_D):
            cols = c0 + tl.arange(0, BLOCK_D)
            x = tl.load(X + rows[:, None] * D + cols[None, :], eviction_policy="evict_first")
            w = tl.load(W + cols, eviction_policy="evict_last")
            tl.store(Y + rows[:, None] * D + cols[None, :], x * rstd[:, None] * w[None, :])
    else:
        cols = tl.arange(0, D)
        x = tl.load(X + rows[:, None] * D + cols[None, :])
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd)
        w = tl.load(W + cols)
        tl.store(Y + rows[:, None] * D + cols[None, :], x * rstd[:, None] * w[None, :])


@triton.jit
def _rms_tma(x_desc, W, y_desc, RSTD, eps, D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    r0 = tl.program_id(0) * BLOCK_ROWS
    acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, D, BLOCK_D):
        x = x_desc.load([r0, c0])
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
    tl.store(RSTD + r0 + tl.arange(0, BLOCK_ROWS), rstd)
    for c0 in range(0, D, BLOCK_D):
        x = x_desc.load([r0, c0])
        w = tl.load(W + c0 + tl.arange(0, BLOCK_D))
        y_desc.store([r0, c0], x * rstd[:, None] * w[None, :])


@triton.jit
def _swiglu_fwd_even(G, U, Y, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(G + offs).to(tl.float32)
    u = tl.load(U + offs).to(tl.float32)
    tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty))


@triton.jit
def _swiglu_bwd_even(DY, G, U, DG, DU, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dy = tl.load(DY + offs).to(tl.float32)
    g = tl.load(G + offs).to(tl.float32)
    u = tl.load(U + offs).to(tl.float32)
    sig = tl.sigmoid(g)
    tl.store(DG + offs, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DG.dtype.element_ty))
    tl.store(DU + offs, (dy * g * sig).to(DU.dtype.element_ty))


@triton.jit
def _swiglu_fwd_tma(g_desc, u_desc, y_desc, ROWS: tl.constexpr, COLS: tl.constexpr):
    r0 = tl.program_id(0) * ROWS
    g = g_desc.load([r0, 0]).to(tl.float32)
    u = u_desc.load([r0, 0]).to(tl.float32)
    y_desc.store([r0, 0], (g * tl.sigmoid(g) * u).to(tl.bfloat16))


def _rms_calls(D: int, dev) -> tuple[dict, torch.Tensor, torch.Tensor, callable, float]:
    from triton.tools.tensor_descriptor import TensorDescriptor

    x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
    M = x.numel() // D
    x2 = x.view(M, D)
    y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
    ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
    calls = {"torch.compile": lambda: ref(x, w)}
    chunk = 1024 if D == 2048 else 2048
    for br, nw in ((1, 8), (2, 16), (1, 16)):
        calls[f"kernels.rmsnorm c{chunk} r{br} w{nw}"] = (
            lambda br=br, nw=nw: _rmsnorm_fwd_kernel[(triton.cdiv(M, br),)](
                x2, x2, w, y, y, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=False, BLOCK_ROWS=br, BLOCK_D=chunk,
                TWO_PASS=True, num_warps=nw))
        for i64 in (False, True):
            calls[f"no mask c{chunk} r{br} w{nw} {'i64' if i64 else 'i32'}"] = (
                lambda br=br, nw=nw, i64=i64: _rms_even[(M // br,)](
                    x2, w, y, rstd, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=chunk, I64=i64, num_warps=nw, num_stages=1))
    for br, nw in ((1, 4), (1, 8), (2, 8), (4, 16)):
        calls[f"no mask one-pass r{br} w{nw} i32"] = (
            lambda br=br, nw=nw: _rms_even[(M // br,)](
                x2, w, y, rstd, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=D, I64=False, num_warps=nw))
    for br, bd, nw in ((1, 256, 4), (2, 256, 4), (4, 256, 8), (1, 1024, 8), (2, 1024, 16)):
        xd = TensorDescriptor.from_tensor(x2, [br, bd])
        yd = TensorDescriptor.from_tensor(y, [br, bd])
        calls[f"TMA c{bd} r{br} w{nw}"] = (
            lambda br=br, bd=bd, nw=nw, xd=xd, yd=yd: _rms_tma[(M // br,)](
                xd, w, yd, rstd, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=bd, num_warps=nw))
    want = ref(x, w).reshape(M, D)

    def check():
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)

    return calls, y, check, 2 * M * D * 4


def _swiglu_calls(F: int, dev, mode: str) -> tuple[dict, torch.Tensor, callable, float]:
    from triton.tools.tensor_descriptor import TensorDescriptor

    g = torch.randn(8, 2048, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
    u = torch.randn(8, 2048, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
    n = g.numel()
    gn, un = g.detach().view(-1), u.detach().view(-1)
    dy = torch.randn_like(gn)
    y, dg, du = torch.empty_like(gn), torch.empty_like(gn), torch.empty_like(gn)
    ref = torch.compile(lambda g, u: ops.swiglu_torch(g, u), dynamic=False)
    calls = {}
    if mode == "fwd":
        with torch.no_grad():
            want = ref(g, u).reshape(-1)
        calls["torch.compile"] = lambda: ref(g, u)
        for blk, nw in ((2048, 8), (1024, 4), (4096, 8)):
            calls[f"kernels.swiglu b{blk} w{nw}"] = (
                lambda blk=blk, nw=nw: _swiglu_fwd_kernel[(triton.cdiv(n, blk),)](gn, un, y, n, BLOCK=blk,
                                                                                    num_warps=nw))
            calls[f"no mask b{blk} w{nw} i32"] = (
                lambda blk=blk, nw=nw: _swiglu_fwd_even[(n // blk,)](gn, un, y, BLOCK=blk, num_warps=nw))
        for rows, cols, nw in ((2, 1024, 4), (4, 1024, 8), (8, 1024, 8)):
            descs = [TensorDescriptor.from_tensor(t.view(n // cols, cols), [rows, cols]) for t in (gn, un, y)]
            calls[f"TMA {rows}x{cols} w{nw}"] = (
                lambda rows=rows, cols=cols, nw=nw, descs=descs: _swiglu_fwd_tma[(n // cols // rows,)](
                    *descs, ROWS=rows, COLS=cols, num_warps=nw))
        outs = (y,)
    else:
        out = ref(g, u)
        gg, gu = torch.autograd.grad(out, (g, u), dy.view(g.shape), retain_graph=True)
        want = torch.cat([gg.reshape(-1), gu.reshape(-1)])
        calls["torch.compile"] = lambda: torch.autograd.grad(out, (g, u), dy.view(g.shape), retain_graph=True)
        for blk, nw in ((2048, 8), (1024, 4), (4096, 8)):
            calls[f"kernels.swiglu b{blk} w{nw}"] = (
                lambda blk=blk, nw=nw: _swiglu_bwd_kernel[(triton.cdiv(n, blk),)](dy, gn, un, dg, du, n, BLOCK=blk,
                                                                                    num_warps=nw))
            calls[f"no mask b{blk} w{nw} i32"] = (
                lambda blk=blk, nw=nw: _swiglu_bwd_even[(n // blk,)](dy, gn, un, dg, du, BLOCK=blk, num_warps=nw))
        outs = (dg, du)

    def check():
        got = outs[0] if mode == "fwd" else torch.cat([dg, du])
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)  # bf16 outputs: one rounding apart

    nbytes = (3 if mode == "fwd" else 5) * n * 2
    return calls, outs, check, nbytes


def main() -> None:
    out_csv = Path(sys.argv[1])
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows: list[dict] = []
    cases = [("rmsnorm fp32", "8x2048x2048", "fwd", lambda: _rms_calls(2048, dev)),
             ("rmsnorm fp32", "8x2048x4096", "fwd", lambda: _rms_calls(4096, dev)),
             ("swiglu bf16", "8x2048x5632", "fwd", lambda: _swiglu_calls(5632, dev, "fwd")),
             ("swiglu bf16", "8x2048x5632", "bwd", lambda: _swiglu_calls(5632, dev, "bwd"))]
    for kernel, shape, mode, make in cases:
        built = make()
        calls, outs, check, nbytes = built
        outs = outs if isinstance(outs, tuple) else (outs,)
        ok = {}
        for name, call in calls.items():
            for o in outs:
                o.fill_(float("nan"))
            try:
                call()
                torch.cuda.synchronize()
                if name != "torch.compile":
                    check()
                ok[name] = call
            except Exception as e:  # a variant that does not build or is wrong: recorded, not timed
                print(f"{kernel} {shape} {mode} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=2)
                rows.append({"kernel": kernel, "shape": shape, "mode": mode, "variant": name, "round": -1,
                             "median_ms": float("nan"), "p20_ms": float("nan"), "p80_ms": float("nan"),
                             "pct_of_copy_ceiling": float("nan"), "copy_ceiling_gb_per_s": ceiling,
                             "error": f"{type(e).__name__}: {str(e)[:200]}", "timestamp": stamp,
                             "gpu": torch.cuda.get_device_name(), **{k: ver[k] for k in ("torch", "triton", "cuda")}})
        for rnd in range(ROUNDS):
            for name in (list(ok) if rnd % 2 == 0 else list(reversed(ok))):
                ms = do_bench(ok[name], False)
                rows.append({"kernel": kernel, "shape": shape, "mode": mode, "variant": name, "round": rnd,
                             "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                             "pct_of_copy_ceiling": 100 * nbytes / (ms[0] * 1e-3) / 1e9 / ceiling,
                             "copy_ceiling_gb_per_s": ceiling, "error": "", "timestamp": stamp,
                             "gpu": torch.cuda.get_device_name(), **{k: ver[k] for k in ("torch", "triton", "cuda")}})
        del built, calls, ok, outs
        torch.cuda.empty_cache()
        write_csv(out_csv, rows)  # after every case: a timeout keeps what was measured
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for kernel, shape, mode, _ in cases:
        p = [r for r in rows if (r["kernel"], r["shape"], r["mode"]) == (kernel, shape, mode) and r["round"] >= 0]
        print(f"{kernel} {shape} {mode}")
        print("\n".join(paired_lines(p, 32)))


if __name__ == "__main__":
    main()
