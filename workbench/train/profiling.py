"""A torch.profiler trace of a few measured steps (``metrics.profile_steps``, ``--profile N``), Perfetto-readable.

The profiler runs over the ``N`` steps after ``training.warmup_measure_steps``: it starts before the first of them
and stops after the last, with CPU activity always and CUDA activity on CUDA. Each step is a ``step <n>`` range
and each of its phases a range named after the phase (``PhaseTimer`` opens them only while the profiler records,
so an unprofiled step pays nothing), beside the NVTX ranges Nsight shows. The trace is written with
``export_chrome_trace`` to ``<out_dir>/trace.json`` (https://ui.perfetto.dev opens it); on CUDA the allocator's
history over the same steps is dumped to ``<out_dir>/memory_snapshot.pickle`` (https://pytorch.org/memory_viz),
except where recording it breaks the step (:func:`memory_history_conflict`).

On CUDA the trace also gives the step's launch overhead (``launch_overhead``, the summary's ``profile/*`` keys): the
launch calls per step and their host time, and the time per step the device ran no kernel, copy or set. A
launch-bound loop (many small kernels) pays its launch overhead as that device idle time, so it is the figure a
CUDA graph should shrink; the host time in launch calls is not, because a graph launch blocks while the device's
queue is full, and that wait is counted as launch-call time.

Stopping the profiler and writing the trace takes host time (and a device sync on CUDA): the trainer stops it at
a window boundary, after the window's flush, and restarts the phase timer's clock afterwards, so that time is
charged to no step. The profiled steps still carry the profiler's own overhead in their timings; so with
``metrics.profile_after_measure`` the profiled steps are the ``N`` steps after the measurement
(``training.max_steps``), run in addition and counted in no figure (``RunSession``): how the tuner traces its
measured runs. Only rank 0 profiles. A profiled step that fails after the measurement leaves the measurement
standing (the trainer's rule): :meth:`StepProfiler.fail` stops the profiler and writes nothing, and the summary's
``profile/error`` says why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.torch_version import TorchVersion

from workbench.errors import ConfigError
from workbench.train.timing import interval_union
from workbench.vocab import KERNEL_KINDS, KERNEL_SHARE

__all__ = ["ALLOC_CALLS", "KERNEL_RULES", "LAUNCH_CALLS", "StepProfiler", "kernel_kind", "kernel_shares",
           "launch_overhead", "memory_history_conflict"]

log = logging.getLogger("workbench")

MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events kept for the memory snapshot (the docs' example size; a few steps of a large model fit)."""


LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync"})
"""CUDA runtime and driver calls that put work on a stream: what a captured graph replaces with one launch."""
ALLOC_CALLS = frozenset({"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cuMemAlloc_v2", "cuMemFree_v2",
                         "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemSetAccess",
                         "cuMemAddressReserve", "cuMemAddressFree"})
