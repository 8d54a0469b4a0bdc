"""One coordinator per study, through a lease in the study's storage: a second coordinator started mid-search
or at the same moment refuses with one line naming the first (its pid and host), and never measures into the
first one's folders; a stale lease (its process gone, or its heartbeat too old) is taken over."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import optuna
import pandas as pd
import pytest

import workbench.tune.lease as lease_mod
from workbench.tune.study import load_study_spec
from workbench.tune import LEASE_ATTR, TuneError, Tuner, make_storage


def _cmd(spec):
    return [sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs", "--no-progress",
            "--no-report"]


def _refusal(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_second_coordinator_mid_search_is_refused(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("one", trials=2, protocol={"baseline_repeats": 1, "top_k": 0})
    run = dict(env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen(_cmd(spec), **run)
    baseline = tmp_path / "runs" / "one" / "baseline" / "0" / "heartbeat"
    end = time.monotonic() + 240
    while not baseline.exists() and time.monotonic() < end:  # the first one is measuring its baseline
        assert first.poll() is None, first.communicate()
        time.sleep(0.2)
    second = subprocess.run(_cmd(spec), timeout=120, **run)
    assert second.returncode == 1
    line = _refusal(second.stderr)
    assert f"already has a coordinator: pid {first.pid} on {socket.gethostname()}" in line and "--worker" in line
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    study = optuna.load_study(study_name="one", storage=f"sqlite:///{tmp_path / 'runs' / 'one' / 'study.db'}")
    assert study.user_attrs[LEASE_ATTR] is None  # released at the end
    assert len(study.user_attrs["baseline_runs"]) == 1 and len(study.get_trials()) == 2
    steps = pd.read_csv(tmp_path / "runs" / "one" / "baseline" / "0" / "phases.csv")["step"].tolist()
    assert steps == list(range(1, len(steps) + 1))  # one writer: no interleaved steps


def test_two_coordinators_started_at_once_one_runs(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("two", trials=1, protocol={"baseline_repeats": 1, "top_k": 0})
    run = dict(env=subprocess_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [subprocess.Popen(_cmd(spec), **run) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = next(o for p, o in zip(procs, outs) if p.returncode == 1)
    assert "already has a coordinator: pid" in _refusal(loser[1])


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_of_swaps_from_the_same_lease_one_is_written(db, tmp_path, request):
    """The lease's compare-and-set: each writer expects the lease it read. Of 8 threads that swap from the same
    lease at once (an INSERT where there was none, then an UPDATE), exactly one writes; a heartbeat that expects
    the lease as written goes on."""
    url = request.getfixturevalue("pg_url") if db == "postgres" else f"sqlite:///{tmp_path / 's.db'}"
    storage = make_storage(url)
    name = f"lease-{uuid.uuid4().hex[:8]}"
    optuna.create_study(storage=storage, study_name=name)
    study_id = storage.get_study_id_from_name(name)
    try:
        assert lease_mod.read_lease(storage, study_id) is None
        for round_ in range(2):
            stored = lease_mod.read_lease(storage, study_id)
            start = threading.Barrier(8)

            # (a token of its own each: a swap that writes the text it expects changes nothing, and the next
            # writer that expects it would match it too)
            def swap(i, stored=stored, start=start, round_=round_):
                start.wait()
                return lease_mod.swap_lease(storage, study_id, stored, {"token": f"{round_}-{i}"})

            with ThreadPoolExecutor(8) as pool:
                written = [w for w in pool.map(swap, range(8)) if w is not None]
            assert len(written) == 1 and lease_mod.read_lease(storage, study_id) == written[0]
        assert lease_mod.swap_lease(storage, study_id, stored, {"token": "late"}) is None
        beat = lease_mod.swap_lease(storage, study_id, written[0], {**json.loads(written[0]), "heartbeat": 1.0})
        assert beat is not None and optuna.load_study(study_name=name, storage=storage).user_attrs[LEASE_ATTR] \
            == {**json.loads(written[0]), "heartbeat": 1.0}
    finally:
        optuna.delete_study(study_name=name, storage=storage)


def test_a_stale_lease_is_taken_over_and_a_live_one_refused(study_spec_file, tmp_path):
    spec = load_study_spec(str(study_spec_file("stale", trials=1)))
    first = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False)
    study = first.open()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for lease, live in (
        ({"host": socket.gethostname(), "pid": dead.pid, "start": None, "heartbeat": time.time()}, False),
        ({"host": "elsewhere", "pid": 4242, "start": None, "heartbeat": time.time() - 120}, False),
        ({"host": "elsewhere", "pid": 4242, "start": None, "heartbeat": time.time()}, True),
    ):
        study.set_user_attr(LEASE_ATTR, {**lease, "token": "other"})
        tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False)
        tuner.lease.token = "new"  # another process's token (the pid is this test's)
        if live:
            with pytest.raises(TuneError, match=r"already has a coordinator: pid 4242 on elsewhere \(heartbeat "
                                                r"\d+ s ago\); start this one with --worker"):
                tuner.open()
        else:
            tuner.open()
            assert study.user_attrs[LEASE_ATTR]["token"] == "new"
            tuner.lease.release()


@pytest.mark.parametrize("written, holder", [
    ({"host": "elsewhere", "pid": 4242, "token": "other"}, "pid 4242 on elsewhere"),
    (None, "pid None on None"),
])
def test_a_heartbeat_that_finds_another_lease_stops_the_coordinator(study_spec_file, tmp_path, monkeypatch,
                                                                   written, holder):
    """The heartbeat's swap expects the lease it wrote last: another coordinator's lease, or none (null, released
    by hand), fails it, and the coordinator stops at its next check."""
    monkeypatch.setattr(lease_mod, "LEASE_HEARTBEAT_S", 0.05)
    spec = load_study_spec(str(study_spec_file("gone", trials=1)))
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False)
    study = tuner.open()
    tuner.lease.check()  # its own beats go on
    time.sleep(0.2)
    tuner.lease.check()
    study.set_user_attr(LEASE_ATTR, written and {**written, "heartbeat": time.time()})
    end = time.monotonic() + 10
    while tuner.lease.lost is None and time.monotonic() < end:
        time.sleep(0.05)
    with pytest.raises(TuneError, match=f"another coordinator took the lease over \\({holder}"):
        tuner.lease.check()
    tuner.lease.release()
    assert study.user_attrs[LEASE_ATTR] == (written and {**written, "heartbeat": pytest.approx(time.time(), abs=15)})


def test_measurements_go_through_attempt_folders(study_spec_file, tmp_path):
    """A coordinator measures into its own .<name>.<attempt> folder and moves it into place only while it holds
    the study: one whose lease was taken over keeps nothing, and the next holder removes what it left."""
    spec = load_study_spec(str(study_spec_file("att", trials=1, protocol={"baseline_repeats": 1, "top_k": 0})))
    tuner = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False)
    tuner.open()
    base = tmp_path / "runs" / "att" / "baseline"
    tuner.lease.lost = "pid 4242 on elsewhere (heartbeat 0 s ago)"
    with pytest.raises(TuneError, match="another coordinator took the lease over"):
        tuner.measurer.measure(spec.measured_base_config(), base / "0", "baseline", "baseline")
    assert not (base / "0").exists() and [p.name for p in base.iterdir()] == [f".0.{tuner.attempt_id}"]
    tuner.lease.release()
    nxt = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=False)
    nxt.run()
    assert [p.name for p in base.iterdir()] == ["0"]  # the dead attempt removed, the finished run in place
    assert (base / "0" / "summary.json").exists()
