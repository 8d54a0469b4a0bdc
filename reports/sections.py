"""The report's sections as data: one function per section, StudyData in, NamedTuple of DataFrames out.

Nothing here draws (``reports.render`` does). Every section has a ``message``:
None when it has something to show, else the one line the report prints instead
(a study in progress, one GPU, no kernel sweep...). Parts of a section that can
be missing on their own carry their own ``*_message``.

"Baseline" is the study's base config, measured by the baseline repeats
(``baseline/<i>/``) and, where the candidates were re-measured, by the
interleaved A/B runs of ``validation.json``. "Best" is the validated winner when
there is one, else the exported config's trial, else the trial with the best
objective among those that ran to the end (status ``ok``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from reports._load import PHASES, RunData, StudyData, _flatten, knob_key, lookup_key, mask_url, num
from reports.sections_numerics import CompileSection, NumericsSection, compile_section, numerics_section
from workbench.vocab import REAL_TOKENS_PER_S

__all__ = [
    "SECTIONS",
    "DataSection",
    "Environment",
    "Kernels",
    "Memory",
    "NOT_FAILED",
    "NoiseFloor",
    "ReportData",
    "Search",
    "SectionFailed",
    "Speedup",
    "Summary",
    "TimeSection",
    "Trials",
    "best_trial_number",
    "compute_report",
    "data_section",
    "environment_section",
    "kernels_section",
    "memory_section",
    "search_section",
    "summary_section",
    "sweep_by_config",
    "time_section",
    "trials_section",
]

TPUT = REAL_TOKENS_PER_S
MIN_IMPORTANCE_TRIALS = 4
"""Finished trials needed before importances are computed: with fewer, any evaluator ranks noise."""
TIMELINE_STEPS = 3
"""Steps of each run drawn in the phase timeline: enough to see the repeat, few enough to read."""
MEMORY_KNOB_WORDS = ("allocator", "memory_domain", "micro_batch", "pinned", "graph_capture", "compile")
"""Knobs whose config key contains one of these are plotted against fragmentation."""


# --------------------------------------------------------------------------- shared helpers


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


def _log_knobs(data: StudyData) -> list[str]:
    """Knobs searched on a log scale (their Optuna distribution has log=True), in knob order."""
    logs = {k for t in data.trials for k, d in t.distributions.items() if getattr(d, "log", False)}
    return [k for k in knob_names(data) if k in logs]


def _objective(t: Any, i: int = 0) -> float:
    if t.values and len(t.values) > i:
        return float(t.values[i])
    return math.nan


def _better(direction: str) -> Callable[[float, float], bool]:
    return (lambda a, b: a > b) if direction != "minimize" else (lambda a, b: a < b)


def best_trial_number(data: StudyData) -> tuple[int | None, str]:
    """The trial shown as "best" and how it was chosen."""
    winner = data.validation.get("winner")
    if isinstance(winner, dict) and isinstance(winner.get("trial"), int):
        return winner["trial"], "validated winner"
    if isinstance(data.provenance.get("trial"), int):
        return data.provenance["trial"], "exported config"
    ok = ok_trials(data)
    if not ok:
        return None, "no finished trial"
    direction = data.directions[0] if data.directions else "maximize"
    key = (lambda t: _objective(t)) if direction != "minimize" else (lambda t: -_objective(t))
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


def baseline_runs(data: StudyData) -> list[RunData]:
    """The baseline repeats, then the baseline arms of the A/B validation."""
    return list(data.baseline_runs) + data.validation_baseline_runs()


def _median(values: Iterable[float]) -> float:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(statistics.median(vals)) if vals else math.nan


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    return [num(v) for v in values if math.isfinite(num(v))]


def _candidate(data: StudyData, number: int | None) -> dict | None:
    for c in data.validation.get("candidates") or []:
        if isinstance(c, dict) and c.get("trial") == number and number is not None:
            return c
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


# --------------------------------------------------------------------------- 1. summary


class Speedup(NamedTuple):
    """Speedup of the best config over the baseline."""

    median: float
    ci_low: float
    """Low end of the 95% interval; NaN when not re-measured."""
    ci_high: float
    significant: bool | None
    rounds: int
    """Interleaved A/B rounds behind the interval (0 = a single study measurement each)."""
    source: str


class Summary(NamedTuple):
    table: pd.DataFrame
    """metric, baseline, best, ratio (best / baseline), source."""
    speedup: Speedup | None
    knobs: pd.DataFrame
    """knob, baseline, best, changed (None where the baseline value is unknown)."""
    candidates: pd.DataFrame
    """trial, rounds, speedup_median, ci_low, ci_high, significant (from validation.json)."""
    ab_runs: pd.DataFrame
    """candidate, arm ('baseline' | 'candidate'), round, tokens_per_s: every A/B measurement."""
    best_trial: int | None
    best_how: str
    config_text: str | None
    notes: list[str]
    message: str | None


def summary_section(data: StudyData) -> Summary:
    number, how = best_trial_number(data)
    notes: list[str] = []
    base = baseline_runs(data)
    best = best_runs(data, number)
    cand = _candidate(data, number)

    # Throughput: interleaved A/B runs where they exist (same conditions for both arms).
    rows = []
    b_runs = _numbers((cand or {}).get("baseline_runs")) or _numbers(data.validation.get("baseline_runs"))
    if b_runs:
        b_tput, b_src = _median(b_runs), f"median of {len(b_runs)} interleaved baseline runs"
    elif any(math.isfinite(r.metric(TPUT)) for r in data.baseline_runs):
        vals = [r.metric(TPUT) for r in data.baseline_runs]
        b_tput, b_src = _median(vals), f"median of {sum(map(math.isfinite, vals))} baseline repeats"
    elif math.isfinite(num((data.tune.get("noise_floor") or {}).get("median"))):
        b_tput, b_src = num(data.tune["noise_floor"]["median"]), "noise floor median"
    elif math.isfinite(num(data.provenance.get("baseline_tokens_per_s_per_gpu"))):
        b_tput, b_src = num(data.provenance["baseline_tokens_per_s_per_gpu"]), "exported config"
    else:
        b_tput, b_src = math.nan, "not measured"
    c_runs = _numbers((cand or {}).get("runs"))
    trial = data.trial(number) if number is not None else None
    if c_runs:
        t_tput, t_src = _median(c_runs), f"median of {len(c_runs)} interleaved re-runs"
    elif trial is not None and trial.values:
        t_tput, t_src = _objective(trial), "the trial's measurement"
    elif best and math.isfinite(best[0].metric(TPUT)):
        t_tput, t_src = best[0].metric(TPUT), "the trial's summary.json"
    else:
        t_tput, t_src = math.nan, "not measured"
    rows.append((TPUT, b_tput, t_tput, f"baseline: {b_src}; best: {t_src}"))

    step_b = _phase_means(base)
    step_t = _phase_means(best)
    for key in ("mfu_pct", "memory/max_reserved_gib", "memory/max_allocated_gib", "memory/max_rss_gib",
                "data/padding_ratio"):
        bv = _median(r.metric(key) for r in base)
        tv = _median(r.metric(key) for r in best)
        if math.isfinite(bv) or math.isfinite(tv):
            rows.append((key, bv, tv, "median over runs' summaries"))
    rows.append(("time/step_s", step_b.get("step_s", math.nan), step_t.get("step_s", math.nan),
                 "mean over measured steps of phases.csv"))
    table = pd.DataFrame(rows, columns=["metric", "baseline", "best", "source"])
    with np.errstate(divide="ignore", invalid="ignore"):
        table.insert(3, "ratio", table["best"] / table["baseline"])

    speedup = _speedup(data, number, b_tput, t_tput)
    knobs = _changed_knobs(data, number)

    candidates = pd.DataFrame(
        [(c.get("trial"), len(_numbers(c.get("runs"))), num(c.get("speedup_median")), num(c.get("ci_low")),
          num(c.get("ci_high")), c.get("significant"))
         for c in data.validation.get("candidates") or [] if isinstance(c, dict)],
        columns=["trial", "rounds", "speedup_median", "ci_low", "ci_high", "significant"])
    ab = []
    for c in data.validation.get("candidates") or []:
        if not isinstance(c, dict):
            continue
        for arm, key in (("baseline", "baseline_runs"), ("candidate", "runs")):
            for i, v in enumerate(_numbers(c.get(key))):
                ab.append((c.get("trial"), arm, i, v))
    ab_runs = pd.DataFrame(ab, columns=["candidate", "arm", "round", "tokens_per_s"])

    winner = data.validation.get("winner")
    if isinstance(winner, dict) and winner.get("trial") is None and data.validation:
        notes.append("No candidate beat the baseline beyond its noise in the A/B re-measurement; "
                     "the exported config is the baseline." if data.exported_config else
                     "No candidate beat the baseline beyond its noise in the A/B re-measurement.")
    if not data.validation:
        notes.append("The top candidates were not re-measured against the baseline (no validation.json): "
                     "the speedup below is a single measurement each, with no interval.")
    message = None
    failed = [r for r in data.baseline_runs if r.failure and not math.isfinite(r.metric(TPUT))]
    if failed and not math.isfinite(b_tput):
        f = failed[0].failure
        message = (f"The baseline failed ({failed[0].name}: {f.get('kind', 'failure')}: {f.get('message', '')}); "
                   f"see {failed[0].name}/log.txt.")
    elif number is None and not math.isfinite(b_tput):
        message = ("No measurement yet: " + (data.study_error or "the study has no finished trial")
                   + " and no baseline run was recorded.")
    elif number is None:
        message = "No trial has finished yet; only the baseline was measured."
    return Summary(table=table, speedup=speedup, knobs=knobs, candidates=candidates, ab_runs=ab_runs,
                   best_trial=number, best_how=how, config_text=data.exported_config_text, notes=notes,
                   message=message)


def _speedup(data: StudyData, number: int | None, b: float, t: float) -> Speedup | None:
    winner = data.validation.get("winner")
    cand = _candidate(data, number)
    for src, d in (("validation.json winner", winner), ("validation.json candidate", cand)):
        if isinstance(d, dict) and math.isfinite(num(d.get("speedup_median"))) and (
                d.get("trial", number) == number):
            rounds = len(_numbers((cand or {}).get("ratios"))) or len(_numbers((cand or {}).get("runs")))
            return Speedup(num(d["speedup_median"]), num(d.get("ci_low")), num(d.get("ci_high")),
                           d.get("significant"), rounds, src)
    prov = data.provenance
    if number is not None and prov.get("trial") == number and math.isfinite(num(prov.get("speedup"))):
        ci = prov.get("speedup_ci") if isinstance(prov.get("speedup_ci"), list) else [None, None]
        ci = (ci + [None, None])[:2]
        return Speedup(num(prov["speedup"]), num(ci[0]), num(ci[1]), prov.get("significant"), 0,
                       "exported config provenance")
    if math.isfinite(b) and math.isfinite(t) and b > 0:
        return Speedup(t / b, math.nan, math.nan, None, 0, "ratio of single measurements")
    return None


def _changed_knobs(data: StudyData, number: int | None) -> pd.DataFrame:
    names = knob_names(data)
    base_cfg = data.baseline_config()
    trial = data.trial(number) if number is not None else None
    best_cfg = None
    rows = []
    for k in names:
        if trial is not None and k in trial.params:
            bv = trial.params[k]
        else:
            if best_cfg is None and number is not None:
                run = data.trial_run(number)
                best_cfg = (run.config if run else None) or {}
            found, bv = lookup_key(best_cfg or {}, k)
            bv = bv if found else None
        found, av = lookup_key(base_cfg, k)
        changed = None if not found else not _same(av, bv)
        rows.append((k, av if found else None, bv, changed))
    return pd.DataFrame(rows, columns=["knob", "baseline", "best", "changed"])


# --------------------------------------------------------------------------- 2. search


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


def search_section(data: StudyData) -> Search:
    direction = data.directions[0] if data.directions else "maximize"
    name = data.metric_names[0] if data.metric_names else TPUT
    better = _better(direction)
    rows, best = [], math.nan
    for t in data.trials:
        status = trial_status(t)
        if t.state.name == "COMPLETE" and t.values:
            value = _objective(t)
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
    knobs = pd.DataFrame([{"trial": t.number, "value": _objective(t), **{k: t.params.get(k) for k in names}}
                          for t in ok], columns=["trial", "value", *names])
    log_knobs = _log_knobs(data)
    importances, imp_msg = _importances(data, ok)
    pareto, pareto_msg = _pareto(data, ok)
    message = None
    if not data.trials:
        message = data.study_error or "The study has no trials yet."
    return Search(history=history, direction=direction, objective_name=name, baseline_band=band,
                  importances=importances, importances_message=imp_msg, knobs=knobs, knob_names=names,
                  log_knobs=log_knobs, pareto=pareto, pareto_message=pareto_msg, message=message)


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
        return None, (f"Too few finished trials for parameter importances ({len(ok)}; "
                      f"{MIN_IMPORTANCE_TRIALS} needed).")
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
        import sklearn  # noqa: F401 - fANOVA's random forest
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


# --------------------------------------------------------------------------- 3. where the time goes


class TimeSection(NamedTuple):
    breakdown: pd.DataFrame
    """Index run ('baseline', 'best'); columns: the phases (mean s/step), step_s, steps, source."""
    timeline: pd.DataFrame
    """run, step, phase, start_s, duration_s: contiguous phases of the first measured steps."""
    step_times: pd.DataFrame
    """run, source, step, seq_len, step_s: every measured step of every run of each arm."""
    step_stats: pd.DataFrame
    """Index run; steps, median_s, p10_s, p90_s, cv_pct (all steps), noise_cv_pct (median over bucket lengths
    with >= 3 steps of the step-time CV at that length: the noise, without the bucket-length spread)."""
    message: str | None
    comm: pd.DataFrame = pd.DataFrame()
    """Index run ('baseline', 'best'); comm_total_s, comm_exposed_s (per step), overlap_pct, mode, buckets,
    bucket_size_mb, overlap_ratio (the knobs), source: gradient communication, medians over the arm's runs."""
    comm_message: str | None = None
    """Why there is no communication table (single-process runs), else None."""


