"""Read what the tuner wrote for one study, tolerating anything missing.

``load_study_data`` gathers ``tune.json``, the Optuna study, ``validation.json``,
the exported ``config.yaml`` and ``environment.json``; run directories (trials,
baseline repeats, validation runs) are read lazily through ``RunData``. Nothing
here raises on a missing or unreadable file: the value is empty and
``StudyData.problems`` says what could not be read.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from workbench.tune.knobs import get_knob
from workbench.tune.storage import mask_url
from workbench.vocab import FAILED_STATUSES, PHASES, REAL_TOKENS_PER_S

__all__ = [
    "PHASES",
    "RunData",
    "StudyData",
    "default_storage_url",
    "knob_doc",
    "knob_key",
    "load_study_data",
    "lookup_key",
    "num",
]

OK = "ok"
FAILURE_KINDS = FAILED_STATUSES  # the report shows every run that did not finish, interrupted ones too


def num(value: Any) -> float:
    """A finite or non-finite float from a JSON value or a DataFrame cell (numpy numbers included); NaN when
    absent or not a number."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return math.nan
    if isinstance(value, numbers.Real):  # int, float and numpy's integers and floats (a DataFrame's cells)
        return float(value)
    if isinstance(value, str):  # the metrics writer stores non-finite floats as strings
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _read_json(path: Path, problems: list[str] | None = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        if problems is not None:
            problems.append(f"{path.name}: {e}")
        return None


def _read_yaml(path: Path, problems: list[str] | None = None) -> tuple[Any, str | None]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if problems is not None:
            problems.append(f"{path.name}: {e}")
        return None, None
    try:
        return yaml.safe_load(text), text
    except yaml.YAMLError as e:
        if problems is not None:
            problems.append(f"{path.name}: {e}")
        return None, text


def _knob(name: str) -> Any:
    try:
        return get_knob(name)
    except (KeyError, ValueError):
        return None


def knob_key(name: str) -> str:
    """Dotted config key of a knob: the tuner's registry for a short name (``bucket_width`` ->
    ``data.bucket_width``), else the name itself (already a dotted key, or unknown)."""
    knob = _knob(name)
    return knob.key if knob is not None else name


def knob_doc(name: str) -> str:
    """What the knob acts on, from the tuner's registry; "" when unknown."""
    knob = _knob(name)
    return knob.doc if knob is not None else ""


def lookup_key(tree: Any, key: str) -> tuple[bool, Any]:
    """Value of a dotted knob name in a nested config dict: ``(found, value)``.

    Tries the knob's config key (the tuner's registry), the exact dotted path, then a
    unique path ending with the knob name (``bucket_width`` finds ``data.bucket_width``).
    """
    if not isinstance(tree, dict):
        return False, None
    mapped = knob_key(key)
    if mapped != key:
        found, value = lookup_key(tree, mapped)
        if found:
            return found, value
    node: Any = tree
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            break
    else:
        return True, node
    hits = [(p, v) for p, v in flatten_dict(tree).items() if p == key or p.endswith("." + key)]
    if len(hits) == 1:
        return True, hits[0][1]
    return False, None


def flatten_dict(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten_dict(v, path))
        else:
            out[path] = v
    return out


@dataclass
class RunData:
    """One run directory (a trial, a baseline repeat or a validation run); files read on first use."""

    name: str
    """Label: the trial number, ``baseline/0``, ``validation/12-1``..."""
    path: Path
    """The directory (it may not exist)."""
    attrs_summary: dict | None = None
    """The summary recorded in the Optuna storage, preferred over ``summary.json``."""

    @functools.cached_property
    def summary(self) -> dict:
        if isinstance(self.attrs_summary, dict) and self.attrs_summary:
            return self.attrs_summary
        data = _read_json(self.path / "summary.json")
        return data if isinstance(data, dict) else {}

    @functools.cached_property
    def phases(self) -> pd.DataFrame | None:
        """``phases.csv``: one row per step (seconds per phase); None when absent or unreadable."""
        try:
            df = pd.read_csv(self.path / "phases.csv")
        except (OSError, ValueError):
            return None
        return df if "step_s" in df.columns and len(df) else None

    @functools.cached_property
    def measured_phases(self) -> pd.DataFrame | None:
        """The measured steps of ``phases.csv`` (warm-up steps excluded)."""
        df = self.phases
        if df is None:
            return None
        if "measured" in df.columns:
            df = df[pd.to_numeric(df["measured"], errors="coerce").fillna(0) > 0]
        return df.reset_index(drop=True) if len(df) else None

    @functools.cached_property
    def metrics(self) -> pd.DataFrame | None:
        """``metrics.jsonl``: one row per measured window."""
        try:
            lines = (self.path / "metrics.jsonl").read_text().splitlines()
        except OSError:
            return None
        rows = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a half-written last line of a run in progress
            if isinstance(row, dict):
                rows.append(row)
        return pd.DataFrame(rows) if rows else None

    @functools.cached_property
    def failure(self) -> dict | None:
        data = _read_json(self.path / "failure.json")
        return data if isinstance(data, dict) else None

    @functools.cached_property
    def config(self) -> dict | None:
        data, _ = _read_yaml(self.path / "config.yaml")
        return data if isinstance(data, dict) else None

    def metric(self, key: str) -> float:
        """A number from the summary; NaN when absent."""
        return num(self.summary.get(key))


@dataclass
class StudyData:
    """Everything a report is computed from."""

    study_dir: Path
    storage_url: str
    study_name: str | None
    tune: dict = field(default_factory=dict)
    """``tune.json``; empty when absent."""
    trials: list = field(default_factory=list)
    """Optuna ``FrozenTrial`` objects, in trial-number order."""
    directions: list[str] = field(default_factory=list)
    """``maximize``/``minimize`` per objective; empty when the study could not be loaded."""
    metric_names: list[str] = field(default_factory=list)
    """Name per objective (Optuna's metric names where set)."""
    study_user_attrs: dict = field(default_factory=dict)
    """The Optuna study's user attrs (noise floor, baseline runs and losses, ...)."""
    study_error: str | None = None
    """Why the Optuna study could not be loaded, when it could not."""
    validation: dict = field(default_factory=dict)
    exported_config: dict | None = None
    exported_config_text: str | None = None
    environment: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Files that exist but could not be read."""

    @property
    def spec(self) -> dict:
        spec = self.tune.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def provenance(self) -> dict:
        prov = (self.exported_config or {}).get("provenance")
        return prov if isinstance(prov, dict) else {}

    def trial(self, number: int):
        for t in self.trials:
            if t.number == number:
                return t
        return None

    def trial_run(self, number: int) -> RunData | None:
        t = self.trial(number)
        attrs = t.user_attrs if t is not None else {}
        path = self.study_dir / "trials" / str(number)
        if isinstance(attrs.get("trial_dir"), str):
            p = Path(attrs["trial_dir"])
            path = p if p.is_absolute() else self.study_dir / p
            if not path.exists() and (self.study_dir / "trials" / str(number)).exists():
                path = self.study_dir / "trials" / str(number)  # the study dir was moved
        if t is None and not path.exists():
            return None
        summary = attrs.get("summary") if isinstance(attrs.get("summary"), dict) else None
        return RunData(name=f"trial {number}", path=path, attrs_summary=summary)

    @functools.cached_property
    def baseline_runs(self) -> list[RunData]:
        return _runs_under(self.study_dir / "baseline", "baseline/")

    @functools.cached_property
    def validation_runs(self) -> list[RunData]:
        return _runs_under(self.study_dir / "validation", "validation/")

    def validation_runs_of(self, trial: int) -> list[RunData]:
        """A candidate's A/B re-runs: validation.json's ``run_dirs`` where given, else the dirs named
        ``trial-<n>-<round>`` or ``<n>-<round>``."""
        for c in self.validation.get("candidates") or []:
            if isinstance(c, dict) and c.get("trial") == trial and isinstance(c.get("run_dirs"), list):
                return self._runs_at(c["run_dirs"])
        pat = re.compile(rf"^(trial-)?{trial}-\d+$")
        return [r for r in self.validation_runs if pat.match(r.path.name)]

    def validation_baseline_runs(self) -> list[RunData]:
        """The baseline's A/B runs (every candidate's): ``baseline_dirs`` of validation.json where given,
        else the dirs named ``baseline-<n>-<round>`` or ``baseline-<round>``."""
        listed = [d for c in self.validation.get("candidates") or [] if isinstance(c, dict)
                  for d in (c.get("baseline_dirs") or []) if isinstance(d, str)]
        if listed:
            return self._runs_at(listed)
        pat = re.compile(r"^baseline(-\d+)?-\d+$")
        return [r for r in self.validation_runs if pat.match(r.path.name)]

    def _runs_at(self, dirs: list) -> list[RunData]:
        runs = []
        for d in dirs:
            p = Path(str(d))
            p = p if p.is_absolute() else self.study_dir / p
            if not p.exists() and (self.study_dir / "validation" / p.name).exists():
                p = self.study_dir / "validation" / p.name  # the study dir was moved
            runs.append(RunData(name=f"validation/{p.name}", path=p))
        return runs

    def baseline_config(self) -> dict | None:
        """The baseline's config: a baseline repeat's config.yaml, else the spec's base when it is a dict or file."""
        for run in self.baseline_runs:
            if run.config:
                return run.config
        base = self.spec.get("base")
        if isinstance(base, dict):
            return base
        if isinstance(base, str):
            for p in (Path(base), self.study_dir / base):
                data, _ = _read_yaml(p) if p.suffix in (".yaml", ".yml") else (None, None)
                if isinstance(data, dict):
                    return data
        return None


