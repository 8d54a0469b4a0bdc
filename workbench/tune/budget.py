"""A study's device time: what each phase spent (the coordinator's phases in the study attr ``gpu_s``, a search
trial's in its own attributes), tune.json's ``gpu_minutes`` record, and the GPU-minute budget the search stops at
(what was spent, the reserve of the runs after the search, and the next trial)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from workbench.config import config_hash
from workbench.tune.ahead import BEING_COMPILED, COMPILED, NOTHING_TO_COMPILE
from workbench.tune.session import StudySession
from workbench.tune.validation import baseline_median, plain_loop_config, plain_loop_skipped
from workbench.vocab import COMPILE_S, STEP_S

__all__ = ["COORDINATOR_PHASES", "GPU_PHASES", "GpuBudget", "gpu_record", "gpu_seconds", "gpu_seconds_total",
           "profile_seconds", "reserved_seconds", "runs_after_search", "spend", "trial_seconds"]

GPU_PHASES = ("baseline", "screening", "trials", "numerics", "validation", "traces")
"""Where a study's device time goes: the base config's repeats, search trials stopped at screening (the pruner
stopped them early), search trials measured to the end (or failed), the numerics guard's twins and reruns,
validation's A/B runs, and the trace runs of studies made before the traces were folded into measured runs (0
since)."""

COORDINATOR_PHASES = ("baseline", "validation", "traces")
"""Phases only the coordinator runs: their device seconds are one study attribute (``gpu_s``) that no other
process writes. A search trial's own seconds, and its numerics guard's runs', are that trial's attributes
(``wall_s``, ``twin_wall_s``, ``rerun_wall_s``), since workers run them."""


def spend(session: StudySession, phase: str, wall_s: float) -> None:
    """Add a coordinator phase's run (one of COORDINATOR_PHASES) to the study's device seconds (its wall time
    times the GPUs it held)."""
    study = session.study
    spent = dict(study.user_attrs.get("gpu_s") or {})
    spent[phase] = round(float(spent.get(phase, 0.0)) + wall_s * session.spec.gpus, 3)
    study.set_user_attr("gpu_s", spent)
    session.show(gpu_min=gpu_seconds_total(session) / 60)


def gpu_seconds(session: StudySession) -> dict[str, float]:
    """Device seconds the study spent so far, by phase (GPU_PHASES): the coordinator's phases from the study,
    each finished search trial's from its own record (a repeat that reused a result ran nothing)."""
    gpus = session.spec.gpus
    spent = dict.fromkeys(GPU_PHASES, 0.0)
    for k, v in (session.study.user_attrs.get("gpu_s") or {}).items():
        if k in spent and isinstance(v, (int, float)):
            spent[k] += float(v)
    for t in session.study.get_trials(deepcopy=False):
        a = t.user_attrs
        wall = a.get("wall_s")
        if isinstance(wall, (int, float)) and "duplicate_of" not in a:
            spent["screening" if t.state == TrialState.PRUNED else "trials"] += wall * gpus
        for guard in (a.get("twin_wall_s"), a.get("rerun_wall_s")):  # the numerics guard's runs for the trial
            if isinstance(guard, (int, float)):
                spent["numerics"] += guard * gpus
    return {k: round(v, 3) for k, v in spent.items()}


def gpu_seconds_total(session: StudySession) -> float:
    return sum(gpu_seconds(session).values())


def gpu_record(session: StudySession) -> dict[str, Any]:
    """tune.json's ``gpu_minutes``: the budget, what each phase spent and the total, in minutes, the device they
    were spent on (``cuda``, or ``cpu`` for a study that ran on the CPU: its minutes are CPU-minutes), and
    ``no_room``: where the budget held no search trial after the baseline, why (``GpuBudget.no_room``), else
    None."""
    spent = gpu_seconds(session)
    return {"device": "cuda" if "cuda" in session.hardware.get("capabilities", ()) else "cpu",
            "budget": session.gpu_minutes, "total": round(sum(spent.values()) / 60, 3),
            "by_phase": {k: round(v / 60, 3) for k, v in spent.items()},
            "no_room": session.study.user_attrs.get("gpu_no_room")}


