"""The report's sections as data: one function per section, StudyData in, NamedTuple of DataFrames out.

Nothing here draws (``reports.render`` does). Each module of this package computes one section or two close ones;
``SECTIONS`` lists them in report order and ``compute_report`` computes them all. Every section has a ``message``:
None when it has something to show, else the one line the report prints instead; parts of a section that can be
missing on their own carry their own ``*_message``. docs/report.md says what each section shows and where its
numbers come from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from reports._load import StudyData
from reports.sections._common import best_trial_number
from reports.sections.data import DataSection, data_section
from reports.sections.environment import Environment, NoiseFloor, environment_section
from reports.sections.gpu import GpuTime, gpu_section
from reports.sections.guide import Guide, guide_section
from reports.sections.kernels import Kernels, kernels_section, sweep_by_config
from reports.sections.memory import Memory, memory_section
from reports.sections.numerics import CompileSection, NumericsSection, compile_section, numerics_section
from reports.sections.phases import TimeSection, time_section
from reports.sections.search import NOT_FAILED, Search, Trials, search_section, trials_section
from reports.sections.summary import Speedup, Summary, summary_section

__all__ = [
    "SECTIONS",
    "DataSection",
    "Environment",
    "GpuTime",
    "Guide",
    "Kernels",
    "Memory",
    "NOT_FAILED",
    "NoiseFloor",
    "ReportData",
    "Search",
    "SectionFailed",
    "Speedup",
    "Summary",
    "TimeSection",
    "Trials",
    "best_trial_number",
    "compute_report",
    "data_section",
    "environment_section",
    "gpu_section",
    "guide_section",
    "kernels_section",
    "memory_section",
    "search_section",
    "summary_section",
    "sweep_by_config",
    "time_section",
    "trials_section",
]


class SectionFailed(NamedTuple):
    """A section whose computation raised: the report shows the error in one line instead."""

    error: str


SECTIONS: tuple[tuple[str, str, Callable[[StudyData], Any]], ...] = (
    ("summary", "Summary", summary_section),
    ("guide", "How to read this report", guide_section),
    ("search", "Search", search_section),
    ("time", "Where the time goes", time_section),
    ("gpu", "GPU time", gpu_section),
    ("compile", "Compile time", compile_section),
    ("numerics", "Numerics", numerics_section),
    ("memory", "Memory", memory_section),
    ("kernels", "Kernels", kernels_section),
    ("data", "Data", data_section),
    ("trials", "Trials", trials_section),
    ("environment", "Environment", environment_section),
)
"""(html id, heading, compute function) in report order."""


class ReportData(NamedTuple):
    study: StudyData
    summary: Summary | SectionFailed
    guide: Guide | SectionFailed
    search: Search | SectionFailed
    time: TimeSection | SectionFailed
    gpu: GpuTime | SectionFailed
    compile: CompileSection | SectionFailed
    numerics: NumericsSection | SectionFailed
    memory: Memory | SectionFailed
    kernels: Kernels | SectionFailed
    data: DataSection | SectionFailed
    trials: Trials | SectionFailed
    environment: Environment | SectionFailed


def compute_report(data: StudyData) -> ReportData:
    """Every section's data; a section that raises becomes a ``SectionFailed`` (the report still builds)."""
    out = {}
    for key, _, fn in SECTIONS:
        try:
            out[key] = fn(data)
        except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
            import logging
            import traceback

            logging.getLogger(__name__).warning("report section %s failed:\n%s", key, traceback.format_exc())
            out[key] = SectionFailed(f"{type(e).__name__}: {e}")
    return ReportData(study=data, **out)
