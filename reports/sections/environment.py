"""The Environment section: the study's settings, the noise floor, the fingerprint, the hardware, dropped knobs."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from reports._load import StudyData, flatten_dict, mask_url, num
from reports.sections._common import finite_numbers

__all__ = ["Environment", "NoiseFloor", "environment_section"]


class NoiseFloor(NamedTuple):
    median: float
    min: float
    max: float
    rel_spread: float
    """(max - min) / median of the baseline repeats."""
    cv: float
    runs: list[float]


class Environment(NamedTuple):
    study: pd.DataFrame
    """key, value: study name, storage (password masked), model, GPUs, sampler, pruner, budget, times."""
    fingerprint: pd.DataFrame
    """key, value: GPU, driver, CUDA, torch, Triton, NCCL versions..."""
    hardware: pd.DataFrame
    """key, value from tune.json's hardware."""
    dropped: pd.DataFrame
    """knob, reason: knobs left out of the search on this hardware."""
    noise: NoiseFloor | None
    message: str | None
    patches: pd.DataFrame = pd.DataFrame(columns=["key", "value"])
    """key, value: what run.prepare() changed in the exported run's Hugging Face model (``patch`` rows) and the
    versions of the libraries that did it (the exported provenance's ``patches``); empty when nothing was."""


def _kv(d: Any) -> pd.DataFrame:
    if not isinstance(d, dict):
        return pd.DataFrame(columns=["key", "value"])
    flat = flatten_dict(d)
    return pd.DataFrame([(k, _scalar(v)) for k, v in flat.items()], columns=["key", "value"])


def _scalar(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return "{}"
    return v


def environment_section(data: StudyData) -> Environment:
    spec = data.spec
    study = [("study", data.study_name), ("storage", mask_url(data.storage_url)),
             ("study directory", str(data.study_dir))]
    for key in ("model", "base", "gpus", "sampler", "pruner", "budget", "protocol", "objective"):
        if key in spec:
            v = spec[key]
            study.append((key, ", ".join(f"{k}={_scalar(x)}" for k, x in flatten_dict(v).items())
                          if isinstance(v, dict) else _scalar(v)))
    for key in ("started", "finished"):
        if data.tune.get(key):
            study.append((key, data.tune[key]))
    sessions = data.tune.get("sessions")
    if isinstance(sessions, list) and sessions:
        unfinished = sum(1 for x in sessions if not (isinstance(x, dict) and x.get("finished")))
        study.append(("coordinator sessions", f"{len(sessions)}" + (f" ({unfinished} unfinished, not counted)"
                                                                      if unfinished else "")))
        study.append(("wall time, all sessions", f"{num(data.tune.get('wall_s')):,.0f} s"))
    if data.trials:
        study.append(("trials", len(data.trials)))
    study_df = pd.DataFrame(study, columns=["key", "value"])

    fp = data.environment or data.provenance.get("fingerprint") or {}
    dropped = [(d.get("knob"), d.get("reason")) for d in data.tune.get("dropped_knobs") or []
               if isinstance(d, dict)]
    nf = data.tune.get("noise_floor")
    noise = None
    if isinstance(nf, dict) and math.isfinite(num(nf.get("median"))):
        runs = finite_numbers(nf.get("runs"))
        noise = NoiseFloor(num(nf.get("median")), num(nf.get("min")), num(nf.get("max")),
                           num(nf.get("rel_spread")), num(nf.get("cv")), runs)
    message = None
    if not data.tune and not fp:
        message = "No environment recorded yet (no tune.json, no environment.json)."
    prepared = data.provenance.get("patches") if isinstance(data.provenance.get("patches"), dict) else {}
    patches = pd.DataFrame([("patch", str(line)) for line in prepared.get("applied") or []]
                           + [(f"{dist} version", v or "not installed")
                              for dist, v in (prepared.get("versions") or {}).items()], columns=["key", "value"])
    return Environment(study=study_df, fingerprint=_kv(fp), hardware=_kv(data.tune.get("hardware")),
                       dropped=pd.DataFrame(dropped, columns=["knob", "reason"]), noise=noise, message=message,
                       patches=patches)