def profile_seconds(out: Any) -> float | None:
    """The seconds a run that profiled steps after its measurement spent past its last measured window (``out``: a
    ``TrialOutcome``; its wall less its timeline's ``last_window`` mark): the profiled steps, the trace's export
    and the exit. None where the run recorded no such mark."""
    last = (out.timeline or {}).get("last_window")
    if not isinstance(last, (int, float)) or not 0 < last <= out.wall_s:
        return None
    return round(out.wall_s - float(last), 3)


def _profile_s(session: StudySession) -> float:
    """What the base config's profiled steps added to its run (``baseline_profile_s``; 0 where none was
    recorded: no profile, or a study from before the record)."""
    v = session.study.user_attrs.get("baseline_profile_s")
    return float(v) if isinstance(v, (int, float)) and v > 0 else 0.0


def _run_seconds(session: StudySession) -> float | None:
    """Device seconds one measured run takes here: the median of the baseline's runs, the profiled repeat's
    without its profiled steps (a run after the search profiles none but the first pair's; None before any)."""
    walls = [w for w in (session.study.user_attrs.get("baseline_wall_s") or []) if isinstance(w, (int, float))]
    if not walls:
        return None
    if len(walls) >= session.spec.protocol.baseline_repeats:  # the last repeat is the profiled one
        walls[-1] = max(0.0, walls[-1] - _profile_s(session))
    return statistics.median(walls) * session.spec.gpus


def _compile_seconds(trial: FrozenTrial) -> float | None:
    """The compile seconds a search trial's loop reported (its ``timeline``'s, else its ``COMPILE_S``)."""
    tl = trial.user_attrs.get("timeline")
    v = tl.get("compile_s") if isinstance(tl, dict) else None
    v = trial.user_attrs.get(COMPILE_S) if v is None else v
    return float(v) if isinstance(v, (int, float)) and v >= 0 else None


def twin_worth_s(session: StudySession) -> float | None:
    """The device seconds a finished compile-ahead twin saves its trial: the median compile of the search trials that
    compiled their own graphs (no twin finished or was stopped for them, none was skipped for graphs already
    compiled) less the median of those that read theirs from the study's cache (after a finished twin, or skipped
    so). None until both were measured. The twins of gr00t-n1.6-vla on one H100 ran 35-54 s from their start-up to
    their last graph, beside trials of 11-18 s; their trials waited 22-38 s, while one that compiled its own graphs
    took 18-27 s to compile and one that read them 3-11 s (runs vlaw8-h100, vlaw9-h100)."""
    cold, cached = [], []
    for t in _ran(session):
        compiled = _compile_seconds(t)
        ahead = t.user_attrs.get("compile_ahead")
        ahead = ahead if isinstance(ahead, dict) else {}
        if compiled is None or ahead.get("reason") == NOTHING_TO_COMPILE or ahead.get("status") == "stopped":
            continue  # (a stopped twin's trial read some graphs and compiled the rest: neither)
        read = ahead.get("status") == "done" or str(ahead.get("reason") or "").startswith((COMPILED, BEING_COMPILED))
        (cached if read else cold).append(compiled)
    if not cold or not cached:
        return None
    return max(0.0, statistics.median(cold) - statistics.median(cached))


TWINS_TO_JUDGE = 2
"""Finished twins the search measures before it judges whether twins pay (``twins_unpaid``)."""


def twins_unpaid(session: StudySession) -> str:
    """Why compile-ahead twins cost this search more device time than they save, so no more start ('' while they
    pay, or before ``TWINS_TO_JUDGE`` finished): the median seconds their trials waited for the finished twins is
    at least what a finished twin saves its trial (``twin_worth_s``). A trial without a twin compiles its new
    graphs itself, which its GPU does anyway while it waits. On one H100 (gr00t-n1.6-vla, runs vlaw8-h100 and
    vlaw9-h100) the trials after a finished twin took 34-60 s, the two whose twin failed 32 and 39 s."""
    waits = [_waited_s(t) for t in session.study.get_trials(deepcopy=False)  # (a trial that failed waited too)
             if (t.user_attrs.get("compile_ahead") or {}).get("status") == "done"]
    worth = twin_worth_s(session)
    if len(waits) < TWINS_TO_JUDGE or worth is None:
        return ""
    waited = statistics.median(waits)
    if waited < worth:
        return ""
    return (f"twins do not pay here: trials waited a median {waited:.1f} s for the {len(waits)} that finished, "
            f"and a finished twin saves its trial {worth:.1f} s of compile")


