"""A/B validation of the best search trials against the baseline: the ``top_k`` best distinct feasible trials,
re-measured interleaved with the base config (A/B/A/B), each pair's ratio, and the winner whose interval lies
above 1.0 (``runs/<study>/validation.json``). The A/B is sequential: from ``protocol.ab_min_rounds`` pairs on, a
candidate stops once its interval excludes 1.0, at most ``ab_rounds`` pairs; the interval's confidence is
Bonferroni-corrected over those looks, so the study's chance of a false winner stays at most 5%.

On a GPU study of the built-in loop the winner is then measured beside the plain ``torch.compile`` loop of the
same model and data (``validation.json``'s ``reference``), by the same interleaved A/B: the ratio a user compares
against, where the study's own ratio is against its base config."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from workbench.config import Config, ConfigError, config_hash, merge_overrides
from workbench.tune.export import write_json
from workbench.tune.session import StudySession
from workbench.tune.storage import mask_url
from workbench.tune.stats import noise_floor, pair_ratios, sequential_confidence, speedup_interval
from workbench.tune.trial import TrialOutcome

__all__ = ["Duel", "PLAIN_LOOP", "Runs", "ab_pairs", "against_plain", "baseline_median", "candidates", "duel",
           "interval_fields",
           "is_feasible", "now_iso", "overlap", "pick_winner", "plain_loop_config", "plain_loop_skipped", "validate"]

PLAIN_LOOP = {"loongforge.compute_domain.compile": "default", "loongforge.compute_domain.graph_capture": "none"}
"""What turns a study's base config into the plain compiled loop: ``torch.compile`` in its default mode, no CUDA
graphs of ours; the model, data, batch and every other setting stay the base's."""


def plain_loop_config(base: Config) -> Config:
    return merge_overrides(base, PLAIN_LOOP)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def is_feasible(t: FrozenTrial) -> bool:
    return (t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
            and all(v <= 0 for v in t.constraints.values()))


class Runs(Protocol):
    """What validation measures with (``workbench.tune.measure.Measurer``): a run of a config into a folder, and the
    coordinator's lease check before each pair."""

    def measure(self, cfg: Any, run_dir: Path, prefix: str, phase: str,
                then: tuple[Any, Path] | None = None) -> TrialOutcome: ...

    def check_lease(self) -> None: ...

    def keep_traces(self, winner: Mapping[str, Any] | None) -> dict[str, Any] | None: ...


def baseline_median(session: StudySession) -> float:
    """The baseline repeats' median throughput (0 before any): a search trial is a candidate only above it."""
    base = session.baseline_runs()
    return statistics.median(base) if base else 0.0


def candidates(session: StudySession) -> tuple[list[FrozenTrial], list[dict[str, Any]]]:
    """Top-k distinct feasible trials (by search throughput) to validate, and those skipped with why."""
    spec = session.spec
    base_hash = config_hash(spec.export_config({}))
    base_median = baseline_median(session)
    pool = session.trials((TrialState.COMPLETE,))
    if spec.objective.multi_objective:
        front = {t.number for t in session.study.best_trials}  # the feasible Pareto front
        pool = [t for t in pool if t.number in front]
    # by throughput (objective 0); in multi-objective studies, among the Pareto front
    ok = sorted((t for t in pool if is_feasible(t)), key=lambda t: (-t.values[0], t.number))
    out: list[FrozenTrial] = []
    skipped: list[dict[str, Any]] = []
    seen = {base_hash}
    for t in ok:
        if len(out) >= spec.protocol.top_k:
            break
        try:
            h = config_hash(spec.export_config(t.params))
        except ConfigError:
            continue
        if h == base_hash:
            skipped.append({"trial": t.number, "reason": "same config as the baseline"})
            continue
        if h in seen:
            continue  # same params as a better-ranked trial
        seen.add(h)
        if t.values[0] <= base_median:
            skipped.append({"trial": t.number, "reason": f"search throughput {t.values[0]:,.0f} not above the "
                            f"baseline median {base_median:,.0f}"})
            continue
        out.append(t)
    return out, skipped

def _pair_key(vdir: Path, arm: int, r: int) -> str:
    """The study attr ``ab_pairs``' key of arm ``arm``'s pair of round ``r`` under ``vdir``."""
    return f"{vdir.name}/{arm}-{r}"


