"""Draws the Memory section."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from reports.render.figures import FULL_W, HALF_W, new_figure, Figures, grid_axes, knob_axis
from reports.render.tables import esc, missing_note, short_names, html_table
from reports.sections.memory import Memory

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def render_memory(s: Memory, figs: Figures) -> str:
    out = []
    if s.message is None:
        out.append(_peaks(s.peaks, figs))
        out.append(_fragmentation_vs_knobs(s, figs))
    else:
        out.append(missing_note(s.message))
    out.append("<h3>Allocation sizes and suggestions</h3>")
    analysis = _allocation_analysis(s, figs)
    if analysis:
        out.append(analysis)
    if s.lifetimes is not None or s.lifetimes_message:  # a study without lifetimes.json shows none of this
        out.append("<h3>Gradient lifetimes</h3>")
        if s.lifetimes is not None:
            out.append(_lifetimes(s, figs))
        if s.lifetimes_message:
            out.append(missing_note(s.lifetimes_message))
    return "\n".join(out)


def _peaks(pk: pd.DataFrame, figs: Figures) -> str:
    """Peak device memory per arm: the figure (when there are device figures) beside the table."""
    out = ['<div class="cols"><div>']
    if len(pk) and pk[["max_allocated_gib", "max_reserved_gib"]].notna().any().any():
        out.append(figs.svg(functools.partial(_draw_peaks, pk)))
    out.append("</div><div>")
    out.append(html_table(pk.reset_index(), cls="compact",
                          headers={"max_allocated_gib": "peak allocated GiB",
                                   "max_reserved_gib": "peak reserved GiB",
                                   "reserved_minus_allocated_gib": "reserved − allocated GiB",
                                   "max_rss_gib": "host RSS GiB",
                                   "predicted_peak_gib": "predicted GiB (memory model)"}))
    out.append('<p class="note">Medians over the runs of each arm; reserved − allocated is what the '
               "caching allocator holds but does not use (fragmentation and cached blocks). The "
               "prediction (workbench/train/memory_model.py) is of the peak allocated: state, saved "
               "activations, the torch loss's logits and one block's working set.</p>")
    out.append("</div></div>")
    return "\n".join(out)


def _fragmentation_vs_knobs(s: Memory, figs: Figures) -> str:
    """Per-trial fragmentation against each memory knob, else why there is no such view."""
    bt = s.by_trial
    knobs = s.memory_knobs
    if len(bt) and knobs and bt["reserved_minus_allocated_gib"].notna().any():
        draw = functools.partial(_draw_fragmentation_vs_knobs, bt, knobs, short_names(knobs), kinds=s.knob_kinds,
                                 choices=s.knob_choices, log_knobs=s.log_knobs)
        return figs.svg(draw, "Fragmentation = peak reserved − peak allocated, per finished trial.")
    return missing_note("No memory knob in the search space: no fragmentation-vs-knob view."
                        if not knobs else "No per-trial memory figures.")


def _allocation_analysis(s: Memory, figs: Figures) -> str:
    """What memory_analysis.json holds: the allocation sizes, fragmentation over the steps, the suggestions."""
    out = []
    if s.histogram is not None:
        out.append(figs.svg(functools.partial(_draw_histogram, s.histogram),
                            f"From {esc(s.analysis_source or 'memory_analysis.json')}."))
    if s.analysis_summary is not None and len(s.analysis_summary):
        out.append(html_table(s.analysis_summary.reset_index() if s.analysis_summary.index.name
                              else s.analysis_summary, cls="compact"))
    frag = s.fragmentation
    if frag is not None and len(frag) and {"event", "fragmentation_gib"} <= set(frag.columns):
        out.append(figs.svg(functools.partial(_draw_fragmentation_over_events, frag)))
    if s.suggestions:
        out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in s.suggestions) + "</ul>")
    if s.analysis_message:
        out.append(missing_note(s.analysis_message))
    return "\n".join(out)


def _draw_peaks(pk: pd.DataFrame) -> Figure:
    """Peak allocated and peak reserved device memory, one pair of bars per arm."""
    fig = new_figure(HALF_W, 2.6)
    ax = fig.add_subplot()
    y = np.arange(len(pk))
    ax.barh(y - 0.18, pk["max_allocated_gib"], height=0.34, color="#4e79a7", label="peak allocated")
    ax.barh(y + 0.18, pk["max_reserved_gib"], height=0.34, color="#a0cbe8", label="peak reserved")
    for yy, a, r in zip(y, pk["max_allocated_gib"], pk["max_reserved_gib"]):
        ax.text(r, yy + 0.18, f" {r:.1f}", va="center", fontsize=8)
        ax.text(a, yy - 0.18, f" {a:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, list(pk.index))
    ax.invert_yaxis()
    ax.set_xlim(0, float(pk["max_reserved_gib"].max()) * 1.12)
    ax.set_xlabel("GiB per GPU")
    ax.set_title("Peak device memory")
    ax.grid(axis="y", visible=False)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.subplots_adjust(right=0.78)  # room for the legend inside the figure's width
    return fig


def _draw_fragmentation_vs_knobs(bt: pd.DataFrame, knobs: list[str], short: dict[str, str], *,
                                 kinds: dict[str, str], choices: dict[str, list], log_knobs: list[str]) -> Figure:
    """One panel per memory knob: each finished trial's reserved − allocated against the knob's value."""
    rows, cols = grid_axes(len(knobs), 5)
    fig = new_figure(FULL_W * min(1.0, (cols + 0.3) / 5), 1.8 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True,
                        gridspec_kw={"hspace": 0.6, "wspace": 0.1, "top": 1 - 0.5 / (1.8 * rows + 0.5)})
    for i, ax in enumerate(axes.flat):
        if i >= len(knobs):
            ax.set_visible(False)
            continue
        x = knob_axis(ax, bt[knobs[i]], kinds.get(knobs[i]), choices.get(knobs[i]), log=knobs[i] in log_knobs)
        ax.scatter(x, bt["reserved_minus_allocated_gib"], s=12, color="#4e79a7", zorder=3)
        ax.set_title(short[knobs[i]], fontsize=8.5, fontweight="normal")
        if i % cols == 0:
            ax.set_ylabel("reserved − allocated GiB")
    fig.suptitle("Fragmentation vs memory knobs", fontsize=10.5, fontweight="bold")
    return fig


def _draw_histogram(hg: pd.DataFrame) -> Figure:
    """Allocations per size bin, labelled by the bin's upper edge."""
    fig = new_figure(FULL_W * 0.6, 2.6)
    ax = fig.add_subplot()
    labels = [_bytes(v) for v in hg["size_bytes"]]
    ax.bar(range(len(hg)), hg["count"], color="#4e79a7")
    ax.set_xticks(range(len(hg)), labels, rotation=45, ha="right", fontsize=7.5)
    ax.set_xlabel("allocation size (bin upper edge)")
    ax.set_ylabel("allocations")
    ax.set_title("Allocation-size histogram")
    return fig


