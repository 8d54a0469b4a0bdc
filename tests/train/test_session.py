"""The run API (workbench/train/session.py) a loop of one's own reports through: windows, phases, heartbeat,
summary, failure kinds; the same session the built-in Trainer runs on (tests/train/test_train.py)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

import workbench
from workbench.config import Config, merge_overrides
from workbench.vocab import PADDED_TOKENS_PER_S, REAL_TOKENS_PER_S


def _cfg(**over) -> Config:
    return merge_overrides(Config(), {"training.max_steps": 8, "training.warmup_measure_steps": 2,
                                      "training.log_every": 3, "hardware.device": "cpu", **over})


def _loop(run, sleep_s: float = 0.002, loss=lambda i: torch.tensor(1.0 / (i + 1))):
    for i in range(run.max_steps):
        with run.phase("data_wait"):
            time.sleep(sleep_s)
        with run.phase("forward"):
            time.sleep(2 * sleep_s)
        with run.phase("optimizer"):
            pass
        run.step(tokens=64, real_tokens=48, loss=loss(i))


def test_a_loop_reports_windows_phases_and_a_summary(tmp_path):
    with workbench.run(_cfg(), out=tmp_path) as run:
        assert run.device.type == "cpu" and run.user == {}
        assert (tmp_path / "heartbeat").read_text() == "0"  # it reports before its first step
        _loop(run)
    windows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [w["step"] for w in windows] == [5, 8]  # warm-up 2, then every 3 steps
    for w in windows:
        # each phase holds at least its own sleep (a loaded machine only lengthens sleeps), so a phase's time
        # counted to its neighbour fails one bound
        assert w["time/data_wait_s"] >= 0.002 and w["time/forward_s"] >= 0.004 and w["time/backward_s"] == 0.0
        assert w[REAL_TOKENS_PER_S] == pytest.approx(48 / w["time/step_s"])
        assert w["data/padding_ratio"] == pytest.approx(0.25)
    assert windows[-1]["loss"] == pytest.approx(1 / 8)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["steps"], s["measured_steps"], s["windows"]) == (8, 6, 2)
    assert s["first_loss"] == pytest.approx(1.0) and s["last_loss"] == pytest.approx(1 / 8)
    assert sum(s["phase_s_per_step"].values()) == pytest.approx(s["time/step_s"], rel=1e-6)
    assert (tmp_path / "heartbeat").read_text() == "8"
    rows = (tmp_path / "phases.csv").read_text().splitlines()
    assert len(rows) == 1 + 8 and rows[0].startswith("step,measured")


def test_config_and_out_come_from_the_environment(tmp_path, monkeypatch):
    from workbench.config import dump_config

    path = dump_config(merge_overrides(_cfg(), {"user.attention": "sdpa", "data.micro_batch_size": 3}),
                       tmp_path / "config.yaml")
    monkeypatch.setenv("WORKBENCH_CONFIG", str(path))
    monkeypatch.setenv("WORKBENCH_OUT", str(tmp_path / "out"))
    with workbench.run() as run:
        assert run.user == {"attention": "sdpa"} and run.config.data.micro_batch_size == 3
        _loop(run, sleep_s=0)
    assert (tmp_path / "out" / "summary.json").exists()


def test_the_allocator_settings_reach_the_environment_before_cuda(tmp_path, monkeypatch):
    """The allocator knobs act on a loop of one's own as on the built-in one: run() writes them to
    PYTORCH_CUDA_ALLOC_CONF before the loop can initialise CUDA, keeping what the environment set besides."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    cfg = _cfg(**{"loongforge.memory_domain.allocator.expandable_segments": True})
    with workbench.run(cfg, out=tmp_path) as run:
        env = __import__("os").environ["PYTORCH_CUDA_ALLOC_CONF"]
        assert "expandable_segments:True" in env and "garbage_collection_threshold:0.8" in env
        _loop(run, sleep_s=0)


