"""The Search and Trials sections: the optimisation history, importances, Pareto front, and every trial's row."""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import pandas as pd

from reports._load import StudyData, num
from workbench.tune.profiled import profile_line, walk_line, warm_start_line
from workbench.tune.result import gpu_minutes_line
from reports.sections._common import (
    TPUT,
    better_than,
    log_scale_knobs,
    objective_of,
    knob_kinds,
    knob_names,
    ok_trials,
    trial_status,
)
from workbench.vocab import MAX_RESERVED_GIB

__all__ = ["NOT_FAILED", "Search", "Trials", "search_section", "trials_section"]

MIN_IMPORTANCE_TRIALS = 10
"""Finished trials needed before importances are computed: with fewer, fANOVA's forest (or PED-ANOVA's quantile
split) fits a handful of points and ranks noise (10 knobs ranked from 4 trials, issue 38)."""


class Search(NamedTuple):
    history: pd.DataFrame
    """trial, value, best_so_far, status (finished and pruned trials; pruned: last window's value)."""
    direction: str
    objective_name: str
    baseline_band: tuple[float, float, float] | None
    """(median, min, max) of the baseline repeats: the noise floor drawn behind the history."""
    importances: pd.DataFrame | None
    """knob, importance over the trials with status ok (fANOVA, or PED-ANOVA without scikit-learn;
    ``importances.attrs["method"]`` says which)."""
    importances_message: str | None
    knobs: pd.DataFrame
    """trial, value, then one column per knob: the trials with status ok."""
    knob_names: list[str]
    log_knobs: list[str]
    """Knobs searched on a log scale (their Optuna distribution has log=True)."""
    pareto: pd.DataFrame | None
    """trial, <objective 0>, <objective 1>, on_front: the trials with status ok."""
    pareto_message: str | None
    message: str | None
    knob_kinds: dict[str, str] = {}
    """Each knob's kind from its Optuna distribution: categorical, int or float."""
    knob_choices: dict[str, list] = {}
    """The choices of each categorical knob, in the space's order."""
    gpu_minutes: pd.DataFrame | None = None
    """phase, gpu_minutes, share: tune.json's device minutes by phase (baseline, screening, trials, numerics,
    validation, traces); None for a study that recorded none."""
    gpu_minutes_line: str | None = None
    """The total against the budget and what each screening stage saw, in one line."""
    profile_line: str | None = None
    """Where the base step's time went and which knobs the startup trials held for it (tune.json's ``profile``);
    None for a study not led by a profile (a grid, no phase timings)."""
    warm_start_line: str | None = None
    """Which earlier study's best config ran first and what the startup trials held for it (tune.json's
    ``warm_start``); None for a study not warm-started."""
    walk_line: str | None = None
    """The steps the startup took from the base config, one knob at a time (tune.json's ``walk``); None for a
    study that did not walk from its base."""