def ab_pairs(session: StudySession, measurer: Runs, base_cfg: Any, arms: Mapping[int, Any], vdir: Path, *,
             max_pairs: int, min_pairs: int, confidence: float, what: str, resume: bool = False,
             phase: str = "validation", profile: Mapping[str, Any] | None = None, base_traced: bool = False,
             more: Callable[[], bool] | None = None) -> dict[int, dict[str, Any]]:
    """Interleaved A/B pairs of each arm's config against ``base_cfg``: per round, for each arm still open, a
    baseline run then the arm's run (``vdir/baseline-<arm>-<round>/``, ``vdir/trial-<arm>-<round>/``). From
    ``min_pairs`` pairs on, an arm stops at the first pair after which its ``confidence`` interval excludes
    1.0; the rest stop at ``max_pairs``, or where ``more()`` says no pair past ``min_pairs`` fits (the GPU-minute
    budget). Returns per arm: runs, baseline_runs, run_dirs, baseline_dirs, failures and ``stopped`` ("interval
    excludes 1.0", "cap" or "budget").

    Each finished pair is stored in the study (user attr ``ab_pairs``, keyed by folder and round, with both
    configs' hashes). With ``resume`` a stored pair of the same configs whose folders are still in place is
    taken as measured, so a validation stopped part-way goes on from its next pair; ``verify`` never
    resumes (it exists to measure again). The runs' device seconds count to ``phase`` (verify's to none: it
    runs after the study).

    With ``profile`` (``Protocol.profile_after_overrides``: steps profiled after the measurement, which leave
    its figures as they are) both runs of each arm's first pair to complete run with those keys, so the pair's
    folders hold a trace of the base config and of the arm (``Measurer.keep_traces`` keeps the winner's). The
    first pair, not the last: under the sequential A/B the last one is known only once it ran. A profiled pair
    that fails leaves its arm unprofiled from then on (its failure records ``profiled``). With ``base_traced``
    (the last baseline repeat holds the base config's trace, ``StudySession.base_trace_dir``) the pair's baseline
    run is not profiled again: its trace would be that one's. A stored pair is taken with or without them on
    either run (they change no measured figure); one whose arm ran without them (a study stopped by an older
    version) leaves the profile to the arm's next pair."""
    results = {k: {"runs": [], "baseline_runs": [], "run_dirs": [], "baseline_dirs": [], "failures": [],
                   "stopped": "cap"} for k in arms}
    settled: set[int] = set()
    # arms whose later pairs run plain: a profiled pair of theirs completed (its trace is kept), or failed (a trace,
    # the profiler beside a custom autograd Function say, never costs a candidate its validation)
    unprofiled: set[int] = set()
    study = session.study

    def configs(base: Any, cfg: Any) -> tuple[tuple[Any, Any], list[str]]:
        return (base, cfg), [config_hash(base), config_hash(cfg)]

    # each arm's pair of configs with their hashes, plain and with the keys that profile after the measurement
    plain = {k: configs(base_cfg, cfg) for k, cfg in arms.items()}
    profiled_base = base_cfg if base_traced or not profile else merge_overrides(base_cfg, profile)
    profiled = ({k: configs(profiled_base, merge_overrides(cfg, profile)) for k, cfg in arms.items()}
                if profile else plain)
    base_hashes = {config_hash(base_cfg), config_hash(merge_overrides(base_cfg, profile)) if profile else None}
    order = list(arms)

    def next_baseline(k: int, r: int) -> tuple[Any, Path] | None:
        """The run expected after arm ``k``'s pair of round ``r`` (its process starts beside that pair's second
        run): the next open arm's baseline run, this round's or the next's, plain or profiled as it will be. Arm
        ``k`` itself may settle on this pair; then the guess is wrong and its held process is stopped."""
        i = order.index(k)
        for r2, k2 in [(r, a) for a in order[i + 1:]] + [(r + 1, a) for a in order[:i + 1]]:
            if r2 < max_pairs and (k2 == k or k2 not in settled):
                cfgs = plain[k2] if (k2 in unprofiled or k2 == k) else profiled[k2]
                return cfgs[0][0], vdir / f"baseline-{k2}-{r2}"
        return None

    for r in range(max_pairs):
        for k in arms:
            res = results[k]
            if k in settled:
                continue
            measurer.check_lease()
            profiling = bool(profile) and k not in unprofiled
            run_cfgs, hashes = profiled[k] if profiling else plain[k]
            key = _pair_key(vdir, k, r)
            dirs = (vdir / f"baseline-{k}-{r}", vdir / f"trial-{k}-{r}")
            stored = study.user_attrs.get("ab_pairs", {}).get(key) if resume else None
            # a pair of the same configs, with or without the keys that profile after the measurement
            fresh = not (stored and stored["hashes"][0] in base_hashes and stored["hashes"][1] in (
                plain[k][1][1], profiled[k][1][1]) and all(d.is_dir() for d in dirs))
            if fresh and more is not None and len(res["runs"]) >= min_pairs and not more():
                settled.add(k)
                res["stopped"] = "budget"
                session.log(f"{what} #{k}: the GPU-minute budget holds no pair past {len(res['runs'])}; its A/B stops")
                continue
            if not fresh:
                session.log(f"{what} #{k}: pair {len(res['runs']) + 1} taken from the study (measured "
                            f"{stored['finished']})")
                a_value, b_value = stored["values"]
                if profile and stored["hashes"][1] == profiled[k][1][1]:
                    unprofiled.add(k)
            else:
                prefix = f"{what} #{k}: pair {len(res['runs']) + 1} (at most {max_pairs})"
                a = measurer.measure(run_cfgs[0], dirs[0], prefix + ", baseline", phase, then=(run_cfgs[1], dirs[1]))
                b = measurer.measure(run_cfgs[1], dirs[1], prefix + ", candidate", phase, then=next_baseline(k, r))
                if not (a.status == "ok" and b.status == "ok" and a.value and b.value):
                    res["failures"].append({"round": r, "baseline": a.status, "candidate": b.status,
                                            "reason": a.failure_reason or b.failure_reason,
                                            "profiled": profiling})
                    if profiling:
                        unprofiled.add(k)
                    continue
                a_value, b_value = a.value, b.value
                if profile:
                    unprofiled.add(k)  # (this pair was profiled unless an earlier one was)
                pairs = dict(study.user_attrs.get("ab_pairs", {}))
                pairs[key] = {"hashes": hashes, "values": [a_value, b_value], "finished": now_iso()}
                study.set_user_attr("ab_pairs", pairs)
            res["runs"].append(b_value)
            res["baseline_runs"].append(a_value)
            res["run_dirs"].append(str(dirs[1]))
            res["baseline_dirs"].append(str(dirs[0]))
            if len(res["runs"]) >= max(2, min_pairs):
                iv = speedup_interval(pair_ratios(res["runs"], res["baseline_runs"]), confidence)
                if (iv.low > 1.0 or iv.high < 1.0) and len(res["runs"]) < max_pairs:
                    settled.add(k)
                    res["stopped"] = "interval excludes 1.0"
                    session.log(f"{what} #{k}: interval [{iv.low:.3f}, {iv.high:.3f}] excludes 1.0 after "
                                f"{len(res['runs'])} pairs; its A/B stops")
    return results


