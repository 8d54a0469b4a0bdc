"""Failure kinds inside a study: each is recorded with its status and log tail, told to the sampler as
infeasible, and the study goes on to finish its budget."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from workbench.config import load_config
from workbench.tune.samplers import learning_view
from workbench.tune.study import load_study_spec
from workbench.tune import Tuner


def test_failures_are_recorded_and_the_study_goes_on(study_spec_file, tmp_path, fault_launch, capsys):
    # micro_batch_size 2..8 with a global batch of 8: 3 is in the range but rejected by the config
    path = study_spec_file("fail", space={"micro_batch_size": {"low": 2, "high": 8}}, trials=4,
                           protocol={"baseline_repeats": 1, "top_k": 0, "heartbeat_timeout_s": 5})
    spec = load_study_spec(str(path))
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False,
                  launch=fault_launch({"1": "crash", "2": "hang"}))
    study = tuner.open()
    for mbs in (3, 4, 4, 8):
        study.enqueue_trial({"micro_batch_size": mbs})
    tuner.run()

    trials = {t.number: t for t in study.get_trials()}
    assert len(trials) == 4

    invalid = trials[0]
    # Optuna's own states: a failed config is FAIL (its kind in its attributes), so Optuna's tools do not read a
    # failure as a measurement; the samplers learn it as infeasible through their view of the study
    assert invalid.state == TrialState.FAIL and invalid.values is None
    assert invalid.user_attrs["status"] == "invalid_config"
    assert "global_batch_size" in invalid.user_attrs["failure_reason"]
    assert "rejected before launch" in invalid.user_attrs["log_tail"]
    assert not (tmp_path / "runs" / "fail" / "trials" / "0" / "metrics.jsonl").exists()  # never launched

    crash = trials[1]
    assert crash.user_attrs["status"] == "crash" and "deliberate crash" in crash.user_attrs["log_tail"]

    hang = trials[2]
    assert hang.user_attrs["status"] == "timeout"
    assert "no step for 5 s" in hang.user_attrs["failure_reason"]

    for t in (invalid, crash, hang):  # infeasible for the constraint-aware samplers
        assert t.state == TrialState.FAIL and t.user_attrs["constraint"] == [1.0, 0.0, 0.0]
        # both forms: Optuna 5's named keys, and the list optuna-dashboard reads (Optuna names it 0, 1, 2)
        assert t.constraints == {"failed": 1.0, "memory": 0.0, "finite_loss": 0.0, "0": 1.0, "1": 0.0, "2": 0.0}
    view, _ = learning_view(study, optuna.trial.create_trial(state=TrialState.RUNNING))  # the next trial's view
    learned = dict(enumerate(view))  # the view holds every trial here, in order (copies are unnumbered)
    assert all(learned[n].state == TrialState.COMPLETE and learned[n].values == [0.0]
               and learned[n].constraints == {"failed": 1.0, "memory": 0.0, "finite_loss": 0.0} for n in (0, 1, 2))

    ok = trials[3]
    assert ok.state == TrialState.COMPLETE and ok.user_attrs["status"] == "ok" and ok.values[0] > 0
    assert ok.constraints == {"failed": 0.0, "memory": 0.0, "finite_loss": 0.0, "0": 0.0, "1": 0.0, "2": 0.0}
    assert learned[3].constraints == {"failed": 0.0, "memory": 0.0, "finite_loss": 0.0}  # the samplers see names
    assert ok.user_attrs["phase/forward_s"] > 0 and ok.user_attrs["throughput/real_tokens_per_s_per_gpu"] > 0
    assert study.metric_names == ["throughput/real_tokens_per_s_per_gpu"]
    assert study.best_trial.number == 3  # chosen among feasible trials only

    # top_k 0: nothing validated, so the base config is exported and provenance says so
    cfg = load_config(tmp_path / "runs" / "fail" / "config.yaml")
    assert cfg.provenance.trial is None and cfg.provenance.significant is False
    assert cfg.data.micro_batch_size == 4
    err = capsys.readouterr().err
    assert "trial 1: crash" in err and "trial 2: timeout" in err


def test_a_trial_killed_from_outside_is_run_once_more(study_spec_file, tmp_path, subprocess_env):
    """SIGKILL of a real training trial's process from outside, with no OOM behind it: the tuner keeps the first
    attempt as trials/0.killed, runs the trial again, and records the result of the second attempt."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna

    path = study_spec_file("ext", space={"micro_batch_size": {"choices": [4]}}, trials=1,
                           protocol={"baseline_repeats": 1, "top_k": 0})
    url = f"sqlite:///{(tmp_path / 'runs' / 'ext' / 'study.db').resolve()}"
    proc = subprocess.Popen([sys.executable, "-m", "workbench.tune", "--study", str(path), "--out", "runs",
                             "--no-progress", "--no-report"], env=subprocess_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    heartbeat = tmp_path / "runs" / "ext" / "trials" / "0" / "heartbeat"
    end = time.monotonic() + 240
    pgid = None
    while pgid is None and time.monotonic() < end:  # the trial reports (0 at its start), its pgid is stored
        assert proc.poll() is None, proc.communicate()
        # the child writes heartbeat 0 before it imports torch, so it may come before the tuner stores the pgid
        if heartbeat.exists():
            pgid = optuna.load_study(study_name="ext", storage=url).trials[0].user_attrs.get("pgid")
        time.sleep(0.2)
    assert pgid is not None, "the trial did not start within 240 s"
    os.kill(pgid, signal.SIGKILL)  # the train process (it leads its group), from outside
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (t,) = optuna.load_study(study_name="ext", storage=url).get_trials()
    assert t.user_attrs["status"] == "ok" and t.values[0] > 0, t.user_attrs.get("failure_reason")
    assert "killed by SIGKILL from outside" in t.user_attrs["rerun"]["reason"]
    assert (tmp_path / "runs" / "ext" / "trials" / "0.killed" / "log.txt").exists()
    assert "running it once more before blaming its config" in err
