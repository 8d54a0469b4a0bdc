"""Benchmark of the Triton kernels against torch eager and torch.compile of the references (CUDA only).

    python benchmarks/kernels_bench.py [--out DIR] [--quick] [--e2e] [--kernels rmsnorm,swiglu,rope,fused_linear_ce]
                            [--shapes 'fused add,bf16 out'] [--providers triton,torch,torch_compile]
                            [--full-sweep] [--kernel-sweep PATH] [--e2e-isolation none --e2e-rounds N]

What it times and how, what it writes and how long it takes: docs/kernel-notes.md, "The benchmark".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from workbench.train.fingerprint import versions  # noqa: E402

__all__ = ["main"]

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
    del src, dst
    _Device(dev).empty_cache()
    return 2 * half / (med * 1e-3) / 1e9


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One kernel at one shape: inputs, the two implementations, what the op must move."""

    kernel: str
    shape_label: str
    registry_shape: dict[str, int]
    dtype: str
    make: Callable[[], tuple[tuple, list, Any]]
    """-> (args, tensors to differentiate, upstream grads)"""
    triton_fn: Callable
    torch_fn: Callable
    bytes: dict[str, float] = field(default_factory=dict)
    """bytes the op must move per mode (NaN: not memory bound)"""
    flops: dict[str, float] = field(default_factory=dict)


