"""The winner beside the plain compiled loop after validation (``validation.against_plain``): measured by
interleaved A/B pairs where the study's base is not that loop, the validation's own ratio where it is, and one
line why where it does not apply."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from workbench.config import Config, config_hash, merge_overrides
from workbench.tune.budget import GpuBudget, reserved_seconds, runs_after_search
from workbench.tune.result import reference_line
from workbench.tune.stats import pair_ratios, sequential_confidence, speedup_interval
from workbench.tune.trial import TrialOutcome
from workbench.tune.validation import PLAIN_LOOP, ab_pairs, against_plain, plain_loop_config

EAGER = Config()  # compile: none, as the VLA study's base
COMPILED = merge_overrides(EAGER, {"loongforge.compute_domain.compile": "default"})


class Spec:
    protocol = SimpleNamespace(top_k=1, ab_rounds=3, ab_min_rounds=None, profile_steps=2, baseline_repeats=1)
    gpus = 1

    def __init__(self, base, trainer=None):
        self.base, self.trainer = base, trainer

    def measured_base_config(self):
        return self.base

    def trial_config(self, params):
        return merge_overrides(self.base, params)


class Stub:
    """What against_plain uses: a session (spec, study, study folder, hardware, the reference switch, a log) and a
    measurer (a lease check, and a measurement that records what it ran: value by folder, the plain loop 100, the
    winner 130)."""

    def __init__(self, tmp_path, base, *, cuda=True, reference=True, trainer=None, winner=(130.0,), baseline=(100.0,)):
        self.measured: list[tuple[str, str]] = []
        self.winner = list(winner)  # the winner's values, pair by pair, the last repeated
        self.baseline = list(baseline)  # the base's (or reference's), the same way
        self.lines: list[str] = []
        self.session = SimpleNamespace(
            spec=Spec(base, trainer), study_dir=tmp_path, reference=reference, log=self.lines.append,
            study=optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="r", load_if_exists=True),
            hardware={"capabilities": ["cuda"] if cuda else []})

    def against_plain(self, best, **kw):
        return against_plain(self.session, self, best, **kw)

    def check_lease(self):
        pass

    def measure(self, cfg, run_dir, prefix, phase, then=None):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.measured.append((run_dir.name, cfg.loongforge.compute_domain.compile))
        values = self.winner if run_dir.name.startswith("trial") else self.baseline
        return TrialOutcome("ok", run_dir, value=values.pop(0) if len(values) > 1 else values[0])


BEST = {"trial": 4, "params": {"data.micro_batch_size": 8}, "ratios": [1.2, 1.25], "speedup_median": 1.224,
        "ci_low": 1.1, "ci_high": 1.35, "significant": True, "runs": [120.0, 125.0], "baseline_runs": [100.0] * 2}


def test_an_eager_base_is_measured_against_the_compiled_loop(tmp_path):
    v = Stub(tmp_path, EAGER)
    r = v.against_plain(BEST, max_pairs=4, min_pairs=2, confidence=0.95)
    # the reference runs compiled; the winner is the trial's config (the base's compile, eager here)
    assert v.measured == [("baseline-4-0", "default"), ("trial-4-0", "none"),
                          ("baseline-4-1", "default"), ("trial-4-1", "none")]
    assert (tmp_path / "validation" / "reference" / "trial-4-1").is_dir()
    assert r["ran"] and not r["same_as_base"] and r["pairs"] == 2 and r["stopped"] == "interval excludes 1.0"
    assert r["speedup_median"] == pytest.approx(1.3) and r["runs"] == [130.0, 130.0]
    assert any("against the plain compiled loop: 1.300x" in line for line in v.lines)
    # resumed from the study, like the validation's pairs: nothing runs again
    again = Stub(tmp_path, EAGER)
    assert again.against_plain(BEST, max_pairs=4, min_pairs=2, confidence=0.95)["pairs"] == 2
    assert again.measured == []


def test_a_base_that_is_the_plain_loop_reuses_the_validation(tmp_path):
    assert config_hash(plain_loop_config(COMPILED)) == config_hash(COMPILED)
    v = Stub(tmp_path, COMPILED)
    r = v.against_plain(BEST, max_pairs=4, min_pairs=2, confidence=0.95)
    assert v.measured == [] and r["same_as_base"] and r["ran"]
    assert (r["speedup_median"], r["ci_low"], r["ci_high"], r["pairs"]) == (1.224, 1.1, 1.35, 2)


@pytest.mark.parametrize(("kw", "best", "words"), [
    ({"cuda": False}, BEST, "not a GPU study"),
    ({"reference": False}, BEST, "off (--no-reference)"),
    ({"trainer": object()}, BEST, "a loop of one's own"),
    ({}, None, "no winner"),
])
def test_where_it_does_not_apply_it_says_why_and_runs_nothing(tmp_path, kw, best, words):
    v = Stub(tmp_path, EAGER, **kw)
    r = v.against_plain(best, max_pairs=4, min_pairs=2, confidence=0.95)
    assert r["ran"] is False and words in r["reason"] and v.measured == []


def test_the_plain_loop_is_the_base_with_default_compile_and_no_graphs():
    captured = merge_overrides(EAGER, {"loongforge.compute_domain.graph_capture": "fwd_bwd",
                                       "data.micro_batch_size": 16})
    plain = plain_loop_config(captured)
    cd = plain.loongforge.compute_domain
    assert (cd.compile, cd.graph_capture, plain.data.micro_batch_size) == ("default", "none", 16)
    assert set(PLAIN_LOOP) == {"loongforge.compute_domain.compile", "loongforge.compute_domain.graph_capture"}


def test_the_line_the_terminal_and_the_report_print():
    ref = {"reference": "the plain compiled loop", "ran": True, "same_as_base": False, "speedup_median": 1.3,
           "ci_low": 1.21, "ci_high": 1.39, "pairs": 2}
    assert reference_line(ref) == "against the plain compiled loop: 1.300x [1.210, 1.390] over 2 interleaved A/B pairs"
    assert reference_line({**ref, "same_as_base": True}).endswith(
        "over 2 A/B pairs of the validation (the study's base is that loop)")
    assert reference_line({**ref, "speedup_median": None}) == "against the plain compiled loop: no A/B pair completed"
    assert reference_line({"reference": "the plain compiled loop", "ran": False, "reason": "off (--no-reference)"}) \
        == "against the plain compiled loop: not measured, off (--no-reference)"


def test_the_budget_reserves_the_reference_pairs_only_where_they_will_run(tmp_path):
    # 1 candidate x 3 pairs x 2 runs, the same again beside the plain loop; the traces (profile_steps 2) add no
    # run: their steps follow the measurement of a validation pair's runs
    assert runs_after_search(Stub(tmp_path, EAGER).session) == 6 + 6
    assert runs_after_search(Stub(tmp_path, EAGER, cuda=False).session) == 6
    assert runs_after_search(Stub(tmp_path, EAGER, reference=False).session) == 6
    assert runs_after_search(Stub(tmp_path, COMPILED).session) == 6  # the validation's pairs answer it


def test_the_budget_reserves_no_reference_pairs_they_run_on_what_it_has_left(tmp_path):
    """The VLA study (eager base) on one H200, 2026-12-05 (study.csv run vla-noroom-h200): a baseline run of 41.4 s
    and a reserve of 6 A/B runs plus 6 runs beside the plain compiled loop kept 8.3 of the 10 GPU-minutes after the
    baseline's 1.0, and no search trial ran. The reference's pairs change nothing the study exports: the reserve
    now holds the A/B pairs only, and the reference runs on what is left, as many pairs as that holds."""
    v = Stub(tmp_path, EAGER, winner=(130.0, 80.0))  # ratios 1.3, 0.8, ...: the interval never excludes 1.0
    s = v.session
    s.study.set_user_attr("baseline_wall_s", [41.4])
    s.study.set_user_attr("gpu_s", {"baseline": 60.0})
    s.gpu_minutes = 10.0
    assert runs_after_search(s) == 12  # the progress bar still counts them
    assert reserved_seconds(s) == pytest.approx(6 * 41.4)
    budget = GpuBudget(s)
    assert budget.pairs_left() == 6  # (600 - 60) // (2 x 41.4)
    s.study.set_user_attr("gpu_s", {"baseline": 60.0, "validation": 456.2})  # 83.8 s left
    assert budget.pairs_left() == 1  # a pair takes 82.8 s
    r = v.against_plain(BEST, max_pairs=3, min_pairs=2, confidence=0.95, pairs_left=budget.pairs_left)
    assert r["ran"] is False and v.measured == []
    assert r["reason"] == ("the GPU-minute budget has room for 1 more A/B pair(s), 2 are needed "
                           "(protocol.ab_min_rounds; budget.gpu_minutes makes room)")
    # room for 2 of the 3 pairs: the reference stops at 2, its interval open
    r = v.against_plain(BEST, max_pairs=3, min_pairs=2, confidence=0.95, pairs_left=lambda: 2)
    assert r["ran"] and r["pairs"] == 2 and r["stopped"] == "cap" and len(v.measured) == 4
    assert "the winner #4 beside the plain compiled loop (torch.compile, default mode, no CUDA graphs): 2 to 2 A/B " \
        "pairs" in v.lines
    # resumed with no room: the stored pairs stand and nothing runs again
    again = Stub(tmp_path, EAGER)
    r = again.against_plain(BEST, max_pairs=3, min_pairs=2, confidence=0.95, pairs_left=lambda: 0)
    assert r["ran"] and r["pairs"] == 2 and again.measured == []
    # without a GPU-minute budget every pair may run
    w = Stub(tmp_path, EAGER, winner=(130.0, 80.0, 130.0))
    assert w.against_plain({**BEST, "trial": 5}, max_pairs=3, min_pairs=2, confidence=0.95,
                           pairs_left=lambda: None)["pairs"] == 3


def test_the_budget_reserves_the_leaders_pairs_to_the_cap(tmp_path):
    """gr00t-n1.6-vla-w8 on one H100 (2026-12-06) validates with 2 to 3 A/B pairs (protocol.ab_min_rounds 2,
    ab_rounds 3), and the reserve held the 2. Its eager base ran 33,767 and 40,125 tok/s beside the candidate's
    90,268 and 90,023: a 2.46x gain whose interval over 2 pairs, one degree of freedom, was [0.263, 22.771]. The
    budget held no third pair, and the base config was exported. The reserve now holds the leading candidate's
    pairs to the cap; a third pair at the search's own runs of the two configs (39,975 and 90,139) settles it."""
    v = Stub(tmp_path, EAGER, winner=(90268.0, 90023.0, 90139.0), baseline=(33767.0, 40125.0, 39975.0))
    s = v.session
    s.spec.protocol = SimpleNamespace(top_k=1, ab_rounds=3, ab_min_rounds=2, profile_steps=2, baseline_repeats=1)
    s.study.set_user_attr("baseline_wall_s", [41.4])
    assert reserved_seconds(s) == pytest.approx(6 * 41.4)  # the reference's pairs are not reserved either
    assert runs_after_search(s) == 6 + 6
    s.spec.protocol.top_k = 3  # the others keep their fewest pairs: 3 x 2 and the leader's third
    assert reserved_seconds(s) == pytest.approx(14 * 41.4)
    s.spec.protocol.top_k = 1
    s.gpu_minutes = 9.0
    s.study.set_user_attr("gpu_s", {"baseline": 46.1})
    budget = GpuBudget(s)
    s.study.set_user_attr("gpu_s", {"baseline": 46.1, "trials": 540 - 46.1 - reserved_seconds(s)})
    assert budget.room() == pytest.approx(0.0) and budget.pairs_left() == 3  # the search spent up to the reserve
    confidence, _ = sequential_confidence(2, 3)

    def pairs(name, more):
        return ab_pairs(s, v, EAGER, {12: COMPILED}, tmp_path / name, max_pairs=3, min_pairs=2,
                        confidence=confidence, what="validating", more=more)[12]

    r = pairs("w8", lambda: budget.pairs_left() > 0)
    assert len(r["runs"]) == 3 and r["stopped"] == "cap" and len(v.measured) == 6
    two = speedup_interval(pair_ratios(r["runs"][:2], r["baseline_runs"][:2]), confidence)
    assert two.low == pytest.approx(0.263, rel=1e-2) and two.high == pytest.approx(22.771, rel=1e-2)  # (rounded)
    three = speedup_interval(pair_ratios(r["runs"], r["baseline_runs"]), confidence)
    assert three.low > 1.5 and three.median == pytest.approx(90139 / 39975)