def _draw_fragmentation_over_events(frag: pd.DataFrame) -> Figure:
    """Reserved − allocated after each recorded allocator event."""
    fig = new_figure(FULL_W * 0.6, 2.4)
    ax = fig.add_subplot()
    ax.plot(frag["event"], frag["fragmentation_gib"], color="#4e79a7", lw=1)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("reserved − allocated GiB")
    ax.set_title("Fragmentation over the recorded steps")
    return fig


_SLOT_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def _lifetimes(s: Memory, figs: Figures) -> str:
    """The buckets' lifetimes over the backward, live gradient bytes under both plans, the summary and notes."""
    lt = s.lifetimes
    out = [figs.svg(functools.partial(_draw_lifetimes, lt, s.lifetimes_timeline),
                    "From lifetimes.json (<code>python -m workbench.memory lifetimes</code> on the base "
                    "config): the production order is the autograd engine's schedule replayed on the "
                    "model's backward graph; buckets are the training loop's (overlap.py).")]
    if s.lifetimes_summary is not None and len(s.lifetimes_summary):
        out.append('<div class="cols"><div>')
        out.append(html_table(s.lifetimes_summary, cls="compact"))
        out.append('<p class="note">Today every gradient lives until the optimizer step. The lifetime-aware plan '
                   "gives each bucket one buffer, freed once its all-reduce and a per-bucket optimizer update are "
                   "done, with one bucket in flight while the next fills; buffers whose lifetimes do not overlap "
                   "share a slot (docs/memory.md).</p>")
        if s.lifetimes_notes:
            out.append("<ul>" + "".join(f"<li>No saving at this config: {esc(x)}.</li>"
                                        for x in s.lifetimes_notes) + "</ul>")
        out.append("</div><div>")
        out.append(html_table(lt, cls="compact", headers={
            "mib": "MiB", "first_tick": "first", "ready_tick": "last", "alloc_tick": "buffer from",
            "release_tick": "freed at"}))
        out.append("</div></div>")
    return "\n".join(out)


