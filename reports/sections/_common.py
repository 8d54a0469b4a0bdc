"""What the sections share: trial statuses, knob names, the "best" trial, and the runs of each arm.

"Baseline" is the study's base config, measured by the baseline repeats (``baseline/<i>/``) and, where the
candidates were re-measured, by the interleaved A/B runs of ``validation.json``. "Best" is the validated winner
when there is one, else the exported config's trial, else the trial with the best objective among those that ran
to the end (status ``ok``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from reports._load import RunData, StudyData, lookup_key, num
from workbench.vocab import REAL_TOKENS_PER_S

__all__ = ["TPUT", "baseline_runs", "best_runs", "best_trial_number", "knob_kinds", "knob_names", "ok_trials",
           "packings", "trial_status"]

TPUT = REAL_TOKENS_PER_S


def trial_status(t: Any) -> str:
    """The tuner's status (ok, pruned, oom...), else one derived from the Optuna state."""
    status = t.user_attrs.get("status")
    if isinstance(status, str) and status:
        return status
    state = t.state.name.lower()
    if state == "complete":
        return "ok" if t.values and all(math.isfinite(v) for v in t.values) else "crash"
    return state  # pruned, fail, running, waiting


def ok_trials(data: StudyData) -> list:
    """Trials that ran to the end and measured a throughput."""
    return [t for t in data.trials
            if t.state.name == "COMPLETE" and t.values and trial_status(t) == "ok"]


def knob_names(data: StudyData) -> list[str]:
    """Searched knobs: the spec's space order where given, then any other param seen."""
    seen: dict[str, None] = {}
    space = data.spec.get("space")
    if isinstance(space, dict):
        for k in _flatten_space(space):
            seen.setdefault(k, None)
    elif isinstance(space, list):
        for item in space:
            if isinstance(item, dict) and isinstance(item.get("name") or item.get("knob"), str):
                seen.setdefault(item.get("name") or item.get("knob"), None)
    params = {p: None for t in data.trials for p in t.params}
    ordered = [k for k in seen if k in params] + [p for p in params if p not in seen]
    return ordered


def _flatten_space(space: dict) -> list[str]:
    """Knob names of a space dict: flat dotted keys, or nested dicts whose leaves describe a knob."""
    out = []
    for k, v in space.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            out.extend(f"{k}.{sub}" for sub in _flatten_space(v))
        else:
            out.append(str(k))
    return out


def log_scale_knobs(data: StudyData) -> list[str]:
    """Knobs searched on a log scale (their Optuna distribution has log=True), in knob order."""
    logs = {k for t in data.trials for k, d in t.distributions.items() if getattr(d, "log", False)}
    return [k for k in knob_names(data) if k in logs]


def knob_kinds(data: StudyData) -> tuple[dict[str, str], dict[str, list]]:
    """Each searched knob's kind, from its Optuna distribution: ``categorical``, ``int`` or ``float``; and the
    choices of each categorical knob, in the space's order. A knob with no distribution recorded is ``int`` when
    every value is a whole number, ``float`` when every value is a number, else ``categorical`` (its values)."""
    kinds: dict[str, str] = {}
    choices: dict[str, list] = {}
    for t in reversed(data.trials):  # the latest trial's distribution: the space as it is now
        for k, d in t.distributions.items():
            if k in kinds:
                continue
            name = type(d).__name__
            if name == "CategoricalDistribution":
                kinds[k], choices[k] = "categorical", list(d.choices)
            elif name == "IntDistribution":
                kinds[k] = "int"
            else:
                kinds[k] = "float"
    for k in knob_names(data):
        if k in kinds:
            continue
        values = [t.params[k] for t in data.trials if k in t.params and t.params[k] is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            kinds[k] = "int"
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            kinds[k] = "float"
        else:
            kinds[k] = "categorical"
            choices[k] = sorted(set(values), key=repr)
    return kinds, choices


def objective_of(t: Any, i: int = 0) -> float:
    if t.values and len(t.values) > i:
        return float(t.values[i])
    return math.nan


def better_than(direction: str) -> Callable[[float, float], bool]:
    return (lambda a, b: a > b) if direction != "minimize" else (lambda a, b: a < b)


def study_result(data: StudyData) -> dict | None:
    """tune.json's ``result`` (workbench.tune.result) of a finished study; None before the study finished."""
    result = data.tune.get("result")
    return result if isinstance(result, dict) and "verdict" in result else None


def best_trial_number(data: StudyData) -> tuple[int | None, str]:
    """The trial shown as "best" and how it was chosen: the study's result (tune.json) first."""
    best = (study_result(data) or {}).get("best")
    if isinstance(best, dict) and isinstance(best.get("trial"), int):
        return best["trial"], ("validated winner" if best.get("significant")
                               else "best validated candidate, not significant")
    winner = data.validation.get("winner")
    if isinstance(winner, dict) and isinstance(winner.get("trial"), int):
        return winner["trial"], "validated winner"
    if isinstance(data.provenance.get("trial"), int):
        return data.provenance["trial"], "exported config"
    ok = ok_trials(data)
    if not ok:
        return None, "no finished trial"
    direction = data.directions[0] if data.directions else "maximize"
    key = (lambda t: objective_of(t)) if direction != "minimize" else (lambda t: -objective_of(t))
    return max(ok, key=key).number, "best objective (not re-measured)"


def best_runs(data: StudyData, number: int | None) -> list[RunData]:
    """The best trial's directory, then its validation re-runs."""
    if number is None:
        return []
    runs = []
    trial = data.trial_run(number)
    if trial is not None:
        runs.append(trial)
    return runs + data.validation_runs_of(number)


def packings(runs: Iterable[RunData]) -> set[str]:
    """The ``data.packing`` of the runs' configs: 'bucket' (rows padded to their bucket's length, the schema's
    default, also where a config leaves it out) or 'fill' (rows cut from the token stream: every row seq_len
    tokens, no padding). Runs without a config.yaml add nothing."""
    out = set()
    for r in runs:
        if r.config is None:
            continue
        found, value = lookup_key(r.config, "data.packing")
        out.add(str(value) if found and value else "bucket")
    return out


def baseline_runs(data: StudyData) -> list[RunData]:
    """The baseline repeats, then the baseline arms of the A/B validation."""
    return list(data.baseline_runs) + data.validation_baseline_runs()


def median_of(values: Iterable[float]) -> float:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(statistics.median(vals)) if vals else math.nan


def finite_numbers(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    return [num(v) for v in values if math.isfinite(num(v))]


def candidate_of(data: StudyData, number: int | None) -> dict | None:
    for c in data.validation.get("candidates") or []:
        if isinstance(c, dict) and c.get("trial") == number and number is not None:
            return c
    return None


def same_config(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b