def duel(session: StudySession, measurer: Runs, a: Mapping[str, Any], b: Mapping[str, Any], *, max_pairs: int,
         min_pairs: int, confidence: float) -> dict[str, Any]:
    """Candidate ``b`` against candidate ``a``, interleaved (a's config in the baseline's place), by the
    validation's sequential protocol (``validation/duel-<a>-<b>/``, resumable like the A/B): the fields of
    ``interval_fields`` with ``pairs``, ``runs``, ``baseline_runs`` (a's) and ``failures``."""
    spec = session.spec
    session.log(f"#{a['trial']} and #{b['trial']} are both significant and their intervals overlap: measuring "
                f"them against each other, {min_pairs} to {max_pairs} A/B pairs")
    res = ab_pairs(session, measurer, spec.trial_config(a["params"]), {b["trial"]: spec.trial_config(b["params"])},
                   session.study_dir / "validation" / f"duel-{a['trial']}-{b['trial']}", max_pairs=max_pairs,
                   min_pairs=min_pairs, confidence=confidence, what=f"head-to-head with #{a['trial']}",
                   resume=True)[b["trial"]]
    fields = interval_fields(res["runs"], res["baseline_runs"], confidence)
    return {**fields, "pairs": len(fields["ratios"]), "runs": res["runs"], "baseline_runs": res["baseline_runs"],
            "failures": res["failures"], "stopped": res["stopped"]}


