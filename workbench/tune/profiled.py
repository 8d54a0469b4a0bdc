"""Proposals led by the base run's profile: the first trials change the knobs that act where the step's time goes.

Every trial records its step's phase timings (``workbench.vocab.PHASES``: data wait, host-to-device copy, forward,
backward, gradient sync, optimizer, other). After the baseline, the base config's median share of the step in each
phase gives each searched knob a weight: the share of the phases it acts on (``Knob.phases``). A knob whose phases
hold less than :data:`HOT_SHARE` of the base step cannot move the step by more than that, whatever its value; during
the sampler's startup trials (its ``n_startup_trials``, random draws before a model exists) such a knob is held at
the base config's value, so the startup spends its draws on the knobs that can act. Afterwards the sampler draws
every knob: a held knob is still searched, later.

The profile, each knob's weight and the knobs held are the study attribute ``profile`` (tune.json's ``profile``, the
report's Search section). A grid sampler and a study whose baseline recorded no phase timings (phase timing off, a
loop of one's own without them) are not led by a profile: every knob is drawn from the start.

A warm-started study (``workbench.tune.opening``: its first trial is the best config of an earlier study of the same
model on the same hardware) that searches knobs the earlier study did not (``warm_start.new``) spends its startup
around what the earlier study found, instead of on the whole space again. Each startup trial is a neighbour of the
incumbent: the best feasible trial so far (the warm start's own trial until one finished), one of the new knobs
set to another of its choices, the first such config that no trial has asked for, in knob order from the knob after
the last one tried around the incumbent; the incumbent moves as faster neighbours finish, so the startup walks the
new knobs one at a time, cyclically (coordinate descent). Such a startup lasts at least one trial more than the new
knobs (``walk_startup``), so that each is changed once. Once every neighbour was asked, the startup holds the
warm start's values and draws the new knobs at random. A trial asked ahead (compile-ahead: during the trial before
it) is planned from the trials finished by then. Where the earlier study searched every knob of this one, the warm
start holds nothing. The profile's holds give way to these values.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from workbench.tune.knobs import Knob
from workbench.tune.samplers import WrappedSampler, infeasible
from workbench.tune.validation import is_feasible
from workbench.vocab import PHASES

__all__ = ["HOT_SHARE", "ProfileLed", "knob_weights", "phase_shares", "profile_line", "profile_record", "warm_held",
           "walk_startup", "warm_neighbour", "warm_start_line", "warm_walk"]

HOT_SHARE = 0.05
"""A knob whose phases hold less than this share of the base step is held at its base value in startup trials."""


def phase_shares(runs: Iterable[Mapping[str, Any] | None]) -> dict[str, float] | None:
    """Each phase's share of the step: per run, its seconds over the step's (``phase_s_per_step`` of a summary),
    then the median over the runs that recorded every phase. None when no run did."""
    per_run = []
    for phases in runs:
        if not phases or any(not isinstance(phases.get(p), (int, float)) for p in PHASES):
            continue
        total = sum(float(phases[p]) for p in PHASES)
        if total > 0:
            per_run.append({p: float(phases[p]) / total for p in PHASES})
    if not per_run:
        return None
    return {p: statistics.median(r[p] for r in per_run) for p in PHASES}


def knob_weights(knobs: Sequence[Knob], shares: Mapping[str, float]) -> list[tuple[str, float]]:
    """(knob, the share of the base step in the phases it acts on), heaviest first; ties keep ``knobs``' order."""
    weights = [(k.name, sum(shares.get(p, 0.0) for p in k.phases)) for k in knobs]
    return sorted(weights, key=lambda kw: -kw[1])


def profile_record(knobs: Sequence[Knob], shares: Mapping[str, float] | None, base: Mapping[str, Any],
                   contains: Callable[[str, Any], bool], startup_trials: int) -> dict[str, Any] | None:
    """The study's ``profile``: the base step's ``phases`` (shares), each knob's ``weight``, and the knobs
    ``held`` at their base value (name -> value) during the first ``startup_trials`` trials; only a knob whose
    base value its space ``contains`` can be held. None without phase timings."""
    if shares is None:
        return None
    weights = knob_weights(knobs, shares)
    held = {name: base[name] for name, w in weights
            if w < HOT_SHARE and name in base and base[name] is not None and contains(name, base[name])}
    return {"phases": {p: round(s, 4) for p, s in shares.items()},
            "weights": [{"knob": n, "weight": round(w, 4)} for n, w in weights],
            "held": held, "startup_trials": startup_trials, "hot_share": HOT_SHARE}


