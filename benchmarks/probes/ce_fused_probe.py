"""Probe (CUDA): where the fused linear cross-entropy's time goes, and the layout of its dW update.

The loss of kernels.bench: N = 8 x 2,047 positions, vocab 50,257 (padded to 50,304), fp32 h and W under bf16
autocast, hidden 2,048 (gr00t-n1.6) and 4,096.

Part 1, one chunk of C rows, each matmul and the softmax kernel alone (do_bench, L2 flushed):
  logits = h @ W^T, the softmax kernel, dh = dlogits @ W, and four ways of adding the chunk's dlogits^T @ h to dW:
  "odd"    one matmul over the V = 50,257 rows (the loss before 4ee57f4),
  "split"  an aligned block of 50,240 rows, then the 17 left (the loss since 4ee57f4; not timed before run AV),
  "padded" dW kept with Vp = 50,304 rows (the padding rows' gradient is 0), one aligned matmul,
  "dWT"    dW^T (D x Vp) += h^T @ dlogits;
  the softmax kernel at the registry's defaults (16 warps, block_v 4,096 in run AV) and
  at 4-32 warps and block_v 2,048-8,192.
Part 2, the whole loss, forward + backward (torch.autograd.grad), interleaved rounds paired with torch.compile of
the unfused torch loss: kernels.linear_cross_entropy_triton as it is, and with its chunk loop swapped for the
"odd", "padded" and "dWT" updates (the module function swapped; everything else as the model runs it).
With --warps (run AW), part 2 only: the loss at the registry's defaults (8 warps since run AV) against 16 warps
(the default before), 8 rounds.

    python benchmarks/probes/ce_fused_probe.py OUT.csv [--warps]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

import kernels
from benchmarks.probes.paired import ce_loss_case, context, write_csv
from kernels import fused_linear_ce as fl
from kernels.bench import do_bench
from kernels.registry import launch_params, using
from workbench import ops

dev = torch.device("cuda")
N, V = 8 * 2047, 50257
Vp = ops.padded_vocab(V)
Va = V // ops.VOCAB_ALIGN * ops.VOCAB_ALIGN
ROUNDS = 8 if "--warps" in sys.argv else 6


def chunk_loop(dw_mode: str):
    """kernels.fused_linear_ce._fused_linear_ce_fwd with its dW update replaced by ``dw_mode``."""

    def fwd(h, weight, labels, mask, compute_dtype, grad_h, grad_w):
        N_, D = h.shape
        p = launch_params("fused_linear_ce", {"rows": N_, "hidden": D, "vocab": V})
        C = p["chunk_size"]
        h_c = h.to(compute_dtype).contiguous()
        w_c = torch.empty((Vp, D), dtype=compute_dtype, device=h.device)
        w_c[:V].copy_(weight)
        w_c[V:].zero_()
        mask_u8 = mask.contiguous().to(torch.uint8)
        loss_N = torch.empty((N_,), dtype=torch.float32, device=h.device)
        dh = torch.empty((N_, D), dtype=h.dtype, device=h.device)
        rows = {"odd": V, "padded": Vp}.get(dw_mode)
        dw = torch.zeros((rows, D) if rows else (D, Vp), dtype=torch.float32, device=h.device)
        for start in range(0, N_, C):
            end = min(start + C, N_)
            logits = torch.mm(h_c[start:end], w_c.t())
            fl._ce_fwd_kernel[(end - start,)](
                logits, logits.stride(0), labels[start:end], mask_u8[start:end], loss_N[start:end],
                V, Vp, -100, WRITE_GRAD=True, BLOCK_V=p["block_v"], num_warps=p["num_warps"],
                num_stages=p["num_stages"])
            fl._mm_into(dh[start:end], logits, w_c, accumulate=False)
            if dw_mode == "odd":
                fl._mm_into(dw, logits[:, :V].t(), h_c[start:end], accumulate=True)
            elif dw_mode == "padded":
                fl._mm_into(dw, logits.t(), h_c[start:end], accumulate=True)
            else:  # dWT
                fl._mm_into(dw, h_c[start:end].t(), logits, accumulate=True)
        if dw_mode == "padded":
            dw = dw[:V]
        elif dw_mode == "dWT":
            dw = dw[:, :V].t().contiguous()
        return loss_N.sum(), dh, dw

    return fwd


def part1(D: int, C: int, base: dict) -> list[dict]:
    torch.manual_seed(0)
    a = torch.randn(C, D, device=dev, dtype=torch.bfloat16)
    w = torch.randn(Vp, D, device=dev, dtype=torch.bfloat16) * 0.02
    w[V:].zero_()
    labels = torch.randint(0, V, (C,), device=dev)
    mask = torch.ones(C, dtype=torch.uint8, device=dev)
    loss = torch.empty(C, device=dev)
    logits = torch.mm(a, w.t())
    dh = torch.empty(C, D, device=dev)
    dw_v = torch.zeros(V, D, device=dev)
    dw_p = torch.zeros(Vp, D, device=dev)
    dw_t = torch.zeros(D, Vp, device=dev)
    p = launch_params("fused_linear_ce", {"rows": N, "hidden": D, "vocab": V})

    def ce(nw=p["num_warps"], bv=p["block_v"]):  # the softmax kernel, at the defaults unless told
        fl._ce_fwd_kernel[(C,)](logits, logits.stride(0), labels, mask, loss, V, Vp, -100, WRITE_GRAD=True,
                                BLOCK_V=bv, num_warps=nw, num_stages=p["num_stages"])

    def split():
        g = logits[:, :V].t()
        fl._mm_into(dw_v[:Va], g[:Va], a, accumulate=True)
        fl._mm_into(dw_v[Va:], g[Va:], a, accumulate=True)

    ops_ = {
        "logits = h @ W^T": (lambda: torch.mm(a, w.t(), out=logits), 2 * C * D * Vp),
        "softmax kernel": (ce, float("nan")),
        "dh = dlogits @ W (fp32 out)": (lambda: fl._mm_into(dh, logits, w, accumulate=False), 2 * C * D * Vp),
        "dW odd": (lambda: fl._mm_into(dw_v, logits[:, :V].t(), a, accumulate=True), 2 * C * D * V),
        "dW split": (split, 2 * C * D * V),
        "dW padded": (lambda: fl._mm_into(dw_p, logits.t(), a, accumulate=True), 2 * C * D * Vp),
        "dWT": (lambda: fl._mm_into(dw_t, a.t(), logits, accumulate=True), 2 * C * D * Vp),
    }
    for nw in (4, 8, 16, 32):  # the softmax kernel's launch (the default is the row above)
        for bv in (2048, 4096, 8192):
            ops_[f"softmax kernel, {nw} warps, block_v {bv}"] = (lambda nw=nw, bv=bv: ce(nw, bv), float("nan"))
    rows = []
    # the softmax kernel's bytes: the logits read twice and written once (bf16)
    ce_bytes = 3 * C * Vp * 2
    for name, (fn, flop) in ops_.items():
        ms = do_bench(fn, False)
        rows.append({"part": "one chunk", "hidden": D, "launch": f"chunk_size={C}", "variant": name, "round": 0,
                     "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                     "tflop_per_s": flop / (ms[0] * 1e-3) / 1e12,
                     "gb_per_s": ce_bytes / (ms[0] * 1e-3) / 1e9 if name.startswith("softmax") else float("nan"),
                     "max_rel_grad_diff_vs_ref": float("nan"), **base})
    return rows


def part2(D: int, base: dict, warps: bool) -> list[dict]:
    full_of = ce_loss_case(D, dev)

    ref = torch.compile(ops.linear_cross_entropy_torch, dynamic=False)
    real = fl._fused_linear_ce_fwd
    fused = full_of(kernels.linear_cross_entropy_triton)
    variants = {"torch.compile (unfused)": (None, None, full_of(ref))}  # name -> (launch, dW update, call)
    if warps:
        variants["fused at the defaults"] = ({}, None, fused)
        variants["fused, 16 warps"] = ({"num_warps": 16}, None, fused)
    else:
        for C in (4096, 8192):
            variants[f"fused as is, chunk {C}"] = ({"chunk_size": C}, None, fused)
            for mode in ("odd", "padded", "dWT"):
                variants[f"fused dW {mode}, chunk {C}"] = ({"chunk_size": C}, mode, fused)

    def call(name):
        launch, mode, fn = variants[name]
        if launch is None:
            return fn
        def run():
            with using({"fused_linear_ce": launch}):
                fl._fused_linear_ce_fwd = chunk_loop(mode) if mode else real
                try:
                    return fn()
                finally:
                    fl._fused_linear_ce_fwd = real
        return run

    # the gradients of every variant against the reference's (once, before timing)
    g_ref = call("torch.compile (unfused)")()
    checks = {}
    for name in variants:
        g = call(name)()
        checks[name] = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(g, g_ref))
    rows = []
    names = list(variants)
    for rnd in range(ROUNDS):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            ms = do_bench(call(name), False)
            rows.append({"part": "whole loss, fwd+bwd", "hidden": D,
                         "launch": " ".join(f"{k}={v}" for k, v in (variants[name][0] or {}).items()),
                         "variant": name, "round": rnd, "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                         "tflop_per_s": 6 * N * D * V / (ms[0] * 1e-3) / 1e12, "gb_per_s": float("nan"),
                         "max_rel_grad_diff_vs_ref": checks[name], **base})
    return rows


def main() -> None:
    out_csv = Path(sys.argv[1])
    ceiling, base = context(dev)
    base = {"copy_ceiling_gb_per_s": ceiling, **base}
    rows: list[dict] = []
    tables = []
    warps = "--warps" in sys.argv
    for D in (() if warps else (2048, 4096)):
        for C in (4096, 8192):
            r = part1(D, C, base)
            rows += r
            write_csv(out_csv, rows)
            tables.append(f"one chunk, hidden {D}, {C} rows:")
            tables += [f"  {x['variant']:>38} {x['median_ms']:7.3f} ms {x['tflop_per_s']:6.0f} TFLOP/s"
                       + (f" {x['gb_per_s']:6.0f} GB/s (3 passes)" if x["variant"].startswith("softmax") else "")
                       for x in r]
            torch.cuda.empty_cache()
    for D in (2048, 4096):
        r = part2(D, base, warps)
        rows += r
        write_csv(out_csv, rows)
        comp = {x["round"]: x["median_ms"] for x in r if x["variant"].startswith("torch.compile")}
        tables.append(f"whole loss fwd+bwd, hidden {D} (time over torch.compile's, per round; <1 is faster):")
        for name in dict.fromkeys(x["variant"] for x in r):
            v = [x for x in r if x["variant"] == name]
            ratio = [x["median_ms"] / comp[x["round"]] for x in v]
            tables.append(f"  {name:>30} {statistics.median(x['median_ms'] for x in v):7.3f} ms "
                          f"{statistics.median(ratio):6.3f}x ({min(ratio):.3f}-{max(ratio):.3f}) "
                          f"grad rel diff {v[0]['max_rel_grad_diff_vs_ref']:.1e}")
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    print("\n".join(tables))


if __name__ == "__main__":
    main()
