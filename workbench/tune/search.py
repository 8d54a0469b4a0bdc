"""The search: trials asked of the study's sampler, run and told until the budget (exact across processes by trial
number), the wall-clock limit or the GPU-minute budget is reached (``Search``); a trial runs on past a measured
window only while the GPU-minute budget holds its other windows. A repeat of a measured config gets
the earlier trial's result and, in a finite space, queues an untried config in its place; a trial stopped without
a result of its own is queued again; the RUNNING trials of a dead tuner are failed."""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from workbench.config import Config, ConfigError, config_hash
from workbench.files import remove_tree
from workbench.train.memory_model import predicted_oom
from workbench.tune.ahead import CompileAhead, StartAhead
from workbench.tune.budget import GpuBudget, gpu_seconds_total, twins_unpaid
from workbench.tune.lease import Lease
from workbench.tune.measure import Measurer
from workbench.tune.numerics import stored_losses
from workbench.tune.opening import params_text
from workbench.tune.peaks import measured_refusal, peaks
from workbench.tune.profiled import ProfileLed
from workbench.tune.samplers import CONSTRAINTS, asked_config, infeasible, untried_config
from workbench.tune.session import StudySession
from workbench.tune.stats import noise_floor
from workbench.tune.storage import HEARTBEAT_INTERVAL_S, alive, proc_identity
from workbench.tune.trial import (OnWindow, TrialOutcome, interrupts_held, not_launched_outcome, read_log_tail,
                                  run_trial)
from workbench.tune.validation import is_feasible

__all__ = ["COUNTED_STATES", "MAX_ENUMERATED", "SEARCH_ENDED", "Search", "counts", "flat_attrs"]


COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""Trial states that use up the budget, with a FAIL whose config failed (``samplers.infeasible``); a FAIL stopped
from outside (interrupted, stale, over the budget) does not."""


def counts(t: FrozenTrial) -> bool:
    """Whether a trial uses up the budget: a repeat of a measured config does not while untried configs remain
    (``free_repeat``: the tuner queued an untried one in its place)."""
    if t.user_attrs.get("free_repeat"):
        return False
    return t.state in COUNTED_STATES or infeasible(t)


SEARCH_ENDED = "asked ahead (compile-ahead, start-ahead), and the search ended before it ran; a resumed study runs it"
"""Why a trial asked ahead did not run when the budget or the time ran out."""

MAX_ENUMERATED = 4096
"""Largest finite space whose configs the tuner lists (to queue an untried one in place of a repeat)."""
DRAWS = 512
"""Configs drawn at random, where a finite space is too large to list, to find an untried one in place of a repeat."""


def flat_attrs(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run summary's numbers as flat trial attributes that Optuna's tools can sort and plot: each numeric
    metric under its own name, each phase's seconds per step as ``phase/<name>_s``."""
    out = {k: float(v) for k, v in summary.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    for name, v in (summary.get("phase_s_per_step") or {}).items():
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[f"phase/{name}_s"] = float(v)
    return out


def _outcome_of(t: FrozenTrial) -> TrialOutcome:
    """A finished trial's outcome as it was told (for a later trial of the same config)."""
    a = t.user_attrs
    windows = a.get("windows")  # the summary's flat keys are stored over it: its count of windows, there
    return TrialOutcome(a.get("status", "ok"), Path(a.get("trial_dir", "")),
                        Path(a["config_path"]) if a.get("config_path") else None,
                        list(windows) if isinstance(windows, list) else [],
                        t.values[0] if t.state == TrialState.COMPLETE and t.values else None, a.get("summary"),
                        a.get("failure_reason", ""), a.get("log_tail", ""), wall_s=0.0)


class Search:
    """The search trials of one session: a coordinator's (holding ``lease``) or a worker's. ``measurer`` runs the
    numerics guard's twins; ``gpu_budget`` says when the GPU-minutes are spent."""

    def __init__(self, session: StudySession, measurer: Measurer, lease: Lease, gpu_budget: GpuBudget) -> None:
        self.session = session
        self.measurer = measurer
        self.lease = lease
        self.gpu_budget = gpu_budget
        self.base_values = session.spec.base_knob_values()
        # compile-ahead and start-ahead (ahead.py): the next trial, asked while the current one runs, its twin and
        # its own process, held at its gate
        self.ahead = CompileAhead(session) if CompileAhead.enabled(session) else None
        # asking ahead costs the sampler the running trial's result: the search holds its next trial where it asks
        # ahead anyway (compile-ahead) or where the study says start_ahead: true
        self.started = StartAhead(session) if StartAhead.enabled(session) and (
            self.ahead is not None or session.spec.protocol.start_ahead) else None
        self.depth = self.ahead.depth if self.ahead is not None else 1
        self.pending: list[optuna.Trial] = []  # asked ahead, in the order they run
        self._pending_beats: dict[int, contextlib.ExitStack] = {}  # their storage heartbeats, by trial number
        self._pending_hashes: dict[int, str] = {}  # their configs' hashes, by trial number
        self._configs: dict[tuple[tuple[str, str], ...], Config] = {}  # trial configs by params (_config_of)
        self.t0 = time.monotonic()  # the search's start (search() sets it): each trial line's elapsed time

    # ------------------------------------------------------------------ the loop
    def search(self, t0: float) -> None:
        """Run trials until the budget (exact across processes) or the wall-clock limit (from ``t0``, this
        process's start on the monotonic clock) is reached."""
        s = self.session
        self.t0 = t0
        deadline = t0 + s.timeout_s if s.timeout_s else None  # wall clock of this process
        waiting_note = False
        while True:
            self.lease.check()
            self.recover_stale()
            self.requeue_interrupted()
            counted, running, waiting = self.counts()
            s.show(done=s.finished_count(), best=self.best_text(), gpu_min=gpu_seconds_total(s) / 60)
            # enqueued (WAITING) trials are asked for like new ones; the exact check after ask() decides
            # (a trial asked ahead is within the budget: it was counted when it was asked)
            budget_done = s.budget is not None and counted - waiting >= s.budget and not self.pending
            time_done = deadline is not None and time.monotonic() >= deadline
            gpu_done = self.gpu_budget.done()  # (asked every time: its one line comes when the budget runs out)
            if budget_done or time_done or gpu_done:
                running -= len(self.pending)  # (told now: not trials to wait for)
                self.drop_pending(SEARCH_ENDED)
                if s.worker or running == 0:
                    return
                if not waiting_note:
                    s.log(f"waiting for {running} running trial(s) of other workers")
                    waiting_note = True
                s.show(phase=f"waiting for {running} running trial(s)")
                time.sleep(2.0)
                continue
            asked_ahead = bool(self.pending)
            trial = self.pending.pop(0) if asked_ahead else self.ask()
            self._pending_hashes.pop(trial.number, None)
            try:
                with self.storage_heartbeat(trial._trial_id):
                    self._end_beat(trial.number)  # (the asked-ahead trial's heartbeat, now this one's)
                    if not asked_ahead:
                        trial.set_user_attr("worker", s.me)
                        if self._over_budget(trial):
                            if s.worker:
                                return
                            continue
                    out = self.run_one(trial)
            except BaseException as e:  # wherever it landed, the asked trial does not stay RUNNING
                why = None if isinstance(e, KeyboardInterrupt) else f"the tuner stopped: {type(e).__name__}: {e}"
                self.mark_interrupted(trial, why)
                self.drop_pending(why)
                raise
            s.log(self.trial_line(trial, out, self.t0))

    def ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            return self.session.study.ask()

    # ------------------------------------------------------------------ compile-ahead, start-ahead
    def ask_ahead(self, beside: Config) -> None:
        """As a trial of config ``beside`` starts: ask for the trials after it until ``depth`` are asked ahead (the
        sampler sees them running), and start each one's twin and held process (ahead.py)."""
        if self.ahead is None and self.started is None:
            return
        while len(self.pending) < self.depth and self._ask_one_ahead(beside):
            pass

    def _end_beat(self, number: int) -> None:
        """Stop the storage heartbeat kept for trial ``number`` while it was asked ahead."""
        beat = self._pending_beats.pop(number, None)
        if beat is not None:
            beat.close()

    def _ask_one_ahead(self, beside: Config) -> bool:
        """Ask for one trial more, sample it, and start its twin and its held process; False when nothing more is
        to be asked. A proposal the memory model refuses by itself is told at once (an ``oom`` without a run, as
        the search would tell it) and the next one is asked, so that the twin compiles, and the process holds, a
        config that runs. Nothing is asked when the trial budget has no room left, nor once the sampler repeats a
        measured config of a covered space."""
        s = self.session
        for _ in range(MAX_ENUMERATED):
            counted, _, waiting = self.counts()
            if s.budget is not None and counted - waiting >= s.budget:
                return False
            trial = self.ask()
            beat = self._pending_beats[trial.number] = contextlib.ExitStack()
            beat.enter_context(self.storage_heartbeat(trial._trial_id))
            trial.set_user_attr("worker", s.me)
            if self._over_budget(trial):
                self._end_beat(trial.number)
                return False
            try:
                cfg = s.spec.trial_config(self.sample(trial))
            except ConfigError:
                self.pending.append(trial)  # its own run says so
                return False
            if self.refused(cfg):
                # told now without a run (no device time; it counts to the trial budget, checked before the next
                # ask, as a failed config does), so that the twin is started for a config that will run
                out = self.run_one(trial)
                self._end_beat(trial.number)
                s.log(self.trial_line(trial, out, self.t0))
                continue
            if self.measured_twin(config_hash(cfg), trial.number) is None:
                break
            # a repeat of a measured config: told now (no run, no budget where an untried config is queued in its
            # place), so that the next trial, the queued one, is the one compiled ahead
            self.run_one(trial)
            self._end_beat(trial.number)
            if not trial.user_attrs.get("free_repeat"):
                return False  # nothing untried was left to queue: the loop decides what comes next
        else:
            return False
        h = config_hash(cfg)
        ahead = set(self._pending_hashes.values())
        self.pending.append(trial)
        self._pending_hashes[trial.number] = h
        # the running trial's config, or one asked ahead already: the first's result answers it, with nothing to
        # compile or start (asking on would propose the same again)
        if h == config_hash(beside) or h in ahead:
            return False
        if self.ahead is not None:
            self.ahead.start(trial.number, cfg, beside=beside, unpaid=twins_unpaid(s))
        if self.started is not None:
            self.started.start(trial.number, cfg, h, s.study_dir / "trials" / str(trial.number))
        return True

    def drop_pending(self, why: str | None) -> None:
        """The trial asked ahead will not run: the search ended (``SEARCH_ENDED``), or the tuner was stopped (None:
        Ctrl-C or SIGTERM; else its error). Either way each is told FAIL as interrupted (no budget used; its config
        is queued again when the study resumes), and their twins and held processes are stopped."""
        if self.ahead is not None:
            self.ahead.stop()
        if self.started is not None:
            self.started.stop()
        trials, self.pending = self.pending, []
        self._pending_hashes.clear()
        for trial in trials:
            self.mark_interrupted(trial, why)
            self._end_beat(trial.number)

    def _over_budget(self, trial: optuna.Trial) -> bool:
        """Whether the trials before ``trial`` took the whole budget (another process asked first); such a trial is
        told FAIL (``skipped_budget``) without a run."""
        budget = self.session.budget
        if budget is None:
            return False
        earlier = sum(counts(t) for t in self.session.trials() if t.number < trial.number)
        if earlier < budget:
            return False
        trial.set_user_attr("status", "skipped_budget")
        trial.set_user_attr("failure_reason", f"budget of {budget} trials already taken")
        self.session.study.tell(trial, state=TrialState.FAIL)
        return True

    def counts(self) -> tuple[int, int, int]:
        """(counted, running, waiting) trials of the study."""
        trials = self.session.trials()
        counted = sum(counts(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        return counted, running, waiting

    def best_text(self) -> str:
        ok = [t for t in self.session.trials((TrialState.COMPLETE,)) if is_feasible(t)]
        if not ok:
            return ""
        best = max(ok, key=lambda t: t.values[0])
        base = self.session.baseline_runs()
        sp = f" ({best.values[0] / statistics.median(base):.2f}x)" if base else ""
        return f"search best #{best.number} {best.values[0]:,.0f} tok/s{sp}, one run, not yet validated"

    def trial_line(self, trial: optuna.Trial, out: TrialOutcome, t0: float) -> str:
        base = self.session.baseline_runs()
        params = ", ".join(f"{k}={v}" for k, v in trial.params.items())
        elapsed = time.monotonic() - t0
        tail = f" | {elapsed // 60:.0f}m{elapsed % 60:02.0f}s" + (f" | {b}" if (b := self.best_text()) else "")
        if out.status == "ok" and out.value is not None:
            # the ratio beside the noise floor: a ratio within the baseline's own spread is no sign of a gain
            floor = f"noise floor {noise_floor(base).rel_spread:.0%}" if len(base) > 1 else \
                "one baseline run: no noise floor"
            sp = f", {out.value / statistics.median(base):.2f}x the baseline median (one search run; {floor})" \
                if base else ""
            return f"trial {trial.number}: {out.value:,.0f} tok/s/gpu{sp} [{params}]{tail}"
        return f"trial {trial.number}: {out.status} ({out.failure_reason}) [{params}]{tail}"

    # ------------------------------------------------------------------ one trial
    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Knob values for ``trial``: each active knob in registry order, conditional knobs when active."""
        spec = self.session.spec
        values = dict(self.base_values)
        params: dict[str, Any] = {}
        for name in spec.knob_order():
            if name not in self.session.active:
                continue
            knob = spec.knob(name)
            if not knob.active(values):
                continue
            rng = spec.space[name]
            if rng.choices is not None:
                v = trial.suggest_categorical(name, rng.choices)
            elif knob.kind == "int":
                low, high = rng.bounds()
                v = trial.suggest_int(name, int(low), int(high), step=int(rng.step or 1), log=rng.log)
            else:
                low, high = rng.bounds()
                v = trial.suggest_float(name, float(low), float(high), step=rng.step, log=rng.log)
            params[name] = v
            values[name] = v
        return params

    def run_one(self, trial: optuna.Trial) -> TrialOutcome:
        """Run and tell one search trial."""
        s = self.session
        spec = s.spec
        n = trial.number
        tdir = s.study_dir / "trials" / str(n)
        params = self.sample(trial)
        trial.set_user_attr("trial_dir", str(tdir))
        try:
            try:
                cfg = spec.trial_config(params)
            except ConfigError as e:
                out = not_launched_outcome(tdir, str(e))
            else:
                too_big = self.refused(cfg)
                if too_big:
                    out = not_launched_outcome(tdir, too_big, kind="oom")
                else:
                    out = self._run_config(trial, params, cfg, tdir)
        except KeyboardInterrupt:
            self.mark_interrupted(trial)
            raise
        self.tell(trial, out)
        return out

    def refused(self, cfg: Config) -> str:
        """Why ``cfg`` cannot fit this device by itself ('' where it may run; a twin beside it is
        ``CompileAhead.why_not``'s question): the memory model of the built-in LM, then the study's own runs of
        configs that differ from it only in micro-batch (``workbench.tune.peaks``: any loop, a loop of one's own
        and the VLA included)."""
        s = self.session
        device = s.hardware.get("gpu_memory_gib")
        if s.spec.trainer is None and (why := predicted_oom(cfg, device)):
            return why
        if not device:  # (not a GPU: nothing to refuse)
            return ""
        runs = peaks(s.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                                 TrialState.FAIL)), self._config_of)
        return measured_refusal(cfg, runs, device_gib=device, share_limit=s.spec.objective.memory_share_limit)

    def _config_of(self, params: Mapping[str, Any]) -> Config:
        """A trial's config from its params, built once a set of params."""
        key = tuple(sorted((k, repr(v)) for k, v in params.items()))
        if key not in self._configs:
            self._configs[key] = self.session.spec.trial_config(params)
        return self._configs[key]

    def _run_config(self, trial: optuna.Trial, params: Mapping[str, Any], cfg: Any, tdir: Path) -> TrialOutcome:
        """A config that may run: the result of an earlier trial of the same config, else a run of its own (with
        the numerics guard)."""
        n = trial.number
        h = config_hash(cfg)
        trial.set_user_attr("config_hash", h)
        twin = self.measured_twin(h, n)
        if twin is None:
            waited = 0.0
            if self.ahead is not None:  # its twin's compile (asked during the trial before) is the one it needs
                waited = self.ahead.wait(n, self.session.spec.protocol.trial_timeout_s / 2,
                                         keep=tuple(p.number for p in self.pending), beside=cfg)
            self.ask_ahead(cfg)  # (where compile-ahead or start-ahead is on)
            stop: dict[str, Any] = {}
            beside: list[int] = []
            limit = self.budget_limit_s(waited)
            on_window = self._on_window(trial, waited, stop, beside)
            out = self.run_search_trial(trial, cfg, tdir, on_window, budget_s=limit)
            out.wall_s += waited  # the GPU waited for the twin: device time of this trial
            if beside:
                trial.set_user_attr("windows_beside_twins", beside)
            if stop and out.status == "pruned":  # (a window read after the process ended stops nothing)
                trial.set_user_attr("stopped_for_budget", stop)
                out.failure_reason = stop["reason"]
            elif out.stopped_for_budget and limit is not None:
                trial.set_user_attr("stopped_for_budget", {"after_window": 0, "room_s": round(limit, 3),
                                                           "reason": out.failure_reason})
            if out.status == "ok":
                self.measurer.guard_numerics(trial, params, cfg, out)
            return out
        # the sampler asked for a config already measured: its result, no run
        if self.started is not None:
            self.started.drop(n)
        trial.set_user_attr("duplicate_of", twin.number)
        if "numerics" in twin.user_attrs:
            trial.set_user_attr("numerics", twin.user_attrs["numerics"])
        queued = self.queue_untried(n)
        if queued is not None:  # the repeat costs no budget: an untried config runs in its place
            trial.set_user_attr("free_repeat", True)
        self.session.log(f"trial {n}: the same config as trial {twin.number}; its result is reused, nothing runs"
                         + (f"; queued an untried config instead ({params_text(queued)})" if queued is not None
                            else ""))
        return _outcome_of(twin)

    def _on_window(self, trial: optuna.Trial, waited: float = 0.0, stop: dict[str, Any] | None = None,
                   beside: list[int] | None = None) -> OnWindow:
        """Each measured window's value, reported to the pruner; True: prune the trial. A trial the pruner lets run
        on is stopped too where the GPU-minute budget cannot hold its other windows (``budget_stop``: its record
        goes to ``stop``). ``waited``: the seconds the trial waited for its twin (its device time too).
        ``beside`` gets, per window, the compile-ahead twins alive when the tuner read it (the trial attr
        ``windows_beside_twins``; each stands stopped through the windows, ahead.py)."""
        spec = self.session.spec
        multi, screens, last = spec.objective.multi_objective, spec.pruner.screens, spec.protocol.windows - 1
        started = time.monotonic()  # (a run killed from outside and run again: both attempts' seconds count)
        reports: list[float] = []  # when each window was read

        def on_window(i: int, v: float, window_s: float | None = None) -> bool:
            now = time.monotonic()
            # a window's seconds: the longer of its own (its record's) and the time since the previous window's
            # report; the first window's report follows the launch, compile and warm-up, so its own seconds alone
            pace = max(window_s or 0.0, now - reports[-1]) if reports else window_s
            reports.append(now)
            if beside is not None and self.ahead is not None:
                beside.append(self.ahead.running())
            if multi:
                return False
            # a screening pruner's resource is the count of windows measured; its last rung is the full protocol,
            # where nothing is left to save, so a trial measured to the end is never pruned
            trial.report(v, step=i + 1 if screens else i)
            if screens and i >= last:
                return False
            if trial.should_prune():
                return True
            why = self.budget_stop(i + 1, now - started, waited, pace)
            if why is not None and stop is not None and not stop:
                stop.update(why)
            return why is not None

        return on_window

    def budget_stop(self, measured: int, run_s: float, waited: float,
                    window_s: float | None = None) -> dict[str, Any] | None:
        """Why a trial that measured ``measured`` windows in the ``run_s`` seconds since its launch (after
        ``waited`` seconds for its twin) stops there: the GPU-minute budget cannot hold its other windows; None
        while it can (or there is no such budget, or no window left). Each window left is taken at ``window_s``,
        the seconds of its last window (``_on_window``): the launch, the compile and the warm-up are paid once and
        are not in it. Without it (a window record with no step time), at the trial's seconds per window so far,
        ``run_s / measured``, an upper bound that holds them."""
        s = self.session
        room = self.gpu_budget.room()
        left = s.spec.protocol.windows - measured
        if room is None or left <= 0 or measured <= 0:
            return None
        gpus = s.spec.gpus
        spent = (run_s + waited) * gpus
        per_window = window_s if window_s else run_s / measured
        need = left * per_window * gpus
        if spent + need <= room:
            return None
        return {"after_window": measured, "windows_left": left, "s_per_window": round(per_window, 3),
                "need_s": round(need, 3), "room_s": round(room - spent, 3),
                "reason": f"stopped after window {measured} of {s.spec.protocol.windows} for the GPU-minute budget: "
                          f"its other {left} would take about {need / 60:.2f} GPU-minutes at {per_window:.1f} s a "
                          f"window, and {max(0.0, room - spent) / 60:.2f} are left beside validation and traces"}

    def budget_limit_s(self, waited: float) -> float | None:
        """The seconds a search trial may run before its first measured window: what the GPU-minute budget holds
        beside the validation's reserve (``GpuBudget.room``, over the GPUs a trial holds), less the seconds it
        waited for its twin; None without such a budget. A trial starts only where the room holds a median
        trial; one whose compile runs past the room (gr00t-n1.6-w5h100 on one H100: a ``packing: bucket``
        screen compiled a graph a bucket width, 149.5 s, and the search spent 8.1 of 8 GPU-minutes with 1.2
        still kept for validation) is stopped there, as a trial whose other windows the budget cannot hold is
        (``budget_stop``)."""
        room = self.gpu_budget.room()
        return None if room is None else max(0.0, room / self.session.spec.gpus - waited)

    def run_search_trial(self, trial: optuna.Trial, cfg: Any, tdir: Path, on_window: Any,
                         budget_s: float | None = None) -> TrialOutcome:
        """One search trial; a trial killed from outside with no sign of an OOM is run once more before its
        config is called infeasible (the first attempt is kept as ``trials/<n>.killed``). ``budget_s``: the
        seconds it may run before its first window (``budget_limit_s``; a second attempt gets what the first
        left)."""
        s = self.session
        n = trial.number
        for attempt in range(2):
            # its process, where one was started ahead for this config (a second attempt launches its own)
            held = self.started.take(n, config_hash(cfg)) if self.started is not None and not attempt else None
            try:  # the twins stand stopped through its measured windows (ahead.py)
                out = run_trial(cfg, tdir, timeout_s=s.spec.protocol.trial_timeout_s,
                                heartbeat_timeout_s=s.spec.protocol.heartbeat_timeout_s, on_window=on_window,
                                on_phase=self.measurer.on_phase(f"trial {n}"), launch=s.launch,
                                on_launch=lambda pgid: _record_group(trial, pgid),
                                on_measure=self.ahead.pause if self.ahead is not None else None,
                                env=s.child_env(), cwd=s.child_cwd(), held=held, budget_s=budget_s)
            finally:
                if self.ahead is not None:
                    self.ahead.resume()
            if not out.killed_from_outside or attempt:
                return out
            budget_s = None if budget_s is None else max(0.0, budget_s - out.wall_s)
            kept = tdir.with_name(f"{tdir.name}.killed")
            remove_tree(kept)
            tdir.rename(kept)
            trial.set_user_attr("rerun", {"reason": out.failure_reason, "first_attempt_dir": str(kept)})
            s.log(f"trial {n}: {out.failure_reason}; running it once more before blaming its config")
        return out

    def constraints(self, out: TrialOutcome) -> dict[str, float]:
        # the same keys for every trial: Optuna's GP sampler models each constraint across all trials
        if out.failed:
            return {"failed": 1.0, "memory": 0.0, "finite_loss": 0.0}
        peak, total = out.peak_memory_gib, out.device_total_gib
        limit = self.session.spec.objective.memory_share_limit
        mem = peak / total - limit if (peak is not None and total) else 0.0
        loss = out.last_loss
        return {"failed": 0.0, "memory": round(mem, 6),
                "finite_loss": 0.0 if loss is None or math.isfinite(loss) else 1.0}

    def tell(self, trial: optuna.Trial, out: TrialOutcome) -> None:
        s = self.session
        cons = self.constraints(out)
        attrs: dict[str, Any] = {
            "status": out.status, "failure_reason": out.failure_reason, "log_tail": out.log_tail,
            "config_path": str(out.config_path) if out.config_path else "", "trial_dir": str(out.trial_dir),
            "summary": out.summary or {}, "constraint": list(cons.values()), "windows": out.windows,
            "wall_s": round(out.wall_s, 3), "timeline": out.timeline,
        }
        if out.step_losses:  # each measured step's loss: what a replay of the numerics guard reads
            attrs["step_losses"] = stored_losses(out.step_losses)
        if self.ahead is not None and (rec := self.ahead.record(trial.number)) is not None:
            attrs["compile_ahead"] = rec
        if out.start_ahead is not None:
            attrs["start_ahead"] = out.start_ahead
            if out.start_ahead.get("cuda_initialized") and self.started is not None:
                self.started.stop()
                self.started = None
                s.log(f"trial {trial.number}: its process had CUDA up before its gate opened (a loop that touches the "
                      "device before workbench.run()): a held process would take device memory beside a measured "
                      "trial, so start-ahead is off for the rest of this search")
        attrs.update(flat_attrs(out.summary or {}))
        # Optuna's own states, so that its tools read the study right: a failed config is FAIL (the samplers
        # learn it as infeasible through their view, workbench.tune.samplers), an interrupted one FAIL too
        values: list[float] | None = None
        state = TrialState.FAIL
        mem = out.peak_memory_gib
        if out.status == "ok" and out.value is not None:  # (an ok outcome carries its value)
            values = [out.value] + ([mem if mem is not None else 0.0] if s.spec.objective.multi_objective else [])
            state = TrialState.COMPLETE
        elif out.status == "pruned":
            state = TrialState.PRUNED
        try:
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            if out.status not in ("interrupted", "disk"):  # the machine's doing: nothing to learn about the config
                for k, v in cons.items():
                    trial.set_constraint(k, v)
                # optuna-dashboard (0.21) reads the constraints as Optuna 4 stored them: one list
                s.storage.set_trial_system_attr(trial._trial_id, "constraints", [cons[k] for k in CONSTRAINTS])
            s.study.tell(trial, values, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as e:
            # another process failed it as stale (our heartbeat stalled); it will be re-run
            s.log(f"trial {trial.number}: could not record its result ({e}); it counts as failed")

    def mark_interrupted(self, trial: optuna.Trial, reason: str | None = None) -> None:
        """Tell a trial that Ctrl-C or SIGTERM (or an error of the tuner's own, ``reason``) stopped FAIL (status
        interrupted: it is re-run on resume), once: more interrupts arriving meanwhile are held off, and a trial
        already finished in the storage is left as it is."""
        s = self.session
        tdir = s.study_dir / "trials" / str(trial.number)
        with interrupts_held(), contextlib.suppress(Exception):
            if s.storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                return
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("failure_reason", reason or "interrupted (Ctrl-C or SIGTERM of the tuner)")
            trial.set_user_attr("log_tail", read_log_tail(tdir))
            trial.set_user_attr("config_path", str(tdir / "config.yaml"))
            s.study.tell(trial, state=TrialState.FAIL)

    # ------------------------------------------------------------------ repeats, requeues, stale trials
    def grids(self) -> dict[str, list[Any]] | None:
        """Each active knob's values in sampling order (knob order); None when a range is continuous."""
        spec = self.session.spec
        grids: dict[str, list[Any]] = {}
        for name in (n for n in spec.knob_order() if n in self.session.active):
            rng = spec.space[name]
            if rng.choices is None and spec.knob(name).kind != "int" and rng.step is None:
                return None
            grids[name] = rng.grid(spec.knob(name).kind)
        return grids

    def configs(self, grids: Mapping[str, list[Any]] | None = None) -> list[dict[str, Any]] | None:
        """Every config of the search space as knob values (conditional knobs only where active), in sampling
        order, from ``grids`` (default ``self.grids()``); None when the space is not finite or has more than
        MAX_ENUMERATED configs."""
        spec = self.session.spec
        grids = self.grids() if grids is None else grids
        if grids is None:
            return None
        names = list(grids)
        out: list[dict[str, Any]] = []

        def walk(i: int, values: dict[str, Any], params: dict[str, Any]) -> bool:
            if i == len(names):
                out.append(dict(params))
                return len(out) <= MAX_ENUMERATED
            name = names[i]
            if not spec.knob(name).active(values):
                return walk(i + 1, values, params)
            for v in grids[name]:
                if not walk(i + 1, {**values, name: v}, {**params, name: v}):
                    return False
            return True

        return out if walk(0, dict(self.base_values), {}) else None

    def drawn_configs(self, grids: Mapping[str, list[Any]], held: Mapping[str, Any],
                      rng: random.Random) -> list[dict[str, Any]]:
        """DRAWS configs drawn at random from ``grids`` (conditional knobs only where active), the ``held`` knobs
        at their values where those are values of the knob; distinct, in the order drawn."""
        spec, out = self.session.spec, []
        for _ in range(DRAWS):
            values, params = dict(self.base_values), {}
            for name, grid in grids.items():
                if not spec.knob(name).active(values):
                    continue
                v = held[name] if name in held and any(held[name] == g for g in grid) else rng.choice(grid)
                params[name] = values[name] = v
            if params not in out:
                out.append(params)
        return out

    def queue_untried(self, number: int) -> dict[str, Any] | None:
        """Enqueue one config of a finite space that no trial has asked for or queued (a seeded choice, so that
        a study reruns the same way), one that agrees with the knobs the sampler holds now first; where the space
        is too large to list (MAX_ENUMERATED), the first such config of DRAWS drawn at random. None when the space
        is not finite or no untried config was found."""
        study, seed = self.session.study, self.session.spec.sampler.seed
        grids = self.grids()
        if not grids:
            return None
        asked = [asked_config(t) for t in self.session.trials()]
        held = study.sampler.held(study) if isinstance(study.sampler, ProfileLed) else {}
        configs = self.configs(grids)
        if configs:
            led = [c for c in configs if all(c.get(k, v) == v for k, v in held.items())]  # the startup's, first
            pick = untried_config(led, asked, seed, number) or untried_config(configs, asked, seed, number)
        else:
            rng = random.Random((seed or 0) * 1_000_003 + number)
            drawn = self.drawn_configs(grids, held, rng) + (self.drawn_configs(grids, {}, rng) if held else [])
            pick = next((c for c in drawn if c not in asked), None)
        if pick is None:
            return None
        study.enqueue_trial(pick, user_attrs={"queued_for": number})
        return pick

    def requeue_interrupted(self) -> None:
        """Queue again, once, the config of every trial that stopped without a result of its own (Ctrl-C, a dead
        tuner, a stale heartbeat): the sampler, the grid's included, treats a finished trial as covered."""
        trials = self.session.trials()
        pending = [t.params for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)] + \
            [t.system_attrs.get("fixed_params") or t.params for t in trials
             if t.state in (TrialState.WAITING, TrialState.RUNNING)]
        done = {t.user_attrs.get("requeue_of") for t in trials}  # (Optuna keeps a finished trial as it is: no mark)
        for t in trials:
            if t.state != TrialState.FAIL or infeasible(t) or t.number in done or not t.params:
                continue
            if t.user_attrs.get("status") not in (None, "interrupted", "disk") or "duplicate_of" in t.user_attrs:
                continue  # the config's own failure, skipped over the budget, or a repeat: nothing was lost
            if t.params in pending:
                continue  # measured or queued since
            self.session.study.enqueue_trial(t.params, user_attrs={"requeue_of": t.number})
            pending.append(t.params)
            self.session.log(f"trial {t.number} stopped without a result: its config is queued again "
                             f"({params_text(t.params)})")

    def measured_twin(self, h: str, number: int) -> FrozenTrial | None:
        """The earliest finished search trial of config hash ``h`` whose result is the config's: complete and ok,
        pruned (screened out: slower than the trials it was ranked with; not one stopped for the GPU-minute budget,
        which the pruner would have run on), or failed out of memory (not a timeout, crash or interrupt, which may
        be the machine's doing)."""
        for t in self.session.trials((TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            screened_out = t.state == TrialState.PRUNED and "stopped_for_budget" not in t.user_attrs
            if (t.number != number and t.user_attrs.get("config_hash") == h and "duplicate_of" not in t.user_attrs
                    and (is_feasible(t) or screened_out or t.user_attrs.get("status") == "oom")):
                return t
        return None

    def recover_stale(self) -> None:
        """Fail RUNNING trials whose tuner is gone: dead pid on this host now, elsewhere by heartbeat."""
        s = self.session
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(s.study)
        for t in s.trials((TrialState.RUNNING,)):
            w = t.user_attrs.get("worker") or {}
            if w.get("host") != s.me["host"] or not isinstance(w.get("pid"), int):
                continue
            if (w.get("pid"), w.get("start")) == (s.me["pid"], s.me["start"]):
                continue
            if alive(w["pid"], w.get("start")):
                continue
            pgid, leader = t.user_attrs.get("pgid"), t.user_attrs.get("pgid_leader")
            # an orphaned trial of the dead tuner: its group is killed only while its leader is the process the
            # trial recorded (pids are reused), and never group 0 (the caller's own) or this tuner's group
            if isinstance(pgid, int) and pgid > 1 and pgid != os.getpgrp() and leader is not None \
                    and proc_identity(pgid) == leader:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                s.storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
                s.storage.set_trial_user_attr(
                    t._trial_id, "failure_reason",
                    f"tuner process {w['pid']} on {w['host']} died while the trial ran; re-run")
                s.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                s.log(f"trial {t.number}: its tuner (pid {w['pid']}) is gone; marked FAIL, it will be re-run")

    @contextlib.contextmanager
    def storage_heartbeat(self, trial_id: int) -> Iterator[None]:
        """Record the trial's storage heartbeat every HEARTBEAT_INTERVAL_S while it runs (ask/tell has none)."""
        storage = self.session.storage
        stop = threading.Event()

        def beat() -> None:
            while True:
                with contextlib.suppress(Exception):  # a transient DB error must not kill the trial
                    storage.record_heartbeat(trial_id)
                if stop.wait(HEARTBEAT_INTERVAL_S):
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _record_group(trial: optuna.Trial, pgid: int) -> None:
    """Store the trial's process group and what identifies its leader, for the recovery of a dead tuner."""
    trial.set_user_attr("pgid_leader", proc_identity(pgid))
    trial.set_user_attr("pgid", pgid)
