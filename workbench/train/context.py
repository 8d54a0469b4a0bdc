"""The run context: what one training process owes the tuner besides its measurements (docs/trial-contract.md).
It owns the stop signals (SIGINT, SIGTERM, and the span's own, e.g. the Trainer's SIGUSR1 reload), the heartbeat,
the summary file and the failure file (``failure.json``, its failure kind named once here), for the built-in loop
(``python -m workbench.train`` and its ``Trainer.run``) and for ``workbench.run()`` alike. The windows, phases and
metrics are the :class:`~workbench.train.session.RunSession`'s, which beats through the context.

It imports no torch: ``python -m workbench.train`` writes the heartbeat's 0 through it before the loop's imports
(seconds on a loaded host), and an exception of torch's can only come once torch is imported.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loaders.format import ShardFormatError
from workbench.errors import ConfigError, DiskError
from workbench.files import write_json

__all__ = ["HOLD_ENV", "NanLossError", "RunContext", "StopSignals", "classify_exception", "failure_record",
           "ready_file", "write_failure"]


HOLD_ENV = "WORKBENCH_HOLD"
"""The environment variable naming a held process's gate file (the tuner's start-ahead): the run waits there,
before its first device work, until the file exists (:meth:`RunContext.hold`)."""


def ready_file(gate: Path) -> Path:
    """The file a held process writes on reaching ``gate`` (``<gate>.ready``)."""
    return gate.with_name(gate.name + ".ready")


class NanLossError(RuntimeError):
    """The loss became NaN or infinite."""


class RunContext:
    """The trial contract's files and signals of one run; each file is written only where a path is given (a run
    without the tuner writes none).

    * ``heartbeat``: the step counter, ``0`` once the process reports (:meth:`beat`), rewritten after every step;
    * ``summary``: the summary JSON at the run's end (:meth:`finish`);
    * ``failure_dir``: ``failure.json`` there for an exception (:meth:`fail`; ``with context:`` records the one
      that leaves the block and lets it propagate; :meth:`tell_failure` is the command line's end);
    * :meth:`stop_signals`: the span in which SIGINT and SIGTERM ask the loop to stop after its step;
    * ``gate``: a process started ahead of its trial (the tuner's start-ahead, ``$WORKBENCH_HOLD``) is held
      there (:meth:`hold`).
    """

    def __init__(self, *, heartbeat: str | Path | None = None, summary: str | Path | None = None,
                 failure_dir: str | Path | None = None, gate: str | Path | None = None) -> None:
        self.heartbeat = Path(heartbeat) if heartbeat else None
        self.summary = Path(summary) if summary else None
        self.failure_dir = Path(failure_dir) if failure_dir else None
        self.gate = Path(gate) if gate else None
        self.stop: StopSignals | None = None
        """The signals of the current (or last) span: ``stop.requested`` once a stop was asked for."""

    def __enter__(self) -> RunContext:
        return self

    def __exit__(self, kind: Any, e: BaseException | None, tb: Any) -> None:
        if e is not None:
            self.fail(e)

    def beat(self, step: int) -> None:
        """The heartbeat: ``step`` steps are done (0: the process reports)."""
        if self.heartbeat is not None:
            self.heartbeat.write_text(str(step))

    def hold(self, poll_s: float = 0.01) -> None:
        """Start-ahead: with its imports and config done and no device touched, write ``<gate>.ready`` (the wall
        clock now, and whether CUDA is initialised yet: it must not be, or the allocator's settings could not act)
        and wait until the gate file exists; then the heartbeat's 0, which the tuner's watchdog counts from the
        gate's opening. Without a gate, nothing. SIGTERM while held ends the process (its default action)."""
        if self.gate is None:
            return
        torch = sys.modules.get("torch")
        cuda = bool(torch is not None and torch.cuda.is_initialized())
        write_json(ready_file(self.gate), {"ready_at": time.time(), "cuda_initialized": cuda}, indent=None)
        while not self.gate.exists():
            time.sleep(poll_s)
        self.beat(0)

    def stop_signals(self, extra: Mapping[int, Callable[[int, Any], None]] | None = None) -> StopSignals:
        """``with context.stop_signals(...) as stop:`` the span of the loop in which a stop request is heard."""
        self.stop = StopSignals(extra)
        return self.stop

    @property
    def stop_requested(self) -> bool:
        return self.stop is not None and self.stop.requested

    def finish(self, summary: Mapping[str, Any]) -> None:
        """The run ended without an exception: its summary to the summary file."""
        if self.summary is not None:
            write_json(self.summary, summary, default=str)

    def fail(self, e: BaseException) -> dict[str, str]:
        """``failure.json`` for ``e`` in ``failure_dir`` (an error writing it propagates); returns the record."""
        record = failure_record(e)
        if self.failure_dir is not None:
            write_json(self.failure_dir / "failure.json", record, indent=None)
        return record

    def tell_failure(self, e: BaseException, *, debug: bool = False) -> str:
        """The command line's end on ``e``: one line on stderr, the traceback of a crash (of any error with
        ``debug``), ``failure.json`` where it can be written (else a line why not). Returns the failure kind."""
        record = failure_record(e)
        kind = record["kind"]
        print(f"error ({kind}): {record['message']}", file=sys.stderr)
        # a crash is a bug to report: its traceback goes to the log; a file the run cannot read or write is not
        if debug or (kind == "crash" and not isinstance(e, OSError)):
            traceback.print_exception(e)
        try:
            self.fail(e)
        except OSError as werr:  # the output directory itself may be what failed: the line above says it
            print(f"  (failure.json not written: {werr.strerror or werr}: {werr.filename or self.failure_dir})",
                  file=sys.stderr)
        return kind


class StopSignals:
    """SIGINT and SIGTERM ask the loop to stop after its step (``requested``); a second one stops it at once
    (KeyboardInterrupt). ``extra``: more signals and their handlers for the same span (the Trainer's SIGUSR1
    reload). The handlers held before come back on leaving. Off the main thread, where Python delivers no signal,
    it installs nothing. The one stop rule of the built-in loop and of ``workbench.run()``."""

    def __init__(self, extra: Mapping[int, Callable[[int, Any], None]] | None = None) -> None:
        self.requested = False
        self.extra = dict(extra or {})
        self._held: dict[int, Any] = {}

    def _on_stop(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            handlers = {signal.SIGINT: self._on_stop, signal.SIGTERM: self._on_stop, **self.extra}
            self._held = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._held.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._held = {}


def failure_record(e: BaseException) -> dict[str, str]:
    """failure.json's content for ``e``: its failure kind and ``<name>: <message>`` (a ConfigError raised as one of
    its private subclasses is named ConfigError; LaunchConfigError keeps its name)."""
    name = "ConfigError" if isinstance(e, ConfigError) and type(e).__name__.startswith("_") else type(e).__name__
    return {"kind": classify_exception(e), "message": f"{name}: {e}"[:4000]}


def write_failure(out_dir: Path, e: BaseException) -> dict[str, str]:
    """Write ``out_dir/failure.json`` for ``e`` (the trial contract's record of why a run ended); returns it."""
    return RunContext(failure_dir=out_dir).fail(e)


def classify_exception(e: BaseException) -> str:
    """Map an exception to a failure kind (``workbench.vocab.FAILURE_KINDS``)."""
    if isinstance(e, DiskError):  # a file could not be written: the machine's fault, not the config's
        return "disk"
    if isinstance(e, (ConfigError, ShardFormatError)):  # the config's data.loongbin_dir is unusable as it is
        return "invalid_config"
    torch = sys.modules.get("torch")  # (not imported: then no exception of torch's)
    if (torch is not None and isinstance(e, torch.OutOfMemoryError)) or "out of memory" in str(e).lower():
        return "oom"
    if isinstance(e, NanLossError):
        return "nan_loss"
    mod = type(e).__module__ or ""
    if mod.startswith(("torch._dynamo", "torch._inductor")) or "BackendCompilerFailed" in type(e).__name__ \
            or mod.startswith("triton"):
        return "compile_error"
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return "crash"