def _waited_s(trial: FrozenTrial) -> float:
    """The seconds a search trial waited for its compile-ahead twin (counted in its ``wall_s``; a pair waits for
    none)."""
    ahead = trial.user_attrs.get("compile_ahead")
    v = ahead.get("waited_s") if isinstance(ahead, dict) else None
    return float(v) if isinstance(v, (int, float)) and v > 0 else 0.0


def _pair_seconds(session: StudySession) -> float | None:
    """Device seconds one A/B pair takes here: a run of a candidate and one of the base config, both reading the
    study's compile cache (the search trial, its twin or the baseline filled it). Before a search trial finished
    to the end, two baseline runs (``_run_seconds``, which compiled: an upper bound); None before the baseline ran.

    After: the median, over the search trials measured to the end (COMPLETE, status ok), of the pair each makes.
    Its candidate's run is the trial's wall less the seconds it waited for its twin, and, where no twin's cache
    served it, less what its compile took beyond the median compile of the trials a twin's cache served (0 where
    none did): on one H100 the VLA at micro-batch 16, compiled, ran 115 s, 91 of them compiling, and its
    validation's runs took 22 s each. Its base run is the same run with its steps at the base's speed: the steps
    take their seconds times the trial's throughput over the baseline's median. (gr00t-n1.6-vla-w7 on one H100:
    candidates' runs of 14-17 s after 13-28 s of twin waits, an eager base 2.0-2.4 times slower a step; both runs
    of a pair at the trials' median wall, 35.4 s, kept 3.0 GPU-minutes for a validation that took 1.8.)"""
    base = _run_seconds(session)
    if base is None:
        return None
    done = _ran(session, to_the_end=True)
    if not done:
        return 2 * base

    def warm(t: FrozenTrial) -> bool:
        ahead = t.user_attrs.get("compile_ahead")
        return isinstance(ahead, dict) and ahead.get("status") == "done"

    read = [c for c in map(_compile_seconds, filter(warm, done)) if c is not None]
    cache_read = statistics.median(read) if read else 0.0
    base_value = baseline_median(session)
    pairs = []
    for t in done:
        run, compiled = float(t.user_attrs["wall_s"]) - _waited_s(t), _compile_seconds(t)
        if not warm(t) and compiled is not None and compiled > cache_read:
            run -= compiled - cache_read
        step, steps = t.user_attrs.get(STEP_S), t.user_attrs.get("steps")
        slower = 0.0  # the seconds the base's steps take beyond the trial's
        if base_value > 0 and t.values and t.values[0] > 0 and isinstance(step, (int, float)) \
                and isinstance(steps, (int, float)):
            slower = steps * step * (t.values[0] / base_value - 1.0)
        pairs.append((2 * run + max(slower, -run)) * session.spec.gpus)
    return statistics.median(pairs)


def _runs_after_search_parts(session: StudySession) -> dict[str, int]:
    """``runs_after_search`` by part: ``ab_pairs`` and ``reference`` at the cap (``protocol.ab_rounds`` pairs),
    and ``reserved``: the A/B runs the budget reserves, every candidate's ``protocol.ab_min_rounds`` pairs and one
    candidate's pairs on to the cap (``reserved_seconds``)."""
    p = session.spec.protocol
    base = session.spec.measured_base_config()
    plain = plain_loop_skipped(session) is None and config_hash(plain_loop_config(base)) != config_hash(base)
    least = p.ab_min_rounds or p.ab_rounds
    return {"ab_pairs": 2 * p.top_k * p.ab_rounds, "reference": 2 * p.ab_rounds if plain else 0,
            "reserved": 2 * (p.top_k * least + p.ab_rounds - least)}


