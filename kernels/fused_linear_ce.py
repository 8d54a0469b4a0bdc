"""Fused LM head + cross-entropy over the vocabulary, in chunks of rows: the N x V logits never exist at once.

Shape legend: N positions (flattened B x (T - 1)), D hidden size, V vocab (Vp: padded to a multiple of 64), C rows
per chunk. Per chunk, cuBLAS computes the logits, a Triton kernel the loss and, in place, the logits' gradient, and
cuBLAS dh and dW: the gradients are computed in the forward and only scaled in the backward. The chunk loop, the
padding and the numerics: docs/kernel-notes.md, "Fused linear + cross-entropy". Launch parameters come from
``kernels.registry`` (kernel ``fused_linear_ce``).
"""

from __future__ import annotations

import re

import torch
import triton
import triton.language as tl

from kernels._launch import check_tensor, empty, interpreted
from kernels.registry import launch_params
from workbench.vocab import VOCAB_ALIGN, padded_vocab

__all__ = ["linear_cross_entropy_triton"]

_IGNORE_INDEX = -100  # as workbench.train.ops: a position whose label is -100 does not count either
_TORCH_MM_OUT_DTYPE = tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 8)
"""mm/addmm with out_dtype=float32 from bf16/fp16 operands exists on CUDA from torch 2.8."""


# --------------------------------------------------------------------------- kernels


