"""Proposals led by the base run's profile: the first trials change the knobs that act where the step's time goes.

Every trial records its step's phase timings (``workbench.vocab.PHASES``: data wait, host-to-device copy, forward,
backward, gradient sync, optimizer, other). After the baseline, the base config's median share of the step in each
phase gives each searched knob a weight: the share of the phases it acts on (``Knob.phases``). A knob whose phases
hold less than :data:`HOT_SHARE` of the base step cannot move the step by more than that, whatever its value; during
the sampler's startup trials (its ``n_startup_trials``, random draws before a model exists) such a knob is held at
the base config's value, so the startup spends its draws on the knobs that can act. Afterwards the sampler draws
every knob: a held knob is still searched, later.

The last baseline repeat profiles a few steps after its measurement; its summary sorts their device time by kernel
kind (``workbench.vocab.KERNEL_KINDS``: :func:`kernel_profile`). A knob's reach is the share of that time it can
take away (``Knob.kernels`` times ``Knob.kernel_bound``; its phases' weight where it names no kinds): a cold walk
tries the knobs with the largest reach first, so that a GEMM-bound step tries FP8 before the micro-batch, whose
effects depend on it, and nothing tries checkpointing (recompute, no time taken away) before the knobs that can act.

The profile, each knob's weight and reach and the knobs held are the study attribute ``profile`` (tune.json's
``profile``, the report's Search section). A grid sampler and a study whose baseline recorded no phase timings
(phase timing off, a loop of one's own without them) are not led by a profile: every knob is drawn from the start;
a study whose base run recorded no device kernels (a CPU run, ``profile_steps: 0``) is ordered by the weights.

A warm-started study (``workbench.tune.opening``: its first trial is the best config of an earlier study of the same
model on the same hardware) that searches knobs the earlier study did not (``warm_start.new``) spends its startup
around what the earlier study found, instead of on the whole space again. Each startup trial is a neighbour of the
incumbent: the best feasible trial so far (the warm start's own trial until one finished), one of the new knobs
set to another of its choices, the first such config that no trial has asked for: each knob once from the
incumbent, one no trial changed yet before one tried around another config, in knob order (``_step``); the
incumbent moves as faster neighbours finish, so the startup walks the new knobs one at a time (coordinate
descent). Such a startup lasts at least one trial
more than the new knobs (``walk_startup``), so that each is changed once. Once every neighbour was asked, the
startup holds the warm start's values and draws the new knobs at random. A trial asked ahead (compile-ahead: during
the trial before it) is planned from the trials finished by then. Where the earlier study searched every knob of
this one, the warm start holds nothing. The profile's holds give way to these values.

A study started cold (no warm start's values; ``sampler.startup: walk``, the default) walks the same way from the
base config (:func:`cold_neighbour`): the study attr ``walk``, written after the baseline (:func:`walk_record`),
holds the knobs to walk (the searched knobs with a list of choices in :func:`walk_order`, those the profile holds
left out), their choices, the value each starts from (``defaults``: the base config's, for a key it leaves
unset what that runs with, ``Knob.unset``; or the first choice where the space lacks it), the base config as the
search asks it (``base``, with those defaults) and the baseline median (``value``). The incumbent is the fastest
feasible trial faster than that median, else ``base``, which counts as asked where it is the base config itself
(``measured``: the baseline measured it) and else is the walk's first trial. A step sets the knobs it makes active
(a condition now met) to their ``defaults``, and those the incumbent's lineage made active are walked first. Numeric
choices are tried nearest the incumbent's value first, the larger of two as near first. The startup lasts at least
as many trials as the base config has neighbours (each walked knob's choices but one, summed: ``walk_startup``), so
that each value can be tried once, before the sampler's model takes over. A random startup can pair every good value
with one that costs more than it gains; the walk's proposals depend on the measurements, not on the sampler's seed.
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
from workbench.tune.samplers import WrappedSampler, asked_config, infeasible
from workbench.tune.validation import is_feasible
from workbench.vocab import KERNEL_SHARE, PADDING_RATIO, PHASES

__all__ = ["HOT_SHARE", "ProfileLed", "cold_neighbour", "kernel_profile", "knob_reach", "knob_weights",
           "phase_shares", "profile_line", "profile_record", "walk_line", "walk_order", "walk_record",
           "walk_startup", "warm_held", "warm_neighbour", "warm_start_line", "warm_walk"]

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


def kernel_profile(summary: Mapping[str, Any] | None) -> dict[str, float] | None:
    """The base step's kernel profile from the summary of its profiled run: each kind's share of the span
    (``workbench.vocab.KERNEL_SHARE`` keys) and ``padding``, the padding tokens' part of the busy device time
    (``PADDING_RATIO`` of the rest). None where the run recorded no device kernels (a CPU run, no profile)."""
    summary = summary or {}
    shares = {k[len(KERNEL_SHARE):]: float(v) for k, v in summary.items()
              if k.startswith(KERNEL_SHARE) and isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not shares or sum(shares.values()) <= 0:
        return None
    padding = summary.get(PADDING_RATIO)
    padding = float(padding) if isinstance(padding, (int, float)) and not isinstance(padding, bool) else 0.0
    return {**shares, "padding": padding * (1.0 - shares.get("idle", 0.0))}


def knob_reach(knob: Knob, phase_weight: float, kernels: Mapping[str, float]) -> float:
    """The largest share of the base step ``knob`` can take away: its kernel kinds' share in the ``kernels``
    profile times its ``kernel_bound``; its ``phase_weight`` where it names no kinds (``Knob.kernels`` None)."""
    if knob.kernels is None:
        return phase_weight
    return knob.kernel_bound * sum(kernels.get(k, 0.0) for k in knob.kernels)


def profile_record(knobs: Sequence[Knob], shares: Mapping[str, float] | None, base: Mapping[str, Any],
                   contains: Callable[[str, Any], bool], startup_trials: int,
                   kernels: Mapping[str, float] | None = None) -> dict[str, Any] | None:
    """The study's ``profile``: the base step's ``phases`` (shares), each knob's ``weight``, and the knobs
    ``held`` at their base value (name -> value) during the first ``startup_trials`` trials; only a knob whose
    base value its space ``contains`` can be held. With the base step's ``kernels`` profile (``kernel_profile``)
    too, each knob's ``reach`` (``knob_reach``), by which the cold walk orders them (``walk_order``). None
    without phase timings."""
    if shares is None:
        return None
    weights = knob_weights(knobs, shares)
    held = {name: base[name] for name, w in weights
            if w < HOT_SHARE and name in base and base[name] is not None and contains(name, base[name])}
    by_name = {k.name: k for k in knobs}
    record: dict[str, Any] = {
        "phases": {p: round(s, 4) for p, s in shares.items()},
        "weights": [{"knob": n, "weight": round(w, 4),
                     **({"reach": round(knob_reach(by_name[n], w, kernels), 4)} if kernels else {})}
                    for n, w in weights],
        "held": held, "startup_trials": startup_trials, "hot_share": HOT_SHARE}
    if kernels:
        record["kernels"] = {k: round(v, 4) for k, v in kernels.items()}
    return record


def walk_order(record: Mapping[str, Any]) -> list[str]:
    """The knobs of a ``profile`` record in the order a cold walk tries them: the largest ``reach`` first where
    the record has a kernel profile, else the heaviest ``weight`` first; ties keep the weights' order."""
    weights = record.get("weights") or []
    return [w["knob"] for w in sorted(weights, key=lambda w: -w.get("reach", w["weight"]))]


