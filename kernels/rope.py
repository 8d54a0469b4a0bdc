"""Rotary position embedding of q and k (HF Llama's rotate-half): forward and backward Triton kernels.

Shape legend: B batch, H query heads, K key/value heads, T tokens, d head dim, h = d / 2.

With x = (x1, x2) the two halves of a head vector and c = (c1, c2), s = (s1, s2) the
halves of that token's cos/sin rows (``cat(freqs, freqs)``, so c1 == c2 in the model,
but the kernel reads both halves and matches the reference for any table):

    forward:   o1 = x1 * c1 - x2 * s1,   o2 = x2 * c2 + x1 * s2                  (fp32 inside)
    backward:  dx1 = g1 * c1 + g2 * s2,  dx2 = g2 * c2 - g1 * s1   (the transposed rotation)

One program per (batch, ``block_t`` consecutive tokens): it loads those tokens'
cos/sin once and loops over the q heads, then the k heads, ``block_h`` heads per
step, each step a tile of block_h heads x block_t tokens x d. Several tokens per
program keep its reads contiguous when the tokens of a head are adjacent in memory
(the (B, H, T, d) layout); with one token, a program reads one head vector per
head, each from another place. q and k may be strided
views (the model passes ``view(B, T, H, d).transpose(1, 2)``); only the head dim
must be contiguous. Outputs keep the inputs' layout. cos/sin are constants (the
model's buffers): no gradient flows to them. Launch parameters come from
``kernels.registry`` (kernel ``rope``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import check_tensor, empty_like, interpreted
from kernels.registry import launch_params

__all__ = ["rope_triton"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _rope_heads(
    X, O, x_off, o_off, stride_xh, stride_oh, n_heads, c1, c2, s1, s2, ok, HALF,
    BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr,
):
    # a tile of BLOCK_H heads x (BLOCK_T tokens x BLOCK_HALF) per step; x_off/o_off: each column's offset in
    # head 0 (its batch, its token, its place in the first half)
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        mask = (h < n_heads)[:, None] & ok[None, :]
        px = X + h[:, None] * stride_xh + x_off[None, :]
        x1 = tl.load(px, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(px + HALF, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            o1 = x1 * c1[None, :] + x2 * s2[None, :]
            o2 = x2 * c2[None, :] - x1 * s1[None, :]
        else:
            o1 = x1 * c1[None, :] - x2 * s1[None, :]
            o2 = x2 * c2[None, :] + x1 * s2[None, :]
        po = O + h[:, None] * stride_oh + o_off[None, :]
        tl.store(po, o1.to(O.dtype.element_ty), mask=mask)
        tl.store(po + HALF, o2.to(O.dtype.element_ty), mask=mask)


@triton.jit
def _rope_apply(
    Q, K, COS, SIN, QO, KO, T, H, KH, HALF,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
    sc_b, sc_t, ss_b, ss_t,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    n_tb = tl.cdiv(T, BLOCK_T)
    b = pid // n_tb
    t0 = (pid % n_tb) * BLOCK_T
    i = tl.arange(0, BLOCK_T * BLOCK_HALF)
    t = t0 + (i // BLOCK_HALF).to(tl.int64)  # each column's token
    j = i % BLOCK_HALF
    ok = (t < T) & (j < HALF)
    pc = COS + b * sc_b + t * sc_t + j
    ps = SIN + b * ss_b + t * ss_t + j
    c1 = tl.load(pc, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(pc + HALF, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(ps, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(ps + HALF, mask=ok, other=0.0).to(tl.float32)
    _rope_heads(Q, QO, b * sq_b + t * sq_t + j, b * sqo_b + t * sqo_t + j, sq_h, sqo_h, H, c1, c2, s1, s2, ok,
                HALF, BLOCK_H, BACKWARD)
    _rope_heads(K, KO, b * sk_b + t * sk_t + j, b * sko_b + t * sko_t + j, sk_h, sko_h, KH, c1, c2, s1, s2, ok,
                HALF, BLOCK_H, BACKWARD)


@triton.jit
def _rope_fwd_kernel(
    Q, K, COS, SIN, QO, KO, T, H, KH, HALF,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
    sc_b, sc_t, ss_b, ss_t,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    _rope_apply(Q, K, COS, SIN, QO, KO, T, H, KH, HALF,
                sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
                sc_b, sc_t, ss_b, ss_t, BLOCK_H, BLOCK_T, BLOCK_HALF, False)


@triton.jit
def _rope_bwd_kernel(
    DQO, DKO, COS, SIN, DQ, DK, T, H, KH, HALF,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
    sc_b, sc_t, ss_b, ss_t,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    _rope_apply(DQO, DKO, COS, SIN, DQ, DK, T, H, KH, HALF,
                sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
                sc_b, sc_t, ss_b, ss_t, BLOCK_H, BLOCK_T, BLOCK_HALF, True)


# --------------------------------------------------------------------------- launchers

_INTERPRETED = interpreted(_rope_fwd_kernel)  # decorated under TRITON_INTERPRET=1: runs on CPU tensors


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_inputs(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_tensor("rope", "q", q, _INTERPRETED)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"kernels.rope: q and k must be 4-d (B, heads, T, d), got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    B, _, T, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, T, d):
        raise ValueError(f"kernels.rope: k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, tokens and "
                         "head dim")
    if d % 2:
        raise ValueError(f"kernels.rope: the head dim must be even for rotate-half, got {d}")
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device or t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"kernels.rope: {name} must be a float tensor on {q.device}, got {t.dtype} on {t.device}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, B) or t.shape[1:] != (T, d):
            raise ValueError(f"kernels.rope: {name} must be ({B} or 1, {T}, {d}) (already gathered by position "
                             f"id), got {tuple(t.shape)}")
        if t.requires_grad:
            raise ValueError(f"kernels.rope: {name} requires grad; the kernel treats cos/sin as constants "
                             "(use the torch backend to differentiate through the table)")


def _rope_launch(kernel, q, k, cos, sin, qo, ko) -> None:
    B, H, T, d = q.shape
    KH = k.shape[1]
    if B * T == 0:
        return
    p = launch_params("rope", {"tokens": B * T, "q_heads": H, "k_heads": KH, "head_dim": d})
    cos, sin = cos.expand(B, T, d), sin.expand(B, T, d)  # a (1, T, d) table gets batch stride 0
    kernel[(B * triton.cdiv(T, p["block_t"]),)](
        q, k, cos, sin, qo, ko, T, H, KH, d // 2,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        BLOCK_H=p["block_h"], BLOCK_T=p["block_t"], BLOCK_HALF=triton.next_power_of_2(max(1, d // 2)),
        num_warps=p["num_warps"], num_stages=p["num_stages"],
    )


def _rope_fwd(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs(q, k, cos, sin)
    q, k, cos, sin = (_last_contiguous(t) for t in (q, k, cos, sin))
    qo, ko = empty_like(q), empty_like(k)
    _rope_launch(_rope_fwd_kernel, q, k, cos, sin, qo, ko)
    return qo, ko


def _rope_bwd(dqo, dko, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    dqo, dko, cos, sin = (_last_contiguous(t) for t in (dqo, dko, cos, sin))
    dq, dk = empty_like(dqo), empty_like(dko)
    _rope_launch(_rope_bwd_kernel, dqo, dko, cos, sin, dq, dk)
    return dq, dk


# --------------------------------------------------------------------------- custom ops
# (opaque to torch.compile, launch parameters resolved from the concrete shapes when they run: see
# kernels/rmsnorm.py; outputs are laid out like the inputs, as the fake functions say)


@torch.library.custom_op("wb_kernels::rope_fwd", mutates_args=())
def _rope_fwd_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rope_fwd(q, k, cos, sin)


@torch.library.custom_op("wb_kernels::rope_bwd", mutates_args=())
def _rope_bwd_op(
    dqo: torch.Tensor, dko: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rope_bwd(dqo, dko, cos, sin)


@_rope_fwd_op.register_fake
@_rope_bwd_op.register_fake
def _(a, b, cos, sin):
    return torch.empty_like(_last_contiguous(a)), torch.empty_like(_last_contiguous(b))


# --------------------------------------------------------------------------- autograd


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        qo, ko = _rope_fwd_op(q, k, cos, sin)
        ctx.save_for_backward(cos, sin)
        return qo, ko

    @staticmethod
    def backward(ctx, dqo, dko):  # grads are materialised (zeros) when an output is unused
        cos, sin = ctx.saved_tensors
        dq, dk = _rope_bwd_op(dqo, dko, cos, sin)
        return dq, dk, None, None


# --------------------------------------------------------------------------- functional


def rope_triton(
    q_BHTd: torch.Tensor, k_BKTd: torch.Tensor, cos_BTd: torch.Tensor, sin_BTd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k, fp32 inside, each in its own dtype: the ``triton`` backend of op ``rope``
    (same signature and numerics as ``workbench.train.ops.rope_torch``; no gradient to cos/sin)."""
    return _RoPE.apply(q_BHTd, k_BKTd, cos_BTd, sin_BTd)
