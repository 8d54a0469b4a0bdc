"""The measurement side of one training process, shared by the built-in Trainer and a loop of one's own: phases
timed by the :class:`PhaseTimer` (an NVTX range and a CUDA event each, no host sync inside a step), the windows
(``metrics.jsonl``, ``phases.csv``, Prometheus, a progress line), the NaN check and the run's throughput summary,
beating the heartbeat of its :class:`~workbench.train.context.RunContext` after each step. The context owns the
rest of the trial contract the tuner reads (docs/trial-contract.md): the signals, the heartbeat, the summary and
the failure file.

A loop of one's own uses it through :func:`run`::

    import workbench

    with workbench.run() as run:             # the trial's config, from $WORKBENCH_CONFIG
        for _ in range(run.max_steps):
            with run.phase("data_wait"):
                x, y = next(batches)
            with run.phase("forward"):
                loss = model(x, y)
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                opt.step(); opt.zero_grad()
            run.step(tokens=x.numel(), loss=loss.detach())
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from workbench.config import Config, load_config
from workbench.train.allocator import apply_allocator_settings
from workbench.train.context import (HOLD_ENV, NanLossError, RunContext, StopSignals, classify_exception,
                                     failure_record, write_failure)
from workbench.train.flops import device_peak_tflops
from workbench.train.metrics import MetricsWriter, StepRecord, memory_snapshot, summarize_comm, summarize_window
from workbench.train.profiling import StepProfiler, memory_history_conflict
from workbench.train.timing import PHASES, PhaseTimer
from workbench.vocab import (COMM_OVERLAP_PCT, COMM_TOTAL_S, MAX_RESERVED_GIB, MAX_RSS_GIB, PADDED_TOKENS_PER_S,
                             REAL_TOKENS_PER_S, STEP_S)

log = logging.getLogger("workbench")

# the run context's names stay importable from here, where the run API lives
__all__ = ["CONFIG_ENV", "HOLD_ENV", "OUT_ENV", "NanLossError", "Run", "RunContext", "RunSession", "StopSignals",
           "classify_exception", "failure_record", "progress_line", "resolve_device", "run", "write_failure"]

CONFIG_ENV = "WORKBENCH_CONFIG"
"""The environment variable holding the trial's config.yaml (set by the tuner for a study's ``trainer.command``)."""
OUT_ENV = "WORKBENCH_OUT"
"""The environment variable holding the trial's directory: heartbeat, metrics.jsonl, summary.json, failure.json."""


