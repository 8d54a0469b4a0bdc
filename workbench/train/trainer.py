"""The training loop: one ``Trainer`` that builds model, data and optimizer from a ``Config`` and runs measured
steps.

The step (``Trainer.train_step``) reads top to bottom: data_wait, h2d, forward, backward per micro-batch, then
grad_sync, optimizer; each phase is an NVTX range timed without a host sync inside the step. docs/training.md
describes its options (compile, CUDA graphs, FP8, checkpointing, data parallelism).
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import pickle
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from loaders.pipeline import BatchPipeline
from workbench.config import Config, ConfigError, to_dict
from workbench.files import atomic_write
from workbench.train.flops import device_peak_tflops
from workbench.train.fp8 import convert_to_fp8
from workbench.train.allocator import apply_allocator_settings
from workbench.train.memory_model import predict_peak, summary_fields
from workbench.train.metrics import LaunchTimer, PrometheusExporter, StepRecord
from workbench.train.hf import model_args
from workbench.train.model import ModelArgs
from workbench.train.ops import resolve
from workbench.train.optim import build_optimizer, lr_at, set_lr
from workbench.train.overlap import DDPCommTimer, OverlapScheduler, layer_units
from workbench.train.reload import ConfigReloader, ConfigSource, ReloadRejected, carry_position
from workbench.train.context import NanLossError, RunContext
from workbench.train.session import RunSession, resolve_device
from workbench.train.workload import workload_for
from workbench.vocab import COMPILE_S

log = logging.getLogger("workbench")

__all__ = ["Trainer", "NanLossError", "build_model_args", "preload", "resolve_device"]


def build_model_args(cfg: Config) -> ModelArgs:
    return model_args(cfg.model.name, cfg.model.config_path)


def preload(cfg: Config) -> list[str]:
    """Import the modules a run of ``cfg`` imports at its first use of them, touching no device: Inductor (with
    Dynamo) where it compiles, Triton where a Triton kernel runs. A process started ahead of its trial pays them
    before its gate opens (``RunContext.hold``). Not torchao: its float8 modules may ask the device's capability
    at import, which initialises CUDA before the allocator's settings are in the environment. Returns the names."""
    cd = cfg.loongforge.compute_domain
    names = ["torch._inductor.compile_fx"] if cd.compile != "none" else []
    if "triton" in cd.effective_ops().values() or cd.triton_casts:
        names += ["triton", "triton.language"]
    for name in names:
        importlib.import_module(name)
    return names