def profile_line(record: Mapping[str, Any]) -> str:
    """One line: where the base step's time goes, and what the startup trials hold."""
    phases = sorted(record["phases"].items(), key=lambda ps: -ps[1])
    where = ", ".join(f"{p} {s:.0%}" for p, s in phases if s >= 0.005) or "no phase over 0.5%"
    kernels = sorted((record.get("kernels") or {}).items(), key=lambda ks: -ks[1])
    if kernels:
        where += "; device time: " + ", ".join(f"{k} {s:.0%}" for k, s in kernels if s >= 0.005)
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
        cold = bool(study.user_attrs.get("walk"))
        if not held and not cold:
            return {}
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) or infeasible(t) for t in trials)
        if done >= walk_startup(study, self.startup_trials):
            return {}
        if trial is not None:
            if trial.number not in self._neighbours:
                plan = cold_neighbour if cold else warm_neighbour
                self._neighbours[trial.number] = plan(study, trials, trial.number)
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
    """The trials the startup lasts: ``startup_trials``; for a partially warm-started study at least one more
    than its new knobs, and for a cold walk at least as many as the base config's neighbours (each walked knob's
    choices but one, summed), so that the walk can try each value once before the sampler's model takes over
    (hf-llama on one H200: 5 new knobs, 4 startup trials; the walk's third step would have been its last; the
    measured 18-config grid: 3 knobs, 5 neighbours, its best config the walk's fourth)."""
    warm = study.user_attrs.get("warm_start") or {}
    if warm.get("params"):
        return _walk_length(startup_trials, warm.get("new") or [])
    walk = study.user_attrs.get("walk") or {}
    return max(startup_trials, sum(len(c) - 1 for c in (walk.get("choices") or {}).values()))


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
    the incumbent's params with one new knob set to another of its choices, the first untried in choice order, in
    ``_step``'s order (coordinate descent); {} when none is left, the study is not partially warm-started, or it
    has more than one objective."""
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
    others = [t for t in trials if t.number != number]
    asked = [asked_config(t) for t in others]
    choices = {n: list(d.choices) for n, d in incumbent.distributions.items()
               if isinstance(d, CategoricalDistribution)}  # (a numeric range is not walked)
    return _step(incumbent.params, new, choices, asked,
                 lambda config: any(all(n in a and a[n] == v for n, v in config.items()) for a in asked),
                 origin=first.params if first is not None else None,
                 speeds=[_speed(t, sign) for t in others])


def cold_neighbour(study: Study, trials: Sequence[FrozenTrial], number: int) -> dict[str, Any]:
    """The config trial ``number`` of a study walking from its base config is planned to be (see the module
    docstring): the incumbent (the fastest feasible trial faster than the baseline median, else the base config)
    with one walked knob set to another of its choices, the first untried in :func:`_choice_order`, in
    ``_step``'s order (the largest reach first, an untried knob first on a tie), the knobs it makes active at their
    ``defaults``; first, where the base config has a value outside the space (``measured`` false), ``base`` itself,
    its nearest config there. {} when none is left, there is no walk, or the study has more than one objective."""
    walk = study.user_attrs.get("walk") or {}
    if not walk.get("knobs") or len(study.directions) != 1:
        return {}
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    ok = [t for t in trials if t.number != number and is_feasible(t) and sign * t.values[0] > sign * walk["value"]]
    incumbent = dict(max(ok, key=lambda t: sign * t.values[0]).params) if ok else dict(walk["base"])
    # the base config counts as asked where the baseline measured it (not where it is the space's nearest config)
    pairs = [(walk["base"] if walk.get("measured", True) else {}, sign * walk["value"]),
             *((asked_config(t), _speed(t, sign)) for t in trials if t.number != number)]
    pairs = [(a, v) for a, v in pairs if a]  # (a trial asked ahead but not yet sampled asks for nothing yet)
    asked = [a for a, _ in pairs]
    defaults = walk.get("defaults") or {}

    def covered(config: dict[str, Any]) -> bool:  # a trial asked for it: its params are the config's active knobs
        return any(all(n in config and config[n] == v for n, v in a.items()) for a in asked)

    start = {**defaults, **walk["base"]}
    if not walk.get("measured", True) and not covered(start):
        return start  # the base config has a value outside the space: its nearest config of the space first
    return _step(incumbent, walk["knobs"], walk["choices"], asked, covered, defaults, walk.get("reach"), start,
                 [v for _, v in pairs])


def _speed(t: FrozenTrial, sign: float) -> float | None:
    """Trial ``t``'s objective, sign-adjusted (larger is better), where it is feasible; else None."""
    return sign * t.values[0] if is_feasible(t) else None


