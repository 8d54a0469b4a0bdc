"""Helpers shared by the launchers: device checks, output allocation (poisonable for tests), SM count."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["check_tensor", "empty", "empty_like", "interpreted", "num_sms", "poison_outputs"]

_POISON = {"on": False}


@contextmanager
def poison_outputs() -> Iterator[None]:
    """Within this block, float outputs of the kernels start as NaN (tests: an unwritten element fails)."""
    before = _POISON["on"]
    _POISON["on"] = True
    try:
        yield
    finally:
        _POISON["on"] = before


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty``, or NaN-filled inside :func:`poison_outputs`."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if _POISON["on"] and out.is_floating_point():
        out.fill_(float("nan"))
    return out


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like`` (keeps a dense tensor's strides), or NaN-filled inside :func:`poison_outputs`."""
    out = torch.empty_like(t)
    if _POISON["on"] and out.is_floating_point():
        out.fill_(float("nan"))
    return out


def interpreted(kernel: object) -> bool:
    """Whether ``kernel`` was decorated under TRITON_INTERPRET=1 (it then runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_tensor(kernel_name: str, arg: str, t: torch.Tensor, interpreted: bool) -> None:
    """Raise a clear error unless ``t`` lives where the kernel can run (CUDA; the CPU when ``interpreted``).

    ``interpreted`` is a module constant of each kernel file (computed once at import)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kernels.{kernel_name}: {arg} must be a tensor, got {type(t).__name__}")
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted):
        return
    raise ValueError(
        f"kernels.{kernel_name}: {arg} is on {t.device}; the Triton kernels need CUDA tensors "
        "(TRITON_INTERPRET=1 set before `import kernels` runs them on the CPU, for tests). "
        "On the CPU use the 'torch' backend of the op.")


_SMS: dict[int, int] = {}
_INTERPRETER_PROGRAMS = 3  # few persistent programs under the interpreter: tests then cover the per-program loops


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a small constant on the CPU interpreter)."""
    if device.type != "cuda":
        return _INTERPRETER_PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    n = _SMS.get(index)
    if n is None:
        n = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n
