"""Tests for reports: a realistic study written to a temp dir (real Optuna SQLite storage, trial dirs,
baseline repeats, A/B validation, exported config), then assertions on each section's data and on the
HTML file.

``make_study`` is the fixture generator (also used by ``test_report_browser.py``): it plays the tuner's
part of the data contract with a seeded performance model of a 3B Llama on one 8-GPU H200 node, so the
numbers are plausible and every expected value is known.
"""

from __future__ import annotations

import copy
import datetime as dt
import html.parser
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

import reports
from reports import build_report, compute_sections
from reports._load import PHASES
from reports.render.figures import Figures
from reports.render.memory import render_memory
from reports.render.tables import missing_note

REPO = Path(__file__).resolve().parents[2]
LIFETIMES = REPO / "tests" / "assets" / "lifetimes_gr00t-n1.6_clip0_2026-12-01.json"
"""What ``python -m workbench.memory lifetimes --preset gr00t-n1.6 --set training.grad_clip=0`` wrote (the DAG on
fake tensors, on the CPU): 31 buckets of whole layers at 25 MiB, a lifetime-aware plan of 2 slots."""
SECTION_IDS = ("summary", "guide", "search", "time", "gpu", "compile", "numerics", "memory", "kernels", "data",
               "trials", "environment")

# --------------------------------------------------------------------------- the fixture generator

# Optuna parameter names are the tuner's short knob names (workbench.tune.knobs); KEYS maps them to config keys.
# The kernel launch knob has no short name in the registry yet: it is named by its config key.
KEYS = {
    "bucket_width": "data.bucket_width",
    "num_workers": "data.num_workers",
    "micro_batch_size": "data.micro_batch_size",
    "io_uring_entries": "loongforge.io_domain.io_uring_entries",
    "bucket_size_mb": "loongforge.overlap.bucket_size_mb",
    "overlap_ratio": "loongforge.overlap.overlap_ratio",
    "graph_capture": "loongforge.compute_domain.graph_capture",
    "expandable_segments": "loongforge.memory_domain.allocator.expandable_segments",
    "max_split_size_mb": "loongforge.memory_domain.allocator.max_split_size_mb",
    "loongforge.compute_domain.kernels.rmsnorm.num_warps": "loongforge.compute_domain.kernels.rmsnorm.num_warps",
}
SPACE = {
    "bucket_width": CategoricalDistribution([64, 128, 256, 512]),
    "num_workers": IntDistribution(2, 16),
    "micro_batch_size": CategoricalDistribution([1, 2, 4, 8]),
    "io_uring_entries": CategoricalDistribution([32, 64, 128, 256, 512]),
    "bucket_size_mb": FloatDistribution(5.0, 200.0, log=True),
    "overlap_ratio": FloatDistribution(0.0, 1.0),
    "graph_capture": CategoricalDistribution([False, True]),
    "expandable_segments": CategoricalDistribution([False, True]),
    "max_split_size_mb": IntDistribution(64, 1024, log=True),
    "loongforge.compute_domain.kernels.rmsnorm.num_warps": CategoricalDistribution([2, 4, 8, 16]),
}
KERNEL_KNOB = "loongforge.compute_domain.kernels.rmsnorm.num_warps"
OVERLAP_KNOBS = ("bucket_size_mb", "overlap_ratio")

BASE_CONFIG: dict[str, Any] = {
    "version": 1,
    "model": {"name": "custom", "config_path": "/mnt/models/llama-3.2-3b/config.json"},
    "data": {"loongbin_dir": "/mnt/data/loongbin/fineweb-edu", "micro_batch_size": 4, "seq_len": 4096,
             "bucket_width": 512, "num_workers": 4},
    "training": {"global_batch_size": 256, "max_steps": 60, "learning_rate": 3.0e-4, "log_every": 10,
                 "warmup_measure_steps": 3},
    "loongforge": {
        "io_domain": {"io_uring_entries": 64},
        "memory_domain": {"pinned_block_kb": 256, "allocator": {"expandable_segments": False}},
        "compute_domain": {"graph_capture": False, "triton_fusion": True,
                           "kernels": {"rmsnorm": {"num_warps": 4, "num_stages": 2, "block_size": 4096},
                                       "swiglu": {"num_warps": 8, "num_stages": 3, "block_size": 1024}}},
        "overlap": {"bucket_size_mb": 25.0, "overlap_ratio": 1.0},
    },
    "hardware": {"gpus": 8},
}
BASELINE_PARAMS = {"bucket_width": 512, "num_workers": 4, "micro_batch_size": 4, "io_uring_entries": 64,
                   "bucket_size_mb": 25.0, "overlap_ratio": 1.0, "graph_capture": False,
                   "expandable_segments": False, KERNEL_KNOB: 4}
"""The base config's knob values (max_split_size_mb is unset in the base: torch's default)."""

FAILURES = {  # trial number -> (status, failure reason, last log line)
    5: ("oom", "CUDA out of memory while allocating 6.00 GiB (micro_batch_size 8, no expandable segments)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 3 has a total "
        "capacity of 139.81 GiB of which 2.13 GiB is free."),
    9: ("timeout", "no step finished for 300 s (watchdog)", "[watchdog] no progress for 300 s; sending SIGKILL"),
    12: ("crash", "rank 5 exited with signal 6 (SIGABRT)",
         "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error"),
    15: ("nan_loss", "loss became NaN at step 21 <after warm-up>", "step 21: loss nan, grad_norm inf"),
    19: ("invalid_config", "loongforge.compute_domain.graph_capture: true cannot be combined with compile: "
         "'reduce-overhead'", "ConfigError: graph_capture: true cannot be combined with compile"),
    22: ("compile_error", "triton: out of resources: shared memory, Required: 262144, Hardware limit: 232448",
         "triton.runtime.errors.OutOfResources: out of resource: shared memory"),
}
PRUNED = (3, 8, 17, 24)


@dataclass
class FixtureStudy:
    """What ``make_study`` wrote, with the values the report must reproduce."""

    dir: Path
    storage_url: str
    name: str
    multi_objective: bool
    gpus: int
    trial_tput: dict[int, float] = field(default_factory=dict)
    """Objective of every trial that ran to the end (status ok)."""
    statuses: dict[int, str] = field(default_factory=dict)
    params: dict[int, dict] = field(default_factory=dict)
    baseline_repeats: list[float] = field(default_factory=list)
    validation: dict = field(default_factory=dict)
    best: int | None = None
    padding: dict[int, list[float]] = field(default_factory=dict)
    """bucket width -> padding ratios of the ok trials using it."""


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    *path, leaf = key.split(".")
    for p in path:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def _config_for(params: dict[str, Any], gpus: int) -> dict:
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg["hardware"]["gpus"] = gpus
    for k, v in params.items():
        _set_dotted(cfg, KEYS[k], v)
    return cfg