"""CUDA runtime and driver calls of the device allocator (the caching allocator's growth and release, expandable
segments' mapping): ``cudaFree`` synchronizes the device, so the device idles for as long as they run."""
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Trace categories of device activity."""


_StepWork = tuple[list[float], list[tuple[float, float, str]], float, float, list[tuple[float, float]]]
"""What :func:`_step_work` returns."""


def _step_work(events: Iterable[Mapping[str, Any]]) -> _StepWork:
    """The profiled steps' launch calls (their durations), their device work ((start, end, kernel name) each), the
    span's start and end, as :func:`launch_overhead` defines them, and the allocator calls made within the steps
    ((start, end) each, ``ALLOC_CALLS``). Raises ValueError without step ranges."""
    launches: list[tuple[float, float, Any]] = []
    allocs: list[tuple[float, float]] = []
    work: list[tuple[float, float, Any, str]] = []
    step_ranges: list[tuple[float, float]] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name", "")
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        corr = (e.get("args") or {}).get("correlation")
        if cat in ("cuda_runtime", "cuda_driver") and name in LAUNCH_CALLS:
            launches.append((ts, dur, corr))
        elif cat in ("cuda_runtime", "cuda_driver") and name in ALLOC_CALLS:
            allocs.append((ts, ts + dur))
        elif cat in _DEVICE_WORK:
            work.append((ts, ts + dur, corr, name if cat == "kernel" else ""))
        elif cat == "user_annotation" and name.startswith("step "):
            step_ranges.append((ts, ts + dur))
    if not step_ranges:
        raise ValueError("the trace has no 'step <n>' ranges to measure the launch overhead over")
    begin = min(s for s, _ in step_ranges)
    host_end = max(e for _, e in step_ranges)
    mine = [(ts, dur, c) for ts, dur, c in launches if begin <= ts <= host_end]
    ids = {c for _, _, c in mine if c is not None}
    inside = [(s, e, n) for s, e, c, n in work if (c in ids if c is not None else begin <= s <= host_end)]
    end = max([host_end, *(e for _, e, _ in inside)])
    return [d for _, d, _ in mine], inside, begin, end, [(s, e) for s, e in allocs if begin <= s <= host_end]


def launch_overhead(events: Iterable[Mapping[str, Any]], steps: int) -> dict[str, float]:
    """Launch calls, their host time, and device busy and idle time per step, from a trace's ``traceEvents``.

    The steps are the ``step <n>`` ranges; their work is every kernel, copy and set whose launch call (matched by
    the trace's ``correlation`` id) was made within them, or, for device activity without one, that started within
    them. The span runs from the first range's start to the later of the last range's end and the end of that
    work: a captured graph's kernels run on after the host has left the step, and their time is the step's.
    Busy time is the union of the work's intervals (overlapping streams count once); idle is the rest of the
    span. All figures are per step. Raises ValueError when the trace has no step ranges.
    """
    return _launch_figures(_step_work(events), steps)


def _launch_figures(work: _StepWork, steps: int) -> dict[str, float]:
    """:func:`launch_overhead` of the steps' work (:func:`_step_work`'s)."""
    if steps <= 0:
        raise ValueError("the trace has no 'step <n>' ranges to measure the launch overhead over")
    calls, inside, begin, end, _ = work
    busy = interval_union([(s, e) for s, e, _ in inside])
    span = end - begin
    ms = 1e-3 / steps
    return {"launch_calls_per_step": len(calls) / steps, "launch_call_ms_per_step": sum(calls) * ms,
            "device_busy_ms_per_step": busy * ms, "device_idle_ms_per_step": (span - busy) * ms,
            "step_span_ms": span * ms}


_ATEN_MATH = ("add|sub|mul|div|neg|exp|log|pow|sqrt|rsqrt|tanh|sigmoid|where|mean|sum|max|min|clamp|abs|sign|sin|"
              "cos|lerp|addcmul|addcdiv|gt|lt|ge|le|eq|ne|masked_fill|argmax")
_NOT_FUSED = r"^(?!triton_(poi|red|per)_)"  # inductor's point-wise, reduction and persistent kernels
KERNEL_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter"),
    ("optimizer", r"multi_tensor_apply|foreach|adam|optimizer"),
    ("attention", r"sdpa|flash|fmha|attention|attn|cudnn::fusion"),
    ("matmul", _NOT_FUSED + r".*(gemm|nvjet|cutlass|xmma|wgmma|cublas|scaled_mm|matmul|triton_tem_|triton_mm|splitk)"
               r"|^aten::(mm|addmm|bmm|baddbmm|linear)$"),
    ("loss", r"cross_entropy|log_softmax|softmax|nll_loss|logsumexp|(^|_)ce_"),
    ("cast", r"fp8|float8|e4m3|e5m2|amax|abs_max|reciprocal|(?<!broad)cast"),
    ("norm", r"rms|rsqrt|pow_sum|norm(?!al)"),
    ("activation", r"silu|swiglu|gelu|sigmoid|relu|tanh"),
    ("rope", r"rope|rotary|mul_neg|neg_slice|neg_split|neg_kernel"),
    ("copy", _NOT_FUSED + r".*(memcpy|memset|copy|fill)|^aten::(zero_|clone|cat|stack|contiguous|to)$"),
    ("elementwise", rf"^triton_(poi|per|red)_|elementwise|vectorized|unrolled|reduce|dropout|embedding|"
                    rf"^aten::({_ATEN_MATH})_?$"),
)
"""(kind, regular expression searched in the lowercased name), first match wins; no match is ``other``. The order
settles the names that match two: cuDNN's flash attention is built of wgmma (attention before matmul); inductor's
fused kernels name every op they fuse, the matmul they feed (``triton_poi_fused__scaled_mm_..``, an FP8 cast) and
their dtype copies too, so none of them is a matmul or a copy and the costliest op they hold names them (a norm
before its activation); a direct copy runs in an element-wise kernel (copies before element-wise)."""
_KERNEL_RULES = tuple((kind, re.compile(rx)) for kind, rx in KERNEL_RULES)


def kernel_kind(name: str) -> str:
    """What a device kernel or CPU op of that name spends its time on (``workbench.vocab.KERNEL_KINDS``, never
    idle or padding; ``KERNEL_RULES``). The names are those torch.profiler records: cuBLAS's ``nvjet_*`` and
    CUTLASS GEMMs, cuDNN's ``*sdpa*`` attention, inductor's ``triton_{poi,red,per}_fused_<ops>``, the project's
    Triton kernels (``_rmsnorm_fwd_kernel``), ATen's (``silu_kernel``) and on a CPU its ops (``aten::mm``)."""
    lowered = name.lower()
    return next((kind for kind, rx in _KERNEL_RULES if rx.search(lowered)), "other")


