"""Tuner bookkeeping without running trials: dropped knobs, the exact budget across workers, spec
mismatches, storage URLs, CLI errors, the fallback report."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

import workbench.tune.opening as tune
from workbench.tune import storage
from workbench.tune.records import Sessions, write_tune_json
from workbench.tune.study import load_study_spec
from workbench.tune import TuneError, Tuner, normalize_storage_url

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")


def test_knobs_the_hardware_cannot_use_are_dropped_and_recorded(study_spec_file, tmp_path, monkeypatch):
    base = {"training": {"global_batch_size": 8}, "hardware": {"device": "auto"}}
    spec = load_study_spec(str(study_spec_file(
        "drop", base=base, space={"micro_batch_size": {"choices": [2, 8]}, "graph_capture": {"choices": [False, True]},
                                  "expandable_segments": {"choices": [False, True]}})))
    monkeypatch.setattr(tune, "detect_capabilities", lambda gpus: frozenset({"io_uring"}))
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False)
    study = tuner.open()
    assert tuner.session.active == ["micro_batch_size"]
    assert tuner.session.dropped == [{"knob": "graph_capture", "reason": "needs cuda"},
                             {"knob": "expandable_segments", "reason": "needs cuda"}]
    assert study.user_attrs["dropped_knobs"] == tuner.session.dropped
    write_tune_json(tuner.session, Sessions(tuner.study_dir, tuner.study_name), "2026-01-01T00:00:00+00:00", None)
    data = json.loads((tmp_path / "runs" / "drop" / "tune.json").read_text())
    assert data["dropped_knobs"] == tuner.session.dropped and data["hardware"]["capabilities"] == ["io_uring"]
    # the versions the trials run with, for results written without the export's fingerprint
    assert data["hardware"]["versions"] == {"torch": torch.__version__, "triton": importlib.metadata.version("triton"),
                                            "cuda": torch.version.cuda}
    # the sampler only ever sees the kept knobs
    trial = study.ask()
    assert set(tuner.searcher.sample(trial)) == {"micro_batch_size"}


def test_the_budget_is_exact_across_workers(study_spec_file, tmp_path, monkeypatch):
    spec = load_study_spec(str(study_spec_file("budget", trials=1)))
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, worker=True)
    study = tuner.open()
    other = study.ask()  # another machine's worker holds the only trial of the budget
    other.set_user_attr("worker", {"host": "elsewhere", "pid": 1, "start": None, "role": "worker"})
    # this worker raced past its budget check (the other's trial did not exist yet) and asks anyway
    monkeypatch.setattr(tuner.searcher, "counts", lambda: (0, 0, 0))
    tuner.search()
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.RUNNING, TrialState.FAIL]
    assert trials[1].user_attrs["status"] == "skipped_budget"
    assert not (tmp_path / "runs" / "budget" / "trials").exists()  # nothing launched


def test_a_changed_spec_is_refused_on_resume_once_measured(study_spec_file, tmp_path):
    study = Tuner(load_study_spec(str(study_spec_file("same"))), out_root=tmp_path / "runs", progress=False).open()
    study.set_user_attr("baseline_runs", [1000.0])  # one baseline run measured
    changed = load_study_spec(str(study_spec_file("same", protocol={"windows": 5})))
    with pytest.raises(TuneError, match="different spec .*protocol.*1 measurement.*pass --reset"):
        Tuner(changed, out_root=tmp_path / "runs", progress=False).open()
    # a bigger budget is not a different study
    Tuner(load_study_spec(str(study_spec_file("same", trials=9))), out_root=tmp_path / "runs", progress=False).open()


def test_a_study_with_nothing_measured_is_fixed_in_place(study_spec_file, tmp_path, capsys):
    """Issue 40: a first run that failed (a refused model, a wrong data folder) left a study nothing was measured
    in, and the corrected spec was refused ("delete runs/mix"). It starts over in the same folder."""
    first = Tuner(load_study_spec(str(study_spec_file("fix"))), out_root=tmp_path / "runs", progress=False)
    study = first.open()
    study.ask()  # the baseline's failure leaves a trial that never finished
    (first.study_dir / "baseline" / "0").mkdir(parents=True)
    (first.study_dir / "tune.json").write_text("{}")
    first.lease.release()
    fixed = Tuner(load_study_spec(str(study_spec_file("fix", protocol={"windows": 5}))), out_root=tmp_path / "runs",
                  progress=False)
    study = fixed.open()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs in: protocol" in err[0] and "nothing was measured in it" in err[0], err
    assert study.get_trials() == [] and study.user_attrs["spec"]["protocol"]["windows"] == 5
    assert sorted(p.name for p in fixed.study_dir.iterdir()) == ["study.db"]


def test_reset_asks_before_deleting_measurements(study_spec_file, tmp_path, subprocess_env):
    spec = load_study_spec(str(study_spec_file("again")))
    first = Tuner(spec, out_root=tmp_path / "runs", progress=False)
    study = first.open()
    study.set_user_attr("baseline_runs", [1000.0, 990.0])
    first.lease.release()
    asked: list[str] = []

    def refuse(question):
        asked.append(question)
        raise TuneError("not confirmed")
    with pytest.raises(TuneError, match="not confirmed"):
        Tuner(spec, out_root=tmp_path / "runs", progress=False, reset=refuse).open()
    assert "holds 2 measurement(s)" in asked[0]
    assert optuna.load_study(study_name="again", storage=first.storage_url).user_attrs["baseline_runs"]
    study = Tuner(spec, out_root=tmp_path / "runs", progress=False, reset=asked.append).open()
    assert len(asked) == 2 and "baseline_runs" not in study.user_attrs
    # the CLI, not on a terminal: --reset without --yes is refused in one line, naming --yes; the study is kept
    study.set_user_attr("baseline_runs", [1000.0])
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(study_spec_file("again")), "--out",
                        str(tmp_path / "runs"), "--reset", "--no-progress"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=120, cwd=tmp_path, env=subprocess_env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "pass --yes with --reset" in lines[0], p.stderr
    assert optuna.load_study(study_name="again", storage=first.storage_url).user_attrs["baseline_runs"] == [1000.0]


def test_storage_urls():
    url = "postgresql://u:p@h:5432/db"
    assert normalize_storage_url("postgres://u:p@h:5432/db").endswith("://u:p@h:5432/db")
    import importlib.util

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        assert normalize_storage_url(url) == "postgresql+psycopg2://u:p@h:5432/db"
    assert normalize_storage_url("sqlite:///x.db") == "sqlite:///x.db"
    assert storage.default_storage_url(Path("runs/s")).endswith("/runs/s/study.db")


@pytest.mark.parametrize("password", ["s3cret", "pa/ss", "p@ss", "pa/s@s:x"])
def test_a_password_is_masked_whatever_it_holds(password):
    """SQLAlchemy reads a password with '/' in it whole (issue 39: the mask left it visible); an unquoted '@' it
    cuts at, but the mask hides up to the last '@' all the same, more rather than less."""
    import sqlalchemy.engine

    url = f"postgresql+psycopg2://u:{password}@h:5432/db?sslmode=require"
    if "@" not in password:
        assert sqlalchemy.engine.make_url(url).password == password
    shown = storage.mask_url(url)
    assert shown == "postgresql+psycopg2://u:***@h:5432/db?sslmode=require" and password not in shown
    assert storage.mask_url("postgresql://h/db?user=u&password=s3/cr@t") == "postgresql://h/db?user=u&password=***"


def test_the_start_over_line_masks_the_storage_password(study_spec_file, tmp_path, capsys, monkeypatch):
    """A study started over in place names its storage without the password (it is printed, and a TuneError's text
    may be logged)."""
    first = Tuner(load_study_spec(str(study_spec_file("pw"))), out_root=tmp_path / "runs", progress=False)
    first.open()
    first.lease.release()
    fixed = Tuner(load_study_spec(str(study_spec_file("pw", protocol={"windows": 5}))), out_root=tmp_path / "runs",
                  progress=False)
    monkeypatch.setattr(fixed, "storage_shown", "sqlite:///masked-for-the-test")  # stands in for mask_url's output
    fixed.open()
    err = capsys.readouterr().err
    assert "masked-for-the-test" in err and str(fixed.storage_url) not in err


def test_bad_storage_urls_are_clear_errors(monkeypatch):
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match=r"^--storage: 'not a url' is not a database URL"):
        storage.make_storage("not a url")
    with pytest.raises(ConfigError, match=r"^--storage: bogus://x: no database driver for this URL"):
        storage.make_storage("bogus://x")
    # a server that refuses: retried (the schema race), then one line naming the URL without its password
    import importlib.util
    import socket

    if importlib.util.find_spec("psycopg2") is None:
        pytest.skip("psycopg2 is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: connections are refused
    sleeps = []
    monkeypatch.setattr(storage.time, "sleep", sleeps.append)
    with pytest.raises(TuneError) as e:
        storage.make_storage(f"postgresql://u:secret@127.0.0.1:{port}/db")
    assert str(e.value).startswith(f"cannot open the study storage postgresql+psycopg2://u:***@127.0.0.1:{port}/db "
                                   "after 5 attempts: ")
    assert "secret" not in str(e.value) and len(sleeps) == 4


def test_cli_errors_are_clear(tmp_path, subprocess_env):
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", "nope", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "unknown study 'nope'" in p.stderr and "tiny-cpu" in p.stderr
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "export", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=120)
    assert p.returncode == 1 and "no study at" in p.stderr
    for name in ("../escaped", str(tmp_path / "abs"), "a/b", ".."):  # a name must be one folder inside --out
        p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study-name", name, "--trials", "1",
                            "--out", str(tmp_path / "out"), "--no-progress"],
                           capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=120)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and f"--study-name {name!r}" in lines[0], p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == []  # nothing written, inside --out or beside it


def test_a_failing_report_is_one_line_and_loses_nothing(study_spec_file, tmp_path, capsys):
    spec = load_study_spec(str(study_spec_file("rep")))

    def broken(*args, **kwargs):
        raise RuntimeError("not today")

    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=broken)
    study = tuner.open()
    t = study.ask()
    tuner.searcher.sample(t)
    study.tell(t, [1.0])
    assert tuner.build_report() is None
    err = capsys.readouterr().err
    assert "report.html not built (RuntimeError: not today)" in err
    assert f"python -m workbench.tune report --study-name rep --out {tmp_path / 'runs'}" in err
    assert not (tuner.study_dir / "report.html").exists()
    assert optuna.load_study(study_name="rep", storage=tuner.storage_url).trials[0].values == [1.0]


def test_no_secret_is_written_and_files_follow_the_umask(tmp_path):
    """A storage password and a trainer.env value that is not listed in safe_env appear in no file of the study's
    folder but the storage itself (workers read the spec, env included, from it); tune.json, the exported config
    and report.html get the umask's mode, not a fixed 0644."""
    from reports import build_report
    from workbench.tune.export import export_config
    from workbench.tune.result import build_result
    from workbench.tune.study import spec_from_dict

    spec = spec_from_dict({
        "name": "secret", "model": "tiny", "space": {"micro_batch_size": {"choices": [2, 8]}},
        "trainer": {"command": ["python", "train.py"], "env": {"API_TOKEN": "TOKSECRET", "LOG_LEVEL": "debug"},
                    "safe_env": ["LOG_LEVEL"]}}, base_dir=tmp_path)
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False)
    tuner.open()
    sqlite_url = tuner.storage_url
    tuner.session.storage_url = "postgresql://tuner:PGSECRET@db.example:5432/studies"  # a shared study's URL
    old = os.umask(0o077)
    try:
        write_tune_json(tuner.session, Sessions(tuner.study_dir, "secret"), "2026-01-01T00:00:00+00:00", None)
        report = build_report(tuner.study_dir, sqlite_url, "secret")
        result = build_result({"candidates": [], "winner": {"trial": None, "significant": False}}, study="secret",
                              base_values=spec.base_knob_values(), baseline_repeats=[80.0], searched=list(spec.space),
                              budget={"trials": 1}, data={"source": "synthetic"}, commit=None)
        exported = export_config(spec, tuner.study_dir, result, fingerprint={"torch": "x"})
    finally:
        os.umask(old)
    tune_json = json.loads((tuner.study_dir / "tune.json").read_text())
    assert tune_json["storage_url"] == "postgresql://tuner:***@db.example:5432/studies"
    assert tune_json["spec"]["trainer"]["env"] == {"API_TOKEN": "<set>", "LOG_LEVEL": "debug"}
    for path in tuner.study_dir.rglob("*"):
        if path.is_file() and path.name != "study.db":
            data = path.read_bytes()
            assert b"PGSECRET" not in data and b"TOKSECRET" not in data, path
    for path in (tuner.study_dir / "tune.json", report, exported):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_the_trust_prompt_shows_control_characters_escaped(tmp_path, subprocess_env):
    """A trainer command from a file outside the working directory is shown before it runs with CR and ESC
    escaped (a terminal would hide what comes before them), and one holding them is refused unless --yes."""
    import yaml

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work").mkdir()
    spec = tmp_path / "elsewhere" / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "spoof", "model": "tiny", "space": {"micro_batch_size": {"choices": [2, 8]}},
        "trainer": {"command": ["sh", "-c", "touch pwned\r\x1b[2Kpython train.py"]}}))
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", str(tmp_path / "o"),
                        "--no-progress"], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path / "work",
                       stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "\r" not in p.stderr and "\x1b" not in p.stderr, p.stderr
    assert "touch pwned\\r\\x1b[2Kpython train.py" in p.stderr and "holds control characters" in p.stderr
    assert not (tmp_path / "work" / "pwned").exists() and not (tmp_path / "elsewhere" / "pwned").exists()


