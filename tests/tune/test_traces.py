"""The study keeps torch.profiler traces of its baseline and of its winner without a run of their own: the steps
are profiled after the measurement of runs made anyway (the winner's first A/B pair, the last baseline repeat),
and tune.json's result points at them (workbench.tune.measure.Measurer.keep_traces)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from optuna.trial import TrialState

from workbench.tune import measure, validation
from workbench.tune.study import load_study_spec
from workbench.tune.tuner import Tuner

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")


def _step_ranges(path: Path) -> Counter:
    trace = json.loads(path.read_text())
    return Counter(e["name"] for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("step "))


def _windows(run_dir: Path) -> list[tuple[int, int]]:
    return [(w["step"], w["steps"]) for w in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _count_runs(monkeypatch) -> list[str]:
    """The runs the coordinator measures from now on (baseline, validation, anything else), as ``phase/run``."""
    ran: list[str] = []
    real = measure.run_trial

    def run_trial(cfg, trial_dir, **kw):
        ran.append(f"{trial_dir.parent.name}/{trial_dir.name[1:].split('.')[0]}")  # (its attempt folder .<run>.<id>)
        return real(cfg, trial_dir, **kw)

    monkeypatch.setattr(measure, "run_trial", run_trial)
    return ran


def test_a_study_keeps_the_traces_of_its_winners_pair(study_spec_file, tmp_path, monkeypatch):
    # the protocol: warm-up 2, then 2 windows of 3 steps (8 steps), 2 steps profiled after them
    spec = load_study_spec(str(study_spec_file("tr", trials=1, protocol={
        "baseline_repeats": 2, "top_k": 1, "ab_rounds": 2, "profile_steps": 2})))

    # a winner whatever the noise of two shared cores: the first ok trial is the candidate, its interval above 1.0
    def candidates(session):
        ok = [t for t in session.trials((TrialState.COMPLETE,)) if t.user_attrs.get("status") == "ok"]
        return ok[:1], []

    monkeypatch.setattr(validation, "candidates", candidates)
    monkeypatch.setattr(validation, "interval_fields", lambda runs, base, confidence: {
        "ratios": [1.2] * len(runs), "speedup_median": 1.2, "ci_low": 1.1, "ci_high": 1.3, "significant": True})
    ran = _count_runs(monkeypatch)
    Tuner(spec, out_root=tmp_path / "runs", progress=False, report=None).run()

    sdir = (tmp_path / "runs" / "tr").resolve()
    tune = json.loads((sdir / "tune.json").read_text())
    result = tune["result"]
    assert result["verdict"] == "winner"
    k = result["exported"]["trial"]
    # no run of their own: the 2 baseline repeats and the 2 A/B pairs are all the coordinator ran
    assert ran == ["baseline/0", "baseline/1", f"validation/baseline-{k}-0", f"validation/trial-{k}-0",
                   f"validation/baseline-{k}-1", f"validation/trial-{k}-1"]
    assert not (sdir / "traces").exists()
    assert tune["gpu_minutes"]["by_phase"]["traces"] == 0 and tune["gpu_minutes"]["by_phase"]["validation"] > 0

    traces = result["traces"]
    assert traces == json.loads((sdir / "validation.json").read_text())["traces"]
    assert traces["steps"] == 2
    # the winner's trace is its first pair's; the base config's is the last baseline repeat's, which profiled it
    # (the pair's baseline run is not profiled again)
    for name, trial, run_dir in (("baseline", None, sdir / "baseline" / "1"),
                                 ("winner", k, sdir / "validation" / f"trial-{k}-0")):
        rec = traces[name]
        assert rec == {"trial": trial, "run_dir": str(run_dir), "path": str(run_dir / "trace.json"),
                       "memory_snapshot": None, "status": "ok"}  # CPU: no memory snapshot
        # the 8 measured steps, then the 2 profiled ones
        assert _step_ranges(Path(rec["path"])) == {"step 9": 1, "step 10": 1}
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["steps"], summary["measured_steps"], summary["windows"]) == (8, 6, 2)
        assert summary["profile/steps"] == 2 and summary["profile/first_step"] == 9
        assert _windows(run_dir) == [(5, 3), (8, 3)]  # the measured windows alone
        assert "profile_after_measure: true" in (run_dir / "config.yaml").read_text()
    cand = json.loads((sdir / "validation.json").read_text())["candidates"][0]
    assert cand["run_dirs"] == [str(sdir / "validation" / f"trial-{k}-{r}") for r in (0, 1)]
    # the second pair, the pairs' baseline runs, the first baseline repeat and the search trial are not profiled
    for run in (f"trial-{k}-1", f"baseline-{k}-0", f"baseline-{k}-1"):
        assert not (sdir / "validation" / run / "trace.json").exists(), run
        assert "profile_after_measure: true" not in (sdir / "validation" / run / "config.yaml").read_text(), run
    assert not (sdir / "baseline" / "0" / "trace.json").exists()
    assert not list((sdir / "trials").rglob("trace.json"))

    # the report's "Where the time goes" reads them: a link to each, the winner's top ops by self time
    from reports._load import load_study_data
    from reports.sections.phases import time_section

    s = time_section(load_study_data(sdir))
    assert list(s.traces.index) == ["baseline", "winner"] and s.traces_message is None
    assert s.traces.loc["winner", "file"] == f"validation/trial-{k}-0/trace.json"
    assert s.top_ops_of == "winner" and 0 < len(s.top_ops) <= 10
    # torch's ops, never the trace's step or phase ranges. Which ops rank is the machine's say: under load the
    # autograd engine's nodes (MmBackward0, torch::autograd::AccumulateGrad) hold self time of their own too
    from reports.sections._traces import op_self_times, read_events

    events = op_self_times(read_events(sdir / s.traces.loc["winner", "file"]))
    ranges = set(events.loc[events["cat"] == "user_annotation", "name"])
    assert {"step 9", "step 10", "forward", "backward"} <= ranges
    assert set(s.top_ops["name"]) <= set(events.loc[events["cat"] == "cpu_op", "name"]) - ranges
    assert s.top_ops["name"].str.startswith("aten::").any()

    # a coordinator that died after validation.json was written: the study resumes and runs nothing again
    tune["finished"] = None
    (sdir / "tune.json").write_text(json.dumps(tune))
    ran.clear()
    Tuner(spec, out_root=tmp_path / "runs", progress=False, report=None).run()
    again = json.loads((sdir / "tune.json").read_text())
    assert ran == [] and again["finished"] and again["result"]["traces"] == traces


def test_without_a_winner_the_base_trace_is_the_last_baseline_repeats(study_spec_file, tmp_path, monkeypatch):
    spec = load_study_spec(str(study_spec_file("nw", trials=1, protocol={
        "baseline_repeats": 2, "top_k": 0, "profile_steps": 2})))
    ran = _count_runs(monkeypatch)
    t = Tuner(spec, out_root=tmp_path / "runs", progress=False, report=None)
    t.run()
    sdir = (tmp_path / "runs" / "nw").resolve()
    tune = json.loads((sdir / "tune.json").read_text())
    assert tune["result"]["verdict"] == "no_candidate" and tune["result"]["exported"]["trial"] is None
    assert ran == ["baseline/0", "baseline/1"] and not (sdir / "traces").exists()
    assert not (sdir / "validation").exists()
    assert tune["gpu_minutes"]["by_phase"]["traces"] == 0
    last = sdir / "baseline" / "1"
    assert tune["result"]["traces"] == {"steps": 2, "winner": None, "baseline": {
        "trial": None, "run_dir": str(last), "path": str(last / "trace.json"), "memory_snapshot": None,
        "status": "ok"}}
    assert _step_ranges(last / "trace.json") == {"step 9": 1, "step 10": 1}
    assert _windows(last) == _windows(sdir / "baseline" / "0") == [(5, 3), (8, 3)]
    # the noise floor is the repeats' windows, the profiled steps in none of them
    base = json.loads((last / "summary.json").read_text())
    assert base["measured_steps"] == 6 and base["profile/steps"] == 2
    # what the profiled steps added to the last repeat's run: not a run's time in the budget's reserve
    walls, extra = t.study.user_attrs["baseline_wall_s"], t.study.user_attrs["baseline_profile_s"]
    assert 0 < extra < walls[1]


def test_a_run_whose_profiled_steps_failed_says_so_where_its_trace_is_missing(tmp_path):
    """The trainer keeps the measurement of a run whose steps profiled after it failed (``profile/error`` in its
    summary, no trace.json); the study's trace record gives that error as the reason it holds no trace."""
    from types import SimpleNamespace

    lines: list[str] = []
    session = SimpleNamespace(spec=SimpleNamespace(protocol=SimpleNamespace(start_ahead=False), trainer=None),
                              log=lines.append)
    m = measure.Measurer(session, lease=None)
    broken, plain = tmp_path / "trial-2-0", tmp_path / "trial-3-0"
    for d, extra in ((broken, {"profile/error": "SystemError: apply returned NULL"}), (plain, {})):
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"tokens_per_s": 100.0, "profile/steps": 1, **extra}))
    rec = m.trace_record(broken, "winner", 2)
    assert (rec["status"], rec["path"]) == ("ok", None)
    assert rec["reason"] == "its profiled steps failed after the measurement: SystemError: apply returned NULL"
    assert lines[-1] == f"trace of the winner: none kept ({rec['reason']})"
    assert m.trace_record(plain, "winner", 3)["reason"].startswith("the run holds no trace.json (measured unprofiled")