def _simulate(params: dict[str, Any], rng: np.random.Generator, *, gpus: int, steps: int = 43,
              warmup: int = 3, window: int = 10) -> tuple[pd.DataFrame, list[dict], dict]:
    """A run of ``steps`` steps under a simple performance model: (phases.csv, metrics.jsonl rows, summary)."""
    p = {**BASELINE_PARAMS, "max_split_size_mb": None, **params}
    mbs, bw = p["micro_batch_size"], p["bucket_width"]
    # Padded tokens per second of forward+backward, by knob (an eager 3B Llama at ~30% MFU on an H200).
    compute_tps = 16_000.0 * {1: 0.82, 2: 0.93, 4: 1.0, 8: 1.03}[mbs]
    compute_tps *= 1.12 if p["graph_capture"] else 1.0
    compute_tps *= {2: 0.96, 4: 1.0, 8: 1.04, 16: 0.99}[p[KERNEL_KNOB]]
    compute_tps *= 1.02 if p["expandable_segments"] else 1.0
    # What the workers deliver to the step (sets data_wait) ...
    feed_tps = 3_000.0 * p["num_workers"] * (0.85 + 0.15 * math.log2(p["io_uring_entries"]) / 9)
    # ... and what the pipeline records as decode/tokens_per_s: decoded tokens per busy decode-second, a per-core
    # capacity thousands of times the step's rate (loaders.csv: 3.3e7 per core for io_uring on a CPU host; the
    # tiny CPU study of test_report_tuner records 5e7-7e7).
    decode_tps = 3.3e7 * (0.9 + 0.1 * math.log2(p["io_uring_entries"]) / 9)
    comm_s = 0.055 if gpus > 1 else 0.0
    ratio = p["overlap_ratio"] if gpus > 1 else 0.0
    bucket_mb = p["bucket_size_mb"]
    exposed = comm_s * (1 - 0.92 * ratio) + comm_s * (0.25 if bucket_mb < 10 else 0.15 if bucket_mb > 100 else 0.0)
    rows = []
    for step in range(steps):
        length = float(np.clip(rng.lognormal(math.log(1100), 0.6), 64, 4096))
        seq = int(min(math.ceil(length / bw) * bw, 4096))
        real = int(sum(rng.integers(max(seq - bw, 32) + 1, seq + 1) for _ in range(mbs)))
        padded = mbs * seq
        noise = lambda: float(rng.lognormal(0.0, 0.03))  # noqa: E731 - run-to-run jitter
        fwd = padded / compute_tps / 3 * noise()
        bwd = 2 * padded / compute_tps / 3 * noise()
        row = {"step": step, "measured": int(step >= warmup), "seq_len": seq, "real_tokens": real,
               "padded_tokens": padded, "loss": round(10.8 * math.exp(-step / 60) + 1.5, 4),
               "data_wait": max(0.0, padded / (feed_tps * noise()) - (fwd + bwd)) + 0.0004 * noise(),
               "h2d": 0.00035 * mbs * noise(), "forward": fwd, "backward": bwd,
               "grad_sync": exposed * noise(), "optimizer": 0.024 * noise(),
               "other": (0.0015 if p["graph_capture"] else 0.0042) * noise()}
        if step < warmup:
            row["forward"] *= 6  # compile / graph capture / allocator settling
        row["step_s"] = sum(row[ph] for ph in PHASES)
        rows.append(row)
    phases = pd.DataFrame(rows)
    # Round as the metrics writer does (%.6e), then make step_s the sum of what was written.
    for ph in PHASES:
        phases[ph] = phases[ph].map(lambda v: float(f"{v:.6e}"))
    phases["step_s"] = phases[list(PHASES)].sum(axis=1)

    reserved_base = 38.0 + 11.5 * mbs + (0.0 if p["expandable_segments"] else 4.5)
    split = p["max_split_size_mb"]
    frag = (1.2 if p["expandable_segments"] else 6.5) * (
        0.7 if split is not None and split < 256 else 1.0)
    allocated = reserved_base - frag
    # Shard reads from the page cache: the quantiles sit close together (the tiny CPU study records p50 0.65 ms,
    # p90 0.69 ms, p99 0.70 ms), so every bar of the read-latency figure is tall.
    p50 = 0.35 + 24.0 / p["io_uring_entries"]

    m = phases[phases["measured"] == 1]
    windows = []
    for start in range(0, len(m) - window + 1, window):
        w = m.iloc[start:start + window]
        wall = float(w["step_s"].sum())
        lat = p50 * noise()
        win = {"step": int(w["step"].iloc[-1]), "steps": window,
               "throughput/real_tokens_per_s_per_gpu": float(w["real_tokens"].sum()) / wall,
               "mfu_pct": 100 * float(w["real_tokens"].sum()) * 2.2e10 / wall / 989e12,
               "time/step_s": wall / window,
               "data/padding_ratio": 1 - float(w["real_tokens"].sum()) / float(w["padded_tokens"].sum()),
               "memory/max_allocated_gib": round(allocated, 3), "memory/max_reserved_gib": round(reserved_base, 3),
               "memory/fragmentation_gib": round(frag * 0.8, 3),
               "io/read_latency_ms_p50": lat, "io/read_latency_ms_p90": 1.06 * lat * noise() ** 0.1,
               "io/read_latency_ms_p99": 1.1 * lat * noise() ** 0.1, "decode/tokens_per_s": decode_tps * noise(),
               "io/backend": "io_uring", "loss": float(w["loss"].iloc[-1])}
        for ph in PHASES:
            win[f"time/{ph}_s"] = float(w[ph].mean())
            win[f"time/{ph}_pct"] = 100 * float(w[ph].sum()) / wall
        windows.append(win)
    wall = float(m["step_s"].sum())
    summary = {
        "throughput/real_tokens_per_s_per_gpu": float(m["real_tokens"].sum()) / wall,
        "mfu_pct": 100 * float(m["real_tokens"].sum()) * 2.2e10 / wall / 989e12,
        "phase_s_per_step": {ph: float(m[ph].mean()) for ph in PHASES},
        "time/step_s": wall / len(m),
        "memory/max_reserved_gib": round(reserved_base, 3), "memory/max_allocated_gib": round(allocated, 3),
        "memory/predicted_peak_gib": round(allocated * 1.02, 3), "memory/max_rss_gib": 21.4, "memory/fragmentation_gib": round(frag * 0.8, 3),
        "first_loss": float(phases["loss"].iloc[0]), "last_loss": float(phases["loss"].iloc[-1]),
        "io/backend": "io_uring",
        "io/read_latency_ms_p50": statistics.median(w["io/read_latency_ms_p50"] for w in windows),
        "io/read_latency_ms_p90": statistics.median(w["io/read_latency_ms_p90"] for w in windows),
        "io/read_latency_ms_p99": statistics.median(w["io/read_latency_ms_p99"] for w in windows),
        "decode/tokens_per_s": statistics.median(w["decode/tokens_per_s"] for w in windows),
        "data/padding_ratio": 1 - float(m["real_tokens"].sum()) / float(m["padded_tokens"].sum()),
    }
    return phases, windows, summary


_CPU = False  # set by make_study(cpu=True) while it writes


def _cpu_run(record: dict | None) -> dict | None:
    if record is None or not _CPU:
        return record
    return {**record, "mfu_pct": None, "memory/max_allocated_gib": None, "memory/max_reserved_gib": None,
            "memory/fragmentation_gib": None, "memory/max_rss_gib": 3.2}


def _write_run(d: Path, cfg: dict, phases: pd.DataFrame | None, windows: list[dict] | None,
               summary: dict | None, failure: dict | None = None, log: str = "") -> None:
    summary = _cpu_run(summary)
    windows = [_cpu_run(w) for w in windows] if windows is not None else None
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if phases is not None:
        phases.to_csv(d / "phases.csv", index=False, float_format="%.6e")
    if windows is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(w) + "\n" for w in windows))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary, indent=1))
    if failure is not None:
        (d / "failure.json").write_text(json.dumps(failure))
    (d / "log.txt").write_text(log or "[trial] started\n[trial] finished\n")


def _sample(rng: np.random.Generator, space: dict) -> dict[str, Any]:
    out = {}
    for k, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            out[k] = dist.choices[int(rng.integers(len(dist.choices)))]
        elif isinstance(dist, IntDistribution):
            lo, hi = dist.low, dist.high
            out[k] = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) if dist.log else int(
                rng.integers(lo, hi + 1))
        else:
            v = math.exp(rng.uniform(math.log(dist.low), math.log(dist.high))) if dist.log else rng.uniform(
                dist.low, dist.high)
            out[k] = round(float(v), 3)
    return out