def profile_line(record: Mapping[str, Any]) -> str:
    """One line: where the base step's time goes, and what the startup trials hold."""
    phases = sorted(record["phases"].items(), key=lambda ps: -ps[1])
    where = ", ".join(f"{p} {s:.0%}" for p, s in phases if s >= 0.005) or "no phase over 0.5%"
    held = record.get("held") or {}
    if not held:
        return f"profile of the base step: {where}; every knob acts on at least {HOT_SHARE:.0%} of it"
    return (f"profile of the base step: {where}; the first {record['startup_trials']} trial(s) hold "
            f"{', '.join(held)} at the base value (their phases take under {HOT_SHARE:.0%} of the step)")


class ProfileLed(WrappedSampler):
    """``sampler``, except that while fewer than ``startup_trials`` trials have finished, a knob the study's
    ``profile`` holds is given its base value (see the module docstring). The profile is read from the study
    (``profile`` user attr) when a trial is sampled: it exists once the baseline ran, in every process."""

    def __init__(self, sampler: optuna.samplers.BaseSampler, startup_trials: int) -> None:
        super().__init__(sampler)
        self.startup_trials = startup_trials
        self._neighbours: dict[int, dict[str, Any]] = {}  # trial number -> its warm start neighbour, once planned

    def held(self, study: Study, trial: FrozenTrial | None = None) -> Mapping[str, Any]:
        """The knobs held now (name -> value) while the startup lasts, else none: the profile's at their base
        value, and a partial warm start's at its values (``warm_held``), or, for ``trial``, at the incumbent's
        neighbour it was planned to be (``warm_neighbour``)."""
        record = study.user_attrs.get("profile") or {}
        held = {**(record.get("held") or {}), **warm_held(study)}
        if not held:
            return {}
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) or infeasible(t) for t in trials)
        if done >= walk_startup(study, self.startup_trials):
            return {}
        if trial is not None:
            if trial.number not in self._neighbours:
                self._neighbours[trial.number] = warm_neighbour(study, trials, trial.number)
            held.update(self._neighbours[trial.number])
        return held

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        held = self.held(study, trial)
        out = self.sampler.sample_relative(study, trial, search_space)
        return {k: (held[k] if k in held and _fits(search_space[k], held[k]) else v) for k, v in out.items()}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        held = self.held(study, trial)
        if param_name in held and _fits(param_distribution, held[param_name]):
            return held[param_name]
        return self.sampler.sample_independent(study, trial, param_name, param_distribution)


def walk_startup(study: Study, startup_trials: int) -> int:
    """The trials the startup lasts: ``startup_trials``, and for a partially warm-started study at least one more
    than its new knobs, so that the walk changes each of them once from the incumbent before the sampler's model
    takes over (hf-llama on one H200: 5 new knobs, 4 startup trials; the walk's third step would have been its
    last)."""
    warm = study.user_attrs.get("warm_start") or {}
    return _walk_length(startup_trials, warm.get("new") or []) if warm.get("params") else startup_trials


def _walk_length(startup_trials: int, new: Sequence[str]) -> int:
    """The startup of a partial warm start: ``startup_trials``, at least one more than the ``new`` knobs."""
    return max(startup_trials, 1 + len(new))


def warm_held(study: Study) -> dict[str, Any]:
    """The warm start's values (the study attr ``warm_start``'s ``params``) when this study searches a knob the
    earlier study did not (its ``new``), else none."""
    warm = study.user_attrs.get("warm_start") or {}
    return dict(warm.get("params") or {}) if warm.get("new") else {}


