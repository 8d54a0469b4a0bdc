"""benchmarks/sampler_efficiency.py: reading a grid study as the tuner writes it, and the seeded replay."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import optuna
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sampler_efficiency", REPO / "benchmarks" / "sampler_efficiency.py")
se = importlib.util.module_from_spec(spec)
spec.loader.exec_module(se)

SPACE = {"micro_batch_size": [2, 4, 8], "compile": ["none", "default"], "triton_fusion": [False, True]}
BEST = (8, "default", True)


def value_of(mb, comp, tri):
    """A peaked landscape: one best configuration, every other at least 5% below it."""
    return 1000.0 * (1 + 0.1 * [2, 4, 8].index(mb) + 0.15 * (comp == "default") + 0.05 * tri)


def make_grid_study(tmp_path: Path, *, skip: int = 0, infeasible=(2, "none", True)) -> str:
    """A grid study written through the API the tuner uses: ask, user attr status, set_constraint, tell."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="grid", storage=url, direction="maximize")
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in SPACE.items()}
    for i, combo in enumerate(itertools.product(*SPACE.values())):
        if i < skip:
            continue
        study.enqueue_trial(dict(zip(SPACE, combo)))
        t = study.ask(dists)
        bad = combo == infeasible
        t.set_user_attr("status", "failed" if bad else "ok")
        t.set_constraint("failed", 1.0 if bad else 0.0)
        study.tell(t, 0.0 if bad else value_of(*combo))
    return url


def test_grid_is_read_with_failures_as_zero(tmp_path):
    url = make_grid_study(tmp_path)
    dists, grid = se.load_grid(url, "grid")
    assert list(dists) == list(SPACE) and len(grid) == 12
    row = grid.set_index(list(SPACE)).loc[(2, "none", True)]
    assert row["value"] == 0.0 and not row["feasible"]
    assert grid["value"].max() == pytest.approx(value_of(*BEST))


def test_incomplete_grid_is_a_clear_error(tmp_path):
    url = make_grid_study(tmp_path, skip=3)
    with pytest.raises(SystemExit, match=r"incomplete: 9 of 12 configurations measured in study .grid. in sqlite:.*; missing e.g."):
        se.load_grid(url, "grid")


def test_replay_counts_the_trial_that_first_asks_for_the_best(tmp_path):
    dists, grid = se.load_grid(make_grid_study(tmp_path), "grid")
    for seed in range(5):
        r = se.replay(dists, grid, "random", seed, n_startup=3, within=0.02, policy="sampler")
        # the same seeded random sampler, independently: the first trial asking for the (unique) best
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))
        first = None
        for i in range(1, 13):
            t = study.ask(dists)
            study.tell(t, 0.0)
            if first is None and tuple(t.params[k] for k in SPACE) == BEST:
                first = i
        assert r["trials_to_target"] == first and r["reached"] == (first is not None)
    # a loose target (within 30%) is met by any configuration at least 0.7 x the best: sooner, never later
    strict = se.replay(dists, grid, "tpe", 0, n_startup=3, within=0.02)
    loose = se.replay(dists, grid, "tpe", 0, n_startup=3, within=0.30)
    assert loose["trials_to_target"] <= (strict["trials_to_target"] or 13)


def test_the_tuners_policy_spends_no_trial_on_a_repeat_and_covers_the_grid(tmp_path):
    dists, grid = se.load_grid(make_grid_study(tmp_path), "grid")
    tuner = [se.replay(dists, grid, "random", seed, n_startup=0, within=0.02) for seed in range(8)]
    plain = [se.replay(dists, grid, "random", seed, n_startup=0, within=0.02, policy="sampler") for seed in range(8)]
    # a budget of 12 trials on a 12-config grid: every trial asks for a new config, so the best is always found
    assert all(r["distinct_configs_asked"] == 12 and r["reached"] for r in tuner)
    assert sum(r["free_repeats"] for r in tuner) > 0 and all(r["free_repeats"] == 0 for r in plain)
    assert any(r["distinct_configs_asked"] < 12 for r in plain)  # the sampler alone repeats itself


def test_the_grid_from_the_committed_results_csv():
    """The H200 grid of gr00t-n1.6-grid (2026-11-30) replays from benchmarks/results/study.csv, without its
    storage: 18 configurations, the best micro-batch 8, bucket width 512, Triton fusion on."""
    dists, grid = se.load_grid_csv(REPO / "benchmarks" / "results" / "study.csv", "gr00t-n1.6-grid",
                                   "campaign_studies_h200_2026-11-30.csv")
    assert {k: d.choices for k, d in dists.items()} == {"micro_batch_size": (2, 4, 8), "bucket_width": (128, 256, 512),
                                                         "triton_fusion": (False, True)}
    assert len(grid) == 18
    best = grid.loc[grid["value"].idxmax()]
    assert (best["micro_batch_size"], best["bucket_width"], best["triton_fusion"]) == (8, 512, True)
    assert best["value"] == pytest.approx(221949.447, rel=1e-6)
    # another source's rows hold other knobs (compile): nothing of this space, an incomplete grid
    with pytest.raises(SystemExit, match=r"incomplete: 0 of 18|no search trial"):
        se.load_grid_csv(REPO / "benchmarks" / "results" / "study.csv", "gr00t-n1.6-grid",
                         "campaign_discarded_compiles_in_windows_h200_2026-11-30.csv")


