"""Optuna samplers of the studies beyond Optuna's own: a Gaussian-process sampler that models ordered choices.

Most knobs are numbers offered as a short list of choices (bucket width 64/128/256/512,
micro-batch 2/4/8, ring depth, warps, chunk sizes). The tuner suggests them with
``suggest_categorical`` so that trials store and report the real values, but Optuna's
samplers then treat them as unordered labels: having seen that micro-batch 4 beats 2,
they learn nothing about 8. :class:`OrdinalGPSampler` is Optuna's ``GPSampler`` fed a
view of the study in which every all-numeric categorical knob is its position among
the sorted choices (an integer), so the Gaussian process's kernel sees 2 < 4 < 8 as
neighbours; what it proposes is mapped back to the choice. Booleans and strings stay
categorical. Constraints (``trial.constraints``, set with ``Trial.set_constraint``) and
running trials (parallel workers) are passed through, so the GP's constrained and batch
acquisition work as in Optuna.

A trial that failed (a failure kind: timeout, oom, crash...) is stored as Optuna's FAIL, so that Optuna's own
tools (the dashboard, ``optuna best-trial``, importances) do not read it as a measurement; the samplers that learn
from results still see it, through a view of the study in which it is COMPLETE with the worst objective and the
``failed`` constraint violated (:func:`learning_view`, :class:`LearnsFromFailures`).

Replayed against an 18-configuration grid measured on an H200
(``benchmarks/sampler_efficiency.py``, 200 seeds), it reaches within 2% of the grid's
best in a median of 4 trials with 2 random startup trials, against 7 for TPE with 4
and 12 for random search (benchmarks/README.md).
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from workbench.errors import ConfigError
from workbench.vocab import FAILURE_KINDS

__all__ = ["LearnsFromFailures", "asked_config", "OrdinalGPSampler", "SAMPLERS", "WrappedSampler", "gp_sampler", "infeasible",
           "learning_view", "make_sampler", "ordinal_choices", "tpe_sampler", "untried_config"]

CONSTRAINTS = ("failed", "memory", "finite_loss")
"""The constraints every trial carries (> 0 = violated), in the order of the ``constraint`` user attr."""


def infeasible(t: FrozenTrial) -> bool:
    """A FAIL trial whose config failed (its ``status`` is a failure kind), as opposed to one stopped from outside
    (interrupted, stale, over the budget): it counts against the budget and teaches the sampler."""
    return t.state == TrialState.FAIL and t.user_attrs.get("status") in FAILURE_KINDS


def _as_learned(t: FrozenTrial, directions: list[optuna.study.StudyDirection]) -> FrozenTrial:
    """A failed trial as the samplers learn it: COMPLETE, the worst objective, the ``failed`` constraint 1."""
    worst = [0.0 if d == optuna.study.StudyDirection.MAXIMIZE else float("inf") for d in directions]
    cons = {k: (1.0 if k == "failed" else 0.0) for k in CONSTRAINTS}
    attrs = {k: v for k, v in t.system_attrs.items() if not k.startswith("constraints")}
    return optuna.trial.create_trial(state=TrialState.COMPLETE, values=worst, params=t.params,
                                     distributions=t.distributions, user_attrs=t.user_attrs,
                                     system_attrs=attrs, constraints=cons)


def _named_constraints(t: FrozenTrial) -> FrozenTrial:
    """``t`` without the list form of its constraints (kept for optuna-dashboard, which Optuna reads back as
    constraints named 0, 1, 2): the samplers model each constraint once, by name."""
    if "constraints" not in t.system_attrs:
        return t
    attrs = {k: v for k, v in t.system_attrs.items() if k != "constraints"}
    return optuna.trial.create_trial(state=t.state, values=t.values, params=t.params, distributions=t.distributions,
                                     user_attrs=t.user_attrs, system_attrs=attrs,
                                     intermediate_values=t.intermediate_values)


def learning_view(study: Study, trial: FrozenTrial) -> tuple[list[FrozenTrial], Study]:
    """The trials a learning sampler sees (COMPLETE and RUNNING ones, and each failed one as infeasible, the trial
    being sampled left out) and an in-memory study holding them, then the trial being sampled (running, with
    what it has drawn so far) as its last trial."""
    trials = []
    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number:
            continue
        if infeasible(t):
            trials.append(_as_learned(t, study.directions))
        elif t.state in (TrialState.COMPLETE, TrialState.RUNNING):
            trials.append(_named_constraints(t))
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(level, optuna.logging.WARNING))  # no "new study created" line per ask
    try:
        view = optuna.create_study(directions=study.directions, sampler=optuna.samplers.RandomSampler(seed=0))
        view.add_trials([*trials, optuna.trial.create_trial(state=TrialState.RUNNING, params=trial.params,
                                                             distributions=trial.distributions)])
    finally:
        optuna.logging.set_verbosity(level)
    return trials, view


class WrappedSampler(optuna.samplers.BaseSampler):
    """A sampler around another (``self.sampler``): what a subclass does not override goes to it as it is."""

    def __init__(self, sampler: optuna.samplers.BaseSampler) -> None:
        self.sampler = sampler

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.sampler.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.sampler.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.sampler.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        self.sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.sampler.reseed_rng()


class LearnsFromFailures(WrappedSampler):
    """Any Optuna sampler, sampling from :func:`learning_view` of the study: the failed trials teach it where the
    infeasible configs are, as COMPLETE trials with the ``failed`` constraint would."""

    def _view(self, study: Study, trial: FrozenTrial) -> tuple[Study, FrozenTrial]:
        _, view = learning_view(study, trial)
        return view, view.get_trials(deepcopy=False)[-1]

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.sampler.infer_relative_search_space(*self._view(study, trial))

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.sampler.sample_relative(*self._view(study, trial), search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.sampler.sample_independent(*self._view(study, trial), param_name, param_distribution)


SAMPLERS = ("tpe", "gp", "random", "nsga2")
"""The samplers :func:`make_sampler` builds (a study's ``sampler.name``; ``grid`` needs the space: workbench.tune)."""


def ordinal_choices(dist: BaseDistribution) -> tuple[float, ...] | None:
    """The sorted choices of a categorical distribution whose choices are all numbers (not bools), else None."""
    if not isinstance(dist, CategoricalDistribution) or len(dist.choices) < 2:
        return None
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in dist.choices):
        return None
    return tuple(sorted(dist.choices))


