"""The ``Tuner``: one run of a study, as coordinator (baseline, search, validation, export, report) or as a worker
(search trials only), resumable from its Optuna storage. docs/tuner.md describes the run, the records it writes
and how it resumes; ``python -m workbench.tune`` (``__main__``) is its CLI.

The Tuner is a facade, as Optuna's ``Study`` is over ``_optimize.py`` and ``_tell.py``: ``open()`` builds the
``StudySession`` (``workbench.tune.opening``) and the parts that work on it, each given what it needs: the
coordinator's ``Lease``, the ``Measurer`` (runs outside the search trials), the ``Search``, ``validate`` and
``verify``, and the records (tune.json, ``workbench.tune.records``); ``run()`` orders them."""
from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from workbench.errors import TuneError
from workbench.files import check_name
from workbench.tune.budget import GpuBudget, runs_after_search
from workbench.tune.export import export_config, exported_patches, winner_launch_record
from workbench.tune.knobs import DroppedKnob, format_dropped
from workbench.tune.lease import Lease
from workbench.tune.measure import Measurer, write_lifetimes
from workbench.tune.opening import open_session, read_session
from workbench.tune.preflight import preflight
from workbench.tune.progress import Console, Progress
from workbench.tune.records import (Sessions, finished, finished_lines, record_in_study, result_text,
                                    sessions_wall_s, stored_result, study_result, write_tune_json)
from workbench.tune.result import data_source, describe_data, result_headline
from workbench.tune.search import Search
from workbench.tune.session import SessionRequest, StudySession
from workbench.tune.storage import default_storage_url, mask_url, normalize_storage_url, proc_start
from workbench.tune.study import StudySpec
from workbench.tune.trial import Launcher, interrupts_held
from workbench.tune.validation import now_iso, validate
from workbench.tune.verify import nothing_to_verify, verifiable, verify, verify_pairs

__all__ = ["Tuner"]


@dataclass(frozen=True)
class _Open:
    """An opened study and the parts that work on it (built together by ``Tuner.open``)."""

    session: StudySession
    measurer: Measurer
    search: Search
    gpu_budget: GpuBudget