def _draw_lifetimes(lt: pd.DataFrame, tl: pd.DataFrame | None) -> Figure:
    """Left: each bucket's lifetime in ticks, coloured by buffer slot. Right: live gradient MiB under both plans."""
    from matplotlib.patches import Patch

    n = len(lt)
    fig = new_figure(FULL_W, min(7.0, 1.6 + 0.16 * n))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1.0], "wspace": 0.25})
    y = np.arange(n)
    colors = [_SLOT_COLORS[int(v) % len(_SLOT_COLORS)] if np.isfinite(v) else "#8c8c8c" for v in lt["slot"]]
    carried = lt["first_tick"] - lt["alloc_tick"]  # > 0 only with accumulation: live from the micro-batch before
    left.barh(y, carried.clip(lower=0), left=lt["alloc_tick"], height=0.7, color="#d9d9d9")
    left.barh(y, lt["ready_tick"] - lt["first_tick"] + 1, left=lt["first_tick"], height=0.7, color=colors)
    left.barh(y, lt["release_tick"] - lt["ready_tick"], left=lt["ready_tick"] + 1, height=0.7, color=colors,
              alpha=0.35)
    step = max(1, n // 24)
    left.set_yticks(y[::step], [str(v) for v in lt["layers"]][::step], fontsize=7)
    left.set_ylim(n - 0.5, -0.5)
    left.set_xlim(0, float((lt["release_tick"] + 1).max()))
    left.set_xlabel("tick (one gradient produced per tick, in production order)")
    left.set_title("Gradient buckets over the backward")
    left.grid(axis="y", visible=False)
    handles = [Patch(color=_SLOT_COLORS[0], label="filling (colour: buffer slot)"),
               Patch(color=_SLOT_COLORS[0], alpha=0.35, label="all-reduce and update, until freed")]
    if (carried > 0).any():
        handles.append(Patch(color="#d9d9d9", label="kept from the micro-batch before"))
    if tl is not None and len(tl):
        right.step(tl["tick"], tl["today_mib"], where="post", color="#8c8c8c", label="today's plan")
        right.step(tl["tick"], tl["lifetime_mib"], where="post", color="#4e79a7", label="lifetime-aware plan")
        right.set_xlim(0, float(tl["tick"].max()) + 1)
        right.set_ylim(0, float(tl["today_mib"].max()) * 1.05)
        right.legend(fontsize=8, loc="upper left")
    right.set_xlabel("tick")
    right.set_ylabel("live gradient MiB")
    right.set_title("Live gradient memory")
    fig.subplots_adjust(bottom=0.8 / fig.get_figheight())  # the x labels, then the legend below them
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.1, 0.0), ncol=len(handles), fontsize=8)
    return fig


def _bytes(v: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"
