# throwaway: the device cost of the VLA's per-sample draws (compiled), against the step time of the VLA
import torch, sys
from workbench.train.vla import draws
f = torch.compile(lambda k: draws(k, (16, 32)))
for B in (16, 32, 64):
    k = torch.arange(B, dtype=torch.int32, device="cuda") * 7919
    for _ in range(5): f(k)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(200): f(k)
    e.record(); torch.cuda.synchronize()
    u, eps = f(k)
    print(f"draws B={B}: {s.elapsed_time(e) / 200 * 1e3:.1f} us/call (launch included); eps mean {eps.mean().item():.4f} std {eps.std().item():.4f}")
# eager vs compiled bits on the GPU
k = torch.arange(4096, dtype=torch.int32, device="cuda")
ue, ee = draws(k, (16, 32)); uc, ec = f(k)
print("eager vs compiled: u max diff", (ue - uc).abs().max().item(), "eps max diff", (ee - ec).abs().max().item())
