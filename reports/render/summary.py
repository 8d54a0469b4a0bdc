"""Draws the Summary section."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from reports.render.figures import ARM_COLORS, HALF_W, new_figure, Figures, kfmt
from reports.render.tables import esc, isnum, missing_note, html_table, fmt
from reports.sections.summary import Summary
from workbench.vocab import MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB, PADDING_RATIO, REAL_TOKENS_PER_S, STEP_S

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_METRIC_LABELS = {REAL_TOKENS_PER_S: "real tokens/s/GPU",
                  "mfu_pct": "MFU (%)", MAX_RESERVED_GIB: "peak reserved (GiB)",
                  MAX_ALLOCATED_GIB: "peak allocated (GiB)", MAX_RSS_GIB: "peak host RSS (GiB)",
                  PADDING_RATIO: "padding ratio", STEP_S: "step time (s)"}


def render_summary(s: Summary, figs: Figures) -> str:
    out = [_headline(s)]
    out.extend(f'<p class="note">{esc(n)}</p>' for n in s.notes)
    if s.reference is not None:
        out.append(f'<h3>Against plain loops</h3><p class="reference">{esc(s.reference[0].upper() + s.reference[1:])}.'
                   " The study's other ratios are against its base config.</p>")
    out.append('<div class="cols"><div>')
    out.append(_best_vs_baseline(s.table))
    out.append("</div><div>")
    out.append(_knobs_changed(s.knobs))
    out.append("</div></div>")
    if len(s.ab_runs):
        out.append('<div class="cols"><div>')
        out.append(figs.svg(functools.partial(_draw_ab_runs, s.ab_runs)))
        out.append("</div><div>")
        out.append(_candidates(s.candidates))
        out.append("</div></div>")
    out.append("<h3>Exported config.yaml</h3>")
    if s.config_text:  # collapsed: a full config is hundreds of lines, the summary stays one screen
        lines = len(s.config_text.splitlines())
        out.append(f'<details class="config"><summary>Show the exported config.yaml ({lines:,} lines)</summary>'
                   f'<pre class="config">{esc(s.config_text)}</pre></details>')
    else:
        out.append(missing_note("No config exported yet (no config.yaml in the study directory)."))
    return "\n".join(out)


def _headline(s: Summary) -> str:
    """One paragraph: the result, else the best against the baseline, and the speedup with its interval."""
    best = f"trial {s.best_trial}" if s.best_trial is not None else "—"
    tp = s.table.set_index("metric")
    b, t = (tp.loc[REAL_TOKENS_PER_S, ["baseline", "best"]]
            if REAL_TOKENS_PER_S in tp.index else (math.nan, math.nan))
    if s.headline is not None:
        head = [f"<strong>Result:</strong> <span class=\"result\">{esc(s.headline)}</span>"]
    elif s.best_trial is None:
        head = [f"Baseline: <strong>{esc(fmt(b))}</strong> real tokens/s/GPU; no trial has finished yet"]
    else:
        head = [f"<strong>Best: {esc(best)}</strong> ({esc(s.best_how)}): "
                f"<strong>{esc(fmt(t))}</strong> real tokens/s/GPU vs baseline {esc(fmt(b))}"]
    if s.speedup is not None and s.headline is None:
        sp = s.speedup
        ci = (f" (95% interval {sp.ci_low:.3f}–{sp.ci_high:.3f})"
              if isnum(sp.ci_low) and not math.isnan(sp.ci_low) else " (no interval: not re-measured)")
        sig = {True: ", significant", False: ", <em>not</em> significant", None: ""}[
            sp.significant if sp.significant in (True, False) else None]
        rounds = f" over {sp.rounds} interleaved A/B rounds" if sp.rounds else ""
        head.append(f"; speedup <strong class=\"speedup\">{sp.median:.3f}×</strong>{esc(ci)}{sig}{esc(rounds)}"
                    f' <span class="src">[{esc(sp.source)}]</span>')
    return '<p class="headline">' + "".join(head) + ".</p>"


def _best_vs_baseline(summary_table: pd.DataFrame) -> str:
    """The metrics of the best config against the baseline's, and where each comes from."""
    table = summary_table.copy()
    table.insert(1, "what", [_METRIC_LABELS.get(m, m) for m in table["metric"]])
    out = ["<h3>Best vs baseline</h3>"]
    out.append(html_table(table[["what", "baseline", "best", "ratio"]],
                          headers={"what": "", "ratio": "best / baseline"},
                          formats={"ratio": lambda v: "—" if math.isnan(v) else f"{v:.3f}×"}, cls="compact",
                          row_titles=list(table["metric"])))
    sources = dict(zip(table["metric"], table["source"]))
    notes = [f"Throughput — {sources.get(REAL_TOKENS_PER_S, '?')}."]
    notes.append("Other rows: median over the runs' summaries (baseline repeats and the best config's runs); "
                 "step time: mean over the measured steps of phases.csv.")
    out.append('<p class="note">' + " ".join(esc(n) for n in notes) + "</p>")
    return "\n".join(out)


def _knobs_changed(k: pd.DataFrame) -> str:
    """The knobs whose best value differs from the baseline's, then the names of the others."""
    out = ["<h3>Knobs that changed</h3>"]
    if k.empty:
        out.append(missing_note("No knob values recorded."))
        return "\n".join(out)
    changed = k[k["changed"].map(lambda c: c is not False)]
    same = k[k["changed"].map(lambda c: c is False)]
    if changed.empty:
        out.append(missing_note("The best config uses the baseline's value of every knob."))
    else:
        out.append(html_table(changed[["knob", "baseline", "best"]], cls="compact left",
                              formats={"baseline": lambda v: fmt(v) if v is not None
                                       else "? (not in baseline config)"}))
    if len(same):
        out.append(f'<p class="note">Unchanged ({len(same)}): '
                   + ", ".join(f"<code>{esc(n)}</code>" for n in same["knob"]) + ".</p>")
    return "\n".join(out)


def _candidates(candidates: pd.DataFrame) -> str:
    """The candidates' A/B speedups over the baseline with their intervals."""
    return "<h3>Candidates re-measured</h3>\n" + html_table(
        candidates, cls="compact",
        formats={"speedup_median": lambda v: f"{v:.3f}×", "ci_low": lambda v: f"{v:.3f}",
                 "ci_high": lambda v: f"{v:.3f}"},
        headers={"speedup_median": "speedup (median)", "rounds": "A/B pairs",
                 "ci_low": "interval low", "ci_high": "interval high"})


def _draw_ab_runs(ab: pd.DataFrame) -> Figure:
    """Each candidate's A/B runs beside the baseline's interleaved with them: one dot per run, a bar at the median."""
    cands = list(dict.fromkeys(ab["candidate"]))
    fig = new_figure(HALF_W, 0.55 * len(cands) + 1.2)
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
    ax.xaxis.set_major_formatter(kfmt)
    ax.set_xlabel("real tokens/s/GPU (each dot one run; bar = median)")
    ax.set_title("A/B re-measurement: candidates interleaved with the baseline")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.subplots_adjust(right=0.82)  # room for the legend inside the figure's width
    return fig
