"""Compile-ahead (workbench/tune/ahead.py, issue 38): the next trial is asked while the current one runs, its config
compiled by a shallow twin (``python -m workbench.train --compile-only --blocks K``) whose cache the trial then
reads, within the trial budget, and with the asked-ahead trial accounted for when the search ends or is stopped.

The search tests replace the trial runner by a function of the config, as test_search_coverage.py does; the twin
tests run the real CLI on the tiny preset (CPU Inductor)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from workbench.config import load_config, merge_overrides, preset_config
from workbench.tune import Tuner
from workbench.tune.ahead import CompileAhead, Twin, graph_key, twin_blocks
from workbench.tune.budget import GpuBudget, gpu_seconds
from workbench.tune.records import compile_ahead_record
from workbench.tune.search import Search
from workbench.tune.study import load_study_spec
from workbench.tune.trial import TrialOutcome

SPACE = {"micro_batch_size": {"choices": [2, 8]}, "num_workers": {"choices": [0, 1]}}
CONFIGS = sorted(tuple(sorted(dict(zip(SPACE, v)).items()))
                 for v in itertools.product(*(r["choices"] for r in SPACE.values())))
COMPILED = {"loongforge": {"compute_domain": {"compile": "default"}}}


@pytest.fixture
def events(monkeypatch):
    """The search's runs and its twins' starts, waits and stops, in order; each run at a known speed."""
    seen: list[tuple] = []

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        seen.append(("run", trial.number))
        v = 1000.0 * trial.params["micro_batch_size"] + trial.params["num_workers"]
        if getattr(self, "interrupt_at", None) == trial.number:
            raise KeyboardInterrupt
        return TrialOutcome("ok", Path(tdir), windows=[v, v], value=v, summary={"measured_steps": 6})

    def start(self, number, cfg, beside, unpaid=""):
        if unpaid:
            seen.append(("skip", number))
            self.records[number] = {"status": "skipped", "reason": unpaid}
            return False
        seen.append(("start", number))
        self.records[number] = {"status": "done", "waited_s": 0.5}
        return True

    def wait(self, number, timeout_s, keep=(), beside=None):
        seen.append(("wait", number))
        return 0.5

    monkeypatch.setattr(Search, "run_search_trial", run)
    monkeypatch.setattr(CompileAhead, "start", start)
    monkeypatch.setattr(CompileAhead, "wait", wait)
    monkeypatch.setattr(CompileAhead, "stop", lambda self, number=None: seen.append(("stop",) if number is None
                                                                                  else ("stop", number)))
    return seen


def _tuner(path: Path, tmp_path: Path, **kw) -> Tuner:
    t = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, **kw)
    t.open()
    return t


def _spec(study_spec_file, name="ahead", trials=4, **protocol):
    return study_spec_file(name, space=SPACE, trials=trials, sampler={"name": "tpe", "seed": 0,
                                                                      "n_startup_trials": 1},
                           protocol={"compile_ahead": True, **protocol})


def test_each_trial_is_compiled_ahead_while_the_one_before_runs(study_spec_file, tmp_path, events):
    t = _tuner(_spec(study_spec_file), tmp_path)
    assert t.searcher.ahead is not None
    t.search()
    runs = [e[1] for e in events if e[0] == "run"]
    assert len(runs) == 4 and events[-1] == ("stop",)
    # every trial after the first was asked, and its twin started, before the trial ahead of it ran: a repeat the
    # sampler proposed was told at once, so the untried config queued in its place is the one compiled ahead
    for before, n in zip(runs, runs[1:]):
        assert events.index(("start", n)) < events.index(("run", before)) < events.index(("wait", n))
    assert not [e for e in events if e[0] == "start" and e[1] not in runs]  # none beyond the budget of 4
    assert sorted(tuple(sorted(x.params.items())) for x in t.study.get_trials()
                  if x.number in runs) == CONFIGS  # asked ahead, the 2x2 space is still covered once
    trials = [x for x in t.study.get_trials() if x.number in runs[1:]]
    assert [x.user_attrs.get("compile_ahead") for x in trials] == [{"status": "done", "waited_s": 0.5}] * 3
    assert all(x.user_attrs["wall_s"] == 0.5 for x in trials)  # the wait is the trial's device time
    rec = compile_ahead_record(t.study.get_trials())
    assert rec["asked_ahead"] == 3 and rec["twins"] == 3 and rec["finished"] == 3 and rec["waited_s"] == 1.5
    # with the space covered, a larger budget takes repeats (they count: nothing is left to try), none runs
    more = _tuner(_spec(study_spec_file, trials=6), tmp_path)
    more.search()
    assert len([e for e in events if e[0] == "run"]) == 4 and more.session.finished_count() == 6


def test_a_trial_asked_ahead_when_the_search_ends_is_not_run_and_not_counted(study_spec_file, tmp_path, events,
                                                                            monkeypatch):
    done = {"after": 2}
    monkeypatch.setattr(GpuBudget, "done", lambda self: sum(e[0] == "run" for e in events) >= done["after"])
    t = _tuner(_spec(study_spec_file, trials=6), tmp_path)
    t.search()
    assert [e for e in events if e[0] == "run"] == [("run", 0), ("run", 1)]
    dropped = [x for x in t.study.get_trials() if x.state == TrialState.FAIL]
    assert len(dropped) == 1 and dropped[0].user_attrs["status"] == "interrupted"
    dropped = dropped[0]
    assert ("start", dropped.number) in events and ("run", dropped.number) not in events
    assert "asked ahead" in dropped.user_attrs["failure_reason"]
    assert ("stop",) in events[events.index(("run", 1)):]  # its twin stopped
    assert t.session.finished_count() == 2  # no budget used
    # a later session runs its config (queued again, once) and the rest of the space
    done["after"] = 99
    again = _tuner(_spec(study_spec_file, trials=4), tmp_path)
    again.search()
    assert sorted({tuple(sorted(x.params.items())) for x in again.study.get_trials(states=(TrialState.COMPLETE,))}
                  ) == CONFIGS
    assert [x.params for x in again.study.get_trials() if x.user_attrs.get("requeue_of") == dropped.number] == \
        [dropped.params]


def test_ctrl_c_leaves_the_asked_ahead_trial_to_be_run_on_resume(study_spec_file, tmp_path, events, monkeypatch):
    monkeypatch.setattr(Search, "interrupt_at", 1, raising=False)
    spec = _spec(study_spec_file)
    t = _tuner(spec, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        t.search()
    stopped = {x.number: x for x in t.study.get_trials() if x.state == TrialState.FAIL}
    ahead = events[events.index(("run", 1)) - 1]  # the trial asked ahead as trial 1 started
    assert ahead[0] == "start" and set(stopped) == {1, ahead[1]}
    assert all(x.user_attrs["status"] == "interrupted" for x in stopped.values())
    t.lease.release()
    monkeypatch.setattr(Search, "interrupt_at", None, raising=False)
    again = _tuner(spec, tmp_path)
    again.search()
    ran = [e[1] for e in events if e[0] == "run"]
    # both stopped configs were queued again and measured; every config ran once (trial 1's run was cut)
    assert sorted(tuple(sorted(x.params.items())) for x in again.study.get_trials() if x.number in ran[2:]) == \
        sorted(set(CONFIGS) - {tuple(sorted(t.study.trials[0].params.items()))})


def _refuse_micro_batch_8(monkeypatch) -> None:
    """The memory model refuses micro-batch 8 by itself (the H200 study's trial 2: refused, no run)."""
    monkeypatch.setattr("workbench.tune.search.predicted_oom", lambda cfg, gib: (
        "the memory model predicts a peak of 150.0 GiB; not launched" if cfg.data.micro_batch_size == 8 else ""))


def test_a_proposal_the_memory_model_refuses_is_told_at_once_and_the_next_one_compiled_ahead(
        study_spec_file, tmp_path, events, monkeypatch, capsys):
    """On the H200 the trial asked ahead was one the memory model refused: its twin was skipped, it was refused
    without a run, and the trial after it compiled cold (88.6 s against ~21 s). Now ask_ahead tells a refused
    proposal there and asks again: the twin compiles the next config that runs."""
    _refuse_micro_batch_8(monkeypatch)
    t = _tuner(_spec(study_spec_file, name="refused"), tmp_path)
    for mb, nw in ((2, 0), (8, 0), (8, 1), (2, 1)):  # the proposals, in order
        t.study.enqueue_trial({"micro_batch_size": mb, "num_workers": nw})
    t.search()
    # trial 0 runs; as it starts, 1 and 2 are refused and 3 is asked and compiled ahead; the budget of 4 is full
    assert events == [("wait", 0), ("start", 3), ("run", 0), ("wait", 3), ("run", 3), ("stop",)]
    trials = t.study.get_trials()
    assert [x.state for x in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    for x in trials[1:3]:  # told oom without a run: no twin, no device time, the failed config counted
        assert x.user_attrs["status"] == "oom" and x.user_attrs["wall_s"] == 0
        assert x.user_attrs["failure_reason"].startswith("the memory model predicts") and "compile_ahead" not in \
            x.user_attrs
    assert trials[3].user_attrs["compile_ahead"] == {"status": "done", "waited_s": 0.5}
    assert gpu_seconds(t.session)["trials"] == 1.0 and t.session.finished_count() == 4  # the two waits, 0.5 s each
    err = capsys.readouterr().err
    assert "trial 1: oom (the memory model predicts" in err and "trial 2: oom (the memory model predicts" in err
    assert err.index("trial 2: oom") < err.index("trial 0: ")  # told while trial 0 ran


def test_once_twins_do_not_pay_the_trials_asked_ahead_get_none(study_spec_file, tmp_path, events, monkeypatch):
    """The search asks ``budget.twins_unpaid`` before each twin: where it gives a reason, the trial asked ahead
    gets no twin (its record says why) and compiles its graphs itself."""
    why = "twins do not pay here: trials waited a median 32.5 s for the 2 that finished, and a finished twin ..."
    judged = iter(["", why, why])
    monkeypatch.setattr("workbench.tune.search.twins_unpaid", lambda session: next(judged, why))
    t = _tuner(_spec(study_spec_file, name="unpaid"), tmp_path)
    for mb, nw in ((2, 0), (8, 0), (8, 1), (2, 1)):  # the proposals, in order
        t.study.enqueue_trial({"micro_batch_size": mb, "num_workers": nw})
    t.search()
    assert [e for e in events if e[0] in ("start", "skip")] == [("start", 1), ("skip", 2), ("skip", 3)]
    trials = t.study.get_trials()
    assert [x.user_attrs["compile_ahead"] for x in trials[2:]] == [{"status": "skipped", "reason": why}] * 2


def test_refusals_asked_ahead_do_not_take_more_than_the_trial_budget(study_spec_file, tmp_path, events,
                                                                     monkeypatch):
    _refuse_micro_batch_8(monkeypatch)
    t = _tuner(_spec(study_spec_file, name="refused2", trials=2), tmp_path)
    for mb, nw in ((2, 0), (8, 0), (2, 1)):
        t.study.enqueue_trial({"micro_batch_size": mb, "num_workers": nw})
    t.search()
    # trial 1, refused ahead, fills the budget of 2: nothing more is asked, no twin is started
    assert events == [("wait", 0), ("run", 0), ("stop",)]
    assert [x.state for x in t.study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert t.session.finished_count() == 2


def test_compile_ahead_is_on_by_default_only_where_a_gpu_waits(study_spec_file, tmp_path):
    t = _tuner(study_spec_file("off", space=SPACE, trials=1), tmp_path)
    assert t.searcher.ahead is None  # a CPU study, unset: off
    session = SimpleNamespace(spec=SimpleNamespace(protocol=SimpleNamespace(compile_ahead=None), trainer=None),
                              hardware={"capabilities": ["cuda"]})
    assert CompileAhead.enabled(session)
    session.spec.trainer = object()  # a loop of one's own has no --compile-only
    assert not CompileAhead.enabled(session)


def _gpu_cfg(**over):
    base = {"hardware.device": "cuda", "loongforge.compute_domain.compile": "default", "data.seq_len": 2048, **over}
    return merge_overrides(preset_config("gr00t-n1.6"), base)


def _gpu_session(tmp_path: Path, share_limit: float = 0.9, depth: int | None = 1) -> SimpleNamespace:
    return SimpleNamespace(hardware={"gpu_memory_gib": 139.8, "capabilities": ["cuda"]}, study_dir=tmp_path,
                           spec=SimpleNamespace(objective=SimpleNamespace(memory_share_limit=share_limit),
                                                protocol=SimpleNamespace(compile_ahead_depth=depth),
                                                model="gr00t-n1.6"),
                           child_env=lambda: {}, child_cwd=lambda: None)


def test_a_twin_starts_only_where_the_memory_model_fits_both(tmp_path):
    ahead = CompileAhead(_gpu_session(tmp_path))
    assert ahead.why_not(_gpu_cfg(), _gpu_cfg()) == ""  # micro-batch 8 beside micro-batch 8: ~60 GiB
    big = _gpu_cfg(**{"data.micro_batch_size": 22})  # 128 GiB: fits alone, not with a twin
    assert "GiB together" in ahead.why_not(_gpu_cfg(), big)
    assert ahead.why_not(_gpu_cfg(**{"loongforge.compute_domain.compile": "none"}), _gpu_cfg()) == \
        "nothing to compile"
    assert twin_blocks(_gpu_cfg(**{"training.activation_checkpointing": "selective",
                                   "training.activation_checkpointing_every": 4})) == 4
    assert twin_blocks(_gpu_cfg(**{"training.activation_checkpointing": "full"})) == 1


def test_a_shallow_twin_fills_the_cache_of_the_full_depth(tmp_path, subprocess_env):
    """The twin of a compiled tiny config (one block of four), started and waited for as the search does; the
    full run of the same config then compiles from the cache alone."""
    cfg = merge_overrides(preset_config("tiny"), {"loongforge.compute_domain.compile": "default",
                                                  "data.micro_batch_size": 2, "data.seq_len": 128,
                                                  "data.bucket_width": 128, "training.warmup_measure_steps": 1,
                                                  "training.log_every": 1})
    cache = tmp_path / "compile-cache"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    session = SimpleNamespace(study_dir=tmp_path / "study", hardware={}, child_env=lambda: env,
                              child_cwd=lambda: None,
                              spec=SimpleNamespace(protocol=SimpleNamespace(compile_ahead_depth=None)))
    ahead = CompileAhead(session)
    assert ahead.start(1, cfg, beside=cfg)
    assert ahead.wait(1, timeout_s=300) >= 0
    rec = ahead.record(1)
    assert rec["status"] == "done" and rec["blocks"] == 1, (session.study_dir / "ahead/1/log.txt").read_text()
    assert rec["time/compile_s"] > 0 and rec["compile/fx_graph_cache_miss"] > 0
    twin = json.loads((session.study_dir / "ahead/1/summary.json").read_text())
    full_dir = tmp_path / "full"
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config",
                        str(session.study_dir / "ahead/1/config.yaml"), "--synthetic", "--steps", "2",
                        "--no-prometheus", "--out", str(full_dir), "--summary", str(full_dir / "summary.json")],
                       env={**subprocess_env, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    full = json.loads((full_dir / "summary.json").read_text())
    assert full["model_params"] > twin["model_params"]  # four blocks against the twin's one
    assert full["compile/fx_graph_cache_miss"] == 0 and full["compile/fx_graph_cache_hit"] > 0


def test_a_vla_twin_is_held_to_what_a_feasible_trial_leaves(tmp_path, monkeypatch):
    """No memory model covers the VLA: its twin's allocator is capped at 1 - memory_share_limit less the margin
    (hardware.memory_fraction_limit of its config, which --blocks enforces), and with no share left it gets none."""
    vla = merge_overrides(preset_config("gr00t-n1.6-vla"), {"hardware.device": "cuda",
                                                            "loongforge.compute_domain.compile": "default",
                                                            "loongforge.compute_domain.graph_capture": "fwd_bwd"})
    launched = []

    class Proc:
        pid, returncode = 0, 0

        def __init__(self, cmd, **kw):
            launched.append(cmd)

        def poll(self):
            return 0

    monkeypatch.setattr("workbench.tune.ahead.subprocess.Popen", Proc)
    ahead = CompileAhead(_gpu_session(tmp_path))
    assert ahead.why_not(vla, vla) == "" and ahead.start(4, vla, beside=vla)
    cmd = launched[0]
    assert cmd[cmd.index("--blocks") + 1] == "1" and "--compile-only" in cmd
    twin = load_config(tmp_path / "ahead/4/config.yaml")
    assert twin.hardware.memory_fraction_limit == pytest.approx(0.08)
    # it compiles what the trial compiles, and captures nothing: a captured graph fills no cache
    assert twin.loongforge.compute_domain.compile == "default"
    assert twin.loongforge.compute_domain.graph_capture == "none"
    # capture alone compiles nothing: no twin (7 of 8 capturing VLA twins failed on the H200, vlaw-h200)
    eager = merge_overrides(vla, {"loongforge.compute_domain.compile": "none"})
    assert ahead.why_not(eager, vla) == "nothing to compile"
    ahead.stop()
    assert ahead.record(4)["status"] == "done"
    full = CompileAhead(_gpu_session(tmp_path, share_limit=0.99))
    assert "memory_share_limit 0.99" in full.why_not(vla, vla) and not full.start(5, vla, beside=vla)
    assert full.record(5)["status"] == "skipped" and len(launched) == 1


def test_a_failed_twin_keeps_why_in_its_record(tmp_path, monkeypatch):
    """gr00t-n1.6-vla on one H100 (run vlaw6-h100): the twins at micro-batch 32 exited with the out-of-memory code
    and trial 3 compiled 101 s cold; the twin's log went with the machine. A failed twin's record now keeps its
    failure.json (kind, message cut to 600 characters) and a capped twin's record the share it held."""
    vla = merge_overrides(preset_config("gr00t-n1.6-vla"), {"hardware.device": "cuda", "data.micro_batch_size": 32,
                                                            "loongforge.compute_domain.compile": "default"})
    message = "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. " + "x" * 1000

    class Proc:
        pid, returncode = 0, 3

        def __init__(self, cmd, **kw):
            pass

        def poll(self):
            return 3

        def wait(self, timeout=None):
            return 3

    monkeypatch.setattr("workbench.tune.ahead.subprocess.Popen", Proc)
    ahead = CompileAhead(_gpu_session(tmp_path, depth=2))
    assert ahead.start(3, vla, beside=vla)
    (tmp_path / "ahead/3/failure.json").write_text(json.dumps({"kind": "oom", "message": message}))
    assert ahead.wait(3, timeout_s=5) >= 0
    rec = ahead.record(3)
    assert rec["status"] == "failed" and rec["rc"] == 3 and rec["memory_share"] == pytest.approx(0.03)
    assert rec["failure"] == {"kind": "oom", "message": message[:600]}
    ok = merge_overrides(vla, {"data.micro_batch_size": 16})
    Proc.returncode = 0
    assert ahead.start(4, ok, beside=vla) and ahead.wait(4, timeout_s=5) >= 0
    assert ahead.record(4)["status"] == "done" and "failure" not in ahead.record(4)
    recs = [{"status": "failed", "rc": 3}, ahead.record(3), ahead.record(4)]
    rec = compile_ahead_record([SimpleNamespace(user_attrs={"compile_ahead": r}) for r in recs])
    assert rec["failed"] == 2 and rec["failed_kinds"] == {"oom": 1, "exit 3": 1} and rec["finished"] == 1
    from workbench.tune.result import gpu_minutes_line

    line = gpu_minutes_line({"device": "cuda", "total": 8.3},
                            {"stages": [{"windows": 1, "trials": 8}], "compile_ahead": {**rec, "twins": 3}})
    assert line.endswith("compile-ahead (2 trials ahead): 1 of 3 twins finished before their trial, 2 failed "
                         "(1 exit 3, 1 oom), 0 s waited")


def test_at_depth_2_two_trials_are_compiled_ahead_and_the_next_ones_twin_runs_on(study_spec_file, tmp_path,
                                                                                   events):
    """``protocol.compile_ahead_depth: 2``: as trial 0 starts, trials 1 and 2 are asked and both twins start; each
    later trial asks one more. A screen was often shorter than the next config's compile on the H200, so each
    twin gets a trial more of head start."""
    t = _tuner(_spec(study_spec_file, name="deep", compile_ahead_depth=2), tmp_path)
    assert t.searcher.depth == 2
    t.search()
    runs = [e[1] for e in events if e[0] == "run"]
    assert len(runs) == 4
    assert events.index(("start", runs[1])) < events.index(("start", runs[2])) < events.index(("run", runs[0]))
    # trial 3 is asked as trial 1 starts, while trial 2's twin (asked with trial 1) compiles on
    assert events.index(("wait", runs[1])) < events.index(("start", runs[3])) < events.index(("run", runs[1]))
    assert not [e for e in events if e[0] == "start" and e[1] not in runs]  # none beyond the budget of 4
    assert sorted(tuple(sorted(x.params.items())) for x in t.study.get_trials() if x.number in runs) == CONFIGS
    rec = compile_ahead_record(t.study.get_trials())
    assert rec["asked_ahead"] == 3 and rec["twins"] == 3


def test_two_trials_asked_ahead_when_the_search_ends_are_both_told_and_queued_again(study_spec_file, tmp_path,
                                                                                     events, monkeypatch):
    done = {"after": 1}
    monkeypatch.setattr(GpuBudget, "done", lambda self: sum(e[0] == "run" for e in events) >= done["after"])
    spec = _spec(study_spec_file, name="deep-end", trials=4, compile_ahead_depth=2)
    t = _tuner(spec, tmp_path)
    t.search()
    assert [e for e in events if e[0] == "run"] == [("run", 0)]
    dropped = [x for x in t.study.get_trials() if x.state == TrialState.FAIL]
    assert [x.number for x in dropped] == [1, 2] and all(x.user_attrs["status"] == "interrupted" for x in dropped)
    assert t.session.finished_count() == 1  # no budget used by the two
    assert not [x for x in t.study.get_trials() if x.state == TrialState.RUNNING]
    # the next session measures both configs (each queued again, once) and the rest of the space
    t.lease.release()
    done["after"] = 99
    again = _tuner(spec, tmp_path)
    again.search()
    requeued = {x.user_attrs["requeue_of"]: x.params for x in again.study.get_trials() if "requeue_of" in x.user_attrs}
    assert requeued == {x.number: x.params for x in dropped}
    assert sorted({tuple(sorted(x.params.items())) for x in again.study.get_trials(states=(TrialState.COMPLETE,))}
                  ) == CONFIGS


def _sleeping_twins(monkeypatch, done: set[int], envs: list) -> None:
    """Twins as real processes: the trials in ``done`` exit at once, the others sleep (still compiling); each
    one's environment goes to ``envs``."""
    from workbench.tune import ahead as ahead_mod

    real = ahead_mod.start_process

    def start(cmd, log_path, **kw):
        number = int(Path(cmd[cmd.index("--out") + 1]).name)
        envs.append(kw["env"])
        return real([sys.executable, "-c", "pass" if number in done else "import time; time.sleep(60)"], log_path,
                    **kw)

    monkeypatch.setattr(ahead_mod, "start_process", start)


def test_twins_run_side_by_side_and_one_that_no_longer_fits_is_stopped(tmp_path, monkeypatch):
    """Two twins run at once, each with half the compile workers; before trial 1 starts its twin is waited for
    and trial 2's runs on, unless it no longer fits beside trial 1 (started beside trial 0): then it is
    stopped, and trial 2 compiles for itself. (Each trial a micro-batch of its own: other graphs, a twin each.)"""
    envs: list = []
    done = {1}
    _sleeping_twins(monkeypatch, done=done, envs=envs)
    monkeypatch.setattr("workbench.tune.ahead.os.cpu_count", lambda: 16)
    cfg = {n: _gpu_cfg(**{"data.micro_batch_size": 9 - n}) for n in range(1, 6)}
    small, big = _gpu_cfg(), _gpu_cfg(**{"data.micro_batch_size": 32})
    ahead = CompileAhead(_gpu_session(tmp_path, depth=None))
    assert ahead.depth == 2
    assert ahead.start(1, cfg[1], beside=small) and ahead.start(2, cfg[2], beside=small)
    assert ahead.record(2)["beside_twins"] == 1 and set(ahead.twins) == {1, 2}
    assert [e["TORCHINDUCTOR_COMPILE_THREADS"] for e in envs] == ["6", "6"]  # (16 - 2 loader - 2) // 2 twins
    assert ahead.wait(1, timeout_s=30, keep=(2,), beside=cfg[1]) >= 0
    assert ahead.record(1)["status"] == "done" and set(ahead.twins) == {2}
    assert ahead.record(1)["depth"] == 2 and "beside_twins" not in ahead.record(1)
    assert ahead.twins[2].proc.poll() is None  # still compiling, beside trial 1
    # a trial the twin of 2 does not fit beside: it is stopped, and says why
    ahead.start(3, cfg[3], beside=cfg[1])
    assert set(ahead.twins) == {2, 3}
    ahead.wait(3, timeout_s=0.5, keep=(2,), beside=big)
    assert ahead.record(3)["status"] == "stopped"  # (its own twin: past its timeout)
    assert ahead.record(2)["status"] == "stopped" and "GiB together" in ahead.record(2)["stopped_for"]
    assert ahead.twins == {}
    # a twin that finished before its turn (reaped as another started) is recorded as waited for 0 s
    done.update({4, 5})
    ahead.start(4, cfg[4], beside=small)
    ahead.twins[4].proc.wait(timeout=30)
    ahead.start(5, cfg[5], beside=small)
    assert 4 not in ahead.twins and ahead.record(4)["status"] == "done"
    assert ahead.wait(4, timeout_s=30, keep=(5,), beside=cfg[4]) == 0.0 and ahead.record(4)["waited_s"] == 0.0
    ahead.stop()


def test_a_config_whose_graphs_are_compiled_gets_no_twin(tmp_path, monkeypatch):
    """gr00t-n1.6-vla-w7 on one H100: the twins of trials 2, 4 and 6, each the config of a trial before with
    another capture, found all 13 graphs in the cache, and each trial waited 13-17 s for its twin's start-up. A
    config's graphs are those of its graph_key (capture, loader and allocator left out); a twin starts only where
    no trial started, and no twin compiled or compiles, the same key."""
    _sleeping_twins(monkeypatch, done={1}, envs=[])
    ahead = CompileAhead(_gpu_session(tmp_path, depth=2))
    cfg = _gpu_cfg()
    again = _gpu_cfg(**{"loongforge.compute_domain.graph_capture": "fwd_bwd", "data.num_workers": 2,
                        "loongforge.memory_domain.allocator.expandable_segments": True})
    other, fp8 = _gpu_cfg(**{"data.micro_batch_size": 2}), _gpu_cfg(**{"loongforge.compute_domain.fp8": "tensorwise"})
    assert graph_key(cfg) == graph_key(again) and len({graph_key(cfg), graph_key(other), graph_key(fp8)}) == 3
    assert ahead.start(1, cfg, beside=other)
    assert not ahead.start(2, again, beside=other) and 2 not in ahead.twins
    assert ahead.record(2) == {"status": "skipped", "reason": "its graphs are being compiled by trial 1's twin"}
    assert ahead.wait(1, timeout_s=30, beside=cfg) >= 0 and ahead.record(1)["status"] == "done"
    assert not ahead.start(3, again, beside=cfg)
    assert ahead.record(3)["reason"] == "its graphs are compiled (trial 1)"
    # a trial that starts fills its key's cache, twin or none; a twin that finished fills its own
    ahead.wait(4, timeout_s=1, beside=other)
    assert not ahead.start(5, other, beside=other) and ahead.record(5)["reason"] == "its graphs are compiled (trial 4)"
    assert ahead.start(6, fp8, beside=other) and ahead.record(6)["status"] == "started"
    ahead.stop()


def test_a_twin_starts_only_where_the_trial_and_every_twin_fit(tmp_path):
    ahead = CompileAhead(_gpu_session(tmp_path, depth=2))
    small, mid = _gpu_cfg(), _gpu_cfg(**{"data.micro_batch_size": 16})
    assert ahead.why_not(small, mid) == ""
    crowd = ahead.why_not(small, mid, others=(small,) * 3)
    assert crowd.startswith("the trial and 4 twins need") and "GiB together" in crowd
    # the VLA's capped twins split what a feasible trial leaves: (1 - 0.9 - 2 x 0.02) / 2
    assert ahead.twin_share() == pytest.approx(0.03)
    assert CompileAhead(_gpu_session(tmp_path, depth=1)).twin_share() == pytest.approx(0.08)


def test_compile_ahead_depth_defaults_to_2_on_a_gpu_and_is_checked(tmp_path):
    from workbench.errors import ConfigError
    from workbench.tune.spec_sections import Protocol

    assert CompileAhead.depth_of(_gpu_session(tmp_path, depth=None)) == 2
    assert CompileAhead.depth_of(_gpu_session(tmp_path, depth=3)) == 3
    # the VLA's twins are capped to what a feasible trial leaves: one at a time holds all of it (0.08, not 0.03)
    vla = _gpu_session(tmp_path, depth=None)
    vla.spec.model = "gr00t-n1.6-vla"
    ahead = CompileAhead(vla)
    assert ahead.depth == 1 and ahead.twin_share() == pytest.approx(0.08)
    vla.spec.protocol.compile_ahead_depth = 2
    assert CompileAhead(vla).twin_share() == pytest.approx(0.03)  # as set
    cpu = SimpleNamespace(hardware={"capabilities": ["cpu"]},
                          spec=SimpleNamespace(protocol=SimpleNamespace(compile_ahead_depth=None)))
    assert CompileAhead.depth_of(cpu) == 1
    for bad in (0, 5, True, 1.5):
        with pytest.raises(ConfigError) as e:
            Protocol(compile_ahead_depth=bad)
        assert e.value.key == "compile_ahead_depth" and "[1, 4]" in str(e.value)


def test_each_window_says_whether_a_twin_compiled_beside_it(study_spec_file, tmp_path, events, monkeypatch):
    """gr00t-n1.6 on one H100 (2026-12-06, w3-h100): trial 3's second window read 54,032 tok/s between 59,155 and
    58,668 while the next trials' twins compiled, and trial 4's one screening window 53,491, 9% under its family's.
    Each window now records how many twins were compiling when the tuner read it, and tune.json's compile-ahead
    record counts the windows read beside one."""
    compiling = iter([1, 0, 0, 2, 0, 0, 0, 0])
    running = CompileAhead.running
    monkeypatch.setattr(CompileAhead, "running", lambda self: next(compiling))

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        events.append(("run", trial.number))
        v = 1000.0 * trial.params["micro_batch_size"] + trial.params["num_workers"]
        for i in range(2):
            on_window(i, v)
        return TrialOutcome("ok", Path(tdir), windows=[v, v], value=v, summary={"measured_steps": 6})

    monkeypatch.setattr(Search, "run_search_trial", run)
    t = _tuner(_spec(study_spec_file, name="beside"), tmp_path)
    t.search()
    ran = sorted((x for x in t.study.get_trials() if ("run", x.number) in events), key=lambda x: x.number)
    assert [x.user_attrs["windows_beside_twins"] for x in ran] == [[1, 0], [0, 2], [0, 0], [0, 0]]
    assert compile_ahead_record(t.study.get_trials())["windows_beside_twins"] == {"beside": 2, "of": 8}
    # running: the twins whose process has not exited
    ahead = CompileAhead(t.session)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    try:
        ahead.twins = {5: Twin(5, tmp_path, live), 6: Twin(6, tmp_path, done), 7: Twin(7, tmp_path, None)}
        assert running(ahead) == 1
    finally:
        live.kill()
        live.wait()
    assert running(ahead) == 0


def _comes_to(pid: int, stopped: bool) -> bool:
    """Whether the process comes to be stopped (state T in /proc), or not, within 5 s (a signal lands when the
    process is next scheduled)."""
    def now() -> bool:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"

    end = time.monotonic() + 5.0
    while now() != stopped and time.monotonic() < end:
        time.sleep(0.01)
    return now() == stopped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_twins_stand_stopped_through_a_measured_trials_windows(tmp_path, monkeypatch):
    """A twin's device work shares the GPU with the measured trial by time-slicing, so each twin's process is
    stopped from the trial's last warm-up step to its end (``on_measure`` -> ``pause``, then ``resume``); one
    started meanwhile waits too; the seconds stood are its record's; a stopped twin asked to stop still ends on
    SIGTERM at once."""
    import signal

    import workbench.tune.ahead as ahead_mod
    import workbench.tune.search as search_mod

    def sleeper(cmd, log, *, env, cwd, nice=0):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)

    monkeypatch.setattr(ahead_mod, "start_process", sleeper)
    ahead = CompileAhead(_gpu_session(tmp_path, depth=2))
    try:
        assert ahead.start(5, _gpu_cfg(), beside=_gpu_cfg())
        five = ahead.twins[5].proc
        ahead.pause()
        time.sleep(0.2)
        # (started beside the windows: stopped too; another micro-batch, graphs of its own)
        assert ahead.start(6, _gpu_cfg(**{"data.micro_batch_size": 2}), beside=_gpu_cfg())
        six = ahead.twins[6].proc
        assert _comes_to(five.pid, stopped=True) and _comes_to(six.pid, stopped=True)
        time.sleep(0.3)
        ahead.resume()
        assert _comes_to(five.pid, stopped=False) and _comes_to(six.pid, stopped=False)
        five_s, six_s = ahead.records[5]["paused_s"], ahead.records[6]["paused_s"]
        # six stood from its start, 0.2 s after five stopped (not from the pause): five stood longer by the sleep,
        # less the time between the two SIGCONTs, which a loaded machine can stretch (0.186 s in a CI run)
        assert six_s >= 0.3 and five_s - six_s >= 0.1
        assert ahead.running() == 2
        ahead.pause()
        t0 = time.monotonic()
        ahead.stop(5)
        assert five.returncode == -signal.SIGTERM and time.monotonic() - t0 < 1.0
        assert ahead.records[5]["status"] == "stopped"
        ahead.resume()
    finally:
        ahead.stop()
    rec = compile_ahead_record([SimpleNamespace(user_attrs={"compile_ahead": ahead.records[k]}) for k in (5, 6)])
    assert rec["paused_s"] == round(ahead.records[5]["paused_s"] + ahead.records[6]["paused_s"], 1) >= 0.8
    from workbench.tune.result import gpu_minutes_line

    ahead_rec = {**rec, "twins": 2, "finished": 2, "waited_s": 37.9, "paused_s": 71.9}
    line = gpu_minutes_line({"device": "cuda", "total": 7.8},
                            {"stages": [{"windows": 1, "trials": 6}], "compile_ahead": ahead_rec})
    assert line.endswith("compile-ahead (2 trials ahead): 2 of 2 twins finished before their trial, 38 s waited, "
                         "72 s stopped through measured windows")

    # the search hands the trial runner ``pause`` and continues the twins however the trial ends
    calls = []

    def run_trial(cfg, tdir, **kw):
        calls.append(kw["on_measure"])
        kw["on_measure"]()
        raise KeyboardInterrupt

    monkeypatch.setattr(search_mod, "run_trial", run_trial)
    fake = SimpleNamespace(started=None, ahead=SimpleNamespace(pause=lambda: calls.append("pause"),
                                                               resume=lambda: calls.append("resume")),
                           session=SimpleNamespace(spec=SimpleNamespace(protocol=SimpleNamespace(
                               trial_timeout_s=60, heartbeat_timeout_s=30)), launch=None, child_env=lambda: {},
                               child_cwd=lambda: None),
                           measurer=SimpleNamespace(on_phase=lambda prefix: None))
    with pytest.raises(KeyboardInterrupt):
        Search.run_search_trial(fake, SimpleNamespace(number=3), _gpu_cfg(), tmp_path / "3", None)
    assert calls == [fake.ahead.pause, "pause", "resume"]


def test_no_twin_starts_where_twins_do_not_pay(tmp_path, monkeypatch):
    _sleeping_twins(monkeypatch, done=set(), envs=[])
    ahead = CompileAhead(_gpu_session(tmp_path, depth=1))
    why = "twins do not pay here: trials waited a median 32.5 s for the 2 that finished, and a finished twin ..."
    assert not ahead.start(9, _gpu_cfg(), beside=_gpu_cfg(**{"data.micro_batch_size": 2}), unpaid=why)
    assert ahead.record(9) == {"status": "skipped", "reason": why} and ahead.twins == {}
