"""Probe (CUDA): can the fused loss's softmax kernel read the logits from DRAM once instead of twice? (run AZ)

The softmax kernel (kernels.fused_linear_ce._ce_fwd_kernel) runs one program per row of a chunk's logits (4,096 x
50,304 bf16 at the defaults, 412 MB): pass 1 reads the row (online max and sum of exponentials), pass 2 reads it
again and writes the gradient over it. At 0.359 ms (run AV) that is 81% of the copy ceiling if both reads go to
DRAM, 57% if the second one hits the L2. A row is 100 KB; with every SM holding several programs, tens of MB of rows
are in flight, about the L2's size (50 MB), so most second reads miss. Variants, each checked against the kernel as
it is (loss and gradient) before timing:

- "as is": the module's kernel at the registry's defaults (one program per row);
- "rows/program": the same two passes, with a grid of G = SMs x k programs, each walking rows pid, pid + G, ...
  (fewer rows in flight, so the second read of a row is more likely an L2 hit), over k, warps and block_v;
- "+ evict": the same with cache hints: pass 1's loads evict_last, pass 2's loads and stores evict_first;
- "one pass": the whole row (65,536 columns, masked) loaded once into registers: max, sum, gradient from the
  registers (16 or 32 warps; spills if the compiler cannot hold it).

Part 2: the whole loss, forward + backward, paired rounds against torch.compile of the unfused torch loss, as it is
and with the fastest variant of part 1 swapped in (kernels.fused_linear_ce._softmax_grad replaced).

    python benchmarks/probes/ce_softmax_probe.py OUT.csv
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import kernels
from benchmarks.probes.paired import ce_loss_case, context, write_csv
from kernels import fused_linear_ce as fl
from kernels.bench import do_bench
from kernels.registry import launch_params
from workbench import ops

N, V = 8 * 2047, 50257
Vp = ops.padded_vocab(V)
C = 4096
ROUNDS_1, ROUNDS_2 = 3, 8


@triton.jit
def _ce_rows_kernel(
    LOGITS, stride_l, LABELS, MASK, LOSS, V, VP, n_rows, ignore_index,
    BLOCK_V: tl.constexpr, EVICT: tl.constexpr,
):
    """The module's kernel (WRITE_GRAD) with a grid-stride loop over rows and, if EVICT, cache hints."""
    pid, grid = tl.program_id(0).to(tl.int64), tl.num_programs(0)
    for i in range(0, tl.cdiv(n_rows - pid, grid)):
        row = pid + i * grid
        base = LOGITS + row * stride_l
        label = tl.load(LABELS + row).to(tl.int64)
        counts = (tl.load(MASK + row) != 0) & (label != ignore_index)
        in_vocab = (label >= 0) & (label < V)
        m = float("-inf")
        acc = 0.0
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            if EVICT:
                x = tl.load(base + cols, mask=cols < V, other=float("-inf"), eviction_policy="evict_last")
            else:
                x = tl.load(base + cols, mask=cols < V, other=float("-inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            acc = acc * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(acc)
        x_label = tl.load(base + label, mask=counts & in_vocab, other=0.0).to(tl.float32)
        tl.store(LOSS + row, tl.where(counts, lse - x_label, 0.0))
        for v0 in range(0, VP, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            real = cols < V
            if EVICT:
                x = tl.load(base + cols, mask=real, other=0.0, eviction_policy="evict_first")
            else:
                x = tl.load(base + cols, mask=real, other=0.0)
            g = tl.exp(x.to(tl.float32) - lse) - tl.where(cols == label, 1.0, 0.0)
            g = tl.where(counts & real, g, 0.0).to(LOGITS.dtype.element_ty)
            if EVICT:
                tl.store(base + cols, g, mask=cols < VP, eviction_policy="evict_first")
            else:
                tl.store(base + cols, g, mask=cols < VP)


@triton.jit
def _ce_one_pass_kernel(LOGITS, stride_l, LABELS, MASK, LOSS, V, VP, n_rows, ignore_index, BLOCK: tl.constexpr):
    """The whole row in registers: one read, one write."""
    pid, grid = tl.program_id(0).to(tl.int64), tl.num_programs(0)
    for i in range(0, tl.cdiv(n_rows - pid, grid)):
        row = pid + i * grid
        base = LOGITS + row * stride_l
        label = tl.load(LABELS + row).to(tl.int64)
        counts = (tl.load(MASK + row) != 0) & (label != ignore_index)
        cols = tl.arange(0, BLOCK)
        real = cols < V
        x = tl.load(base + cols, mask=real, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        s = tl.sum(e, axis=0)
        lse = m + tl.log(s)
        x_label = tl.sum(tl.where(cols == label, x, 0.0), axis=0)
        tl.store(LOSS + row, tl.where(counts, lse - x_label, 0.0))
        g = e / s - tl.where(cols == label, 1.0, 0.0)
        g = tl.where(counts & real, g, 0.0)
        tl.store(base + cols, g.to(LOGITS.dtype.element_ty), mask=cols < VP)


def variants(sms: int) -> dict:
    """name -> softmax_grad(logits, labels, mask_u8, loss, V, write_grad, p), as kernels.fused_linear_ce's."""
    out = {"as is": fl._softmax_grad}

    def rows(k, nw, bv, evict):
        def run(logits, labels, mask_u8, loss, V_, write_grad, p):
            assert write_grad
            n = logits.shape[0]
            _ce_rows_kernel[(min(n, sms * k),)](logits, logits.stride(0), labels, mask_u8, loss, V_,
                                                logits.shape[1], n, -100, BLOCK_V=bv, EVICT=evict, num_warps=nw,
                                                num_stages=2)
        return run

    def one_pass(k, nw):
        def run(logits, labels, mask_u8, loss, V_, write_grad, p):
            assert write_grad
            n = logits.shape[0]
            _ce_one_pass_kernel[(min(n, sms * k),)](logits, logits.stride(0), labels, mask_u8, loss, V_,
                                                    logits.shape[1], n, -100, BLOCK=triton.next_power_of_2(V_),
                                                    num_warps=nw, num_stages=1)
        return run

    out["one program per row, + evict"] = rows(1 << 30, 8, 4096, True)
    for k in (1, 2, 4):
        for nw in (8, 16, 32):
            for bv in (4096, 8192):
                if k * nw > 64:  # more warps than an SM holds
                    continue
                for evict in (False, True):
                    out[f"rows/program, {k}/SM, {nw} warps, block_v {bv}" + (", + evict" if evict else "")] = \
                        rows(k, nw, bv, evict)
    for k, nw in ((1, 32), (2, 16), (1, 16)):
        out[f"one pass, {k}/SM, {nw} warps"] = one_pass(k, nw)
    return out


def part1(dev, base: dict) -> tuple[list[dict], dict]:
    torch.manual_seed(0)
    D = 2048
    a = torch.randn(C, D, device=dev, dtype=torch.bfloat16)
    w = torch.randn(Vp, D, device=dev, dtype=torch.bfloat16) * 0.02
    w[V:].zero_()
    labels = torch.randint(0, V, (C,), device=dev)
    labels[::97] = -100  # some rows do not count
    mask = (torch.rand(C, device=dev) < 0.95).to(torch.uint8)
    logits0 = torch.mm(a, w.t())
    p = launch_params("fused_linear_ce", {"rows": N, "hidden": D, "vocab": V})
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    calls = variants(sms)
    # each variant against the kernel as it is, on fresh copies of the logits
    ref_l, ref_loss = logits0.clone(), torch.empty(C, device=dev)
    fl._softmax_grad(ref_l, labels, mask, ref_loss, V, True, p)
    checks, failed = {}, []
    for name, fn in calls.items():
        lg, loss = logits0.clone(), torch.full((C,), float("nan"), device=dev)
        try:
            fn(lg, labels, mask, loss, V, True, p)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            failed.append(name)
            continue
        d_loss = float((loss - ref_loss).abs().max() / ref_loss.abs().max())
        d_grad = float((lg.float() - ref_l.float()).abs().max())
        checks[name] = (d_loss, d_grad)
        if not (d_loss < 1e-5 and d_grad <= 2 ** -8):
            print(f"{name}: differs from the kernel as is: loss {d_loss:.1e}, grad {d_grad:.1e}")
            failed.append(name)
    for name in failed:
        calls.pop(name)
    logits = logits0.clone()
    loss = torch.empty(C, device=dev)
    nbytes = 2 * C * Vp * 2  # the logits read once and written once: the least any variant moves
    rows = []
    names = list(calls)
    for rnd in range(ROUNDS_1):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            ms = do_bench(lambda fn=calls[name]: fn(logits, labels, mask, loss, V, True, p), False)
            rows.append({"part": "softmax kernel, one chunk", "hidden": D, "rows": C, "variant": name, "round": rnd,
                         "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                         "gb_per_s_read_write_once": nbytes / (ms[0] * 1e-3) / 1e9,
                         "max_rel_loss_diff_vs_as_is": checks[name][0], "max_abs_grad_diff_vs_as_is": checks[name][1],
                         "max_rel_grad_diff_vs_compile": float("nan"), **base})
    return rows, calls


def part2(dev, base: dict, best: str, fn) -> list[dict]:
    full_of = ce_loss_case(2048, dev)

    real = fl._softmax_grad
    fused = full_of(kernels.linear_cross_entropy_triton)

    def swapped():
        fl._softmax_grad = fn
        try:
            return fused()
        finally:
            fl._softmax_grad = real

    calls = {"torch.compile (unfused)": full_of(torch.compile(ops.linear_cross_entropy_torch, dynamic=False)),
             "fused as is": fused, f"fused, {best}": swapped}
    g_ref = calls["torch.compile (unfused)"]()
    checks = {n: max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(c(), g_ref))
              for n, c in calls.items()}
    rows = []
    names = list(calls)
    for rnd in range(ROUNDS_2):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            ms = do_bench(calls[name], False)
            rows.append({"part": "whole loss, fwd+bwd", "hidden": 2048, "rows": N, "variant": name, "round": rnd,
                         "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2], "gb_per_s_read_write_once": float("nan"),
                         "max_rel_loss_diff_vs_as_is": float("nan"), "max_abs_grad_diff_vs_as_is": float("nan"),
                         "max_rel_grad_diff_vs_compile": checks[name], **base})
    return rows


def main() -> None:
    dev = torch.device("cuda")
    out_csv = Path(sys.argv[1])
    ceiling, base = context(dev)
    base = {"copy_ceiling_gb_per_s": ceiling, **base}
    rows, calls = part1(dev, base)
    write_csv(out_csv, rows)
    per = {n: statistics.median(r["median_ms"] for r in rows if r["variant"] == n) for n in calls}
    as_is = {r["round"]: r["median_ms"] for r in rows if r["variant"] == "as is"}
    lines = [f"copy ceiling {ceiling:.0f} GB/s; softmax kernel, {C} x {Vp} bf16 logits "
             "(GB/s counting one read and one write; x = as is / variant, per round):"]
    for n in sorted(per, key=per.get):
        v = [r for r in rows if r["variant"] == n]
        ratio = [as_is[r["round"]] / r["median_ms"] for r in v]
        lines.append(f"  {n:>52} {per[n]:7.4f} ms {statistics.median(r['gb_per_s_read_write_once'] for r in v):6.0f}"
                     f" GB/s {statistics.median(ratio):6.3f}x ({min(ratio):.3f}-{max(ratio):.3f})")
    best = min((n for n in per if n != "as is"), key=per.get)
    r2 = part2(dev, base, best, calls[best])
    rows += r2
    write_csv(out_csv, rows)
    comp = {r["round"]: r["median_ms"] for r in r2 if r["variant"].startswith("torch.compile")}
    mine = {r["round"]: r["median_ms"] for r in r2 if r["variant"] == "fused as is"}
    lines.append("whole loss fwd+bwd, hidden 2048 (time / torch.compile's; time / fused as is; per round):")
    for n in dict.fromkeys(r["variant"] for r in r2):
        v = [r for r in r2 if r["variant"] == n]
        rc = [r["median_ms"] / comp[r["round"]] for r in v]
        rm = [r["median_ms"] / mine[r["round"]] for r in v]
        lines.append(f"  {n:>60} {statistics.median(r['median_ms'] for r in v):7.3f} ms "
                     f"{statistics.median(rc):6.3f}x ({min(rc):.3f}-{max(rc):.3f}) "
                     f"{statistics.median(rm):6.3f}x ({min(rm):.3f}-{max(rm):.3f}) "
                     f"faster than as is in {sum(x < 1 for x in rm)}/{len(rm)}; "
                     f"grad rel diff to compile's {v[0]['max_rel_grad_diff_vs_compile']:.1e}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
