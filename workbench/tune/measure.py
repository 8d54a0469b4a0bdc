"""How the Tuner measures: a run of a config in its own process (the baseline repeats, validation runs, the
numerics guard's twins and the trace runs), each in a fresh per-attempt folder, the numerics guard of a search
trial, and the base config's gradient lifetimes."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from workbench.config import config_hash, merge_overrides
from workbench.errors import ConfigError, TuneError, UnsafePathError
from workbench.files import remove_tree
from workbench.train.workload import is_vla, workload_for
from workbench.tune.knobs import numerics_knobs
from workbench.tune.numerics import check_loss, data_key, window_loss
from workbench.tune.profiled import phase_shares, profile_line, profile_record
from workbench.tune.stats import noise_floor, noise_warning
from workbench.tune.trial import TrialOutcome, run_trial
from workbench.tune.validation import plain_loop_config

__all__ = ["GPU_PHASES", "Measurement"]

GPU_PHASES = ("baseline", "screening", "trials", "numerics", "validation", "traces")
"""Where a study's device time goes: the base config's repeats, search trials stopped at screening (the pruner
stopped them early), search trials measured to the end (or failed), the numerics guard's twins, validation's A/B
runs and the trace runs."""

COORDINATOR_PHASES = ("baseline", "validation", "traces")
"""Phases only the coordinator runs: their device seconds are one study attribute (``gpu_s``) that no other
process writes. A search trial's own seconds, and its twin's, are that trial's attributes (``wall_s``,
``twin_wall_s``), since workers run them."""


class Measurement:
    """The Tuner's measurement methods (the Tuner provides the spec, study, study_dir, progress, logging and the
    lifetimes writer)."""

    def _phase(self, prefix: str) -> Any:
        def on_phase(text: str) -> None:
            if self.progress is not None:
                self.progress.set(phase=f"{prefix}: {text}")
        return on_phase

    def _measure(self, cfg: Any, run_dir: Path, prefix: str, phase: str) -> TrialOutcome:
        """A measurement outside the search trials (baseline, validation, numerics twin, trace): run into this
        process's own attempt folder ``.<name>.<attempt>`` beside ``run_dir``, then, if this coordinator still
        holds the study, move it into place; so no two processes ever write one folder, and a folder in place is a
        finished run. Its device seconds count to ``phase`` (one of GPU_PHASES; a twin's are its trial's)."""
        spec = self.spec
        assert spec is not None
        attempt = run_dir.with_name(f".{run_dir.name}.{self._attempt_id}")
        out = run_trial(cfg, attempt, timeout_s=spec.protocol.trial_timeout_s,
                        heartbeat_timeout_s=spec.protocol.heartbeat_timeout_s, on_phase=self._phase(prefix),
                        launch=self.launch, env=self._child_env(), cwd=self._child_cwd())
        if phase in COORDINATOR_PHASES:
            self._spend(phase, out.wall_s)
        if phase in ("validation", "traces") and self.progress is not None:
            self.progress.run_after_search()
        self._check_lease()  # a coordinator whose study was taken over keeps nothing
        remove_tree(run_dir)
        attempt.rename(run_dir)
        out.trial_dir = run_dir
        out.config_path = run_dir / "config.yaml" if out.config_path is not None else None
        return out

    def _spend(self, phase: str, wall_s: float) -> None:
        """Add a coordinator phase's run to the study's device seconds (its wall time times the GPUs it held)."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None and phase in COORDINATOR_PHASES
        spent = dict(study.user_attrs.get("gpu_s") or {})
        spent[phase] = round(float(spent.get(phase, 0.0)) + wall_s * spec.gpus, 3)
        study.set_user_attr("gpu_s", spent)
        if self.progress is not None:
            self.progress.set(gpu_min=self.gpu_seconds_total() / 60)

    def gpu_seconds(self) -> dict[str, float]:
        """Device seconds the study spent so far, by phase (GPU_PHASES): the coordinator's phases from the study,
        each finished search trial's from its own record (a repeat that reused a result ran nothing)."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        spent = dict.fromkeys(GPU_PHASES, 0.0)
        for k, v in (study.user_attrs.get("gpu_s") or {}).items():
            if k in spent and isinstance(v, (int, float)):
                spent[k] += float(v)
        for t in study.get_trials(deepcopy=False):
            a = t.user_attrs
            wall, twin = a.get("wall_s"), a.get("twin_wall_s")
            if isinstance(wall, (int, float)) and "duplicate_of" not in a:
                spent["screening" if t.state == optuna.trial.TrialState.PRUNED else "trials"] += wall * spec.gpus
            if isinstance(twin, (int, float)):
                spent["numerics"] += twin * spec.gpus
        return {k: round(v, 3) for k, v in spent.items()}

    def gpu_seconds_total(self) -> float:
        return sum(self.gpu_seconds().values())

    def gpu_record(self) -> dict[str, Any]:
        """tune.json's ``gpu_minutes``: the budget, what each phase spent and the total, in minutes, and the device
        they were spent on (``cuda``, or ``cpu`` for a study that ran on the CPU: its minutes are CPU-minutes)."""
        spec = self.spec
        assert spec is not None
        spent = self.gpu_seconds()
        return {"device": "cuda" if "cuda" in self.hardware.get("capabilities", ()) else "cpu",
                "budget": spec.budget.gpu_minutes if self.gpu_budget_override is None else self.gpu_budget_override,
                "total": round(sum(spent.values()) / 60, 3),
                "by_phase": {k: round(v / 60, 3) for k, v in spent.items()}}

    def _run_seconds(self) -> float | None:
        """Device seconds one measured run takes here: the median of the baseline's runs (None before any)."""
        walls = [w for w in (self.study.user_attrs.get("baseline_wall_s") or []) if isinstance(w, (int, float))]
        return statistics.median(walls) * self.spec.gpus if walls else None

    def runs_after_search(self) -> int:
        """Measured runs after the search at most: every candidate's A/B pairs at the cap, the winner's pairs
        beside the plain compiled loop where they will run (``Validation.against_plain``) and the two trace runs."""
        spec = self.spec
        assert spec is not None
        p = spec.protocol
        base = spec.measured_base_config()
        plain = self.plain_loop_skipped() is None and config_hash(plain_loop_config(base)) != config_hash(base)
        return 2 * p.top_k * p.ab_rounds + (2 * p.ab_rounds if plain else 0) + (2 if p.profile_steps > 0 else 0)

    def reserved_seconds(self) -> float:
        """Device seconds the runs after the search may take at most, each at the baseline's run time (0 before
        the baseline ran)."""
        return (self._run_seconds() or 0.0) * self.runs_after_search()

    def _trial_seconds(self) -> float:
        """Device seconds the next search trial is expected to take: the median of the search trials measured to
        the end so far, else a baseline run."""
        spec = self.spec
        assert spec is not None
        walls = [t.user_attrs["wall_s"] * spec.gpus for t in self.study.get_trials(deepcopy=False)
                 if t.state == optuna.trial.TrialState.COMPLETE and isinstance(t.user_attrs.get("wall_s"), (int, float))
                 and t.user_attrs["wall_s"] > 0]
        return statistics.median(walls) if walls else (self._run_seconds() or 0.0)

    def gpu_budget_left(self) -> float | None:
        """Device seconds the search may still spend: the budget less what was spent, validation's and the traces'
        reserve, and the next trial; None without a GPU-minute budget."""
        spec = self.spec
        assert spec is not None
        minutes = spec.budget.gpu_minutes if self.gpu_budget_override is None else self.gpu_budget_override
        if minutes is None:
            return None
        return minutes * 60 - self.gpu_seconds_total() - self.reserved_seconds() - self._trial_seconds()

    def _remove_stale_attempts(self) -> None:
        """Attempt folders that a dead coordinator left (it held the lease; this one holds it now)."""
        for root in (self.study_dir / "baseline", self.study_dir / "validation", self.study_dir / "traces"):
            with contextlib.suppress(OSError):
                for p in root.iterdir():
                    if p.is_dir() and p.name.startswith(".") and not p.name.endswith(f".{self._attempt_id}"):
                        with contextlib.suppress(OSError, UnsafePathError):  # a symlink is left where it is
                            remove_tree(p)

    def run_baseline(self) -> list[float]:
        """Measure the base config ``baseline_repeats`` times (resumable); returns the throughputs."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        cfg = spec.measured_base_config()
        try:  # a model the loop cannot build, or weights that do not fit it, stop the study before any run
            if spec.trainer is None:  # (a loop of one's own builds its own model)
                workload_for(cfg)  # reads and checks the model's args (a VLA preset or the language model)
        except ConfigError as e:
            raise TuneError(f"the study's model is rejected: {e}") from None
        h = config_hash(cfg)
        stored_hash = study.user_attrs.get("baseline_config_hash")
        runs = self.baseline_runs() if stored_hash in (None, h) else []
        losses = list(study.user_attrs.get("baseline_losses", [])) if stored_hash in (None, h) else []
        phases = list(study.user_attrs.get("baseline_phases", [])) if stored_hash in (None, h) else []
        study.set_user_attr("baseline_config_hash", h)
        repeats = spec.protocol.baseline_repeats
        for i in range(len(runs), repeats):
            self._check_lease()
            out = self._measure(cfg, self.study_dir / "baseline" / str(i),
                                f"baseline {i + 1}/{repeats}", "baseline")
            if out.status != "ok" or out.value is None:
                raise TuneError(f"baseline run {i} failed ({out.status}: {out.failure_reason}); the study's base "
                                f"config must run. Log: {out.trial_dir / 'log.txt'}\n{out.log_tail}")
            runs.append(out.value)
            losses.append(window_loss(out.last_window))
            study.set_user_attr("baseline_wall_s", [*(study.user_attrs.get("baseline_wall_s") or [])[:i],
                                                    round(out.wall_s, 3)])
            study.set_user_attr("baseline_runs", runs)
            study.set_user_attr("baseline_losses", losses)  # the numerics guard's reference
            phases = [*phases[:i], (out.summary or {}).get("phase_s_per_step")]
            study.set_user_attr("baseline_phases", phases)  # the profile that leads the first proposals
            study.set_user_attr("baseline_dirs", [str(self.study_dir / "baseline" / str(j))
                                                  for j in range(len(runs))])
            self._log(f"baseline {i + 1}/{repeats}: {out.value:,.0f} tok/s/gpu")
        nf = noise_floor(runs)
        study.set_user_attr("noise_floor", nf.to_dict())
        self._log(f"noise floor: median {nf.median:,.0f} tok/s/gpu, spread {nf.rel_spread:.1%} "
                  f"(min {nf.min:,.0f}, max {nf.max:,.0f}), cv {nf.cv:.1%} over {nf.n} runs")
        if (warning := noise_warning(nf)) is not None:
            self._log(warning)
        self._record_profile(phases)
        return runs

    def _record_profile(self, phases: list[Any]) -> None:
        """The study's ``profile`` (workbench.tune.profiled), once: the base runs' phase shares and the knobs the
        startup trials hold at their base value. Not for a grid, which tries every config anyway."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        if "profile" in study.user_attrs or spec.sampler.name == "grid":
            return
        record = profile_record([spec.knob(n) for n in self.active], phase_shares(phases), spec.base_knob_values(),
                                lambda n, v: spec.space[n].contains(v, spec.knob(n).kind),
                                spec.sampler.n_startup_trials)
        study.set_user_attr("profile", record)
        if record is not None:
            self._log(profile_line(record))

    def write_lifetimes(self) -> None:
        """``lifetimes.json`` in the study directory, once per study, through the writer the Tuner was given
        (``Tuner(lifetimes=...)``: the CLI passes ``workbench.memory.lifetimes.study_lifetimes``, a layer this one
        does not import): the gradient-lifetime analysis of the base config as the baseline measures it
        (docs/memory.md), for the report's Memory section. No device and no training step: the model's graph is
        built on fake tensors, once per model (cached). One that fails costs the study one line."""
        spec = self.spec
        assert spec is not None
        if self.lifetimes is None or (self.study_dir / "lifetimes.json").exists():
            return
        if spec.trainer is not None or is_vla(spec.base_config()):
            return  # the analysis models the built-in language model: a loop of one's own, or the VLA, is not it
        try:
            line = self.lifetimes(spec.measured_base_config(), self.study_dir)
        except Exception as e:  # noqa: BLE001 - an analysis must never cost the study its measurements
            self._log(f"gradient lifetimes: not written ({type(e).__name__}: {e})")
            return
        self._log(f"gradient lifetimes: {line}")

    def keep_traces(self, winner: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """torch.profiler traces of the baseline and of the validated winner (``winner``: its trial and params;
        None when there is none, the base config being exported): ``protocol.profile_steps`` steps after the
        warm-up, each in a run of its own (``traces/baseline/``, ``traces/winner/``), since a profiled step's
        timing carries the profiler's overhead and no measured run may be profiled. Returns validation.json's
        ``traces``: {steps, baseline, winner (None without a winner)}, each {trial, run_dir, path,
        memory_snapshot, status}; a trace run that fails costs the study nothing, its entry says why (``reason``).
        None when ``profile_steps`` is 0."""
        spec = self.spec
        assert spec is not None
        n = spec.protocol.profile_steps
        if n <= 0:
            return None
        over = spec.protocol.profile_overrides()
        traces: dict[str, Any] = {"steps": n, "winner": None}
        traces["baseline"] = self._trace(merge_overrides(spec.measured_base_config(), over), "baseline", None)
        if winner is not None:
            traces["winner"] = self._trace(merge_overrides(spec.trial_config(winner["params"]), over), "winner",
                                           winner["trial"])
        return traces

    def _trace(self, cfg: Any, name: str, trial: int | None) -> dict[str, Any]:
        run_dir = self.study_dir / "traces" / name
        out = self._measure(cfg, run_dir, f"trace of the {name}", "traces")
        trace, snapshot = run_dir / "trace.json", run_dir / "memory_snapshot.pickle"
        rec: dict[str, Any] = {"trial": trial, "run_dir": str(run_dir),
                               "path": str(trace) if trace.exists() else None,
                               "memory_snapshot": str(snapshot) if snapshot.exists() else None, "status": out.status}
        if rec["path"] is None or out.status != "ok":
            rec["reason"] = out.failure_reason or "the run wrote no trace.json"
            self._log(f"trace of the {name}: none kept ({out.status}: {rec['reason']})")
        else:
            self._log(f"trace of the {name}: {trace}")
        return rec

    def _guard_numerics(self, trial: optuna.Trial, params: Mapping[str, Any], cfg: Any, out: TrialOutcome) -> None:
        """The numerics guard (workbench.tune.numerics): a trial that sets a numerics knob off its base value keeps
        status ok only if its last-window loss is within the protocol's tolerance of its twin's; else its status
        becomes ``numerics``. The check is stored as the trial's ``numerics`` user attr."""
        spec, study = self.spec, self.study
        assert spec is not None and study is not None
        base = spec.base_knob_values()
        changed = [k for k in numerics_knobs() if k in params and params[k] != base.get(k)]
        if not changed:
            return
        twin_params = {k: v for k, v in params.items() if k not in changed}
        twin_cfg = merge_overrides(cfg, {spec.knob(k).key: base.get(k) for k in changed})
        tol = spec.protocol.numerics_tolerance
        base_losses = [x for x in study.user_attrs.get("baseline_losses", []) if x is not None]
        if base_losses and data_key(twin_cfg) == data_key(spec.measured_base_config()):
            check = check_loss(window_loss(out.last_window), base_losses, tol, source="baseline")
        else:
            twins = dict(study.user_attrs.get("numerics_twins", {}))
            h = config_hash(twin_cfg)
            if h not in twins:
                self._log(f"trial {trial.number}: numerics twin ({', '.join(changed)} at base) on the same data")
                tw = self._measure(twin_cfg, out.trial_dir / "numerics-twin",
                                   f"trial {trial.number} numerics twin", "numerics")
                trial.set_user_attr("twin_wall_s", round(tw.wall_s, 3))
                if tw.status != "ok" or window_loss(tw.last_window) is None:
                    # no reference: the candidate cannot be shown to train like the base, so it cannot win
                    out.status, out.failure_reason = "numerics", (
                        f"its twin ({', '.join(changed)} at base: {twin_params}) failed ({tw.status}: "
                        f"{tw.failure_reason}), so its loss has no reference")
                    trial.set_user_attr("numerics", {"passed": False, "reference": "twin", "twin_status": tw.status})
                    return
                twins[h] = window_loss(tw.last_window)
                study.set_user_attr("numerics_twins", twins)
            check = check_loss(window_loss(out.last_window), [twins[h]], tol, source="twin")
        trial.set_user_attr("numerics", check.to_dict())
        if not check.passed:
            out.status, out.failure_reason = "numerics", f"{', '.join(f'{k}={params[k]}' for k in changed)}: " \
                + check.reason()