class OrdinalGPSampler(optuna.samplers.GPSampler):
    """``GPSampler`` that models all-numeric categorical knobs as ordered (see the module docstring)."""

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        order = {name: c for name, d in search_space.items() if (c := ordinal_choices(d)) is not None}
        space = {name: IntDistribution(0, len(order[name]) - 1) if name in order else d
                 for name, d in search_space.items()}
        # the study as the GP should see it: in memory, rebuilt per ask (trials are few and each costs minutes),
        # failed trials as infeasible; the trial being sampled is a fresh running trial of the view (GPSampler
        # writes its proposal there)
        trials, _ = learning_view(study, trial)
        keys = sorted({k for t in trials if t.state == TrialState.COMPLETE for k in t.constraints})
        level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(max(level, optuna.logging.WARNING))
        try:
            view = optuna.create_study(directions=study.directions, sampler=optuna.samplers.RandomSampler(seed=0))
            view.add_trials([_as_ordinal(t, order, keys) for t in trials])
            view.ask()
        finally:
            optuna.logging.set_verbosity(level)
        proposed = super().sample_relative(view, view.get_trials(deepcopy=False)[-1], space)
        return {name: order[name][int(v)] if name in order else v for name, v in proposed.items()}


def _as_ordinal(t: FrozenTrial, order: dict[str, tuple[float, ...]], keys: list[str]) -> FrozenTrial:
    """``t`` with ordered knobs as positions, and every constraint in ``keys`` (0, feasible, where ``t`` has
    none: the GP models each constraint over all trials; a study resumed across versions may mix key sets)."""
    params, dists = dict(t.params), dict(t.distributions)
    for name, choices in order.items():
        if name in params and params[name] in choices:
            params[name] = choices.index(params[name])
            dists[name] = IntDistribution(0, len(choices) - 1)
        else:  # the knob was not suggested in this trial (conditional), or from another space: leave it out
            params.pop(name, None)
            dists.pop(name, None)
    done = t.state == TrialState.COMPLETE
    return optuna.trial.create_trial(
        state=t.state, values=t.values if done else None, params=params, distributions=dists,
        constraints={k: t.constraints.get(k, 0.0) for k in keys} if done and keys else None)


def make_sampler(name: str, seed: int | None, n_startup_trials: int) -> optuna.samplers.BaseSampler:
    """The sampler a study names: what the tuner searches with and what the replay benchmark replays."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return LearnsFromFailures(tpe_sampler(seed, n_startup_trials))
        if name == "gp":
            return gp_sampler(seed, n_startup_trials)  # its ordinal view holds the failed trials already
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "nsga2":
            return LearnsFromFailures(optuna.samplers.NSGAIISampler(seed=seed,
                                                                    population_size=max(2, n_startup_trials)))
    raise ValueError(f"sampler {name!r}: expected one of {', '.join(SAMPLERS)}")


def tpe_sampler(seed: int | None, n_startup_trials: int) -> optuna.samplers.TPESampler:
    """The studies' TPE: multivariate, constant liar (parallel workers), ``n_startup_trials`` random trials first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True,
                                          constant_liar=True)


def gp_sampler(seed: int | None, n_startup_trials: int,
               independent: optuna.samplers.BaseSampler | None = None) -> OrdinalGPSampler:
    """The studies' GP sampler: ``n_startup_trials`` random trials, then the ordinal GP. Knobs outside the
    space every trial shares (conditional ones, such as ``compile_scope`` when something is compiled) are drawn
    by ``independent`` (random search by default), without a warning per trial."""
    try:
        import scipy  # noqa: F401  (Optuna's GP sampler needs it and fails only at its first model fit)
    except ImportError as e:
        raise ConfigError("'gp' needs scipy (pip install scipy, a dependency of this project); or use "
                          "sampler.name: tpe", key="sampler.name") from e
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return OrdinalGPSampler(seed=seed, n_startup_trials=n_startup_trials, warn_independent_sampling=False,
                                independent_sampler=independent or optuna.samplers.RandomSampler(seed=seed))


def asked_config(t: FrozenTrial) -> dict[str, Any]:
    """The config trial ``t`` asked for: its params, or the ones it was enqueued with (``fixed_params``) before it
    sampled them; {} for a trial asked ahead and not yet sampled."""
    return t.params or t.system_attrs.get("fixed_params") or {}


def untried_config(configs: list[dict[str, Any]], asked: list[dict[str, Any]], seed: int | None,
                   number: int) -> dict[str, Any] | None:
    """The config that runs in place of trial ``number``'s repeat: one of ``configs`` (the finite space, in
    sampling order) that is not in ``asked``, picked by the study seed and the trial number so that a study reruns
    the same way; None when every config was asked for."""
    untried = [c for c in configs if c not in asked]
    if not untried:
        return None
    return untried[random.Random((seed or 0) * 1_000_003 + number).randrange(len(untried))]
