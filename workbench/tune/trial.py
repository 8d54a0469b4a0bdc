"""One isolated trial: launch ``workbench.train`` in its own process group, watch it, classify the outcome.

``run_trial(cfg, trial_dir, ...)`` writes ``trial_dir/config.yaml``, launches

    python -m workbench.train --config config.yaml --out DIR --summary DIR/summary.json \
        --heartbeat DIR/heartbeat -q [--synthetic]

(``python -m torch.distributed.run --rdzv-endpoint 127.0.0.1:<free port> --nproc-per-node N -m workbench.train ...``,
i.e. torchrun, when ``hardware.gpus > 1``) with stdout and stderr in
``trial_dir/log.txt``, and polls until it exits:

* every new line of ``metrics.jsonl`` is one measured window; its real
  tokens/s/GPU goes to ``on_window(index, value)``, which returns True to prune
  (the tuner reports it to Optuna and asks ``should_prune``): a pruned trial's
  group is SIGKILLed at once, and its summary is its last window's figures;
* a run of the built-in loop ends where its ``summary.json`` is written: its group is SIGKILLed then, and it
  counts as exited with the code it was about to give (what follows is the summary printed and the teardown);
* the watchdog kills the whole process group (SIGTERM, then SIGKILL after a
  grace) when the trial exceeds its time limit, or when the heartbeat file (the
  step counter, rewritten after every step) has not changed for
  ``heartbeat_timeout_s`` after the first step: status ``timeout``; and when the
  process has not written its heartbeat at all ``heartbeat_timeout_s`` after its
  launch (it never reports: a command that does not use the run API): status
  ``no_report``.

The child's environment holds ``WORKBENCH_CONFIG`` (the trial's config.yaml) and ``WORKBENCH_OUT`` (the trial
directory), the trial contract of docs/trial-contract.md; a process started ahead (``hold_trial``) also
``WORKBENCH_HOLD``, its gate.

The outcome's status is one of ``STATUSES``: ``ok``, ``pruned``, a failure kind
of ``workbench.vocab.FAILURE_KINDS`` (from ``failure.json``, else the exit code, else the signal; "CUDA
out of memory" in the log tail makes a crash an ``oom``), or ``interrupted``.
The objective of an ``ok`` trial is the median of its window throughputs.

On Linux the child gets ``PR_SET_PDEATHSIG(SIGKILL)``, so a tuner killed with
``kill -9`` does not leave its trial running.

``launch(cfg, config_path, trial_dir)`` builds the command line; it defaults to
``launch_command`` (``command_launcher`` runs a study's own ``trainer.command``; the tests pass stand-ins that
hang or crash).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import socket
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import Config, dump_config
from workbench.files import remove_tree, write_json, write_text
from workbench.train.context import HOLD_ENV, ready_file
from workbench.tune.numerics import window_losses
from workbench.vocab import (COMPILE_S, DEVICE_TOTAL_GIB, EXIT_CODES, FAILURE_KINDS, MAX_RESERVED_GIB, MAX_RSS_GIB,
                             PHASES, REAL_TOKENS_PER_S, STATUSES, STEP_S)

__all__ = [
    "FAILURE_KINDS",
    "STATUSES",
    "TIMELINE",
    "Held",
    "Launcher",
    "TrialOutcome",
    "Watchdog",
    "classify",
    "ignore_interrupts",
    "command_launcher",
    "interrupts_held",
    "kill_group",
    "not_launched_outcome",
    "launch_command",
    "hold_trial",
    "read_log_tail",
    "run_trial",
    "start_process",
]

LOG_TAIL_LINES = 30
KILL_GRACE_S = 3.0  # SIGTERM -> SIGKILL; the train CLI needs no cleanup when it is killed
_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "out of memory")
_SUMMARY_KEEP = ("phase_s_per_step", "hf/patches", "hf/versions")  # the structured keys a trial record keeps

_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding workbench/, loaders/, kernels/


def _exit_code_kinds() -> dict[int, str]:
    return {code: kind for kind, code in EXIT_CODES.items()}


@dataclass
class TrialOutcome:
    """What one trial process did."""

    status: str
    """One of STATUSES."""
    trial_dir: Path
    config_path: Path | None = None
    windows: list[float] = field(default_factory=list)
    """Real tokens/s/GPU of each measured window, in order."""
    value: float | None = None
    """Objective: median window throughput (ok trials only)."""
    summary: dict[str, Any] | None = None
    """summary.json of the run, bulky keys removed."""
    failure_reason: str = ""
    log_tail: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    last_window: dict[str, Any] | None = None
    """The last metrics.jsonl record (memory and loss of a pruned or failed trial)."""
    step_losses: list[float] = field(default_factory=list)
    """The training loss of each measured step, in order (``numerics.window_losses`` of each measured window)."""
    timeline: dict[str, float] = field(default_factory=dict)
    """Seconds after the launch at which the watchdog first saw each mark of ``TIMELINE`` (to its poll), and the
    first window's ``compile_s`` (``TIMELINE`` says which)."""
    start_ahead: dict[str, Any] | None = None
    """A trial whose process was started ahead (``Held.record``): the seconds it was held, when it was ready."""
    killed_from_outside: bool = False
    """Ended by a SIGKILL that neither the watchdog sent nor an OOM explains (no kernel OOM kill recorded, memory
    not near the host's): the config is not to blame; the tuner runs such a trial once more."""
    stopped_for_budget: bool = False
    """Stopped before its first measured window, as its seconds passed ``run_trial``'s ``budget_s`` (status
    ``pruned``)."""

    @property
    def failed(self) -> bool:
        return self.status in FAILURE_KINDS

    @property
    def peak_memory_gib(self) -> float | None:
        """Peak reserved device memory (CUDA) or peak host RSS (CPU), GiB."""
        for src in (self.summary, self.last_window):
            if src:
                v = src.get(MAX_RESERVED_GIB)
                if v is None:
                    v = src.get(MAX_RSS_GIB)
                if v is not None:
                    return float(v)
        return None

    @property
    def device_total_gib(self) -> float | None:
        for src in (self.summary, self.last_window):
            if src and src.get(DEVICE_TOTAL_GIB):
                return float(src[DEVICE_TOTAL_GIB])
        return None

    @property
    def last_loss(self) -> float | None:
        if self.summary and self.summary.get("last_loss") is not None:
            return float(self.summary["last_loss"])
        if self.last_window and self.last_window.get("loss") is not None:
            return float(self.last_window["loss"])
        return None


