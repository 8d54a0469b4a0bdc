"""The "GPU time" section: where the device's time goes in the winner's profiler trace (else the baseline's).

The trace's device work (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``) over its profiled steps gives the
time per step by kind of work, the device's busy and idle time, and the top kernels with their time per step and
share; the runs' metrics give the model's FLOPs per step, so the achieved TFLOP/s stands against the peak.

Steps and busy time follow ``workbench.train.profiling.launch_overhead``: the steps are the trace's ``step <n>``
ranges; their work is every kernel, copy and set launched within them (matched to its launch call by the trace's
``correlation`` id; device work without one counts where it starts), and the span runs from the first range's start
to the later of the last range's end and the end of that work. Busy is the union of the work's intervals
(overlapping streams count once), idle the rest of the span. Without step ranges the span is the work's own.

The kind of a kernel comes from its name (``workbench.train.profiling.kernel_kind``, the tuner's too, grouped by
``KIND_GROUPS``), except that everything launched inside a step's ``optimizer`` phase range is ``optimizer``
(clipping, the update, zero_grad) and NCCL's kernels are always ``communication``. On a CPU trace there is no device work: the same figures are computed over the aten ops
(``cpu_op``) of the training thread(s), by self time (``reports.sections._traces``); busy is the time inside an
op, idle the rest of the steps (Python, waiting for data, the profiler itself).

Where a GPU waits (``device_waits``): each gap of at least ``IDLE_GAP_US`` between the steps' device work goes to
the host op that launched the work ending it (the outermost and innermost ``cpu_op`` around the launch call, on the
launching thread): many short gaps under one compiled region say the host launches no faster than the device runs;
and each call that made the host wait for the device (``cudaStreamSynchronize`` and the like, at least
``IDLE_GAP_US``) goes to the op that made it (an ``.item()`` or a tensor's truth value: ``aten::is_nonzero``), since
after one the device idles until the host has launched again.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from reports._load import RunData, StudyData, num
from reports.sections._common import median_of, baseline_runs, best_runs
from reports.sections._traces import op_self_times, read_events, trace_table
from workbench.train.profiling import kernel_kind
from workbench.vocab import STEP_S

__all__ = ["KINDS", "KIND_GROUPS", "DeviceTime", "GpuTime", "device_time", "device_waits", "gpu_section", "work_kind"]

KINDS = ("matmul", "attention", "elementwise/norm", "copy/cast/memset", "optimizer", "communication", "other")
"""The kinds of device work, in the order the report lists them."""

TOP_KERNELS = 10
"""Kernels (or CPU ops) listed by time."""
TOP_WAITS = 8
"""Places the device waits at, listed by time."""
IDLE_GAP_US = 50.0
"""The shortest gap between device work, and the shortest host wait for the device, that ``device_waits`` counts:
below it, the device's own scheduling between kernels."""
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync")
"""Runtime calls that can hold the host until the device is done (a copy to the host, or one from pageable memory,
waits for the stream)."""

KIND_GROUPS = {"matmul": "matmul", "attention": "attention", "communication": "communication",
               "optimizer": "optimizer", "loss": "elementwise/norm", "norm": "elementwise/norm",
               "activation": "elementwise/norm", "rope": "elementwise/norm", "elementwise": "elementwise/norm",
               "cast": "copy/cast/memset", "copy": "copy/cast/memset", "other": "other"}
"""The kind the report lists for each of ``kernel_kind``'s (``workbench.train.profiling.KERNEL_RULES``)."""
_DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def work_kind(name: str, cat: str | None = None, *, in_optimizer: bool = False) -> str:
    """The kind of one kernel, copy, set or CPU op (``kernel_kind``'s, grouped by ``KIND_GROUPS``):
    ``in_optimizer`` when it was launched (or, a CPU op, ran) inside the ``optimizer`` phase range."""
    kind = kernel_kind(name)
    if kind == "communication":
        return kind
    if in_optimizer:
        return "optimizer"
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy/cast/memset"
    return KIND_GROUPS[kind]


class DeviceTime(NamedTuple):
    """The work of a trace's profiled steps."""

    device: str
    """'GPU' (a trace with device work) or 'CPU' (aten ops only)."""
    steps: int
    """The profiled steps the per-step figures divide by: the ``step <n>`` ranges, else the number given."""
    step_ranges: int
    """The trace's ``step <n>`` ranges (0: the figures cover the whole trace)."""
    span_ms: float
    """Per step: the span of the steps (GPU: until their last work ends)."""
    busy_ms: float
    """Per step: the union of the work's intervals."""
    work: pd.DataFrame
    """One row per kernel, copy or set (GPU) or aten op (CPU): name, kind, ms (its self time in the whole span)."""


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals, in their unit."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def _within(t: float, ranges: list[tuple[float, float]]) -> bool:
    return any(s <= t <= e for s, e in ranges)


