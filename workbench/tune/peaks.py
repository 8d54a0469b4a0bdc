"""Peak device memory of an untried micro-batch, from the study's own runs (the loop's measured
``memory/max_reserved_gib``), so a config that cannot fit is refused without a run where no analytic model holds
(the VLA, a loop of one's own) or where the analytic one misses what the runs show (the private pools of captured
graphs).

Configs that differ only in micro-batch (and the accumulation derived from it) form a family; within one, the peak
grows linearly with the micro-batch: state is fixed, activations scale with the samples. An untried micro-batch
above the family's largest measured one is extrapolated from its two largest, or, with one measured, from the median
slope of the families that have two. A family member that ran out of memory refuses every larger micro-batch of
it. gr00t-n1.6-vla on one H100 (2026-12-06, runs vlaw8-h100 and vlaw9-h100): micro-batch 32 under ``fwd_bwd``
capture peaked at 54.7 GiB, 16 at 43.7; 64 was extrapolated to 76.7 and ran out of memory after 45 s of device time;
with ``fwd_bwd+optimizer`` capture 32 peaked at 68.4 (62.5 with FP8), and 64 ran out of memory twice. FP8 at 64 with
``fwd_bwd`` capture, extrapolated to 71.4 from 48.8 at 32, peaked at 67.5.

A config is refused where its extrapolated peak less :data:`MARGIN` is over what a trial may hold: the device's
memory times the smaller of ``objective.memory_share_limit`` (a trial above it is infeasible and cannot win) and
``hardware.memory_fraction_limit`` (above it the process runs out of memory)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from workbench.config import Config, config_hash
from workbench.vocab import MAX_RESERVED_GIB

__all__ = ["MARGIN", "Peak", "family", "measured_refusal", "peaks"]

MARGIN = 0.05
"""The extrapolation's allowance: a peak is refused only where 95% of it is over the limit. (Against the runs in
the module doc it over-predicted FP8 at 64 by 5.8% and an uncaptured 64 by 8.5%, and under-predicted capture at 64,
which ran out of memory, by at least 3%.)"""

_PER_SAMPLE = ("data.micro_batch_size", "training.grad_accum_steps", "hardware.memory_fraction_limit")
"""Keys a family leaves out: the micro-batch, the accumulation derived from it, and the process's memory share
(the compile-ahead twins' own; it bounds the peak, it does not make it)."""


@dataclass(frozen=True)
class Peak:
    """One launched run of the study: its trial, micro-batch and measured peak (None: it ran out of memory)."""

    trial: int
    micro_batch: int
    gib: float | None


def family(cfg: Config) -> str:
    """The hash a config shares with every config that differs from it only in micro-batch."""
    return config_hash(cfg, leave_out=_PER_SAMPLE)


def peaks(trials: Iterable[FrozenTrial], config_of: Callable[[Mapping[str, Any]], Config]) -> dict[str, list[Peak]]:
    """The launched runs of ``trials`` by family: those measured to the end or screened (their peak), and those
    that ran out of memory after a launch (a refusal without a run is no measurement). ``config_of``: a trial's
    config from its params."""
    out: dict[str, list[Peak]] = {}
    for t in trials:
        status, wall = t.user_attrs.get("status"), t.user_attrs.get("wall_s")
        gib = t.user_attrs.get(MAX_RESERVED_GIB)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and status in ("ok", "pruned") \
                and isinstance(gib, (int, float)) and gib > 0:
            measured: float | None = float(gib)
        elif status == "oom" and isinstance(wall, (int, float)) and wall > 0:
            measured = None
        else:
            continue
        try:
            cfg = config_of(t.params)
        except Exception:  # noqa: BLE001 (a config the spec no longer builds says nothing of this one)
            continue
        out.setdefault(family(cfg), []).append(Peak(t.number, cfg.data.micro_batch_size, measured))
    return out


def _slope(points: list[Peak]) -> float | None:
    """GiB a sample between the family's two largest measured micro-batches; None with fewer than two."""
    by_mb: dict[int, float] = {}
    for p in points:
        if p.gib is not None:
            by_mb[p.micro_batch] = max(p.gib, by_mb.get(p.micro_batch, 0.0))
    if len(by_mb) < 2:
        return None
    (m1, g1), (m0, g0) = sorted(by_mb.items())[-2:]
    return max(0.0, (g0 - g1) / (m0 - m1))


def measured_refusal(cfg: Config, runs: Mapping[str, list[Peak]], *, device_gib: float | None,
                     share_limit: float) -> str:
    """Why the study's runs say ``cfg`` cannot fit ('' where they do not: no device size, nothing measured of its
    family, or a micro-batch at or below the largest that ran); the module doc gives the rule."""
    if not device_gib:
        return ""
    mine = runs.get(family(cfg), [])
    mb = cfg.data.micro_batch_size
    ran_out = [p for p in mine if p.gib is None and p.micro_batch <= mb]
    if ran_out:
        p = min(ran_out, key=lambda p: p.micro_batch)
        return (f"trial {p.trial} ran out of memory at micro-batch {p.micro_batch} with the same other settings; "
                "not launched")
    measured = [p for p in mine if p.gib is not None]
    if not measured:
        return ""
    top = max(measured, key=lambda p: (p.micro_batch, p.gib))
    if mb <= top.micro_batch:
        return ""
    slope, basis = _slope(measured), "its family's"
    if slope is None:
        others = [s for key, pts in runs.items() if key != family(cfg) and (s := _slope(pts)) is not None]
        if not others:
            return ""
        slope, basis = statistics.median(others), f"the median of {len(others)} other families'"
    predicted = top.gib + slope * (mb - top.micro_batch)
    share = min(share_limit, cfg.hardware.memory_fraction_limit)
    allowed = device_gib * share
    if predicted * (1 - MARGIN) <= allowed:
        return ""
    return (f"the study's runs put micro-batch {mb} at {predicted:.1f} GiB (trial {top.trial}'s {top.gib:.1f} at "
            f"{top.micro_batch}, {slope:.2f} GiB a sample, {basis}), over the {allowed:.1f} GiB a trial may hold "
            f"({share:g} of {device_gib:.1f}) by more than {MARGIN:.0%}; not launched")
