"""Probe (CUDA): logits/dh/dW matmul times at the fused loss's shapes, vocab 50,257 unpadded vs padded to 50,304."""
import torch
from kernels import bench

dev = torch.device("cuda")
N, D, V = 8 * 2047, 2048, 50257
Vp = -(-V // 64) * 64
torch.manual_seed(0)
hb = torch.randn(N, D, device=dev, dtype=torch.bfloat16)
for C in (1024, 4096):
    a = hb[:C]
    for label, vv in (("V=50257", V), ("Vp=50304", Vp)):
        w = torch.randn(vv, D, device=dev, dtype=torch.bfloat16) * 0.02
        logits = torch.mm(a, w.t())
        dw = torch.zeros(V, D, device=dev)
        dh = torch.empty(C, D, device=dev)
        Va = V // 64 * 64
        def split():  # the aligned block of rows, then the tail (what kernels/fused_linear_ce.py does now)
            g = logits[:, :V].t()
            torch.addmm(dw[:Va], g[:Va], a, out_dtype=torch.float32, out=dw[:Va])
            torch.addmm(dw[Va:], g[Va:], a, out_dtype=torch.float32, out=dw[Va:])
        t = [bench.do_bench(lambda: torch.mm(a, w.t(), out=logits), True)[0],
             bench.do_bench(lambda: torch.mm(logits, w, out_dtype=torch.float32, out=dh), True)[0],
             bench.do_bench(lambda: torch.addmm(dw, logits[:, :V].t(), a, out_dtype=torch.float32, out=dw), True)[0]]
        if vv == Vp:
            ts = bench.do_bench(split, True)[0]
            print(f"C={C} {label}: dW as {Va} aligned rows + {V - Va} rows {ts:.3f} ms "
                  f"({2 * C * D * V / (ts * 1e-3) / 1e12:.0f} TFLOP/s)", flush=True)
        tf = [2 * C * D * vv / (x * 1e-3) / 1e12 for x in t]
        print(f"C={C} {label}: logits {t[0]:.3f} ms ({tf[0]:.0f} TFLOP/s), dh {t[1]:.3f} ({tf[1]:.0f}), "
              f"dW(first V rows) {t[2]:.3f} ({tf[2]:.0f})", flush=True)
        del w, logits, dw, dh
