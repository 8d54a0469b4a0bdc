"""The trial runner alone: a real trial, a real crash, the watchdog (time limit, heartbeat), signals."""

from __future__ import annotations

import json
import signal
import statistics
import sys
import time

import pytest

from workbench.config import load_config, merge_overrides
from workbench.errors import UnsafePathError
from workbench.tune.study import load_study_spec
from workbench.tune.trial import (TIMELINE, Watchdog, classify, launch_command, not_launched_outcome, run_trial,
                                  start_process)
from workbench.vocab import COMPILE_S, EXIT_CODES, LOSS_STEPS, PHASES, REAL_TOKENS_PER_S, STEP_S


@pytest.fixture
def spec(study_spec_file):
    return load_study_spec(str(study_spec_file("trial")))


def test_a_real_trial_reports_its_windows(spec, tmp_path):
    seen, phases, seconds = [], [], []
    out = run_trial(spec.trial_config({"micro_batch_size": 8}), tmp_path / "t0", timeout_s=180,
                    heartbeat_timeout_s=60, on_window=lambda i, v, s: seen.append((i, v)) or seconds.append(s),
                    on_phase=phases.append)
    assert out.status == "ok", out.log_tail
    assert out.returncode == 0  # ended at its summary or not, the exit code of a run that went well
    assert len(out.windows) == spec.protocol.windows
    assert seen == list(enumerate(out.windows))
    # each window's own seconds, from its record: its steps at its mean step time (what the budget prices a
    # window left at; the launch and the warm-up are not in it)
    recs = [json.loads(ln) for ln in (tmp_path / "t0" / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if REAL_TOKENS_PER_S in r
            and r["step"] > spec.protocol.warmup_steps]
    assert seconds == pytest.approx([r["steps"] * r[STEP_S] for r in recs])
    # the numerics guard's losses: every measured step's, in order, the same as phases.csv's measured rows
    rows = [ln.split(",") for ln in (tmp_path / "t0" / "phases.csv").read_text().splitlines()[1:]]
    measured = [float(r[5]) for r in rows if int(r[0]) > spec.protocol.warmup_steps]
    assert len(out.step_losses) == spec.protocol.windows * spec.protocol.window_steps
    assert out.step_losses == pytest.approx(measured, rel=1e-5)
    assert [r[LOSS_STEPS] for r in recs] == [out.step_losses[i:i + spec.protocol.window_steps] for i in
                                             range(0, len(out.step_losses), spec.protocol.window_steps)]
    assert all(0 < s < out.wall_s / spec.protocol.windows for s in seconds)
    assert out.value == pytest.approx(statistics.median(out.windows))
    assert out.summary and out.summary["measured_steps"] > 0 and "phase_s_per_step" in out.summary
    for name in ("config.yaml", "metrics.jsonl", "phases.csv", "summary.json", "log.txt", "heartbeat"):
        assert (tmp_path / "t0" / name).exists(), name
    assert load_config(out.config_path).data.micro_batch_size == 8
    assert phases[0] == "launching" and any(p.startswith("measuring window") for p in phases)
    assert out.peak_memory_gib is not None and out.device_total_gib is None  # CPU: RSS, no device share
    # the watchdog's marks, in order of the run; the stepping from the first step to the last window holds the
    # measured windows' own seconds (each mark is seen up to a poll late)
    tl = out.timeline
    assert [k for k in tl if k in TIMELINE] == list(TIMELINE)
    assert tl["compile_s"] == pytest.approx(out.summary[COMPILE_S], abs=0.01)  # the first window's, before step 1
    assert 0 < tl["report"] <= tl["first_step"] <= tl["first_window"] <= tl["last_window"] <= tl["end"]
    assert tl["end"] == pytest.approx(out.wall_s, abs=0.01)
    assert tl["last_window"] - tl["first_step"] >= sum(seconds) - 0.5


def test_a_trial_binds_no_prometheus_port_unless_its_config_sets_one(spec, tmp_path):
    cfg = spec.trial_config({})
    assert cfg.metrics.prometheus_port is None
    cmd = launch_command(cfg, tmp_path / "c.yaml", tmp_path)
    assert cmd[1:3] == ["-m", "workbench.train"] and "--no-prometheus" in cmd  # the CLI's 9091 is off
    cmd = launch_command(merge_overrides(cfg, {"metrics.prometheus_port": 9200}), tmp_path / "c.yaml", tmp_path)
    assert "--no-prometheus" not in cmd and "--prometheus-port" not in cmd  # the config's port serves
    cmd = launch_command(merge_overrides(cfg, {"hardware.gpus": 2, "hardware.device": "auto"}), tmp_path / "c.yaml",
                         tmp_path)
    assert "--standalone" not in cmd  # it resolves the host's name: the rendezvous is on loopback
    assert cmd[cmd.index("--rdzv-endpoint") + 1].startswith("127.0.0.1:") and cmd[cmd.index("--nnodes") + 1] == "1"


def test_a_symlink_in_a_study_folder_is_refused_never_emptied(spec, tmp_path):
    """A trial folder that is a symlink, or lies behind one, is refused before anything is deleted or launched;
    a link inside a trial folder is removed, its target kept."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "1").mkdir(parents=True)
    for f in (elsewhere / "keep.txt", elsewhere / "1" / "keep.txt"):
        f.write_text("the user's file")
    trials = tmp_path / "study" / "trials"
    trials.mkdir(parents=True)
    (trials / "0").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match=r"trials/0: is or lies behind a symlink"):
        run_trial(spec.trial_config({}), trials / "0", timeout_s=60, heartbeat_timeout_s=60)
    (tmp_path / "study" / "linked").symlink_to(elsewhere)  # a link above the trial folder
    with pytest.raises(UnsafePathError, match="symlink"):
        not_launched_outcome(tmp_path / "study" / "linked" / "1", "rejected")
    real = trials / "2"
    real.mkdir()
    (real / "link").symlink_to(elsewhere)
    not_launched_outcome(real, "rejected")  # a fresh folder: the link inside is gone, not followed
    assert not (real / "link").exists() and (real / "failure.json").exists()
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["1", "keep.txt", "keep.txt"]


def test_pruning_kills_the_trial_at_once(spec, tmp_path):
    out = run_trial(spec.trial_config({}), tmp_path / "p", timeout_s=180, heartbeat_timeout_s=60,
                    on_window=lambda i, v, s: True)
    assert out.status == "pruned" and len(out.windows) == 1 and out.value is None
    # SIGKILLed, not asked to stop: no summary of its own; its summary is its one window's figures
    assert out.returncode == -signal.SIGKILL and not (tmp_path / "p" / "summary.json").exists()
    rec = json.loads((tmp_path / "p" / "metrics.jsonl").read_text().splitlines()[-1])
    assert out.summary["summary_of"] == "last_window"
    assert out.summary["measured_steps"] == spec.protocol.window_steps == rec["steps"]
    assert out.summary[REAL_TOKENS_PER_S] == out.windows[0] == rec[REAL_TOKENS_PER_S]
    assert out.summary[COMPILE_S] == rec[COMPILE_S] and out.summary["memory/max_rss_gib"] == rec["memory/max_rss_gib"]
    assert out.summary["phase_s_per_step"] == {k: rec[f"time/{k}_s"] for k in PHASES}
    assert out.peak_memory_gib == rec["memory/max_rss_gib"]
    assert out.timeline["first_window"] == out.timeline["last_window"] <= out.timeline["end"]


# A loop that writes its summary, then tears down for as long as it is told, leaving a mark if it gets through.
SLOW_EXIT = """
import os, pathlib, sys, time
out = pathlib.Path(os.environ['WORKBENCH_OUT'])
(out / 'heartbeat').write_text('1')
(out / 'summary.json').write_text('{}')
time.sleep(float(sys.argv[1]))
(out / 'torn-down').write_text('')
"""


def test_the_built_in_loop_is_over_at_its_summary_a_loop_of_ones_own_is_not(spec, tmp_path):
    # the built-in loop's watchdog (run_trial gives it end_at_summary where the launcher is launch_command)
    run = tmp_path / "built-in"
    run.mkdir()
    proc = start_process([sys.executable, "-c", SLOW_EXIT, "60"], run / "log.txt", env={"WORKBENCH_OUT": str(run)},
                         cwd=None)
    dog = Watchdog(proc, run, spec.trial_config({}), timeout_s=120, heartbeat_timeout_s=120, on_window=None,
                   phase=lambda text: None, poll_s=0.05, end_at_summary=True)
    t0 = time.monotonic()
    seen = dog.watch(t0)
    assert seen.ended_at_summary and proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 30
    assert not (run / "torn-down").exists() and not seen.killed_reason
    # a loop of one's own may still work after its summary (save its model, say): it is left to finish
    out = run_trial(spec.trial_config({}), tmp_path / "own", timeout_s=60, heartbeat_timeout_s=60,
                    launch=lambda cfg, config_path, trial_dir: [sys.executable, "-c", SLOW_EXIT, "1"])
    assert (tmp_path / "own" / "torn-down").exists() and out.returncode == 0


# A loop that ignores SIGTERM and writes a window every 0.2 s (the HF Trainer on the H200 outlived the 3 s grace
# after every SIGTERM): a pruned trial is not waited for.
DEAF = """
import json, os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = pathlib.Path(os.environ['WORKBENCH_OUT'])
for step in range(1, 10000):
    (out / 'heartbeat').write_text(str(step))
    time.sleep(0.05)
    if step % 4 == 0:
        with open(out / 'metrics.jsonl', 'a') as f:
            f.write(json.dumps({'step': step, 'steps': 4, 'time/step_s': 0.05, 'THROUGHPUT': 1000.0}) + '\\n')
""".replace("THROUGHPUT", REAL_TOKENS_PER_S)


def test_a_pruned_trial_that_ignores_sigterm_is_not_waited_for(spec, tmp_path):
    from workbench.tune.trial import KILL_GRACE_S, command_launcher

    out = run_trial(spec.trial_config({}), tmp_path / "deaf", timeout_s=60, heartbeat_timeout_s=30,
                    launch=command_launcher(["python", "-c", DEAF]), on_window=lambda i, v, s: True)
    assert out.status == "pruned" and out.returncode == -signal.SIGKILL
    assert out.timeline["end"] - out.timeline["last_window"] < KILL_GRACE_S / 2


# A loop stepping every 0.3 s that writes a window of 4 steps after its warm-up (``WARM`` steps).
STEPPER = """
import json, os, pathlib, time
out = pathlib.Path(os.environ['WORKBENCH_OUT'])
for step in range(1, WARM + 9):
    time.sleep(0.3)
    (out / 'heartbeat').write_text(str(step))
    if step > WARM and (step - WARM) % 4 == 0:
        with open(out / 'metrics.jsonl', 'a') as f:
            f.write(json.dumps({'step': step, 'steps': 4, 'time/step_s': 0.3, 'THROUGHPUT': 1000.0}) + '\\n')
"""


def test_the_trial_says_once_when_its_measured_windows_are_next(spec, tmp_path):
    """``on_measure`` comes once, as the last warm-up step runs (the compile-ahead twins stop there), before the
    first window; with one warm-up step, as the first step is seen."""
    from workbench.tune.trial import command_launcher

    for warm in (3, 1):
        cfg = merge_overrides(spec.trial_config({}), {"training.warmup_measure_steps": warm,
                                                      "training.max_steps": warm + 8, "training.log_every": 4})
        calls, windows = [], []
        d = tmp_path / f"w{warm}"

        def measuring(d=d):
            calls.append((int((d / "heartbeat").read_text()), len(windows)))

        code = STEPPER.replace("WARM", str(warm)).replace("THROUGHPUT", REAL_TOKENS_PER_S)
        out = run_trial(cfg, d, timeout_s=60, heartbeat_timeout_s=30, launch=command_launcher(["python", "-c", code]),
                        on_window=lambda i, v, s: windows.append(v) and False, on_measure=measuring)
        assert out.status == "ok" and len(out.windows) == 2, out.log_tail
        assert len(calls) == 1, calls
        beat, seen = calls[0]
        assert seen == 0 and max(1, warm - 1) <= beat <= warm, calls  # (a poll may see the next beat)


def test_a_real_failure_is_recorded_with_its_log_tail(spec, tmp_path):
    bad = tmp_path / "bad-model.json"
    bad.write_text(json.dumps({"num_attention_heads": 4}))  # no hidden_size: the model cannot be built
    from workbench.config import merge_overrides

    cfg = merge_overrides(spec.trial_config({}), {"model.name": "custom", "model.config_path": str(bad)})
    out = run_trial(cfg, tmp_path / "c", timeout_s=180, heartbeat_timeout_s=60)
    assert out.status == "invalid_config" and out.returncode == 2
    assert "hidden_size" in out.failure_reason and "hidden_size" in out.log_tail
    assert 0 < len(out.log_tail.splitlines()) <= 30


def test_a_checkpoint_that_cannot_be_written_is_the_machines_fault(spec, tmp_path):
    """Issue 39: a failed checkpoint write was torch's RuntimeError, exit 1, and the tuner blamed the config as a
    crash. The trial ends as ``disk`` (exit 6), with the file named, and the tuner learns nothing about the config
    from it (Tuner._record sets no constraint for ``disk``)."""
    (tmp_path / "afile").write_text("x")
    cfg = merge_overrides(spec.trial_config({}), {"training.checkpoint_dir": str(tmp_path / "afile" / "ck"),
                                                  "training.checkpoint_every": 1})
    out = run_trial(cfg, tmp_path / "d", timeout_s=180, heartbeat_timeout_s=60)
    assert (out.status, out.returncode) == ("disk", 6), out.log_tail
    assert str(tmp_path / "afile" / "ck") in out.failure_reason and "Traceback" not in out.log_tail


@pytest.mark.parametrize(("fault", "status", "words", "limits"), [
    # heartbeat watchdog; 3 s: a loaded CI machine once took over 1.5 s to start the stand-in's Python
    ("hang", "timeout", "no step for 3 s", (60, 3)),
    ("rewrite-then-hang", "timeout", "no step for 3 s (hung after step 8)", (60, 3)),  # empty reads: no loss
    ("hang-start", "timeout", "time limit of 2 s before its first step", (2, 60)),  # per-trial limit
    ("sigkill", "crash", "killed by SIGKILL", (60, 60)),
    ("crash", "crash", "exit code 1", (60, 60)),
])
def test_watchdog_and_signals(spec, tmp_path, fault_launch, fault, status, words, limits):
    t0 = time.monotonic()
    out = run_trial(spec.trial_config({}), tmp_path / fault, timeout_s=limits[0], heartbeat_timeout_s=limits[1],
                    launch=fault_launch({"*": fault}))
    assert out.status == status, (out.failure_reason, out.log_tail)
    assert words in out.failure_reason
    assert time.monotonic() - t0 < 30  # killed promptly, not left to its 1 h sleep


def test_a_trial_with_no_window_by_its_budget_is_stopped_there(spec, tmp_path, fault_launch):
    t0 = time.monotonic()
    out = run_trial(spec.trial_config({}), tmp_path / "b", timeout_s=60, heartbeat_timeout_s=60, budget_s=1.0,
                    launch=fault_launch({"*": "hang"}))
    assert out.status == "pruned" and out.stopped_for_budget and out.returncode == -signal.SIGKILL
    assert out.failure_reason.startswith("stopped before its first window for the GPU-minute budget: 1 s")
    assert 1.0 <= out.wall_s and time.monotonic() - t0 < 30 and out.windows == []
    # a trial that measured a window (every 0.2 s here) is the window callback's to stop: the limit is past
    start = time.monotonic()
    out = run_trial(spec.trial_config({}), tmp_path / "w", timeout_s=60, heartbeat_timeout_s=60, budget_s=5.0,
                    launch=lambda cfg, config_path, trial_dir: [sys.executable, "-c", DEAF],
                    on_window=lambda i, v, s: time.monotonic() - start > 6.0)
    assert out.status == "pruned" and not out.stopped_for_budget and out.wall_s > 5.0 and len(out.windows) > 3


def test_invalid_config_is_recorded_without_launch(tmp_path):
    out = not_launched_outcome(tmp_path / "i", "training.global_batch_size: got 8; must be a multiple of 3")
    assert out.status == "invalid_config" and out.failed
    assert json.loads((tmp_path / "i" / "failure.json").read_text())["kind"] == "invalid_config"
    assert "multiple of 3" in out.log_tail and not (tmp_path / "i" / "metrics.jsonl").exists()


def test_a_sigkill_is_an_oom_only_with_evidence(spec, tmp_path, monkeypatch, fault_launch):
    """SIGKILL with the memory cgroup's oom_kill count rising is an oom; without any sign of one it is a crash
    marked as killed from outside (the tuner runs such a trial again)."""
    import workbench.tune.trial as trial_mod

    sigkill = fault_launch({"*": "sigkill"})
    counts = iter([3, 4])
    monkeypatch.setattr(trial_mod, "_oom_kills", lambda: next(counts))
    out = run_trial(spec.trial_config({}), tmp_path / "oom", timeout_s=60, heartbeat_timeout_s=60, launch=sigkill)
    assert out.status == "oom" and "oom_kill count rose" in out.failure_reason and not out.killed_from_outside
    monkeypatch.setattr(trial_mod, "_oom_kills", lambda: 3)
    out = run_trial(spec.trial_config({}), tmp_path / "ext", timeout_s=60, heartbeat_timeout_s=60, launch=sigkill)
    assert out.status == "crash" and out.killed_from_outside and "from outside" in out.failure_reason


@pytest.mark.parametrize("rc, failure, tail, kw, expected", [
    # exited 0: measured, measured with a non-finite loss, or nothing reported
    (0, {}, "", {"windows": [1.0, 2.0]}, ("ok", "", False)),
    (0, {}, "", {"windows": [1.0], "summary": {"last_loss": float("nan")}}, ("nan_loss", "final loss nan", False)),
    (0, {}, "", {"windows": []}, ("no_report", "exited 0 without reporting a measured window", False)),
    # failure.json names the kind; an unknown kind, or ok/pruned written there, is a crash
    (1, {"kind": "oom", "message": "CUDA out of memory"}, "", {"windows": []}, ("oom", "CUDA out of memory", False)),
    (0, {"kind": "invalid_config", "message": "bad key"}, "", {"windows": [1.0]}, ("invalid_config", "bad key", False)),
    (1, {"kind": "exploded"}, "", {"windows": []}, ("crash", "exit code 1", False)),
    (1, {"kind": "pruned"}, "", {"windows": []}, ("crash", "exit code 1", False)),
    # no failure.json: the exit code's kind, else a crash, an OOM where the log says so
    (EXIT_CODES["oom"], {}, "", {"windows": []}, ("oom", f"exit code {EXIT_CODES['oom']}", False)),
    (1, {}, "RuntimeError: CUDA out of memory. Tried", {"windows": []}, ("oom", "exit code 1", False)),
    (1, {}, "Traceback ... ValueError", {"windows": []}, ("crash", "exit code 1", False)),
    # killed by a signal: SIGKILL is an OOM when the kernel's OOM killer acted or the RSS neared the host's memory,
    # else a kill from outside (run once more)
    (-signal.SIGSEGV, {}, "", {"windows": []}, ("crash", "killed by SIGSEGV", False)),
    (-signal.SIGKILL, {}, "", {"windows": [], "oom_kill_rose": True},
     ("oom", "killed by SIGKILL (the kernel's OOM killer: its oom_kill count rose)", False)),
    (-signal.SIGKILL, {}, "", {"windows": [], "oom_kill_rose": False, "rss_gib": 22.0, "host_gib": 24.0},
     ("oom", "killed by SIGKILL (its RSS had reached 22.0 of 24.0 GiB)", False)),
    (-signal.SIGKILL, {}, "", {"windows": [], "oom_kill_rose": None, "rss_gib": 2.0, "host_gib": 24.0},
     ("crash", "killed by SIGKILL from outside (no OOM kill recorded, memory not near the host's)", True)),
    (-signal.SIGKILL, {"message": "step 3"}, "", {"windows": []},
     ("crash", "killed by SIGKILL; step 3 from outside (no OOM kill recorded, memory not near the host's)", True)),
])
def test_classify_maps_each_exit_to_its_status(rc, failure, tail, kw, expected):
    status, reason, outside = classify(rc, failure, tail, **kw)
    assert (status, outside) == (expected[0], expected[2])
    assert reason.startswith(expected[1]) if expected[0] == "no_report" else reason == expected[1]
