"""A study session: one tuner process's open study, complete once built. ``SessionRequest`` is what the ``Tuner``
was asked (known before the storage is read); ``StudySession`` is the study as it was opened (the spec, the Optuna
study and storage, the searched knobs, the budget, the hardware), which ``workbench.tune.opening`` builds. The
parts of a run (``Lease``, ``Measurer``, ``Search``, ``validate``, ``verify``, the records) take the session, or
the narrower values they need, instead of sharing a Tuner's attributes; so Optuna's ``Study`` is a facade over
module functions (``optuna/study/_optimize.py``, ``_tell.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from workbench.tune.progress import Console
from workbench.tune.samplers import infeasible
from workbench.tune.study import StudySpec
from workbench.tune.trial import Launcher

__all__ = ["SessionRequest", "StudySession", "hardware_key"]


@dataclass(kw_only=True)
class SessionRequest:
    """What a Tuner was asked to open (its arguments, resolved to paths and URLs)."""

    spec: StudySpec | None
    """The study's spec; None: a worker reads the coordinator's from the storage."""
    study_name: str
    study_dir: Path
    storage_url: str
    storage_shown: str
    """The only form of the storage URL that is printed or written (its password masked)."""
    trials: int | None
    """--trials, over the spec's budget."""
    timeout_s: float | None
    """--timeout, over the spec's budget."""
    gpu_minutes: float | None
    """--gpu-minutes, over the spec's ``budget.gpu_minutes``."""
    worker: bool
    reference: bool
    """The winner beside the plain compiled loop after validation (GPU studies)."""
    launch: Launcher | None
    """Each trial's command line; None: the spec's ``trainer.command``, else the built-in loop."""
    confirm: Callable[[StudySpec], None] | None
    """Asked before a spec that did not come from the user's own file runs its ``trainer.command``; raising
    TuneError refuses it."""
    reset: Callable[[str], None] | None
    """--reset: asked (with what would be deleted) before a study with measurements starts over; None: never."""
    me: dict[str, Any]
    """This process: {host, pid, start, role}."""
    attempt_id: str
    """Names this process's measurement folders (``.<name>.<attempt_id>``)."""


@dataclass(kw_only=True)
class StudySession:
    """One process's open study (see the module docstring). ``active``, ``budget`` and the spec's space are settled
    when it is built; the study's records live in the Optuna storage, read through ``study``."""

    spec: StudySpec
    study: optuna.Study
    """Loaded with the spec's sampler and pruner."""
    storage: optuna.storages.RDBStorage
    study_name: str
    study_dir: Path
    storage_url: str
    storage_shown: str
    worker: bool
    reference: bool
    me: dict[str, Any]
    attempt_id: str
    launch: Launcher
    active: list[str]
    """The knobs searched, in the study's order."""
    dropped: list[dict[str, str]]
    """Knobs this study leaves out, each {knob, reason}."""
    budget: int | None
    """Trials (None: no trial budget)."""
    timeout_s: float | None
    """Wall-clock seconds of this process's search (None: no limit)."""
    gpu_minutes: float | None
    """The GPU-minute budget (None: none)."""
    hardware: dict[str, Any]
    """tune.json's ``hardware``: capabilities, GPUs a trial holds, host, and the GPU's name, count and memory."""
    console: Console = field(default_factory=Console)

    def log(self, text: str) -> None:
        self.console.log(text)

    def show(self, **fields: Any) -> None:
        self.console.show(**fields)

    def ran_after_search(self) -> None:
        """One validation or trace run finished (the progress bar counts it)."""
        self.console.run_after_search()

    def child_env(self) -> dict[str, str]:
        """Environment of every trial process: one Inductor/AOTAutograd cache and one Triton cache per study, so
        a trial recompiles only what no earlier trial of the study compiled."""
        cache = self.study_dir / "compile-cache"
        own = dict(self.spec.trainer.env) if self.spec.trainer is not None else {}
        return {**own, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}

    def child_cwd(self) -> str | None:
        """A loop of one's own runs in its ``trainer.cwd``; the built-in one in the tuner's working directory."""
        return self.spec.trainer.cwd if self.spec.trainer is not None else None

    def trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=tuple(states) if states else None)

    def baseline_runs(self) -> list[float]:
        return list(self.study.user_attrs.get("baseline_runs", []))

    def last_baseline_dir(self) -> Path:
        """The folder of the last baseline repeat: the one that profiles the base config (``run_baseline``)."""
        dirs = self.study.user_attrs.get("baseline_dirs") or []
        return Path(dirs[-1]) if dirs else self.study_dir / "baseline" / str(self.spec.protocol.baseline_repeats - 1)

    def base_trace_dir(self) -> Path | None:
        """The last baseline repeat's folder where it holds the base config's trace, else None."""
        last = self.last_baseline_dir()
        return last if (last / "trace.json").exists() else None

    def finished_count(self) -> int:
        """Finished trials that used the budget (a repeat replaced by an untried config did not)."""
        return sum((t.state in (TrialState.COMPLETE, TrialState.PRUNED) or infeasible(t))
                   and not t.user_attrs.get("free_repeat") for t in self.trials())

    def hardware_key(self) -> dict[str, Any]:
        """What makes two studies' measurements comparable: the device model, the GPUs a trial holds."""
        return hardware_key(self.hardware)


def hardware_key(hardware: dict[str, Any]) -> dict[str, Any]:
    return {"device": hardware.get("gpu") or "cpu", "gpus": hardware.get("gpus")}
