"""Compile-ahead: the next search trial's graphs compiled while the current trial runs (``protocol.compile_ahead``).

A screened trial's device time is mostly its compile, during which the GPU waits: on the H200 (gr00t-n1.6,
2026-12-03) 9 to 78 s of the 46 s a screened trial took on average. So while trial n runs, the search asks the
sampler for the trials after it, n+1 .. n+depth (``protocol.compile_ahead_depth``), as more workers would (the
sampler sees them running), and compiles each one's config in a shallow twin beside it: the same config with
at most ``blocks`` blocks in each stack (``python -m workbench.train --compile-only --blocks K``), on the
study's compile cache. Every block of a stack compiles to one graph, so when n+1 starts, its compiles read the
cache. A twin only fills a cache: a twin that fails, or a cache that misses, costs n+1 nothing but the compile
it does anyway.

Rules the twins follow:

* only the built-in loop (a loop of one's own has no ``--compile-only``) and a config that compiles;
* a twin never captures CUDA graphs (``graph_capture: none``): a captured graph lives in the process that
  captured it and fills no cache, and the graphs compiled under capture are those compiled without it (a
  capture would also take memory a capped twin does not have);
* a twin runs beside a measured trial, so it must not push that trial out of memory. For the language model it
  starts only when the memory model's peaks of both, with its error on each and a context's worth for the twin,
  fit the share of the device a trial may use (``hardware.memory_fraction_limit``). For a workload the memory
  model does not cover (the VLA) the twin's allocator is held (``hardware.memory_fraction_limit`` of the twin's
  config, which ``--blocks`` enforces) to what a feasible trial leaves free: ``1 - objective.memory_share_limit``
  less both processes' contexts (``_MARGIN``); a twin that needs more fails, harmlessly;
* it runs niced (``NICE``), without loader workers, with Inductor's compile workers capped so that the measured
  trial keeps a core for its loop and one for each of its loader workers;
* twins run side by side, each with its share of the compile workers, and a twin starts only where the trial and
  every twin running fit the device together (the VLA's capped twins split the free share, so by default they run
  one at a time: ``depth_of``); on the H200 a screen
  (9-30 s) was often shorter than the next config's twin (16-77 s), so with one twin the GPU waited 108 of the
  study's 468 s for it (2026-12-05, ``sa``);
* a twin leaves the device to the measured windows beside it: from the trial's last warm-up step to its end,
  each twin's process is stopped (SIGSTOP; its compile workers, which touch no device, run on) and then
  continued. Two processes on one GPU share it by time-slicing, and a twin runs a forward and backward pass
  per shape and Inductor's benchmarks of its kernels' configs: a window beside them reads the twin's work as
  the trial's (``benchmarks/results/twins.csv``). A stopped twin's compile waits as long as the windows run
  (its record's ``paused_s``);
* a config whose graphs are compiled gets no twin: the graphs are those of its ``graph_key``, its config less
  what compiles nothing (``_NO_GRAPHS``: the capture, the loader, the allocator, the IO settings), and a trial
  that started, or a twin that finished or is compiling, of the same key fills the cache it would fill. (In
  gr00t-n1.6-vla-w7 on one H100 the twins of three configs that differed from the trial before only in capture
  compiled nothing new, and their trials waited 13-17 s for each: a twin's start-up.);
* before trial n+1 starts, its unfinished twin is waited for (its compile is the one n+1 would do; the wait is
  charged to n+1's device time); the twins of the trials still asked ahead run on, any other is stopped.
* a proposal for n+1 that the memory model refuses by itself gets no twin: the search tells it (an ``oom``
  without a run) and asks again (``Search.ask_ahead``), so the twin compiles a config that runs.

What each twin did is the trial's ``compile_ahead`` attribute: ``started`` (or why not), the twin's compile
seconds and its exit, the seconds it stood stopped (``paused_s``) and the seconds its trial waited for it.

Start-ahead (``protocol.start_ahead``, ``StartAhead``): the trial asked ahead gets its own process too, started
beside trial n and held at its gate (``workbench.tune.trial.hold_trial``, ``$WORKBENCH_HOLD``): the interpreter,
the imports (torch, the loop, Inductor and Triton where the config uses them; a loop of one's own: all it runs
before ``workbench.run()``) and the config are done while n holds the device, and n+1's device time starts at
the gate. A held process that had CUDA up at its gate (a loop of one's own that touched the device first) would
hold device memory beside the measured trial: the search turns start-ahead off after it. The process is n+1's
own, fresh: the allocator's settings reach it before CUDA starts, and nothing of an earlier trial is in it. It is
not niced (a niced process cannot take its priority back for its measured run). One whose trial does not run it
(the config became a repeat, the search ended) is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.config import Config, config_hash, dump_config, merge_overrides
from workbench.files import remove_tree
from workbench.train.hf import model_args
from workbench.train.memory_model import MODEL_ERROR, predict_peak
from workbench.train.vla import VLA_PRESETS
from workbench.tune.session import StudySession
from workbench.tune.trial import Held, hold_trial, kill_group, start_process
from workbench.vocab import COMPILE_S

__all__ = ["BEING_COMPILED", "COMPILED", "NICE", "NOTHING_TO_COMPILE", "CompileAhead", "StartAhead", "Twin", "graph_key",
           "twin_blocks"]

NICE = 10
"""Niceness of a twin: the measured trial's threads come first on a busy core."""

