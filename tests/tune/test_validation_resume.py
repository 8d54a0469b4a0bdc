"""A validation stopped part-way goes on from its next A/B pair (``validation.ab_pairs(resume=True)``): finished
pairs are stored in the study with both configs' hashes and taken as measured; a changed config, a pair whose
folders are gone, or ``verify`` (no resume) measures again."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import optuna
import pytest

from workbench.config import Config, merge_overrides
from workbench.tune.trial import TrialOutcome
from workbench.tune.validation import ab_pairs, duel


class Stub:
    """What ab_pairs uses: a session (a study, a log) and a measurer (a lease check, and a measurement that records
    its calls)."""

    def __init__(self, study, values, stop_at=None):
        self.values, self.stop_at = values, stop_at
        self.measured: list[str] = []
        self.lines: list[str] = []
        self.session = SimpleNamespace(study=study, log=self.lines.append, spec=None, study_dir=None)

    def check_lease(self):
        pass

    def measure(self, cfg, run_dir, prefix, phase, then=None):
        if run_dir.name == self.stop_at:
            raise KeyboardInterrupt  # the call's time ran out here
        self.measured.append(run_dir.name)
        run_dir.mkdir(parents=True, exist_ok=True)
        return TrialOutcome("ok", run_dir, value=self.values[run_dir.name.split("-")[0]])


BASE = Config()
ARM = merge_overrides(BASE, {"data.micro_batch_size": 8})


def _pairs(v, vdir, arm=ARM, resume=True):
    return ab_pairs(v.session, v, BASE, {3: arm}, vdir, max_pairs=3, min_pairs=3, confidence=0.95,
                    what="validating", resume=resume)[3]


def test_a_stopped_validation_resumes_from_its_next_pair(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="v")
    values = {"baseline": 100.0, "trial": 150.0}
    first = Stub(study, values, stop_at="trial-3-1")
    with pytest.raises(KeyboardInterrupt):
        _pairs(first, tmp_path / "validation")
    assert first.measured == ["baseline-3-0", "trial-3-0", "baseline-3-1"]

    # a new process on the same storage: pair 0 is taken, pairs 1 and 2 are measured
    study = optuna.load_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="v")
    again = Stub(study, {"baseline": 100.0, "trial": 140.0})
    res = _pairs(again, tmp_path / "validation")
    assert again.measured == ["baseline-3-1", "trial-3-1", "baseline-3-2", "trial-3-2"]
    assert res["runs"] == [150.0, 140.0, 140.0] and res["baseline_runs"] == [100.0] * 3
    assert any("pair 1 taken from the study" in line for line in again.lines)

    # every pair stored now: nothing runs again, unless a folder is gone or the arm's config changed
    third = Stub(study, values)
    assert _pairs(third, tmp_path / "validation")["runs"] == [150.0, 140.0, 140.0] and third.measured == []
    shutil.rmtree(tmp_path / "validation" / "trial-3-1")
    fourth = Stub(study, values)
    _pairs(fourth, tmp_path / "validation")
    assert fourth.measured == ["baseline-3-1", "trial-3-1"]
    other = Stub(study, values)
    _pairs(other, tmp_path / "validation", arm=merge_overrides(BASE, {"data.micro_batch_size": 2}))
    assert len(other.measured) == 6
    fresh = Stub(study, values)  # verify: measures every pair again
    _pairs(fresh, tmp_path / "validation", resume=False)
    assert len(fresh.measured) == 6


class _Spec:
    def trial_config(self, params):
        return merge_overrides(BASE, params)


def test_a_head_to_head_measures_one_candidate_against_the_other(tmp_path):
    """``validation.duel``: b's runs interleaved with a's, a's config in the baseline's place, under
    ``validation/duel-<a>-<b>/``, stopping once the interval excludes 1.0; resumed like the A/B."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="v")
    v = Stub(study, {"baseline": 100.0, "trial": 80.0})  # "baseline" is a's run here, "trial" b's
    v.session.spec, v.session.study_dir = _Spec(), tmp_path
    a = {"trial": 2, "params": {"data.micro_batch_size": 8}}
    b = {"trial": 1, "params": {"data.micro_batch_size": 2}}
    d = duel(v.session, v, a, b, max_pairs=4, min_pairs=2, confidence=0.95)
    assert v.measured == ["baseline-1-0", "trial-1-0", "baseline-1-1", "trial-1-1"]
    assert (tmp_path / "validation" / "duel-2-1" / "trial-1-1").is_dir()
    assert d["pairs"] == 2 and d["speedup_median"] == pytest.approx(0.8) and d["stopped"] == "interval excludes 1.0"
    assert any("measuring them against each other" in line for line in v.lines)
    again = Stub(study, {"baseline": 100.0, "trial": 80.0})
    again.session.spec, again.session.study_dir = _Spec(), tmp_path
    assert duel(again.session, again, a, b, max_pairs=4, min_pairs=2, confidence=0.95)["pairs"] == 2
    assert again.measured == []


