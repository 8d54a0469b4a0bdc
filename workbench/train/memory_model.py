"""Peak device memory of a training config, predicted before it runs.

The peak of a step is the persistent state plus what the forward saves for the backward, plus the largest
transient on top of it:

* **State**, 16 bytes a parameter: fp32 weights, fp32 gradients and AdamW's two fp32 moments (autocast keeps
  the weights in fp32; FP8 casts them per step and stores nothing extra).
* **Saved activations**, per token and decoder block, under bf16 autocast (D hidden, F intermediate, K the
  key/value width):

  - the fp32 residual stream into each of the two norms: 2 x 4D;
  - the two norm outputs, bf16: 2 x 2D;
  - RoPE'd q and k, and v, bf16, for the attention backward: 2 x (D + 2K);
  - the attention output, bf16: 2D;
  - the gate and up projections, bf16, for the SwiGLU backward, and its output: 3 x 2F.

  That is 16D + 4K + 6F bytes. FP8 saves 4D + 3F/2 bytes fewer, a measured figure (16.6 KB a token and block
  on gr00t-n1.6, bf16 against FP8 tensorwise at micro-batch 16): the FP8 copies of the four Linear inputs (both
  norm outputs, the attention output, the SwiGLU output) replace their bf16 ones, 3D + F of it, and Inductor
  recomputes the rest from what it keeps. The Triton RMSNorm also keeps its bf16 output for its own backward:
  2 x 2D bytes more. Without autocast (fp32 on the CPU) every saved value takes twice the bytes.
* **Checkpointed blocks** keep only their fp32 input (4D a token) and recompute the rest in the backward, so one
  block's activations come back at a time.
* **The loss**: the torch loss op materialises the logits of a micro-batch, bf16, kept for the backward, and
  their fp32 gradient in it (6 bytes a logit, over the vocabulary padded to a multiple of 64); the fused LM head
  + cross-entropy (the ``triton`` loss) works in row chunks and keeps none of it: the fused loss's saving.
* **Working set**: the backward of one block holds its activation gradients while the block's saved tensors are
  still alive: one more block's activations.

It ignores the allocator's rounding and fragmentation (the gap between allocated and reserved), NCCL buffers and
cuBLAS/cuDNN workspaces. Measured on one H200 (gr00t-n1.6, 2,048-token rows, five configs of the 2026-12-01 study
and benchmarks; tests/test_memory_model.py holds them), it is within 5% of the peak allocated memory. That
holds for bf16 and FP8 tensorwise; rowwise FP8 keeps more (a micro-batch-32 rowwise trial ran out of memory at
136 GiB allocated, where the model says 127), so the tuner only rejects what is out of reach even with the
error taken off (:func:`predicted_oom`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import Config
from workbench.train.model import ModelArgs, model_args, num_params
from workbench.vocab import padded_vocab

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
    return {"memory/predicted_peak_gib": round(pred.total / 2**30, 3), "memory/predicted": pred.as_gib()}


def predicted_oom(cfg: Config, gpu_memory_gib: float | None) -> str:
    """Why ``cfg`` cannot fit a GPU of ``gpu_memory_gib``, or '' when it may (or the device is not a GPU): the
    prediction less :data:`MODEL_ERROR` is above the memory the process may use
    (``hardware.memory_fraction_limit`` of the device). The tuner records such a trial as an ``oom`` without
    launching it."""
    if not gpu_memory_gib or cfg.hardware.device == "cpu":
        return ""
    predicted = predict_peak(cfg).total / 2**30
    allowed = gpu_memory_gib * cfg.hardware.memory_fraction_limit
    if predicted * (1 - MODEL_ERROR) <= allowed:
        return ""
    return (f"the memory model predicts a peak of {predicted:.1f} GiB (within {MODEL_ERROR:.0%}), over the "
            f"{allowed:.1f} GiB a trial may use (hardware.memory_fraction_limit "
            f"{cfg.hardware.memory_fraction_limit:g} of {gpu_memory_gib:.1f} GiB); not launched")
