"""Draw the report: the sections' DataFrames become inline SVG figures, HTML tables and one HTML file.

Nothing is computed here that a test would want to check (``reports.sections`` does that); this package only
formats and draws. This module lays out the page; ``tables`` writes cells and tables, ``figures`` holds the
matplotlib setup, and one module per group of sections draws them. The page fetches nothing: no external script,
style sheet, font or image. docs/report.md says more.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from reports.render.assets import CSS, JS
from reports.render.data import render_data
from reports.render.environment import render_environment
from reports.render.figures import Figures
from reports.render.gpu import render_gpu
from reports.render.guide import render_guide
from reports.render.kernels import render_kernels
from reports.render.memory import render_memory
from reports.render.numerics import render_compile, render_numerics
from reports.render.phases import render_time
from reports.render.search import render_search, render_trials
from reports.render.summary import render_summary
from reports.render.tables import esc, missing_note
from reports.sections import SECTIONS, ReportData, SectionFailed, Trials

__all__ = ["render_html"]


_RENDERERS: dict[str, Callable[[Any, Figures], str]] = {
    "summary": render_summary, "guide": render_guide, "search": render_search, "time": render_time,
    "gpu": render_gpu, "compile": render_compile, "numerics": render_numerics, "memory": render_memory,
    "kernels": render_kernels,
    "data": render_data, "trials": render_trials, "environment": render_environment,
}


def render_html(report: ReportData) -> str:
    """The whole report as one self-contained HTML document."""
    data = report.study
    figs = Figures()
    name = data.study_name or data.study_dir.name
    parts = []
    for i, (key, heading, _) in enumerate(SECTIONS, start=1):
        section = getattr(report, key)
        body: str
        if isinstance(section, SectionFailed):
            body = f'<p class="missing error section-error">This section could not be built: {esc(section.error)}</p>'
        else:
            try:
                body = ""
                if section.message and key not in ("memory", "kernels", "guide"):  # those place their own
                    body = missing_note(section.message)
                    if section_is_empty(key, section):
                        parts.append(_section(key, i, heading, body))
                        continue
                body += _RENDERERS[key](section, figs)
            except Exception as e:  # noqa: BLE001 - a drawing bug must not lose the other sections
                import logging
                import traceback

                logging.getLogger(__name__).warning("rendering section %s failed:\n%s", key, traceback.format_exc())
                body = (f'<p class="missing error section-error">This section could not be drawn: '
                        f"{esc(type(e).__name__)}: {esc(e)}</p>")
        parts.append(_section(key, i, heading, body))

    trials = report.trials
    counts = ""
    if isinstance(trials, Trials) and len(trials.status_counts):
        counts = " — " + ", ".join(f"{esc(k)} {int(v)}" for k, v in trials.status_counts.items())
    n_trials = len(data.trials)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    model = data.spec.get("model")
    model = model.get("name") if isinstance(model, dict) else model
    sub = [f"{n_trials} trials{counts}"]
    if model:
        sub.insert(0, f"model {esc(model)}")
    if data.spec.get("gpus"):
        sub.insert(1 if model else 0, f"{esc(data.spec['gpus'])} GPU(s)")
    nav = "".join(f'<a href="#{key}">{i}. {esc(h)}</a>' for i, (key, h, _) in enumerate(SECTIONS, start=1))
    problems = ""
    if data.problems:
        problems = "<p>Unreadable files: " + "; ".join(esc(p) for p in data.problems) + "</p>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Study report: {esc(name)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>Study report: {esc(name)}</h1>"
        f"<p>{' · '.join(sub)}</p>"
        f"<p>Generated {now} from <code>{esc(data.study_dir)}</code></p>{problems}</header>\n"
        f"<nav>{nav}</nav>\n<main>\n" + "\n".join(parts) + "\n</main>\n"
        f"<script>{JS}</script>\n</body>\n</html>\n"
    )


def section_is_empty(key: str, section: Any) -> bool:
    """Whether a section with a message has nothing else worth drawing."""
    if key == "summary":  # its message may only say that no trial finished yet
        return section.table[["baseline", "best"]].isna().all().all() and not section.config_text
    if key == "time":  # no phase timings, but perhaps the study's profiler traces
        return not len(section.traces)
    return True  # the other sections set a message only when they have nothing else


def _section(key: str, i: int, heading: str, body: str) -> str:
    return f'<section id="{key}">\n<h2>{i}. {esc(heading)}</h2>\n{body}\n</section>'
