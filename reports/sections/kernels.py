"""The Kernels section: the best config's launch parameters and, with a kernel_sweep.csv, their times."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from reports._load import StudyData, knob_key, lookup_key
from reports.sections._common import best_trial_number

__all__ = ["Kernels", "kernels_section", "sweep_by_config"]


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