PROFILE = {"metrics.profile_steps": 2, "metrics.profile_after_measure": True}


class Profiled(Stub):
    """A Stub that also records which runs carried the profile's keys, and fails the runs named in ``fail``."""

    def __init__(self, study, values, fail=(), stop_at=None):
        super().__init__(study, values, stop_at)
        self.fail, self.profiled = set(fail), []

    def measure(self, cfg, run_dir, prefix, phase, then=None):
        out = super().measure(cfg, run_dir, prefix, phase)
        if cfg.metrics.profile_after_measure:
            self.profiled.append(run_dir.name)
        if run_dir.name in self.fail:
            out.status, out.value = "crash", None
        return out


def _profiled_pairs(v, vdir, profile=PROFILE):
    return ab_pairs(v.session, v, BASE, {3: ARM, 4: merge_overrides(BASE, {"data.micro_batch_size": 2})}, vdir,
                    max_pairs=3, min_pairs=3, confidence=0.95, what="validating", resume=True, profile=profile)


def test_each_arms_first_completed_pair_is_profiled_and_resumes_so(tmp_path):
    """``ab_pairs(profile=...)``: both runs of each arm's first pair to complete carry the keys that profile the
    steps after the measurement (the traces), the later pairs not. A profiled pair that fails is measured plain
    from then on: on the H200 (2026-12-05) a candidate crashed in both its profiled pairs after running clean in
    its search trial, and lost its validation."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="v")
    values = {"baseline": 100.0, "trial": 150.0}
    v = Profiled(study, values, fail={"trial-4-0"}, stop_at="baseline-3-2")
    with pytest.raises(KeyboardInterrupt):
        _profiled_pairs(v, tmp_path / "validation")
    assert v.profiled == ["baseline-3-0", "trial-3-0", "baseline-4-0", "trial-4-0"]
    assert v.measured == ["baseline-3-0", "trial-3-0", "baseline-4-0", "trial-4-0", "baseline-3-1", "trial-3-1",
                          "baseline-4-1", "trial-4-1"]

    # stopped mid-validation: the stored pairs are taken (the profiled ones as profiled), the failed one measured
    # again (profiled: this tuner has not seen it fail, and its arm has no profiled pair), the rest plain
    again = Profiled(study, values)
    res = _profiled_pairs(again, tmp_path / "validation")
    assert again.measured == ["baseline-4-0", "trial-4-0", "baseline-3-2", "trial-3-2", "baseline-4-2", "trial-4-2"]
    assert again.profiled == ["baseline-4-0", "trial-4-0"]
    assert res[3]["runs"] == res[4]["runs"] == [150.0] * 3
    assert res[4]["run_dirs"] == [str(tmp_path / "validation" / f"trial-4-{r}") for r in range(3)]
    # a pair stored by a tuner that profiled nothing (an older version) is taken too; the next one profiles
    old = tmp_path / "old"
    plain = Profiled(study, values)
    _profiled_pairs(plain, old, profile=None)
    assert plain.profiled == [] and len(plain.measured) == 12
    pairs = dict(study.user_attrs["ab_pairs"])
    study.set_user_attr("ab_pairs", {k: v for k, v in pairs.items() if not k.endswith("-2")})
    for arm in (3, 4):
        shutil.rmtree(old / f"trial-{arm}-2")
    resumed = Profiled(study, values)
    _profiled_pairs(resumed, old)
    assert resumed.measured == resumed.profiled == ["baseline-3-2", "trial-3-2", "baseline-4-2", "trial-4-2"]


def test_a_profiled_pair_that_fails_leaves_the_arm_unprofiled(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="v")
    v = Profiled(study, {"baseline": 100.0, "trial": 150.0}, fail={"trial-3-0"})
    res = ab_pairs(v.session, v, BASE, {3: ARM}, tmp_path / "validation", max_pairs=3, min_pairs=3,
                   confidence=0.95, what="validating", resume=True, profile=PROFILE)[3]
    assert v.profiled == ["baseline-3-0", "trial-3-0"] and len(v.measured) == 6
    assert [(f["round"], f["candidate"], f["profiled"]) for f in res["failures"]] == [(0, "crash", True)]
    assert res["runs"] == [150.0, 150.0]
