"""Probe (CUDA): the torch loss op and the eager gr00t step with the LM head padded to 64 rows (now) and not
(ops.VOCAB_ALIGN = 1, as before), interleaved A/B/A/B in one process. Prints medians; writes CSV rows to argv[1]."""
import csv, datetime as dt, statistics, sys, time
import torch
from kernels import bench
from workbench import ops
from workbench.model import Llama, get_preset

dev = torch.device("cuda")
rows, stamp = [], dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
N, D, V = 8 * 2047, 2048, 50257
h = torch.randn(N, D, device=dev, requires_grad=True)
w = (torch.randn(V, D, device=dev) * 0.02).requires_grad_()
labels = torch.randint(0, V, (N,), device=dev)
mask = torch.ones(N, dtype=torch.bool, device=dev)

def loss_full():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        l, n = ops.linear_cross_entropy_torch(h, w, labels, mask)
    torch.autograd.grad(l, (h, w))

model = Llama(get_preset("gr00t-n1.6")).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)
ids = torch.randint(0, V, (8, 2048), device=dev)
pos = torch.arange(2048, device=dev).expand(8, 2048).contiguous()
m2 = torch.ones(8, 2048, dtype=torch.bool, device=dev)

def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        l, n = model.loss(ids, pos, m2)
    (l / n).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

for rnd in range(2):
    for align in (1, 64):
        ops.VOCAB_ALIGN = align
        ms = bench.do_bench(loss_full, quick=True)[0]
        step(); step()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e3)
        st = statistics.median(ts)
        print(f"round {rnd} VOCAB_ALIGN={align:2d}: torch loss fwd+bwd {ms:7.2f} ms, eager gr00t step {st:7.1f} ms",
              flush=True)
        for metric, value in (("loss_fwd_bwd_ms", ms), ("eager_step_ms", st)):
            rows.append({"benchmark": "vocab_pad_ab", "round": rnd, "vocab_align": align, "metric": metric,
                         "value": value, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                         "timestamp": stamp, "config": "gr00t-n1.6 8x2048 bf16 autocast, torch ops, eager"})
with open(sys.argv[1] if len(sys.argv) > 1 else "vocab_pad_ab.csv", "w", newline="") as f:
    wr = csv.DictWriter(f, fieldnames=list(rows[0])); wr.writeheader(); wr.writerows(rows)
