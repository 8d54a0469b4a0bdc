"""``python -m workbench.tune``: search the knobs of a study, validate the best, export the winner.

    python -m workbench.tune [--study NAME|PATH] [--trials N] [--timeout S] [--storage URL]
                             [--study-name NAME] [--gpus N] [--out runs/] [--worker] [--no-report]
                             [--no-progress]
    python -m workbench.tune export [same flags]   # re-export runs/<study>/config.yaml
    python -m workbench.tune report [same flags]   # rebuild runs/<study>/report.html

    # scale-out: the coordinator on one machine, workers on others, one PostgreSQL study
    python -m workbench.tune --study gr00t-n1.6 --storage postgresql://USER:PW@HOST/DB
    python -m workbench.tune --storage postgresql://USER:PW@HOST/DB --study-name gr00t-n1.6 --worker

One run of the coordinator (the default role):

1. **Baseline**: the study's base config is measured ``protocol.baseline_repeats`` times
   (``runs/<study>/baseline/<i>/``); the spread of these runs is the noise floor.
   Stored in the study's user attrs, so a resumed run skips what is done.
2. **Search**: Optuna trials (ask/tell), each an isolated subprocess
   (``workbench.trial.run_trial``) under ``runs/<study>/trials/<n>/``; measured windows
   are intermediate values for the pruner; failures are told as infeasible
   (objective 0, constraint 1.0) so the sampler avoids their region. The spec's
   ``seed_trials`` are queued first (``enqueue_trial``, once per study) and count against
   the budget. A trial that sets a numerics knob (FP8) off its base value passes the
   numerics guard (``workbench.numerics``) or fails with kind ``numerics``. Every trial
   process shares the study's compile caches (``runs/<study>/compile-cache/``).
3. **Validation**: the ``top_k`` best distinct feasible trials are re-measured
   interleaved with the baseline (A/B/A/B, ``ab_rounds`` pairs each); the winner is
   the highest median speedup whose 95% interval lies above 1.0
   (``runs/<study>/validation.json``, ``workbench.stats``); with ``protocol.ab_min_rounds``
   a candidate stops once its interval excludes 1.0. A trial whose config is the
   baseline's, or whose search throughput did not beat the baseline median, is not
   re-measured (listed under ``skipped``). No winner: "no significant gain", and the
   base config is exported.
4. **Export** (``runs/<study>/config.yaml`` with provenance, ``environment.json``) and
   the **report** (``runs/<study>/report.html``).

Constraints go through ``Trial.set_constraint`` (Optuna 5 deprecated the samplers'
``constraints_func``; TPE, NSGA-II and GP read ``trial.constraints`` directly): ``memory``
= peak reserved / device total - ``objective.memory_share_limit`` (CUDA; 0 on the CPU),
``finite_loss`` = 0 or 1, and ``failed`` = 1.0 for a failure kind (every trial has all three). A failed trial,
``invalid_config`` included (rejected before launch, never run), is told COMPLETE with
objective 0 so that the sampler learns the region is infeasible; the best trial and the
candidates are chosen among feasible trials only. Multi-objective studies maximise
throughput and minimise peak memory (reserved on CUDA, RSS on the CPU); their candidates
come from the feasible Pareto front.

One coordinator per study: it holds a lease in the study's user attrs (``coordinator_lease``: host, pid,
heartbeat every 10 s); a second coordinator of the same study refuses with one line naming the first, and
takes the lease over only once its heartbeat is 60 s old or, on the same host, its process is gone.

``--worker`` processes (on this or other machines, sharing ``--storage``) only run
search trials of the same study; the spec is read from the storage when ``--study``
is not given. The trial budget is exact across processes: a trial whose number
comes after ``budget`` counted trials (complete, pruned, running, waiting) is told
FAIL with ``status=skipped_budget`` and its process stops searching.

Resume: trials of a tuner that died (``kill -9``, a lost machine) turn FAIL, on the
same host at once (its process is gone), elsewhere when their storage heartbeat is
older than the grace period; FAIL trials do not count, so the budget is filled
again. Ctrl-C kills the running trial, marks it FAIL (``status=interrupted``) and
exits 130; the same command resumes.

Data written (read by ``reports.build_report``): ``tune.json`` {study_name,
storage_url, spec, dropped_knobs, hardware, noise_floor, started, finished,
sessions, wall_s} (``sessions``: each coordinator run of the study, resumes included, as {started, finished};
``started`` is the first one's; ``wall_s`` sums the finished ones, the study's cost across calls);
each trial's user attrs ``status``, ``failure_reason``, ``log_tail``,
``config_path``, ``trial_dir``, ``summary``, ``constraint`` (list, > 0 =
infeasible), ``windows``; ``validation.json`` (see ``Tuner.validate``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import html
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from workbench.config import ConfigError, config_hash, merge_overrides
from workbench.export import export_config, write_json
from workbench.knobs import (detect_capabilities, drop_unsupported, format_dropped, get_knob, knob_names,
                             numerics_knobs)
from workbench.memory_model import predicted_oom
from workbench.numerics import check_loss, data_key, window_loss
from workbench.samplers import make_sampler
from workbench.stats import noise_floor, pair_ratios, speedup_interval
from workbench.study import DEFAULT_STUDY, StudySpec, load_study_spec, spec_from_dict
from workbench.trial import (TrialOutcome, ignore_interrupts, interrupts_held, not_launched_outcome,
                             read_log_tail, run_trial)

__all__ = ["Tuner", "TuneError", "build_report", "default_storage_url", "main", "make_storage", "normalize_storage_url"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""Trial states that use up the budget; FAIL (interrupted, stale, skipped) does not."""

HEARTBEAT_INTERVAL_S = 10
"""Storage heartbeat of a running trial (Optuna RDB heartbeat table)."""
HEARTBEAT_GRACE_S = 60
"""A RUNNING trial whose storage heartbeat is older than this is failed (its tuner is gone)."""
SQLITE_TIMEOUT_S = 60  # concurrent writers (coordinator, workers, heartbeat threads) wait for the lock

_STUDY_WAIT_S = 300  # a worker started before its coordinator waits this long for the study

LEASE_ATTR = "coordinator_lease"
"""Study user attr: the coordinator holding the study {host, pid, start, token, heartbeat (unix time)}."""
LEASE_HEARTBEAT_S = 10
"""The holder rewrites its lease's heartbeat this often."""
LEASE_TTL_S = 60
"""A lease whose heartbeat is older than this is stale: another coordinator may take it over."""
LEASE_SETTLE_S = 1.0
"""After writing its lease a coordinator waits this long and reads it back: of two that wrote at once, only
the one whose lease is still there holds the study (Optuna's storage has no compare-and-set)."""