@triton.jit
def _ce_fwd_kernel(
    LOGITS, stride_l, LABELS, MASK, LOSS, V, VP, ignore_index,
    WRITE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_l
    label = tl.load(LABELS + row).to(tl.int64)
    counts = (tl.load(MASK + row) != 0) & (label != ignore_index)
    in_vocab = (label >= 0) & (label < V)
    tl.device_assert(in_vocab | (counts == 0), "fused_linear_ce: label outside [0, V) at a counted position")
    # pass 1: running max and sum of exponentials (online softmax), fp32
    m = float("-inf")
    acc = 0.0
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        acc = acc * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(acc)
    x_label = tl.load(base + label, mask=counts & in_vocab, other=0.0).to(tl.float32)
    tl.store(LOSS + row, tl.where(counts, lse - x_label, 0.0))
    # pass 2: d loss / d logits = softmax - onehot(label), written over the logits (0 where the row does not
    # count, and in the padding columns V..VP)
    if WRITE_GRAD:
        for v0 in range(0, VP, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            real = cols < V
            x = tl.load(base + cols, mask=real, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) - tl.where(cols == label, 1.0, 0.0)
            g = tl.where(counts & real, g, 0.0)
            tl.store(base + cols, g.to(LOGITS.dtype.element_ty), mask=cols < VP)


# The backward has no kernel of its own: its work is done in the forward (docs/kernel-notes.md, fused linear +
# cross-entropy); what is left is scaling dh and dW by the incoming gradient.


# --------------------------------------------------------------------------- launchers


_INTERPRETED = interpreted(_ce_fwd_kernel)  # decorated under TRITON_INTERPRET=1: runs on CPU tensors


def _compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    if h.dtype != weight.dtype:
        raise ValueError(f"kernels.fused_linear_ce: h is {h.dtype} and weight {weight.dtype}; outside autocast "
                         "they must match (as for F.linear)")
    return h.dtype


def _check_inputs(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
    check_tensor("fused_linear_ce", "h", h, _INTERPRETED)
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1]:
        raise ValueError(f"kernels.fused_linear_ce: h must be (N, D) and weight (V, D), got {tuple(h.shape)} and "
                         f"{tuple(weight.shape)}")
    N = h.shape[0]
    if labels.shape != (N,) or mask.shape != (N,):
        raise ValueError(f"kernels.fused_linear_ce: labels and mask must be ({N},), got {tuple(labels.shape)} and "
                         f"{tuple(mask.shape)}")
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"kernels.fused_linear_ce: labels must be integers, got {labels.dtype}")
    for name, t in (("weight", weight), ("labels", labels), ("mask", mask)):
        if t.device != h.device:
            raise ValueError(f"kernels.fused_linear_ce: {name} is on {t.device}, h on {h.device}")


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """``out (+)= a @ b`` where ``out`` may be fp32 and ``a``, ``b`` bf16/fp16 (accumulated in fp32).

    Returns ``out``."""
    if out.dtype == a.dtype:
        if accumulate:
            out.addmm_(a, b)
        else:
            torch.mm(a, b, out=out)
    elif out.is_cuda and _TORCH_MM_OUT_DTYPE and out.dtype == torch.float32:
        if accumulate:
            torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
        else:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
    elif not out.is_cuda:  # the CPU (tests): fp32 products of the rounded operands, as cuBLAS's out_dtype path
        if accumulate:
            out.addmm_(a.to(out.dtype), b.to(out.dtype))
        else:
            torch.mm(a.to(out.dtype), b.to(out.dtype), out=out)
    else:  # CUDA with torch < 2.8: the product rounded to the operands' dtype, then added
        if accumulate:
            out.add_(torch.mm(a, b))
        else:
            out.copy_(torch.mm(a, b))
    return out


def _softmax_grad(logits_CV: torch.Tensor, labels: torch.Tensor, mask_u8: torch.Tensor, loss: torch.Tensor, V: int,
                  write_grad: bool, p: dict[str, int]) -> None:
    """The softmax kernel over one chunk: ``loss`` per row; the logits' gradient over them if ``write_grad``."""
    _ce_fwd_kernel[(logits_CV.shape[0],)](
        logits_CV, logits_CV.stride(0), labels, mask_u8, loss, V, logits_CV.shape[1], _IGNORE_INDEX,
        WRITE_GRAD=write_grad, BLOCK_V=p["block_v"], num_warps=p["num_warps"], num_stages=p["num_stages"],
    )


def _fused_linear_ce_fwd(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
    compute_dtype: torch.dtype, grad_h: bool, grad_w: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (loss_sum fp32 0-d, dh (N, D) in h's dtype or None, dW (V, D) fp32 or None), gradients of loss_sum."""
    N, D = h.shape
    V = weight.shape[0]
    p = launch_params("fused_linear_ce", {"rows": N, "hidden": D, "vocab": V})
    C = p["chunk_size"]
    Vp = padded_vocab(V)  # the torch loss pads the same way
    Va = V // VOCAB_ALIGN * VOCAB_ALIGN or V  # the rows of dW updated as one aligned block
    h_c = h.to(compute_dtype).contiguous()
    if Vp == V:
        w_c = weight.to(compute_dtype).contiguous()
    else:  # zero rows V..Vp: their logits are 0 and their gradient is written as 0
        w_c = torch.empty((Vp, D), dtype=compute_dtype, device=h.device)
        w_c[:V].copy_(weight)
        w_c[V:].zero_()
    labels = labels.contiguous()
    mask_u8 = mask.contiguous().to(torch.uint8)  # a copy of N bytes (inductor cannot bitcast bool)
    loss_N = empty((N,), torch.float32, h.device)
    dh = empty((N, D), h.dtype, h.device) if grad_h else None
    dw = torch.zeros((V, D), dtype=torch.float32, device=h.device) if grad_w else None
    write_grad = grad_h or grad_w
    for start in range(0, N, C):  # a Python loop over chunks: no host sync
        end = min(start + C, N)
        logits_CV = torch.mm(h_c[start:end], w_c.t())
        _softmax_grad(logits_CV, labels[start:end], mask_u8[start:end], loss_N[start:end], V, write_grad, p)
        if dh is not None:
            _mm_into(dh[start:end], logits_CV, w_c, accumulate=False)
        if dw is not None:
            # dW (V rows, unpadded) as an aligned block of Va rows (a multiple of VOCAB_ALIGN) plus the tail: an
            # odd row count runs the matmul far slower (docs/kernel-notes.md, fused linear + cross-entropy)
            g_VC = logits_CV[:, :V].t()
            _mm_into(dw[:Va], g_VC[:Va], h_c[start:end], accumulate=True)
            if Va < V:
                _mm_into(dw[Va:], g_VC[Va:], h_c[start:end], accumulate=True)
    return loss_N.sum(), dh, dw


# --------------------------------------------------------------------------- custom op
# (opaque to torch.compile: the chunk loop, its cuBLAS matmuls and the Triton kernel run as written, with
# launch parameters resolved from the concrete shapes; see kernels/rmsnorm.py)


@torch.library.custom_op("wb_kernels::fused_linear_ce_fwd", mutates_args=())
def _fused_linear_ce_op(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
    compute_dtype: torch.dtype, grad_h: bool, grad_w: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (loss_sum, dh, dW); a gradient not asked for is an empty tensor."""
    loss_sum, dh, dw = _fused_linear_ce_fwd(h, weight, labels, mask, compute_dtype, grad_h, grad_w)
    return (loss_sum, dh if dh is not None else h.new_empty(0),
            dw if dw is not None else h.new_empty(0, dtype=torch.float32))


@_fused_linear_ce_op.register_fake
def _(h, weight, labels, mask, compute_dtype, grad_h, grad_w):
    return (h.new_empty((), dtype=torch.float32),
            h.new_empty(h.shape if grad_h else (0,)),
            weight.new_empty(weight.shape if grad_w else (0,), dtype=torch.float32))


# --------------------------------------------------------------------------- autograd


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, mask, compute_dtype, grad_h, grad_w):
        loss_sum, dh, dw = _fused_linear_ce_op(h, weight, labels, mask, compute_dtype, grad_h, grad_w)
        ctx.save_for_backward(dh, dw)
        ctx.grads = (grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss_sum

    @staticmethod
    def backward(ctx, d_loss):
        dh, dw = ctx.saved_tensors
        grad_h, grad_w = ctx.grads
        # Scaled in place (no second V x D buffer at the start of the backward, when memory peaks): the saved
        # gradients serve one backward; a second one through the same graph (retain_graph) fails with
        # autograd's "modified by an inplace operation" error instead of returning wrong gradients.
        dh = dh.mul_(d_loss.to(dh.dtype)) if grad_h else None
        dw = dw.mul_(d_loss).to(ctx.weight_dtype) if grad_w else None
        return dh, dw, None, None, None, None, None


# --------------------------------------------------------------------------- functional


def linear_cross_entropy_triton(
    h_ND: torch.Tensor, weight_VD: torch.Tensor, labels_N: torch.Tensor, mask_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``h @ weight.T`` summed over counted positions, and their number: the ``triton``
    backend of op ``loss`` (same signature and numerics as ``workbench.train.ops.linear_cross_entropy_torch``).

    Returns ``(loss_sum, n_tokens)``: a 0-d float32 tensor and a 0-d int64 tensor, neither synced to the host.
    Labels of counted positions must be in [0, V).
    """
    _check_inputs(h_ND, weight_VD, labels_N, mask_N)
    compute_dtype = _compute_dtype(h_ND, weight_VD)
    grad = torch.is_grad_enabled()
    grad_h, grad_w = grad and h_ND.requires_grad, grad and weight_VD.requires_grad
    with torch.autocast(h_ND.device.type, enabled=False):  # dtypes are explicit inside
        loss_sum = _FusedLinearCE.apply(h_ND, weight_VD, labels_N, mask_N, compute_dtype, grad_h, grad_w)
    return loss_sum, mask_N.bool().sum()
