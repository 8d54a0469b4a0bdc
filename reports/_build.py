"""``build_report``: study directory and storage in, ``STUDY_DIR/report.html`` out."""

from __future__ import annotations

from pathlib import Path

from reports._load import load_study_data
from reports.render import render_html
from reports.sections import ReportData, compute_report
from workbench.files import write_text

__all__ = ["build_report", "compute_sections"]


def compute_sections(study_dir: str | Path, storage_url: str | None = None,
                     study_name: str | None = None) -> ReportData:
    """Every section's data (DataFrames and NamedTuples) for a study, without drawing anything.

    ``storage_url`` defaults to ``sqlite:///STUDY_DIR/study.db`` (or tune.json's
    storage_url when that file does not exist); ``study_name`` to tune.json's.
    """
    return compute_report(load_study_data(study_dir, storage_url, study_name))


def build_report(study_dir: str | Path, storage_url: str | None = None, study_name: str | None = None) -> Path:
    """Write ``study_dir/report.html`` (one self-contained file) and return its path.

    Never fails because a result file is missing or unreadable: a section without
    data says so in one line. The file is replaced atomically, so a report being
    viewed while the tuner rebuilds it is never half-written.
    """
    study_dir = Path(study_dir)
    report = compute_sections(study_dir, storage_url, study_name)
    text = render_html(report)
    return write_text(study_dir / "report.html", text)
