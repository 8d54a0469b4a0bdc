"""kernels_bench's kernel cases: each kernel's inputs at a shape, timing one implementation, the launch sweeps."""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import _kbench_setup as setup
from _kbench_setup import MODES, _Device

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
    """Every kernel's cases at each model's shapes, in a fixed order: RMSNorm (fp32, bf16 out, the fused add),
    SwiGLU, RoPE, the fused linear + cross-entropy."""
    out: list[Case] = []
    for name in models:
        out += _rmsnorm_cases(name, dev)
        out += [_swiglu_case(name, dev), _rope_case(name, dev), _loss_case(name, dev)]
    return out


def _shape(name: str) -> tuple[int, int, dict[str, int]]:
    """Batch and sequence (read at call time: the tests' smoke run shrinks them) and the model's dims."""
    return setup.BATCH, setup.SEQ, setup.MODELS[name]


def _rmsnorm_cases(name: str, dev) -> list[Case]:
    import torch

    import kernels
    from workbench.train import ops

    _B, _T, m = _shape(name)  # noqa: N806
    D = m["hidden"]
    M = _B * _T

    def make_rms():
        x = torch.randn(_B, _T, D, device=dev, requires_grad=True)
        w = torch.ones(D, device=dev, requires_grad=True)
        return (x, w, 1e-5), [x, w], torch.randn(_B, _T, D, device=dev)

    es = 4
    out = [Case("rmsnorm", f"{name} {_B}x{_T}x{D}", {"rows": M, "hidden": D}, "float32", make_rms,
                kernels.rms_norm_triton, ops.rms_norm_torch,
                bytes={"fwd": 2 * M * D * es, "bwd": 3 * M * D * es, "full": 5 * M * D * es})]

    def make_rms_autocast():  # as the model runs it under bf16 autocast: fp32 stream in, bf16 out
        x = torch.randn(_B, _T, D, device=dev, requires_grad=True)
        w = torch.ones(D, device=dev, requires_grad=True)
        return (x, w, 1e-5, torch.bfloat16), [x, w], torch.randn(_B, _T, D, device=dev, dtype=torch.bfloat16)

    # fwd reads x (4 bytes) and writes y (2); bwd reads x and dy (2) and writes dx (4)
    out.append(Case("rmsnorm", f"{name} {_B}x{_T}x{D} bf16 out", {"rows": M, "hidden": D},
                    "float32>bfloat16", make_rms_autocast, kernels.rms_norm_triton, ops.rms_norm_torch,
                    bytes={"fwd": 6 * M * D, "bwd": 10 * M * D, "full": 16 * M * D}))

    def make_rms_add():  # the fused residual add as the model runs it: bf16 branch + fp32 stream, bf16 out
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
    return out


def _swiglu_case(name: str, dev) -> Case:
    import torch

    import kernels
    from workbench.train import ops

    _B, _T, m = _shape(name)  # noqa: N806
    F = m["ffn"]

    def make_swiglu():
        g = torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
        u = torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16, requires_grad=True)
        return (g, u), [g, u], torch.randn(_B, _T, F, device=dev, dtype=torch.bfloat16)

    n, es = _B * _T * F, 2
    return Case("swiglu", f"{name} {_B}x{_T}x{F}", {"numel": n}, "bfloat16", make_swiglu,
                kernels.swiglu_triton, ops.swiglu_torch,
                bytes={"fwd": 3 * n * es, "bwd": 5 * n * es, "full": 8 * n * es})


def _rope_case(name: str, dev) -> Case:
    import torch

    import kernels
    from workbench.train import ops
    from workbench.train.model import rope_cos_sin

    _B, _T, m = _shape(name)  # noqa: N806
    H, K = m["heads"], m["kv_heads"]
    d = m["hidden"] // H

    def make_rope():
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
    return Case("rope", f"{name} {_B}x{H}/{K}x{_T}x{d}", {"tokens": _B * _T, "q_heads": H, "k_heads": K,
                                                         "head_dim": d}, "bfloat16", make_rope,
                rope_layout(kernels.rope_triton), rope_layout(ops.rope_torch),
                bytes={"fwd": rope_bytes, "bwd": rope_bytes, "full": 2 * rope_bytes})


def _loss_case(name: str, dev) -> Case:
    import torch

    import kernels
    from workbench.train import ops

    _B, _T, m = _shape(name)  # noqa: N806
    D, V = m["hidden"], m["vocab"]
    N = _B * (_T - 1)

    def make_loss():
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
    return Case("fused_linear_ce", f"{name} {N}x{D}x{V}", {"rows": N, "hidden": D, "vocab": V},
                "float32+autocast_bf16", make_loss, autocast_loss(kernels.linear_cross_entropy_triton),
                autocast_loss(ops.linear_cross_entropy_torch),
                bytes={"fwd": nan, "bwd": nan, "full": nan},
                flops={"fwd": 2 * N * D * V, "bwd": 4 * N * D * V, "full": 6 * N * D * V})


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
    res["fwd"] = dict(zip(keys, setup.do_bench(fwd, quick)))
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    try:  # backward alone: the same graph again (retain_graph), so the forward is not timed
        res["bwd"] = dict(zip(keys, setup.do_bench(
            lambda: torch.autograd.grad(outs, params, up, retain_graph=True), quick)))
    except RuntimeError:  # the fused loss scales its saved gradients in place: its backward runs once
        res["bwd"] = {**dict(zip(keys, _bench_fresh_backward(fn, args, params, up, quick, device))),
                      "note": "backward of a fresh forward each run (it cannot be re-run); L2 not flushed"}
    out = outs = None  # released; not del: the closures above use these names (pyflakes)
    res["full"] = dict(zip(keys, setup.do_bench(full, quick)))
    if device.cuda:  # the host's launch overhead per call (fwd, full); the GPU time above excludes it
        res["fwd"]["host_ms"], res["full"]["host_ms"] = setup.host_ms(fwd), setup.host_ms(full)
    for mode in MODES:
        r = res[mode]
        b = case.bytes.get(mode, math.nan)
        r["gb_per_s"] = b / (r["median_ms"] * 1e-3) / 1e9 if not math.isnan(b) else math.nan
        f = case.flops.get(mode, math.nan)
        r["tflop_per_s"] = f / (r["median_ms"] * 1e-3) / 1e12 if mode == "full" and not math.isnan(f) else math.nan
        r["peak_mem_gib"] = peak if mode == "full" else math.nan
    args = params = upstream = up = None
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
    model's (B, T, heads, d) layout), it copies the gradient first. Inside a compiled model that copy does not
    happen (the backward that makes the gradient is in the same graph), so it is not charged to the reference
    (docs/kernel-notes.md, RoPE).
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
    # a copy of as many bytes as the op moves in each mode: what its size allows (setup.copy_ceiling_gb_per_s)
    # (forward and backward: full mode is two kernels, not one of the summed size)
    size_copy = {mode: setup.copy_ceiling_gb_per_s(args.quick, device.dev, b) for mode, b in case.bytes.items()
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
        small = args.quick or not case.shape_label.startswith(setup.MAIN_MODEL)  # the larger shape: main params only
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
