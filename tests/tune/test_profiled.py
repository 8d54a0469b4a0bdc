"""Issue 38's proposals led by the base run's profile: the startup trials hold the knobs whose phases take under 5%
of the base step at their base value, so that the random draws before a model exists go to the knobs that can act.

Runs are replaced by functions of the config that report a known step profile: what is under test is which configs
the tuner proposes, and what tune.json and the report say about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import workbench.tune.measure as measure
from reports import build_report
from workbench.tune import Tuner
from workbench.tune.knobs import Knob, get_knob
from workbench.tune.profiled import HOT_SHARE, knob_weights, phase_shares, profile_line, profile_record
from workbench.tune.search import Search
from workbench.tune.study import load_study_spec
from workbench.tune.trial import TrialOutcome
from workbench.vocab import PHASES

SPACE = {"micro_batch_size": {"choices": [1, 2, 4, 8]}, "num_workers": {"choices": [0, 1, 2, 3]},
         "activation_checkpointing": {"choices": ["none", "full"]}}
COMPUTE_BOUND = {"data_wait": 0.002, "h2d": 0.001, "forward": 0.30, "backward": 0.60, "grad_sync": 0.0,
                 "optimizer": 0.08, "other": 0.017}
"""A GPU step as profile.csv has it: the device busy, the loader idle (the data knobs act on 0.2% of it)."""
DATA_BOUND = {"data_wait": 0.90, "h2d": 0.0, "forward": 0.01, "backward": 0.02, "grad_sync": 0.0,
              "optimizer": 0.005, "other": 0.005}
"""A step waiting on its loader: only the data knobs act on more than 5% of it."""


def _phases(total: dict[str, float], scale: float = 1.0) -> dict[str, float]:
    return {p: v * scale for p, v in total.items()}


def test_phase_shares_are_the_median_share_of_the_runs_that_timed_every_phase():
    runs = [_phases(COMPUTE_BOUND, 2.0), _phases(DATA_BOUND), None, {"forward": 1.0}, _phases(COMPUTE_BOUND, 0.5)]
    shares = phase_shares(runs)
    total = sum(COMPUTE_BOUND.values())
    # three runs count; each share is the median of the three (two compute-bound runs outvote the data-bound one)
    assert shares == pytest.approx({p: COMPUTE_BOUND[p] / total for p in PHASES})
    assert phase_shares([None, {"forward": 1.0}]) is None  # phase timing off: no profile
    assert phase_shares([dict.fromkeys(PHASES, 0.0)]) is None


def test_knob_weights_sum_the_phases_each_knob_acts_on():
    knobs = [get_knob(n) for n in ("num_workers", "micro_batch_size", "activation_checkpointing", "io_uring_entries")]
    w = dict(knob_weights(knobs, COMPUTE_BOUND))
    assert w["num_workers"] == w["io_uring_entries"] == pytest.approx(0.002)
    assert w["activation_checkpointing"] == pytest.approx(0.90)
    assert w["micro_batch_size"] == pytest.approx(0.997)
    assert [n for n, _ in knob_weights(knobs, DATA_BOUND)][:2] == ["num_workers", "io_uring_entries"]
    with pytest.raises(ValueError, match="phases"):
        Knob(name="x", key="user.x", kind="int", phases=frozenset({"warmup"}))


def test_only_a_knob_whose_base_value_is_in_its_space_is_held():
    knobs = [get_knob("num_workers"), get_knob("io_uring_entries"), get_knob("micro_batch_size")]
    rec = profile_record(knobs, COMPUTE_BOUND, {"num_workers": 2, "io_uring_entries": 48, "micro_batch_size": 4},
                         lambda n, v: v in {"num_workers": [0, 2], "io_uring_entries": [32, 64]}.get(n, [4]), 3)
    assert rec["held"] == {"num_workers": 2}  # 48 is not a choice of io_uring_entries: drawn like the rest
    assert rec["startup_trials"] == 3 and rec["hot_share"] == HOT_SHARE
    assert "the first 3 trial(s) hold num_workers at the base value" in profile_line(rec)
    assert profile_line(rec).startswith("profile of the base step: backward 60%, forward 30%, optimizer 8%")
    assert profile_record(knobs, None, {}, lambda n, v: True, 3) is None


@pytest.fixture
def profiled_runs(monkeypatch):
    """Baseline runs report ``profile[0]`` as their step's phases; search trials run at a speed that grows with the
    micro-batch. Returns (profile holder, the params of every search trial in order)."""
    profile = [COMPUTE_BOUND]
    ran: list[dict] = []

    def run_trial(cfg, run_dir, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        v = 1000.0 * cfg.data.micro_batch_size
        return TrialOutcome("ok", Path(run_dir), windows=[v, v], value=v, wall_s=1.0,
                            summary={"measured_steps": 6, "phase_s_per_step": _phases(profile[0], 0.3)})

    def run(self, trial, cfg, tdir, on_window):
        ran.append(dict(trial.params))
        return run_trial(cfg, tdir)

    monkeypatch.setattr(measure, "run_trial", run_trial)
    monkeypatch.setattr(Search, "run_search_trial", run)
    return profile, ran


def _search(spec_path: Path, tmp_path: Path) -> Tuner:
    t = Tuner(load_study_spec(str(spec_path)), out_root=tmp_path / "runs", progress=False)
    t.open()
    t.run_baseline()
    t.search()
    return t


@pytest.mark.parametrize("sampler", ["tpe", "gp", "random"])
def test_startup_trials_hold_the_knobs_that_cannot_act_on_a_compute_bound_step(study_spec_file, tmp_path,
                                                                               profiled_runs, sampler, capsys):
    _, ran = profiled_runs
    spec = study_spec_file("hot", space=SPACE, trials=8,
                           sampler={"name": sampler, "seed": 3, "n_startup_trials": 5})
    t = _search(spec, tmp_path)
    rec = t.study.user_attrs["profile"]
    assert rec["held"] == {"num_workers": 0} and rec["startup_trials"] == 5
    assert [w["knob"] for w in rec["weights"]] == ["micro_batch_size", "activation_checkpointing", "num_workers"]
    assert "the first 5 trial(s) hold num_workers at the base value" in capsys.readouterr().err
    # the five startup draws vary the knobs that act and keep the loader at the base; 4 x 2 configs remain for them
    assert [p["num_workers"] for p in ran[:5]] == [0] * 5
    assert len({(p["micro_batch_size"], p["activation_checkpointing"]) for p in ran[:5]}) == 5
    assert not t.study.sampler.held(t.study)  # after the startup every knob is drawn again


def test_a_data_bound_step_leads_with_the_loader(study_spec_file, tmp_path, profiled_runs):
    profile, ran = profiled_runs
    profile[0] = DATA_BOUND
    spec = study_spec_file("cold", space=SPACE, trials=4, sampler={"name": "tpe", "seed": 0, "n_startup_trials": 4})
    t = _search(spec, tmp_path)
    held = t.study.user_attrs["profile"]["held"]
    assert held == {"micro_batch_size": 4, "activation_checkpointing": "none"}  # the base config's values
    assert all((p["micro_batch_size"], p["activation_checkpointing"]) == (4, "none") for p in ran)
    assert len({p["num_workers"] for p in ran}) == 4  # every draw a new loader setting (no repeats)


def test_a_grid_or_a_run_without_phase_timings_is_not_led(study_spec_file, tmp_path, profiled_runs):
    profile, ran = profiled_runs
    grid = study_spec_file("grid", space=SPACE, trials=3, sampler={"name": "grid", "seed": 0})
    assert "profile" not in _search(grid, tmp_path).study.user_attrs
    profile[0] = {"forward": 1.0}  # phase timing off: only some phases known
    off = study_spec_file("off", space=SPACE, trials=3, sampler={"name": "tpe", "seed": 0})
    t = _search(off, tmp_path)
    assert t.study.user_attrs["profile"] is None and not t.study.sampler.held(t.study)


def test_tune_json_and_the_report_say_what_the_profile_held(study_spec_file, tmp_path, profiled_runs):
    spec = study_spec_file("rep", space=SPACE, trials=3, sampler={"name": "tpe", "seed": 0, "n_startup_trials": 3},
                           protocol={"baseline_repeats": 2, "top_k": 1, "ab_rounds": 1, "profile_steps": 0})
    t = Tuner(load_study_spec(str(spec)), out_root=tmp_path / "runs", progress=False, report=build_report)
    t.run()
    sdir = tmp_path / "runs" / "rep"
    tune = json.loads((sdir / "tune.json").read_text())
    assert tune["profile"]["held"] == {"num_workers": 0}
    assert tune["profile"]["phases"]["backward"] == pytest.approx(0.60, abs=1e-3)
    page = (sdir / "report.html").read_text()
    assert "the first 3 trial(s) hold num_workers at the base value" in page