def _bootstrap_ci(ratios: list[float], rng: np.random.Generator) -> tuple[float, float]:
    r = np.asarray(ratios)
    meds = np.median(rng.choice(r, size=(2000, len(r)), replace=True), axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def make_study(root: Path, *, name: str = "llama3b-h200x8", n_trials: int = 28, gpus: int = 8,
               multi_objective: bool = False, validate: bool = True, running: bool = True, cpu: bool = False,
               seed: int = 0) -> FixtureStudy:
    """Write a finished (or, with ``running``, nearly finished) study under ``root/name``, as the tuner would.

    ``cpu`` writes what a CPU run records: no device memory figures and no MFU (no peak to divide by).
    """
    global _CPU
    _CPU = cpu
    try:
        return _make_study(root, name=name, n_trials=n_trials, gpus=gpus, multi_objective=multi_objective,
                           validate=validate, running=running, seed=seed)
    finally:
        _CPU = False


def _make_study(root: Path, *, name: str, n_trials: int, gpus: int, multi_objective: bool, validate: bool,
                running: bool, seed: int) -> FixtureStudy:
    rng = np.random.default_rng(seed)
    d = root / name
    d.mkdir(parents=True)
    storage = f"sqlite:///{d / 'study.db'}"
    space = {k: v for k, v in SPACE.items() if gpus > 1 or k not in OVERLAP_KNOBS}
    dropped = [] if gpus > 1 else [
        {"knob": k, "reason": "one GPU: there is no gradient all-reduce to bucket or overlap"} for k in OVERLAP_KNOBS]
    directions = ["maximize", "minimize"] if multi_objective else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    if multi_objective:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["throughput/real_tokens_per_s_per_gpu", "memory/max_reserved_gib"])
    fx = FixtureStudy(dir=d, storage_url=storage, name=name, multi_objective=multi_objective, gpus=gpus)

    # Baseline repeats: the noise floor.
    for i in range(3):
        ph, win, summ = _simulate({}, rng, gpus=gpus)
        _write_run(d / "baseline" / str(i), _config_for({}, gpus), ph, win, summ)
        fx.baseline_repeats.append(summ["throughput/real_tokens_per_s_per_gpu"])
    base = fx.baseline_repeats
    noise = {"median": statistics.median(base), "min": min(base), "max": max(base),
             "rel_spread": (max(base) - min(base)) / statistics.median(base),
             "cv": statistics.stdev(base) / statistics.mean(base), "runs": base}

    t0 = dt.datetime(2025, 3, 4, 9, 0, tzinfo=dt.timezone.utc)
    clock = t0 + dt.timedelta(minutes=6)
    frozen = []
    for n in range(n_trials):
        params = _sample(rng, space)
        if n == 0:  # the tuner enqueues the baseline first
            params = {k: BASELINE_PARAMS.get(k, params[k]) for k in space}
        if n in (6, 11):  # good regions found by the sampler
            params.update({"micro_batch_size": 4, "bucket_width": 128, "num_workers": 12,
                           "graph_capture": True,
                           KERNEL_KNOB: 8,
                           "expandable_segments": True})
            if gpus > 1:
                params.update({"overlap_ratio": 0.9, "bucket_size_mb": 40.0})
        if n == 5:
            params.update({"micro_batch_size": 8,
                           "expandable_segments": False})
        params = {k: v for k, v in params.items() if k in space}
        tdir = d / "trials" / str(n)
        cfg = _config_for(params, gpus)
        attrs: dict[str, Any] = {"config_path": str(tdir / "config.yaml"), "trial_dir": f"trials/{n}"}
        duration = dt.timedelta(seconds=float(rng.uniform(150, 260)))
        values = None
        intermediate: dict[int, float] = {}
        state = TrialState.COMPLETE
        if n in FAILURES:
            status, reason, last = FAILURES[n]
            log = f"[trial {n}] launching torchrun --nproc-per-node {gpus}\n" + "".join(
                f"[rank0] step {s}: loss {10.8 - 0.1 * s:.3f}\n" for s in range(8)) + last + "\n"
            ph, win, summ = (None, None, None)
            if status == "nan_loss":
                ph, win, summ = _simulate(params, rng, gpus=gpus, steps=22)
                win, summ = win[:1], None
            _write_run(tdir, cfg, ph, win, summ, failure={"kind": status, "message": reason}, log=log)
            attrs.update({"status": status, "failure_reason": reason, "log_tail": "\n".join(log.splitlines()[-5:]),
                          "summary": {}, "constraint": [0.0]})
            values = [0.0, 0.0] if multi_objective else [0.0]
            duration = dt.timedelta(seconds=300.0 if status == "timeout" else float(rng.uniform(20, 90)))
        else:
            ph, win, summ = _simulate(params, rng, gpus=gpus)
            intermediate = {int(w["step"]): w["throughput/real_tokens_per_s_per_gpu"] for w in win}
            if n in PRUNED:
                state = TrialState.PRUNED
                intermediate = dict(list(intermediate.items())[:2])
                win = win[:2]
                ph = ph[ph["step"] <= max(intermediate)]
                _write_run(tdir, cfg, ph, win, None)
                attrs.update({"status": "pruned", "summary": {}})
                duration = dt.timedelta(seconds=float(rng.uniform(60, 100)))
            else:
                _write_run(tdir, cfg, ph, win, summ)
                tput = summ["throughput/real_tokens_per_s_per_gpu"]
                share = summ["memory/max_reserved_gib"] / 139.81
                values = [tput, summ["memory/max_reserved_gib"]] if multi_objective else [tput]
                attrs.update({"status": "ok", "failure_reason": "", "summary": _cpu_run(summ),
                              "constraint": [share - 0.95]})
                fx.trial_tput[n] = tput
                fx.padding.setdefault(params["bucket_width"], []).append(summ["data/padding_ratio"])
        fx.statuses[n] = attrs["status"]
        fx.params[n] = params
        t = optuna.trial.create_trial(
            state=state, values=values, params=params, distributions={k: space[k] for k in params},
            user_attrs=attrs, intermediate_values=intermediate)
        t.datetime_start, t.datetime_complete = clock, clock + duration
        clock += duration + dt.timedelta(seconds=5)
        frozen.append(t)
    study.add_trials(frozen)
    if running:  # a worker still measuring: in storage, no values, no files yet
        trial = study.ask()
        for k, dist in space.items():
            if isinstance(dist, CategoricalDistribution):
                trial.suggest_categorical(k, dist.choices)
            elif isinstance(dist, IntDistribution):
                trial.suggest_int(k, dist.low, dist.high, log=dist.log)
            else:
                trial.suggest_float(k, dist.low, dist.high, log=dist.log)
        fx.statuses[trial.number] = "running"

    ranked = sorted(fx.trial_tput, key=fx.trial_tput.get, reverse=True)
    fx.best = ranked[0]
    if validate:
        # Interleaved A/B rounds, named as workbench.tune names them (validation/{baseline,trial}-<n>-<round>).
        cands = []
        for c in ranked[:3]:
            runs, bases, run_dirs, base_dirs = [], [], [], []
            for r in range(5):
                ph, win, summ = _simulate({}, rng, gpus=gpus)
                bases.append(summ["throughput/real_tokens_per_s_per_gpu"])
                base_dirs.append(str(d / "validation" / f"baseline-{c}-{r}"))
                _write_run(Path(base_dirs[-1]), _config_for({}, gpus), ph, win, summ)
                ph, win, summ = _simulate(fx.params[c], rng, gpus=gpus)
                runs.append(summ["throughput/real_tokens_per_s_per_gpu"])
                run_dirs.append(str(d / "validation" / f"trial-{c}-{r}"))
                _write_run(Path(run_dirs[-1]), _config_for(fx.params[c], gpus), ph, win, summ)
            ratios = [a / b for a, b in zip(runs, bases)]
            lo, hi = _bootstrap_ci(ratios, rng)
            cands.append({"trial": c, "params": fx.params[c], "search_value": fx.trial_tput[c], "runs": runs,
                          "baseline_runs": bases, "run_dirs": run_dirs, "baseline_dirs": base_dirs,
                          "failures": [], "ratios": ratios, "speedup_median": statistics.median(ratios),
                          "ci_low": lo, "ci_high": hi, "significant": lo > 1.0})
        win_c = max(cands, key=lambda c: c["speedup_median"])
        winner = {k: win_c[k] for k in ("trial", "significant", "speedup_median", "ci_low", "ci_high")}
        fx.validation = {"baseline_runs": base, "noise_floor": noise, "method": "bootstrap of the median ratio",
                         "confidence": 0.95, "ab_rounds": 5, "candidates": cands, "winner": winner,
                         "reference": {"reference": "the plain compiled loop (torch.compile, default mode, no CUDA "
                                                    "graphs)", "ran": True, "same_as_base": False,
                                       "trial": winner["trial"], "ratios": [1.31, 1.29], "speedup_median": 1.3,
                                       "ci_low": 1.21, "ci_high": 1.39, "significant": True, "pairs": 2},
                         "complete": True}
        (d / "validation.json").write_text(json.dumps(fx.validation, indent=1))
        fx.best = winner["trial"]

    fingerprint = {"gpu": "NVIDIA H200", "gpu_count": str(gpus), "driver": "550.90.07", "cuda": "12.4",
                   "torch": "2.5.1+cu124", "triton": "3.1.0", "nccl": "2.21.5", "python": "3.11.9",
                   "hostname": "gpu-node-017"}
    (d / "environment.json").write_text(json.dumps(fingerprint, indent=1))
    shutil.copy(LIFETIMES, d / "lifetimes.json")  # the tuner's gradient-lifetime analysis of the base config
    best_cfg = _config_for(fx.params[fx.best], gpus)
    w = fx.validation.get("winner", {})
    best_cfg["provenance"] = {
        "study": name, "trial": fx.best, "tokens_per_s_per_gpu": fx.trial_tput[fx.best],
        "speedup": w.get("speedup_median"), "speedup_ci": [w.get("ci_low"), w.get("ci_high")] if w else None,
        "significant": w.get("significant"), "baseline_tokens_per_s_per_gpu": noise["median"],
        "fingerprint": fingerprint, "created": "2025-03-04T12:41:07+00:00"}
    (d / "config.yaml").write_text("# Exported by python -m workbench.tune; trial <%d> of %s\n" % (fx.best, name)
                                   + yaml.safe_dump(best_cfg, sort_keys=False))
    spec = {"name": name, "model": {"name": "custom", "config_path": BASE_CONFIG["model"]["config_path"]},
            "base": "studies/llama3b-base.yaml",
            "space": {k: {"choices": list(v.choices)} if isinstance(v, CategoricalDistribution) else
                      {"low": v.low, "high": v.high, "log": v.log} for k, v in space.items()},
            "budget": {"trials": n_trials, "hours": 2.0},
            "objective": {"multi_objective": multi_objective, "memory_share_limit": 0.95},
            "sampler": "tpe", "pruner": "median", "protocol": {"warmup_steps": 3, "window": 10, "windows": 4,
                                                               "baseline_repeats": 3, "validation_rounds": 5},
            "gpus": gpus}
    tune = {"study_name": name, "storage_url": storage, "spec": spec, "dropped_knobs": dropped,
            "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": gpus, "gpu_memory_gib": 139.81,
                         "nvlink": gpus > 1, "cpu_count": 192, "host_memory_gib": 2015.6, "io_uring": True},
            "noise_floor": noise, "started": t0.isoformat(), "finished": None if running else clock.isoformat()}
    # two coordinator calls: a first one that finished after 90 s, and a resume still running (or, for a
    # finished study, a first call stopped without an end recorded and a resume that finished)
    resumed = t0 + dt.timedelta(minutes=2)
    tune["sessions"] = ([{"started": t0.isoformat(), "finished": (t0 + dt.timedelta(seconds=90)).isoformat()},
                         {"started": resumed.isoformat(), "finished": None}] if running else
                        [{"started": t0.isoformat(), "finished": None},
                         {"started": resumed.isoformat(), "finished": clock.isoformat()}])
    tune["wall_s"] = 90.0 if running else (clock - resumed).total_seconds()
    tune["gpu_minutes"] = {"budget": 10.0, "total": 6.0, "by_phase": {
        "baseline": 1.5, "screening": 3.0, "trials": 0.0, "numerics": 0.0, "validation": 1.2, "traces": 0.3}}
    tune["screening"] = {"pruner": "successive_halving", "stages": [{"windows": 1, "trials": 7},
                                                                    {"windows": 4, "trials": 2}],
                         "refused_without_run": 1, "repeats": 0, "configs_evaluated": 8,
                         "configs_per_gpu_minute": 1.333}
    (d / "tune.json").write_text(json.dumps(tune, indent=1))
    return fx


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> FixtureStudy:
    return make_study(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def rep(fx):
    return compute_sections(fx.dir, fx.storage_url, fx.name)


@pytest.fixture(scope="module")
def page(fx) -> str:
    path = build_report(fx.dir, fx.storage_url, fx.name)
    assert path == fx.dir / "report.html"
    return path.read_text()


# --------------------------------------------------------------------------- section data


def test_no_section_failed(rep):
    for key in SECTION_IDS:
        assert not isinstance(getattr(rep, key), reports.sections.SectionFailed), getattr(rep, key)


def test_summary_best_vs_baseline(rep, fx):
    s = rep.summary
    assert s.message is None
    assert s.best_trial == fx.best and s.best_how == "validated winner"
    cand = next(c for c in fx.validation["candidates"] if c["trial"] == fx.best)
    row = s.table.set_index("metric").loc["throughput/real_tokens_per_s_per_gpu"]
    assert row["baseline"] == pytest.approx(statistics.median(cand["baseline_runs"]))
    assert row["best"] == pytest.approx(statistics.median(cand["runs"]))
    assert row["ratio"] == pytest.approx(row["best"] / row["baseline"])
    assert row["best"] > row["baseline"]
    w = fx.validation["winner"]
    assert s.speedup.median == pytest.approx(w["speedup_median"])
    assert (s.speedup.ci_low, s.speedup.ci_high) == pytest.approx((w["ci_low"], w["ci_high"]))
    assert s.speedup.ci_low <= s.speedup.median <= s.speedup.ci_high
    assert s.speedup.rounds == 5 and s.speedup.significant == w["significant"]
    metrics = set(s.table["metric"])
    assert {"mfu_pct", "memory/max_reserved_gib", "time/step_s"} <= metrics
    # Peak memory of the best: median over its trial dir and validation re-runs.
    mem = s.table.set_index("metric").loc["memory/max_reserved_gib"]
    assert mem["best"] == pytest.approx(rep.memory.peaks.loc["best", "max_reserved_gib"])


def test_summary_changed_knobs(rep, fx):
    k = rep.summary.knobs.set_index("knob")
    best = fx.params[fx.best]
    assert set(k.index) == set(SPACE)
    for knob, v in best.items():
        assert k.loc[knob, "best"] == v
        if knob in BASELINE_PARAMS:
            assert k.loc[knob, "baseline"] == BASELINE_PARAMS[knob]
            assert k.loc[knob, "changed"] == (v != BASELINE_PARAMS[knob])
    # Unset in the base config (torch's default): unknown baseline, shown as a change.
    assert k.loc["max_split_size_mb", "changed"] is None
    assert rep.summary.config_text.startswith("# Exported by python -m workbench.tune")


def test_summary_ab_runs(rep, fx):
    ab = rep.summary.ab_runs
    assert len(ab) == 3 * 5 * 2 and set(ab["arm"]) == {"baseline", "candidate"}
    assert list(rep.summary.candidates["trial"]) == [c["trial"] for c in fx.validation["candidates"]]


def test_search_history_and_importances(rep, fx):
    s = rep.search
    h = s.history.set_index("trial")
    finished = [n for n, st in fx.statuses.items() if st not in ("running",)]
    assert sorted(h.index) == sorted(finished)
    ok = sorted(fx.trial_tput)
    expect = pd.Series([fx.trial_tput[n] for n in ok], index=ok).cummax()
    assert h.loc[ok, "best_so_far"].to_numpy() == pytest.approx(expect.to_numpy())
    assert h["best_so_far"].max() == pytest.approx(max(fx.trial_tput.values()))
    assert (h.loc[list(FAILURES), "value"] == 0).all()
    assert s.importances is not None and s.importances_message is None
    assert set(s.importances["knob"]) <= set(SPACE)
    assert s.importances["importance"].sum() == pytest.approx(1.0)
    assert list(s.knobs["trial"]) == ok and s.pareto is None
    # Each knob's kind (for its axis: category labels, whole-number ticks) and the categorical choices in order.
    kinds = {k: {"CategoricalDistribution": "categorical", "IntDistribution": "int"}.get(type(d).__name__, "float")
             for k, d in SPACE.items()}
    assert s.knob_kinds == kinds
    assert s.knob_choices == {k: list(d.choices) for k, d in SPACE.items() if kinds[k] == "categorical"}
    assert rep.memory.knob_kinds == {k: kinds[k] for k in rep.memory.memory_knobs}
    assert s.baseline_band[1] == pytest.approx(min(fx.baseline_repeats))


def test_search_says_where_the_gpu_minutes_went(rep, fx, tmp_path):
    m = rep.search.gpu_minutes.set_index("phase")
    assert list(m.index) == ["baseline", "screening", "trials", "numerics", "validation", "traces"]
    assert m.loc["screening", "gpu_minutes"] == 3.0 and m.loc["screening", "share"] == pytest.approx(0.5)
    assert m["share"].sum() == pytest.approx(1.0)
    assert rep.search.gpu_minutes_line == ("GPU-minutes: 6.0 of 10 (baseline 1.5, screening 3.0, validation 1.2, "
                                           "traces 0.3); trials measured: 7 at 1 window, 2 at 4 windows; 1 refused "
                                           "without a run; 1.33 configs a GPU-minute")
    # a study from before the budget (or on a machine that timed nothing): no table, nothing invented
    old = tmp_path / "old"
    shutil.copytree(fx.dir, old)
    tune = json.loads((old / "tune.json").read_text())
    del tune["gpu_minutes"], tune["screening"]
    (old / "tune.json").write_text(json.dumps(tune))
    s = compute_sections(old, f"sqlite:///{old / 'study.db'}", fx.name).search
    assert s.gpu_minutes is None and s.gpu_minutes_line is None
    # a CPU study's minutes are called what they are
    tune["gpu_minutes"] = {"device": "cpu", "budget": None, "total": 2.0, "by_phase": {"baseline": 1.0, "trials": 1.0}}
    (old / "tune.json").write_text(json.dumps(tune))
    s = compute_sections(old, f"sqlite:///{old / 'study.db'}", fx.name).search
    assert s.gpu_minutes.attrs["device"] == "cpu" and s.gpu_minutes_line.startswith("CPU-minutes: 2.0 (")


def test_time_phases_sum_to_step_time(rep):
    t = rep.time
    assert list(t.breakdown.index) == ["baseline", "best"]
    sums = t.breakdown[list(PHASES)].sum(axis=1)
    # phases.csv holds 7 significant digits (%.6e) per value: sums agree to ~1e-7, not to the last bit.
    assert sums.to_numpy() == pytest.approx(t.breakdown["step_s"].to_numpy(), rel=1e-6)
    assert not sums.to_numpy() == pytest.approx(t.breakdown["step_s"].to_numpy() * 1.001, rel=1e-6)
    # The timeline: contiguous phases, each step as long as its step time.
    for (run, step), g in t.timeline.groupby(["run", "step"]):
        g = g.set_index("phase").loc[list(PHASES)]
        assert (g["start_s"].iloc[1:].to_numpy() == pytest.approx(
            (g["start_s"] + g["duration_s"]).iloc[:-1].to_numpy()))
    assert t.timeline.groupby("run")["step"].nunique().to_dict() == {"baseline": 3, "best": 3}
    # Step times: 40 measured steps per run; baseline = 3 repeats + 15 interleaved runs.
    counts = t.step_times.groupby("run").size().to_dict()
    assert counts == {"baseline": 40 * (3 + 15), "best": 40 * (1 + 5)}
    assert t.step_stats.loc["best", "median_s"] < t.step_stats.loc["baseline", "median_s"]


def test_time_breakdown_matches_phases_csv(rep, fx):
    run = pd.read_csv(fx.dir / "baseline" / "0" / "phases.csv")
    first = rep.time.step_times[rep.time.step_times["source"] == "baseline/0"]
    assert first["step_s"].to_numpy() == pytest.approx(run[run["measured"] == 1]["step_s"].to_numpy())


def test_memory(rep, fx):
    m = rep.memory
    assert m.message is None
    # the memory model's prediction sits beside the measured peak, per arm and per trial
    assert m.peaks.loc["best", "predicted_peak_gib"] == pytest.approx(m.peaks.loc["best", "max_allocated_gib"] * 1.02,
                                                                      abs=2e-3)
    assert (m.by_trial["predicted_peak_gib"] / m.by_trial["max_allocated_gib"]).round(2).eq(1.02).all()
    assert m.analysis_message.startswith("Memory analysis not run")
    assert m.histogram is None
    best = fx.params[fx.best]
    assert m.peaks.loc["best", "max_reserved_gib"] == pytest.approx(
        38.0 + 11.5 * best["micro_batch_size"] + (0 if best[
            "expandable_segments"] else 4.5))
    assert (m.peaks["reserved_minus_allocated_gib"] > 0).all()
    assert "expandable_segments" in m.memory_knobs
    assert len(m.by_trial) == len(fx.trial_tput)


def test_memory_gradient_lifetimes(rep, fx):
    """lifetimes.json in the study directory: the buckets in launch order, the two plans' peaks, the slots and the
    saving, as the analysis wrote them."""
    doc = json.loads(LIFETIMES.read_text())
    m = rep.memory
    assert m.lifetimes_message is None and m.lifetimes_notes == []
    assert len(m.lifetimes) == len(doc["buckets"]) == 31
    assert m.lifetimes["bucket"].tolist() == list(range(31))
    assert m.lifetimes.loc[0, "layers"] == "lm_head" and m.lifetimes.loc[30, "layers"] == "embed_tokens"
    assert m.lifetimes["first_tick"].is_monotonic_increasing  # buckets fill in launch order here
    assert m.lifetimes["mib"].sum() == pytest.approx(doc["total_bytes"] / 2 ** 20)
    summary = m.lifetimes_summary.set_index("metric")["value"]
    assert summary["peak live gradients MiB, today's plan"] == pytest.approx(doc["total_bytes"] / 2 ** 20)
    assert summary["peak live gradients MiB, lifetime-aware plan"] == pytest.approx(588.6, abs=0.05)
    assert summary["buffer slots, lifetime-aware plan"] == 2
    assert summary["saved MiB at this config"] == pytest.approx(doc["saved_bytes"] / 2 ** 20)
    assert m.lifetimes_timeline["today_mib"].iloc[-1] == pytest.approx(doc["total_bytes"] / 2 ** 20)
    assert m.lifetimes_timeline["lifetime_mib"].max() == pytest.approx(588.6, abs=0.05)


def _memory_html(memory) -> str:
    """The Memory section's HTML alone (its own figure numbering)."""
    return render_memory(memory, Figures())


def test_memory_without_lifetimes_renders_as_before(rep, fx, tmp_path):
    """No lifetimes.json (a study from before the analysis): nothing of it in the data, and the section's page is
    the one with the file less its gradient-lifetimes part; a broken file is one line."""
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    (d / "lifetimes.json").unlink()
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    assert m.lifetimes is None and m.lifetimes_summary is None and m.lifetimes_timeline is None
    assert m.lifetimes_message is None and m.lifetimes_notes == []
    without, with_file = _memory_html(m), _memory_html(rep.memory)
    assert "lifetimes" not in without.lower()
    assert with_file.startswith(without + "\n<h3>Gradient lifetimes</h3>")
    (d / "lifetimes.json").write_text("{")
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    assert m.lifetimes is None and m.lifetimes_message.startswith("lifetimes.json could not be read")
    assert _memory_html(m).endswith(f"<h3>Gradient lifetimes</h3>\n{missing_note(m.lifetimes_message)}")


def test_memory_lifetimes_that_do_not_apply_say_why(fx, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    doc = json.loads(LIFETIMES.read_text())
    why = "training.grad_clip=1: clipping scales every gradient by the global norm"
    doc["lifetime"].update(applies=False, blocked_by=[why])
    doc["saved_bytes"] = 0
    (d / "lifetimes.json").write_text(json.dumps(doc))
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    summary = m.lifetimes_summary.set_index("metric")["value"]
    assert summary["saved MiB at this config"] == 0
    assert summary["saved MiB without the reasons below"] == pytest.approx(doc["lifetime"]["saved_bytes"] / 2 ** 20)
    assert m.lifetimes_notes == [why]
    assert f"No saving at this config: {why}" in _memory_html(m)


def test_kernels_without_sweep(rep, fx):
    k = rep.kernels
    assert k.message.startswith("No kernel sweep ran")
    launch = k.launch.set_index("kernel")
    assert launch.loc["rmsnorm", "num_warps"] == fx.params[fx.best][KERNEL_KNOB]
    assert launch.loc["swiglu", "num_stages"] == 3
    assert launch["measured_ms"].isna().all()


def test_data_padding_per_bucket_width(rep, fx):
    d = rep.data
    pad = d.padding.set_index("bucket_width")
    assert set(pad.index) == set(fx.padding)
    for bw, ratios in fx.padding.items():
        assert pad.loc[bw, "trials"] == len(ratios)
        assert pad.loc[bw, "padding_ratio_median"] == pytest.approx(statistics.median(ratios))
    # Wider buckets pad more.
    assert pad["padding_ratio_median"].is_monotonic_increasing
    assert list(d.io.index) == ["baseline", "best"] and set(d.io["io_backend"]) == {"io_uring"}
    assert (d.io["read_latency_ms_p50"] < d.io["read_latency_ms_p90"]).all()
    assert (d.io["read_latency_ms_p90"] < d.io["read_latency_ms_p99"]).all()
    assert d.by_trial["decode_tokens_per_s"].notna().all()


def test_data_loader_headroom(rep):
    """decode/tokens_per_s is a per-core decode capacity (~3e7 here) and training ~1e4 tokens/s/GPU: the two are
    compared as a ratio, not on one axis."""
    d = rep.data
    bt = d.by_trial
    assert (bt["decode_tokens_per_s"] > 1e7).all() and (bt["value"] < 1e5).all()
    assert bt["loader_headroom"].to_numpy() == pytest.approx((bt["decode_tokens_per_s"] / bt["value"]).to_numpy())
    io = d.io
    assert io["loader_headroom"].to_numpy() == pytest.approx(
        (io["decode_tokens_per_s"] / io["real_tokens_per_s_per_gpu"]).to_numpy())
    from reports.sections.data import headroom

    assert math.isnan(headroom(3e7, 0.0)) and math.isnan(headroom(math.nan, 1e4)) and headroom(2e4, 1e4) == 2.0


def test_guide(rep, fx):
    g = rep.guide
    assert g.message is None
    assert g.base == "studies/llama3b-base.yaml" and g.baseline_repeats == 3
    assert (g.warmup_steps, g.window_steps, g.windows) == (3, 10, 4)
    assert g.ab_rounds == 5 and g.candidates == 3 and g.confidence == 0.95
    assert g.method == fx.validation["method"]
    assert g.phases == tuple(PHASES)
    files = g.files.set_index("path")["present"]
    assert files[["tune.json", "study.db", "trials/<n>/", "baseline/<i>/", "validation.json", "config.yaml",
                  "environment.json"]].all()


def test_trials_table(rep, fx):
    t = rep.trials
    tab = t.table.set_index("trial")
    assert len(tab) == len(fx.statuses)
    assert {"state", "status", "value", "failure_kind", "failure_reason", "duration_s"} <= set(tab.columns)
    assert set(SPACE) <= set(tab.columns)
    expected = pd.Series(fx.statuses).value_counts()
    assert t.status_counts.sort_index().to_dict() == expected.sort_index().to_dict()
    for n, (status, reason, _) in FAILURES.items():
        assert tab.loc[n, "failure_kind"] == status and tab.loc[n, "failure_reason"] == reason
        assert tab.loc[n, "state"] == "complete" and tab.loc[n, "value"] == 0.0
    assert tab.loc[PRUNED[0], "state"] == "pruned" and tab.loc[PRUNED[0], "failure_kind"] == ""
    assert tab.loc[max(fx.statuses), "state"] == "running"
    assert (tab.loc[list(fx.trial_tput), "duration_s"] > 100).all()
    assert set(t.log_tails["trial"]) == set(FAILURES)


def test_environment(rep, fx):
    e = rep.environment
    fp = e.fingerprint.set_index("key")["value"]
    assert fp["gpu"] == "NVIDIA H200" and fp["nccl"] == "2.21.5"
    assert e.dropped.empty
    assert e.noise.median == pytest.approx(statistics.median(fx.baseline_repeats))
    assert e.noise.runs == pytest.approx(fx.baseline_repeats)
    assert e.hardware.set_index("key").loc["gpu_count", "value"] == 8
    study = e.study.set_index("key")["value"]
    assert study["coordinator sessions"] == "2 (1 unfinished, not counted)"
    assert study["wall time, all sessions"] == "90 s"


# --------------------------------------------------------------------------- the HTML


class _WellFormed(html.parser.HTMLParser):
    """Checks that every non-void element is closed in order; collects ids and resource references."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.refs: list[tuple[str, str, str]] = []
        self.tags: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k == "id":
                self.ids.append(v)
            if k in ("src", "href", "xlink:href", "srcset", "data", "action", "poster") and v is not None:
                self.refs.append((tag, k, v))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k == "id":
                self.ids.append(v)
            if k in ("src", "href", "xlink:href") and v is not None:
                self.refs.append((tag, k, v))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}> at {self.getpos()}")
        else:
            self.stack.pop()


def _parse(page: str) -> _WellFormed:
    p = _WellFormed()
    p.feed(page)
    p.close()
    return p


def test_html_well_formed_and_self_contained(page):
    p = _parse(page)
    assert not p.errors, p.errors[:5]
    assert p.stack == [], p.stack
    assert page.startswith("<!DOCTYPE html>")
    for sid in SECTION_IDS:
        assert sid in p.ids
    assert len(p.ids) == len(set(p.ids)), "duplicate element ids"
    for tag, attr, ref in p.refs:
        assert ref.startswith("#") or ref.startswith("data:"), (tag, attr, ref)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(http" not in page
    assert p.tags.get("svg", 0) >= 10, p.tags.get("svg")
    assert p.tags.get("img", 0) == 0 and p.tags.get("link", 0) == 0
    assert p.tags.get("script", 0) == 1  # the inline sort script only
    assert "<script src" not in page


def test_html_sections_and_content(page, fx):
    for i, heading in enumerate(("Summary", "How to read this report", "Search", "Where the time goes",
                                 "GPU time", "Compile time", "Numerics", "Memory", "Kernels", "Data", "Trials", "Environment"),
                                start=1):
        assert f"<h2>{i}. {heading}</h2>" in page
    assert 'class="section-error"' not in page and "section-error" not in page
    assert "Memory analysis not run" in page and "No kernel sweep ran" in page
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    assert "<h3>Against plain loops</h3>" in summary
    assert ("Against the plain compiled loop (torch.compile, default mode, no CUDA graphs): 1.300x [1.210, 1.390] "
            "over 2 interleaved A/B pairs.") in summary
    search = page.split('<section id="search">', 1)[1].split("</section>", 1)[0]
    assert "<h3>Where the GPU-minutes went</h3>" in search and "7 at 1 window, 2 at 4 windows" in search
    assert "CPU-minutes" not in search  # the fixture's tune.json names no device: a GPU study's
    assert "<h3>Gradient lifetimes</h3>" in page and 'data-title="Gradient buckets over the backward"' in page
    # Escaped: the config comment and a failure reason contain '<...>'.
    assert f"trial &lt;{fx.best}&gt;" in page and "&lt;after warm-up&gt;" in page
    assert "<after warm-up>" not in page
    assert 'table id="trials-table" class="sortable trials"' in page
    assert page.count("<tr") >= len(fx.statuses)
    guide = page.split('<section id="guide">', 1)[1].split("</section>", 1)[0]
    assert "Only the A/B validation decides the winner" in guide and "significant" in guide
    assert "<code>validation.json</code>" in guide and "<code>data_wait</code>" in guide
    assert len(re.sub(r"<[^>]+>", "", guide).split()) < 400  # short: a guide, not a manual
    # The trials table: the knob columns come before the failure's kind and reason (the widest column).
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", page.split('id="trials-table"', 1)[1].split("</thead>", 1)[0])
    heads = [h.replace("\u200b", "") for h in heads]
    assert heads.index("expandable_segments") < heads.index("failure") < heads.index("reason") == len(heads) - 1
    # The knob plots: a labelled colour bar for the trial number, category labels for categorical knobs.
    search = page.split('<section id="search">', 1)[1].split("</section>", 1)[0]
    assert "trial number (colour)" in search


def test_long_failure_text_is_one_clipped_line_and_tables_sit_in_a_box(page):
    """Issue 40: an OOM row of the trials table was a tall empty band (its reason wrapped at the far right); the
    reason is one line now, cut by the style sheet, with the full text as its title. Every table sits in a box that
    scrolls sideways (the trials table in its own), so no table widens the page."""
    trials = page.split('<section id="trials">', 1)[1].split("</section>", 1)[0]
    reason = html.escape(FAILURES[5][1], quote=True)
    assert f'<td class="reason"><div class="clip" title="{reason}">{reason}</div></td>' in trials
    css = page.split("<style>", 1)[1].split("</style>", 1)[0]
    clip = re.search(r"div\.clip \{([^}]*)\}", css).group(1)
    assert "white-space:nowrap" in clip and "overflow:hidden" in clip and "text-overflow:ellipsis" in clip
    assert re.search(r"div\.tbox \{[^}]*overflow-x:auto", css)
    body = page.split("<main>", 1)[1]
    tables = [m.start() for m in re.finditer(r"<table\b", body)]
    assert len(tables) >= 10
    for at in tables:
        before = body[:at]
        assert before.endswith('<div class="tbox">') or before.endswith('<div class="scroll">\n'), before[-80:]


def test_exported_config_is_collapsed(page, fx):
    """Issue 40: the whole exported config was expanded inside the Summary; it is one closed <details> now."""
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    m = re.search(r'<details class="config"><summary>([^<]*)</summary><pre class="config">', summary)
    assert m, "the exported config is not inside a <details> block"
    lines = len((fx.dir / "config.yaml").read_text().splitlines())
    assert m.group(1) == f"Show the exported config.yaml ({lines} lines)"
    assert summary.count('<pre class="config">') == 1 and "<details open" not in summary


def test_figures_carry_ids_for_the_browser_check(page):
    """Every figure's <svg> is numbered and titled, and names its axes and data artists (test_report_browser
    measures them in Chromium)."""
    svgs = re.findall(r"<svg\b[^>]*>.*?</svg>", page, re.S)
    assert len(svgs) >= 10
    for n, svg in enumerate(svgs, start=1):
        head = svg[:svg.index(">")]
        assert f'data-figure="{n}"' in head and 'data-title="' in head, head[:200]
        assert re.search(rf'id="f{n}-ax\d+-bg"', svg) and re.search(rf'id="f{n}-ax\d+-data\d+"', svg), n
    loader = next(s for s in svgs if 'data-title="Loader throughput vs training"' in s)
    assert not re.search(r'id="f\d+-ax\d+-ref\d+"', loader)  # headroom far above 1x: no reference line drawn


def test_report_is_deterministic_but_for_its_timestamp(fx, page):
    again = build_report(fx.dir, fx.storage_url, fx.name).read_text()
    strip = lambda s: re.sub(r"Generated [^<]* from", "", s)  # noqa: E731
    assert strip(again) == strip(page)
    assert oct((fx.dir / "report.html").stat().st_mode & 0o777) == "0o644"
    assert not list(fx.dir.glob(".report-*")), "temporary file left behind"


# --------------------------------------------------------------------------- degraded studies


def test_empty_dir_every_section_one_line(tmp_path):
    out = build_report(tmp_path, None, None)
    page = out.read_text()
    p = _parse(page)
    assert not p.errors and all(s in p.ids for s in SECTION_IDS)
    assert "section-error" not in page
    assert not (tmp_path / "study.db").exists(), "reading must not create a database"
    rep = compute_sections(tmp_path)
    for key in SECTION_IDS:
        assert getattr(rep, key).message, key
    assert rep.memory.analysis_message.startswith("Memory analysis not run")


def test_study_in_progress_and_broken_files(tmp_path):
    """One trial finished, no validation, no export; a truncated metrics.jsonl and garbage summary.json."""
    fx = make_study(tmp_path, name="early", n_trials=2, validate=False, running=True, cpu=True, seed=3)
    for f in ("config.yaml", "environment.json"):
        (fx.dir / f).unlink()
    (fx.dir / "trials" / "1" / "metrics.jsonl").open("a").write('{"step": 60, "throughp')
    (fx.dir / "baseline" / "2" / "summary.json").write_text("{not json")
    (fx.dir / "trials" / "0" / "phases.csv").write_text("")
    rep = compute_sections(fx.dir)
    assert rep.summary.best_trial == max(fx.trial_tput, key=fx.trial_tput.get)
    assert rep.summary.best_how.startswith("best objective")
    assert any("not re-measured" in n for n in rep.summary.notes)
    assert math.isnan(rep.summary.speedup.ci_low)
    assert rep.search.importances is None and "Too few" in rep.search.importances_message
    assert rep.environment.fingerprint.empty
    assert rep.memory.message.startswith("No device memory figures: the runs were on the CPU")
    assert rep.memory.peaks["max_rss_gib"].tolist() == [3.2, 3.2]
    page = build_report(fx.dir).read_text()
    assert "section-error" not in page and "No config exported yet" in page
    assert not _parse(page).errors


def test_multi_objective_pareto_and_one_gpu(tmp_path):
    fx = make_study(tmp_path, name="mo-1gpu", n_trials=14, gpus=1, multi_objective=True, validate=False,
                    running=False, seed=1)
    rep = compute_sections(fx.dir)
    p = rep.search.pareto
    assert p is not None and list(p.columns) == ["trial", "throughput/real_tokens_per_s_per_gpu",
                                                 "memory/max_reserved_gib", "on_front"]
    assert set(p["trial"]) == set(fx.trial_tput)
    front = p[p["on_front"]]
    for _, a in front.iterrows():  # nothing dominates a point on the front
        assert not ((p.iloc[:, 1] >= a.iloc[1]) & (p.iloc[:, 2] <= a.iloc[2])
                    & ((p.iloc[:, 1] > a.iloc[1]) | (p.iloc[:, 2] < a.iloc[2]))).any()
    assert p.loc[p.iloc[:, 1].idxmax(), "on_front"]
    # fewer than 10 finished trials: no importances, and the report says why
    assert len(fx.trial_tput) < 10 and rep.search.importances is None
    assert rep.search.importances_message == (f"Too few finished trials for parameter importances "
                                              f"({len(fx.trial_tput)}; 10 needed: with fewer, a ranking of the knobs "
                                              "would rank noise).")
    assert rep.trials.objective_columns == ["throughput/real_tokens_per_s_per_gpu", "memory/max_reserved_gib"]
    assert set(rep.environment.dropped["knob"]) == set(OVERLAP_KNOBS)
    assert "grad_sync" in rep.time.breakdown.columns
    assert (rep.time.breakdown["grad_sync"] == 0).all()
    page = build_report(fx.dir).read_text()
    assert "Pareto front" in page and "one GPU: there is no gradient all-reduce" in page


def test_memory_analysis_and_kernel_sweep_when_present(fx, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    (d / "memory_analysis.json").write_text(json.dumps({
        "allocation_size_histogram": [{"size_bytes": 2 ** k, "count": 1000 // (k - 8)} for k in range(10, 32, 3)],
        "suggestions": ["Set expandable_segments: true: 5.1 GiB of reserved memory is fragmented.",
                        {"text": "max_split_size_mb: 256 keeps large blocks whole"}]}))
    best = fx.params[fx.best][KERNEL_KNOB]
    rows = [{"kernel": k, "num_warps": w, "num_stages": s, "block_size": b, "size": 4096,
             "median_ms": 0.05 + 0.01 * w + 0.002 * s, "gpu": "NVIDIA H200"}
            for k, b in (("rmsnorm", 4096), ("swiglu", 1024)) for w in (2, 4, 8, 16) for s in (2, 3)]
    pd.DataFrame(rows).to_csv(d / "kernel_sweep.csv", index=False)
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    assert rep.memory.analysis_message is None
    assert rep.memory.histogram["count"].sum() == sum(1000 // (k - 8) for k in range(10, 32, 3))
    assert len(rep.memory.suggestions) == 2
    k = rep.kernels.launch.set_index("kernel")
    assert rep.kernels.message is None
    assert k.loc["rmsnorm", "measured_ms"] == pytest.approx(0.05 + 0.01 * best + 0.002 * 2)
    assert k.loc["swiglu", "best_in_sweep_ms"] == pytest.approx(0.05 + 0.02 + 0.004)
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Allocation-size histogram" in page and "max_split_size_mb: 256 keeps" in page


def test_cli(tmp_path):
    """The CLI's plumbing; the defaults it relies on (storage and name from the study dir) are covered by
    ``test_study_in_progress_and_broken_files``."""
    r = subprocess.run([sys.executable, "-m", "reports", str(tmp_path), "--storage",
                        f"sqlite:///{tmp_path / 'other.db'}", "--study-name", "nightly"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == tmp_path / "report.html"
    assert f"no study database at {tmp_path / 'other.db'}" in (tmp_path / "report.html").read_text()
    r = subprocess.run([sys.executable, "-m", "reports", str(tmp_path / "nope")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_postgres_password_is_masked():
    from reports._load import mask_url

    assert mask_url("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert mask_url("sqlite:///runs/x/study.db") == "sqlite:///runs/x/study.db"


def test_validation_dirs_by_name_without_run_dirs(tmp_path):
    """Without run_dirs/baseline_dirs in validation.json, A/B runs are found by their directory names."""
    from reports._load import load_study_data

    for name in ("7-0", "trial-7-1", "17-0", "baseline-0", "baseline-7-1", "baseline-x", "notes"):
        (tmp_path / "validation" / name).mkdir(parents=True)
    (tmp_path / "validation.json").write_text(json.dumps({"candidates": [{"trial": 7, "runs": [1.0, 2.0]}]}))
    data = load_study_data(tmp_path)
    assert [r.path.name for r in data.validation_runs_of(7)] == ["7-0", "trial-7-1"]
    assert [r.path.name for r in data.validation_baseline_runs()] == ["baseline-0", "baseline-7-1"]


def test_kernels_section_from_a_real_h200_sweep(fx, tmp_path):
    """The kernel_sweep.csv that ``python benchmarks/kernels_bench.py --kernel-sweep`` wrote on an H200 (full-mode Triton rows
    at the gr00t-n1.6 shapes): the chosen configuration's time, the fastest of the sweep, and the drawn sweep."""
    from reports.sections import sweep_by_config

    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    real = pd.read_csv(Path(__file__).parents[1].joinpath("assets") / "kernel_sweep_h200_2026-11-29.csv")
    real.to_csv(d / "kernel_sweep.csv", index=False)
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    k = rep.kernels.launch.set_index("kernel")
    assert set(k.index) >= {"rmsnorm", "swiglu", "rope", "fused_linear_ce"}
    ce = real[real["kernel"] == "fused_linear_ce"]
    assert k.loc["fused_linear_ce", "best_in_sweep_ms"] == pytest.approx(ce["median_ms"].min())
    drawn = sweep_by_config(rep.kernels)
    assert len(drawn) == len(real)  # one point per launch configuration (the CSV has one full-mode row each)
    fastest = drawn.sort_values("ms").groupby("kernel").head(1).set_index("kernel")
    assert fastest.loc["fused_linear_ce", "launch"] == "num_warps=8 num_stages=1 block_v=4096 chunk_size=8192"
    assert fastest.loc["rope", "ms"] == pytest.approx(real[real["kernel"] == "rope"]["median_ms"].min())
    # the fixture's exported config sets swiglu {num_warps 8, num_stages 3, block_size 1024} (SwiGLU has no
    # num_stages: ignored) and rmsnorm block_size 4096, which the sweep at hidden 2048 never ran
    chosen = drawn[drawn["chosen"]]
    assert list(chosen["launch"]) == ["num_warps=8 block_size=1024"] and list(chosen["kernel"]) == ["swiglu"]
    sw = real[(real["kernel"] == "swiglu") & (real["num_warps"] == 8) & (real["block_size"] == 1024)]
    assert k.loc["swiglu", "measured_ms"] == pytest.approx(sw["median_ms"].median())
    assert math.isnan(k.loc["rmsnorm", "measured_ms"])
    assert k.loc["rmsnorm", "best_in_sweep_ms"] == pytest.approx(real[real["kernel"] == "rmsnorm"]["median_ms"].min())
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Launch-parameter sweep per kernel" in page and "3 fastest per kernel" in page


def test_memory_section_from_a_real_h200_analysis(fx, tmp_path):
    """The memory_analysis.json that ``python -m workbench.memory analyze`` wrote on an H200 (gr00t-n1.6,
    micro-batch 4, torch's default allocator settings; benchmarks/results/memory_h200_2026-11-30/): the
    histogram, the two suggestions with their reasons, and the suggested settings reach the Memory section."""
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    src = Path(__file__).parents[1].joinpath("assets") / "memory_analysis_h200_mb4_2026-11-30.json"
    doc = json.loads(src.read_text())
    shutil.copy(src, d / "memory_analysis.json")
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    m = rep.memory
    assert m.analysis_message is None
    assert m.histogram["count"].sum() == sum(b["count"] for b in doc["allocation_size_histogram"])
    assert len(m.suggestions) == 2
    assert any(s.startswith("expandable_segments: true: 9.92 GiB (16%)") for s in m.suggestions)
    assert any(s.startswith("roundup_power2_divisions: 4: the 18,850 allocations") for s in m.suggestions)
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Allocation-size histogram" in page and "9.92 GiB (16%)" in page


def test_under_fill_packing_no_plot_of_bucket_length_or_padding(tmp_path, rep):
    """Issue 40: "step time vs bucket length" was drawn under packing: fill, where every step has one length; so
    was padding against bucket width, where nothing pads. Each is one line saying why instead."""
    assert rep.time.by_length_runs == ["baseline", "best"] and rep.time.by_length_message is None
    assert rep.data.padding_message is None
    drawn = _figure_titles(reports.render_html(rep))
    assert any(t.startswith("Step time vs bucket length") for t in drawn) and "Padding vs bucket width" in drawn
    fx = make_study(tmp_path, name="fill", n_trials=6, cpu=True, seed=2)
    for cfg in fx.dir.rglob("config.yaml"):
        doc = yaml.safe_load(cfg.read_text())
        doc["data"]["packing"] = "fill"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    for csv in fx.dir.rglob("phases.csv"):
        df = pd.read_csv(csv)
        df["seq_len"] = 4096
        df.to_csv(csv, index=False)
    r = compute_sections(fx.dir)
    assert r.time.by_length_runs == []
    assert r.time.by_length_message == (
        "Step time vs bucket length is not drawn: the baseline's data uses packing: fill (rows cut from the token "
        "stream: every step is 4,096 tokens long); the best's data uses packing: fill (rows cut from the token "
        "stream: every step is 4,096 tokens long), so bucket length explains none of the spread; the step-time "
        "distribution above is the noise.")
    assert r.data.padding_message.startswith("No padding to plot against bucket width: the data uses packing: fill")
    page = build_report(fx.dir).read_text()
    drawn = _figure_titles(page)
    assert not any(t.startswith("Step time vs bucket length") for t in drawn) and "Padding vs bucket width" not in drawn
    assert "bucket length explains none of the spread" in page and "No padding to plot" in page
    # a CPU study: the trials' MFU and reserved-memory columns would be dashes only
    assert not {"mfu_pct", "max_reserved_gib"} & set(r.trials.table.columns)
    assert r.trials.notes == ["No trial recorded MFU (no peak FLOP/s for the device: a CPU) or reserved memory (no "
                              "device memory: a CPU): those columns are left out."]
    assert r.trials.notes[0] in html.unescape(page)


def _figure_titles(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'<svg data-figure="\d+" data-title="([^"]*)"', page)]


