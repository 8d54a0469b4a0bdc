"""A/B validation of the best search trials against the baseline: the ``top_k`` best distinct feasible trials,
re-measured interleaved with the base config (A/B/A/B), each pair's ratio, and the winner whose 95% interval lies
above 1.0 (``runs/<study>/validation.json``). With ``protocol.ab_min_rounds`` a candidate stops once its interval
excludes 1.0."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import statistics
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from workbench.config import ConfigError, config_hash
from workbench.tune.export import write_json
from workbench.tune.stats import noise_floor, pair_ratios, speedup_interval

__all__ = ["Validation"]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _feasible(t: FrozenTrial) -> bool:
    return (t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
            and all(v <= 0 for v in t.constraints.values()))


class Validation:
    """The Tuner's validation methods (the Tuner provides the study, spec, measurement and logging)."""

    def candidates(self) -> tuple[list[FrozenTrial], list[dict[str, Any]]]:
        """Top-k distinct feasible trials (by search throughput) to validate, and those skipped with why."""
        spec = self.spec
        assert spec is not None
        base_hash = config_hash(spec.export_config({}))
        base = self.baseline_runs()
        base_median = statistics.median(base) if base else 0.0
        pool = self._trials((TrialState.COMPLETE,))
        if spec.objective.multi_objective:
            assert self.study is not None
            front = {t.number for t in self.study.best_trials}  # the feasible Pareto front
            pool = [t for t in pool if t.number in front]
        # by throughput (objective 0); in multi-objective studies, among the Pareto front
        ok = sorted((t for t in pool if _feasible(t)), key=lambda t: (-t.values[0], t.number))
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

    def validate(self) -> dict[str, Any]:
        """Interleaved A/B re-measurement of the candidates; writes and returns validation.json.

        validation.json: {baseline_runs (the baseline repeats), noise_floor, method, confidence,
        candidates: [{trial, params, search_value, runs, baseline_runs, ratios, run_dirs,
        baseline_dirs, failures, numerics, speedup_median, ci_low, ci_high, significant}], skipped,
        winner: {trial or null, significant, speedup_median, ci_low, ci_high}, complete, finished}.
        Runs: ``validation/baseline-<trial>-<round>/`` then ``validation/trial-<trial>-<round>/``
        for each round, candidates interleaved within the round.
        """
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        cands, skipped = self.candidates()
        path = self.study_dir / "validation.json"
        rounds = spec.protocol.ab_rounds
        with contextlib.suppress(OSError, json.JSONDecodeError):
            old = json.loads(path.read_text())
            if (old.get("complete") and [c["trial"] for c in old.get("candidates", [])] == [t.number for t in cands]
                    and old.get("ab_rounds") == rounds and old.get("storage_url") == self.storage_url):
                self._log("validation: reusing validation.json (same candidates)")
                return old
        base_cfg = spec.measured_base_config()
        results = {t.number: {"trial": t.number, "params": dict(t.params), "search_value": t.values[0], "runs": [],
                              "baseline_runs": [], "run_dirs": [], "baseline_dirs": [], "failures": [],
                              "numerics": t.user_attrs.get("numerics")}
                   for t in cands}
        vdir = self.study_dir / "validation"
        if cands:
            self._log(f"validating {len(cands)} candidate(s) against the baseline, {rounds} A/B pairs each: "
                      + ", ".join(f"#{t.number}" for t in cands))
        settled: set[int] = set()  # sequential A/B: candidates whose interval already excludes 1.0
        min_rounds = spec.protocol.ab_min_rounds
        for r in range(rounds):
            for t in cands:
                res = results[t.number]
                if t.number in settled:
                    continue
                self._check_lease()
                prefix = f"validating #{t.number} round {r + 1}/{rounds}"
                a = self._measure(base_cfg, vdir / f"baseline-{t.number}-{r}",
                                  prefix + " (baseline)")
                b = self._measure(spec.trial_config(t.params), vdir / f"trial-{t.number}-{r}", prefix)
                if a.status == "ok" and b.status == "ok" and a.value and b.value:
                    res["runs"].append(b.value)
                    res["baseline_runs"].append(a.value)
                    res["run_dirs"].append(str(b.trial_dir))
                    res["baseline_dirs"].append(str(a.trial_dir))
                else:
                    res["failures"].append({"round": r, "baseline": a.status, "candidate": b.status,
                                            "reason": a.failure_reason or b.failure_reason})
                if min_rounds is not None and len(res["runs"]) >= min_rounds:
                    iv = speedup_interval(pair_ratios(res["runs"], res["baseline_runs"]))
                    if iv.low > 1.0 or iv.high < 1.0:
                        settled.add(t.number)
                        self._log(f"candidate #{t.number}: interval [{iv.low:.3f}, {iv.high:.3f}] excludes 1.0 "
                                  f"after {len(res['runs'])} pairs; its validation stops")
        candidates = []
        for t in cands:
            res = results[t.number]
            if res["runs"]:
                ratios = pair_ratios(res["runs"], res["baseline_runs"])
                iv = speedup_interval(ratios)
                res.update(ratios=ratios, speedup_median=iv.median, ci_low=_finite_or_none(iv.low),
                           ci_high=_finite_or_none(iv.high), significant=iv.significant)
            else:
                res.update(ratios=[], speedup_median=None, ci_low=None, ci_high=None, significant=False)
            candidates.append(res)
            ci = (f"[{res['ci_low']:.3f}, {res['ci_high']:.3f}]" if res["ci_low"] is not None
                  and res["ci_high"] is not None else "[n/a]")
            sp = f"{res['speedup_median']:.3f}x" if res["speedup_median"] is not None else "n/a"
            self._log(f"candidate #{t.number}: speedup {sp}, 95% interval {ci} over {len(res['ratios'])} pairs"
                      + (" (significant)" if res["significant"] else " (not significant)"))
        sig = [c for c in candidates if c["significant"]]
        if sig:
            w = max(sig, key=lambda c: c["speedup_median"])
            winner = {"trial": w["trial"], "significant": True, "speedup_median": w["speedup_median"],
                      "ci_low": w["ci_low"], "ci_high": w["ci_high"]}
        else:
            winner = {"trial": None, "significant": False, "speedup_median": None, "ci_low": None, "ci_high": None}
        base = self.baseline_runs()
        data = {
            "study_name": self.study_name, "storage_url": self.storage_url, "baseline_runs": base,
            "noise_floor": noise_floor(base).to_dict() if base else None, "method": "t-interval on log ratios",
            "confidence": 0.95, "ab_rounds": rounds, "candidates": candidates, "skipped": skipped,
            "winner": winner, "complete": True, "finished": _now(),
        }
        write_json(path, data)
        return data

    # ------------------------------------------------------------------ the whole run
