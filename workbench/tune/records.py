"""The study's records: tune.json (the coordinator sessions, the study's facts and, once finished, its one result,
workbench.tune.result), the result as study attributes for Optuna's tools, and what a finished study says when it
is run again."""

from __future__ import annotations

import datetime
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from workbench.train.fingerprint import source_commit
from workbench.tune.budget import GpuBudget, gpu_record, gpu_seconds_total
from workbench.tune.export import write_json
from workbench.tune.profiled import warm_walk
from workbench.tune.result import build_result, data_source, result_lines
from workbench.tune.session import StudySession
from workbench.tune.storage import mask_url
from workbench.vocab import COMPILE_S

__all__ = ["Sessions", "compile_ahead_record", "earlier_sessions", "finished", "finished_lines", "finished_result",
           "record_in_study", "result_text", "screen_seconds", "screening_record", "sessions_wall_s",
           "start_ahead_record", "stored_result", "study_result", "warm_start_record", "write_tune_json"]


def sessions_wall_s(sessions: Sequence[Mapping[str, Any]]) -> float:
    """Seconds of the sessions that finished (tune.json's ``sessions``); an interrupted one has no end and adds
    nothing."""
    total = 0.0
    for s in sessions:
        try:
            total += (datetime.datetime.fromisoformat(s["finished"])
                      - datetime.datetime.fromisoformat(s["started"])).total_seconds()
        except (KeyError, TypeError, ValueError):
            continue
    return total


