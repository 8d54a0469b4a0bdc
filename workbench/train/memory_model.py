"""Peak device memory of a training config, predicted before it runs.

State (16 bytes a parameter), the activations each block saves, the loss's logits and one block's working set;
within 5% of the measured peak on the H200 configs in tests/train/test_memory_model.py. docs/memory.md gives the
byte counts and where the model does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import Config
from workbench.train.hf import model_args
from workbench.train.model import ModelArgs, num_params
from workbench.train.vla import VLA_PRESETS
from workbench.vocab import PREDICTED_PEAK_GIB, padded_vocab

__all__ = ["MODEL_ERROR", "MemoryPrediction", "predict_peak", "predicted_oom", "summary_fields"]

MODEL_ERROR = 0.05
"""Largest relative error of the prediction against the measured peak allocated memory (module doc)."""

_LOSS_BYTES_PER_LOGIT = 6  # bf16 logits kept for the backward, their fp32 gradient in it


@dataclass(frozen=True)
class MemoryPrediction:
    """The parts of the predicted peak, in bytes."""

    state: int
    """Weights, gradients and optimizer moments."""
    activations: int
    """What the forward of one micro-batch saves for its backward, over every block."""
    loss: int
    """The logits of the torch loss op (0 for the fused loss)."""
    working_set: int
    """One block's activations again: its backward's gradients (or its recompute when checkpointed)."""

    @property
    def total(self) -> int:
        return self.state + self.activations + self.loss + self.working_set

    def as_gib(self) -> dict[str, float]:
        out = {k: round(v / 2**30, 3) for k, v in asdict(self).items()}
        out["total"] = round(self.total / 2**30, 3)
        return out


def _block_bytes_per_token(args: ModelArgs, cfg: Config, ops: Mapping[str, str], *, autocast: bool) -> int:
    D, F = args.hidden_size, args.intermediate_size
    K = args.num_key_value_heads * args.head_dim
    b = 16 * D + 4 * K + 6 * F
    if cfg.loongforge.compute_domain.fp8 != "none":
        b -= 4 * D + 3 * F // 2
    if ops.get("rmsnorm") == "triton":
        b += 4 * D
    return b if autocast else 2 * b


def predict_peak(cfg: Config, args: ModelArgs | None = None, *, autocast: bool = True,
                 backends: Mapping[str, str] | None = None) -> MemoryPrediction:
    """The predicted peak device memory of one process training ``cfg`` (module doc; every process holds the
    whole model and optimizer). ``autocast``: bf16 autocast is on (the GPU default), else every activation is
    fp32. ``backends``: the op backends in use, when they differ from the config's (the Trainer falls back to
    torch ops on the CPU). ``args``: the model's, built from ``cfg`` when not given."""
    if args is None:
        args = model_args(cfg.model.name, cfg.model.config_path)
    ops = dict(backends) if backends is not None else cfg.loongforge.compute_domain.effective_ops()
    tokens = cfg.data.micro_batch_size * cfg.data.seq_len
    L = args.num_hidden_layers
    t = cfg.training
    # the blocks Llama.checkpointed_blocks() picks: all, none, or every N-th
    checkpointed = {"none": 0, "full": L}.get(t.activation_checkpointing,
                                              L // max(1, t.activation_checkpointing_every))
    block = _block_bytes_per_token(args, cfg, ops, autocast=autocast) * tokens
    kept_input = 4 * args.hidden_size * tokens
    activations = (L - checkpointed) * block + checkpointed * kept_input
    loss = 0
    if ops.get("loss") != "triton":
        rows = cfg.data.micro_batch_size * (cfg.data.seq_len - 1)
        loss = rows * padded_vocab(args.vocab_size) * _LOSS_BYTES_PER_LOGIT
    return MemoryPrediction(state=16 * num_params(args), activations=activations, loss=loss, working_set=block)


def summary_fields(pred: MemoryPrediction) -> dict[str, Any]:
    """The prediction as summary keys: ``memory/predicted_peak_gib`` and its parts."""
    return {PREDICTED_PEAK_GIB: round(pred.total / 2**30, 3), "memory/predicted": pred.as_gib()}


def predicted_oom(cfg: Config, gpu_memory_gib: float | None) -> str:
    """Why ``cfg`` cannot fit a GPU of ``gpu_memory_gib``, or '' when it may (or the device is not a GPU): the
    prediction less :data:`MODEL_ERROR` is above the memory the process may use
    (``hardware.memory_fraction_limit`` of the device). The tuner records such a trial as an ``oom`` without
    launching it."""
    if not gpu_memory_gib or cfg.hardware.device == "cpu" or cfg.model.name in VLA_PRESETS:  # (the LM's model)
        return ""
    predicted = predict_peak(cfg).total / 2**30
    allowed = gpu_memory_gib * cfg.hardware.memory_fraction_limit
    if predicted * (1 - MODEL_ERROR) <= allowed:
        return ""
    return (f"the memory model predicts a peak of {predicted:.1f} GiB (within {MODEL_ERROR:.0%}), over the "
            f"{allowed:.1f} GiB a trial may use (hardware.memory_fraction_limit "
            f"{cfg.hardware.memory_fraction_limit:g} of {gpu_memory_gib:.1f} GiB); not launched")
