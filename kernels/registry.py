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

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# what a launch space is lives in _space.py; its names stay importable from here
from kernels._space import (MAX_NUM_STAGES, MAX_TILE_NUMEL, NUM_WARPS_ALLOWED, LaunchConfigError, LaunchParam,
                            LaunchSpace, Shape, between, int_in, next_pow2, per_thread, pow2_between)

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

KERNEL_OF_OP: dict[str, str] = {"rmsnorm": "rmsnorm", "swiglu": "swiglu", "rope": "rope", "loss": "fused_linear_ce"}
"""Op name (``workbench.train.ops.OP_NAMES``) -> the kernel that implements its ``triton`` backend."""


_NUM_WARPS = dict(name="num_warps", check=int_in(NUM_WARPS_ALLOWED),
                  doc="warps per program (32 threads each)")
_NUM_STAGES = dict(name="num_stages", check=between(1, MAX_NUM_STAGES),
                   doc="software-pipelining stages of the kernel's loop")


# ---- rmsnorm: one-pass, a tile of block_rows x block_size holds whole rows


def _rms_tile_warps(numel: int) -> int:
    # Liger-Kernel's calculate_settings thresholds (by tile size), a starting point for kernels_bench.
    return 32 if numel >= 32768 else 16 if numel >= 8192 else 8 if numel >= 2048 else 4


def _rms_default_rows(s: Shape) -> int:
    # ~4K elements per tile: enough work per program for small hidden sizes, one row from 4,096 up.
    return max(1, min(16, 4096 // next_pow2(s["hidden"])))


def _rms_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    out = []
    for rows, warps in (("block_rows", "num_warps"), ("bwd_block_rows", "bwd_num_warps")):
        if rows in p and "block_size" in p and warps in p:
            why = per_thread(p[rows] * p["block_size"], p[warps])
            if why:
                out.append((rows, f"with block_size={p['block_size']} and {warps}={p[warps]} {why}"))
    return out


def _rms_default_warps(s: Shape) -> int:
    return _rms_tile_warps(_rms_default_rows(s) * next_pow2(s["hidden"]))


# The forward's defaults: from a row of 2,048 up, one row per program in two passes over chunks of half the row
# (at most 2,048 columns), 4 elements (one 16-byte fp32 access) a thread; from a tile of 1,024 columns up to a row
# of 2,047, one pass, one row per program, 4 warps; below, several rows a program of 4 warps (4 rows at a tile of
# 512 columns, 16 at 256 and below). The measurements behind each: docs/kernel-notes.md, RMSNorm.
def _rms_fwd_split(s: Shape) -> bool:
    return s["hidden"] >= 2048


def _rms_fwd_default_rows(s: Shape) -> int:
    tile = next_pow2(s["hidden"])
    return 1 if tile >= 1024 else 4 if tile == 512 else 16


def _rms_fwd_default_block(s: Shape) -> int:
    # chunks of at most 2,048 columns (one of the candidates) above a row of 4,096: not measured there
    return min(2048, next_pow2(s["hidden"]) // 2) if _rms_fwd_split(s) else next_pow2(s["hidden"])


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
                    check=pow2_between(1, 256), candidates=lambda s: (1, 2, 4, 8, 16),
                    default=_rms_fwd_default_rows),
        LaunchParam(name="block_size", doc="columns per tile: the whole hidden size, padded to a power of two",
                    check=pow2_between(1, MAX_TILE_NUMEL),
                    shape_check=lambda v, s: None if v >= s["hidden"] else
                    f"must be a power of two >= the hidden size {s['hidden']} (the one-pass kernel holds a whole "
                    f"row in one tile)",
                    candidates=lambda s: (next_pow2(s["hidden"]),), default=lambda s: next_pow2(s["hidden"])),
        LaunchParam(name="fwd_block_size", doc="forward: columns per loop step; below the hidden size the "
                    "forward reads each row twice (the sum of squares, then from L2 to normalise), at or above it "
                    "one pass with the block_size tile", check=pow2_between(1, MAX_TILE_NUMEL), phase="fwd",
                    # inductor's fp32 forward at hidden 4,096: two passes of 2,048 columns (docs/kernel-notes.md)
                    candidates=lambda s: tuple(sorted({v for v in (512, 1024, 2048) if v < s["hidden"]}
                                                      | {next_pow2(s["hidden"])})),
                    default=_rms_fwd_default_block),
        LaunchParam(name="fwd_passes", doc="forward: 2 reads each row twice (the sum of squares, then from L2 to "
                    "normalise) even where one fwd_block_size chunk holds the row, as inductor's forward does; 1 "
                    "reads it once where the chunk holds it (a chunk narrower than the row always takes two)",
                    check=int_in((1, 2)), phase="fwd", candidates=lambda s: (1, 2),
                    # default 1: two passes over a whole row are slower with bf16 out (docs/kernel-notes.md, RMSNorm)
                    default=lambda s: 1),
        LaunchParam(**{**_NUM_WARPS, "name": "bwd_num_warps", "doc": "backward: warps per program"}, phase="bwd",
                    candidates=lambda s: (4, 8, 16), default=_rms_default_warps),
        LaunchParam(name="bwd_block_rows", doc="backward: rows per loop step", phase="bwd",
                    check=pow2_between(1, 256), candidates=lambda s: (1, 2, 4, 8), default=_rms_default_rows),
        LaunchParam(name="programs_per_sm", doc="backward: persistent programs per SM (each loops over row tiles "
                    "and keeps its partial dw in registers)", check=between(1, 32), phase="bwd",
                    candidates=lambda s: (1, 2, 4, 8),
                    # Liger-Kernel runs one per SM; two keep more loads in flight per SM at the cost of twice
                    # the partial-dw rows (2 x SMs x D fp32, small next to the M x D tensors)
                    default=lambda s: 2),
        LaunchParam(name="bwd_tiles_in_flight", doc="backward: row tiles whose loads are in flight per program; 2 "
                    "loads the next tile before working on the current one (its loads then overlap the reduction "
                    "and the stores, for twice the input registers)", check=int_in((1, 2)), phase="bwd",
                    candidates=lambda s: (1, 2),
                    # 2 up to a row of 2,048, 1 above it, where the second tile's registers cost more than its
                    # loads hide (docs/kernel-notes.md, RMSNorm)
                    default=lambda s: 2 if next_pow2(s["hidden"]) <= 2048 else 1),
    ),
    joint=_rms_joint,
)

