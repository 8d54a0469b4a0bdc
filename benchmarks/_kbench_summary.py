"""kernels_bench's results: the fastest launch per kernel and shape, the summary table and the goal checks."""

from __future__ import annotations

import math

from _kbench_e2e import E2E_MODES
from _kbench_setup import GOAL_PCT_OF_COPY, MODES



def _best_launch(df) -> dict[str, dict[str, dict[str, int]]]:
    """shape -> kernel -> fastest full-mode triton configuration."""
    import kernels

    out: dict[str, dict[str, dict[str, int]]] = {}
    ok = df[(df["provider"] == "triton") & (df["mode"] == "full") & df["median_ms"].notna()]
    for (kernel, shape), g in ok.groupby(["kernel", "shape"]):
        row = g.loc[g["median_ms"].idxmin()]
        params = kernels.get_space(kernel).param_names()
        out.setdefault(shape, {})[kernel] = {p: int(row[p]) for p in params}
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _summary(df, ceiling: float) -> tuple[str, list[str]]:
    """A markdown table (best triton config vs torch vs torch.compile per kernel, shape, mode) and goal checks."""
    import pandas as pd

    lines = [f"Copy ceiling measured in this run: {ceiling:,.0f} GB/s (read + write).", "",
             "| kernel | shape | mode | triton ms (best) | GB/s | % of copy | % of copy at size | compile % of copy "
             "at size | torch ms | compile ms | x torch | x compile | launch (best full) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    goals: list[str] = []
    kern = df[df["kernel"] != "e2e_step"]
    for (kernel, shape), g in kern.groupby(["kernel", "shape"], sort=False):
        tri = g[(g["provider"] == "triton") & g["median_ms"].notna()]
        if tri.empty:
            continue
        full = tri[tri["mode"] == "full"]
        best_launch = full.loc[full["median_ms"].idxmin(), "launch"] if not full.empty else ""
        _mode_rows(kernel, shape, g, tri, best_launch, lines, goals)
        if kernel == "fused_linear_ce":
            goals += _fused_ce_goal(shape, g, full)
    e2e = df[df["kernel"] == "e2e_step"]
    if not e2e.empty:
        _e2e_summary(e2e, lines, goals)
    pd.set_option("display.width", 250)
    return "\n".join(lines) + "\n", goals


def _mode_rows(kernel: str, shape: str, g, tri, best_launch: str, lines: list[str], goals: list[str]) -> None:
    """A kernel's row per mode at its best full-mode launch, against torch and torch.compile, and the goal check
    of a memory-bound kernel's forward and backward (a share of the copy ceiling, faster than torch.compile)."""
    for mode in MODES:
        t = tri[(tri["mode"] == mode) & (tri["launch"] == best_launch)]
        if t.empty:
            continue
        t = t.iloc[0]
        ref = g[(g["provider"] == "torch") & (g["mode"] == mode)]
        comp = g[(g["provider"] == "torch_compile") & (g["mode"] == mode)]
        ref_ms = float(ref["median_ms"].iloc[0]) if len(ref) else math.nan
        comp_ms, comp_at_size = ((float(comp["median_ms"].iloc[0]), float(comp["pct_of_size_copy"].iloc[0]))
                                 if len(comp) else (math.nan, math.nan))
        lines.append(f"| {kernel} | {shape} | {mode} | {t['median_ms']:.3f} | {t['gb_per_s']:,.0f} | "
                     f"{t['pct_of_copy_ceiling']:.1f} | {t['pct_of_size_copy']:.1f} | {comp_at_size:.1f} | "
                     f"{ref_ms:.3f} | {comp_ms:.3f} | "
                     f"{_ratio(ref_ms, t['median_ms']):.2f} | {_ratio(comp_ms, t['median_ms']):.2f} | "
                     f"{best_launch} |")
        if kernel != "fused_linear_ce" and mode in ("fwd", "bwd"):
            ok = t["pct_of_copy_ceiling"] >= GOAL_PCT_OF_COPY and t["median_ms"] < comp_ms
            goals.append(f"{'PASS' if ok else 'FAIL'} {kernel} {shape} {mode}: "
                         f"{t['pct_of_copy_ceiling']:.1f}% of copy (goal >= {GOAL_PCT_OF_COPY:.0f}%), "
                         f"{_ratio(comp_ms, t['median_ms']):.2f}x torch.compile (goal > 1); a copy of as many "
                         f"bytes: {t['pct_of_size_copy']:.1f}%, torch.compile's {comp_at_size:.1f}%")


def _fused_ce_goal(shape: str, g, full) -> list[str]:
    """The fused loss's goal: memory against the eager unfused loss (its N x V logits are what fusing removes);
    time against the FASTER unfused one (torch.compile pads the vocabulary and fuses the softmax, eager does
    neither). No line when either reference is missing."""
    ref_full = g[(g["provider"] == "torch") & (g["mode"] == "full")]
    unfused = g[g["provider"].isin(["torch", "torch_compile"]) & (g["mode"] == "full") & g["median_ms"].notna()]
    if not (len(ref_full) and len(unfused)):
        return []
    fastest = unfused.loc[unfused["median_ms"].idxmin()]
    ref_gib = float(ref_full["peak_mem_gib"].iloc[0])
    by_time = full.sort_values("median_ms")
    lean = by_time[ref_gib / by_time["peak_mem_gib"] >= 4]  # the fastest config meeting the memory goal
    t = (lean if len(lean) else by_time).iloc[0]
    mem_x = ref_gib / float(t["peak_mem_gib"])
    time_x = float(t["median_ms"]) / float(fastest["median_ms"])
    ok = mem_x >= 4 and time_x <= 1.10
    return [f"{'PASS' if ok else 'FAIL'} fused_linear_ce {shape} ({t['launch']}): peak memory "
            f"{float(t['peak_mem_gib']):.2f} GiB vs {float(ref_full['peak_mem_gib'].iloc[0]):.2f} GiB "
            f"unfused eager ({mem_x:.1f}x lower, goal >= 4x); time {time_x:.3f}x the fastest unfused "
            f"({fastest['provider']}, {float(fastest['median_ms']):.2f} ms; goal <= 1.10)"]


def _e2e_summary(e2e, lines: list[str], goals: list[str]) -> None:
    """The end-to-end steps' table, and per mode: Triton ops against torch ops (the goal), the fused residual add
    and any Triton-for-some-ops mix against them (information)."""
    import pandas as pd

    lines += ["", "| end to end | ms/step (median) | p20 | p80 | tokens/s | peak GiB | loss |",
              "|---|---|---|---|---|---|---|"]
    for _, r in e2e.iterrows():
        if isinstance(r.get("error"), str) and r["error"]:
            lines.append(f"| {r['provider']} | failed: {r['error'][:120]} | | | | | |")
            continue
        lines.append(f"| {r['provider']} | {r['median_ms']:.1f} | {r['p20_ms']:.1f} | {r['p80_ms']:.1f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['peak_mem_gib']:.1f} | {r['loss']:.5f} |")
    by = {r["provider"]: r for _, r in e2e.iterrows()}
    for mode in E2E_MODES:
        a, b = by.get(f"torch_ops_{mode}"), by.get(f"triton_ops_{mode}")
        if a is not None and b is not None and (pd.isna(a["median_ms"]) or pd.isna(b["median_ms"])):
            goals.append(f"FAIL end to end {mode}: not measured ({a.get('error') or b.get('error')})")
        elif a is not None and b is not None:
            goals.append(f"{'PASS' if b['median_ms'] < a['median_ms'] else 'FAIL'} end to end {mode}: triton "
                         f"ops {a['median_ms'] / b['median_ms']:.3f}x the step speed of torch ops; losses "
                         f"{b['loss']:.5f} vs {a['loss']:.5f}")
        c = by.get(f"triton_fused_ops_{mode}")
        if b is not None and c is not None and not (pd.isna(b["median_ms"]) or pd.isna(c["median_ms"])):
            goals.append(f"INFO end to end {mode}: the fused residual add {b['median_ms'] / c['median_ms']:.3f}x "
                         f"the step speed of the Triton ops without it; losses {c['loss']:.5f} vs "
                         f"{b['loss']:.5f}")
        suffix = f"_ops_{mode}"
        mixes = {n[: -len(suffix)]: m for n, m in by.items() if n.endswith(suffix)}
        for ops_name, m in mixes.items():  # Triton for some ops only
            if ops_name in ("torch", "triton", "triton_fused") or a is None:
                continue
            if not (pd.isna(a["median_ms"]) or pd.isna(m["median_ms"])):
                goals.append(f"INFO end to end {mode}: Triton for {ops_name} only "
                             f"{a['median_ms'] / m['median_ms']:.3f}x the step speed of torch ops; losses "
                             f"{m['loss']:.5f} vs {a['loss']:.5f}")
