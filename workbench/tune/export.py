"""Export a study's result: ``runs/<study>/config.yaml`` with provenance, and ``environment.json``.

The exported config is the study's base config plus the winner's knob values (``StudySpec.export_config``),
without the protocol's measurement keys, so ``python -m workbench.train --config runs/<study>/config.yaml`` runs
it as a production config. Its ``provenance`` is the study's result (``workbench.tune.result``) as
``workbench.config.Provenance`` fields, plus the environment fingerprint and the export time: when no candidate's
interval lies above 1.0 the base config is exported (``trial: null``, ``significant: false``) and
``best_candidate`` says which candidate came closest and why it lost.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from kernels.registry import LAUNCH_SPACES
from workbench.config import Config, Provenance, dump_config, from_dict, load_config, to_dict
from workbench.files import write_text
from workbench.train.fingerprint import fingerprint as environment_fingerprint
from workbench.tune.result import provenance_fields
from workbench.tune.study import StudySpec

__all__ = ["export_config", "exported_patches", "pinned_launch_params", "winner_launch_record", "write_json"]


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON (no NaN) atomically (workbench.files: the mode follows the umask)."""
    return write_text(path, json.dumps(data, indent=2, default=str, allow_nan=False) + "\n")


def pinned_launch_params(record: list[Mapping[str, Any]] | None) -> dict[str, dict[str, int]]:
    """Kernel -> launch parameters to pin, from a run's launch record (``summary["kernels/launch"]``: one entry
    per kernel and shape, as resolved at launch). A kernel launched at several shapes with different resolved
    parameters is left out: its shape-dependent defaults are what ran, and one value cannot pin them all."""
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
    result: Mapping[str, Any],
    *,
    fingerprint: Mapping[str, str] | None = None,
    launch_record: list[Mapping[str, Any]] | None = None,
    patches: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``study_dir/config.yaml`` (the result's exported config, with provenance) and ``environment.json``;
    returns its path.

    ``launch_record``: the winner's ``kernels/launch`` (what its Triton kernels ran with). Those launch parameters
    are pinned in the export, under the values the study searched, so the file runs the measured kernels even
    if the shape-dependent defaults change in a later version. ``patches``: what ``run.prepare()`` changed in the
    exported run's Hugging Face model (its summary's ``hf/patches`` and ``hf/versions``)."""
    study_dir = Path(study_dir)
    fp = {str(k): str(v) for k, v in (fingerprint if fingerprint is not None else environment_fingerprint()).items()}
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    trainer = spec.trainer.record() if spec.trainer is not None else None  # env values as <set>
    prov = Provenance(**provenance_fields(result), trainer=trainer, fingerprint=fp, created=created,
                      patches=dict(patches) if patches else None)
    cfg = spec.export_config(result["exported"]["params"])
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


def exported_patches(study: optuna.Study, result: Mapping[str, Any], study_dir: Path) -> dict[str, Any] | None:
    """What ``run.prepare()`` changed in the exported run's Hugging Face model (the exported trial's summary, else
    the first baseline run's), as the provenance's ``patches``; None when nothing was prepared."""
    trial = ((result or {}).get("exported") or {}).get("trial")
    summary: Mapping[str, Any] = {}
    if trial is not None:
        with contextlib.suppress(IndexError, ValueError, TypeError):
            summary = study.trials[int(trial)].user_attrs.get("summary") or {}
    else:
        with contextlib.suppress(OSError, ValueError):
            summary = json.loads((study_dir / "baseline" / "0" / "summary.json").read_text())
    applied = summary.get("hf/patches")
    return {"applied": list(applied), "versions": summary.get("hf/versions") or {}} if applied else None


def winner_launch_record(study: optuna.Study, result: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The Triton launch record of the exported winner's search trial (its summary's ``kernels/launch``)."""
    trial = ((result or {}).get("exported") or {}).get("trial")
    if trial is None:
        return None
    try:
        frozen = study.trials[int(trial)]
    except (IndexError, ValueError, TypeError):
        return None
    return ((frozen.user_attrs.get("summary") or {}).get("kernels/launch")) or None
