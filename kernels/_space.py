"""What a launch space is: the limits every kernel's launch meets, a tunable parameter (``LaunchParam``) and a
kernel's space of them (``LaunchSpace``: candidates, defaults, constraints, sweeps), the checks they are built
from, and the error a bad value raises (``LaunchConfigError``). The kernels' own spaces are data in
``kernels.registry``, which re-exports these names. Plain Python: no torch, no triton.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ConfigError

__all__ = ["MAX_ELEMS_PER_THREAD", "MAX_NUM_STAGES", "MAX_TILE_NUMEL", "NUM_WARPS_ALLOWED", "Check",
           "LaunchConfigError", "LaunchParam", "LaunchSpace", "Shape", "ShapeCheck", "between", "int_in", "is_pow2",
           "next_pow2", "per_thread", "pow2_between"]

# --------------------------------------------------------------------------- limits

NUM_WARPS_ALLOWED = (1, 2, 4, 8, 16, 32)
"""Triton takes a power-of-two warp count; 32 warps = 1,024 threads, CUDA's limit per block."""
MAX_NUM_STAGES = 8
"""Software-pipelining depth; beyond a few stages the shared-memory buffers only cost occupancy."""
MAX_TILE_NUMEL = 1 << 20
"""Triton's limit on the elements of one block tensor (TRITON_MAX_TENSOR_NUMEL)."""
MAX_ELEMS_PER_THREAD = 128
"""Spill guard: a tile keeps one fp32 register per element in each thread; above 128 per thread
(half of the 255 registers a thread can address, with several tiles live at once) the kernel
spills to local memory and is never the fastest choice, so such a combination is rejected
instead of costing a trial."""

_CONFIG_KEY = "loongforge.compute_domain.kernels"


class LaunchConfigError(ConfigError):
    """A launch parameter is unknown or breaks a constraint of its kernel.

    ``kernel``, ``param``, ``value`` and ``constraint`` say which; ``key`` is the config key
    (``loongforge.compute_domain.kernels.rmsnorm.block_size``). Build one with :meth:`of`.
    """

    def __init__(self, message: str, *, key: str = "", source: str | None = None, line: int | None = None,
                 kernel: str = "", param: str | None = None, value: Any = None, constraint: str = "") -> None:
        super().__init__(message, key=key, source=source, line=line)
        self.kernel, self.param, self.value, self.constraint = kernel, param, value, constraint

    @classmethod
    def of(cls, kernel: str, param: str | None, value: Any, constraint: str) -> LaunchConfigError:
        what = f"{param}={value!r}" if param else f"{value!r}"
        key = f"{_CONFIG_KEY}.{kernel}" + (f".{param}" if param else "")
        return cls(f"kernel {kernel!r}: {what} {constraint}", key=key, kernel=kernel, param=param, value=value,
                   constraint=constraint)

    def __reduce__(self) -> tuple[Any, ...]:
        return (LaunchConfigError.of, (self.kernel, self.param, self.value, self.constraint))


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


Shape = Mapping[str, int]
Check = Callable[[int], "str | None"]
ShapeCheck = Callable[[int, Shape], "str | None"]


def int_in(allowed: tuple[int, ...]) -> Check:
    return lambda v: None if v in allowed else f"must be one of {list(allowed)}"


