"""Issue 38's proposals led by the base run's profile: the startup trials hold the knobs whose phases take under 5%
of the base step at their base value, so that the random draws before a model exists go to the knobs that can act.

Runs are replaced by functions of the config that report a known step profile: what is under test is which configs
the tuner proposes, and what tune.json and the report say about it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

import workbench.tune.measure as measure
from reports import build_report
from workbench.tune import Tuner
from workbench.tune.knobs import Knob, get_knob
from workbench.tune.profiled import (HOT_SHARE, _choice_order, cold_neighbour, kernel_profile, knob_weights,
                                     phase_shares, profile_line, profile_record, walk_line, walk_order, walk_record)
from workbench.tune.search import Search
from workbench.tune.study import load_study_spec
from workbench.tune.trial import TrialOutcome
from workbench.vocab import KERNEL_SHARE, PADDING_RATIO, PHASES

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


GEMM_BOUND = {"matmul": 0.60, "attention": 0.13, "optimizer": 0.045, "norm": 0.04, "activation": 0.028,
              "other": 0.027, "loss": 0.015, "rope": 0.013, "cast": 0.0, "idle": 0.102, "padding": 0.0}
"""gr00t-n1.6's compiled bf16 step on one H200 as profile.csv's kernels sort (run Q, torch_ops_compile), with
10% of its span idle: the GEMMs take most of it."""
LAUNCH_BOUND = {"matmul": 0.30, "attention": 0.05, "optimizer": 0.03, "norm": 0.05, "activation": 0.04,
                "other": 0.13, "loss": 0.02, "rope": 0.03, "cast": 0.0, "idle": 0.35, "padding": 0.0}
"""An eager step of small kernels: the device waits on their launches a third of the time."""


def test_kernel_profile_reads_the_shares_and_the_padding_of_the_busy_time():
    summary = {f"{KERNEL_SHARE}matmul": 0.5, f"{KERNEL_SHARE}other": 0.25, f"{KERNEL_SHARE}idle": 0.25,
               PADDING_RATIO: 0.2, "profile/steps": 2}
    assert kernel_profile(summary) == pytest.approx({"matmul": 0.5, "other": 0.25, "idle": 0.25, "padding": 0.15})
    assert kernel_profile({"profile/steps": 2}) is None  # a CPU run: no device kernels
    assert kernel_profile(None) is None
    assert kernel_profile({f"{KERNEL_SHARE}idle": 0.0}) is None


def test_the_walk_tries_first_the_knob_that_can_take_away_most_of_the_step():
    """On a GEMM-bound step FP8 (at most half the matmuls' time) leads, the Triton ops follow by their kernels'
    share, and what can only add time (checkpointing) or acts on no time of this step (padding under packing:
    fill) comes last; on a launch-bound step compile and the knobs that act on idle time lead and FP8 follows.
    Without a kernel profile the phases' weights order them, as before."""
    names = ("micro_batch_size", "packing", "activation_checkpointing", "compile_shapes", "fp8", "rmsnorm_backend",
             "swiglu_backend", "rope_backend", "loss_backend", "expandable_segments")
    knobs = [get_knob(n) for n in names]

    def order(kernels):
        return walk_order(profile_record(knobs, COMPUTE_BOUND, {}, lambda n, v: True, 3, kernels))

    gemm = order(GEMM_BOUND)
    assert gemm[0] == "fp8" and set(gemm[-2:]) == {"packing", "activation_checkpointing"}
    assert gemm.index("rmsnorm_backend") < gemm.index("swiglu_backend") < gemm.index("loss_backend") \
        < gemm.index("rope_backend")
    rec = profile_record(knobs, COMPUTE_BOUND, {}, lambda n, v: True, 3, GEMM_BOUND)
    reach = {w["knob"]: w["reach"] for w in rec["weights"]}
    assert reach["fp8"] == pytest.approx(0.30) and reach["micro_batch_size"] == pytest.approx(0.102)
    assert "device time: matmul 60%, attention 13%, idle 10%" in profile_line(rec)

    vla = [get_knob(n) for n in ("micro_batch_size", "compile", "graph_capture", "expandable_segments", "fp8")]
    assert walk_order(profile_record(vla, COMPUTE_BOUND, {}, lambda n, v: True, 3, LAUNCH_BOUND)) == [
        "compile", "micro_batch_size", "graph_capture", "fp8", "expandable_segments"]  # no allocator call to save
    # where the device waits on cudaFree for a fifth of the step, the allocator's knob and capture's pool rise
    stalled = {**LAUNCH_BOUND, "alloc": 0.20, "idle": 0.15}
    assert walk_order(profile_record(vla, COMPUTE_BOUND, {}, lambda n, v: True, 3, stalled))[:3] == [
        "graph_capture", "compile", "expandable_segments"]
    assert order(None) == [n for n, _ in knob_weights(knobs, COMPUTE_BOUND)]
    with pytest.raises(ValueError, match="kernels"):
        Knob(name="x", key="user.x", kind="int", kernels=frozenset({"warp"}))
    with pytest.raises(ValueError, match="kernel_bound"):
        Knob(name="x", key="user.x", kind="int", kernels=frozenset({"matmul"}), kernel_bound=0.0)


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
    profile = [COMPUTE_BOUND]  # (a second item: more keys of every run's summary)
    ran: list[dict] = []

    def run_trial(cfg, run_dir, **kw):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        v = 1000.0 * cfg.data.micro_batch_size
        return TrialOutcome("ok", Path(run_dir), windows=[v, v], value=v, wall_s=1.0,
                            summary={"measured_steps": 6, "phase_s_per_step": _phases(profile[0], 0.3),
                                     **(profile[1] if len(profile) > 1 else {})})

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
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


def test_the_base_runs_kernel_profile_orders_the_cold_walk(study_spec_file, tmp_path, profiled_runs, capsys):
    """The last baseline repeat, profiled after its measurement, gives the device time by kernel kind: a third
    of it idle, so the micro-batch (idle time) leads, the loader (10% of the step waits on it) comes next and
    checkpointing (recompute only) last, where the phases alone put checkpointing second."""
    profile, ran = profiled_runs
    profile[0] = {"data_wait": 0.10, "h2d": 0.0, "forward": 0.30, "backward": 0.50, "grad_sync": 0.0,
                  "optimizer": 0.08, "other": 0.02}
    profile.append({f"{KERNEL_SHARE}{k}": v for k, v in LAUNCH_BOUND.items() if k != "padding"})
    spec = study_spec_file("kern", space=SPACE, trials=3, protocol={"profile_steps": 1},
                           sampler={"name": "tpe", "seed": 0, "n_startup_trials": 3})
    t = _search(spec, tmp_path)
    rec = t.study.user_attrs["profile"]
    assert rec["kernels"]["idle"] == pytest.approx(0.35) and rec["kernels"]["padding"] == 0.0
    assert [w["knob"] for w in rec["weights"]] == ["micro_batch_size", "activation_checkpointing", "num_workers"]
    assert t.study.user_attrs["walk"]["knobs"] == ["micro_batch_size", "num_workers", "activation_checkpointing"]
    changed = [{k for k in b if a.get(k) != b[k]} for a, b in zip([{"micro_batch_size": 4, "num_workers": 0,
                                                                      "activation_checkpointing": "none"}, ran[0],
                                                                     ran[0]], ran)]
    assert changed == [{"micro_batch_size"}, {"num_workers"}, {"activation_checkpointing"}], ran
    assert "device time: idle 35%, matmul 30%" in capsys.readouterr().err


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


WALK_SPACE = {"micro_batch_size": {"choices": [2, 4, 8]}, "num_workers": {"choices": [0, 1]},
              "activation_checkpointing": {"choices": ["none", "selective"]},
              "activation_checkpointing_every": {"choices": [2, 4]}}


def _walk_speed(p: dict) -> float:
    """Micro-batch 8 and one worker add speed; selective checkpointing costs 500 at every 4 blocks, 100 at every
    2."""
    ac = p.get("activation_checkpointing") == "selective"
    return 1000.0 * p["micro_batch_size"] + 300.0 * p.get("num_workers", 0) - (
        (100.0 if p.get("activation_checkpointing_every") == 2 else 500.0) if ac else 0.0)


@pytest.fixture
def walked_runs(monkeypatch):
    """Baseline runs and search trials at ``_walk_speed`` of their config, with no phase timings (no profile: the
    walk goes in knob order). Returns the params of every search trial in order."""
    ran: list[dict] = []

    def outcome(p: dict, run_dir) -> TrialOutcome:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        v = _walk_speed(p)
        return TrialOutcome("ok", Path(run_dir), windows=[v, v], value=v, wall_s=1.0, summary={"measured_steps": 6})

    def run_trial(cfg, run_dir, **kw):
        return outcome({"micro_batch_size": cfg.data.micro_batch_size, "num_workers": cfg.data.num_workers,
                        "activation_checkpointing": cfg.training.activation_checkpointing,
                        "activation_checkpointing_every": cfg.training.activation_checkpointing_every}, run_dir)

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        ran.append(dict(trial.params))
        return outcome(dict(trial.params), tdir)

    monkeypatch.setattr(measure, "run_trial", run_trial)
    monkeypatch.setattr(Search, "run_search_trial", run)
    return ran


@pytest.mark.parametrize("sampler", ["tpe", "gp", "random"])
def test_a_cold_start_walks_from_the_base_config_whatever_the_seed(study_spec_file, tmp_path, walked_runs, sampler):
    """From the base config (micro-batch 4, no worker, no checkpointing), each startup trial changes one knob of
    the fastest config so far, in knob order (the loader's first; with no kernel profile every knob's reach is the
    same): each knob once from that incumbent, one never changed before one tried around another config, then
    their other choices; the knob a step makes active starts at its default (the base config's every 4). The same
    steps come from every seed, and the base config, which the baseline measured, is not asked."""
    base = {"data": {"seq_len": 256, "micro_batch_size": 4, "bucket_width": 64, "num_workers": 0},
            "training": {"global_batch_size": 8, "max_steps": 16, "log_every": 4, "warmup_measure_steps": 2,
                         "dtype": "fp32", "activation_checkpointing_every": 4},
            "hardware": {"device": "cpu"}}
    for seed in range(3):
        walked_runs.clear()
        spec = study_spec_file(f"walk{seed}", space=WALK_SPACE, trials=6, base=base,
                               sampler={"name": sampler, "seed": seed, "n_startup_trials": 2})
        t = _search(spec, tmp_path)
        walk = t.study.user_attrs["walk"]
        assert walk["knobs"] == ["num_workers", "micro_batch_size", "activation_checkpointing",
                                 "activation_checkpointing_every"]
        assert walk["base"] == {"num_workers": 0, "micro_batch_size": 4, "activation_checkpointing": "none"}
        assert walk["value"] == 4000.0 and walk["defaults"]["activation_checkpointing_every"] == 4
        assert walked_runs[:5] == [
            {"num_workers": 1, "micro_batch_size": 4, "activation_checkpointing": "none"},
            {"num_workers": 1, "micro_batch_size": 8, "activation_checkpointing": "none"},  # 8 before 2: nearer
            {"num_workers": 1, "micro_batch_size": 8, "activation_checkpointing": "selective",
             "activation_checkpointing_every": 4},  # slower: the incumbent stays
            # every knob was stepped: the loader again, around the new incumbent
            {"num_workers": 0, "micro_batch_size": 8, "activation_checkpointing": "none"},
            # the base config has 5 neighbours (2 + 1 + 1 + 1 other choices): a fifth step (4 was trial 0's)
            {"num_workers": 1, "micro_batch_size": 2, "activation_checkpointing": "none"},
        ], (sampler, seed, walked_runs)
        assert not t.study.sampler.held(t.study)  # after the walk, the sampler draws every knob


def test_a_walk_step_stays_only_where_it_beats_the_baseline(study_spec_file, tmp_path, walked_runs):
    """A step slower than the base config does not become the incumbent: the walk goes on from the base."""
    base = {"data": {"seq_len": 256, "micro_batch_size": 8, "bucket_width": 64, "num_workers": 1},
            "training": {"global_batch_size": 8, "max_steps": 16, "log_every": 4, "warmup_measure_steps": 2,
                         "dtype": "fp32"}, "hardware": {"device": "cpu"}}
    spec = study_spec_file("down", space={"micro_batch_size": {"choices": [2, 4, 8]},
                                          "num_workers": {"choices": [0, 1]}}, trials=3, base=base,
                           sampler={"name": "tpe", "seed": 0, "n_startup_trials": 3})
    _search(spec, tmp_path)
    # num_workers 1 -> 0 (slower, not kept), then micro-batch 8 -> 4 from the base, then 2 from the base
    assert walked_runs == [{"num_workers": 0, "micro_batch_size": 8}, {"num_workers": 1, "micro_batch_size": 4},
                           {"num_workers": 1, "micro_batch_size": 2}]


def test_a_random_startup_or_a_grid_does_not_walk(study_spec_file, tmp_path, walked_runs):
    spec = study_spec_file("rnd", space=WALK_SPACE, trials=2, sampler={"name": "tpe", "seed": 0, "startup": "random"})
    t = _search(spec, tmp_path)
    assert t.study.user_attrs["walk"] is None and not t.study.sampler.held(t.study)
    grid = study_spec_file("grd", space=WALK_SPACE, trials=2, sampler={"name": "grid", "seed": 0})
    assert _search(grid, tmp_path).study.user_attrs["walk"] is None


def test_choices_are_walked_nearest_first_the_larger_first_on_a_tie():
    assert _choice_order([8, 16, 32], 8) == [16, 32]
    assert _choice_order([8, 16, 32], 16) == [32, 8]
    assert _choice_order([32, 4, 16, 8], 16) == [32, 8, 4]
    assert _choice_order(["fill", "bucket"], "fill") == ["bucket"]
    assert _choice_order([False, True], False) == [True]  # booleans keep the space's order


def test_tune_json_and_the_report_say_what_the_walk_did(study_spec_file, tmp_path, walked_runs):
    spec = study_spec_file("walkrep", space={"micro_batch_size": {"choices": [2, 4, 8]},
                                             "num_workers": {"choices": [0, 1]}}, trials=2,
                           sampler={"name": "tpe", "seed": 0, "n_startup_trials": 2},
                           protocol={"baseline_repeats": 1, "top_k": 1, "ab_rounds": 1, "profile_steps": 0})
    t = Tuner(load_study_spec(str(spec)), out_root=tmp_path / "runs", progress=False, report=build_report)
    t.run()
    sdir = tmp_path / "runs" / "walkrep"
    walk = json.loads((sdir / "tune.json").read_text())["walk"]
    assert walk["steps"] == [
        {"trial": 0, "knob": "num_workers", "from": 0, "to": 1, "of": "base", "value": 4300.0, "status": "ok"},
        {"trial": 1, "knob": "micro_batch_size", "from": 4, "to": 8, "of": 0, "value": 8300.0, "status": "ok"}]
    page = (sdir / "report.html").read_text()
    assert ("The startup changed one knob at a time from the best config so far, starting from the base: trial 0: "
            "num_workers 0 -&gt; 1 from the base (4,300); trial 1: micro_batch_size 4 -&gt; 8 from trial 0 (8,300)"
            in page)


def test_a_new_incumbent_tries_untried_knobs_first_unless_a_tried_one_reaches_more():
    """Compile-ahead plans a trial while the one before runs: trial 1 was planned from the base (trial 0 running).
    Once trial 0 wins, trial 2 changes a knob no trial changed yet, around trial 0; a knob tried around another
    config comes before it only where it can reach more of the step (the profile's reach): what lost beside the
    base may win beside the new incumbent (gr00t-n1.6 on one H200: micro-batch 16 at 0.95x in bf16, never tried
    again under FP8). A knob is stepped once from each incumbent before any knob takes its other choices."""
    dists = {k: optuna.distributions.CategoricalDistribution(["x", "y"]) for k in "abcdk"}
    base = dict.fromkeys("abcd", "x")

    def study_of(*trials):
        """trials: (params, value or None for a running one), numbered in order; the baseline median is 100."""
        study = optuna.create_study(direction="maximize")
        study.set_user_attr("walk", walk_record(list("abcd"), {k: ["x", "y"] for k in "abcd"}, base, base, 100.0))
        for params, value in trials:
            done = value is not None
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE if done else optuna.trial.TrialState.RUNNING, params=params,
                distributions={k: dists[k] for k in params}, value=value,
                user_attrs={"status": "ok"} if done else {}))
        return study

    running = study_of(({**base, "a": "y"}, None))
    assert cold_neighbour(running, running.get_trials(), 1) == {**base, "b": "y"}  # planned from the base
    won = study_of(({**base, "a": "y"}, 120.0), ({**base, "b": "y"}, None))
    assert cold_neighbour(won, won.get_trials(), 2) == {**base, "a": "y", "c": "y"}
    lost = study_of(({**base, "b": "y"}, 95.0), ({**base, "a": "y"}, 120.0), ({**base, "a": "y", "c": "y"}, 110.0))
    assert cold_neighbour(lost, lost.get_trials(), 3) == {**base, "a": "y", "d": "y"}  # untried d before b
    reach = {"a": 0.30, "b": 0.05, "c": 0.03, "d": 0.03}
    lost.set_user_attr("walk", walk_record(list("abcd"), {k: ["x", "y"] for k in "abcd"}, base, base, 100.0,
                                           reach=reach))
    assert cold_neighbour(lost, lost.get_trials(), 3) == {**base, "a": "y", "b": "y"}  # b lost beside the base
    lost.set_user_attr("walk", walk_record(list("abcd"), {k: ["x", "y"] for k in "abcd"}, base, base, 100.0,
                                           reach={**reach, "b": 0.03}))
    assert cold_neighbour(lost, lost.get_trials(), 3) == {**base, "a": "y", "d": "y"}  # a tie: the untried first
    # each knob once from the incumbent, then the other choices, in the knobs' order
    three = study_of(({**base, "a": "y"}, 120.0), ({**base, "a": "y", "b": "y"}, 110.0),
                     ({**base, "a": "y", "c": "y"}, 110.0))
    three.set_user_attr("walk", walk_record(list("abcd"), {"a": ["x", "y"], "b": ["x", "y", "z"], "c": ["x", "y"],
                                                           "d": ["x", "y"]}, base, base, 100.0))
    assert cold_neighbour(three, three.get_trials(), 3) == {**base, "a": "y", "d": "y"}
    three.add_trial(optuna.trial.create_trial(params={**base, "a": "y", "d": "y"}, value=105.0,
                                              distributions={k: dists[k] for k in "abcd"},
                                              user_attrs={"status": "ok"}))
    assert cold_neighbour(three, three.get_trials(), 4) == {**base, "a": "y", "b": "z"}
    # a knob the incumbent's step made active comes first: the cycle passed it while it was inactive
    opened = study_of(({**base, "a": "y", "k": "x"}, 120.0))
    opened.set_user_attr("walk", walk_record([*"abcd", "k"], {k: ["x", "y"] for k in "abcdk"}, base, base, 100.0))
    assert cold_neighbour(opened, opened.get_trials(), 1) == {**base, "a": "y", "k": "y"}
    # a trial slower than the baseline median is no incumbent: from the base, the next knob
    lost = study_of(({**base, "a": "y"}, 90.0))
    assert cold_neighbour(lost, lost.get_trials(), 1) == {**base, "b": "y"}


