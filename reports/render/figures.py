"""Figures: drawn on a ``matplotlib.figure.Figure`` with an explicit Agg canvas and embedded as inline SVG.

pyplot and the process-wide backend are left alone, so the tuner can build a report in-process. Text stays text in
the SVG (no font files, searchable), and ids are prefixed per figure so that many figures share one page.

Each figure's ``<svg>`` carries ``data-figure`` (its number on the page) and ``data-title``, and the parts the
browser test checks carry ids (``_tag_artists``): every axes' background, its data artists and its legend. A
reference line or band (the "loader = training" line, a noise band) is drawn with ``gid="ref"`` so that it does
not count as data.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from reports.render.tables import esc, isnum, fmt

__all__ = ["ARM_COLORS", "FULL_W", "HALF_W", "PHASE_COLORS", "STATUS_FAILED", "STATUS_OK", "STATUS_PRUNED"]

PHASE_COLORS = {
    "data_wait": "#e15759", "h2d": "#f28e2b", "forward": "#4e79a7", "backward": "#76b7b2",
    "grad_sync": "#59a14f", "optimizer": "#edc948", "other": "#bab0ac",
}
ARM_COLORS = {"baseline": "#8c8c8c", "best": "#4e79a7"}
STATUS_OK, STATUS_PRUNED, STATUS_FAILED = "#4e79a7", "#b0b0b0", "#e15759"
FULL_W, HALF_W = 14.0, 7.0
"""Figure widths in inches: full width of the page, half of it (two side by side). At 96 px per inch they are
drawn for a window of ~1400 px and scale with the page (render/assets.py: up to 1800 px wide)."""
MAX_SCALE = 1.5
"""The most a figure is scaled up in the browser, over its drawn size: a full-width figure fills the widest page,
a small one in a wide column keeps its text a sane size."""

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


def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # No layout engine (constrained layout doubles the drawing time); savefig trims the margins.
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # an explicit Agg canvas: no pyplot, no global backend switch
    return fig


class Figures:
    """Draws under the report's rcParams and returns inline ``<svg>`` markup with ids unique per figure."""

    def __init__(self) -> None:
        self.count = 0

    def svg(self, draw: Callable[[], Any], caption: str = "", cls: str = "") -> str:
        import matplotlib

        with matplotlib.rc_context(_RC):
            fig = draw()
            _tag_artists(fig)
            buf = io.StringIO()
            fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.06,
                        metadata={"Date": None, "Creator": None})
        self.count += 1
        text = _inline_svg(buf.getvalue(), prefix=f"f{self.count}-", number=self.count, title=_title(fig))
        cap = f"<figcaption>{caption}</figcaption>" if caption else ""
        return f'<figure class="{cls}">{text}{cap}</figure>' if cls else f"<figure>{text}{cap}</figure>"


def _title(fig) -> str:
    """The figure's title: its suptitle, else the first axes title."""
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text():
        return sup.get_text()
    return next((ax.get_title() for ax in fig.axes if ax.get_title()), "")


def _tag_artists(fig) -> None:
    """Ids for the browser test: ``ax<i>-bg`` on each axes' background patch, ``ax<i>-data<k>`` on its data
    artists (collections, lines, patches, images), ``ax<i>-legend`` on its legend, ``cb<i>-bg`` on a colour bar's
    axes (whose contents are not data). An artist drawn with ``gid="ref"`` becomes ``ax<i>-ref<k>``; any other gid
    set while drawing is kept."""
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        colorbar = hasattr(ax, "_colorbar")
        ax.patch.set_gid(f"{'cb' if colorbar else 'ax'}{i}-bg")
        if not colorbar:
            n_data = n_ref = 0
            for a in [*ax.collections, *ax.lines, *ax.patches, *ax.images]:
                if a.get_gid() == "ref":
                    a.set_gid(f"ax{i}-ref{n_ref}")
                    n_ref += 1
                elif a.get_gid() is None:
                    a.set_gid(f"ax{i}-data{n_data}")
                    n_data += 1
        legend = ax.get_legend()
        if legend is not None and legend.get_gid() is None:
            legend.set_gid(f"ax{i}-legend")
    for k, legend in enumerate(fig.legends):
        if legend.get_gid() is None:
            legend.set_gid(f"fig-legend{k}")


