"""``verify``'s verdict on known numbers (``workbench.tune.verify``): the speedup holds when the new median lies
inside the validated interval and the new interval is no wider than ``INCONCLUSIVE_WIDTH`` times the validated
one; a wider one is "inconclusive" (exit 1 like "does not hold"), and it says what to do."""

from __future__ import annotations

import json

import pytest

from workbench.tune.verify import Verification, verify_lines


class _Spec:
    def measured_base_config(self):
        return "base"

    def trial_config(self, params):
        return "trial"


class Stub(Verification):
    """The Tuner's parts verify uses, with A/B pairs that return the given throughputs."""

    def __init__(self, tmp_path, runs, baseline_runs, validated):
        self.study_dir, self.study_name, self.study, self.spec = tmp_path, "s", object(), _Spec()
        self.runs, self.baseline_runs = runs, baseline_runs
        self.validated = validated
        self.lines: list[str] = []

    def stored_result(self):
        lo, hi, med = self.validated
        return {"verdict": "winner", "exported": {"trial": 2, "params": {}, "changed": {"micro_batch_size": {}}},
                "best": {"speedup": med, "ci_low": lo, "ci_high": hi, "pairs": 3}}

    def _log(self, line):
        self.lines.append(line)

    def _release_lease(self):
        pass

    def ab_pairs(self, base_cfg, arms, vdir, **kw):
        assert kw["max_pairs"] == kw["min_pairs"] == len(self.runs)  # a fixed count: no early stop
        return {k: {"runs": self.runs, "baseline_runs": self.baseline_runs, "failures": []} for k in arms}


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
