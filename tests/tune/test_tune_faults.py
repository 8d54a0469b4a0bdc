"""Filesystem and storage faults of the tuner CLI end in one line naming the path and what to do, exit 2 (the
traceback only with --debug), and a trial the fault interrupted is not left RUNNING."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from workbench.tune.samplers import infeasible


def _tune(tmp_path, env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "workbench.tune", "--no-progress", "--no-report", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_out_that_is_not_a_writable_directory(tmp_path, subprocess_env, study_spec_file):
    spec = study_spec_file("f", trials=1)
    (tmp_path / "afile").write_text("x")
    r = _tune(tmp_path, subprocess_env, "--study", str(spec), "--out", "afile")
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert f"{tmp_path / 'afile' / 'f'}: Not a directory; the study's files go under --out 'afile'" in line
    r = _tune(tmp_path, subprocess_env, "--study", str(spec), "--out", "/proc/no-such-dir/runs")
    assert r.returncode == 2 and "/proc/no-such-dir" in _one_line(r.stderr)
    r = _tune(tmp_path, subprocess_env, "--study", str(spec), "--out", "afile", "--debug")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" in r.stderr


@pytest.mark.parametrize("damage", ["garbage", "malformed", "middle"])
def test_a_damaged_study_db_is_named(tmp_path, subprocess_env, study_spec_file, damage):
    """A damaged study.db is checked read-only before anything writes to it: one line naming the study's own
    file (not one named after the spec file), exit 2, the file's bytes unchanged."""
    spec = study_spec_file("f", trials=1).rename(tmp_path / "other-name.yaml")
    db = tmp_path / "runs" / "f" / "study.db"
    db.parent.mkdir(parents=True)
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    else:  # a real SQLite file whose pages after the header were overwritten
        con = sqlite3.connect(db)
        con.executescript("CREATE TABLE studies (x); " + "".join(f"INSERT INTO studies VALUES ({i});"
                                                                  for i in range(2000)))
        con.close()
        data = bytearray(db.read_bytes())
        if damage == "malformed":
            data[100:4096 * 3] = b"\xff" * (4096 * 3 - 100)
        else:  # one page in the middle: the header and the schema still read
            assert len(data) >= 4096 * 6
            data[4096 * 3:4096 * 4] = b"\xff" * 4096
        db.write_bytes(bytes(data))
    before = db.read_bytes()
    r = _tune(tmp_path, subprocess_env, "--study", str(spec))
    assert db.read_bytes() == before and not list(db.parent.glob("study.db-*"))
    assert r.returncode == 2
    line = _one_line(r.stderr)
    assert line.startswith(f"error: {db}: the study storage cannot be used (") and "move it aside" in line


@pytest.mark.parametrize("version, advice", [("v2.4.0.a", "run `optuna storage upgrade"),
                                             ("v99.0.0.z", "use the newer optuna that wrote it")])
def test_a_study_db_of_another_optuna_schema_is_one_line(tmp_path, subprocess_env, study_spec_file, version, advice):
    """Issue 39: a study.db whose table schema is older or newer than this optuna's was a RuntimeError traceback.
    One line names the storage (the study's own file, under a spec file of another name) and what to do, exit 2."""
    from workbench.tune.storage import make_storage

    spec = study_spec_file("v", trials=1).rename(tmp_path / "other-name.yaml")
    db = tmp_path / "runs" / "v" / "study.db"
    db.parent.mkdir(parents=True)
    make_storage(f"sqlite:///{db}").engine.dispose()  # a current schema, then stamped as another version's
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = ?", (version,))
    con.commit()
    con.close()
    r = _tune(tmp_path, subprocess_env, "--study", str(spec))
    assert r.returncode == 2, r.stderr[-2000:]
    line = _one_line(r.stderr)
    assert line.startswith(f"error: --storage: sqlite:///{db}: The runtime optuna version") and advice in line, line


def test_trials_folder_lost_mid_study(tmp_path, subprocess_env, study_spec_file):
    """The trials/ folder is replaced by a file while the study runs: the tuner stops with one line naming the
    path, and the trial it was starting is FAIL (interrupted: re-run on resume), not RUNNING."""
    spec = study_spec_file("lost", trials=3, protocol={"baseline_repeats": 1, "top_k": 0})
    proc = subprocess.Popen([sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs",
                             "--no-progress", "--no-report"], cwd=tmp_path, env=subprocess_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials = tmp_path / "runs" / "lost" / "trials"
    end = time.monotonic() + 240
    while not (trials / "0" / "heartbeat").exists() and time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    # a rename is atomic; removing the folder in place races the trial still writing into it (ENOTEMPTY)
    trials.rename(tmp_path / "trials.gone")
    trials.write_text("not a folder any more")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    line = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(line) == 1 and str(trials) in line[0] and "Not a directory" in line[0], err
    assert "Traceback" not in err
    study = optuna.load_study(study_name="lost", storage=f"sqlite:///{tmp_path / 'runs' / 'lost' / 'study.db'}")
    states = [t.state for t in study.get_trials()]
    assert TrialState.RUNNING not in states and TrialState.FAIL in states, states
    # the trial it was starting is FAIL/interrupted; a trial whose folder vanished under it may have failed too
    stopped = [t for t in study.get_trials() if t.state == TrialState.FAIL and not infeasible(t)]
    assert stopped and all(t.user_attrs["status"] == "interrupted"
                           and "the tuner stopped" in t.user_attrs["failure_reason"] for t in stopped)


def test_a_read_only_out_is_one_line(tmp_path, monkeypatch, capsys, study_spec_file):
    """A read-only --out (EACCES; root ignores mode bits, so the denial is injected where the study folder is
    made): one line naming the path, exit 2."""
    import errno
    import os
    from pathlib import Path

    from workbench.tune.__main__ import main as tune_main

    spec = study_spec_file("ro", trials=1)
    ro = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):
        if str(self).startswith(str(ro)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert tune_main(["--study", str(spec), "--out", str(ro), "--no-progress", "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {ro / 'ro'}: Permission denied; the study's files go under --out {str(ro)!r}: give a "
                   "writable directory (rerun with --debug for the traceback)"]
