"""Triton kernels (kernels/): forward and every gradient against float64 references, launch spaces, knobs.

On a machine without CUDA the kernels run under the Triton interpreter. Triton
reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. when
``kernels.*`` is first imported (not when triton itself is imported), so the
variable is set here before ``import kernels``; if another module imported
``kernels`` earlier in this process without it, the module fails at once with a
message saying so. With CUDA the tests run the compiled kernels on the GPU.

Shapes are tiny (the interpreter runs every program instance in Python) but odd:
hidden sizes 1, 3, 127, 200, one row and many rows, non-power-of-two vocab and
head counts, and launch configurations that make several programs, loop
iterations and chunks.

Tolerances (``torch.testing.assert_close``: |actual - ref| <= atol + rtol * |ref|):

- float32: the kernels compute in fp32 from the same inputs as the float64
  reference; their error is a few fp32 ulps (2^-23 ~ 1.2e-7) per operation,
  amplified by the reductions (sums of <= 300 terms): rtol 1e-5 leaves > 10x margin
  over the worst error seen (under 1e-6) and still fails on any real bug (a wrong
  term is off by O(1)); atol 1e-5 x the magnitude of the terms that are summed
  covers results near zero that come out of cancellations (RMSNorm's dx is
  rstd * (w dy - xhat * mean(xhat w dy)), ~0 at hidden size 1).
- bfloat16: the inputs are bf16 (exact in float64); the kernels compute in fp32
  and round once. bf16 keeps 8 significant bits, so rounding to nearest (the
  GPU's cvt.rn) is off by at most 2^-8 relative (half an ulp at the bottom of a
  binade): rtol 2^-8, plus the same atol for fp32 noise. The Triton interpreter
  truncates fp32 -> bf16 instead (triton/runtime/interpreter.py: cast_impl passes
  no rounding mode), which is off by up to one ulp, 2^-7: that is the rtol when
  interpreted. Where the reference itself computes in bf16 (the logits of the
  loss, as ``workbench.train.ops`` does under bf16), the float64 reference starts from
  those bf16 logits, and the gradients' bound adds the rounding of the logits'
  gradient to bf16 before the matmuls: rtol x (|dlogits| @ |W|) for dh,
  rtol x (|dlogits|^T @ |h|) for dW.

Inputs are drawn fresh for every test from a generator seeded by the test's id
(reproducible, never shared between tests); every output is allocated NaN-filled
(``kernels.poison_outputs``), so an element the kernel does not write fails.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import inspect
import math
import os
import sys
import zlib
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before `import kernels`: read when @triton.jit decorates

import kernels  # noqa: E402
from kernels import registry  # noqa: E402
from kernels._launch import interpreted  # noqa: E402
from workbench.train import ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not interpreted(kernels.rmsnorm._rmsnorm_fwd_kernel):
    raise RuntimeError(
        "kernels was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run on this CPU-only "
        "machine; set os.environ.setdefault('TRITON_INTERPRET', '1') in tests/conftest.py")

INTERPRETED = interpreted(kernels.rmsnorm._rmsnorm_fwd_kernel)
BF16_RTOL = 2.0**-7 if INTERPRETED else 2.0**-8  # see the module docstring
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=BF16_RTOL, atol=1e-5)
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh_launch_config():
    kernels.reset()
    yield
    kernels.reset()


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded by the test id: fresh inputs per test, the same on every run."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(gen, *shape, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float64) * scale).to(dtype)


def close(actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    assert actual.dtype == dtype, f"dtype {actual.dtype}, expected {dtype}"
    torch.testing.assert_close(actual.double(), ref.double(), rtol=tol["rtol"], atol=tol["atol"] * scale)


def grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)


# --------------------------------------------------------------------------- RMSNorm


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


# --------------------------------------------------------------------------- SwiGLU


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


# --------------------------------------------------------------------------- RoPE


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


# --------------------------------------------------------------------------- fused linear + cross-entropy


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
    else:  # bound: dlogits rounded to bf16 before each matmul, then one rounding of the result (module docstring)
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


# --------------------------------------------------------------------------- the ops switch


def test_triton_backends_are_registered_with_the_torch_signatures():
    refs = {"rmsnorm": ops.rms_norm_torch, "swiglu": ops.swiglu_torch, "rope": ops.rope_torch,
            "loss": ops.linear_cross_entropy_torch}
    for op, ref in refs.items():
        fn = kernels.TRITON_OPS[op]
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(ref).parameters), op
        assert registry.get_space(registry.KERNEL_OF_OP[op]).op == op
    # the ops switch finds them through kernels.TRITON_OPS when first asked
    opset = ops.resolve({op: "triton" for op in ops.OP_NAMES})
    assert opset.rmsnorm is kernels.rms_norm_triton and opset.loss is kernels.linear_cross_entropy_triton
    assert ops.OPS["rmsnorm_add"]["triton"] is kernels.rms_norm_add_triton


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
    assert {r["kernel"] for r in record} == set(registry.LAUNCH_SPACES)  # every kernel ran, params recorded
    assert all(r["num_warps"] == launch[r["kernel"]].get("num_warps", r["num_warps"]) for r in record)


# --------------------------------------------------------------------------- launch spaces and validation


GR00T_SHAPES = {  # gr00t-n1.6 at micro-batch 8 x 2,048 (the benchmark's shapes)
    "rmsnorm": {"rows": 16384, "hidden": 2048},
    "swiglu": {"numel": 16384 * 5632},
    "rope": {"tokens": 16384, "q_heads": 32, "k_heads": 32, "head_dim": 64},
    "fused_linear_ce": {"rows": 8 * 2047, "hidden": 2048, "vocab": 50257},
}


HIDDEN_4096_SHAPES = {  # the benchmark's larger shapes
    "rmsnorm": {"rows": 16384, "hidden": 4096},
    "swiglu": {"numel": 16384 * 11008},
    "rope": {"tokens": 16384, "q_heads": 32, "k_heads": 8, "head_dim": 128},
    "fused_linear_ce": {"rows": 8 * 2047, "hidden": 4096, "vocab": 50257},
}


def test_every_space_is_valid_data():
    for kernel, space in registry.LAUNCH_SPACES.items():
        big = HIDDEN_4096_SHAPES[kernel]
        space.validate(space.defaults(big), big)
        assert len(space.sweep(big)) >= 1
        shape = GR00T_SHAPES[kernel]
        space.validate(space.defaults(shape), shape)
        sweep = space.sweep(shape)
        assert 1 <= len(sweep) <= 640, (kernel, len(sweep))  # --full-sweep: minutes, not hours, per shape
        for params in sweep:
            assert set(params) == set(space.param_names())
            space.validate(params, shape)
        assert "num_warps" in space.param_names()
    # RMSNorm's forward defaults: a whole-row tile read once below a row of 2,048, with 4 warps: 16 rows a program
    # up to a tile of 256 columns, 4 rows at 512 (run AY), one row from a tile of 1,024 (run AT); from a row of
    # 2,048 one row a program, two passes over chunks of half the row (at most 2,048 columns), 4 elements a thread
    # (runs AO, AR, AS)
    rms = registry.get_space("rmsnorm")
    fwd = ("block_rows", "fwd_block_size", "num_warps", "fwd_passes")
    assert [[rms.defaults({"rows": 16384, "hidden": d})[k] for k in fwd] for d in (200, 512, 1000, 1536, 2048, 4096,
                                                                                  8192)] == [
        [16, 256, 4, 1], [4, 512, 4, 1], [1, 1024, 4, 1], [1, 2048, 4, 1], [1, 1024, 8, 1], [1, 2048, 16, 1],
        [1, 2048, 16, 1]]
    # the largest power of two of rows whose bf16 logits fit in 512 MiB, capped by the rows there are
    ce = registry.get_space("fused_linear_ce")
    assert ce.defaults(GR00T_SHAPES["fused_linear_ce"])["chunk_size"] == 4096
    assert ce.defaults({"rows": 18, "hidden": 128, "vocab": 4096})["chunk_size"] == 256
    assert ce.defaults({"rows": 16384, "hidden": 4096, "vocab": 128256})["chunk_size"] == 2048


@pytest.mark.parametrize("cfg,match", [
    ({"rmsnorm": {"num_warps": 3}}, r"kernel 'rmsnorm': num_warps=3 must be one of \[1, 2, 4, 8, 16, 32\]"),
    ({"rmsnorm": {"block_size": 96}}, r"block_size=96 must be a power of two"),
    ({"rope": {"num_stages": 0}}, r"kernel 'rope': num_stages=0 must be between 1 and 8"),
    ({"swiglu": {"num_stages": 2}}, r"kernel 'swiglu': num_stages=2 is not a launch parameter.*'block_size'"),
    ({"swiglu": {"block_size": 65536, "num_warps": 4}}, r"block_size=65536 gives 512 tile elements per thread"),
    ({"layernorm": {"num_warps": 4}}, r"'layernorm' is not a kernel; kernels: \['rmsnorm'"),
    ({"fused_linear_ce": {"chunk_size": True}}, r"chunk_size=True must be an integer"),
])
def test_an_invalid_launch_config_is_refused_naming_kernel_param_value_and_constraint(cfg, match):
    kernels.configure({"rope": {"block_h": 2}})
    with pytest.raises(kernels.LaunchConfigError, match=match) as info:
        kernels.configure(cfg)
    from workbench.config import ConfigError

    assert isinstance(info.value, ConfigError)  # a trial that hits it fails as invalid_config
    assert info.value.key.startswith("loongforge.compute_domain.kernels.")
    assert kernels.active_config()["rope"] == {"block_h": 2}  # nothing changed


def test_a_config_that_does_not_fit_the_shape_fails_before_launch(gen, monkeypatch):
    class NotLaunched:
        def __getitem__(self, grid):
            raise AssertionError("launched")

    monkeypatch.setattr(kernels.rmsnorm, "_rmsnorm_fwd_kernel", NotLaunched())
    kernels.configure({"rmsnorm": {"block_size": 128}})  # a power of two: fine until the hidden size is known
    with pytest.raises(kernels.LaunchConfigError, match=r"block_size=128 must be a power of two >= the hidden "
                                                        r"size 200 \(the one-pass kernel holds a whole row"):
        kernels.rms_norm_triton(randn(gen, 4, 200), torch.ones(200, device=DEVICE), 1e-5)
    assert kernels.launch_record() == []


def test_launch_params_fill_defaults_and_are_recorded():
    kernels.configure({"rmsnorm": {"num_warps": 8}})
    p = kernels.launch_params("rmsnorm", {"rows": 10, "hidden": 200})
    assert p == {"num_warps": 8, "num_stages": 2, "block_rows": 16, "block_size": 256, "fwd_block_size": 256,
                 "fwd_passes": 1, "bwd_num_warps": 8, "bwd_block_rows": 16, "programs_per_sm": 2,
                 "bwd_tiles_in_flight": 2}
    assert kernels.launch_record() == [{"kernel": "rmsnorm", "hidden": 200, "rows": 10, **p,
                                        "configured": ["num_warps"]}]


# --------------------------------------------------------------------------- the tuner's knobs


def test_kernel_knobs_mirror_the_launch_spaces():
    from workbench.config import Config, merge_overrides
    from workbench.tune.knobs import KNOBS, drop_unsupported, get_knob

    declared = {k.key for k in KNOBS if ".kernels." in k.key}
    expected = {f"loongforge.compute_domain.kernels.{kernel}.{p}"
                for kernel, space in registry.LAUNCH_SPACES.items() for p in space.param_names()}
    assert declared == expected
    for key in expected:  # each key is accepted by the config (a dict field, set entry by entry)
        kernel, param = key.split(".")[-2:]
        cfg = merge_overrides(Config(), {key: registry.get_space(kernel).param(param).candidates(
            GR00T_SHAPES[kernel])[0]})
        registry.configure(cfg.loongforge.compute_domain.kernels)
    names = [k.name for k in KNOBS if ".kernels." in k.key]
    kept, dropped = drop_unsupported(names + ["triton_fusion", "loss_backend"], set())
    assert kept == [] and {d.reason for d in dropped} == {"needs cuda"}  # left out on a CPU host
    k = get_knob("fused_linear_ce_chunk_size")
    assert k.key == "loongforge.compute_domain.kernels.fused_linear_ce.chunk_size" and k.kind == "int"
    assert not k.active({"triton_fusion": False, "loss_backend": "torch", "rmsnorm_backend": "triton"})
    assert k.active({"triton_fusion": False, "loss_backend": "triton"})
    assert k.active({"triton_fusion": True, "loss_backend": "torch"})
    assert get_knob("rmsnorm_backend").active({"triton_fusion": False})
    assert not get_knob("rmsnorm_backend").active({"triton_fusion": True})
    fused = get_knob("fused_residual_norm")  # one Triton kernel; with torch norms the same add and norm
    assert fused.key == "loongforge.compute_domain.fused_residual_norm" and fused.inactive is False
    assert fused.active({"triton_fusion": True}) and fused.active({"rmsnorm_backend": "triton"})
    assert not fused.active({"triton_fusion": False, "rmsnorm_backend": "torch", "loss_backend": "triton"})


# --------------------------------------------------------------------------- torch.compile (the CPU: interpreted kernels)


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



def _kernels_bench():
    """benchmarks/kernels_bench.py, imported once as the module ``kernels_bench`` (it is a script, not a package
    module); it puts benchmarks/ on sys.path for its helper modules."""
    if "kernels_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kernels_bench", ROOT / "benchmarks" / "kernels_bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernels_bench"] = module
        spec.loader.exec_module(module)
    return sys.modules["kernels_bench"]


def _kbench(name: str):
    """The benchmark's helper module benchmarks/_kbench_<name>.py (setup, cases, e2e, summary), where the names
    the tests patch are looked up."""
    _kernels_bench()
    return importlib.import_module(f"_kbench_{name}")

# --------------------------------------------------------------------------- the benchmark's plumbing (CPU)


def test_bench_needs_cuda_and_says_so(capsys):
    bench = _kernels_bench()

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark would run")
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_compiled_references_backward_expects_gradients_laid_out_like_its_outputs():
    import torch._functorch.config as aot_config

    before = aot_config.guess_tangent_strides_as_outputs
    aot_config.guess_tangent_strides_as_outputs = False  # torch 2.11's default: contiguous gradients
    try:
        with _kbench("cases")._tangents_like_outputs():
            assert aot_config.guess_tangent_strides_as_outputs is True
        assert aot_config.guess_tangent_strides_as_outputs is False  # restored
    finally:
        aot_config.guess_tangent_strides_as_outputs = before


def test_bench_smoke_run_on_the_interpreter(tmp_path, monkeypatch):
    """The whole benchmark at toy shapes with a fake timer: rows, best launch, summary, report sweep file."""
    import json

    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")
    bench_e2e = _kbench("e2e")

    def fake_do_bench(fn, quick):
        fn()
        fn()  # do_bench runs fn many times: the fused loss's backward cannot run twice on one graph
        return 1.0, 0.9, 1.1

    monkeypatch.setattr(setup, "do_bench", fake_do_bench)
    # the tiny preset's dims, so the launch parameters picked at these shapes fit its end-to-end step too
    monkeypatch.setattr(setup, "MODELS", {"toy": dict(hidden=128, ffn=384, heads=4, kv_heads=2, vocab=4096)})
    monkeypatch.setattr(setup, "MAIN_MODEL", "toy")
    monkeypatch.setattr(setup, "E2E_PRESET", "tiny")
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # inductor is not what this test is about
    args = bench._parser().parse_args(["--quick", "--e2e", "--e2e-profile", "--out", str(tmp_path),
                                       "--providers", "triton,torch",
                                       "--kernel-sweep", str(tmp_path / "study" / "kernel_sweep.csv")])
    assert bench.run(args, DEVICE) == 0
    df = pd.read_csv(tmp_path / "kernels_bench.csv")
    assert list(df.columns) == setup.CSV_COLUMNS
    assert {p for s in registry.LAUNCH_SPACES.values() for p in s.param_names()} <= set(setup.CSV_COLUMNS)
    kern = df[df["kernel"].isin(list(registry.LAUNCH_SPACES))]
    assert set(kern["kernel"]) == set(registry.LAUNCH_SPACES) and not kern["error"].notna().any()
    assert set(kern["mode"]) == {"fwd", "bwd", "full"} and set(kern["provider"]) == {"triton", "torch"}
    # the same-size copy moves the op's bytes: under the fake timer (1 ms for everything) the op is at 100% of it
    sized = kern[kern["mode"].isin(["fwd", "bwd"]) & (kern["kernel"] != "fused_linear_ce")]
    assert sized["pct_of_size_copy"].to_numpy() == pytest.approx(100, rel=0.02)
    assert kern[kern["mode"] == "full"]["pct_of_size_copy"].isna().all()
    derived = kern[kern["note"].notna()]
    assert set(derived["kernel"]) == {"fused_linear_ce"} and set(derived["mode"]) == {"bwd"}
    assert set(derived["provider"]) == {"triton"} and (derived["median_ms"] > 0).all()
    assert (df["provider"].str.endswith(("_eager", "_compile")) == (df["kernel"] == "e2e_step")).all()
    e2e = df[df["kernel"] == "e2e_step"].set_index("provider")
    assert e2e.loc["triton_ops_eager", "loss"] == pytest.approx(e2e.loc["torch_ops_eager", "loss"], rel=1e-2)
    best = json.loads((tmp_path / "best_launch.json").read_text())["loongforge.compute_domain.kernels"]
    assert set(best) == set(registry.LAUNCH_SPACES)
    kernels.configure(best)  # what the benchmark recommends is a valid config
    summary = (tmp_path / "summary.md").read_text()
    assert "| rmsnorm | toy 1x6x128 | fwd |" in summary and "end to end" in summary
    sweep = pd.read_csv(tmp_path / "study" / "kernel_sweep.csv")
    assert {"kernel", "num_warps", "median_ms"} <= set(sweep.columns) and set(sweep["mode"]) == {"full"}
    # --e2e-profile: per variant, the ops by self time per step (kernels on CUDA), shares of the profiled time
    prof = pd.read_csv(tmp_path / "e2e_profile.csv")
    assert set(prof["provider"]) == set(e2e.index) and {"gpu", "torch", "timestamp"} <= set(prof.columns)
    for provider, g in prof.groupby("provider"):
        assert list(g["rank"]) == list(range(1, len(g) + 1)) and len(g) <= bench_e2e.PROFILE_TOP
        assert (g["self_ms_per_step"].diff().dropna() <= 0).all() and (g["self_ms_per_step"] > 0).all()
        assert 0 < g["share"].sum() <= 1 + 1e-9
    names = " ".join(prof[prof["provider"] == "torch_ops_eager"]["name"])
    assert "aten::mm" in names or "aten::addmm" in names or "aten::linear" in names  # the matmuls are seen


def test_bench_e2e_keeps_the_variants_measured_before_one_fails(tmp_path, monkeypatch):
    """A variant that raises (on the GPU: a compile error, an illegal access) becomes an error row; the variants
    measured before it keep their numbers, the ones after it are marked not run, and the summary says FAIL."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")

    def broken_compile(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("boom in the compiled step")
        return run

    monkeypatch.setattr(setup, "E2E_PRESET", "tiny")
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    monkeypatch.setattr(torch, "compile", broken_compile)
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path)])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert list(e2e.index) == ["torch_ops_eager", "triton_ops_eager", "torch_ops_compile", "triton_ops_compile"]
    for ok in ("torch_ops_eager", "triton_ops_eager"):
        assert e2e.loc[ok, "median_ms"] > 0 and pd.isna(e2e.loc[ok, "error"])
    assert "boom in the compiled step" in e2e.loc["torch_ops_compile", "error"]
    assert pd.isna(e2e.loc["torch_ops_compile", "median_ms"])
    assert e2e.loc["triton_ops_compile", "error"].startswith("not run")
    summary = (tmp_path / "summary.md").read_text()
    assert "FAIL end to end compile: not measured (RuntimeError: boom in the compiled step)" in summary
    assert "end to end eager: triton ops" in summary  # the eager pair is still compared