def runs_after_search(session: StudySession) -> int:
    """Measured runs after the search at most (the progress bar's count): every candidate's A/B pairs at the cap
    and the winner's pairs beside the plain compiled loop where they will run (``validation.against_plain``). The
    traces add no run: their ``protocol.profile_steps`` steps follow the measurement of runs made anyway
    (``Measurer.keep_traces``), and their device time counts to those runs' phase, ``validation`` for an A/B
    pair's (``baseline`` for the last baseline repeat's); ``traces`` stays 0, in GPU_PHASES for the trace runs of
    older studies."""
    parts = _runs_after_search_parts(session)
    return parts["ab_pairs"] + parts["reference"]


def _traces_seconds(session: StudySession) -> float:
    """Device seconds the traces after the search add: the winner's first A/B pair profiles its candidate run,
    and its baseline run too where the last baseline repeat holds no trace (``validation.ab_pairs``), each taken
    to add what the base config's profiled steps did."""
    profile_s = _profile_s(session)
    if not profile_s or not _runs_after_search_parts(session)["ab_pairs"]:
        return 0.0
    return (1 if session.base_trace_dir() is not None else 2) * profile_s * session.spec.gpus


def reserved_seconds(session: StudySession) -> float:
    """Device seconds the search leaves for the validation: every candidate's A/B pairs at
    ``protocol.ab_min_rounds`` (the fewest the sequential A/B takes) and one candidate's pairs on to
    ``protocol.ab_rounds``, each at ``_pair_seconds``, and the traces of the winner's profiled pair (0 before the
    baseline ran). The leading candidate gets every pair of the cap because the export hangs on its interval: two
    pairs leave a t-interval of one degree of freedom, which a base whose runs spread 17% keeps open at a 2.46x
    gain (gr00t-n1.6-vla-w8 on one H100: an eager base of 33,767 and 40,125 tok/s beside a candidate of 90,268
    and 90,023 gave [0.263, 22.771], and the base config was exported). Another candidate's pair past its
    ``ab_min_rounds`` runs only where the budget holds it (``GpuBudget.pairs_left``): the sequential A/B stops
    most candidates there, and the search is what the budget is for. The pairs beside the plain compiled loop
    are not reserved either: they say how the winner compares with a loop the user might run instead and change
    nothing the study exports, so they run on what the budget has left."""
    pair = _pair_seconds(session)
    return 0.0 if pair is None else pair * _runs_after_search_parts(session)["reserved"] / 2 + _traces_seconds(session)


def _ran(session: StudySession, to_the_end: bool = False) -> list[FrozenTrial]:
    """The search trials that ran: COMPLETE or PRUNED with a wall time (a screen stopped by the pruner as much as
    a trial measured to the end; a config refused before its run, a repeat answered from an earlier trial and a
    failure are left out); ``to_the_end``: only those measured to the end (COMPLETE, ok)."""
    states = (TrialState.COMPLETE,) if to_the_end else (TrialState.COMPLETE, TrialState.PRUNED)
    return [t for t in session.study.get_trials(deepcopy=False)
            if t.state in states and (not to_the_end or t.user_attrs.get("status") == "ok")
            and isinstance(t.user_attrs.get("wall_s"), (int, float)) and t.user_attrs["wall_s"] > 0]


def _trial_walls(session: StudySession) -> list[float]:
    """Device seconds of each search trial that ran (``_ran``)."""
    return [t.user_attrs["wall_s"] * session.spec.gpus for t in _ran(session)]


def trial_seconds(session: StudySession) -> float:
    """Device seconds the next search trial is expected to take: the median of the search trials that ran so far,
    screens included (with a screening pruner every trial starts as a screen, and most stop there), else a
    baseline run."""
    walls = _trial_walls(session)
    return statistics.median(walls) if walls else (_run_seconds(session) or 0.0)


def _trial_estimate_text(session: StudySession) -> str:
    """How ``trial_seconds`` came about, for the budget's line."""
    n = len(_trial_walls(session))
    if n:
        return f"the median of the {n} search trial{'s' if n != 1 else ''} that ran, screens included"
    return "a baseline run" if _run_seconds(session) else "nothing measured yet"


