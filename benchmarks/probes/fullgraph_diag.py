"""Probe (CUDA): which parameters' gradients differ between torch ops and Triton ops (real kernels, eager),
and whether compiling changes them: per-parameter max |diff| and scale, tiny model of 2 layers, fp32."""
import dataclasses
import torch
import kernels
from workbench import ops
from workbench.model import Llama, get_preset

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
args = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
ids = torch.randint(0, args.vocab_size, (2, 10), generator=g, device=dev)
pos = torch.arange(10, device=dev).repeat(2, 1)
mask = torch.rand(2, 10, generator=g, device=dev) < 0.8
torch.manual_seed(0)
model = Llama(args, ops.resolve()).to(dev)
params = list(model.parameters())
names = [n for n, _ in model.named_parameters()]

def grads(opset, compile_mode=None):
    model.set_ops(opset)
    def step():
        l, n = model.loss(ids, pos, mask)
        return l / n
    fn = torch.compile(step, backend=compile_mode, fullgraph=True) if compile_mode else step
    out = fn()
    return out, torch.autograd.grad(out, params)

ref_out, ref = grads(ops.resolve())
ref2_out, ref2 = grads(ops.resolve())
tri = ops.resolve({op: "triton" for op in ops.OP_NAMES})
kernels.configure({"fused_linear_ce": {"chunk_size": 7}})
for label, (o, gs) in (("torch again", (ref2_out, ref2)), ("triton eager", grads(tri)),
                       ("triton aot_eager", grads(tri, "aot_eager")), ("triton inductor", grads(tri, "inductor"))):
    worst = max(((a - b).abs().max().item(), n, b.abs().max().item()) for n, a, b in zip(names, gs, ref))
    print(f"{label:18s} loss diff {abs(o.item() - ref_out.item()):.2e}; worst grad diff {worst[0]:.3e} at {worst[1]} "
          f"(scale {worst[2]:.3e})")
    for n, a, b in zip(names, gs, ref):
        d = (a - b).abs().max().item()
        if d > 1e-5:
            print(f"    {n:50s} max|diff| {d:.3e}  max|ref| {b.abs().max().item():.3e}")
