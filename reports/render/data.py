"""Draws the Data section."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from reports.render.figures import ARM_COLORS, STATUS_OK, new_figure, Figures, kfmt
from reports.render.tables import missing_note, fmt_pct, html_table
from reports.sections.data import DataSection

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def render_data(s: DataSection, figs: Figures) -> str:
    out = ['<div class="cols3">']
    bt = s.by_trial
    pad = bt.dropna(subset=["bucket_width", "padding_ratio"])
    if s.padding_message:
        out.append(missing_note(s.padding_message))
    elif len(pad):
        out.append(figs.svg(functools.partial(_draw_padding, pad, s.padding)))
    else:
        out.append(missing_note("No padding ratio per bucket width yet."))
    io_df = s.io
    q = ["read_latency_ms_p50", "read_latency_ms_p90", "read_latency_ms_p99"]
    if len(io_df) and io_df[q].notna().any().any():
        out.append(figs.svg(functools.partial(_draw_read_latency, io_df, q)))
    else:
        out.append(missing_note("No read latency recorded (io/read_latency_ms_*)."))
    dec = bt.dropna(subset=["loader_headroom"])
    if len(dec):
        out.append(figs.svg(functools.partial(_draw_loader_headroom, dec),
                            "Headroom: the loader's decode rate (decoded tokens per busy decode-second, "
                            "per core) over the step's real tokens/s/GPU, per finished trial. Below 1×, "
                            "one decode core is slower than the step: the step waits for data unless "
                            "several workers decode."))
    else:
        out.append(missing_note("No loader throughput recorded (decode/tokens_per_s)."))
    out.append("</div>")
    if len(io_df):
        out.append(_io_table(io_df))
    if len(s.padding):
        out.append(_padding_table(s.padding))
    return "\n".join(out)


def _draw_padding(pad: pd.DataFrame, padding: pd.DataFrame) -> Figure:
    """Each finished trial's padding against its bucket width, and the median per width."""
    fig = new_figure(4.2, 3.0)
    ax = fig.add_subplot()
    ax.scatter(pad["bucket_width"], pad["padding_ratio"] * 100, s=14, color="#4e79a7", alpha=0.7,
               zorder=3, label="trial")
    ax.plot(padding["bucket_width"], padding["padding_ratio_median"] * 100, "o-", color="#f28e2b",
            label="median")
    widths = [int(v) for v in padding["bucket_width"]]
    if widths and min(widths) > 0 and max(widths) / min(widths) >= 4:
        ax.set_xscale("log", base=2)
    if widths:  # whole numbers: a tick at each width used, no fractional ticks between them
        ax.set_xticks(widths, [str(v) for v in widths])
        ax.minorticks_off()
    ax.set_xlabel("bucket width (tokens)")
    ax.set_ylabel("padding (% of tokens)")
    ax.set_title("Padding vs bucket width")
    ax.legend(fontsize=8)
    return fig


def _draw_read_latency(io_df: pd.DataFrame, q: list[str]) -> Figure:
    """The shard read latency quantiles (columns ``q``), one group of bars per quantile, one bar per arm."""
    fig = new_figure(4.2, 3.0)
    ax = fig.add_subplot()
    x = np.arange(len(q))
    w = 0.8 / len(io_df)
    for i, (arm, row) in enumerate(io_df.iterrows()):
        ax.bar(x + (i - (len(io_df) - 1) / 2) * w, [row[c] for c in q], width=w,
               color=ARM_COLORS.get(arm, STATUS_OK), label=f"{arm} ({row['io_backend'] or '?'})")
    ax.set_xticks(x, ["p50", "p90", "p99"])
    ax.set_ylabel("shard read latency (ms)")
    ax.set_title("Read latency quantiles")
    # Below the axes: the quantiles are often close together, so every bar can reach the top corners.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(len(io_df), 2))
    return fig


def _draw_loader_headroom(dec: pd.DataFrame) -> Figure:
    """Each finished trial's loader headroom against its training throughput, on a log scale."""
    from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

    fig = new_figure(4.2, 3.0)
    ax = fig.add_subplot()
    ax.scatter(dec["value"], dec["loader_headroom"], s=14, color="#4e79a7", zorder=3)
    lo, hi = float(dec["loader_headroom"].min()), float(dec["loader_headroom"].max())
    ax.set_yscale("log")
    if lo <= 10:  # near the line where the step waits for data: show it
        ax.axhline(1.0, color="#e15759", lw=1, ls="--", gid="ref", label="loader = training")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
        lo = min(lo, 1.0)
    ax.set_ylim(lo / 1.6, hi * 1.6)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(lambda v, _pos: _times(v))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # a third of the page: long labels such as 3.25k
    ax.xaxis.set_major_formatter(kfmt)
    ax.set_xlabel("training: real tokens/s/GPU")
    ax.set_ylabel("loader headroom (decode ÷ training)")
    ax.set_title("Loader throughput vs training")
    return fig


def _io_table(io_df: pd.DataFrame) -> str:
    """Per arm: the io backend, read latency, decode rate, throughput, loader headroom and padding."""
    return html_table(io_df.reset_index(), cls="compact",
                      formats={"padding_ratio": fmt_pct,
                               "loader_headroom": _times},
                      headers={"io_backend": "io backend", "read_latency_ms_p50": "read p50 (ms)",
                               "read_latency_ms_p90": "read p90 (ms)", "read_latency_ms_p99": "read p99 (ms)",
                               "decode_tokens_per_s": "decode tokens/s",
                               "real_tokens_per_s_per_gpu": "real tokens/s/GPU",
                               "loader_headroom": "loader headroom", "padding_ratio": "padding"})


def _padding_table(padding: pd.DataFrame) -> str:
    """Padding per bucket width over the finished trials: median, min, max, and the median throughput."""
    return html_table(padding, cls="compact",
                      formats={c: fmt_pct for c in ("padding_ratio_median", "padding_ratio_min",
                                                    "padding_ratio_max")},
                      headers={"bucket_width": "bucket width", "padding_ratio_median": "padding (median)",
                               "padding_ratio_min": "min", "padding_ratio_max": "max",
                               "tokens_per_s_median": "tokens/s/GPU (median)"})


def _times(v: float) -> str:
    """A ratio: 3,509×, 12.5×, 0.8×."""
    if v != v:
        return "—"
    return f"{v:,.0f}×" if v >= 100 else f"{v:.3g}×"
