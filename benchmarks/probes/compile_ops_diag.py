"""Probe (CUDA): which Triton op fails under torch.compile in the gr00t step. One op on the Triton backend per
process (an illegal memory access poisons the CUDA context), 2 decoder layers, 8 x 2048, bf16 autocast."""
import dataclasses, os, subprocess, sys, time

if len(sys.argv) == 1:
    for op in sys.argv[1:] if False else ["all", "all:best"]:
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, op], capture_output=True, text=True, timeout=100,
                           env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"})
        tail = [l for l in (r.stdout + r.stderr).splitlines() if l.strip() and not l.startswith(("W1", "E1", "I1"))]
        print(f"== {op}: rc={r.returncode} ({time.time() - t0:.0f} s)")
        print("\n".join(tail[-6:] if r.returncode else tail[-2:]), flush=True)
    sys.exit(0)

import torch
import kernels
from kernels import rope as krope
from workbench import ops
from workbench.model import Llama, get_preset

op = sys.argv[1]
if op.endswith(":best"):
    import json
    op = op.split(":")[0]
    kernels.configure(json.load(open("benchmarks/results/kernels_best_launch_h200_2026-11-29.json"))["loongforge.compute_domain.kernels"])
if op.endswith(":contig"):
    op = op.split(":")[0]
    orig = krope._rope_fwd
    krope._rope_fwd = lambda q, k, c, s: orig(q.contiguous(), k.contiguous(), c, s)
dev = torch.device("cuda")
args = dataclasses.replace(get_preset("gr00t-n1.6"), num_hidden_layers=2)
torch.manual_seed(0)
model = Llama(args, ops.resolve({o: "triton" for o in (ops.OP_NAMES if op == "all" else [op])})).to(dev)
B, T = 8, 2048
ids = torch.randint(0, args.vocab_size, (B, T), device=dev)
pos = torch.arange(T, device=dev).expand(B, T).contiguous()
mask = torch.ones(B, T, dtype=torch.bool, device=dev)
fn = torch.compile(model.loss, dynamic=False)
for i in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        l, n = fn(ids, pos, mask)
    (l / n).backward()
    torch.cuda.synchronize()
print("ok, loss", float(l / n))