# --------------------------------------------------------------------------- helpers


def read_log_tail(trial_dir: Path, lines: int = LOG_TAIL_LINES, width: int = 400) -> str:
    """The last ``lines`` lines of ``trial_dir/log.txt`` (each cut to ``width`` characters)."""
    path = Path(trial_dir) / "log.txt"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    text = text.replace("\r", "\n")  # progress bars
    tail = [ln[:width] for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(tail)


def _slim_summary(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            out[k] = v
        elif k in _SUMMARY_KEEP and isinstance(v, (dict, list)):
            out[k] = v
    return out


def _pruned_summary(last_window: Mapping[str, Any], measured_steps: int) -> dict[str, Any]:
    """The summary of a trial killed once pruned (it writes none): its last window record's figures (the peaks so
    far, its speed, MFU and phase seconds: a screen's one window is its whole measurement) with ``measured_steps``
    and ``phase_s_per_step``, and ``summary_of: last_window`` saying where they come from."""
    out = _slim_summary(dict(last_window))
    phases = {ph: last_window.get(f"time/{ph}_s") for ph in PHASES}
    out.update(measured_steps=measured_steps, summary_of="last_window",
               phase_s_per_step={k: v for k, v in phases.items() if isinstance(v, (int, float))})
    return out


def _fresh_dir(path: Path) -> None:
    remove_tree(path)  # a re-run trial must not append to an earlier run's metrics; a symlink is refused
    path.mkdir(parents=True)


def not_launched_outcome(trial_dir: Path, reason: str, kind: str = "invalid_config") -> TrialOutcome:
    """Record a trial whose config was rejected before launch (nothing is run): ``invalid_config``, or ``oom``
    where the memory model says it cannot fit."""
    assert kind in FAILURE_KINDS, kind
    trial_dir = Path(trial_dir)
    _fresh_dir(trial_dir)
    write_json(trial_dir / "failure.json", {"kind": kind, "message": reason}, indent=None)
    write_text(trial_dir / "log.txt", f"config rejected before launch: {reason}\n")
    return TrialOutcome(kind, trial_dir, failure_reason=reason, log_tail=read_log_tail(trial_dir))


Launcher = Callable[[Config, Path, Path], list[str]]
"""``(cfg, config_path, trial_dir) -> argv`` of one trial's process."""


def launch_command(cfg: Config, config_path: Path, trial_dir: Path) -> list[str]:
    """The command line of one trial (torchrun when the config asks for several GPUs)."""
    args = ["--config", str(config_path), "--out", str(trial_dir), "--summary", str(trial_dir / "summary.json"),
            "--heartbeat", str(trial_dir / "heartbeat"), "-q"]
    if not cfg.data.loongbin_dir:
        args.append("--synthetic")
    if cfg.metrics.prometheus_port is None:  # the CLI would serve on 9091: a trial binds a port only if asked
        args.append("--no-prometheus")
    if cfg.hardware.gpus > 1:
        # a one-node rendezvous whose endpoint is loopback: the processes meet on 127.0.0.1, never on the host's
        # name or a public address (what --standalone resolves); torch's TCPStore server itself binds every
        # interface, whatever the endpoint (README, "Failures and recovery")
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{_free_loopback_port()}", "--rdzv-id", f"trial-{os.getpid()}",
                "--nproc-per-node", str(cfg.hardware.gpus), "-m", "workbench.train", *args]
    return [sys.executable, "-m", "workbench.train", *args]


def _free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command_launcher(command: list[str]) -> Launcher:
    """A launcher of a study's own ``trainer.command`` (run without a shell; the trial's config and directory reach
    it through the environment). A leading ``python`` is this interpreter, so the command runs in the tuner's
    environment."""
    argv = [sys.executable if command[0] in ("python", "python3") else command[0], *command[1:]]

    def launch(cfg: Config, config_path: Path, trial_dir: Path) -> list[str]:
        return list(argv)

    return launch


def _pdeathsig() -> Callable[[], None] | None:
    """preexec_fn giving the child SIGKILL when the tuner dies (Linux); resolved before fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def _set() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)

    return _set


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace_s`` (0: SIGKILL at once); reap the child."""
    pgid = proc.pid  # start_new_session: the child leads its own group
    steps = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)) if grace_s > 0 else ((signal.SIGKILL, 30.0),)
    for sig, wait in steps:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # grandchildren (torchrun workers, loader processes) may outlive the leader; finish them too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _MetricsTail:
    """Reads complete new lines of metrics.jsonl as the child appends them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.buf = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn line cannot be re-read; the summary still has the totals
        return out


def _read_heartbeat(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _oom_kills() -> int | None:
    """The kernel's OOM-kill count of this process's memory cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``); None where neither can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    candidates = []
    if "v1" in paths:
        candidates.append(Path("/sys/fs/cgroup/memory") / paths["v1"].lstrip("/") / "memory.oom_control")
    if "v2" in paths:
        candidates.append(Path("/sys/fs/cgroup") / paths["v2"].lstrip("/") / "memory.events")
    for path in candidates:
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def _host_memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        return None
    return None