def _step(incumbent: Mapping[str, Any], knobs: Sequence[str], choices: Mapping[str, Sequence[Any]],
          asked: Sequence[Mapping[str, Any]], covered: Callable[[dict[str, Any]], bool],
          defaults: Mapping[str, Any] | None = None, reach: Mapping[str, float] | None = None,
          origin: Mapping[str, Any] | None = None, speeds: Sequence[float | None] | None = None) -> dict[str, Any]:
    """The walk's next config: ``incumbent`` with one of ``knobs`` (one active there, with ``choices``) set to
    another choice, the other knobs at ``defaults``, then the incumbent's values; {} when none is left.

    First each knob not yet stepped from this incumbent (no config its steps from it would ask for is
    ``covered``; the knob the incumbent's own step changed steps only onward, :func:`_onward`) takes its first
    choice in :func:`_choice_order`, a value other than its ``origin`` one before that one: the knobs the
    incumbent's lineage made active and never compared beside each other first (:func:`_opened`: FP8's casts and
    head once FP8 won; the walk could not step them before), then the largest ``reach`` first (the profile's: the
    share of the base step a knob can take away, where its next step leaves the ``origin`` value the profile
    measured (compile back to eager has none); or the larger share a step of it toward another value took away,
    :func:`_gains`; ``speeds`` holds each asked config's objective, sign-adjusted, None where it has none
    feasible; without a profile every knob's reach is the same), on a tie a knob no config asked has changed from
    ``origin`` (the walk's start) before one that was, then in ``knobs``' order. So a new incumbent tries untried
    knobs before it tries again, around itself, what was tried around another config, unless that knob can reach
    more of the step: what lost beside the base may win beside the new incumbent (a micro-batch that lost in
    bf16, under FP8). The steps planned ahead (compile-ahead) while a trial before them runs are asked too, so
    they go on to the next knob. Then the knobs' other choices, in ``knobs``' order."""
    lineage = _lineage(incumbent, knobs, asked, speeds)
    opened = _opened(lineage, incumbent, knobs, asked)
    parent = asked[lineage[-2]] if len(lineage) > 1 else {}
    back = {n: parent[n] for n in _differ(incumbent, parent)}  # (the knob the incumbent's own step changed)
    start = origin or {}
    tried = {n for a in asked for n in knobs if n in a and n in start and a[n] != start[n]}
    steps = {name: [{**(defaults or {}), **incumbent, name: choice}
                    for choice in _choice_order(choices[name], incumbent[name])]
             for name in knobs if name in incumbent and name in choices}  # (not inactive, a list of choices)
    ahead = {name: sorted((c for c in configs if name not in back or _onward(back[name], incumbent[name], c[name])),
                          key=lambda c, n=name: n in start and c[n] == start[n])  # (off the start value first)
             for name, configs in steps.items()}
    gains = _gains(knobs, asked, speeds) if reach else {}  # (without a profile every reach is the same)
    gained = {n: max([g for v, g in by_value if not (n in incumbent and v == incumbent[n])], default=0.0)
              for n, by_value in gains.items()}

    def reach_of(name: str) -> float:  # the profile's bound holds for a step away from the walk's start value
        bound = (reach or {}).get(name, 0.0)
        nxt = next((c[name] for c in ahead.get(name, []) if not covered(c)), None)
        return max(bound if nxt is not None and not (name in start and nxt == start[name]) else 0.0,
                   gained.get(name, 0.0))

    ranked = sorted(knobs, key=lambda n: (n not in opened, -reach_of(n), n in tried, knobs.index(n)))
    for name in ranked:  # one step of each knob from this incumbent first
        configs = ahead.get(name, [])
        if configs and not any(covered(c) for c in configs):
            return configs[0]
    return next((c for name in knobs if name in steps for c in steps[name] if not covered(c)), {})


