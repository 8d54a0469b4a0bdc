"""Search spaces a study need not write by hand: ``space: auto``, and micro-batches bounded by the machine.

``space: auto`` (:func:`auto_space`) is a workload's full default space: every knob of the built-in loop that acts on
that workload, with the choices worth measuring. Knobs the detected hardware cannot act on are dropped when the study
opens, as for a written space (``knobs.drop_unsupported``). Kernel launch parameters are left to their registry
defaults (``kernels_bench.py`` sweeps them): the search would spend trials on what a kernel sweep finds in seconds.

The micro-batch is bounded by the global batch (a choice must divide the per-GPU share, so that accumulation keeps
the global batch) and, once the GPU is known, by the memory model (:func:`fit_micro_batches`): a choice that cannot
fit under any memory-saving setting of the space (checkpointing, the fused loss) is dropped, with one line saying
why. Hand-written ranges get the same check.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from workbench.config import Config, ConfigError, merge_overrides
from workbench.train.memory_model import predicted_oom
from workbench.train.workload import is_vla

__all__ = ["AUTO", "auto_space", "fit_micro_batches", "micro_batch_choices"]

AUTO = "auto"
"""The value of a study's ``space`` that asks for :func:`auto_space`."""

_MAX_MICRO_BATCH = 256
"""The largest micro-batch ``space: auto`` offers when the global batch does not bound it."""

_LM_SPACE: dict[str, list[Any]] = {
    "packing": ["fill", "bucket"],
    "bucket_width": [64, 128, 256],
    "num_workers": [1, 2, 4],
    "activation_checkpointing": ["none", "selective", "full"],
    "activation_checkpointing_every": [2, 4],
    "compile": ["none", "default"],
    "compile_scope": ["layer", "model"],
    "compile_shapes": ["static", "dynamic"],
    "fp8": ["none", "tensorwise", "rowwise"],
    "fp8_cast": ["torchao", "triton"],
    "fp8_head": [False, True],
    "graph_capture": ["none", "fwd_bwd", "fwd_bwd+optimizer"],
    "rmsnorm_backend": ["torch", "triton"],
    "swiglu_backend": ["torch", "triton"],
    "rope_backend": ["torch", "triton"],
    "loss_backend": ["torch", "triton"],
    "fused_residual_norm": [False, True],
    "expandable_segments": [False, True],
    "io_uring_entries": [32, 64, 128],
}
"""The built-in language model's default space, less the micro-batch (derived) and the overlap knobs (several
GPUs only)."""

_OVERLAP_SPACE: dict[str, list[Any]] = {"bucket_size_mb": [10.0, 25.0, 50.0, 100.0], "overlap_ratio": [0.5, 1.0]}
"""Gradient bucketing and overlap: searched with more than one GPU."""

_VLA_SPACE: dict[str, list[Any]] = {
    "compile": ["none", "default"],
    "graph_capture": ["none", "fwd_bwd", "fwd_bwd+optimizer"],
    "expandable_segments": [False, True],
    "fp8": ["none", "tensorwise"],  # the recipe measured on the VLA's blocks (fp8_modules' default)
}
"""The VLA's default space, less the micro-batch: its loop reads these knobs (studies/gr00t-n1.6-vla.yaml)."""


def micro_batch_choices(cfg: Config) -> list[int]:
    """Powers of two that divide the per-GPU share of the global batch (every one of them, from 1), or up to
    :data:`_MAX_MICRO_BATCH` without a global batch."""
    g = cfg.training.global_batch_size
    per_gpu = g // cfg.hardware.gpus if g else _MAX_MICRO_BATCH
    out, m = [], 1
    while m <= per_gpu:
        if per_gpu % m == 0:
            out.append(m)
        m *= 2
    return out


def auto_space(cfg: Config) -> dict[str, dict[str, list[Any]]]:
    """The default space of ``cfg``'s workload, as a study's ``space`` in plain data (knob -> {choices: [...]})."""
    vla = is_vla(cfg)
    table = dict(_VLA_SPACE if vla else _LM_SPACE)
    if cfg.hardware.gpus > 1 and not vla:
        table.update(_OVERLAP_SPACE)
    return {"micro_batch_size": {"choices": micro_batch_choices(cfg)}, **{k: {"choices": list(v)}
                                                                       for k, v in table.items()}}


_LEAN_KNOBS = {"activation_checkpointing": "training.activation_checkpointing",
               "loss_backend": "loongforge.compute_domain.ops.loss"}
"""Knobs whose choices change the memory model's peak: a micro-batch fits when any of their choices fits."""


def fit_micro_batches(base: Config, choices: list[int], space: Mapping[str, list[Any]],
                      gpu_memory_gib: float | None) -> tuple[list[int], str]:
    """The micro-batch ``choices`` that may fit a GPU of ``gpu_memory_gib`` by the memory model, under some setting
    of the memory-saving knobs in ``space`` (knob -> its choices), and one line naming those dropped ('' when none
    is). Without a GPU, or for a workload the model does not cover (the VLA), every choice is kept."""
    if not gpu_memory_gib or base.hardware.device == "cpu" or is_vla(base):
        return list(choices), ""
    lean = [[(key, v) for v in space[name]] for name, key in _LEAN_KNOBS.items() if name in space]
    kept, why = [], {}
    for m in choices:
        reasons = []
        for combo in itertools.product(*lean) if lean else [()]:
            try:
                cfg = merge_overrides(base, {"data.micro_batch_size": m, **dict(combo)})
            except ConfigError as e:
                reasons.append(str(e))
                continue
            reason = predicted_oom(cfg, gpu_memory_gib)
            if not reason:
                kept.append(m)
                break
            reasons.append(reason)
        else:
            why[m] = reasons[-1] if reasons else "no setting of the space accepts it"
    if not why:
        return kept, ""
    first = min(why)
    return kept, (f"micro_batch_size: dropped {sorted(why)}, which cannot fit this GPU under any memory setting of "
                  f"the space: at {first}, {why[first]}")