def test_main_writes_the_replay_and_a_summary(tmp_path, capsys):
    grid_dir = tmp_path / "grid"
    grid_dir.mkdir()
    make_grid_study(grid_dir)
    out = tmp_path / "out"
    assert se.main(["--grid", str(grid_dir), "--seeds", "6", "--spec", "gr00t-n1.6-proxy",
                    "--samplers", "tpe:4,gp:2,random", "--out", str(out)]) == 0
    res = pd.read_csv(out / "sampler_efficiency.csv")
    assert len(res) == 18 and list(dict.fromkeys(res["sampler"])) == ["tpe:4", "gp:2", "random"]
    assert set(res["policy"]) == {"tuner"}  # the default: repeats answered as workbench.tune answers them
    assert (res["grid_size"] == 12).all()
    assert res.groupby("sampler")["n_startup_trials"].first().to_dict() == {"tpe:4": 4, "gp:2": 2, "random": 0}
    summ = pd.read_csv(out / "summary.csv").set_index("sampler")
    for s, g in res.groupby("sampler"):
        t = g["trials_to_target"].fillna(13)
        assert summ.loc[s, "median_trials"] == pytest.approx(t.median())
        assert summ.loc[s, "share_within_25pct_of_grid"] == pytest.approx((t <= 3).mean())
    assert "grid grid: 12 configurations" in capsys.readouterr().out
    # without --samplers: the spec's own sampler, with its startup trials, and random search
    assert se.main(["--grid", str(grid_dir), "--seeds", "2", "--spec", "gr00t-n1.6-proxy", "--out", str(out)]) == 0
    spec = se.load_study_spec("gr00t-n1.6-proxy").sampler
    assert set(pd.read_csv(out / "sampler_efficiency.csv")["sampler"]) == {f"{spec.name}:{spec.n_startup_trials}",
                                                                           "random"}
    # both policies side by side: a summary row for each
    assert se.main(["--grid", str(grid_dir), "--seeds", "2", "--samplers", "random", "--policies", "tuner,sampler",
                    "--out", str(out)]) == 0
    assert list(pd.read_csv(out / "summary.csv")["policy"]) == ["tuner", "sampler"]
    with pytest.raises(SystemExit):
        se.main(["--grid", str(grid_dir), "--policies", "tuner,greedy", "--out", str(out)])
    assert "--policies: 'tuner,greedy'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"'bo:2' is not NAME or NAME:STARTUP_TRIALS"):
        se.main(["--grid", str(grid_dir), "--samplers", "tpe,bo:2", "--out", str(out)])


def test_a_grid_study_run_by_the_tuner_is_enumerated_and_replayed(study_spec_file, tmp_path, subprocess_env):
    """The tuner with sampler grid measures every configuration once and finishes (Optuna's grid sampler stops
    the study at the end of the grid, which raises under ask/tell: the tuner's subclass does not), and the
    replay reads the study as the tuner wrote it."""
    import subprocess
    import sys

    space = {"micro_batch_size": {"choices": [2, 8]}, "num_workers": {"choices": [0, 1]}}
    spec = study_spec_file("grid", space=space, trials=4, sampler={"name": "grid", "seed": 0},
                           protocol={"top_k": 0, "baseline_repeats": 1})  # the grid is the subject, not the A/B
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", str(out),
                        "--no-report", "--no-progress"], cwd=REPO, env=subprocess_env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    dists, grid = se.load_grid(f"sqlite:///{out / 'grid' / 'study.db'}", "grid")
    assert set(dists) == {"micro_batch_size", "num_workers"} and len(grid) == 4
    assert grid["feasible"].all() and (grid["value"] > 0).all()
    # which configuration measured best is up to the noise of two shared cores (micro-batch 2 and 8 run within
    # ~15% of each other here), and whether TPE's 4 asks reach it depends on which one it is; seeded random search
    # over 12 asks visits all 4 (seed 0), so it must find the measured best whichever it is
    res = se.replay(dists, grid, "random", 0, n_startup=0, within=0.02, n_trials=12)
    assert res["reached"] and res["distinct_configs_asked"] == 4 and res["best_found"] == grid["value"].max()
    res = se.replay(dists, grid, "tpe", 0, n_startup=2, within=0.02)
    assert res["best_found"] in set(grid["value"]) and res["trials_to_target"] in (None, 1, 2, 3, 4)
