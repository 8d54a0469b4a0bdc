"""Data-parallel gradient sync with two knobs: ``bucket_size_mb`` and ``overlap_ratio``.

``OverlapScheduler`` replaces DistributedDataParallel in the training loop when WORLD_SIZE > 1 and
``loongforge.overlap.mode`` is ``scheduler`` (the default); ``DDPCommTimer`` times DDP's own all-reduces under
``mode: ddp``. docs/training.md describes the buckets, the overlap, the streams, the timing and how it
composes with accumulation, CUDA graphs and torch.compile.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from workbench.config import bucket_bytes
from workbench.train.timing import interval_union

__all__ = [
    "BucketPlan",
    "DDPCommTimer",
    "OverlapScheduler",
    "layer_units",
    "overlap_count",
    "plan_buckets",
]

LayerUnits = Sequence[tuple[str, Sequence[nn.Parameter]]]


# --------------------------------------------------------------------------- the bucket plan


def layer_units(module: nn.Module) -> list[tuple[str, list[nn.Parameter]]]:
    """Trainable parameters grouped by layer, in forward (registration) order.

    Each child of a ``ModuleList`` / ``Sequential`` child is one layer
    (``layers.3``); any other direct child is one layer (``embed_tokens``,
    ``norm``, ``lm_head``); a parameter held by ``module`` itself is a layer of
    its own. A tied parameter is listed once, in its first owner.
    """
    units: dict[str, list[nn.Parameter]] = {}
    for name, p in module.named_parameters():  # deduplicates tied parameters
        if not p.requires_grad:
            continue
        parts = name.split(".")
        key = parts[0]
        if len(parts) > 2 and isinstance(getattr(module, parts[0], None), (nn.ModuleList, nn.Sequential)):
            key = f"{parts[0]}.{parts[1]}"
        units.setdefault(key, []).append(p)
    return list(units.items())


@dataclass(frozen=True, eq=False)
class BucketPlan:
    """One bucket: whole layers, in the order backward produces their gradients."""

    layers: tuple[str, ...]
    params: tuple[nn.Parameter, ...]
    numel: int
    nbytes: int


def plan_buckets(units: LayerUnits, bucket_bytes: int) -> list[BucketPlan]:
    """Buckets of about ``bucket_bytes`` from whole layers, taken in reverse order of ``units``.

    ``units`` are (name, parameters) in forward order (``layer_units``). A layer
    joins the open bucket when the bucket's size gets closer to ``bucket_bytes``
    with it than without it; otherwise the bucket is closed and the layer opens
    the next one. So a bucket overshoots the target by less than it would
    undershoot without its last layer, and a layer larger than the target is a
    bucket by itself.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: expected > 0")
    kinds = {(p.dtype, p.device) for _, ps in units for p in ps}
    if len(kinds) > 1:
        raise ValueError("the overlap scheduler needs one dtype and device for all parameters; "
                         f"got {sorted(map(str, kinds))}")
    plans: list[BucketPlan] = []
    names: list[str] = []
    params: list[nn.Parameter] = []
    size = 0

    def close() -> None:
        plans.append(BucketPlan(tuple(names), tuple(params), sum(p.numel() for p in params), size))

    for name, ps in reversed(list(units)):
        if not ps:
            continue
        unit = sum(p.numel() * p.element_size() for p in ps)
        if names and abs(size + unit - bucket_bytes) > abs(size - bucket_bytes):
            close()
            names, params, size = [], [], 0
        names.append(name)
        params.extend(ps)
        size += unit
    if names:
        close()
    return plans


def overlap_count(n_buckets: int, overlap_ratio: float) -> int:
    """Buckets all-reduced during backward: ``floor(ratio x n + 1/2)`` (0 -> none, 1 -> all)."""
    if not 0.0 <= overlap_ratio <= 1.0:
        raise ValueError(f"overlap_ratio={overlap_ratio}: expected a number in [0, 1]")
    return min(n_buckets, math.floor(overlap_ratio * n_buckets + 0.5))


# --------------------------------------------------------------------------- timing helpers


class _Intervals:
    """Per-step lists of communication intervals: CUDA event pairs or host timestamps."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.lock = threading.Lock()  # gloo's threads add host completion times
        self.current: list[list[Any]] = []  # [start, end] of this step's all-reduces
        self.window: list[list[list[Any]]] = []

    def start(self, stream: Any = None) -> list[Any]:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
            item = [ev, None]
        else:
            item = [time.perf_counter(), None]
        with self.lock:
            self.current.append(item)
        return item

    def end(self, item: list[Any], stream: Any = None) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
            item[1] = ev
        else:
            item[1] = time.perf_counter()

    def step_end(self) -> None:
        with self.lock:
            self.window.append(self.current)
            self.current = []

    def flush(self) -> list[list[tuple[float, float]]]:
        """Per step of the window: (start, end) seconds relative to the step's first start."""
        with self.lock:
            steps, self.window = self.window, []
        out = []
        for items in steps:
            items = [it for it in items if it[1] is not None]
            if not items:
                out.append([])
                continue
            if self.cuda:
                for _, e in items:  # note: complete after the loop's window sync (the current stream waited
                    e.synchronize()  # for them), so this costs microseconds, not a stall
                ref = items[0][0]
                out.append([(ref.elapsed_time(s) / 1e3, ref.elapsed_time(e) / 1e3) for s, e in items])
            else:
                ref = items[0][0]
                out.append([(s - ref, e - ref) for s, e in items])
        return out


