"""Two report sections as data: compile time per trial (cold or warm from the study's shared cache) and numerics
(the guard's checks, and a convergence run's loss curves when the study directory holds ``convergence.csv``).

``convergence.csv`` is what ``benchmarks/convergence.py`` writes (long format: variant, step, loss, ...); copy
it into the study directory to have the report plot it.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from reports._load import StudyData, num
from workbench.vocab import COMPILE_S

__all__ = ["CompileSection", "NumericsSection", "compile_section", "numerics_section"]

CONVERGENCE_FILE = "convergence.csv"
CONVERGENCE_TAIL = 50
"""Steps averaged at the end of each convergence curve for the table."""


class CompileSection(NamedTuple):
    table: pd.DataFrame
    """trial, compile_s, fx_hits, fx_misses, aot_hits, aot_misses, cache: cold (something compiled from scratch),
    warm (every graph from the study's cache) or n/a (nothing compiled)."""
    cold_median_s: float
    warm_median_s: float
    message: str | None


def compile_section(data: StudyData) -> CompileSection:
    rows = []
    for t in data.trials:
        s = t.user_attrs.get("summary") if isinstance(t.user_attrs.get("summary"), dict) else {}
        if COMPILE_S not in s:
            continue
        fx_h, fx_m = num(s.get("compile/fx_graph_cache_hit")), num(s.get("compile/fx_graph_cache_miss"))
        aot_h, aot_m = num(s.get("compile/aot_autograd_cache_hit")), num(s.get("compile/aot_autograd_cache_miss"))
        total = sum(x for x in (fx_h, fx_m) if x == x)
        cache = "n/a" if not total else ("warm" if fx_m == 0 else "cold")
        rows.append({"trial": t.number, "compile_s": num(s.get(COMPILE_S)), "fx_hits": fx_h,
                     "fx_misses": fx_m, "aot_hits": aot_h, "aot_misses": aot_m, "cache": cache})
    table = pd.DataFrame(rows, columns=["trial", "compile_s", "fx_hits", "fx_misses", "aot_hits", "aot_misses",
                                        "cache"])
    cold = table.loc[table["cache"] == "cold", "compile_s"]
    warm = table.loc[table["cache"] == "warm", "compile_s"]
    message = None if len(table) else "No trial recorded its compile time (no trial finished, or none compiled)."
    if len(table) and (table["compile_s"].fillna(0) == 0).all() and (table["cache"] == "n/a").all():
        message = (f"No trial compiled anything ({len(table)} trial(s), 0 s of compile each, no graph cached): "
                   "the trials ran eagerly (loongforge.compute_domain.compile: none).")
    return CompileSection(table=table, cold_median_s=float(cold.median()) if len(cold) else float("nan"),
                          warm_median_s=float(warm.median()) if len(warm) else float("nan"), message=message)


class NumericsSection(NamedTuple):
    checks: pd.DataFrame
    """trial, status, loss, reference_loss, rel_diff, tolerance, reference, runs, passed: one row per guarded
    trial (losses: each run's median step loss; tolerance: the one applied, widened by the base's spread; runs: the
    reference's runs the check was made against)."""
    baseline_losses: list[float]
    """The base config's median step loss per baseline repeat (their spread is the run-to-run noise)."""
    curves: pd.DataFrame | None
    """convergence.csv: variant, step, loss."""
    curve_tail: pd.DataFrame | None
    """variant, mean_loss over the last CONVERGENCE_TAIL steps, rel_diff from the first variant."""
    message: str | None
    skipped: list[int] = []
    """Trials that changed a numerics knob but were not above the baseline median: no check, no twin ran
    (``numerics_skipped``)."""
    reruns: list[int] = []
    """Trials whose check failed against one run of the reference, which then ran once more (``rerun_wall_s``)."""


def numerics_section(data: StudyData) -> NumericsSection:
    rows = []
    for t in data.trials:
        check = t.user_attrs.get("numerics")
        if not isinstance(check, dict):
            continue
        rows.append({"trial": t.number, "status": t.user_attrs.get("status"), "loss": num(check.get("loss")),
                     "reference_loss": num(check.get("reference_loss")), "rel_diff": num(check.get("rel_diff")),
                     "tolerance": num(check.get("tolerance")), "reference": check.get("reference"),
                     "runs": num(check.get("reference_runs")), "passed": bool(check.get("passed"))})
    checks = pd.DataFrame(rows, columns=["trial", "status", "loss", "reference_loss", "rel_diff", "tolerance",
                                         "reference", "runs", "passed"])
    curves = tail = None
    path = data.study_dir / CONVERGENCE_FILE
    if path.exists():
        try:
            df = pd.read_csv(path)
            curves = df[["variant", "step", "loss"]].dropna() if {"variant", "step", "loss"} <= set(df.columns) \
                else None
        except (OSError, ValueError) as e:
            data.problems.append(f"{path}: {e}")
        if curves is not None and len(curves):
            last = curves[curves["step"] > curves["step"].max() - CONVERGENCE_TAIL]
            tail = last.groupby("variant", sort=False)["loss"].mean().rename("mean_loss").reset_index()
            tail["rel_diff"] = tail["mean_loss"] / tail["mean_loss"].iloc[0] - 1
    losses = [float(x) for x in (data.study_user_attrs.get("baseline_losses") or []) if isinstance(x, (int, float))]
    skipped = [t.number for t in data.trials if t.user_attrs.get("numerics_skipped")]
    reruns = [t.number for t in data.trials if isinstance(t.user_attrs.get("rerun_wall_s"), (int, float))]
    message = None if (len(checks) or curves is not None or skipped) else \
        "No trial changed a numerics knob (FP8), so no loss was checked; no convergence.csv in the study directory."
    return NumericsSection(checks=checks, baseline_losses=losses, curves=curves, curve_tail=tail, message=message,
                           skipped=skipped, reruns=reruns)
