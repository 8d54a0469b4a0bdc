"""Launch spaces of the Triton kernels, as data, and the launch parameters in force.

Every kernel declares here (and nowhere else) what can be tuned about its launch:

- its parameters (``num_warps``, ``num_stages`` where the kernel has a loop to
  pipeline, block sizes, rows per chunk), each with the candidate values a sweep
  or a study tries, a default for when the config leaves it out, and the
  constraints any value must meet;
- the shape it is launched at, as named dims (``rows``, ``hidden``, ...), since
  some constraints and defaults depend on it (a one-pass RMSNorm tile must hold
  a whole row).

:func:`configure` takes ``loongforge.compute_domain.kernels`` (kernel -> param ->
int) and checks what does not depend on the shape; :func:`launch_params`, called
by each launcher before it launches, fills the defaults for the shape at hand,
checks the rest, and records the values actually used (:func:`launch_record`).
A bad value raises :class:`LaunchConfigError` (a ``ConfigError``, so a trial
that hits it fails as ``invalid_config``) naming the kernel, the parameter, the
value and the constraint, before anything is launched.

The spaces are plain Python: neither this module nor the ``kernels`` package imports torch or triton (the
kernels' own modules do, at their first use), so a config's launch parameters are checked on every machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ConfigError

__all__ = [
    "KERNEL_OF_OP",
    "LAUNCH_SPACES",
    "LaunchConfigError",
    "LaunchParam",
    "LaunchSpace",
    "active_config",
    "configure",
    "get_space",
    "launch_params",
    "launch_record",
    "reset",
    "using",
]

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

KERNEL_OF_OP: dict[str, str] = {"rmsnorm": "rmsnorm", "swiglu": "swiglu", "rope": "rope", "loss": "fused_linear_ce"}
"""Op name (``workbench.train.ops.OP_NAMES``) -> the kernel that implements its ``triton`` backend."""

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


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


Shape = Mapping[str, int]
Check = Callable[[int], "str | None"]
ShapeCheck = Callable[[int, Shape], "str | None"]


def _int_in(allowed: tuple[int, ...]) -> Check:
    return lambda v: None if v in allowed else f"must be one of {list(allowed)}"


def _between(lo: int, hi: int) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def _pow2_between(lo: int, hi: int) -> Check:
    return lambda v: None if _is_pow2(v) and lo <= v <= hi else f"must be a power of two between {lo} and {hi}"


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


def _per_thread(tile_numel: int, num_warps: int) -> str | None:
    per = tile_numel / (32 * num_warps)
    if tile_numel > MAX_TILE_NUMEL:
        return f"gives a tile of {tile_numel} elements, above Triton's limit of {MAX_TILE_NUMEL}"
    if per > MAX_ELEMS_PER_THREAD:
        return (f"gives {per:g} tile elements per thread at num_warps={num_warps} (limit "
                f"{MAX_ELEMS_PER_THREAD}: more would spill registers); raise num_warps or shrink the tile")
    return None


_NUM_WARPS = dict(name="num_warps", check=_int_in(NUM_WARPS_ALLOWED),
                  doc="warps per program (32 threads each)")
_NUM_STAGES = dict(name="num_stages", check=_between(1, MAX_NUM_STAGES),
                   doc="software-pipelining stages of the kernel's loop")


# ---- rmsnorm: one-pass, a tile of block_rows x block_size holds whole rows


def _rms_tile_warps(numel: int) -> int:
    # Liger-Kernel's calculate_settings thresholds (by tile size), a starting point for kernels_bench.
    return 32 if numel >= 32768 else 16 if numel >= 8192 else 8 if numel >= 2048 else 4


def _rms_default_rows(s: Shape) -> int:
    # ~4K elements per tile: enough work per program for small hidden sizes, one row from 4,096 up.
    return max(1, min(16, 4096 // _next_pow2(s["hidden"])))


def _rms_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    out = []
    for rows, warps in (("block_rows", "num_warps"), ("bwd_block_rows", "bwd_num_warps")):
        if rows in p and "block_size" in p and warps in p:
            why = _per_thread(p[rows] * p["block_size"], p[warps])
            if why:
                out.append((rows, f"with block_size={p['block_size']} and {warps}={p[warps]} {why}"))
    return out


def _rms_default_warps(s: Shape) -> int:
    return _rms_tile_warps(_rms_default_rows(s) * _next_pow2(s["hidden"]))


# The forward's defaults: from a row of 2,048 up, one row per program in two passes over chunks of half the row
# (at most 2,048 columns), 4 elements (one 16-byte fp32 access) a thread; from a tile of 1,024 columns up to a row
# of 2,047, one pass, one row per program, 4 warps; below, several rows a program of 4 warps (4 rows at a tile of
# 512 columns, 16 at 256 and below). The measurements behind each: docs/kernel-notes.md, RMSNorm.
def _rms_fwd_split(s: Shape) -> bool:
    return s["hidden"] >= 2048


def _rms_fwd_default_rows(s: Shape) -> int:
    tile = _next_pow2(s["hidden"])
    return 1 if tile >= 1024 else 4 if tile == 512 else 16


def _rms_fwd_default_block(s: Shape) -> int:
    # chunks of at most 2,048 columns (one of the candidates) above a row of 4,096: not measured there
    return min(2048, _next_pow2(s["hidden"]) // 2) if _rms_fwd_split(s) else _next_pow2(s["hidden"])


def _rms_fwd_default_warps(s: Shape) -> int:
    if _rms_fwd_split(s):
        return min(16, _rms_fwd_default_block(s) // 128)
    return 4


RMSNORM = LaunchSpace(
    kernel="rmsnorm", op="rmsnorm", dims=("rows", "hidden"),
    doc="RMSNorm (optionally fused with the residual add), forward and backward; the forward reads each row "
        "once or, in column chunks, twice (fwd_block_size).",
    params=(
        LaunchParam(**{**_NUM_WARPS, "doc": "forward: warps per program"}, phase="fwd",
                    candidates=lambda s: (2, 4, 8, 16), default=_rms_fwd_default_warps),
        LaunchParam(**{**_NUM_STAGES, "doc": "software-pipelining stages of the backward's row loop and of the "
                       "two-pass forward's column loops"}, candidates=lambda s: (1, 2, 3), default=lambda s: 2),
        LaunchParam(name="block_rows", doc="forward: rows per program", phase="fwd",
                    check=_pow2_between(1, 256), candidates=lambda s: (1, 2, 4, 8, 16),
                    default=_rms_fwd_default_rows),
        LaunchParam(name="block_size", doc="columns per tile: the whole hidden size, padded to a power of two",
                    check=_pow2_between(1, MAX_TILE_NUMEL),
                    shape_check=lambda v, s: None if v >= s["hidden"] else
                    f"must be a power of two >= the hidden size {s['hidden']} (the one-pass kernel holds a whole "
                    f"row in one tile)",
                    candidates=lambda s: (_next_pow2(s["hidden"]),), default=lambda s: _next_pow2(s["hidden"])),
        LaunchParam(name="fwd_block_size", doc="forward: columns per loop step; below the hidden size the "
                    "forward reads each row twice (the sum of squares, then from L2 to normalise), at or above it "
                    "one pass with the block_size tile", check=_pow2_between(1, MAX_TILE_NUMEL), phase="fwd",
                    # inductor's fp32 forward at hidden 4,096: two passes of 2,048 columns (docs/kernel-notes.md)
                    candidates=lambda s: tuple(sorted({v for v in (512, 1024, 2048) if v < s["hidden"]}
                                                      | {_next_pow2(s["hidden"])})),
                    default=_rms_fwd_default_block),
        LaunchParam(name="fwd_passes", doc="forward: 2 reads each row twice (the sum of squares, then from L2 to "
                    "normalise) even where one fwd_block_size chunk holds the row, as inductor's forward does; 1 "
                    "reads it once where the chunk holds it (a chunk narrower than the row always takes two)",
                    check=_int_in((1, 2)), phase="fwd", candidates=lambda s: (1, 2),
                    # default 1: two passes over a whole row are slower with bf16 out (docs/kernel-notes.md, RMSNorm)
                    default=lambda s: 1),
        LaunchParam(**{**_NUM_WARPS, "name": "bwd_num_warps", "doc": "backward: warps per program"}, phase="bwd",
                    candidates=lambda s: (4, 8, 16), default=_rms_default_warps),
        LaunchParam(name="bwd_block_rows", doc="backward: rows per loop step", phase="bwd",
                    check=_pow2_between(1, 256), candidates=lambda s: (1, 2, 4, 8), default=_rms_default_rows),
        LaunchParam(name="programs_per_sm", doc="backward: persistent programs per SM (each loops over row tiles "
                    "and keeps its partial dw in registers)", check=_between(1, 32), phase="bwd",
                    candidates=lambda s: (1, 2, 4, 8),
                    # Liger-Kernel runs one per SM; two keep more loads in flight per SM at the cost of twice
                    # the partial-dw rows (2 x SMs x D fp32, small next to the M x D tensors)
                    default=lambda s: 2),
        LaunchParam(name="bwd_tiles_in_flight", doc="backward: row tiles whose loads are in flight per program; 2 "
                    "loads the next tile before working on the current one (its loads then overlap the reduction "
                    "and the stores, for twice the input registers)", check=_int_in((1, 2)), phase="bwd",
                    candidates=lambda s: (1, 2),
                    # 2 up to a row of 2,048, 1 above it, where the second tile's registers cost more than its
                    # loads hide (docs/kernel-notes.md, RMSNorm)
                    default=lambda s: 2 if _next_pow2(s["hidden"]) <= 2048 else 1),
    ),
    joint=_rms_joint,
)

# ---- swiglu: elementwise over the flattened tensors


def _block_size_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    """A tile of ``block_size`` elements spread over ``num_warps`` warps within the spill guard (SwiGLU, the amax)."""
    if "block_size" in p and "num_warps" in p:
        why = _per_thread(p["block_size"], p["num_warps"])
        if why:
            return [("block_size", why)]
    return []


SWIGLU = LaunchSpace(
    kernel="swiglu", op="swiglu", dims=("numel",),
    doc="silu(gate) * up, forward and backward, elementwise (no loop: num_stages does not apply).",
    params=(
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (2, 4, 8, 16), default=lambda s: 8),
        LaunchParam(name="block_size", doc="elements per program", check=_pow2_between(32, 1 << 16),
                    candidates=lambda s: (512, 1024, 2048, 4096, 8192), default=lambda s: 2048),
    ),
    joint=_block_size_joint,
)

# ---- rope: one program per block of tokens, a loop over blocks of heads


def _rope_half(s: Shape) -> int:
    return _next_pow2(max(1, s["head_dim"] // 2))


def _rope_default_heads(s: Shape) -> int:
    # ~1K elements per half-tile (32 heads of head dim 64), capped at the head count.
    return max(1, min(_next_pow2(max(s["q_heads"], s["k_heads"])), 1024 // _rope_half(s)))


def _rope_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if s is not None and "block_h" in p and "num_warps" in p:
        block_t = p.get("block_t", 1)
        why = _per_thread(p["block_h"] * block_t * _rope_half(s), p["num_warps"])
        if why:
            return [("block_h", f"with block_t={block_t} and head dim {s['head_dim']} {why}")]
    return []


ROPE = LaunchSpace(
    kernel="rope", op="rope", dims=("tokens", "q_heads", "k_heads", "head_dim"),
    doc="Rotary embedding of q and k (rotate-half), forward and backward; one program per (batch, block of "
        "tokens).",
    params=(
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (1, 2, 4, 8), default=lambda s: 4),
        LaunchParam(**_NUM_STAGES, candidates=lambda s: (1, 2, 3), default=lambda s: 2),
        LaunchParam(name="block_h", doc="heads per loop step", check=_pow2_between(1, 256),
                    candidates=lambda s: tuple(h for h in (1, 2, 4, 8, 16, 32)
                                               if h <= _next_pow2(max(s["q_heads"], s["k_heads"]))),
                    default=_rope_default_heads),
        LaunchParam(name="block_t", doc="tokens per program (its heads' tiles span them)",
                    check=_pow2_between(1, 64), candidates=lambda s: (1, 2, 4, 8), default=lambda s: 1),
    ),
    joint=_rope_joint,
)

# ---- fused linear + cross-entropy: torch matmuls per chunk of rows, a Triton softmax/CE/grad kernel per chunk


def _ce_default_chunk(s: Shape) -> int:
    # The largest power of two of rows whose bf16 logits fit in 512 MiB (4,096 rows at vocab 50,257), at most
    # the rows there are: fewer, larger chunks cost less per chunk, and the memory smaller chunks save is small
    # next to the unfused loss's N x V logits (docs/kernel-notes.md, fused linear + cross-entropy).
    rows_fit = max(1, (512 << 20) // (2 * max(1, s["vocab"])))
    cap = 1 << (rows_fit.bit_length() - 1)
    return max(256, min(8192, cap, _next_pow2(s["rows"])))


def _ce_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if "block_v" in p and "num_warps" in p:
        why = _per_thread(p["block_v"], p["num_warps"])
        if why:
            return [("block_v", why)]
    return []


FUSED_LINEAR_CE = LaunchSpace(
    kernel="fused_linear_ce", op="loss", dims=("rows", "hidden", "vocab"),
    doc="LM head + cross-entropy in chunks of rows (logits of one chunk at a time), with the gradients.",
    params=(
        # 8 warps: the fastest of 4-32 for the softmax kernel at the gr00t-n1.6 vocabulary (docs/kernel-notes.md)
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (4, 8, 16, 32), default=lambda s: 8),
        LaunchParam(**_NUM_STAGES, candidates=lambda s: (1, 2, 3), default=lambda s: 2),
        LaunchParam(name="block_v", doc="vocab entries per loop step of the softmax kernel",
                    check=_pow2_between(32, 1 << 17), candidates=lambda s: (2048, 4096, 8192, 16384),
                    default=lambda s: 4096),
        LaunchParam(name="chunk_size", doc="rows whose logits are materialised at once (memory vs matmul size)",
                    check=_between(1, 1 << 20), candidates=lambda s: (1024, 2048, 4096, 8192),
                    default=_ce_default_chunk),
    ),
    joint=_ce_joint,
)

# ---- FP8 tensorwise casts (kernels/fp8_cast.py): the amax, a persistent grid-stride reduction; then one pass that
# scales, casts and stores each tile row-major and transposed


FP8_AMAX = LaunchSpace(
    kernel="fp8_amax", op="fp8_linear", dims=("numel",),
    doc="max |x| of a tensor, for its FP8 tensorwise scale: persistent programs, each a grid-stride loop of "
        "blocks, then one atomic max each.",
    params=(
        # 8 warps, 8,192 elements a step (32 a thread: four 16-byte bf16 loads in flight), 8 programs an SM: the
        # fastest of the sweep's 48 at the gr00t-n1.6 widths, 3-4% faster than 2,048 elements and 4 programs
        # (docs/kernel-notes.md, FP8 tensorwise casts)
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (4, 8, 16), default=lambda s: 8),
        LaunchParam(name="block_size", doc="elements per loop step of a program", check=_pow2_between(256, 1 << 16),
                    candidates=lambda s: (1024, 2048, 4096, 8192), default=lambda s: 8192),
        LaunchParam(name="programs_per_sm", doc="persistent programs per SM", check=_between(1, 32),
                    candidates=lambda s: (2, 4, 8, 16), default=lambda s: 8),
    ),
    joint=_block_size_joint,  # a block_size tile per program, as SwiGLU's
)


def _cast_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if "block_m" in p and "block_n" in p and "num_warps" in p:
        why = _per_thread(p["block_m"] * p["block_n"], p["num_warps"])
        if why:
            return [("block_m", f"with block_n={p['block_n']} and num_warps={p['num_warps']} {why}")]
    return []


FP8_CAST = LaunchSpace(
    kernel="fp8_cast", op="fp8_linear", dims=("rows", "cols"),
    doc="x * scale cast to FP8 and stored twice, row-major and transposed, from one read of each "
        "block_m x block_n tile (no loop: num_stages does not apply).",
    params=(
        # 4 warps, 64 x 128 tiles: the fastest of the sweep at the gr00t-n1.6 widths (docs/kernel-notes.md)
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (4, 8), default=lambda s: 4),
        LaunchParam(name="block_m", doc="rows per tile", check=_pow2_between(16, 256),
                    candidates=lambda s: (32, 64, 128), default=lambda s: 64),
        LaunchParam(name="block_n", doc="columns per tile", check=_pow2_between(16, 256),
                    candidates=lambda s: (32, 64, 128), default=lambda s: 128),
    ),
    joint=_cast_joint,
)

LAUNCH_SPACES: dict[str, LaunchSpace] = {s.kernel: s for s in (RMSNORM, SWIGLU, ROPE, FUSED_LINEAR_CE, FP8_AMAX,
                                                               FP8_CAST)}
"""Kernel name -> its launch space."""


def get_space(kernel: str) -> LaunchSpace:
    """The launch space of ``kernel``; the error lists the kernels."""
    try:
        return LAUNCH_SPACES[kernel]
    except KeyError:
        raise LaunchConfigError.of(kernel, None, kernel,
                                f"is not a kernel; kernels: {list(LAUNCH_SPACES)}") from None


# --------------------------------------------------------------------------- launch parameters in force
# The one place with module state: what configure() set, and what each launch resolved it to.

_ACTIVE: dict[str, dict[str, int]] = {k: {} for k in LAUNCH_SPACES}
_RESOLVED: dict[tuple[str, tuple[tuple[str, int], ...]], dict[str, int]] = {}


def configure(kernels_cfg: Mapping[str, Mapping[str, int]] | None) -> dict[str, dict[str, int]]:
    """Set the launch parameters of each kernel from ``loongforge.compute_domain.kernels``.

    Kernels and parameters left out use their shape-dependent defaults. Everything is
    checked before anything changes (unknown kernel or parameter, shape-independent
    constraints); shape-dependent constraints are checked at launch. Returns the
    parameters now set, per kernel.
    """
    new: dict[str, dict[str, int]] = {k: {} for k in LAUNCH_SPACES}
    for kernel, params in (kernels_cfg or {}).items():
        space = get_space(kernel)
        if not isinstance(params, Mapping):
            raise LaunchConfigError.of(kernel, None, params, "must be a mapping of launch parameter -> int")
        space.validate(params)
        new[kernel] = {str(k): int(v) for k, v in params.items()}
    _ACTIVE.clear()
    _ACTIVE.update(new)
    _RESOLVED.clear()
    return active_config()


def reset() -> None:
    """Back to every kernel's defaults (and an empty launch record)."""
    configure({})


