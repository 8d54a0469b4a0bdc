"""Probe (CUDA): the RMSNorm backward's dw partial sum ([programs, D] fp32 -> [D]), torch's sum(0) against the
Triton row-sum kernel at several block shapes; GPU time (kernels.bench.do_bench). Long CSV to argv[1]."""
import sys

import pandas as pd
import torch

from kernels import bench
from kernels.rmsnorm import _sum_rows

dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
rows = []
for D in (2048, 4096):
    for pps in (1, 2, 4):
        p = torch.randn(sms * pps, D, device=dev)
        ref = p.double().sum(0)
        variants = {"torch sum(0)": lambda: p.sum(0)}
        for bp, bc, w in ((0, 32, 4), (0, 16, 4), (0, 64, 4), (64, 32, 4), (128, 32, 8), (0, 32, 8)):
            variants[f"triton block_p={bp or 'all<=256'} block_c={bc} warps={w}"] = (
                lambda bp=bp, bc=bc, w=w: _sum_rows(p, torch.float32, bp, bc, w))
        for name, fn in variants.items():
            err = (fn().double() - ref).abs().max().item()
            med, p20, p80 = bench.do_bench(fn, False)
            rows.append({"hidden": D, "partial_rows": sms * pps, "variant": name, "median_us": med * 1e3,
                         "p20_us": p20 * 1e3, "p80_us": p80 * 1e3, "max_abs_err_vs_fp64": err,
                         **bench.versions()})
            print(f"D={D} rows={sms * pps:4d} {name:50s} {med * 1e3:7.2f} us  err {err:.2e}", flush=True)
pd.DataFrame(rows).to_csv(sys.argv[1], index=False)
