"""Ctrl-C and kill -9 of the tuner: the running trial is marked FAIL (it does not count), finished trials
and the baseline are kept, and re-running the same command completes the budget."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from _signals import default_signals
from optuna.trial import TrialState


def _study(url: str) -> optuna.Study | None:
    if not Path(url.split(":///", 1)[1]).exists():
        return None  # the tuner has not created it yet (opening would create an empty one)
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)
        return optuna.load_study(study_name="resume", storage=storage)
    except Exception:  # noqa: BLE001 - not created yet, or its schema is being written right now
        return None


def _wait_for(proc: subprocess.Popen, url: str, complete: int, timeout: float = 300) -> optuna.Study:
    """Wait until ``complete`` trials are COMPLETE and one more is RUNNING with its train process up."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        study = _study(url)
        if study is not None:
            trials = study.get_trials()
            done = sum(t.state == TrialState.COMPLETE for t in trials)
            running = [t for t in trials if t.state == TrialState.RUNNING and "pgid" in t.user_attrs]
            if done >= complete and running:
                return study
        time.sleep(0.3)
    raise AssertionError("the tuner made no progress")


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_then_kill_9_then_resume(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("resume", trials=4, protocol={"baseline_repeats": 1, "top_k": 0})
    out = tmp_path / "runs"
    url = f"sqlite:///{(out / 'resume' / 'study.db').resolve()}"
    # a relative --out: trial processes must get paths that do not depend on their working directory
    cmd = [sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs", "--no-progress",
           "--no-report"]
    run = dict(env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
               preexec_fn=default_signals)

    # 1. Ctrl-C while trial 1 runs: exit 130, the trial is FAIL/interrupted, the way to resume is printed
    proc = subprocess.Popen(cmd, **run)
    _wait_for(proc, url, complete=1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Resume with: python -m workbench.tune --study" in err
    study = _study(url)
    # (a trial asked ahead that repeats a measured config is answered from it: a free repeat, not a run)
    first = {t.number: t.values for t in study.get_trials() if t.state == TrialState.COMPLETE
             and not t.user_attrs.get("free_repeat")}
    interrupted = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    # the running trial, and the one asked ahead beside it (start-ahead) where it was asked already
    assert len(first) == 1 and 1 <= len(interrupted) <= 2
    assert all(t.user_attrs["status"] == "interrupted" for t in interrupted)
    baseline = study.user_attrs["baseline_runs"]
    assert len(baseline) == 1

    # 2. kill -9 while a trial runs: the trial stays RUNNING in the storage; its process group dies with it
    proc = subprocess.Popen(cmd, **run)
    study = _wait_for(proc, url, complete=2)
    victim = next(t for t in study.get_trials() if t.state == TrialState.RUNNING and "pgid" in t.user_attrs)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    end = time.monotonic() + 10
    while _alive_group(victim.user_attrs["pgid"]) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _alive_group(victim.user_attrs["pgid"]), "the trial outlived its tuner"
    assert _study(url).trials[victim.number].state == TrialState.RUNNING

    # 3. the same command resumes: dead trial -> FAIL, finished trials and the baseline kept, budget done
    proc = subprocess.run(cmd, timeout=600, **{k: v for k, v in run.items() if k not in ("stdout", "stderr")},
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr
    study = _study(url)
    trials = study.get_trials()
    assert trials[victim.number].state == TrialState.FAIL
    assert trials[victim.number].user_attrs["status"] == "interrupted"
    assert "died" in trials[victim.number].user_attrs["failure_reason"]
    for number, values in first.items():
        assert trials[number].values == values  # not re-run
    # the budget of 4 (a repeat the tuner replaced by an untried config costs none), and both stopped configs
    # were queued again and measured
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not t.user_attrs.get("free_repeat")
               for t in trials) == 4
    measured = [t.params for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert trials[victim.number].params in measured and all(t.params in measured for t in interrupted)
    assert {t.user_attrs.get("requeue_of") for t in trials} >= {victim.number, *(t.number for t in interrupted)}
    assert study.user_attrs["baseline_runs"] == baseline
    assert len(list((out / "resume" / "baseline").iterdir())) == 1
    assert (out / "resume" / "config.yaml").exists()
    # tune.json keeps every coordinator run: the two stopped ones have no end and add nothing to wall_s
    tune = json.loads((out / "resume" / "tune.json").read_text())
    sessions = tune["sessions"]
    assert len(sessions) == 3 and [s["finished"] is None for s in sessions] == [True, True, False]
    assert tune["started"] == sessions[0]["started"] < sessions[2]["started"]
    last = sessions[2]
    assert tune["wall_s"] == (datetime.datetime.fromisoformat(last["finished"])
                              - datetime.datetime.fromisoformat(last["started"])).total_seconds() > 0


def test_a_burst_of_ctrl_c_still_marks_the_running_trial(study_spec_file, tmp_path, subprocess_env):
    """Five SIGINTs 20 ms apart while a real trial runs: the tuner exits 130 and the trial is FAIL/interrupted
    in the storage, not left RUNNING; its process group is gone."""
    spec = study_spec_file("resume", trials=3, protocol={"baseline_repeats": 1, "top_k": 0})
    url = f"sqlite:///{(tmp_path / 'runs' / 'resume' / 'study.db').resolve()}"
    cmd = [sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs", "--no-progress",
           "--no-report"]
    # the default SIGINT disposition in the child, whatever the shell that runs the tests set
    proc = subprocess.Popen(cmd, env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_signals)
    study = _wait_for(proc, url, complete=1)
    running = next(t for t in study.get_trials() if t.state == TrialState.RUNNING)
    for _ in range(5):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "marked FAIL (status interrupted)" in err
    t = _study(url).trials[running.number]
    assert t.state == TrialState.FAIL and t.user_attrs["status"] == "interrupted", (t.state, err[-2000:])
    assert not any(x.state == TrialState.RUNNING for x in _study(url).get_trials())
    end = time.monotonic() + 10
    while _alive_group(running.user_attrs["pgid"]) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _alive_group(running.user_attrs["pgid"])


def test_a_leader_recorded_before_its_exec_is_still_itself_after_it():
    """The tuner records a trial's group leader right after the fork, often before the exec: the identity must
    survive the exec, or the recovery of a dead tuner would leave that trial's processes running."""
    from workbench.tune.storage import proc_identity

    child = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(0.5); "
                              "os.execvp('sleep', ['sleep', '120'])"], start_new_session=True)
    try:
        before = proc_identity(child.pid)
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{child.pid}/cmdline").read_bytes().startswith(b"sleep\0") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(f"/proc/{child.pid}/cmdline").read_bytes().startswith(b"sleep\0")  # it has exec'd
        assert before is not None and proc_identity(child.pid) == before
    finally:
        child.kill()
        child.wait()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")
def test_recovery_kills_only_the_group_the_trial_recorded(study_spec_file, tmp_path):
    """A RUNNING trial of a dead tuner on this host: its stored process group is killed only while the group's
    leader is the process the trial recorded. A stored pgid that now belongs to an unrelated process (pids are
    reused), or that has no recorded leader, is left alive; the trial is marked FAIL/interrupted either way."""
    from workbench.tune import Tuner
    from workbench.tune.storage import proc_identity, proc_start
    from workbench.tune.study import load_study_spec

    tuner = Tuner(load_study_spec(str(study_spec_file("resume"))), out_root=tmp_path / "runs", progress=False)
    study = tuner.open()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = proc_start(dead.pid)
    dead.wait()  # a tuner that is gone
    groups = [subprocess.Popen(["sleep", "120"], start_new_session=True) for _ in range(3)]
    try:
        recorded = proc_identity(groups[0].pid)
        stale = {**proc_identity(groups[1].pid), "start": "1"}  # the group of a process that came later
        for group, leader in zip(groups, (recorded, stale, None)):
            t = study.ask()
            t.set_user_attr("worker", {**tuner.me, "pid": dead.pid, "start": dead_start})
            t.set_user_attr("pgid", group.pid)
            t.set_user_attr("pgid_leader", leader)
        tuner.searcher.recover_stale()
        assert groups[0].wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.2)
        assert groups[1].poll() is None and groups[2].poll() is None  # unrelated processes live on
        trials = study.get_trials()
        assert [(t.state, t.user_attrs["status"]) for t in trials] == [(TrialState.FAIL, "interrupted")] * 3
    finally:
        for g in groups:
            g.kill()
            g.wait()