HOST_MEMORY_SHARE_OOM = 0.9
"""A SIGKILLed trial whose last window's RSS reached this share of the host's memory counts as an OOM."""


def ignore_interrupts() -> dict[int, Any]:
    """Ignore SIGINT and SIGTERM from now on (the main thread only: elsewhere no handler can be set); returns the
    handlers they had."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while the body runs, so that a burst of Ctrl-Cs cannot cut short the bookkeeping
    of the first one."""
    held = ignore_interrupts()
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


# --------------------------------------------------------------------------- the runner


@dataclass
class Watch:
    """What the watchdog saw of a running trial: its measured windows and, where it ended the trial, why."""

    windows: list[float] = field(default_factory=list)
    last_window: dict[str, Any] | None = None
    step_losses: list[float] = field(default_factory=list)
    """The training loss of each measured step so far (``numerics.window_losses``)."""
    killed_kind: str = ""
    """``timeout`` or ``no_report`` when the watchdog killed the trial; "" otherwise."""
    killed_reason: str = ""
    pruned: bool = False
    ended_at_summary: bool = False
    """The watchdog ended the run once its summary was written (the built-in loop's)."""
    stopped_for_budget: bool = False
    """The watchdog stopped the run before its first window, at its ``budget_s``."""
    timeline: dict[str, float] = field(default_factory=dict)
    """``TIMELINE``'s marks seen so far: seconds after the launch."""