def _measured(runs: list[RunData]) -> list[tuple[RunData, pd.DataFrame]]:
    return [(r, r.measured_phases) for r in runs if r.measured_phases is not None]


def _phase_means(runs: list[RunData]) -> dict[str, Any]:
    """Mean seconds per step per phase over every measured step of the runs (summary fallback)."""
    tables = _measured(runs)
    if tables:
        df = pd.concat([t for _, t in tables], ignore_index=True)
        out: dict[str, Any] = {p: float(pd.to_numeric(df[p], errors="coerce").mean()) if p in df else 0.0
                               for p in PHASES}
        out["step_s"] = float(pd.to_numeric(df["step_s"], errors="coerce").mean())
        out["steps"] = len(df)
        names = [r.name for r, _ in tables]
        out["source"] = "phases.csv of " + (", ".join(names) if len(names) <= 3 else
                                            f"{names[0]}, {names[1]}, … {names[-1]} ({len(names)} runs)")
        return out
    for r in runs:
        ph = r.summary.get("phase_s_per_step")
        if isinstance(ph, dict) and ph:
            out = {p: num(ph.get(p)) if math.isfinite(num(ph.get(p))) else 0.0 for p in PHASES}
            out["step_s"] = sum(out[p] for p in PHASES)
            out["steps"] = 0
            out["source"] = f"summary of {r.name}"
            return out
    return {}


