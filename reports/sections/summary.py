"""The Summary section: best config against the baseline, the speedup and its interval, the knobs that changed."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from reports._load import StudyData, lookup_key, num
from reports.sections._common import (
    TPUT,
    candidate_of,
    median_of,
    finite_numbers,
    objective_of,
    same_config,
    baseline_runs,
    best_runs,
    best_trial_number,
    knob_names,
    study_result,
)
from workbench.tune.result import describe_data, reference_line, result_headline
from reports.sections.phases import phase_means
from workbench.vocab import MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB, PADDING_RATIO, STEP_S

__all__ = ["Speedup", "Summary", "summary_section"]


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
    headline: str | None = None
    """The study's result in one sentence (the terminal's, from tune.json); None before it finished."""
    reference: str | None = None
    """The exported config against the plain compiled loop, or why it was not measured (validation.json's
    ``reference``); None for a study from before it was recorded."""


def summary_section(data: StudyData) -> Summary:
    ref = data.validation.get("reference")
    return _summary(data)._replace(reference=reference_line(ref) if isinstance(ref, dict) else None)


def _summary(data: StudyData) -> Summary:
    number, how = best_trial_number(data)
    notes: list[str] = []
    base = baseline_runs(data)
    best = best_runs(data, number)
    cand = candidate_of(data, number)

    result = study_result(data)
    if result is not None:
        return _from_result(data, result, number, how)
    # Throughput: interleaved A/B runs where they exist (same conditions for both arms).
    rows = []
    b_runs = finite_numbers((cand or {}).get("baseline_runs")) or finite_numbers(data.validation.get("baseline_runs"))
    if b_runs:
        b_tput, b_src = median_of(b_runs), f"median of {len(b_runs)} interleaved baseline runs"
    elif any(math.isfinite(r.metric(TPUT)) for r in data.baseline_runs):
        vals = [r.metric(TPUT) for r in data.baseline_runs]
        b_tput, b_src = median_of(vals), f"median of {sum(map(math.isfinite, vals))} baseline repeats"
    elif math.isfinite(num((data.tune.get("noise_floor") or {}).get("median"))):
        b_tput, b_src = num(data.tune["noise_floor"]["median"]), "noise floor median"
    elif math.isfinite(num(data.provenance.get("baseline_tokens_per_s_per_gpu"))):
        b_tput, b_src = num(data.provenance["baseline_tokens_per_s_per_gpu"]), "exported config"
    else:
        b_tput, b_src = math.nan, "not measured"
    c_runs = finite_numbers((cand or {}).get("runs"))
    trial = data.trial(number) if number is not None else None
    if c_runs:
        t_tput, t_src = median_of(c_runs), f"median of {len(c_runs)} interleaved re-runs"
    elif trial is not None and trial.values:
        t_tput, t_src = objective_of(trial), "the trial's measurement"
    elif best and math.isfinite(best[0].metric(TPUT)):
        t_tput, t_src = best[0].metric(TPUT), "the trial's summary.json"
    else:
        t_tput, t_src = math.nan, "not measured"
    rows.append((TPUT, b_tput, t_tput, f"baseline: {b_src}; best: {t_src}"))
    table = _table(rows, base, best)

    speedup = _speedup(data, number, b_tput, t_tput)
    knobs = _changed_knobs(data, number)

    candidates = pd.DataFrame(
        [(c.get("trial"), len(finite_numbers(c.get("runs"))), num(c.get("speedup_median")), num(c.get("ci_low")),
          num(c.get("ci_high")), c.get("significant"))
         for c in data.validation.get("candidates") or [] if isinstance(c, dict)],
        columns=["trial", "rounds", "speedup_median", "ci_low", "ci_high", "significant"])
    ab = []
    for c in data.validation.get("candidates") or []:
        if not isinstance(c, dict):
            continue
        for arm, key in (("baseline", "baseline_runs"), ("candidate", "runs")):
            for i, v in enumerate(finite_numbers(c.get(key))):
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


def _table(rows: list[tuple], base: list, best: list) -> pd.DataFrame:
    """The best-vs-baseline table: the throughput ``rows`` given, then the runs' other metrics and step time."""
    rows = list(rows)
    step_b, step_t = phase_means(base), phase_means(best)
    for key in ("mfu_pct", MAX_RESERVED_GIB, MAX_ALLOCATED_GIB, MAX_RSS_GIB,
                PADDING_RATIO):
        bv, tv = median_of(r.metric(key) for r in base), median_of(r.metric(key) for r in best)
        if math.isfinite(bv) or math.isfinite(tv):
            rows.append((key, bv, tv, "median over runs' summaries"))
    rows.append((STEP_S, step_b.get("step_s", math.nan), step_t.get("step_s", math.nan),
                 "mean over measured steps of phases.csv"))
    table = pd.DataFrame(rows, columns=["metric", "baseline", "best", "source"])
    with np.errstate(divide="ignore", invalid="ignore"):
        table.insert(3, "ratio", table["best"] / table["baseline"])
    return table


