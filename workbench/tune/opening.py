"""Opening a study: ``open_session`` turns a ``SessionRequest`` into a complete ``StudySession``. It opens the
storage, reads a worker's spec from it, starts a changed (or --reset) study over, creates or loads the Optuna
study, takes the coordinator's lease, settles the searched knobs, the budget and the micro-batch bound on this
hardware, queues the warm start and the seed trials once, and loads the study with the spec's sampler and
pruner. ``read_session`` is a stored study as it is, for reading (``python -m workbench.tune export``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from workbench.errors import TuneError
from workbench.files import remove_tree
from workbench.tune.knobs import DroppedKnob, detect_capabilities, drop_unsupported, format_dropped
from workbench.tune.lease import LEASE_ATTR, Lease
from workbench.tune.profiled import ProfileLed, walk_startup
from workbench.tune.progress import Console
from workbench.tune.samplers import infeasible, make_sampler
from workbench.tune.session import SessionRequest, StudySession, hardware_key
from workbench.tune.spaces import fit_micro_batches
from workbench.tune.storage import make_storage
from workbench.tune.spec_sections import KnobRange
from workbench.tune.study import StudySpec, spec_from_dict
from workbench.tune.trial import Launcher, command_launcher, launch_command
from workbench.tune.validation import is_feasible
from workbench.vocab import REAL_TOKENS_PER_S

__all__ = ["open_session", "read_session", "spec_diff"]

_STUDY_WAIT_S = 300  # a worker started before its coordinator waits this long for the study


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, without its end-of-grid ``study.stop()``: that call only works inside
    ``study.optimize`` and raises under ask/tell (after the last grid point was stored), which is how the
    tuner drives trials. The study's trial budget ends the search instead (set it to the grid's size)."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        return None


def open_session(req: SessionRequest, lease: Lease, console: Console) -> StudySession:
    """Open (or create) the request's Optuna study and settle the search space and budget (see the module
    docstring); a coordinator holds ``lease`` from here on."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(req.storage_url)
    from_storage = req.spec is None
    spec = _load_stored_spec(req, storage) if req.spec is None else req.spec
    if spec.trainer is not None and req.confirm is not None and (from_storage or not _users_own_file(spec.source)):
        req.confirm(spec)
    directions = ["maximize", "minimize"] if spec.objective.multi_objective else ["maximize"]
    caps = detect_capabilities(spec.gpus)
    kept, dropped = drop_unsupported(list(spec.space), caps)
    if not req.worker:
        _start_over_if_changed(req, storage, lease, spec.to_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        study = optuna.create_study(storage=storage, study_name=req.study_name, directions=directions,
                                    load_if_exists=True, sampler=optuna.samplers.RandomSampler(0))
    if not req.worker:
        lease.acquire(storage)
    attrs = study.user_attrs
    stored_spec = attrs.get("spec")
    mine = spec.to_dict()
    if stored_spec is not None:
        diff = spec_diff(stored_spec, mine)
        if diff:  # a worker's spec (a coordinator's was settled by _start_over_if_changed)
            raise TuneError(
                f"study {req.study_name!r} in {req.storage_shown} was created from a different spec "
                f"(differs in: {', '.join(diff)}); use another --study-name, or start the coordinator with "
                f"this spec and --reset")
    active, dropped_rec = _settle_space(attrs, kept, dropped)
    if not req.worker and not study.metric_names:
        # the objective's name as Optuna's tools show it (the dashboard, `optuna trials`)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([REAL_TOKENS_PER_S, "memory/peak_gib"][:len(directions)])
    if not req.worker or stored_spec is None:
        study.set_user_attr("spec", mine)
        study.set_user_attr("active_knobs", active)
        study.set_user_attr("dropped_knobs", dropped_rec)
    budget, gpu_minutes = _settle_budget(req, spec, attrs)
    hardware = _hardware(caps, spec.gpus)
    if not req.worker:
        study.set_user_attr("budget_trials", budget)
        study.set_user_attr("budget_gpu_minutes", gpu_minutes)
        study.set_user_attr("hardware_key", hardware_key(hardware))
        _warm_start(req, storage, study, spec, active, hardware, console)
        _enqueue_seeds(study, spec, active, console)
    timeout_s = req.timeout_s if req.timeout_s is not None else spec.budget.timeout_s
    if budget is None and timeout_s is None and gpu_minutes is None:
        raise TuneError("no budget: give --trials, --timeout or --gpu-minutes, or set budget in the study spec")
    if not active:
        raise TuneError(f"nothing to search on this hardware: {format_dropped(dropped)}")
    _fit_micro_batches(study, spec, attrs, hardware, req.worker, console)
    # reload with the real sampler and pruner (create_study needed a sampler to exist)
    trials_before = sum(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))
    study = optuna.load_study(study_name=req.study_name, storage=storage,
                              sampler=_sampler(spec, active, req.worker, trials_before), pruner=_pruner(spec))
    return StudySession(spec=spec, study=study, storage=storage, study_name=req.study_name, study_dir=req.study_dir,
                        storage_url=req.storage_url, storage_shown=req.storage_shown, worker=req.worker,
                        reference=req.reference, me=req.me, attempt_id=req.attempt_id,
                        launch=_launcher(req.launch, spec), active=active, dropped=dropped_rec, budget=budget,
                        timeout_s=timeout_s, gpu_minutes=gpu_minutes, hardware=hardware, console=console)


