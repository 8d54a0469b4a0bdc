"""Two tuner processes (coordinator + --worker) share one study through PostgreSQL and finish the budget
with no trial lost or run twice. Needs $WORKBENCH_TEST_PG_URL (scripts/services.sh starts a server)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from workbench.tune import normalize_storage_url

@pytest.mark.postgres
def test_two_workers_share_one_study(pg_url, study_spec_file, tmp_path, subprocess_env):
    name = f"pg-{uuid.uuid4().hex[:8]}"
    budget = 4
    spec = study_spec_file(name, trials=budget, protocol={"baseline_repeats": 1, "top_k": 0})
    out = tmp_path / "runs"
    common = ["--storage", pg_url, "--study-name", name, "--out", str(out), "--no-progress", "--no-report"]
    kw = dict(env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    coordinator = subprocess.Popen([sys.executable, "-m", "workbench.tune", "--study", str(spec), *common], **kw)
    worker = subprocess.Popen([sys.executable, "-m", "workbench.tune", "--worker", *common], **kw)  # spec from the DB
    try:
        w_out, w_err = worker.communicate(timeout=600)
        c_out, c_err = coordinator.communicate(timeout=600)
    finally:
        for p in (worker, coordinator):
            if p.poll() is None:
                p.kill()
    assert worker.returncode == 0, w_err
    assert coordinator.returncode == 0, c_err
    try:
        url = normalize_storage_url(pg_url)  # plain postgresql:// means psycopg 3 to SQLAlchemy 2.1
        study = optuna.load_study(study_name=name, storage=url)
        trials = study.get_trials()
        numbers = [t.number for t in trials]
        assert len(numbers) == len(set(numbers))  # each trial number once
        finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        counted = [t for t in finished if not t.user_attrs.get("free_repeat")]  # a repeat replaced: no budget
        assert len(counted) == budget
        assert not [t for t in trials if t.state == TrialState.RUNNING]
        for t in trials:  # the only FAILs allowed: the over-budget asks of the losing process
            if t.state == TrialState.FAIL:
                assert t.user_attrs["status"] == "skipped_budget"
                assert not (out / name / "trials" / str(t.number)).exists()
        roles = set()
        for t in finished:  # a config the sampler asks for again reuses its first trial's result and folder
            tdir = out / name / "trials" / str(t.user_attrs.get("duplicate_of", t.number))
            assert t.user_attrs["trial_dir"] == str(tdir)
            assert t.user_attrs["status"] == "ok" and (tdir / "summary.json").exists(), t.user_attrs
            log = (tdir / "log.txt").read_text()
            assert log.count("$ ") == 1  # launched exactly once
            roles.add(t.user_attrs["worker"]["role"])
        assert roles == {"coordinator", "worker"}, roles  # both shared the work
        assert json.loads((out / name / "validation.json").read_text())["winner"]["trial"] is None
    finally:
        optuna.delete_study(study_name=name, storage=normalize_storage_url(pg_url))