_CONTEXT_GIB = 1.0
"""A CUDA context and the allocator's slack: what the twin's process holds beyond its tensors."""

_MESSAGE = 600
"""Characters of a failed twin's message its record keeps (a CUDA out-of-memory message, with what was held)."""

_MARGIN = 0.02
"""The device's share kept free between a feasible trial and a capped twin (both processes' CUDA contexts)."""


NOTHING_TO_COMPILE = "nothing to compile"
"""A twin's skip reason for a config that compiles nothing (``compile: none``)."""

COMPILED, BEING_COMPILED = "its graphs are compiled", "its graphs are being compiled by"
"""How the skip reasons of ``CompileAhead.compiled_by`` begin: the trial reads its graphs from the cache."""


_NO_GRAPHS = ("loongforge.compute_domain.graph_capture", "loongforge.io_domain", "loongforge.memory_domain",
              "data.num_workers", "data.prefetch_batches", "hardware.memory_fraction_limit")
"""Config keys (or sections) that change no compiled graph: a captured graph replays the compiled kernels, the loader
and the IO feed the step, the allocator places its tensors."""


def graph_key(cfg: Config) -> str:
    """The graphs ``cfg`` compiles, as a short hash: its config less ``_NO_GRAPHS``. Two configs of one key compile
    the same graphs, so the compile cache one filled serves the other."""
    return config_hash(cfg, leave_out=_NO_GRAPHS)


def _shallow(cfg: Config) -> Any:
    """The model args of ``cfg``'s twin: at most ``twin_blocks`` blocks."""
    args = model_args(cfg.model.name, cfg.model.config_path)
    return replace(args, num_hidden_layers=min(twin_blocks(cfg), args.num_hidden_layers))


def twin_blocks(cfg: Config) -> int:
    """Blocks a twin of ``cfg`` keeps in each stack: one, or with every N-th block checkpointed N, so that both
    kinds of block (checkpointed and not) are compiled."""
    t = cfg.training
    return max(1, t.activation_checkpointing_every) if t.activation_checkpointing == "selective" else 1


