"""Measurement statistics of the tuner: the baseline's noise floor and A/B speedup intervals.

``noise_floor`` summarises the baseline repeats; ``speedup_interval`` is a Student-t interval on the log ratios
of interleaved A/B pairs, significant when its low end is above 1.0. docs/tuner.md says why that interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "INCONCLUSIVE_WIDTH",
    "NOISY_SPREAD",
    "NoiseFloor",
    "SpeedupInterval",
    "bootstrap_interval",
    "noise_floor",
    "noise_warning",
    "pairs_needed",
    "pair_ratios",
    "sequential_confidence",
    "speedup_interval",
    "t_ppf",
    "width_ratio",
]

NOISY_SPREAD = 0.10
"""A base-config spread (max - min over the median of its repeats) above this is flagged as noise: idle, the
2-core CI machine's three repeats spread 7-10% (README, Quickstart); beside a busy process, 95-166%."""

INCONCLUSIVE_WIDTH = 2.0
"""``verify`` is inconclusive when its interval is wider than the validated one by more than this factor (in
log terms, hi/lo): at 2x, a check whose interval could hold two validated ones side by side says nothing."""


@dataclass(frozen=True)
class NoiseFloor:
    """Spread of repeated measurements of one config."""

    n: int
    median: float
    min: float
    max: float
    rel_spread: float
    """(max - min) / median: the relative range; a gain smaller than this is not a win."""
    cv: float
    """Coefficient of variation, stdev / mean (0 for a single run)."""
    runs: tuple[float, ...] = ()
    """The measurements, in order."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = list(self.runs)
        return d


def noise_floor(values: Sequence[float]) -> NoiseFloor:
    """Noise floor of repeated throughputs of the baseline; ValueError when there is none."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("noise_floor needs at least one measurement")
    if any(not math.isfinite(v) or v <= 0 for v in xs):
        raise ValueError(f"noise_floor needs positive finite throughputs, got {xs}")
    med = statistics.median(xs)
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if len(xs) > 1 else 0.0
    return NoiseFloor(n=len(xs), median=med, min=min(xs), max=max(xs), rel_spread=(max(xs) - min(xs)) / med, cv=cv,
                      runs=tuple(xs))


def noise_warning(nf: NoiseFloor | dict[str, Any] | None, threshold: float = NOISY_SPREAD,
                  what: str = "repeats") -> str | None:
    """One line when the base config's ``what`` (its repeats, or every run of it in the study) spread more than
    ``threshold``, with what to do; else None."""
    if nf is None:
        return None
    d = nf.to_dict() if isinstance(nf, NoiseFloor) else nf
    if d.get("n", 0) < 2 or not d.get("rel_spread", 0.0) > threshold:
        return None
    return (f"noisy machine: the base config's {d['n']} {what} spread {d['rel_spread']:.0%} (above {threshold:.0%}); "
            "a gain smaller than that is not a win; stop background jobs, or lengthen the windows "
            "(protocol.window_steps, windows), or add repeats (protocol.baseline_repeats, ab_rounds)")