def test_the_knobs_fp8_opens_are_stepped_beside_each_other_and_a_measured_gain_ranks_a_knob():
    """gr00t-n1.6's walk as compile-ahead plans it. FP8 won and opened its casts and head; the head lost beside
    torchao's casts, the project's casts won: the head is tried again beside them before the micro-batch (the two
    act together). Once the head and then micro-batch 16 won, neither is stepped again first: the micro-batch's
    step was taken from the FP8 config, not from the bf16 micro-batch 16 one knob away from it. A knob that sped
    up a config ranks by that gain where the profile's bound is smaller (the casts, whose kernels a bf16 step
    lacks)."""
    choices = {"fp8": ["none", "tw"], "mb": [8, 16], "norm": ["torch", "triton"], "cast": ["torchao", "triton"],
               "head": [False, True]}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    base = {"fp8": "none", "mb": 8, "norm": "torch"}
    defaults = {**base, "cast": "torchao", "head": False}
    fp8 = {**base, "fp8": "tw", "cast": "torchao", "head": False}

    def study_of(*trials, norm=0.06):
        study = optuna.create_study(direction="maximize")
        study.set_user_attr("walk", walk_record(list(choices), choices, defaults, base, 100.0, reach={
            "fp8": 0.30, "mb": 0.10, "norm": norm, "cast": 0.0, "head": 0.015}))
        for params, value in trials:
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, params=params, value=value,
                distributions={k: dists[k] for k in params}, user_attrs={"status": "ok"}))
        return study

    def next_of(study):
        return cold_neighbour(study, study.get_trials(), len(study.get_trials()))

    tried = [(fp8, 120.0), ({**base, "mb": 16}, 95.0), ({**fp8, "head": True}, 114.0), ({**fp8, "cast": "triton"},
                                                                                         125.0)]
    assert next_of(study_of(*tried)) == {**fp8, "cast": "triton", "head": True}  # not micro-batch 16 first
    head = {**fp8, "cast": "triton", "head": True}
    won = study_of(*tried, (head, 128.0), ({**head, "mb": 16}, 137.0))
    assert next_of(won) == {**head, "mb": 16, "norm": "triton"}  # not the casts again
    # micro-batch 16 won under torchao's casts: the project's casts (+4% beside FP8) rank above a norm of 2%
    mb16 = [(fp8, 120.0), ({**base, "mb": 16}, 95.0), ({**fp8, "head": True}, 114.0),
            ({**fp8, "cast": "triton"}, 125.0), ({**fp8, "mb": 16}, 126.0)]
    assert next_of(study_of(*mb16, norm=0.02)) == {**fp8, "mb": 16, "cast": "triton"}
    assert next_of(study_of(*mb16, norm=0.06)) == {**fp8, "mb": 16, "norm": "triton"}