def _inline_svg(svg: str, prefix: str, number: int | None = None, title: str = "") -> str:
    """matplotlib's SVG document as an element for inline HTML: no XML prolog, no RDF metadata, unique ids."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'((?:xlink:)?href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{prefix}{m.group(2)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", svg)
    # Scale with the page (drop the fixed size, keep the viewBox), but never above 1.5x the drawn size: a
    # full-width figure then fills the widest page (render/assets.py) while a small one keeps its text a sane size.
    m = re.search(r'<svg[^>]*?\s+width="([\d.]+)pt"\s+height="[^"]*"', svg)
    if m:
        max_px = float(m.group(1)) * 4 / 3 * MAX_SCALE
        svg = svg[:m.start()] + re.sub(r'\s+width="[^"]*"\s+height="[^"]*"', f' style="max-width:{max_px:.0f}px"',
                                       m.group(0), count=1) + svg[m.end():]
    if number is not None:
        svg = re.sub(r"<svg\b", f'<svg data-figure="{number}" data-title="{esc(title)}"', svg, count=1)
    return svg.strip()


def _value_key(v: Any) -> tuple:
    """A knob value compared across types: numpy and Python numbers alike, bools apart from numbers."""
    if isinstance(v, (bool, np.bool_)):
        return ("b", bool(v))
    if isnum(v):
        return ("n", float(v))
    return ("s", str(v))


def _missing_value(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v))


def knob_axis(ax, values: pd.Series, kind: str | None = None, choices: list | None = None,
              log: bool = False) -> np.ndarray:
    """x positions for a knob's values, with ticks that suit the knob.

    A categorical knob (or any knob with a value that is not a number: bools, strings) is evenly spaced with its
    choices as tick labels, in the space's order; an integer knob gets whole-number ticks only (powers of two on a
    log axis); a float knob searched on a log scale gets a log axis with plain tick labels.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    vals = list(values)
    present = [v for v in vals if not _missing_value(v)]
    if kind == "categorical" or not all(isnum(v) for v in present):
        cats = list(choices or [])
        keys = [_value_key(c) for c in cats]
        for v in sorted(present, key=_value_key):
            if _value_key(v) not in keys:
                cats.append(v)
                keys.append(_value_key(v))
        pos = np.array([np.nan if _missing_value(v) else keys.index(_value_key(v)) for v in vals], dtype=float)
        ax.set_xticks(range(len(cats)), [fmt(c) for c in cats])
        ax.set_xlim(-0.5, len(cats) - 0.5)
        return pos
    pos = np.array([np.nan if _missing_value(v) else float(v) for v in vals], dtype=float)
    finite = pos[np.isfinite(pos)]
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    if log and len(finite) and finite.min() > 0:
        ax.set_xscale("log")  # resets the locators: the ticks are set after it
        lo, hi = float(finite.min()), float(finite.max())
        if kind == "int":
            ticks = [2 ** e for e in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
            if len(ticks) > 6:
                ticks = ticks[::math.ceil(len(ticks) / 6)]
            if len(ticks) < 2:
                ticks = sorted({int(lo), int(hi)})
            ax.set_xticks(ticks, [str(t) for t in ticks])
        else:
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_locator(NullLocator())
    elif kind == "int":
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        ax.xaxis.set_major_formatter(plain)
    return pos


def kfmt(v: float, _pos: Any = None) -> str:
    """An axis tick in thousands or millions: 12k, 1.5M."""
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    return f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}"


def grid_axes(n: int, cols: int) -> tuple[int, int]:
    cols = max(1, min(cols, n))
    return math.ceil(n / cols), cols