def _onward(was: Any, now: Any, to: Any) -> bool:
    """Whether a step of a knob from ``now`` to ``to`` goes on from the step that brought it from ``was``: a number
    further the same way (a micro-batch that won at 32 from 16 tries 64, not 8), another value anything but
    ``was``. Going back, or past the start the other way, is no step of the incumbent's own."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (was, now, to))
    return (to - now) * (now - was) > 0 if numeric else to != was


def _differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The knobs both configs set, to different values."""
    return [n for n in a if n in b and a[n] != b[n]]


def _gains(knobs: Sequence[str], asked: Sequence[Mapping[str, Any]],
           speeds: Sequence[float | None] | None) -> dict[str, list[tuple[Any, float]]]:
    """Each knob's measured gains, as (the value that gained, the share of the step it took away): over the pairs
    of configs ``asked`` that differ in that knob alone, both with a feasible objective (``speeds``,
    sign-adjusted), the faster one's value and the relative gain r as r / (1 + r) (1 - slow / fast for a
    throughput). Where the profile gives a reach, a knob's in ``_step`` is the larger of the profile's bound and
    its gains toward a value the incumbent does not hold: a knob that sped up one config (the project's casts
    under FP8, whose kernels a bf16 step lacks) is tried early around the next that lacks that value."""
    if speeds is None:
        return {}
    gains: dict[str, list[tuple[Any, float]]] = {}
    for i, x in enumerate(asked):
        for j in range(i):
            d = _differ(x, asked[j])
            if len(d) != 1 or d[0] not in knobs or speeds[i] is None or speeds[j] is None or speeds[i] == speeds[j]:
                continue
            fast, slow = (i, j) if speeds[i] > speeds[j] else (j, i)
            if speeds[slow] != 0:
                r = (speeds[fast] - speeds[slow]) / abs(speeds[slow])
                gains.setdefault(d[0], []).append((asked[fast][d[0]], r / (1.0 + r)))
    return gains


