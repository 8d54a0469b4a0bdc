"""The Memory section: peaks per arm and per trial, fragmentation against the memory knobs, memory_analysis.json,
and the gradient lifetimes of lifetimes.json."""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import pandas as pd

from reports._load import StudyData, knob_key, num
from reports.sections._common import (
    log_scale_knobs,
    median_of,
    objective_of,
    baseline_runs,
    best_runs,
    best_trial_number,
    knob_kinds,
    knob_names,
    ok_trials,
)
from workbench.vocab import MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB, PREDICTED_PEAK_GIB

__all__ = ["Memory", "memory_section"]

MEMORY_KNOB_WORDS = ("allocator", "memory_domain", "micro_batch", "pinned", "graph_capture", "compile")
"""Knobs whose config key contains one of these are plotted against fragmentation."""


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
    knob_kinds: dict[str, str] = {}
    """Each memory knob's kind from its Optuna distribution: categorical, int or float."""
    knob_choices: dict[str, list] = {}
    """The choices of each categorical memory knob, in the space's order."""
    lifetimes: pd.DataFrame | None = None
    """The gradient buckets in launch order, from the study directory's lifetimes.json (``python -m
    workbench.memory lifetimes``, workbench/memory/lifetimes.py): bucket, layers, params, mib, first_tick,
    ready_tick, alloc_tick, release_tick, slot. A tick is one gradient's production, in production order; ticks
    past the backward are buckets launched after it."""
    lifetimes_summary: pd.DataFrame | None = None
    """metric, value: gradient MiB, buckets, peak live gradient MiB under today's plan and the lifetime-aware one,
    its buffer slots and buffer MiB, the MiB saved at this config (and without the reasons it does not apply)."""
    lifetimes_timeline: pd.DataFrame | None = None
    """tick, today_mib, lifetime_mib: live gradient MiB at each tick under the two plans."""
    lifetimes_notes: list[str] = []
    """Why the lifetime-aware plan saves nothing at this config (lifetimes.json's ``lifetime.blocked_by``)."""
    lifetimes_message: str | None = None
    """One line when lifetimes.json is there but unusable; None when it is absent (the section then shows no
    gradient lifetimes at all, as before the analysis existed) or read."""


_MEM_KEYS = (MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB,
             PREDICTED_PEAK_GIB)


def memory_section(data: StudyData) -> Memory:
    number, _ = best_trial_number(data)
    arms = {"baseline": baseline_runs(data), "best": best_runs(data, number)}
    peaks = {}
    for arm, runs in arms.items():
        vals = {k.split("/")[1]: median_of(r.metric(k) for r in runs) for k in _MEM_KEYS}
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
        a, r = num(s.get(MAX_ALLOCATED_GIB)), num(s.get(MAX_RESERVED_GIB))
        rows.append({"trial": t.number, "value": objective_of(t), "max_allocated_gib": a,
                     "max_reserved_gib": r, "reserved_minus_allocated_gib": r - a,
                     "predicted_peak_gib": num(s.get(PREDICTED_PEAK_GIB)),
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
    lifetimes, lt_summary, lt_timeline, lt_notes, lt_msg = _lifetimes(data)
    kinds, choices = knob_kinds(data)
    return Memory(peaks=peaks_df, by_trial=by_trial, memory_knobs=mem_knobs,
                  log_knobs=[k for k in log_scale_knobs(data) if k in mem_knobs], histogram=histogram,
                  suggestions=suggestions, analysis_source=source, analysis_message=a_msg, message=message,
                  analysis_summary=summary, fragmentation=timeline, suggested_allocator=suggested,
                  knob_kinds={k: kinds[k] for k in mem_knobs if k in kinds},
                  knob_choices={k: choices[k] for k in mem_knobs if k in choices},
                  lifetimes=lifetimes, lifetimes_summary=lt_summary, lifetimes_timeline=lt_timeline,
                  lifetimes_notes=lt_notes, lifetimes_message=lt_msg)


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


_LIFETIME_COLUMNS = ["bucket", "layers", "params", "mib", "first_tick", "ready_tick", "alloc_tick", "release_tick",
                     "slot"]


def _lifetimes(data: StudyData) -> tuple[pd.DataFrame | None, pd.DataFrame | None, pd.DataFrame | None, list[str],
                                         str | None]:
    """The buckets, the summary, the timeline and the notes of the study directory's lifetimes.json, and a message
    when it cannot be used (schema: workbench/memory/lifetimes.py, docs/memory.md)."""
    path = data.study_dir / "lifetimes.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None, None, [], None
    except (OSError, ValueError) as e:
        return None, None, None, [], f"lifetimes.json could not be read: {e}"
    buckets = doc.get("buckets") if isinstance(doc, dict) else None
    if not isinstance(buckets, list) or not buckets or not all(isinstance(b, dict) for b in buckets):
        return None, None, None, [], "lifetimes.json has no gradient buckets."
    mib = 1024 ** 2
    rows = []
    for b in buckets:
        layers = [str(x) for x in b.get("layers") or []]
        rows.append({"bucket": num(b.get("index")),
                     "layers": layers[0] if len(layers) == 1 else
                     (f"{layers[0]} … {layers[-1]} ({len(layers)})" if layers else ""),
                     "params": num(b.get("params")), "mib": num(b.get("bytes")) / mib,
                     **{k: num(b.get(k)) for k in _LIFETIME_COLUMNS[4:]}})
    table = pd.DataFrame(rows, columns=_LIFETIME_COLUMNS)
    today = doc.get("today") if isinstance(doc.get("today"), dict) else {}
    life = doc.get("lifetime") if isinstance(doc.get("lifetime"), dict) else {}
    summary = [("gradients MiB", num(doc.get("total_bytes")) / mib),
               ("buckets", float(len(buckets))),
               ("bucket size MiB (loongforge.overlap.bucket_size_mb)", num(doc.get("bucket_size_mb"))),
               ("gradient accumulation steps", num(doc.get("grad_accum_steps"))),
               ("peak live gradients MiB, today's plan", num(today.get("peak_live_bytes")) / mib),
               ("peak live gradients MiB, lifetime-aware plan", num(life.get("peak_live_bytes")) / mib),
               ("buffer slots, lifetime-aware plan", num(life.get("slots"))),
               ("gradient buffers MiB, lifetime-aware plan", num(life.get("buffer_bytes")) / mib),
               ("saved MiB at this config", num(doc.get("saved_bytes")) / mib)]
    if life.get("applies") is False and num(life.get("saved_bytes")) > 0:
        summary.append(("saved MiB without the reasons below", num(life.get("saved_bytes")) / mib))
    summary_df = pd.DataFrame([r for r in summary if math.isfinite(r[1])], columns=["metric", "value"])
    tl = doc.get("timeline")
    timeline = None
    if isinstance(tl, list) and tl and all(isinstance(x, dict) for x in tl):
        timeline = pd.DataFrame({"tick": [num(x.get("tick")) for x in tl],
                                 "today_mib": [num(x.get("today_bytes")) / mib for x in tl],
                                 "lifetime_mib": [num(x.get("lifetime_bytes")) / mib for x in tl]})
    notes = [str(x) for x in life.get("blocked_by") or []]
    return table, summary_df, timeline, notes, None
