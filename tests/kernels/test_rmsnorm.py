"""RMSNorm (kernels/rmsnorm.py), plain and with the fused residual add: forward and every gradient against float64
references, the dw partials' sum, the unmasked path, the output dtype."""

from __future__ import annotations

import pytest
import torch
from _kernel_testing import DTYPES, INTERPRETED, close, grads, randn

import kernels
from workbench.train import ops


def rmsnorm_ref(x, w, eps):
    x, w = x.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


RMS_CASES = [  # (leading shape, hidden, launch params)
    ((1,), 1, {}),
    ((5,), 3, {"block_rows": 2}),
    ((1,), 127, {}),
    ((2, 3), 200, {"block_rows": 4, "num_warps": 2}),
    ((257,), 127, {"block_rows": 16, "block_size": 256, "num_warps": 16}),  # many rows, a tile wider than D
    ((300,), 3, {"block_rows": 4, "programs_per_sm": 8}),  # more backward programs than under the default
    ((2, 3), 200, {"fwd_block_size": 64}),  # two-pass forward: 4 column chunks, the last one partly masked
    ((257,), 127, {"block_rows": 4, "fwd_block_size": 32, "num_warps": 2}),
    # backward with its own tile, loading the next one ahead: 3 programs (interpreter) over 65 tiles of 4 rows
    # (the last tile has one row, and each program's last load ahead is past M: masked)
    ((257,), 127, {"bwd_block_rows": 4, "bwd_num_warps": 2, "bwd_tiles_in_flight": 2, "programs_per_sm": 1}),
    ((5,), 3, {"bwd_block_rows": 8, "bwd_tiles_in_flight": 2}),  # one tile, more rows than M
    # tiles wholly inside the tensor (rows a multiple of block_rows, D of the column block): the forward's
    # unmasked path, one pass and two; then D a multiple of the block but not the rows (masked)
    ((2, 4), 128, {"block_rows": 4, "block_size": 128}),
    ((2, 4), 256, {"block_rows": 2, "fwd_block_size": 64}),
    ((5,), 128, {"block_rows": 2, "fwd_block_size": 32}),
    # the defaults: at 1,500 one pass, a row a program in a 2,048-column tile of 4 warps (masked); from a row of
    # 2,048 up, two passes over half-row chunks (unmasked)
    ((3,), 1500, {}),
    ((2,), 2048, {}),
    # two passes over one chunk that holds the whole row (fwd_passes 2): masked, then whole tiles
    ((3,), 200, {"fwd_passes": 2, "block_rows": 2}),
    ((2, 4), 128, {"fwd_passes": 2, "block_rows": 4, "block_size": 128}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,D,params", RMS_CASES, ids=[f"{c[0]}x{c[1]}" for c in RMS_CASES])
def test_rmsnorm_forward_and_grads(gen, lead, D, params, dtype):
    x = randn(gen, *lead, D, dtype=dtype, scale=2.0).requires_grad_()
    w = (1 + randn(gen, D, dtype=torch.float64, scale=0.5)).to(dtype).requires_grad_()
    dy = randn(gen, *lead, D, dtype=dtype)
    eps = 1e-5
    with kernels.using({"rmsnorm": params}), kernels.poison_outputs():
        y = kernels.rms_norm_triton(x, w, eps)
        dx, dw = grads(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = rmsnorm_ref(x64, w64, eps)
    dx64, dw64 = grads(y64, (x64, w64), dy.double())
    close(y, y64, dtype, scale=y64.abs().max().item())
    close(dx, dx64, dtype, scale=dx_terms(x64, w64, dy, eps))
    close(dw, dw64, dtype, scale=dw64.abs().max().item())


@pytest.mark.parametrize("P,D,block_p", [(1, 1, 0), (300, 70, 64), (300, 70, 0), (5, 2049, 0)],
                         ids=["1x1", "300x70-loop", "300x70-256-rows", "5x2049"])
def test_rmsnorm_dw_partials_sum(gen, P, D, block_p):
    """The backward's dw partials are summed by a Triton kernel (row blocks in a loop, the last one partly
    masked; columns past D masked), written in the weight's dtype."""
    from kernels.rmsnorm import _sum_rows

    partial = randn(gen, P, D)
    ref = partial.double().sum(0)
    with kernels.poison_outputs():
        got = _sum_rows(partial, torch.float32, block_p=block_p)
        got16 = _sum_rows(partial, torch.bfloat16, block_p=block_p)
    # fp32 sums of P terms of size ~1 in another order than fp64's: error ~ P * 2^-24 * sqrt(P)
    close(got, ref, torch.float32, scale=max(1.0, P ** 0.5))
    close(got16, ref, torch.bfloat16, scale=ref.abs().max().item())


def dx_terms(x64, w64, dy, eps) -> float:
    """Magnitude of the terms whose difference is RMSNorm's dx: rstd * |w * dy|."""
    x64 = x64.detach()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return (rstd * (w64.detach() * dy.double()).abs()).max().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,D,params", RMS_CASES[1:4:2] + RMS_CASES[4:5] + RMS_CASES[6:7] + RMS_CASES[8:9]
                         + RMS_CASES[10:12] + RMS_CASES[15:16],
                         ids=["5x3", "6x200", "257x127", "6x200-two-pass", "257x127-bwd-prefetch",
                              "8x128-whole-tiles", "8x256-two-pass-whole-chunks", "3x200-two-pass-whole-row"])
def test_rmsnorm_fused_residual_add(gen, lead, D, params, dtype):
    x = randn(gen, *lead, D, dtype=dtype).requires_grad_()
    r = randn(gen, *lead, D, dtype=dtype).requires_grad_()
    w = (1 + randn(gen, D, dtype=torch.float64, scale=0.5)).to(dtype).requires_grad_()
    dy, ds = randn(gen, *lead, D, dtype=dtype), randn(gen, *lead, D, dtype=dtype)
    with kernels.using({"rmsnorm": params}), kernels.poison_outputs():
        y, s = kernels.rms_norm_add_triton(x, r, w, 1e-6)
        dx, dr, dw = grads((y, s), (x, r, w), (dy, ds))
    # reference: the norm of the s returned (x + r rounded to the dtype, as an unfused add rounds it)
    s_ref = s.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = rmsnorm_ref(s_ref, w64, 1e-6)
    ds64, dw64 = grads(y64, (s_ref, w64), dy.double())
    ds64 = ds64 + ds.double()
    if INTERPRETED:  # the interpreter truncates the sum to bf16 where torch rounds it
        close(s, (x.detach() + r.detach()).double(), dtype, scale=0.0)
    else:
        assert torch.equal(s, x.detach() + r.detach())
    close(y, y64, dtype, scale=y64.abs().max().item())
    scale = dx_terms(s_ref, w64, dy, 1e-6) + ds.abs().max().item()
    close(dx, ds64, dtype, scale=scale)
    close(dr, ds64, dtype, scale=scale)
    close(dw, dw64, dtype, scale=dw64.abs().max().item())


@pytest.mark.parametrize("lead,D,params,fused,even", [
    ((2, 4), 128, {"block_rows": 4, "block_size": 128}, False, True),  # one pass, whole tiles
    ((2, 4), 256, {"block_rows": 2, "fwd_block_size": 64}, False, True),  # two passes, whole chunks
    ((5,), 128, {"block_rows": 2, "fwd_block_size": 32}, False, False),  # rows not a multiple of block_rows
    ((2, 4), 200, {"block_rows": 4, "fwd_block_size": 64}, False, False),  # D not a multiple of the chunk
    ((2, 4), 100, {"block_rows": 4, "block_size": 128}, False, False),  # one pass, a tile wider than D
    ((2, 4), 128, {"block_rows": 4, "block_size": 128}, True, False),  # the fused add keeps its masks
    ((2, 4), 128, {"block_rows": 4, "block_size": 128, "fwd_passes": 2}, False, True),  # two passes, whole rows
], ids=["one-pass", "two-pass", "rows-ragged", "chunks-ragged", "tile-wider", "fused-add", "two-pass-whole-row"])
def test_rmsnorm_forward_drops_its_masks_only_where_the_tiles_fit(gen, monkeypatch, lead, D, params, fused, even):
    """The forward's unmasked path is taken exactly when every tile lies inside the tensor, and not with the fused
    add (runs AI and AJ: up to 3.1% faster without the add, 0.2-0.5% slower with it); the results are checked
    for the same shapes in test_rmsnorm_forward_and_grads and test_rmsnorm_fused_residual_add."""
    import kernels.rmsnorm as rms

    launched = []
    real = rms._rmsnorm_fwd_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launched.append(kw["EVEN"])
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(rms, "_rmsnorm_fwd_kernel", Spy())
    x, w, r = randn(gen, *lead, D), 1 + randn(gen, D, scale=0.5), randn(gen, *lead, D)
    with kernels.using({"rmsnorm": params}), kernels.poison_outputs():
        y = kernels.rms_norm_add_triton(x, r, w, 1e-5)[0] if fused else kernels.rms_norm_triton(x, w, 1e-5)
    assert launched == [even]
    close(y, rmsnorm_ref(x + r if fused else x, w, 1e-5), torch.float32, scale=2.0)


@pytest.mark.parametrize("fused", (False, True), ids=("norm", "add+norm"))
def test_rmsnorm_writes_the_matmul_dtype(gen, fused):
    """out_dtype (the model passes autocast's): y written in bf16 from fp32 x, its bf16 gradient read back;
    values as the torch reference with the same out_dtype (fp32 inside, one rounding), dx and dw in fp32.
    Fused, as the model adds a bf16 branch output to the fp32 residual stream: s in fp32, the kernel writes the
    sum's gradient in fp32 for the stream and in bf16 for the branch."""
    x = randn(gen, 6, 200, dtype=torch.bfloat16 if fused else torch.float32).requires_grad_()
    r = randn(gen, 6, 200).requires_grad_()
    w = (1 + randn(gen, 200, scale=0.5)).requires_grad_()
    dy = randn(gen, 6, 200, dtype=torch.bfloat16)
    with kernels.using({"rmsnorm": {"block_rows": 2}}), kernels.poison_outputs():
        if fused:
            y, s = kernels.rms_norm_add_triton(x, r, w, 1e-5, torch.bfloat16)
            assert s.dtype == torch.float32
        else:
            y = kernels.rms_norm_triton(x, w, 1e-5, torch.bfloat16)
        got = grads(y, (x, r, w) if fused else (x, w), dy)
    assert y.dtype == torch.bfloat16 and [g.dtype for g in got] == [x.dtype] + [torch.float32] * (len(got) - 1)
    xr, rr, wr = (t.detach().clone().requires_grad_() for t in (x, r, w))
    y_ref = (ops.rms_norm_add_torch(xr, rr, wr, 1e-5, torch.bfloat16)[0] if fused
             else ops.rms_norm_torch(xr, wr, 1e-5, torch.bfloat16))
    assert y_ref.dtype == torch.bfloat16
    want = grads(y_ref, (xr, rr, wr) if fused else (xr, wr), dy)
    # y: both round the same fp32 value to bf16 once; fp32 sums in another order may flip a last bf16 bit
    close(y, y_ref.double(), torch.bfloat16, scale=y_ref.abs().max().item())
    for a, b in zip(got, want):  # the gradient read is bf16 in both: fp32 math after it
        close(a, b.double(), b.dtype, scale=b.abs().max().item())
    if fused and INTERPRETED:  # the interpreter truncates to bf16 where the GPU (and torch) rounds
        close(got[0], got[1].double(), torch.bfloat16, scale=0.0)
    elif fused:  # the branch's gradient is the stream's, rounded once
        assert torch.equal(got[0], got[1].to(torch.bfloat16))
