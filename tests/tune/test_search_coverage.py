"""The search's use of its budget (issues 38 and 40): a repeated proposal costs no budget while untried configs
remain, a resumed or second process continues the search instead of replaying it, and a trial that stopped
without a result of its own (Ctrl-C, a dead tuner) has its config queued again, once, under every sampler.

The trial runner is replaced by a function of the config (known speeds): what is under test is the tuner's
choice of configs and its budget, which the real runner's tests (test_tune_trial.py, test_tune_resume.py) do not
reach in the time a fast suite has."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from workbench.tune import Tuner
from workbench.tune.search import Search
from workbench.tune.study import load_study_spec
from workbench.tune.trial import TrialOutcome

SPACE = {"micro_batch_size": {"choices": [2, 8]}, "num_workers": {"choices": [0, 1]}}
CONFIGS = [dict(zip(SPACE, v)) for v in itertools.product(*(r["choices"] for r in SPACE.values()))]


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def _speed(params: dict) -> float:
    return 1000.0 * params["micro_batch_size"] + 10.0 * params.get("num_workers", 0)  # mb 8, a worker: the best


@pytest.fixture
def fake_runs(monkeypatch):
    """Every search trial 'runs' at its config's known speed; the calls are listed."""
    ran: list[dict] = []

    def run(self, trial, cfg, tdir, on_window, budget_s=None):
        params = dict(trial.params)
        ran.append(params)
        v = _speed(params)
        return TrialOutcome("ok", Path(tdir), windows=[v, v], value=v, summary={"measured_steps": 6})

    monkeypatch.setattr(Search, "run_search_trial", run)
    return ran


def _own_loop(spec_path: Path) -> Path:
    """The spec with a loop of one's own (never launched here: the runs are faked), so that a user.* knob may take
    a float range."""
    spec = yaml.safe_load(spec_path.read_text())
    spec["trainer"] = {"command": ["python", "loop.py"]}
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec_path


def _tuner(spec_path: Path, tmp_path: Path, **kw) -> Tuner:
    t = Tuner(load_study_spec(str(spec_path)), out_root=tmp_path / "runs", progress=False, **kw)
    t.open()
    return t


def _measured(t: Tuner) -> list[dict]:
    """Configs of the trials that used the budget and ran (not repeats), in trial order."""
    return [dict(x.params) for x in t.study.get_trials(states=(TrialState.COMPLETE,))
            if "duplicate_of" not in x.user_attrs]


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "too-large-to-list"])
@pytest.mark.parametrize("sampler", [{"name": "tpe", "seed": 0, "n_startup_trials": 1},
                                     {"name": "random", "seed": 3}, {"name": "gp", "seed": 0,
                                                                      "n_startup_trials": 1}])
def test_a_2x2_space_with_a_4_trial_budget_measures_all_4(study_spec_file, tmp_path, fake_runs, sampler, listed,
                                                          monkeypatch):
    """Issue 38: a 2x2 space with a 3-trial TPE budget measured 1 of 4 configs; the repeats took the budget. A space
    too large to list (the hf-llama study's ~10k configs: a repeat took a trial of its budget) draws an untried
    config in the repeat's place."""
    if not listed:
        monkeypatch.setattr("workbench.tune.search.MAX_ENUMERATED", 1)
    spec = study_spec_file("cover", space=SPACE, trials=4, sampler=sampler)
    t = _tuner(spec, tmp_path)
    t.search()
    assert sorted(map(_key, _measured(t))) == sorted(map(_key, CONFIGS))
    assert sorted(map(_key, fake_runs)) == sorted(map(_key, CONFIGS))  # each ran once
    counted = [x for x in t.study.get_trials() if x.state == TrialState.COMPLETE and not x.user_attrs.get(
        "free_repeat")]
    assert len(counted) == 4 and t.session.finished_count() == 4  # what tune.json calls trials_run
    # with the space covered, a further trial may repeat (and counts: nothing is left to try)
    t2 = _tuner(spec, tmp_path, trials=5)
    t2.search()
    assert len(fake_runs) == 4 and len(t2.study.get_trials(states=(TrialState.COMPLETE,))) >= 5