def finished_result(tune_json: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The stored result of a finished study (tune.json's ``result`` once its last session ended), else None."""
    if not isinstance(tune_json, Mapping) or not tune_json.get("finished"):
        return None
    result = tune_json.get("result")
    return dict(result) if isinstance(result, Mapping) and "verdict" in result else None


def stored_result(study_dir: Path) -> dict[str, Any] | None:
    """The finished result in a study directory's tune.json, else None."""
    try:
        return finished_result(json.loads((study_dir / "tune.json").read_text()))
    except (OSError, ValueError):
        return None


def earlier_sessions(study_dir: Path, study_name: str) -> list[dict[str, Any]]:
    """The coordinator runs recorded by an earlier tune.json of this study directory (a resume); none when there is
    no such file or it cannot be read (the report then counts this run alone)."""
    try:
        prev = json.loads((study_dir / "tune.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(prev, dict) or prev.get("study_name") != study_name:
        return []
    sessions = prev.get("sessions")
    if isinstance(sessions, list):
        return [s for s in sessions if isinstance(s, dict) and isinstance(s.get("started"), str)]
    # a tune.json written before sessions were recorded: its one run
    return [{"started": prev["started"], "finished": prev.get("finished")}] \
        if isinstance(prev.get("started"), str) else []


class Sessions:
    """tune.json's ``sessions``: the coordinator runs of the study, this one last. The earlier ones are read from
    the tune.json in place at the first ``mark`` (after the study was opened, which may have started it over)."""

    def __init__(self, study_dir: Path, study_name: str) -> None:
        self.study_dir, self.study_name = study_dir, study_name
        self.runs: list[dict[str, Any]] = []
        self._read = False  # the earlier runs were read

    def mark(self, started: str, finished: str | None) -> list[dict[str, Any]]:
        """This run's start and end (None while it runs); returns every run."""
        if not self._read:
            self._read = True
            self.runs = [*earlier_sessions(self.study_dir, self.study_name), {"started": started, "finished": None}]
        self.runs[-1] = {"started": started, "finished": finished}
        return self.runs


def write_tune_json(session: StudySession, sessions: Sessions, started: str, finished: str | None,
                    result: Mapping[str, Any] | None = None) -> None:
    """tune.json: the study's facts, its coordinator sessions and, once finished, its ``result``."""
    runs = sessions.mark(started, finished)
    study = session.study
    write_json(session.study_dir / "tune.json", {
        "study_name": session.study_name, "storage_url": mask_url(session.storage_url),
        "spec": session.spec.to_record(),
        "active_knobs": session.active, "dropped_knobs": session.dropped, "hardware": session.hardware,
        "budget_trials": session.budget, "gpu_minutes": gpu_record(session),
        "screening": screening_record(session),
        "profile": study.user_attrs.get("profile"), "warm_start": warm_start_record(session),
        "walk": cold_walk_record(session),
        "noise_floor": study.user_attrs.get("noise_floor"),
        "started": runs[0]["started"], "finished": finished,
        "sessions": runs, "wall_s": sessions_wall_s(runs), "result": result,
    })


def warm_start_record(session: StudySession) -> dict[str, Any] | None:
    """tune.json's ``warm_start``: the study attr (the earlier study's trial that ran first, its values kept, the
    knobs it did not search) with, for a partial warm start, the steps its startup took (``walk``,
    ``workbench.tune.profiled.warm_walk``). None: not warm-started."""
    warm = session.study.user_attrs.get("warm_start")
    if not isinstance(warm, dict):
        return None
    if not warm.get("new"):
        return dict(warm)
    return {**warm, "walk": warm_walk(session.trials(), warm["new"])}


def cold_walk_record(session: StudySession) -> dict[str, Any] | None:
    """tune.json's ``walk``: the study attr of a cold walk from the base config (the knobs walked, their choices,
    the base config and the baseline median) with the steps its trials took (``steps``,
    ``workbench.tune.profiled.warm_walk`` from the base). None: the study did not walk from its base."""
    walk = session.study.user_attrs.get("walk")
    if not isinstance(walk, dict):
        return None
    return {**walk, "steps": warm_walk(session.trials(), walk["knobs"], walk["base"], walk["value"])}


def screening_record(session: StudySession) -> dict[str, Any]:
    """tune.json's ``screening``: how many search trials each stage of the protocol saw (``stages``: trials that
    measured at least that many windows; the first is the screen, the last the full protocol), the trials the
    pruner would have run on that the GPU-minute budget stopped (``stopped_for_budget``), the configs refused
    before any run (the memory model, a config error), repeats answered from an earlier trial, and configs
    evaluated (screened or refused) per GPU-minute of the study."""
    spec = session.spec
    trials = [t for t in session.trials() if t.state not in (TrialState.WAITING, TrialState.RUNNING)]
    own = [t for t in trials if "duplicate_of" not in t.user_attrs]
    windows, eta = spec.protocol.windows, spec.pruner.reduction_factor
    marks = {1, windows}
    if spec.pruner.screens:
        r = 1
        while r < windows:
            marks.add(r)
            r *= eta
    stages = [{"windows": w, "trials": sum(len(t.intermediate_values) >= w for t in own)} for w in sorted(marks)]
    refused = sum(not t.intermediate_values and t.user_attrs.get("wall_s") == 0 for t in own)
    minutes = gpu_seconds_total(session) / 60
    evaluated = stages[0]["trials"] + refused
    return {"pruner": spec.pruner.name, "stages": stages,
            "stopped_for_budget": sum("stopped_for_budget" in t.user_attrs for t in own),
            "refused_without_run": refused,
            "repeats": len(trials) - len(own), "configs_evaluated": evaluated,
            "configs_per_gpu_minute": round(evaluated / minutes, 3) if minutes > 0 else None,
            "screen_seconds": screen_seconds(own), "compile_ahead": compile_ahead_record(own),
            "start_ahead": start_ahead_record(own)}


def screen_seconds(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """Where a screened trial's seconds went, from the watchdog's ``timeline`` (``workbench.tune.trial.TIMELINE``):
    the medians, over the search trials that measured a window, of the seconds before their first step (process
    start, imports, model build, compile and that step), of the stepping from there to their last window read,
    and of those after it (a summary, a trace, the teardown) to the process's end; with ``trials``, how many they
    are, and ``compile``, the median compile seconds of those whose loop reports them (None: none does). None: no
    trial has a timeline (a study measured before trials kept one)."""
    spans: dict[str, list[float]] = {"before_first_step": [], "stepping": [], "after_last_window": [], "total": []}
    compiles: list[float] = []
    for t in trials:
        tl = t.user_attrs.get("timeline")
        if not isinstance(tl, dict) or not all(isinstance(tl.get(k), (int, float))
                                               for k in ("first_step", "last_window", "end")):
            continue
        first, last, end = float(tl["first_step"]), float(tl["last_window"]), float(tl["end"])
        spans["before_first_step"].append(first)
        spans["stepping"].append(max(0.0, last - first))
        spans["after_last_window"].append(max(0.0, end - last))  # (a window read at the exit: none after it)
        spans["total"].append(end)
        if isinstance(tl.get("compile_s"), (int, float)):
            compiles.append(float(tl["compile_s"]))
    if not spans["total"]:
        return None
    return {"trials": len(spans["total"]), **{k: round(statistics.median(v), 1) for k, v in spans.items()},
            "compile": round(statistics.median(compiles), 1) if compiles else None}


def compile_ahead_record(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """What compile-ahead (workbench/tune/ahead.py) did over ``trials``: twins started, finished, failed or
    stopped (of those, stopped as they no longer fit beside the next trial), the failed ones by failure kind
    (``failed_kinds``: their ``failure.json``'s, else ``exit <code>``), the trials asked ahead at once
    (``depth``; None before it was recorded) and the twins started beside another, the seconds trials waited,
    the seconds the twins stood stopped beside measured windows, the median compile seconds of the trials that
    had a finished twin and of those that had none, why the others got none, and ``windows_beside_twins``: of the
    windows the search measured (``of``), how many were read with a twin alive (stopped). None: no trial was asked
    ahead."""
    recs = [(t, t.user_attrs["compile_ahead"]) for t in trials if isinstance(t.user_attrs.get("compile_ahead"), dict)]
    if not recs:
        return None
    status = Counter(r.get("status", "started") for _, r in recs)
    reasons = Counter(r["reason"] for _, r in recs if r.get("status") == "skipped" and r.get("reason"))

    def median_compile(ts: list[FrozenTrial]) -> float | None:
        vals = [t.user_attrs[COMPILE_S] for t in ts if isinstance(t.user_attrs.get(COMPILE_S), (int, float))]
        return round(statistics.median(vals), 2) if vals else None

    depths = [r["depth"] for _, r in recs if isinstance(r.get("depth"), int)]
    beside = [n for t in trials for n in t.user_attrs.get("windows_beside_twins") or []]
    failures = Counter(str((r.get("failure") or {}).get("kind") or f"exit {r.get('rc')}")
                       for _, r in recs if r.get("status") == "failed")
    return {"asked_ahead": len(recs), "twins": len(recs) - status["skipped"], "finished": status["done"],
            "failed": status["failed"], "failed_kinds": dict(failures), "stopped": status["stopped"],
            "skipped": dict(reasons),
            "depth": max(depths) if depths else None,
            "beside_another_twin": sum(bool(r.get("beside_twins")) for _, r in recs),
            "stopped_to_fit": sum("stopped_for" in r for _, r in recs),
            "waited_s": round(sum(float(r.get("waited_s") or 0.0) for _, r in recs), 1),
            "paused_s": round(sum(float(r.get("paused_s") or 0.0) for _, r in recs), 1),
            "median_compile_s_after_twin": median_compile([t for t, r in recs if r.get("status") == "done"]),
            "median_compile_s_without": median_compile([t for t in trials if t.user_attrs.get("compile_ahead",
                                                        {}).get("status") != "done"]),
            "windows_beside_twins": {"beside": sum(n > 0 for n in beside), "of": len(beside)}}


def start_ahead_record(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """What start-ahead (workbench/tune/ahead.py) did over ``trials``: the trials run from a held process, how many
    of those were at their gate when it opened, the median seconds from their launch to the gate (the interpreter,
    imports and config: off the device's clock where ready), the seconds trials waited for a process not yet ready
    (on it), and how many had CUDA up at the gate (none should). None: no trial ran from a held process."""
    recs = [t.user_attrs["start_ahead"] for t in trials if isinstance(t.user_attrs.get("start_ahead"), dict)]
    if not recs:
        return None
    ready = [r for r in recs if isinstance(r.get("ready_s"), (int, float))]
    on_time = [r for r in ready if r["ready_s"] <= r.get("held_s", 0.0)]
    return {"held": len(recs), "ready_at_gate": len(on_time),
            "median_ready_s": round(statistics.median(r["ready_s"] for r in ready), 2) if ready else None,
            "waited_s": round(sum(max(0.0, r["ready_s"] - r.get("held_s", 0.0)) for r in ready), 1),
            "cuda_initialized": sum(bool(r.get("cuda_initialized")) for r in recs)}


def study_result(session: StudySession, validation: Mapping[str, Any], wall_s: float | None) -> dict[str, Any]:
    """The study's one result (workbench.tune.result) from its validation and the study's facts."""
    spec = session.spec
    budget = {"trials": session.budget, "trials_run": session.finished_count(), "timeout_s": session.timeout_s,
              "wall_s": wall_s, "gpu_minutes": gpu_record(session), "screening": screening_record(session)}
    return build_result(validation, study=session.study_name, base_values=spec.base_knob_values(),
                        baseline_repeats=session.baseline_runs(), searched=session.active, budget=budget,
                        data=data_source(spec.base_config(), spec.trainer), commit=source_commit())


def finished(session: StudySession, gpu_budget: GpuBudget, timeout_given: bool) -> dict[str, Any] | None:
    """The stored result of a study that is not run again: its result is stored and its budget spent (trials, a
    study without a trial budget unless --timeout was given, or GPU-minutes). None when there is work to do."""
    result = stored_result(session.study_dir)
    spent = (session.budget is not None and session.finished_count() >= session.budget) or \
        (session.budget is None and not timeout_given) or gpu_budget.done()
    return result if result is not None and spent else None


def finished_lines(session: StudySession, result: Mapping[str, Any]) -> list[str]:
    """What a finished study says when run again: its result, how to re-measure its export and how to extend it."""
    n = session.finished_count()
    return [f"study {session.study_name} is finished ({n} trials):", *result_lines(result),
            f"config: {session.study_dir / 'config.yaml'}",
            f"re-measure the exported config: python -m workbench.tune verify --study-name {session.study_name} "
            f"--out {session.study_dir.parent}",
            f"extend the search: the same command with --trials N (N > {n})"]


def record_in_study(study: optuna.Study, result: Mapping[str, Any]) -> None:
    """The validated result where Optuna's tools see it, as study attributes: ``result/...`` (verdict, the
    exported trial, the baseline, the best candidate's speedup and interval) and ``validated/trial_<n>`` for each
    candidate (its role and A/B figures; a finished trial's own attributes cannot change). Optuna's own best
    trial is the best single search run; the tuner's winner is the validated one (docs/cli.md, "Optuna's own
    tools")."""
    best = result.get("best") or {}
    study.set_user_attr("result/verdict", result["verdict"])
    study.set_user_attr("result/exported_trial", result["exported"]["trial"])
    study.set_user_attr("result/baseline_tokens_per_s", result["baseline"]["tokens_per_s"])
    for key in ("trial", "speedup", "ci_low", "ci_high", "pairs"):
        study.set_user_attr(f"result/best_{key}", best.get(key))
    for c in result.get("candidates") or []:
        role = "validated winner" if c["trial"] == result["exported"]["trial"] else "validated candidate"
        study.set_user_attr(f"validated/trial_{c['trial']}", {
            "role": role, **{k: c[k] for k in ("speedup", "ci_low", "ci_high", "pairs", "tokens_per_s",
                                               "baseline_tokens_per_s", "significant")}})


def result_text(result: Mapping[str, Any], config: Path, report: Path | None) -> str:
    """The terminal's lines of a finished run: the result, the exported config and, where built, the report."""
    lines = [*result_lines(result), f"config: {config}"]
    if report is not None and report.exists():
        lines.append(f"report: {report}")
    return "\n".join(lines)
