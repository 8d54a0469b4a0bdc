"""Issue 38's search economics: screening (a short run first, the full protocol for the fastest), a budget in
GPU-minutes that stops the search and still validates and exports, a warm start from an earlier study of the same
model and hardware, and a progress bar that counts validation's runs.

Runs are replaced by functions of the config (known speeds and a known minute each): what is under test is the
tuner's choices and its accounting, which the real runner's tests reach only slowly."""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.trial import TrialState

import workbench.tune.measure as measure
from workbench.errors import ConfigError
from workbench.tune import Tuner
from workbench.tune.budget import (GpuBudget, gpu_seconds, profile_seconds, reserved_seconds, trial_seconds,
                                   twin_worth_s, twins_unpaid)
from workbench.tune.profiled import warm_start_line, warm_walk
from workbench.tune.progress import Progress
from workbench.tune.records import screen_seconds, screening_record
from workbench.tune.result import gpu_minutes_line
from workbench.tune.search import Search
from workbench.tune.study import load_study_spec, loads_study_spec
from workbench.tune.trial import TrialOutcome
from workbench.tune.validation import candidates

SPACE = {"micro_batch_size": {"choices": [1, 2, 4, 8]}, "num_workers": {"choices": [0, 1]}}
RUN_S = 60.0  # every fake run holds its device for one minute


def _speed(mb: int, nw: int) -> float:
    return 1000.0 * mb + 100.0 * nw


def _tuner(spec_path: Path, tmp_path: Path, **kw) -> Tuner:
    t = Tuner(load_study_spec(str(spec_path)), out_root=tmp_path / "runs", progress=False, **kw)
    t.open()
    return t


def _timeline(mb: int, windows: int) -> dict[str, float]:
    """A fake trial's watchdog marks: ``mb`` seconds to its first step, half of them compiling, 5 s a window, 2 s
    after the last."""
    first = float(mb)
    return {"report": 0.5, "first_step": first, "first_window": first + 5, "last_window": first + 5 * windows,
            "compile_s": first / 2, "end": first + 5 * windows + 2}


@pytest.fixture
def fake_search(monkeypatch):
    """Search trials report their windows through the pruner; mb 4 with a worker crashes before its first
    window. Returns the list of (params, windows measured)."""
    ran: list[tuple[dict, int]] = []

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        p = dict(trial.params)
        Path(tdir).mkdir(parents=True, exist_ok=True)
        if (p["micro_batch_size"], p["num_workers"]) == (4, 1):
            ran.append((p, 0))
            return TrialOutcome("crash", Path(tdir), failure_reason="exit 1 before the first window", wall_s=RUN_S)
        v = _speed(p["micro_batch_size"], p["num_workers"])
        windows: list[float] = []
        for i in range(self.session.spec.protocol.windows):
            windows.append(v)
            if on_window(i, v):
                ran.append((p, len(windows)))
                return TrialOutcome("pruned", Path(tdir), windows=windows, wall_s=RUN_S * len(windows) / 2,
                                    failure_reason=f"pruned after window {len(windows)}",
                                    timeline=_timeline(p["micro_batch_size"], len(windows)))
        ran.append((p, len(windows)))
        return TrialOutcome("ok", Path(tdir), windows=windows, value=v, summary={"measured_steps": 6},
                            wall_s=RUN_S, timeline=_timeline(p["micro_batch_size"], len(windows)))

    monkeypatch.setattr(Search, "run_search_trial", run)
    return ran


