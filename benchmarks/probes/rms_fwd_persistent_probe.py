"""Probe (CUDA): the RMSNorm forward, one program per row tile against persistent programs that load their next
tile ahead (fwd_tiles_in_flight 2), fp32 in with fp32 and bf16 out, hidden 2,048 and 4,096; torch.compile of the
reference in the same process. Ran at commit 749fbe0 (run AA); the persistent forward was slower in every case and was
reverted after it, so this script needs that commit. GPU time (kernels.bench.do_bench, quick timing). CSV to argv[1]."""
import itertools
import sys

import pandas as pd
import torch

import kernels
from kernels import bench
from workbench import ops

dev = torch.device("cuda")
ceiling = bench.copy_ceiling_gb_per_s(True, dev)
rows = []
compiled = torch.compile(ops.rms_norm_torch, dynamic=False)
for D, out_dtype in itertools.product((2048, 4096), (torch.float32, torch.bfloat16)):
    M = 8 * 2048
    x = torch.randn(M, D, device=dev)
    w = torch.ones(D, device=dev)
    nbytes = M * D * (4 + (4 if out_dtype == torch.float32 else 2))
    ref = ops.rms_norm_torch(x, w, 1e-5, out_dtype)
    configs = [("torch.compile", None)]
    configs += [(f"one program per tile, {nw} warps, {br} rows", {"num_warps": nw, "block_rows": br})
                for nw, br in ((8, 1), (8, 2), (16, 1), (16, 2))]
    configs += [(f"one program per tile, two-pass 1024, {nw} warps", {"num_warps": nw, "block_rows": 1,
                                                                      "fwd_block_size": 1024}) for nw in (8, 16)]
    configs += [(f"persistent {pps}/SM, {nw} warps, {br} rows", {"num_warps": nw, "block_rows": br,
                                                                 "fwd_tiles_in_flight": 2, "fwd_programs_per_sm": pps})
                for nw, br, pps in itertools.product((4, 8, 16), (1, 2), (2, 4, 8))]
    for name, cfg in configs:
        if cfg is None:
            fn = lambda: compiled(x, w, 1e-5, out_dtype)  # noqa: E731
        else:
            if kernels.get_space("rmsnorm").problems(cfg, {"rows": M, "hidden": D}):
                continue
            fn = lambda cfg=cfg: kernels.rms_norm_triton(x, w, 1e-5, out_dtype)  # noqa: E731
        with kernels.using({"rmsnorm": cfg or {}}):
            err = (fn().float() - ref.float()).abs().max().item()
            med, p20, p80 = bench.do_bench(fn, True)
        rows.append({"hidden": D, "out_dtype": str(out_dtype), "variant": name, **(cfg or {}), "median_ms": med,
                     "p20_ms": p20, "p80_ms": p80, "pct_of_copy_ceiling": 100 * nbytes / (med * 1e-3) / 1e9 / ceiling,
                     "max_abs_err": err, "copy_ceiling_gb_per_s": ceiling, **bench.versions()})
        print(f"D={D} {str(out_dtype):15s} {name:45s} {med * 1e3:7.2f} us {rows[-1]['pct_of_copy_ceiling']:5.1f}%",
              flush=True)
df = pd.DataFrame(rows)
df.to_csv(sys.argv[1], index=False)
for (D, dt), g in df.groupby(["hidden", "out_dtype"]):
    c = g[g["variant"] == "torch.compile"]["median_ms"].iloc[0]
    one = g[g["variant"].str.startswith("one")]["median_ms"].min()
    per = g[g["variant"].str.startswith("persistent")].sort_values("median_ms").iloc[0]
    print(f"SUMMARY D={D} {dt}: compile {c * 1e3:.2f} us; one program per tile best {one * 1e3:.2f} us "
          f"({c / one:.3f}x compile); persistent best {per['median_ms'] * 1e3:.2f} us ({c / per['median_ms']:.3f}x; "
          f"{per['variant']})")
