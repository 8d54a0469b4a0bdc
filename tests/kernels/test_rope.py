"""RoPE (kernels/rope.py): forward and gradients against a float64 reference, in the model's layouts and tables."""

from __future__ import annotations

import pytest
import torch
from _kernel_testing import DEVICE, DTYPES, close, grads, randn

import kernels
from workbench.train import ops


ROPE_CASES = [  # (B, H, K, T, d, q as the model's transposed view, launch params)
    (1, 1, 1, 1, 2, False, {}),
    (2, 4, 2, 5, 6, True, {"block_h": 2}),
    (1, 3, 3, 7, 10, True, {"block_h": 1, "num_warps": 1}),
    (3, 5, 1, 2, 64, False, {"block_h": 4, "num_stages": 1}),
    (2, 3, 2, 7, 10, True, {"block_h": 2, "block_t": 4}),  # 7 tokens in blocks of 4: the last block is short
    (2, 2, 1, 5, 8, False, {"block_h": 1, "block_t": 2}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,H,K,T,d,transposed,params", ROPE_CASES, ids=[f"{c[:5]}" for c in ROPE_CASES])
def test_rope_forward_and_grads(gen, B, H, K, T, d, transposed, params, dtype):
    if transposed:  # the model's layout: q_proj(x).view(B, T, H, d).transpose(1, 2)
        q = randn(gen, B, T, H, d, dtype=dtype).transpose(1, 2).requires_grad_()
    else:
        q = randn(gen, B, H, T, d, dtype=dtype).requires_grad_()
    k = randn(gen, B, K, T, d, dtype=dtype).requires_grad_()
    angles = randn(gen, B, T, d, scale=3.0)
    cos, sin = angles.cos(), angles.sin()  # any table: the kernel reads both halves of cos and sin
    if transposed:  # the gradients as flash SDPA's backward hands them over in the model: laid out like q
        dqo = randn(gen, B, T, H, d, dtype=dtype).transpose(1, 2)
        dko = randn(gen, B, T, K, d, dtype=dtype).transpose(1, 2)
    else:
        dqo, dko = randn(gen, B, H, T, d, dtype=dtype), randn(gen, B, K, T, d, dtype=dtype)
    with kernels.using({"rope": params}), kernels.poison_outputs():
        qo, ko = kernels.rope_triton(q, k, cos, sin)
        dq, dk = grads((qo, ko), (q, k), (dqo, dko))
    assert qo.stride() == q.stride() and ko.stride() == k.stride()  # outputs keep the inputs' layout
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    qo64, ko64 = ops.rope_torch(q64, k64, cos.double(), sin.double())
    dq64, dk64 = grads((qo64, ko64), (q64, k64), (dqo.double(), dko.double()))
    for actual, ref in ((qo, qo64), (ko, ko64), (dq, dq64), (dk, dk64)):
        close(actual, ref, dtype, scale=ref.abs().max().item())


def test_rope_broadcast_table_and_the_models_tables(gen):
    B, H, K, T, d = 2, 2, 2, 6, 8
    from workbench.train.model import rope_cos_sin

    cos_Td, sin_Td = rope_cos_sin(d, T, 10000.0, device=DEVICE)
    q, k = randn(gen, B, H, T, d), randn(gen, B, K, T, d)
    with kernels.poison_outputs():
        qo, ko = kernels.rope_triton(q, k, cos_Td[None], sin_Td[None])  # (1, T, d): one table for the batch
    qr, kr = ops.rope_torch(q.double(), k.double(), cos_Td[None].double(), sin_Td[None].double())
    close(qo, qr, torch.float32, scale=qr.abs().max().item())
    close(ko, kr, torch.float32, scale=kr.abs().max().item())
