"""Phase timing of the training step: NVTX ranges plus device-side timestamps.

A step is cut into contiguous phases::

    data_wait | h2d | forward | backward | grad_sync | optimizer | other

Each phase is an NVTX range in one domain (``workbench``), so Nsight Systems
shows the same names, and its boundaries are timestamped without adding a
host-device synchronisation inside the step:

* on CUDA, one ``torch.cuda.Event`` is recorded at every boundary on the
  current stream; the events of a window are read back once, at the window's
  end (``flush``), which is the only sync the timer adds. Event times are on
  the GPU's timeline, so a phase measures how long the *GPU* spent in it; host
  work that overlaps queued GPU work costs nothing, as it should.
* on the CPU, ``time.perf_counter_ns`` at every boundary.

While a torch.profiler trace records (``workbench.train.profiling``), ``record = True`` makes each phase a
``torch.profiler.record_function`` range of the same name as well; otherwise no such range is opened.

Phases are contiguous and the end of one step is the start of the next, so the
phases of a step add up to the step time, and the steps of a window add up to
the window's wall time. Only the *end* of a phase is stamped (one event per
phase, plus one at the step's end): the few microseconds of loop bookkeeping
between two phases are charged to the phase that follows, and everything after
the last phase (scheduler, logging) to ``other``. A phase entered several times
in a step (gradient accumulation) is summed.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

try:  # NVTX is optional: without it the ranges are no-ops and timing still works
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - exercised only where nvtx is missing
    _nvtx = None

from workbench.vocab import PHASES

__all__ = ["PHASES", "PhaseTimer", "interval_union"]

_INDEX = {p: i for i, p in enumerate(PHASES)}
_OTHER = _INDEX["other"]


class PhaseTimer:
    """Times the phases of each step; ``flush()`` returns the steps since the last flush.

    ``enabled=False`` turns the timer into no-ops (for the overhead benchmark):
    ``flush`` then returns one row per step with only the step time, measured
    on the host clock after one synchronisation at the window's end.
    """

    def __init__(self, device: torch.device | str = "cpu", *, enabled: bool = True, nvtx: bool = True) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.enabled = enabled
        self._domain = _nvtx.get_domain("workbench") if (nvtx and enabled and _nvtx is not None) else None
        self._attrs = {p: self._domain.get_event_attributes(message=p) for p in PHASES} if self._domain else {}
        # marks of the current window: (phase index that ENDS at this mark, timestamp or event)
        self._marks: list[tuple[int, object]] = []
        self._step_ends: list[int] = []  # index into _marks of each step's last mark
        self._pool: list[torch.cuda.Event] = []
        self._pool_i = 0
        self._window_start_wall = time.perf_counter()
        self._steps_in_window = 0
        self._origin: object | None = None
        self.record = False
        """Open each phase as a ``torch.profiler.record_function`` range too (while a profiler records)."""

    # -- timestamps
    def _stamp(self) -> object:
        if not self.cuda:
            return time.perf_counter_ns()
        if self._pool_i == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        ev = self._pool[self._pool_i]
        self._pool_i += 1
        ev.record()
        return ev

    def _mark(self, phase_index: int) -> None:
        self._marks.append((phase_index, self._stamp()))

    # -- the API the loop uses
    def start(self) -> None:
        """Stamp the beginning of the first step of a window (call once before the loop)."""
        self._window_start_wall = time.perf_counter()
        if self.enabled:
            self._origin = self._stamp()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with timer.phase("forward"): ...``: the phase runs from the previous stamp to exit."""
        rf = torch.profiler.record_function(name) if self.record else None
        if rf is not None:
            rf.__enter__()
        try:
            if not self.enabled:
                yield
                return
            i = _INDEX[name]
            if self._domain is not None:
                self._domain.push_range(self._attrs[name])
            try:
                yield
            finally:
                if self._domain is not None:
                    self._domain.pop_range()
                self._mark(i)
        finally:
            if rf is not None:
                rf.__exit__(None, None, None)

    def mark(self, name: str) -> None:
        """End phase ``name`` here (it ran from the previous stamp), for phases that are not one block of code."""
        if self.enabled:
            self._mark(_INDEX[name])

    def step_end(self) -> None:
        """Close the step: time since the last phase is ``other``; the next step starts here."""
        self._steps_in_window += 1
        if not self.enabled:
            return
        self._mark(_OTHER)
        self._step_ends.append(len(self._marks) - 1)

    def flush(self) -> list[dict[str, float]]:
        """Per-step phase seconds (plus ``step``) for the steps since the last flush.

        Note: this is the timer's one CPU-GPU sync point, at a window's end.
        """
        if not self.enabled:
            if self.cuda:
                torch.cuda.synchronize()  # note: CPU-GPU sync at the window end only
            now = time.perf_counter()
            n = max(self._steps_in_window, 1)
            dt = (now - self._window_start_wall) / n
            rows = [{"step": dt} for _ in range(self._steps_in_window)]
            self._window_start_wall, self._steps_in_window = now, 0
            return rows
        if not self._step_ends:
            return []
        last = self._step_ends[-1]
        if self.cuda:
            self._marks[last][1].synchronize()  # note: CPU-GPU sync, once per window
        rows: list[dict[str, float]] = []
        prev = self._origin
        m = 0
        for end in self._step_ends:
            secs = [0.0] * len(PHASES)
            for j in range(m, end + 1):
                phase, stamp = self._marks[j]
                secs[phase] += self._elapsed(prev, stamp)
                prev = stamp
            m = end + 1
            row = dict(zip(PHASES, secs))
            row["step"] = sum(secs)
            rows.append(row)
        # the last stamp of this window is the origin of the next one
        self._origin = self._marks[last][1]
        if self.cuda:
            # keep the origin event alive: swap it to the front of the pool, reuse the rest
            k = self._pool_i - 1
            self._pool[0], self._pool[k] = self._pool[k], self._pool[0]
            self._pool_i = 1
        self._marks.clear()
        self._step_ends.clear()
        self._steps_in_window = 0
        self._window_start_wall = time.perf_counter()
        return rows

    def _elapsed(self, a: object, b: object) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1e3  # type: ignore[union-attr]
        return (b - a) / 1e9  # type: ignore[operator]


def interval_union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (overlapping ones count once), in their unit."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
