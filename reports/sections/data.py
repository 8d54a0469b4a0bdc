"""The Data section: padding per bucket width, shard read latency and the loader's decode rate against training.

The loader's ``decode/tokens_per_s`` is decoded tokens per busy decode-second (loaders/pipeline.py: a per-core
capacity), typically 10^7-10^8, while training runs at 10^3-10^5 real tokens/s/GPU. The two are compared as a
ratio, ``loader_headroom``: how many times faster one decode core is than the step consumes; below 1 the step
waits for data.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from reports._load import RunData, StudyData, knob_key, lookup_key, num
from reports.sections._common import (
    TPUT,
    median_of,
    objective_of,
    baseline_runs,
    best_runs,
    best_trial_number,
    knob_names,
    ok_trials,
    packings,
)
from workbench.vocab import PADDING_RATIO

__all__ = ["DataSection", "data_section", "headroom"]


class DataSection(NamedTuple):
    padding: pd.DataFrame
    """bucket_width, trials, padding_ratio_median, padding_ratio_min, padding_ratio_max, tokens_per_s_median."""
    io: pd.DataFrame
    """Index run ('baseline', 'best'); io_backend, read_latency_ms_p50/p90/p99, decode_tokens_per_s,
    real_tokens_per_s_per_gpu, loader_headroom, padding_ratio."""
    by_trial: pd.DataFrame
    """trial, value, bucket_width, padding_ratio, io_backend, read_latency_ms_p50/p90/p99, decode_tokens_per_s,
    loader_headroom (decode_tokens_per_s / value)."""
    message: str | None
    padding_message: str | None = None
    """Why padding is not drawn against bucket width: no trial padded (packing: fill, or every ratio 0), or every
    finished trial used one bucket width; None when it is drawn."""


def headroom(decode: float, training: float) -> float:
    """The loader's decode rate over the step's throughput; NaN where either is missing or not positive."""
    if not (math.isfinite(decode) and math.isfinite(training)) or decode <= 0 or training <= 0:
        return math.nan
    return decode / training


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
    return median_of(pd.to_numeric(run.metrics[key], errors="coerce"))


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
        row = {"trial": t.number, "value": objective_of(t), "bucket_width": num(bw),
               "padding_ratio": _run_metric(s, run, PADDING_RATIO),
               "io_backend": s.get("io/backend")}
        for k in _IO_KEYS:
            row[k.split("/")[1].replace("tokens_per_s", "decode_tokens_per_s") if k.startswith("decode")
                else k.split("/")[1]] = _run_metric(s, run, k)
        row["loader_headroom"] = headroom(row["decode_tokens_per_s"], row["value"])
        rows.append(row)
    cols = ["trial", "value", "bucket_width", "padding_ratio", "io_backend", "read_latency_ms_p50",
            "read_latency_ms_p90", "read_latency_ms_p99", "decode_tokens_per_s", "loader_headroom"]
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
        for k in (*_IO_KEYS, TPUT, PADDING_RATIO):
            col = {"decode/tokens_per_s": "decode_tokens_per_s", TPUT: "real_tokens_per_s_per_gpu"}.get(
                k, k.split("/")[1])
            vals[col] = median_of(_run_metric(r.summary, r, k) for r in runs)
        vals["loader_headroom"] = headroom(vals["decode_tokens_per_s"], vals["real_tokens_per_s_per_gpu"])
        io[arm] = vals
    io_df = pd.DataFrame.from_dict(io, orient="index", columns=[
        "io_backend", "read_latency_ms_p50", "read_latency_ms_p90", "read_latency_ms_p99",
        "decode_tokens_per_s", "real_tokens_per_s_per_gpu", "loader_headroom", "padding_ratio"])
    io_df.index.name = "run"
    message = None
    if by_trial.empty and (io_df.empty or io_df.drop(columns="io_backend").isna().all().all()):
        message = "No loader metrics yet: no finished run recorded io/* or decode/* figures."
    runs = [r for t in ok_trials(data) if (r := data.trial_run(t.number)) is not None]
    return DataSection(padding=padding, io=io_df, by_trial=by_trial, message=message,
                       padding_message=_padding_message(padding, packings(runs)))


def _padding_message(padding: pd.DataFrame, packing: set[str]) -> str | None:
    """Why padding against bucket width would mean nothing, in one line; None when it means something."""
    if packing == {"fill"}:
        return ("No padding to plot against bucket width: the data uses packing: fill (rows cut from the token "
                "stream, every one seq_len tokens), so bucket width changes nothing.")
    if not len(padding):
        return None  # no ratio recorded: the figure's own line says so
    if (padding["padding_ratio_max"].fillna(0) == 0).all():
        return "No trial padded a single token (padding 0% at every bucket width): nothing to plot."
    if len(padding) == 1:
        row = padding.iloc[0]
        return (f"Every finished trial used bucket width {int(row['bucket_width']):,} (padding "
                f"{100 * row['padding_ratio_median']:.1f}%, median): one point, no curve; search data.bucket_width "
                "to see padding against it.")
    return None