@pytest.fixture
def fake_measure(monkeypatch):
    """The coordinator's runs (baseline, validation, traces) at their config's known speed, a minute each."""
    def run_trial(cfg, run_dir, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        v = _speed(cfg.data.micro_batch_size, cfg.data.num_workers)
        return TrialOutcome("ok", Path(run_dir), windows=[v, v], value=v, summary={"measured_steps": 6},
                            wall_s=RUN_S)

    monkeypatch.setattr(measure, "run_trial", run_trial)


def test_screening_promotes_the_fastest_and_never_a_failed_one(study_spec_file, tmp_path, fake_search):
    spec = study_spec_file("screen", space=SPACE, trials=8, sampler={"name": "grid", "seed": 1},
                           pruner={"name": "successive_halving", "reduction_factor": 2},
                           protocol={"windows": 2})
    t = _tuner(spec, tmp_path)
    t.search()
    trials = t.study.get_trials()
    assert len(ran := fake_search) == 8
    seen: list[float] = []
    for tr in trials:
        p = tr.params
        if (p["micro_batch_size"], p["num_workers"]) == (4, 1):
            assert tr.state == TrialState.FAIL and not tr.intermediate_values  # failed: never screened or promoted
            continue
        v = _speed(p["micro_batch_size"], p["num_workers"])
        seen.append(v)
        # Optuna's rule at eta 2: promoted when among the best half of the first-window values so far
        # (the best of them while fewer than two)
        rank = sorted(seen, reverse=True).index(v) + 1
        promoted = rank <= max(len(seen) // 2, 1)
        assert tr.state == (TrialState.COMPLETE if promoted else TrialState.PRUNED), (p, seen)
        assert list(tr.intermediate_values) == ([1, 2] if promoted else [1])  # the resource: windows measured
    best = max(trials, key=lambda tr: tr.values[0] if tr.state == TrialState.COMPLETE else 0)
    assert (best.params["micro_batch_size"], best.params["num_workers"]) == (8, 1)
    assert [c.number for c in candidates(t.session)[0]] == [best.number]
    rec = screening_record(t.session)
    completed = sum(tr.state == TrialState.COMPLETE for tr in trials)
    assert rec["stages"] == [{"windows": 1, "trials": 7}, {"windows": 2, "trials": completed}]
    assert 0 < completed < 7 and rec["configs_evaluated"] == 7 and rec["refused_without_run"] == 0
    gpu = gpu_seconds(t.session)  # screened trials ran one window of two: half a run
    assert gpu["screening"] == pytest.approx(RUN_S / 2 * (7 - completed))
    assert gpu["trials"] == pytest.approx(RUN_S * (completed + 1))  # the crash's minute counts to the trials
    assert len(ran) == 8
    # where a search trial's seconds went, from the watchdog's marks: medians over the 7 that measured a window
    # (the crash has none); before the first step is mb seconds, a window 5 s, 2 s after the last
    ok = [tr for tr in trials if tr.intermediate_values]
    firsts = sorted(float(tr.params["micro_batch_size"]) for tr in ok)
    steps = sorted(5.0 * len(tr.intermediate_values) for tr in ok)
    totals = sorted(tr.params["micro_batch_size"] + 5.0 * len(tr.intermediate_values) + 2 for tr in ok)
    assert rec["screen_seconds"] == {"trials": 7, "before_first_step": firsts[3], "stepping": steps[3],
                                     "after_last_window": 2.0, "total": totals[3], "compile": firsts[3] / 2}
    line = gpu_minutes_line({"device": "cuda", "total": 5.0}, rec)
    assert (f"a search trial's median seconds: {firsts[3]:.0f} before its first step ({firsts[3] / 2:.0f} of them "
            f"compiling), {steps[3]:.0f} stepping, 2 after its last window ({totals[3]:.0f} in all, 7 trials)") in line
    # a loop that reports no compile seconds (a loop of one's own): no such figure, and the line says nothing of it
    no_compile = [SimpleNamespace(user_attrs={"timeline": {k: v for k, v in tr.user_attrs["timeline"].items()
                                                           if k != "compile_s"}}) for tr in ok]
    assert screen_seconds(no_compile)["compile"] is None
    assert "compiling" not in gpu_minutes_line({"device": "cuda", "total": 5.0},
                                               {**rec, "screen_seconds": screen_seconds(no_compile)})
    # trials measured before the watchdog kept marks: no such figures, and no line
    assert screening_record(SimpleNamespace(**{**vars(t.session), "trials": lambda: [
        tr for tr in t.session.trials() if "timeline" not in tr.user_attrs]}))["screen_seconds"] is None


def test_a_config_screened_out_is_not_screened_again(study_spec_file, tmp_path, fake_search):
    """On one H200 the study screened a config out (trial 1) and ran it again in full 5 trials later."""
    spec = study_spec_file("again", space=SPACE, trials=3, sampler={"name": "grid", "seed": 1},
                           pruner={"name": "successive_halving", "reduction_factor": 2})
    t = _tuner(spec, tmp_path)
    t.search()
    pruned = next(tr for tr in t.study.get_trials() if tr.state == TrialState.PRUNED)
    runs = len(fake_search)
    t.study.enqueue_trial(dict(pruned.params))
    t.session.budget = 4
    t.search()
    again = t.study.get_trials()[3]
    assert again.params == pruned.params and again.user_attrs["duplicate_of"] == pruned.number
    assert again.state == TrialState.PRUNED and again.user_attrs["free_repeat"]  # an untried config took its place
    assert all(p != pruned.params for p, _ in fake_search[runs:])


def _budget_study(study_spec_file, name: str, gpu_minutes: float, *, top_k: int, ab_rounds: int) -> Path:
    """A random search of SPACE on a budget of 50 trials and ``gpu_minutes``, 2 baseline repeats, no traces."""
    path = study_spec_file(name, space=SPACE, trials=50, sampler={"name": "random", "seed": 0},
                           protocol={"baseline_repeats": 2, "top_k": top_k, "ab_rounds": ab_rounds,
                                     "profile_steps": 0})
    spec = yaml.safe_load(path.read_text())
    spec["budget"] = {"trials": 50, "gpu_minutes": gpu_minutes}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_gpu_minute_budget_stops_the_search_and_still_validates_and_exports(study_spec_file, tmp_path,
                                                                              fake_search, fake_measure):
    """10 GPU-minutes: the baseline's 2 runs, then trials while 4 A/B runs and one more trial still fit."""
    path = _budget_study(study_spec_file, "gpumin", 10, top_k=1, ab_rounds=2)
    t = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False)
    validation = t.run()
    tune = json.loads((tmp_path / "runs" / "gpumin" / "tune.json").read_text())
    g = tune["gpu_minutes"]
    assert g["budget"] == 10 and g["total"] <= 10 and g["no_room"] is None  # room for trials: no such line
    assert g["by_phase"]["baseline"] == 2.0 and g["by_phase"]["validation"] == pytest.approx(4.0)
    ran = [tr for tr in t.study.get_trials() if tr.state != TrialState.WAITING and "duplicate_of" not in tr.user_attrs]
    assert g["by_phase"]["trials"] == pytest.approx(len(ran)) and len(ran) == 4  # 2 + 4 + 4 = 10
    assert validation["winner"]["trial"] is not None or validation["candidates"]
    assert (tmp_path / "runs" / "gpumin" / "config.yaml").exists()
    assert tune["result"]["budget"]["gpu_minutes"]["total"] == g["total"]
    # on this CPU the minutes are CPU-minutes, and the result line says so
    assert g["device"] == "cpu" and gpu_minutes_line(g).startswith(f"CPU-minutes: {g['total']:.1f} of 10 (")
    assert gpu_minutes_line({**g, "device": "cuda"}).startswith("GPU-minutes: ")
    rate = {"stages": [{"windows": 1, "trials": 2}], "configs_per_gpu_minute": 1.5}
    assert gpu_minutes_line(g, rate).endswith("; 1.50 configs a CPU-minute")  # a CPU study's own unit throughout
    assert gpu_minutes_line({**g, "device": "cuda"}, rate).endswith("; 1.50 configs a GPU-minute")


def test_a_trial_whose_compile_outlasts_the_budget_is_stopped_before_its_first_window(study_spec_file, tmp_path,
                                                                                        monkeypatch, fault_launch):
    """gr00t-n1.6-w5h100 on one H100: a ``packing: bucket`` screen compiled a graph a bucket width, 149.5 s, and
    the search spent 8.1 of 8 GPU-minutes with 1.2 kept for validation. A trial that has measured no window when
    the budget's room (beside the validation's reserve) runs out is stopped there: pruned for the budget, and the
    study still exports."""
    def quick(cfg, run_dir, **kw):  # the baseline's and the validation's runs: 2 s each
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        return TrialOutcome("ok", Path(run_dir), windows=[100.0, 100.0], value=100.0,
                            summary={"measured_steps": 6}, wall_s=2.0)

    monkeypatch.setattr(measure, "run_trial", quick)
    # 2 baseline runs (4 s), 2 pairs kept for validation (8 s), 3 s of room: a trial (2 s, a baseline run) starts
    path = _budget_study(study_spec_file, "compiling", (4.0 + 8.0 + 3.0) / 60, top_k=1, ab_rounds=2)
    t = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False,
              launch=fault_launch({"*": "hang"}))  # every trial "compiles" (a step 1 heartbeat) for an hour
    started = time.monotonic()
    t.run()
    assert time.monotonic() - started < 60  # not the trial time limit, nor the hour
    [first] = t.study.get_trials()
    assert first.state == TrialState.PRUNED and first.user_attrs["status"] == "pruned"
    stop = first.user_attrs["stopped_for_budget"]
    assert stop["after_window"] == 0 and stop["room_s"] == pytest.approx(3.0, abs=0.05)
    assert stop["reason"] == first.user_attrs["failure_reason"] == (
        "stopped before its first window for the GPU-minute budget: 3 s of the device were left beside the "
        "validation's reserve")
    assert 3.0 <= first.user_attrs["wall_s"] < 10.0
    assert t.searcher.measured_twin(first.user_attrs["config_hash"], 99) is None  # its config was not measured
    tune = json.loads((tmp_path / "runs" / "compiling" / "tune.json").read_text())
    assert tune["screening"]["stopped_for_budget"] == 1
    assert (tmp_path / "runs" / "compiling" / "config.yaml").exists()


