"""Draws the 'GPU time' section."""

from __future__ import annotations

import math

from reports.render.figures import HALF_W, new_figure, Figures
from reports.render.tables import esc, missing_note, html_table, fmt
from reports.sections.gpu import GpuTime

KIND_COLORS = {"matmul": "#4e79a7", "attention": "#76b7b2", "elementwise/norm": "#f28e2b",
               "copy/cast/memset": "#edc948", "optimizer": "#b07aa1", "communication": "#59a14f",
               "other": "#9c755f", "idle": "#d4d4d4"}


def _pct(v: float) -> str:
    return "—" if v != v else f"{v:.1f}%"


def render_gpu(s: GpuTime, figs: Figures) -> str:
    out = []
    trial = f" (trial #{s.trial})" if s.trial is not None else ""
    trace = f'<a href="{esc(s.trace_href)}">{esc(s.trace)}</a>' if s.trace_href else f"<code>{esc(s.trace)}</code>"
    what = "kernels, copies and sets on the GPU" if s.device == "GPU" else "aten ops on the CPU, by self time"
    out.append(f"<p>From the {esc(s.run)}'s trace{esc(trial)}, {trace}: {what}, per profiled step "
               f"({s.steps} step{'s' if s.steps != 1 else ''}).</p>")
    if s.device == "CPU":
        out.append('<p class="note">No GPU: a CPU study. The same figures over the aten ops of the training thread: '
                   "busy is the time inside an op, idle the rest of the step (Python, waiting for data, the "
                   "profiler).</p>")
    bk, busy = s.by_kind, s.busy.set_index("what")
    out.append('<div class="cols"><div>')

    def draw():
        labels = list(bk["kind"]) + ["idle"]
        values = list(bk["ms_per_step"]) + [float(busy.loc["idle", "ms_per_step"])]
        shares = list(bk["span_pct"]) + [float(busy.loc["idle", "span_pct"])]
        fig = new_figure(HALF_W, 0.32 * len(labels) + 1.1)
        ax = fig.add_subplot()
        ax.barh(labels, values, color=[KIND_COLORS.get(k, "#9c755f") for k in labels], height=0.6)
        top = max(values) if values else 1.0
        for y, (v, p) in enumerate(zip(values, shares)):
            ax.text(v + 0.01 * top, y, f"{p:.0f}%", va="center", fontsize=7.5)
        ax.set_xlim(0, top * 1.12)
        ax.invert_yaxis()
        ax.set_xlabel("ms per profiled step (% of the step's span)")
        ax.set_title(f"{s.device} time by kind of work")
        ax.grid(axis="y", visible=False)
        return fig

    out.append(figs.svg(draw, "Kinds by kernel name (matmul, attention, elementwise and norms, copies and casts); "
                              "optimizer: everything launched in the optimizer phase. Overlapping streams can make "
                              "the kinds add up to more than the busy time."))
    out.append("</div><div>")
    out.append("<h3>Busy and idle</h3>")
    out.append(html_table(s.busy, cls="compact",
                          headers={"what": "", "ms_per_step": "ms/step", "span_pct": "of the span"},
                          formats={"ms_per_step": lambda v: f"{v:,.2f}", "span_pct": _pct}))
    out.append("<h3>Achieved TFLOP/s</h3>")
    if len(s.flops):
        out.append(html_table(s.flops, cls="compact", col_classes={"source": "wrap"},
                              headers={"metric": "", "peak_pct": "of peak"},
                              formats={"value": lambda v: fmt(v), "peak_pct": _pct}))
    if s.flops_message:
        out.append(missing_note(s.flops_message))
    out.append("</div></div>")
    out.append(f"<h3>Top {len(s.top)} {'kernels' if s.device == 'GPU' else 'CPU ops'} by time "
               "(roofline view: where the time is, against the step)</h3>")
    out.append(html_table(s.top, cls="compact", clip=("name",),
                          headers={"calls_per_step": "calls/step", "ms_per_step": "ms/step", "share_pct": "of the work",
                               "span_pct": "of the step"},
                          titles={"share_pct": "share of the time of all the work (kernels, copies, sets) in the steps",
                              "span_pct": "share of the step's span, idle included"},
                          formats={"calls_per_step": lambda v: fmt(v) if not math.isnan(v) else "—",
                               "ms_per_step": lambda v: f"{v:,.3f}", "share_pct": _pct, "span_pct": _pct}))
    if s.waits is not None:
        out.append("<h3>Where the GPU waits</h3>")
        if len(s.waits):
            out.append("<p>Idle gaps of 50 us or more between the GPU's work, by the host op that launched the work "
                       "after each (outermost &gt; innermost); and the host's waits for the GPU, by the op that made "
                       "them. Many short gaps under one op: the host launches no faster than the GPU runs. A sync "
                       "empties the queue the host had launched ahead.</p>")
            out.append(html_table(s.waits, cls="compact", clip=("where",),
                                  headers={"what": "", "count_per_step": "count/step", "ms_per_step": "ms/step"},
                                  formats={"count_per_step": lambda v: fmt(v), "ms_per_step": lambda v: f"{v:,.2f}"}))
        else:
            out.append(missing_note("No idle gap of 50 us or more and no wait for the GPU in the profiled steps."))
    return "\n".join(out)
