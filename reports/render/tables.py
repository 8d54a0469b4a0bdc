"""Cells and tables: how a value is written (``fmt``), and DataFrames as HTML tables that sort in the browser."""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

__all__ = ["fmt"]


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def isnum(v: Any) -> bool:
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


def fmt_pct(v: float) -> str:
    return "—" if not isnum(v) or math.isnan(v) else f"{100 * v:.1f}%"


def fmt_ms(v: float) -> str:
    return "—" if not isnum(v) or math.isnan(v) else f"{1000 * v:,.1f} ms"


def missing_note(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def html_table(df: pd.DataFrame, *, formats: dict[str, Callable[[Any], str]] | None = None,
               headers: dict[str, str] | None = None, titles: dict[str, str] | None = None,
               sortable: bool = False, index: bool = False, cls: str = "", row_class: Callable | None = None,
               table_id: str | None = None, row_titles: list[str] | None = None,
               col_classes: dict[str, str] | None = None, links: dict[str, list[str | None]] | None = None,
               clip: tuple[str, ...] = (), box: bool = True) -> str:
    """An HTML table; numeric cells carry their raw value in ``data-v`` for sorting.

    ``links`` maps a column to one href per row (None: no link): that cell's text becomes a link. The cells of the
    ``clip`` columns are one line, cut with an ellipsis, with the full text as their title. With ``box`` the table
    sits in a box that scrolls sideways when the table is wider than its column (the page never does); a table
    already inside a scrolling box of its own passes False."""
    formats, headers, titles, col_classes = formats or {}, headers or {}, titles or {}, col_classes or {}
    links = links or {}
    if index:
        df = df.reset_index()
    classes = " ".join(c for c in ("sortable" if sortable else "", cls) if c)
    out = ['<div class="tbox">'] if box else []
    out += [f'<table{f" id={chr(34)}{esc(table_id)}{chr(34)}" if table_id else ""}'
           f'{f" class={chr(34)}{classes}{chr(34)}" if classes else ""}><thead><tr>']
    for c in df.columns:
        title = titles.get(c, c if headers.get(c, c) != c else "")
        out.append(f'<th{f" title={chr(34)}{esc(title)}{chr(34)}" if title else ""}>'
                   f"{esc(headers.get(c, c))}</th>")
    out.append("</tr></thead><tbody>")
    for i, (_, row) in enumerate(df.iterrows()):
        rc = row_class(row) if row_class else ""
        title = f' title="{esc(row_titles[i])}"' if row_titles else ""
        out.append(f'<tr class="{esc(rc)}"{title}>' if rc else f"<tr{title}>")
        for c in df.columns:
            v = row[c]
            text = formats[c](v) if c in formats else fmt(v)
            extra = f" {col_classes[c]}" if c in col_classes else ""
            href = links[c][i] if c in links else None
            linked = isinstance(href, str) and href
            body = f'<a href="{esc(quote(href))}">{esc(text)}</a>' if linked else esc(text)
            if c in clip and text:
                body = f'<div class="clip" title="{esc(text)}">{body}</div>'
            if isnum(v):
                raw = "" if math.isnan(float(v)) else repr(float(v))
                out.append(f'<td class="num{extra}" data-v="{raw}">{body}</td>')
            else:
                out.append(f'<td class="{extra.strip()}">{body}</td>' if extra else f"<td>{body}</td>")
        out.append("</tr>")
    out.append("</tbody></table>" + ("</div>" if box else ""))
    return "".join(out)


def short_names(names: list[str]) -> dict[str, str]:
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
