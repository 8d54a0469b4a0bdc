"""Export a study's result: ``runs/<study>/config.yaml`` with provenance, and ``environment.json``.

The exported config is the study's base config plus the winner's knob values
(``StudySpec.export_config``), without the protocol's measurement keys, so
``python -m workbench.train --config runs/<study>/config.yaml`` runs it as a
production config. When no candidate's speedup interval lies above 1.0, the
base config is exported and ``provenance`` says so (``trial: null``,
``significant: false``, ``speedup: 1.0``).

``provenance`` (workbench.config.Provenance): study, trial, tokens_per_s_per_gpu
(the median of the winner's validation runs, or of the baseline repeats),
speedup and speedup_ci (median and 95% interval of the A/B ratios),
significant, baseline_tokens_per_s_per_gpu, the numerics guard's check of the
winner (numerics knobs such as FP8), the environment fingerprint and the export time.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config import Config, Provenance, dump_config, from_dict, load_config, to_dict
from workbench.train.fingerprint import fingerprint as environment_fingerprint
from workbench.tune.study import StudySpec

__all__ = ["export_config", "pinned_launch_params", "provenance_for", "write_json"]


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str, allow_nan=False)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def _median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def provenance_for(
    study_name: str,
    validation: Mapping[str, Any],
    *,
    fingerprint: Mapping[str, str],
    baseline_runs: list[float] | None = None,
) -> tuple[Provenance, dict[str, Any]]:
    """Provenance of the export described by ``validation`` (validation.json), and the winner's params."""
    winner = validation.get("winner") or {}
    trial = winner.get("trial")
    cand = next((c for c in validation.get("candidates", []) if c.get("trial") == trial), None) \
        if trial is not None else None
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    fp = {str(k): str(v) for k, v in fingerprint.items()}
    if cand is not None and winner.get("significant"):
        prov = Provenance(
            study=study_name, trial=int(trial), tokens_per_s_per_gpu=_median(cand.get("runs")),
            speedup=float(cand["speedup_median"]),
            speedup_ci=[float(cand["ci_low"]), float(cand["ci_high"])], significant=True,
            baseline_tokens_per_s_per_gpu=_median(cand.get("baseline_runs")), numerics=cand.get("numerics"),
            fingerprint=fp, created=created)
        return prov, dict(cand.get("params") or {})
    base = _median(baseline_runs or validation.get("baseline_runs"))
    prov = Provenance(study=study_name, trial=None, tokens_per_s_per_gpu=base, speedup=1.0, speedup_ci=None,
                      significant=False, baseline_tokens_per_s_per_gpu=base, fingerprint=fp, created=created)
    return prov, {}


def pinned_launch_params(record: list[Mapping[str, Any]] | None) -> dict[str, dict[str, int]]:
    """Kernel -> launch parameters to pin, from a run's launch record (``summary["kernels/launch"]``: one entry
    per kernel and shape, as resolved at launch). A kernel launched at several shapes with different resolved
    parameters is left out: its shape-dependent defaults are what ran, and one value cannot pin them all."""
    from kernels.registry import LAUNCH_SPACES  # data, but the kernels package imports torch and triton

    seen: dict[str, list[dict[str, int]]] = {}
    for entry in record or []:
        kernel = entry.get("kernel")
        space = LAUNCH_SPACES.get(kernel) if isinstance(kernel, str) else None
        if space is None:
            continue
        seen.setdefault(kernel, []).append({p: int(entry[p]) for p in space.param_names() if p in entry})
    return {k: v[0] for k, v in seen.items() if v[0] and all(x == v[0] for x in v)}


def export_config(
    spec: StudySpec,
    study_dir: Path,
    validation: Mapping[str, Any],
    *,
    study_name: str | None = None,
    baseline_runs: list[float] | None = None,
    fingerprint: Mapping[str, str] | None = None,
    launch_record: list[Mapping[str, Any]] | None = None,
) -> Path:
    """Write ``study_dir/config.yaml`` (winner or base, with provenance) and ``environment.json``; returns its path.

    ``launch_record``: the winner's ``kernels/launch`` (what its Triton kernels ran with). Those launch parameters
    are pinned in the export, under the values the study searched, so the file runs the measured kernels even
    if the shape-dependent defaults change in a later version."""
    study_dir = Path(study_dir)
    fp = dict(fingerprint) if fingerprint is not None else environment_fingerprint()
    prov, params = provenance_for(study_name or spec.name, validation, fingerprint=fp, baseline_runs=baseline_runs)
    cfg = spec.export_config(params)
    data = to_dict(cfg)
    if prov.trial is not None and launch_record:
        kernels_cfg = data["loongforge"]["compute_domain"].setdefault("kernels", {})
        for kernel, pinned in pinned_launch_params(launch_record).items():
            kernels_cfg[kernel] = {**pinned, **kernels_cfg.get(kernel, {})}  # searched values win (they agree)
    data["provenance"] = to_dict(prov)
    cfg = from_dict(Config, data)  # validated again, provenance included
    path = dump_config(cfg, study_dir / "config.yaml")
    write_json(study_dir / "environment.json", fp)
    load_config(path)  # the file must load as written
    return path