# --------------------------------------------------------------------------- the scheduler


class _Bucket:
    __slots__ = ("plan", "flat", "views", "pending", "work", "timing")

    def __init__(self, plan: BucketPlan) -> None:
        self.plan = plan
        p0 = plan.params[0]
        self.flat = torch.zeros(plan.numel, dtype=p0.dtype, device=p0.device)
        self.views, off = [], 0
        for p in plan.params:
            self.views.append(self.flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        self.pending = len(plan.params)
        self.work: Any = None
        self.timing: list[Any] | None = None


class OverlapScheduler:
    """Bucketed, partly overlapped gradient all-reduce for data parallelism (see the module docstring).

    Arguments:
        units: (layer name, parameters) in forward order, e.g. ``layer_units(model)``.
        bucket_size_mb: target bucket size in MiB (``loongforge.overlap.bucket_size_mb``).
        overlap_ratio: share of buckets all-reduced during backward (``loongforge.overlap.overlap_ratio``).
        process_group: the data-parallel group; None = the default group.
        broadcast_from: rank whose parameters every rank starts from (as DDP does); None skips it.

    Use: micro-steps that must not communicate under ``no_sync()``; after the
    last backward, ``finish()``; at a window's end, ``flush()`` for the timings.
    ``enabled = False`` turns all communication off (gradients stay local): a
    compute-only reference for benchmarks, never for training.
    """

    def __init__(self, units: LayerUnits, *, bucket_size_mb: float, overlap_ratio: float,
                 process_group: Any = None, broadcast_from: int | None = 0) -> None:
        if not dist.is_initialized():
            raise RuntimeError("OverlapScheduler needs an initialised torch.distributed process group")
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.bucket_size_mb = float(bucket_size_mb)
        self.overlap_ratio = float(overlap_ratio)
        self.plan = plan_buckets(units, bucket_bytes(bucket_size_mb))
        if not self.plan:
            raise ValueError("OverlapScheduler: no trainable parameter")
        self.n_overlap = overlap_count(len(self.plan), overlap_ratio)
        self.buckets = [_Bucket(b) for b in self.plan]
        self.device = self.plan[0].params[0].device
        self.cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._timing = _Intervals(self.cuda)
        self._sync = True
        self._next = 0  # next bucket to launch, in bucket order
        self.enabled = True
        if broadcast_from is not None:
            self._broadcast(broadcast_from)
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i))
                       for i, b in enumerate(self.plan) for p in b.params]

    # -- the API the loop uses
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; nothing is launched."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    def finish(self) -> None:
        """Launch the buckets not yet in flight, wait for every bucket, leave averaged ``.grad``s.

        On CUDA the wait is device-side (the current stream waits for the comm
        stream); on the CPU it is a host wait on each gloo work.
        """
        if not self.enabled:
            self._reset()
            self._timing.step_end()
            return
        while self._next < len(self.buckets):
            self._launch(self._next)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
        else:
            for b in self.buckets:
                b.work.wait()  # host wait: gloo runs the all-reduce on its own threads
                if b.timing is not None and b.timing[1] is None:
                    b.timing[1] = time.perf_counter()  # no future callback on this backend
                torch._foreach_copy_([p.grad for p in b.plan.params], b.views)
        self._reset()
        self._timing.step_end()

    def flush(self) -> list[dict[str, float | None]]:
        """Per step since the last flush: ``total_s`` (union of all-reduce time), ``exposed_s`` None
        (the loop's grad_sync phase is the exposed part). Call after the window's sync."""
        return [{"total_s": interval_union(iv), "exposed_s": None} for iv in self._timing.flush()]

    def describe(self) -> dict[str, Any]:
        """The bucket plan, for the run summary."""
        return {"comm/mode": "scheduler", "comm/buckets": len(self.plan), "comm/overlapped_buckets": self.n_overlap,
                "comm/bucket_size_mb": self.bucket_size_mb, "comm/overlap_ratio": self.overlap_ratio}

    def remove(self) -> None:
        """Remove the gradient hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- internals
    def _broadcast(self, src: int) -> None:
        with torch.no_grad():
            for b in self.buckets:
                torch._foreach_copy_(b.views, [p.detach() for p in b.plan.params])
                dist.broadcast(b.flat, src, group=self.group)
                torch._foreach_copy_([p.detach() for p in b.plan.params], b.views)

    def _hook(self, index: int):
        def on_grad(_param: torch.Tensor) -> None:
            if not (self._sync and self.enabled):
                return
            if self.cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the overlap scheduler cannot launch all-reduces inside a CUDA graph capture; "
                                   "run captured backward passes under no_sync() and call finish() after the replay")
            b = self.buckets[index]
            b.pending -= 1
            if b.pending < 0:
                raise RuntimeError("a gradient hook fired twice in one step: call finish() after each synchronising "
                                   "backward, and run accumulation micro-steps under no_sync()")
            # launch in bucket order: every rank issues the same collectives in the same order
            while self._next < self.n_overlap and self.buckets[self._next].pending == 0:
                self._launch(self._next)
        return on_grad

    def _launch(self, index: int) -> None:
        b = self.buckets[index]
        self._next = index + 1
        for p in b.plan.params:
            if p.grad is None:  # no gradient this step: all-reduce zeros, as DDP does for unused parameters
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in b.plan.params]
        if self.cuda:
            s = self._stream
            s.wait_stream(torch.cuda.current_stream(self.device))  # the gradients are ready on the backward stream
            with torch.cuda.stream(s):
                torch._foreach_copy_(b.views, grads)
                b.flat.div_(self.world)
                t = self._timing.start(s)
                b.work = dist.all_reduce(b.flat, group=self.group, async_op=True)
                b.work.wait()  # the comm stream (not the host) waits for NCCL's stream
                self._timing.end(t, s)
                torch._foreach_copy_(grads, b.views)
        else:
            torch._foreach_copy_(b.views, grads)
            b.flat.div_(self.world)
            t = b.timing = self._timing.start()
            b.work = dist.all_reduce(b.flat, group=self.group, async_op=True)
            try:
                b.work.get_future().add_done_callback(lambda _f, t=t: self._timing.end(t))
            except (RuntimeError, AttributeError):
                pass  # no future on this backend: finish() stamps the end when its wait returns

    def _reset(self) -> None:
        self._next = 0
        for b in self.buckets:
            b.pending = len(b.plan.params)
            b.work = None
            b.timing = None


# --------------------------------------------------------------------------- DDP, timed


class DDPCommTimer:
    """Times DDP's gradient all-reduces through a comm hook doing what DDP's built-in one does.

    The hook divides the bucket by the world size, launches ``all_reduce`` and
    returns its future; a start stamp is taken when the bucket is ready (an
    event on the backward stream, or the host clock) and an end stamp in the
    future's callback (on CUDA the callback's stream waits for the all-reduce, so
    an event recorded there marks its end on the device timeline). Cost: one
    Python call and two events per bucket.

    Per step, ``total_s`` is the union of the all-reduce intervals and
    ``exposed_s`` the tail after backward: the end of the last all-reduce minus
    the time the last bucket became ready (DDP waits for it inside backward, so
    the loop's grad_sync phase is empty).
    """

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, *, bucket_size_mb: float) -> None:
        self.ddp = ddp
        self.bucket_size_mb = float(bucket_size_mb)
        self.group = ddp.process_group
        self.world = dist.get_world_size(self.group)
        self.cuda = next(ddp.module.parameters()).device.type == "cuda"
        self._timing = _Intervals(self.cuda)
        ddp.register_comm_hook(None, self._hook)

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP checks these annotations: leave them off
        t = bucket.buffer()
        t.div_(self.world)
        item = self._timing.start()
        fut = dist.all_reduce(t, group=self.group, async_op=True).get_future()

        def done(f: torch.futures.Future) -> torch.Tensor:
            self._timing.end(item)
            return f.value()[0]

        return fut.then(done)

    def no_sync(self):
        """DDP's own no_sync."""
        return self.ddp.no_sync()

    def finish(self) -> None:
        """Close the step (DDP already waited for its all-reduces inside backward)."""
        self._timing.step_end()

    def flush(self) -> list[dict[str, float | None]]:
        out = []
        for iv in self._timing.flush():
            if not iv:
                out.append({"total_s": 0.0, "exposed_s": 0.0})
                continue
            tail = max(e for _, e in iv) - max(s for s, _ in iv)
            out.append({"total_s": interval_union(iv), "exposed_s": max(0.0, tail)})
        return out

    def describe(self) -> dict[str, Any]:
        return {"comm/mode": "ddp", "comm/buckets": None, "comm/overlapped_buckets": None,
                "comm/bucket_size_mb": self.bucket_size_mb, "comm/overlap_ratio": 1.0}

    def remove(self) -> None:
        """Nothing to remove: the hook goes with the DDP module."""