def between(lo: int, hi: int) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def pow2_between(lo: int, hi: int) -> Check:
    return lambda v: None if is_pow2(v) and lo <= v <= hi else f"must be a power of two between {lo} and {hi}"


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True, kw_only=True)
class LaunchParam:
    """One tunable launch parameter of a kernel."""

    name: str
    """Key under ``loongforge.compute_domain.kernels.<kernel>``."""
    doc: str
    """What it sets."""
    candidates: Callable[[Shape], tuple[int, ...]]
    """Values a sweep tries at a shape (a subset of the valid ones)."""
    default: Callable[[Shape], int]
    """Value used at a shape when the config leaves the parameter out."""
    check: Check
    """Shape-independent constraint: None if ``value`` is allowed, else what is required."""
    shape_check: ShapeCheck | None = None
    """Constraint at a shape: None if allowed, else what is required."""
    phase: str = ""
    """``"fwd"`` or ``"bwd"`` when only that kernel of the op reads it; ``""`` when every launch does."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpace:
    """A kernel's tunable launch space and its validity constraints."""

    kernel: str
    """Kernel name: the key under ``loongforge.compute_domain.kernels``."""
    op: str
    """The ``workbench.train.ops`` op it implements (``fp8_linear``: the FP8 Linears of
    ``loongforge.compute_domain.fp8_cast: triton``, which are no op of the switch)."""
    dims: tuple[str, ...]
    """Named dims of the shape it is launched at (e.g. rows, hidden)."""
    params: tuple[LaunchParam, ...]
    """Tunable parameters, in the order they are reported."""
    joint: Callable[[Mapping[str, int], Shape | None], "list[tuple[str, str]]"] = field(
        default=lambda p, s: [])
    """Constraints between parameters: [(param, requirement)] that fail (shape may be None)."""
    doc: str = ""

    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> LaunchParam:
        for p in self.params:
            if p.name == name:
                return p
        raise LaunchConfigError.of(self.kernel, name, None,
                                f"is not a launch parameter of this kernel; its parameters: {list(self.param_names())}")

    def _check_shape(self, shape: Shape) -> None:
        missing = [d for d in self.dims if d not in shape]
        if missing:
            raise ValueError(
                f"kernel {self.kernel!r}: shape {dict(shape)} lacks dims {missing}; needs {list(self.dims)}")

    def defaults(self, shape: Shape) -> dict[str, int]:
        """Every parameter's default at ``shape``."""
        self._check_shape(shape)
        return {p.name: int(p.default(shape)) for p in self.params}

    def candidates(self, shape: Shape) -> dict[str, tuple[int, ...]]:
        """Each parameter's candidate values at ``shape``."""
        self._check_shape(shape)
        return {p.name: tuple(p.candidates(shape)) for p in self.params}

    def sweep(self, shape: Shape, fixed: Mapping[str, int] | None = None) -> list[dict[str, int]]:
        """Every valid combination of candidates at ``shape`` that can differ in time (``fixed`` pins some
        parameters).

        Parameters read by one phase only (forward or backward kernel) are not crossed with the other phase's:
        for each combination of the shared ones, the forward-only combinations (backward-only ones at their
        defaults), then the backward-only ones (forward-only at their defaults). The two kernels are separate
        launches, so a full step's time is the sum of theirs and the cross product would add no information.
        """
        cands = self.candidates(shape)
        for k, v in (fixed or {}).items():
            self.param(k)
            cands[k] = (int(v),)
        defaults = self.defaults(shape)
        by_phase: dict[str, list[str]] = {}
        for p in self.params:
            by_phase.setdefault(p.phase, []).append(p.name)
        shared = by_phase.pop("", [])
        phased = list(by_phase.values()) or [[]]
        out: list[dict[str, int]] = []
        seen: set[tuple[int, ...]] = set()
        for shared_values in itertools.product(*(cands[n] for n in shared)):
            for names in phased:
                # the other phase's parameters at their defaults (or at the value ``fixed`` pins)
                others = {n: cands[n][0] if len(cands[n]) == 1 else defaults[n]
                          for ns in phased if ns is not names for n in ns}
                for values in itertools.product(*(cands[n] for n in names)):
                    params = {**dict(zip(shared, shared_values)), **others, **dict(zip(names, values))}
                    params = {n: params[n] for n in self.param_names()}
                    key = tuple(params.values())
                    if key not in seen and not self.problems(params, shape):
                        seen.add(key)
                        out.append(params)
        return out

    def problems(self, params: Mapping[str, Any], shape: Shape | None = None) -> list[LaunchConfigError]:
        """Every violated constraint of ``params`` (at ``shape`` when given); [] when valid."""
        errs: list[LaunchConfigError] = []
        known = set(self.param_names())
        for name, value in params.items():
            if name not in known:
                errs.append(LaunchConfigError.of(
                    self.kernel, name, value,
                    f"is not a launch parameter of this kernel; its parameters: {list(self.param_names())}"))
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                errs.append(LaunchConfigError.of(self.kernel, name, value, "must be an integer"))
                continue
            p = self.param(name)
            why = p.check(value)
            if why is None and shape is not None and p.shape_check is not None:
                why = p.shape_check(value, shape)
            if why is not None:
                errs.append(LaunchConfigError.of(self.kernel, name, value, why))
        if not errs:
            for name, why in self.joint(params, shape):
                errs.append(LaunchConfigError.of(self.kernel, name, params.get(name), why))
        return errs

    def validate(self, params: Mapping[str, Any], shape: Shape | None = None) -> None:
        """Raise :class:`LaunchConfigError` for the first violated constraint."""
        if shape is not None:
            self._check_shape(shape)
        errs = self.problems(params, shape)
        if errs:
            raise errs[0]

    def resolve(self, params: Mapping[str, int], shape: Shape) -> dict[str, int]:
        """Defaults at ``shape`` overridden by ``params``, validated."""
        full = {**self.defaults(shape), **params}
        self.validate(full, shape)
        return full

def per_thread(tile_numel: int, num_warps: int) -> str | None:
    per = tile_numel / (32 * num_warps)
    if tile_numel > MAX_TILE_NUMEL:
        return f"gives a tile of {tile_numel} elements, above Triton's limit of {MAX_TILE_NUMEL}"
    if per > MAX_ELEMS_PER_THREAD:
        return (f"gives {per:g} tile elements per thread at num_warps={num_warps} (limit "
                f"{MAX_ELEMS_PER_THREAD}: more would spill registers); raise num_warps or shrink the tile")
    return None
