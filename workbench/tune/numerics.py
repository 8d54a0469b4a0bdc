"""The numerics guard: a knob that changes the loop's numbers (FP8) must not win on speed alone.

A trial that sets a numerics knob (``Knob.numerics``) off its base value is compared
with a reference run on the same model init, the same data and the same optimizer
steps, step by step (``step_distance``): at each measured step, the candidate's loss's
distance to the nearest reference run's loss at that step, relative to theirs; the guard's
distance is the median over the steps, and it must lie within the tolerance (below), else
the trial fails with kind ``numerics``. Where the reference's per-step losses are not stored
(a study from before they were), the runs' median step losses (``run_loss``) are compared.

The reference is the trial's *twin*: its own config with every numerics knob at its
base value. When the twin feeds the model the same data as the base config
(``data_key``: same corpus, seeds, global batch and packing, and for bucketed records
the same micro-batch and bucket width, which decide how records group into batches),
the baseline repeats already measured it, with no extra run. Otherwise the twin is run once per data path (cached
by its ``data_key``: a later trial on the same tokens is checked against it), unless a finished search trial ran the
twin's very config (its config hash) and measured at least the candidate's steps: its stored step losses are the
twin's (``Measurer.searched_twin``). A twin is run only for a trial that
can be validated: one whose search throughput is above the baseline repeats' median (``validation.candidates``
passes over the others, so their numbers decide nothing); a slower trial keeps its status, its check is the trial
attr ``numerics_skipped`` (why), and the first faster trial on its tokens runs the twin.

A trial's steps are early training, where the loss is noisy:
- **Spikes.** One step's loss jumps and falls back, at a step no config predicts. On one H200 (gr00t-n1.6,
  learning rate warming up, ``benchmarks/results/convergence.csv`` run ``numerics``), bf16 went 8.54 -> 11.29 ->
  8.22 at steps 7-9, and FP8 runs of the same data spiked at other steps. A window's mean carries a spike whole,
  and so can the median of a run's steps: the loss falls about 0.3 a step there, so a spike that moves the
  median's rank moves it by a step's fall (FP8 tensorwise on one H200, run ``w1h-h200``: 4.95% off that way,
  its last step 0.6% from the nearest base run). Paired step by step, a spike is one step of six.
- **FP8 trains a little behind early.** Step by step, six FP8 runs of that H200 data lay 1.8-2.8% from the
  nearest bf16 run (median over steps 3-8), and three studies' FP8 trials 1.2-1.95%; a run that does not learn
  past its first steps, one whose loss rises and one that diverges lay 12.8%, 7.2% and infinitely far. The
  default tolerance, 4%, lies between; the 0.41% after 500 steps (benchmarks/README.md) is a later step's.
- **Runs of one config need not agree:** bf16 kernels with atomics (attention's backward) are not bit-reproducible,
  and early in training a tiny difference grows (two baseline runs of gr00t-n1.6 ended their 8th step at 8.68 and
  10.46). A candidate is measured against what the reference config itself does: its distance is to the nearest of
  the reference runs' losses, relative to their median, and the tolerance is the protocol's or
  ``NOISE_FACTOR`` times the baseline repeats' own spread (``spread``), whichever is larger. What the base config
  does from run to run, the guard cannot tell from a change of numerics.
- **Draws.** The VLA's flow-matching loss draws its time and noise inside the step, each sample's from its own
  key (the loader's, from the data seed, the epoch and the record), so a sample draws the same numbers at any
  micro-batch, eager, compiled or captured (tests/train/test_vla.py): the baseline repeats serve a VLA trial at
  another micro-batch or compile setting, as they serve the language model's.
- **One reference run.** A reference run whose spike falls at another step than the candidate's puts two or three of
  six steps off: the median then lands on a spike. On one H200 (``study.csv`` run ``w6-h200``), FP8 tensorwise at
  micro-batch 8 lay 2.0, 1.8, 1.2, 6.3, 6.2 and 8.3% from the one baseline repeat at steps 3-8 (the candidate spiked
  at step 6, the base at step 8): 4.08% off, past the 4% tolerance, where a later trial of the same FP8 passed at
  2.6%; against that repeat and the 2026-12-05 study's (same config, same data) it lies 1.90% off. So a check that
  fails against fewer than ``REFERENCE_RUNS`` runs of its reference, with every candidate step finite and a candidate
  validation could pass, runs the reference once more on the same data and is made again against the nearest of its
  runs (the study attr ``numerics_reruns``, by ``data_key``; once a data path, and every later check uses it). A
  broken run stays broken against two runs; the tolerance is still widened by the baseline repeats' spread alone.
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
from workbench.train.workload import is_vla
from workbench.vocab import LOSS_MEAN, LOSS_STEPS

__all__ = ["NOISE_FACTOR", "REFERENCE_RUNS", "NumericsCheck", "check_loss", "data_key", "run_loss", "spread",
           "step_distance", "stored_losses", "window_losses"]

NOISE_FACTOR = 2.0
"""The tolerance is at least this many times the baseline repeats' spread of the guard's loss."""

REFERENCE_RUNS = 2
"""A failed check against fewer runs of its reference is made again after one more (the module doc, "One reference
run")."""


def data_key(cfg: Config) -> str:
    """A hash of what decides the tokens each optimizer step trains on (for the VLA, also its flow loss's noise,
    which the data seed decides: the module doc's "Draws"), and the model's initial weights."""
    d, t = cfg.data, cfg.training
    key: dict[str, Any] = {
        "corpus": d.loongbin_dir, "seq_len": d.seq_len, "min_len": d.min_len, "data_seed": d.seed,
        "shuffle_window_frames": d.shuffle_window_frames, "packing": d.packing,
        "global_batch": cfg.effective_global_batch_size(), "gpus": cfg.hardware.gpus, "model_seed": t.seed,
        "model": [cfg.model.name, cfg.model.config_path],
    }
    # token records group into batches by bucket, micro-batch by micro-batch (the VLA's one bucket takes records in
    # the plan's order at any micro-batch)
    if d.packing == "bucket" and not is_vla(cfg):
        key.update(micro_batch=d.micro_batch_size, bucket_width=d.bucket_width)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class NumericsCheck:
    """The outcome of one guard check (stored with the trial and in the exported provenance)."""

    passed: bool
    loss: float
    """The candidate's guard loss: the median of its measured steps' losses."""
    reference_loss: float
    """The reference's (median over its runs)."""
    rel_diff: float
    """The guard's distance: step by step (``paired``), the median over the steps of each step's distance to the
    nearest reference run's loss there; else from ``loss`` to the nearest reference run's, over |reference_loss|."""
    tolerance: float
    """The tolerance applied: ``protocol_tolerance`` or ``NOISE_FACTOR`` x ``noise``, whichever is larger."""
    reference: str
    """``baseline`` (the baseline repeats) or ``twin`` (the candidate with its numerics knobs at base)."""
    reference_runs: int
    protocol_tolerance: float = 0.0
    """``protocol.numerics_tolerance``."""
    noise: float = 0.0
    """The baseline repeats' spread of the guard's loss (``spread``); 0 with one repeat."""
    paired: bool = False
    """Whether ``rel_diff`` was measured step by step (``step_distance``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reason(self) -> str:
        widened = (f" ({NOISE_FACTOR:g}x the base's run-to-run spread of {self.noise:.2%}; the protocol's is "
                   f"{self.protocol_tolerance:.2%})" if self.tolerance > self.protocol_tolerance else "")
        if self.paired:
            nearest = " the nearest of its runs" if self.reference_runs > 1 else ""
            return (f"median step loss {self.loss:.5f} vs {self.reference_loss:.5f} of the {self.reference} on the "
                    f"same data; step by step {self.rel_diff:.2%} off{nearest} (the median over the steps), "
                    f"tolerance {self.tolerance:.2%}{widened}")
        runs = f" (median of {self.reference_runs} runs; distance to the nearest)" if self.reference_runs > 1 else ""
        return (f"median step loss {self.loss:.5f} vs {self.reference_loss:.5f} of the {self.reference}{runs} on the "
                f"same data: {self.rel_diff:.2%} off, tolerance {self.tolerance:.2%}{widened}")


def check_loss(loss: float | None, reference: Sequence[float], tolerance: float, *, source: str,
               noise: float = 0.0, distance: float | None = None) -> NumericsCheck:
    """Compare a candidate's guard loss (its median step loss) with the reference runs' (their median): by
    ``distance`` where given (``step_distance``, step by step), else by the distance from ``loss`` to the nearest
    reference run's; the tolerance is ``tolerance`` or ``NOISE_FACTOR`` x ``noise`` (the baseline repeats'
    spread), whichever is larger."""
    refs = [float(x) for x in reference if x is not None and math.isfinite(x)]
    if not refs:
        raise ValueError(f"numerics guard: no finite reference loss from the {source}")
    ref = statistics.median(refs)
    noise = noise if math.isfinite(noise) and noise > 0 else 0.0
    tol = max(tolerance, NOISE_FACTOR * noise)
    paired = distance is not None
    if loss is None or not math.isfinite(loss):
        return NumericsCheck(False, float("nan") if loss is None else float(loss), ref, math.inf, tol,
                             source, len(refs), tolerance, noise, paired)
    if paired:
        rel = float(distance)
    else:
        rel = min(abs(loss - r) for r in refs) / abs(ref) if ref else math.inf
    return NumericsCheck(rel <= tol, float(loss), ref, rel, tol, source, len(refs), tolerance, noise, paired)


def step_distance(candidate: Sequence[float], references: Sequence[Sequence[float | str]]) -> float | None:
    """The guard's distance step by step: at each of the ``candidate``'s measured steps, its loss's distance to the
    nearest reference run's loss at that step, over the reference runs' median there; the median over the steps.
    inf where a candidate step is not finite. None where a reference run holds fewer steps, or a step has no
    finite reference loss: the runs' median step losses are compared instead. ``references``: each run's measured
    step losses as the study stores them (``stored_losses``)."""
    if not candidate or not references or any(len(r) < len(candidate) for r in references):
        return None
    per_step = []
    for i, x in enumerate(candidate):
        at = [v for v in (_loss(r[i]) for r in references) if math.isfinite(v)]
        if not at:
            return None
        if not math.isfinite(x):
            return math.inf
        med = statistics.median(at)
        per_step.append(min(abs(x - v) for v in at) / abs(med) if med else math.inf)
    return float(statistics.median(per_step))


def _loss(value: float | str) -> float:
    """A stored step loss as a number (JSON holds a non-finite one as its text)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def spread(losses: Sequence[float | None]) -> float:
    """The run-to-run spread of runs' guard losses: (max - min) / median over the finite ones; 0 with fewer than
    two."""
    xs = [float(x) for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
    if len(xs) < 2:
        return 0.0
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / abs(med) if med else math.inf


def window_losses(window: Mapping[str, Any]) -> list[float]:
    """The step losses of one measured window: its ``LOSS_STEPS``, or its ``LOSS_MEAN`` alone where a loop of one's
    own writes no per-step losses. A non-finite loss stays in (as NaN), so a diverged run fails the guard."""
    steps = window.get(LOSS_STEPS)
    if isinstance(steps, list) and steps:
        values = steps
    else:
        mean = window.get(LOSS_MEAN)
        values = [] if mean is None else [mean]
    out = []
    for v in values:
        try:
            out.append(float(v))  # JSON writes a non-finite loss as a string ("nan", "inf")
        except (TypeError, ValueError):
            continue
    return out


def run_loss(losses: Sequence[float]) -> float | None:
    """The guard's loss of a run from its measured steps' losses (``window_losses`` of each measured window, in
    order): their median; NaN where any is not finite; None where there are none."""
    if not losses:
        return None
    if any(not math.isfinite(x) for x in losses):
        return math.nan
    return float(statistics.median(losses))


def stored_losses(losses: Sequence[float]) -> list[float | str]:
    """A run's measured step losses as the study stores them (the trial's ``step_losses``, the study's
    ``baseline_step_losses`` and ``numerics_twin_steps``), so that the guard can be replayed on them: rounded to 5
    decimals, a non-finite one as its text (JSON has no NaN)."""
    return [round(float(x), 5) if math.isfinite(x) else str(x) for x in losses]
