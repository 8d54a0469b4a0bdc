"""Draws the Search and Trials sections."""

from __future__ import annotations

import functools
import math
import re
from typing import TYPE_CHECKING

import pandas as pd

from reports._load import knob_doc, knob_key
from reports.render.figures import (
    ARM_COLORS,
    FULL_W,
    HALF_W,
    STATUS_FAILED,
    STATUS_OK,
    STATUS_PRUNED,
    new_figure,
    Figures,
    grid_axes,
    kfmt,
    knob_axis,
)
from reports.render.tables import esc, missing_note, short_names, html_table, fmt
from reports.sections.search import NOT_FAILED, Search, Trials

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def render_search(s: Search, figs: Figures) -> str:
    out = []
    if len(s.history):
        out.append(figs.svg(functools.partial(_draw_history, s.history, s.baseline_band, s.objective_name,
                                              s.direction)))
    if s.gpu_minutes is not None:
        out.append(_gpu_minutes(s))
    if s.profile_line or s.warm_start_line or s.walk_line:
        out.append("<h3>What led the first proposals</h3>")
    if s.warm_start_line:
        out.append(f'<p id="warm-start">{esc(s.warm_start_line[0].upper() + s.warm_start_line[1:])}.</p>')
    if s.walk_line:
        out.append(f'<p id="walk">{esc(s.walk_line[0].upper() + s.walk_line[1:])}.</p>')
    if s.profile_line:
        out.append(f'<p id="profile-lead">{esc(s.profile_line[0].upper() + s.profile_line[1:])}. Knobs held there '
                   "are searched after the startup trials.</p>")
    short = short_names(s.knob_names)
    out.append('<div class="cols"><div>')
    if s.importances is not None and len(s.importances):
        out.append(figs.svg(functools.partial(_draw_importances, s.importances, short),
                            "Computed over the trials that ran to the end; failures are in the trials table."))
    else:
        out.append("<h3>Parameter importances</h3>")
        out.append(missing_note(s.importances_message or "No importances."))
    out.append("</div><div>")
    if s.pareto is not None:
        out.append(figs.svg(functools.partial(_draw_pareto, s.pareto)))
    elif s.pareto_message:
        out.append("<h3>Pareto front</h3>")
        out.append(missing_note(s.pareto_message))
    out.append("</div></div>")
    if len(s.knobs) and s.knob_names:
        out.append(figs.svg(functools.partial(_draw_knob_slices, s.knobs, s.knob_names, short, kinds=s.knob_kinds,
                                              choices=s.knob_choices, log_knobs=s.log_knobs)))
    elif not s.message:
        out.append(missing_note("No finished trial yet: no knob view."))
    return "\n".join(out)


def _draw_history(h: pd.DataFrame, baseline_band: tuple[float, float, float] | None, objective_name: str,
                  direction: str) -> Figure:
    """Each trial's objective by status, the best so far, and the baseline's noise band."""
    fig = new_figure(FULL_W, 3.4)
    ax = fig.add_subplot()
    if baseline_band:
        med, lo, hi = baseline_band
        ax.axhspan(lo, hi, color=ARM_COLORS["baseline"], alpha=0.18, lw=0,
                   label="baseline noise (min–max of repeats)", gid="ref")
        ax.axhline(med, color=ARM_COLORS["baseline"], lw=1, ls="--", gid="ref")
    ok = h[h["status"] == "ok"]
    pruned = h[h["status"] == "pruned"]
    failed = h[~h["status"].isin(["ok", "pruned"])]
    ax.scatter(ok["trial"], ok["value"], s=20, color=STATUS_OK, label="finished", zorder=3)
    ax.scatter(pruned["trial"], pruned["value"], s=20, facecolors="none", edgecolors=STATUS_PRUNED,
               label="pruned (last window)", zorder=3)
    ax.scatter(failed["trial"], failed["value"], s=26, marker="x", color=STATUS_FAILED,
               label="failed (objective 0)", zorder=3)
    ax.step(h["trial"], h["best_so_far"], where="post", color="#f28e2b", lw=1.8, label="best so far")
    ax.yaxis.set_major_formatter(kfmt)
    ax.set_xlabel("trial")
    ax.set_ylabel("real tokens/s/GPU" if "tokens" in objective_name else objective_name)
    ax.set_title(f"Optimization history ({direction})")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8.5)
    return fig


def _draw_importances(imp: pd.DataFrame, short: dict[str, str]) -> Figure:
    """The knobs' importances, most important on top, by short name."""
    fig = new_figure(HALF_W * 0.9, 0.32 * len(imp) + 1.0)
    ax = fig.add_subplot()
    ax.barh([short.get(k, k) for k in imp["knob"]], imp["importance"], color=STATUS_OK)
    ax.invert_yaxis()
    ax.set_xlabel(f"importance ({imp.attrs.get('method', 'Optuna')}, sums to 1)")
    ax.set_title("Parameter importances for throughput")
    ax.grid(axis="y", visible=False)
    return fig