def test_the_next_trial_is_estimated_from_every_trial_that_ran_screens_included(study_spec_file, tmp_path, capsys):
    """The H200 study (gr00t-n1.6, 8 GPU-minutes): one trial measured to the end (44.6 s, a cold compile) and four
    screens (21.2, 88.6, 35.1, 20.7 s). Every new trial starts as a screen, so the next one is the median of all
    five, 35.1 s, not the one complete trial's 44.6 s; a refusal, a repeat and a crash took no trial's time."""
    t = _tuner(study_spec_file("estimate", space=SPACE, trials=20), tmp_path)
    s, study = t.session, t.study
    study.set_user_attr("baseline_wall_s", [43.5, 43.5])  # 4 runs after the search (top_k 1, 2 rounds): 174 s
    study.set_user_attr("gpu_s", {"baseline": 87.0})
    for state, wall, attrs in [(TrialState.COMPLETE, 44.6, {}), (TrialState.PRUNED, 21.2, {}),
                               (TrialState.PRUNED, 88.6, {}), (TrialState.PRUNED, 35.1, {}),
                               (TrialState.PRUNED, 20.7, {}), (TrialState.FAIL, 0.0, {"status": "oom"}),
                               (TrialState.FAIL, 30.0, {"status": "crash"}),
                               (TrialState.COMPLETE, 0.0, {"duplicate_of": 0})]:
        study.add_trial(optuna.trial.create_trial(state=state, value=1000.0 if state == TrialState.COMPLETE else None,
                                                  user_attrs={"wall_s": wall, **attrs}))
    assert trial_seconds(s) == pytest.approx(35.1)
    spent = 87.0 + 44.6 + 21.2 + 88.6 + 35.1 + 20.7 + 30.0  # the crash's seconds were spent, not a trial's estimate
    assert gpu_seconds(s)["baseline"] + gpu_seconds(s)["trials"] + gpu_seconds(s)["screening"] == \
        pytest.approx(spent)
    budget = GpuBudget(s)
    s.gpu_minutes = (spent + 174.0 + 40.0) / 60  # 40 s of room: the screens' median fits (the complete one's not)
    assert budget.room() == pytest.approx(40.0) and budget.left() == pytest.approx(4.9) and not budget.done()
    s.gpu_minutes = 8.9  # 32.8 s of room: the search stops, and its line adds up
    assert budget.left() == pytest.approx(-2.3) and budget.done() and budget.done()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("GPU-minute budget")]
    assert lines == ["GPU-minute budget: 5.5 of 8.9 spent, 2.9 kept for validation, 0.55 left; a trial "
                     "takes about 0.59 (the median of the 5 search trials that ran, screens included): the search "
                     "stops"]  # once


def test_a_profiled_baseline_runs_past_its_measurement_and_the_reserve_counts_that_once(study_spec_file, tmp_path):
    """The VLA study on one H100 (2026-12-05, study.csv run vla-h100): its one baseline run took 73.6 s, its last
    measured window came 51.6 s after the launch, and the rest was 2 profiled eager steps and their trace. Of the
    runs after the search only the winner's first pair profiles, so a run is 51.6 s and the reserve 6 such runs and
    that pair's 2 x 22.0 s: 5.9 GPU-minutes, not the 7.4 of 6 runs at 73.6 s that left 4.5 GPU-minutes no search
    trial."""
    spec = study_spec_file("profiled", space=SPACE, trials=20,
                           protocol={"profile_steps": 2, "top_k": 1, "ab_rounds": 3, "baseline_repeats": 1})
    t = _tuner(spec, tmp_path)
    s, study = t.session, t.study
    marks = {"first_window": 45.0, "last_window": 51.6, "end": 73.6}
    assert profile_seconds(TrialOutcome("ok", tmp_path, wall_s=73.6, timeline=marks)) == pytest.approx(22.0)
    assert profile_seconds(TrialOutcome("ok", tmp_path, wall_s=73.6)) is None  # no window seen: nothing to take off
    study.set_user_attr("baseline_wall_s", [73.6])
    study.set_user_attr("gpu_s", {"baseline": 73.6})
    assert reserved_seconds(s) == pytest.approx(6 * 73.6)  # a study from before the record: as it was
    study.set_user_attr("baseline_profile_s", 22.0)
    assert trial_seconds(s) == pytest.approx(51.6)  # the first trial's estimate: a run without the profile
    assert reserved_seconds(s) == pytest.approx(6 * 51.6 + 2 * 22.0)
    s.gpu_minutes = 4.5
    record = GpuBudget(s).no_room()
    m = record["minutes"]
    assert m["ab_pairs"] == pytest.approx(5.16) and m["traces"] == pytest.approx(44.0 / 60, abs=1e-3)
    assert m["needed"] == pytest.approx(8.0)  # 1.23 spent + 5.16 + 0.73 + a trial's 0.86, rounded up
    assert "the winner's traces 0.7 (its first pair's profiled steps; protocol.profile_steps 0 drops them)" in \
        record["line"] and "Raise budget.gpu_minutes to 8 " in record["line"]
    s.gpu_minutes = 8.0
    assert GpuBudget(s).no_room() is None and study.user_attrs["gpu_no_room"] is None
    # where the last baseline repeat holds the base config's trace, the winner's pair profiles its candidate's
    # run alone (validation.ab_pairs' base_traced)
    traced = s.last_baseline_dir()
    traced.mkdir(parents=True)
    (traced / "trace.json").write_text("{}")
    assert reserved_seconds(s) == pytest.approx(6 * 51.6 + 22.0)