def time_section(data: StudyData) -> TimeSection:
    number, _ = best_trial_number(data)
    arms = {"baseline": baseline_runs(data), "best": best_runs(data, number)}
    rows = {}
    for arm, runs in arms.items():
        m = _phase_means(runs)
        if m:
            rows[arm] = m
    breakdown = pd.DataFrame.from_dict(rows, orient="index",
                                       columns=[*PHASES, "step_s", "steps", "source"])
    breakdown.index.name = "run"

    tl, st = [], []
    for arm, runs in arms.items():
        tables = _measured(runs)
        for r, df in tables:
            seq = pd.to_numeric(df["seq_len"], errors="coerce") if "seq_len" in df else [math.nan] * len(df)
            for step, n, s in zip(df["step"], seq, pd.to_numeric(df["step_s"], errors="coerce")):
                st.append((arm, r.name, int(step), float(n), float(s)))
        if tables:
            r, df = tables[0]
            t0 = 0.0
            for _, row in df.head(TIMELINE_STEPS).iterrows():
                start = t0
                for p in PHASES:
                    d = float(num(row.get(p))) if math.isfinite(num(row.get(p))) else 0.0
                    tl.append((arm, int(row["step"]), p, start, d))
                    start += d
                t0 += float(row["step_s"])
    timeline = pd.DataFrame(tl, columns=["run", "step", "phase", "start_s", "duration_s"])
    step_times = pd.DataFrame(st, columns=["run", "source", "step", "seq_len", "step_s"])
    stats = {}
    for arm, g in step_times.groupby("run", sort=False):
        s = g["step_s"]
        by_len = g.groupby("seq_len")["step_s"]
        cvs = (100 * by_len.std(ddof=1) / by_len.mean())[by_len.size() >= 3]
        stats[arm] = {"steps": len(s), "median_s": s.median(), "p10_s": s.quantile(0.1),
                      "p90_s": s.quantile(0.9), "cv_pct": 100 * s.std(ddof=1) / s.mean() if len(s) > 1 else 0.0,
                      "noise_cv_pct": float(cvs.median()) if len(cvs) else math.nan}
    step_stats = pd.DataFrame.from_dict(stats, orient="index",
                                        columns=["steps", "median_s", "p10_s", "p90_s", "cv_pct", "noise_cv_pct"])
    step_stats.index.name = "run"
    message = None
    if breakdown.empty:
        message = "No phase timings yet: no run wrote phases.csv or a phase summary."
    comm, comm_message = _comm_table(arms)
    return TimeSection(breakdown=breakdown, timeline=timeline, step_times=step_times,
                       step_stats=step_stats, message=message, comm=comm, comm_message=comm_message)