def search_section(data: StudyData) -> Search:
    direction = data.directions[0] if data.directions else "maximize"
    name = data.metric_names[0] if data.metric_names else TPUT
    better = better_than(direction)
    rows, best = [], math.nan
    for t in data.trials:
        status = trial_status(t)
        if t.state.name == "COMPLETE" and t.values:
            value = objective_of(t)
        elif t.state.name == "PRUNED" and t.intermediate_values:
            value = float(t.intermediate_values[max(t.intermediate_values)])
        else:
            continue
        if status == "ok" and math.isfinite(value) and (not math.isfinite(best) or better(value, best)):
            best = value
        rows.append((t.number, value, best, status))
    history = pd.DataFrame(rows, columns=["trial", "value", "best_so_far", "status"])

    nf = data.tune.get("noise_floor") if isinstance(data.tune.get("noise_floor"), dict) else {}
    band = None
    if all(math.isfinite(num(nf.get(k))) for k in ("median", "min", "max")):
        band = (num(nf["median"]), num(nf["min"]), num(nf["max"]))

    names = knob_names(data)
    ok = ok_trials(data)
    knobs = pd.DataFrame([{"trial": t.number, "value": objective_of(t), **{k: t.params.get(k) for k in names}}
                          for t in ok], columns=["trial", "value", *names])
    log_knobs = log_scale_knobs(data)
    kinds, choices = knob_kinds(data)
    importances, imp_msg = _importances(data, ok)
    pareto, pareto_msg = _pareto(data, ok)
    message = None
    if not data.trials:
        message = data.study_error or "The study has no trials yet."
    gpu = data.tune.get("gpu_minutes") if isinstance(data.tune.get("gpu_minutes"), dict) else {}
    by_phase = {k: num(v) for k, v in (gpu.get("by_phase") or {}).items()}
    total = sum(v for v in by_phase.values() if math.isfinite(v))
    minutes = None
    if total > 0:
        minutes = pd.DataFrame([(k, v, v / total) for k, v in by_phase.items() if math.isfinite(v)],
                               columns=["phase", "gpu_minutes", "share"])
        minutes.attrs["device"] = gpu.get("device", "cuda")  # cpu: a CPU study's minutes
    return Search(history=history, direction=direction, objective_name=name, baseline_band=band,
                  importances=importances, importances_message=imp_msg, knobs=knobs, knob_names=names,
                  log_knobs=log_knobs, pareto=pareto, pareto_message=pareto_msg, message=message,
                  knob_kinds={k: kinds[k] for k in names if k in kinds},
                  knob_choices={k: choices[k] for k in names if k in choices}, gpu_minutes=minutes,
                  gpu_minutes_line=gpu_minutes_line(gpu, data.tune.get("screening")) if minutes is not None else None,
                  profile_line=profile_line(prof) if isinstance(prof := data.tune.get("profile"), dict) else None,
                  warm_start_line=warm_start_line(warm, (data.tune.get("spec") or {}).get("sampler", {}).get(
                      "n_startup_trials")) if isinstance(warm := data.tune.get("warm_start"), dict) else None,
                  walk_line=walk_line(walk, (data.tune.get("spec") or {}).get("sampler", {}).get(
                      "n_startup_trials")) if isinstance(walk := data.tune.get("walk"), dict) else None)


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def _importances(data: StudyData, ok: list) -> tuple[pd.DataFrame | None, str | None]:
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return None, (f"Too few finished trials for parameter importances ({len(ok)}; {MIN_IMPORTANCE_TRIALS} "
                      "needed: with fewer, a ranking of the knobs would rank noise).")
    varied = [k for k in {p for t in ok for p in t.params}
              if len({repr(t.params.get(k)) for t in ok}) > 1]
    if not varied:
        return None, "Every finished trial used the same knob values: no importances."
    try:
        import optuna

        evaluator, method = _importance_evaluator()
        with _quiet_optuna():
            # Importances of throughput among the trials that ran: failures (value 0) would rank
            # "what crashes" instead of "what is fast"; the trials table shows those.
            # A single-objective copy on the first objective (throughput): PED-ANOVA then follows the
            # study's direction (with a `target` it would rank the knobs of *low* throughput).
            tmp = optuna.create_study(direction=(data.directions or ["maximize"])[0])
            tmp.add_trials([optuna.trial.create_trial(value=t.values[0], params=t.params,
                                                      distributions=t.distributions) for t in ok])
            imp = optuna.importance.get_param_importances(tmp, evaluator=evaluator)
    except Exception as e:  # noqa: BLE001 - e.g. conditional knobs with no common trial
        return None, f"Parameter importances could not be computed: {e}"
    df = pd.DataFrame(list(imp.items()), columns=["knob", "importance"])
    df.attrs["method"] = method
    return df.sort_values("importance", ascending=False, ignore_index=True), None


def _importance_evaluator() -> tuple[Any, str]:
    """Optuna's default fANOVA where scikit-learn is installed, else PED-ANOVA (needs nothing more)."""
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    try:
        importlib.import_module("sklearn")  # fANOVA's random forest
    except ImportError:
        return PedAnovaImportanceEvaluator(), "PED-ANOVA"
    return FanovaImportanceEvaluator(seed=0), "fANOVA"


