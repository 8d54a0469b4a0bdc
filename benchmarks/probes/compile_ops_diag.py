"""Probe (CUDA): which Triton op fails under torch.compile in the gr00t step, one variant per process (an
illegal memory access poisons the CUDA context). bf16 autocast, 8 x 2048, lr-free fwd+bwd, two steps.

    python benchmarks/probes/compile_ops_diag.py LAYERS VARIANT [VARIANT ...]

VARIANT: OPS[:best][:blocking][:noautotune], OPS = all | rmsnorm | rope | swiglu | loss (Triton ops; the rest torch).
  best       launch parameters of benchmarks/results/kernels_best_launch_h200_2026-11-29.json (else defaults)
  blocking   CUDA_LAUNCH_BLOCKING=1 (the failing kernel is the one reported)
  noautotune torch._inductor.config.triton.autotune_pointwise = False
Seen on an H200 (2026-11-29): at 2 layers every variant ran; at 28 layers, all ops + best, in a process that had
compiled the torch-ops step before, the first compiled step hit an illegal memory access."""
import dataclasses, json, os, subprocess, sys, time

if len(sys.argv) >= 3 and sys.argv[1] != "--one":
    layers = sys.argv[1]
    for variant in sys.argv[2:]:
        t0 = time.time()
        env = {**os.environ, **({"CUDA_LAUNCH_BLOCKING": "1"} if ":blocking" in variant else {})}
        r = subprocess.run([sys.executable, __file__, "--one", layers, variant], capture_output=True, text=True,
                           timeout=400, env=env)
        tail = [l for l in (r.stdout + r.stderr).splitlines() if l.strip() and not l.startswith(("W1", "E1", "I1"))]
        print(f"== layers={layers} {variant}: rc={r.returncode} ({time.time() - t0:.0f} s)")
        print("\n".join(tail[-8:] if r.returncode else tail[-1:]), flush=True)
    sys.exit(0)

_, _, layers, variant = sys.argv
import torch
import kernels
from workbench import ops
from workbench.model import Llama, get_preset

parts = variant.split(":")
op = parts[0]
if "best" in parts:
    kernels.configure(json.load(open("benchmarks/results/kernels_best_launch_h200_2026-11-29.json"))
                      ["loongforge.compute_domain.kernels"])
if "noautotune" in parts:
    import torch._inductor.config as icfg
    icfg.triton.autotune_pointwise = False
dev = torch.device("cuda")
args = dataclasses.replace(get_preset("gr00t-n1.6"), num_hidden_layers=int(layers))
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
print("ok, loss", float((l / n).detach()))