def test_the_reserve_takes_a_pairs_run_at_the_search_trials_measured_to_the_end(study_spec_file, tmp_path):
    """gr00t-n1.6 on one H100 (2026-12-06, study.csv run w3-h100): the baseline's run, which compiled every graph,
    took 46.1 s past its 10.0 s of profiled steps, and the reserve of 4 pair runs at that kept 3.4 GPU-minutes; the
    4 runs took 1.8, as the search trials measured to the end (their graphs compiled ahead) took a median 30.6 s.
    The search stopped with 2.0 of its 8.5 GPU-minutes unspent. A pair's run is now taken at those trials'
    median once one finished; screens, which stop after one window, say nothing of it."""
    spec = study_spec_file("pairs", space=SPACE, trials=20,
                           protocol={"profile_steps": 2, "top_k": 1, "ab_rounds": 2, "ab_min_rounds": 2,
                                     "baseline_repeats": 1})
    t = _tuner(spec, tmp_path)
    s, study = t.session, t.study
    study.set_user_attr("baseline_wall_s", [56.1])
    study.set_user_attr("baseline_profile_s", 10.0)
    study.set_user_attr("gpu_s", {"baseline": 56.1})
    assert reserved_seconds(s) == pytest.approx(4 * 46.1 + 2 * 10.0)  # before a trial finished: a baseline run
    for state, wall in [(TrialState.COMPLETE, 52.2), (TrialState.PRUNED, 11.2), (TrialState.PRUNED, 15.7),
                        (TrialState.COMPLETE, 31.6), (TrialState.COMPLETE, 20.5), (TrialState.COMPLETE, 29.6)]:
        study.add_trial(optuna.trial.create_trial(state=state, value=1000.0 if state == TrialState.COMPLETE else None,
                                                  user_attrs={"wall_s": wall, "status": state.name.lower()
                                                              .replace("complete", "ok")}))
    assert reserved_seconds(s) == pytest.approx(4 * 30.6 + 2 * 10.0)
    s.gpu_minutes = 8.5
    assert GpuBudget(s).pairs_left() == math.floor((510.0 - 56.1 - 160.8) / (2 * 30.6))


def test_a_pairs_run_is_taken_without_the_cold_compile_of_the_trial_it_comes_from(study_spec_file, tmp_path):
    """gr00t-n1.6-vla on one H100 (2026-12-06, run vlaw5-h100): the first search trial, micro-batch 16 compiled,
    ran 114.9 s, 90.6 of them compiling on an empty cache. Taken as a pair's run, it made the reserve of 4 runs and
    the traces 8.3 GPU-minutes of the 9, and the search stopped after that one trial; the validation's 6 runs and
    traces took 2.9. A pair's runs read the compile cache the search trial filled: a trial that compiled cold counts
    at its wall less its compile, plus the median compile of the trials that read a compile-ahead twin's cache."""
    spec = study_spec_file("cold", space=SPACE, trials=20,
                           protocol={"profile_steps": 2, "top_k": 1, "ab_rounds": 3, "ab_min_rounds": 2,
                                     "baseline_repeats": 1})
    t = _tuner(spec, tmp_path)
    s, study = t.session, t.study
    study.set_user_attr("baseline_wall_s", [55.5])
    study.set_user_attr("baseline_profile_s", 20.6)
    study.set_user_attr("gpu_s", {"baseline": 55.5})

    def finished(wall: float, compiled: float, twin: str | None = None) -> None:
        attrs = {"wall_s": wall, "status": "ok", "timeline": {"first_step": wall - 8, "compile_s": compiled,
                                                              "last_window": wall - 2, "end": wall}}
        if twin:
            attrs["compile_ahead"] = {"status": twin}
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1000.0, user_attrs=attrs))

    finished(114.9, 90.6)
    assert reserved_seconds(s) == pytest.approx(6 * (114.9 - 90.6) + 2 * 20.6)
    s.gpu_minutes = 9.0
    assert GpuBudget(s).left() == pytest.approx(540 - 55.5 - 114.9 - 6 * 24.3 - 41.2 - 114.9)  # room for trial 2
    finished(40.0, 5.0, twin="done")  # its twin compiled it: its wall is a cached run's
    finished(60.0, 30.0, twin="failed")  # cold: 60 - 30 + the 5 s a cache read took
    assert reserved_seconds(s) == pytest.approx(6 * 35.0 + 2 * 20.6)
    finished(50.0, 2.0)  # a compile under the cache read's: as measured
    assert reserved_seconds(s) == pytest.approx(6 * statistics.median([29.3, 40.0, 35.0, 50.0]) + 2 * 20.6)


def test_a_pair_is_a_candidates_run_without_its_twin_wait_and_a_base_run_at_the_bases_speed(study_spec_file,
                                                                                          tmp_path):
    """gr00t-n1.6-vla-w7 on one H100 (2026-12-06): search trials' walls held 13-28 s of waiting for their twins,
    which no pair waits for, and the eager base takes 2.0-2.4 times a candidate's seconds a step. Both runs of a
    pair taken at the trials' median wall (35.4 s) kept 3.0 GPU-minutes for a validation of 2 pairs and the traces
    that took 1.8. A pair is a candidate's run without its wait, and the same run with its 13 steps at the base's
    speed: 1.9 GPU-minutes kept for 2 pairs, 2.5 with the leader's third (reserved since gr00t-n1.6-vla-w8)."""
    spec = study_spec_file("pairs", space=SPACE, trials=20,
                           protocol={"profile_steps": 2, "top_k": 1, "ab_rounds": 3, "ab_min_rounds": 2,
                                     "baseline_repeats": 1})
    t = _tuner(spec, tmp_path)
    s, study = t.session, t.study
    study.set_user_attr("baseline_wall_s", [56.523])
    study.set_user_attr("baseline_profile_s", 19.033)
    study.set_user_attr("baseline_runs", [34271.4])
    trials = [  # wall, waited, compile, step s, tok/s (trials 2, 3, 4, 5 and 7; each with a finished twin)
        (29.444, 14.557, 4.778, 0.4762, 68814.8), (41.277, 27.593, 4.145, 0.4444, 73768.9),
        (28.283, 13.002, 5.993, 0.4229, 77485.8), (42.49, 27.196, 5.292, 0.4018, 81560.8),
        (45.416, 28.342, 7.582, 0.3960, 82747.0)]
    for wall, waited, compiled, step, value in trials:
        attrs = {"wall_s": wall, "status": "ok", "steps": 13, "time/step_s": step,
                 "timeline": {"compile_s": compiled, "end": wall - waited},
                 "compile_ahead": {"status": "done", "waited_s": waited}}
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=value, user_attrs=attrs))
    pairs = sorted(2 * (w - wt) + 13 * st * (v / 34271.4 - 1) for w, wt, _, st, v in trials)
    assert pairs[2] == pytest.approx(37.5, abs=0.1)
    assert reserved_seconds(s) == pytest.approx(3 * pairs[2] + 2 * 19.033)  # the leader's 3 pairs and its traces
    assert reserved_seconds(s) / 60 == pytest.approx(2.5, abs=0.05)  # (4.2 at the old pair; 2 pairs took 1.8)
    s.gpu_minutes = 9.0
    study.set_user_attr("gpu_s", {"baseline": 56.523})
    assert GpuBudget(s).pairs_left() == math.floor((540 - 56.523 - sum(w for w, *_ in trials)) / pairs[2])