def _lineage(incumbent: Mapping[str, Any], knobs: Sequence[str], asked: Sequence[Mapping[str, Any]],
             speeds: Sequence[float | None] | None) -> list[int]:
    """The indexes in ``asked`` of the incumbent's lineage, the oldest first, the incumbent's config last: each
    config's parent is the config asked before it that differs from it in one walked knob, the fastest of those
    (``speeds``: each asked config's objective, sign-adjusted, None where it has no feasible one; a step is taken
    from the incumbent of its time). [] where no config asked is the incumbent's."""
    measured = list(speeds) if speeds is not None else [None] * len(asked)
    index = next((i for i, a in enumerate(asked) if a == incumbent), None)
    lineage: list[int] = []
    while index is not None:
        lineage.append(index)
        near = [j for j in range(index) if len(d := _differ(asked[index], asked[j])) == 1 and d[0] in knobs]
        index = max(near, key=lambda j: (measured[j] is not None, measured[j] or 0.0, -j)) if near else None
    return lineage[::-1]


def _opened(lineage: Sequence[int], incumbent: Mapping[str, Any], knobs: Sequence[str],
            asked: Sequence[Mapping[str, Any]]) -> list[str]:
    """The knobs the incumbent's ``lineage`` (:func:`_lineage`) made active and never stepped beside each other
    (``_step``'s first). The knobs a link made active (the child holds them, the parent did not: FP8's casts and
    head once FP8 won) act together: one stays open until two configs asked differ in it alone while the others
    of that link hold the incumbent's values. So the head, tried beside torchao's casts, is open again once the
    project's casts won; the casts, compared beside the head once, are not when the head won."""
    opened: list[str] = []
    for parent, child in zip(lineage, lineage[1:]):  # the oldest link first
        group = [n for n in knobs if n in asked[child] and n not in asked[parent]]
        for name in group:
            others = [n for n in group if n != name]
            compared = any(_differ(x, y) == [name] and all(x.get(o) == y.get(o) == incumbent.get(o) for o in others)
                           for i, x in enumerate(asked) for y in asked[:i])
            if name not in opened and not compared:
                opened.append(name)
    return opened


def _choice_order(choices: Sequence[Any], current: Any) -> list[Any]:
    """``choices`` other than ``current``: numbers (not booleans) nearest ``current`` first, the larger of two as
    near first (a micro-batch 8 tries 16 before 4); other values in the space's order."""
    others = [c for c in choices if not (c == current and type(c) is type(current))]
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in [*choices, current])
    if not numeric:
        return others
    ranked = sorted({*choices, current})
    at = ranked.index(current)
    return sorted(others, key=lambda c: (abs(ranked.index(c) - at), -c))