class TuneError(RuntimeError):
    """The tuner cannot go on (failing baseline, spec mismatch with the stored study...)."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def sessions_wall_s(sessions: Sequence[Mapping[str, Any]]) -> float:
    """Seconds of the sessions that finished (tune.json's ``sessions``); an interrupted one has no end and adds
    nothing."""
    total = 0.0
    for s in sessions:
        try:
            total += (datetime.datetime.fromisoformat(s["finished"])
                      - datetime.datetime.fromisoformat(s["started"])).total_seconds()
        except (KeyError, TypeError, ValueError):
            continue
    return total


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def default_storage_url(study_dir: Path) -> str:
    """``sqlite:///<abs>/runs/<study>/study.db``."""
    return f"sqlite:///{(Path(study_dir) / 'study.db').resolve()}"


def normalize_storage_url(url: str) -> str:
    """Make a PostgreSQL URL usable with the installed driver.

    SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3; the project's ``postgres`` extra installs
    psycopg2, so a plain URL becomes ``postgresql+psycopg2://`` when only psycopg2 is importable.
    ``postgres://`` (Heroku style) is read as ``postgresql://``.
    """
    import importlib.util

    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def make_storage(url: str) -> optuna.storages.RDBStorage:
    """RDB storage with heartbeats (stale trials become FAIL) and a lock timeout for SQLite."""
    url = normalize_storage_url(url)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    else:
        engine_kwargs["pool_pre_ping"] = True  # survive server-side connection drops during long trials
    import sqlalchemy.engine
    import sqlalchemy.exc

    try:
        shown = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        raise ConfigError(f"{url!r} is not a database URL; expected e.g. sqlite:///runs/study.db or "
                          "postgresql://user:password@host/db", key="--storage") from None
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                                  heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                                  grace_period=HEARTBEAT_GRACE_S)
        except (sqlalchemy.exc.NoSuchModuleError, ModuleNotFoundError) as e:
            raise ConfigError(f"{shown}: no database driver for this URL ({e}); expected sqlite:///... or "
                              "postgresql://... (psycopg2)", key="--storage") from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as e:
            # two processes creating the schema of a new database at once: one loses the race, then
            # finds the tables there on the next attempt
            if attempt == 4:
                reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
                raise TuneError(f"cannot open the study storage {shown} after 5 attempts: {reason}") from e
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def _proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot, from /proc) to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    if Path("/proc").is_dir() and Path("/proc/self/stat").exists():
        now = _proc_start(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, without its end-of-grid ``study.stop()``: that call only works inside
    ``study.optimize`` and raises under ask/tell (after the last grid point was stored), which is how the
    tuner drives trials. The study's trial budget ends the search instead (set it to the grid's size)."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        return None


def _feasible(t: FrozenTrial) -> bool:
    return (t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
            and all(v <= 0 for v in t.constraints.values()))


