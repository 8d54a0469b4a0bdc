"""``build_report``: study directory and storage in, ``STUDY_DIR/report.html`` out."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from reports._load import load_study_data
from reports.render import render_html
from reports.sections import ReportData, compute_report

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
    study_dir.mkdir(parents=True, exist_ok=True)
    out = study_dir / "report.html"
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=study_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; the report is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