TIMELINE = ("report", "first_step", "first_window", "last_window", "end")
"""Where a trial's seconds go, as its watchdog sees them: the heartbeat's first write (the process reports), its
first step done (imports, model build, compile and one step behind it), its first and last measured windows read,
and the process gone (exited, or killed once pruned or once its summary is written). The rest of a screen's device
time is the gaps: before the first step, the stepping, and after the last window (the summary, a trace, the
teardown). Beside the marks, a timeline holds ``compile_s``: the compile seconds the first measured window's record
reports (the built-in loop compiles before its first step), where it reports them."""


OnWindow = Callable[[int, float, float | None], bool]
"""A measured window's callback: (its index, its tokens/s/GPU, its own seconds or None); True prunes the trial."""


def _window_seconds(rec: dict[str, Any]) -> float | None:
    """A window record's own seconds: its steps at its mean step time (the launch, the compile, the warm-up and
    the earlier windows are not in it); None where the record lacks either."""
    steps, step_s = rec.get("steps"), rec.get(STEP_S)
    if isinstance(steps, int) and steps > 0 and isinstance(step_s, (int, float)) and step_s > 0:
        return steps * float(step_s)
    return None


class Watchdog:
    """Polls a running trial (see the module docstring): each measured window of ``metrics`` goes to
    ``on_window`` (True prunes), the heartbeat file tells progress, and the time limits end the process group.
    ``end_at_summary``: the run is over once its summary file is written (an atomic write: a file there is
    whole), and its group is SIGKILLed then; for the built-in loop, which does nothing after its summary but
    print it and tear down. ``budget_s``: the seconds after the launch by which a first measured window must be
    read, else the group is SIGKILLed and the trial is ``pruned`` for the budget (the windows after the first are
    the ``on_window`` callback's to stop)."""

    def __init__(self, proc: subprocess.Popen[bytes], trial_dir: Path, cfg: Config, *, timeout_s: float,
                 heartbeat_timeout_s: float, on_window: OnWindow | None,
                 phase: Callable[[str], None], poll_s: float, on_measure: Callable[[], None] | None = None,
                 end_at_summary: bool = False, budget_s: float | None = None) -> None:
        self.proc, self.phase, self.on_window, self.poll_s = proc, phase, on_window, poll_s
        self.budget_s = budget_s
        self.on_measure = on_measure
        self.summary = trial_dir / "summary.json" if end_at_summary else None
        self.timeout_s, self.heartbeat_timeout_s = timeout_s, heartbeat_timeout_s
        self.warm = cfg.training.warmup_measure_steps
        # the beat at which the measured windows are near: the last warm-up step runs (one step's slack, in which
        # work queued on the device by another process drains)
        self.measure_beat = max(1, self.warm - 1)
        self.n_windows = max(1, (cfg.training.max_steps - self.warm) // cfg.training.log_every)
        self.metrics = _MetricsTail(trial_dir / "metrics.jsonl")
        self.heartbeat = trial_dir / "heartbeat"
        self.seen = Watch()
        self.t0: float | None = None  # the launch (monotonic), once watch() starts

    def _new_windows(self) -> Iterator[tuple[float, float | None]]:
        """Each measured window written since the last read (only windows after the warm-up count): its
        tokens/s/GPU and its own seconds (its steps at its mean step time; None where the record lacks them)."""
        for rec in self.metrics.read():
            v = rec.get(REAL_TOKENS_PER_S)
            if isinstance(v, (int, float)) and isinstance(rec.get("step"), int) and rec["step"] > self.warm:
                self.seen.windows.append(float(v))
                self.seen.last_window = rec
                seen_at = time.monotonic()  # one reading: the first window's two marks are one moment
                self._mark("first_window", seen_at)
                self._mark("last_window", seen_at)
                if isinstance(rec.get(COMPILE_S), (int, float)) and "compile_s" not in self.seen.timeline:
                    self.seen.timeline["compile_s"] = round(float(rec[COMPILE_S]), 2)
                self.seen.step_losses.extend(window_losses(rec))
                yield float(v), _window_seconds(rec)

    def _limit_passed(self, t0: float, now: float, beat: str | None, beat_at: float) -> tuple[str, str]:
        """(kind, reason) of the time limit the trial has passed, or ("", "")."""
        hb = self.heartbeat_timeout_s
        if beat is None and now - t0 > hb:
            return "no_report", (f"no heartbeat {hb:g} s after launch: the process does not report (a loop of "
                                 "one's own reports through workbench.run(); docs/trial-contract.md)")
        if now - t0 > self.timeout_s:
            return "timeout", f"exceeded the trial time limit of {self.timeout_s:g} s" + (
                f" (last step {beat})" if beat else " before its first step")
        if beat not in (None, "0") and now - beat_at > hb:  # "0": started, compiling
            return "timeout", f"no step for {hb:g} s (hung after step {beat})"
        return "", ""

    def _mark(self, name: str, at: float | None = None) -> None:
        """Mark ``name`` of ``TIMELINE`` at the first time it is seen (``at``, a monotonic reading, else now; later
        sightings keep it; ``last_window`` moves with each window); nothing before ``watch`` knows the launch."""
        if self.t0 is not None and (name == "last_window" or name not in self.seen.timeline):
            self.seen.timeline[name] = round((time.monotonic() if at is None else at) - self.t0, 2)

    def _measuring(self) -> None:
        """``on_measure``, once: the trial's last warm-up step has started, or a measured window is seen."""
        if self.on_measure is not None:
            self.on_measure()
            self.on_measure = None

    def watch(self, t0: float) -> Watch:
        """Poll until the process exits, is pruned or passes a limit (then its group is killed)."""
        seen, n = self.seen, self.n_windows
        beat, beat_at = None, t0
        self.t0 = t0
        while True:
            rc = self.proc.poll()
            for v, window_s in self._new_windows():
                self._measuring()
                self.phase(f"measuring window {len(seen.windows) + 1}/{n}" if len(seen.windows) < n else "finishing")
                if self.on_window is not None and self.on_window(len(seen.windows) - 1, v, window_s) and rc is None:
                    seen.pruned = True
            if seen.pruned:
                # nothing it would still do is wanted: SIGKILL frees the device now, where SIGTERM waits for its
                # step, summary and teardown (an HF run took the whole grace, 3 s of a 37 s screen, on the H200)
                kill_group(self.proc, grace_s=0)
                return seen
            if rc is not None:
                return seen
            if self.summary is not None and self.summary.exists():
                # measured and summarised: the printing and the teardown of CUDA, the loader's workers and the
                # interpreter that follow would hold the device for nothing (2-3 s a run on one H100)
                kill_group(self.proc, grace_s=0)
                seen.ended_at_summary = True
                return seen
            now = time.monotonic()
            b = _read_heartbeat(self.heartbeat)
            # an empty read is a beat being rewritten (a writer truncates the file, then writes the step), not a
            # lost heartbeat: it keeps the last beat seen
            if b is not None and b != beat:
                beat, beat_at = b, now
                self._mark("report")
                if b.isdigit() and int(b) >= 1:
                    self._mark("first_step")
                if b.isdigit() and int(b) >= self.measure_beat:
                    self._measuring()
                if not seen.windows:
                    in_warmup = b.isdigit() and int(b) <= self.warm
                    self.phase(f"warm-up (step {b}/{self.warm})" if in_warmup else f"measuring window 1/{n}")
            seen.killed_kind, seen.killed_reason = self._limit_passed(t0, now, beat, beat_at)
            if not seen.killed_reason and self.budget_s is not None and not seen.windows and now - t0 > self.budget_s:
                seen.stopped_for_budget = True
                seen.killed_kind = "pruned"
                seen.killed_reason = (f"stopped before its first window for the GPU-minute budget: {self.budget_s:.0f} "
                                      "s of the device were left beside the validation's reserve")
                kill_group(self.proc, grace_s=0)  # nothing of it is wanted: SIGKILL frees the device now
                return seen
            if seen.killed_reason:
                kill_group(self.proc)
                return seen
            time.sleep(self.poll_s)

    def drain(self) -> None:
        """The windows written between the last poll and the exit, to ``on_window`` for the pruner's statistics
        (the trial is over)."""
        for v, window_s in self._new_windows():
            if self.on_window is not None:
                self.on_window(len(self.seen.windows) - 1, v, window_s)


def _launch(cfg: Config, trial_dir: Path, launch: Launcher, env: dict[str, str] | None,
            cwd: str | Path | None) -> tuple[Path, subprocess.Popen[bytes] | str]:
    """Write the trial's config and start its command in a new process group, output to ``log.txt``: (the config's
    path, the process), or the reason it could not start in place of the process."""
    _fresh_dir(trial_dir)
    config_path = dump_config(cfg, trial_dir / "config.yaml")
    cmd = launch(cfg, config_path, trial_dir)
    env = {**(env or {}), "WORKBENCH_CONFIG": str(config_path), "WORKBENCH_OUT": str(trial_dir)}
    return config_path, start_process(cmd, trial_dir / "log.txt", env=env, cwd=cwd)


GATE = "gate"
"""A held trial process's gate file, in its trial directory; it writes ``ready_file(gate)`` on reaching it."""


@dataclass
class Held:
    """A trial's process started ahead (``hold_trial``) with ``$WORKBENCH_HOLD`` naming ``<trial dir>/gate``: the
    built-in loop imports what its run needs and loads its config, a loop of one's own runs up to
    ``workbench.run()``, and each waits there, touching no device, until ``run_trial`` opens the gate. The device
    time of its trial counts from the gate's opening."""

    config_hash: str
    config_path: Path
    proc: subprocess.Popen[bytes] | str
    """The process, or the reason it could not start (the trial's run says so)."""
    trial_dir: Path
    launched: float = field(default_factory=time.monotonic)
    launched_at: float = field(default_factory=time.time)

    @property
    def gate(self) -> Path:
        return self.trial_dir / GATE

    def open(self) -> float:
        """Let the process run on; returns the monotonic time of the opening."""
        write_text(self.gate, "")
        return time.monotonic()

    def stop(self) -> None:
        """End a process whose trial will not run it (its group killed, its directory removed: no run was made)."""
        if not isinstance(self.proc, str):
            kill_group(self.proc, grace_s=0)  # (held: it has nothing to finish)
        remove_tree(self.trial_dir)

    def record(self, opened: float) -> dict[str, Any]:
        """``held_s``: from the launch to the gate's opening; ``ready_s``: from the launch to the process reaching
        the gate (None: it never did; above ``held_s``: the trial waited for it, on its device time);
        ``cuda_initialized``: whether CUDA was up at the gate (it must not be: the allocator's settings)."""
        rec: dict[str, Any] = {"held_s": round(opened - self.launched, 2), "ready_s": None}
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            ready = json.loads(ready_file(self.gate).read_text())
            rec.update(ready_s=round(float(ready["ready_at"]) - self.launched_at, 2),
                       cuda_initialized=bool(ready["cuda_initialized"]))
        return rec


def hold_trial(cfg: Config, trial_dir: Path, config_hash: str, *, launch: Launcher = launch_command,
               env: dict[str, str] | None = None, cwd: str | Path | None = None) -> Held:
    """Start trial ``cfg``'s process ahead, held at its gate (``Held``): ``launch``'s command line with the gate in
    ``$WORKBENCH_HOLD``. ``run_trial(..., held=)`` opens the gate and watches it as a process it launched."""
    trial_dir = Path(os.path.abspath(trial_dir))
    config_path, proc = _launch(cfg, trial_dir, launch, {**(env or {}), HOLD_ENV: str(trial_dir / GATE)}, cwd)
    return Held(config_hash, config_path, proc, trial_dir)


def start_process(cmd: list[str], log_path: Path, *, env: Mapping[str, str] | None, cwd: str | Path | None,
                  nice: int = 0) -> subprocess.Popen[bytes] | str:
    """Start ``cmd`` in a new process group (killed with the tuner), output to ``log_path`` after its command line,
    with this checkout importable and ``env`` over the tuner's environment (niced by ``nice``): the process, or
    the reason it could not start (written to the log too)."""
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    deathsig = _pdeathsig()

    def child_setup() -> None:
        if nice:
            os.nice(nice)
        if deathsig is not None:
            deathsig()

    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # the tuner's working directory: relative paths in the config mean what they mean to the user
        try:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                    env=env, start_new_session=True, preexec_fn=child_setup)
        except OSError as e:  # the command itself cannot start: the study's to fix, not a crash of its config
            reason = f"cannot start {cmd[0]!r}: {e.strerror or e}" + (f" (cwd {cwd})" if cwd else "")
            log.write((reason + "\n").encode())
            return reason