def read_session(req: SessionRequest, spec: StudySpec, study: optuna.Study, console: Console) -> StudySession:
    """A stored study as its coordinator left it, for reading its records: its searched knobs and trial budget
    from its attributes, no hardware of this machine; nothing is written, no lease is taken."""
    attrs = study.user_attrs
    return StudySession(spec=spec, study=study, storage=make_storage(req.storage_url), study_name=req.study_name,
                        study_dir=req.study_dir, storage_url=req.storage_url, storage_shown=req.storage_shown,
                        worker=req.worker, reference=req.reference, me=req.me, attempt_id=req.attempt_id,
                        launch=_launcher(req.launch, spec), active=list(attrs.get("active_knobs", [])),
                        dropped=list(attrs.get("dropped_knobs", [])), budget=attrs.get("budget_trials"),
                        timeout_s=req.timeout_s if req.timeout_s is not None else spec.budget.timeout_s,
                        gpu_minutes=req.gpu_minutes if req.gpu_minutes is not None else spec.budget.gpu_minutes,
                        hardware={}, console=console)


def _launcher(given: Launcher | None, spec: StudySpec) -> Launcher:
    """Each trial's command line: the one given, else the spec's own ``trainer.command``, else
    ``python -m workbench.train``."""
    if given is not None:
        return given
    if spec.trainer is not None:
        return command_launcher(spec.trainer.command)
    return launch_command


def _load_stored_spec(req: SessionRequest, storage: optuna.storages.RDBStorage) -> StudySpec:
    """A worker without --study: wait for the coordinator's study and read its spec."""
    deadline = time.monotonic() + _STUDY_WAIT_S
    while True:
        try:
            summary = optuna.study.load_study(study_name=req.study_name, storage=storage)
            data = summary.user_attrs.get("spec")
            if data:
                return spec_from_dict(data, source=f"{req.storage_shown} (study {req.study_name})")
        except KeyError:
            pass
        if time.monotonic() > deadline:
            raise TuneError(f"no study {req.study_name!r} with a spec in {req.storage_shown} after "
                            f"{_STUDY_WAIT_S} s; start the coordinator, or give --study")
        time.sleep(2)


def _settle_space(attrs: Mapping[str, Any], kept: list[str],
                  dropped: list[DroppedKnob]) -> tuple[list[str], list[dict[str, str]]]:
    """The knobs searched and those left out: a stored study's own (its space does not change with the machine;
    one warning for those this machine cannot act on), else the spec's less those this machine dropped."""
    if "active_knobs" in attrs:
        active = list(attrs["active_knobs"])
        mine_lost = [d.knob for d in dropped if d.knob in active]
        if mine_lost:
            warnings.warn(f"this machine cannot act on {', '.join(mine_lost)}, which the study searches; "
                          "its trials here measure them without effect", stacklevel=4)
        return active, list(attrs.get("dropped_knobs", []))
    return kept, [d.to_dict() for d in dropped]


