"""Draws the 'Where the time goes' section."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from reports._load import PHASES
from reports.render.figures import ARM_COLORS, FULL_W, HALF_W, PHASE_COLORS, STATUS_OK, new_figure, Figures
from reports.render.tables import esc, missing_note, fmt_ms, html_table
from reports.sections.phases import TimeSection

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def render_time(s: TimeSection, figs: Figures) -> str:
    if not len(s.breakdown) and s.message:  # no phase timings (the message is drawn): the traces alone
        return _traces(s)
    out = []
    bd = s.breakdown
    st = s.step_times
    out.append('<div class="cols"><div>')
    out.append(figs.svg(functools.partial(_draw_phase_stack, bd)))
    out.append("</div><div>")
    if len(st):
        out.append(figs.svg(functools.partial(_draw_step_distribution, st)))
    else:
        out.append(missing_note("No per-step times (no phases.csv)."))
    out.append("</div></div>")
    if s.by_length_runs:
        out.append(figs.svg(functools.partial(_draw_step_vs_length, st, s.by_length_runs)))
    if s.by_length_message:
        out.append(missing_note(s.by_length_message))
    if len(s.timeline):
        out.append(figs.svg(functools.partial(_draw_timeline, s.timeline)))
    if len(bd):
        out.append("<h3>Milliseconds per step (share of the step)</h3>")
        out.append(_phase_table(bd))
    if len(s.step_stats):
        out.append(_step_stats(s.step_stats))
    out.append(_comm(s))
    out.append(_traces(s))
    return "\n".join(out)


def _draw_phase_stack(bd: pd.DataFrame) -> Figure:
    """Each run's mean step as a bar of its phases, the larger shares labelled."""
    fig = new_figure(HALF_W, 0.6 * len(bd) + 1.6)
    ax = fig.add_subplot()
    left = np.zeros(len(bd))
    for p in PHASES:
        w = bd[p].to_numpy(dtype=float) * 1000
        ax.barh(list(bd.index), w, left=left, color=PHASE_COLORS[p], label=p, height=0.55)
        for y, (l, ww, tot) in enumerate(zip(left, w, bd["step_s"].to_numpy() * 1000)):
            if tot and ww / tot >= 0.07:
                ax.text(l + ww / 2, y, f"{100 * ww / tot:.0f}%", ha="center", va="center", fontsize=7.5,
                        color="white" if p in ("forward", "data_wait", "grad_sync") else "black")
        left += w
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean of measured steps)")
    ax.set_title("Phase breakdown")
    ax.grid(axis="y", visible=False)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.subplots_adjust(right=0.8)  # room for the legend inside the figure's width
    return fig


def _draw_step_distribution(st: pd.DataFrame) -> Figure:
    """Every measured step time of each run: a box plot with the steps jittered over it."""
    arms = list(dict.fromkeys(st["run"]))
    fig = new_figure(HALF_W, 0.6 * len(arms) + 1.6)
    ax = fig.add_subplot()
    data = [st[st["run"] == a]["step_s"].to_numpy() * 1000 for a in arms]
    ax.set_xlim(0, max(d.max() for d in data if len(d)) * 1.05)
    ax.boxplot(data, orientation="horizontal", widths=0.5, showfliers=False,
               medianprops={"color": "black"})
    rng = np.random.default_rng(0)
    for i, (a, d) in enumerate(zip(arms, data), start=1):
        ax.scatter(d, i + rng.uniform(-0.18, 0.18, len(d)), s=7, alpha=0.6,
                   color=ARM_COLORS.get(a, STATUS_OK), zorder=3)
    ax.set_yticks(range(1, len(arms) + 1), arms)
    ax.invert_yaxis()
    ax.set_xlabel("step time (ms); every measured step of every run")
    ax.set_title("Step-time distribution (noise)")
    ax.grid(axis="y", visible=False)
    return fig


def _draw_step_vs_length(st: pd.DataFrame, runs: list[str]) -> Figure:
    """Step time against the step's bucket length, one panel per run in ``runs``."""
    fig = new_figure(FULL_W, 2.6)
    arms = [a for a in dict.fromkeys(st["run"]) if a in runs]
    axes = fig.subplots(1, len(arms), squeeze=False, sharey=True, sharex=True,
                        gridspec_kw={"wspace": 0.06})[0]
    rng = np.random.default_rng(0)
    for ax, arm in zip(axes, arms):
        g = st[st["run"] == arm]
        ax.scatter(g["seq_len"] * (1 + rng.uniform(-0.01, 0.01, len(g))), g["step_s"] * 1000, s=6,
                   alpha=0.5, color=ARM_COLORS.get(arm, STATUS_OK))
        ax.text(0.01, 0.97, arm, transform=ax.transAxes, va="top", fontsize=9.5,
                color=ARM_COLORS.get(arm, STATUS_OK), fontweight="bold")
        ax.set_xlabel("bucket length of the step (tokens)")
    axes[0].set_ylabel("step time (ms)")
    axes[0].set_ylim(0, None)
    fig.suptitle("Step time vs bucket length: the vertical spread at one length is the noise",
                 fontsize=10.5, fontweight="bold", y=1.0)
    return fig


