"""Fused linear + cross-entropy (kernels/fused_linear_ce.py): loss and gradients against a float64 reference, under
autocast, without grad and with every position masked."""

from __future__ import annotations

import math

import pytest
import torch
from _kernel_testing import BF16_RTOL, DEVICE, DTYPES, close, grads, randn

import kernels


CE_CASES = [  # (N, D, V, launch params)
    (1, 1, 3, {}),
    (7, 3, 5, {"chunk_size": 3, "block_v": 32, "num_warps": 1}),
    (37, 16, 300, {"chunk_size": 16, "block_v": 128, "num_warps": 4}),
    (130, 8, 1000, {"chunk_size": 64, "block_v": 256, "num_warps": 2, "num_stages": 1}),
    (9, 4, 128, {"chunk_size": 4, "block_v": 64}),  # vocab a multiple of 64: no padding, no tail rows of dW
]
# vocab 300 and 1000: padded to 320 and 1024, dW updated as 256 + 44 and 960 + 40 rows


def ce_reference(h, w, labels, mask, logits_dtype):
    """float64 loss sum and grads of h, w, from logits rounded to ``logits_dtype`` (as the torch op does)."""
    logits = (h.to(logits_dtype) @ w.to(logits_dtype).t()).double()
    counts = mask & (labels != -100)
    safe = torch.where(counts, labels, 0).long()
    lse = torch.logsumexp(logits, dim=-1)
    loss = torch.where(counts, lse - logits.gather(1, safe[:, None])[:, 0], 0.0).sum()
    dlogits = (torch.softmax(logits, -1) - torch.nn.functional.one_hot(safe, logits.shape[1])) * counts[:, None]
    h64, w64 = h.to(logits_dtype).double(), w.to(logits_dtype).double()
    return loss, dlogits @ w64, dlogits.t() @ h64, dlogits, h64, w64


def ce_inputs(gen, N, D, V, dtype):
    h = randn(gen, N, D, dtype=dtype).requires_grad_()
    w = randn(gen, V, D, dtype=dtype, scale=2.0 / math.sqrt(D)).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=gen, device=DEVICE)
    mask = torch.rand(N, generator=gen, device=DEVICE) < 0.7
    mask[0] = True
    labels[~mask] = V + 17  # padding ids outside the vocab at masked positions must be ignored, not read
    if N > 2:
        labels[1], mask[1] = -100, True  # -100 does not count either (F.cross_entropy's ignore_index)
    return h, w, labels, mask


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,D,V,params", CE_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}" for c in CE_CASES])
def test_fused_linear_ce_forward_and_grads(gen, N, D, V, params, dtype):
    h, w, labels, mask = ce_inputs(gen, N, D, V, dtype)
    upstream = torch.tensor(0.37, device=DEVICE)  # the caller divides by the token count: not 1
    with kernels.using({"fused_linear_ce": params}), kernels.poison_outputs():
        loss, n = kernels.linear_cross_entropy_triton(h, w, labels, mask)
        dh, dw = grads(loss, (h, w), upstream)
    loss64, dh64, dw64, dlogits, h64, w64 = ce_reference(h.detach(), w.detach(), labels, mask, dtype)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert n.dtype == torch.int64 and n.dim() == 0 and n.item() == int(mask.sum())
    # the loss: fp32 softmax of the same logits, summed over <= 130 rows
    torch.testing.assert_close(loss.double(), loss64, rtol=1e-5, atol=1e-5)
    if dtype == torch.float32:
        close(dh, dh64 * 0.37, dtype, scale=dh64.abs().max().item())
        close(dw, dw64 * 0.37, dtype, scale=dw64.abs().max().item())
    else:  # bound: dlogits rounded to bf16 before each matmul, then one rounding of the result (kernel notes, Tests)
        for actual, ref, bound in ((dh, dh64, dlogits.abs() @ w64.abs()), (dw, dw64, dlogits.abs().t() @ h64.abs())):
            err = (actual.double() - ref * 0.37).abs()
            allowed = 0.37 * BF16_RTOL * bound + BF16_RTOL * (ref * 0.37).abs() + 1e-6
            assert actual.dtype == dtype and bool((err <= allowed).all()), float((err - allowed).max())


def test_fused_linear_ce_under_autocast_matches_the_torch_op(gen):
    """fp32 h and W under bf16 autocast: logits in bf16 as the torch op computes them, grads in fp32."""
    if DEVICE.type == "cpu":
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    h, w, labels, mask = ce_inputs(gen, 40, 16, 200, torch.float32)
    with kernels.using({"fused_linear_ce": {"chunk_size": 16, "block_v": 64}}), kernels.poison_outputs(), autocast:
        loss, _ = kernels.linear_cross_entropy_triton(h, w, labels, mask)
    dh, dw = grads(loss, (h, w), torch.tensor(1.0, device=DEVICE))
    assert dh.dtype == torch.float32 and dw.dtype == torch.float32
    loss64, dh64, dw64, dlogits, h64, w64 = ce_reference(h.detach(), w.detach(), labels, mask, torch.bfloat16)
    torch.testing.assert_close(loss.double(), loss64, rtol=1e-5, atol=1e-5)
    for actual, ref, bound in ((dh, dh64, dlogits.abs() @ w64.abs()), (dw, dw64, dlogits.abs().t() @ h64.abs())):
        err = (actual.double() - ref).abs()
        assert bool((err <= BF16_RTOL * bound + 1e-6).all()), float((err - BF16_RTOL * bound).max())


def test_fused_linear_ce_backward_runs_once(gen):
    """The saved gradients are scaled in place: a second backward through the graph fails loudly."""
    h, w, labels, mask = ce_inputs(gen, 6, 4, 20, torch.float32)
    loss, _ = kernels.linear_cross_entropy_triton(h, w, labels, mask)
    torch.autograd.grad(loss, (h, w), retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, (h, w))


def test_fused_linear_ce_without_grad_and_all_masked(gen):
    h, w, labels, mask = ce_inputs(gen, 9, 4, 50, torch.float32)
    with torch.no_grad(), kernels.poison_outputs():
        loss, n = kernels.linear_cross_entropy_triton(h, w, labels, mask)
    loss64 = ce_reference(h.detach(), w.detach(), labels, mask, torch.float32)[0]
    torch.testing.assert_close(loss.double(), loss64, rtol=1e-5, atol=1e-5)
    mask[:] = False
    with kernels.poison_outputs():
        loss, n = kernels.linear_cross_entropy_triton(h, w, labels, mask)
        dh, dw = grads(loss, (h, w), torch.tensor(1.0, device=DEVICE))
    assert loss.item() == 0.0 and n.item() == 0
    assert not dh.any() and not dw.any()
