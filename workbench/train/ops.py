"""The one switch point for fused ops: op name -> backend name -> callable.

The model calls the callables of an :class:`OpSet` built by :func:`resolve` from a mapping such as
``{"rmsnorm": "triton", "loss": "torch"}``; ops left out use the ``"torch"`` backends defined here. The
``"triton"`` ones live in ``kernels`` (``kernels.TRITON_OPS``), registered the first time one is asked for, as is
the loss's ``"fp8"`` (``workbench.train.fp8_linear``, chosen by ``compute_domain.fp8_head``).
docs/training.md lists the calling conventions every backend of an op follows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from workbench.vocab import VOCAB_ALIGN, padded_vocab

__all__ = [
    "OPS",
    "OP_NAMES",
    "OpSet",
    "VOCAB_ALIGN",
    "linear_cross_entropy_torch",
    "padded_vocab",
    "register",
    "resolve",
    "rms_norm_add_torch",
    "rms_norm_torch",
    "rope_torch",
    "swiglu_torch",
]

OP_NAMES: tuple[str, ...] = ("rmsnorm", "swiglu", "rope", "loss")
"""The switchable ops, in the order of :class:`OpSet`'s fields."""


# ---------------------------------------------------------------------------
# Reference torch implementations
# ---------------------------------------------------------------------------