def test_export_by_the_name_of_ones_own_study(study_spec_file, tmp_path, subprocess_env):
    """Issue 40: ``export --study my-tiny`` said "unknown study 'my-tiny'; built-in studies: ..." for a study of
    one's own under --out; the README shows that form. The name finds the study and its stored spec."""
    spec_path = study_spec_file("my-tiny")
    tuner = Tuner(load_study_spec(str(spec_path)), out_root=tmp_path / "runs", progress=False)
    tuner.open().set_user_attr("baseline_runs", [1000.0])
    tuner.lease.release()
    spec_path.unlink()  # the name alone, not the file
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "export", "--study", "my-tiny", "--out", "runs"],
                       capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "runs" / "my-tiny" / "config.yaml").is_file()
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "export", "--study", "not-mine", "--out", "runs"],
                       capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "unknown study 'not-mine'" in p.stderr


def test_seed_flag_starts_another_search_of_the_same_space(study_spec_file, tmp_path, capsys):
    """--seed replaces the spec's sampler.seed: the study stores it, and the first proposal of seed 1 is the one
    a sampler seeded 1 makes, not seed 0's. A stored study does not take another seed on resume, and a bad seed is
    refused before anything is written."""
    from workbench.tune.__main__ import _resolve_spec, main, parse_args

    spec_file = study_spec_file("seeded", space={"micro_batch_size": {"choices": [1, 2, 4, 8]},
                                                 "bucket_width": {"choices": [32, 64, 128, 256]}})
    firsts = {}
    for seed in (0, 1, 2, 3):
        spec = _resolve_spec(parse_args(["--study", str(spec_file), "--seed", str(seed)]))
        assert spec.sampler.seed == seed
        tuner = Tuner(spec, study_name=f"s{seed}", out_root=tmp_path / "runs", progress=False)
        study = tuner.open()
        assert study.user_attrs["spec"]["sampler"]["seed"] == seed
        firsts[seed] = tuple(sorted(tuner.searcher.sample(study.ask()).items()))
    assert len(set(firsts.values())) > 1  # 16 configs: four seeds do not all draw the same first one
    assert _resolve_spec(parse_args(["--study", str(spec_file)])).sampler.seed == load_study_spec(
        str(spec_file)).sampler.seed
    with pytest.raises(SystemExit):
        parse_args(["--study", str(spec_file), "--seed", "-1"])
    # a study under --out, resumed by its name, keeps the seed it holds
    assert main(["--study", "s1", "--seed", "5", "--out", str(tmp_path / "runs"), "--no-progress"]) == 1
    assert "--seed 5: study 's1' resumes with the spec it holds" in capsys.readouterr().err