class GpuBudget:
    """Whether the GPU-minute budget leaves room for one more search trial; the first time it does not, one line
    says where the minutes went."""

    def __init__(self, session: StudySession) -> None:
        self.session = session
        self.noted = False  # the line was printed

    def room(self) -> float | None:
        """Device seconds the search may still spend: the budget less what was spent and the reserve of the runs
        after the search; None without a GPU-minute budget."""
        minutes = self.session.gpu_minutes
        if minutes is None:
            return None
        return minutes * 60 - gpu_seconds_total(self.session) - reserved_seconds(self.session)

    def left(self) -> float | None:
        """Device seconds left after the next trial too (``room`` less ``trial_seconds``); None without a
        GPU-minute budget."""
        room = self.room()
        return None if room is None else room - trial_seconds(self.session)

    def pairs_left(self) -> int | None:
        """A/B pairs the budget still holds, each at ``_pair_seconds``; None without a GPU-minute budget or before
        the baseline ran."""
        minutes, pair = self.session.gpu_minutes, _pair_seconds(self.session)
        if minutes is None or not pair:
            return None
        return max(0, math.floor((minutes * 60 - gpu_seconds_total(self.session)) / pair))

    def done(self) -> bool:
        left = self.left()
        if left is None or left >= 0:
            return False
        if not self.noted:
            self.noted = True
            s = self.session
            self.session.log(f"GPU-minute budget: {gpu_seconds_total(s) / 60:.1f} of {s.gpu_minutes:g} spent, "
                             f"{reserved_seconds(s) / 60:.1f} kept for validation, "
                             f"{max(0.0, left + trial_seconds(s)) / 60:.2f} left; a trial takes about "
                             f"{trial_seconds(s) / 60:.2f} ({_trial_estimate_text(s)}): the search stops")
        return True

    def no_room(self) -> dict[str, Any] | None:
        """Right after the baseline, before any search trial finished: where the budget leaves no room for one
        trial beside the reserve, one line with the minutes each part takes and the keys that make room, logged
        (in place of ``done``'s line, which would follow at once) and stored as the study attr ``gpu_no_room``
        (tune.json's ``gpu_minutes.no_room``); the record, or None (and the attr cleared: a resumed study given
        more minutes) when a trial fits. The study still validates and exports, the base config."""
        s = self.session
        left = self.left()
        if left is None or s.finished_count() > 0:
            return None
        if left >= 0:
            if s.study.user_attrs.get("gpu_no_room") is not None:
                s.study.set_user_attr("gpu_no_room", None)
            return None
        p, run = s.spec.protocol, _run_seconds(s) or 0.0
        parts = {"ab_pairs": _runs_after_search_parts(s)["reserved"] * run / 60, "traces": _traces_seconds(s) / 60}
        minutes = {"budget": s.gpu_minutes, "spent": gpu_seconds_total(s) / 60, "run": run / 60, **parts,
                   "trial": trial_seconds(s) / 60}
        minutes["needed"] = math.ceil((minutes["spent"] + sum(parts.values()) + minutes["trial"]) * 10) / 10
        least = p.ab_min_rounds or p.ab_rounds
        runs = f"2 x protocol.top_k {p.top_k} x protocol.ab_rounds {p.ab_rounds} runs" if least == p.ab_rounds else (
            f"2 x protocol.top_k {p.top_k} x protocol.ab_min_rounds {least} runs and the leader's pairs on to "
            f"protocol.ab_rounds {p.ab_rounds}")
        kept = [f"A/B pairs {parts['ab_pairs']:.1f} ({runs})"]
        if parts["traces"]:
            kept.append(f"the winner's traces {parts['traces']:.1f} (its first pair's profiled steps; "
                        "protocol.profile_steps 0 drops them)")
        line = (f"GPU-minute budget: budget.gpu_minutes {s.gpu_minutes:g} holds no search trial: "
                f"{minutes['spent']:.1f} spent so far, {sum(parts.values()):.1f} kept for validation at "
                f"{run / 60:.2f} a run ({', '.join(kept)}), a trial about {minutes['trial']:.2f}. Raise "
                f"budget.gpu_minutes to {minutes['needed']:g} or lower protocol.top_k or protocol.ab_rounds; now no "
                "search trial runs and the base config is exported")
        record = {"line": line, "minutes": {k: round(v, 3) for k, v in minutes.items()}}
        s.study.set_user_attr("gpu_no_room", record)
        s.log(line)
        self.noted = True
        return record