def validate(session: StudySession, measurer: Runs,
             pairs_left: Callable[[], int | None] | None = None) -> dict[str, Any]:
    """Sequential interleaved A/B re-measurement of the candidates; writes and returns validation.json.
    ``pairs_left``: the A/B pairs the GPU-minute budget still holds (``GpuBudget.pairs_left``; None without
    one). The budget reserves each candidate's ``ab_min_rounds`` pairs and the leader's on to ``ab_rounds``
    (``budget.reserved_seconds``); another pair past them runs only where it holds one more, and the pairs beside
    the plain compiled loop (``against_plain``) are bounded by what it holds after.

    validation.json: {baseline_runs (the baseline repeats), noise_floor, method, confidence (per look),
    overall_confidence, looks, ab_rounds (most pairs), ab_min_rounds, candidates: [{trial, params,
    search_value, runs, baseline_runs, ratios, run_dirs, baseline_dirs, failures, stopped, numerics,
    speedup_median, ci_low, ci_high, significant}], skipped, winner: {trial or null, significant,
    speedup_median, ci_low, ci_high, decided_by, duels: [{a, b, ratios (b over a), speedup_median, ci_low,
    ci_high, pairs, runs, baseline_runs (a's), failures, stopped, faster, told_apart}]}, traces
    (``Measurer.keep_traces``), complete, finished}.
    """
    spec = session.spec
    cands, skipped = candidates(session)
    path = session.study_dir / "validation.json"
    rounds = spec.protocol.ab_rounds
    min_rounds = spec.protocol.ab_min_rounds or rounds
    confidence, looks = sequential_confidence(min_rounds, rounds)
    with contextlib.suppress(OSError, json.JSONDecodeError):
        old = json.loads(path.read_text())
        if (old.get("complete") and [c["trial"] for c in old.get("candidates", [])] == [t.number for t in cands]
                and old.get("ab_rounds") == rounds and old.get("ab_min_rounds") == min_rounds
                and old.get("storage_url") == mask_url(session.storage_url)):
            session.log("validation: reusing validation.json (same candidates)")
            return old
    if cands:
        session.log(f"validating {len(cands)} candidate(s) against the baseline, {min_rounds} to {rounds} A/B "
                    f"pairs each: " + ", ".join(f"#{t.number}" for t in cands))
    pairs = ab_pairs(session, measurer, spec.measured_base_config(),
                     {t.number: spec.trial_config(t.params) for t in cands}, session.study_dir / "validation",
                     max_pairs=rounds, min_pairs=min_rounds, confidence=confidence, what="validating", resume=True,
                     profile=spec.protocol.profile_after_overrides(),
                     base_traced=session.base_trace_dir() is not None,
                     more=None if pairs_left is None else lambda: _holds_a_pair(pairs_left))
    validated = []
    for t in cands:
        res = {"trial": t.number, "params": dict(t.params), "search_value": t.values[0], **pairs[t.number],
               "numerics": t.user_attrs.get("numerics")}
        res.update(interval_fields(res["runs"], res["baseline_runs"], confidence))
        validated.append(res)
        ci = (f"[{res['ci_low']:.3f}, {res['ci_high']:.3f}]" if res["ci_low"] is not None
              and res["ci_high"] is not None else "[n/a]")
        sp = f"{res['speedup_median']:.3f}x" if res["speedup_median"] is not None else "n/a"
        session.log(f"candidate #{t.number}: speedup {sp}, interval {ci} over {len(res['ratios'])} pairs"
                    + (" (significant)" if res["significant"] else " (not significant)"))
    winner = pick_winner(validated, lambda a, b: duel(session, measurer, a, b, max_pairs=rounds, min_pairs=min_rounds,
                                                      confidence=confidence))
    if winner["duels"]:
        session.log(f"winner #{winner['trial']}: {winner['decided_by']}")
    best = next((c for c in validated if c["trial"] == winner["trial"]), None)
    reference = against_plain(session, measurer, best, max_pairs=rounds, min_pairs=min_rounds, confidence=confidence,
                              pairs_left=pairs_left)
    traces = measurer.keep_traces(best)
    base = session.baseline_runs()
    data = {
        "study_name": session.study_name, "storage_url": mask_url(session.storage_url), "baseline_runs": base,
        "noise_floor": noise_floor(base).to_dict() if base else None, "method": "t-interval on log ratios",
        "confidence": confidence, "overall_confidence": 0.95, "looks": looks, "ab_rounds": rounds,
        "ab_min_rounds": min_rounds, "candidates": validated, "skipped": skipped,
        "winner": winner, "reference": reference, "traces": traces, "complete": True, "finished": now_iso(),
    }
    write_json(path, data)
    return data