def test_the_space_is_listed_with_conditional_knobs_where_active(study_spec_file, tmp_path):
    space = {"activation_checkpointing": {"choices": ["none", "selective"]},
             "activation_checkpointing_every": {"choices": [2, 4]}, "micro_batch_size": {"choices": [2, 8]}}
    t = _tuner(study_spec_file("cond", space=space, trials=2), tmp_path)
    configs = t.searcher.configs()
    assert len(configs) == 6  # none x 2 micro-batches, selective x 2 x 2
    assert {"activation_checkpointing": "none", "micro_batch_size": 2} in configs
    assert all(("activation_checkpointing_every" in c) == (c["activation_checkpointing"] == "selective")
               for c in configs)
    t2 = _tuner(_own_loop(study_spec_file("cont", space={"micro_batch_size": {"choices": [2, 8]},
                                                         "user.lr_scale": {"low": 0.5, "high": 0.9}}, trials=1)),
                tmp_path)
    assert "user.lr_scale" in t2.session.active and t2.searcher.configs() is None  # a continuous range: no list


def _interrupt_one(t: Tuner) -> dict:
    """Ask a trial and leave it as Ctrl-C leaves one (FAIL, status interrupted); returns its config."""
    trial = t.study.ask()
    params = t.searcher.sample(trial)
    t.searcher.mark_interrupted(trial)
    return params


def _dead_worker_trial(t: Tuner) -> dict:
    """Ask a trial and leave it RUNNING under a tuner process that has exited (a kill -9); returns its config."""
    trial = t.study.ask()
    params = t.searcher.sample(trial)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    trial.set_user_attr("worker", {**t.me, "pid": gone.pid, "start": "1"})
    return params


@pytest.mark.parametrize("sampler", [{"name": "random", "seed": 0}, {"name": "tpe", "seed": 0,
                                                                      "n_startup_trials": 2},
                                     {"name": "grid", "seed": 0}])
@pytest.mark.parametrize("how", ["ctrl_c", "kill_9"])
def test_a_config_stopped_without_result_is_measured_on_resume(study_spec_file, tmp_path, fake_runs, sampler, how):
    """Issue 40: under the grid sampler a config interrupted by Ctrl-C was never re-run; issue 38: after a kill -9
    the resumed random sampler started its sequence over and the budget went to repeats. Resumed, the stopped
    config is queued again and measured, every config once, the budget of 4 kept."""
    spec = study_spec_file("resume", space=SPACE, trials=4, sampler=sampler)
    first = _tuner(spec, tmp_path)
    stopped = _interrupt_one(first) if how == "ctrl_c" else _dead_worker_trial(first)
    first.lease.release()
    again = _tuner(spec, tmp_path)
    again.search()
    assert stopped in fake_runs
    assert sorted(map(_key, fake_runs)) == sorted(map(_key, CONFIGS))  # no repeat while untried configs remained
    requeued = [x for x in again.study.get_trials() if "requeue_of" in x.user_attrs]
    assert len(requeued) == 1 and requeued[0].params == stopped and requeued[0].state == TrialState.COMPLETE
    # once: a later resume queues nothing more
    _tuner(spec, tmp_path).searcher.requeue_interrupted()
    assert len([x for x in again.study.get_trials() if "requeue_of" in x.user_attrs]) == 1


def test_a_resumed_sampler_does_not_replay_its_sequence(study_spec_file, tmp_path, fake_runs):
    """The seed of a resumed study's sampler is offset by the trials it holds: its proposals are not the fresh
    study's again (a continuous range, so that no untried config can be queued in place of a repeat: the sampler
    alone decides)."""
    space = {"micro_batch_size": {"choices": [2, 8]}, "user.lr_scale": {"low": 0.1, "high": 1.0}}
    spec = _own_loop(study_spec_file("seq", space=space, trials=2, sampler={"name": "random", "seed": 0}))
    t = _tuner(spec, tmp_path)
    t.search()
    first_two = list(fake_runs)
    t2 = _tuner(spec, tmp_path, trials=4)
    t2.search()
    assert len(fake_runs) == 4, fake_runs  # two new configs ran: none of the resumed proposals was a repeat
    assert not set(map(_key, fake_runs[2:])) & set(map(_key, first_two))