def rms_norm_torch(
    x_BTD: torch.Tensor, weight_D: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32, cast to ``out_dtype`` (default: ``x``'s dtype)."""
    x_f = x_BTD.float()
    inv_rms = torch.rsqrt(x_f.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x_f * inv_rms * weight_D.float()).to(out_dtype or x_BTD.dtype)


def rms_norm_add_torch(
    x_BTD: torch.Tensor, residual_BTD: torch.Tensor, weight_D: torch.Tensor, eps: float,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual; (rms_norm(s), s)``: the unfused reference of the fused residual add + norm."""
    s_BTD = x_BTD + residual_BTD
    return rms_norm_torch(s_BTD, weight_D, eps, out_dtype), s_BTD


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: ``silu(gate) * up``."""
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    # HF Llama convention: the head dim is split in two halves, not interleaved pairs.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_torch(
    q_BHTd: torch.Tensor,
    k_BKTd: torch.Tensor,
    cos_BTd: torch.Tensor,
    sin_BTd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k (rotate-half convention of HF Llama).

    ``cos``/``sin`` hold ``cat(freqs, freqs)`` per position, already gathered by
    position id (so packed documents whose positions restart are handled by the
    caller). The rotation is computed in float32 and cast back to each input's
    dtype.
    """
    cos_B1Td = cos_BTd.float().unsqueeze(1)  # broadcast over heads
    sin_B1Td = sin_BTd.float().unsqueeze(1)
    q_f, k_f = q_BHTd.float(), k_BKTd.float()
    q_out = q_f * cos_B1Td + _rotate_half(q_f) * sin_B1Td
    k_out = k_f * cos_B1Td + _rotate_half(k_f) * sin_B1Td
    return q_out.to(q_BHTd.dtype), k_out.to(k_BKTd.dtype)


_IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def linear_cross_entropy_torch(
    h_ND: torch.Tensor,
    weight_VD: torch.Tensor,
    labels_N: torch.Tensor,
    mask_N: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LM-head matmul + cross-entropy, summed over unmasked positions.

    ``logits = h @ weight.T`` in the compute dtype (that of ``h``, or autocast's),
    cross-entropy in float32. Masked positions are ignored whatever their label
    holds (a padding id outside the vocab is fine). This reference materialises
    the N x V logits; a fused kernel registered for ``"loss"`` need not.

    Returns ``(loss_sum, n_tokens)``: a 0-d float32 tensor and a 0-d int64 tensor.
    """
    mask_N = mask_N.bool()
    V = weight_VD.shape[0]
    Vp = padded_vocab(V)
    if Vp != V:
        # zero rows up to a multiple of 64: the logits' rows are then 16-byte aligned, which cuBLAS needs for its
        # fast kernels (5-7x on an H200 at V = 50,257: docs/kernel-notes.md);
        # the padded columns are sliced off before the softmax, so the loss and gradients are unchanged
        logits_NV = F.linear(h_ND, F.pad(weight_VD, (0, 0, 0, Vp - V)))[:, :V]
    else:
        logits_NV = F.linear(h_ND, weight_VD)
    labels_N = labels_N.long().masked_fill(~mask_N, _IGNORE_INDEX)
    loss_sum = F.cross_entropy(
        logits_NV.float(), labels_N, ignore_index=_IGNORE_INDEX, reduction="sum"
    )
    return loss_sum, mask_N.sum()


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

OPS: dict[str, dict[str, Callable]] = {
    "rmsnorm": {"torch": rms_norm_torch},
    "rmsnorm_add": {"torch": rms_norm_add_torch},  # follows the rmsnorm backend (not in OP_NAMES)
    "swiglu": {"torch": swiglu_torch},
    "rope": {"torch": rope_torch},
    "loss": {"torch": linear_cross_entropy_torch},
}
"""op name -> backend name -> callable. Extend it with :func:`register`."""


def _register_triton() -> None:
    """Register ``kernels.TRITON_OPS`` as the ``"triton"`` backends, once (importing ``kernels`` imports Triton)."""
    if all("triton" in OPS[op] for op in (*OP_NAMES, "rmsnorm_add")):
        return
    kernels = importlib.import_module("kernels")
    for op, fn in kernels.TRITON_OPS.items():
        OPS[op].setdefault("triton", fn)


def register(op: str, backend: str, fn: Callable) -> None:
    """Register ``fn`` as ``backend`` for ``op``; registering again replaces it."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {sorted(OPS)}")
    if not callable(fn):
        raise TypeError(f"backend {backend!r} for op {op!r} is not callable: {fn!r}")
    OPS[op][backend] = fn


@dataclass(frozen=True)
class OpSet:
    """The callables the model uses for each switchable op."""

    rmsnorm: Callable = rms_norm_torch
    """``(x_BTD, weight_D, eps, out_dtype=None) -> y_BTD``"""
    swiglu: Callable = swiglu_torch
    """``(gate, up) -> silu(gate) * up``"""
    rope: Callable = rope_torch
    """``(q_BHTd, k_BKTd, cos_BTd, sin_BTd) -> (q_BHTd, k_BKTd)``"""
    loss: Callable = linear_cross_entropy_torch
    """``(h_ND, weight_VD, labels_N, mask_N) -> (loss_sum, n_tokens)``"""
    rmsnorm_add: Callable | None = None
    """``(x_BTD, residual_BTD, weight_D, eps, out_dtype=None) -> (y_BTD, s_BTD)`` when every residual add runs
    inside the norm after it; None: add, then ``rmsnorm``."""
    backends: Mapping[str, str] = field(
        default_factory=lambda: {op: "torch" for op in OP_NAMES}, hash=False
    )
    """op name -> backend name chosen, to record with results."""


def resolve(ops: Mapping[str, str] | None = None, *, fused_residual_norm: bool = False) -> OpSet:
    """Build an :class:`OpSet` from ``{op: backend}``; unnamed ops use ``"torch"``.

    ``fused_residual_norm``: every residual add runs inside the norm that follows it (``rmsnorm_add`` of the
    ``rmsnorm`` backend): with the Triton backend one kernel reads x and the residual once instead of an add
    and a norm; with the torch backend the same add and norm as unfused.

    Raises ``ValueError`` naming the op and its registered backends when a
    backend is not registered, or
    naming the known ops when an op is unknown.
    """
    ops = dict(ops or {})
    unknown = sorted(set(ops) - set(OP_NAMES))
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; ops: {list(OP_NAMES)}")
    chosen = {op: ops.get(op, "torch") for op in OP_NAMES}
    if "triton" in chosen.values() or (fused_residual_norm and chosen["rmsnorm"] == "triton"):
        _register_triton()
    if chosen["loss"] == "fp8" and "fp8" not in OPS["loss"]:  # compute_domain.fp8_head (imports the FP8 casts)
        OPS["loss"]["fp8"] = importlib.import_module("workbench.train.fp8_linear").linear_cross_entropy_fp8
    fns = {}
    for op, backend in chosen.items():
        available = OPS[op]
        if backend not in available:
            raise ValueError(f"op {op!r} has no backend {backend!r}; available: {sorted(available)}")
        fns[op] = available[backend]
    add = None
    if fused_residual_norm:
        add = OPS["rmsnorm_add"].get(chosen["rmsnorm"])
        if add is None:
            raise ValueError(f"op 'rmsnorm' backend {chosen['rmsnorm']!r} has no fused residual add; available: "
                             f"{sorted(OPS['rmsnorm_add'])}")
    return OpSet(**fns, rmsnorm_add=add, backends=chosen)