def test_one_arm_with_one_length_is_left_out_of_the_bucket_length_plot():
    from reports.sections.phases import _by_length

    st = pd.DataFrame({"run": ["baseline"] * 4 + ["best"] * 3, "seq_len": [64, 128, 64, 192, 256, 256, 256],
                       "step_s": 0.1})
    drawn, why = _by_length({"baseline": [], "best": []}, st)
    assert drawn == ["baseline"]
    assert why == "Step time vs bucket length leaves out the best: in the best, every step is 256 tokens long."


def test_padding_of_one_bucket_width_or_none_is_one_line():
    from reports.sections.data import _padding_message

    def padding(widths, ratio):
        return pd.DataFrame({"bucket_width": widths, "trials": 2, "padding_ratio_median": ratio,
                             "padding_ratio_min": ratio, "padding_ratio_max": ratio, "tokens_per_s_median": 1e3})

    assert _padding_message(padding([64], 0.007), {"bucket"}) == (
        "Every finished trial used bucket width 64 (padding 0.7%, median): one point, no curve; search "
        "data.bucket_width to see padding against it.")
    assert _padding_message(padding([64, 128], 0.0), {"bucket"}).startswith("No trial padded a single token")
    assert _padding_message(padding([64, 128], 0.1), {"bucket", "fill"}) is None


