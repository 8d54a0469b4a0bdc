"""``verify``'s verdict on known numbers (``workbench.tune.verify``): the speedup holds when the new median lies
inside the validated interval and the new interval is no wider than ``INCONCLUSIVE_WIDTH`` times the validated
one; a wider one is "inconclusive" (exit 1 like "does not hold"), and it says what to do."""

from __future__ import annotations

import json
from types import SimpleNamespace

import optuna
import pytest

from workbench.config import Config, merge_overrides
from workbench.tune.trial import TrialOutcome
from workbench.tune.verify import verify, verify_lines, verify_pairs


class _Spec:
    def measured_base_config(self):
        return Config()

    def trial_config(self, params):
        return merge_overrides(Config(), {"data.micro_batch_size": 8})


class Stub:
    """What verify uses: a session (study folder, spec, study, a log) and a measurer whose A/B pairs return the
    given throughputs, by round."""

    def __init__(self, tmp_path, runs, baseline_runs, validated):
        self.runs, self.baseline_runs = runs, baseline_runs
        self.validated = validated
        self.lines: list[str] = []
        self.measured: list[str] = []
        self.session = SimpleNamespace(study_dir=tmp_path, study_name="s", spec=_Spec(), study=optuna.create_study(),
                                       log=self.lines.append)

    def stored_result(self):
        lo, hi, med = self.validated
        return {"verdict": "winner", "exported": {"trial": 2, "params": {}, "changed": {"micro_batch_size": {}}},
                "best": {"speedup": med, "ci_low": lo, "ci_high": hi, "pairs": 3}}

    def check_lease(self):
        pass

    def measure(self, cfg, run_dir, prefix, phase, then=None):
        kind, _, r = run_dir.name.split("-")  # baseline-<trial>-<round>, trial-<trial>-<round>
        self.measured.append(run_dir.name)
        return TrialOutcome("ok", run_dir, value=(self.runs if kind == "trial" else self.baseline_runs)[int(r)])

    def verify(self):
        result = self.stored_result()
        record = verify(self.session, self, result, verify_pairs(result, None))
        assert len(self.measured) == 2 * len(self.runs)  # a fixed count of pairs: no early stop
        return record


def test_a_tight_check_inside_the_validated_interval_holds(tmp_path):
    rec = Stub(tmp_path, [210.0, 220.0, 205.0], [100.0, 101.0, 99.0], (1.9, 2.5, 2.2)).verify()
    assert rec["verdict"] == "holds" and rec["holds"] and rec["width_ratio"] < 2.0
    assert "the speedup holds" in verify_lines(rec)[0]
    assert json.loads((tmp_path / "verify.json").read_text())[-1]["verdict"] == "holds"


def test_a_check_outside_it_does_not_hold(tmp_path):
    rec = Stub(tmp_path, [120.0, 125.0, 118.0], [100.0, 101.0, 99.0], (1.9, 2.5, 2.2)).verify()
    assert rec["verdict"] == "does not hold" and not rec["holds"]
    assert "does NOT hold" in verify_lines(rec)[0]


def test_a_wide_interval_is_inconclusive_not_holds(tmp_path):
    """Issue 40: "holds" at 1.608x [0.117, 21.264] beside a CPU-burning process; its median lies inside the
    validated [1.479, 2.437], yet an interval that wide would hold any speedup."""
    rec = Stub(tmp_path, [161.0, 400.0, 60.0], [100.0, 100.0, 100.0], (1.479, 2.437, 1.94)).verify()
    assert rec["inside"] and rec["ci_low"] < 0.2 and rec["ci_high"] > 15
    assert rec["width_ratio"] == pytest.approx(9.0, abs=1.0)
    assert rec["verdict"] == "inconclusive" and rec["holds"] is False
    line = verify_lines(rec)[0]
    assert "inconclusive: its interval is" in line and "more than 2x" in line and "--pairs N" in line