FIRST_WINDOW_S, WINDOW_S = 20.0, 10.0  # a timed trial's launch, compile and warm-up with its first window; a window


@pytest.fixture
def timed_search(monkeypatch):
    """Search trials on a clock of their own: the first window at FIRST_WINDOW_S after the launch, each later one
    WINDOW_S after it; a trial's wall is the clock's. Their windows' records hold no step time (the runner gives
    no window seconds). Returns the windows each trial measured, by trial number."""
    return _timed_runs(monkeypatch, own_s=None)


@pytest.fixture
def timed_search_own(monkeypatch):
    """The same clock, each window's own seconds (WINDOW_S) given with its value, as the real runner reads them
    from the window's record."""
    return _timed_runs(monkeypatch, own_s=WINDOW_S)


@pytest.fixture
def timed_search_gaps(monkeypatch):
    """The same clock, each window's own seconds half the time between windows' reports (the rest: the loop's
    work between windows)."""
    return _timed_runs(monkeypatch, own_s=WINDOW_S / 2)


def _timed_runs(monkeypatch, *, own_s: float | None) -> dict[int, int]:
    clock = [1000.0]
    monkeypatch.setattr("workbench.tune.search.time", SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep))
    measured: dict[int, int] = {}

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        Path(tdir).mkdir(parents=True, exist_ok=True)
        v, start = _speed(trial.params["micro_batch_size"], trial.params["num_workers"]), clock[0]
        for i in range(self.session.spec.protocol.windows):
            clock[0] += WINDOW_S if i else FIRST_WINDOW_S
            measured[trial.number] = i + 1
            if on_window(i, v) if own_s is None else on_window(i, v, own_s):
                return TrialOutcome("pruned", Path(tdir), windows=[v] * (i + 1), wall_s=clock[0] - start,
                                    failure_reason=f"pruned after window {i + 1}")
        return TrialOutcome("ok", Path(tdir), windows=[v] * measured[trial.number], value=v,
                            summary={"measured_steps": 6}, wall_s=clock[0] - start)

    monkeypatch.setattr(Search, "run_search_trial", run)
    return measured


@pytest.mark.parametrize("minutes, promoted", [(0.5, False), (1.0, True)])
def test_a_trial_is_promoted_past_its_screen_only_while_the_budget_holds_its_other_windows(
        study_spec_file, tmp_path, timed_search, capsys, minutes, promoted):
    """The first screen is always promoted by the pruner. 20 s into the run it measured one window of two; the
    window left is taken at 20 s (its seconds per window so far), so it needs 40 s in all: 30 s of budget stop it
    there (pruned, its reason recorded), 60 s let it run to the end."""
    spec = study_spec_file(f"promote{int(promoted)}", space=SPACE, trials=5, sampler={"name": "grid", "seed": 1},
                           pruner={"name": "successive_halving", "reduction_factor": 2}, protocol={"windows": 2})
    t = _tuner(spec, tmp_path)
    t.session.gpu_minutes = minutes  # no baseline here: nothing spent, nothing kept for validation
    t.search()
    first = t.study.get_trials()[0]
    if not promoted:
        assert timed_search == {0: 1} and first.state == TrialState.PRUNED
        assert first.user_attrs["wall_s"] == FIRST_WINDOW_S
        stop = first.user_attrs["stopped_for_budget"]
        assert {k: v for k, v in stop.items() if k != "reason"} == {
            "after_window": 1, "windows_left": 1, "s_per_window": 20.0, "need_s": 20.0, "room_s": 10.0}
        assert first.user_attrs["failure_reason"] == stop["reason"] == (
            "stopped after window 1 of 2 for the GPU-minute budget: its other 1 would take about 0.33 GPU-minutes "
            "at 20.0 s a window, and 0.17 are left beside validation and traces")
        err = capsys.readouterr().err
        assert f"trial 0: pruned ({stop['reason']})" in err
        # 10 s left, a trial takes about 20: the search stops within the budget, after that one trial
        assert "0.17 left; a trial takes about 0.33 (the median of the 1 search trial that ran" in err
        assert len(t.study.get_trials()) == 1 and gpu_seconds(t.session)["screening"] == FIRST_WINDOW_S
        assert screening_record(t.session)["stopped_for_budget"] == 1
        # the pruner would have run it on: a later proposal of its config runs, not the stopped one's answer
        assert t.searcher.measured_twin(first.user_attrs["config_hash"], 99) is None
    else:
        assert timed_search[0] == 2 and first.state == TrialState.COMPLETE
        assert "stopped_for_budget" not in first.user_attrs and first.user_attrs["wall_s"] == 30.0
        assert screening_record(t.session)["stopped_for_budget"] == 0
    assert gpu_seconds(t.session)["screening"] + gpu_seconds(t.session)["trials"] <= minutes * 60


def test_a_screen_is_priced_at_its_windows_own_seconds_not_its_compile(study_spec_file, tmp_path,
                                                                         timed_search_own):
    """The hf-llama study on the H200: its one trial measured 64,553 tok/s in its first window, 50 s after its
    launch (most of it the compile), and was stopped there at 50 s a window left, though a window took 5 s; the
    base config was exported. Here the first window comes 20 s after the launch and takes 10 s of it: with 15 s
    of budget left, the window left (10 s) fits and the trial is measured to the end."""
    spec = study_spec_file("ownsec", space=SPACE, trials=1, sampler={"name": "grid", "seed": 1},
                           pruner={"name": "successive_halving", "reduction_factor": 2}, protocol={"windows": 2})
    t = _tuner(spec, tmp_path)
    t.session.gpu_minutes = (FIRST_WINDOW_S + 15.0) / 60  # after the first window, 15 s are left
    t.search()
    first = t.study.get_trials()[0]
    assert timed_search_own == {0: 2} and first.state == TrialState.COMPLETE
    assert "stopped_for_budget" not in first.user_attrs
    assert first.user_attrs["wall_s"] == FIRST_WINDOW_S + WINDOW_S