def test_a_study_that_compiled_nothing_says_so_in_one_line(tmp_path):
    """Issue 40: on a CPU study the Compile time section was a table of zeros."""
    from reports._load import StudyData
    from reports.sections import compile_section

    summary = {"time/compile_s": 0.0, "compile/fx_graph_cache_hit": 0, "compile/fx_graph_cache_miss": 0,
               "compile/aot_autograd_cache_hit": 0, "compile/aot_autograd_cache_miss": 0}
    trials = [optuna.trial.create_trial(value=1.0, user_attrs={"summary": summary}) for _ in range(2)]
    for n, t in enumerate(trials):
        t.number = n
    c = compile_section(StudyData(study_dir=tmp_path, storage_url="", study_name=None, trials=trials))
    assert c.message == ("No trial compiled anything (2 trial(s), 0 s of compile each, no graph cached): the trials "
                         "ran eagerly (loongforge.compute_domain.compile: none).")
    trials[1].user_attrs["summary"] = {**summary, "time/compile_s": 21.5, "compile/fx_graph_cache_miss": 3}
    assert compile_section(StudyData(study_dir=tmp_path, storage_url="", study_name=None, trials=trials)).message is None


def test_summary_says_noise_and_how_the_winner_was_chosen(tmp_path):
    """Issue 40: the report said nothing of a 95% base spread; the winner rule's head-to-head is named."""
    from workbench.tune.result import build_result

    fx = make_study(tmp_path, name="noisy", n_trials=4, cpu=True, seed=5)
    tune = json.loads((fx.dir / "tune.json").read_text())
    w = fx.validation["winner"]
    validation = {**fx.validation, "winner": {**w, "decided_by": "faster than #9 head-to-head: #9 at 0.800x "
                                              "[0.700, 0.900] of #1 over 3 interleaved pairs",
                                              "duels": [{"a": w["trial"], "b": 9, "speedup_median": 0.8,
                                                         "ci_low": 0.7, "ci_high": 0.9, "pairs": 3,
                                                         "faster": w["trial"], "told_apart": True}]}}
    tune["result"] = build_result(validation, study="noisy", base_values={}, baseline_repeats=[100, 195, 150],
                                  searched=["micro_batch_size"], budget={"trials": 4, "trials_run": 4},
                                  data={"source": "synthetic"}, commit="abc")
    (fx.dir / "tune.json").write_text(json.dumps(tune))
    notes = compute_sections(fx.dir).summary.notes
    assert notes[0].startswith("Noisy machine: the base config's 3 repeats spread 63% (above 10%)")
    assert any(n.startswith("Winner chosen: faster than #9 head-to-head") for n in notes)
    assert "Noisy machine: the base config" in build_report(fx.dir).read_text()