def _draw_timeline(tl: pd.DataFrame) -> Figure:
    """The phases of the first measured steps of each run, laid out in time, one row per run."""
    arms = list(dict.fromkeys(tl["run"]))
    fig = new_figure(FULL_W, 0.55 * len(arms) + 1.4)
    ax = fig.add_subplot()
    for y, arm in enumerate(arms):
        g = tl[tl["run"] == arm]
        for p in PHASES:
            seg = g[g["phase"] == p]
            ax.broken_barh(list(zip(seg["start_s"] * 1000, seg["duration_s"] * 1000)), (y - 0.3, 0.6),
                           facecolors=PHASE_COLORS[p], label=p if y == 0 else None)
        for step, sg in g.groupby("step", sort=False):
            start = sg["start_s"].min() * 1000
            ax.plot([start, start], [y - 0.38, y + 0.38], color="black", lw=0.8)
            ax.text(start + 2, y - 0.42, f"step {step}", fontsize=7, va="bottom")
    ax.set_yticks(range(len(arms)), arms)
    ax.set_ylim(len(arms) - 0.4, -0.7)
    ax.set_xlim(0, float((tl["start_s"] + tl["duration_s"]).max()) * 1000 * 1.01)
    ax.set_xlabel("ms from the first step shown")
    ax.set_title(f"Per-step timeline of the phases (first {tl.groupby('run')['step'].nunique().max()} "
                 "measured steps of each)")
    ax.grid(axis="y", visible=False)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.subplots_adjust(right=0.9)
    return fig


def _phase_table(bd: pd.DataFrame) -> str:
    """Milliseconds per step of each phase, with its share of the step, one row per run."""
    tab = pd.DataFrame({"run": bd.index})
    for p in PHASES:
        tab[p] = [f"{1000 * v:,.1f} ({100 * v / tot:.0f}%)" if tot else "—"
                  for v, tot in zip(bd[p], bd["step_s"])]
    tab["step"] = [fmt_ms(v) for v in bd["step_s"]]
    tab["steps"] = list(bd["steps"])
    tab["source"] = list(bd["source"])
    return html_table(tab, cls="compact nowrap", col_classes={"source": "wrap"})


def _step_stats(step_stats: pd.DataFrame) -> str:
    """The step-time statistics of each run and what its two CVs mean."""
    table = html_table(step_stats.reset_index(), cls="compact",
                       formats={c: fmt_ms for c in ("median_s", "p10_s", "p90_s")}
                       | {"cv_pct": lambda v: f"{v:.1f}%", "noise_cv_pct": lambda v: f"{v:.2f}%"},
                       headers={"median_s": "median", "p10_s": "p10", "p90_s": "p90", "cv_pct": "CV (all steps)",
                                "noise_cv_pct": "CV at one bucket length"})
    note = ('<p class="note">Step times vary with the bucket length of each step; the CV at one bucket '
            "length (median over lengths with at least 3 steps) is the run-to-run noise.</p>")
    return f"{table}\n{note}"


def _comm(s: TimeSection) -> str:
    """The gradient communication table, else why there is none."""
    out = ["<h3>Gradient communication</h3>"]
    if s.comm is not None and len(s.comm):
        out.append(html_table(s.comm.reset_index() if s.comm.index.name else s.comm, cls="compact"))
        out.append('<p class="note">Exposed communication is the grad_sync phase; overlap achieved = '
                   "communication hidden under backward / total communication.</p>")
    else:
        out.append(missing_note(s.comm_message or "No gradient communication: a single-process study."))
    return "\n".join(out)


def _traces(s: TimeSection) -> str:
    """The kept profiler traces (linked from the study dir: the report links nothing outside it) and the top
    ops by self time of the winner's trace, else the baseline's."""
    out = ["<h3>Profiler traces</h3>"]
    tr = s.traces
    if tr is None or not len(tr):
        out.append(missing_note(s.traces_message or "No profiler traces."))
        return "\n".join(out)
    tab = pd.DataFrame({"run": list(tr.index), "trial": list(tr["trial"]), "steps": list(tr["steps"]),
                        "trace": list(tr["file"]), "memory snapshot": [m or "—" for m in tr["memory_snapshot"]],
                        "status": list(tr["status"])})
    out.append(html_table(tab, cls="compact", col_classes={"trace": "wrap", "memory snapshot": "wrap"},
                          formats={"trial": lambda v: "—" if v is None or v != v else f"#{int(v)}"},
                          links={"trace": list(tr["trace_href"]), "memory snapshot": list(tr["snapshot_href"])}))
    out.append('<p class="note">Paths from the study directory, linked where the file is there. To open a trace, '
               "save the trace.json (the link) and load it in ui.perfetto.dev (Open trace file) or drag it onto "
               "chrome://tracing: each step is a <code>step N</code> range, each phase a range of its name; a "
               "memory_snapshot.pickle (CUDA runs) opens in pytorch.org/memory_viz. The traces come from runs of "
               "their own after the validation: no measured run is profiled.</p>")
    if s.top_ops is not None and len(s.top_ops):
        out.append(f"<h3>Top {len(s.top_ops)} {esc(s.top_ops_kind)} by self time ({esc(s.top_ops_of)}'s "
                   "trace)</h3>")
        out.append(html_table(s.top_ops, cls="compact", clip=("name",),
                              formats={"self_ms": lambda v: f"{v:,.2f}", "total_ms": lambda v: f"{v:,.2f}",
                                   "self_pct": lambda v: f"{v:.1f}%", "self_ms_per_step": lambda v: f"{v:,.2f}"},
                              headers={"self_ms": "self (ms)", "total_ms": "total (ms)", "self_pct": "share of self",
                                   "self_ms_per_step": "self ms/step"},
                              titles={"self_ms": "its duration less that of the ops nested in it, summed over calls",
                                  "self_pct": "share of the self time of every op of this kind in the trace"}))
        out.append('<p class="note">Self time: an op\'s duration less that of the ops nested in it on the same '
                   "thread; on a CUDA trace the GPU kernels, on a CPU trace the aten ops. Profiled steps carry the "
                   "profiler's overhead: compare shares, not absolute times, with the phase table above.</p>")
    else:
        out.append(missing_note(s.top_ops_message or "No op in the kept traces."))
    return "\n".join(out)
