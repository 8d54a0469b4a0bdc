"""Probe (CUDA): the RMSNorm backward's launch parameters crossed (the bench's sweep varies one at a time), for the
two cases as the model runs them at gr00t-n1.6 shapes (bf16 out; the fused residual add). Long CSV to argv[1]."""
import itertools
import sys

import pandas as pd
import torch

import kernels
from kernels import bench

dev = torch.device("cuda")
device = bench._Device(dev)
ceiling = bench.copy_ceiling_gb_per_s(False, dev)
common = {**bench.versions(), "copy_ceiling_gb_per_s": ceiling}
fwd = {"num_warps": 8, "block_rows": 2}
rows = []
for case in bench._cases([bench.MAIN_MODEL], dev):
    if case.kernel != "rmsnorm" or not any(s in case.shape_label for s in ("bf16 out", "fused add")):
        continue
    for warps, pps, tif, br in itertools.product((4, 8), (2, 3, 4), (1, 2), (1, 2)):
        cfg = {**fwd, "bwd_num_warps": warps, "programs_per_sm": pps, "bwd_tiles_in_flight": tif, "bwd_block_rows": br}
        if kernels.get_space("rmsnorm").problems(cfg):
            continue
        with kernels.using({"rmsnorm": cfg}):
            res = bench._measure(case, case.triton_fn, False, device)
        for mode in ("bwd", "full"):
            r = res[mode]
            rows.append({"shape": case.shape_label, "mode": mode, **cfg, "median_ms": r["median_ms"],
                         "p20_ms": r["p20_ms"], "p80_ms": r["p80_ms"],
                         "pct_of_copy_ceiling": 100 * r["gb_per_s"] / ceiling, **common})
        print(f"{case.shape_label:40s} {cfg} bwd {res['bwd']['median_ms']:.4f} ms "
              f"{100 * res['bwd']['gb_per_s'] / ceiling:.1f}%", flush=True)
df = pd.DataFrame(rows)
df.to_csv(sys.argv[1], index=False)
b = df[df["mode"] == "bwd"].sort_values("median_ms").groupby("shape").head(5)
print(b[["shape", "bwd_num_warps", "programs_per_sm", "bwd_tiles_in_flight", "bwd_block_rows", "median_ms",
         "pct_of_copy_ceiling"]].to_string(index=False))
