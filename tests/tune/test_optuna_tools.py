"""A finished tiny study read by Optuna's own tools: optuna-dashboard's HTTP API and the ``optuna`` CLI see its
trials' real states (a failed config FAIL, not a zero measurement), values, flat attributes, constraints, the
metric name and the validated result."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from workbench.tune import Tuner
from workbench.tune.study import load_study_spec

DASHBOARD = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
OPTUNA = shutil.which("optuna", path=str(Path(sys.executable).parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """3 trials of micro-batch {2, 4, 8}: trial 0 crashes (a stand-in process), 1 and 2 run; one A/B candidate."""
    import yaml

    tmp = tmp_path_factory.mktemp("tools")
    spec_path = tmp / "tools.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "tools", "model": "tiny",
        "base": {"data": {"seq_len": 256, "micro_batch_size": 4, "bucket_width": 64, "num_workers": 0},
                 "training": {"global_batch_size": 8, "max_steps": 16, "log_every": 4, "warmup_measure_steps": 2,
                              "dtype": "fp32"},
                 "hardware": {"device": "cpu"}},
        "space": {"micro_batch_size": {"choices": [2, 4, 8]}},
        "budget": {"trials": 3}, "sampler": {"name": "grid"}, "pruner": {"name": "none"},
        "protocol": {"warmup_steps": 2, "window_steps": 3, "windows": 2, "baseline_repeats": 1, "top_k": 1,
                     "ab_rounds": 2, "trial_timeout_s": 180, "heartbeat_timeout_s": 60, "profile_steps": 0}}))
    spec = load_study_spec(str(spec_path))

    from workbench.tune.trial import launch_command

    def launch(cfg, config_path, trial_dir):
        if Path(trial_dir).name == "0":
            return [sys.executable, "-c", "raise RuntimeError('deliberate crash (a test fault)')"]
        return launch_command(cfg, config_path, trial_dir)

    tuner = Tuner(spec, out_root=tmp / "runs", progress=False, launch=launch)
    tuner.run()
    return tuner, json.loads((tmp / "runs" / "tools" / "tune.json").read_text())


@pytest.mark.skipif(DASHBOARD is None, reason="optuna-dashboard is not installed (pip install -e '.[dev]')")
def test_optuna_dashboard_reads_the_study(finished_study):
    tuner, tune = finished_study
    port = _free_port()
    proc = subprocess.Popen([DASHBOARD, tuner.storage_url, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = _get(f"{base}/api/studies")["study_summaries"]
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"optuna-dashboard did not start: {proc.communicate(timeout=5)[0]}")
                time.sleep(0.5)
        sid = next(s["study_id"] for s in studies if s["study_name"] == "tools")
        detail = _get(f"{base}/api/studies/{sid}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    trials = {t["number"]: t for t in detail["trials"]}
    assert detail["objective_names"] == ["throughput/real_tokens_per_s_per_gpu"]  # Optuna's metric names
    crashed = trials[0]
    attrs = {a["key"]: a["value"] for a in crashed["user_attrs"]}
    assert crashed["state"] == "Fail" and not crashed.get("values")  # not a zero measurement
    assert attrs["status"] == "crash" and "deliberate crash" in attrs["log_tail"]
    assert crashed["constraints"] == [1.0, 0.0, 0.0]  # infeasible, as the dashboard shows it
    for n in (1, 2):
        t = trials[n]
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert t["state"] == "Complete" and t["values"][0] > 0 and t["constraints"] == [0.0, 0.0, 0.0]
        assert float(attrs["phase/forward_s"]) > 0 and float(attrs["time/step_s"]) > 0  # flat, sortable
    # the best trial the dashboard names is the best search run among measured trials, never the failure
    assert [b["number"] for b in detail["best_trials"]] == [max((1, 2), key=lambda n: trials[n]["values"][0])]
    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert study_attrs["result/verdict"] == tune["result"]["verdict"]


@pytest.mark.skipif(OPTUNA is None, reason="the optuna CLI is not installed")
def test_the_optuna_cli_reads_the_study(finished_study):
    tuner, tune = finished_study
    run = [OPTUNA, "--storage", tuner.storage_url]
    out = subprocess.run([*run, "trials", "--study-name", "tools", "-f", "json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {r["number"]: r for r in json.loads(out.stdout)}
    assert rows[0]["state"] == "FAIL" and rows[0]["user_attrs"]["status"] == "crash"
    assert all(rows[n]["state"] == "COMPLETE" for n in (1, 2))
    best = subprocess.run([*run, "best-trial", "--study-name", "tools", "-f", "json"], capture_output=True,
                          text=True, timeout=120)
    assert best.returncode == 0, best.stderr
    key = "throughput/real_tokens_per_s_per_gpu"  # the metric name: the CLI prints values under it
    assert rows[0]["value"] == {key: None}
    number = json.loads(best.stdout)["number"]
    assert number in (1, 2) and rows[number]["value"][key] == max(rows[1]["value"][key], rows[2]["value"][key])
    # the tuner's own winner is the validated one; the study's attributes say which, next to Optuna's best
    # (top_k 1: the one candidate is the best search run that changes the base config, if it beat the baseline
    # median in the search; the grid runs its 3 values in a random order, and a trial that drew the base's
    # micro-batch 4 is the baseline's own config, never a candidate, though it may be Optuna's best)
    changed = [n for n in sorted((1, 2), key=lambda n: -rows[n]["value"][key])
               if rows[n]["params"]["micro_batch_size"] != 4]
    assert changed[0] == number or rows[number]["params"]["micro_batch_size"] == 4
    cands = tune["result"]["candidates"]
    assert ([c["trial"] for c in cands] == changed[:1]) or (not cands and tune["result"]["verdict"] == "no_candidate")
