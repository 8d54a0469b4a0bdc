"""Shared pytest configuration and fixtures (the tuner tests' small study)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Before torch is imported anywhere in the test process: OpenMP threads that spin
# collapse on 2 shared cores (see workbench/train/__main__.py, which sets the same default).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# A study small enough for the test suite: the tiny model on the CPU, 2 + 3 x 2 steps per trial; no trace runs
# (tests/tune/test_traces.py turns them on).
FAST_PROTOCOL = {"warmup_steps": 2, "window_steps": 3, "windows": 2, "baseline_repeats": 2, "top_k": 1,
                 "ab_rounds": 2, "trial_timeout_s": 180, "heartbeat_timeout_s": 60, "profile_steps": 0}


# The files that take longest, longest first (by their totals in a run of the suite as scripts/test.sh runs it on
# 2 cores, 3 workers: 2,727 worker-seconds in 939 s on 2026-12-07):
# scripts/test.sh runs the suite on pytest-xdist workers, a file at a time each, in collection order
# (--no-loadscope-reorder); handing out the long files first leaves the short ones to even out the workers' ends.
# A file missing here only runs later; keep the order roughly right when a file's cost changes a lot.
LONGEST_FIRST = [
    "tests/train/test_train.py",
    "tests/train/test_hf_prepare.py",
    "tests/tune/test_tune_e2e.py",
    "tests/benchmarks/test_loop_bench.py",
    "tests/examples/test_examples.py",
    "tests/tune/test_compile_ahead.py",
    "tests/tune/test_tune_signals.py",
    "tests/tune/test_tune_resume.py",
    "tests/tune/test_screening.py",
    "tests/tune/test_traces.py",
    "tests/kernels/test_kernels_bench.py",
    "tests/tune/test_profiled.py",
    "tests/tune/test_numerics.py",
    "tests/tune/test_tune_faults.py",
    "tests/tune/test_tune_coordinator.py",
    "tests/tune/test_sampler_efficiency.py",
    "tests/reports/test_report_degraded.py",
    "tests/tune/test_start_ahead.py",
    "tests/train/test_compile_cache.py",
    "tests/tune/test_tune_trial.py",
    "tests/tune/test_tune_cli.py",
    "tests/tune/test_tune_failures.py",
    "tests/tune/test_optuna_tools.py",
    "tests/kernels/test_kernel_ops.py",
    "tests/tune/test_tune_postgres.py",
    "tests/train/test_overlap.py",
    "tests/test_background_job.py",
    "tests/tune/test_search_coverage.py",
    "tests/train/test_profiling.py",
    "tests/kernels/test_fp8_linear.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: a file keeps its order


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "postgres: needs a PostgreSQL server at $WORKBENCH_TEST_PG_URL (skipped when unset, a failure under CI=true)",
    )


@pytest.fixture
def pg_url():
    """$WORKBENCH_TEST_PG_URL, the PostgreSQL server of the postgres-marked tests (scripts/services.sh starts one):
    skipped where it is unset, a failure under CI=true."""
    url = os.environ.get("WORKBENCH_TEST_PG_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("WORKBENCH_TEST_PG_URL is not set under CI=true: the PostgreSQL tests must run in CI")
        pytest.skip("WORKBENCH_TEST_PG_URL is not set (scripts/services.sh starts PostgreSQL)")
    return url


@pytest.fixture
def study_spec_file(tmp_path):
    """Write a small study spec: ``study_spec_file(name, space=..., trials=..., protocol={...})`` -> its path."""

    def write(name: str = "t", *, space=None, trials: int = 3, protocol=None, base=None, pruner=None,
              sampler=None) -> Path:
        spec = {
            "name": name,
            "model": "tiny",
            "base": base or {
                "data": {"seq_len": 256, "micro_batch_size": 4, "bucket_width": 64, "num_workers": 0},
                "training": {"global_batch_size": 8, "max_steps": 16, "log_every": 4, "warmup_measure_steps": 2,
                             "dtype": "fp32"},
                "hardware": {"device": "cpu"},
            },
            "space": space or {"micro_batch_size": {"choices": [2, 8]}, "num_workers": {"low": 0, "high": 1}},
            "budget": {"trials": trials},
            "sampler": sampler or {"name": "random", "seed": 0},
            "pruner": pruner or {"name": "none"},
            "protocol": {**FAST_PROTOCOL, **(protocol or {})},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write


@pytest.fixture
def subprocess_env():
    """Environment for running the CLIs in a subprocess from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile on the aot_eager backend for the test (the same Dynamo graphs and autograd, without inductor's
    C++ build, ~40 s a graph on 2 cores); returns the list of the modes it was asked for, a call each."""
    import torch

    real_compile, modes = torch.compile, []

    def compile_(fn=None, **kw):
        modes.append(kw.pop("mode", None))
        if fn is None:  # (used as a decorator factory)
            return lambda f: real_compile(f, backend="aot_eager", **kw)
        return real_compile(fn, backend="aot_eager", **kw)

    monkeypatch.setattr(torch, "compile", compile_)
    return modes


# Stand-ins for a trial's process, each testing one watchdog or classification path.
FAULT_SCRIPTS = {
    # one heartbeat, then silence: the heartbeat watchdog must fire
    "hang": "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(3600)",
    # never a step: the per-trial time limit must fire
    "hang-start": "import time; time.sleep(3600)",
    # 8 beats, each written as Path.write_text does (truncate, then write) with the file left empty for 0.25 s,
    # then silence: the empty reads must not count as a process that never reported
    "rewrite-then-hang": ("import sys, time\nfor i in range(1, 9):\n    with open(sys.argv[1], 'w') as f:\n"
                          "        f.flush(); time.sleep(0.25); f.write(str(i))\n    time.sleep(0.05)\n"
                          "time.sleep(3600)"),
    "crash": "raise RuntimeError('deliberate crash (a test fault)')",
    "sigkill": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
}


@pytest.fixture
def fault_launch():
    """``fault_launch({"1": "crash", "*": "hang"})`` -> a launcher for ``run_trial``/``Tuner`` that replaces the
    process of a trial whose folder has that name (``*``: every trial) by the ``FAULT_SCRIPTS`` stand-in; other
    trials run as usual."""
    from workbench.tune.trial import launch_command

    def make(faults: dict[str, str]):
        unknown = set(faults.values()) - set(FAULT_SCRIPTS)
        assert not unknown, f"unknown faults {unknown}; known: {sorted(FAULT_SCRIPTS)}"

        def launch(cfg, config_path: Path, trial_dir: Path) -> list[str]:
            fault = faults.get(Path(trial_dir).name, faults.get("*"))
            if fault is None:
                return launch_command(cfg, config_path, trial_dir)
            return [sys.executable, "-c", FAULT_SCRIPTS[fault], str(Path(trial_dir) / "heartbeat")]

        return launch

    return make