def pair_ratios(candidate: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per-pair speedups candidate[i] / baseline[i] of an interleaved A/B run."""
    if len(candidate) != len(baseline):
        raise ValueError(f"unpaired runs: {len(candidate)} candidate vs {len(baseline)} baseline")
    out = []
    for c, b in zip(candidate, baseline):
        if not (math.isfinite(c) and math.isfinite(b)) or c <= 0 or b <= 0:
            raise ValueError(f"pair ({c}, {b}): throughputs must be positive and finite")
        out.append(c / b)
    return out


@dataclass(frozen=True)
class SpeedupInterval:
    """Median speedup with its interval; significant when the interval is entirely above 1."""

    n: int
    median: float
    low: float
    high: float
    confidence: float
    method: str

    @property
    def significant(self) -> bool:
        return self.n >= 2 and self.low > 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


# --------------------------------------------------------------------------- Student t quantile


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (bisection on the exact CDF; |error| < 1e-10)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- intervals


def speedup_interval(ratios: Sequence[float], confidence: float = 0.95) -> SpeedupInterval:
    """Median of the per-pair ratios and the t-interval of their geometric mean (see the module docstring).

    With one pair the interval is (0, inf): not significant. With identical ratios it is a point.
    """
    rs = [float(r) for r in ratios]
    if not rs:
        raise ValueError("speedup_interval needs at least one pair")
    if any(not math.isfinite(r) or r <= 0 for r in rs):
        raise ValueError(f"ratios must be positive and finite, got {rs}")
    med = statistics.median(rs)
    n = len(rs)
    if n < 2:
        return SpeedupInterval(n, med, 0.0, math.inf, confidence, "t-log")
    logs = [math.log(r) for r in rs]
    mean = statistics.fmean(logs)
    se = statistics.stdev(logs) / math.sqrt(n)
    half = t_ppf(0.5 + confidence / 2.0, n - 1) * se
    return SpeedupInterval(n, med, math.exp(mean - half), math.exp(mean + half), confidence, "t-log")


def sequential_confidence(min_pairs: int, max_pairs: int, overall: float = 0.95) -> tuple[float, int]:
    """(per-look confidence, looks) of a sequential A/B that looks at its interval after each pair from
    ``min_pairs`` to ``max_pairs`` and stops at the first that excludes 1.0: Bonferroni over the looks, so the
    chance that any look excludes 1.0 for a config no faster than the base stays at most ``1 - overall``."""
    if not 1 <= min_pairs <= max_pairs:
        raise ValueError(f"need 1 <= min_pairs <= max_pairs, got {min_pairs}, {max_pairs}")
    looks = max_pairs - min_pairs + 1
    return 1.0 - (1.0 - overall) / looks, looks


def pairs_needed(ratios: Sequence[float], min_pairs: int, overall: float = 0.95, limit: int = 1000) -> int | None:
    """Fewest A/B pairs, more than ``len(ratios)``, whose sequential interval (``sequential_confidence(min_pairs, n)``) would exclude 1.0 if
    more pairs had the same mean and spread of log ratios as ``ratios``; None when they show no gain (mean log
    ratio <= 0), have no spread to scale, or need more than ``limit``."""
    logs = [math.log(float(r)) for r in ratios]
    if len(logs) < 2:
        return None
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    if mean <= 0 or sd == 0:
        return None
    for n in range(max(2, min_pairs, len(logs) + 1), limit + 1):  # more than it has: those were not enough
        conf, _ = sequential_confidence(min(min_pairs, n), n, overall)
        if t_ppf(0.5 + conf / 2.0, n - 1) * sd / math.sqrt(n) < mean:
            return n
    return None


def width_ratio(low: float | None, high: float | None, ref_low: float | None, ref_high: float | None) -> float | None:
    """How many times wider the interval [low, high] is than [ref_low, ref_high], in log terms (hi/lo); None
    without both; inf when the reference is a point and this one is not."""
    if None in (low, high, ref_low, ref_high) or not (low > 0 and ref_low > 0):
        return None
    w, ref = math.log(high / low), math.log(ref_high / ref_low)
    if ref <= 0:
        return math.inf if w > 0 else 1.0
    return w / ref


def bootstrap_interval(
    ratios: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> SpeedupInterval:
    """Percentile bootstrap interval of the median ratio (fixed seed); for comparison only."""
    rs = [float(r) for r in ratios]
    if not rs:
        raise ValueError("bootstrap_interval needs at least one pair")
    rng = random.Random(seed)
    n = len(rs)
    meds = sorted(statistics.median(rng.choices(rs, k=n)) for _ in range(max(2000, resamples)))
    alpha = (1.0 - confidence) / 2.0
    lo = meds[int(math.floor(alpha * (len(meds) - 1)))]
    hi = meds[int(math.ceil((1.0 - alpha) * (len(meds) - 1)))]
    return SpeedupInterval(n, statistics.median(rs), lo, hi, confidence, "bootstrap-percentile")