def _pareto(data: StudyData, ok: list) -> tuple[pd.DataFrame | None, str | None]:
    if len(data.directions) != 2:
        return None, ("Single objective: no Pareto front." if data.directions else None)
    names = (data.metric_names + ["objective 0", "objective 1"])[:2]
    pts = [(t.number, float(t.values[0]), float(t.values[1])) for t in ok if len(t.values) >= 2]
    if not pts:
        return None, "No finished trial yet: no Pareto front."
    sign = [1.0 if d == "maximize" else -1.0 for d in data.directions]
    front = []
    for _, a0, a1 in pts:
        dominated = any(sign[0] * b0 >= sign[0] * a0 and sign[1] * b1 >= sign[1] * a1
                        and (b0, b1) != (a0, a1) for _, b0, b1 in pts)
        front.append(not dominated)
    df = pd.DataFrame(pts, columns=["trial", names[0], names[1]])
    df["on_front"] = front
    return df, None


# --------------------------------------------------------------------------- trials


class Trials(NamedTuple):
    table: pd.DataFrame
    """trial, state, status, the objective column(s), mfu_pct, max_reserved_gib, duration_s,
    failure_kind, failure_reason, then one column per knob."""
    objective_columns: list[str]
    knob_names: list[str]
    status_counts: pd.Series
    """Trials per status, most frequent first."""
    log_tails: pd.DataFrame
    """trial, status, log_tail: the last log lines of each failed trial."""
    message: str | None
    notes: list[str] = []
    """Why a column is left out: MFU and reserved memory, when no trial recorded them (CPU runs)."""


LOG_TAIL_LINES = 15
"""Log lines kept per failed trial: the traceback's end, not the whole log."""
NOT_FAILED = ("ok", "pruned", "running", "waiting", "skipped_budget")
"""Statuses that are not a failure of the trial's config (skipped_budget: the budget ran out first)."""


def trials_section(data: StudyData) -> Trials:
    names = knob_names(data)
    obj_cols = list(data.metric_names) if len(data.directions) > 1 else ["value"]
    rows, tails = [], []
    for t in data.trials:
        status = trial_status(t)
        s = t.user_attrs.get("summary") if isinstance(t.user_attrs.get("summary"), dict) else {}
        run = data.trial_run(t.number) if status not in NOT_FAILED else None
        failure = (run.failure if run is not None else None) or {}
        reason = t.user_attrs.get("failure_reason") or failure.get("message") or ""
        kind = "" if status in NOT_FAILED else (failure.get("kind") or status)
        duration = t.duration.total_seconds() if t.duration is not None else math.nan
        row = {"trial": t.number, "state": t.state.name.lower(), "status": status}
        for i, c in enumerate(obj_cols):
            row[c] = objective_of(t, i)
        row.update({"mfu_pct": num(s.get("mfu_pct")), "max_reserved_gib": num(s.get(MAX_RESERVED_GIB)),
                    "duration_s": duration, "failure_kind": kind, "failure_reason": str(reason)})
        row.update({k: t.params.get(k) for k in names})
        rows.append(row)
        tail = t.user_attrs.get("log_tail")
        if kind and not tail and run is not None:
            try:
                tail = "\n".join((run.path / "log.txt").read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
            except OSError:
                tail = None
        if kind and tail:
            tails.append((t.number, status, "\n".join(str(tail).splitlines()[-LOG_TAIL_LINES:])))
    table = pd.DataFrame(rows, columns=["trial", "state", "status", *obj_cols, "mfu_pct", "max_reserved_gib",
                                        "duration_s", "failure_kind", "failure_reason", *names])
    counts = table["status"].value_counts() if len(table) else pd.Series(dtype=int, name="count")
    message = None if len(table) else (data.study_error or "The study has no trials yet.")
    notes = []
    empty = [c for c in ("mfu_pct", "max_reserved_gib") if len(table) and table[c].isna().all()]
    if empty:  # a column of dashes only: left out, and said why in one line
        table = table.drop(columns=empty)
        what = {"mfu_pct": "MFU (no peak FLOP/s for the device: a CPU)",
                "max_reserved_gib": "reserved memory (no device memory: a CPU)"}
        notes.append("No trial recorded " + " or ".join(what[c] for c in empty) + ": "
                     + ("those columns are" if len(empty) > 1 else "that column is") + " left out.")
    return Trials(table=table, objective_columns=obj_cols, knob_names=names, status_counts=counts,
                  log_tails=pd.DataFrame(tails, columns=["trial", "status", "log_tail"]), message=message,
                  notes=notes)