def resolve_device(cfg: Config) -> torch.device:
    """``hardware.device`` made concrete (``auto``: CUDA when there is one), on ``LOCAL_RANK``'s GPU."""
    want = cfg.hardware.device
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("hardware.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


class RunSession:
    """Steps in, windows out. The loop calls :meth:`start` once, times its phases with :meth:`phase`, hands each
    finished step to :meth:`step_done`, and closes a window where :meth:`at_boundary` says (or where it must, e.g.
    before a pause that no step should be charged for). :meth:`summary` aggregates the measured windows.

    A window is measured when its first step comes after ``training.warmup_measure_steps``; windows close at the
    warm-up's end and every ``training.log_every`` steps after it. The loss of each step may stay on the device:
    the window reads every loss back at once, with the timer's one sync.

    With ``metrics.profile_after_measure`` the loop runs ``metrics.profile_steps`` more steps after the measured
    ``total`` (:attr:`last_step`), profiled, as one window of their own that counts nowhere: their rows go to
    ``phases.csv`` as unmeasured, and :meth:`summary` is the one taken as the measurement ended (its windows,
    losses, steps and memory peaks), with the profile's keys.
    """

    def __init__(self, cfg: Config, *, device: torch.device, out_dir: str | Path | None = None,
                 context: RunContext | None = None, world: int = 1, rank: int = 0,
                 peak_tflops: float | None = None, total_steps: int | None = None, prometheus: Any = None,
                 echo: bool = True) -> None:
        self.cfg, self.device, self.world, self.rank, self.peak = cfg, device, world, rank, peak_tflops
        self.echo = echo  # a line on stdout per measured window (rank 0); the files get every window regardless
        self.timer = PhaseTimer(device, enabled=cfg.metrics.phase_timing)
        self.total = total_steps or cfg.training.max_steps
        """The measured run's steps: warm-up and windows (``training.max_steps`` unless the loop says otherwise)."""
        self.after_measure = cfg.metrics.profile_after_measure
        start_after = self.total if self.after_measure else cfg.training.warmup_measure_steps
        self.profiler = StepProfiler(cfg.metrics.profile_steps, start_after=start_after,
                                     out_dir=Path(out_dir) if out_dir else None, device=device, enabled=rank == 0,
                                     no_memory_history=memory_history_conflict(cfg))
        self._measured: dict[str, Any] | None = None  # the summary as the measurement ended (profile after it)
        self._step_range: contextlib.AbstractContextManager[Any] | None = None
        self.writer = MetricsWriter(out_dir if rank == 0 else None)
        self.context = context or RunContext()  # the heartbeat's owner (its file, if any)
        self.prom = prometheus
        self.step = 0
        self.windows: list[dict[str, Any]] = []
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self._pending: list[tuple[StepRecord, Any]] = []
        self.annotate: Callable[[list[StepRecord], list[dict[str, float]]], None] | None = None
        """Called with a closing window's records and phase rows, before they are written (the Trainer adds each
        step's communication time)."""
        self.window_extras: Callable[[], Mapping[str, Any]] | None = None
        """Figures added to every measured window (the Trainer's pipeline, graph-replay and lr figures)."""

    def set_total(self, total: int) -> None:
        """The measured run's steps, where the loop runs other than ``training.max_steps`` (a profile after the
        measurement moves with them). Before the first step."""
        self.total = total
        if self.after_measure:
            self.profiler.place(start_after=total)

    @property
    def last_step(self) -> int:
        """The loop's last step: ``total``, then under ``metrics.profile_after_measure`` the profiled steps (every
        rank runs them, though only rank 0 profiles: a step's collectives need them all)."""
        return self.total + (self.profiler.requested if self.after_measure else 0)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """``with session.phase("forward"): ...``: the phase runs from the previous stamp to the block's end."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        return self.timer.phase(name)

    def mark(self, name: str) -> None:
        """End phase ``name`` now (it ran from the previous stamp): for a loop whose phases are hooks, not blocks."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        self.timer.mark(name)

    def start(self) -> None:
        """The loop is about to take its first step: heartbeat 0 (the process reports), stamp the window start."""
        self.beat()
        self.timer.start()

    def beat(self) -> None:
        self.context.beat(self.step)

    def begin_step(self) -> None:
        """The next step starts: the profiler starts before its first profiled step, and a profiled step is a
        ``step <n>`` range with its phases inside."""
        n = self.step + 1
        if self.after_measure and n == self.total + 1 and self._measured is None:
            self._measured = self._summary()  # the measurement ended with the window just closed
        self.profiler.before_step(n)
        self.timer.record = self.profiler.active  # phase ranges in the trace, only while it records
        self._step_range = self.profiler.step_range(n)
        self._step_range.__enter__()

    def step_done(self, record: StepRecord, loss: Any) -> None:
        """Close step ``record.step`` (its phases end here); ``loss`` is a float or a 0-d tensor."""
        self.timer.step_end()
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        self.step = record.step
        self.profiler.after_step(self.step)
        self._pending.append((record, loss))
        self.beat()

    def at_boundary(self) -> bool:
        """Whether a window closes after the current step (the profile's end closes one too)."""
        warm, every = self.cfg.training.warmup_measure_steps, self.cfg.training.log_every
        if self.after_measure and self.step > self.total:  # the steps profiled after the measurement: one window
            return self.step >= self.last_step
        return self.step >= self.total or self.step == warm or (self.step > warm and (self.step - warm) % every == 0) \
            or self.profiler.ends_at(self.step)

    def end_profile(self) -> None:
        """After the profile's last step's window closed: write the trace (host time, a sync on CUDA), charged to no
        step (the phase clock restarts after it). Call with no step pending; a no-op at any other step."""
        if self.profiler.ends_at(self.step):
            self.timer.record = False
            self.profiler.stop()
            self.timer.start()

    def close_window(self) -> dict[str, Any] | None:
        """Read the pending steps back (one CPU-GPU sync), write them, and return the window's metrics when it is
        measured (None for the warm-up's windows or when no step is pending). Raises NanLossError."""
        if not self._pending:
            return None
        rows = self.timer.flush()
        recs = [rec for rec, _ in self._pending]
        n = len(recs)  # the losses, and the real tokens and FLOPs a loop gave as device tensors, in one read
        values = _read_back([lv for _, lv in self._pending] + [r.real_tokens for r in recs] + [r.flops for r in recs])
        losses = values[:n]
        for rec, real, flops in zip(recs, values[n:2 * n], values[2 * n:]):
            rec.real_tokens, rec.flops = round(real), float(flops)
        self._pending.clear()
        if self.annotate is not None:
            self.annotate(recs, rows)
        for rec, row, lv in zip(recs, rows or [{}] * len(recs), losses):
            rec.phases, rec.loss = row, lv
        if self.after_measure and recs[0].step > self.total:  # profiled after the measurement: counted nowhere
            self.writer.steps(recs, measured=False)
            if any(r.loss is not None and not math.isfinite(r.loss) for r in recs):
                log.warning("a non-finite loss in the steps profiled after the measurement (steps %d-%d); the "
                            "measurement before them stands", recs[0].step, recs[-1].step)
            return None
        bad = next((r for r in recs if r.loss is not None and not math.isfinite(r.loss)), None)
        if bad is not None:
            raise NanLossError(f"loss is {bad.loss} at step {bad.step}")
        known = [r.loss for r in recs if r.loss is not None]
        if known:
            self.first_loss = known[0] if self.first_loss is None else self.first_loss
            self.last_loss = known[-1]
        warm = self.cfg.training.warmup_measure_steps
        measured = recs[0].step > warm
        self.writer.steps(recs, measured=measured)
        if self.prom:
            self.prom.steps(recs)
        if not measured or "step" not in recs[0].phases:
            return None
        m = summarize_window(recs, world_size=self.world, peak_tflops=self.peak)
        m.update(memory_snapshot(self.device))
        if self.window_extras is not None:
            m.update(self.window_extras())
        self.windows.append(m)
        self.writer.window(m)
        if self.prom:
            self.prom.update(m)
        if self.rank == 0 and self.echo:
            print(progress_line(m, self.total), flush=True)
        return m

    def summary(self) -> dict[str, Any]:
        """Throughput, MFU, step time and phases over the measured windows (weighted by their steps), the losses;
        after a profile after the measurement, the summary as the measurement ended with the profile's keys."""
        if self._measured is not None:
            return {**self._measured, **self.profiler.summary()}
        return self._summary()

    def _summary(self) -> dict[str, Any]:
        windows = self.windows
        steps = sum(w["steps"] for w in windows)
        wall = sum(w[STEP_S] * w["steps"] for w in windows)

        def rate(key: str) -> float:
            return sum(w[key] * w[STEP_S] * w["steps"] for w in windows)

        achieved = rate("flops/achieved_tflops_per_gpu")
        s: dict[str, Any] = {
            "steps": self.step, "measured_steps": steps,
            REAL_TOKENS_PER_S: rate(REAL_TOKENS_PER_S) / wall if wall else None,
            PADDED_TOKENS_PER_S: rate(PADDED_TOKENS_PER_S) / wall
            if wall else None,
            "mfu_pct": (100 * achieved / wall / self.peak) if (wall and self.peak and achieved) else None,
            "peak_tflops": self.peak,
            STEP_S: wall / steps if steps else None,
            "phase_s_per_step": {p: (sum(w[f"time/{p}_s"] * w["steps"] for w in windows) / steps
                                     if steps and windows[0][f"time/{p}_s"] is not None else None)
                                 for p in PHASES},
            "first_loss": self.first_loss, "last_loss": self.last_loss,
            "device": str(self.device), "world_size": self.world,
            "gpu_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            "windows": len(windows),
            **self.profiler.summary(),
        }
        s.update(summarize_comm(windows))
        s.update(memory_snapshot(self.device))
        return s

    def close(self) -> None:
        self.timer.record = False
        self.profiler.stop()  # a run that ended before the profile's last step keeps what it recorded
        self.writer.close()


def _read_back(values: list[Any]) -> list[float | None]:
    """Floats of a window's values (losses, token counts, FLOPs): device tensors stacked and read in one transfer
    (in float64: a count stays exact), numbers as they are."""
    tensors = [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    out: list[float | None] = [None if v is None or isinstance(v, torch.Tensor) else float(v) for v in values]
    if tensors:
        read = torch.stack([v.detach().reshape(()).to(torch.float64) for _, v in tensors]).tolist()
        for (i, _), lv in zip(tensors, read):
            out[i] = lv
    return out


def progress_line(m: dict[str, Any], total: int) -> str:
    """One line per window: throughput, MFU, phase shares, memory, loss."""
    short = {"data_wait": "data", "h2d": "h2d", "forward": "fwd", "backward": "bwd", "grad_sync": "sync",
             "optimizer": "opt", "other": "other"}
    phases = " ".join(f"{short[p]} {m[f'time/{p}_pct']:.0f}%" for p in PHASES) \
        if m["time/forward_pct"] is not None else "phase timing off"
    mfu = f"MFU {m['mfu_pct']:.1f}%" if m.get("mfu_pct") is not None else "MFU n/a"
    mem = m.get(MAX_RESERVED_GIB)
    mem_s = f"mem {mem:.2f} GiB" if mem is not None else f"rss {m.get(MAX_RSS_GIB, 0):.2f} GiB"
    loss = m.get("loss")
    comm = f" | comm {1000 * m[COMM_TOTAL_S]:.1f} ms, {m[COMM_OVERLAP_PCT]:.0f}% hidden" \
        if m.get(COMM_TOTAL_S) and m.get(COMM_OVERLAP_PCT) is not None else ""
    loss_s = f"loss {loss:.4f}" if loss is not None else "loss n/a"
    return (f"step {m['step']}/{total} | {m[REAL_TOKENS_PER_S]:,.0f} tok/s/gpu | {mfu} | "
            f"{phases}{comm} | {mem_s} | {loss_s}")


# --------------------------------------------------------------------------- the run API of a loop of one's own


class Run:
    """What ``workbench.run()`` gives a loop: the trial's config, its phases, its steps."""

    def __init__(self, cfg: Config, session: RunSession, out_dir: Path | None) -> None:
        self.config = cfg
        """The trial's config (``workbench.config.Config``): the searched knobs' values are in it."""
        self.session = session
        self.out_dir = out_dir
        self.stop_requested = False
        """Set by SIGINT or SIGTERM: the loop should finish its step and leave the ``with`` block."""
        self.prepared: dict[str, Any] = {}
        """What :meth:`prepare` changed, for the summary."""

    def prepare(self, model: Any) -> Any:
        """The trial's knobs applied to a Hugging Face ``transformers`` model, in place
        (workbench/train/hf_prepare.py): attention, Liger's or the project's kernels, FP8, checkpointing, compile.
        Returns the model; what changed goes to the run's summary (``hf/patches``, ``hf/versions``). Raises
        ConfigError (an ``invalid_config`` trial) for a choice this model cannot take."""
        from workbench.train.hf_prepare import describe, prepare  # (imports torchao and the kernels on demand)

        model, applied = prepare(model, self.config, self.device)
        self.prepared = describe(applied)
        return model

    def collator(self) -> Any:
        """The data collator of a Hugging Face run of documents, as the trial's ``data.packing`` says: padding-free
        (``fill``: documents end to end with position ids) or each padded to its bucket (``bucket``); see
        :func:`workbench.train.hf_prepare.collator`."""
        from workbench.train.hf_prepare import collator

        return collator(self.config)

    @property
    def user(self) -> dict[str, Any]:
        """The study's ``user.*`` knob values (the config's ``user`` section)."""
        return dict(self.config.user)

    @property
    def max_steps(self) -> int:
        """Steps the loop runs: the protocol's (``training.max_steps``: warm-up plus the measured windows), then
        under ``metrics.profile_after_measure`` the ``metrics.profile_steps`` profiled after them."""
        return self.session.last_step

    @property
    def device(self) -> torch.device:
        """Where the config says to train (``hardware.device``; ``auto``: CUDA when there is one)."""
        return self.session.device

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time one phase of the step (one of ``workbench.vocab.PHASES``)."""
        return self.session.phase(name)

    def step(self, *, tokens: int, real_tokens: int | torch.Tensor | None = None, loss: Any = None,
             seq_len: int = 0, flops: float | torch.Tensor = 0.0) -> None:
        """One optimizer step is done: ``tokens`` it processed (padding included), ``real_tokens`` of them real
        (default all), its loss (a float or a 0-d tensor, read back at the window's end), and optionally the
        row length and the FLOPs (for MFU). ``real_tokens`` and ``flops`` may be 0-d tensors too, read back with
        the loss: a count made on the device (an attention mask's sum) costs no sync in the step."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"run.step(tokens=...) takes an int >= 0, got {tokens!r}")
        for name, v in (("real_tokens", real_tokens), ("flops", flops)):
            if isinstance(v, torch.Tensor):
                if v.numel() != 1 or v.is_complex():
                    raise ValueError(f"run.step({name}=...) takes a 0-d real tensor, got shape {tuple(v.shape)}")
            elif v is not None and (isinstance(v, bool) or not isinstance(v, (int, float) if name == "flops" else int)
                                    or v < 0):
                raise ValueError(f"run.step({name}=...) takes {'a number' if name == 'flops' else 'an int'} >= 0 "
                                 f"or a 0-d tensor, got {v!r}")
        real = tokens if real_tokens is None else real_tokens
        session = self.session
        flops = flops if isinstance(flops, torch.Tensor) else float(flops)
        session.step_done(StepRecord(session.step + 1, real, tokens, seq_len, flops), loss)
        if session.at_boundary():
            session.close_window()
            session.end_profile()
        session.begin_step()  # the loop's next step starts now


@contextlib.contextmanager
def run(config: str | os.PathLike | Config | None = None, *, out: str | os.PathLike | None = None) -> Iterator[Run]:
    """The run API of a loop of one's own: ``with workbench.run() as run: ...`` (see the module docstring).

    ``config`` defaults to ``$WORKBENCH_CONFIG`` (set by the tuner), else the default config; ``out`` to
    ``$WORKBENCH_OUT``, else no files. On leaving, it writes ``summary.json``; an exception writes
    ``failure.json`` with its failure kind and propagates. SIGINT and SIGTERM set ``run.stop_requested``. The
    files and signals are its :class:`RunContext`'s, as they are ``python -m workbench.train``'s.
    """
    if config is None:
        config = os.environ.get(CONFIG_ENV)
    cfg = config if isinstance(config, Config) else (load_config(config) if config else Config())
    out = out or os.environ.get(OUT_ENV)
    out_dir = Path(out) if out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    # under torchrun (the command itself launches it when a study has gpus > 1) rank 0 alone writes the files
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    files = out_dir if rank == 0 else None
    context = RunContext(heartbeat=files / "heartbeat" if files else None,
                         summary=files / "summary.json" if files else None, failure_dir=files,
                         gate=os.environ.get(HOLD_ENV))
    context.hold()  # started ahead by the tuner: the loop's imports are done; wait for the trial's start
    apply_allocator_settings(cfg)  # before CUDA initialises: the allocator knobs act on a loop of one's own too
    device = resolve_device(cfg)
    peak = device_peak_tflops(device, cfg.hardware.peak_tflops)  # MFU for the FLOPs run.step() is given
    session = RunSession(cfg, device=device, out_dir=out_dir, world=world, rank=rank, peak_tflops=peak,
                         context=context)
    handle = Run(cfg, session, out_dir)
    t0 = time.perf_counter()
    with context, context.stop_signals() as stop:  # an exception leaving the block: failure.json, and it goes on
        session.start()
        session.begin_step()
        try:
            yield handle
            session.close_window()
        finally:
            handle.stop_requested = handle.stop_requested or stop.requested
            session.close()
    context.finish({**session.summary(), **handle.prepared, "elapsed_s": time.perf_counter() - t0,
                    "interrupted": handle.stop_requested})
