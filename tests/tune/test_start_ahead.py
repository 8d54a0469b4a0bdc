"""Start-ahead (workbench/tune/ahead.py, issue 38): the next trial's own process is started while the current trial
runs and held at its gate, its imports and config done and no device touched; its trial's device time counts from
the gate's opening.

A stand-in process (``STANDIN``) takes a known time to "import" and then steps as the trial contract says, so the
tests can tell the seconds before the gate from those after it; one test holds the real CLI on the tiny preset."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from workbench.config import load_config, merge_overrides, preset_config
from workbench.train.trainer import preload
from workbench.tune import Tuner
from workbench.tune.ahead import StartAhead
from workbench.tune.budget import GpuBudget
from workbench.tune.records import start_ahead_record
from workbench.tune.study import load_study_spec
from workbench.tune.search import Search
from workbench.tune.trial import Held, TrialOutcome, command_launcher, hold_trial, run_trial
from workbench.vocab import REAL_TOKENS_PER_S

IMPORT_S = 1.5
STEP_S = 0.25  # 8 steps outlast the next trial's start-up: it is ready when its turn comes

# The trial contract's files, after IMPORT_S seconds of start-up and, with $WORKBENCH_HOLD, the gate: the
# heartbeat's 0, then 8 steps (2 warm-up, 2 windows of 3), the window records at steps 5 and 8 at a speed set by
# the micro-batch.
STANDIN = f"""
import json, os, pathlib, sys, time
argv = sys.argv
out = pathlib.Path(os.environ['WORKBENCH_OUT'])
gate = pathlib.Path(os.environ['WORKBENCH_HOLD']) if 'WORKBENCH_HOLD' in os.environ else None
time.sleep({IMPORT_S})
if gate is not None:
    (gate.parent / (gate.name + '.ready')).write_text(json.dumps({{'ready_at': time.time(),
                                                                 'cuda_initialized': False}}))
    while not gate.exists():
        time.sleep(0.01)
(out / 'heartbeat').write_text('0')
speed = 100.0 * int(argv[argv.index('--mb') + 1])
for step in range(1, 9):
    time.sleep({STEP_S})
    (out / 'heartbeat').write_text(str(step))
    if step in (5, 8):
        with open(out / 'metrics.jsonl', 'a') as f:
            f.write(json.dumps({{'step': step, 'steps': 3, 'step_s': {STEP_S}, '{REAL_TOKENS_PER_S}': speed}}) + '\\n')
"""


def standin(cfg, config_path: Path, trial_dir: Path) -> list[str]:
    return [sys.executable, "-c", STANDIN, "--mb", str(cfg.data.micro_batch_size)]


@pytest.fixture
def spec(study_spec_file):
    return load_study_spec(str(study_spec_file("held")))


def _ready(trial_dir: Path, timeout_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while not (trial_dir / "gate.ready").exists():
        assert time.monotonic() - t0 < timeout_s, "the held process never reached its gate"
        time.sleep(0.05)


def test_a_held_trials_device_time_starts_at_its_gate(spec, tmp_path):
    cfg = spec.trial_config({"micro_batch_size": 8})
    plain = run_trial(cfg, tmp_path / "plain", timeout_s=60, heartbeat_timeout_s=30, launch=standin)
    held = hold_trial(cfg, tmp_path / "held", "h8", launch=standin)
    _ready(tmp_path / "held")
    time.sleep(0.3)
    assert not (tmp_path / "held" / "heartbeat").exists()  # held: nothing reported, nothing run
    out = run_trial(cfg, tmp_path / "held", timeout_s=60, heartbeat_timeout_s=30, launch=standin, held=held)
    assert plain.status == out.status == "ok" and out.windows == plain.windows == [800.0, 800.0]
    # a launched trial's clock holds its start-up; a held one's starts at the gate, its start-up done before
    assert plain.timeline["report"] >= IMPORT_S and out.timeline["report"] < IMPORT_S / 2
    assert out.wall_s < plain.wall_s - IMPORT_S / 2
    rec = out.start_ahead
    assert IMPORT_S <= rec["ready_s"] <= rec["held_s"] and rec["cuda_initialized"] is False
    assert plain.start_ahead is None and load_config(out.config_path) == cfg


def test_the_real_loop_held_imports_and_waits_without_reporting(spec, tmp_path):
    cfg = spec.trial_config({})
    d = tmp_path / "real"
    held = hold_trial(cfg, d, "h", env={"OMP_NUM_THREADS": "1"})
    _ready(d)
    time.sleep(0.5)
    ready = json.loads((d / "gate.ready").read_text())
    assert ready["cuda_initialized"] is False and held.proc.poll() is None
    assert sorted(p.name for p in d.iterdir()) == ["config.yaml", "gate.ready", "log.txt"]  # no step, no file
    out = run_trial(cfg, d, timeout_s=180, heartbeat_timeout_s=60, held=held)
    assert out.status == "ok", out.log_tail
    assert len(out.windows) == spec.protocol.windows and out.timeline["report"] < 1.0
    assert out.summary["measured_steps"] == spec.protocol.windows * spec.protocol.window_steps


OWN_LOOP = """
import time
import workbench
with workbench.run() as run:
    for _ in range(run.max_steps):
        time.sleep(0.05)
        run.step(tokens=1000)
