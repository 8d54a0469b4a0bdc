"""Signals and budgets, with real processes: a trial frozen by SIGSTOP is killed by the heartbeat watchdog and
the study goes on; SIGTERM of the tuner stops it like Ctrl-C (exit 130, the trial FAIL/interrupted); negative
budgets are refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from _signals import default_signals
from optuna.trial import TrialState



def _study(url: str) -> optuna.Study | None:
    name = url.rsplit("/", 2)[-2]  # runs/<study>/study.db
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)
        return optuna.load_study(study_name=name, storage=storage)
    except Exception:  # noqa: BLE001 - not created yet, or its schema is being written right now
        return None


def _running_trial(proc, url, trial_dir, timeout=240):
    """The trial whose heartbeat says its first step ran (0 is written at its start), with its process group from
    the storage."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        beat = (trial_dir / "heartbeat").read_text().strip() if (trial_dir / "heartbeat").exists() else ""
        if beat.isdigit() and int(beat) >= 1:
            study = _study(url)
            trial = study.trials[int(trial_dir.name)] if study is not None and \
                len(study.trials) > int(trial_dir.name) else None
            if trial is not None and "pgid" in trial.user_attrs:
                return trial
        time.sleep(0.1)
    raise AssertionError("no trial started")


def _cmd(spec, *extra):
    return [sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs", "--no-progress",
            "--no-report", *extra]


def test_a_sigstopped_trial_is_killed_by_the_watchdog(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("stop", trials=2, protocol={"baseline_repeats": 1, "top_k": 0, "heartbeat_timeout_s": 4,
                                                      "window_steps": 4, "windows": 3})
    url = f"sqlite:///{(tmp_path / 'runs' / 'stop' / 'study.db').resolve()}"
    proc = subprocess.Popen(_cmd(spec), env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    frozen = _running_trial(proc, url, tmp_path / "runs" / "stop" / "trials" / "0")
    os.killpg(frozen.user_attrs["pgid"], signal.SIGSTOP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    t = _study(url).trials[frozen.number]
    assert t.user_attrs["status"] == "timeout" and "no step for 4 s" in t.user_attrs["failure_reason"]
    assert t.constraints["failed"] == 1.0  # infeasible for the sampler: a hang is the config's
    # FAIL in Optuna, and it used up one of the 2 trials of the budget: the study went on with the other
    assert [x.state for x in _study(url).get_trials()] == [TrialState.FAIL, TrialState.COMPLETE]


def test_sigterm_stops_the_tuner_like_ctrl_c(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("term", trials=2, protocol={"baseline_repeats": 1, "top_k": 0, "window_steps": 4,
                                                      "windows": 3})
    url = f"sqlite:///{(tmp_path / 'runs' / 'term' / 'study.db').resolve()}"
    proc = subprocess.Popen(_cmd(spec), env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    running = _running_trial(proc, url, tmp_path / "runs" / "term" / "trials" / "0")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    t = _study(url).trials[running.number]
    assert t.state == TrialState.FAIL and t.user_attrs["status"] == "interrupted"


@pytest.mark.parametrize(("args", "words"), [
    (["--trials", "-1"], "--trials must be >= 1"),
    (["--trials", "0"], "--trials must be >= 1"),
    (["--timeout", "-5"], "--timeout must be > 0"),
])
def test_negative_budgets_on_the_command_line(tmp_path, subprocess_env, args, words):
    r = subprocess.run([sys.executable, "-m", "workbench.tune", "--out", str(tmp_path), *args], env=subprocess_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "tiny-cpu").exists()  # nothing was started


def test_negative_budgets_in_a_spec(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("neg", trials=3)
    spec.write_text(spec.read_text().replace("trials: 3", "trials: -1"))
    r = subprocess.run(_cmd(spec), env=subprocess_env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1
    assert "budget.trials: got -1; expected an integer >= 1 or null" in lines[0]
    assert not (tmp_path / "runs" / "neg" / "study.db").exists()
