"""The study's torch.profiler traces (tune.json's ``result.traces``) and the ops that take the time in one of them.

A trace is Chrome trace JSON (``export_chrome_trace``): complete events (``"ph": "X"``) with a start ``ts`` and a
duration ``dur`` in microseconds, on a ``pid``/``tid`` track. An op's self time is its duration minus that of the
events nested directly in it on the same track; the table sums it per op name. On CUDA the GPU kernels
(category ``kernel``) are ranked, on the CPU the aten ops (``cpu_op``); the step and phase ranges
(``user_annotation``) are the frame, never ranked.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from reports._load import StudyData, num

__all__ = ["TOP_OPS", "TRACE_ARMS", "op_self_times", "read_events", "top_ops", "trace_table"]

TOP_OPS = 10
"""Ops listed by self time."""

TRACE_ARMS = ("baseline", "winner")
"""The traces a study keeps (workbench.tune.measure.Measurer.keep_traces): profiled after the measurement of a
validation pair's runs, or of the last baseline repeat; an older study's in trace runs of their own (``traces/``)."""

_TRACE_COLS = ["trial", "steps", "file", "path", "memory_snapshot", "status", "exists", "trace_href",
               "snapshot_href"]
_OPS_COLS = ["name", "calls", "self_ms", "total_ms", "self_pct", "self_ms_per_step"]


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace file (a bare list of events is read as it is)."""
    return list(_read_events(str(path), Path(path).stat().st_mtime_ns))


