"""Draw the report: the sections' DataFrames become inline SVG figures, HTML tables and one HTML file.

Nothing is computed here that a test would want to check (``reports.sections``
does that); this module only formats and draws. Figures are drawn on a
``matplotlib.figure.Figure`` with an explicit Agg canvas -- pyplot and the
process-wide backend are left alone, so the tuner can call this in-process --
and embedded as SVG with text kept as text (no font files, searchable). The page
fetches nothing: no external script, style sheet, font or image.
"""

from __future__ import annotations

import datetime
import html
import io
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from reports._load import PHASES, knob_doc, knob_key
from reports.sections import (
    SECTIONS,
    DataSection,
    Environment,
    Kernels,
    Memory,
    ReportData,
    Search,
    SectionFailed,
    Summary,
    TimeSection,
    Trials,
    sweep_by_config,
)
from reports.sections import NOT_FAILED
from reports.sections.numerics import CompileSection, NumericsSection
from workbench.vocab import REAL_TOKENS_PER_S

__all__ = ["render_html"]

PHASE_COLORS = {
    "data_wait": "#e15759", "h2d": "#f28e2b", "forward": "#4e79a7", "backward": "#76b7b2",
    "grad_sync": "#59a14f", "optimizer": "#edc948", "other": "#bab0ac",
}
ARM_COLORS = {"baseline": "#8c8c8c", "best": "#4e79a7"}
STATUS_OK, STATUS_PRUNED, STATUS_FAILED = "#4e79a7", "#b0b0b0", "#e15759"
FULL_W, HALF_W = 12.0, 6.0
"""Figure widths in inches: full width of the page, half of it (two side by side at 1400 px)."""

_RC = {
    "svg.fonttype": "none",        # text stays text: no embedded glyphs, no font files
    "svg.hashsalt": "report",      # stable ids, so that two builds of one study are byte-identical
    "font.size": 9.5,
    "font.family": "DejaVu Sans",  # bundled with matplotlib: text is measured with its metrics
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "legend.frameon": False,
}


# --------------------------------------------------------------------------- formatting


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _isnum(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def fmt(v: Any, digits: int = 3) -> str:
    """A value for a table cell: thousands separators, 3 significant digits, '—' for missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v.is_integer() and abs(v) >= 1:
            return f"{int(v):,}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.{digits}g}"
    return str(v)


def _pct(v: float) -> str:
    return "—" if not _isnum(v) or math.isnan(v) else f"{100 * v:.1f}%"


def _ms(v: float) -> str:
    return "—" if not _isnum(v) or math.isnan(v) else f"{1000 * v:,.1f} ms"


def _missing(text: str) -> str:
    return f'<p class="missing">{_esc(text)}</p>'


def _table(df: pd.DataFrame, *, formats: dict[str, Callable[[Any], str]] | None = None,
           headers: dict[str, str] | None = None, titles: dict[str, str] | None = None,
           sortable: bool = False, index: bool = False, cls: str = "", row_class: Callable | None = None,
           table_id: str | None = None, row_titles: list[str] | None = None,
           col_classes: dict[str, str] | None = None) -> str:
    """An HTML table; numeric cells carry their raw value in ``data-v`` for sorting."""
    formats, headers, titles, col_classes = formats or {}, headers or {}, titles or {}, col_classes or {}
    if index:
        df = df.reset_index()
    classes = " ".join(c for c in ("sortable" if sortable else "", cls) if c)
    out = [f'<table{f" id={chr(34)}{_esc(table_id)}{chr(34)}" if table_id else ""}'
           f'{f" class={chr(34)}{classes}{chr(34)}" if classes else ""}><thead><tr>']
    for c in df.columns:
        title = titles.get(c, c if headers.get(c, c) != c else "")
        out.append(f'<th{f" title={chr(34)}{_esc(title)}{chr(34)}" if title else ""}>'
                   f"{_esc(headers.get(c, c))}</th>")
    out.append("</tr></thead><tbody>")
    for i, (_, row) in enumerate(df.iterrows()):
        rc = row_class(row) if row_class else ""
        title = f' title="{_esc(row_titles[i])}"' if row_titles else ""
        out.append(f'<tr class="{_esc(rc)}"{title}>' if rc else f"<tr{title}>")
        for c in df.columns:
            v = row[c]
            text = formats[c](v) if c in formats else fmt(v)
            extra = f" {col_classes[c]}" if c in col_classes else ""
            if _isnum(v):
                raw = "" if math.isnan(float(v)) else repr(float(v))
                out.append(f'<td class="num{extra}" data-v="{raw}">{_esc(text)}</td>')
            else:
                out.append(f'<td class="{extra.strip()}">{_esc(text)}</td>' if extra else f"<td>{_esc(text)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _short_names(names: list[str]) -> dict[str, str]:
    """Shortest unique dotted suffix of each knob name (``data.bucket_width`` -> ``bucket_width``)."""
    out = {}
    for n in names:
        parts = n.split(".")
        for k in range(1, len(parts) + 1):
            cand = ".".join(parts[-k:])
            if sum(1 for m in names if m == cand or m.endswith("." + cand)) == 1:
                out[n] = cand
                break
        else:
            out[n] = n
    return out


# --------------------------------------------------------------------------- figures


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # No layout engine (constrained layout doubles the drawing time); savefig trims the margins.
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # an explicit Agg canvas: no pyplot, no global backend switch
    return fig


class _Figures:
    """Draws under the report's rcParams and returns inline ``<svg>`` markup with ids unique per figure."""

    def __init__(self) -> None:
        self.count = 0

    def svg(self, draw: Callable[[], Any], caption: str = "", cls: str = "") -> str:
        import matplotlib

        with matplotlib.rc_context(_RC):
            fig = draw()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.06,
                        metadata={"Date": None, "Creator": None})
        self.count += 1
        text = _inline_svg(buf.getvalue(), prefix=f"f{self.count}-")
        cap = f"<figcaption>{caption}</figcaption>" if caption else ""
        return f'<figure class="{cls}">{text}{cap}</figure>' if cls else f"<figure>{text}{cap}</figure>"


