"""The numerics guard: a knob that changes the loop's numbers (FP8) must not win on speed alone.

A trial that sets a numerics knob (``Knob.numerics``) off its base value is compared
with a reference run on the same model init, the same data and the same optimizer
steps: the mean loss over its last measured window must lie within
``protocol.numerics_tolerance`` (a share) of the reference's, else the trial fails
with kind ``numerics``.

The reference is the trial's *twin*: its own config with every numerics knob at its
base value. When the twin feeds the model the same data as the base config
(``data_key``: same corpus, seeds, global batch and packing, and for bucketed records
the same micro-batch and bucket width, which decide how records group into batches),
the baseline repeats already measured it, with no extra run. Otherwise the twin is run once (and cached by its
config hash).

Several reference runs of one config need not agree: bf16 kernels with atomics (attention's backward) are not
bit-reproducible, and early in training a tiny difference can grow (on one H200, two baseline runs of
gr00t-n1.6 ended their 8th step at loss 8.68 and 10.46). A candidate is measured against what the reference config
itself does: its distance is to the nearest of the reference runs' losses, relative to their median.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import Config

__all__ = ["LOSS_KEY", "NumericsCheck", "check_loss", "data_key", "window_loss"]

LOSS_KEY = "loss/mean"
"""The window metric compared: the mean training loss over the window's steps."""


def data_key(cfg: Config) -> str:
    """A hash of what decides the tokens each optimizer step trains on, and the model's initial weights."""
    d, t = cfg.data, cfg.training
    key: dict[str, Any] = {
        "corpus": d.loongbin_dir, "seq_len": d.seq_len, "min_len": d.min_len, "data_seed": d.seed,
        "shuffle_window_frames": d.shuffle_window_frames, "packing": d.packing,
        "global_batch": cfg.effective_global_batch_size(), "gpus": cfg.hardware.gpus, "model_seed": t.seed,
        "model": [cfg.model.name, cfg.model.config_path],
    }
    if d.packing == "bucket":  # records group into batches by bucket, micro-batch by micro-batch
        key.update(micro_batch=d.micro_batch_size, bucket_width=d.bucket_width)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class NumericsCheck:
    """The outcome of one guard check (stored with the trial and in the exported provenance)."""

    passed: bool
    loss: float
    """The candidate's mean loss over its last measured window."""
    reference_loss: float
    """The reference's (median over its runs)."""
    rel_diff: float
    """The distance from ``loss`` to the nearest reference run's loss, over |reference_loss|."""
    tolerance: float
    reference: str
    """``baseline`` (the baseline repeats) or ``twin`` (the candidate with its numerics knobs at base)."""
    reference_runs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reason(self) -> str:
        runs = f" (median of {self.reference_runs} runs; distance to the nearest)" if self.reference_runs > 1 else ""
        return (f"loss {self.loss:.5f} vs {self.reference_loss:.5f} of the {self.reference}{runs} on the same data: "
                f"{self.rel_diff:.2%} off, tolerance {self.tolerance:.2%}")


def check_loss(loss: float | None, reference: Sequence[float], tolerance: float, *, source: str) -> NumericsCheck:
    """Compare a candidate's last-window mean loss with the reference runs' (their median)."""
    refs = [float(x) for x in reference if x is not None and math.isfinite(x)]
    if not refs:
        raise ValueError(f"numerics guard: no finite reference loss from the {source}")
    ref = statistics.median(refs)
    if loss is None or not math.isfinite(loss):
        return NumericsCheck(False, float("nan") if loss is None else float(loss), ref, math.inf, tolerance,
                             source, len(refs))
    rel = min(abs(loss - r) for r in refs) / abs(ref) if ref else math.inf
    return NumericsCheck(rel <= tolerance, float(loss), ref, rel, tolerance, source, len(refs))


def window_loss(window: Mapping[str, Any] | None) -> float | None:
    """The guard's loss of a run: ``LOSS_KEY`` of its last measured window."""
    if not window:
        return None
    v = window.get(LOSS_KEY)
    return float(v) if isinstance(v, (int, float)) else None