class _Trace(NamedTuple):
    """What the module's figures read from a trace's complete events ("X", finite, duration >= 0), in one pass."""

    steps: list[tuple[float, float]]
    """The ``step <n>`` ranges."""
    optimizer: list[tuple[float, float]]
    """The ``optimizer`` phase ranges."""
    launches: dict[Any, tuple[Any, float]]
    """Correlation id -> (thread, host time) of each launch call."""
    device: list[tuple[str, str, float, float, Any]]
    """Each kernel, copy and set: name, cat, start, duration, correlation id."""
    syncs: list[tuple[Any, float, float, str]]
    """Each ``SYNC_CALLS`` call of at least ``IDLE_GAP_US``: thread, start, duration, name."""
    ops: dict[Any, list[tuple[float, float, str]]]
    """Per thread, each ``cpu_op``: start, end, name; sorted by start, longest first at a tie."""

    @property
    def host_span(self) -> tuple[float, float]:
        """The host time from the first step range's start to the last one's end (the trace has step ranges)."""
        return min(s for s, _ in self.steps), max(e for _, e in self.steps)


def _read(events: list[dict[str, Any]]) -> _Trace:
    tr = _Trace([], [], {}, [], [], {})
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = num(e.get("ts")), num(e.get("dur"))
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        corr = e["args"].get("correlation") if isinstance(e.get("args"), dict) else None
        if cat == "user_annotation" and name.startswith("step "):
            tr.steps.append((ts, ts + dur))
        elif cat == "user_annotation" and name == "optimizer":
            tr.optimizer.append((ts, ts + dur))
        elif cat in _LAUNCH_CATS:
            if corr is not None:
                tr.launches[corr] = (e.get("tid"), ts)
            if name in SYNC_CALLS and dur >= IDLE_GAP_US:
                tr.syncs.append((e.get("tid"), ts, dur, name))
        elif cat in _DEVICE_WORK:
            tr.device.append((name, cat, ts, dur, corr))
        elif cat == "cpu_op":
            tr.ops.setdefault(e.get("tid"), []).append((ts, ts + dur, name))
    for rows in tr.ops.values():
        rows.sort(key=lambda r: (r[0], -r[1]))
    return tr


def _step_work(tr: _Trace) -> list[tuple[str, str, float, float, Any, float]]:
    """The device work of the steps (all of it without step ranges): name, cat, start, duration, correlation id,
    and the host time of its launch where the trace links them (else its start), which decides its step."""
    work = [(name, cat, ts, dur, corr, tr.launches.get(corr, (None, ts))[1]) for name, cat, ts, dur, corr in tr.device]
    if not tr.steps:
        return work
    begin, host_end = tr.host_span
    return [w for w in work if begin <= w[5] <= host_end]


def device_time(events: list[dict[str, Any]], steps: int | None = None) -> DeviceTime:
    """The device's work over a trace's profiled steps (the module's rules); ``steps``: how many steps the trace
    holds when it has no ``step <n>`` ranges. Raises ValueError when the trace holds no device work and no op."""
    return _device_time(_read(events), events, steps)