def _inline_svg(svg: str, prefix: str) -> str:
    """matplotlib's SVG document as an element for inline HTML: no XML prolog, no RDF metadata, unique ids."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'((?:xlink:)?href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{prefix}{m.group(2)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", svg)
    # Scale with the page (drop the fixed size, keep the viewBox), but never above 1.15x the drawn size:
    # a small figure blown up to the full width would have oversized text.
    m = re.search(r'<svg[^>]*?\s+width="([\d.]+)pt"\s+height="[^"]*"', svg)
    if m:
        max_px = float(m.group(1)) * 4 / 3 * 1.15
        svg = svg[:m.start()] + re.sub(r'\s+width="[^"]*"\s+height="[^"]*"', f' style="max-width:{max_px:.0f}px"',
                                       m.group(0), count=1) + svg[m.end():]
    return svg.strip()


def _categorical_axis(ax, values: pd.Series, axis: str = "x") -> np.ndarray:
    """Positions for a knob's values: numbers as they are, anything else (bools, strings) as ordered categories."""
    vals = list(values)
    if all(_isnum(v) for v in vals if v is not None):
        return np.array([np.nan if v is None else float(v) for v in vals])
    cats = sorted({repr(v) for v in vals if v is not None})
    labels = {repr(v): fmt(v) for v in vals if v is not None}
    pos = np.array([np.nan if v is None else cats.index(repr(v)) for v in vals], dtype=float)
    ticks, names = list(range(len(cats))), [labels[c] for c in cats]
    if axis == "x":
        ax.set_xticks(ticks, names)
        ax.set_xlim(-0.5, len(cats) - 0.5)
    else:
        ax.set_yticks(ticks, names)
    return pos


def _kfmt(v: float, _pos: Any = None) -> str:
    return f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}"


def _grid(n: int, cols: int) -> tuple[int, int]:
    cols = max(1, min(cols, n))
    return math.ceil(n / cols), cols


# --------------------------------------------------------------------------- sections


