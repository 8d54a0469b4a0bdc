"""The ``Tuner``: one run of a study, as coordinator (baseline, search, validation, export, report) or as a worker
(search trials only), resumable from its Optuna storage. docs/tuner.md describes the run, the records it writes
and how it resumes; ``python -m workbench.tune`` (``__main__``) is its CLI."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from workbench.config import ConfigError, config_hash
from workbench.errors import TuneError
from workbench.files import check_name, remove_tree
from workbench.train.memory_model import predicted_oom
from workbench.tune.export import export_config
from workbench.tune.knobs import DroppedKnob, detect_capabilities, drop_unsupported, format_dropped
from workbench.tune.lease import LEASE_ATTR, CoordinatorLease
from workbench.tune.measure import Measurement
from workbench.tune.preflight import preflight
from workbench.tune.progress import Progress
from workbench.tune.profiled import ProfileLed
from workbench.tune.records import StudyRecords, sessions_wall_s
from workbench.tune.result import data_source, describe_data, result_headline
from workbench.tune.samplers import CONSTRAINTS, infeasible, make_sampler, untried_config
from workbench.tune.stats import noise_floor
from workbench.tune.storage import (HEARTBEAT_INTERVAL_S, alive, default_storage_url, make_storage, mask_url,
                                    normalize_storage_url, proc_identity, proc_start)
from workbench.tune.spaces import fit_micro_batches
from workbench.tune.study import KnobRange, StudySpec, spec_from_dict
from workbench.tune.trial import (Launcher, TrialOutcome, command_launcher, interrupts_held, launch_command,
                                  not_launched_outcome, read_log_tail, run_trial)
from workbench.tune.validation import Validation, is_feasible, now_iso
from workbench.vocab import REAL_TOKENS_PER_S
from workbench.tune.verify import Verification

__all__ = ["Tuner", "winner_launch_record"]


COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
"""Trial states that use up the budget, with a FAIL whose config failed (``samplers.infeasible``); a FAIL stopped
from outside (interrupted, stale, over the budget) does not."""


def counts(t: FrozenTrial) -> bool:
    """Whether a trial uses up the budget: a repeat of a measured config does not while untried configs remain
    (``free_repeat``: the tuner queued an untried one in its place)."""
    if t.user_attrs.get("free_repeat"):
        return False
    return t.state in COUNTED_STATES or infeasible(t)


MAX_ENUMERATED = 4096
"""Largest finite space whose configs the tuner lists (to queue an untried one in place of a repeat)."""


def flat_attrs(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run summary's numbers as flat trial attributes that Optuna's tools can sort and plot: each numeric
    metric under its own name, each phase's seconds per step as ``phase/<name>_s``."""
    out = {k: float(v) for k, v in summary.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    for name, v in (summary.get("phase_s_per_step") or {}).items():
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[f"phase/{name}_s"] = float(v)
    return out


_STUDY_WAIT_S = 300  # a worker started before its coordinator waits this long for the study





class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, without its end-of-grid ``study.stop()``: that call only works inside
    ``study.optimize`` and raises under ask/tell (after the last grid point was stored), which is how the
    tuner drives trials. The study's trial budget ends the search instead (set it to the grid's size)."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        return None


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def _outcome_of(t: FrozenTrial) -> TrialOutcome:
    """A finished trial's outcome as it was told (for a later trial of the same config)."""
    a = t.user_attrs
    windows = a.get("windows")  # the summary's flat keys are stored over it: its count of windows, there
    return TrialOutcome(a.get("status", "ok"), Path(a.get("trial_dir", "")),
                        Path(a["config_path"]) if a.get("config_path") else None,
                        list(windows) if isinstance(windows, list) else [],
                        t.values[0] if t.state == TrialState.COMPLETE and t.values else None, a.get("summary"),
                        a.get("failure_reason", ""), a.get("log_tail", ""), wall_s=0.0)