def test_a_knob_goes_on_the_way_it_won_and_the_profile_bounds_only_a_step_off_the_base_value():
    """gr00t-n1.6-vla's walk: compile won, then micro-batch 32 beside it. A micro-batch that won at 32 from 16
    goes on to 64, not back past 16; a knob whose only step left returns it to the base value (compile back to
    eager) has no reach from the profile, which measured that value: capture's next mode comes first."""
    choices = {"compile": ["none", "default"], "mb": [8, 16, 32, 64], "capture": ["none", "fwd_bwd", "fwd_bwd+opt"]}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    base = {"compile": "none", "mb": 16, "capture": "none"}

    def next_of(*trials):
        study = optuna.create_study(direction="maximize")
        study.set_user_attr("walk", walk_record(list(choices), choices, base, base, 38.0, reach={
            "compile": 0.49, "mb": 0.35, "capture": 0.35}))
        for params, value in trials:
            study.add_trial(optuna.trial.create_trial(params=params, value=value, user_attrs={"status": "ok"},
                                                      distributions={k: dists[k] for k in params}))
        return cold_neighbour(study, study.get_trials(), len(trials))

    tried = [({**base, "compile": "default"}, 66.0), ({**base, "compile": "default", "mb": 32}, 75.0)]
    assert next_of(*tried) == {"compile": "default", "mb": 32, "capture": "fwd_bwd"}  # untried before mb 64
    tried.append(({"compile": "default", "mb": 32, "capture": "fwd_bwd"}, 83.0))
    assert next_of(*tried) == {"compile": "default", "mb": 64, "capture": "fwd_bwd"}
    tried.append(({"compile": "default", "mb": 64, "capture": "fwd_bwd"}, 87.0))
    assert next_of(*tried) == {"compile": "default", "mb": 64, "capture": "fwd_bwd+opt"}  # not eager again
    # micro-batch 8 lost from 16 and 32 won: from 32 the micro-batch tries 64, never 8
    lost = [({**base, "compile": "default"}, 66.0), ({**base, "compile": "default", "mb": 8}, 52.0),
            ({**base, "compile": "default", "mb": 32}, 75.0),
            ({"compile": "default", "mb": 32, "capture": "fwd_bwd"}, 70.0)]
    assert next_of(*lost) == {"compile": "default", "mb": 64, "capture": "none"}


