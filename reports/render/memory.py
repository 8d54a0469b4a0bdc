"""Draws the Memory section."""

from __future__ import annotations

import numpy as np

from reports.render.figures import FULL_W, HALF_W, _figure, _Figures, _grid, _knob_axis
from reports.render.tables import _esc, _missing, _short_names, _table
from reports.sections.memory import Memory


def _memory(s: Memory, figs: _Figures) -> str:
    out = []
    pk = s.peaks
    if s.message is None:
        out.append('<div class="cols"><div>')
        if len(pk) and pk[["max_allocated_gib", "max_reserved_gib"]].notna().any().any():
            def draw():
                fig = _figure(HALF_W, 2.6)
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

            out.append(figs.svg(draw))
        out.append("</div><div>")
        out.append(_table(pk.reset_index(), cls="compact",
                          headers={"max_allocated_gib": "peak allocated GiB", "max_reserved_gib": "peak reserved GiB",
                                   "reserved_minus_allocated_gib": "reserved − allocated GiB",
                                   "max_rss_gib": "host RSS GiB",
                                   "predicted_peak_gib": "predicted GiB (memory model)"}))
        out.append('<p class="note">Medians over the runs of each arm; reserved − allocated is what the '
                   "caching allocator holds but does not use (fragmentation and cached blocks). The "
                   "prediction (workbench/train/memory_model.py) is of the peak allocated: state, saved "
                   "activations, the torch loss's logits and one block's working set.</p>")
        out.append("</div></div>")
        bt = s.by_trial
        knobs = s.memory_knobs
        if len(bt) and knobs and bt["reserved_minus_allocated_gib"].notna().any():
            short = _short_names(knobs)

            def draw():
                rows, cols = _grid(len(knobs), 5)
                fig = _figure(FULL_W * min(1.0, (cols + 0.3) / 5), 1.8 * rows + 0.5)
                axes = fig.subplots(rows, cols, squeeze=False, sharey=True,
                                    gridspec_kw={"hspace": 0.6, "wspace": 0.1, "top": 1 - 0.5 / (1.8 * rows + 0.5)})
                for i, ax in enumerate(axes.flat):
                    if i >= len(knobs):
                        ax.set_visible(False)
                        continue
                    x = _knob_axis(ax, bt[knobs[i]], s.knob_kinds.get(knobs[i]), s.knob_choices.get(knobs[i]),
                                   log=knobs[i] in s.log_knobs)
                    ax.scatter(x, bt["reserved_minus_allocated_gib"], s=12, color="#4e79a7", zorder=3)
                    ax.set_title(short[knobs[i]], fontsize=8.5, fontweight="normal")
                    if i % cols == 0:
                        ax.set_ylabel("reserved − allocated GiB")
                fig.suptitle("Fragmentation vs memory knobs", fontsize=10.5, fontweight="bold")
                return fig

            out.append(figs.svg(draw, "Fragmentation = peak reserved − peak allocated, per finished trial."))
        else:
            out.append(_missing("No memory knob in the search space: no fragmentation-vs-knob view."
                                if not knobs else "No per-trial memory figures."))
    else:
        out.append(_missing(s.message))

    out.append("<h3>Allocation sizes and suggestions</h3>")
    if s.histogram is not None:
        hg = s.histogram

        def draw():
            fig = _figure(FULL_W * 0.6, 2.6)
            ax = fig.add_subplot()
            labels = [_bytes(v) for v in hg["size_bytes"]]
            ax.bar(range(len(hg)), hg["count"], color="#4e79a7")
            ax.set_xticks(range(len(hg)), labels, rotation=45, ha="right", fontsize=7.5)
            ax.set_xlabel("allocation size (bin upper edge)")
            ax.set_ylabel("allocations")
            ax.set_title("Allocation-size histogram")
            return fig

        out.append(figs.svg(draw, f"From {_esc(s.analysis_source or 'memory_analysis.json')}."))
    if s.analysis_summary is not None and len(s.analysis_summary):
        out.append(_table(s.analysis_summary.reset_index() if s.analysis_summary.index.name
                          else s.analysis_summary, cls="compact"))
    frag = s.fragmentation
    if frag is not None and len(frag) and {"event", "fragmentation_gib"} <= set(frag.columns):
        def draw_frag():
            fig = _figure(FULL_W * 0.6, 2.4)
            ax = fig.add_subplot()
            ax.plot(frag["event"], frag["fragmentation_gib"], color="#4e79a7", lw=1)
            ax.set_xlabel("allocator event")
            ax.set_ylabel("reserved − allocated GiB")
            ax.set_title("Fragmentation over the recorded steps")
            return fig

        out.append(figs.svg(draw_frag))
    if s.suggestions:
        out.append("<ul>" + "".join(f"<li>{_esc(x)}</li>" for x in s.suggestions) + "</ul>")
    if s.analysis_message:
        out.append(_missing(s.analysis_message))
    return "\n".join(out)


def _bytes(v: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{v / size:g} {unit}"
    return f"{v:g} B"