def _device_time(tr: _Trace, events: list[dict[str, Any]], steps: int | None) -> DeviceTime:
    step_ranges, optimizer = tr.steps, tr.optimizer
    n = len(step_ranges) or (steps if steps and steps > 0 else 1)
    if tr.device:
        work = _step_work(tr)
        if step_ranges:
            begin, host_end = tr.host_span
            end = max([host_end, *(w[2] + w[3] for w in work)])
        else:
            begin, end = min(w[2] for w in work), max(w[2] + w[3] for w in work)
        busy = _union([(w[2], w[2] + w[3]) for w in work])
        rows = [(name, work_kind(name, cat, in_optimizer=_within(at, optimizer)), dur / 1e3)
                for name, cat, _, dur, _, at in work]
        return DeviceTime("GPU", n, len(step_ranges), (end - begin) / 1e3 / n, busy / 1e3 / n,
                          pd.DataFrame(rows, columns=["name", "kind", "ms"]))
    ops = op_self_times(events)
    ops = ops[ops["cat"] == "cpu_op"]
    if ops.empty:
        raise ValueError("the trace holds no kernel, copy or set and no CPU op")
    if step_ranges:
        ops = ops[[_within(t, step_ranges) for t in ops["ts_us"]]]
        span = _union(step_ranges)
        clipped = [(max(t, s), min(t + d, e)) for t, d in zip(ops["ts_us"], ops["dur_us"])
                   for s, e in step_ranges if t < e and t + d > s]
        busy = _union([c for c in clipped if c[1] > c[0]])
    else:
        span = float((ops["ts_us"] + ops["dur_us"]).max() - ops["ts_us"].min())
        busy = _union(list(zip(ops["ts_us"], ops["ts_us"] + ops["dur_us"])))
    rows = [(name, work_kind(name, "cpu_op", in_optimizer=_within(t, optimizer)), self_us / 1e3)
            for name, t, self_us in zip(ops["name"], ops["ts_us"], ops["self_us"])]
    return DeviceTime("CPU", n, len(step_ranges), span / 1e3 / n, busy / 1e3 / n,
                      pd.DataFrame(rows, columns=["name", "kind", "ms"]))


def _enclosing(ops: dict[Any, list[tuple[float, float, str]]], queries: list[tuple[Any, float, int]]) -> dict[int, str]:
    """For each query (thread, time, id): "outermost > innermost" of the ``cpu_op`` ranges on that thread that hold
    the time ("-" for none). ``ops``: per thread, (start, end, name) sorted by start, longest first at a tie."""
    found: dict[int, str] = {}
    by_tid: dict[Any, list[tuple[float, int]]] = {}
    for tid, t, qid in queries:
        by_tid.setdefault(tid, []).append((t, qid))
    for tid, qs in by_tid.items():
        stack: list[tuple[float, float, str]] = []
        rows, i = ops.get(tid, []), 0
        for t, qid in sorted(qs):
            while i < len(rows) and rows[i][0] <= t:
                while stack and stack[-1][1] < rows[i][0]:
                    stack.pop()
                stack.append(rows[i])
                i += 1
            open_ = [r for r in stack if r[1] >= t]
            found[qid] = (open_[0][2] if len(open_) == 1 else f"{open_[0][2]} > {open_[-1][2]}") if open_ else "-"
    return found


_NO_WAITS = ["what", "where", "count_per_step", "ms_per_step"]


def device_waits(events: list[dict[str, Any]]) -> pd.DataFrame:
    """Where the device waits over a trace's ``step <n>`` ranges (the module's rules): one row per (what, where):
    what is ``idle gap`` (by the op that launched the work after it) or ``host sync`` (the call, by the op that
    made it); with count_per_step and ms_per_step, most time first. Empty without step ranges or device work."""
    return _device_waits(_read(events))


def _device_waits(tr: _Trace) -> pd.DataFrame:
    work = sorted((ts, ts + dur, corr) for _, _, ts, dur, corr, _ in _step_work(tr))
    if not tr.steps or not work:
        return pd.DataFrame(columns=_NO_WAITS)
    begin, end = tr.host_span
    queries, gaps, reach = [], [], work[0][1]
    for i, (start, stop, corr) in enumerate(work[1:], 1):
        if start - reach >= IDLE_GAP_US and corr in tr.launches:
            tid, at = tr.launches[corr]
            queries.append((tid, at, i))
            gaps.append((i, (start - reach) / 1e3))
        reach = max(reach, stop)
    syncs = [x for x in tr.syncs if begin <= x[1] <= end]
    queries += [(tid, ts, -1 - j) for j, (tid, ts, _, _) in enumerate(syncs)]
    where = _enclosing(tr.ops, queries)
    rows = [("idle gap", where[i], ms) for i, ms in gaps]
    rows += [("host sync", f"{call} in {where[-1 - j]}", dur / 1e3) for j, (_, _, dur, call) in enumerate(syncs)]
    if not rows:
        return pd.DataFrame(columns=_NO_WAITS)
    n = len(tr.steps)
    g = pd.DataFrame(rows, columns=["what", "where", "ms"]).groupby(["what", "where"])["ms"].agg(["size", "sum"])
    out = pd.DataFrame({"count_per_step": g["size"] / n, "ms_per_step": g["sum"] / n}).reset_index()
    return out.sort_values(["ms_per_step", "what"], ascending=[False, True], kind="stable").reset_index(drop=True)