def test_bench_e2e_pairs_interleaved_rounds_with_the_torch_ops(tmp_path, monkeypatch):
    """--e2e-rounds in one process: per round, the torch ops' median step over the other variant's (note column),
    and every timed step with its round in e2e_steps.csv."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")

    monkeypatch.setattr(setup, "E2E_PRESET", "tiny")
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    # rounds run torch's 4 timed steps, then triton's: 10 ms against 8, except round 2 (11: slower there)
    scripted = iter([10.0] * 4 + [8.0] * 4 + [10.0] * 4 + [8.0] * 4 + [10.0] * 4 + [11.0] * 4)
    monkeypatch.setattr(setup._Device, "time_ms", lambda self, fn: (fn(), next(scripted)))
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path),
                                       "--e2e-isolation", "none", "--e2e-rounds", "3",
                                       "--e2e-variants", "torch:eager,triton:eager"])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert e2e.loc["triton_ops_eager", "note"] == (
        "paired over 3 rounds: torch ops' step / this step, per round: median 1.2500, min 0.9091, max 1.2500; "
        "faster in 2 of 3")
    assert pd.isna(e2e.loc["torch_ops_eager", "note"])
    steps = pd.read_csv(tmp_path / "e2e_steps.csv")
    assert len(steps) == 24 and list(steps.groupby("provider")["round"].nunique()) == [3, 3]
    per_round = steps.groupby(["provider", "round"])["ms"].median().unstack()
    assert per_round.loc["triton_ops_eager"].tolist() == [8.0, 8.0, 11.0]


def test_bench_e2e_one_process_per_variant(tmp_path, monkeypatch):
    """--e2e-isolation process: each variant runs in a worker process of its own (python benchmarks/kernels_bench.py
    --e2e-worker) whose rows come back to the parent; losses agree across the isolated processes (same seed)."""
    import pandas as pd

    bench = _kernels_bench()
    setup = _kbench("setup")
    bench_e2e = _kbench("e2e")

    monkeypatch.setattr(setup, "E2E_PRESET", "tiny")
    monkeypatch.setattr(setup, "BATCH", 1)
    monkeypatch.setattr(setup, "SEQ", 6)
    monkeypatch.setattr(setup, "COPY_BYTES", 1 << 12)
    monkeypatch.setattr(setup, "do_bench", lambda fn, quick: (fn(), 1.0, 0.9, 1.1)[1:])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the workers run the Triton ops on the CPU too
    args = bench._parser().parse_args(["--quick", "--e2e", "--kernels", "none", "--out", str(tmp_path),
                                       "--e2e-isolation", "process", "--e2e-variants", "torch:eager,triton:eager"])
    assert bench.run(args, DEVICE) == 0
    e2e = pd.read_csv(tmp_path / "kernels_bench.csv").query("kernel == 'e2e_step'").set_index("provider")
    assert list(e2e.index) == ["torch_ops_eager", "triton_ops_eager"]
    assert (e2e["median_ms"] > 0).all() and e2e["error"].isna().all() and (e2e["gpu"] == "cpu").all()
    assert e2e.loc["triton_ops_eager", "loss"] == pytest.approx(e2e.loc["torch_ops_eager", "loss"], rel=1e-3)
    with pytest.raises(SystemExit, match="not one of"):
        bench_e2e._variants(bench._parser().parse_args(["--e2e-variants", "triton:turbo"]))


def test_bench_e2e_variants_include_the_fused_residual_add_on_request():
    import argparse

    bench_e2e = _kbench("e2e")

    assert bench_e2e._variants(argparse.Namespace(e2e_variants=None)) == bench_e2e.E2E_VARIANTS  # not by default
    got = bench_e2e._variants(argparse.Namespace(e2e_variants="triton:compile,triton_fused:compile"))
    assert got == [("triton", "compile"), ("triton_fused", "compile")]
    assert bench_e2e._e2e_row("triton_fused", "compile", {"rmsnorm": {"num_warps": 8}}, {})["sweep"] == "best"
    with pytest.raises(SystemExit, match="'fused' needs the Triton rmsnorm"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="fused:eager"))


def test_bench_e2e_mixes_run_triton_for_the_named_ops_only():
    import argparse

    bench_e2e = _kbench("e2e")
    from workbench.train.ops import OP_NAMES, resolve

    got = bench_e2e._variants(argparse.Namespace(e2e_variants="rmsnorm+loss:compile,rmsnorm+fused+rope:eager"))
    assert got == [("rmsnorm+loss", "compile"), ("rmsnorm+fused+rope", "eager")]
    assert bench_e2e._e2e_ops("rmsnorm+loss") == ({"rmsnorm": "triton", "loss": "triton"}, False)
    assert bench_e2e._e2e_ops("rmsnorm+fused+rope") == ({"rmsnorm": "triton", "rope": "triton"}, True)
    assert bench_e2e._e2e_ops("triton") == ({op: "triton" for op in OP_NAMES}, False)
    assert bench_e2e._e2e_ops("torch") == ({}, False)
    chosen = resolve(*bench_e2e._e2e_ops("rmsnorm+loss")[:1]).backends
    assert chosen == {"rmsnorm": "triton", "swiglu": "torch", "rope": "torch", "loss": "triton"}
    assert bench_e2e._e2e_row("rmsnorm+loss", "compile", {}, {})["provider"] == "rmsnorm+loss_ops_compile"
    with pytest.raises(SystemExit, match=r"\['swigloo'\] not in"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="rmsnorm+swigloo:eager"))
    with pytest.raises(SystemExit, match="mode 'turbo' is not one of eager, compile, graphs"):
        bench_e2e._variants(argparse.Namespace(e2e_variants="rope:turbo"))
