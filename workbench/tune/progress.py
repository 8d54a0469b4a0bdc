"""The tuner's progress bar (tqdm): the runs of the study done of those planned (the search's trials, then
validation's A/B runs), the best so far, the GPU-minutes spent, the current phase; and the
``Console`` the tuner's lines go through (above the bar while there is one)."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["Console", "Progress"]


class Progress:
    """tqdm bar over the study's runs: ``trials`` search trials (None: no trial budget, so no total), then at most
    ``after`` runs after the search (validation); each counts one."""

    def __init__(self, trials: int | None, desc: str, enabled: bool, after: int = 0) -> None:
        total = None if trials is None else trials + after
        # disable=None: no bar when stderr is not a terminal (logs get one line per trial instead)
        self.bar = tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True, disable=None if enabled else True,
                        file=sys.stderr, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                        "[{elapsed}<{remaining}]{postfix}")
        self.after = after
        self.searched = 0
        self.measured_after = 0
        self.best = ""
        self.phase = ""
        self.gpu = ""

    @property
    def n(self) -> int:
        return self.bar.n

    @property
    def total(self) -> int | None:
        return self.bar.total

    def set(self, *, done: int | None = None, best: str | None = None, phase: str | None = None,
            gpu_min: float | None = None) -> None:
        if done is not None:
            self.searched = done
        self.bar.n = self.searched + self.measured_after
        if best is not None:
            self.best = best
        if phase is not None:
            self.phase = phase
        if gpu_min is not None:
            self.gpu = f"{gpu_min:.1f} GPU-min"
        self.bar.set_postfix_str(" | ".join(p for p in (self.best, self.gpu, self.phase) if p), refresh=True)

    def run_after_search(self) -> None:
        """One validation or trace run finished."""
        self.measured_after = min(self.measured_after + 1, self.after)
        self.set()

    def finish(self) -> None:
        """The study is done: the runs it did are all there were (validation may stop early, the search at a
        time or GPU-minute budget), so the bar ends full."""
        if self.bar.total is not None:
            self.bar.total = self.bar.n
        self.set(phase="done")

    def write(self, text: str) -> None:
        tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


class Console:
    """Where the tuner's lines and progress go: through the bar while a run has one (``progress``, set by
    ``Tuner.run``), else one line each on stderr."""

    def __init__(self) -> None:
        self.progress: Progress | None = None

    def log(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def show(self, **fields: Any) -> None:
        """Update the bar (``Progress.set``'s fields); nothing without one."""
        if self.progress is not None:
            self.progress.set(**fields)

    def run_after_search(self) -> None:
        if self.progress is not None:
            self.progress.run_after_search()