def active_config() -> dict[str, dict[str, int]]:
    """The parameters set by :func:`configure` (kernels not set map to {})."""
    return {k: dict(v) for k, v in _ACTIVE.items()}


def launch_params(kernel: str, shape: Shape) -> dict[str, int]:
    """The full launch parameters of ``kernel`` at ``shape``: configured values over defaults, validated.

    Raises :class:`LaunchConfigError` before launch when the configured values do
    not fit this shape. Results are cached per shape and kept for :func:`launch_record`.
    """
    key = (kernel, tuple((k, int(shape[k])) for k in sorted(shape)))  # sorted by name: traceable by dynamo
    hit = _RESOLVED.get(key)
    if hit is None:
        hit = _RESOLVED[key] = get_space(kernel).resolve(_ACTIVE[kernel], shape)
    return hit


def launch_record() -> list[dict[str, Any]]:
    """What was launched since the last :func:`configure`: one dict per kernel and shape,
    ``{"kernel": ..., <dims>: ..., <params>: ..., "configured": [params set in the config]}``."""
    out = []
    for (kernel, shape), params in sorted(_RESOLVED.items()):
        out.append({"kernel": kernel, **dict(shape), **params, "configured": sorted(_ACTIVE[kernel])})
    return out


@contextmanager
def using(kernels_cfg: Mapping[str, Mapping[str, int]]) -> Iterator[None]:
    """Run with other launch parameters (benchmark sweeps, tests), then restore the previous ones."""
    before = active_config()
    configure(kernels_cfg)
    try:
        yield
    finally:
        configure(before)