_COMM_COLS = ["comm_total_s", "comm_exposed_s", "overlap_pct", "mode", "buckets", "bucket_size_mb", "overlap_ratio",
              "source"]


def _comm_table(arms: dict[str, list[RunData]]) -> tuple[pd.DataFrame, str | None]:
    """Exposed communication and overlap achieved per arm (run summaries' ``comm/*``; workbench/train/metrics.py)."""
    rows = {}
    for arm, runs in arms.items():
        with_comm = [r for r in runs if math.isfinite(r.metric("comm/total_s"))]
        if not with_comm:
            continue
        total = _median(r.metric("comm/total_s") for r in with_comm)
        exposed = _median(r.metric("comm/exposed_s") for r in with_comm)
        first = with_comm[0].summary
        rows[arm] = {"comm_total_s": total, "comm_exposed_s": exposed,
                     "overlap_pct": _median(r.metric("comm/overlap_pct") for r in with_comm),
                     "mode": first.get("comm/mode"), "buckets": num(first.get("comm/buckets")),
                     "bucket_size_mb": num(first.get("comm/bucket_size_mb")),
                     "overlap_ratio": num(first.get("comm/overlap_ratio")),
                     "source": f"summary of {len(with_comm)} run(s)"}
    df = pd.DataFrame.from_dict(rows, orient="index", columns=_COMM_COLS)
    df.index.name = "run"
    message = None if rows else ("No gradient communication: single-process runs (bucket size and overlap ratio "
                                 "act with several GPUs).")
    return df, message


# --------------------------------------------------------------------------- 4. memory


class Memory(NamedTuple):
    peaks: pd.DataFrame
    """Index run ('baseline', 'best'); max_allocated_gib, max_reserved_gib, reserved_minus_allocated_gib,
    max_rss_gib, predicted_peak_gib (the memory model's; medians over the arm's runs)."""
    by_trial: pd.DataFrame
    """trial, value, max_allocated_gib, max_reserved_gib, reserved_minus_allocated_gib, predicted_peak_gib, then
    the memory knobs."""
    memory_knobs: list[str]
    log_knobs: list[str]
    """Memory knobs searched on a log scale."""
    histogram: pd.DataFrame | None
    """size_bytes, count: allocation sizes, from memory_analysis.json."""
    suggestions: list[str]
    analysis_source: str | None
    analysis_message: str | None
    message: str | None
    analysis_summary: pd.DataFrame | None = None
    """metric, value: peak allocated / reserved GiB, unused reserved at peak allocation (GiB, %), max reserved -
    allocated GiB, allocator retries, from memory_analysis.json (workbench/memory/analysis.py)."""
    fragmentation: pd.DataFrame | None = None
    """event, time_us, allocated_gib, reserved_gib, fragmentation_gib: the recorded steps' timeline."""
    suggested_allocator: dict | None = None
    """The allocator settings the analysis suggests changing ({option: value})."""


