"""SwiGLU (kernels/swiglu.py): forward and both gradients against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from _kernel_testing import DTYPES, close, grads, randn

import kernels


SWIGLU_CASES = [((1,), {}), ((3, 7), {"block_size": 32, "num_warps": 1}), ((2, 5, 127), {"block_size": 256}),
                ((1000,), {"block_size": 128, "num_warps": 4})]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,params", SWIGLU_CASES, ids=[str(c[0]) for c in SWIGLU_CASES])
def test_swiglu_forward_and_grads(gen, shape, params, dtype):
    g = randn(gen, *shape, dtype=dtype, scale=3.0).requires_grad_()
    u = randn(gen, *shape, dtype=dtype).requires_grad_()
    dy = randn(gen, *shape, dtype=dtype)
    with kernels.using({"swiglu": params}), kernels.poison_outputs():
        y = kernels.swiglu_triton(g, u)
        dg, du = grads(y, (g, u), dy)
    g64, u64 = g.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    y64 = torch.nn.functional.silu(g64) * u64
    dg64, du64 = grads(y64, (g64, u64), dy.double())
    close(y, y64, dtype, scale=y64.abs().max().item())
    close(dg, dg64, dtype, scale=dg64.abs().max().item())
    close(du, du64, dtype, scale=du64.abs().max().item())
