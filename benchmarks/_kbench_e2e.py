"""kernels_bench's end-to-end step: the gr00t-n1.6 training step with torch ops and with Triton ops (``--e2e``),
in one process in interleaved rounds or one process per variant."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _kbench_setup as setup
from _kbench_setup import _Device

SCRIPT = Path(__file__).resolve().with_name("kernels_bench.py")  # the CLI, run again as a worker per variant
ROOT = SCRIPT.parents[1]

E2E_VARIANTS = [(o, c) for c in ("eager", "compile") for o in ("torch", "triton")]
E2E_EXTRA = [(o, c) for c in ("eager", "compile") for o in ("triton_fused",)]
"""On request (``--e2e-variants``): the Triton ops with every residual add fused into the norm after it."""
E2E_MODES = ("eager", "compile", "graphs")
"""``graphs``: torch.compile with mode="reduce-overhead" (CUDA graphs of the forward and backward): the host's
launch overhead gone, as in the training loop's graph replay; on request only."""

PROFILE_STEPS = 2
PROFILE_TOP = 40  # kernels (ops on the CPU) kept per variant, by self time


def _bench_e2e_isolated(best: dict[str, dict[str, int]], args: argparse.Namespace, common: dict[str, str],
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each variant in a process of its own (``--e2e-worker``): a fresh allocator and compile cache per variant,
    and a variant that fails (a CUDA error poisons its context) costs only its own row."""
    import subprocess

    rows: list[dict[str, Any]] = []
    for ops_name, mode in _variants(args):
        cmd = [sys.executable, str(SCRIPT), "--e2e-worker", f"{ops_name}:{mode}",
               "--e2e-shape", f"{setup.E2E_PRESET}:{setup.BATCH}:{setup.SEQ}", "--launch-json", json.dumps(best)]
        if args.quick:
            cmd.append("--quick")
        if args.e2e_profile:
            cmd.append("--e2e-profile")
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
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
    return {"kernel": "e2e_step", "shape": f"{setup.E2E_PRESET} {setup.BATCH}x{setup.SEQ}", "mode": "train_step",
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

    _B, _T, dev = setup.BATCH, setup.SEQ, device.dev  # noqa: N806
    margs = get_preset(setup.E2E_PRESET)
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
    warmup, steps, rounds = _e2e_counts(args, len(variants))
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
    rows = [_e2e_result(v, best, common, times, errors, losses, peaks, profiles, tokens=_B * _T) for v in variants]
    model = opt = None
    device.empty_cache()
    return rows


def _e2e_counts(args: argparse.Namespace, n_variants: int) -> tuple[int, int, int]:
    """Warm-up steps (of the first round), timed steps per round, rounds; a worker process (one variant) takes
    its rounds' steps in one go."""
    warmup, steps, rounds = (2, 4, 1) if args.quick else (2, 6, 2)
    rounds = getattr(args, "e2e_rounds", None) or rounds
    if n_variants == 1:
        steps, rounds = steps * rounds, 1
    return warmup, steps, rounds


def _e2e_result(variant: tuple[str, str], best: dict[str, dict[str, int]], common: dict[str, str],
                times: dict[tuple[str, str], dict[int, list[float]]], errors: dict[tuple[str, str], str],
                losses: dict[tuple[str, str], float], peaks: dict[tuple[str, str], float],
                profiles: dict[tuple[str, str], list[dict[str, Any]]], *, tokens: int) -> dict[str, Any]:
    """A variant's result row: its median step and quantiles over every round, or the error that stopped it."""
    ops_name, mode = variant
    per_step = [(r, t) for r, ts in times[variant].items() for t in ts]
    ts = [t for _, t in per_step]
    base = _e2e_row(ops_name, mode, best, common)
    if variant in errors:  # its timed steps (if any) are incomplete: not reported as a result
        return {**base, "error": errors[variant]}
    ts_sorted = sorted(ts)
    q = lambda f: ts_sorted[min(len(ts_sorted) - 1, int(f * (len(ts_sorted) - 1) + 0.5))]  # noqa: E731
    med = statistics.median(ts)
    return {**base, "median_ms": med, "p20_ms": q(0.2), "p80_ms": q(0.8),
            "tokens_per_s": tokens / (med * 1e-3), "peak_mem_gib": peaks[variant],
            "loss": losses[variant], "profile": profiles.get(variant),
            "note": _paired_note(times, variant),
            "steps": [{"round": r, "step": i, "ms": t} for i, (r, t) in enumerate(per_step)]}


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
