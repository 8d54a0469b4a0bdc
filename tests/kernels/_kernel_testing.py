"""What the kernel tests share: the device, the tolerances, seeded inputs and the comparison.

On a machine without CUDA the kernels run under the Triton interpreter. Triton reads TRITON_INTERPRET when
``@triton.jit`` decorates a kernel, i.e. when ``kernels.*`` is first imported (not when triton itself is
imported), so the variable is set here before ``import kernels`` (tests/kernels/conftest.py imports this module
first); if another module imported ``kernels`` earlier in this process without it, the import fails at once with a
message saying so. With CUDA the tests run the compiled kernels on the GPU. Shapes, inputs and the reasoning behind
the tolerances: docs/kernel-notes.md, "Tests".
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before `import kernels`: read when @triton.jit decorates

import kernels  # noqa: E402
from kernels._launch import interpreted  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not interpreted(kernels.rmsnorm._rmsnorm_fwd_kernel):
    raise RuntimeError(
        "kernels was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run on this CPU-only "
        "machine; set os.environ.setdefault('TRITON_INTERPRET', '1') in tests/conftest.py")

INTERPRETED = interpreted(kernels.rmsnorm._rmsnorm_fwd_kernel)
BF16_RTOL = 2.0**-7 if INTERPRETED else 2.0**-8  # the interpreter truncates to bf16 where the GPU rounds
FP32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=BF16_RTOL, atol=1e-5)
DTYPES = [torch.float32, torch.bfloat16]


def randn(gen, *shape, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float64) * scale).to(dtype)


def close(actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    assert actual.dtype == dtype, f"dtype {actual.dtype}, expected {dtype}"
    torch.testing.assert_close(actual.double(), ref.double(), rtol=tol["rtol"], atol=tol["atol"] * scale)


def grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)
