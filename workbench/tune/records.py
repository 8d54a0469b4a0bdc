"""The study's records in tune.json: the coordinator sessions, the study's facts and, once finished, its one
result (workbench.tune.result); and what a finished study says when it is run again."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.train.fingerprint import source_commit
from workbench.tune.export import write_json
from workbench.tune.storage import mask_url
from workbench.tune.result import build_result, data_source, result_lines
from workbench.tune.trial import interrupts_held

__all__ = ["StudyRecords", "finished_result", "sessions_wall_s"]


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


class StudyRecords:
    """The Tuner's tune.json methods (the Tuner provides the spec, study, budget and lease)."""

    def stored_result(self) -> dict[str, Any] | None:
        """The finished result in this study's tune.json, else None."""
        try:
            return finished_result(json.loads((self.study_dir / "tune.json").read_text()))
        except (OSError, ValueError):
            return None

    def _earlier_sessions(self) -> list[dict[str, Any]]:
        """The coordinator runs recorded by an earlier tune.json of this study directory (a resume); none when
        there is no such file or it cannot be read (the report then counts this run alone)."""
        try:
            prev = json.loads((self.study_dir / "tune.json").read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(prev, dict) or prev.get("study_name") != self.study_name:
            return []
        sessions = prev.get("sessions")
        if isinstance(sessions, list):
            return [s for s in sessions if isinstance(s, dict) and isinstance(s.get("started"), str)]
        # a tune.json written before sessions were recorded: its one run
        return [{"started": prev["started"], "finished": prev.get("finished")}] \
            if isinstance(prev.get("started"), str) else []

    def _session(self, started: str, finished: str | None) -> None:
        if self._sessions is None:
            self._sessions = self._earlier_sessions()
            self._sessions.append({"started": started, "finished": None})
        self._sessions[-1] = {"started": started, "finished": finished}

    def _write_tune_json(self, started: str, finished: str | None, result: Mapping[str, Any] | None = None) -> None:
        """tune.json: the study's facts, its coordinator sessions and, once finished, its ``result``."""
        assert self.spec is not None and self.study is not None
        self._session(started, finished)
        write_json(self.study_dir / "tune.json", {
            "study_name": self.study_name, "storage_url": mask_url(self.storage_url),
            "spec": self.spec.to_record(),
            "active_knobs": self.active, "dropped_knobs": self.dropped, "hardware": self.hardware,
            "budget_trials": self.budget, "gpu_minutes": self.gpu_record(), "screening": self.screening_record(),
            "profile": self.study.user_attrs.get("profile"), "noise_floor": self.study.user_attrs.get("noise_floor"),
            "started": self._sessions[0]["started"], "finished": finished,
            "sessions": self._sessions, "wall_s": sessions_wall_s(self._sessions), "result": result,
        })

    def _result(self, validation: Mapping[str, Any], wall_s: float | None) -> dict[str, Any]:
        """The study's one result (workbench.tune.result) from its validation and the study's facts."""
        assert self.spec is not None
        budget = {"trials": self.budget, "trials_run": self._finished_count(), "timeout_s": self.timeout_s,
                  "wall_s": wall_s, "gpu_minutes": self.gpu_record(), "screening": self.screening_record()}
        return build_result(validation, study=self.study_name, base_values=self.spec.base_knob_values(),
                            baseline_repeats=self.baseline_runs(), searched=self.active, budget=budget,
                            data=data_source(self.spec.base_config(), self.spec.trainer), commit=source_commit())

    def _finished(self) -> dict[str, Any] | None:
        """A study whose result is stored and whose budget is spent is not run again: say so, how to re-measure
        its export and how to extend it, and give the lease back. None when there is work to do."""
        result = self.stored_result()
        spent = (self.budget is not None and self._finished_count() >= self.budget) or \
            (self.budget is None and self.timeout_override is None) or self._gpu_budget_done()
        if result is None or not spent:
            return None
        with interrupts_held():
            self._release_lease()
        print("\n".join([f"study {self.study_name} is finished ({self._finished_count()} trials):",
                         *result_lines(result), f"config: {self.study_dir / 'config.yaml'}",
                         f"re-measure the exported config: python -m workbench.tune verify --study-name "
                         f"{self.study_name} --out {self.study_dir.parent}",
                         f"extend the search: the same command with --trials N (N > {self._finished_count()})"]),
              flush=True)
        return result

    def _record_in_study(self, result: Mapping[str, Any]) -> None:
        """The validated result where Optuna's tools see it, as study attributes: ``result/...`` (verdict, the
        exported trial, the baseline, the best candidate's speedup and interval) and ``validated/trial_<n>`` for each
        candidate (its role and A/B figures; a finished trial's own attributes cannot change). Optuna's own best
        trial is the best single search run; the tuner's winner is the validated one (docs/cli.md, "Optuna's own
        tools")."""
        assert self.study is not None
        study, best = self.study, result.get("best") or {}
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

    def _print_result(self, result: Mapping[str, Any], path: Path) -> None:
        lines = [*result_lines(result), f"config: {path}"]
        if self.report is not None and (self.study_dir / "report.html").exists():
            lines.append(f"report: {self.study_dir / 'report.html'}")
        print("\n".join(lines), flush=True)
