"""How fast can anything move the bytes of the two level ops? (GPU run AL; a record of what ran, not a test.)

The RMSNorm forward in fp32 at hidden 2,048 and SwiGLU are level with torch.compile (runs AD, AI, AJ), both at
about 100% of ``dst.copy_(src)`` of the same bytes. That copy is one kernel, not the floor: this probe times, in
the same interleaved rounds as torch.compile of the reference and our kernels, kernels that move exactly the op's
bytes (same dtypes, same reads and writes) and do no arithmetic worth the name:

- ATen's ``copy_`` (RMSNorm) or ``add(out=)`` (SwiGLU forward);
- inductor's compile of a pointwise op with the same inputs and outputs (``x * 2``, ``g + u``, ``(dy + g, dy + u)``);
- a Triton kernel with no masks over a sweep of block size and warps, one program per block, and grid-stride
  (persistent) with 4 or 8 programs per SM.

If the fastest of these is no faster than torch.compile of the reference, no kernel for the op can be faster beyond
noise: the goal "faster than torch.compile" is out of reach for it on this GPU. If one is, the gap is headroom and
the variant says which launch shape reaches it.

Usage: python benchmarks/probes/ceiling_probe.py OUT_CSV [INDUCTOR_CODE_TXT]
"""

from __future__ import annotations

import statistics
import sys
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.rmsnorm import _rmsnorm_fwd_kernel  # noqa: E402
from kernels.swiglu import _swiglu_bwd_kernel, _swiglu_fwd_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import context, paired_lines, timed_rounds, write_csv  # noqa: E402

ROUNDS = 6


@triton.jit
def _traffic_block(A, B, C, Y, Z, offs, NIN: tl.constexpr, NOUT: tl.constexpr):
    """Reads NIN inputs and writes NOUT outputs at ``offs``, no masks."""
    v = tl.load(A + offs).to(tl.float32)
    if NIN >= 2:
        v += tl.load(B + offs).to(tl.float32)
    if NIN >= 3:
        v += tl.load(C + offs).to(tl.float32)
    tl.store(Y + offs, v.to(Y.dtype.element_ty))
    if NOUT == 2:
        tl.store(Z + offs, v.to(Z.dtype.element_ty))


@triton.jit
def _traffic(A, B, C, Y, Z, NIN: tl.constexpr, NOUT: tl.constexpr, BLOCK: tl.constexpr):
    """Reads NIN inputs, writes NOUT outputs, BLOCK elements per program, no masks (n % BLOCK == 0)."""
    _traffic_block(A, B, C, Y, Z, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), NIN, NOUT)


@triton.jit
def _traffic_persistent(A, B, C, Y, Z, n_blocks, NIN: tl.constexpr, NOUT: tl.constexpr, BLOCK: tl.constexpr):
    """The same, grid-stride: each program walks blocks pid, pid + grid, ..."""
    for blk in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        _traffic_block(A, B, C, Y, Z, blk * BLOCK + tl.arange(0, BLOCK), NIN, NOUT)