def _draw_pareto(p: pd.DataFrame) -> Figure:
    """The trials on the two objectives (columns 1 and 2 of ``p``), the front joined and labelled by trial."""
    n0, n1 = p.columns[1], p.columns[2]
    fig = new_figure(HALF_W, 3.6)
    ax = fig.add_subplot()
    off, on = p[~p["on_front"]], p[p["on_front"]].sort_values(n0)
    ax.scatter(off[n0], off[n1], s=18, color=STATUS_PRUNED, label="dominated")
    ax.plot(on[n0], on[n1], "o-", color="#f28e2b", ms=5, label="Pareto front")
    for _, r in on.iterrows():
        ax.annotate(f"{int(r['trial'])}", (r[n0], r[n1]), textcoords="offset points", xytext=(4, 4),
                    fontsize=7.5)
    ax.set_xlabel(n0)
    ax.set_ylabel(n1)
    ax.xaxis.set_major_formatter(kfmt)
    ax.set_title("Pareto front (labels: trial)")
    ax.legend(fontsize=8)
    return fig


def _draw_knob_slices(kn: pd.DataFrame, names: list[str], short: dict[str, str], *, kinds: dict[str, str],
                      choices: dict[str, list], log_knobs: list[str]) -> Figure:
    """One panel per knob in ``names``: throughput against the knob's value, coloured by trial, the best ringed."""
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator

    rows, cols = grid_axes(len(names), 5)
    fig = new_figure(FULL_W, 2.1 * rows + 0.4)
    best = kn["value"].max()
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True,
                        gridspec_kw={"hspace": 0.45, "wspace": 0.08, "top": 1 - 0.45 / (2.1 * rows + 0.4)})
    norm = Normalize(float(kn["trial"].min()), float(max(kn["trial"].max(), kn["trial"].min() + 1)))
    shown = []
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.set_visible(False)
            continue
        shown.append(ax)
        x = knob_axis(ax, kn[names[i]], kinds.get(names[i]), choices.get(names[i]), log=names[i] in log_knobs)
        points = ax.scatter(x, kn["value"], s=14, c=kn["trial"], cmap="viridis", norm=norm, zorder=3)
        top = kn["value"] == best
        ax.scatter(x[top.to_numpy()], kn["value"][top], s=60, facecolors="none",
                   edgecolors="#e15759", lw=1.4, zorder=4)
        ax.set_title(short.get(names[i], names[i]), fontsize=9, fontweight="normal")
        ax.yaxis.set_major_formatter(kfmt)
        if i % cols == 0:
            ax.set_ylabel("tokens/s/GPU")
    bar = fig.colorbar(points, ax=shown, fraction=0.02, pad=0.012, aspect=30)
    bar.set_label("trial number (colour)")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    fig.suptitle("Knobs vs throughput (slice view; colour = trial number, red ring = best)",
                 fontsize=10.5, fontweight="bold")
    return fig


def _gpu_minutes(s: Search) -> str:
    """Where the study's device minutes went, by phase."""
    out = ["<h3>Where the GPU-minutes went</h3>" if s.gpu_minutes.attrs.get("device") != "cpu"
           else "<h3>Where the CPU-minutes went (a CPU study)</h3>"]
    out.append(f"<p>{esc(s.gpu_minutes_line or '')}.</p>")
    out.append(html_table(s.gpu_minutes, cls="compact",
                          formats={"gpu_minutes": lambda v: f"{v:.2f}", "share": lambda v: f"{v:.0%}"},
                          headers={"gpu_minutes": "minutes"}, table_id="gpu-minutes"))
    return "\n".join(out)


def render_trials(s: Trials, figs: Figures) -> str:
    out = []
    counts = ", ".join(f"{esc(k)}: {int(v)}" for k, v in s.status_counts.items())
    out.append(f"<p>{len(s.table)} trials — {counts}. Click a column header to sort; the table scrolls sideways "
               "in its box, the trial number staying in view.</p>")
    out.extend(f'<p class="note">{esc(n)}</p>' for n in s.notes)
    short = short_names(s.knob_names)
    # Knob headers may break after "_" or "." (a zero-width space): a column is then as wide as its values.
    headers = {k: re.sub(r"([_.])", "\\1\u200b", short[k]) for k in s.knob_names} | {
        "max_reserved_gib": "reserved GiB", "duration_s": "duration (s)", "failure_kind": "failure",
        "failure_reason": "reason", "mfu_pct": "MFU %", "value": "tokens/s/GPU"}
    titles = {k: f"{knob_key(k)}: {knob_doc(k)}" if knob_doc(k) else knob_key(k) for k in s.knob_names}
    formats = {"duration_s": lambda v: fmt(v, 3) if not (isinstance(v, float) and math.isnan(v)) else "—"}
    # The knobs before the failure's kind and reason (the widest column), so that they show without scrolling.
    last = [c for c in ("failure_kind", "failure_reason") if c in s.table.columns]
    table = s.table[[c for c in s.table.columns if c not in last] + last]
    out.append('<div class="scroll">')
    out.append(html_table(table, sortable=True, headers=headers, titles=titles, formats=formats,
                          table_id="trials-table", cls="trials", col_classes={"failure_reason": "reason"},
                          clip=("failure_reason",), box=False,
                          row_class=lambda r: "" if r["status"] in ("ok", "running") else
                          ("pruned" if r["status"] in NOT_FAILED else "failed")))
    out.append("</div>")
    if len(s.log_tails):
        out.append("<h3>Log tails of failed trials</h3>")
        for _, r in s.log_tails.iterrows():
            out.append(f"<details><summary>trial {int(r['trial'])}: {esc(r['status'])}</summary>"
                       f"<pre>{esc(r['log_tail'])}</pre></details>")
    return "\n".join(out)
