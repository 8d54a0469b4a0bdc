"""Why is RoPE's backward only level with torch.compile at the gr00t shape? (GPU run AB; a record of what ran, not
a test.)

1. Which memory layout do the gradients reaching RoPE's backward have in the model (flash SDPA after RoPE, q/k/v
   as ``view(B, T, H, d).transpose(1, 2)``)? kernels.bench feeds (B, H, T, d)-contiguous gradients, where a
   program per token reads each head's vector from another place.
2. The tiled kernel (``block_t`` tokens per program) against torch.compile of the reference, forward and
   backward, with the gradients in both layouts, over a grid of block_t x block_h x num_warps.

Usage: python benchmarks/probes/rope_tile_probe.py MODEL OUT_CSV   (MODEL: a kernels.bench.MODELS key)
Prints a table (best configuration per mode and layout against torch.compile); writes every row to OUT_CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kernels  # noqa: E402
from kernels.bench import BATCH, MODELS, SEQ, copy_ceiling_gb_per_s, do_bench  # noqa: E402
from kernels.rope import _rope_bwd, _rope_fwd  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402
from workbench.model import rope_cos_sin  # noqa: E402

dev = torch.device("cuda")


def grad_layouts() -> dict[str, str]:
    """The strides of the gradients reaching RoPE's outputs, per backend, in the model's attention."""
    B, T, H, d = 2, 256, 8, 64
    cos_Pd, sin_Pd = rope_cos_sin(d, T, 10000.0, device=dev)
    pos = torch.arange(T, device=dev).expand(B, T)
    cos, sin = cos_Pd[pos], sin_Pd[pos]
    out = {}
    for name, fn in (("torch", ops.rope_torch), ("triton", kernels.rope_triton)):
        q, k, v = (torch.randn(B, T, H, d, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        qo, ko = fn(q, k, cos, sin)
        seen = {}
        qo.register_hook(lambda g: seen.__setitem__("dq", g.stride()))
        ko.register_hook(lambda g: seen.__setitem__("dk", g.stride()))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = F.scaled_dot_product_attention(qo, ko, v, is_causal=True)
        o.float().sum().backward()
        bhtd = (H * T * d, T * d, d, 1)
        out[name] = " ".join(f"{n}={s} ({'B,H,T,d' if s == bhtd else 'B,T,H,d' if s[2] == H * d else '?'})"
                             for n, s in sorted(seen.items()))
    return out


def main() -> None:
    model, out_csv = sys.argv[1], Path(sys.argv[2])
    m = MODELS[model]
    B, T, H, K = BATCH, SEQ, m["heads"], m["kv_heads"]
    d = m["hidden"] // H
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    layouts = grad_layouts()
    for k_, v_ in layouts.items():
        print(f"gradient layout reaching rope ({k_} backend): {v_}", flush=True)
    ceiling = copy_ceiling_gb_per_s(False, dev)
    cos_Pd, sin_Pd = rope_cos_sin(d, T, 10000.0, device=dev)
    pos = torch.arange(T, device=dev).expand(B, T)
    cos, sin = cos_Pd[pos], sin_Pd[pos]
    q = torch.randn(B, T, H, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(B, T, K, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    grads = {
        "BHTd": (torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16),
                 torch.randn(B, K, T, d, device=dev, dtype=torch.bfloat16)),
        "BTHd": (torch.randn(B, T, H, d, device=dev, dtype=torch.bfloat16).transpose(1, 2),
                 torch.randn(B, T, K, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)),
    }
    nbytes = 2 * (q.numel() + k.numel()) * 2 + 2 * B * T * d * 4
    rows = []

    def add(provider, mode, layout, launch, ms):
        rows.append({"kernel": "rope", "shape": f"{model} {B}x{H}/{K}x{T}x{d}", "mode": mode,
                     "grad_layout": layout, "provider": provider, "launch": launch, "median_ms": ms[0],
                     "p20_ms": ms[1], "p80_ms": ms[2], "gb_per_s": nbytes / (ms[0] * 1e-3) / 1e9,
                     "pct_of_copy_ceiling": 100 * nbytes / (ms[0] * 1e-3) / 1e9 / ceiling,
                     "copy_ceiling_gb_per_s": ceiling, "dtype": "bfloat16", "timestamp": stamp,
                     "gpu": torch.cuda.get_device_name(), **{x: ver.get(x, "") for x in ("torch", "triton", "cuda")},
                     "note": " ".join(f"{k_}: {v_};" for k_, v_ in layouts.items())})

    # torch.compile of the reference: forward alone, and the backward of one graph (retain_graph), per layout
    ref = torch.compile(ops.rope_torch, dynamic=False)
    add("torch_compile", "fwd", "", "", do_bench(lambda: ref(q, k, cos, sin), False))
    qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
    outs = ref(qg, kg, cos, sin)
    for layout, up in grads.items():
        torch.autograd.grad(outs, (qg, kg), up, retain_graph=True)
        add("torch_compile", "bwd", layout, "",
            do_bench(lambda: torch.autograd.grad(outs, (qg, kg), up, retain_graph=True), False))  # noqa: B023
    space = kernels.get_space("rope")
    shape = {"tokens": B * T, "q_heads": H, "k_heads": K, "head_dim": d}
    for bt in (1, 2, 4, 8, 16):
        for bh in (2, 4, 8, 16, 32):
            for nw in (4, 8):
                p = {"num_warps": nw, "num_stages": 2, "block_h": bh, "block_t": bt}
                if bh > max(H, K) or space.problems(p, shape):
                    continue
                launch = " ".join(f"{a}={b}" for a, b in p.items())
                with kernels.using({"rope": p}):
                    add("triton", "fwd", "", launch, do_bench(lambda: _rope_fwd(q, k, cos, sin), False))
                    for layout, (dqo, dko) in grads.items():
                        add("triton", "bwd", layout, launch,
                            do_bench(lambda: _rope_bwd(dqo, dko, cos, sin), False))  # noqa: B023
                print(f"{launch}: done", flush=True)
    with out_csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n{model}: copy ceiling {ceiling:.0f} GB/s")
    print(f"{'mode':4s} {'grads':5s} {'compile ms':>10s} {'best triton ms':>14s} {'x compile':>9s} {'% copy':>6s}  "
          f"{'block_t=1 ms':>12s}  best launch")
    for mode, layout in (("fwd", ""), ("bwd", "BHTd"), ("bwd", "BTHd")):
        c = next(r for r in rows if r["provider"] == "torch_compile" and r["mode"] == mode
                 and r["grad_layout"] == layout)
        tri = [r for r in rows if r["provider"] == "triton" and r["mode"] == mode and r["grad_layout"] == layout]
        best = min(tri, key=lambda r: r["median_ms"])
        bt1 = min((r for r in tri if "block_t=1" in r["launch"]), key=lambda r: r["median_ms"])
        print(f"{mode:4s} {layout or '-':5s} {c['median_ms']:10.4f} {best['median_ms']:14.4f} "
              f"{c['median_ms'] / best['median_ms']:9.3f} {best['pct_of_copy_ceiling']:6.1f}  "
              f"{bt1['median_ms']:12.4f}  {best['launch']}")


if __name__ == "__main__":
    main()
