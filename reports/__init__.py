"""Study reports: results into DataFrames first (``reports.sections``), then figures and one
self-contained HTML file (``reports.render``). docs/report.md says how it is built and what each
section shows.

    from reports import build_report
    build_report(Path("runs/llama-1b"), "sqlite:///runs/llama-1b/study.db", "llama-1b")

or ``python -m reports runs/llama-1b``.
"""

from __future__ import annotations

from reports._build import build_report, compute_sections
from reports._load import StudyData, load_study_data
from reports.render import render_html
from reports.sections import SECTIONS, ReportData, compute_report

__all__ = [
    "SECTIONS",
    "ReportData",
    "StudyData",
    "build_report",
    "compute_report",
    "compute_sections",
    "load_study_data",
    "render_html",
]