def _from_result(data: StudyData, result: dict, number: int | None, how: str) -> Summary:
    """The summary of a finished study: every figure about the winner from tune.json's result, as the terminal
    printed it."""
    best = result.get("best") or {}
    base_tput = num(result["baseline"].get("tokens_per_s"))
    best_tput = num(best.get("tokens_per_s"))
    rows = [(TPUT, base_tput, best_tput,
             f"baseline: median of {result['baseline'].get('runs')} runs ({result['baseline'].get('source')}); "
             f"best: median of its {best.get('pairs', 0)} A/B runs; its search run measured "
             f"{num(best.get('search_tokens_per_s')):,.0f} (one run, not the figure that decides)")]
    table = _table(rows, baseline_runs(data), best_runs(data, number))
    speedup = Speedup(num(best["speedup"]), num(best.get("ci_low")), num(best.get("ci_high")),
                      bool(best.get("significant")), int(best.get("pairs") or 0), "tune.json result") \
        if best.get("speedup") is not None else None
    cands = result.get("candidates") or []
    candidates = pd.DataFrame(
        [(c["trial"], c.get("pairs", 0), num(c.get("speedup")), num(c.get("ci_low")), num(c.get("ci_high")),
          c.get("significant")) for c in cands],
        columns=["trial", "rounds", "speedup_median", "ci_low", "ci_high", "significant"])
    ab = [(c.get("trial"), arm, i, v) for c in data.validation.get("candidates") or [] if isinstance(c, dict)
          for arm, key in (("baseline", "baseline_runs"), ("candidate", "runs"))
          for i, v in enumerate(finite_numbers(c.get(key)))]
    notes = [f"Data: {describe_data(result.get('data') or {})}."]
    if result.get("noise_warning"):
        notes.insert(0, result["noise_warning"][0].upper() + result["noise_warning"][1:] + ".")
    if result.get("head_to_head"):
        notes.append(f"Winner chosen: {result['winner_rule']}.")
    if result["verdict"] != "winner":
        notes.append("The exported config is the base config: no candidate's interval lay above 1.0.")
    return Summary(table=table, speedup=speedup, knobs=_changed_knobs(data, number), candidates=candidates,
                   ab_runs=pd.DataFrame(ab, columns=["candidate", "arm", "round", "tokens_per_s"]),
                   best_trial=number, best_how=how, config_text=data.exported_config_text, notes=notes,
                   message=None, headline=result_headline(result))


def _speedup(data: StudyData, number: int | None, b: float, t: float) -> Speedup | None:
    winner = data.validation.get("winner")
    cand = candidate_of(data, number)
    for src, d in (("validation.json winner", winner), ("validation.json candidate", cand)):
        if isinstance(d, dict) and math.isfinite(num(d.get("speedup_median"))) and (
                d.get("trial", number) == number):
            rounds = len(finite_numbers((cand or {}).get("ratios"))) or len(finite_numbers((cand or {}).get("runs")))
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
        changed = None if not found else not same_config(av, bv)
        rows.append((k, av if found else None, bv, changed))
    return pd.DataFrame(rows, columns=["knob", "baseline", "best", "changed"])