def warm_neighbour(study: Study, trials: Sequence[FrozenTrial], number: int) -> dict[str, Any]:
    """The config trial ``number`` of a partially warm-started study is planned to be (see the module docstring):
    the incumbent's params with one new knob set to another of its choices, the first untried in choice order and
    in knob order from the knob after the last one tried around the incumbent (cyclic coordinate descent); {} when
    none is left, the study is not partially warm-started, or it has more than one objective."""
    warm = study.user_attrs.get("warm_start") or {}
    new = warm.get("new") or []
    if not new or not warm.get("params") or len(study.directions) != 1:
        return {}
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    ok = [t for t in trials if t.number != number and is_feasible(t)]
    first = next((t for t in trials if "warm_start" in t.user_attrs and t.number != number), None)
    incumbent = max(ok, key=lambda t: sign * t.values[0]) if ok else first
    if incumbent is None or not incumbent.params:
        return {}
    asked = [t.params or t.system_attrs.get("fixed_params") or {} for t in trials if t.number != number]
    # cyclic: the knobs after the last (in knob order) whose neighbour of the incumbent was asked first, so that a
    # new incumbent goes on to the next knob instead of trying again the ones its predecessor tried
    inc, last = incumbent.params, -1
    for a in asked:
        differ = [n for n in {*a, *inc} if a.get(n) != inc.get(n)]
        if len(differ) == 1 and differ[0] in new:
            last = max(last, new.index(differ[0]))
    for name in new[last + 1:] + new[:last + 1]:
        dist = incumbent.distributions.get(name)
        if not isinstance(dist, CategoricalDistribution):  # inactive in the incumbent, or a numeric range
            continue
        for choice in dist.choices:
            if choice == incumbent.params[name] and type(choice) is type(incumbent.params[name]):
                continue
            config = {**incumbent.params, name: choice}
            if not any(all(n in a and a[n] == v for n, v in config.items()) for a in asked):
                return config
    return {}


def warm_walk(trials: Sequence[FrozenTrial], new: Sequence[str]) -> list[dict[str, Any]]:
    """The steps the startup of a partially warm-started study took, read from its trials: each trial after the warm
    start's own that differs in exactly one of the ``new`` knobs from an earlier trial, as {trial, knob, from, to,
    of (that earlier trial; the fastest feasible one where several qualify), value (its objective, None where
    it has none), status}. A trial drawn at random (more than one knob changed) is not a step."""
    done = sorted((t for t in trials if t.params), key=lambda t: t.number)
    start = next((t.number for t in done if "warm_start" in t.user_attrs), None)
    if start is None:
        return []
    steps = []
    for t in done:
        if t.number <= start:
            continue
        near = []
        for e in done:
            if e.number >= t.number:
                break
            differ = [n for n in {*e.params, *t.params} if e.params.get(n) != t.params.get(n)]
            if len(differ) == 1 and differ[0] in new:
                near.append((e, differ[0]))
        if not near:
            continue
        e, knob = max(near, key=lambda p: (is_feasible(p[0]), p[0].values[0] if is_feasible(p[0]) else 0.0))
        steps.append({"trial": t.number, "knob": knob, "from": e.params.get(knob), "to": t.params.get(knob),
                      "of": e.number, "value": t.values[0] if t.values else t.intermediate_values.get(
                          max(t.intermediate_values)) if t.intermediate_values else None,
                      "status": t.user_attrs.get("status", t.state.name.lower())})
    return steps


def warm_start_line(record: Mapping[str, Any], startup_trials: int | None = None) -> str:
    """One line: which earlier study's trial ran first, and what the startup trials did around it (``walk``:
    :func:`warm_walk`'s steps, where the record holds them)."""
    kept = record.get("params") or {}
    line = (f"the first trial was trial {record.get('trial')} of the earlier study {record.get('study')} (same model "
            f"and hardware), {len(kept)} of its values kept")
    if record.get("new") and kept:
        walk = record.get("walk")
        if walk:
            told = []
            for w in walk:
                speed = f"{w['value']:,.0f}" if isinstance(w.get("value"), (int, float)) else w.get("status", "")
                told.append(f"trial {w['trial']}: {w['knob']} {w['from']} -> {w['to']} from trial {w['of']} ({speed})")
            line += (f"; then one new knob at a time from the best so far: {'; '.join(told)}")
        else:
            n = _walk_length(startup_trials, record["new"]) if startup_trials else None
            first = f"the first {n} trial(s)" if n else "the startup trials"
            line += (f"; {first} changed {', '.join(record['new'])}, which it did not search, one at a time from "
                     "the best so far")
    return line


def _fits(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one ``dist`` can return (a choice, or a number in its range on its step)."""
    if isinstance(dist, CategoricalDistribution):
        return any(value == c and type(value) is type(c) for c in dist.choices)
    if isinstance(dist, (IntDistribution, FloatDistribution)) and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        if not dist.low <= value <= dist.high:
            return False
        return dist.step is None or abs((value - dist.low) / dist.step - round((value - dist.low) / dist.step)) < 1e-9
    return False