_MEM_KEYS = ("memory/max_allocated_gib", "memory/max_reserved_gib", "memory/max_rss_gib",
             "memory/predicted_peak_gib")


def memory_section(data: StudyData) -> Memory:
    number, _ = best_trial_number(data)
    arms = {"baseline": baseline_runs(data), "best": best_runs(data, number)}
    peaks = {}
    for arm, runs in arms.items():
        vals = {k.split("/")[1]: _median(r.metric(k) for r in runs) for k in _MEM_KEYS}
        vals["reserved_minus_allocated_gib"] = vals["max_reserved_gib"] - vals["max_allocated_gib"]
        if any(math.isfinite(v) for v in vals.values()):
            peaks[arm] = vals
    cols = ["max_allocated_gib", "max_reserved_gib", "reserved_minus_allocated_gib", "max_rss_gib",
            "predicted_peak_gib"]
    peaks_df = pd.DataFrame.from_dict(peaks, orient="index", columns=cols)
    peaks_df.index.name = "run"

    names = knob_names(data)
    mem_knobs = [k for k in names if any(w in knob_key(k) for w in MEMORY_KNOB_WORDS)]
    rows = []
    for t in ok_trials(data):
        s = t.user_attrs.get("summary") if isinstance(t.user_attrs.get("summary"), dict) else {}
        if not s:
            run = data.trial_run(t.number)
            s = run.summary if run else {}
        a, r = num(s.get("memory/max_allocated_gib")), num(s.get("memory/max_reserved_gib"))
        rows.append({"trial": t.number, "value": _objective(t), "max_allocated_gib": a,
                     "max_reserved_gib": r, "reserved_minus_allocated_gib": r - a,
                     "predicted_peak_gib": num(s.get("memory/predicted_peak_gib")),
                     **{k: t.params.get(k) for k in mem_knobs}})
    by_trial = pd.DataFrame(rows, columns=["trial", "value", "max_allocated_gib", "max_reserved_gib",
                                           "reserved_minus_allocated_gib", "predicted_peak_gib", *mem_knobs])

    histogram, suggestions, source, a_msg, doc = _memory_analysis(data, number)
    message = None
    if peaks_df.empty and by_trial["max_reserved_gib"].isna().all():
        message = "No memory figures yet: no run recorded memory/max_allocated_gib or memory/max_reserved_gib."
    elif peaks_df.get("max_reserved_gib", pd.Series(dtype=float)).isna().all() and \
            by_trial["max_reserved_gib"].isna().all():
        message = ("No device memory figures: the runs were on the CPU (host peak RSS "
                   + ", ".join(f"{arm} {v:.2f} GiB" for arm, v in peaks_df["max_rss_gib"].items()
                               if math.isfinite(v)) + ").")
    summary, timeline, suggested = _analysis_tables(doc)
    return Memory(peaks=peaks_df, by_trial=by_trial, memory_knobs=mem_knobs,
                  log_knobs=[k for k in _log_knobs(data) if k in mem_knobs], histogram=histogram,
                  suggestions=suggestions, analysis_source=source, analysis_message=a_msg, message=message,
                  analysis_summary=summary, fragmentation=timeline, suggested_allocator=suggested)


def _analysis_tables(doc: dict | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None, dict | None]:
    """Peaks, fragmentation and retries; the timeline; the suggested settings (schema: workbench/memory/analysis.py)."""
    if not doc:
        return None, None, None
    gib = 1024 ** 3
    peak = doc.get("peak") if isinstance(doc.get("peak"), dict) else {}
    frag = doc.get("fragmentation") if isinstance(doc.get("fragmentation"), dict) else {}
    rows = [("peak allocated GiB", num(peak.get("allocated_bytes")) / gib),
            ("peak reserved GiB", num(peak.get("reserved_bytes")) / gib),
            ("unused reserved at peak allocation GiB", num(frag.get("at_peak_allocated_bytes")) / gib),
            ("unused reserved at peak allocation %", num(frag.get("at_peak_allocated_pct"))),
            ("max reserved − allocated GiB", num(frag.get("max_bytes")) / gib),
            ("allocator retries", num(doc.get("alloc_retries"))),
            ("allocations recorded", num(doc.get("allocations")))]
    summary = pd.DataFrame([r for r in rows if math.isfinite(r[1])], columns=["metric", "value"])
    tl = doc.get("timeline")
    timeline = None
    if isinstance(tl, list) and tl and all(isinstance(x, dict) for x in tl):
        timeline = pd.DataFrame({
            "event": [num(x.get("event")) for x in tl], "time_us": [num(x.get("time_us")) for x in tl],
            "allocated_gib": [num(x.get("allocated_bytes")) / gib for x in tl],
            "reserved_gib": [num(x.get("reserved_bytes")) / gib for x in tl]})
        timeline["fragmentation_gib"] = timeline["reserved_gib"] - timeline["allocated_gib"]
    suggested = doc.get("suggested_allocator") if isinstance(doc.get("suggested_allocator"), dict) else None
    return (summary if len(summary) else None), timeline, suggested


