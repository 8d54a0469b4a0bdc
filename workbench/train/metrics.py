"""Window metrics of a training run: throughput, MFU, phase shares, memory, loss.

Names carry a namespace and a unit (``throughput/real_tokens_per_s_per_gpu``,
``memory/max_reserved_gib``, ``time/forward_pct``...). Every window (``log_every``
steps after the warm-up) becomes one JSON line in ``metrics.jsonl``, beside event
records that carry ``"kind": "event"`` (a window's line has no ``kind``): a config
reload's (``"event": "config_reload"``, workbench/train/reload.py); every step
one row of the phase table ``phases.csv`` (seconds per phase, step time, tokens,
bucket length, loss). ``PrometheusExporter`` serves the run to Prometheus in its own
types under the seed's names (gauges for the latest window, ``*_total`` counters,
summaries for the read latency and the CUDA graph launch overhead); the names and
definitions are in docs/operations.md ("Prometheus").

MFU = achieved model FLOP/s / peak FLOP/s, where achieved = sum over steps of
real tokens x ``flops_per_token(model, bucket length)`` (6 x parameters + 12 x
layers x hidden x sequence length; padding tokens are not counted) divided by
wall time, and the peak is dense bf16 from ``workbench.train.flops.PEAK_TFLOPS``
keyed by GPU name, or ``hardware.peak_tflops`` from the config. On the CPU
there is no peak and MFU is reported as null.

Gradient communication (several processes; ``workbench/train/overlap.py``):
``comm/total_s`` communication time per step (the union of the all-reduce
intervals), ``comm/exposed_s`` the part not hidden under compute per step (the
``grad_sync`` phase with the overlap scheduler; with DDP the tail between the
last bucket becoming ready and the last all-reduce ending), and
``comm/overlap_pct`` = 100 x (1 - exposed / total) over the window, clamped to
[0, 100]: the share of the communication hidden under compute. All None in a
single-process run. ``phases.csv`` carries ``comm_s`` and ``comm_exposed_s``
per step.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import resource
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.train.timing import PHASES
from workbench.vocab import (ALLOCATOR_REUSE_RATIO, COMM_EXPOSED_S, COMM_OVERLAP_PCT, COMM_TOTAL_S, DEVICE_TOTAL_GIB,
                             LOSS_MEAN, LOSS_STEPS, MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB,
                             PADDED_TOKENS_PER_S, PADDING_RATIO, REAL_TOKENS_PER_S, STEP_S)

__all__ = ["StepRecord", "MetricsWriter", "summarize_comm", "summarize_window", "memory_snapshot",
           "PrometheusExporter", "LaunchTimer"]

GIB = 1024 ** 3
log = logging.getLogger("workbench")


@dataclass
class StepRecord:
    """What the loop knows about one step without a device sync."""

    step: int
    real_tokens: int
    padded_tokens: int
    seq_len: int
    flops: float
    phases: dict[str, float] = field(default_factory=dict)
    loss: float | None = None
    comm_s: float | None = None
    """Gradient all-reduce time of the step (None: no communication)."""
    comm_exposed_s: float | None = None
    """The part of it not hidden under compute."""


def memory_snapshot(device: torch.device) -> dict[str, float | None]:
    """Peak allocated/reserved (GiB), fragmentation and allocator retries; host RSS on the CPU."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        alloc = stats.get("allocated_bytes.all.peak", 0) / GIB
        reserved = stats.get("reserved_bytes.all.peak", 0) / GIB
        cur_alloc = stats.get("allocated_bytes.all.current", 0) / GIB
        cur_res = stats.get("reserved_bytes.all.current", 0) / GIB
        return {
            MAX_ALLOCATED_GIB: round(alloc, 4),
            MAX_RESERVED_GIB: round(reserved, 4),
            "memory/fragmentation_gib": round(cur_res - cur_alloc, 4),
            "memory/alloc_retries": int(stats.get("num_alloc_retries", 0)),
            DEVICE_TOTAL_GIB: round(torch.cuda.get_device_properties(device).total_memory / GIB, 2),
            ALLOCATOR_REUSE_RATIO: _allocator_reuse(stats),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB
    return {MAX_ALLOCATED_GIB: None, MAX_RESERVED_GIB: None,
            "memory/fragmentation_gib": None, "memory/alloc_retries": None,
            ALLOCATOR_REUSE_RATIO: None, MAX_RSS_GIB: round(rss, 4)}


def _allocator_reuse(stats: dict[str, Any]) -> float | None:
    """1 - segments allocated / blocks allocated since the process started: the share of the caching allocator's
    allocation requests served from memory it already held (a cudaMalloc'd segment serves the request that made
    it; every other request reused cached memory). None before the first allocation."""
    blocks = stats.get("allocation.all.allocated", 0)
    return 1 - stats.get("segment.all.allocated", 0) / blocks if blocks else None


def summarize_window(steps: list[StepRecord], *, world_size: int = 1,
                     peak_tflops: float | None = None) -> dict[str, Any]:
    """Aggregate a window of steps (already read back) into namespaced metrics."""
    wall = sum(s.phases["step"] for s in steps)
    real = sum(s.real_tokens for s in steps)
    padded = sum(s.padded_tokens for s in steps)
    flops = sum(s.flops for s in steps)
    out: dict[str, Any] = {
        "step": steps[-1].step,
        "steps": len(steps),
        STEP_S: wall / len(steps),
        "time/step_s_median": statistics.median(s.phases["step"] for s in steps),
        REAL_TOKENS_PER_S: real / wall if wall else 0.0,
        PADDED_TOKENS_PER_S: padded / wall if wall else 0.0,
        PADDING_RATIO: 1 - real / padded if padded else 0.0,
        "mfu_pct": (100 * flops / wall / (peak_tflops * 1e12)) if (peak_tflops and wall) else None,
        "flops/achieved_tflops_per_gpu": flops / wall / 1e12 if wall else 0.0,
    }
    for p in PHASES:
        if p not in steps[0].phases:  # phase timing off: only the step time is known
            out[f"time/{p}_s"] = out[f"time/{p}_pct"] = None
            continue
        t = sum(s.phases.get(p, 0.0) for s in steps)
        out[f"time/{p}_s"] = t / len(steps)
        out[f"time/{p}_pct"] = 100 * t / wall if wall else 0.0
    out.update(_comm_metrics([s.comm_s for s in steps], [s.comm_exposed_s for s in steps]))
    losses = [s.loss for s in steps if s.loss is not None]
    out["loss"] = losses[-1] if losses else None
    out[LOSS_MEAN] = sum(losses) / len(losses) if losses else None
    out[LOSS_STEPS] = losses
    out["world_size"] = world_size
    return out


def _comm_metrics(total: list[float | None], exposed: list[float | None]) -> dict[str, float | None]:
    pairs = [(t, e) for t, e in zip(total, exposed) if t is not None and e is not None]
    if not pairs:
        return {COMM_TOTAL_S: None, COMM_EXPOSED_S: None, COMM_OVERLAP_PCT: None}
    t, e = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return {COMM_TOTAL_S: t / len(pairs), COMM_EXPOSED_S: e / len(pairs),
            COMM_OVERLAP_PCT: 100 * min(1.0, max(0.0, 1 - e / t)) if t > 0 else None}


def summarize_comm(windows: list[dict[str, Any]]) -> dict[str, float | None]:
    """``comm/*`` over several windows (weighted by their steps), for the run summary."""
    total: list[float | None] = []
    exposed: list[float | None] = []
    for w in windows:
        n = w.get("steps", 0)
        total += [w.get(COMM_TOTAL_S)] * n
        exposed += [w.get(COMM_EXPOSED_S)] * n
    return _comm_metrics(total, exposed)


class MetricsWriter:
    """Appends window metrics to ``metrics.jsonl`` and step rows to ``phases.csv``."""

    def __init__(self, out_dir: str | Path | None) -> None:
        self.out_dir = Path(out_dir) if out_dir else None
        self._csv_header = False
        if self.out_dir:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.out_dir / "metrics.jsonl", "a")
            self._csv = open(self.out_dir / "phases.csv", "a")
            self._csv_header = self._csv.tell() > 0

    def window(self, metrics: dict[str, Any]) -> None:
        if self.out_dir:
            self._jsonl.write(json.dumps(_finite(metrics)) + "\n")
            self._jsonl.flush()

    def event(self, record: dict[str, Any]) -> None:
        """An event record (``"kind": "event"``, e.g. a config reload) between the windows of ``metrics.jsonl``."""
        assert record.get("kind") == "event", record
        self.window(record)

    def steps(self, steps: list[StepRecord], *, measured: bool) -> None:
        if not self.out_dir:
            return
        cols = ["step", "measured", "seq_len", "real_tokens", "padded_tokens", "loss", *PHASES, "step_s", "comm_s",
                "comm_exposed_s"]
        if not self._csv_header:
            self._csv.write(",".join(cols) + "\n")
            self._csv_header = True
        for s in steps:
            vals = [s.step, int(measured), s.seq_len, s.real_tokens, s.padded_tokens,
                    "" if s.loss is None else f"{s.loss:.6g}",
                    *(f"{s.phases.get(p, 0.0):.6e}" for p in PHASES), f"{s.phases.get('step', 0.0):.6e}",
                    *("" if v is None else f"{v:.6e}" for v in (s.comm_s, s.comm_exposed_s))]
            self._csv.write(",".join(map(str, vals)) + "\n")
        self._csv.flush()

    def close(self) -> None:
        if self.out_dir:
            self._jsonl.close()
            self._csv.close()


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: write non-finite floats as strings so a reader sees them."""
    def one(v: Any) -> Any:
        return str(v) if isinstance(v, float) and not math.isfinite(v) else v

    return {k: [one(x) for x in v] if isinstance(v, list) else one(v) for k, v in d.items()}


class LaunchTimer:
    """Host time of CUDA graph replays: ``observe(us)`` per ``replay()`` call; cumulative count and sum, and
    quantiles over the last ``window`` replays (Prometheus: ``loongforge_compute_graph_launch_overhead_us``)."""

    def __init__(self, window: int = 4096) -> None:
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.count = 0
        self.sum_us = 0.0

    def observe(self, us: float) -> None:
        self._recent.append(us)
        self.count += 1
        self.sum_us += us

    def snapshot(self) -> dict[str, float | int]:
        """``graph/launch_overhead_us_*`` (p50, p90, p99, sum) and ``graph/replays``; empty before a replay."""
        if not self.count:
            return {}
        q = statistics.quantiles(self._recent, n=100, method="inclusive") if len(self._recent) > 1 \
            else [self._recent[0]] * 99
        return {"graph/replays": self.count, "graph/launch_overhead_us_sum": self.sum_us,
                "graph/launch_overhead_us_p50": q[49], "graph/launch_overhead_us_p90": q[89],
                "graph/launch_overhead_us_p99": q[98]}


_QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))
_REUSE_POOLS = (("staging", "memory/staging_reuse_ratio"), ("cuda_allocator", ALLOCATOR_REUSE_RATIO))


class PrometheusExporter:
    """Serves the run on ``port`` in Prometheus's own types, under the seed's names (docs/operations.md, "Prometheus").

    Gauges carry the latest window, counters (``*_total``) the whole run, summaries (``_count``, ``_sum`` and
    ``{quantile=...}``) a cumulative count and sum with quantiles over the reader's recent reads (or graph
    replays). A figure that does not apply is not exported: MFU without a peak (the CPU), GPU memory and the
    allocator's reuse off CUDA, the graph launch overhead without graph capture. ``start()`` returns None
    with one warning line when the port cannot be bound; the run goes on without the endpoint.
    """

    def __init__(self, port: int, addr: str = "127.0.0.1") -> None:
        try:
            import prometheus_client as pc
        except ImportError as e:  # pragma: no cover
            raise RuntimeError("metrics.prometheus_port is set but prometheus_client is not installed: "
                               "pip install prometheus_client") from e
        self._lock = threading.Lock()
        self._window: dict[str, Any] = {}
        self._tokens = self._padded = self._steps = 0
        self._reloads = {"applied": 0, "rejected": 0}
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # collect() below builds the families at each scrape
        self.port = port
        self.server, self.thread = pc.start_http_server(port, addr=addr, registry=self.registry)

    @classmethod
    def start(cls, port: int, addr: str = "127.0.0.1") -> "PrometheusExporter | None":
        """An exporter on ``addr:port`` (loopback unless asked), or None (one warning line) when the port is in use
        or cannot be bound."""
        try:
            return cls(port, addr)
        except OSError as e:
            log.warning("metrics.prometheus_port=%d: cannot serve /metrics (%s); continuing without the "
                        "Prometheus endpoint", port, e.strerror or e)
            return None

    def steps(self, recs: list[StepRecord]) -> None:
        """Count steps and tokens (every step, warm-up included)."""
        with self._lock:
            self._steps += len(recs)
            self._tokens += sum(r.real_tokens for r in recs)
            self._padded += sum(r.padded_tokens for r in recs)

    def reload(self, result: str) -> None:
        """Count a config reload: ``result`` is ``applied`` or ``rejected``."""
        with self._lock:
            self._reloads[result] += 1

    def update(self, m: dict[str, Any]) -> None:
        """The latest measured window (``summarize_window`` + memory + pipeline + graph figures)."""
        with self._lock:
            self._window = dict(m)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

        with self._lock:
            m, steps, tokens, padded = self._window, self._steps, self._tokens, self._padded
            reloads = dict(self._reloads)

        def num(key: str) -> float | None:
            v = m.get(key)
            return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

        def gauge(name: str, doc: str, key: str):
            v = num(key)
            if v is not None:
                yield GaugeMetricFamily(name, doc, value=v)

        def summary(name: str, doc: str, prefix: str, count_key: str):
            count, total = num(count_key), num(f"{prefix}_sum")
            if not count or total is None:
                return
            f = Metric(name, doc, "summary")
            for q, suffix in _QUANTILES:
                v = num(f"{prefix}_{suffix}")
                if v is not None:
                    f.add_sample(name, {"quantile": q}, v)
            f.add_sample(f"{name}_count", {}, count)
            f.add_sample(f"{name}_sum", {}, total)
            yield f

        yield CounterMetricFamily("loongforge_steps", "optimizer steps taken (warm-up included)", value=steps)
        yield CounterMetricFamily("loongforge_tokens", "real (non-padding) tokens trained on", value=tokens)
        yield CounterMetricFamily("loongforge_padded_tokens", "tokens after padding (real + padding)",
                                  value=padded)
        f = CounterMetricFamily("workbench_config_reloads", "config reloads (SIGUSR1), by result", labels=["result"])
        for result, n in reloads.items():
            f.add_metric([result], n)
        yield f
        if not m:
            return
        yield from gauge("loongforge_throughput_tokens_per_sec", "real tokens/s per GPU over the latest window",
                         REAL_TOKENS_PER_S)
        yield from gauge("loongforge_mfu_percent", "model FLOPs utilisation over the latest window, %", "mfu_pct")
        yield from gauge("loongforge_memory_reserved_gib", "peak GiB reserved by the CUDA caching allocator",
                         MAX_RESERVED_GIB)
        yield from gauge("loongforge_loss", "training loss (last step of the latest window)", "loss")
        phases = [(p, num(f"time/{p}_s")) for p in PHASES]
        if any(v is not None for _, v in phases):
            f = GaugeMetricFamily("loongforge_phase_seconds", "seconds per step in each phase (latest window)",
                                  labels=["phase"])
            for p, v in phases:
                if v is not None:
                    f.add_metric([p], v)
            yield f
        reuse = [(pool, num(key)) for pool, key in _REUSE_POOLS]
        if any(v is not None for _, v in reuse):
            f = GaugeMetricFamily("loongforge_memory_buffer_reuse_ratio",
                                  "share of buffer requests served by reusing memory already held (0..1)",
                                  labels=["pool"])
            for pool, v in reuse:
                if v is not None:
                    f.add_metric([pool], v)
            yield f
        if num("io/reads") is not None:
            yield CounterMetricFamily("loongforge_io_reads", "shard reads completed", value=num("io/reads"))
        if num("io/read_bytes") is not None:
            yield CounterMetricFamily("loongforge_io_read_bytes", "shard bytes read", value=num("io/read_bytes"))
        yield from summary("loongforge_io_read_latency_ms", "shard read latency, submit to completion, ms "
                           "(quantiles over the last 65,536 reads)", "io/read_latency_ms", "io/reads")
        yield from summary("loongforge_compute_graph_launch_overhead_us", "host time of one CUDA graph "
                           "replay() call, us (quantiles over the last 4,096 replays)", "graph/launch_overhead_us",
                           "graph/replays")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