def _holds_a_pair(pairs_left: Callable[[], int | None]) -> bool:
    left = pairs_left()
    return left is None or left >= 1


def plain_loop_skipped(session: StudySession) -> str | None:
    """Why the winner is not measured beside the plain compiled loop on this study; None where it is."""
    if not session.reference:
        return "off (--no-reference)"
    if session.spec.trainer is not None:
        return "a loop of one's own: its base config is the reference"
    if "cuda" not in session.hardware.get("capabilities", ()):
        return "not a GPU study: torch.compile's speed on a CPU says nothing of a GPU's"
    return None


def against_plain(session: StudySession, measurer: Runs, best: Mapping[str, Any] | None, *, max_pairs: int,
                  min_pairs: int, confidence: float,
                  pairs_left: Callable[[], int | None] | None = None) -> dict[str, Any]:
    """validation.json's ``reference``: the winner beside the plain compiled loop (``plain_loop_config`` of
    the measured base), interleaved A/B pairs as the validation's (``validation/reference/``, resumable). Where
    the base already is the plain loop, the validation's own ratio is the answer and nothing runs again.
    The budget reserves no device time for these pairs (``budget.reserved_seconds``): they run on what it has
    left, ``pairs_left()`` more pairs than those stored (None: no GPU-minute budget), and not at all where that
    is fewer than ``min_pairs``. Always a record: ``ran`` False with the ``reason`` where it does not apply (no
    winner, a CPU study, a loop of one's own, ``--no-reference``, a budget spent)."""
    spec = session.spec
    what = "the plain compiled loop (torch.compile, default mode, no CUDA graphs)"
    if best is None:
        return {"reference": what, "ran": False, "reason": "no winner: the base config is exported"}
    reason = plain_loop_skipped(session)
    if reason is not None:
        return {"reference": what, "ran": False, "reason": reason}
    base = spec.measured_base_config()
    plain = plain_loop_config(base)
    if config_hash(plain) == config_hash(base):
        fields = {k: best[k] for k in ("ratios", "speedup_median", "ci_low", "ci_high", "significant")}
        return {"reference": what, "ran": True, "same_as_base": True, "trial": best["trial"], **fields,
                "pairs": len(best["ratios"]), "runs": best["runs"], "baseline_runs": best["baseline_runs"]}
    vdir = session.study_dir / "validation" / "reference"
    fit = pairs_left() if pairs_left is not None else None
    if fit is not None:
        done = session.study.user_attrs.get("ab_pairs", {})
        stored = sum(_pair_key(vdir, best["trial"], r) in done for r in range(max_pairs))
        if stored + fit < min_pairs:
            reason = (f"the GPU-minute budget has room for {fit} more A/B pair(s), {min_pairs} are needed "
                      "(protocol.ab_min_rounds; budget.gpu_minutes makes room)")
            session.log(f"the winner #{best['trial']} is not measured beside {what}: {reason}")
            return {"reference": what, "ran": False, "reason": reason}
        max_pairs = min(max_pairs, stored + fit)
    session.log(f"the winner #{best['trial']} beside {what}: {min_pairs} to {max_pairs} A/B pairs")
    res = ab_pairs(session, measurer, plain, {best["trial"]: spec.trial_config(best["params"])},
                   vdir, max_pairs=max_pairs, min_pairs=min_pairs,
                   confidence=confidence, what="against the plain loop", resume=True)[best["trial"]]
    fields = interval_fields(res["runs"], res["baseline_runs"], confidence)
    if fields["speedup_median"] is not None:
        ci = (f"[{fields['ci_low']:.3f}, {fields['ci_high']:.3f}]" if fields["ci_low"] is not None
              and fields["ci_high"] is not None else "[n/a]")
        session.log(f"against the plain compiled loop: {fields['speedup_median']:.3f}x {ci} over "
                    f"{len(fields['ratios'])} pairs")
    return {"reference": what, "ran": True, "same_as_base": False, "trial": best["trial"], **fields,
            "pairs": len(fields["ratios"]), "runs": res["runs"], "baseline_runs": res["baseline_runs"],
            "failures": res["failures"], "stopped": res["stopped"]}


def overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two validated candidates' speedup intervals share a point."""
    return a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]


Duel = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
"""Measures ``b`` against ``a`` (a's config is the A/B's base): ``interval_fields`` of b's runs over a's, with
``pairs``; ``validation.duel`` runs it, tests pass their own."""


def pick_winner(candidates: list[dict[str, Any]], duel: Duel | None = None) -> dict[str, Any]:
    """validation.json's ``winner``: the faster of the significant candidates, not only the surer.

    Each candidate's ratios come from its own pairs against the baseline, so neither its median nor its low end
    ranks two candidates whose intervals overlap (on 2 busy cores a runner-up's median out-ran the faster
    config's, and a tighter interval once exported the slower config). The rule: the significant candidates in
    order of median speedup; the first is the leader, and each next one takes its place when its interval lies
    wholly above the leader's, or, where the two overlap, when ``duel`` (an interleaved A/B of the two) finds it
    faster: its interval above 1.0, or, when the two cannot be told apart within the cap, its median above 1.0
    (``decided_by`` says so). Without ``duel`` overlapping candidates keep the leader. ``duels`` lists each."""
    sig = sorted((c for c in candidates if c["significant"]), key=lambda c: (-c["speedup_median"], c["trial"]))
    if not sig:
        return {"trial": None, "significant": False, "speedup_median": None, "ci_low": None, "ci_high": None,
                "decided_by": "no significant candidate", "duels": []}
    lead, duels = sig[0], []
    decided_by = "the only significant candidate" if len(sig) == 1 else "its interval lies above the others'"
    for c in sig[1:]:
        if not overlap(lead, c):
            if c["ci_low"] > lead["ci_high"]:
                lead = c
            continue
        if duel is None:
            decided_by = "the higher median speedup (no head-to-head measured)"
            continue
        d = {"a": lead["trial"], "b": c["trial"], **duel(lead, c)}
        med, lo, hi = d.get("speedup_median"), d.get("ci_low"), d.get("ci_high")
        told_apart = med is not None and lo is not None and hi is not None and (lo > 1.0 or hi < 1.0)
        b_wins = med is not None and (lo > 1.0 if told_apart else med > 1.0)
        d["faster"], d["told_apart"] = (c if b_wins else lead)["trial"], told_apart
        duels.append(d)
        lead = c if b_wins else lead
        if med is None:
            decided_by = f"no head-to-head pair of #{d['a']} and #{d['b']} completed; the higher median speedup"
        elif told_apart:
            decided_by = (f"faster than #{d['a'] if b_wins else d['b']} head-to-head: #{d['b']} at {med:.3f}x "
                          f"[{lo:.3f}, {hi:.3f}] of #{d['a']} over {d['pairs']} interleaved pairs")
        else:
            ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
            decided_by = (f"#{d['a']} and #{d['b']} could not be told apart within {d['pairs']} interleaved pairs "
                          f"(#{d['b']} at {med:.3f}x {ci} of #{d['a']}); the faster median is exported")
    return {"trial": lead["trial"], "significant": True, "speedup_median": lead["speedup_median"],
            "ci_low": lead["ci_low"], "ci_high": lead["ci_high"], "decided_by": decided_by, "duels": duels}


def interval_fields(runs: list[float], baseline_runs: list[float], confidence: float) -> dict[str, Any]:
    """ratios, speedup_median, ci_low, ci_high and significant of paired runs (None and False without a pair)."""
    if not runs:
        return {"ratios": [], "speedup_median": None, "ci_low": None, "ci_high": None, "significant": False}
    ratios = pair_ratios(runs, baseline_runs)
    iv = speedup_interval(ratios, confidence)
    return {"ratios": ratios, "speedup_median": iv.median, "ci_low": _finite_or_none(iv.low),
            "ci_high": _finite_or_none(iv.high), "significant": iv.significant}