def _memory_analysis(data: StudyData, number: int | None
                     ) -> tuple[pd.DataFrame | None, list[str], str | None, str | None, dict | None]:
    import json

    places = [data.study_dir]
    run = data.trial_run(number) if number is not None else None
    if run is not None:
        places.append(run.path)
    places += [r.path for r in data.baseline_runs[:1]]
    for place in places:
        path = place / "memory_analysis.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            return None, [], str(path), f"memory_analysis.json could not be read: {e}", None
        if not isinstance(doc, dict):
            return None, [], str(path), "memory_analysis.json is not a JSON object.", None
        hist = _histogram(doc)
        sugg = []
        for s in doc.get("suggestions") or []:
            if isinstance(s, str):
                sugg.append(s)
            elif isinstance(s, dict):
                text = s.get("text") or s.get("message") or s.get("suggestion")
                if text:
                    sugg.append(str(text))
        rel = path.relative_to(data.study_dir) if path.is_relative_to(data.study_dir) else path
        return hist, sugg, str(rel), (None if hist is not None or sugg else
                                      "memory_analysis.json has no allocation-size histogram or suggestions."), doc
    return None, [], None, ("Memory analysis not run for this study (no memory_analysis.json; "
                            "`python -m workbench.memory analyze --out runs/<study>` writes one)."), None


def _histogram(doc: dict) -> pd.DataFrame | None:
    for key in ("allocation_size_histogram", "size_histogram", "histogram", "allocation_sizes"):
        h = doc.get(key)
        if isinstance(h, dict) and h:
            rows = [(num(k), num(v)) for k, v in h.items()]
        elif isinstance(h, list) and h and all(isinstance(x, dict) for x in h):
            size_key = next((k for k in ("size_bytes", "bytes", "size", "bin", "upper_bytes") if k in h[0]), None)
            count_key = next((k for k in ("count", "n", "allocations") if k in h[0]), None)
            if not size_key or not count_key:
                continue
            rows = [(num(x.get(size_key)), num(x.get(count_key))) for x in h]
        else:
            continue
        df = pd.DataFrame(rows, columns=["size_bytes", "count"]).dropna()
        return df.sort_values("size_bytes", ignore_index=True) if len(df) else None
    return None


# --------------------------------------------------------------------------- 5. kernels


class Kernels(NamedTuple):
    launch: pd.DataFrame
    """kernel, then each launch parameter (num_warps, num_stages, block sizes...), measured_ms,
    best_in_sweep_ms (NaN without a sweep)."""
    sweep: pd.DataFrame | None
    """kernel_sweep.csv as written (long format: one row per kernel and launch configuration)."""
    sweep_source: str | None
    message: str | None


_TIME_COLUMNS = ("median_ms", "time_ms", "ms", "median")


def kernels_section(data: StudyData) -> Kernels:
    number, _ = best_trial_number(data)
    chosen: dict[str, dict[str, Any]] = {}
    run = data.trial_run(number) if number is not None else None
    cfg = (run.config if run else None) or (data.exported_config if number is not None and
                                            data.provenance.get("trial") == number else None)
    found, kernels = lookup_key(cfg or {}, "loongforge.compute_domain.kernels")
    if found and isinstance(kernels, dict):
        for k, params in kernels.items():
            if isinstance(params, dict):
                chosen.setdefault(str(k), {}).update(params)
    trial = data.trial(number) if number is not None else None
    for name, v in (trial.params.items() if trial is not None else []):
        key = knob_key(name)
        if "kernels." in key:
            kernel, _, param = key.split("kernels.", 1)[1].partition(".")
            if param:
                chosen.setdefault(kernel, {})[param] = v

    sweep, source = None, None
    for place in [data.study_dir] + ([run.path] if run is not None else []):
        try:
            sweep = pd.read_csv(place / "kernel_sweep.csv")
        except (OSError, ValueError):
            continue
        source = str((place / "kernel_sweep.csv").relative_to(data.study_dir)) \
            if place.is_relative_to(data.study_dir) else str(place / "kernel_sweep.csv")
        break
    if sweep is not None and ("kernel" not in sweep.columns or sweep.empty):
        sweep = None

    params = sorted({p for d in chosen.values() for p in d}, key=_param_order)
    rows = []
    time_col = next((c for c in _TIME_COLUMNS if sweep is not None and c in sweep.columns), None)
    for kernel in sorted(chosen):
        row: dict[str, Any] = {"kernel": kernel, **{p: chosen[kernel].get(p) for p in params}}
        row["measured_ms"], row["best_in_sweep_ms"] = math.nan, math.nan
        if sweep is not None and time_col:
            ks = sweep[sweep["kernel"] == kernel]
            # parameters this kernel has (a long-format sweep leaves other kernels' columns empty)
            keys = [p for p in params if p in ks.columns and ks[p].notna().any() and chosen[kernel].get(p) is not None]
            match = ks
            for p in keys:
                match = match[match[p] == chosen[kernel][p]]
            if len(match):
                row["measured_ms"] = float(pd.to_numeric(match[time_col], errors="coerce").median())
            if keys and len(ks):
                per_cfg = ks.groupby(keys)[time_col].median()
                row["best_in_sweep_ms"] = float(per_cfg.min())
        rows.append(row)
    # Kernels swept but not configured still show their fastest measured configuration.
    if sweep is not None and time_col:
        for kernel in sorted(set(sweep["kernel"].astype(str)) - set(chosen)):
            ks = sweep[sweep["kernel"] == kernel]
            rows.append({"kernel": kernel, **{p: None for p in params}, "measured_ms": math.nan,
                         "best_in_sweep_ms": float(pd.to_numeric(ks[time_col], errors="coerce").min())})
    launch = pd.DataFrame(rows, columns=["kernel", *params, "measured_ms", "best_in_sweep_ms"])
    message = None
    if launch.empty:
        message = ("No kernel sweep ran and no kernel launch parameters were set for this study "
                   "(no kernel_sweep.csv; no loongforge.compute_domain.kernels in the best config).")
    elif sweep is None:
        message = "No kernel sweep ran (no kernel_sweep.csv): the chosen launch parameters are shown without times."
    return Kernels(launch=launch, sweep=sweep, sweep_source=source, message=message)


