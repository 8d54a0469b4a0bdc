"""Window metrics served to Prometheus under the orchestrator's names, scraped over loopback."""

from __future__ import annotations

import socket
import urllib.request

from workbench.train.metrics import PrometheusExporter, StepRecord, summarize_window
from workbench.train.timing import PHASES


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_latest_window_is_served_with_seed_names():
    steps = [StepRecord(step=i, real_tokens=900, padded_tokens=1000, seq_len=250, flops=9e12,
                        phases={**{p: 0.01 for p in PHASES}, "step": 0.07}, loss=3.5 - 0.1 * i)
             for i in range(1, 5)]
    m = summarize_window(steps, peak_tflops=989.0)
    # 4 steps of 0.07 s: 3,600 real tokens in 0.28 s; 3.6e13 FLOP / 0.28 s / 989e12 = 13.0 %
    assert m["throughput/real_tokens_per_s_per_gpu"] == 3600 / 0.28
    assert abs(m["mfu_pct"] - 100 * 3.6e13 / 0.28 / 989e12) < 1e-9
    assert abs(m["data/padding_ratio"] - 0.1) < 1e-12
    m.update({"io/read_latency_ms_p50": 0.25, "io/read_latency_ms_p99": 1.5, "memory/max_reserved_gib": 12.5})
    port = _free_port()
    exp = PrometheusExporter(port)
    try:
        exp.update(m)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        exp.close()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert abs(values["loongforge_throughput_tokens_per_sec"] - 3600 / 0.28) < 1e-6
    assert values['loongforge_io_read_latency_ms{quantile="0.5"}'] == 0.25
    assert values['loongforge_io_read_latency_ms{quantile="0.99"}'] == 1.5
    assert values['loongforge_phase_seconds{phase="forward"}'] == 0.01
    assert values["loongforge_memory_reserved_gib"] == 12.5
    assert abs(values["loongforge_loss"] - 3.1) < 1e-9
