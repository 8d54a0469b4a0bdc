"""kernels_bench's setup: the shapes and constants, the device helper and the GPU timers.

The names that a run or the tests override (``BATCH``, ``SEQ``, ``MODELS``, ``MAIN_MODEL``, ``E2E_PRESET``,
``COPY_BYTES``, ``do_bench``) are read as attributes of this module at call time (``setup.BATCH``), never
imported by name, so one assignment here reaches every helper module.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

# gr00t-n1.6 (workbench.train.model.GR00T_N1_6) at micro-batch 8 x 2,048, and a larger hidden size.
BATCH, SEQ = 8, 2048
MODELS = {
    "gr00t-n1.6": dict(hidden=2048, ffn=5632, heads=32, kv_heads=32, vocab=50257),
    "hidden-4096": dict(hidden=4096, ffn=11008, heads=32, kv_heads=8, vocab=50257),
}
MAIN_MODEL = "gr00t-n1.6"
E2E_PRESET = "gr00t-n1.6"  # workbench.train.model preset of the end-to-end step
COPY_BYTES = 1 << 30  # 1 GiB per side: far above the H200's 60 MiB L2
PROVIDERS = ("triton", "torch", "torch_compile")
MODES = ("fwd", "bwd", "full")
GOAL_PCT_OF_COPY = 85.0  # the goal for the memory-bound kernels
CSV_COLUMNS = [
    "kernel", "shape", "mode", "provider", "sweep", "launch",
    "num_warps", "num_stages", "block_rows", "block_size", "fwd_block_size", "fwd_passes", "bwd_num_warps",
    "bwd_block_rows", "programs_per_sm", "bwd_tiles_in_flight", "block_h", "block_t", "block_v",
    "chunk_size",
    "median_ms", "p20_ms", "p80_ms", "host_ms", "gb_per_s", "pct_of_copy_ceiling", "size_copy_gb_per_s",
    "pct_of_size_copy", "tflop_per_s", "peak_mem_gib", "tokens_per_s",
    "loss", "dtype", "note", "error", "copy_ceiling_gb_per_s", "gpu", "torch", "triton", "cuda", "timestamp",
]


class _Device:
    """Synchronisation, peak memory and step timing on ``dev`` (CUDA; the CPU only for the tests' smoke run)."""

    def __init__(self, dev) -> None:
        import torch

        self.dev, self.cuda, self.torch = dev, dev.type == "cuda", torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> int:
        if not self.cuda:
            return 0
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        return self.torch.cuda.memory_allocated()

    def peak_gib(self, base: int) -> float:
        if not self.cuda:
            return math.nan
        self.torch.cuda.synchronize()
        return (self.torch.cuda.max_memory_allocated() - base) / 2**30

    def empty_cache(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()

    def time_ms(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``fn`` once; its result and its time (CUDA events on the GPU)."""
        if not self.cuda:
            t0 = time.perf_counter()
            out = fn()
            return out, (time.perf_counter() - t0) * 1e3
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()  # note: a host sync per measured step, after its end event
        return out, start.elapsed_time(end)


def do_bench(fn: Callable[[], Any], quick: bool) -> tuple[float, float, float]:
    """(median, p20, p80) GPU milliseconds of ``fn``, the L2 flushed before every run.

    Like ``triton.testing.do_bench``, with one difference that matters for these kernels (tens of
    microseconds each): before each timed run the GPU is held in a spin (``torch.cuda._sleep``) long
    enough for the host to enqueue all of ``fn``, so the interval between the two events is the GPU's
    work and not the host's launch overhead (Python launchers, autograd, dynamo guards), which
    ``triton.testing.do_bench`` counts whenever the host is slower than the GPU. That overhead is
    measured separately by :func:`host_ms` and reported in its own column.
    """
    import torch

    warmup_ms, rep_ms = (10.0, 40.0) if quick else (25.0, 100.0)
    fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # 4x the H200's L2
    host = host_ms(fn, reps=3)
    # a spin of 1.5x the host's time (clock ~2 GHz or below: cycles overestimate, which is harmless)
    spin_cycles = int(max(20e-6, 1.5 * host * 1e-3) * 2.0e9)
    est0, est1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    est0.record()
    for _ in range(5):
        flush.zero_()
        fn()
    est1.record()
    torch.cuda.synchronize()
    est = max(est0.elapsed_time(est1) / 5, 1e-3)
    n_warm, n_rep = max(1, int(warmup_ms / est)), max(5, min(1000, int(rep_ms / est)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for s, e in zip(starts, ends):
        flush.zero_()
        torch.cuda._sleep(spin_cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    del flush
    q = statistics.quantiles(times, n=10, method="inclusive")
    return float(statistics.median(times)), float(q[1]), float(q[7])


def host_ms(fn: Callable[[], Any], reps: int = 5) -> float:
    """Median host milliseconds to enqueue ``fn`` (the GPU held in a spin meanwhile, so the host never waits
    for it): the launch overhead an eager step pays per call unless the GPU has other work queued."""
    import torch

    times = []
    for _ in range(reps):
        torch.cuda._sleep(int(20e-3 * 2.0e9))  # 20 ms of GPU spin: the queue never fills and blocks the host
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return float(statistics.median(times))


def copy_ceiling_gb_per_s(quick: bool, dev, nbytes: float | None = None) -> float:
    """Measured device copy bandwidth: read + write bytes of ``dst.copy_(src)`` over its median time.

    ``nbytes``: the read + write bytes of the copy (half each way); default ``2 * COPY_BYTES``, far above the L2,
    the ceiling. A copy of as many bytes as an op moves says what that size allows: a kernel of tens of
    microseconds loses a few percent to the ramp-up and the last wave, a copy too.
    """
    import torch

    half = COPY_BYTES if nbytes is None else max(2, int(nbytes) // 4 * 2)  # whole bf16 elements per side
    src = torch.empty(half // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    med, _, _ = do_bench(lambda: dst.copy_(src), quick)
    src = dst = None
    _Device(dev).empty_cache()
    return 2 * half / (med * 1e-3) / 1e9