def sweep_by_config(s: Kernels) -> pd.DataFrame | None:
    """kernel, launch, ms (median per configuration), chosen: the sweep as drawn, or None without times."""
    if s.sweep is None:
        return None
    time_col = next((c for c in _TIME_COLUMNS if c in s.sweep.columns), None)
    if time_col is None:
        return None
    sw = s.sweep.copy()
    if "mode" in sw.columns and (sw["mode"] == "full").any():  # kernels_bench rows: forward + backward
        sw = sw[sw["mode"] == "full"]
    ignore = {"kernel", "shape", "mode", "provider", "sweep", "launch", "dtype", "note", "error", "gpu", "torch",
              "triton", "cuda", "timestamp", "size"}
    params = [c for c in sw.columns if c not in ignore and pd.api.types.is_numeric_dtype(sw[c])
              and not c.endswith(("_ms", "_gib", "_per_s", "_ceiling")) and c != time_col]
    params = [c for c in params if sw[c].notna().any()]
    sw[time_col] = pd.to_numeric(sw[time_col], errors="coerce")
    sw = sw.dropna(subset=[time_col])
    if sw.empty:
        return None
    chosen = {r["kernel"]: r for _, r in s.launch.iterrows()}
    rows = []
    for kernel, ks in sw.groupby("kernel", sort=False):
        kp = [p for p in params if ks[p].notna().any()]
        for cfg, g in ks.groupby(kp, dropna=False) if kp else [((), ks)]:
            cfg = cfg if isinstance(cfg, tuple) else (cfg,)
            values = {p: v for p, v in zip(kp, cfg) if pd.notna(v)}
            want = chosen.get(kernel)
            # chosen: agrees with every parameter the study set for this kernel (the others are defaults,
            # so several sweep points may agree when the study set only some)
            set_params = {p: want[p] for p in values if want is not None and p in want.index and pd.notna(want[p])}
            is_chosen = bool(set_params) and all(float(values[p]) == float(v) for p, v in set_params.items())
            rows.append({"kernel": kernel, "launch": " ".join(f"{p}={int(v) if float(v).is_integer() else v}"
                                                              for p, v in values.items()),
                         "ms": float(g[time_col].median()), "chosen": bool(is_chosen)})
    return pd.DataFrame(rows)


def _param_order(p: str) -> tuple[int, str]:
    order = {"num_warps": 0, "num_stages": 1}
    return order.get(p, 2), p


# --------------------------------------------------------------------------- 6. data


class DataSection(NamedTuple):
    padding: pd.DataFrame
    """bucket_width, trials, padding_ratio_median, padding_ratio_min, padding_ratio_max, tokens_per_s_median."""
    io: pd.DataFrame
    """Index run ('baseline', 'best'); io_backend, read_latency_ms_p50/p90/p99, decode_tokens_per_s,
    real_tokens_per_s_per_gpu, padding_ratio."""
    by_trial: pd.DataFrame
    """trial, value, bucket_width, padding_ratio, io_backend, read_latency_ms_p50/p90/p99, decode_tokens_per_s."""
    message: str | None


_IO_KEYS = ("io/read_latency_ms_p50", "io/read_latency_ms_p90", "io/read_latency_ms_p99", "decode/tokens_per_s")


def _run_summary(data: StudyData, t: Any) -> dict:
    s = t.user_attrs.get("summary")
    if isinstance(s, dict) and s:
        return s
    run = data.trial_run(t.number)
    return run.summary if run else {}


def _run_metric(summary: dict, run: RunData | None, key: str) -> float:
    """A summary number, else the median over the run's metrics.jsonl windows."""
    v = num(summary.get(key))
    if math.isfinite(v) or run is None or run.metrics is None or key not in run.metrics:
        return v
    return _median(pd.to_numeric(run.metrics[key], errors="coerce"))