@dataclass
class Twin:
    """One twin process: the trial it compiles for, its directory, its process and what it came to."""

    number: int
    dir: Path
    proc: subprocess.Popen[bytes] | None
    started: float = field(default_factory=time.monotonic)
    record: dict[str, Any] = field(default_factory=dict)
    stopped_at: float | None = None  # (monotonic) while its process is stopped for a measured trial
    key: str = ""  # the graph_key of its config

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the twin's own process (not its group: its compile workers touch no device); a
        SIGSTOP or SIGCONT also keeps the seconds it stood (the record's ``paused_s``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, sig)
        now = time.monotonic()
        if sig == signal.SIGSTOP and self.stopped_at is None:
            self.stopped_at = now
        elif sig == signal.SIGCONT and self.stopped_at is not None:
            self.record["paused_s"] = round(self.record.get("paused_s", 0.0) + now - self.stopped_at, 3)
            self.stopped_at = None

    def finish(self, status: str) -> dict[str, Any]:
        """The twin's record once its process is done (or stopped): its exit and its compile's seconds; for a
        failed twin, its ``failure.json``'s kind and message (``failure``, the message cut to ``_MESSAGE``
        characters: the study keeps why, its directory may not outlive the machine)."""
        rc = self.proc.returncode if self.proc is not None else None
        self.record.update(status=status, rc=rc, wall_s=round(time.monotonic() - self.started, 3))
        with contextlib.suppress(OSError, ValueError):
            s = json.loads((self.dir / "summary.json").read_text())
            self.record.update({k: s[k] for k in (COMPILE_S, "compile/fx_graph_cache_hit",
                                                  "compile/fx_graph_cache_miss") if k in s})
        if status == "failed":
            with contextlib.suppress(OSError, ValueError, AttributeError):
                f = json.loads((self.dir / "failure.json").read_text())
                self.record["failure"] = {"kind": str(f.get("kind")), "message": str(f.get("message"))[:_MESSAGE]}
        return self.record


class CompileAhead:
    """The twins of one search process: at most ``depth`` at a time, those of the trials asked ahead."""

    def __init__(self, session: StudySession) -> None:
        self.session = session
        self.depth = self.depth_of(session)
        self.twins: dict[int, Twin] = {}
        self.configs: dict[int, Config] = {}  # each running twin's config (the memory it may take)
        self.records: dict[int, dict[str, Any]] = {}
        self.compiled: dict[str, str] = {}  # graph_key -> who compiled its graphs: a trial that started, or a twin
        self.paused = False  # while a trial's measured windows run (``pause``)

    @staticmethod
    def depth_of(session: StudySession) -> int:
        """``protocol.compile_ahead_depth``; unset: 2 with CUDA (the host's cores are the twins'), else 1 (a CPU
        trial's compute is the cores), and 1 for a workload whose twins are capped (the VLA: ``twin_share`` splits
        what a feasible trial leaves among the twins, and on one H100 at depth 2, 0.03 of the device, both twins at
        micro-batch 32 ran out of it: a one-block twin of gr00t-n1.6-vla peaks at 4.28 GiB reserved at micro-batch
        32 and 7.03 at 64, and one alone holds 0.08, 6.3 GiB there and 11.2 on an H200)."""
        depth = session.spec.protocol.compile_ahead_depth
        if depth is not None:
            return int(depth)
        if "cuda" not in session.hardware.get("capabilities", ()):
            return 1
        return 1 if session.spec.model in VLA_PRESETS else 2

    @staticmethod
    def enabled(session: StudySession) -> bool:
        """``protocol.compile_ahead``; unset: on where a GPU waits for the compiles (CUDA, the built-in loop)."""
        on = session.spec.protocol.compile_ahead
        if on is None:
            return session.spec.trainer is None and "cuda" in session.hardware.get("capabilities", ())
        return bool(on) and session.spec.trainer is None

    def why_not(self, cfg: Config, beside: Config | None, others: tuple[Config, ...] = ()) -> str:
        """Why ``cfg`` gets no twin beside a trial of ``beside`` and the twins of ``others`` ('' when it may have
        one)."""
        if cfg.loongforge.compute_domain.compile == "none":
            return NOTHING_TO_COMPILE
        on_gpu = "cuda" in self.session.hardware.get("capabilities", ())
        if not on_gpu or beside is None or "cpu" in (cfg.hardware.device, beside.hardware.device):
            return ""  # (host memory: a twin takes a fraction of the trial's)
        if cfg.model.name in VLA_PRESETS or beside.model.name in VLA_PRESETS:  # no memory model: a capped twin
            return "" if self.twin_share() > 0 else (
                f"objective.memory_share_limit {self.session.spec.objective.memory_share_limit:g} leaves a twin no "
                "memory beside a feasible trial")
        gib = self.session.hardware.get("gpu_memory_gib")
        if not gib:
            return "the GPU's memory is not known"
        twins = (cfg, *others)
        need = (predict_peak(beside).total + sum(predict_peak(c, _shallow(c)).total for c in twins)) \
            * (1 + MODEL_ERROR) / 2**30 + _CONTEXT_GIB * len(twins)
        allowed = gib * beside.hardware.memory_fraction_limit
        if need > allowed:
            what = "its twin" if not others else f"{len(twins)} twins"
            return f"the trial and {what} need {need:.1f} GiB together, over the {allowed:.1f} GiB a trial may use"
        return ""

    def twin_share(self) -> float:
        """The device's share a capped twin may hold (a workload without a memory model): what a trial within
        ``objective.memory_share_limit`` leaves, less ``_MARGIN``, split among ``depth`` twins; 0 when nothing is
        left."""
        free = 1.0 - self.session.spec.objective.memory_share_limit - _MARGIN * self.depth
        return round(max(0.0, free / self.depth), 4)

    def start(self, number: int, cfg: Config, beside: Config | None, unpaid: str = "") -> bool:
        """Start the twin of trial ``number`` (config ``cfg``) beside the running trial of ``beside`` and the twins
        running. False (and the reason in the record) when it gets none; ``unpaid``: why twins cost this search
        more than they save (``budget.twins_unpaid``), and none starts."""
        self.stop(number)
        self._reap()
        key = graph_key(cfg)
        reason = unpaid or self.why_not(cfg, beside, tuple(self.configs.values())) or self.compiled_by(key)
        if reason:
            self.records[number] = {"status": "skipped", "reason": reason}
            return False
        s = self.session
        d = s.study_dir / "ahead" / str(number)
        remove_tree(d)
        d.mkdir(parents=True)
        blocks = twin_blocks(cfg)
        # no loader processes: the twin reads no batch (the graphs do not depend on them); no capture (see above)
        over: dict[str, Any] = {"data.num_workers": 0, "loongforge.compute_domain.graph_capture": "none"}
        if cfg.model.name in VLA_PRESETS and "cuda" in s.hardware.get("capabilities", ()):
            over["hardware.memory_fraction_limit"] = self.twin_share()
        cfg = merge_overrides(cfg, over)
        config_path = dump_config(cfg, d / "config.yaml")
        cmd = [sys.executable, "-m", "workbench.train", "--config", str(config_path), "--compile-only",
               "--blocks", str(blocks), "--out", str(d), "--summary", str(d / "summary.json"), "--no-prometheus",
               "-q"] + ([] if cfg.data.loongbin_dir else ["--synthetic"])
        loader = cfg.data.num_workers if beside is None else beside.data.num_workers
        # (not OMP_NUM_THREADS: Inductor's CPU kernels are keyed by the thread count, and would miss the trial's)
        threads = max(1, ((os.cpu_count() or 2) - loader - 2) // self.depth)  # (each twin its share)
        env = {**s.child_env(), "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
        proc = start_process(cmd, d / "log.txt", env=env, cwd=s.child_cwd(), nice=NICE)
        if isinstance(proc, str):
            self.records[number] = {"status": "skipped", "reason": proc}
            return False
        twin = Twin(number, d, proc, record={"status": "started", "blocks": blocks, "depth": self.depth}, key=key)
        if "hardware.memory_fraction_limit" in over:  # the share a capped twin held
            twin.record["memory_share"] = over["hardware.memory_fraction_limit"]
        if len(self.twins):
            twin.record["beside_twins"] = len(self.twins)
        self.twins[number], self.configs[number] = twin, cfg
        self.records[number] = twin.record
        if self.paused:  # (started beside windows being measured: it waits for their end too)
            twin.signal(signal.SIGSTOP)
        return True

    def compiled_by(self, key: str) -> str:
        """Why a config of graph_key ``key`` needs no twin: a trial or twin compiled, or compiles, its graphs ('' when
        none did)."""
        for number, twin in self.twins.items():
            if twin.key == key:
                return f"{BEING_COMPILED} trial {number}'s twin"
        return f"{COMPILED} ({self.compiled[key]})" if key in self.compiled else ""

    def _finish(self, twin: Twin, status: str) -> None:
        """``twin``'s record once its process is done or stopped; a twin that finished filled the cache of its key."""
        twin.finish(status)
        if status == "done":
            self.compiled.setdefault(twin.key, f"trial {twin.number}'s twin")

    def pause(self) -> None:
        """Stop every twin's process: a trial's measured windows are about to run."""
        self.paused = True
        for twin in self.twins.values():
            twin.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue the twins that ``pause`` stopped."""
        self.paused = False
        for twin in self.twins.values():
            twin.signal(signal.SIGCONT)

    def _reap(self) -> None:
        """Record the twins whose process is done (their memory is free for the next)."""
        for number, twin in list(self.twins.items()):
            if twin.proc is not None and twin.proc.poll() is not None:
                self._finish(twin, "done" if twin.proc.returncode == 0 else "failed")
                del self.twins[number]
                self.configs.pop(number, None)

    def wait(self, number: int, timeout_s: float, keep: tuple[int, ...] = (), beside: Config | None = None) -> float:
        """Before trial ``number`` (config ``beside``) starts: wait for its twin to finish (at most ``timeout_s``;
        then it is stopped); the twins of ``keep`` (the trials still asked ahead) run on where they fit beside
        it, any other is stopped. Returns the seconds waited. From here the trial's config fills the cache of its graph
        key (a twin asked for another config of that key is not started)."""
        if beside is not None and beside.loongforge.compute_domain.compile != "none":
            self.compiled.setdefault(graph_key(beside), f"trial {number}")
        for other in [k for k in self.twins if k != number and k not in keep]:
            self.stop(other)
        twin = self.twins.pop(number, None)
        self.configs.pop(number, None)
        if twin is None or twin.proc is None:
            if number in self.records:  # (finished before its turn, and reaped)
                self.records[number].setdefault("waited_s", 0.0)
            self._refit(beside)
            return 0.0
        t0 = time.monotonic()
        try:
            twin.proc.wait(timeout=max(0.0, timeout_s))
            self._finish(twin, "done" if twin.proc.returncode == 0 else "failed")
        except subprocess.TimeoutExpired:
            kill_group(twin.proc, grace_s=2.0)
            self._finish(twin, "stopped")
        waited = round(time.monotonic() - t0, 3)
        twin.record["waited_s"] = waited
        self._refit(beside)
        return waited

    def _refit(self, beside: Config | None) -> None:
        """The twins that run on were started beside an earlier trial: stop each that no longer fits beside the
        trial of ``beside`` and the twins kept before it (its trial compiles for itself)."""
        self._reap()
        if beside is None:
            return
        kept: list[Config] = []
        for number in list(self.twins):
            reason = self.why_not(self.configs[number], beside, tuple(kept))
            if reason:
                self.twins[number].record["stopped_for"] = reason
                self.stop(number)
            else:
                kept.append(self.configs[number])

    def stop(self, number: int | None = None) -> None:
        """Stop the twin of trial ``number`` (it will not run), or every twin (None: the search ends)."""
        for k in list(self.twins) if number is None else [number]:
            twin = self.twins.pop(k, None)
            self.configs.pop(k, None)
            if twin is None or twin.proc is None:
                continue
            if twin.proc.poll() is None:
                twin.signal(signal.SIGCONT)  # (a stopped process holds SIGTERM until it continues)
                kill_group(twin.proc, grace_s=2.0)
                self._finish(twin, "stopped")
            else:
                self._finish(twin, "done" if twin.proc.returncode == 0 else "failed")

    def running(self) -> int:
        """How many twins are compiling now, or stopped for a measured window (their process not yet done)."""
        return sum(1 for twin in self.twins.values() if twin.proc is not None and twin.proc.poll() is None)

    def record(self, number: int) -> dict[str, Any] | None:
        """What trial ``number``'s twin did (None: it had none asked for)."""
        return self.records.get(number)


class StartAhead:
    """The held processes of one tuner process (see the module docstring), by key: the search's by trial number,
    the measured runs' (baseline repeats, A/B pairs) by their folder."""

    def __init__(self, session: StudySession) -> None:
        self.session = session
        self.held: dict[Any, Held] = {}

    @staticmethod
    def enabled(session: StudySession) -> bool:
        """``protocol.start_ahead``; unset: on for the built-in loop, which touches no device before its gate. (On
        a CPU too: the held process's imports overlap the start-up of the run beside it, not its measured windows;
        the default study measured the same speeds and a 3.1% noise floor with it, 6% without, on 2 cores.) A loop
        of one's own holds in ``workbench.run()``, which only it knows comes before its first device work: on when
        the study says so. The search holds its next trial only where it asks for it ahead anyway (``Search``)."""
        on = session.spec.protocol.start_ahead
        if on is None:
            return session.spec.trainer is None
        return bool(on)

    def start(self, key: Any, cfg: Config, config_hash: str, run_dir: Path) -> None:
        """Start the process of run ``key`` (config ``cfg``, folder ``run_dir``), held at its gate."""
        s = self.session
        self.drop(key)
        self.held[key] = hold_trial(cfg, run_dir, config_hash, launch=s.launch, env=s.child_env(),
                                    cwd=s.child_cwd())

    def take(self, key: Any, config_hash: str) -> Held | None:
        """Run ``key``'s held process, for its run; None (and a held one stopped) where it has none of that
        config."""
        held = self.held.pop(key, None)
        if held is not None and held.config_hash != config_hash:
            held.stop()
            return None
        return held

    def drop(self, key: Any) -> None:
        """Stop run ``key``'s held process: nothing will run it."""
        held = self.held.pop(key, None)
        if held is not None:
            held.stop()

    def stop(self) -> None:
        """Stop every held process (the search ends, the tuner is stopped, or another run came next)."""
        for key in list(self.held):
            self.drop(key)
