"""The "Where the time goes" section: phase breakdown, per-step timeline and step-time noise, communication, and
the profiler traces the study kept with the ops of the winner's (else the baseline's) that take the most self
time."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from reports._load import PHASES, RunData, StudyData, num
from reports.sections._common import median_of, baseline_runs, best_runs, best_trial_number, packings
from reports.sections._traces import top_ops, trace_table
from workbench.vocab import COMM_EXPOSED_S, COMM_OVERLAP_PCT, COMM_TOTAL_S

__all__ = ["TimeSection", "time_section"]

TIMELINE_STEPS = 3
"""Steps of each run drawn in the phase timeline: enough to see the repeat, few enough to read."""


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
    traces: pd.DataFrame = pd.DataFrame()
    """Index run ('baseline', 'winner'); trial, steps, path, memory_snapshot, status, exists: the torch.profiler
    traces of tune.json's ``result.traces`` (Perfetto opens them)."""
    traces_message: str | None = None
    """Why there is no trace table, else None."""
    top_ops: pd.DataFrame = pd.DataFrame()
    """name, calls, self_ms, total_ms, self_pct, self_ms_per_step: the ops with the most self time in the trace
    of ``top_ops_of`` (the winner's, else the baseline's), at most 10 (reports.sections._traces)."""
    top_ops_of: str | None = None
    """The run whose trace ``top_ops`` ranks."""
    top_ops_kind: str = ""
    """'GPU kernels' (a CUDA trace) or 'CPU ops'."""
    top_ops_message: str | None = None
    """Why there is no top-ops table, else None."""
    by_length_runs: list[str] = []
    """The arms whose step times are drawn against their bucket length: those whose steps have more than one."""
    by_length_message: str | None = None
    """Why step time vs bucket length leaves out an arm, or is not drawn at all (packing: fill, where every step
    has the one length seq_len; or bucket packing that gave every step one length); None when every arm is
    drawn."""


def _measured(runs: list[RunData]) -> list[tuple[RunData, pd.DataFrame]]:
    return [(r, r.measured_phases) for r in runs if r.measured_phases is not None]


def phase_means(runs: list[RunData]) -> dict[str, Any]:
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
        m = phase_means(runs)
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
    by_length_runs, by_length_message = _by_length(arms, step_times)
    message = None
    if breakdown.empty:
        message = "No phase timings yet: no run wrote phases.csv or a phase summary."
    comm, comm_message = _comm_table(arms)
    traces, traces_message, found = trace_table(data)
    ops, ops_of, ops_kind, ops_message = pd.DataFrame(), None, "", traces_message
    for arm in ("winner", "baseline"):
        if arm in found:
            ops_of, steps = arm, num(traces.loc[arm, "steps"])
            try:
                ops, ops_kind = top_ops(found[arm], steps=int(steps) if math.isfinite(steps) and steps > 0 else None)
                ops_message = None if len(ops) else f"The {arm}'s trace holds no op."
            except (OSError, ValueError) as e:
                ops_message = f"The {arm}'s trace could not be read: {type(e).__name__}: {e}"
            break
    else:
        if traces_message is None:
            ops_message = "No trace file of the kept traces could be found."
    return TimeSection(breakdown=breakdown, timeline=timeline, step_times=step_times,
                       step_stats=step_stats, message=message, comm=comm, comm_message=comm_message,
                       traces=traces, traces_message=traces_message, top_ops=ops, top_ops_of=ops_of,
                       top_ops_kind=ops_kind, top_ops_message=ops_message, by_length_runs=by_length_runs,
                       by_length_message=by_length_message)


def _by_length(arms: dict[str, list[RunData]], step_times: pd.DataFrame) -> tuple[list[str], str | None]:
    """The arms drawn in "step time vs bucket length" and the one line about those left out.

    An arm is drawn when its measured steps have more than one bucket length: against a single length the plot
    shows nothing but the noise, which the step-time distribution already shows."""
    drawn, reasons = [], {}
    for arm, runs in arms.items():
        lengths = step_times.loc[step_times["run"] == arm, "seq_len"].dropna().unique()
        if len(lengths) > 1:
            drawn.append(arm)
        elif len(lengths) == 1:
            one = f"every step is {int(lengths[0]):,} tokens long"
            reasons[arm] = (f"packing: fill (rows cut from the token stream: {one})" if "fill" in packings(runs)
                            else one)
    if not reasons:
        return drawn, None
    why = "; ".join(f"the {arm}'s data uses {r}" if r.startswith("packing") else f"in the {arm}, {r}"
                    for arm, r in reasons.items())
    if drawn:
        return drawn, f"Step time vs bucket length leaves out {' and '.join(f'the {a}' for a in reasons)}: {why}."
    return drawn, (f"Step time vs bucket length is not drawn: {why}, so bucket length explains none of the "
                   "spread; the step-time distribution above is the noise.")


_COMM_COLS = ["comm_total_s", "comm_exposed_s", "overlap_pct", "mode", "buckets", "bucket_size_mb", "overlap_ratio",
              "source"]


def _comm_table(arms: dict[str, list[RunData]]) -> tuple[pd.DataFrame, str | None]:
    """Exposed communication and overlap achieved per arm (run summaries' ``comm/*``; workbench/train/metrics.py)."""
    rows = {}
    for arm, runs in arms.items():
        with_comm = [r for r in runs if math.isfinite(r.metric(COMM_TOTAL_S))]
        if not with_comm:
            continue
        total = median_of(r.metric(COMM_TOTAL_S) for r in with_comm)
        exposed = median_of(r.metric(COMM_EXPOSED_S) for r in with_comm)
        first = with_comm[0].summary
        rows[arm] = {"comm_total_s": total, "comm_exposed_s": exposed,
                     "overlap_pct": median_of(r.metric(COMM_OVERLAP_PCT) for r in with_comm),
                     "mode": first.get("comm/mode"), "buckets": num(first.get("comm/buckets")),
                     "bucket_size_mb": num(first.get("comm/bucket_size_mb")),
                     "overlap_ratio": num(first.get("comm/overlap_ratio")),
                     "source": f"summary of {len(with_comm)} run(s)"}
    df = pd.DataFrame.from_dict(rows, orient="index", columns=_COMM_COLS)
    df.index.name = "run"
    message = None if rows else ("No gradient communication: single-process runs (bucket size and overlap ratio "
                                 "act with several GPUs).")
    return df, message
