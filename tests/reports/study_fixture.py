"""The report tests' study: ``make_study`` writes a realistic study to a folder (real Optuna SQLite storage, trial
dirs, baseline repeats, A/B validation, exported config) as the tuner would. It plays the tuner's part of the data
contract with a seeded performance model of a 3B Llama on one 8-GPU H200 node, so the numbers are plausible and
every expected value is known (``FixtureStudy``). Used by test_report.py (through conftest.py's ``fx``),
test_report_degraded.py and test_report_browser.py.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import shutil
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from reports._load import PHASES

REPO = Path(__file__).resolve().parents[2]
LIFETIMES = REPO / "tests" / "assets" / "lifetimes_gr00t-n1.6_clip0_2026-12-01.json"
"""What ``python -m workbench.memory lifetimes --preset gr00t-n1.6 --set training.grad_clip=0`` wrote (the DAG on
fake tensors, on the CPU): 31 buckets of whole layers at 25 MiB, a lifetime-aware plan of 2 slots."""


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
    phases = _simulated_phases(p, rng, gpus=gpus, steps=steps, warmup=warmup)
    mbs = p["micro_batch_size"]
    reserved_base = 38.0 + 11.5 * mbs + (0.0 if p["expandable_segments"] else 4.5)
    split = p["max_split_size_mb"]
    frag = (1.2 if p["expandable_segments"] else 6.5) * (
        0.7 if split is not None and split < 256 else 1.0)
    allocated = reserved_base - frag
    memory = {"memory/max_allocated_gib": round(allocated, 3), "memory/max_reserved_gib": round(reserved_base, 3),
              "memory/fragmentation_gib": round(frag * 0.8, 3)}
    m = phases[phases["measured"] == 1]
    windows = _simulated_windows(m, p, rng, memory, window)
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


def _jitter(rng: np.random.Generator) -> float:
    """Run-to-run jitter of a time: lognormal, 3%."""
    return float(rng.lognormal(0.0, 0.03))


def _simulated_phases(p: dict[str, Any], rng: np.random.Generator, *, gpus: int, steps: int,
                      warmup: int) -> pd.DataFrame:
    """The phases.csv of ``steps`` steps of the knob values ``p``: each phase's time from the performance model,
    rounded as the metrics writer writes them."""
    mbs, bw = p["micro_batch_size"], p["bucket_width"]
    # Padded tokens per second of forward+backward, by knob (an eager 3B Llama at ~30% MFU on an H200).
    compute_tps = 16_000.0 * {1: 0.82, 2: 0.93, 4: 1.0, 8: 1.03}[mbs]
    compute_tps *= 1.12 if p["graph_capture"] else 1.0
    compute_tps *= {2: 0.96, 4: 1.0, 8: 1.04, 16: 0.99}[p[KERNEL_KNOB]]
    compute_tps *= 1.02 if p["expandable_segments"] else 1.0
    # What the workers deliver to the step (sets data_wait)
    feed_tps = 3_000.0 * p["num_workers"] * (0.85 + 0.15 * math.log2(p["io_uring_entries"]) / 9)
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
        fwd = padded / compute_tps / 3 * _jitter(rng)
        bwd = 2 * padded / compute_tps / 3 * _jitter(rng)
        row = {"step": step, "measured": int(step >= warmup), "seq_len": seq, "real_tokens": real,
               "padded_tokens": padded, "loss": round(10.8 * math.exp(-step / 60) + 1.5, 4),
               "data_wait": max(0.0, padded / (feed_tps * _jitter(rng)) - (fwd + bwd)) + 0.0004 * _jitter(rng),
               "h2d": 0.00035 * mbs * _jitter(rng), "forward": fwd, "backward": bwd,
               "grad_sync": exposed * _jitter(rng), "optimizer": 0.024 * _jitter(rng),
               "other": (0.0015 if p["graph_capture"] else 0.0042) * _jitter(rng)}
        if step < warmup:
            row["forward"] *= 6  # compile / graph capture / allocator settling
        row["step_s"] = sum(row[ph] for ph in PHASES)
        rows.append(row)
    phases = pd.DataFrame(rows)
    # Round as the metrics writer does (%.6e), then make step_s the sum of what was written.
    for ph in PHASES:
        phases[ph] = phases[ph].map(lambda v: float(f"{v:.6e}"))
    phases["step_s"] = phases[list(PHASES)].sum(axis=1)
    return phases


def _simulated_windows(m: pd.DataFrame, p: dict[str, Any], rng: np.random.Generator, memory: dict[str, float],
                       window: int) -> list[dict]:
    """The metrics.jsonl rows of the measured steps ``m``, a window of ``window`` steps each."""
    # What the pipeline records as decode/tokens_per_s: decoded tokens per busy decode-second, a per-core capacity
    # thousands of times the step's rate (loaders.csv: 3.3e7 per core for io_uring on a CPU host; the tiny CPU
    # study of test_report_tuner records 5e7-7e7).
    decode_tps = 3.3e7 * (0.9 + 0.1 * math.log2(p["io_uring_entries"]) / 9)
    # Shard reads from the page cache: the quantiles sit close together (the tiny CPU study records p50 0.65 ms,
    # p90 0.69 ms, p99 0.70 ms), so every bar of the read-latency figure is tall.
    p50 = 0.35 + 24.0 / p["io_uring_entries"]
    windows = []
    for start in range(0, len(m) - window + 1, window):
        w = m.iloc[start:start + window]
        wall = float(w["step_s"].sum())
        lat = p50 * _jitter(rng)
        win = {"step": int(w["step"].iloc[-1]), "steps": window,
               "throughput/real_tokens_per_s_per_gpu": float(w["real_tokens"].sum()) / wall,
               "mfu_pct": 100 * float(w["real_tokens"].sum()) * 2.2e10 / wall / 989e12,
               "time/step_s": wall / window,
               "data/padding_ratio": 1 - float(w["real_tokens"].sum()) / float(w["padded_tokens"].sum()),
               **memory,
               "io/read_latency_ms_p50": lat, "io/read_latency_ms_p90": 1.06 * lat * _jitter(rng) ** 0.1,
               "io/read_latency_ms_p99": 1.1 * lat * _jitter(rng) ** 0.1, "decode/tokens_per_s": decode_tps * _jitter(rng),
               "io/backend": "io_uring", "loss": float(w["loss"].iloc[-1])}
        for ph in PHASES:
            win[f"time/{ph}_s"] = float(w[ph].mean())
            win[f"time/{ph}_pct"] = 100 * float(w[ph].sum()) / wall
        windows.append(win)
    return windows


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
    """The study's parts in the order the tuner makes them (one seeded generator draws for all of them, in this
    order): baseline repeats, trials, a trial still running, A/B validation, then its files."""
    rng = np.random.default_rng(seed)
    d = root / name
    d.mkdir(parents=True)
    storage = f"sqlite:///{d / 'study.db'}"
    space = {k: v for k, v in SPACE.items() if gpus > 1 or k not in OVERLAP_KNOBS}
    directions = ["maximize", "minimize"] if multi_objective else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    if multi_objective:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["throughput/real_tokens_per_s_per_gpu", "memory/max_reserved_gib"])
    fx = FixtureStudy(dir=d, storage_url=storage, name=name, multi_objective=multi_objective, gpus=gpus)
    noise = _baseline_repeats(fx, rng)
    t0 = dt.datetime(2025, 3, 4, 9, 0, tzinfo=dt.timezone.utc)
    clock = t0 + dt.timedelta(minutes=6)
    frozen = []
    for n in range(n_trials):
        t, duration = _trial(fx, n, space, rng)
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
        _validate(fx, ranked, noise, rng)
    _write_study_files(fx, space, noise, t0, clock, n_trials=n_trials, running=running)
    return fx


def _baseline_repeats(fx: FixtureStudy, rng: np.random.Generator) -> dict[str, Any]:
    """Baseline repeats: the noise floor."""
    d, gpus = fx.dir, fx.gpus
    for i in range(3):
        ph, win, summ = _simulate({}, rng, gpus=gpus)
        _write_run(d / "baseline" / str(i), _config_for({}, gpus), ph, win, summ)
        fx.baseline_repeats.append(summ["throughput/real_tokens_per_s_per_gpu"])
    base = fx.baseline_repeats
    return {"median": statistics.median(base), "min": min(base), "max": max(base),
            "rel_spread": (max(base) - min(base)) / statistics.median(base),
            "cv": statistics.stdev(base) / statistics.mean(base), "runs": base}


def _trial_params(n: int, space: dict, rng: np.random.Generator, gpus: int) -> dict[str, Any]:
    """Trial ``n``'s knob values: the baseline first (the tuner enqueues it), good regions at 6 and 11, the OOM's
    at 5, else a sample."""
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
    return {k: v for k, v in params.items() if k in space}


def _trial(fx: FixtureStudy, n: int, space: dict, rng: np.random.Generator
           ) -> tuple[optuna.trial.FrozenTrial, dt.timedelta]:
    """Trial ``n`` as the tuner records it: its run folder (a failure, a pruned run or a finished one) and its
    Optuna trial (times not set); returns it and how long it ran."""
    d, gpus, multi_objective = fx.dir, fx.gpus, fx.multi_objective
    params = _trial_params(n, space, rng, gpus)
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
    return t, duration


def _validate(fx: FixtureStudy, ranked: list[int], noise: dict[str, Any], rng: np.random.Generator) -> None:
    """Interleaved A/B rounds of the top 3, named as workbench.tune names them
    (validation/{baseline,trial}-<n>-<round>), and validation.json; the winner becomes ``fx.best``."""
    d, gpus, base = fx.dir, fx.gpus, fx.baseline_repeats
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


def _write_study_files(fx: FixtureStudy, space: dict, noise: dict[str, Any], t0: dt.datetime, clock: dt.datetime,
                       *, n_trials: int, running: bool) -> None:
    """The study folder's own files: environment.json, lifetimes.json, the exported config.yaml and tune.json."""
    d, name, gpus, storage, multi_objective = fx.dir, fx.name, fx.gpus, fx.storage_url, fx.multi_objective
    dropped = [] if gpus > 1 else [
        {"knob": k, "reason": "one GPU: there is no gradient all-reduce to bucket or overlap"} for k in OVERLAP_KNOBS]
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
