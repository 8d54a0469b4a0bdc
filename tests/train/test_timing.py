"""PhaseTimer on the CPU: phases are contiguous, add up to the step time, and the
steps of a window add up to its wall time."""

from __future__ import annotations

import time

import pytest

from workbench.train.timing import PHASES, PhaseTimer


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_phases_add_up_to_step_and_window_wall_time():
    t = PhaseTimer("cpu")
    t0 = time.perf_counter()
    t.start()
    for _ in range(4):
        with t.phase("data_wait"):
            _busy(0.002)
        with t.phase("forward"):
            _busy(0.006)
        with t.phase("backward"):
            _busy(0.010)
        with t.phase("optimizer"):
            _busy(0.003)
        _busy(0.002)  # bookkeeping after the last phase: "other"
        t.step_end()
    rows = t.flush()
    wall = time.perf_counter() - t0
    assert len(rows) == 4
    for r in rows:
        assert set(r) == set(PHASES) | {"step"}
        assert r["step"] == pytest.approx(sum(r[p] for p in PHASES), rel=1e-12)
        # each phase holds at least its busy time
        assert r["forward"] >= 0.006 and r["backward"] >= 0.010 and r["other"] >= 0.002
        assert r["h2d"] == 0.0 and r["grad_sync"] == 0.0
    # and not much more, in the fastest of the 4 steps (the host clock on shared cores: a preemption inside one
    # step's phase is the machine's time, not the timer's)
    for phase, busy in (("forward", 0.006), ("backward", 0.010), ("other", 0.002)):
        assert min(r[phase] for r in rows) < busy + 0.02, phase
    # contiguous: the window's steps cover (almost) all of its wall time
    assert sum(r["step"] for r in rows) == pytest.approx(wall, rel=0.05)


def test_accumulation_sums_repeated_phases_and_next_window_starts_where_last_ended():
    t = PhaseTimer("cpu")
    t.start()
    for _ in range(3):  # three micro-batches in one step
        with t.phase("forward"):
            _busy(0.003)
        with t.phase("backward"):
            _busy(0.003)
    t.step_end()
    first = t.flush()
    assert len(first) == 1 and first[0]["forward"] >= 0.009 and first[0]["backward"] >= 0.009
    _busy(0.004)  # time between windows belongs to the next step, not lost
    with t.phase("forward"):
        _busy(0.001)
    t.step_end()
    second = t.flush()
    assert second[0]["forward"] >= 0.005


def test_disabled_timer_reports_step_time_only():
    t = PhaseTimer("cpu", enabled=False)
    t.start()
    for _ in range(3):
        with t.phase("forward"):
            _busy(0.003)
        t.step_end()
    rows = t.flush()
    assert len(rows) == 3 and all(set(r) == {"step"} for r in rows)
    assert all(r["step"] >= 0.003 for r in rows)