class Tuner(CoordinatorLease, Measurement, Validation, Verification, StudyRecords):
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
        self.spec = spec
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
        self._launch = launch  # builds each trial's command line; None: the built-in loop or the spec's command
        # asked before a spec that did not come from the user's own file runs its trainer.command (the CLI asks the
        # user, or takes --yes); raising TuneError refuses it
        self.confirm = confirm
        # --reset: asked (with what would be deleted) before a study with measurements is started over; raising
        # TuneError refuses it. None: such a study is never deleted
        self.reset = reset
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "start": proc_start(os.getpid()),
                   "role": "worker" if worker else "coordinator"}
        self.storage: optuna.storages.RDBStorage | None = None
        self.study: optuna.Study | None = None
        self.active: list[str] = []
        self.dropped: list[dict[str, str]] = []
        self.budget: int | None = None
        self.progress: Progress | None = None
        self._base_values: dict[str, Any] | None = None
        self._t0 = time.monotonic()
        self._sessions: list[dict[str, Any]] | None = None  # tune.json's coordinator runs, this one last
        self.hardware: dict[str, Any] = {}
        self._attempt_id = os.urandom(4).hex()  # names this process's measurement folders
        self._lease_token = f"{self.me['host']}:{self.me['pid']}:{self._attempt_id}"
        self._lease_stop: threading.Event | None = None
        self._lease_study: optuna.Study | None = None
        self._lease_lost: str | None = None
        self._gpu_note = False  # the GPU-minute budget's line was printed

    # ------------------------------------------------------------------ setup
    @property
    def launch(self) -> Launcher:
        """Each trial's command line: the one given, else the spec's own ``trainer.command``, else
        ``python -m workbench.train``."""
        if self._launch is not None:
            return self._launch
        if self.spec is not None and self.spec.trainer is not None:
            return command_launcher(self.spec.trainer.command)
        return launch_command

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
                    return spec_from_dict(data, source=f"{self.storage_shown} (study {self.study_name})")
            except KeyError:
                pass
            if time.monotonic() > deadline:
                raise TuneError(f"no study {self.study_name!r} with a spec in {self.storage_shown} after "
                                f"{_STUDY_WAIT_S} s; start the coordinator, or give --study")
            time.sleep(2)

    def open(self) -> optuna.Study:
        """Open (or create) the Optuna study and settle the search space and budget."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = make_storage(self.storage_url)
        from_storage = self.spec is None
        if from_storage:
            self.spec = self._load_stored_spec()
        spec = self.spec
        if spec.trainer is not None and self.confirm is not None and (from_storage or not _users_own_file(spec.source)):
            self.confirm(spec)
        directions = ["maximize", "minimize"] if spec.objective.multi_objective else ["maximize"]
        caps = detect_capabilities(spec.gpus)
        kept, dropped = drop_unsupported(list(spec.space), caps)
        if not self.worker:
            self._start_over_if_changed(spec.to_dict())
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
            if diff:  # a worker's spec (a coordinator's was settled by _start_over_if_changed)
                raise TuneError(
                    f"study {self.study_name!r} in {self.storage_shown} was created from a different spec "
                    f"(differs in: {', '.join(diff)}); use another --study-name, or start the coordinator with "
                    f"this spec and --reset")
        self._settle_space(attrs, kept, dropped)
        if not self.worker and not study.metric_names:
            # the objective's name as Optuna's tools show it (the dashboard, `optuna trials`)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([REAL_TOKENS_PER_S, "memory/peak_gib"][:len(directions)])
        if not self.worker or stored_spec is None:
            study.set_user_attr("spec", mine)
            study.set_user_attr("active_knobs", self.active)
            study.set_user_attr("dropped_knobs", self.dropped)
        self._settle_budget(attrs)
        self.hardware = _hardware(caps, spec.gpus)
        if not self.worker:
            study.set_user_attr("budget_trials", self.budget)
            study.set_user_attr("budget_gpu_minutes", self.gpu_minutes)
            study.set_user_attr("hardware_key", self._hardware_key())
            self._warm_start(study)
            self._enqueue_seeds(study)
        if self.budget is None and self.timeout_s is None and self.gpu_minutes is None:
            raise TuneError("no budget: give --trials, --timeout or --gpu-minutes, or set budget in the study spec")
        if not self.active:
            raise TuneError(f"nothing to search on this hardware: {format_dropped(dropped)}")
        self._fit_micro_batches(study, attrs)
        # reload with the real sampler and pruner (create_study needed a sampler to exist)
        trials_before = sum(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))
        study = optuna.load_study(study_name=self.study_name, storage=self.storage,
                                  sampler=self._sampler(trials_before), pruner=self._pruner())
        self.study = study
        return study

    def _settle_space(self, attrs: Mapping[str, Any], kept: list[str], dropped: list[DroppedKnob]) -> None:
        """The knobs searched: a stored study's own (its space does not change with the machine; one warning for
        those this machine cannot act on), else the spec's less those this machine dropped."""
        if "active_knobs" in attrs:
            self.active = list(attrs["active_knobs"])
            self.dropped = list(attrs.get("dropped_knobs", []))
            mine_lost = [d.knob for d in dropped if d.knob in self.active]
            if mine_lost:
                warnings.warn(f"this machine cannot act on {', '.join(mine_lost)}, which the study searches; "
                              "its trials here measure them without effect", stacklevel=3)
        else:
            self.active = kept
            self.dropped = [d.to_dict() for d in dropped]

    def _settle_budget(self, attrs: Mapping[str, Any]) -> None:
        """The trial budget (--trials, else a worker takes the coordinator's, else the spec's) and a worker's
        GPU-minute budget (the coordinator's)."""
        assert self.spec is not None
        if self.trials_override is not None:
            self.budget = self.trials_override
        elif self.worker and "budget_trials" in attrs:
            self.budget = attrs["budget_trials"]
        else:
            self.budget = self.spec.budget.trials
        if self.gpu_budget_override is None and self.worker and "budget_gpu_minutes" in attrs:
            self.gpu_budget_override = attrs["budget_gpu_minutes"]

    def _fit_micro_batches(self, study: optuna.Study, attrs: Mapping[str, Any]) -> None:
        """Bound the space's micro_batch_size by the memory model on this GPU (``workbench.tune.spaces``), with one
        line for the choices dropped. The study keeps the bound it was first opened with (its trials' distribution
        must not change)."""
        spec = self.spec
        assert spec is not None
        rng = spec.space.get("micro_batch_size")
        if rng is None or spec.trainer is not None:  # a loop of one's own finds its own limit
            return
        choices = rng.grid("int")
        if "micro_batch_fit" in attrs:
            kept = list(attrs["micro_batch_fit"])
        else:
            lean = {n: spec.space[n].grid(spec.knob(n).kind) for n in ("activation_checkpointing", "loss_backend")
                    if n in spec.space}
            kept, line = fit_micro_batches(spec.base_config(), choices, lean, self.hardware.get("gpu_memory_gib"))
            if line:
                self._log(line)
            if not kept:
                raise TuneError(f"nothing to search: {line}")
            if not self.worker:
                study.set_user_attr("micro_batch_fit", kept)
        if kept != choices:
            spec.space["micro_batch_size"] = KnobRange(choices=kept)

    def _start_over_if_changed(self, mine: Mapping[str, Any]) -> None:
        """A coordinator on a stored study: where the spec changed and nothing was measured yet (no baseline run,
        no finished trial: a first run that failed, say on a refused model or a wrong data folder), the study
        starts over in the same folder, with one line. With measurements it is refused, unless ``reset`` (the
        CLI's --reset) confirms; with ``reset`` an unchanged study starts over too, after the same question. A
        study another coordinator holds is never deleted."""
        assert self.storage is not None
        try:
            old = optuna.load_study(study_name=self.study_name, storage=self.storage,
                                    sampler=optuna.samplers.RandomSampler(0))
        except KeyError:
            return  # a new study
        stored = old.user_attrs.get("spec")
        diff = _spec_diff(stored, mine) if stored is not None else []
        if not diff and self.reset is None:
            return
        finished = [t for t in old.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                    or infeasible(t)]
        measured = len(old.user_attrs.get("baseline_runs") or []) + len(finished)
        what = (f"study {self.study_name!r} in {self.storage_shown}"
                + (f" was created from a different spec (differs in: {', '.join(diff)})" if diff else ""))
        if measured:
            if self.reset is None:
                raise TuneError(f"{what}; it holds {measured} measurement(s); use another --study-name, or pass "
                                "--reset to delete them and start it over in place")
            self.reset(f"{what}; it holds {measured} measurement(s) ({len(finished)} finished trial(s)): delete "
                       f"them and start it over in {self.study_dir}?")
        lease = old.user_attrs.get(LEASE_ATTR)
        if self._lease_is_live(lease):
            raise TuneError(f"study {self.study_name!r} is being run by another coordinator, "
                            f"{self._lease_holder(lease)}; it is not started over")
        optuna.delete_study(study_name=self.study_name, storage=self.storage)
        self._clear_study_dir()
        print(f"{what}{'' if diff else ' is reset'}; {'nothing was measured in it: ' if not measured else ''}"
              f"starting it over in {self.study_dir}", file=sys.stderr, flush=True)

    def _clear_study_dir(self) -> None:
        """The study folder without the outputs of the study just deleted: the storage's own files (study.db)
        and the compile cache (a cache keyed by what it compiled) stay."""
        if not self.study_dir.is_dir():
            return
        for child in self.study_dir.iterdir():
            if child.name.startswith("study.db") or child.name == "compile-cache":
                continue
            if child.is_dir() and not child.is_symlink():
                remove_tree(child)
            else:
                child.unlink(missing_ok=True)

    def _hardware_key(self) -> dict[str, Any]:
        """What makes two studies' measurements comparable: the device model, the GPUs a trial holds."""
        return {"device": self.hardware.get("gpu") or "cpu", "gpus": self.hardware.get("gpus")}

    def _warm_start(self, study: optuna.Study) -> None:
        """A new study's first trial, once: the validated winner (else the fastest feasible trial) of the best
        earlier study in the same storage of the same model on the same hardware (``_hardware_key``), its values
        kept where this study searches them and holds them (the sampler picks the rest). Nothing when no such
        study exists or this one already holds trials."""
        spec = self.spec
        assert spec is not None and self.storage is not None
        if "warm_start" in study.user_attrs or study.get_trials(deepcopy=False):
            return
        mine = self._hardware_key()
        best: tuple[float, str, int, dict[str, Any]] | None = None
        for summary in optuna.get_all_study_summaries(self.storage, include_best_trial=False):
            a = summary.user_attrs
            if summary.study_name == self.study_name or (a.get("spec") or {}).get("model") != spec.model \
                    or a.get("hardware_key") != mine:
                continue
            other = optuna.load_study(study_name=summary.study_name, storage=self.storage,
                                      sampler=optuna.samplers.RandomSampler(0))
            ok = [t for t in other.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible(t)]
            exported = a.get("result/exported_trial")
            pick = next((t for t in ok if t.number == exported), None) or max(ok, key=lambda t: t.values[0],
                                                                               default=None)
            if pick is not None and (best is None or pick.values[0] > best[0]):
                best = (pick.values[0], summary.study_name, pick.number, dict(pick.params))
        if best is None:
            study.set_user_attr("warm_start", None)
            return
        value, name, number, params = best
        kept = {k: v for k, v in params.items() if k in self.active and k in spec.space
                and spec.space[k].contains(v, spec.knob(k).kind)}
        study.enqueue_trial(kept, user_attrs={"warm_start": {"study": name, "trial": number}})
        study.set_user_attr("warm_start", {"study": name, "trial": number, "params": kept})
        self._log(f"warm start: trial {number} of study {name} (same model and {mine['device']}; {value:,.0f} "
                  f"tok/s/gpu there) runs first ({_params_text(kept) or 'the base config'})")

    def screening_record(self) -> dict[str, Any]:
        """tune.json's ``screening``: how many search trials each stage of the protocol saw (``stages``: trials that
        measured at least that many windows; the first is the screen, the last the full protocol), the configs
        refused before any run (the memory model, a config error), repeats answered from an earlier trial, and
        configs evaluated (screened or refused) per GPU-minute of the study."""
        spec = self.spec
        assert spec is not None
        trials = [t for t in self._trials() if t.state not in (TrialState.WAITING, TrialState.RUNNING)]
        own = [t for t in trials if "duplicate_of" not in t.user_attrs]
        windows, eta = spec.protocol.windows, spec.pruner.reduction_factor
        marks = {1, windows}
        if spec.pruner.screens:
            r = 1
            while r < windows:
                marks.add(r)
                r *= eta
        stages = [{"windows": w, "trials": sum(len(t.intermediate_values) >= w for t in own)} for w in sorted(marks)]
        refused = sum(not t.intermediate_values and t.user_attrs.get("wall_s") == 0 for t in own)
        minutes = self.gpu_seconds_total() / 60
        evaluated = stages[0]["trials"] + refused
        return {"pruner": spec.pruner.name, "stages": stages, "refused_without_run": refused,
                "repeats": len(trials) - len(own), "configs_evaluated": evaluated,
                "configs_per_gpu_minute": round(evaluated / minutes, 3) if minutes > 0 else None}

    # ------------------------------------------------------------------ the coordinator lease
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
        own = dict(self.spec.trainer.env) if self.spec is not None and self.spec.trainer is not None else {}
        return {**own, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}

    def _child_cwd(self) -> str | None:
        """A loop of one's own runs in its ``trainer.cwd``; the built-in one in the tuner's working directory."""
        return self.spec.trainer.cwd if self.spec is not None and self.spec.trainer is not None else None

    @property
    def gpu_minutes(self) -> float | None:
        """The study's GPU-minute budget: --gpu-minutes, else the spec's ``budget.gpu_minutes``."""
        if self.gpu_budget_override is not None:
            return self.gpu_budget_override
        return self.spec.budget.gpu_minutes if self.spec else None

    @property
    def timeout_s(self) -> float | None:
        if self.timeout_override is not None:
            return self.timeout_override
        return self.spec.budget.timeout_s if self.spec else None

    def _sampler(self, trials_before: int = 0) -> optuna.samplers.BaseSampler:
        """The spec's sampler. Its seed is the study's, offset by the trials the study already holds (a resumed
        study continues the search instead of proposing its first configs again) and, for a worker, by its pid
        (two workers must not replay one random sequence); a fresh study's coordinator uses the seed as given."""
        spec = self.spec
        assert spec is not None
        s = spec.sampler
        seed = s.seed
        if seed is not None:  # (numpy's generators take seeds below 2**32)
            seed = (seed + trials_before + ((1 + os.getpid() % 100_000) * 100_003 if self.worker else 0)) % 2**31
        if s.name != "grid":  # the startup trials led by the base run's profile (workbench.tune.profiled)
            return ProfileLed(make_sampler(s.name, seed, s.n_startup_trials), s.n_startup_trials)
        grid = {name: spec.space[name].grid(spec.knob(name).kind) for name in self.active}
        return _AskTellGridSampler(grid, seed=seed)

    def _pruner(self) -> optuna.pruners.BasePruner:
        spec = self.spec
        assert spec is not None
        p, windows = spec.pruner, spec.protocol.windows
        if p.name == "none" or spec.objective.multi_objective:
            return optuna.pruners.NopPruner()
        # screening: the resource is the count of windows measured (a trial reports window i as step i + 1),
        # so the first rung is the warm-up and one window
        if p.name == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=p.reduction_factor,
                                                          min_early_stopping_rate=0)
        if p.name == "hyperband":
            return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=windows,
                                                  reduction_factor=p.reduction_factor)
        return optuna.pruners.MedianPruner(n_startup_trials=spec.pruner.n_startup_trials,
                                           n_warmup_steps=spec.pruner.n_warmup_steps, interval_steps=1)

    # ------------------------------------------------------------------ bookkeeping
    def _trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        assert self.study is not None
        return self.study.get_trials(deepcopy=False, states=tuple(states) if states else None)

    def _counts(self) -> tuple[int, int, int]:
        """(counted, running, waiting) trials of the study."""
        trials = self._trials()
        counted = sum(counts(t) for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        return counted, running, waiting

    def _finished_count(self) -> int:
        """Finished trials that used the budget (a repeat replaced by an untried config did not)."""
        return sum((t.state in (TrialState.COMPLETE, TrialState.PRUNED) or infeasible(t))
                   and not t.user_attrs.get("free_repeat") for t in self._trials())

    def baseline_runs(self) -> list[float]:
        assert self.study is not None
        return list(self.study.user_attrs.get("baseline_runs", []))

    def _best_text(self) -> str:
        ok = [t for t in self._trials((TrialState.COMPLETE,)) if is_feasible(t)]
        if not ok:
            return ""
        best = max(ok, key=lambda t: t.values[0])
        base = self.baseline_runs()
        sp = f" ({best.values[0] / statistics.median(base):.2f}x)" if base else ""
        return f"search best #{best.number} {best.values[0]:,.0f} tok/s{sp}, one run, not yet validated"

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
    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Knob values for ``trial``: each active knob in registry order, conditional knobs when active."""
        spec = self.spec
        assert spec is not None
        if self._base_values is None:
            self._base_values = spec.base_knob_values()
        values = dict(self._base_values)
        params: dict[str, Any] = {}
        for name in spec.knob_order():
            if name not in self.active:
                continue
            knob = spec.knob(name)
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

        screens = spec.pruner.screens
        last = spec.protocol.windows - 1

        def on_window(i: int, v: float) -> bool:
            if multi:
                return False
            # a screening pruner's resource is the count of windows measured; its last rung is the full protocol,
            # where nothing is left to save, so a trial measured to the end is never pruned
            trial.report(v, step=i + 1 if screens else i)
            return not (screens and i >= last) and trial.should_prune()

        out: TrialOutcome | None = None
        try:
            try:
                cfg = spec.trial_config(params)
            except ConfigError as e:
                out = not_launched_outcome(tdir, str(e))
            else:
                # the memory model is the built-in loop's: a loop of one's own finds its own limit
                too_big = predicted_oom(cfg, self.hardware.get("gpu_memory_gib")) if spec.trainer is None else None
                if too_big:
                    out = not_launched_outcome(tdir, too_big, kind="oom")
            if out is None:
                h = config_hash(cfg)
                trial.set_user_attr("config_hash", h)
                twin = self._measured_twin(h, n)
                if twin is not None:  # the sampler asked for a config already measured: its result, no run
                    out = _outcome_of(twin)
                    trial.set_user_attr("duplicate_of", twin.number)
                    if "numerics" in twin.user_attrs:
                        trial.set_user_attr("numerics", twin.user_attrs["numerics"])
                    queued = self._queue_untried(n)
                    if queued is not None:  # the repeat costs no budget: an untried config runs in its place
                        trial.set_user_attr("free_repeat", True)
                    self._log(f"trial {n}: the same config as trial {twin.number}; its result is reused, "
                              "nothing runs" + (f"; queued an untried config instead ({_params_text(queued)})"
                                                if queued is not None else ""))
                else:
                    out = self._run_search_trial(trial, cfg, tdir, on_window)
                    if out.status == "ok":
                        self._guard_numerics(trial, params, cfg, out)
        except KeyboardInterrupt:
            self._mark_interrupted(trial)
            raise
        self._tell(trial, out)
        return out

    def configs(self) -> list[dict[str, Any]] | None:
        """Every config of the search space as knob values (conditional knobs only where active), in sampling
        order; None when the space is not finite or has more than MAX_ENUMERATED configs."""
        spec = self.spec
        assert spec is not None
        if self._base_values is None:
            self._base_values = spec.base_knob_values()
        names = [n for n in spec.knob_order() if n in self.active]
        grids: dict[str, list[Any]] = {}
        for name in names:
            rng = spec.space[name]
            if rng.choices is None and spec.knob(name).kind != "int" and rng.step is None:
                return None  # a continuous range
            grids[name] = rng.grid(spec.knob(name).kind)
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

        return out if walk(0, dict(self._base_values), {}) else None

    def _queue_untried(self, number: int) -> dict[str, Any] | None:
        """Enqueue one config of a finite space that no trial has asked for or queued (a seeded choice, so that
        a study reruns the same way); None when the space is not finite or every config was asked for."""
        study, spec = self.study, self.spec
        assert study is not None and spec is not None
        configs = self.configs()
        if not configs:
            return None
        asked = [t.params or t.system_attrs.get("fixed_params") or {} for t in self._trials()]
        held = study.sampler.held(study) if isinstance(study.sampler, ProfileLed) else {}
        led = [c for c in configs if all(c.get(k, v) == v for k, v in held.items())]  # the startup's, first
        pick = untried_config(led, asked, spec.sampler.seed, number) or \
            untried_config(configs, asked, spec.sampler.seed, number)
        if pick is None:
            return None
        study.enqueue_trial(pick, user_attrs={"queued_for": number})
        return pick

    def _requeue_interrupted(self) -> None:
        """Queue again, once, the config of every trial that stopped without a result of its own (Ctrl-C, a dead
        tuner, a stale heartbeat): the sampler, the grid's included, treats a finished trial as covered."""
        study = self.study
        assert study is not None and self.storage is not None
        trials = self._trials()
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
            study.enqueue_trial(t.params, user_attrs={"requeue_of": t.number})
            pending.append(t.params)
            self._log(f"trial {t.number} stopped without a result: its config is queued again "
                      f"({_params_text(t.params)})")

    def _measured_twin(self, h: str, number: int) -> FrozenTrial | None:
        """The earliest finished search trial of config hash ``h`` whose result is the config's: complete and ok,
        pruned (screened out: slower than the trials it was ranked with), or failed out of memory (not a timeout,
        crash or interrupt, which may be the machine's doing)."""
        for t in self._trials((TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            if (t.number != number and t.user_attrs.get("config_hash") == h and "duplicate_of" not in t.user_attrs
                    and (is_feasible(t) or t.state == TrialState.PRUNED or t.user_attrs.get("status") == "oom")):
                return t
        return None

    def _run_search_trial(self, trial: optuna.Trial, cfg: Any, tdir: Path, on_window: Any) -> TrialOutcome:
        """One search trial; a trial killed from outside with no sign of an OOM is run once more before its
        config is called infeasible (the first attempt is kept as ``trials/<n>.killed``)."""
        spec = self.spec
        assert spec is not None
        n = trial.number
        for attempt in range(2):
            out = run_trial(cfg, tdir, timeout_s=spec.protocol.trial_timeout_s,
                            heartbeat_timeout_s=spec.protocol.heartbeat_timeout_s, on_window=on_window,
                            on_phase=self._phase(f"trial {n}"), launch=self.launch,
                            on_launch=lambda pgid: self._record_group(trial, pgid), env=self._child_env(),
                            cwd=self._child_cwd())
            if not out.killed_from_outside or attempt:
                return out
            kept = tdir.with_name(f"{tdir.name}.killed")
            remove_tree(kept)
            tdir.rename(kept)
            trial.set_user_attr("rerun", {"reason": out.failure_reason, "first_attempt_dir": str(kept)})
            self._log(f"trial {n}: {out.failure_reason}; running it once more before blaming its config")
        return out

    @staticmethod
    def _record_group(trial: optuna.Trial, pgid: int) -> None:
        """Store the trial's process group and what identifies its leader, for the recovery of a dead tuner."""
        trial.set_user_attr("pgid_leader", proc_identity(pgid))
        trial.set_user_attr("pgid", pgid)

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
        attrs.update(flat_attrs(out.summary or {}))
        # Optuna's own states, so that its tools read the study right: a failed config is FAIL (the samplers
        # learn it as infeasible through their view, workbench.tune.samplers), an interrupted one FAIL too
        values: list[float] | None = None
        state = TrialState.FAIL
        mem = out.peak_memory_gib
        if out.status == "ok":
            assert out.value is not None
            values = [out.value] + ([mem if mem is not None else 0.0] if spec.objective.multi_objective else [])
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
                self.storage.set_trial_system_attr(trial._trial_id, "constraints", [cons[k] for k in CONSTRAINTS])
            study.tell(trial, values, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as e:
            # another process failed it as stale (our heartbeat stalled); it will be re-run
            self._log(f"trial {trial.number}: could not record its result ({e}); it counts as failed")

    def _trial_line(self, trial: optuna.Trial, out: TrialOutcome) -> str:
        base = self.baseline_runs()
        params = ", ".join(f"{k}={v}" for k, v in trial.params.items())
        elapsed = time.monotonic() - self._t0
        tail = f" | {elapsed // 60:.0f}m{elapsed % 60:02.0f}s" + (f" | {b}" if (b := self._best_text()) else "")
        if out.status == "ok" and out.value is not None:
            # the ratio beside the noise floor: a ratio within the baseline's own spread is no sign of a gain
            sp = (f", {out.value / statistics.median(base):.2f}x the baseline median (one search run; noise floor "
                  f"{noise_floor(base).rel_spread:.0%})") if base else ""
            return f"trial {trial.number}: {out.value:,.0f} tok/s/gpu{sp} [{params}]{tail}"
        return f"trial {trial.number}: {out.status} ({out.failure_reason}) [{params}]{tail}"

    def search(self) -> None:
        """Run trials until the budget (exact across processes) or the wall-clock limit is reached."""
        study = self.study
        assert study is not None
        deadline = self._t0 + self.timeout_s if self.timeout_s else None  # wall clock of this process
        waiting_note = False
        while True:
            self._check_lease()
            self._recover_stale()
            self._requeue_interrupted()
            counted, running, waiting = self._counts()
            if self.progress is not None:
                self.progress.set(done=self._finished_count(), best=self._best_text(),
                                  gpu_min=self.gpu_seconds_total() / 60)
            # enqueued (WAITING) trials are asked for like new ones; the exact check after ask() decides
            budget_done = self.budget is not None and counted - waiting >= self.budget
            time_done = deadline is not None and time.monotonic() >= deadline
            gpu_done = self._gpu_budget_done()
            if budget_done or time_done or gpu_done:
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
                        earlier = sum(counts(t) for t in self._trials() if t.number < trial.number)
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

    def _gpu_budget_done(self) -> bool:
        """Whether the GPU-minute budget leaves no room for one more search trial (workbench.tune.measure:
        what was spent, the validation and trace reserve, and a trial at the median search trial's cost); the
        first time, one line says where the minutes went."""
        left = self.gpu_budget_left()
        if left is None or left >= 0:
            return False
        if not self._gpu_note:
            self._gpu_note = True
            spent = self.gpu_seconds_total() / 60
            self._log(f"GPU-minute budget: {spent:.1f} of {self.gpu_minutes:g} spent, "
                      f"{self.reserved_seconds() / 60:.1f} kept for validation and traces, a trial takes about "
                      f"{self._trial_seconds() / 60:.1f}: the search stops")
        return True

    # ------------------------------------------------------------------ validation
    def run(self) -> dict[str, Any] | None:
        """Coordinator: baseline, search, validation, export, report. Worker: search only.

        Returns validation.json's content (None for a worker). KeyboardInterrupt propagates after the
        running trial is marked FAIL.
        """
        started = now_iso()
        self._t0 = time.monotonic()
        self._sessions = None  # read from an earlier tune.json at the first write
        if self.study is None and self.spec is not None and not self.worker:
            preflight(self.spec)  # before anything is stored or run
        self.study_dir.mkdir(parents=True, exist_ok=True)
        if self.study is None:
            self.open()
        assert self.spec is not None
        if not self.worker and self._finished() is not None:
            return None
        if self.dropped:
            print(format_dropped(_as_dropped(self.dropped)), file=sys.stderr, flush=True)
        role = "worker" if self.worker else "coordinator"
        print(f"study {self.study_name} ({role}): searching {', '.join(self.active)}; budget "
              f"{self.budget if self.budget is not None else 'unlimited'} trials"
              + (f", {self.timeout_s:g} s" if self.timeout_s else "") + f"; storage {self.storage_shown}\n"
              f"data: {describe_data(data_source(self.spec.base_config(), self.spec.trainer))}", file=sys.stderr, flush=True)
        after = 0 if self.worker else self.runs_after_search()
        self.progress = Progress(self.budget, self.study_name, self.progress_enabled, after=after)
        try:
            if not self.worker:
                self._remove_stale_attempts()
                self._write_tune_json(started, None)
                self.run_baseline()
                self.write_lifetimes()  # the base config's gradient lifetimes, once (no device: fake tensors)
                self._write_tune_json(started, None)
            self.search()
            if self.worker:
                self.progress.finish()
                return None
            self.progress.set(phase="validating", best="")
            validation = self.validate()
            self.progress.set(phase="exporting")
            finished = now_iso()
            self._session(started, finished)
            result = self._result(validation, sessions_wall_s(self._sessions or []))
            self._record_in_study(result)
            path = export_config(self.spec, self.study_dir, result,
                                 launch_record=winner_launch_record(self.study, result),
                                 patches=exported_patches(self.study, result, self.study_dir))
            self._write_tune_json(started, finished, result)
            if self.report is not None:
                self.progress.set(phase="report")
                self._build_report()
            self.progress.set(best=result_headline(result))
            self.progress.finish()
        finally:
            self.progress.close()
            with interrupts_held():
                self._release_lease()  # the same command may resume at once
        self._print_result(result, path)
        return validation

    def _build_report(self) -> Path | None:
        """report.html through the injected builder. The study's results are already stored and exported, so a
        builder that fails is one line naming the command that rebuilds it, never a lost study."""
        assert self.report is not None
        try:
            return Path(self.report(self.study_dir, self.storage_url, self.study_name))
        except Exception as e:  # noqa: BLE001 - any failure of the report must leave the study's result intact
            print(f"report.html not built ({type(e).__name__}: {e}); the study's results are in {self.study_dir}; "
                  f"rebuild it with `python -m workbench.tune report --study-name {self.study_name} --out "
                  f"{self.study_dir.parent}`", file=sys.stderr, flush=True)
            return None

def _as_dropped(items: Sequence[Mapping[str, str]]) -> list[Any]:
    return [DroppedKnob(d["knob"], d["reason"]) for d in items]


def _hardware(caps: frozenset[str], gpus: int) -> dict[str, Any]:
    """tune.json's ``hardware``: the capabilities, the GPUs a trial holds, the host, and the GPU's name, count and
    memory where there is one."""
    hw: dict[str, Any] = {"capabilities": sorted(caps), "gpus": gpus, "cpu_count": os.cpu_count(),
                          "host": socket.gethostname()}
    if "cuda" in caps:
        import torch

        hw.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                  gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 3))
    return hw


def _users_own_file(source: str | None) -> bool:
    """Whether a spec came from a file under the working directory (the user's own project), whose command runs
    without a question; a file from elsewhere, or a spec read from shared storage, is shown first."""
    if not source:
        return False
    path = Path(source)
    return path.is_file() and path.resolve().is_relative_to(Path.cwd().resolve())


def _spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Top-level spec keys that differ, ignoring the budget (it may be extended on resume)."""
    keys = sorted(set(old) | set(new))
    return [k for k in keys if k not in ("budget",) and json.dumps(old.get(k), sort_keys=True, default=str)
            != json.dumps(new.get(k), sort_keys=True, default=str)]


def exported_patches(study: optuna.Study, result: Mapping[str, Any], study_dir: Path) -> dict[str, Any] | None:
    """What ``run.prepare()`` changed in the exported run's Hugging Face model (the exported trial's summary, else
    the first baseline run's), as the provenance's ``patches``; None when nothing was prepared."""
    trial = ((result or {}).get("exported") or {}).get("trial")
    summary: Mapping[str, Any] = {}
    if trial is not None:
        with contextlib.suppress(IndexError, ValueError, TypeError):
            summary = study.trials[int(trial)].user_attrs.get("summary") or {}
    else:
        with contextlib.suppress(OSError, ValueError):
            summary = json.loads((study_dir / "baseline" / "0" / "summary.json").read_text())
    applied = summary.get("hf/patches")
    return {"applied": list(applied), "versions": summary.get("hf/versions") or {}} if applied else None


def winner_launch_record(study: optuna.Study, result: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The Triton launch record of the exported winner's search trial (its summary's ``kernels/launch``)."""
    trial = ((result or {}).get("exported") or {}).get("trial")
    if trial is None:
        return None
    try:
        frozen = study.trials[int(trial)]
    except (IndexError, ValueError, TypeError):
        return None
    return ((frozen.user_attrs.get("summary") or {}).get("kernels/launch")) or None
