"""The "How to read this report" section: what the baseline, the search-time numbers, the speedup and its
interval, and the phases are, with this study's protocol filled in, and where the raw files are."""

from __future__ import annotations

from typing import Any, NamedTuple

import pandas as pd

from reports._load import PHASES, StudyData, mask_url

__all__ = ["Guide", "guide_section"]


class Guide(NamedTuple):
    base: str | None
    """The base config: its path in the spec, "inline in the study spec", or None when unknown."""
    baseline_repeats: int | None
    warmup_steps: int | None
    window_steps: int | None
    windows: int | None
    ab_rounds: int | None
    candidates: int | None
    """Candidates the A/B validation re-measured (None before it ran)."""
    confidence: float | None
    method: str | None
    """How validation.json computed the speedup interval (e.g. "t-interval on log ratios")."""
    phases: tuple[str, ...]
    study_dir: str
    files: pd.DataFrame
    """path, what, present: the study directory's raw files."""
    storage: str | None
    """The Optuna storage URL, its password masked."""
    message: str | None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


FILES = (
    ("tune.json", "the study's spec, hardware, noise floor and coordinator sessions"),
    ("study.db", "the Optuna study (SQLite): every trial's knobs, objective, status and timings"),
    ("trials/<n>/", "one run per trial: config.yaml, metrics.jsonl (per window), phases.csv (per step), "
                    "summary.json, log.txt, failure.json when it failed"),
    ("baseline/<i>/", "the baseline repeats, the same files"),
    ("validation.json", "the A/B rounds: every run's throughput, the ratios, intervals and winner"),
    ("validation/", "the A/B runs: baseline-<trial>-<round>/ and trial-<trial>-<round>/"),
    ("config.yaml", "the exported config, with its provenance"),
    ("environment.json", "the environment fingerprint (GPU, driver, CUDA, torch, Triton, NCCL)"),
)


def guide_section(data: StudyData) -> Guide:
    spec = data.spec if isinstance(data.spec, dict) else {}
    protocol = spec.get("protocol") if isinstance(spec.get("protocol"), dict) else {}
    base = spec.get("base")
    base = base if isinstance(base, str) else ("inline in the study spec" if isinstance(base, dict) else None)
    v = data.validation if isinstance(data.validation, dict) else {}
    cands = v.get("candidates") if isinstance(v.get("candidates"), list) else None
    conf = v.get("confidence")
    d = data.study_dir
    files = pd.DataFrame(
        [(path, what, (d / path.split("/<")[0].rstrip("/")).exists()) for path, what in FILES],
        columns=["path", "what", "present"])
    repeats = _int(protocol.get("baseline_repeats"))
    if repeats is None and data.baseline_runs:
        repeats = len(data.baseline_runs)
    message = None
    if not data.tune and not data.trials:
        message = "No study recorded here yet: what follows says what a study writes and how to read it."
    return Guide(base=base, baseline_repeats=repeats, warmup_steps=_int(protocol.get("warmup_steps")),
                 window_steps=_int(protocol.get("window_steps", protocol.get("window"))),
                 windows=_int(protocol.get("windows")),
                 ab_rounds=_int(v.get("ab_rounds", protocol.get("ab_rounds", protocol.get("validation_rounds")))),
                 candidates=len(cands) if cands is not None else None,
                 confidence=float(conf) if isinstance(conf, (int, float)) else None,
                 method=v.get("method") if isinstance(v.get("method"), str) else None,
                 phases=tuple(PHASES), study_dir=str(d), files=files,
                 storage=mask_url(data.storage_url) if data.storage_url else None, message=message)