class GpuTime(NamedTuple):
    device: str | None
    """'GPU' or 'CPU': what the trace holds; None without a trace."""
    run: str | None
    """The run whose trace it is: 'winner', else 'baseline'."""
    trial: int | None
    trace: str | None
    """The trace file, from the study directory."""
    trace_href: str | None
    """Its relative link (None: outside the study directory)."""
    steps: int
    """Profiled steps the per-step figures divide by."""
    by_kind: pd.DataFrame
    """kind, calls_per_step, ms_per_step, share_pct (of all the work's time), span_pct (of the step's span): the
    kinds with any time, in ``KINDS`` order."""
    busy: pd.DataFrame
    """what ('busy', 'idle', 'step span'), ms_per_step, span_pct."""
    flops: pd.DataFrame
    """metric, value, peak_pct (of the peak, for a rate), source: model FLOPs per step, achieved TFLOP/s of the
    measured runs, the peak, MFU, and the model's FLOPs over the trace's busy and matmul + attention time."""
    top: pd.DataFrame
    """name, kind, calls_per_step, ms_per_step, share_pct, span_pct: the kernels (or CPU ops) with the most time."""
    message: str | None
    flops_message: str | None = None
    """Why there is no TFLOP/s, or no peak to hold it against; None when both are there."""
    waits: pd.DataFrame | None = None
    """what, where, count_per_step, ms_per_step: the places the GPU waits at, most time first (``device_waits``,
    the first ``TOP_WAITS``); None on a CPU trace or without a trace."""


def _empty(message: str) -> GpuTime:
    return GpuTime(device=None, run=None, trial=None, trace=None, trace_href=None, steps=0,
                   by_kind=pd.DataFrame(columns=["kind", "calls_per_step", "ms_per_step", "share_pct", "span_pct"]),
                   busy=pd.DataFrame(columns=["what", "ms_per_step", "span_pct"]),
                   flops=pd.DataFrame(columns=["metric", "value", "peak_pct", "source"]),
                   top=pd.DataFrame(columns=["name", "kind", "calls_per_step", "ms_per_step", "share_pct",
                                             "span_pct"]), message=message)


def gpu_section(data: StudyData) -> GpuTime:
    traces, traces_message, found = trace_table(data)
    arm = next((a for a in ("winner", "baseline") if a in found), None)
    if arm is None:
        why = traces_message or "No trace file of the kept traces could be found."
        return _empty(f"No GPU time: {why[0].lower()}{why[1:]}")
    row = traces.loc[arm]
    trial = None if row["trial"] is None or row["trial"] != row["trial"] else int(row["trial"])
    hint = num(row["steps"])
    try:
        events = read_events(found[arm])
        trace = _read(events)
        dt = _device_time(trace, events, int(hint) if math.isfinite(hint) else None)
    except (OSError, ValueError) as e:
        return _empty(f"No GPU time: the {arm}'s trace could not be used ({type(e).__name__}: {e}).")
    n, span = dt.steps, dt.span_ms
    total = float(dt.work["ms"].sum())
    g = dt.work.groupby("kind")["ms"].agg(["size", "sum"])
    by_kind = pd.DataFrame([(k, g.loc[k, "size"] / n, g.loc[k, "sum"] / n, 100 * g.loc[k, "sum"] / total,
                             100 * g.loc[k, "sum"] / n / span) for k in KINDS if k in g.index and g.loc[k, "sum"] > 0],
                           columns=["kind", "calls_per_step", "ms_per_step", "share_pct", "span_pct"])
    busy = pd.DataFrame([("busy", dt.busy_ms, 100 * dt.busy_ms / span), ("idle", span - dt.busy_ms,
                                                                          100 * (span - dt.busy_ms) / span),
                         ("step span", span, 100.0)], columns=["what", "ms_per_step", "span_pct"])
    t = (dt.work.groupby(["name", "kind"])["ms"].agg(["size", "sum"]).reset_index()
         .sort_values(["sum", "size"], ascending=[False, False], kind="stable").head(TOP_KERNELS))
    top = pd.DataFrame({"name": t["name"], "kind": t["kind"], "calls_per_step": t["size"] / n,
                        "ms_per_step": t["sum"] / n, "share_pct": 100 * t["sum"] / total,
                        "span_pct": 100 * t["sum"] / n / span}).reset_index(drop=True)
    runs = best_runs(data, trial) if arm == "winner" else baseline_runs(data)
    compute_ms = float(by_kind.loc[by_kind["kind"].isin(["matmul", "attention"]), "ms_per_step"].sum())
    traced = found[arm].parent  # the measured run profiled after its measurement (an older study's trace run)
    flops, flops_message = _flops(RunData(name=f"{traced.parent.name}/{traced.name}", path=traced), runs, dt,
                                  compute_ms)
    waits = _device_waits(trace).head(TOP_WAITS) if dt.device == "GPU" else None
    return GpuTime(device=dt.device, run=arm, trial=trial, trace=str(row["file"]),
                   trace_href=row["trace_href"] if isinstance(row["trace_href"], str) else None, steps=n,
                   by_kind=by_kind, busy=busy, flops=flops, top=top, message=None, flops_message=flops_message,
                   waits=waits)