@pytest.mark.parametrize(("raise_", "kind"), [
    (lambda: (_ for _ in ()).throw(RuntimeError("boom")), "crash"),
    (lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")), "oom"),
])
def test_an_exception_writes_its_failure_kind_and_propagates(tmp_path, raise_, kind):
    with pytest.raises(Exception):
        with workbench.run(_cfg(), out=tmp_path):
            next(raise_())
    assert json.loads((tmp_path / "failure.json").read_text())["kind"] == kind
    assert not (tmp_path / "summary.json").exists()


def test_a_nan_loss_stops_the_run_as_nan_loss(tmp_path):
    with pytest.raises(workbench.train.NanLossError, match="loss is nan at step 4"):
        with workbench.run(_cfg(), out=tmp_path) as run:
            _loop(run, sleep_s=0, loss=lambda i: torch.tensor(math.nan if i == 3 else 1.0))
    assert json.loads((tmp_path / "failure.json").read_text())["kind"] == "nan_loss"


def test_bad_calls_name_what_is_expected(tmp_path):
    with workbench.run(_cfg(), out=tmp_path) as run:
        with pytest.raises(ValueError, match="unknown phase 'fwd'; phases: data_wait, h2d, forward"):
            run.phase("fwd")
        with pytest.raises(ValueError, match=r"run.step\(tokens=...\) takes an int >= 0, got 1.5"):
            run.step(tokens=1.5)
        with pytest.raises(ValueError, match=r"run.step\(real_tokens=...\) takes a 0-d real tensor, got shape \(2,\)"):
            run.step(tokens=4, real_tokens=torch.ones(2))
        with pytest.raises(ValueError, match=r"run.step\(flops=...\) takes a number >= 0 or a 0-d tensor"):
            run.step(tokens=4, flops="many")


def test_real_tokens_and_flops_counted_on_the_device_are_read_with_the_loss(tmp_path):
    """A count made on the device (an attention mask's sum) is handed over as a tensor and read back at the
    window's end with the losses, exactly."""
    with workbench.run(_cfg(), out=tmp_path) as run:
        for i in range(run.max_steps):
            mask = torch.ones(4, 16, dtype=torch.long)
            mask[:, 16 - i:] = 0  # step i has 4 x i padding tokens
            real = mask.sum()
            run.step(tokens=64, real_tokens=real, flops=real * 1e6, loss=torch.tensor(1.0))
    rows = [r.split(",") for r in (tmp_path / "phases.csv").read_text().splitlines()]
    head = rows[0]
    assert [int(r[head.index("real_tokens")]) for r in rows[1:]] == [64 - 4 * i for i in range(8)]
    s = json.loads((tmp_path / "summary.json").read_text())
    real = sum(64 - 4 * i for i in range(2, 8))  # the measured steps
    assert s[REAL_TOKENS_PER_S] / s[PADDED_TOKENS_PER_S] == pytest.approx(real / (6 * 64))
    for w in (json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()):
        assert w["flops/achieved_tflops_per_gpu"] / w[REAL_TOKENS_PER_S] == pytest.approx(1e6 / 1e12)


def test_a_profile_traces_the_loops_steps_and_phases(tmp_path):
    with workbench.run(_cfg(**{"metrics.profile_steps": 2}), out=tmp_path) as run:
        _loop(run, sleep_s=0.001)
    names = [e.get("name") for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]]
    assert names.count("step 3") == 1 and names.count("step 4") == 1 and "step 5" not in names
    assert names.count("forward") == 2 and names.count("data_wait") == 2
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["profile/steps"] == 2 and s["profile/first_step"] == 3


def test_a_profile_after_the_measurement_runs_more_steps_that_count_nowhere(tmp_path):
    """metrics.profile_after_measure: run.max_steps holds the 2 profiled steps after the 8 measured ones; the
    trace has them, the windows and the summary do not (not their loss, though a NaN, not their time)."""
    loss = lambda i: torch.tensor(1.0 / (i + 1) if i < 8 else math.nan)  # noqa: E731 - NaN in the profiled steps
    with workbench.run(_cfg(**{"metrics.profile_steps": 2, "metrics.profile_after_measure": True}),
                       out=tmp_path) as run:
        assert run.max_steps == 10
        _loop(run, sleep_s=0.001, loss=loss)
    names = [e.get("name") for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]]
    assert names.count("step 9") == 1 and names.count("step 10") == 1 and "step 8" not in names
    assert names.count("forward") == 2
    windows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(w["step"], w["steps"]) for w in windows] == [(5, 3), (8, 3)]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["steps"], s["measured_steps"], s["windows"]) == (8, 6, 2)
    assert s["first_loss"] == pytest.approx(1.0) and s["last_loss"] == pytest.approx(1 / 8)
    assert s["profile/steps"] == 2 and s["profile/first_step"] == 9 and not s["interrupted"]
    assert (tmp_path / "heartbeat").read_text() == "10"
    rows = [r.split(",") for r in (tmp_path / "phases.csv").read_text().splitlines()[1:]]
    assert [int(r[1]) for r in rows] == [0, 0] + [1] * 6 + [0, 0]  # the measured column


def test_the_built_in_loop_and_the_run_api_write_one_failure_record(tmp_path, subprocess_env):
    """python -m workbench.train and workbench.run() name an error the same way in failure.json (they drifted
    once: a ConfigError raised as one of its private subclasses was named by the subclass in one of them)."""
    import json
    import subprocess
    import sys

    from workbench.config import ConfigError
    from workbench.train.context import failure_record, write_failure

    class _Deep(ConfigError):
        pass

    assert failure_record(_Deep("bad", key="data.seq_len")) == {"kind": "invalid_config",
                                                                "message": "ConfigError: data.seq_len: bad"}
    assert write_failure(tmp_path, MemoryError("CUDA out of memory")) == {
        "kind": "oom", "message": "MemoryError: CUDA out of memory"}
    assert json.loads((tmp_path / "failure.json").read_text())["kind"] == "oom"
    script = ("import workbench\n"
              "from workbench.config import ConfigError\n"
              "class _Deep(ConfigError): pass\n"
              f"with workbench.run(out={str(tmp_path / 'own')!r}):\n"
              "    raise _Deep('bad', key='data.seq_len')\n")
    subprocess.run([sys.executable, "-c", script], env=subprocess_env, capture_output=True, timeout=120)
    assert json.loads((tmp_path / "own" / "failure.json").read_text()) == {
        "kind": "invalid_config", "message": "ConfigError: data.seq_len: bad"}