def _summary(s: Summary, figs: _Figures) -> str:
    out = []
    best = f"trial {s.best_trial}" if s.best_trial is not None else "—"
    tp = s.table.set_index("metric")
    b, t = (tp.loc[REAL_TOKENS_PER_S, ["baseline", "best"]]
            if REAL_TOKENS_PER_S in tp.index else (math.nan, math.nan))
    if s.best_trial is None:
        head = [f"Baseline: <strong>{_esc(fmt(b))}</strong> real tokens/s/GPU; no trial has finished yet"]
    else:
        head = [f"<strong>Best: {_esc(best)}</strong> ({_esc(s.best_how)}): "
                f"<strong>{_esc(fmt(t))}</strong> real tokens/s/GPU vs baseline {_esc(fmt(b))}"]
    if s.speedup is not None:
        sp = s.speedup
        ci = (f" (95% interval {sp.ci_low:.3f}–{sp.ci_high:.3f})"
              if _isnum(sp.ci_low) and not math.isnan(sp.ci_low) else " (no interval: not re-measured)")
        sig = {True: ", significant", False: ", <em>not</em> significant", None: ""}[
            sp.significant if sp.significant in (True, False) else None]
        rounds = f" over {sp.rounds} interleaved A/B rounds" if sp.rounds else ""
        head.append(f"; speedup <strong class=\"speedup\">{sp.median:.3f}×</strong>{_esc(ci)}{sig}{_esc(rounds)}"
                    f' <span class="src">[{_esc(sp.source)}]</span>')
    out.append('<p class="headline">' + "".join(head) + ".</p>")
    out.extend(f'<p class="note">{_esc(n)}</p>' for n in s.notes)

    labels = {REAL_TOKENS_PER_S: "real tokens/s/GPU",
              "mfu_pct": "MFU (%)", "memory/max_reserved_gib": "peak reserved (GiB)",
              "memory/max_allocated_gib": "peak allocated (GiB)", "memory/max_rss_gib": "peak host RSS (GiB)",
              "data/padding_ratio": "padding ratio", "time/step_s": "step time (s)"}
    table = s.table.copy()
    table.insert(1, "what", [labels.get(m, m) for m in table["metric"]])
    out.append('<div class="cols"><div>')
    out.append("<h3>Best vs baseline</h3>")
    out.append(_table(table[["what", "baseline", "best", "ratio"]], headers={"what": "", "ratio": "best / baseline"},
                      formats={"ratio": lambda v: "—" if math.isnan(v) else f"{v:.3f}×"}, cls="compact",
                      row_titles=list(table["metric"])))
    sources = dict(zip(table["metric"], table["source"]))
    notes = [f"Throughput — {sources.get('throughput/real_tokens_per_s_per_gpu', '?')}."]
    notes.append("Other rows: median over the runs' summaries (baseline repeats and the best config's runs); "
                 "step time: mean over the measured steps of phases.csv.")
    out.append('<p class="note">' + " ".join(_esc(n) for n in notes) + "</p>")
    out.append("</div><div>")
    out.append("<h3>Knobs that changed</h3>")
    k = s.knobs
    if k.empty:
        out.append(_missing("No knob values recorded."))
    else:
        changed = k[k["changed"].map(lambda c: c is not False)]
        same = k[k["changed"].map(lambda c: c is False)]
        if changed.empty:
            out.append(_missing("The best config uses the baseline's value of every knob."))
        else:
            out.append(_table(changed[["knob", "baseline", "best"]], cls="compact left",
                              formats={"baseline": lambda v: fmt(v) if v is not None else "? (not in baseline config)"}))
        if len(same):
            out.append(f'<p class="note">Unchanged ({len(same)}): '
                       + ", ".join(f"<code>{_esc(n)}</code>" for n in same["knob"]) + ".</p>")
    out.append("</div></div>")

    if len(s.ab_runs):
        ab = s.ab_runs

        def draw():
            cands = list(dict.fromkeys(ab["candidate"]))
            fig = _figure(HALF_W, 0.55 * len(cands) + 1.2)
            ax = fig.add_subplot()
            rng = np.random.default_rng(0)
            for i, c in enumerate(cands):
                for arm, dy, color in (("baseline", -0.15, ARM_COLORS["baseline"]),
                                       ("candidate", 0.15, ARM_COLORS["best"])):
                    v = ab[(ab["candidate"] == c) & (ab["arm"] == arm)]["tokens_per_s"].to_numpy()
                    ax.scatter(v, i + dy + rng.uniform(-0.05, 0.05, len(v)), s=16, color=color,
                               label=arm if i == 0 else None, zorder=3)
                    if len(v):
                        ax.plot([np.median(v)] * 2, [i + dy - 0.12, i + dy + 0.12], color=color, lw=2)
            ax.set_yticks(range(len(cands)), [f"trial {c}" for c in cands])
            ax.invert_yaxis()
            ax.xaxis.set_major_formatter(_kfmt)
            ax.set_xlabel("real tokens/s/GPU (each dot one run; bar = median)")
            ax.set_title("A/B re-measurement: candidates interleaved with the baseline")
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
            fig.subplots_adjust(right=0.82)  # room for the legend inside the figure's width
            return fig

        out.append('<div class="cols"><div>')
        out.append(figs.svg(draw))
        out.append("</div><div>")
        out.append("<h3>Candidates re-measured</h3>")
        out.append(_table(s.candidates, cls="compact",
                          formats={"speedup_median": lambda v: f"{v:.3f}×", "ci_low": lambda v: f"{v:.3f}",
                                   "ci_high": lambda v: f"{v:.3f}"},
                          headers={"speedup_median": "speedup (median)", "ci_low": "95% low",
                                   "ci_high": "95% high"}))
        out.append("</div></div>")

    out.append("<h3>Exported config.yaml</h3>")
    if s.config_text:
        out.append(f'<pre class="config">{_esc(s.config_text)}</pre>')
    else:
        out.append(_missing("No config exported yet (no config.yaml in the study directory)."))
    return "\n".join(out)