# ---- swiglu: elementwise over the flattened tensors


def _block_size_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    """A tile of ``block_size`` elements spread over ``num_warps`` warps within the spill guard (SwiGLU, the amax)."""
    if "block_size" in p and "num_warps" in p:
        why = per_thread(p["block_size"], p["num_warps"])
        if why:
            return [("block_size", why)]
    return []


SWIGLU = LaunchSpace(
    kernel="swiglu", op="swiglu", dims=("numel",),
    doc="silu(gate) * up, forward and backward, elementwise (no loop: num_stages does not apply).",
    params=(
        LaunchParam(**_NUM_WARPS, candidates=lambda s: (2, 4, 8, 16), default=lambda s: 8),
        LaunchParam(name="block_size", doc="elements per program", check=pow2_between(32, 1 << 16),
                    candidates=lambda s: (512, 1024, 2048, 4096, 8192), default=lambda s: 2048),
    ),
    joint=_block_size_joint,
)

# ---- rope: one program per block of tokens, a loop over blocks of heads


def _rope_half(s: Shape) -> int:
    return next_pow2(max(1, s["head_dim"] // 2))


def _rope_default_heads(s: Shape) -> int:
    # ~1K elements per half-tile (32 heads of head dim 64), capped at the head count.
    return max(1, min(next_pow2(max(s["q_heads"], s["k_heads"])), 1024 // _rope_half(s)))


def _rope_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if s is not None and "block_h" in p and "num_warps" in p:
        block_t = p.get("block_t", 1)
        why = per_thread(p["block_h"] * block_t * _rope_half(s), p["num_warps"])
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
        LaunchParam(name="block_h", doc="heads per loop step", check=pow2_between(1, 256),
                    candidates=lambda s: tuple(h for h in (1, 2, 4, 8, 16, 32)
                                               if h <= next_pow2(max(s["q_heads"], s["k_heads"]))),
                    default=_rope_default_heads),
        LaunchParam(name="block_t", doc="tokens per program (its heads' tiles span them)",
                    check=pow2_between(1, 64), candidates=lambda s: (1, 2, 4, 8), default=lambda s: 1),
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
    return max(256, min(8192, cap, next_pow2(s["rows"])))


def _ce_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if "block_v" in p and "num_warps" in p:
        why = per_thread(p["block_v"], p["num_warps"])
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
                    check=pow2_between(32, 1 << 17), candidates=lambda s: (2048, 4096, 8192, 16384),
                    default=lambda s: 4096),
        LaunchParam(name="chunk_size", doc="rows whose logits are materialised at once (memory vs matmul size)",
                    check=between(1, 1 << 20), candidates=lambda s: (1024, 2048, 4096, 8192),
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
        LaunchParam(name="block_size", doc="elements per loop step of a program", check=pow2_between(256, 1 << 16),
                    candidates=lambda s: (1024, 2048, 4096, 8192), default=lambda s: 8192),
        LaunchParam(name="programs_per_sm", doc="persistent programs per SM", check=between(1, 32),
                    candidates=lambda s: (2, 4, 8, 16), default=lambda s: 8),
    ),
    joint=_block_size_joint,  # a block_size tile per program, as SwiGLU's
)


def _cast_joint(p: Mapping[str, int], s: Shape | None) -> list[tuple[str, str]]:
    if "block_m" in p and "block_n" in p and "num_warps" in p:
        why = per_thread(p["block_m"] * p["block_n"], p["num_warps"])
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
        LaunchParam(name="block_m", doc="rows per tile", check=pow2_between(16, 256),
                    candidates=lambda s: (32, 64, 128), default=lambda s: 64),
        LaunchParam(name="block_n", doc="columns per tile", check=pow2_between(16, 256),
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