def _runs_under(root: Path, prefix: str) -> list[RunData]:
    try:
        dirs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]  # .<name>.<id>: unfinished
    except OSError:
        return []

    def order(p: Path) -> tuple:
        return tuple(int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p.name))

    return [RunData(name=prefix + p.name, path=p) for p in sorted(dirs, key=order)]


def default_storage_url(study_dir: Path) -> str:
    """``sqlite:///STUDY_DIR/study.db`` when that file exists, else tune.json's storage_url, else the SQLite path."""
    db = Path(study_dir) / "study.db"
    if db.exists():
        return f"sqlite:///{db}"
    tune = _read_json(Path(study_dir) / "tune.json")
    if isinstance(tune, dict) and isinstance(tune.get("storage_url"), str):
        return tune["storage_url"]
    return f"sqlite:///{db}"


def load_study_data(study_dir: str | Path, storage_url: str | None = None,
                    study_name: str | None = None) -> StudyData:
    """Read a study directory and its Optuna storage; never raises for missing or broken files."""
    study_dir = Path(study_dir)
    problems: list[str] = []
    tune = _read_json(study_dir / "tune.json", problems)
    tune = tune if isinstance(tune, dict) else {}
    storage_url = storage_url or default_storage_url(study_dir)
    study_name = study_name or tune.get("study_name") or (tune.get("spec") or {}).get("name")
    data = StudyData(study_dir=study_dir, storage_url=storage_url, study_name=study_name,
                     tune=tune, problems=problems)
    _load_optuna(data)
    validation = _read_json(study_dir / "validation.json", problems)
    data.validation = validation if isinstance(validation, dict) else {}
    cfg, text = _read_yaml(study_dir / "config.yaml", problems)
    data.exported_config = cfg if isinstance(cfg, dict) else None
    data.exported_config_text = text
    env = _read_json(study_dir / "environment.json", problems)
    data.environment = env if isinstance(env, dict) else {}
    return data


def _load_optuna(data: StudyData) -> None:
    url = data.storage_url
    if url.startswith("sqlite:///"):
        # Opening a missing SQLite file would create an empty database: don't.
        path = Path(url[len("sqlite:///"):])
        if not path.exists():
            data.study_error = f"no study database at {path}"
            return
    try:
        import optuna
    except ImportError:  # pragma: no cover - optuna is a dependency of the workbench
        data.study_error = "optuna is not installed (pip install optuna)"
        return
    try:
        study = optuna.load_study(study_name=data.study_name, storage=url)
        data.trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        data.directions = [d.name.lower() for d in study.directions]
        data.study_user_attrs = dict(study.user_attrs)
        data.study_name = study.study_name
        names = study.metric_names
        data.metric_names = list(names) if names else _default_metric_names(len(data.directions))
    except Exception as e:  # noqa: BLE001 - any storage error becomes the one-line message
        data.study_error = f"could not load study {data.study_name!r} from {mask_url(url)}: {e}"


def _default_metric_names(n: int) -> list[str]:
    names = [REAL_TOKENS_PER_S]
    return (names + [f"objective {i}" for i in range(1, n)])[:n]