def data_section(data: StudyData) -> DataSection:
    names = knob_names(data)
    bw_knob = next((k for k in names if knob_key(k).endswith("bucket_width")), None)
    rows = []
    for t in ok_trials(data):
        s = _run_summary(data, t)
        run = data.trial_run(t.number)
        if bw_knob and bw_knob in t.params:
            bw = t.params[bw_knob]
        else:
            found, bw = lookup_key((run.config if run else None) or {}, "data.bucket_width")
            bw = bw if found else None
        row = {"trial": t.number, "value": _objective(t), "bucket_width": num(bw),
               "padding_ratio": _run_metric(s, run, "data/padding_ratio"),
               "io_backend": s.get("io/backend")}
        for k in _IO_KEYS:
            row[k.split("/")[1].replace("tokens_per_s", "decode_tokens_per_s") if k.startswith("decode")
                else k.split("/")[1]] = _run_metric(s, run, k)
        rows.append(row)
    cols = ["trial", "value", "bucket_width", "padding_ratio", "io_backend", "read_latency_ms_p50",
            "read_latency_ms_p90", "read_latency_ms_p99", "decode_tokens_per_s"]
    by_trial = pd.DataFrame(rows, columns=cols)

    g = by_trial.dropna(subset=["bucket_width", "padding_ratio"]).groupby("bucket_width")
    padding = pd.DataFrame({
        "trials": g.size(), "padding_ratio_median": g["padding_ratio"].median(),
        "padding_ratio_min": g["padding_ratio"].min(), "padding_ratio_max": g["padding_ratio"].max(),
        "tokens_per_s_median": g["value"].median()}).reset_index()
    padding["bucket_width"] = padding["bucket_width"].astype(int) if len(padding) else padding["bucket_width"]

    number, _ = best_trial_number(data)
    io = {}
    for arm, runs in (("baseline", baseline_runs(data)), ("best", best_runs(data, number))):
        if not runs:
            continue
        backends = [r.summary.get("io/backend") for r in runs if r.summary.get("io/backend")]
        vals: dict[str, Any] = {"io_backend": backends[0] if backends else None}
        for k in (*_IO_KEYS, TPUT, "data/padding_ratio"):
            col = {"decode/tokens_per_s": "decode_tokens_per_s", TPUT: "real_tokens_per_s_per_gpu"}.get(
                k, k.split("/")[1])
            vals[col] = _median(_run_metric(r.summary, r, k) for r in runs)
        io[arm] = vals
    io_df = pd.DataFrame.from_dict(io, orient="index", columns=[
        "io_backend", "read_latency_ms_p50", "read_latency_ms_p90", "read_latency_ms_p99",
        "decode_tokens_per_s", "real_tokens_per_s_per_gpu", "padding_ratio"])
    io_df.index.name = "run"
    message = None
    if by_trial.empty and (io_df.empty or io_df.drop(columns="io_backend").isna().all().all()):
        message = "No loader metrics yet: no finished run recorded io/* or decode/* figures."
    return DataSection(padding=padding, io=io_df, by_trial=by_trial, message=message)


# --------------------------------------------------------------------------- 7. trials


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
            row[c] = _objective(t, i)
        row.update({"mfu_pct": num(s.get("mfu_pct")), "max_reserved_gib": num(s.get("memory/max_reserved_gib")),
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
    return Trials(table=table, objective_columns=obj_cols, knob_names=names, status_counts=counts,
                  log_tails=pd.DataFrame(tails, columns=["trial", "status", "log_tail"]), message=message)


# --------------------------------------------------------------------------- 8. environment


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


def _kv(d: Any) -> pd.DataFrame:
    if not isinstance(d, dict):
        return pd.DataFrame(columns=["key", "value"])
    flat = _flatten(d)
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
            study.append((key, ", ".join(f"{k}={_scalar(x)}" for k, x in _flatten(v).items())
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
        runs = _numbers(nf.get("runs"))
        noise = NoiseFloor(num(nf.get("median")), num(nf.get("min")), num(nf.get("max")),
                           num(nf.get("rel_spread")), num(nf.get("cv")), runs)
    message = None
    if not data.tune and not fp:
        message = "No environment recorded yet (no tune.json, no environment.json)."
    return Environment(study=study_df, fingerprint=_kv(fp), hardware=_kv(data.tune.get("hardware")),
                       dropped=pd.DataFrame(dropped, columns=["knob", "reason"]), noise=noise, message=message)


# --------------------------------------------------------------------------- all sections


class SectionFailed(NamedTuple):
    """A section whose computation raised: the report shows the error in one line instead."""

    error: str


SECTIONS: tuple[tuple[str, str, Callable[[StudyData], Any]], ...] = (
    ("summary", "Summary", summary_section),
    ("search", "Search", search_section),
    ("time", "Where the time goes", time_section),
    ("compile", "Compile time", compile_section),
    ("numerics", "Numerics", numerics_section),
    ("memory", "Memory", memory_section),
    ("kernels", "Kernels", kernels_section),
    ("data", "Data", data_section),
    ("trials", "Trials", trials_section),
    ("environment", "Environment", environment_section),
)
"""(html id, heading, compute function) in report order."""


class ReportData(NamedTuple):
    study: StudyData
    summary: Summary | SectionFailed
    search: Search | SectionFailed
    time: TimeSection | SectionFailed
    compile: CompileSection | SectionFailed
    numerics: NumericsSection | SectionFailed
    memory: Memory | SectionFailed
    kernels: Kernels | SectionFailed
    data: DataSection | SectionFailed
    trials: Trials | SectionFailed
    environment: Environment | SectionFailed


def compute_report(data: StudyData) -> ReportData:
    """Every section's data; a section that raises becomes a ``SectionFailed`` (the report still builds)."""
    out = {}
    for key, _, fn in SECTIONS:
        try:
            out[key] = fn(data)
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
            import logging
            import traceback

            logging.getLogger(__name__).warning("report section %s failed:\n%s", key, traceback.format_exc())
            out[key] = SectionFailed(f"{type(e).__name__}: {e}")
    return ReportData(study=data, **out)