def _cases(models: list[str], dev) -> list[Case]:
    import torch

    import kernels
    from workbench.train import ops
    from workbench.train.model import rope_cos_sin

    _B, _T = BATCH, SEQ  # noqa: N806 (read at call time: the tests' smoke run shrinks them)
    out: list[Case] = []
    for name in models:
        m = MODELS[name]
        D, F, H, K, V = m["hidden"], m["ffn"], m["heads"], m["kv_heads"], m["vocab"]
        d = D // H
        M = _B * _T

        def make_rms(D=D):
            x = torch.randn(_B, _T, D, device=dev, requires_grad=True)
            w = torch.ones(D, device=dev, requires_grad=True)
            return (x, w, 1e-5), [x, w], torch.randn(_B, _T, D, device=dev)

        es = 4
        out.append(Case("rmsnorm", f"{name} {_B}x{_T}x{D}", {"rows": M, "hidden": D}, "float32", make_rms,
                        kernels.rms_norm_triton, ops.rms_norm_torch,
                        bytes={"fwd": 2 * M * D * es, "bwd": 3 * M * D * es, "full": 5 * M * D * es}))

        def make_rms_autocast(D=D):  # as the model runs it under bf16 autocast: fp32 stream in, bf16 out
            x = torch.randn(_B, _T, D, device=dev, requires_grad=True)
            w = torch.ones(D, device=dev, requires_grad=True)
            return (x, w, 1e-5, torch.bfloat16), [x, w], torch.randn(_B, _T, D, device=dev, dtype=torch.bfloat16)

        # fwd reads x (4 bytes) and writes y (2); bwd reads x and dy (2) and writes dx (4)
        out.append(Case("rmsnorm", f"{name} {_B}x{_T}x{D} bf16 out", {"rows": M, "hidden": D},
                        "float32>bfloat16", make_rms_autocast, kernels.rms_norm_triton, ops.rms_norm_torch,
                        bytes={"fwd": 6 * M * D, "bwd": 10 * M * D, "full": 16 * M * D}))

        def make_rms_add(D=D):  # the fused residual add as the model runs it: bf16 branch + fp32 stream, bf16 out
            x = torch.randn(_B, _T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
            r = torch.randn(_B, _T, D, device=dev, requires_grad=True)
            w = torch.ones(D, device=dev, requires_grad=True)
            up = (torch.randn(_B, _T, D, device=dev, dtype=torch.bfloat16), torch.randn(_B, _T, D, device=dev))
            return (x, r, w, 1e-5, torch.bfloat16), [x, r, w], up

        # fwd reads x (2 bytes) and r (4), writes s (4) and y (2); bwd reads dy (2), s (4) and the stream's
        # gradient ds (4), writes the gradients of r (4) and x (2)
        out.append(Case("rmsnorm", f"{name} {_B}x{_T}x{D} fused add", {"rows": M, "hidden": D},
                        "bfloat16+float32>bfloat16", make_rms_add, kernels.rms_norm_add_triton,
                        ops.rms_norm_add_torch, bytes={"fwd": 12 * M * D, "bwd": 16 * M * D, "full": 28 * M * D}))

        def make_swiglu(F=F):
            g = torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
            u = torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
            return (g, u), [g, u], torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16)

        n, es = M * F, 2
        out.append(Case("swiglu", f"{name} {_B}x{_T}x{F}", {"numel": n}, "bfloat16", make_swiglu,
                        kernels.swiglu_triton, ops.swiglu_torch,
                        bytes={"fwd": 3 * n * es, "bwd": 5 * n * es, "full": 8 * n * es}))

        def make_rope(H=H, K=K, d=d):
            # the model's layout: q_proj(x).view(B, T, H, d).transpose(1, 2); cos/sin gathered by position (fp32)
            q = torch.randn(_B, _T, H, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(_B, _T, K, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            cos_Pd, sin_Pd = rope_cos_sin(d, _T, 10000.0, device=dev)
            pos = torch.arange(_T, device=dev).expand(_B, _T)
            # the gradients as the model's flash SDPA backward hands them over: (B, T, heads, d) in memory, like
            # q (docs/kernel-notes.md, RoPE)
            up = (torch.randn(_B, _T, H, d, device=dev, dtype=torch.bfloat16).transpose(1, 2),
                  torch.randn(_B, _T, K, d, device=dev, dtype=torch.bfloat16).transpose(1, 2))
            return (q, k, cos_Pd[pos], sin_Pd[pos]), [q, k], up

        def rope_layout(fn):
            return lambda q, k, cos, sin: fn(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

        nq, nk, es = _B * H * _T * d, _B * K * _T * d, 2
        table = 2 * _B * _T * d * 4
        rope_bytes = 2 * (nq + nk) * es + table
        out.append(Case("rope", f"{name} {_B}x{H}/{K}x{_T}x{d}", {"tokens": M, "q_heads": H, "k_heads": K,
                                                                  "head_dim": d}, "bfloat16", make_rope,
                        rope_layout(kernels.rope_triton), rope_layout(ops.rope_torch),
                        bytes={"fwd": rope_bytes, "bwd": rope_bytes, "full": 2 * rope_bytes}))

        N = _B * (_T - 1)

        def make_loss(N=N, D=D, V=V):  # noqa: N803
            h = torch.randn(N, D, device=dev, requires_grad=True)
            w = (torch.randn(V, D, device=dev) * 0.02).requires_grad_()
            labels = torch.randint(0, V, (N,), device=dev)
            mask = torch.rand(N, device=dev) < 0.95  # a little padding, as real batches have
            return (h, w, labels, mask), [h, w], torch.tensor(1.0, device=dev)

        def autocast_loss(fn):
            def run(h, w, labels, mask):
                with torch.autocast(dev.type, dtype=torch.bfloat16):
                    return fn(h, w, labels, mask)[0]
            return run

        nan = math.nan
        out.append(Case("fused_linear_ce", f"{name} {N}x{D}x{V}", {"rows": N, "hidden": D, "vocab": V},
                        "float32+autocast_bf16", make_loss, autocast_loss(kernels.linear_cross_entropy_triton),
                        autocast_loss(ops.linear_cross_entropy_torch),
                        bytes={"fwd": nan, "bwd": nan, "full": nan},
                        flops={"fwd": 2 * N * D * V, "bwd": 4 * N * D * V, "full": 6 * N * D * V}))
    return out


# --------------------------------------------------------------------------- measuring one implementation


def _measure(case: Case, fn: Callable, quick: bool, device: _Device) -> dict[str, dict[str, float]]:
    """Times per mode, plus the peak memory of one full step (GiB above the inputs)."""
    import torch

    args, params, upstream = case.make()
    up = upstream if isinstance(upstream, tuple) else (upstream,)

    def fwd():
        return fn(*args)

    def full():
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(outs, params, up)

    keys = ("median_ms", "p20_ms", "p80_ms")
    res: dict[str, dict[str, float]] = {}
    full()  # compile outside the timing (and the memory figure)
    base = device.reset_peak()
    full()
    peak = device.peak_gib(base)
    res["fwd"] = dict(zip(keys, do_bench(fwd, quick)))
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    try:  # backward alone: the same graph again (retain_graph), so the forward is not timed
        res["bwd"] = dict(zip(keys, do_bench(lambda: torch.autograd.grad(outs, params, up, retain_graph=True),
                                             quick)))
    except RuntimeError:  # the fused loss scales its saved gradients in place: its backward runs once
        res["bwd"] = {**dict(zip(keys, _bench_fresh_backward(fn, args, params, up, quick, device))),
                      "note": "backward of a fresh forward each run (it cannot be re-run); L2 not flushed"}
    del out, outs
    res["full"] = dict(zip(keys, do_bench(full, quick)))
    if device.cuda:  # the host's launch overhead per call (fwd, full); the GPU time above excludes it
        res["fwd"]["host_ms"], res["full"]["host_ms"] = host_ms(fwd), host_ms(full)
    for mode in MODES:
        r = res[mode]
        b = case.bytes.get(mode, math.nan)
        r["gb_per_s"] = b / (r["median_ms"] * 1e-3) / 1e9 if not math.isnan(b) else math.nan
        f = case.flops.get(mode, math.nan)
        r["tflop_per_s"] = f / (r["median_ms"] * 1e-3) / 1e12 if mode == "full" and not math.isnan(f) else math.nan
        r["peak_mem_gib"] = peak if mode == "full" else math.nan
    del args, params, upstream, up
    device.empty_cache()
    return res


def _bench_fresh_backward(fn, args, params, up, quick: bool, device: _Device) -> tuple[float, float, float]:
    """(median, p20, p80) ms of the backward alone, each run after an untimed forward of its own."""
    import torch

    times = []
    for _ in range(5 if quick else 20):
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        # on the GPU the start event waits for the forward's kernels: the interval is the backward's
        _, ms = device.time_ms(lambda: torch.autograd.grad(outs, params, up))  # noqa: B023
        times.append(ms)
    q = statistics.quantiles(times, n=10, method="inclusive")
    return statistics.median(times), q[1], q[7]


# --------------------------------------------------------------------------- sweeps


def _ofat(space, shape, quick: bool) -> list[dict[str, int]]:
    """One parameter at a time around the defaults (valid combinations only), defaults first."""
    base = space.defaults(shape)
    configs = [dict(base)]
    params = space.param_names()
    if quick:  # the parameters that matter most: warps and the kernel's main block
        params = tuple(p for p in params if p in ("num_warps", "block_rows", "block_size", "fwd_block_size",
                                                   "fwd_passes", "bwd_num_warps", "bwd_block_rows",
                                                   "bwd_tiles_in_flight", "block_h", "block_v"))
    for p in params:
        for v in space.param(p).candidates(shape):
            cfg = {**base, p: v}
            if cfg not in configs and not space.problems(cfg, shape):
                configs.append(cfg)
    return configs


def _tangents_like_outputs():
    """Compile the references' backward for gradients laid out like their forward outputs.

    AOTAutograd traces a backward before it sees a gradient, so it guesses the gradients' strides; where it
    guesses contiguous (torch 2.11's default) and the gradient comes laid out like the output (RoPE's, in the
    model's (B, T, heads, d) layout), it copies the gradient first: run AB measured the compiled RoPE backward at
    0.265 ms that way against 0.078 ms for contiguous gradients. Inside a compiled model that copy does not
    happen (the backward that makes the gradient is in the same graph), so it is not charged to the reference.
    """
    import torch._functorch.config as aot_config

    if not hasattr(aot_config, "guess_tangent_strides_as_outputs"):
        return contextlib.nullcontext()
    return aot_config.patch(guess_tangent_strides_as_outputs=True)


def _launch_str(params: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _bench_case(case: Case, providers: list[str], args: argparse.Namespace, ceiling: float,
                common: dict[str, str], log: Callable[[str], None], device: _Device) -> list[dict[str, Any]]:
    import torch

    import kernels

    rows: list[dict[str, Any]] = []
    # a copy of as many bytes as the op moves in each mode: what its size allows (see copy_ceiling_gb_per_s)
    # (forward and backward: full mode is two kernels, not one of the summed size)
    size_copy = {mode: copy_ceiling_gb_per_s(args.quick, device.dev, b) for mode, b in case.bytes.items()
                 if mode != "full" and not math.isnan(b)}

    def add(provider: str, sweep: str, params: dict[str, int] | None, res: dict | None, error: str = "") -> None:
        for mode in MODES:
            r = (res or {}).get(mode, {})
            gbps = r.get("gb_per_s", math.nan)
            at_size = size_copy.get(mode, math.nan)
            rows.append({
                "kernel": case.kernel, "shape": case.shape_label, "mode": mode, "provider": provider,
                "sweep": sweep, "launch": _launch_str(params) if params else "", **(params or {}),
                "median_ms": r.get("median_ms", math.nan), "p20_ms": r.get("p20_ms", math.nan),
                "p80_ms": r.get("p80_ms", math.nan), "host_ms": r.get("host_ms", math.nan), "gb_per_s": gbps,
                "pct_of_copy_ceiling": 100 * gbps / ceiling if not math.isnan(gbps) else math.nan,
                "size_copy_gb_per_s": at_size, "pct_of_size_copy": 100 * gbps / at_size,
                "tflop_per_s": r.get("tflop_per_s", math.nan), "peak_mem_gib": r.get("peak_mem_gib", math.nan),
                "dtype": case.dtype, "note": r.get("note", ""), "error": error, "copy_ceiling_gb_per_s": ceiling,
                **common,
            })

    def run(provider: str, fn: Callable, sweep: str, params: dict[str, int] | None) -> dict | None:
        t0 = time.time()
        try:
            res = _measure(case, fn, args.quick, device)
        except Exception as e:  # noqa: BLE001 - a configuration that fails (out of resources) is a result too
            device.empty_cache()
            add(provider, sweep, params, None, error=f"{type(e).__name__}: {str(e)[:300]}")
            log(f"  {provider:13s} {_launch_str(params or {}):60s} FAILED {type(e).__name__}: {str(e)[:120]}")
            return None
        add(provider, sweep, params, res)
        log(f"  {provider:13s} {_launch_str(params or {}):60s} full {res['full']['median_ms']:8.3f} ms "
            f"({time.time() - t0:4.1f} s)")
        return res

    log(f"{case.kernel} at {case.shape_label} ({case.dtype})")
    if "torch" in providers:
        run("torch", case.torch_fn, "reference", None)
    if "torch_compile" in providers:
        with _tangents_like_outputs():
            run("torch_compile", torch.compile(case.torch_fn, dynamic=False), "reference", None)
    if "triton" in providers:
        space = kernels.get_space(case.kernel)
        shape = case.registry_shape
        small = args.quick or not case.shape_label.startswith(MAIN_MODEL)  # the larger shape: main params only
        configs = space.sweep(shape) if args.full_sweep else _ofat(space, shape, small)
        results: list[tuple[dict[str, int], float]] = []
        for i, cfg in enumerate(configs):
            with kernels.using({case.kernel: cfg}):
                res = run("triton", case.triton_fn, "default" if i == 0 else "sweep", cfg)
            if res is not None:
                results.append((cfg, res["full"]["median_ms"]))
        if not args.full_sweep and results:  # combine each parameter's best value (one coordinate step)
            base = configs[0]
            best_by_param = dict(base)
            for p in space.param_names():  # among the runs that changed only p (and the defaults' run)
                varied = [(c[p], t) for c, t in results if all(c[q] == base[q] for q in base if q != p)]
                if varied:
                    best_by_param[p] = min(varied, key=lambda x: x[1])[0]
            if best_by_param not in [c for c, _ in results] and not space.problems(best_by_param, shape):
                with kernels.using({case.kernel: best_by_param}):
                    run("triton", case.triton_fn, "combined", best_by_param)
    return rows


# --------------------------------------------------------------------------- end to end


def _bench_e2e_isolated(best: dict[str, dict[str, int]], args: argparse.Namespace, common: dict[str, str],
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each variant in a process of its own (``--e2e-worker``): a fresh allocator and compile cache per variant,
    and a variant that fails (a CUDA error poisons its context) costs only its own row."""
    import subprocess

    rows: list[dict[str, Any]] = []
    for ops_name, mode in _variants(args):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--e2e-worker", f"{ops_name}:{mode}",
               "--e2e-shape", f"{E2E_PRESET}:{BATCH}:{SEQ}", "--launch-json", json.dumps(best)]
        if args.quick:
            cmd.append("--quick")
        if args.e2e_profile:
            cmd.append("--e2e-profile")
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[1]))
        got = [ln for ln in r.stdout.splitlines() if ln.startswith("E2E_ROWS ")]
        if r.returncode == 0 and got:
            new = json.loads(got[-1][len("E2E_ROWS "):])
            rows += [{**row, **common} for row in new]
            ok = new[0]
            log(f"  e2e {ops_name:6s} {mode:7s} (own process): median {ok.get('median_ms', math.nan):8.2f} ms/step, "
                f"loss {ok.get('loss', math.nan):.5f} ({time.time() - t0:.0f} s)")
            continue
        tail = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()][-8:]
        err = next((ln for ln in reversed(tail) if "Error" in ln or "error" in ln), tail[-1] if tail else "")
        rows.append({**_e2e_row(ops_name, mode, best, common), "error": f"exit {r.returncode}: {err.strip()[:300]}"})
        log(f"  e2e {ops_name:6s} {mode:7s} (own process): FAILED exit {r.returncode}: {err.strip()[:200]}")
    return rows


E2E_VARIANTS = [(o, c) for c in ("eager", "compile") for o in ("torch", "triton")]
E2E_EXTRA = [(o, c) for c in ("eager", "compile") for o in ("triton_fused",)]
"""On request (``--e2e-variants``): the Triton ops with every residual add fused into the norm after it."""
E2E_MODES = ("eager", "compile", "graphs")
"""``graphs``: torch.compile with mode="reduce-overhead" (CUDA graphs of the forward and backward): the host's
launch overhead gone, as in the training loop's graph replay; on request only."""


def _e2e_ops(ops_name: str) -> tuple[dict[str, str], bool]:
    """An end-to-end variant's ops -> ({op: backend}, fused_residual_norm).

    ``torch``, ``triton`` (every op), ``triton_fused`` (every op, residual add fused into the norm), or a mix:
    op names joined by ``+`` run on Triton, the others on torch; ``fused`` among them fuses the residual add
    (``rmsnorm+loss``, ``rmsnorm+fused+rope``)."""
    from workbench.train.ops import OP_NAMES

    named = {"torch": ((), False), "triton": (OP_NAMES, False), "triton_fused": (OP_NAMES, True)}
    if ops_name in named:
        ops, fused = named[ops_name]
    else:
        parts = ops_name.split("+")
        bad = [p for p in parts if p not in OP_NAMES and p != "fused"]
        if bad or not parts:
            raise ValueError(f"{ops_name!r}: {bad} not in {list(OP_NAMES) + ['fused']} (or use torch, triton, "
                             f"triton_fused)")
        ops, fused = tuple(p for p in parts if p != "fused"), "fused" in parts
        if fused and "rmsnorm" not in ops:
            raise ValueError(f"{ops_name!r}: 'fused' needs the Triton rmsnorm (the fused add runs in its kernel)")
    return {op: "triton" for op in ops}, fused
PROFILE_STEPS = 2
PROFILE_TOP = 40  # kernels (ops on the CPU) kept per variant, by self time


def _profile_steps(run_step: Callable[[], Any], device: _Device) -> list[dict[str, Any]]:
    """``PROFILE_STEPS`` steps under torch.profiler: the ``PROFILE_TOP`` kernels (CUDA) or ops (CPU) by self time,
    per step, with their share of the profiled time. Run after the timed steps, so it does not perturb them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(PROFILE_STEPS):
            run_step()
        if device.cuda:
            torch.cuda.synchronize()
    cuda = device.cuda
    key = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events = [e for e in prof.key_averages() if key(e) > 0 and (not cuda or e.device_type.name == "CUDA")]
    total = sum(key(e) for e in events) or 1.0
    top = sorted(events, key=key, reverse=True)[:PROFILE_TOP]
    return [{"name": e.key[:200], "calls_per_step": e.count / PROFILE_STEPS,
             "self_ms_per_step": key(e) / 1e3 / PROFILE_STEPS, "share": key(e) / total,
             "timer": "cuda_self" if cuda else "cpu_self"} for e in top]


def _e2e_row(ops_name: str, mode: str, best: dict[str, dict[str, int]], common: dict[str, str]) -> dict[str, Any]:
    """The identifying columns of one end-to-end variant's row."""
    return {"kernel": "e2e_step", "shape": f"{E2E_PRESET} {BATCH}x{SEQ}", "mode": "train_step",
            "provider": f"{ops_name}_ops_{mode}", "sweep": "reference" if ops_name == "torch" else "best",
            "launch": "" if ops_name == "torch" else json.dumps(best, sort_keys=True),
            "dtype": "float32+autocast_bf16", **common}


def _variants(args: argparse.Namespace) -> list[tuple[str, str]]:
    if not getattr(args, "e2e_variants", None):
        return E2E_VARIANTS
    out = []
    for v in args.e2e_variants.split(","):
        ops_name, _, mode = v.strip().partition(":")
        try:
            _e2e_ops(ops_name)
        except ValueError as e:
            raise SystemExit(f"kernels_bench: --e2e-variants: {v!r}: ops {e}") from None
        if mode not in E2E_MODES:
            examples = ", ".join(f"{o}:{m}" for o, m in E2E_VARIANTS + E2E_EXTRA)
            raise SystemExit(f"kernels_bench: --e2e-variants: {v!r}: mode {mode!r} is not one of "
                             f"{', '.join(E2E_MODES)} (e.g. {examples})")
        out.append((ops_name, mode))
    return out


def _bench_e2e(best: dict[str, dict[str, int]], args: argparse.Namespace, common: dict[str, str],
               log: Callable[[str], None], device: _Device,
               variants: list[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """The variants in this process, on one model, in interleaved rounds."""
    import torch

    import kernels
    from workbench.train.model import Llama, get_preset
    from workbench.train.ops import resolve

    _B, _T, dev = BATCH, SEQ, device.dev  # noqa: N806
    margs = get_preset(E2E_PRESET)
    torch.manual_seed(0)
    model = Llama(margs).to(dev)
    # lr 0: every variant sees the same weights, so their losses must agree (a check on the Triton ops)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, fused=device.cuda)
    ids = torch.randint(0, margs.vocab_size, (_B, _T), device=dev)
    pos = torch.arange(_T, device=dev).expand(_B, _T).contiguous()
    mask = torch.ones(_B, _T, dtype=torch.bool, device=dev)
    variants = variants or _variants(args)
    opsets = {}
    for ops_name, _ in variants:
        ops, fused = _e2e_ops(ops_name)
        opsets[ops_name] = resolve(ops, fused_residual_norm=fused)
    from torch import _dynamo

    _dynamo.config.cache_size_limit = max(64, _dynamo.config.cache_size_limit)
    compiled = {"compile": torch.compile(model.loss, dynamic=False),
                "graphs": torch.compile(model.loss, dynamic=False, mode="reduce-overhead")}
    warmup, steps, rounds = (2, 4, 1) if args.quick else (2, 6, 2)
    rounds = getattr(args, "e2e_rounds", None) or rounds
    if len(variants) == 1:  # a worker process: one variant, its rounds' steps in one go
        steps, rounds = steps * rounds, 1
    times: dict[tuple[str, str], dict[int, list[float]]] = {v: {} for v in variants}  # variant -> round -> ms
    losses: dict[tuple[str, str], float] = {}
    peaks: dict[tuple[str, str], float] = {}

    def step(fn) -> torch.Tensor:
        if fn is compiled["graphs"]:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss_sum, n = fn(ids, pos, mask)
        loss = loss_sum / n
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    errors: dict[tuple[str, str], str] = {}
    profiles: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with kernels.using(best):
        for r in range(rounds):  # interleaved: torch, triton, torch, triton per round
            for ops_name, mode in variants:
                if errors:  # a failed variant may leave the CUDA context unusable (an illegal access does)
                    errors.setdefault((ops_name, mode), "not run: an earlier variant failed")
                    continue
                model.set_ops(opsets[ops_name])
                fn = model.loss if mode == "eager" else compiled[mode]
                t0 = time.time()
                try:
                    for _ in range(warmup if r == 0 else 1):
                        step(fn)
                    device.reset_peak()
                    for _ in range(steps):
                        loss, ms = device.time_ms(lambda: step(fn))  # noqa: B023
                        times[(ops_name, mode)].setdefault(r, []).append(ms)
                    losses[(ops_name, mode)] = float(loss)  # note: a host sync, after the timed steps
                    peaks[(ops_name, mode)] = device.peak_gib(0)
                    if getattr(args, "e2e_profile", False) and r == rounds - 1:
                        profiles[(ops_name, mode)] = _profile_steps(lambda: step(fn), device)  # noqa: B023
                except Exception as e:  # noqa: BLE001 - recorded as a result row; the variants before it are kept
                    errors[(ops_name, mode)] = f"{type(e).__name__}: {str(e)[:300]}"
                    log(f"  e2e {ops_name:6s} {mode:7s} round {r}: FAILED {errors[(ops_name, mode)][:200]}")
                    continue
                log(f"  e2e {ops_name:6s} {mode:7s} round {r}: median "
                    f"{statistics.median(times[(ops_name, mode)][r]):8.2f} ms/step, loss {float(loss):.5f} "
                    f"({time.time() - t0:.0f} s)")
    rows = []
    for ops_name, mode in variants:
        per_step = [(r, t) for r, ts in times[(ops_name, mode)].items() for t in ts]
        ts = [t for _, t in per_step]
        base = _e2e_row(ops_name, mode, best, common)
        if (ops_name, mode) in errors:  # its timed steps (if any) are incomplete: not reported as a result
            rows.append({**base, "error": errors[(ops_name, mode)]})
            continue
        ts_sorted = sorted(ts)
        q = lambda f: ts_sorted[min(len(ts_sorted) - 1, int(f * (len(ts_sorted) - 1) + 0.5))]  # noqa: E731
        med = statistics.median(ts)
        rows.append({**base, "median_ms": med, "p20_ms": q(0.2), "p80_ms": q(0.8),
                     "tokens_per_s": _B * _T / (med * 1e-3), "peak_mem_gib": peaks[(ops_name, mode)],
                     "loss": losses[(ops_name, mode)], "profile": profiles.get((ops_name, mode)),
                     "note": _paired_note(times, (ops_name, mode)),
                     "steps": [{"round": r, "step": i, "ms": t} for i, (r, t) in enumerate(per_step)]})
    del model, opt
    device.empty_cache()
    return rows


def _paired_note(times: dict[tuple[str, str], dict[int, list[float]]], variant: tuple[str, str]) -> str:
    """For a non-torch variant measured in interleaved rounds with the torch ops in the same mode: the torch
    ops' median step time over this variant's, per round (paired: each round's two medians were taken minutes
    apart at most, so slow drift of the GPU's clocks cancels). '' otherwise."""
    ref = ("torch", variant[1])
    if variant[0] == "torch" or ref not in times:
        return ""
    a, b = times[ref], times[variant]
    ratios = sorted(statistics.median(a[r]) / statistics.median(b[r]) for r in a if r in b)
    if len(ratios) < 2:
        return ""
    faster = sum(x > 1 for x in ratios)
    return (f"paired over {len(ratios)} rounds: torch ops' step / this step, per round: median "
            f"{statistics.median(ratios):.4f}, min {ratios[0]:.4f}, max {ratios[-1]:.4f}; faster in "
            f"{faster} of {len(ratios)}")


# --------------------------------------------------------------------------- results


def _best_launch(df) -> dict[str, dict[str, dict[str, int]]]:
    """shape -> kernel -> fastest full-mode triton configuration."""
    import kernels

    out: dict[str, dict[str, dict[str, int]]] = {}
    ok = df[(df["provider"] == "triton") & (df["mode"] == "full") & df["median_ms"].notna()]
    for (kernel, shape), g in ok.groupby(["kernel", "shape"]):
        row = g.loc[g["median_ms"].idxmin()]
        params = kernels.get_space(kernel).param_names()
        out.setdefault(shape, {})[kernel] = {p: int(row[p]) for p in params}
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _summary(df, ceiling: float) -> tuple[str, list[str]]:
    """A markdown table (best triton config vs torch vs torch.compile per kernel, shape, mode) and goal checks."""
    import pandas as pd

    lines = [f"Copy ceiling measured in this run: {ceiling:,.0f} GB/s (read + write).", "",
             "| kernel | shape | mode | triton ms (best) | GB/s | % of copy | % of copy at size | compile % of copy "
             "at size | torch ms | compile ms | x torch | x compile | launch (best full) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    goals: list[str] = []
    kern = df[df["kernel"] != "e2e_step"]
    for (kernel, shape), g in kern.groupby(["kernel", "shape"], sort=False):
        tri = g[(g["provider"] == "triton") & g["median_ms"].notna()]
        if tri.empty:
            continue
        full = tri[tri["mode"] == "full"]
        best_launch = full.loc[full["median_ms"].idxmin(), "launch"] if not full.empty else ""
        for mode in MODES:
            t = tri[(tri["mode"] == mode) & (tri["launch"] == best_launch)]
            if t.empty:
                continue
            t = t.iloc[0]
            ref = g[(g["provider"] == "torch") & (g["mode"] == mode)]
            comp = g[(g["provider"] == "torch_compile") & (g["mode"] == mode)]
            ref_ms = float(ref["median_ms"].iloc[0]) if len(ref) else math.nan
            comp_ms, comp_at_size = ((float(comp["median_ms"].iloc[0]), float(comp["pct_of_size_copy"].iloc[0]))
                                     if len(comp) else (math.nan, math.nan))
            lines.append(f"| {kernel} | {shape} | {mode} | {t['median_ms']:.3f} | {t['gb_per_s']:,.0f} | "
                         f"{t['pct_of_copy_ceiling']:.1f} | {t['pct_of_size_copy']:.1f} | {comp_at_size:.1f} | "
                         f"{ref_ms:.3f} | {comp_ms:.3f} | "
                         f"{_ratio(ref_ms, t['median_ms']):.2f} | {_ratio(comp_ms, t['median_ms']):.2f} | "
                         f"{best_launch} |")
            if kernel != "fused_linear_ce" and mode in ("fwd", "bwd"):
                ok = t["pct_of_copy_ceiling"] >= GOAL_PCT_OF_COPY and t["median_ms"] < comp_ms
                goals.append(f"{'PASS' if ok else 'FAIL'} {kernel} {shape} {mode}: "
                             f"{t['pct_of_copy_ceiling']:.1f}% of copy (goal >= {GOAL_PCT_OF_COPY:.0f}%), "
                             f"{_ratio(comp_ms, t['median_ms']):.2f}x torch.compile (goal > 1); a copy of as many "
                             f"bytes: {t['pct_of_size_copy']:.1f}%, torch.compile's {comp_at_size:.1f}%")
        if kernel == "fused_linear_ce":
            # memory against the eager unfused loss (its N x V logits are what fusing removes); time against the
            # FASTER unfused one (torch.compile pads the vocabulary and fuses the softmax, eager does neither)
            ref_full = g[(g["provider"] == "torch") & (g["mode"] == "full")]
            unfused = g[g["provider"].isin(["torch", "torch_compile"]) & (g["mode"] == "full") & g["median_ms"].notna()]
            if len(ref_full) and len(unfused):
                fastest = unfused.loc[unfused["median_ms"].idxmin()]
                ref_gib = float(ref_full["peak_mem_gib"].iloc[0])
                by_time = full.sort_values("median_ms")
                lean = by_time[ref_gib / by_time["peak_mem_gib"] >= 4]  # the fastest config meeting the memory goal
                t = (lean if len(lean) else by_time).iloc[0]
                mem_x = ref_gib / float(t["peak_mem_gib"])
                time_x = float(t["median_ms"]) / float(fastest["median_ms"])
                ok = mem_x >= 4 and time_x <= 1.10
                goals.append(f"{'PASS' if ok else 'FAIL'} fused_linear_ce {shape} ({t['launch']}): peak memory "
                             f"{float(t['peak_mem_gib']):.2f} GiB vs {float(ref_full['peak_mem_gib'].iloc[0]):.2f} GiB "
                             f"unfused eager ({mem_x:.1f}x lower, goal >= 4x); time {time_x:.3f}x the fastest unfused "
                             f"({fastest['provider']}, {float(fastest['median_ms']):.2f} ms; goal <= 1.10)")
    e2e = df[df["kernel"] == "e2e_step"]
    if not e2e.empty:
        lines += ["", "| end to end | ms/step (median) | p20 | p80 | tokens/s | peak GiB | loss |",
                  "|---|---|---|---|---|---|---|"]
        for _, r in e2e.iterrows():
            if isinstance(r.get("error"), str) and r["error"]:
                lines.append(f"| {r['provider']} | failed: {r['error'][:120]} | | | | | |")
                continue
            lines.append(f"| {r['provider']} | {r['median_ms']:.1f} | {r['p20_ms']:.1f} | {r['p80_ms']:.1f} | "
                         f"{r['tokens_per_s']:,.0f} | {r['peak_mem_gib']:.1f} | {r['loss']:.5f} |")
        by = {r["provider"]: r for _, r in e2e.iterrows()}
        for mode in E2E_MODES:
            a, b = by.get(f"torch_ops_{mode}"), by.get(f"triton_ops_{mode}")
            if a is not None and b is not None and (pd.isna(a["median_ms"]) or pd.isna(b["median_ms"])):
                goals.append(f"FAIL end to end {mode}: not measured ({a.get('error') or b.get('error')})")
            elif a is not None and b is not None:
                goals.append(f"{'PASS' if b['median_ms'] < a['median_ms'] else 'FAIL'} end to end {mode}: triton "
                             f"ops {a['median_ms'] / b['median_ms']:.3f}x the step speed of torch ops; losses "
                             f"{b['loss']:.5f} vs {a['loss']:.5f}")
            c = by.get(f"triton_fused_ops_{mode}")
            if b is not None and c is not None and not (pd.isna(b["median_ms"]) or pd.isna(c["median_ms"])):
                goals.append(f"INFO end to end {mode}: the fused residual add {b['median_ms'] / c['median_ms']:.3f}x "
                             f"the step speed of the Triton ops without it; losses {c['loss']:.5f} vs "
                             f"{b['loss']:.5f}")
            suffix = f"_ops_{mode}"
            mixes = {n[: -len(suffix)]: m for n, m in by.items() if n.endswith(suffix)}
            for ops_name, m in mixes.items():  # Triton for some ops only
                if ops_name in ("torch", "triton", "triton_fused") or a is None:
                    continue
                if not (pd.isna(a["median_ms"]) or pd.isna(m["median_ms"])):
                    goals.append(f"INFO end to end {mode}: Triton for {ops_name} only "
                                 f"{a['median_ms'] / m['median_ms']:.3f}x the step speed of torch ops; losses "
                                 f"{m['loss']:.5f} vs {a['loss']:.5f}")
    pd.set_option("display.width", 250)
    return "\n".join(lines) + "\n", goals


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/kernels_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/out", help="output folder (default: benchmarks/out)")
    p.add_argument("--quick", action="store_true", help="gr00t shapes only, a smaller sweep, shorter timing")
    p.add_argument("--full-sweep", action="store_true", help="every valid launch configuration (long)")
    p.add_argument("--kernels", default="rmsnorm,swiglu,rope,fused_linear_ce")
    p.add_argument("--shapes", help="only the cases whose shape label contains one of these comma-separated "
                                    "strings, e.g. 'fused add,bf16 out'")
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--e2e", action="store_true", help="also the end-to-end gr00t-n1.6 step, eager and compiled")
    p.add_argument("--kernel-sweep", help="also write the gr00t-shape triton rows as a report kernel_sweep.csv")
    p.add_argument("--launch", help="best_launch.json of an earlier run: the end-to-end step's Triton launch "
                                    "parameters when this run sweeps no kernel (--kernels none --e2e)")
    p.add_argument("--e2e-isolation", choices=("auto", "process", "none"), default="auto",
                   help="run each end-to-end variant in its own process (auto: on CUDA) or all in this one")
    p.add_argument("--e2e-variants",
                   help="end-to-end variants to run, OPS:MODE, e.g. torch:eager,triton:compile,rmsnorm+loss:graphs "
                        "(OPS: torch, triton, triton_fused, or op names joined by +; MODE: eager, compile, graphs; "
                        "default: torch and triton ops, eager and compile)")
    p.add_argument("--e2e-rounds", type=int,
                   help="interleaved rounds of timed steps per variant when the variants share a process "
                        "(--e2e-isolation none; default 2): each variant's per-round medians are "
                        "paired with the torch ops' (column note) and every step is written to e2e_steps.csv")
    p.add_argument("--e2e-profile", action="store_true",
                   help="also profile two end-to-end steps per variant (torch.profiler): e2e_profile.csv, the time "
                        "per kernel / op, to see where one variant loses to another")
    p.add_argument("--e2e-worker", help=argparse.SUPPRESS)  # OPS:MODE, one variant (internal)
    p.add_argument("--e2e-shape", help=argparse.SUPPRESS)  # PRESET:BATCH:SEQ (internal)
    p.add_argument("--launch-json", help=argparse.SUPPRESS)  # the launch parameters as JSON (internal)
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)

    import torch

    if args.e2e_worker:
        return _e2e_worker(args, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if not torch.cuda.is_available():
        print("kernels_bench needs a CUDA GPU (torch.cuda.is_available() is False here). The kernels' "
              "correctness tests run on the CPU: pytest tests/test_kernels.py (under TRITON_INTERPRET=1).",
              file=sys.stderr)
        return 2
    import kernels

    chosen = [k.strip() for k in args.kernels.split(",") if k.strip() and k.strip() != "none"]
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    if set(chosen) - set(kernels.LAUNCH_SPACES) or set(providers) - set(PROVIDERS):
        p.error(f"kernels must be among {list(kernels.LAUNCH_SPACES)}, providers among {list(PROVIDERS)}")
    return run(args, torch.device("cuda"))


def run(args: argparse.Namespace, dev) -> int:
    """The benchmark with parsed ``args`` on ``dev`` (CUDA; the tests smoke-run it on the CPU interpreter)."""
    import pandas as pd

    device = _Device(dev)
    chosen = [k.strip() for k in args.kernels.split(",") if k.strip() and k.strip() != "none"]
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f} s] {msg}", flush=True)

    from torch import _dynamo

    _dynamo.config.cache_size_limit = max(64, _dynamo.config.cache_size_limit)
    ver = versions()
    common = {**ver, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    ceiling = copy_ceiling_gb_per_s(args.quick, dev)
    log(f"{ver['gpu']}, torch {ver['torch']}, triton {ver['triton']}: copy ceiling {ceiling:,.0f} GB/s")
    rows: list[dict[str, Any]] = [{
        "kernel": "copy", "shape": f"{COPY_BYTES // 2**20} MiB", "mode": "copy", "provider": "torch",
        "sweep": "ceiling", "gb_per_s": ceiling, "pct_of_copy_ceiling": 100.0, "copy_ceiling_gb_per_s": ceiling,
        "median_ms": 2 * COPY_BYTES / ceiling / 1e6, "dtype": "bfloat16", **common}]
    models = [MAIN_MODEL] if args.quick else list(MODELS)
    shapes = [x.strip() for x in (args.shapes or "").split(",") if x.strip()]
    for case in _cases(models, dev):
        if case.kernel in chosen and (not shapes or any(x in case.shape_label for x in shapes)):
            rows += _bench_case(case, providers, args, ceiling, common, log, device)
    df = pd.DataFrame(rows)
    best = _best_launch(df)
    main_best: dict[str, dict[str, int]] = {}
    # the end-to-end step's parameters: the main model's shapes, the fused residual add's RMSNorm last (so its
    # best wins: the fused-add norms are all but one of the step's norms when the adds are fused)
    for shape, per_kernel in sorted(best.items(), key=lambda kv: "fused add" in kv[0]):
        if shape.startswith(MAIN_MODEL):
            main_best.update(per_kernel)
    if args.launch:  # launch parameters measured by an earlier run fill in the kernels this run did not sweep
        earlier = json.loads(Path(args.launch).read_text())["loongforge.compute_domain.kernels"]
        main_best = {**earlier, **main_best}
    if args.e2e and (args.e2e_isolation == "process" or (args.e2e_isolation == "auto" and device.cuda)):
        log(f"end to end {E2E_PRESET} {BATCH}x{SEQ}, one process per variant, Triton launch parameters "
            f"{main_best or 'defaults'}")
        rows += _bench_e2e_isolated(main_best, args, common, log)
        df = pd.DataFrame(rows)
    elif args.e2e:
        log(f"end to end {E2E_PRESET} {BATCH}x{SEQ}, Triton launch parameters {main_best or 'defaults'}")
        rows += _bench_e2e(main_best, args, common, log, device)
        df = pd.DataFrame(rows)
    steps = [{"provider": r["provider"], **k, **common} for r in rows if r.get("steps") for k in r["steps"]]
    if steps:  # every timed step of the end-to-end variants, with its round (paired comparisons)
        pd.DataFrame(steps).to_csv(out / "e2e_steps.csv", index=False)
        for r in rows:
            if r.get("note", "").startswith("paired"):
                log(f"  {r['provider']}: {r['note']}")
    prof = [{"provider": r["provider"], "rank": i + 1, **k, **common}
            for r in rows if r.get("profile") for i, k in enumerate(r["profile"])]
    if prof:  # long format: one row per variant and kernel
        pd.DataFrame(prof).to_csv(out / "e2e_profile.csv", index=False)
        for provider, g in pd.DataFrame(prof).groupby("provider", sort=False):
            log(f"  profile {provider}: " + "; ".join(f"{n[:40]} {ms:.2f} ms" for n, ms in
                                                     zip(g["name"][:4], g["self_ms_per_step"][:4])))
    df = df.reindex(columns=CSV_COLUMNS)
    df.to_csv(out / "kernels_bench.csv", index=False)
    (out / "best_launch.json").write_text(json.dumps(
        {"by_shape": best, "loongforge.compute_domain.kernels": main_best}, indent=1, sort_keys=True))
    if args.kernel_sweep:
        sweep = df[(df["provider"] == "triton") & (df["mode"] == "full") & df["shape"].str.startswith(MAIN_MODEL)]
        Path(args.kernel_sweep).parent.mkdir(parents=True, exist_ok=True)
        sweep.dropna(axis=1, how="all").to_csv(args.kernel_sweep, index=False)
    table, goals = _summary(df, ceiling)
    (out / "summary.md").write_text(table + "\n" + "\n".join(f"- {g}" for g in goals) + "\n")
    print()
    print(table)
    for g in goals:
        print(g)
    print(f"\nwrote {out / 'kernels_bench.csv'} ({len(df)} rows), best_launch.json, summary.md"
          f"{', e2e_profile.csv' if prof else ''} "
          f"in {time.time() - t_start:.0f} s")
    return 0


def _e2e_worker(args: argparse.Namespace, dev) -> int:
    """One end-to-end variant in this process; prints ``E2E_ROWS <json>`` (the parent adds versions)."""
    global E2E_PRESET, BATCH, SEQ
    ops_name, mode = args.e2e_worker.split(":")
    if args.e2e_shape:
        preset, b, t = args.e2e_shape.split(":")
        E2E_PRESET, BATCH, SEQ = preset, int(b), int(t)
    best = json.loads(args.launch_json) if args.launch_json else {}
    rows = _bench_e2e(best, args, {}, lambda msg: print(msg, flush=True), _Device(dev), variants=[(ops_name, mode)])
    if rows and rows[0].get("error"):
        print(rows[0]["error"], file=sys.stderr)
        return 1
    print("E2E_ROWS " + json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