@pytest.mark.parametrize("left_s, stopped", [(9.0, True), (11.0, False)])
def test_later_windows_are_priced_at_the_pace_between_their_reports(study_spec_file, tmp_path, timed_search_gaps,
                                                                      left_s, stopped):
    """Three windows of 5 s each, reported 10 s apart: after the first (20 s in) the two left are priced at 5 s
    each; after the second (30 s in) the one left at the 10 s since the first's report, the longer. 9 s left
    then stop it, 11 s let it run."""
    spec = study_spec_file(f"pace{int(stopped)}", space=SPACE, trials=1, sampler={"name": "grid", "seed": 1},
                           pruner={"name": "none"}, protocol={"windows": 3})
    t = _tuner(spec, tmp_path)
    t.session.gpu_minutes = (FIRST_WINDOW_S + WINDOW_S + left_s) / 60
    t.search()
    first = t.study.get_trials()[0]
    if stopped:
        assert timed_search_gaps == {0: 2} and first.state == TrialState.PRUNED
        stop = first.user_attrs["stopped_for_budget"]
        assert (stop["after_window"], stop["s_per_window"], stop["need_s"]) == (2, WINDOW_S, WINDOW_S)
    else:
        assert timed_search_gaps == {0: 3} and first.state == TrialState.COMPLETE


def test_a_budget_that_holds_no_search_trial_says_which_keys_make_room(study_spec_file, tmp_path, fake_search,
                                                                        fake_measure, capsys):
    """The hf-llama study on the H200: top_k 2 and 4 A/B rounds at ~54 s a run kept 14.2 GPU-minutes of an
    8-minute budget, and the base config was exported without a word on why. Here (a minute a run): the baseline's
    2, 16 kept for 2 x 2 x 4 A/B runs and a trial's 1 need 19 minutes; one line says so after the baseline."""
    path = _budget_study(study_spec_file, "noroom", 8, top_k=2, ab_rounds=4)
    t = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False)
    validation = t.run()
    err = capsys.readouterr().err
    line = ("GPU-minute budget: budget.gpu_minutes 8 holds no search trial: 2.0 spent so far, 16.0 kept for "
            "validation at 1.00 a run (A/B pairs 16.0 (2 x protocol.top_k 2 x protocol.ab_rounds 4 runs)), a trial "
            "about 1.00. Raise budget.gpu_minutes to 19 or lower protocol.top_k or protocol.ab_rounds; now no search "
            "trial runs and the base config is exported")
    assert [ln for ln in err.splitlines() if ln.startswith("GPU-minute budget")] == [line]  # once, no other
    assert fake_search == [] and validation["winner"]["trial"] is None
    assert (tmp_path / "runs" / "noroom" / "config.yaml").exists()  # the base config, exported as before
    tune = json.loads((tmp_path / "runs" / "noroom" / "tune.json").read_text())
    assert tune["gpu_minutes"]["no_room"] == {"line": line, "minutes": {
        "budget": 8, "spent": 2.0, "run": 1.0, "ab_pairs": 16.0, "traces": 0.0, "trial": 1.0,
        "needed": 19.0}}
    assert tune["gpu_minutes"]["total"] == 2.0
    assert gpu_minutes_line(tune["gpu_minutes"]).endswith("; the budget held no search trial (raise it to 19)")
    # given the minutes (a resume with --gpu-minutes 19), the search runs and the record is cleared
    again = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, gpu_minutes=19)
    again.open()
    assert GpuBudget(again.session).no_room() is None and again.study.user_attrs["gpu_no_room"] is None
    again.lease.release()


def test_gpu_minutes_and_the_screening_pruner_are_checked_in_the_spec():
    head = "name: x\nspace: {num_workers: {choices: [0, 1]}}\n"
    with pytest.raises(ConfigError, match="gpu_minutes.*expected a number of minutes > 0"):
        loads_study_spec(head + "budget: {gpu_minutes: 0}\n", source="x.yaml")
    spec = loads_study_spec(head + "budget: {trials: null, gpu_minutes: 5}\n", source="x.yaml")
    assert spec.budget.gpu_minutes == 5 and spec.budget.trials is None
    with pytest.raises(ConfigError, match="reduction_factor.*expected an integer >= 2"):
        loads_study_spec(head + "pruner: {name: successive_halving, reduction_factor: 1}\n", source="x.yaml")


def test_warm_start_runs_the_earlier_studys_best_config_first(study_spec_file, tmp_path, fake_search):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = _tuner(study_spec_file("first", space=SPACE, trials=8, sampler={"name": "grid", "seed": 0}),
                   tmp_path, storage_url=url)
    first.search()
    second_spec = study_spec_file("second", space=SPACE, trials=2, sampler={"name": "random", "seed": 5})
    second = _tuner(second_spec, tmp_path, storage_url=url)
    queued = second.study.get_trials()
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING
    assert queued[0].system_attrs["fixed_params"] == {"micro_batch_size": 8, "num_workers": 1}
    second.search()
    t0 = second.study.get_trials()[0]
    assert t0.params == {"micro_batch_size": 8, "num_workers": 1}
    assert t0.user_attrs["warm_start"] == {"study": "first", "trial": next(
        tr.number for tr in first.study.get_trials() if tr.params == t0.params)}
    # another model is not the same workload: nothing to start from
    other = yaml.safe_load(second_spec.read_text())
    other.update(name="third", model="tiny-gqa")
    (p := tmp_path / "third.yaml").write_text(yaml.safe_dump(other))
    third = _tuner(p, tmp_path, storage_url=url)
    assert third.study.get_trials() == [] and third.study.user_attrs["warm_start"] is None


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_warm_start_holds_what_it_knows_while_the_startup_draws_the_new_knobs(study_spec_file, tmp_path,
                                                                               fake_search, sampler, capsys):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _tuner(study_spec_file("first", space=SPACE, trials=8, sampler={"name": "grid", "seed": 0}), tmp_path,
           storage_url=url).search()
    wider = {**SPACE, "activation_checkpointing": {"choices": ["none", "full"]}}
    spec = study_spec_file("second", space=wider, trials=4,
                           sampler={"name": sampler, "seed": 2, "n_startup_trials": 3})
    second = _tuner(spec, tmp_path, storage_url=url)
    assert second.study.user_attrs["warm_start"]["new"] == ["activation_checkpointing"]
    assert ("the first 3 trials change activation_checkpointing, which it did not search, one at a time from the "
            "best so far") in capsys.readouterr().err
    fake_search.clear()
    second.search()
    ran = [p for p, _ in fake_search]
    # the earlier study's best (mb 8, a worker) runs first; the next startup trial keeps it and draws the other
    # checkpointing; with that neighbourhood measured, the third startup trial is an untried config elsewhere
    assert [(p["micro_batch_size"], p["num_workers"]) for p in ran[:2]] == [(8, 1), (8, 1)]
    assert {p["activation_checkpointing"] for p in ran[:2]} == {"none", "full"}
    assert (ran[2]["micro_batch_size"], ran[2]["num_workers"]) != (8, 1)
    assert len({tuple(sorted(p.items())) for p in ran}) == len(ran) == 4  # no repeat
    assert not second.study.sampler.held(second.study)  # after the startup every knob is drawn
    # a warm start from a study that searched every knob holds nothing
    third = _tuner(study_spec_file("third", space=SPACE, trials=2, sampler={"name": sampler, "seed": 2}), tmp_path,
                   storage_url=url)
    assert third.study.user_attrs["warm_start"]["new"] == [] and not third.study.sampler.held(third.study)


