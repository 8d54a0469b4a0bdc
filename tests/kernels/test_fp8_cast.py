"""kernels/fp8_cast.py against torchao.float8's tensorwise cast, bit for bit: the amax, the scale, and every FP8
value in both layouts, for random inputs of each float dtype and each FP8 format, and for adversarial ones (all
zeros, one huge value, values in FP8's subnormal range, a NaN). A shape FP8 matmuls cannot take is refused with
the shape named. Exact equality is the right test: the kernel implements the same arithmetic (fp64 scale, fp32
product, saturating round-to-nearest-even), so any difference is a bug, not rounding."""

from __future__ import annotations

import pytest
import torch
from _kernel_testing import DEVICE, randn

import kernels
from kernels import fp8_cast

torchao_utils = pytest.importorskip("torchao.float8.float8_utils")

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _torchao(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's tensorwise cast (tensor_to_scale, then _ToFloat8ConstrFunc's fp32 product and saturated cast)."""
    amax = torch.max(torch.abs(x))
    scale = torchao_utils.amax_to_scale(amax, dtype)
    return torchao_utils.to_fp8_saturated(x.to(torch.float32) * scale, dtype), scale


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    diff = (a.view(torch.uint8) != b.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} values differ, first at {diff[0].tolist()}: " \
                              f"{a[tuple(diff[0])].item()} vs {b[tuple(diff[0])].item()}"


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 48), (96, 160), (16, 16)])
def test_cast_matches_torchao_bit_for_bit(gen, dtype, src, shape):
    # a heavy tail: values over many binades, so that both normal and subnormal FP8 values are produced
    x = (randn(gen, *shape) * torch.exp(randn(gen, *shape) * 3)).to(src)
    kernels.configure({"fp8_cast": {"block_m": 32, "block_n": 32}, "fp8_amax": {"block_size": 256}})  # several tiles
    q, qt, scale = fp8_cast.fp8_cast_transpose(x, dtype)
    ref_q, ref_scale = _torchao(x, dtype)
    assert scale.dtype == torch.float32 and scale.shape == () and scale.item() == ref_scale.item()
    _same_bits(q, ref_q)
    _same_bits(qt, ref_q.t().contiguous())
    assert qt.is_contiguous() and qt.shape == (shape[1], shape[0])
    assert fp8_cast.fp8_amax(x).item() == x.abs().max().float().item()


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("case", ["zeros", "one_huge", "subnormal", "nan", "inf"])
def test_adversarial_inputs_match_torchao(gen, dtype, case):
    x = randn(gen, 32, 32, dtype=torch.bfloat16)
    if case == "zeros":
        x.zero_()  # amax 0: torchao's scale is fp8_max / 1e-12, every value 0
    elif case == "one_huge":
        x[3, 5] = 3e38  # every other value then lands in FP8's subnormals or rounds to 0
    elif case == "subnormal":
        x = x * 1e-30  # the scale is huge, the products ordinary
    elif case == "nan":
        x[7, 1] = float("nan")  # amax NaN: torchao's values are all NaN, and so must ours be
    elif case == "inf":
        x[0, 0] = float("inf")  # amax inf: scale 0, inf * 0 = NaN there, 0 elsewhere
    q, qt, scale = fp8_cast.fp8_cast_transpose(x, dtype)
    ref_q, ref_scale = _torchao(x, dtype)
    assert torch.equal(scale, ref_scale) or (scale.isnan() and ref_scale.isnan())
    _same_bits(q, ref_q)
    _same_bits(qt, ref_q.t().contiguous())
    if case == "nan":
        assert q.float().isnan().all()


@pytest.mark.parametrize("shape", [(30, 32), (32, 40), (8,), (2, 16, 16)])
def test_a_shape_fp8_matmuls_cannot_take_is_refused(shape):
    x = torch.ones(shape, device=DEVICE)
    with pytest.raises(ValueError, match=r"2-D with both dims multiples of 16.*got shape " + str(tuple(shape))
                       .replace("(", r"\(").replace(")", r"\)")):
        fp8_cast.fp8_cast_transpose(x)


def test_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        fp8_cast.fp8_cast_transpose(torch.ones(16, 16, device=DEVICE), torch.bfloat16)
    with pytest.raises(ValueError, match="x must be float32/bfloat16/float16, got torch.int32"):
        fp8_cast.fp8_cast_transpose(torch.ones(16, 16, dtype=torch.int32, device=DEVICE))


def test_launch_parameters_come_from_the_registry(gen):
    kernels.configure({"fp8_cast": {"block_m": 16, "block_n": 64, "num_warps": 8}})
    fp8_cast.fp8_cast_transpose(randn(gen, 48, 128))
    rec = [r for r in kernels.launch_record() if r["kernel"] == "fp8_cast"]
    assert rec == [{"kernel": "fp8_cast", "cols": 128, "rows": 48, "num_warps": 8, "block_m": 16, "block_n": 64,
                    "configured": ["block_m", "block_n", "num_warps"]}]
    with pytest.raises(kernels.LaunchConfigError, match=r"kernel 'fp8_cast': block_m=512 must be a power of two "
                       r"between 16 and 256"):
        kernels.configure({"fp8_cast": {"block_m": 512}})
    with pytest.raises(kernels.LaunchConfigError, match=r"tile elements per thread"):
        kernels.configure({"fp8_cast": {"block_m": 256, "block_n": 256, "num_warps": 4}})