class _Progress:
    """tqdm bar: trials done/total, best so far and its speedup, the current phase."""

    def __init__(self, total: int | None, desc: str, enabled: bool) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        # disable=None: no bar when stderr is not a terminal (logs get one line per trial instead)
        self.bar = tqdm(total=total, desc=desc, unit="trial", dynamic_ncols=True, disable=None if enabled else True,
                        file=sys.stderr, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                        "[{elapsed}]{postfix}")
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
        self._tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


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
        worker: bool = False,
        report: bool = True,
        progress: bool = True,
    ) -> None:
        if spec is None and study_name is None:
            raise TuneError("a study spec or a study name is needed")
        self.spec = spec
        self.study_name = study_name or (spec.name if spec else "")
        self.study_dir = Path(out_root).resolve() / self.study_name  # trial processes get absolute paths
        self.storage_url = normalize_storage_url(storage_url or default_storage_url(self.study_dir))
        self.trials_override = trials
        self.timeout_override = timeout_s
        self.worker = worker
        self.make_report = report
        self.progress_enabled = progress
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _proc_start(os.getpid()),
                   "role": "worker" if worker else "coordinator"}
        self.storage: optuna.storages.RDBStorage | None = None
        self.study: optuna.Study | None = None
        self.active: list[str] = []
        self.dropped: list[dict[str, str]] = []
        self.budget: int | None = None
        self.progress: _Progress | None = None
        self._base_values: dict[str, Any] | None = None
        self._t0 = time.monotonic()
        self._sessions: list[dict[str, Any]] | None = None  # tune.json's coordinator runs, this one last
        self.hardware: dict[str, Any] = {}
        self._attempt_id = os.urandom(4).hex()  # names this process's measurement folders
        self._lease_token = f"{self.me['host']}:{self.me['pid']}:{self._attempt_id}"
        self._lease_stop: threading.Event | None = None
        self._lease_study: optuna.Study | None = None
        self._lease_lost: str | None = None

    # ------------------------------------------------------------------ setup
    def _log(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def _load_stored_spec(self) -> StudySpec:
        """A worker without --study: wait for the coordinator's study and read its spec."""
        assert self.storage is not None
        deadline = time.monotonic() + _STUDY_WAIT_S
        while True:
            try:
                summary = optuna.study.load_study(study_name=self.study_name, storage=self.storage)
                data = summary.user_attrs.get("spec")
                if data:
                    return spec_from_dict(data, source=f"{self.storage_url} (study {self.study_name})")
            except KeyError:
                pass
            if time.monotonic() > deadline:
                raise TuneError(f"no study {self.study_name!r} with a spec in {self.storage_url} after "
                                f"{_STUDY_WAIT_S} s; start the coordinator, or give --study")
            time.sleep(2)

    def open(self) -> optuna.Study:
        """Open (or create) the Optuna study and settle the search space and budget."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = make_storage(self.storage_url)
        if self.spec is None:
            self.spec = self._load_stored_spec()
        spec = self.spec
        directions = ["maximize", "minimize"] if spec.objective.multi_objective else ["maximize"]
        caps = detect_capabilities(spec.gpus)
        kept, dropped = drop_unsupported(list(spec.space), caps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.simplefilter("ignore", FutureWarning)
            study = optuna.create_study(storage=self.storage, study_name=self.study_name, directions=directions,
                                        load_if_exists=True, sampler=optuna.samplers.RandomSampler(0))
        if not self.worker:
            self._acquire_lease(study)
        attrs = study.user_attrs
        stored_spec = attrs.get("spec")
        mine = spec.to_dict()
        if stored_spec is not None:
            diff = _spec_diff(stored_spec, mine)
            if diff:
                raise TuneError(
                    f"study {self.study_name!r} in {self.storage_url} was created from a different spec "
                    f"(differs in: {', '.join(diff)}); use another --study-name, or delete {self.study_dir}")
        if "active_knobs" in attrs:  # the space of an existing study does not change with the machine
            self.active = list(attrs["active_knobs"])
            self.dropped = list(attrs.get("dropped_knobs", []))
            mine_lost = [d.knob for d in dropped if d.knob in self.active]
            if mine_lost:
                warnings.warn(f"this machine cannot act on {', '.join(mine_lost)}, which the study searches; "
                              "its trials here measure them without effect", stacklevel=2)
        else:
            self.active = kept
            self.dropped = [d.to_dict() for d in dropped]
        if not self.worker or stored_spec is None:
            study.set_user_attr("spec", mine)
            study.set_user_attr("active_knobs", self.active)
            study.set_user_attr("dropped_knobs", self.dropped)
        if self.trials_override is not None:
            self.budget = self.trials_override
        elif self.worker and "budget_trials" in attrs:
            self.budget = attrs["budget_trials"]
        else:
            self.budget = spec.budget.trials
        if not self.worker:
            study.set_user_attr("budget_trials", self.budget)
            self._enqueue_seeds(study)
        if self.budget is None and self.timeout_s is None:
            raise TuneError("no budget: give --trials or --timeout, or set budget in the study spec")
        if not self.active:
            raise TuneError(f"nothing to search on this hardware: {format_dropped(dropped)}")
        self.hardware = {"capabilities": sorted(caps), "gpus": spec.gpus, "cpu_count": os.cpu_count(),
                         "host": socket.gethostname()}
        if "cuda" in caps:
            import torch

            self.hardware.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                                 gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 3))
        # reload with the real sampler and pruner (create_study needed a sampler to exist)
        study = optuna.load_study(study_name=self.study_name, storage=self.storage, sampler=self._sampler(),
                                  pruner=self._pruner())
        self.study = study
        return study

    # ------------------------------------------------------------------ the coordinator lease
    def _lease_holder(self, lease: Any) -> str:
        age = time.time() - float(lease.get("heartbeat", 0))
        return f"pid {lease.get('pid')} on {lease.get('host')} (heartbeat {age:.0f} s ago)"

    def _lease_is_live(self, lease: Any) -> bool:
        """Whether another coordinator holds ``lease`` now: its heartbeat is fresh, and where it runs on this host,
        its process is alive."""
        if not isinstance(lease, dict) or lease.get("token") == self._lease_token:
            return False
        if (lease.get("host"), lease.get("pid"), lease.get("start")) == (self.me["host"], self.me["pid"],
                                                                          self.me["start"]):
            return False  # this process, through another Tuner object
        if time.time() - float(lease.get("heartbeat", 0)) > LEASE_TTL_S:
            return False
        if lease.get("host") == self.me["host"] and isinstance(lease.get("pid"), int):
            return _alive(lease["pid"], lease.get("start"))
        return True

    def _acquire_lease(self, study: optuna.Study) -> None:
        """Hold the study's coordinator lease (one coordinator per study, SQLite or PostgreSQL alike), or raise
        TuneError naming the live holder. A stale lease (its heartbeat older than LEASE_TTL_S, or its process gone
        from this host) is taken over."""
        old = study.user_attrs.get(LEASE_ATTR)
        if self._lease_is_live(old):
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self._lease_holder(old)}; "
                            f"start this one with --worker to add trials, or wait for it to finish")
        mine = {**{k: self.me[k] for k in ("host", "pid", "start")}, "token": self._lease_token,
                "heartbeat": time.time()}
        study.set_user_attr(LEASE_ATTR, mine)
        time.sleep(LEASE_SETTLE_S)
        now = optuna.load_study(study_name=self.study_name, storage=self.storage).user_attrs.get(LEASE_ATTR)
        if not isinstance(now, dict) or now.get("token") != self._lease_token:
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self._lease_holder(now or {})}"
                            f" (both started at once); start this one with --worker to add trials")
        if isinstance(old, dict) and old.get("token") != self._lease_token and \
                (old.get("host"), old.get("pid")) != (self.me["host"], self.me["pid"]):
            self._log(f"took over the coordinator lease of {self._lease_holder(old)}: it is gone")
        self._lease_study = study
        stop = self._lease_stop = threading.Event()

        def beat() -> None:
            while not stop.wait(LEASE_HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a transient DB error: the next beat tries again
                    held = study.user_attrs.get(LEASE_ATTR)
                    if isinstance(held, dict) and held.get("token") != self._lease_token:
                        self._lease_lost = self._lease_holder(held)
                        return
                    study.set_user_attr(LEASE_ATTR, {**mine, "heartbeat": time.time()})

        threading.Thread(target=beat, name="coordinator-lease", daemon=True).start()

    def _release_lease(self) -> None:
        if self._lease_stop is None or self._lease_study is None:
            return
        self._lease_stop.set()
        with contextlib.suppress(Exception):
            held = self._lease_study.user_attrs.get(LEASE_ATTR)
            if isinstance(held, dict) and held.get("token") == self._lease_token:
                self._lease_study.set_user_attr(LEASE_ATTR, None)
        self._lease_stop = None

    def _check_lease(self) -> None:
        if self._lease_lost:
            raise TuneError(f"study {self.study_name!r}: another coordinator took the lease over "
                            f"({self._lease_lost}); this one stops")

    def _enqueue_seeds(self, study: optuna.Study) -> None:
        """The spec's seed trials, queued once per study (Optuna's enqueue_trial): they run first and count
        against the budget. Values of knobs this machine dropped are left out."""
        spec = self.spec
        assert spec is not None
        if study.user_attrs.get("seeded") or not spec.seed_trials:
            return
        for i in range(len(spec.seed_trials)):
            params = {k: v for k, v in spec.seed_params(i).items() if k in self.active}
            study.enqueue_trial(params, user_attrs={"seed_trial": i}, skip_if_exists=True)
        study.set_user_attr("seeded", True)
        self._log(f"queued {len(spec.seed_trials)} seed trial(s) to run first")

    def _child_env(self) -> dict[str, str]:
        """Environment of every trial process: one Inductor/AOTAutograd cache and one Triton cache per study, so
        a trial recompiles only what no earlier trial of the study compiled."""
        cache = self.study_dir / "compile-cache"
        return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}

    @property
    def timeout_s(self) -> float | None:
        if self.timeout_override is not None:
            return self.timeout_override
        return self.spec.budget.timeout_s if self.spec else None

    def _sampler(self) -> optuna.samplers.BaseSampler:
        spec = self.spec
        assert spec is not None
        s = spec.sampler
        seed = s.seed
        if seed is not None and self.worker:
            seed = seed + 1 + os.getpid() % 100_000  # two workers must not replay the same random sequence
        if s.name != "grid":
            return make_sampler(s.name, seed, s.n_startup_trials)
        grid = {name: spec.space[name].grid(get_knob(name).kind) for name in self.active}
        return _AskTellGridSampler(grid, seed=seed)

    def _pruner(self) -> optuna.pruners.BasePruner:
        spec = self.spec
        assert spec is not None
        if spec.pruner.name == "none" or spec.objective.multi_objective:
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner.n_startup_trials,
                                           n_warmup_steps=spec.pruner.n_warmup_steps, interval_steps=1)

    # ------------------------------------------------------------------ bookkeeping
    def _trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        assert self.study is not None
        return self.study.get_trials(deepcopy=False, states=tuple(states) if states else None)

    def _counts(self) -> tuple[int, int, int]:
        """(counted, running, waiting) trials of the study."""
        trials = self._trials()
        counted = sum(t.state in COUNTED_STATES for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        return counted, running, waiting

    def _finished_count(self) -> int:
        return sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in self._trials())

    def baseline_runs(self) -> list[float]:
        assert self.study is not None
        return list(self.study.user_attrs.get("baseline_runs", []))

    def _best_text(self) -> str:
        ok = [t for t in self._trials((TrialState.COMPLETE,)) if _feasible(t)]
        if not ok:
            return ""
        best = max(ok, key=lambda t: t.values[0])
        base = self.baseline_runs()
        sp = f" ({best.values[0] / statistics.median(base):.2f}x)" if base else ""
        return f"best #{best.number} {best.values[0]:,.0f} tok/s{sp}"

    def _recover_stale(self) -> None:
        """Fail RUNNING trials whose tuner is gone: dead pid on this host now, elsewhere by heartbeat."""
        assert self.study is not None and self.storage is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        for t in self._trials((TrialState.RUNNING,)):
            w = t.user_attrs.get("worker") or {}
            if w.get("host") != self.me["host"] or not isinstance(w.get("pid"), int):
                continue
            if (w.get("pid"), w.get("start")) == (self.me["pid"], self.me["start"]):
                continue
            if _alive(w["pid"], w.get("start")):
                continue
            pgid = t.user_attrs.get("pgid")
            if isinstance(pgid, int):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)  # an orphaned trial of the dead tuner
            with contextlib.suppress(Exception):
                self.storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
                self.storage.set_trial_user_attr(
                    t._trial_id, "failure_reason",
                    f"tuner process {w['pid']} on {w['host']} died while the trial ran; re-run")
                self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                self._log(f"trial {t.number}: its tuner (pid {w['pid']}) is gone; marked FAIL, it will be re-run")

    @contextlib.contextmanager
    def _storage_heartbeat(self, trial_id: int) -> Iterator[None]:
        """Record the trial's storage heartbeat every HEARTBEAT_INTERVAL_S while it runs (ask/tell has none)."""
        assert self.storage is not None
        storage = self.storage
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

    # ------------------------------------------------------------------ phases
    def _phase(self, prefix: str) -> Any:
        def on_phase(text: str) -> None:
            if self.progress is not None:
                self.progress.set(phase=f"{prefix}: {text}")
        return on_phase

    def _measure(self, cfg: Any, run_dir: Path, label: str, prefix: str) -> TrialOutcome:
        """A coordinator's measurement (baseline, validation, numerics twin): run into this process's own attempt
        folder ``.<name>.<attempt>`` beside ``run_dir``, then, if this coordinator still holds the study, move it
        into place; so no two processes ever write one folder, and a folder in place is a finished run."""
        spec = self.spec
        assert spec is not None
        attempt = run_dir.with_name(f".{run_dir.name}.{self._attempt_id}")
        out = run_trial(cfg, attempt, timeout_s=spec.protocol.trial_timeout_s,
                        heartbeat_timeout_s=spec.protocol.heartbeat_timeout_s, on_phase=self._phase(prefix),
                        label=label, env=self._child_env())
        self._check_lease()  # a coordinator whose study was taken over keeps nothing
        if run_dir.exists():
            shutil.rmtree(run_dir)
        attempt.rename(run_dir)
        out.trial_dir = run_dir
        out.config_path = run_dir / "config.yaml" if out.config_path is not None else None
        return out

    def _remove_stale_attempts(self) -> None:
        """Attempt folders that a dead coordinator left (it held the lease; this one holds it now)."""
        for root in (self.study_dir / "baseline", self.study_dir / "validation"):
            with contextlib.suppress(OSError):
                for p in root.iterdir():
                    if p.is_dir() and p.name.startswith(".") and not p.name.endswith(f".{self._attempt_id}"):
                        shutil.rmtree(p, ignore_errors=True)

    def run_baseline(self) -> list[float]:
        """Measure the base config ``baseline_repeats`` times (resumable); returns the throughputs."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        cfg = spec.measured_base_config()
        h = config_hash(cfg)
        stored_hash = study.user_attrs.get("baseline_config_hash")
        runs = self.baseline_runs() if stored_hash in (None, h) else []
        losses = list(study.user_attrs.get("baseline_losses", [])) if stored_hash in (None, h) else []
        study.set_user_attr("baseline_config_hash", h)
        repeats = spec.protocol.baseline_repeats
        for i in range(len(runs), repeats):
            self._check_lease()
            out = self._measure(cfg, self.study_dir / "baseline" / str(i), f"baseline-{i}",
                                f"baseline {i + 1}/{repeats}")
            if out.status != "ok" or out.value is None:
                raise TuneError(f"baseline run {i} failed ({out.status}: {out.failure_reason}); the study's base "
                                f"config must run. Log: {out.trial_dir / 'log.txt'}\n{out.log_tail}")
            runs.append(out.value)
            losses.append(window_loss(out.last_window))
            study.set_user_attr("baseline_runs", runs)
            study.set_user_attr("baseline_losses", losses)  # the numerics guard's reference
            study.set_user_attr("baseline_dirs", [str(self.study_dir / "baseline" / str(j))
                                                  for j in range(len(runs))])
            self._log(f"baseline {i + 1}/{repeats}: {out.value:,.0f} tok/s/gpu")
        nf = noise_floor(runs)
        study.set_user_attr("noise_floor", nf.to_dict())
        self._log(f"noise floor: median {nf.median:,.0f} tok/s/gpu, spread {nf.rel_spread:.1%} "
                  f"(min {nf.min:,.0f}, max {nf.max:,.0f}), cv {nf.cv:.1%} over {nf.n} runs")
        return runs

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Knob values for ``trial``: each active knob in registry order, conditional knobs when active."""
        spec = self.spec
        assert spec is not None
        if self._base_values is None:
            self._base_values = spec.base_knob_values()
        values = dict(self._base_values)
        params: dict[str, Any] = {}
        for name in knob_names():
            if name not in self.active:
                continue
            knob = get_knob(name)
            if not knob.active(values):
                continue
            rng = spec.space[name]
            if rng.choices is not None:
                v = trial.suggest_categorical(name, rng.choices)
            elif knob.kind == "int":
                assert rng.low is not None and rng.high is not None
                v = trial.suggest_int(name, int(rng.low), int(rng.high), step=int(rng.step or 1), log=rng.log)
            else:
                assert rng.low is not None and rng.high is not None
                v = trial.suggest_float(name, float(rng.low), float(rng.high), step=rng.step, log=rng.log)
            params[name] = v
            values[name] = v
        return params

    def _constraints(self, out: TrialOutcome) -> dict[str, float]:
        spec = self.spec
        assert spec is not None
        # the same keys for every trial: Optuna's GP sampler models each constraint across all trials
        if out.failed:
            return {"failed": 1.0, "memory": 0.0, "finite_loss": 0.0}
        peak, total = out.peak_memory_gib, out.device_total_gib
        mem = peak / total - spec.objective.memory_share_limit if (peak is not None and total) else 0.0
        loss = out.last_loss
        return {"failed": 0.0, "memory": round(mem, 6),
                "finite_loss": 0.0 if loss is None or math.isfinite(loss) else 1.0}

    def run_one(self, trial: optuna.Trial) -> TrialOutcome:
        """Run and tell one search trial."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        n = trial.number
        tdir = self.study_dir / "trials" / str(n)
        params = self.sample(trial)
        trial.set_user_attr("trial_dir", str(tdir))
        multi = spec.objective.multi_objective

        def on_window(i: int, v: float) -> bool:
            if multi:
                return False
            trial.report(v, step=i)
            return trial.should_prune()

        out: TrialOutcome | None = None
        try:
            try:
                cfg = spec.trial_config(params)
            except ConfigError as e:
                out = not_launched_outcome(tdir, str(e))
            else:
                too_big = predicted_oom(cfg, self.hardware.get("gpu_memory_gib"))
                if too_big:
                    out = not_launched_outcome(tdir, too_big, kind="oom")
            if out is None:
                out = self._run_search_trial(trial, cfg, tdir, on_window)
                if out.status == "ok":
                    self._guard_numerics(trial, params, cfg, out)
        except KeyboardInterrupt:
            self._mark_interrupted(trial)
            raise
        self._tell(trial, out)
        return out

    def _run_search_trial(self, trial: optuna.Trial, cfg: Any, tdir: Path, on_window: Any) -> TrialOutcome:
        """One search trial; a trial killed from outside with no sign of an OOM is run once more before its
        config is called infeasible (the first attempt is kept as ``trials/<n>.killed``)."""
        spec = self.spec
        assert spec is not None
        n = trial.number
        for attempt in range(2):
            out = run_trial(cfg, tdir, timeout_s=spec.protocol.trial_timeout_s,
                            heartbeat_timeout_s=spec.protocol.heartbeat_timeout_s, on_window=on_window,
                            on_phase=self._phase(f"trial {n}"), label=f"trial-{n}",
                            on_launch=lambda pgid: trial.set_user_attr("pgid", pgid), env=self._child_env())
            if not out.killed_from_outside or attempt:
                return out
            kept = tdir.with_name(f"{tdir.name}.killed")
            shutil.rmtree(kept, ignore_errors=True)
            tdir.rename(kept)
            trial.set_user_attr("rerun", {"reason": out.failure_reason, "first_attempt_dir": str(kept)})
            self._log(f"trial {n}: {out.failure_reason}; running it once more before blaming its config")
        return out

    def _mark_interrupted(self, trial: optuna.Trial, reason: str | None = None) -> None:
        """Tell a trial that Ctrl-C or SIGTERM (or an error of the tuner's own, ``reason``) stopped FAIL (status
        interrupted: it is re-run on resume), once: more interrupts arriving meanwhile are held off, and a trial
        already finished in the storage is left as it is."""
        study = self.study
        assert study is not None and self.storage is not None
        tdir = self.study_dir / "trials" / str(trial.number)
        with interrupts_held(), contextlib.suppress(Exception):
            if self.storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                return
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("failure_reason", reason or "interrupted (Ctrl-C or SIGTERM of the tuner)")
            trial.set_user_attr("log_tail", read_log_tail(tdir))
            trial.set_user_attr("config_path", str(tdir / "config.yaml"))
            study.tell(trial, state=TrialState.FAIL)

    def _guard_numerics(self, trial: optuna.Trial, params: Mapping[str, Any], cfg: Any, out: TrialOutcome) -> None:
        """The numerics guard (workbench.numerics): a trial that sets a numerics knob off its base value keeps
        status ok only if its last-window loss is within the protocol's tolerance of its twin's; else its status
        becomes ``numerics``. The check is stored as the trial's ``numerics`` user attr."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        base = spec.base_knob_values()
        changed = [k for k in numerics_knobs() if k in params and params[k] != base.get(k)]
        if not changed:
            return
        twin_params = {k: v for k, v in params.items() if k not in changed}
        twin_cfg = merge_overrides(cfg, {get_knob(k).key: base.get(k) for k in changed})
        tol = spec.protocol.numerics_tolerance
        base_losses = [x for x in study.user_attrs.get("baseline_losses", []) if x is not None]
        if base_losses and data_key(twin_cfg) == data_key(spec.measured_base_config()):
            check = check_loss(window_loss(out.last_window), base_losses, tol, source="baseline")
        else:
            twins = dict(study.user_attrs.get("numerics_twins", {}))
            h = config_hash(twin_cfg)
            if h not in twins:
                self._log(f"trial {trial.number}: numerics twin ({', '.join(changed)} at base) on the same data")
                tw = self._measure(twin_cfg, out.trial_dir / "numerics-twin", f"trial-{trial.number}-twin",
                                   f"trial {trial.number} numerics twin")
                if tw.status != "ok" or window_loss(tw.last_window) is None:
                    # no reference: the candidate cannot be shown to train like the base, so it cannot win
                    out.status, out.failure_reason = "numerics", (
                        f"its twin ({', '.join(changed)} at base: {twin_params}) failed ({tw.status}: "
                        f"{tw.failure_reason}), so its loss has no reference")
                    trial.set_user_attr("numerics", {"passed": False, "reference": "twin", "twin_status": tw.status})
                    return
                twins[h] = window_loss(tw.last_window)
                study.set_user_attr("numerics_twins", twins)
            check = check_loss(window_loss(out.last_window), [twins[h]], tol, source="twin")
        trial.set_user_attr("numerics", check.to_dict())
        if not check.passed:
            out.status, out.failure_reason = "numerics", f"{', '.join(f'{k}={params[k]}' for k in changed)}: " \
                + check.reason()

    def _tell(self, trial: optuna.Trial, out: TrialOutcome) -> None:
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        cons = self._constraints(out)
        attrs: dict[str, Any] = {
            "status": out.status, "failure_reason": out.failure_reason, "log_tail": out.log_tail,
            "config_path": str(out.config_path) if out.config_path else "", "trial_dir": str(out.trial_dir),
            "summary": out.summary or {}, "constraint": list(cons.values()), "windows": out.windows,
            "wall_s": round(out.wall_s, 3),
        }
        values: list[float] | None
        state = TrialState.COMPLETE
        mem = out.peak_memory_gib
        if out.status == "ok":
            assert out.value is not None
            values = [out.value] + ([mem if mem is not None else 0.0] if spec.objective.multi_objective else [])
        elif out.status == "pruned":
            values, state = None, TrialState.PRUNED
        elif out.failed:
            values = [0.0] + ([math.inf] if spec.objective.multi_objective else [])
        else:  # interrupted (the child got SIGINT from elsewhere): infrastructure, not the config's fault
            values, state = None, TrialState.FAIL
        try:
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            if state != TrialState.FAIL:
                for k, v in cons.items():
                    trial.set_constraint(k, v)
            study.tell(trial, values, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as e:
            # another process failed it as stale (our heartbeat stalled); it will be re-run
            self._log(f"trial {trial.number}: could not record its result ({e}); it counts as failed")

    def _trial_line(self, trial: optuna.Trial, out: TrialOutcome) -> str:
        base = self.baseline_runs()
        params = ", ".join(f"{k}={v}" for k, v in trial.params.items())
        if out.status == "ok" and out.value is not None:
            sp = f" ({out.value / statistics.median(base):.2f}x)" if base else ""
            return f"trial {trial.number}: {out.value:,.0f} tok/s/gpu{sp} [{params}]"
        return f"trial {trial.number}: {out.status} ({out.failure_reason}) [{params}]"

    def search(self) -> None:
        """Run trials until the budget (exact across processes) or the wall-clock limit is reached."""
        study = self.study
        assert study is not None
        deadline = self._t0 + self.timeout_s if self.timeout_s else None  # wall clock of this process
        waiting_note = False
        while True:
            self._check_lease()
            self._recover_stale()
            counted, running, waiting = self._counts()
            if self.progress is not None:
                self.progress.set(done=self._finished_count(), best=self._best_text())
            # enqueued (WAITING) trials are asked for like new ones; the exact check after ask() decides
            budget_done = self.budget is not None and counted - waiting >= self.budget
            time_done = deadline is not None and time.monotonic() >= deadline
            if budget_done or time_done:
                if self.worker or running == 0:
                    return
                if not waiting_note:
                    self._log(f"waiting for {running} running trial(s) of other workers")
                    waiting_note = True
                if self.progress is not None:
                    self.progress.set(phase=f"waiting for {running} running trial(s)")
                time.sleep(2.0)
                continue
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = study.ask()
            try:
                with self._storage_heartbeat(trial._trial_id):
                    trial.set_user_attr("worker", self.me)
                    if self.budget is not None:
                        earlier = sum(t.state in COUNTED_STATES for t in self._trials() if t.number < trial.number)
                        if earlier >= self.budget:
                            trial.set_user_attr("status", "skipped_budget")
                            trial.set_user_attr("failure_reason", f"budget of {self.budget} trials already taken")
                            study.tell(trial, state=TrialState.FAIL)
                            if self.worker:
                                return
                            continue
                    out = self.run_one(trial)
            except BaseException as e:  # wherever it landed, the asked trial does not stay RUNNING
                self._mark_interrupted(trial, None if isinstance(e, KeyboardInterrupt) else
                                       f"the tuner stopped: {type(e).__name__}: {e}")
                raise
            self._log(self._trial_line(trial, out))

    # ------------------------------------------------------------------ validation
    def candidates(self) -> tuple[list[FrozenTrial], list[dict[str, Any]]]:
        """Top-k distinct feasible trials (by search throughput) to validate, and those skipped with why."""
        spec = self.spec
        assert spec is not None
        base_hash = config_hash(spec.export_config({}))
        base = self.baseline_runs()
        base_median = statistics.median(base) if base else 0.0
        pool = self._trials((TrialState.COMPLETE,))
        if spec.objective.multi_objective:
            assert self.study is not None
            front = {t.number for t in self.study.best_trials}  # the feasible Pareto front
            pool = [t for t in pool if t.number in front]
        # by throughput (objective 0); in multi-objective studies, among the Pareto front
        ok = sorted((t for t in pool if _feasible(t)), key=lambda t: (-t.values[0], t.number))
        out: list[FrozenTrial] = []
        skipped: list[dict[str, Any]] = []
        seen = {base_hash}
        for t in ok:
            if len(out) >= spec.protocol.top_k:
                break
            try:
                h = config_hash(spec.export_config(t.params))
            except ConfigError:
                continue
            if h == base_hash:
                skipped.append({"trial": t.number, "reason": "same config as the baseline"})
                continue
            if h in seen:
                continue  # same params as a better-ranked trial
            seen.add(h)
            if t.values[0] <= base_median:
                skipped.append({"trial": t.number, "reason": f"search throughput {t.values[0]:,.0f} not above the "
                                f"baseline median {base_median:,.0f}"})
                continue
            out.append(t)
        return out, skipped

    def validate(self) -> dict[str, Any]:
        """Interleaved A/B re-measurement of the candidates; writes and returns validation.json.

        validation.json: {baseline_runs (the baseline repeats), noise_floor, method, confidence,
        candidates: [{trial, params, search_value, runs, baseline_runs, ratios, run_dirs,
        baseline_dirs, failures, numerics, speedup_median, ci_low, ci_high, significant}], skipped,
        winner: {trial or null, significant, speedup_median, ci_low, ci_high}, complete, finished}.
        Runs: ``validation/baseline-<trial>-<round>/`` then ``validation/trial-<trial>-<round>/``
        for each round, candidates interleaved within the round.
        """
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        cands, skipped = self.candidates()
        path = self.study_dir / "validation.json"
        rounds = spec.protocol.ab_rounds
        with contextlib.suppress(OSError, json.JSONDecodeError):
            old = json.loads(path.read_text())
            if (old.get("complete") and [c["trial"] for c in old.get("candidates", [])] == [t.number for t in cands]
                    and old.get("ab_rounds") == rounds and old.get("storage_url") == self.storage_url):
                self._log("validation: reusing validation.json (same candidates)")
                return old
        base_cfg = spec.measured_base_config()
        results = {t.number: {"trial": t.number, "params": dict(t.params), "search_value": t.values[0], "runs": [],
                              "baseline_runs": [], "run_dirs": [], "baseline_dirs": [], "failures": [],
                              "numerics": t.user_attrs.get("numerics")}
                   for t in cands}
        vdir = self.study_dir / "validation"
        if cands:
            self._log(f"validating {len(cands)} candidate(s) against the baseline, {rounds} A/B pairs each: "
                      + ", ".join(f"#{t.number}" for t in cands))
        settled: set[int] = set()  # sequential A/B: candidates whose interval already excludes 1.0
        min_rounds = spec.protocol.ab_min_rounds
        for r in range(rounds):
            for t in cands:
                res = results[t.number]
                if t.number in settled:
                    continue
                self._check_lease()
                prefix = f"validating #{t.number} round {r + 1}/{rounds}"
                a = self._measure(base_cfg, vdir / f"baseline-{t.number}-{r}", f"baseline-{t.number}-{r}",
                                  prefix + " (baseline)")
                b = self._measure(spec.trial_config(t.params), vdir / f"trial-{t.number}-{r}",
                                  f"trial-{t.number}-{r}", prefix)
                if a.status == "ok" and b.status == "ok" and a.value and b.value:
                    res["runs"].append(b.value)
                    res["baseline_runs"].append(a.value)
                    res["run_dirs"].append(str(b.trial_dir))
                    res["baseline_dirs"].append(str(a.trial_dir))
                else:
                    res["failures"].append({"round": r, "baseline": a.status, "candidate": b.status,
                                            "reason": a.failure_reason or b.failure_reason})
                if min_rounds is not None and len(res["runs"]) >= min_rounds:
                    iv = speedup_interval(pair_ratios(res["runs"], res["baseline_runs"]))
                    if iv.low > 1.0 or iv.high < 1.0:
                        settled.add(t.number)
                        self._log(f"candidate #{t.number}: interval [{iv.low:.3f}, {iv.high:.3f}] excludes 1.0 "
                                  f"after {len(res['runs'])} pairs; its validation stops")
        candidates = []
        for t in cands:
            res = results[t.number]
            if res["runs"]:
                ratios = pair_ratios(res["runs"], res["baseline_runs"])
                iv = speedup_interval(ratios)
                res.update(ratios=ratios, speedup_median=iv.median, ci_low=_finite_or_none(iv.low),
                           ci_high=_finite_or_none(iv.high), significant=iv.significant)
            else:
                res.update(ratios=[], speedup_median=None, ci_low=None, ci_high=None, significant=False)
            candidates.append(res)
            ci = (f"[{res['ci_low']:.3f}, {res['ci_high']:.3f}]" if res["ci_low"] is not None
                  and res["ci_high"] is not None else "[n/a]")
            sp = f"{res['speedup_median']:.3f}x" if res["speedup_median"] is not None else "n/a"
            self._log(f"candidate #{t.number}: speedup {sp}, 95% interval {ci} over {len(res['ratios'])} pairs"
                      + (" (significant)" if res["significant"] else " (not significant)"))
        sig = [c for c in candidates if c["significant"]]
        if sig:
            w = max(sig, key=lambda c: c["speedup_median"])
            winner = {"trial": w["trial"], "significant": True, "speedup_median": w["speedup_median"],
                      "ci_low": w["ci_low"], "ci_high": w["ci_high"]}
        else:
            winner = {"trial": None, "significant": False, "speedup_median": None, "ci_low": None, "ci_high": None}
        base = self.baseline_runs()
        data = {
            "study_name": self.study_name, "storage_url": self.storage_url, "baseline_runs": base,
            "noise_floor": noise_floor(base).to_dict() if base else None, "method": "t-interval on log ratios",
            "confidence": 0.95, "ab_rounds": rounds, "candidates": candidates, "skipped": skipped,
            "winner": winner, "complete": True, "finished": _now(),
        }
        write_json(path, data)
        return data

    # ------------------------------------------------------------------ the whole run
    def _earlier_sessions(self) -> list[dict[str, Any]]:
        """The coordinator runs recorded by an earlier tune.json of this study directory (a resume); none when
        there is no such file or it cannot be read (the report then counts this run alone)."""
        try:
            prev = json.loads((self.study_dir / "tune.json").read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(prev, dict) or prev.get("study_name") != self.study_name:
            return []
        sessions = prev.get("sessions")
        if isinstance(sessions, list):
            return [s for s in sessions if isinstance(s, dict) and isinstance(s.get("started"), str)]
        # a tune.json written before sessions were recorded: its one run
        return [{"started": prev["started"], "finished": prev.get("finished")}] \
            if isinstance(prev.get("started"), str) else []

    def _write_tune_json(self, started: str, finished: str | None) -> None:
        assert self.spec is not None and self.study is not None
        if self._sessions is None:
            self._sessions = self._earlier_sessions()
            self._sessions.append({"started": started, "finished": None})
        self._sessions[-1] = {"started": started, "finished": finished}
        write_json(self.study_dir / "tune.json", {
            "study_name": self.study_name, "storage_url": self.storage_url, "spec": self.spec.to_dict(),
            "active_knobs": self.active, "dropped_knobs": self.dropped, "hardware": self.hardware,
            "budget_trials": self.budget, "noise_floor": self.study.user_attrs.get("noise_floor"),
            "started": self._sessions[0]["started"], "finished": finished,
            "sessions": self._sessions, "wall_s": sessions_wall_s(self._sessions),
        })

    def run(self) -> dict[str, Any] | None:
        """Coordinator: baseline, search, validation, export, report. Worker: search only.

        Returns validation.json's content (None for a worker). KeyboardInterrupt propagates after the
        running trial is marked FAIL.
        """
        started = _now()
        self._t0 = time.monotonic()
        self._sessions = None  # read from an earlier tune.json at the first write
        self.study_dir.mkdir(parents=True, exist_ok=True)
        if self.study is None:
            self.open()
        assert self.spec is not None
        if self.dropped:
            print(format_dropped(_as_dropped(self.dropped)), file=sys.stderr, flush=True)
        role = "worker" if self.worker else "coordinator"
        print(f"study {self.study_name} ({role}): searching {', '.join(self.active)}; budget "
              f"{self.budget if self.budget is not None else 'unlimited'} trials"
              + (f", {self.timeout_s:g} s" if self.timeout_s else "") + f"; storage {self.storage_url}",
              file=sys.stderr, flush=True)
        self.progress = _Progress(self.budget, self.study_name, self.progress_enabled)
        try:
            if not self.worker:
                self._remove_stale_attempts()
                self._write_tune_json(started, None)
                self.run_baseline()
                self._write_tune_json(started, None)
            self.search()
            if self.worker:
                self.progress.set(phase="done")
                return None
            self.progress.set(phase="validating")
            validation = self.validate()
            self.progress.set(phase="exporting")
            path = export_config(self.spec, self.study_dir, validation, study_name=self.study_name,
                                 baseline_runs=self.baseline_runs(),
                                 launch_record=_winner_launch_record(self.study, validation))
            self._write_tune_json(started, _now())
            if self.make_report:
                self.progress.set(phase="report")
                build_report(self.study_dir, self.storage_url, self.study_name)
            self.progress.set(phase="done")
        finally:
            self.progress.close()
            with interrupts_held():
                self._release_lease()  # the same command may resume at once
        self._print_result(validation, path)
        return validation

    def _print_result(self, validation: Mapping[str, Any], path: Path) -> None:
        base = self.baseline_runs()
        nf = noise_floor(base) if base else None
        w = validation["winner"]
        lines = []
        if nf:
            lines.append(f"baseline: median {nf.median:,.0f} tok/s/gpu, noise spread {nf.rel_spread:.1%} (cv {nf.cv:.1%})")
        if w["trial"] is not None:
            cand = next(c for c in validation["candidates"] if c["trial"] == w["trial"])
            lines.append(f"winner: trial #{w['trial']} {cand['params']}: speedup {w['speedup_median']:.3f}x, "
                         f"95% interval [{w['ci_low']:.3f}, {w['ci_high']:.3f}]")
        else:
            best = max((c for c in validation["candidates"] if c.get("speedup_median")),
                       key=lambda c: c["speedup_median"], default=None)
            extra = ""
            if best is not None:
                lo, hi = best["ci_low"], best["ci_high"]
                ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
                extra = f" (best candidate #{best['trial']}: {best['speedup_median']:.3f}x, 95% interval {ci})"
            lines.append(f"no significant gain{extra}: exported the baseline config")
        lines.append(f"config: {path}")
        if self.make_report:
            lines.append(f"report: {self.study_dir / 'report.html'}")
        print("\n".join(lines), flush=True)


def _as_dropped(items: Sequence[Mapping[str, str]]) -> list[Any]:
    from workbench.knobs import DroppedKnob

    return [DroppedKnob(d["knob"], d["reason"]) for d in items]


def _spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Top-level spec keys that differ, ignoring the budget (it may be extended on resume)."""
    keys = sorted(set(old) | set(new))
    return [k for k in keys if k not in ("budget",) and json.dumps(old.get(k), sort_keys=True, default=str)
            != json.dumps(new.get(k), sort_keys=True, default=str)]


# --------------------------------------------------------------------------- report


def build_report(study_dir: Path, storage_url: str, study_name: str) -> Path:
    """``reports.build_report`` when the reports package provides it, else a minimal self-contained page."""
    study_dir = Path(study_dir)
    fn = None
    try:
        import reports

        fn = getattr(reports, "build_report", None)
    except Exception as e:  # noqa: BLE001 - a broken optional package must not lose the study's result
        print(f"reports unavailable ({type(e).__name__}: {e}); writing a minimal report", file=sys.stderr)
    if callable(fn):
        try:
            return Path(fn(study_dir, storage_url, study_name))
        except Exception as e:  # noqa: BLE001
            print(f"reports.build_report failed ({type(e).__name__}: {e}); writing a minimal report", file=sys.stderr)
    return _minimal_report(study_dir, storage_url, study_name)


def _minimal_report(study_dir: Path, storage_url: str, study_name: str) -> Path:
    """One HTML page: noise floor, validation and winner, and a table of every trial."""
    esc = html.escape
    storage = make_storage(storage_url)
    study = optuna.load_study(study_name=study_name, storage=storage)
    val: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        val = json.loads((study_dir / "validation.json").read_text())
    tune: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        tune = json.loads((study_dir / "tune.json").read_text())
    nf = study.user_attrs.get("noise_floor") or {}
    parts = [f"<h1>Study {esc(study_name)}</h1>"]
    if nf:
        parts.append(f"<p>Baseline: median {nf['median']:,.0f} tokens/s/GPU over {nf['n']} runs; spread "
                     f"{nf['rel_spread']:.1%}, cv {nf['cv']:.1%}.</p>")
    dropped = tune.get("dropped_knobs") or study.user_attrs.get("dropped_knobs") or []
    if dropped:
        parts.append("<p>Dropped for this hardware: " + esc(", ".join(f"{d['knob']} ({d['reason']})"
                                                                     for d in dropped)) + "</p>")
    w = val.get("winner") or {}
    if w.get("trial") is not None:
        parts.append(f"<h2>Winner: trial {w['trial']}</h2><p>speedup {w['speedup_median']:.3f}x, 95% interval "
                     f"[{w['ci_low']:.3f}, {w['ci_high']:.3f}]</p>")
    elif val:
        parts.append("<h2>No significant gain</h2><p>The baseline config was exported.</p>")
    if val.get("candidates"):
        rows = "".join(
            f"<tr><td>{c['trial']}</td><td>{esc(json.dumps(c['params']))}</td>"
            f"<td>{_fmt(c.get('speedup_median'), '.3f')}</td><td>{_fmt(c.get('ci_low'), '.3f')}</td>"
            f"<td>{_fmt(c.get('ci_high'), '.3f')}</td><td>{c.get('significant')}</td></tr>"
            for c in val["candidates"])
        parts.append("<h2>Validation (A/B)</h2><table><tr><th>trial</th><th>params</th><th>speedup</th>"
                     f"<th>ci low</th><th>ci high</th><th>significant</th></tr>{rows}</table>")
    rows = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        value = t.values[0] if t.values else None
        rows.append(f"<tr><td>{t.number}</td><td>{t.state.name}</td><td>{esc(str(ua.get('status', '')))}</td>"
                    f"<td>{_fmt(value, ',.0f')}</td><td>{esc(json.dumps(t.params))}</td>"
                    f"<td>{esc(str(ua.get('failure_reason', '')))}</td></tr>")
    parts.append("<h2>Trials</h2><table><tr><th>#</th><th>state</th><th>status</th><th>tokens/s/GPU</th>"
                 f"<th>params</th><th>failure</th></tr>{''.join(rows)}</table>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>" + esc(study_name) + "</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style></head><body>"
            + "".join(parts) + "</body></html>\n")
    path = study_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else ""


# --------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=("tune", "export", "report"), default="tune",
                   help="tune (default): run or resume the study; export / report: on an existing study")
    p.add_argument("--study", help=f"built-in study name or spec file (default {DEFAULT_STUDY}; a worker "
                   "without it reads the spec from the storage)")
    p.add_argument("--trials", type=int, help="trial budget (overrides the spec)")
    p.add_argument("--timeout", type=float, help="wall-clock limit of the search in this process, seconds")
    p.add_argument("--storage", help="Optuna storage URL (default sqlite:///<out>/<study>/study.db)")
    p.add_argument("--study-name", help="Optuna study name and runs/ directory (default: the spec's name)")
    p.add_argument("--gpus", type=int, help="GPUs per trial (overrides the spec)")
    p.add_argument("--out", default="runs", help="directory of study outputs (default runs/)")
    p.add_argument("--worker", action="store_true", help="only run search trials of an existing or shared study")
    p.add_argument("--no-report", action="store_true", help="do not build report.html")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one line per trial still)")
    p.add_argument("--debug", action="store_true", help="on an error, print the traceback after its line")
    args = p.parse_args(argv)
    if args.trials is not None and args.trials < 1:
        p.error("--trials must be >= 1")
    if args.gpus is not None and args.gpus < 1:
        p.error("--gpus must be >= 1")
    if args.timeout is not None and args.timeout <= 0:
        p.error("--timeout must be > 0")
    return args


def _resolve_spec(args: argparse.Namespace) -> StudySpec | None:
    if args.study is None and args.worker and args.study_name:
        return None  # read from the storage
    spec = load_study_spec(args.study or DEFAULT_STUDY)
    if args.gpus is not None and args.gpus != spec.gpus:
        spec = replace(spec, gpus=args.gpus)
    return spec


def _resume_hint() -> str:
    return "python -m workbench.tune " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _existing(args: argparse.Namespace) -> tuple[StudySpec, str, Path, str]:
    """Spec, study name, study dir and storage URL of an existing study (export/report)."""
    spec = _resolve_spec(args)
    name = args.study_name or (spec.name if spec else None)
    if name is None:
        raise TuneError("give --study or --study-name")
    study_dir = Path(args.out).resolve() / name
    url = normalize_storage_url(args.storage or default_storage_url(study_dir))
    if args.storage is None and not (study_dir / "study.db").exists():
        raise TuneError(f"no study at {study_dir / 'study.db'}; run `python -m workbench.tune` first")
    storage = make_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise TuneError(f"no study {name!r} in {url}") from None
    stored = study.user_attrs.get("spec")
    if stored:
        spec = spec_from_dict(stored, source=f"{url} (study {name})")
    if spec is None:
        raise TuneError(f"study {name!r} has no stored spec; give --study")
    return spec, name, study_dir, url


def _winner_launch_record(study: optuna.Study, validation: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The Triton launch record of the validated winner's search trial (its summary's ``kernels/launch``)."""
    winner = (validation or {}).get("winner") or {}
    if winner.get("trial") is None or not winner.get("significant"):
        return None
    try:
        trial = study.trials[int(winner["trial"])]
    except (IndexError, ValueError, TypeError):
        return None
    return ((trial.user_attrs.get("summary") or {}).get("kernels/launch")) or None


def cmd_export(args: argparse.Namespace) -> int:
    spec, name, study_dir, url = _existing(args)
    study = optuna.load_study(study_name=name, storage=make_storage(url))
    base = list(study.user_attrs.get("baseline_runs", []))
    vpath = study_dir / "validation.json"
    if vpath.exists():
        validation = json.loads(vpath.read_text())
    else:
        print(f"{vpath} missing (the study was not validated): exporting the baseline config; finish the study "
              f"with `python -m workbench.tune --study {args.study or name}` to validate candidates",
              file=sys.stderr)
        validation = {"baseline_runs": base, "candidates": [], "winner": {"trial": None, "significant": False}}
    path = export_config(spec, study_dir, validation, study_name=name, baseline_runs=base,
                         launch_record=_winner_launch_record(study, validation))
    print(path)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    _spec, name, study_dir, url = _existing(args)
    print(build_report(study_dir, url, name))
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    spec = _resolve_spec(args)
    tuner = Tuner(spec, study_name=args.study_name, out_root=args.out, storage_url=args.storage, trials=args.trials,
                  timeout_s=args.timeout, worker=args.worker, report=not args.no_report,
                  progress=not args.no_progress)
    try:
        tuner.run()
    except KeyboardInterrupt:
        ignore_interrupts()  # the rest of a burst of Ctrl-Cs changes nothing
        print(f"\ninterrupted: the running trial was stopped and marked FAIL (status interrupted); finished "
              f"trials are kept in {tuner.storage_url}.\nResume with: {_resume_hint()}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _environment_error(e: BaseException, args: argparse.Namespace) -> str:
    """One line for a filesystem or storage fault: the path or database, what went wrong, what to do."""
    if isinstance(e, OSError):
        where = e.filename or args.out
        return (f"{where}: {e.strerror or e}; the study's files go under --out {args.out!r}: give a writable "
                f"directory (rerun with --debug for the traceback)")
    orig = getattr(e, "orig", None) or getattr(e, "__cause__", None) or e
    reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if args.storage:
        import sqlalchemy.engine

        try:
            where = sqlalchemy.engine.make_url(normalize_storage_url(args.storage)).render_as_string(
                hide_password=True)
        except Exception:  # noqa: BLE001 - the URL was accepted before; name it as given
            where = "--storage"
    else:
        name = args.study_name or (Path(args.study).stem if args.study else DEFAULT_STUDY)
        where = str(Path(args.out).resolve() / name / "study.db")
    return (f"{where}: the study storage cannot be used ({reason}); if it is damaged, move it aside and start "
            f"the study again, or give another --out / --storage (rerun with --debug for the traceback)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prev = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # `kill` stops as cleanly as Ctrl-C
    try:
        if args.command == "export":
            return cmd_export(args)
        if args.command == "report":
            return cmd_report(args)
        return cmd_tune(args)
    except (TuneError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_USAGE if isinstance(e, ConfigError) else EXIT_ERROR
    except (OSError, sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        print(f"error: {_environment_error(e, args)}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_USAGE
    finally:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is _raise_keyboard_interrupt:
            signal.signal(signal.SIGTERM, prev)


if __name__ == "__main__":
    sys.exit(main())