@pytest.mark.parametrize("startup", [4, 2])
@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_warm_started_startup_walks_the_new_knobs_one_at_a_time(study_spec_file, tmp_path, monkeypatch, sampler,
                                                                  startup):
    """The earlier study searched the micro-batch alone; this one adds three knobs that each add speed at one of
    their values. Whatever the first trial draws for them, its startup reaches the fastest config. With 2 startup
    trials the walk still changes each of the 3 new knobs once: the startup lasts one trial more than them."""
    gain = {"num_workers": {1: 300.0}, "activation_checkpointing": {"none": 200.0}, "bucket_width": {64: 100.0}}
    ran: list[dict] = []

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        p = dict(trial.params)
        ran.append(p)
        v = 1000.0 * p["micro_batch_size"] + sum(g.get(p.get(k), 0.0) for k, g in gain.items())
        return TrialOutcome("ok", Path(tdir), windows=[v] * 3, value=v, summary={"measured_steps": 6}, wall_s=RUN_S)

    monkeypatch.setattr(Search, "run_search_trial", run)
    wider = {"micro_batch_size": {"choices": [2, 8]}, "num_workers": {"choices": [0, 1]},
             "activation_checkpointing": {"choices": ["none", "full"]}, "bucket_width": {"choices": [32, 64]}}
    best = (8, 1, "none", 64)
    for seed in range(4):
        url = f"sqlite:///{tmp_path / f'shared{seed}.db'}"
        _tuner(study_spec_file(f"first{seed}-{startup}", space={"micro_batch_size": {"choices": [2, 8]}}, trials=2,
                               sampler={"name": "grid", "seed": 0}), tmp_path, storage_url=url).search()
        ran.clear()
        t = _tuner(study_spec_file(f"second{seed}-{startup}", space=wider, trials=4,
                                   sampler={"name": sampler, "seed": seed, "n_startup_trials": startup}),
                   tmp_path, storage_url=url)
        assert t.study.user_attrs["warm_start"]["new"] == ["num_workers", "activation_checkpointing", "bucket_width"]
        t.search()
        assert all(p["micro_batch_size"] == 8 for p in ran)  # what the earlier study knew is kept
        # each startup trial after the first changes one new knob of the best so far, the next in knob order
        # whether or not the one before won (cyclic: a new best does not try the knobs before its own again)
        keys = ("micro_batch_size", "num_workers", "activation_checkpointing", "bucket_width")
        seen = [tuple(p[k] for k in keys) for p in ran]
        for i in range(1, 4):
            incumbent = max(seen[:i], key=lambda c: (c[1] == 1) * 300 + (c[2] == "none") * 200 + (c[3] == 64) * 100)
            assert [k for k, a, b in zip(keys, seen[i], incumbent) if a != b] == [keys[i]], (seed, seen)
        assert best in seen, (seed, seen)
        # the record of the walk, read back from the trials, names the same steps
        walk = warm_walk(t.study.get_trials(), list(keys[1:]))
        assert [(w["trial"], w["knob"]) for w in walk] == [(i, keys[i]) for i in range(1, 4)], (seed, walk)


def test_tune_json_and_the_report_say_what_the_warm_start_did(study_spec_file, tmp_path, fake_search,
                                                               fake_measure):
    from reports import build_report

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _tuner(study_spec_file("first", space=SPACE, trials=8, sampler={"name": "grid", "seed": 0}), tmp_path,
           storage_url=url).search()
    wider = {**SPACE, "activation_checkpointing": {"choices": ["none", "full"]}}
    spec = study_spec_file("rep", space=wider, trials=2, sampler={"name": "tpe", "seed": 0, "n_startup_trials": 2},
                           protocol={"baseline_repeats": 1, "top_k": 1, "ab_rounds": 1, "profile_steps": 0})
    t = Tuner(load_study_spec(str(spec)), out_root=tmp_path / "runs", progress=False, storage_url=url)
    t.run()
    tune = json.loads((tmp_path / "runs" / "rep" / "tune.json").read_text())
    first = next(tr.number for tr in optuna.load_study(study_name="first", storage=url).trials
                 if tr.params == {"micro_batch_size": 8, "num_workers": 1})
    # the walk as its trials took it: trial 1 is trial 0 with the new knob's other choice
    ac = [tr.params["activation_checkpointing"] for tr in t.study.get_trials()[:2]]
    assert ac[0] != ac[1]
    assert tune["warm_start"] == {"study": "first", "trial": first, "params": {"micro_batch_size": 8, "num_workers": 1},
                                  "new": ["activation_checkpointing"],
                                  "walk": [{"trial": 1, "knob": "activation_checkpointing", "from": ac[0], "to": ac[1],
                                            "of": 0, "value": 8100.0, "status": "ok"}]}
    html = build_report(tmp_path / "runs" / "rep").read_text()
    assert (f'<p id="warm-start">The first trial was trial {first} of the earlier study first (same model and '
            f"hardware), 2 of its values kept; then one new knob at a time from the best so far: trial 1: "
            f"activation_checkpointing {ac[0]} -&gt; {ac[1]} from trial 0 (8,100).</p>") in html
    # a record without the walk (a tune.json written before it was kept) says what the startup was to do
    assert warm_start_line({**tune["warm_start"], "walk": None}, 2).endswith(
        "the first 2 trial(s) changed activation_checkpointing, which it did not search, one at a time from the best "
        "so far")