def classify(rc: int | None, failure: Mapping[str, Any], tail: str, *, windows: list[float],
             summary: Mapping[str, Any] | None = None, rss_gib: float | None = None, host_gib: float | None = None,
             oom_kill_rose: bool | None = None) -> tuple[str, str, bool]:
    """(status, reason, killed from outside) of a trial process that exited by itself with ``rc`` (negative: the
    signal), given its ``failure.json`` (``kind``, ``message``), its log ``tail``, its measured ``windows``, its
    ``summary``, its last RSS against the host's memory, and whether the kernel's OOM-kill count rose meanwhile
    (None: unknown). Pure: the table of outcomes in the module docstring."""
    if rc == 0 and failure.get("kind") is None:
        if not windows:
            return "no_report", ("exited 0 without reporting a measured window (does it run training.max_steps "
                                 "steps, calling run.step() after each?)"), False
        last = (summary or {}).get("last_loss")
        if last is not None and not math.isfinite(float(last)):
            return "nan_loss", f"final loss {last}", False
        return "ok", "", False
    kind = failure.get("kind") or _exit_code_kinds().get(rc, "crash")
    if kind not in STATUSES or kind in ("ok", "pruned"):
        kind = "crash"
    reason = str(failure.get("message") or "")
    outside = False
    if rc is not None and rc < 0:
        kind = "crash"
        reason = f"killed by {_signal_name(rc)}" + (f"; {reason}" if reason else "")
        if rc == -signal.SIGKILL:
            if oom_kill_rose:
                kind, reason = "oom", reason + " (the kernel's OOM killer: its oom_kill count rose)"
            elif isinstance(rss_gib, (int, float)) and host_gib and rss_gib >= HOST_MEMORY_SHARE_OOM * host_gib:
                kind, reason = "oom", reason + f" (its RSS had reached {rss_gib:.1f} of {host_gib:.1f} GiB)"
            else:
                outside = True
                reason += " from outside (no OOM kill recorded, memory not near the host's)"
    elif not reason:
        reason = f"exit code {rc}"
    if kind == "crash" and any(m in tail for m in _OOM_MARKERS):
        kind = "oom"
    return kind, reason, outside