"""


def test_a_loop_of_ones_own_is_held_in_workbench_run(spec, tmp_path):
    cfg = spec.trial_config({})
    launch = command_launcher(["python", "-c", OWN_LOOP])
    held = hold_trial(cfg, tmp_path / "own", "h", launch=launch)
    _ready(tmp_path / "own")
    time.sleep(0.3)
    assert not (tmp_path / "own" / "heartbeat").exists() and held.proc.poll() is None
    out = run_trial(cfg, tmp_path / "own", timeout_s=60, heartbeat_timeout_s=30, launch=launch, held=held)
    assert out.status == "ok", out.log_tail
    assert len(out.windows) == spec.protocol.windows and out.timeline["report"] < 1.0
    assert out.start_ahead["ready_s"] <= out.start_ahead["held_s"]


def test_preload_imports_what_the_config_uses_first_and_nothing_else():
    tiny = preset_config("tiny")
    assert preload(tiny) == []
    compiled = merge_overrides(tiny, {"loongforge.compute_domain.compile": "default"})
    assert preload(compiled) == ["torch._inductor.compile_fx"] and "torch._inductor.compile_fx" in sys.modules
    triton = merge_overrides(tiny, {"loongforge.compute_domain.triton_fusion": True})
    assert preload(triton) == ["triton", "triton.language"]


def _session(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(study_dir=tmp_path, launch=standin, child_env=lambda: {}, child_cwd=lambda: None,
                           spec=SimpleNamespace(trainer=None, protocol=SimpleNamespace(start_ahead=None)),
                           hardware={"capabilities": ["cpu"]})


def test_a_held_process_of_another_config_or_a_dropped_trial_is_stopped(spec, tmp_path):
    ahead = StartAhead(_session(tmp_path))
    cfg = spec.trial_config({})
    ahead.start(3, cfg, "a", tmp_path / "trials" / "3")
    ahead.start(4, cfg, "b", tmp_path / "trials" / "4")
    p3, p4 = ahead.held[3].proc, ahead.held[4].proc
    assert ahead.take(3, "not a") is None  # its config changed: stopped, its directory gone (nothing ran there)
    assert p3.poll() is not None and not (tmp_path / "trials" / "3").exists()
    ahead.stop()  # the search ends
    assert p4.poll() is not None and not (tmp_path / "trials" / "4").exists() and ahead.held == {}
    assert ahead.take(4, "b") is None


def test_start_ahead_is_on_by_default_for_the_built_in_loop(tmp_path):
    s = _session(tmp_path)
    assert StartAhead.enabled(s)  # on a CPU too
    s.hardware = {"capabilities": ["cuda"]}
    assert StartAhead.enabled(s)
    s.spec.trainer = object()  # a loop of one's own: only it knows that it touches no device before run()
    assert not StartAhead.enabled(s)
    s.spec.protocol.start_ahead = True
    assert StartAhead.enabled(s)
    s.spec.protocol.start_ahead = False
    s.spec.trainer = None
    assert not StartAhead.enabled(s)


SPACE = {"micro_batch_size": {"choices": [2, 4, 8]}}


def _tuner(study_spec_file, tmp_path: Path, trials: int, **protocol) -> Tuner:
    path = study_spec_file("started", space=SPACE, trials=trials, sampler={"name": "random", "seed": 0},
                           protocol={"start_ahead": True, **protocol})
    t = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, launch=standin)
    t.open()
    return t


def test_each_trial_after_the_first_runs_from_a_process_started_beside_the_one_before(study_spec_file, tmp_path):
    t = _tuner(study_spec_file, tmp_path, trials=3)
    assert t.searcher.started is not None and t.searcher.ahead is None  # (a CPU study: no twins)
    for mb in (4, 8, 2):
        t.study.enqueue_trial({"micro_batch_size": mb})
    t.search()
    trials = sorted(t.study.get_trials(), key=lambda x: x.number)
    assert [x.state for x in trials] == [TrialState.COMPLETE] * 3
    assert [x.values[0] for x in trials] == [400.0, 800.0, 200.0]  # each config's own process
    assert "start_ahead" not in trials[0].user_attrs  # the first was launched: nothing ran before it
    for x in trials[1:]:
        rec = x.user_attrs["start_ahead"]
        # held beside the trial before it, ready before its gate opened: its device time holds no start-up
        assert IMPORT_S <= rec["ready_s"] <= rec["held_s"], rec
        assert x.user_attrs["timeline"]["report"] < IMPORT_S / 2
        assert x.user_attrs["wall_s"] < trials[0].user_attrs["wall_s"] - IMPORT_S / 2
    rec = start_ahead_record(trials)
    assert rec["held"] == 2 and rec["ready_at_gate"] == 2 and rec["waited_s"] == 0 and rec["cuda_initialized"] == 0
    assert IMPORT_S <= rec["median_ready_s"] < IMPORT_S + 5
    assert sorted(p.name for p in (t.session.study_dir / "trials").iterdir()) == ["0", "1", "2"]


def test_the_process_held_for_a_trial_the_search_ends_before_is_stopped(study_spec_file, tmp_path, monkeypatch):
    runs = []  # the search's own runs, as they end
    monkeypatch.setattr(GpuBudget, "done", lambda self: len(runs) >= 1)
    t = _tuner(study_spec_file, tmp_path, trials=3)
    orig = t.searcher.run_search_trial

    def run(trial, cfg, tdir, on_window, budget_s=None):
        out = orig(trial, cfg, tdir, on_window, budget_s)
        runs.append(trial.number)
        return out

    t.searcher.run_search_trial = run
    t.search()
    assert runs == [0]
    dropped = [x for x in t.study.get_trials() if x.state == TrialState.FAIL]
    assert len(dropped) == 1 and dropped[0].user_attrs["status"] == "interrupted"
    assert not (t.session.study_dir / "trials" / str(dropped[0].number)).exists()  # its process stopped, no run
    assert t.searcher.started.held == {}


def test_the_gpu_minutes_line_says_how_many_processes_were_ready():
    from workbench.tune.result import gpu_minutes_line

    held = {"held": 5, "ready_at_gate": 4, "median_ready_s": 4.6, "waited_s": 1.2, "cuda_initialized": 0}
    line = gpu_minutes_line({"device": "cuda", "total": 9.5}, {"stages": [{"windows": 1, "trials": 6}],
                                                              "start_ahead": held})
    assert line.endswith("; start-ahead: 4 of 5 trials' processes were ready when they started (median 4.6 s of "
                         "start-up off the device's clock)")
    assert "start-ahead" not in gpu_minutes_line({"device": "cuda", "total": 9.5},
                                                 {"stages": [{"windows": 1, "trials": 6}], "start_ahead": None})


def test_a_held_process_with_cuda_up_at_its_gate_turns_start_ahead_off(study_spec_file, tmp_path, monkeypatch,
                                                                      capsys):
    """A loop of one's own that touches the device before workbench.run() holds device memory while held: after
    the first trial that says so, no process is started ahead."""
    seen: list[tuple] = []

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        seen.append(("run", trial.number))
        v = 100.0 * trial.params["micro_batch_size"]
        return TrialOutcome("ok", Path(tdir), windows=[v, v], value=v, start_ahead=None if trial.number == 0 else
                            {"held_s": 2.0, "ready_s": 1.0, "cuda_initialized": trial.number == 1})

    monkeypatch.setattr(Search, "run_search_trial", run)
    monkeypatch.setattr(StartAhead, "start", lambda self, n, cfg, h, d: seen.append(("start", n)))
    monkeypatch.setattr(StartAhead, "stop", lambda self: seen.append(("stop",)))
    t = _tuner(study_spec_file, tmp_path, trials=3)
    for mb in (4, 8, 2):
        t.study.enqueue_trial({"micro_batch_size": mb})
    t.search()
    assert seen == [("start", 1), ("run", 0), ("start", 2), ("run", 1), ("stop",), ("run", 2)]
    assert t.searcher.started is None
    assert "trial 1: its process had CUDA up before its gate opened" in capsys.readouterr().err


def test_only_a_training_run_waits_at_a_gate(tmp_path, subprocess_env):
    import subprocess

    env = {**subprocess_env, "WORKBENCH_HOLD": str(tmp_path / "never")}
    done = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny", "--print-config"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "micro_batch_size" in done.stdout and not (tmp_path / "never.ready").exists()


def test_the_measured_runs_after_the_first_start_beside_the_run_before(study_spec_file, tmp_path, monkeypatch):
    """Baseline repeats and A/B pairs are known in advance: each run's process is started beside the run before
    it and held, so a run's device time holds no start-up; a process held for a run that does not come (the A/B
    stopped) is stopped, and nothing is left running or half-written."""
    t = _tuner(study_spec_file, tmp_path, trials=2, ab_rounds=3, ab_min_rounds=2)
    assert t.measurer.started is not None
    stopped: list[str] = []
    stop = Held.stop
    monkeypatch.setattr(Held, "stop", lambda self: stopped.append(self.trial_dir.name) or stop(self))
    t.study.enqueue_trial({"micro_batch_size": 8})
    t.study.enqueue_trial({"micro_batch_size": 2})
    validation = t.run()
    d = t.session.study_dir
    walls = t.study.user_attrs["baseline_wall_s"]
    assert len(walls) == 2 and walls[1] < walls[0] - IMPORT_S / 2  # repeat 2 was held beside repeat 1
    assert not (d / "baseline" / "0" / "gate.ready").exists() and (d / "baseline" / "1" / "gate.ready").exists()
    cand = validation["candidates"][0]
    assert cand["trial"] == 0 and cand["runs"] == [800.0, 800.0] and cand["baseline_runs"] == [400.0, 400.0]
    # every validation run was started beside the one before it (the first beside the search's end: no)
    runs = [Path(p) for pair in zip(cand["baseline_dirs"], cand["run_dirs"]) for p in pair]
    assert [(p / "gate.ready").exists() for p in runs] == [False, True, True, True]
    for p in runs[1:]:
        ready = json.loads((p / "gate.ready").read_text())
        assert ready["cuda_initialized"] is False
    # the A/B stopped after its second pair (from 2 to 3 pairs): the process held for a third was stopped, its
    # folder removed
    assert stopped == [f".baseline-0-2.{t.session.attempt_id}"] and t.measurer.started.held == {}
    assert not [p for p in (d / "validation").iterdir() if p.name.startswith(".")]


def test_unset_the_measured_runs_are_held_and_the_search_asks_nothing_ahead_on_a_cpu(study_spec_file, tmp_path):
    """Asking the next trial ahead costs the sampler the running trial's result: on a CPU (no compile-ahead) the
    search does not pay it for start-ahead unless the study says so; the measured runs, known in advance, are
    held."""
    t = _tuner(study_spec_file, tmp_path, trials=2, start_ahead=None)
    assert t.measurer.started is not None and t.searcher.started is None and t.searcher.ahead is None