def _search(s: Search, figs: _Figures) -> str:
    out = []
    h = s.history
    if len(h):
        def draw():
            fig = _figure(FULL_W, 3.4)
            ax = fig.add_subplot()
            if s.baseline_band:
                med, lo, hi = s.baseline_band
                ax.axhspan(lo, hi, color=ARM_COLORS["baseline"], alpha=0.18, lw=0,
                           label="baseline noise (min–max of repeats)")
                ax.axhline(med, color=ARM_COLORS["baseline"], lw=1, ls="--")
            ok = h[h["status"] == "ok"]
            pruned = h[h["status"] == "pruned"]
            failed = h[~h["status"].isin(["ok", "pruned"])]
            ax.scatter(ok["trial"], ok["value"], s=20, color=STATUS_OK, label="finished", zorder=3)
            ax.scatter(pruned["trial"], pruned["value"], s=20, facecolors="none", edgecolors=STATUS_PRUNED,
                       label="pruned (last window)", zorder=3)
            ax.scatter(failed["trial"], failed["value"], s=26, marker="x", color=STATUS_FAILED,
                       label="failed (objective 0)", zorder=3)
            ax.step(h["trial"], h["best_so_far"], where="post", color="#f28e2b", lw=1.8, label="best so far")
            ax.yaxis.set_major_formatter(_kfmt)
            ax.set_xlabel("trial")
            ax.set_ylabel("real tokens/s/GPU" if "tokens" in s.objective_name else s.objective_name)
            ax.set_title(f"Optimization history ({s.direction})")
            ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8.5)
            return fig

        out.append(figs.svg(draw))
    short = _short_names(s.knob_names)
    out.append('<div class="cols"><div>')
    if s.importances is not None and len(s.importances):
        imp = s.importances

        def draw():
            fig = _figure(HALF_W * 0.9, 0.32 * len(imp) + 1.0)
            ax = fig.add_subplot()
            ax.barh([short.get(k, k) for k in imp["knob"]], imp["importance"], color=STATUS_OK)
            ax.invert_yaxis()
            ax.set_xlabel(f"importance ({imp.attrs.get('method', 'Optuna')}, sums to 1)")
            ax.set_title("Parameter importances for throughput")
            ax.grid(axis="y", visible=False)
            return fig

        out.append(figs.svg(draw, "Computed over the trials that ran to the end; failures are in the "
                                  "trials table."))
    else:
        out.append("<h3>Parameter importances</h3>")
        out.append(_missing(s.importances_message or "No importances."))
    out.append("</div><div>")
    if s.pareto is not None:
        p = s.pareto
        n0, n1 = p.columns[1], p.columns[2]

        def draw():
            fig = _figure(HALF_W, 3.6)
            ax = fig.add_subplot()
            off, on = p[~p["on_front"]], p[p["on_front"]].sort_values(n0)
            ax.scatter(off[n0], off[n1], s=18, color=STATUS_PRUNED, label="dominated")
            ax.plot(on[n0], on[n1], "o-", color="#f28e2b", ms=5, label="Pareto front")
            for _, r in on.iterrows():
                ax.annotate(f"{int(r['trial'])}", (r[n0], r[n1]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7.5)
            ax.set_xlabel(n0)
            ax.set_ylabel(n1)
            ax.xaxis.set_major_formatter(_kfmt)
            ax.set_title("Pareto front (labels: trial)")
            ax.legend(fontsize=8)
            return fig

        out.append(figs.svg(draw))
    elif s.pareto_message:
        out.append("<h3>Pareto front</h3>")
        out.append(_missing(s.pareto_message))
    out.append("</div></div>")

    kn = s.knobs
    if len(kn) and s.knob_names:
        names = s.knob_names

        def draw():
            rows, cols = _grid(len(names), 5)
            fig = _figure(FULL_W, 2.1 * rows + 0.4)
            best = kn["value"].max()
            axes = fig.subplots(rows, cols, squeeze=False, sharey=True,
                                gridspec_kw={"hspace": 0.45, "wspace": 0.08, "top": 1 - 0.45 / (2.1 * rows + 0.4)})
            for i, ax in enumerate(axes.flat):
                if i >= len(names):
                    ax.set_visible(False)
                    continue
                x = _categorical_axis(ax, kn[names[i]])
                if names[i] in s.log_knobs:
                    ax.set_xscale("log")
                ax.scatter(x, kn["value"], s=14, c=kn["trial"], cmap="viridis", zorder=3)
                top = kn["value"] == best
                ax.scatter(x[top.to_numpy()], kn["value"][top], s=60, facecolors="none",
                           edgecolors="#e15759", lw=1.4, zorder=4)
                ax.set_title(short.get(names[i], names[i]), fontsize=9, fontweight="normal")
                ax.yaxis.set_major_formatter(_kfmt)
                if i % cols == 0:
                    ax.set_ylabel("tokens/s/GPU")
            fig.suptitle("Knobs vs throughput (slice view; colour = trial number, red ring = best)",
                         fontsize=10.5, fontweight="bold")
            return fig

        out.append(figs.svg(draw))
    elif not s.message:
        out.append(_missing("No finished trial yet: no knob view."))
    return "\n".join(out)


def _time(s: TimeSection, figs: _Figures) -> str:
    out = []
    bd = s.breakdown
    out.append('<div class="cols"><div>')

    def draw_stack():
        fig = _figure(HALF_W, 0.6 * len(bd) + 1.6)
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

    out.append(figs.svg(draw_stack))
    out.append("</div><div>")
    st = s.step_times
    if len(st):
        def draw_dist():
            arms = list(dict.fromkeys(st["run"]))
            fig = _figure(HALF_W, 0.6 * len(arms) + 1.6)
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

        out.append(figs.svg(draw_dist))
    else:
        out.append(_missing("No per-step times (no phases.csv)."))
    out.append("</div></div>")
    if len(st) and st["seq_len"].notna().any():
        def draw_len():
            fig = _figure(FULL_W, 2.6)
            arms = list(dict.fromkeys(st["run"]))
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

        out.append(figs.svg(draw_len))

    tl = s.timeline
    if len(tl):
        def draw_tl():
            arms = list(dict.fromkeys(tl["run"]))
            fig = _figure(FULL_W, 0.55 * len(arms) + 1.4)
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

        out.append(figs.svg(draw_tl))

    if len(bd):
        t = bd.copy()
        tab = pd.DataFrame({"run": t.index})
        for p in PHASES:
            tab[p] = [f"{1000 * v:,.1f} ({100 * v / tot:.0f}%)" if tot else "—"
                      for v, tot in zip(t[p], t["step_s"])]
        tab["step"] = [_ms(v) for v in t["step_s"]]
        tab["steps"] = list(t["steps"])
        tab["source"] = list(t["source"])
        out.append("<h3>Milliseconds per step (share of the step)</h3>")
        out.append(_table(tab, cls="compact nowrap", col_classes={"source": "wrap"}))
    if len(s.step_stats):
        ss = s.step_stats.reset_index()
        out.append(_table(ss, cls="compact", formats={c: _ms for c in ("median_s", "p10_s", "p90_s")}
                          | {"cv_pct": lambda v: f"{v:.1f}%", "noise_cv_pct": lambda v: f"{v:.2f}%"},
                          headers={"median_s": "median", "p10_s": "p10", "p90_s": "p90", "cv_pct": "CV (all steps)",
                                   "noise_cv_pct": "CV at one bucket length"}))
        out.append('<p class="note">Step times vary with the bucket length of each step; the CV at one bucket '
                   "length (median over lengths with at least 3 steps) is the run-to-run noise.</p>")
    out.append("<h3>Gradient communication</h3>")
    if s.comm is not None and len(s.comm):
        out.append(_table(s.comm.reset_index() if s.comm.index.name else s.comm, cls="compact"))
        out.append('<p class="note">Exposed communication is the grad_sync phase; overlap achieved = '
                   "communication hidden under backward / total communication.</p>")
    else:
        out.append(_missing(s.comm_message or "No gradient communication: a single-process study."))
    return "\n".join(out)


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
                    x = _categorical_axis(ax, bt[knobs[i]])
                    if knobs[i] in s.log_knobs:
                        ax.set_xscale("log")
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


def _kernels(s: Kernels, figs: _Figures) -> str:
    out = []
    if s.message:
        out.append(_missing(s.message))
    if len(s.launch):
        out.append(_table(s.launch, cls="compact",
                          headers={"measured_ms": "measured (ms)", "best_in_sweep_ms": "fastest in sweep (ms)"}))
        if s.sweep_source:
            out.append(f'<p class="note">Times from <code>{_esc(s.sweep_source)}</code> '
                       f"({len(s.sweep)} rows).</p>")
    sweep = sweep_by_config(s)
    if sweep is not None:
        kernels = list(dict.fromkeys(sweep["kernel"]))

        def draw():
            fig = _figure(min(3.0 * len(kernels), 12.0), 2.8)
            for i, kernel in enumerate(kernels):
                ax = fig.add_subplot(1, len(kernels), i + 1)
                ks = sweep[sweep["kernel"] == kernel].sort_values("ms").reset_index(drop=True)
                colors = ["#f28e2b" if c else "#4e79a7" for c in ks["chosen"]]
                ax.scatter(range(len(ks)), ks["ms"], s=16, color=colors, zorder=3)
                ax.set_title(kernel, fontsize=9)
                ax.set_xlabel("configuration (fastest first)", fontsize=8)
                if i == 0:
                    ax.set_ylabel("median time (ms)")
                ax.set_ylim(bottom=0)
            fig.suptitle("Launch-parameter sweep per kernel (orange: the chosen configuration)", fontsize=9)
            return fig

        out.append(figs.svg(draw))
        top = (sweep.sort_values(["kernel", "ms"]).groupby("kernel", sort=False).head(3)
               .loc[:, ["kernel", "launch", "ms", "chosen"]])
        out.append(_table(top, cls="compact", headers={"ms": "median (ms)", "launch": "launch configuration (3 "
                                                       "fastest per kernel)"}))
    return "\n".join(out)


def _data(s: DataSection, figs: _Figures) -> str:
    out = ['<div class="cols3">']
    bt = s.by_trial
    pad = bt.dropna(subset=["bucket_width", "padding_ratio"])
    if len(pad):
        def draw():
            fig = _figure(4.2, 3.0)
            ax = fig.add_subplot()
            ax.scatter(pad["bucket_width"], pad["padding_ratio"] * 100, s=14, color="#4e79a7", alpha=0.7,
                       zorder=3, label="trial")
            ax.plot(s.padding["bucket_width"], s.padding["padding_ratio_median"] * 100, "o-", color="#f28e2b",
                    label="median")
            if len(s.padding) and s.padding["bucket_width"].min() > 0 and \
                    s.padding["bucket_width"].max() / s.padding["bucket_width"].min() >= 4:
                ax.set_xscale("log", base=2)
                ax.set_xticks(list(s.padding["bucket_width"]), [str(v) for v in s.padding["bucket_width"]])
                ax.minorticks_off()
            ax.set_xlabel("bucket width (tokens)")
            ax.set_ylabel("padding (% of tokens)")
            ax.set_title("Padding vs bucket width")
            ax.legend(fontsize=8)
            return fig

        out.append(figs.svg(draw))
    else:
        out.append(_missing("No padding ratio per bucket width yet."))
    io_df = s.io
    q = ["read_latency_ms_p50", "read_latency_ms_p90", "read_latency_ms_p99"]
    if len(io_df) and io_df[q].notna().any().any():
        def draw():
            fig = _figure(4.2, 3.0)
            ax = fig.add_subplot()
            x = np.arange(len(q))
            w = 0.8 / len(io_df)
            for i, (arm, row) in enumerate(io_df.iterrows()):
                ax.bar(x + (i - (len(io_df) - 1) / 2) * w, [row[c] for c in q], width=w,
                       color=ARM_COLORS.get(arm, STATUS_OK), label=f"{arm} ({row['io_backend'] or '?'})")
            ax.set_xticks(x, ["p50", "p90", "p99"])
            ax.set_ylabel("shard read latency (ms)")
            ax.set_title("Read latency quantiles")
            ax.legend(fontsize=8)
            return fig

        out.append(figs.svg(draw))
    else:
        out.append(_missing("No read latency recorded (io/read_latency_ms_*)."))
    dec = bt.dropna(subset=["decode_tokens_per_s", "value"])
    if len(dec):
        def draw():
            fig = _figure(4.2, 3.0)
            ax = fig.add_subplot()
            ax.scatter(dec["value"], dec["decode_tokens_per_s"], s=14, color="#4e79a7", zorder=3)
            hi = max(dec["value"].max(), dec["decode_tokens_per_s"].max()) * 1.05
            ax.plot([0, hi], [0, hi], color="#999999", lw=1, ls="--", label="loader = training")
            ax.set_xlim(0, hi)
            ax.set_ylim(0, hi)
            ax.xaxis.set_major_formatter(_kfmt)
            ax.yaxis.set_major_formatter(_kfmt)
            ax.set_xlabel("training: real tokens/s/GPU")
            ax.set_ylabel("loader: decode tokens/s")
            ax.set_title("Loader throughput vs training")
            ax.legend(fontsize=8, loc="lower right")
            return fig

        out.append(figs.svg(draw, "Above the diagonal the loader has headroom; on it, the step waits for data."))
    else:
        out.append(_missing("No loader throughput recorded (decode/tokens_per_s)."))
    out.append("</div>")
    if len(io_df):
        out.append(_table(io_df.reset_index(), cls="compact",
                          formats={"padding_ratio": _pct},
                          headers={"io_backend": "io backend", "read_latency_ms_p50": "read p50 (ms)",
                                   "read_latency_ms_p90": "read p90 (ms)", "read_latency_ms_p99": "read p99 (ms)",
                                   "decode_tokens_per_s": "decode tokens/s",
                                   "real_tokens_per_s_per_gpu": "real tokens/s/GPU", "padding_ratio": "padding"}))
    if len(s.padding):
        out.append(_table(s.padding, cls="compact",
                          formats={c: _pct for c in ("padding_ratio_median", "padding_ratio_min",
                                                     "padding_ratio_max")},
                          headers={"bucket_width": "bucket width", "padding_ratio_median": "padding (median)",
                                   "padding_ratio_min": "min", "padding_ratio_max": "max",
                                   "tokens_per_s_median": "tokens/s/GPU (median)"}))
    return "\n".join(out)


def _trials(s: Trials, figs: _Figures) -> str:
    out = []
    counts = ", ".join(f"{_esc(k)}: {int(v)}" for k, v in s.status_counts.items())
    out.append(f"<p>{len(s.table)} trials — {counts}. Click a column header to sort.</p>")
    short = _short_names(s.knob_names)
    headers = {k: short[k] for k in s.knob_names} | {
        "max_reserved_gib": "reserved GiB", "duration_s": "duration (s)", "failure_kind": "failure",
        "failure_reason": "reason", "mfu_pct": "MFU %", "value": "tokens/s/GPU"}
    titles = {k: f"{knob_key(k)}: {knob_doc(k)}" if knob_doc(k) else knob_key(k) for k in s.knob_names}
    formats = {"duration_s": lambda v: fmt(v, 3) if not (isinstance(v, float) and math.isnan(v)) else "—"}
    out.append('<div class="scroll">')
    out.append(_table(s.table, sortable=True, headers=headers, titles=titles, formats=formats,
                      table_id="trials-table", cls="trials", col_classes={"failure_reason": "reason"},
                      row_class=lambda r: "" if r["status"] in ("ok", "running") else
                      ("pruned" if r["status"] in NOT_FAILED else "failed")))
    out.append("</div>")
    if len(s.log_tails):
        out.append("<h3>Log tails of failed trials</h3>")
        for _, r in s.log_tails.iterrows():
            out.append(f"<details><summary>trial {int(r['trial'])}: {_esc(r['status'])}</summary>"
                       f"<pre>{_esc(r['log_tail'])}</pre></details>")
    return "\n".join(out)


def _environment(s: Environment, figs: _Figures) -> str:
    out = []
    if s.noise is not None:
        n = s.noise
        out.append(f'<p class="headline">Noise floor: the baseline measured {len(n.runs) or "several"} times gave '
                   f"{fmt(n.median)} real tokens/s/GPU (min {fmt(n.min)}, max {fmt(n.max)}; spread "
                   f"{_pct(n.rel_spread)}, CV {_pct(n.cv)}). A difference smaller than this is not a win.</p>")
    else:
        out.append(_missing("No noise floor recorded (the baseline repeats have not run)."))
    out.append('<div class="cols"><div>')
    out.append("<h3>Study</h3>" + _table(s.study, cls="kv left"))
    out.append("<h3>Knobs dropped for this hardware</h3>")
    out.append(_table(s.dropped, cls="compact") if len(s.dropped) else
               _missing("None: every knob of the space can act on this hardware."))
    out.append("</div><div>")
    out.append("<h3>Fingerprint and versions</h3>")
    out.append(_table(s.fingerprint, cls="kv left") if len(s.fingerprint) else
               _missing("No environment fingerprint recorded (no environment.json)."))
    out.append("<h3>Hardware</h3>")
    out.append(_table(s.hardware, cls="kv left") if len(s.hardware) else _missing("No hardware recorded."))
    out.append("</div></div>")
    return "\n".join(out)


def _compile(s: CompileSection, figs: _Figures) -> str:
    out = []
    cold, warm = s.cold_median_s, s.warm_median_s
    parts = []
    if cold == cold:
        parts.append(f"cold (something compiled from scratch): median {cold:.1f} s")
    if warm == warm:
        parts.append(f"warm (every graph from the study's shared cache): median {warm:.1f} s")
    out.append("<p>Compile seconds per trial, outside the measured windows. The trials of a study share one "
               "Inductor/AOTAutograd cache and one Triton cache (<code>compile-cache/</code> in the study "
               "directory)" + (": " + "; ".join(parts) if parts else "") + ".</p>")
    out.append(_table(s.table, cls="compact", headers={"compile_s": "compile (s)", "fx_hits": "FX graph hits",
                                                        "fx_misses": "FX graph misses", "aot_hits": "AOT hits",
                                                        "aot_misses": "AOT misses"},
                      formats={c: (lambda v: fmt(v, 0) if v == v else "—") for c in
                               ("fx_hits", "fx_misses", "aot_hits", "aot_misses")}))
    return "\n".join(out)


def _numerics(s: NumericsSection, figs: _Figures) -> str:
    out = []
    if len(s.baseline_losses) > 1:
        lo, hi = min(s.baseline_losses), max(s.baseline_losses)
        out.append(f"<p>Run-to-run spread of the base config's last-window loss over {len(s.baseline_losses)} "
                   f"baseline repeats (same seed and data): {(hi - lo) / lo:.3%}.</p>")
    if len(s.checks):
        out.append("<p>A trial that sets a numerics knob (FP8) off its base value keeps its result only if its mean "
                   "loss over the last measured window is within the tolerance of the reference's on the same "
                   "data: the baseline repeats, or the trial's twin (the same config with the numerics knobs at "
                   "their base values).</p>")
        out.append(_table(s.checks, cls="compact", headers={"reference_loss": "reference loss",
                                                             "rel_diff": "difference", "tolerance": "tolerance"},
                          formats={"rel_diff": lambda v: f"{v:.2%}", "tolerance": lambda v: f"{v:.2%}",
                                   "loss": lambda v: fmt(v, 5), "reference_loss": lambda v: fmt(v, 5)}))
    if s.curves is not None and len(s.curves):
        curves = s.curves

        def draw():
            fig = _figure(7.5, 2.8)
            ax = fig.add_subplot(1, 1, 1)
            for name, g in curves.groupby("variant", sort=False):
                ax.plot(g["step"], g["loss"], lw=1.0, label=str(name))
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("training loss")
            ax.legend(loc="upper right", fontsize=8, frameon=False)
            return fig

        out.append(figs.svg(draw, caption="Convergence check: the same model, seed and data with and without the "
                                          "numerics knob (convergence.csv in the study directory)."))
        if s.curve_tail is not None:
            out.append(_table(s.curve_tail, cls="compact", headers={"mean_loss": "mean loss, last 50 steps",
                                                                      "rel_diff": "vs the first"},
                              formats={"rel_diff": lambda v: f"{v:+.3%}", "mean_loss": lambda v: fmt(v, 5)}))
    return "\n".join(out)


_RENDERERS: dict[str, Callable[[Any, _Figures], str]] = {
    "summary": _summary, "search": _search, "time": _time, "compile": _compile, "numerics": _numerics,
    "memory": _memory, "kernels": _kernels,
    "data": _data, "trials": _trials, "environment": _environment,
}

# --------------------------------------------------------------------------- page

_CSS = """
:root { --fg:#1d1d1f; --muted:#6b6b6b; --line:#dcdcdc; --accent:#4e79a7; --bad:#c0392b; }
* { box-sizing: border-box; }
body { margin:0; color:var(--fg); background:#fff;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif; }
header, nav { padding-left:max(28px, calc((100% - 1320px) / 2 + 28px)); padding-right:28px; }
header { padding-top:18px; padding-bottom:8px; border-bottom:1px solid var(--line); }
header h1 { margin:0 0 4px; font-size:22px; }
header p { margin:2px 0; color:var(--muted); }
nav { position:sticky; top:0; z-index:5; background:#f7f7f8; border-bottom:1px solid var(--line);
  padding-top:6px; padding-bottom:6px; font-size:13px; }
nav a { color:var(--accent); text-decoration:none; margin-right:16px; white-space:nowrap; }
main { max-width:1320px; margin:0 auto; padding:0 28px 40px; }
section { border-bottom:1px solid var(--line); padding:6px 0 18px; }
h2 { font-size:19px; margin:18px 0 8px; }
h3 { font-size:14.5px; margin:14px 0 6px; }
p.missing { color:var(--muted); font-style:italic; margin:6px 0; }
p.missing.error { color:var(--bad); font-style:normal; }
p.note { color:var(--muted); margin:4px 0; }
p.headline { font-size:15px; margin:8px 0; }
.speedup { color:var(--accent); }
.src { color:var(--muted); font-size:12px; }
.cols { display:grid; grid-template-columns:repeat(2, minmax(0, 1fr)); gap:12px 28px; align-items:start; }
.cols3 { display:grid; grid-template-columns:repeat(3, minmax(0, 1fr)); gap:12px 20px; align-items:start; }
@media (max-width: 900px) { .cols, .cols3 { grid-template-columns:1fr; } }
figure { margin:8px 0; }
figure svg { display:block; width:100%; height:auto; }
figcaption { color:var(--muted); font-size:12.5px; margin-top:2px; }
table { border-collapse:collapse; font-size:13px; margin:6px 0; }
th, td { border-bottom:1px solid var(--line); padding:3px 9px; text-align:left; vertical-align:top; }
th { background:#f3f4f6; font-weight:600; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
table.left td.num { text-align:left; }
table.nowrap td { white-space:nowrap; }
table.nowrap td.wrap { white-space:normal; }
table.kv td:first-child { color:var(--muted); white-space:nowrap; }
table.kv td { word-break:break-word; }
table.sortable th { cursor:pointer; user-select:none; position:sticky; top:0; white-space:nowrap; }
table.sortable th[aria-sort=ascending]::after { content:" \\25B2"; font-size:10px; }
table.sortable th[aria-sort=descending]::after { content:" \\25BC"; font-size:10px; }
tr.failed td { background:#fdecea; }
tr.pruned td { color:var(--muted); }
div.scroll { max-height:640px; overflow:auto; border:1px solid var(--line); }
div.scroll table { margin:0; }
table.trials td { white-space:nowrap; }
table.trials td.reason { white-space:normal; min-width:280px; max-width:420px; overflow-wrap:break-word; }
pre { background:#f7f7f8; border:1px solid var(--line); padding:8px 10px; font-size:12.5px;
  overflow:auto; white-space:pre; }
pre.config { max-height:520px; }
code { font-size:12.5px; background:#f3f4f6; padding:0 3px; }
details { margin:4px 0; }
summary { cursor:pointer; }
"""

# Sort a table by clicking its header: numbers by value (data-v), text alphabetically, blanks last.
_JS = """
(function () {
  function key(cell) {
    var v = cell.getAttribute('data-v');
    if (v !== null) { return v === '' ? null : parseFloat(v); }
    var t = cell.textContent.trim();
    return t === '' || t === '\\u2014' ? null : t.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[col]), y = key(b.cells[col]);
          if (x === null || y === null) { return x === y ? 0 : (x === null ? 1 : -1); }
          var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
    table.setAttribute('data-sort-ready', '1');
  });
})();
"""


def render_html(report: ReportData) -> str:
    """The whole report as one self-contained HTML document."""
    data = report.study
    figs = _Figures()
    name = data.study_name or data.study_dir.name
    parts = []
    for i, (key, heading, _) in enumerate(SECTIONS, start=1):
        section = getattr(report, key)
        body: str
        if isinstance(section, SectionFailed):
            body = f'<p class="missing error section-error">This section could not be built: {_esc(section.error)}</p>'
        else:
            try:
                body = ""
                if section.message and key not in ("memory", "kernels"):  # those two place their own
                    body = _missing(section.message)
                    if section_is_empty(key, section):
                        parts.append(_section(key, i, heading, body))
                        continue
                body += _RENDERERS[key](section, figs)
            except Exception as e:  # noqa: BLE001 - a drawing bug must not lose the other sections
                import logging
                import traceback

                logging.getLogger(__name__).warning("rendering section %s failed:\n%s", key, traceback.format_exc())
                body = (f'<p class="missing error section-error">This section could not be drawn: '
                        f"{_esc(type(e).__name__)}: {_esc(e)}</p>")
        parts.append(_section(key, i, heading, body))

    trials = report.trials
    counts = ""
    if isinstance(trials, Trials) and len(trials.status_counts):
        counts = " — " + ", ".join(f"{_esc(k)} {int(v)}" for k, v in trials.status_counts.items())
    n_trials = len(data.trials)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    model = data.spec.get("model")
    model = model.get("name") if isinstance(model, dict) else model
    sub = [f"{n_trials} trials{counts}"]
    if model:
        sub.insert(0, f"model {_esc(model)}")
    if data.spec.get("gpus"):
        sub.insert(1 if model else 0, f"{_esc(data.spec['gpus'])} GPU(s)")
    nav = "".join(f'<a href="#{key}">{i}. {_esc(h)}</a>' for i, (key, h, _) in enumerate(SECTIONS, start=1))
    problems = ""
    if data.problems:
        problems = "<p>Unreadable files: " + "; ".join(_esc(p) for p in data.problems) + "</p>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Study report: {_esc(name)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>Study report: {_esc(name)}</h1>"
        f"<p>{' · '.join(sub)}</p>"
        f"<p>Generated {now} from <code>{_esc(data.study_dir)}</code></p>{problems}</header>\n"
        f"<nav>{nav}</nav>\n<main>\n" + "\n".join(parts) + "\n</main>\n"
        f"<script>{_JS}</script>\n</body>\n</html>\n"
    )


def section_is_empty(key: str, section: Any) -> bool:
    """Whether a section with a message has nothing else worth drawing."""
    if key == "summary":  # its message may only say that no trial finished yet
        return section.table[["baseline", "best"]].isna().all().all() and not section.config_text
    return True  # the other sections set a message only when they have nothing else


def _section(key: str, i: int, heading: str, body: str) -> str:
    return f'<section id="{key}">\n<h2>{i}. {_esc(heading)}</h2>\n{body}\n</section>'