def test_the_progress_bar_counts_validation_and_traces():
    bar = Progress(5, "t", enabled=False, after=10)
    assert bar.total == 15
    bar.set(done=5)
    for _ in range(3):
        bar.run_after_search()
    assert bar.n == 8 and bar.total == 15
    bar.finish()  # validation stopped early: the bar ends full at what ran
    assert bar.n == bar.total == 8


@pytest.mark.parametrize(("minutes", "second"), [(16, (2, "budget")), (40, (3, "cap"))])
def test_a_validation_pair_past_the_fewest_runs_only_where_the_budget_holds_it(study_spec_file, tmp_path, fake_search,
                                                                               monkeypatch, minutes, second):
    """Two candidates with 2 to 3 A/B pairs each (top_k 2, ab_min_rounds 2, ab_rounds 3), a minute a run, each
    candidate's runs alternately 1.3x and 0.8x the base (its interval includes 1.0 after 2 pairs). The reserve is
    both candidates' 2 pairs and the leader's third: on 16 GPU-minutes the search spends the rest, the leader runs
    its 3 pairs and the second candidate stops at 2 for the budget; on 40 the search covers the space first and
    both run 3."""
    runs: dict[tuple[int, int], int] = {}

    def run_trial(cfg, run_dir, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        key = (cfg.data.micro_batch_size, cfg.data.num_workers)
        v = _speed(*key)
        if Path(run_dir).name.startswith(".trial-"):  # (its attempt folder)
            runs[key] = runs.get(key, 0) + 1
            v *= 1.3 if runs[key] % 2 else 0.8
        return TrialOutcome("ok", Path(run_dir), windows=[v, v], value=v, summary={"measured_steps": 6}, wall_s=RUN_S)

    monkeypatch.setattr(measure, "run_trial", run_trial)
    path = _budget_study(study_spec_file, f"abmin{minutes}", minutes, top_k=2, ab_rounds=3)
    spec = yaml.safe_load(path.read_text())
    spec["protocol"]["ab_min_rounds"] = 2
    path.write_text(yaml.safe_dump(spec))
    validation = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False).run()
    leader, other = validation["candidates"]
    assert (len(leader["ratios"]), leader["stopped"]) == (3, "cap")
    assert (len(other["ratios"]), other["stopped"]) == second
    tune = json.loads((tmp_path / "runs" / f"abmin{minutes}" / "tune.json").read_text())
    assert tune["gpu_minutes"]["by_phase"]["validation"] == pytest.approx(2 * (3 + second[0]))
    assert tune["gpu_minutes"]["total"] <= minutes


def test_twins_stop_where_their_trials_wait_longer_for_them_than_they_save(study_spec_file, tmp_path):
    """gr00t-n1.6-vla-w8 on one H100: trials 0 and 9 compiled their own graphs in 18.4 and 20.9 s, trials 2 and 3
    read theirs from the cache (skipped as compiled; after a finished twin) in 3.8 and 3.2 s: a finished twin is
    worth 16.15 s to its trial. A trial with nothing to compile, and one whose twin was stopped (it read part of
    its graphs), count to neither median. Trials 3 and 5 waited 22.3 and 23.7 s for their twins: from then on no
    twin starts (w8's trials 7 and 17 waited 24.0 and 26.5 s more, and compiled 6.9 and 6.2 s after)."""
    t = _tuner(study_spec_file("worth", space=SPACE, trials=20), tmp_path)
    s, study = t.session, t.study
    assert twin_worth_s(s) is None and twins_unpaid(s) == ""

    def ran(compiled, ahead=None, state=TrialState.COMPLETE):
        attrs = {"wall_s": 30.0, "status": "ok" if state == TrialState.COMPLETE else "oom",
                 "timeline": {"compile_s": compiled}}
        if ahead is not None:
            attrs["compile_ahead"] = ahead
        study.add_trial(optuna.trial.create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                                                  user_attrs=attrs))

    ran(18.4)
    ran(0.0, {"status": "skipped", "reason": "nothing to compile"})
    assert twin_worth_s(s) is None  # nothing read from the cache yet
    ran(3.8, {"status": "skipped", "reason": "its graphs are compiled (trial 0)"})
    assert twin_worth_s(s) == pytest.approx(18.4 - 3.8)
    ran(3.2, {"status": "done", "waited_s": 22.3})
    assert twins_unpaid(s) == ""  # one finished twin: not judged yet
    ran(20.9, {"status": "failed", "waited_s": 0.6})
    ran(9.0, {"status": "stopped", "waited_s": 16.0})
    assert twin_worth_s(s) == pytest.approx((18.4 + 20.9) / 2 - (3.8 + 3.2) / 2)
    ran(3.9, {"status": "done", "waited_s": 23.7})
    assert twin_worth_s(s) == pytest.approx(19.65 - 3.8)
    assert twins_unpaid(s) == ("twins do not pay here: trials waited a median 23.0 s for the 2 that finished, and a "
                               "finished twin saves its trial 15.8 s of compile")
    # gr00t-n1.6-w4h100: twins that mostly finished beside their trial pay (waits 0.0, 5.7, 1.2 against 6.4)
    t2 = _tuner(study_spec_file("pays", space=SPACE, trials=20), tmp_path / "pays")
    s, study = t2.session, t2.study
    ran(12.6, {"status": "skipped", "reason": "the trial and its twin need 80.8 GiB together"})
    ran(4.1, {"status": "done", "waited_s": 0.0})
    ran(5.6, {"status": "done", "waited_s": 5.7})
    ran(5.9, {"status": "done", "waited_s": 1.2}, state=TrialState.FAIL)  # a failed trial waited too
    assert twin_worth_s(s) == pytest.approx(12.6 - 4.85) and twins_unpaid(s) == ""


def test_a_trial_whose_graphs_another_twin_compiled_read_them_from_the_cache(study_spec_file, tmp_path):
    """A twin skipped because another twin was compiling the same graph key: its trial read the cache."""
    t = _tuner(study_spec_file("being", space=SPACE, trials=20), tmp_path)
    for compiled, ahead in [(20.0, None), (4.0, {"status": "skipped",
                                                  "reason": "its graphs are being compiled by trial 1's twin"})]:
        attrs = {"wall_s": 30.0, "status": "ok", "timeline": {"compile_s": compiled},
                 **({"compile_ahead": ahead} if ahead else {})}
        t.study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs))
    assert twin_worth_s(t.session) == pytest.approx(16.0)