class LossModule(nn.Module):
    """``forward`` returns (loss_sum, n), so DDP and torch.compile see the whole loss; its inputs are the workload's
    (workload.py)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor):
        return self.model.loss(*inputs)


def _shape_key(inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[int, ...], ...]:
    """A captured graph serves one shape of every input."""
    return tuple(tuple(x.shape) for x in inputs)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    loss_sum: torch.Tensor
    n_tokens: torch.Tensor


class Trainer:
    """Builds everything from a Config; ``run()`` trains and returns the summary."""

    def __init__(self, cfg: Config, *, out_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 context: RunContext | None = None, config_source: ConfigSource | None = None,
                 trust_checkpoint: bool = False, echo: bool = True, blocks: int | None = None) -> None:
        self.cfg = cfg
        self.blocks = blocks  # a shallow model for compile_only(): at most this many blocks in each stack
        self.frozen, self.gc_settle_s = 0, 0.0  # the objects settle_heap froze, and its seconds
        self.heap_frozen = False  # settle_heap froze the heap; thaw_heap has not returned it yet
        # the allocator settings' one application, before CUDA initialises; an option torch does not know is a
        # ConfigError
        self.allocator_env = apply_allocator_settings(cfg)
        self.rank, self.world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        self.device = resolve_device(cfg)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if blocks:  # a shallow twin compiles beside a measured run: the allocator holds it to its share
                torch.cuda.set_per_process_memory_fraction(cfg.hardware.memory_fraction_limit, self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        torch.manual_seed(cfg.training.seed)
        self.out_dir = Path(out_dir) if out_dir else (Path(cfg.metrics.out_dir) if cfg.metrics.out_dir else None)
        t = cfg.training
        self.amp_dtype = torch.bfloat16 if (t.dtype == "bf16" or (t.dtype == "auto" and self.device.type == "cuda")) \
            else None

        self._build_model(trust_checkpoint)
        self.loss_module: nn.Module = LossModule(self.model)
        self._wire_gradient_sync()
        self._compile_model()
        self.compile_s = 0.0

        self.opt = build_optimizer(self.model, cfg.training, self.device, capturable=self.opt_graph_on)
        self.grad_accum = self._grad_accum()
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._opt_graph: torch.cuda.CUDAGraph | None = None
        self._pool = None

        # data
        self.data_dir = Path(data_dir) if data_dir else self._data_dir()
        self.pipeline = self._pipeline()
        self.prom = PrometheusExporter.start(cfg.metrics.prometheus_port, cfg.metrics.prometheus_addr) \
            if (cfg.metrics.prometheus_port and self.rank == 0) else None
        if self.rank == 0:  # what runs, where, on what, and where to watch it: one line before any step
            where = f"{self.device} ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" \
                else str(self.device)
            data = f"{self.data_dir}" + (" (synthetic corpus)" if not cfg.data.loongbin_dir else "")
            served = f"/metrics on http://{cfg.metrics.prometheus_addr}:{self.prom.port}" if self.prom else \
                "no /metrics endpoint"
            log.info("model %s: %s parameters on %s x %d; data %s; %s", cfg.model.name,
                     f"{sum(p.numel() for p in self.model.parameters()):,}", where, self.world, data, served)
        self.reloader = ConfigReloader(config_source, cfg)  # SIGUSR1 re-reads the config file (reload.py)
        self.launch = LaunchTimer()  # host time of each CUDA graph replay() (graph capture only)
        self.peak = device_peak_tflops(self.device, cfg.hardware.peak_tflops)
        # the trial contract's signals and files are the run context's (python -m workbench.train's; none given:
        # no files); the measurement side (phases, windows, traces) is the run API's, as for a loop of one's own
        self.context = context or RunContext()
        self.session = RunSession(cfg, device=self.device, out_dir=self.out_dir, context=self.context,
                                  world=self.world, rank=self.rank, peak_tflops=self.peak, prometheus=self.prom,
                                  echo=echo)
        self.session.annotate, self.session.window_extras = self._comm_per_step, self._window_extras
        self.timer, self.profiler, self.writer = self.session.timer, self.session.profiler, self.session.writer
        self.step = 0
        if self.ckpt_dir is not None and (self.ckpt_dir / "latest.pt").exists():  # a resumed run
            self.load_checkpoint(self.ckpt_dir / "latest.pt")

    # ------------------------------------------------------------------ setup helpers
    def _grad_accum(self) -> int:
        return self.cfg.effective_grad_accum_steps(self.world)

    def _data_dir(self) -> Path:
        if self.cfg.data.loongbin_dir:
            return Path(self.cfg.data.loongbin_dir)
        raise ValueError("data.loongbin_dir is not set: point it at a shard directory written by "
                         "`python -m loaders.preprocess`, or run with --synthetic")

    def _pipeline(self):
        self.shards = self.workload.open_shards(self.data_dir)  # data the model cannot take: a ConfigError now
        return self._new_pipeline(self.cfg)

    def _new_pipeline(self, cfg: Config) -> BatchPipeline:
        return self.workload.pipeline(cfg, self.shards, seed=cfg.data.seed + 1_000_003 * self.rank,
                                      device=self.device)

    # ------------------------------------------------------------------ the step
    def train_step(self) -> tuple[StepRecord, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches; returns its record and device loss (hand them to
        ``session.step_done``, which closes the step)."""
        timer, loss_acc = self.timer, torch.zeros((), device=self.device)
        real = padded = 0
        flops = 0.0
        set_lr(self.opt, lr_at(self.cfg.training, self.step))  # host-side write (a device fill_ under graph capture), no sync
        for micro in range(self.grad_accum):
            with timer.phase("data_wait"):
                batch = next(self.pipeline)  # blocks only if the loader fell behind
            with timer.phase("h2d"):
                batch.ready()  # the current stream waits on the side-stream copy; no host sync
                inputs = self.workload.inputs(batch)
            # no gradient communication on accumulation micro-steps; under CUDA graphs the scheduler
            # all-reduces every bucket after the replay (workbench/train/overlap.py says why)
            quiet = self.comm is not None and (micro < self.grad_accum - 1 or self.graphs_on)
            with self.comm.no_sync() if quiet else nullcontext():
                if self.graphs_on:
                    with timer.phase("forward"):  # forward + backward: one graph replay
                        loss_sum, n_tok = self._graph_fwd_bwd(inputs)
                else:
                    with timer.phase("forward"), torch.autocast(self.device.type, self.amp_dtype,
                                                                enabled=self.amp_dtype is not None):
                        loss_sum, n_tok = self.compute(*inputs)
                        loss = loss_sum / n_tok.clamp(min=1) / self.grad_accum
                    with timer.phase("backward"):
                        loss.backward()
            loss_acc += loss_sum.detach() / n_tok.clamp(min=1) / self.grad_accum
            batch.release()  # CPU path: the staging block may be refilled now
            r, p, f = self.workload.counts(batch)
            real, padded, flops = real + r, padded + p, flops + f
        with timer.phase("grad_sync"):  # the exposed communication
            if self.comm is not None:
                self.comm.finish()  # launch the buckets not yet in flight, wait for all (device-side on CUDA)
        with timer.phase("optimizer"):
            if self.opt_graph_on:
                self._graph_optimizer()
            else:
                if self.cfg.training.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip)
                self.opt.step()
                self.opt.zero_grad(set_to_none=not self.graphs_on)  # in place under capture: the graphs hold them
        self.step += 1  # the step's end is stamped by the session (step_done)
        return StepRecord(self.step, real, padded, batch.seq_len, flops), loss_acc

    # ------------------------------------------------------------------ compile and capture up front
    def bucket_lengths(self) -> list[int]:
        """The row lengths the pipeline can hand out, longest first."""
        return self.pipeline.batch_lengths()

    def precompile(self) -> float:
        """Compile, and under graph capture capture, every bucket shape before the first step, so that no
        measured step pays for it: forward + backward on a dummy batch per shape (one shape suffices for
        ``compile_shapes: dynamic`` without capture), no communication, gradients discarded. Parameters, the
        optimizer state and the data stream are untouched. Returns the seconds it took (``time/compile_s``)."""
        cd = self.cfg.loongforge.compute_domain
        if cd.compile == "none" and not self.graphs_on:
            return 0.0
        from torch._dynamo.utils import counters

        lengths, done = self.bucket_lengths(), 0
        # dynamic: the first length makes the graph with a symbolic length; when the second one needs no new
        # graph, that graph serves every length (code that specialises on the length, e.g. a Python loop over
        # it, makes dynamo compile per shape instead: then every shape is compiled here)
        one_for_all = cd.compile != "none" and cd.compile_shapes == "dynamic" and not self.graphs_on
        B, t0 = self.cfg.data.micro_batch_size, time.perf_counter()
        with self.comm.no_sync() if self.comm is not None else nullcontext():
            for T in lengths:
                graphs, done = counters["stats"]["unique_graphs"], done + 1
                inputs = self.workload.dummy_inputs(B, T, self.device)
                if self.graphs_on:
                    if _shape_key(inputs) not in self._graphs:
                        self._capture(inputs)  # restores the gradients it accumulated
                    continue
                with torch.autocast(self.device.type, self.amp_dtype, enabled=self.amp_dtype is not None):
                    loss_sum, n_tok = self.compute(*inputs)
                (loss_sum / n_tok.clamp(min=1)).backward()
                if one_for_all and done >= 2 and counters["stats"]["unique_graphs"] == graphs:
                    break
        if not self.graphs_on:
            self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        self.compile_s += elapsed
        log.info("compiled%s %d of %d bucket shape(s) in %.1f s", " and captured" if self.graphs_on else "",
                 done, len(lengths), elapsed)
        return elapsed

    # ------------------------------------------------------------------ CUDA graphs
    def _graph_fwd_bwd(self, inputs: tuple[torch.Tensor, ...]):
        g = self._graphs.get(_shape_key(inputs))
        if g is None:
            g = self._capture(inputs)
        for static, x in zip(g.inputs, inputs):
            static.copy_(x)
        t0 = time.perf_counter()
        g.graph.replay()  # asynchronous: the host time is the launch, not the graph's work
        self.launch.observe((time.perf_counter() - t0) * 1e6)
        return g.loss_sum, g.n_tokens

    def _ensure_static_grads(self) -> None:
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Graph:
        self._ensure_static_grads()
        static = tuple(x.clone() for x in inputs)
        grads = [p.grad.clone() for p in self.model.parameters()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture (allocator, autotuning, lazy init)
            for _ in range(3):
                with torch.autocast("cuda", self.amp_dtype, enabled=self.amp_dtype is not None):
                    ls, nt = self.compute(*static)
                (ls / nt.clamp(min=1) / self.grad_accum).backward()
        torch.cuda.current_stream().wait_stream(side)
        for p, g0 in zip(self.model.parameters(), grads):
            p.grad.copy_(g0)  # undo the warm-up's accumulation
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            with torch.autocast("cuda", self.amp_dtype, enabled=self.amp_dtype is not None):
                ls, nt = self.compute(*static)
            (ls / nt.clamp(min=1) / self.grad_accum).backward()
        g = _Graph(graph, static, ls, nt)
        self._graphs[_shape_key(inputs)] = g
        return g

    def _graph_optimizer(self) -> None:
        if self._opt_graph is None:
            grads = [p.grad.clone() for p in self.model.parameters()]
            params = [p.detach().clone() for p in self.model.parameters()]
            state = {k: {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in s.items()}
                     for k, s in self.opt.state.items()}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: creates the optimizer state
                for _ in range(2):
                    self._optimizer_body()
            torch.cuda.current_stream().wait_stream(side)
            # restore what the warm-up changed, so the first real step is exact
            with torch.no_grad():
                for p, p0, g0 in zip(self.model.parameters(), params, grads):
                    p.copy_(p0)
                    p.grad.copy_(g0)
                for p, s in self.opt.state.items():
                    s0 = state.get(p)
                    for n, v in s.items():
                        if isinstance(v, torch.Tensor):
                            v.copy_(s0[n]) if s0 is not None else v.zero_()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                self._optimizer_body()
            self._opt_graph = g
        t0 = time.perf_counter()
        self._opt_graph.replay()
        self.launch.observe((time.perf_counter() - t0) * 1e6)

    def _optimizer_body(self) -> None:
        if self.cfg.training.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip, foreach=True)
        self.opt.step()
        for p in self.model.parameters():
            p.grad.zero_()  # in place: the graphs hold these tensors

    def _build_model(self, trust_checkpoint: bool) -> None:
        """The workload's model on its device, with its ops (Triton's on CUDA), its weights (a checkpoint_path, unless
        a run resumes), FP8 Linears and activation checkpointing."""
        cfg, t = self.cfg, self.cfg.training
        cd = cfg.loongforge.compute_domain
        # what differs between a language model and the VLA is the workload's (workload.py)
        self.workload = workload_for(cfg)  # checks the model before any work: an invalid_config
        if self.blocks:
            self.workload.keep_blocks(self.blocks)
        self.args = self.workload.args
        backends = cd.effective_ops()
        if "triton" in backends.values() or cd.triton_casts:
            if self.device.type == "cuda":
                import kernels  # here, not at the top: only a Triton kernel on CUDA needs Triton imported

                kernels.configure(cd.kernels)  # LaunchConfigError: invalid_config
            elif "triton" in backends.values():  # Triton ops run on CUDA (tests run them under TRITON_INTERPRET=1)
                log.warning("Triton ops requested on the CPU: using the torch ops")
                backends = {op: "torch" if b == "triton" else b for op, b in backends.items()}
        with torch.device(self.device):  # parameters are made and initialised where they train
            self.model = self.workload.build(resolve(backends, fused_residual_norm=cd.fused_residual_norm))
        self.ckpt_dir = Path(t.checkpoint_dir) if t.checkpoint_dir else None
        self.trust_checkpoint = trust_checkpoint  # the user's flag only, never a config key (a study sets those)
        resuming = self.ckpt_dir is not None and (self.ckpt_dir / "latest.pt").exists()
        if cfg.model.checkpoint_path and not resuming:  # a resumed run's own checkpoint has the newer weights
            n = self.workload.load_weights(cfg.model.checkpoint_path)
            log.info("loaded %d tensors from %s", n, cfg.model.checkpoint_path)
        # FP8 swaps Linears for torchao's Float8Linear (same parameters) before anything wraps or compiles them
        self.fp8_linears = convert_to_fp8(self.model, cd, self.device.type, self.device.index or 0)
        if self.fp8_linears and self.device.type == "cpu":
            log.warning("FP8 on the CPU: torchao emulates the FP8 matmuls (FP8's numbers, not its speed)")
        self.model.set_activation_checkpointing(t.activation_checkpointing, t.activation_checkpointing_every)

    def _wire_gradient_sync(self) -> None:
        """Gradient sync with several processes (DDP or the overlap scheduler) and the graph-capture switches."""
        cfg = self.cfg
        self.comm: OverlapScheduler | DDPCommTimer | None = None  # gradient sync with several processes
        # graph capture by segment: forward+backward (graphs_on), and the optimizer too (opt_graph_on)
        self.graphs_on = cfg.loongforge.compute_domain.captures and self.device.type == "cuda"
        self.opt_graph_on = self.graphs_on and cfg.loongforge.compute_domain.graph_capture == "fwd_bwd+optimizer"
        if self.world > 1:
            ov = cfg.loongforge.overlap
            if ov.mode == "ddp":
                if self.graphs_on and (conflict := cfg.ddp_capture_conflict(self.world)) is not None:
                    raise ConfigError(conflict, key="loongforge.overlap.mode")
                self.loss_module = nn.parallel.DistributedDataParallel(
                    self.loss_module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                    bucket_cap_mb=ov.bucket_size_mb)
                self.comm = DDPCommTimer(self.loss_module, bucket_size_mb=ov.bucket_size_mb)
            else:  # starts every rank from rank 0's parameters, as DDP does
                ratio = cfg.effective_overlap_ratio if self.graphs_on else ov.overlap_ratio  # (CPU: no graphs)
                if ratio != ov.overlap_ratio:
                    log.warning("loongforge.overlap.overlap_ratio=%s has no effect under graph capture: the gradient "
                                "all-reduces run after the graph replay (workbench/train/overlap.py)", ov.overlap_ratio)
                self.comm = OverlapScheduler(layer_units(self.model), bucket_size_mb=ov.bucket_size_mb,
                                             overlap_ratio=ratio)

    def _compile_model(self) -> None:
        """``self.compute``: the loss module, compiled per the config (each block in place, or the whole loss)."""
        cd = self.cfg.loongforge.compute_domain
        self.compute = self.loss_module
        mode = cd.compile
        if mode != "none":
            from torch import _dynamo

            # one compiled graph per bucket shape: allow as many as there are buckets
            _dynamo.config.cache_size_limit = max(64, _dynamo.config.cache_size_limit)
            dynamic = cd.compile_shapes == "dynamic"
            if cd.compile_scope == "layer":
                self.workload.compile_parts(mode=mode, dynamic=dynamic)  # each block in place, and the head
            else:
                self.compute = torch.compile(self.loss_module, mode=mode, dynamic=dynamic)

    # ------------------------------------------------------------------ the run
    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        """Train to ``max_steps`` (default training.max_steps) inside the run context (its stop signals, with
        SIGUSR1's reload; its heartbeat after every step); returns the summary. Under
        ``metrics.profile_after_measure`` the profiled steps follow, and the summary is the one taken as the
        measurement ended (the data pipeline's counters too), with the profile's keys; on one rank a profiled step
        that raises ends the run there, with no trace and the error as ``profile/error``."""
        session = self.session
        total = max_steps or self.cfg.training.max_steps
        session.set_total(total)
        interrupted = False
        measured: dict[str, Any] | None = None  # the summary at the measurement's end, when profiled steps follow
        reload = {"flag": False}

        def _on_sigusr1(signum, frame):  # re-read the config file after the step (reload_config)
            reload["flag"] = True

        # SIGINT or SIGTERM: finish the step, then stop and checkpoint; a second one stops at once. On leaving, the
        # handlers before it come back (python -m workbench.train's: SIGUSR1 ignored with a line)
        with self.context.stop_signals({signal.SIGUSR1: _on_sigusr1}) as stop:
            t_start = time.perf_counter()
            self.precompile()
            self.settle_heap()
            session.step = self.step  # a resumed run counts on from its checkpoint
            session.start()
            failed_profile = False
            try:
                while self.step < session.last_step:
                    session.begin_step()
                    session.step_done(*self.train_step())
                    done = self.step >= session.last_step
                    # a reload waits for the profile's end; it closes the window first, as the profile's end does
                    reload_now = reload["flag"] and not (done or stop.requested or self.profiler.active)
                    if session.at_boundary() or stop.requested or reload_now:
                        session.close_window()  # note: one CPU-GPU sync per window, here
                        session.end_profile()
                    if self.step == total < session.last_step:  # the measurement ends: the profiled steps follow
                        measured = self._summary(time.perf_counter() - t_start, interrupted)
                    ck_every = self.cfg.training.checkpoint_every
                    if self.ckpt_dir and ck_every and self.step % ck_every == 0:
                        self.save_checkpoint()
                    if stop.requested:
                        interrupted = True
                        break
                    if reload_now:
                        reload["flag"] = False
                        self.reload_config()  # a recompile's time is time/compile_s ...
                        self.timer.start()  # ... charged to no step: the next one starts after it
            except Exception as e:
                # a step profiled after the measurement failed: the measurement before it stands. With more ranks
                # than one the others wait in its collectives, so there the failure ends the run as any other does
                if measured is None or self.world > 1:
                    raise
                failed_profile = True
                self.profiler.fail(f"{type(e).__name__}: {e}")
            finally:
                self.timer.record = False
                self.profiler.stop()  # a run that ended before the profile's last step keeps what it recorded
                self.thaw_heap()
        if self.ckpt_dir and failed_profile:  # the failed step may have left the optimizer mid-update
            log.warning("no checkpoint at the end: the profiled step %d failed mid-step", self.step + 1)
        elif self.ckpt_dir:
            self.save_checkpoint()
        if measured is not None:
            return {**measured, **self.profiler.summary(), "interrupted": interrupted}
        return self._summary(time.perf_counter() - t_start, interrupted)

    def _comm_per_step(self, recs: list[StepRecord], rows: list[dict[str, float]]) -> None:
        """Each step's all-reduce time; exposed: DDP's tail after backward, else the grad_sync phase."""
        if self.comm is None:
            return
        for rec, row, c in zip(recs, rows or [{}] * len(recs), self.comm.flush()):
            rec.comm_s = c["total_s"]
            rec.comm_exposed_s = c["exposed_s"] if c["exposed_s"] is not None else row.get("grad_sync")

    def _window_extras(self) -> dict[str, Any]:
        # the compile seconds so far: a window's record carries them, so a trial pruned before its summary still
        # tells how much of its start was compiling (the tuner's trial timeline)
        return {**self.pipeline.metrics(), **self.launch.snapshot(),  # (no launch figures without graph replays)
                "lr": lr_at(self.cfg.training, self.step - 1), COMPILE_S: self.compile_s}

    def _summary(self, elapsed: float, interrupted: bool) -> dict[str, Any]:
        s = self.session.summary()  # throughput, MFU, phases and losses over the measured windows
        s.update({
            "elapsed_s": elapsed, "interrupted": interrupted, COMPILE_S: self.compile_s,
            "model_params": sum(p.numel() for p in self.model.parameters()),
            "grad_accum_steps": self.grad_accum,
            **self.reloader.summary(),
            "ops/backends": dict(self.model.ops.backends),
            "fp8/recipe": self.cfg.loongforge.compute_domain.fp8,
            "fp8/converted_linears": len(self.fp8_linears),
            "training/checkpointed_blocks": self.workload.checkpointed_blocks(),
            "workload": self.workload.name,
            **_compile_cache_counts(),
            "kernels/launch": sys.modules["kernels"].launch_record() if "kernels" in sys.modules else [],
            "gc/frozen_objects": self.frozen, "gc/settle_s": self.gc_settle_s,
        })
        # the memory model's prediction beside the measured peak (on the CPU the tensors' share of the RSS); it
        # models the language model only
        if self.workload.name == "language_model":
            s.update(summary_fields(predict_peak(self.cfg, self.args, autocast=self.amp_dtype is not None,
                                                 backends=self.model.ops.backends)))
        s.update(self.pipeline.metrics())
        s.update(self.workload.summary_fields(s))
        if self.comm is not None:
            s.update(self.comm.describe())
        return s

    def settle_heap(self) -> None:
        """Collect the garbage of the build and the compile, then freeze what is left (the model, the compiled
        graphs and their caches: objects that live for the run), before the first step. A compiled model leaves
        the interpreter a heap whose full collection takes about a second, which it would otherwise start in
        whichever step first crosses its threshold, a measured one as likely as not; frozen, the collections
        during the run scan only what the steps allocate. The run's end unfreezes them (``thaw_heap``: a process
        may run more than one Trainer). The summary's ``gc/frozen_objects`` and ``gc/settle_s`` say what it
        did."""
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.heap_frozen = True
        self.frozen = gc.get_freeze_count()
        self.gc_settle_s = time.perf_counter() - t0

    def thaw_heap(self) -> None:
        """Return what ``settle_heap`` froze to the collector (idempotent)."""
        if self.heap_frozen:
            gc.unfreeze()
            self.heap_frozen = False

    def compile_only(self) -> dict[str, Any]:
        """Compile (and capture) what a run of this config compiles, then stop: no training step, no window, no
        checkpoint. With ``blocks`` the model is shallow: it fills the compile cache (``TORCHINDUCTOR_CACHE_DIR``,
        ``TRITON_CACHE_DIR``) for a later run of the full depth. The summary: the seconds it took and the cache's
        hits and misses."""
        elapsed = self.precompile()
        return {"compile_only": True, "blocks": self.blocks, COMPILE_S: elapsed, "workload": self.workload.name,
                "model_params": sum(p.numel() for p in self.model.parameters()), **_compile_cache_counts()}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path | None:
        if self.rank != 0 or self.ckpt_dir is None:
            return None
        # tensors and plain types only, so that load_checkpoint can use weights_only=True; atomic: a crash or a full
        # disk mid-save keeps the previous checkpoint, and a folder that cannot be made or written (atomic_write
        # makes it) is a DiskError, the run's failure kind ``disk``
        state = {"step": self.step, "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "data": self.pipeline.state_dict(), "config": to_dict(self.cfg), "torch_rng": torch.get_rng_state()}
        return atomic_write(self.ckpt_dir / "latest.pt", lambda f: torch.save(state, f))

    def load_checkpoint(self, path: str | Path) -> None:
        """Resume from ``path``. It loads with ``weights_only=True`` (tensors and plain types: a data file runs no
        code); a checkpoint that needs pickle is refused in one line unless the user passed ``trust_checkpoint``."""
        try:
            ck = torch.load(path, map_location=self.device, weights_only=not self.trust_checkpoint)
        except pickle.UnpicklingError:
            raise ConfigError(f"{path}: this checkpoint holds objects that only pickle can load, and loading them "
                              "could run code; expected tensors and plain types (a checkpoint this loop wrote). "
                              "Delete it, or pass --trust-checkpoint to python -m workbench.train if you wrote it",
                              key="training.checkpoint_dir") from None
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        if self.opt_graph_on:  # restore capturable lr tensors, then re-capture with the new state tensors
            for g in self.opt.param_groups:
                if not isinstance(g["lr"], torch.Tensor):
                    g["lr"] = torch.tensor(g["lr"], device=self.device)
        self.pipeline.load_state_dict(ck["data"])
        torch.set_rng_state(ck["torch_rng"].cpu())
        self.step = int(ck["step"])
        self._graphs.clear()
        self._opt_graph = None
        log.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------ config hot reload (SIGUSR1)
    def reload_config(self) -> dict[str, Any] | None:
        """Re-read the config file and apply the keys that may change while running, or reject the whole reload
        (workbench/train/reload.py); returns its event record (None: no file). Between steps only: ``run()``
        closes the window before and restarts the phase timer after. A new micro-batch rebuilds the pipeline at
        the same data position and compiles (and captures) its shapes here, outside any step."""
        r = self.reloader
        if r.source is None:
            log.warning("config reload: this run was started from a preset, it has no config file: nothing to reload")
            return None
        pipeline = position = None
        old, compiling = (self.cfg, self.grad_accum), False
        try:
            plan = r.plan(self.cfg, world=self.world, grad_accum=self.grad_accum, device=self.device)
            if plan.running.data.micro_batch_size != self.cfg.data.micro_batch_size:
                pipeline = self._new_pipeline(plan.running)  # a ValueError (no batch of that size) rejects it
                position = carry_position(self.pipeline, pipeline)
            self.cfg, self.grad_accum = plan.running, plan.grad_accum[1]
            if pipeline is not None:
                compiling = True
                self._graphs.clear()  # the forward+backward graphs bake in 1/grad_accum; the optimizer's stays
                self.precompile()  # the new shapes, now
        except (ReloadRejected, ValueError, torch.OutOfMemoryError) as e:
            self.cfg, self.grad_accum = old
            if pipeline is not None:
                pipeline.close()
            if compiling:  # the new shapes did not fit: no gradient left over, the old shapes' graphs again
                self._graphs.clear()
                self.opt.zero_grad(set_to_none=not self.graphs_on)  # in place under capture: the graphs hold them
                self.precompile()
            event = r.rejected(str(e) or type(e).__name__, step=self.step)
        else:
            if pipeline is not None:
                pipeline.continue_counters(self.pipeline)
                self.pipeline.close()
                self.pipeline = pipeline
                pipeline.start()  # its first reads and decodes now, not in the next step's data_wait
            event = r.applied(plan, step=self.step, position=position)
        self.writer.event(event)
        if self.prom:
            self.prom.reload(event["result"])
        return event

    def close(self) -> None:
        self.thaw_heap()
        if self.comm is not None:
            self.comm.remove()
        self.pipeline.close()
        self.writer.close()
        if self.prom:
            self.prom.close()


def _compile_cache_counts() -> dict[str, int]:
    """Hits and misses of Inductor's FX graph cache and AOTAutograd's cache in this process (a trial whose
    compiles all hit ran warm: ``TORCHINDUCTOR_CACHE_DIR`` is shared by a study's trials)."""
    if "torch._dynamo" not in sys.modules:
        return {}
    from torch._dynamo.utils import counters

    return {"compile/fx_graph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
            "compile/fx_graph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
            "compile/aot_autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
            "compile/aot_autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"])}