def test_a_base_outside_the_space_is_walked_from_its_nearest_config_measured_first(study_spec_file, tmp_path,
                                                                                  walked_runs):
    """The base config's micro-batch 4 is not a choice: the walk's first trial is the base with the space's first
    choice (2), which the baseline did not measure, then that config with its first knob changed, whatever the
    seed."""
    for seed in range(2):
        walked_runs.clear()
        spec = study_spec_file(f"off{seed}", space={"micro_batch_size": {"choices": [2, 8]},
                                                    "num_workers": {"choices": [0, 1]}}, trials=2,
                               sampler={"name": "random", "seed": seed, "n_startup_trials": 2})
        t = _search(spec, tmp_path)
        assert t.study.user_attrs["walk"]["measured"] is False
        assert walked_runs == [{"num_workers": 0, "micro_batch_size": 2}, {"num_workers": 1, "micro_batch_size": 2}]


@pytest.mark.parametrize(("environ", "unset"), [("", False), ("expandable_segments:True", True)])
def test_a_key_the_base_leaves_unset_is_walked_from_what_it_runs_with(study_spec_file, tmp_path, walked_runs,
                                                                     monkeypatch, environ, unset):
    """The VLA study's base leaves the allocator unset (null), and its space has expandable_segments [False, True].
    On one H200 (2026-12-05, study.csv run vlaw-h200) the walk took null for a value outside the space and spent
    its first trial on the base with False, which is what the baseline had run (0.86x its one run). The value an
    unset key runs with, the environment's setting or else torch's default (off), is the walk's start, measured."""
    monkeypatch.setattr("workbench.tune.opening.detect_capabilities", lambda gpus: frozenset({"cuda"}))
    monkeypatch.setattr("workbench.tune.opening._hardware", lambda caps, gpus: {"capabilities": ["cuda"], "gpus": 1})
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", environ)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    spec = study_spec_file(f"unset{int(unset)}", space={"micro_batch_size": {"choices": [4, 8]},
                                                        "expandable_segments": {"choices": [False, True]}},
                           trials=2, sampler={"name": "random", "seed": 0, "n_startup_trials": 2},
                           protocol={"compile_ahead": False, "start_ahead": False})
    t = _search(spec, tmp_path)
    walk = t.study.user_attrs["walk"]
    assert walk["measured"] is True and walk["defaults"]["expandable_segments"] is unset
    assert walked_runs == [{"micro_batch_size": 8, "expandable_segments": unset},
                           {"micro_batch_size": 8, "expandable_segments": not unset}]


def test_the_walk_line_names_apart_the_knobs_the_base_config_leaves_inactive():
    """gr00t-n1.6 on one H200 (study w7h, 2026-12-07): the line listed fused_residual_norm second, but the
    base runs RMSNorm on torch, where it does not act, and Triton RMSNorm never won, so no trial stepped it."""
    choices = {"fp8": ["none", "tensorwise"], "fused_residual_norm": [False, True],
               "rmsnorm_backend": ["torch", "triton"], "fp8_head": [False, True]}
    knobs = list(choices)
    base = {"fp8": "none", "rmsnorm_backend": "torch"}
    line = walk_line(walk_record(knobs, choices, {**base, "fused_residual_norm": False, "fp8_head": False}, base,
                                 100.0), startup_trials=2)
    assert line == ("the first 4 trial(s) were to change one knob at a time from the best config so far, starting "
                    "from the base config: fp8, rmsnorm_backend; then, where the best config so far makes them act, "
                    "fused_residual_norm, fp8_head")
    every = walk_line(walk_record(["fp8", "rmsnorm_backend"], choices, base, base, 100.0))
    assert every.endswith("from the base config: fp8, rmsnorm_backend")
