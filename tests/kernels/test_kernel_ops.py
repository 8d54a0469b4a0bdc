"""The Triton ops as the model runs them (kernels/__init__.py, kernels/_launch.py): the device check, the tiny model
trained with them, the launchers as custom ops under torch.compile, and on CUDA compile and graph capture."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from _kernel_testing import DEVICE, randn

import kernels
from kernels import registry
from workbench.train import ops


# --------------------------------------------------------------------------- the ops in the model


def test_a_cpu_tensor_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(kernels.swiglu, "_INTERPRETED", False)
    with pytest.raises(ValueError, match="need CUDA tensors.*'torch' backend"):
        kernels.swiglu_triton(torch.ones(3), torch.ones(3))


def test_the_tiny_model_trains_the_same_with_triton_ops(gen):
    """3 AdamW steps of the tiny model (fp32) with every op on Triton vs every op on torch.

    Tolerance: both runs start from the same weights and batches and differ only by fp32
    rounding inside the ops (~1e-7 relative per op); after 3 optimizer steps the losses
    agree to ~1e-6 relative, so rtol 1e-4 is ~100x margin and still far below the
    ~1e-2 change of the loss per step (a wrong gradient shows up there).
    """
    from workbench.train.model import Llama, get_preset

    args = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
    B, T = 2, 12
    ids = torch.randint(0, args.vocab_size, (B, T), generator=gen, device=DEVICE)
    pos = torch.cat([torch.arange(7), torch.arange(5)]).repeat(B, 1).to(DEVICE)  # two packed documents per row
    loss_mask = torch.ones(B, T, dtype=torch.bool, device=DEVICE)
    loss_mask[1, -3:] = False  # padding at the end of a row

    def run(backend: str, fused: bool = False) -> list[float]:
        torch.manual_seed(0)
        model = Llama(args, ops.resolve({op: backend for op in ops.OP_NAMES}, fused_residual_norm=fused)).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(3):
            loss_sum, n = model.loss(ids, pos, loss_mask)
            loss = loss_sum / n
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    launch = {"rmsnorm": {"block_rows": 16}, "swiglu": {"block_size": 4096, "num_warps": 32},
              "rope": {"block_h": 4}, "fused_linear_ce": {"chunk_size": 8, "block_v": 2048, "num_warps": 16}}
    with kernels.using(launch), kernels.poison_outputs():
        triton_losses = run("triton")
        record = kernels.launch_record()
        fused_losses = run("triton", fused=True)  # each block's second residual add inside the RMSNorm kernel
    torch_losses = run("torch")
    assert torch_losses[0] > torch_losses[2]  # it learns, so equal losses mean equal gradients
    torch.testing.assert_close(triton_losses, torch_losses, rtol=1e-4, atol=0)
    torch.testing.assert_close(fused_losses, torch_losses, rtol=1e-4, atol=0)
    assert run("torch", fused=True) == torch_losses  # the torch reference of the fused add: the same add and norm
    assert {r["kernel"] for r in record} == set(registry.KERNEL_OF_OP.values())  # every op's kernel ran, recorded
    assert all(r["num_warps"] == launch[r["kernel"]].get("num_warps", r["num_warps"]) for r in record)


# --------------------------------------------------------------------------- torch.compile (the CPU: interpreted)


def test_the_launchers_are_custom_ops_with_fake_functions():
    """Each launcher is a torch.library custom op whose fake function gives the real outputs' shapes, dtypes
    and strides (inductor lays out what follows from the fake ones; a mismatch would be read wrongly)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gen_ = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(3, 7, 40, generator=gen_, device=DEVICE)
    w = torch.randn(40, generator=gen_, device=DEVICE)
    q = torch.randn(2, 5, 3, 8, generator=gen_, device=DEVICE).transpose(1, 2)  # strided, as the model's
    k = torch.randn(2, 1, 5, 8, generator=gen_, device=DEVICE)
    cos, sin = torch.randn(1, 5, 8, device=DEVICE), torch.randn(1, 5, 8, device=DEVICE)
    h, wv = torch.randn(6, 40, device=DEVICE), torch.randn(70, 40, device=DEVICE)
    labels, mask = torch.randint(0, 70, (6,), device=DEVICE), torch.rand(6, device=DEVICE) < 0.5
    calls = [
        (torch.ops.wb_kernels.rmsnorm_fwd, (x, None, w, 1e-5, torch.float32)),
        (torch.ops.wb_kernels.rmsnorm_fwd, (x, x * 2, w, 1e-5, torch.bfloat16)),
        (torch.ops.wb_kernels.rmsnorm_bwd, (x, x.reshape(-1, 40), w, torch.ones(21, device=DEVICE), None,
                                            torch.float32)),
        (torch.ops.wb_kernels.rmsnorm_bwd, (x.bfloat16(), x.reshape(-1, 40), w, torch.ones(21, device=DEVICE), x,
                                            torch.bfloat16)),
        (torch.ops.wb_kernels.swiglu_fwd, (x, x)),
        (torch.ops.wb_kernels.swiglu_bwd, (x, x, x)),
        (torch.ops.wb_kernels.rope_fwd, (q, k, cos, sin)),
        (torch.ops.wb_kernels.rope_bwd, (q, k, cos, sin)),
        (torch.ops.wb_kernels.fused_linear_ce_fwd, (h, wv, labels, mask, torch.float32, True, False)),
        (torch.ops.wb_kernels.fused_linear_ce_fwd, (h, wv, labels, mask, torch.float32, False, True)),
    ]
    for op, args in calls:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), op
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_fullgraph_dynamic_torch_compile_runs_the_real_kernels(gen):
    """The tiny model with every op on the Triton backend compiles as ONE graph (fullgraph=True, AOTAutograd)
    with a symbolic sequence length: two lengths run on that one graph (no recompile), the kernels launch with
    parameters resolved from each call's concrete shape, and loss and gradients match eager torch ops."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from workbench.train.model import Llama, get_preset

    torch._dynamo.reset()
    args = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
    torch.manual_seed(0)
    model = Llama(args, ops.resolve({op: "triton" for op in ops.OP_NAMES})).to(DEVICE)
    reference = copy.deepcopy(model)
    reference.set_ops(ops.resolve())
    kernels.configure({"fused_linear_ce": {"chunk_size": 7}})  # several chunks
    counter = CompileCounterWithBackend("inductor")  # the backend that failed on the launchers before they were ops

    def step(m, ids, pos, mask):
        loss_sum, n = m.loss(ids, pos, mask)
        return loss_sum / n

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for T in (10, 13):
        ids = torch.randint(0, args.vocab_size, (2, T), generator=gen, device=DEVICE)
        pos = torch.arange(T, device=DEVICE).repeat(2, 1)
        mask = torch.rand(2, T, generator=gen, device=DEVICE) < 0.8
        out = compiled(model, ids, pos, mask)
        grads_c = torch.autograd.grad(out, list(model.parameters()))
        ref = step(reference, ids, pos, mask)
        grads_r = torch.autograd.grad(ref, list(reference.parameters()))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for (name, _), a, b in zip(model.named_parameters(), grads_c, grads_r):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, name=name, b=b: f"{name} (grad max |.| {b.abs().max():.3g}): {m}")
        frames.append(counter.frame_count)
    # (the first length may take two backend calls: dynamo restarts once to specialise the float eps)
    assert frames[0] >= 1 and frames[1] == frames[0], f"the second length recompiled: {frames}"
    chunks = [r for r in kernels.launch_record() if r["kernel"] == "fused_linear_ce"]
    assert sorted(r["rows"] for r in chunks) == [18, 24]  # 2 x (T - 1) rows: resolved per concrete shape
    # the fused residual add (not used by the model yet): two outputs, the saved one returned
    x, r = randn(gen, 3, 5, 40).requires_grad_(), randn(gen, 3, 5, 40).requires_grad_()
    w = torch.ones(40, device=DEVICE, requires_grad=True)

    def fused():
        y, s = kernels.rms_norm_add_triton(x, r, w, 1e-5)
        return (y * s).sum()

    out = torch.compile(fused, backend="aot_eager", fullgraph=True)()
    g_c = torch.autograd.grad(out, (x, r, w))
    s_ref = x + r
    ref = (ops.rms_norm_torch(s_ref, w, 1e-5) * s_ref).sum()
    for a, b in zip(g_c, torch.autograd.grad(ref, (x, r, w))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- CUDA only: compile and graphs


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _op_calls(dev):
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(4, 64, 256, device=dev, generator=g, requires_grad=True)
    w = torch.ones(256, device=dev, requires_grad=True)
    q = torch.randn(4, 64, 8, 32, device=dev, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(4, 2, 64, 32, device=dev, generator=g, requires_grad=True)
    from workbench.train.model import rope_cos_sin

    cos, sin = (t[None].expand(4, 64, 32) for t in rope_cos_sin(32, 64, 10000.0, device=dev))
    h = torch.randn(4 * 64, 256, device=dev, generator=g, requires_grad=True)
    wv = torch.randn(1000, 256, device=dev, generator=g, requires_grad=True) * 0.05
    labels = torch.randint(0, 1000, (4 * 64,), device=dev, generator=g)
    mask = torch.rand(4 * 64, device=dev, generator=g) < 0.8

    def step(f_rms, f_swiglu, f_rope, f_loss):
        y = f_rms(x, w, 1e-5)
        a = f_swiglu(y, y * 0.5)
        qo, ko = f_rope(q, k, cos, sin)
        loss, n = f_loss(h, wv, labels, mask)
        return a.square().mean() + qo.float().sum() * 1e-3 + ko.float().mean() + loss / n

    params = (x, w, q, k, h)
    return step, params


@needs_cuda
def test_under_torch_compile_fullgraph():
    step, params = _op_calls(DEVICE)
    fns = (kernels.rms_norm_triton, kernels.swiglu_triton, kernels.rope_triton, kernels.linear_cross_entropy_triton)
    refs = (ops.rms_norm_torch, ops.swiglu_torch, ops.rope_torch, ops.linear_cross_entropy_torch)
    eager = step(*refs)
    g_eager = torch.autograd.grad(eager, params)
    compiled = torch.compile(lambda: step(*fns), fullgraph=True)
    out = compiled()
    g_out = torch.autograd.grad(out, params)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    for a, b in zip(g_out, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@needs_cuda
def test_under_cuda_graph_capture():
    step, params = _op_calls(DEVICE)
    fns = (kernels.rms_norm_triton, kernels.swiglu_triton, kernels.rope_triton, kernels.linear_cross_entropy_triton)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles the kernels) outside the capture
        for _ in range(2):
            ref = step(*fns)
            ref_grads = torch.autograd.grad(ref, params)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*fns)
        g_out = torch.autograd.grad(out, params)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref)
    for a, b in zip(g_out, ref_grads):
        torch.testing.assert_close(a, b)