def _window_flops(run: RunData) -> tuple[float, float]:
    """(model FLOPs per step, achieved TFLOP/s) over a run's metrics.jsonl windows, weighted by their steps; NaN
    where the windows carry no ``flops/achieved_tflops_per_gpu`` (workbench/train/metrics.py)."""
    m = run.metrics
    if m is None or "flops/achieved_tflops_per_gpu" not in m or STEP_S not in m:
        return math.nan, math.nan
    rate = pd.to_numeric(m["flops/achieved_tflops_per_gpu"], errors="coerce")
    step = pd.to_numeric(m[STEP_S], errors="coerce")
    steps = pd.to_numeric(m["steps"], errors="coerce").fillna(1) if "steps" in m else pd.Series(1.0, index=m.index)
    ok = rate.notna() & step.notna() & (rate > 0) & (step > 0)
    if not ok.any():
        return math.nan, math.nan
    flops = (rate * 1e12 * step * steps)[ok].sum()
    wall = (step * steps)[ok].sum()
    return float(flops / steps[ok].sum()), float(flops / wall / 1e12)


def _flops(trace_run: RunData, runs: list[RunData], dt: DeviceTime,
           compute_ms: float) -> tuple[pd.DataFrame, str | None]:
    """The FLOPs table and why a part of it is missing."""
    per_step, _ = _window_flops(trace_run)
    per_step_src = "the traced run's windows: flops/achieved_tflops_per_gpu × time/step_s"
    measured = [_window_flops(r) for r in runs]
    if not math.isfinite(per_step):
        per_step = median_of(f for f, _ in measured)
        per_step_src = f"median over {len(runs)} measured run(s)' windows"
    achieved = median_of(a for _, a in measured)
    peak = next((p for r in [trace_run, *runs] if math.isfinite(p := r.metric("peak_tflops")) and p > 0), math.nan)
    if not math.isfinite(per_step) and not math.isfinite(achieved):
        return (pd.DataFrame(columns=["metric", "value", "peak_pct", "source"]),
                "No TFLOP/s: the runs' metrics carry no model FLOPs (flops/achieved_tflops_per_gpu).")
    where = "device-busy" if dt.device == "GPU" else "in-op (CPU)"
    rows = [("model GFLOP per step, per GPU", per_step / 1e9, math.nan,
             f"{per_step_src} (6 × parameters + attention, per real token)"),
            ("achieved TFLOP/s, measured runs", achieved, math.nan,
             f"median over {sum(math.isfinite(a) for _, a in measured)} run(s)' windows, no profiler"),
            ("peak TFLOP/s", peak, math.nan, "the runs' peak_tflops (dense bf16 peak table, or hardware.peak_tflops)"),
            (f"TFLOP/s over {where} time", per_step / (dt.busy_ms / 1e3) / 1e12 if dt.busy_ms > 0 else math.nan,
             math.nan, "model FLOPs per step ÷ busy time per profiled step"),
            ("TFLOP/s over matmul + attention time", per_step / (compute_ms / 1e3) / 1e12 if compute_ms > 0
             else math.nan, math.nan, "model FLOPs per step ÷ matmul and attention time per profiled step: the "
                                      "rate of those kernels if they did all the FLOPs")]
    flops = pd.DataFrame(rows, columns=["metric", "value", "peak_pct", "source"])
    rates = flops["metric"].str.contains("TFLOP/s") & ~flops["metric"].str.startswith("peak")
    flops.loc[rates, "peak_pct"] = 100 * flops.loc[rates, "value"] / peak
    flops = flops[flops["value"].notna()].reset_index(drop=True)
    message = None
    if not math.isfinite(peak):
        message = ("No peak FLOP/s to hold these against: " + ("a CPU has none in the peak table" if dt.device == "CPU"
                   else "the GPU is not in the peak table") + " (hardware.peak_tflops sets one), so no MFU.")
    return flops, message