def run_trial(
    cfg: Config,
    trial_dir: Path,
    *,
    timeout_s: float,
    heartbeat_timeout_s: float,
    on_window: OnWindow | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_launch: Callable[[int], None] | None = None,
    on_measure: Callable[[], None] | None = None,
    launch: Launcher = launch_command,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    poll_s: float = 0.2,
    held: Held | None = None,
    budget_s: float | None = None,
) -> TrialOutcome:
    """Run one trial of ``cfg`` in a fresh process group under ``trial_dir`` (see the module docstring).

    ``on_window(i, tokens_per_s, window_s)`` is called for each measured window (``window_s``: its own seconds,
    or None); returning True prunes the trial. ``on_phase(text)`` gets "launching", "warm-up (step s/w)", "measuring window k/K".
    ``on_launch(pgid)`` is called once the child runs; ``on_measure()`` once its last warm-up step has started
    (its measured windows follow; or the first window is seen first). ``budget_s``: the seconds from the launch
    within which a first window must come, else the trial is stopped, ``pruned`` with ``stopped_for_budget``
    (None: no such limit). ``launch`` builds the child's command line.
    ``env``: variables set in the child's environment (the study's shared compile caches); ``cwd``: its working
    directory (default the tuner's). ``held``: the trial's process, started ahead (``hold_trial``) in
    ``trial_dir``: its gate is opened in place of a launch, and the seconds from there are the trial's. A
    KeyboardInterrupt kills the child's group and propagates.
    """
    trial_dir = Path(os.path.abspath(trial_dir))  # absolute for the child; not resolved: a symlink is refused
    phase = on_phase or (lambda _text: None)
    phase("launching")
    oom_kills_before = _oom_kills()
    if held is not None:
        assert held.trial_dir == trial_dir, (held.trial_dir, trial_dir)
        config_path, proc, t0 = held.config_path, held.proc, held.open()
    else:
        t0 = time.monotonic()
        config_path, proc = _launch(cfg, trial_dir, launch, env, cwd)
    if isinstance(proc, str):
        return TrialOutcome("invalid_config", trial_dir, config_path, failure_reason=proc, log_tail=proc)
    dog = Watchdog(proc, trial_dir, cfg, timeout_s=timeout_s, heartbeat_timeout_s=heartbeat_timeout_s,
                   on_window=on_window, phase=phase, poll_s=poll_s, on_measure=on_measure,
                   end_at_summary=launch is launch_command, budget_s=budget_s)
    try:
        if on_launch is not None:
            on_launch(proc.pid)
        seen = dog.watch(t0)
    except BaseException:
        with interrupts_held():  # the child's group is ended whatever else arrives meanwhile (a burst of Ctrl-Cs)
            kill_group(proc)
        raise
    rc = proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stray grandchildren of a finished trial
    wall = time.monotonic() - t0
    if not seen.pruned:
        dog.drain()
    seen.timeline["end"] = round(wall, 2)

    summary = None
    with contextlib.suppress(OSError, json.JSONDecodeError):
        summary = _slim_summary(json.loads((trial_dir / "summary.json").read_text()))
    if seen.ended_at_summary and rc == -signal.SIGKILL:  # the exit code the run was about to give
        rc = EXIT_CODES["interrupted" if (summary or {}).get("interrupted") else "ok"]
    if summary is None and seen.pruned and seen.last_window is not None:
        summary = _pruned_summary(seen.last_window, len(seen.step_losses))
    failure: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        failure = json.loads((trial_dir / "failure.json").read_text())
    tail = read_log_tail(trial_dir)
    windows = seen.windows
    out = TrialOutcome("ok", trial_dir, config_path, windows, None, summary, "", tail, rc, wall, seen.last_window,
                       seen.step_losses, dict(seen.timeline), held.record(t0) if held is not None else None)
    if seen.killed_reason:
        out.status, out.failure_reason = seen.killed_kind, seen.killed_reason
        out.stopped_for_budget = seen.stopped_for_budget
    elif seen.pruned:
        out.status = "pruned"
        out.failure_reason = f"pruned after window {len(windows)} ({windows[-1]:,.0f} tok/s/gpu)"
    else:
        after = _oom_kills() if rc == -signal.SIGKILL else None
        rose = None if oom_kills_before is None or after is None else after > oom_kills_before
        out.status, out.failure_reason, out.killed_from_outside = classify(
            rc, failure, tail, windows=windows, summary=summary, rss_gib=(seen.last_window or {}).get(
                MAX_RSS_GIB), host_gib=_host_memory_gib() if rc == -signal.SIGKILL else None,
            oom_kill_rose=rose)
        if out.status == "ok":
            out.value = statistics.median(windows)
    return out
