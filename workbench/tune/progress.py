"""The tuner's progress bar (tqdm): trials done of the budget, the best so far, the current phase."""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["Progress"]


class Progress:
    """tqdm bar: trials done/total, best so far and its speedup, the current phase."""

    def __init__(self, total: int | None, desc: str, enabled: bool) -> None:
        # disable=None: no bar when stderr is not a terminal (logs get one line per trial instead)
        self.bar = tqdm(total=total, desc=desc, unit="trial", dynamic_ncols=True, disable=None if enabled else True,
                        file=sys.stderr, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                        "[{elapsed}<{remaining}]{postfix}")
        self.best = ""
        self.phase = ""

    def set(self, *, done: int | None = None, best: str | None = None, phase: str | None = None) -> None:
        if done is not None and done != self.bar.n:
            self.bar.n = done
        if best is not None:
            self.best = best
        if phase is not None:
            self.phase = phase
        self.bar.set_postfix_str(" | ".join(p for p in (self.best, self.phase) if p), refresh=True)

    def write(self, text: str) -> None:
        tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