class Tuner:
    """One tuner process (coordinator or worker) on one study; see the module docstring."""

    def __init__(
        self,
        spec: StudySpec | None,
        *,
        study_name: str | None = None,
        out_root: str | Path = "runs",
        storage_url: str | None = None,
        trials: int | None = None,
        timeout_s: float | None = None,
        gpu_minutes: float | None = None,
        worker: bool = False,
        report: Callable[[Path, str, str], Path] | None = None,
        lifetimes: Callable[[Any, Path], str] | None = None,
        progress: bool = True,
        launch: Launcher | None = None,
        confirm: Callable[[StudySpec], None] | None = None,
        reset: Callable[[str], None] | None = None,
        reference: bool = True,
    ) -> None:
        if spec is None and study_name is None:
            raise TuneError("a study spec or a study name is needed")
        self.spec = spec  # None: a worker reads the coordinator's from the storage (the session's spec)
        self.study_name = check_name(study_name, "--study-name") if study_name else (spec.name if spec else "")
        self.study_dir = Path(out_root).resolve() / self.study_name  # trial processes get absolute paths
        self.storage_url = normalize_storage_url(storage_url or default_storage_url(self.study_dir))
        self.storage_shown = mask_url(self.storage_url)  # the only form of the URL that is printed or written
        self.reference = reference  # the winner beside the plain compiled loop after validation (GPU studies)
        self.trials_override = trials
        self.timeout_override = timeout_s
        self.gpu_budget_override = gpu_minutes  # the CLI's --gpu-minutes, over the spec's budget.gpu_minutes
        self.worker = worker
        self.report = report or None  # report.html's builder (the CLI passes reports.build_report); None builds none
        self.lifetimes = lifetimes  # lifetimes.json's writer (workbench.memory.lifetimes.study_lifetimes), or None
        self.progress_enabled = progress
        self.launch = launch  # builds each trial's command line; None: the built-in loop or the spec's command
        # asked before a spec that did not come from the user's own file runs its trainer.command (the CLI asks the
        # user, or takes --yes); raising TuneError refuses it
        self.confirm = confirm
        # --reset: asked (with what would be deleted) before a study with measurements is started over; raising
        # TuneError refuses it. None: such a study is never deleted
        self.reset = reset
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "start": proc_start(os.getpid()),
                   "role": "worker" if worker else "coordinator"}
        self.attempt_id = os.urandom(4).hex()  # names this process's measurement folders
        self.console = Console()  # the tuner's lines, through the progress bar while run() shows one
        self.lease = Lease(self.study_name, self.me, f"{self.me['host']}:{self.me['pid']}:{self.attempt_id}",
                           self.console.log)
        self._t0 = time.monotonic()  # this process's start (run() sets it again): the search's wall clock
        self._open: _Open | None = None  # set by open()

    # ------------------------------------------------------------------ the open study
    def _request(self) -> SessionRequest:
        return SessionRequest(spec=self.spec, study_name=self.study_name, study_dir=self.study_dir,
                              storage_url=self.storage_url, storage_shown=self.storage_shown,
                              trials=self.trials_override, timeout_s=self.timeout_override,
                              gpu_minutes=self.gpu_budget_override, worker=self.worker, reference=self.reference,
                              launch=self.launch, confirm=self.confirm, reset=self.reset, me=self.me,
                              attempt_id=self.attempt_id)

    def open(self) -> optuna.Study:
        """Open (or create) the Optuna study and settle the search space and budget: the ``StudySession``
        (``workbench.tune.opening.open_session``); a coordinator holds the study's lease from here on."""
        session = open_session(self._request(), self.lease, self.console)
        measurer = Measurer(session, self.lease)
        gpu_budget = GpuBudget(session)
        self._open = _Open(session, measurer, Search(session, measurer, self.lease, gpu_budget), gpu_budget)
        return session.study

    def _opened(self) -> _Open:
        if self._open is None:
            raise TuneError(f"study {self.study_name!r} is not open: call Tuner.open() first")
        return self._open

    @property
    def session(self) -> StudySession:
        return self._opened().session

    @property
    def measurer(self) -> Measurer:
        return self._opened().measurer

    @property
    def searcher(self) -> Search:
        return self._opened().search

    @property
    def study(self) -> optuna.Study:
        return self._opened().session.study

    def search(self) -> None:
        """Run search trials until the budget or the wall-clock limit (``Search.search``)."""
        self.searcher.search(self._t0)

    def run_baseline(self) -> list[float]:
        """Measure the base config ``baseline_repeats`` times (resumable); returns the throughputs."""
        return self.measurer.run_baseline()

    def stored_result(self) -> dict[str, Any] | None:
        """The finished result in this study's tune.json, else None."""
        return stored_result(self.study_dir)

    def stored_study_result(self, study: optuna.Study, validation: Mapping[str, Any]) -> dict[str, Any]:
        """The result of a stored study from a validation record, as a finished run builds it, without opening
        the study for measuring (``python -m workbench.tune export`` of an unfinished study)."""
        if self.spec is None:
            raise TuneError(f"study {self.study_name!r}: a stored study's result needs its spec")
        return study_result(read_session(self._request(), self.spec, study, self.console), validation, None)

    # ------------------------------------------------------------------ a run
    def run(self) -> dict[str, Any] | None:
        """Coordinator: baseline, search, validation, export, report. Worker: search only.

        Returns validation.json's content (None for a worker). KeyboardInterrupt propagates after the
        running trial is marked FAIL.
        """
        started = now_iso()
        self._t0 = time.monotonic()
        if self._open is None and self.spec is not None and not self.worker:
            preflight(self.spec)  # before anything is stored or run
        self.study_dir.mkdir(parents=True, exist_ok=True)
        if self._open is None:
            self.open()
        o = self._opened()
        s, sessions = o.session, Sessions(self.study_dir, self.study_name)
        if not self.worker and (done := finished(s, o.gpu_budget, self.timeout_override is not None)) is not None:
            with interrupts_held():
                self.lease.release()
            print("\n".join(finished_lines(s, done)), flush=True)
            return None
        self._print_start(s)
        after = 0 if self.worker else runs_after_search(s)
        progress = self.console.progress = Progress(s.budget, s.study_name, self.progress_enabled, after=after)
        try:
            if not self.worker:
                o.measurer.remove_stale_attempts()
                write_tune_json(s, sessions, started, None)
                o.measurer.run_baseline()
                o.gpu_budget.no_room()  # a GPU-minute budget that holds no search trial says so, naming its keys
                write_lifetimes(s, self.lifetimes)  # the base config's gradient lifetimes, once (no device)
                write_tune_json(s, sessions, started, None)
            o.search.search(self._t0)
            if self.worker:
                progress.finish()
                return None
            progress.set(phase="validating", best="")
            validation = validate(s, o.measurer, o.gpu_budget.pairs_left)
            progress.set(phase="exporting")
            result, path = self._export(s, sessions, started, validation)
            if self.report is not None:
                progress.set(phase="report")
                self.build_report()
            progress.set(best=result_headline(result))
            progress.finish()
        finally:
            progress.close()
            o.measurer.stop_held()
            with interrupts_held():
                self.lease.release()  # the same command may resume at once
        print(result_text(result, path, self.study_dir / "report.html" if self.report is not None else None),
              flush=True)
        return validation

    def _print_start(self, s: StudySession) -> None:
        """The run's first lines: the knobs left out, what is searched, the budget, the storage and the data."""
        if s.dropped:
            print(format_dropped(_as_dropped(s.dropped)), file=sys.stderr, flush=True)
        role = "worker" if s.worker else "coordinator"
        print(f"study {s.study_name} ({role}): searching {', '.join(s.active)}; budget "
              f"{s.budget if s.budget is not None else 'unlimited'} trials"
              + (f", {s.timeout_s:g} s" if s.timeout_s else "") + f"; storage {s.storage_shown}\n"
              f"data: {describe_data(data_source(s.spec.base_config(), s.spec.trainer))}", file=sys.stderr,
              flush=True)

    def _export(self, s: StudySession, sessions: Sessions, started: str,
                validation: Mapping[str, Any]) -> tuple[dict[str, Any], Path]:
        """The study's one result, stored as study attributes, exported (config.yaml) and written (tune.json)."""
        finished_at = now_iso()
        result = study_result(s, validation, sessions_wall_s(sessions.mark(started, finished_at)))
        record_in_study(s.study, result)
        path = export_config(s.spec, s.study_dir, result, launch_record=winner_launch_record(s.study, result),
                             patches=exported_patches(s.study, result, s.study_dir))
        write_tune_json(s, sessions, started, finished_at, result)
        return result, path

    def build_report(self) -> Path | None:
        """report.html through the injected builder. The study's results are already stored and exported, so a
        builder that fails is one line naming the command that rebuilds it, never a lost study."""
        if self.report is None:
            return None
        try:
            return Path(self.report(self.study_dir, self.storage_url, self.study_name))
        except Exception as e:  # noqa: BLE001 - any failure of the report must leave the study's result intact
            print(f"report.html not built ({type(e).__name__}: {e}); the study's results are in {self.study_dir}; "
                  f"rebuild it with `python -m workbench.tune report --study-name {self.study_name} --out "
                  f"{self.study_dir.parent}`", file=sys.stderr, flush=True)
            return None

    # ------------------------------------------------------------------ verify
    def verify(self, pairs: int | None = None) -> dict[str, Any]:
        """Re-measure the exported config against the baseline (``workbench.tune.verify``); returns the record
        appended to verify.json (``holds`` None when the base config was exported: there is nothing to
        re-measure). Opening the study takes the coordinator lease: no other coordinator measures meanwhile."""
        result = verifiable(self.stored_result(), self.study_name, self.study_dir)
        n = verify_pairs(result, pairs)
        if n is None:
            return nothing_to_verify(result)
        if self._open is None:
            self.open()
        o = self._opened()
        try:
            return verify(o.session, o.measurer, result, n)
        finally:
            o.measurer.stop_held()
            self.lease.release()


def _as_dropped(items: Sequence[Mapping[str, str]]) -> list[Any]:
    return [DroppedKnob(d["knob"], d["reason"]) for d in items]