def _settle_budget(req: SessionRequest, spec: StudySpec, attrs: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """The trial budget (--trials, else a worker takes the coordinator's, else the spec's) and the GPU-minute
    budget (--gpu-minutes, else a worker takes the coordinator's, else the spec's)."""
    if req.trials is not None:
        budget = req.trials
    elif req.worker and "budget_trials" in attrs:
        budget = attrs["budget_trials"]
    else:
        budget = spec.budget.trials
    gpu_minutes = req.gpu_minutes
    if gpu_minutes is None and req.worker and "budget_gpu_minutes" in attrs:
        gpu_minutes = attrs["budget_gpu_minutes"]
    return budget, gpu_minutes if gpu_minutes is not None else spec.budget.gpu_minutes


def _fit_micro_batches(study: optuna.Study, spec: StudySpec, attrs: Mapping[str, Any], hardware: Mapping[str, Any],
                       worker: bool, console: Console) -> None:
    """Bound the space's micro_batch_size by the memory model on this GPU (``workbench.tune.spaces``), with one
    line for the choices dropped. The study keeps the bound it was first opened with (its trials' distribution
    must not change)."""
    rng = spec.space.get("micro_batch_size")
    if rng is None or spec.trainer is not None:  # a loop of one's own finds its own limit
        return
    choices = rng.grid("int")
    if "micro_batch_fit" in attrs:
        kept = list(attrs["micro_batch_fit"])
    else:
        lean = {n: spec.space[n].grid(spec.knob(n).kind) for n in ("activation_checkpointing", "loss_backend")
                if n in spec.space}
        kept, line = fit_micro_batches(spec.base_config(), choices, lean, hardware.get("gpu_memory_gib"))
        if line:
            console.log(line)
        if not kept:
            raise TuneError(f"nothing to search: {line}")
        if not worker:
            study.set_user_attr("micro_batch_fit", kept)
    if kept != choices:
        spec.space["micro_batch_size"] = KnobRange(choices=kept)


def _start_over_if_changed(req: SessionRequest, storage: optuna.storages.RDBStorage, lease: Lease,
                           mine: Mapping[str, Any]) -> None:
    """A coordinator on a stored study: where the spec changed and nothing was measured yet (no baseline run,
    no finished trial: a first run that failed, say on a refused model or a wrong data folder), the study
    starts over in the same folder, with one line. With measurements it is refused, unless ``reset`` (the
    CLI's --reset) confirms; with ``reset`` an unchanged study starts over too, after the same question. A
    study another coordinator holds is never deleted."""
    try:
        old = optuna.load_study(study_name=req.study_name, storage=storage, sampler=optuna.samplers.RandomSampler(0))
    except KeyError:
        return  # a new study
    stored = old.user_attrs.get("spec")
    diff = spec_diff(stored, mine) if stored is not None else []
    if not diff and req.reset is None:
        return
    finished = [t for t in old.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                or infeasible(t)]
    measured = len(old.user_attrs.get("baseline_runs") or []) + len(finished)
    what = (f"study {req.study_name!r} in {req.storage_shown}"
            + (f" was created from a different spec (differs in: {', '.join(diff)})" if diff else ""))
    if measured:
        if req.reset is None:
            raise TuneError(f"{what}; it holds {measured} measurement(s); use another --study-name, or pass "
                            "--reset to delete them and start it over in place")
        req.reset(f"{what}; it holds {measured} measurement(s) ({len(finished)} finished trial(s)): delete "
                  f"them and start it over in {req.study_dir}?")
    held = old.user_attrs.get(LEASE_ATTR)
    if lease.is_live(held):
        raise TuneError(f"study {req.study_name!r} is being run by another coordinator, "
                        f"{lease.holder(held)}; it is not started over")
    optuna.delete_study(study_name=req.study_name, storage=storage)
    _clear_study_dir(req.study_dir)
    print(f"{what}{'' if diff else ' is reset'}; {'nothing was measured in it: ' if not measured else ''}"
          f"starting it over in {req.study_dir}", file=sys.stderr, flush=True)


def _clear_study_dir(study_dir: Path) -> None:
    """The study folder without the outputs of the study just deleted: the storage's own files (study.db)
    and the compile cache (a cache keyed by what it compiled) stay."""
    if not study_dir.is_dir():
        return
    for child in study_dir.iterdir():
        if child.name.startswith("study.db") or child.name == "compile-cache":
            continue
        if child.is_dir() and not child.is_symlink():
            remove_tree(child)
        else:
            child.unlink(missing_ok=True)


def _warm_start(req: SessionRequest, storage: optuna.storages.RDBStorage, study: optuna.Study, spec: StudySpec,
                active: list[str], hardware: Mapping[str, Any], console: Console) -> None:
    """A new study's first trial, once: the validated winner (else the fastest feasible trial) of the best
    earlier study in the same storage of the same model on the same hardware (``hardware_key``), its values
    kept where this study searches them and holds them (the sampler picks the rest). Nothing when no such
    study exists or this one already holds trials."""
    if "warm_start" in study.user_attrs or study.get_trials(deepcopy=False):
        return
    mine = hardware_key(dict(hardware))
    best: tuple[float, str, int, dict[str, Any], list[str]] | None = None
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        a = summary.user_attrs
        if summary.study_name == req.study_name or (a.get("spec") or {}).get("model") != spec.model \
                or a.get("hardware_key") != mine:
            continue
        other = optuna.load_study(study_name=summary.study_name, storage=storage,
                                  sampler=optuna.samplers.RandomSampler(0))
        ok = [t for t in other.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible(t)]
        exported = a.get("result/exported_trial")
        pick = next((t for t in ok if t.number == exported), None) or max(ok, key=lambda t: t.values[0],
                                                                           default=None)
        if pick is not None and (best is None or pick.values[0] > best[0]):
            best = (pick.values[0], summary.study_name, pick.number, dict(pick.params),
                    list(a.get("active_knobs") or []))
    if best is None:
        study.set_user_attr("warm_start", None)
        return
    value, name, number, params, theirs = best
    kept = {k: v for k, v in params.items() if k in active and k in spec.space
            and spec.space[k].contains(v, spec.knob(k).kind)}
    new = [k for k in active if k not in theirs]  # what the earlier study could not tell (workbench.tune.profiled)
    study.enqueue_trial(kept, user_attrs={"warm_start": {"study": name, "trial": number}})
    study.set_user_attr("warm_start", {"study": name, "trial": number, "params": kept, "new": new})
    console.log(f"warm start: trial {number} of study {name} (same model and {mine['device']}; {value:,.0f} "
                f"tok/s/gpu there) runs first ({params_text(kept) or 'the base config'})"
                + (f"; the first {walk_startup(study, spec.sampler.n_startup_trials)} trials change "
                   f"{', '.join(new)}, which it did not search, one at a time from the best so far"
                   if new and kept else ""))


def _enqueue_seeds(study: optuna.Study, spec: StudySpec, active: list[str], console: Console) -> None:
    """The spec's seed trials, queued once per study (Optuna's enqueue_trial): they run first and count
    against the budget. Values of knobs this machine dropped are left out."""
    if study.user_attrs.get("seeded") or not spec.seed_trials:
        return
    for i in range(len(spec.seed_trials)):
        params = {k: v for k, v in spec.seed_params(i).items() if k in active}
        study.enqueue_trial(params, user_attrs={"seed_trial": i}, skip_if_exists=True)
    study.set_user_attr("seeded", True)
    console.log(f"queued {len(spec.seed_trials)} seed trial(s) to run first")


def _sampler(spec: StudySpec, active: list[str], worker: bool, trials_before: int) -> optuna.samplers.BaseSampler:
    """The spec's sampler. Its seed is the study's, offset by the trials the study already holds (a resumed
    study continues the search instead of proposing its first configs again) and, for a worker, by its pid
    (two workers must not replay one random sequence); a fresh study's coordinator uses the seed as given."""
    s = spec.sampler
    seed = s.seed
    if seed is not None:  # (numpy's generators take seeds below 2**32)
        seed = (seed + trials_before + ((1 + os.getpid() % 100_000) * 100_003 if worker else 0)) % 2**31
    if s.name != "grid":  # the startup trials led by the base run's profile (workbench.tune.profiled)
        return ProfileLed(make_sampler(s.name, seed, s.n_startup_trials), s.n_startup_trials)
    grid = {name: spec.space[name].grid(spec.knob(name).kind) for name in active}
    return _AskTellGridSampler(grid, seed=seed)


def _pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
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


def _hardware(caps: frozenset[str], gpus: int) -> dict[str, Any]:
    """tune.json's ``hardware``: the capabilities, the GPUs a trial holds, the host, the GPU's name, count and
    memory where there is one, and the ``versions`` of torch, Triton and CUDA the trials run with (this
    interpreter's: the trials' unless a trainer command of one's own names another; None where absent)."""
    import torch

    hw: dict[str, Any] = {"capabilities": sorted(caps), "gpus": gpus, "cpu_count": os.cpu_count(),
                          "host": socket.gethostname()}
    if "cuda" in caps:
        hw.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                  gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 3))
    try:
        triton: str | None = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    hw["versions"] = {"torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda}
    return hw


def _users_own_file(source: str | None) -> bool:
    """Whether a spec came from a file under the working directory (the user's own project), whose command runs
    without a question; a file from elsewhere, or a spec read from shared storage, is shown first."""
    if not source:
        return False
    path = Path(source)
    return path.is_file() and path.resolve().is_relative_to(Path.cwd().resolve())


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Top-level spec keys that differ, ignoring the budget (it may be extended on resume). A key set to null
    is the key left out (null is each optional key's default), so a study stored before a version added one
    (``protocol.start_ahead``) resumes unchanged."""
    keys = sorted(set(old) | set(new))
    def text(spec: Mapping[str, Any], k: str) -> str:
        return json.dumps(_set_keys(spec.get(k)), sort_keys=True, default=str)

    return [k for k in keys if k not in ("budget",) and text(old, k) != text(new, k)]


def _set_keys(value: Any) -> Any:
    """``value`` with every mapping's null-valued keys left out, at any depth."""
    if isinstance(value, Mapping):
        return {k: _set_keys(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_set_keys(v) for v in value]
    return value


def params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())