def _floors(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> dict:
    """The no-arithmetic movers of len(ins) reads and len(outs) writes of the same flat size and dtype."""
    n = ins[0].numel()
    a, b, c = (ins + [ins[0]] * 2)[:3]
    y, z = (outs + [outs[0]])[:2]
    nin, nout = len(ins), len(outs)
    calls = {}
    if nin == 1 and nout == 1:
        calls["floor: ATen copy_"] = lambda: y.copy_(a)
        comp = torch.compile(lambda a: a * 2, dynamic=False)
    elif nin == 2 and nout == 1:
        calls["floor: ATen add(out=)"] = lambda: torch.add(a, b, out=y)
        comp = torch.compile(lambda a, b: a + b, dynamic=False)
    else:
        comp = torch.compile(lambda a, b, c: (a + b, a + c), dynamic=False)
    calls["floor: inductor pointwise"] = lambda: comp(*ins)
    assert n % 8192 == 0, n  # the Triton movers have no masks
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for blk in (1024, 2048, 4096, 8192):
        for nw in (4, 8, 16):
            if blk // (32 * nw) < 4:  # fewer than 4 elements a thread: not a vector access
                continue
            calls[f"floor: triton b{blk} w{nw}"] = (
                lambda blk=blk, nw=nw: _traffic[(n // blk,)](a, b, c, y, z, NIN=nin, NOUT=nout, BLOCK=blk,
                                                            num_warps=nw))
    for blk, nw in ((2048, 8), (4096, 8), (8192, 16)):
        for per_sm in (4, 8):
            calls[f"floor: triton persistent b{blk} w{nw} {per_sm}/SM"] = (
                lambda blk=blk, nw=nw, per_sm=per_sm: _traffic_persistent[(sms * per_sm,)](
                    a, b, c, y, z, n // blk, NIN=nin, NOUT=nout, BLOCK=blk, num_warps=nw))
    return calls


def _rms_case(D: int, dev) -> tuple[dict, list, callable, float]:
    x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
    M = x.numel() // D
    x2 = x.view(M, D)
    y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
    ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
    calls = {"torch.compile": lambda: ref(x, w)}
    for br, chunk, nw in ((2, 1024, 16), (1, 1024, 8), (1, D, 8), (2, D, 8), (2, D, 16)):
        calls[f"kernels.rmsnorm r{br} c{chunk} w{nw}"] = (
            lambda br=br, chunk=chunk, nw=nw: _rmsnorm_fwd_kernel[(M // br,)](
                x2, x2, w, y, y, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=False, BLOCK_ROWS=br, BLOCK_D=chunk,
                TWO_PASS=chunk < D, EVEN=True, num_warps=nw))
    ours = list(calls)[1:]
    fy = torch.empty_like(x2)
    calls.update(_floors([x2.view(-1)], [fy.view(-1)]))
    want = ref(x, w).reshape(M, D)

    def check(name):
        if name in ours:
            torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)

    return calls, [y, fy], check, 2 * M * D * 4


def _swiglu_case(F: int, dev, mode: str) -> tuple[dict, list, callable, float]:
    g = torch.randn(8, 2048, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
    u = torch.randn(8, 2048, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
    n = g.numel()
    gn, un = g.detach().view(-1), u.detach().view(-1)
    dy = torch.randn_like(gn)
    y, dg, du = torch.empty_like(gn), torch.empty_like(gn), torch.empty_like(gn)
    f1, f2 = torch.empty_like(gn), torch.empty_like(gn)
    ref = torch.compile(lambda g, u: ops.swiglu_torch(g, u), dynamic=False)
    calls = {}
    if mode == "fwd":
        with torch.no_grad():
            want = ref(g, u).reshape(-1)
        calls["torch.compile"] = lambda: ref(g, u)
        for blk, nw in ((2048, 8), (1024, 4), (4096, 8)):
            calls[f"kernels.swiglu b{blk} w{nw}"] = (
                lambda blk=blk, nw=nw: _swiglu_fwd_kernel[(n // blk,)](gn, un, y, n, BLOCK=blk, num_warps=nw))
        ours = list(calls)[1:]
        calls.update(_floors([gn, un], [f1]))
        outs = [y, f1]
    else:
        out = ref(g, u)
        gg, gu = torch.autograd.grad(out, (g, u), dy.view(g.shape), retain_graph=True)
        want = torch.cat([gg.reshape(-1), gu.reshape(-1)])
        calls["torch.compile"] = lambda: torch.autograd.grad(out, (g, u), dy.view(g.shape), retain_graph=True)
        for blk, nw in ((2048, 8), (1024, 4), (4096, 8)):
            calls[f"kernels.swiglu b{blk} w{nw}"] = (
                lambda blk=blk, nw=nw: _swiglu_bwd_kernel[(n // blk,)](dy, gn, un, dg, du, n, BLOCK=blk,
                                                                         num_warps=nw))
        ours = list(calls)[1:]
        calls.update(_floors([dy, gn, un], [f1, f2]))
        outs = [dg, du, f1, f2]

    def check(name):
        if name in ours:
            got = y if mode == "fwd" else torch.cat([dg, du])
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)  # bf16 outputs: one rounding apart

    return calls, outs, check, (3 if mode == "fwd" else 5) * n * 2


def _inductor_code(path: Path, dev) -> None:
    """The kernels inductor generates for the two references, with the launch heuristics it chose from."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    x, w = torch.randn(8, 2048, 2048, device=dev), torch.randn(2048, device=dev)
    _, code = run_and_get_code(torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False), x, w)
    g = torch.randn(8, 2048, 5632, device=dev, dtype=torch.bfloat16)
    _, code2 = run_and_get_code(torch.compile(lambda g, u: ops.swiglu_torch(g, u), dynamic=False), g, g)
    path.write_text("\n\n# ======== swiglu\n\n".join(["# ======== rmsnorm fp32 2048\n\n" + code[0], code2[0]]))


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rows: list[dict] = []
    cases = [("rmsnorm fp32", "8x2048x2048", "fwd", lambda: _rms_case(2048, dev)),
             ("swiglu bf16", "8x2048x5632", "fwd", lambda: _swiglu_case(5632, dev, "fwd")),
             ("swiglu bf16", "8x2048x5632", "bwd", lambda: _swiglu_case(5632, dev, "bwd")),
             ("rmsnorm fp32", "8x2048x4096", "fwd", lambda: _rms_case(4096, dev))]
    for kernel, shape, mode, make in cases:
        calls, outs, check, nbytes = make()
        ok = {}
        for name, call in calls.items():
            for o in outs:
                o.fill_(float("nan"))
            try:
                call()
                torch.cuda.synchronize()
                check(name)
                ok[name] = call
            except Exception as e:  # a variant that does not build or is wrong: recorded, not timed
                print(f"{kernel} {shape} {mode} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=2)
                rows.append({"kernel": kernel, "shape": shape, "mode": mode, "variant": name, "round": -1,
                             "median_ms": float("nan"), "p20_ms": float("nan"), "p80_ms": float("nan"),
                             "pct_of_copy_ceiling": float("nan"), "copy_ceiling_gb_per_s": ceiling,
                             "bytes": nbytes, "error": f"{type(e).__name__}: {str(e)[:200]}", **base})
        rows += timed_rounds(ok, ROUNDS, {"kernel": kernel, "shape": shape, "mode": mode}, nbytes, ceiling, base,
                             {"bytes": nbytes, "error": ""})
        del calls, ok, outs
        torch.cuda.empty_cache()
        write_csv(out_csv, rows)  # after every case: a timeout keeps what was measured
    if len(sys.argv) > 2:
        try:
            _inductor_code(Path(sys.argv[2]), dev)
        except Exception as e:  # a record only: its failure must not lose the table
            print(f"inductor code not saved: {type(e).__name__}: {e}")
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for kernel, shape, mode, _ in cases:
        p = [r for r in rows if (r["kernel"], r["shape"], r["mode"]) == (kernel, shape, mode) and r["round"] >= 0]
        print(f"{kernel} {shape} {mode}")
        print("\n".join(paired_lines(p, 40)))
        comp = {r["round"]: r["median_ms"] for r in p if r["variant"] == "torch.compile"}
        floors = {r["variant"] for r in p if r["variant"].startswith("floor")}
        if floors:  # the floor fastest by its median over rounds, then paired per round (no per-round minimum:
            # the least of 20 noisy times each round would be biased low)
            med = {v: statistics.median(r["median_ms"] for r in p if r["variant"] == v) for v in floors}
            best = min(med, key=med.get)
            ratios = [comp[r["round"]] / r["median_ms"] for r in p if r["variant"] == best]
            print(f"  torch.compile against the fastest floor ({best}): {statistics.median(ratios):.4f}x "
                  f"({min(ratios):.4f}-{max(ratios):.4f}); headroom {100 * (1 - 1 / statistics.median(ratios)):+.2f}%"
                  f" of torch.compile's time")


if __name__ == "__main__":
    main()
