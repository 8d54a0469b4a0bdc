"""workbench.tune.samplers: the GP sampler that models numeric choices as ordered."""

from __future__ import annotations

import itertools
import statistics

import optuna
import pytest
from optuna.distributions import CategoricalDistribution as Cat
from optuna.trial import TrialState

from workbench.tune.samplers import gp_sampler, ordinal_choices

optuna.logging.set_verbosity(optuna.logging.WARNING)

# five ordered choices per knob (values given unsorted, as a study file may), plus a boolean
SPACE = {"bucket_width": Cat((512, 64, 128, 256, 1024)), "micro_batch_size": Cat((1, 2, 4, 8, 16)),
         "graph_capture": Cat((False, True))}


def throughput(p) -> float:
    """A smooth landscape over the ordered knobs: best at bucket 512, micro-batch 8, graphs on (1 in 50)."""
    b = [64, 128, 256, 512, 1024].index(p["bucket_width"])
    m = [1, 2, 4, 8, 16].index(p["micro_batch_size"])
    return 100.0 - 6 * (b - 3) ** 2 - 5 * (m - 3) ** 2 + 8 * p["graph_capture"]


BEST = throughput({"bucket_width": 512, "micro_batch_size": 8, "graph_capture": True})


def trials_to_best(sampler, budget: int = 25) -> int:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for i in range(1, budget + 1):
        t = study.ask(SPACE)
        assert all(t.params[k] in d.choices for k, d in SPACE.items())  # proposals are the real choices
        v = throughput(t.params)
        t.set_constraint("failed", 0.0)
        study.tell(t, v)
        if v == BEST:
            return i
    return budget + 1


def test_ordinal_choices_are_numbers_only():
    assert ordinal_choices(Cat((512, 64, 128))) == (64, 128, 512)
    assert ordinal_choices(Cat((0.5, 1, 0.25))) == (0.25, 0.5, 1)
    assert ordinal_choices(Cat((False, True))) is None  # bools stay labels
    assert ordinal_choices(Cat(("none", "default"))) is None
    assert ordinal_choices(Cat((1, "auto"))) is None
    assert ordinal_choices(Cat((8,))) is None
    assert ordinal_choices(optuna.distributions.IntDistribution(1, 8)) is None


def test_the_ordinal_gp_finds_the_best_of_an_ordered_landscape_in_fewer_trials():
    """50 configurations, one best: seeded runs of the ordinal GP against Optuna's GP on the same (categorical)
    space and against random search. Ordered, the GP learns from micro-batch 4 beating 2 that 8 is worth a try;
    as labels it cannot."""
    seeds = range(4)
    ordinal = [trials_to_best(gp_sampler(s, 3)) for s in seeds]
    labels = [trials_to_best(optuna.samplers.GPSampler(seed=s, n_startup_trials=3)) for s in seeds]
    rand = [trials_to_best(optuna.samplers.RandomSampler(seed=s)) for s in seeds]
    assert statistics.median(ordinal) <= 12, ordinal
    assert statistics.median(ordinal) < statistics.median(labels), (ordinal, labels)
    assert statistics.median(ordinal) < statistics.median(rand), (ordinal, rand)


def test_constraints_of_mixed_key_sets_and_running_trials_are_accepted():
    """A study resumed across versions may hold trials with other constraint keys (missing ones count as
    feasible), and parallel workers leave trials running: the GP still proposes, within the choices, and steers
    away from the infeasible region it has seen."""
    study = optuna.create_study(direction="maximize", sampler=gp_sampler(0, 2))
    combos = list(itertools.product(*(d.choices for d in SPACE.values())))
    for i, combo in enumerate(combos[:12]):
        params = dict(zip(SPACE, combo))
        bad = params["micro_batch_size"] == 16  # out of memory, say
        cons = {"failed": float(bad)} if i % 2 else {"failed": float(bad), "memory": 0.0}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=SPACE, constraints=cons,
                                                  value=0.0 if bad else throughput(params)))
    running = study.ask(SPACE)  # a parallel worker's trial, params suggested, no value yet
    asked = []
    for _ in range(6):
        t = study.ask(SPACE)
        asked.append(t.params)
        study.tell(t, throughput(t.params)) if t.params["micro_batch_size"] != 16 else study.tell(t, 0.0)
    assert running.number in [t.number for t in study.get_trials(states=(TrialState.RUNNING,))]
    assert all(p[k] in d.choices for p in asked for k, d in SPACE.items())
    assert sum(p["micro_batch_size"] == 16 for p in asked) <= 1, asked


def test_a_study_file_may_name_the_gp_sampler():
    from workbench.tune.study import spec_from_dict

    spec = spec_from_dict({"name": "s", "space": {"micro_batch_size": {"choices": [2, 4]}},
                           "sampler": {"name": "gp", "n_startup_trials": 2}})
    assert spec.sampler.name == "gp"
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match="sampler.name|name"):
        spec_from_dict({"name": "s", "space": {"micro_batch_size": {"choices": [2, 4]}}, "sampler": {"name": "bo"}})


def test_without_scipy_the_gp_sampler_is_a_clear_config_error(monkeypatch):
    import sys

    from workbench.config import ConfigError

    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy -> ImportError
    with pytest.raises(ConfigError, match=r"sampler.name: 'gp' needs scipy"):
        gp_sampler(0, 2)
