"""How the tuner measures: a run of a config in its own process (the baseline repeats, validation runs and the
numerics guard's twins), each in a fresh per-attempt folder (``Measurer``), the traces it keeps of them, the
numerics guard of a search trial, and the base config's gradient lifetimes (``write_lifetimes``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna

from workbench.config import config_hash, merge_overrides
from workbench.errors import ConfigError, TuneError, UnsafePathError
from workbench.files import remove_tree
from workbench.train.workload import is_vla, workload_for
from workbench.tune.ahead import StartAhead
from workbench.tune.budget import COORDINATOR_PHASES, profile_seconds, spend
from workbench.tune.knobs import numerics_knobs
from workbench.tune.lease import Lease
from workbench.tune.numerics import (REFERENCE_RUNS, NumericsCheck, check_loss, data_key, run_loss, spread,
                                     step_distance, stored_losses)
from workbench.tune.profiled import (kernel_profile, phase_shares, profile_line, profile_record, walk_line,
                                     walk_order, walk_record)
from workbench.tune.session import StudySession
from workbench.tune.stats import noise_floor, noise_warning
from workbench.tune.trial import TrialOutcome, run_trial
from workbench.tune.validation import baseline_median

__all__ = ["Measurer", "write_lifetimes"]


class Measurer:
    """Measurements of one session outside the search trials' own runs, made while ``lease`` is held: a run that
    ends after another coordinator took the study over is not kept."""

    def __init__(self, session: StudySession, lease: Lease) -> None:
        self.session = session
        self.lease = lease
        # start-ahead (ahead.py): the run a caller says comes next, started beside the current one, held
        self.started = StartAhead(session) if StartAhead.enabled(session) else None

    def check_lease(self) -> None:
        self.lease.check()

    def on_phase(self, prefix: str) -> Callable[[str], None]:
        """A run's phase lines, shown on the progress bar after ``prefix``."""
        def on_phase(text: str) -> None:
            self.session.show(phase=f"{prefix}: {text}")
        return on_phase

    def attempt_dir(self, run_dir: Path) -> Path:
        """This process's own folder for the run of ``run_dir``."""
        return run_dir.with_name(f".{run_dir.name}.{self.session.attempt_id}")

    def measure(self, cfg: Any, run_dir: Path, prefix: str, phase: str,
                then: tuple[Any, Path] | None = None) -> TrialOutcome:
        """A measurement outside the search trials (baseline, validation, numerics twin): run into this
        process's own attempt folder ``.<name>.<attempt>`` beside ``run_dir``, then, if this coordinator still
        holds the study, move it into place; so no two processes ever write one folder, and a folder in place is a
        finished run. Its device seconds count to ``phase`` (one of ``budget.GPU_PHASES``; a twin's are its
        trial's). ``then``: the run expected next (its config and ``run_dir``), whose process starts beside this
        one, held at its gate, where start-ahead is on; this run takes the one held for it, and any other held
        process is stopped (the expectation was wrong: the run that came is not it)."""
        s = self.session
        attempt = self.attempt_dir(run_dir)
        held = None
        if self.started is not None:
            held = self.started.take(attempt, config_hash(cfg))
            self.started.stop()

        def on_launch(pgid: int) -> None:
            if then is not None and self.started is not None:
                nxt = self.attempt_dir(then[1])
                self.started.start(nxt, then[0], config_hash(then[0]), nxt)

        out = run_trial(cfg, attempt, timeout_s=s.spec.protocol.trial_timeout_s,
                        heartbeat_timeout_s=s.spec.protocol.heartbeat_timeout_s, on_phase=self.on_phase(prefix),
                        on_launch=on_launch, launch=s.launch, env=s.child_env(), cwd=s.child_cwd(), held=held)
        if phase in COORDINATOR_PHASES:
            spend(s, phase, out.wall_s)
        if phase == "validation":
            s.ran_after_search()
        self.lease.check()  # a coordinator whose study was taken over keeps nothing
        remove_tree(run_dir)
        attempt.rename(run_dir)
        out.trial_dir = run_dir
        out.config_path = run_dir / "config.yaml" if out.config_path is not None else None
        return out

    def stop_held(self) -> None:
        """Stop the process held for a run that will not come (the measurements are over)."""
        if self.started is not None:
            self.started.stop()

    def remove_stale_attempts(self) -> None:
        """Attempt folders that a dead coordinator left (it held the lease; this one holds it now); ``traces/``
        held the trace runs of studies before traces were folded into measured runs."""
        study_dir, mine = self.session.study_dir, f".{self.session.attempt_id}"
        for root in (study_dir / "baseline", study_dir / "validation", study_dir / "traces"):
            with contextlib.suppress(OSError):
                for p in root.iterdir():
                    if p.is_dir() and p.name.startswith(".") and not p.name.endswith(mine):
                        with contextlib.suppress(OSError, UnsafePathError):  # a symlink is left where it is
                            remove_tree(p)

    def run_baseline(self) -> list[float]:
        """Measure the base config ``baseline_repeats`` times (resumable); returns the throughputs. The last repeat
        profiles ``protocol.profile_steps`` steps after its measurement: the base config's trace where no A/B pair
        gives one (no winner; ``keep_traces``). Its figures are those of the run without them; their device time
        counts to the baseline's."""
        spec, study = self.session.spec, self.session.study
        cfg = spec.measured_base_config()
        try:  # a model the loop cannot build, or weights that do not fit it, stop the study before any run
            if spec.trainer is None:  # (a loop of one's own builds its own model)
                workload_for(cfg)  # reads and checks the model's args (a VLA preset or the language model)
        except ConfigError as e:
            raise TuneError(f"the study's model is rejected: {e}") from None
        h = config_hash(cfg)
        stored_hash = study.user_attrs.get("baseline_config_hash")
        same = stored_hash in (None, h)  # a changed base keeps none of the stored repeats

        def kept(key: str) -> list:
            return list(study.user_attrs.get(key, [])) if same else []

        runs = self.session.baseline_runs() if same else []
        losses, step_losses, phases = kept("baseline_losses"), kept("baseline_step_losses"), kept("baseline_phases")
        study.set_user_attr("baseline_config_hash", h)
        if not same:
            study.set_user_attr("baseline_profile_s", None)
            study.set_user_attr("baseline_kernels", None)
        repeats = spec.protocol.baseline_repeats
        profile = spec.protocol.profile_after_overrides()

        def repeat(i: int) -> tuple[Any, Path]:  # the last repeat profiles after its measurement
            return (merge_overrides(cfg, profile) if profile and i == repeats - 1 else cfg,
                    self.session.study_dir / "baseline" / str(i))

        for i in range(len(runs), repeats):
            self.lease.check()
            out = self.measure(*repeat(i), f"baseline {i + 1}/{repeats}", "baseline",
                               then=repeat(i + 1) if i + 1 < repeats else None)
            if out.status != "ok" or out.value is None:
                raise TuneError(f"baseline run {i} failed ({out.status}: {out.failure_reason}); the study's base "
                                f"config must run. Log: {out.trial_dir / 'log.txt'}\n{out.log_tail}")
            runs.append(out.value)
            losses.append(run_loss(out.step_losses))
            study.set_user_attr("baseline_wall_s", [*(study.user_attrs.get("baseline_wall_s") or [])[:i],
                                                    round(out.wall_s, 3)])
            if profile and i == repeats - 1:  # the seconds its profiled steps added (budget.run_seconds)
                study.set_user_attr("baseline_profile_s", profile_seconds(out))
            study.set_user_attr("baseline_runs", runs)
            study.set_user_attr("baseline_losses", losses)  # the numerics guard's reference
            step_losses = [*step_losses[:i], stored_losses(out.step_losses)]
            study.set_user_attr("baseline_step_losses", step_losses)  # (a replay of the guard reads these)
            phases = [*phases[:i], (out.summary or {}).get("phase_s_per_step")]
            study.set_user_attr("baseline_phases", phases)  # the profile that leads the first proposals
            if profile and i == repeats - 1:  # its device time by kernel kind orders the cold walk's knobs
                study.set_user_attr("baseline_kernels", kernel_profile(out.summary))
            study.set_user_attr("baseline_dirs", [str(self.session.study_dir / "baseline" / str(j))
                                                  for j in range(len(runs))])
            self.session.log(f"baseline {i + 1}/{repeats}: {out.value:,.0f} tok/s/gpu")
        nf = noise_floor(runs)
        study.set_user_attr("noise_floor", nf.to_dict())
        self.session.log(f"noise floor: median {nf.median:,.0f} tok/s/gpu, spread {nf.rel_spread:.1%} "
                         f"(min {nf.min:,.0f}, max {nf.max:,.0f}), cv {nf.cv:.1%} over {nf.n} runs")
        if (warning := noise_warning(nf)) is not None:
            self.session.log(warning)
        self.record_profile(phases)
        self.record_walk()
        return runs

    def record_profile(self, phases: list[Any]) -> None:
        """The study's ``profile`` (workbench.tune.profiled), once: the base runs' phase shares and the knobs the
        startup trials hold at their base value. Not for a grid, which tries every config anyway."""
        spec, study = self.session.spec, self.session.study
        if "profile" in study.user_attrs or spec.sampler.name == "grid":
            return
        record = profile_record([spec.knob(n) for n in self.session.active], phase_shares(phases),
                                spec.base_knob_values(), lambda n, v: spec.space[n].contains(v, spec.knob(n).kind),
                                spec.sampler.n_startup_trials, study.user_attrs.get("baseline_kernels"))
        study.set_user_attr("profile", record)
        if record is not None:
            self.session.log(profile_line(record))

    def record_walk(self) -> None:
        """The study's ``walk`` (workbench.tune.profiled), once: the knobs a cold start walks from the base config,
        in the profile's ``walk_order`` (the largest reach in the base step's kernel profile first, else the
        heaviest), those the profile holds left out; None where the study does not walk
        (``sampler.startup: random``, a grid or nsga2, several objectives, a warm start holding values)."""
        spec, study = self.session.spec, self.session.study
        if "walk" in study.user_attrs:
            return
        warm = study.user_attrs.get("warm_start")
        if spec.sampler.startup != "walk" or spec.sampler.name in ("grid", "nsga2") \
                or spec.objective.multi_objective or (isinstance(warm, dict) and warm.get("params")):
            study.set_user_attr("walk", None)
            return
        profile = study.user_attrs.get("profile") or {}
        held = profile.get("held") or {}
        order = walk_order(profile) or spec.knob_order()
        base = spec.base_knob_values()
        knobs = [n for n in order if n in self.session.active and n not in held
                 and len(spec.space[n].choices or []) > 1]
        defaults, measured = {}, {}
        environ = {**os.environ, **self.session.child_env()}  # a trial's: what an unset key runs with
        for name in self.session.active:
            knob = spec.knob(name)
            rng, value = spec.space[name], base.get(name)
            if value is None and knob.unset is not None:
                value = knob.unset(environ)
            if value is not None and rng.contains(value, knob.kind):
                defaults[name] = measured[name] = value
            elif rng.choices:
                defaults[name] = rng.choices[0]
        start, active = spec.searched_params(defaults, self.session.active), self.session.active
        reach = {w["knob"]: w["reach"] for w in profile.get("weights") or [] if "reach" in w}
        record = walk_record(knobs, {n: spec.space[n].choices for n in knobs}, defaults, start,
                             baseline_median(self.session), start == spec.searched_params(measured, active), reach)
        study.set_user_attr("walk", record)
        if knobs:
            self.session.log(walk_line(record, spec.sampler.n_startup_trials))

    def _cannot_be_validated(self, out: TrialOutcome) -> str:
        """Why a measured trial can never be a candidate (``validation.baseline_median``, the bar
        ``validation.candidates`` sets), or '' where it can."""
        median = baseline_median(self.session)
        if out.value is None or out.value > median:
            return ""
        return (f"its {out.value:,.0f} tok/s/gpu is not above the baseline median {median:,.0f}, so it cannot be "
                "validated and its loss decides nothing")

    def keep_traces(self, winner: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """torch.profiler traces of the baseline and of the validated winner (``winner``: its validation record,
        with its pairs' ``run_dirs`` and ``baseline_dirs``; None when there is none, the base config being
        exported): ``protocol.profile_steps`` steps profiled after the measurement of runs made anyway, so no
        run is made for them and no measured figure carries the profiler's overhead. The winner's and the base
        config's come from the winner's profiled A/B pair (``validation.ab_pairs``: its first to complete),
        whose device time counts to the validation's; without a winner the base config's from the last
        baseline repeat (``run_baseline``). Returns validation.json's ``traces``: {steps, baseline, winner (None
        without a winner)}, each {trial, run_dir, path, memory_snapshot, status}, with the ``reason`` where the
        run holds no trace (a study measured before traces were folded, a loop that ran no step after its
        measurement); a missing trace costs the study nothing. None when ``profile_steps`` is 0."""
        spec = self.session.spec
        n = spec.protocol.profile_steps
        if n <= 0:
            return None
        traces: dict[str, Any] = {"steps": n, "winner": None}
        if winner is None:
            traces["baseline"] = self.trace_record(self.session.last_baseline_dir(), "baseline", None)
            return traces
        pairs = list(zip(winner["baseline_dirs"], winner["run_dirs"]))
        base_dir, run_dir = next(((b, r) for b, r in pairs if (Path(r) / "trace.json").exists()),
                                 pairs[0] if pairs else (None, None))
        if base_dir is None or not (Path(base_dir) / "trace.json").exists():
            base_dir = self.session.base_trace_dir() or base_dir  # its pair profiled the arm alone (base_traced)
        traces["baseline"] = self.trace_record(base_dir, "baseline", None)
        traces["winner"] = self.trace_record(run_dir, "winner", winner["trial"])
        return traces

    def trace_record(self, run_dir: str | Path | None, name: str, trial: int | None) -> dict[str, Any]:
        """The trace record of a measured run (``run_dir``; None: no completed run) as the ``name``'s."""
        rec: dict[str, Any] = {"trial": trial, "run_dir": str(run_dir) if run_dir is not None else None,
                               "path": None, "memory_snapshot": None, "status": "ok" if run_dir else "missing"}
        if run_dir is not None:
            trace, snapshot = Path(run_dir) / "trace.json", Path(run_dir) / "memory_snapshot.pickle"
            rec["path"] = str(trace) if trace.exists() else None
            rec["memory_snapshot"] = str(snapshot) if snapshot.exists() else None
        if rec["path"] is None:
            rec["reason"] = "the run holds no trace.json (measured unprofiled, or its loop ran no step after its " \
                "measurement)" if run_dir is not None else "no completed run"
            if error := _profile_error(run_dir):
                rec["reason"] = f"its profiled steps failed after the measurement: {error}"
            self.session.log(f"trace of the {name}: none kept ({rec['reason']})")
        else:
            self.session.log(f"trace of the {name}: {rec['path']}")
        return rec

    def searched_twin(self, twin_cfg: Any, steps: int) -> tuple[int, list] | None:
        """A search trial that ran ``twin_cfg`` itself (its config hash) and measured at least ``steps`` steps, all
        finite: (its number, its stored step losses), which stand for a twin run (the same config on the same
        data draws the same numbers); None where none did."""
        done = self.session.trials((optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
        return _searched_twin_steps(done, config_hash(twin_cfg), steps)

    def guard_numerics(self, trial: optuna.Trial, params: Mapping[str, Any], cfg: Any, out: TrialOutcome) -> None:
        """The numerics guard (workbench.tune.numerics): a trial that sets a numerics knob off its base value keeps
        status ok only if its step losses lie within the tolerance of its reference's, step by step
        (``numerics.step_distance``; the median step losses where the reference's steps are not stored), the
        protocol's tolerance or twice the baseline repeats' spread where larger (``numerics.check_loss``); else its
        status becomes ``numerics``. The reference is the baseline where the trial trains on its tokens, else the
        trial's twin (its config with the numerics knobs at base), run once per data path (``data_key``: the study
        attr ``numerics_twins``). A check that fails against fewer than ``REFERENCE_RUNS`` reference runs is made
        again after one more run of the reference (``_rerun_reference``). The check is stored as the trial's
        ``numerics`` user attr."""
        spec, study = self.session.spec, self.session.study
        base = spec.base_knob_values()
        changed = [k for k in numerics_knobs() if k in params and params[k] != base.get(k)]
        if not changed:
            return
        twin_params = {k: v for k, v in params.items() if k not in changed}
        twin_cfg = merge_overrides(cfg, {spec.knob(k).key: base.get(k) for k in changed})
        h = data_key(twin_cfg)
        base_losses = [x for x in study.user_attrs.get("baseline_losses", []) if x is not None]
        if base_losses and h == data_key(spec.measured_base_config()):
            ref_cfg, source, losses = spec.measured_base_config(), "baseline", base_losses
            steps = list(study.user_attrs.get("baseline_step_losses") or [])
        else:
            # one twin a data path: a twin's numerics knobs are at base and the others do not change the numbers,
            # so a later trial on the same tokens is checked against the same twin
            twins = dict(study.user_attrs.get("numerics_twins", {}))
            if h not in twins and (why := self._cannot_be_validated(out)):
                trial.set_user_attr("numerics_skipped", why)
                self.session.log(f"trial {trial.number}: no numerics twin ({why})")
                return
            if h not in twins and (known := self.searched_twin(twin_cfg, len(out.step_losses))) is not None:
                number, known_steps = known  # the twin's config ran as a search trial: its steps are the reference
                self.session.log(f"trial {trial.number}: its numerics twin ({', '.join(changed)} at base) is "
                                 f"trial {number}, measured on the same data")
                twins[h] = run_loss([float(x) for x in known_steps])
                study.set_user_attr("numerics_twins", twins)
                study.set_user_attr("numerics_twin_steps", {**study.user_attrs.get("numerics_twin_steps", {}),
                                                            h: known_steps})
            if h not in twins:
                self.session.log(f"trial {trial.number}: numerics twin ({', '.join(changed)} at base) on the same "
                                 "data")
                tw = self.measure(twin_cfg, out.trial_dir / "numerics-twin", f"trial {trial.number} numerics twin",
                                  "numerics")
                trial.set_user_attr("twin_wall_s", round(tw.wall_s, 3))
                if tw.status != "ok" or run_loss(tw.step_losses) is None:
                    # no reference: the candidate cannot be shown to train like the base, so it cannot win
                    out.status, out.failure_reason = "numerics", (
                        f"its twin ({', '.join(changed)} at base: {twin_params}) failed ({tw.status}: "
                        f"{tw.failure_reason}), so its loss has no reference")
                    trial.set_user_attr("numerics", {"passed": False, "reference": "twin", "twin_status": tw.status})
                    return
                twins[h] = run_loss(tw.step_losses)
                study.set_user_attr("numerics_twins", twins)
                study.set_user_attr("numerics_twin_steps", {**study.user_attrs.get("numerics_twin_steps", {}),
                                                            h: stored_losses(tw.step_losses)})
            twin_steps = (study.user_attrs.get("numerics_twin_steps") or {}).get(h)
            ref_cfg, source, losses, steps = twin_cfg, "twin", [twins[h]], [twin_steps] if twin_steps else []
        noise = spread(base_losses)  # the tolerance is widened by the baseline repeats' spread alone
        check = self._check_numerics(out, losses, steps, h, source, noise)
        if not check.passed and math.isfinite(check.rel_diff) and check.reference_runs < REFERENCE_RUNS \
                and not self._cannot_be_validated(out) and self._rerun_reference(trial, ref_cfg, out, h, source):
            check = self._check_numerics(out, losses, steps, h, source, noise)
        trial.set_user_attr("numerics", check.to_dict())
        if not check.passed:
            out.status, out.failure_reason = "numerics", f"{', '.join(f'{k}={params[k]}' for k in changed)}: " \
                + check.reason()

    def _check_numerics(self, out: TrialOutcome, losses: list[float], steps: list[list], h: str,
                        source: str, noise: float) -> NumericsCheck:
        """The guard's check of ``out`` against its reference's runs: ``losses`` and ``steps`` (the baseline
        repeats' or the twin's) and the reference's reruns on data path ``h`` (the study attr
        ``numerics_reruns``); the tolerance widened by ``noise``."""
        study = self.session.study
        extra = [list(r) for r in (study.user_attrs.get("numerics_reruns") or {}).get(h, [])]
        refs = [*losses, *(run_loss([float(x) for x in r]) for r in extra)]
        runs = [*steps, *extra] if steps else []
        return check_loss(run_loss(out.step_losses), refs, self.session.spec.protocol.numerics_tolerance,
                          source=source, noise=noise,
                          distance=step_distance(out.step_losses, runs) if runs else None)

    def _rerun_reference(self, trial: optuna.Trial, ref_cfg: Any, out: TrialOutcome, h: str, source: str) -> bool:
        """Run the guard's reference config once more on data path ``h`` and store its step losses in the study
        attr ``numerics_reruns`` (the module doc of workbench.tune.numerics, "One reference run"); its device
        seconds are the trial's ``rerun_wall_s``. Whether it gave finite losses."""
        study = self.session.study
        self.session.log(f"trial {trial.number}: its loss is off the {source}'s one run; the {source} runs once "
                         "more on the same data")
        rr = self.measure(ref_cfg, out.trial_dir / "numerics-rerun", f"trial {trial.number} numerics rerun",
                          "numerics")
        trial.set_user_attr("rerun_wall_s", round(rr.wall_s, 3))
        loss = run_loss(rr.step_losses)
        if rr.status != "ok" or loss is None or not math.isfinite(loss):
            trial.set_user_attr("numerics_rerun", f"{rr.status}: {rr.failure_reason}")
            return False
        reruns = dict(study.user_attrs.get("numerics_reruns") or {})
        reruns[h] = [*reruns.get(h, []), stored_losses(rr.step_losses)]
        study.set_user_attr("numerics_reruns", reruns)
        return True


def _searched_twin_steps(trials: list[optuna.trial.FrozenTrial], h: str, steps: int) -> tuple[int, list] | None:
    """(number, stored step losses) of the earliest finished search trial of config hash ``h`` that measured at
    least ``steps`` steps, all of them finite; None where none did."""
    for t in trials:
        losses = t.user_attrs.get("step_losses") or []
        if t.user_attrs.get("config_hash") == h and t.user_attrs.get("status") in ("ok", "pruned") \
                and len(losses) >= max(steps, 1) and all(isinstance(x, (int, float)) for x in losses):
            return t.number, list(losses)
    return None


def write_lifetimes(session: StudySession, writer: Callable[[Any, Path], str] | None) -> None:
    """``lifetimes.json`` in the study directory, once per study, through the writer the Tuner was given
    (``Tuner(lifetimes=...)``: the CLI passes ``workbench.memory.lifetimes.study_lifetimes``, a layer this one
    does not import; None writes none): the gradient-lifetime analysis of the base config as the baseline
    measures it (docs/memory.md), for the report's Memory section. No device and no training step: the model's
    graph is built on fake tensors, once per model (cached). One that fails costs the study one line."""
    spec = session.spec
    if writer is None or (session.study_dir / "lifetimes.json").exists():
        return
    if spec.trainer is not None or is_vla(spec.base_config()):
        return  # the analysis models the built-in language model: a loop of one's own, or the VLA, is not it
    try:
        line = writer(spec.measured_base_config(), session.study_dir)
    except Exception as e:  # noqa: BLE001 - an analysis must never cost the study its measurements
        session.log(f"gradient lifetimes: not written ({type(e).__name__}: {e})")
        return
    session.log(f"gradient lifetimes: {line}")


def _profile_error(run_dir: str | Path | None) -> str | None:
    """The ``profile/error`` of a run's summary.json (its profiled steps failed after the measurement), or None."""
    if run_dir is None:
        return None
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    error = summary.get("profile/error") if isinstance(summary, dict) else None
    return error if isinstance(error, str) else None