def kernel_shares(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each kernel kind's share of the profiled steps' span (:func:`launch_overhead`'s): each kind's kernel time over
    all the work's, scaled to the busy share (streams that overlap share their busy time in proportion); ``alloc``
    the span the device ran no work while the host was in an allocator call (``ALLOC_CALLS``); ``idle`` the rest of
    the span the device ran no work. The shares sum to 1. Raises ValueError without step ranges."""
    return _kernel_figures(_step_work(events))


def _kernel_figures(work: _StepWork) -> dict[str, float]:
    """:func:`kernel_shares` of the steps' work (:func:`_step_work`'s)."""
    _, inside, begin, end, allocs = work
    span = end - begin
    shares = dict.fromkeys([k for k in KERNEL_KINDS if k != "padding"], 0.0)
    if span <= 0:
        return shares
    intervals = [(s, e) for s, e, _ in inside]
    busy = interval_union(intervals)
    # the allocator calls' time outside the busy intervals: |calls | busy| - |busy|
    alloc = interval_union(intervals + [(s, min(e, end)) for s, e in allocs]) - busy
    total = sum(e - s for s, e, _ in inside)
    for s, e, name in inside:  # (a copy or set has no kernel name)
        shares[kernel_kind(name) if name else "copy"] += (e - s) / total * busy / span if total else 0.0
    shares["alloc"] = alloc / span
    shares["idle"] = (span - busy - alloc) / span
    return shares


def memory_history_conflict(cfg: Any, version: str | None = None) -> str | None:
    """Why the allocator's history must not be recorded over a profile of ``cfg`` under torch ``version`` (default
    the installed one), or None. From torch 2.11, the backward of a checkpointed block that recomputes compiled code
    fails while the history records (``SystemError: <built-in method apply of FunctionMeta> returned NULL``,
    pytorch/pytorch#179536, a regression from 2.10): so with activation checkpointing and compile on, the trace is
    written without the snapshot."""
    if cfg.training.activation_checkpointing == "none" or cfg.loongforge.compute_domain.compile == "none":
        return None
    if TorchVersion(version or torch.__version__) < (2, 11):
        return None
    return ("activation checkpointing recomputes compiled blocks, whose backward torch >= 2.11 fails while the "
            "allocator's history records (pytorch/pytorch#179536)")


class StepProfiler:
    """Profiles steps ``start_after + 1 .. start_after + steps`` (1-based); a no-op when ``steps`` is 0."""

    def __init__(self, steps: int, *, start_after: int, out_dir: Path | None, device: torch.device,
                 enabled: bool = True, no_memory_history: str | None = None) -> None:
        if steps > 0 and out_dir is None:
            raise ConfigError("a profile needs an output directory: pass --out DIR or set metrics.out_dir",
                              key="metrics.profile_steps")
        self.requested = steps  # every rank ends a window where the profile ends, so windows match across ranks
        self.steps = steps if enabled else 0
        self.first = start_after + 1
        self.last = start_after + steps
        self.out_dir = out_dir
        self.cuda = device.type == "cuda"
        self.no_memory_history = no_memory_history if self.cuda else None
        """Why the allocator's history is not recorded on CUDA (:func:`memory_history_conflict`), or None."""
        self.error: str | None = None
        """Why the profiled steps failed (:meth:`fail`), or None."""
        self._prof: torch.profiler.profile | None = None
        self._profiled = 0
        self._memory = False
        self.trace_path: Path | None = None
        self.memory_path: Path | None = None
        self.launch: dict[str, float] = {}
        self.kernels: dict[str, float] = {}

    @property
    def active(self) -> bool:
        return self._prof is not None

    def place(self, *, start_after: int) -> None:
        """Profile steps ``start_after + 1 .. start_after + steps`` instead (before the first of them started)."""
        assert self._prof is None and not self._profiled, "the profile has started"
        self.first, self.last = start_after + 1, start_after + self.requested

    def ends_at(self, step: int) -> bool:
        """Whether the profiled steps end with step ``step`` (the trainer flushes its window there)."""
        return self.requested > 0 and step == self.last

    def before_step(self, step: int) -> None:
        """Called before step ``step`` (1-based) runs: starts the profiler before the first profiled step."""
        if self.steps <= 0 or step != self.first or self._prof is not None:
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        if self.cuda and self.no_memory_history is None:
            # the allocator's history over the profiled steps, for torch.cuda.memory._dump_snapshot
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
            self._memory = True
        elif self.cuda:
            log.info("profile: no memory snapshot: %s", self.no_memory_history)
        self._prof = torch.profiler.profile(activities=acts)
        self._prof.start()

    def step_range(self, step: int) -> contextlib.AbstractContextManager:
        """``step <n>`` as a profiler range while recording, else nothing."""
        if self._prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"step {step}")

    def after_step(self, step: int) -> None:
        if self._prof is not None:
            self._profiled += 1

    def stop(self) -> None:
        """Stop recording and write the trace (and on CUDA the memory snapshot); idempotent."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()  # on CUDA this flushes the device's activity: a sync, outside any step
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.trace_path = self.out_dir / "trace.json"
            prof.export_chrome_trace(str(self.trace_path))
            if self.cuda and self._profiled:
                with open(self.trace_path) as f:
                    events = json.load(f)["traceEvents"]
                work = _step_work(events)  # one pass over the trace for both
                self.launch = _launch_figures(work, self._profiled)
                self.kernels = _kernel_figures(work)
            if self._memory:
                self.memory_path = self.out_dir / "memory_snapshot.pickle"
                torch.cuda.memory._dump_snapshot(str(self.memory_path))
        if self._memory:
            torch.cuda.memory._record_memory_history(enabled=None)  # stop recording the allocator's history
            self._memory = False
        log.info("profiled %d step(s): %s%s", self._profiled, self.trace_path,
                 f", memory snapshot {self.memory_path}" if self.memory_path else "")

    def fail(self, error: str) -> None:
        """A profiled step failed: stop recording and write nothing, since a trace of a broken step would rank its
        ops as if it were whole; the summary's ``profile/error`` is ``error``."""
        prof, self._prof = self._prof, None
        self.error = error
        if prof is not None:
            with contextlib.suppress(Exception):  # the failure may have left the profiler's state broken too
                prof.stop()
        if self._memory:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._memory = False
        log.warning("the profiled steps failed (%s); no trace written", error)

    def summary(self) -> dict[str, Any]:
        """The run summary's ``profile/*`` keys (none when profiling is off); ``profile/error`` and
        ``profile/no_memory_snapshot`` only where they apply."""
        if self.steps <= 0:
            return {}
        return {"profile/steps": self._profiled, "profile/first_step": self.first if self._profiled else None,
                "profile/trace_path": str(self.trace_path) if self.trace_path else None,
                "profile/memory_snapshot_path": str(self.memory_path) if self.memory_path else None,
                **({"profile/error": self.error} if self.error else {}),
                **({"profile/no_memory_snapshot": self.no_memory_history} if self.no_memory_history else {}),
                **{f"profile/{k}": v for k, v in self.launch.items()},
                **{f"{KERNEL_SHARE}{k}": v for k, v in self.kernels.items()}}
