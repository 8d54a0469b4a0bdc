"""The study keeps torch.profiler traces of its baseline and of its winner, in trace runs of their own after the
A/B validation, and tune.json's result points at them (workbench.tune.measure.Measurer.keep_traces)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from optuna.trial import TrialState

from workbench.tune import validation
from workbench.tune.study import load_study_spec
from workbench.tune.tuner import Tuner

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")


def _step_ranges(path: Path) -> Counter:
    trace = json.loads(path.read_text())
    return Counter(e["name"] for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("step "))


def test_a_study_keeps_the_traces_of_its_baseline_and_winner(study_spec_file, tmp_path, monkeypatch):
    spec = load_study_spec(str(study_spec_file("tr", trials=1, protocol={
        "baseline_repeats": 1, "top_k": 1, "ab_rounds": 1, "profile_steps": 2})))

    # a winner whatever the noise of two shared cores: the first ok trial is the candidate, its interval above 1.0
    def candidates(session):
        ok = [t for t in session.trials((TrialState.COMPLETE,)) if t.user_attrs.get("status") == "ok"]
        return ok[:1], []

    monkeypatch.setattr(validation, "candidates", candidates)
    monkeypatch.setattr(validation, "interval_fields", lambda runs, base, confidence: {
        "ratios": [1.2] * len(runs), "speedup_median": 1.2, "ci_low": 1.1, "ci_high": 1.3, "significant": True})
    Tuner(spec, out_root=tmp_path / "runs", progress=False, report=None).run()

    sdir = (tmp_path / "runs" / "tr").resolve()
    tune = json.loads((sdir / "tune.json").read_text())
    result = tune["result"]
    assert result["verdict"] == "winner"
    traces = result["traces"]
    assert traces == json.loads((sdir / "validation.json").read_text())["traces"]
    assert traces["steps"] == 2
    for name, trial in (("baseline", None), ("winner", result["exported"]["trial"])):
        rec = traces[name]
        assert rec["status"] == "ok" and rec["trial"] == trial
        assert rec["path"] == str(sdir / "traces" / name / "trace.json")
        assert rec["memory_snapshot"] is None  # CPU
        # the protocol's warm-up (2 steps), then the 2 profiled ones
        assert _step_ranges(Path(rec["path"])) == {"step 3": 1, "step 4": 1}
        summary = json.loads((sdir / "traces" / name / "summary.json").read_text())
        assert summary["profile/steps"] == 2 and summary["steps"] == 4
    # no measured run is profiled: the baseline repeat and the A/B runs carry no trace
    assert not list((sdir / "baseline").rglob("trace.json")) and not list((sdir / "validation").rglob("trace.json"))
    assert not list((sdir / "trials").rglob("trace.json"))

    # the report's "Where the time goes" reads them: a link to each, the winner's top ops by self time
    from reports._load import load_study_data
    from reports.sections.phases import time_section

    s = time_section(load_study_data(sdir))
    assert list(s.traces.index) == ["baseline", "winner"] and s.traces_message is None
    assert s.top_ops_of == "winner" and 0 < len(s.top_ops) <= 10
    # torch's ops, never the trace's step or phase ranges; the autograd engine's node wrappers
    # (autograd::engine::evaluate_function: PowBackward0) hold self time of their own and may rank
    assert all(n.split("::")[0] in ("aten", "autograd") for n in s.top_ops["name"])
    assert s.top_ops["name"].str.startswith("aten::").any()
