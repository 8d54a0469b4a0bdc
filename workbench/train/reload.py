"""Config hot reload: ``kill -USR1 <pid>`` of a running ``python -m workbench.train --config FILE`` re-reads FILE
between steps and applies the keys that may change while running (docs/training.md, "Hot reload").

The rule is atomic: the re-read config is compared with the one the run last accepted (``diff``), and either
every changed key is applied or the whole reload is rejected with the reason, naming the key
(``model.name cannot change while running (was 'tiny', now 'gr00t-n1.6')``), and the run keeps its values.
``plan_reload`` decides and changes nothing; ``Trainer.reload_config`` applies a plan; ``ConfigReloader`` keeps
a run's source, the config it last accepted and its counts, and writes the log line and the event record of
every reload.

A new micro-batch keeps the global batch (samples per optimizer step): gradient accumulation is re-derived, and a
micro-batch that does not divide the global batch rejects the reload. ``carry_position`` maps the data position
onto the new micro-batch's plan (``position_for`` says how and when it is exact).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from loaders.pipeline import upgrade_state
from workbench.config import Config, accumulation, merge_overrides, to_dict
from workbench.train.memory_model import predicted_oom

__all__ = ["RELOADABLE", "ConfigReloader", "ConfigSource", "ReloadPlan", "ReloadRejected", "carry_position",
           "diff", "plan_reload", "position_for"]

log = logging.getLogger("workbench")

RELOADABLE = frozenset({
    "training.learning_rate", "training.scheduler", "training.warmup_steps", "training.min_lr_ratio",
    "data.micro_batch_size", "training.log_every", "training.checkpoint_every",
})
"""The keys a reload may change: the schedule, the micro-batch and the logging and checkpoint cadence."""

_BATCH_KEYS = ("training.global_batch_size", "training.grad_accum_steps")
"""May change in the file only where the global batch stays what it is (grad accumulation is re-derived)."""


class ReloadRejected(Exception):
    """The reload is rejected as a whole; ``str()`` is the reason."""


@dataclass(frozen=True)
class ConfigSource:
    """The file a run was started from and how it is read again (the CLI's ``load_run_config``, so that its
    ``--set`` and ``--steps`` apply on top of the re-read file as they did at the start)."""

    path: str
    load: Callable[[], Config]


@dataclass(frozen=True)
class ReloadPlan:
    """What an accepted reload applies."""

    base: Config
    """The re-read config: the next reload is compared with it."""
    running: Config
    """The config the run trains with from now on (the file's values, grad accumulation re-derived)."""
    changes: dict[str, tuple[Any, Any]]
    """Each key the file changed: (old, new)."""
    grad_accum: tuple[int, int]
    """Micro-batches per optimizer step, before and after."""


def _diff(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str, out: dict[str, tuple[Any, Any]]) -> None:
    for k in [*a, *(k for k in b if k not in a)]:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            _diff(va, vb, f"{prefix}{k}.", out)
        elif va != vb:
            out[f"{prefix}{k}"] = (va, vb)


def diff(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs, to the deepest key both sides have: key -> (old, new); a key one
    side lacks is None there (a section null on one side, ``provenance``, differs as a whole)."""
    out: dict[str, tuple[Any, Any]] = {}
    _diff(to_dict(old), to_dict(new), "", out)
    return out


def plan_reload(base: Config, new: Config, running: Config, *, world: int, grad_accum: int,
                gpu_memory_gib: float | None = None) -> ReloadPlan:
    """Check the re-read config ``new`` against ``base`` (the config the run last accepted) and build the config to
    run with; raises ``ReloadRejected`` naming every key that cannot change, or why the micro-batch cannot.

    ``running`` is the config the run trains with now, ``grad_accum`` its micro-batches per optimizer step with
    ``world`` processes: the global batch ``running.data.micro_batch_size x world x grad_accum`` stays. On a GPU of
    ``gpu_memory_gib`` a new micro-batch the memory model says cannot fit is rejected (the tuner's rule)."""
    changes = diff(base, new)
    fixed = [f"{k} cannot change while running (was {old!r}, now {now!r})" for k, (old, now) in changes.items()
             if k not in RELOADABLE and k not in _BATCH_KEYS]
    if fixed:
        raise ReloadRejected("; ".join(fixed))
    samples = running.data.micro_batch_size * world * grad_accum  # the global batch, kept
    mb = new.data.micro_batch_size
    accum = accumulation(samples, mb, world)
    if accum is None:
        raise ReloadRejected(f"data.micro_batch_size={mb} does not divide the global batch of {samples} samples per "
                             f"optimizer step over {world} process(es)")
    if any(k in changes for k in _BATCH_KEYS) and mb * world * new.effective_grad_accum_steps(world) != samples:
        keys = " and ".join(k for k in _BATCH_KEYS if k in changes)
        raise ReloadRejected(f"{keys}: the global batch cannot change while running (was {samples} samples per "
                             f"optimizer step, the file now makes it "
                             f"{mb * world * new.effective_grad_accum_steps(world)})")
    try:
        run = merge_overrides(running, {k: now for k, (_, now) in changes.items()})
        if run.effective_grad_accum_steps(world) != accum:  # grad_accum_steps given, not global_batch_size
            run = merge_overrides(run, {"training.grad_accum_steps": accum})
    except ValueError as e:  # ConfigError: the running config with these values is not a valid one
        raise ReloadRejected(str(e)) from None
    too_big = predicted_oom(run, gpu_memory_gib) if mb != running.data.micro_batch_size else ""
    if too_big:
        raise ReloadRejected(f"data.micro_batch_size={mb}: {too_big.removesuffix('; not launched')}")
    return ReloadPlan(base=new, running=run, changes=changes, grad_accum=(grad_accum, accum))


def position_for(state: Mapping[str, Any], micro_batch_size: int,
                 batches_per_epoch: int) -> tuple[tuple[int, int], bool]:
    """The data position of a pipeline rebuilt at ``micro_batch_size`` (``batches_per_epoch`` batches an epoch)
    that continues the one whose ``state_dict()`` is ``state``: ((epoch, batch), exact). A state written before
    the key was ``micro_batch_size`` (it holds ``micro_batch``) is read too (loaders' ``upgrade_state``).

    A position counts batches, so it carries over as the rows consumed in the epoch: ``batch x old micro-batch``,
    rounded up to whole new batches (a row is skipped rather than trained on twice). Under fill packing the
    epoch's rows do not depend on the micro-batch (loaders' ``FillPlan``), so the next row is the one the old
    pipeline would have handed out: exact when the micro-batch divides the rows consumed. Under bucket packing
    the epoch's plan itself depends on the micro-batch (which bucket's batch comes when): the same count of
    records into the epoch is the honest equivalent, and the rest of that epoch follows the new plan (records
    may be seen twice or skipped until the epoch ends); from the next epoch on the order is exactly that of a
    run started at the new micro-batch."""
    state = upgrade_state(state)
    epoch, rows = int(state["epoch"]), int(state["batch"]) * int(state["micro_batch_size"])
    k = math.ceil(rows / micro_batch_size)
    exact = state.get("packing", "bucket") == "fill" and rows % micro_batch_size == 0
    if k >= batches_per_epoch:  # the epoch's rest is short of a new batch: the next epoch starts
        return (epoch + 1, 0), exact
    return (epoch, k), exact


def carry_position(old: Any, new: Any) -> str:
    """Move the pipeline ``new`` (a ``BatchPipeline`` at a new micro-batch, not started) to the position that
    continues ``old`` (``position_for``); returns the position's description for the log line."""
    state = old.state_dict()
    (epoch, k), exact = position_for(state, new.micro_batch_size, new.batches_per_epoch)
    new.load_state_dict({**new.state_dict(), "epoch": epoch, "batch": k})
    return (f"epoch {state['epoch']} batch {state['batch']} -> epoch {epoch} batch {k} "
            f"({'exact' if exact else 'the same rows into the epoch'})")


def _describe(changes: Mapping[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r}->{new!r}" for k, (old, new) in changes.items()) or "no change"


@dataclass
class ConfigReloader:
    """A run's reloads: where its config comes from (None: a preset, nothing to reload), the config it last
    accepted, and the count of applied and rejected reloads."""

    source: ConfigSource | None
    base: Config
    counts: dict[str, int] = field(default_factory=lambda: {"applied": 0, "rejected": 0})

    def plan(self, running: Config, *, world: int, grad_accum: int, device: torch.device) -> ReloadPlan:
        """Re-read the source and plan the reload for a run on ``device``; any error reading it rejects it
        (``ReloadRejected``)."""
        if self.source is None:
            raise ReloadRejected("the run was started from a preset: there is no config file to re-read")
        if world > 1:  # each rank would read the file at its own step: the ranks must not diverge
            raise ReloadRejected(f"hot reload needs a single process (WORLD_SIZE={world})")
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
        try:
            new = self.source.load()
        except Exception as e:  # noqa: BLE001 - any load error rejects the reload; the run goes on
            raise ReloadRejected(str(e) or type(e).__name__) from None
        return plan_reload(self.base, new, running, world=world, grad_accum=grad_accum, gpu_memory_gib=gib)

    def applied(self, plan: ReloadPlan, *, step: int, position: str | None = None) -> dict[str, Any]:
        """Count an applied reload, log its line; returns its event record (``MetricsWriter.event``)."""
        self.base = plan.base
        self.counts["applied"] += 1
        changes = dict(plan.changes)
        if plan.grad_accum[0] != plan.grad_accum[1]:
            changes.setdefault("training.grad_accum_steps (derived)", plan.grad_accum)
        log.info("config reload at step %d (%s): applied %s%s", step, self.source.path if self.source else "-",
                 _describe(changes), f"; data position {position}" if position else "")
        return {"kind": "event", "event": "config_reload", "step": step, "result": "applied",
                "changes": {k: list(v) for k, v in changes.items()}, "grad_accum_steps": list(plan.grad_accum),
                "data_position": position, "reason": None}

    def rejected(self, reason: str, *, step: int) -> dict[str, Any]:
        """Count a rejected reload, log its line; returns its event record."""
        self.counts["rejected"] += 1
        log.warning("config reload at step %d (%s): rejected, the run keeps its config: %s", step,
                    self.source.path if self.source else "-", reason)
        return {"kind": "event", "event": "config_reload", "step": step, "result": "rejected", "changes": {},
                "grad_accum_steps": None, "data_position": None, "reason": reason}

    def summary(self) -> dict[str, int]:
        """The run summary's ``config/reloads_*`` keys."""
        return {f"config/reloads_{k}": v for k, v in self.counts.items()}
