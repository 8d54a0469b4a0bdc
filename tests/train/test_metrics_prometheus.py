"""Prometheus: the seed's names in Prometheus's own types, scraped over loopback and parsed with
``prometheus_client``'s own parser; a live ``python -m workbench.train`` run scraped while it trains."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workbench.train.__main__ import parse_args
from workbench.train.metrics import LaunchTimer, MetricsWriter, PrometheusExporter, StepRecord, summarize_window
from workbench.train.run import load_run_config
from workbench.train.timing import PHASES


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(fam) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}


def _window() -> dict:
    steps = [StepRecord(step=i, real_tokens=900, padded_tokens=1000, seq_len=250, flops=9e12,
                        phases={**{p: 0.01 for p in PHASES}, "step": 0.07}, loss=3.5 - 0.1 * i)
             for i in range(1, 5)]
    m = summarize_window(steps, peak_tflops=989.0)
    # 4 steps of 0.07 s: 3,600 real tokens in 0.28 s; 3.6e13 FLOP / 0.28 s / 989e12 = 13.0 %
    assert m["throughput/real_tokens_per_s_per_gpu"] == 3600 / 0.28
    assert abs(m["mfu_pct"] - 100 * 3.6e13 / 0.28 / 989e12) < 1e-9
    assert abs(m["data/padding_ratio"] - 0.1) < 1e-12
    return m, steps


def test_a_cuda_window_is_served_in_prometheus_types():
    m, steps = _window()
    launch = LaunchTimer()
    for us in (10.0, 20.0, 30.0, 40.0):
        launch.observe(us)
    m.update({"io/read_latency_ms_p50": 0.25, "io/read_latency_ms_p90": 1.0, "io/read_latency_ms_p99": 1.5,
              "io/read_latency_ms_sum": 40.0, "io/reads": 100, "io/read_bytes": 4096,
              "memory/max_reserved_gib": 12.5, "memory/allocator_reuse_ratio": 0.97,
              "memory/staging_reuse_ratio": 0.5, **launch.snapshot()})
    port = _free_port()
    exp = PrometheusExporter(port)
    try:
        exp.steps(steps)
        exp.update(m)
        fams = _scrape(port)
    finally:
        exp.close()
    types = {n: f.type for n, f in fams.items()}
    assert types["loongforge_throughput_tokens_per_sec"] == "gauge"
    assert abs(fams["loongforge_throughput_tokens_per_sec"].samples[0].value - 3600 / 0.28) < 1e-6
    for name, value in (("loongforge_tokens", 3600), ("loongforge_steps", 4), ("loongforge_io_reads", 100),
                        ("loongforge_padded_tokens", 4000), ("loongforge_io_read_bytes", 4096)):
        assert types[name] == "counter" and _samples(fams[name])[(f"{name}_total", ())] == value, name
    lat = _samples(fams["loongforge_io_read_latency_ms"])
    assert types["loongforge_io_read_latency_ms"] == "summary"
    assert lat[("loongforge_io_read_latency_ms", (("quantile", "0.5"),))] == 0.25
    assert lat[("loongforge_io_read_latency_ms", (("quantile", "0.99"),))] == 1.5
    assert lat[("loongforge_io_read_latency_ms_count", ())] == 100
    assert lat[("loongforge_io_read_latency_ms_sum", ())] == 40.0
    g = _samples(fams["loongforge_compute_graph_launch_overhead_us"])
    assert types["loongforge_compute_graph_launch_overhead_us"] == "summary"
    assert g[("loongforge_compute_graph_launch_overhead_us_count", ())] == 4
    assert g[("loongforge_compute_graph_launch_overhead_us_sum", ())] == 100.0
    assert g[("loongforge_compute_graph_launch_overhead_us", (("quantile", "0.5"),))] == 25.0
    reuse = _samples(fams["loongforge_memory_buffer_reuse_ratio"])
    assert reuse == {("loongforge_memory_buffer_reuse_ratio", (("pool", "cuda_allocator"),)): 0.97,
                     ("loongforge_memory_buffer_reuse_ratio", (("pool", "staging"),)): 0.5}
    assert _samples(fams["loongforge_phase_seconds"])[("loongforge_phase_seconds", (("phase", "forward"),))] == 0.01
    assert fams["loongforge_memory_reserved_gib"].samples[0].value == 12.5
    assert abs(fams["loongforge_mfu_percent"].samples[0].value - m["mfu_pct"]) < 1e-9
    assert abs(fams["loongforge_loss"].samples[0].value - 3.1) < 1e-9


def test_what_does_not_apply_is_not_exported():
    m, _ = _window()
    m.update({"mfu_pct": None, "memory/max_reserved_gib": None, "memory/allocator_reuse_ratio": None,
              "memory/staging_reuse_ratio": float("nan"), "io/read_latency_ms_p50": float("nan")})
    port = _free_port()
    exp = PrometheusExporter(port)
    try:
        before = _scrape(port)  # no window yet: the counters alone, at 0
        exp.update(m)
        fams = _scrape(port)
    finally:
        exp.close()
    assert set(before) == {"loongforge_tokens", "loongforge_steps", "loongforge_padded_tokens",
                           "workbench_config_reloads"}
    for name in ("loongforge_mfu_percent", "loongforge_memory_reserved_gib", "loongforge_memory_buffer_reuse_ratio",
                 "loongforge_compute_graph_launch_overhead_us", "loongforge_io_read_latency_ms"):
        assert name not in fams, name
    assert "loongforge_throughput_tokens_per_sec" in fams


def test_a_port_in_use_is_one_warning_and_no_endpoint(caplog):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        with caplog.at_level(logging.WARNING, logger="workbench"):
            assert PrometheusExporter.start(s.getsockname()[1]) is None
    assert len(caplog.records) == 1 and "continuing without the Prometheus endpoint" in caplog.text


def _listening(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (the kernel's table: /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                addr, p = local.split(":")
                if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                    found.add("*" if set(addr) == {"0"} else addr)
    return found


def test_the_endpoint_listens_on_loopback_unless_asked():
    from workbench.config import ConfigError, merge_overrides, preset_config

    port = _free_port()
    exp = PrometheusExporter.start(port)
    try:
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only
        assert "loongforge_steps" in _scrape(port)
    finally:
        exp.close()
    wide = merge_overrides(preset_config("tiny"), {"metrics.prometheus_addr": "0.0.0.0"}).metrics.prometheus_addr
    port = _free_port()
    exp = PrometheusExporter.start(port, wide)
    try:
        assert _listening(port) == {"*"}  # every interface, as asked
    finally:
        exp.close()
    with pytest.raises(ConfigError, match=r"metrics.prometheus_addr: got 'localhost:9091'; expected an IP address"):
        merge_overrides(preset_config("tiny"), {"metrics.prometheus_addr": "localhost:9091"})


def test_launch_timer_quantiles_count_and_sum():
    t = LaunchTimer(window=3)
    assert t.snapshot() == {}
    for us in (100.0, 1.0, 2.0, 3.0):  # the window keeps the last 3; count and sum cover all 4
        t.observe(us)
    s = t.snapshot()
    assert s["graph/replays"] == 4 and s["graph/launch_overhead_us_sum"] == 106.0
    assert s["graph/launch_overhead_us_p50"] == 2.0 and s["graph/launch_overhead_us_p99"] <= 3.0


@pytest.mark.parametrize("argv, port", [([], 9091), (["--prometheus-port", "9300"], 9300),
                                        (["--no-prometheus"], None),
                                        (["--set", "metrics.prometheus_port=9400"], 9400),
                                        (["--set", "metrics.prometheus_port=null"], None)])
def test_the_cli_serves_on_9091_unless_told_otherwise(argv, port):
    assert load_run_config(parse_args(["--preset", "tiny", *argv])).metrics.prometheus_port == port


@pytest.mark.parametrize("argv, addr", [([], "127.0.0.1"), (["--prometheus-addr", "0.0.0.0"], "0.0.0.0"),
                                        (["--set", "metrics.prometheus_addr=::1"], "::1")])
def test_the_cli_listens_on_loopback_unless_told_otherwise(argv, addr):
    assert load_run_config(parse_args(["--preset", "tiny", *argv])).metrics.prometheus_addr == addr


def _listeners_of(pid: int) -> set[str]:
    """Local addresses (hex, as the kernel's tables give them) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN; column 9: the socket's inode
                    found.add(cols[1].split(":")[0])
    return found


def test_a_live_run_is_scraped_and_parsed(tmp_path, subprocess_env):
    port = _free_port()
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "workbench.train", "--preset", "tiny", "--synthetic", "--steps", "100000", "-q",
           "--prometheus-port", str(port), "--set", "training.log_every=2", "--set", "training.warmup_measure_steps=1",
           "--set", "hardware.device=cpu"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    fams: dict = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and p.poll() is None:
            try:
                fams = _scrape(port)
            except (urllib.error.URLError, ConnectionError):
                fams = {}
            if "loongforge_throughput_tokens_per_sec" in fams:
                listeners = _listeners_of(p.pid)  # issue 39: `ss -ltn` of a default run shows loopback only
                break
            time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate(timeout=30)[0]
    assert "loongforge_throughput_tokens_per_sec" in fams, out[-3000:]
    assert listeners == {"0100007F"}, listeners  # 127.0.0.1, and nothing else listening
    types = {n: f.type for n, f in fams.items()}
    assert types["loongforge_throughput_tokens_per_sec"] == "gauge"
    assert fams["loongforge_throughput_tokens_per_sec"].samples[0].value > 0
    for name in ("loongforge_tokens", "loongforge_steps", "loongforge_io_reads"):
        assert types[name] == "counter", name
        ((sample_name, value),) = [(s.name, s.value) for s in fams[name].samples if s.name.endswith("_total")]
        assert sample_name == f"{name}_total" and value > 0, name
    lat = fams["loongforge_io_read_latency_ms"]
    assert lat.type == "summary"
    names = {s.name for s in lat.samples}
    assert {"loongforge_io_read_latency_ms", "loongforge_io_read_latency_ms_sum",
            "loongforge_io_read_latency_ms_count"} <= names
    assert {s.labels.get("quantile") for s in lat.samples if s.name == lat.name} == {"0.5", "0.9", "0.99"}
    count = next(s.value for s in lat.samples if s.name.endswith("_count"))
    assert count == next(s.value for s in fams["loongforge_io_reads"].samples if s.name.endswith("_total"))
    reuse = {s.labels["pool"]: s.value for s in fams["loongforge_memory_buffer_reuse_ratio"].samples}
    assert set(reuse) == {"staging"} and 0 <= reuse["staging"] < 1  # the CPU: no CUDA allocator
    # the CPU: no peak FLOP/s, no GPU memory, no CUDA graphs
    for name in ("loongforge_mfu_percent", "loongforge_memory_reserved_gib",
                 "loongforge_compute_graph_launch_overhead_us"):
        assert name not in fams, name


def test_a_window_record_carries_its_step_losses_as_strict_json(tmp_path):
    """Each step's loss in order (the numerics guard's median reads them); a non-finite one is written as a string,
    so metrics.jsonl stays strict JSON."""
    m, steps = _window()
    assert m["loss/steps"] == pytest.approx([3.4, 3.3, 3.2, 3.1]) and m["loss"] == pytest.approx(3.1)
    steps[-1].loss = float("nan")
    writer = MetricsWriter(tmp_path)
    writer.window(summarize_window(steps, peak_tflops=989.0))
    writer.close()
    rec = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert rec["loss/steps"][:3] == pytest.approx([3.4, 3.3, 3.2]) and rec["loss/steps"][3] == "nan"