@functools.lru_cache(maxsize=2)  # two sections read the same trace: parse it once per report
def _read_events(path: str, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    data = json.loads(Path(path).read_text())
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return tuple(events) if isinstance(events, list) else ()


def op_self_times(events: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per complete event: cat, name, ts_us, dur_us, self_us (duration less the direct children's on its
    track)."""
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X":
            ts, dur = num(e.get("ts")), num(e.get("dur"))
            if ts == ts and dur == dur and dur >= 0:  # not NaN
                tracks[(e.get("pid"), e.get("tid"))].append({"cat": e.get("cat"), "name": str(e.get("name")),
                                                             "ts": ts, "dur": dur})
    rows: list[tuple[Any, str, float, float, float]] = []
    for evs in tracks.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))  # a parent before the children that start with it
        stack: list[list[Any]] = []  # [end, event, children's duration]

        def close() -> None:
            _, ev, children = stack.pop()
            rows.append((ev["cat"], ev["name"], ev["ts"], ev["dur"], max(0.0, ev["dur"] - children)))

        for e in evs:
            while stack and e["ts"] >= stack[-1][0]:
                close()
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e, 0.0])
        while stack:
            close()
    return pd.DataFrame(rows, columns=["cat", "name", "ts_us", "dur_us", "self_us"])


def top_ops(path: str | Path, *, steps: int | None = None, n: int = TOP_OPS) -> tuple[pd.DataFrame, str]:
    """The ``n`` ops of a trace with the most self time, and what they are ('GPU kernels' or 'CPU ops').

    Columns: name, calls, self_ms, total_ms (their durations, children included), self_pct (share of the self
    time of every op of that kind in the trace), self_ms_per_step (over ``steps`` profiled steps)."""
    df = op_self_times(read_events(path))
    kernels = df[df["cat"] == "kernel"]
    kind, ops = ("GPU kernels", kernels) if len(kernels) else ("CPU ops", df[df["cat"] == "cpu_op"])
    if ops.empty:
        return pd.DataFrame(columns=_OPS_COLS), kind
    g = ops.groupby("name").agg(calls=("self_us", "size"), self_us=("self_us", "sum"), dur_us=("dur_us", "sum"))
    total = float(g["self_us"].sum())
    g = g.sort_values(["self_us", "calls"], ascending=[False, False], kind="stable").head(n).reset_index()
    out = pd.DataFrame({
        "name": g["name"], "calls": g["calls"].astype(int), "self_ms": g["self_us"] / 1e3,
        "total_ms": g["dur_us"] / 1e3, "self_pct": 100 * g["self_us"] / total if total else float("nan"),
        "self_ms_per_step": g["self_us"] / 1e3 / steps if steps else float("nan"),
    })
    return out, kind


def _in_study_dir(data: StudyData, path: str) -> Path:
    """A file of a run of the study (``<phase>/<run>/<file>``: ``validation/trial-3-0/trace.json``, the last
    baseline repeat's, an older study's ``traces/winner/``) in the study dir as it lies now, also when the dir
    was moved or copied since the path was recorded."""
    p = Path(path)
    return data.study_dir / p.parent.parent.name / p.parent.name / p.name


def _resolve(data: StudyData, arm: str, path: Any) -> Path | None:
    """Where the trace lies in the study dir (also when the dir was moved or copied), else its path as recorded."""
    here = [_in_study_dir(data, path)] if isinstance(path, str) else []
    for p in [*here, data.study_dir / "traces" / arm / "trace.json"]:
        if p.exists():
            return p
    return Path(path) if isinstance(path, str) and Path(path).exists() else None


def _relative(data: StudyData, path: str) -> str:
    """The path from the study dir (where report.html lies) when it is inside it, else as it is."""
    try:
        return str(Path(path).resolve().relative_to(data.study_dir.resolve()))
    except (ValueError, OSError):
        return path


def _href(data: StudyData, path: Any) -> str | None:
    """A relative link from report.html to ``path``: only to a file that exists inside the study directory (the
    report links nothing outside the folder it was written for, so the folder can be moved or copied whole)."""
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        return None
    rel = _relative(data, str(path))
    return None if Path(rel).is_absolute() or rel.startswith("..") else Path(rel).as_posix()


def _snapshot(data: StudyData, arm: str, path: Any) -> str | None:
    """The memory snapshot beside the trace in the study dir (also when the dir was moved or copied), else its path
    as recorded."""
    if not isinstance(path, str):
        return None
    for here in (_in_study_dir(data, path), data.study_dir / "traces" / arm / Path(path).name):
        if here.exists():
            return str(here)
    return path


def trace_table(data: StudyData) -> tuple[pd.DataFrame, str | None, dict[str, Path]]:
    """The kept traces (index run: 'baseline', 'winner'; columns trial, steps, file (from the study dir), path,
    memory_snapshot (from the study dir), status, exists, trace_href and snapshot_href (the relative links of the
    trace and the snapshot, None where the file is missing or outside the study dir)), why there are none, and the
    readable ones' paths."""
    traces = ((data.tune.get("result") or {}) if isinstance(data.tune.get("result"), dict) else {}).get("traces")
    if not isinstance(traces, dict):
        return (pd.DataFrame(columns=_TRACE_COLS).rename_axis("run"),
                "No profiler traces: the study kept none (protocol.profile_steps 0, an older study, or not "
                "finished).", {})
    rows, found = {}, {}
    for arm in TRACE_ARMS:
        rec = traces.get(arm)
        if not isinstance(rec, dict):
            continue
        p = _resolve(data, arm, rec.get("path"))
        if p is not None:
            found[arm] = p
        path = str(p or rec.get("path"))
        snapshot = _snapshot(data, arm, rec.get("memory_snapshot"))
        rows[arm] = {"trial": rec.get("trial"), "steps": traces.get("steps"), "file": _relative(data, path),
                     "path": path,
                     "memory_snapshot": _relative(data, snapshot) if snapshot else None,
                     "status": rec.get("status") if p is not None else
                     f"{rec.get('status')}: {rec.get('reason') or 'the trace file is missing'}",
                     "exists": p is not None, "trace_href": _href(data, p), "snapshot_href": _href(data, snapshot)}
    df = pd.DataFrame.from_dict(rows, orient="index", columns=_TRACE_COLS)
    df.index.name = "run"
    message = None if rows else "No profiler traces were kept."
    return df, message, found