def warm_walk(trials: Sequence[FrozenTrial], new: Sequence[str],
              origin: Mapping[str, Any] | None = None, origin_value: float | None = None) -> list[dict[str, Any]]:
    """The steps the startup of a partially warm-started study took, read from its trials: each trial after the warm
    start's own that differs in exactly one of the ``new`` knobs from an earlier trial, as {trial, knob, from, to,
    of (that earlier trial; the fastest feasible one where several qualify), value (its objective, None where
    it has none), status}. A trial drawn at random (more than one knob changed) is not a step. With ``origin``
    (a cold walk's base config, measured at ``origin_value``), every trial may step from it (``of``: "base") or
    from an earlier trial, and knobs active on one side only (the ones a step makes active) are not compared."""
    done = sorted((t for t in trials if t.params), key=lambda t: t.number)
    start = -1 if origin is not None else next((t.number for t in done if "warm_start" in t.user_attrs), None)
    if start is None:
        return []

    def differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
        if origin is not None:
            return _differ(a, b)
        return [n for n in {*a, *b} if a.get(n) != b.get(n)]

    steps = []
    for t in done:
        if t.number <= start:
            continue
        near: list[tuple[Any, str, bool, float]] = []  # (of, knob, feasible, value)
        if origin is not None and len(d := differ(origin, t.params)) == 1 and d[0] in new:
            near.append(("base", d[0], True, origin_value or 0.0))
        for e in done:
            if e.number >= t.number:
                break
            d = differ(e.params, t.params)
            if len(d) == 1 and d[0] in new:
                near.append((e.number, d[0], is_feasible(e), e.values[0] if is_feasible(e) else 0.0))
        if not near:
            continue
        of, knob, _, _ = max(near, key=lambda p: (p[2], p[3]))
        was = origin if of == "base" else next(e for e in done if e.number == of).params
        steps.append({"trial": t.number, "knob": knob, "from": was.get(knob), "to": t.params.get(knob),
                      "of": of, "value": t.values[0] if t.values else t.intermediate_values.get(
                          max(t.intermediate_values)) if t.intermediate_values else None,
                      "status": t.user_attrs.get("status", t.state.name.lower())})
    return steps


def walk_record(knobs: Sequence[str], choices: Mapping[str, Sequence[Any]], defaults: Mapping[str, Any],
                base: Mapping[str, Any], value: float, measured: bool = True,
                reach: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The study attr ``walk`` of a cold walk (see the module docstring); ``measured``: ``base`` is the base
    config itself (every value of it is in the space), which the baseline measured; ``reach``: each knob's, where
    the profile has a kernel profile (``profile_record``), else None."""
    return {"knobs": list(knobs), "choices": {k: list(choices[k]) for k in knobs}, "defaults": dict(defaults),
            "base": dict(base), "value": value, "measured": measured,
            "reach": {k: reach[k] for k in knobs if k in reach} if reach else None}


def walk_line(record: Mapping[str, Any], startup_trials: int | None = None) -> str:
    """One line: what the cold walk tried, step by step (``steps``: :func:`warm_walk`'s, where the record holds
    them), or what it was to do."""
    knobs = record.get("knobs") or []
    steps = record.get("steps")
    if not steps:
        n = max(startup_trials or 0, sum(len(c) - 1 for c in (record.get("choices") or {}).values()))
        base = record.get("base") or {}
        later = [k for k in knobs if base and k not in base]  # inactive in the base: a step must open them first
        line = (f"the first {n} trial(s) were to change one knob at a time from the best config so far, starting "
                f"from the base config: {', '.join(k for k in knobs if k not in later)}")
        if later:
            line += f"; then, where the best config so far makes them act, {', '.join(later)}"
        return line
    told = []
    for w in steps:
        speed = f"{w['value']:,.0f}" if isinstance(w.get("value"), (int, float)) else w.get("status", "")
        of = "the base" if w["of"] == "base" else f"trial {w['of']}"
        told.append(f"trial {w['trial']}: {w['knob']} {w['from']} -> {w['to']} from {of} ({speed})")
    return f"the startup changed one knob at a time from the best config so far, starting from the base: " \
           f"{'; '.join(told)}"


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
