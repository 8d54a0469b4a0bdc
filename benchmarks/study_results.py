"""A tuner study as a long-format results CSV for benchmarks/results/: one row per trial (search, baseline and
validation runs) and metric, with the configuration, the study, the GPU and versions, and the time.

    python benchmarks/study_results.py runs/<study> [runs/<study2> ...] --out benchmarks/results/NAME.csv
        [--storage URL]  # a study tuned with --storage URL (one storage shared by studies)

Reads what ``workbench.tune`` leaves in a study directory: ``study.db`` (or ``--storage``: every search trial,
its status and summary), ``validation.json`` (the A/B pairs and the winner's interval; without it, tune.json's
result and the study's stored pairs), ``environment.json`` and ``tune.json``.
Metrics per search trial: the objective (tokens/s/GPU, the median window), each measured window's (with the
compile-ahead twins compiling as it was read), the summary's throughput, MFU, step time, compile seconds and
cache hits, device seconds (``time/trial_wall_s``, the baseline's runs too) and a compile-ahead twin's figures,
peak reserved memory, seconds per step of each phase and the numerics
guard's check; the baseline's last-window loss; per study its GPU-minutes by phase and its screening record
(configs a GPU-minute); a failed trial gets ``status`` and ``failure_reason`` in its row's ``note`` and
objective 0, as the sampler was told.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import optuna
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workbench.tune.samplers import infeasible  # noqa: E402
from workbench.vocab import (COMPILE_S, MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, PREDICTED_PEAK_GIB, REAL_TOKENS_PER_S,
                             STEP_S)

SUMMARY_METRICS = (REAL_TOKENS_PER_S, "mfu_pct", STEP_S, COMPILE_S,
                   MAX_RESERVED_GIB, MAX_ALLOCATED_GIB, PREDICTED_PEAK_GIB)
CACHE_METRICS = ("compile/fx_graph_cache_hit", "compile/fx_graph_cache_miss", "compile/aot_autograd_cache_hit",
                 "compile/aot_autograd_cache_miss")


def study_rows(d: Path, storage: str | None = None) -> list[dict]:
    tune = json.loads((d / "tune.json").read_text())
    env = json.loads((d / "environment.json").read_text()) if (d / "environment.json").exists() else {}
    versions = tune["hardware"].get("versions") or {}  # (tune.json of 2026-12-07 on: without environment.json)
    common = {"study": tune["study_name"], "gpu": env.get("gpu") or tune["hardware"].get("gpu"),
              **{k: env.get(k) or versions.get(k) for k in ("torch", "triton", "cuda")},
              "timestamp": tune.get("finished") or tune.get("started")}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=tune["study_name"],
                              storage=storage or f"sqlite:///{(d / 'study.db').resolve()}")
    rows = []
    for t in study.trials:
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) and not infeasible(t):
            continue
        attrs = t.user_attrs
        config = " ".join(f"{k}={v}" for k, v in t.params.items())
        note = attrs.get("status", t.state.name.lower())
        if attrs.get("failure_reason"):
            note += f": {attrs['failure_reason'].splitlines()[0][:160]}"
        base = {**common, "phase": "search", "trial": t.number, "config": config, "note": note}
        # a failed config (FAIL in the study) as its sampler learns it: objective 0
        value = 0.0 if infeasible(t) else t.value
        rows.append({**base, "metric": "objective/tokens_per_s_per_gpu", "value": value})
        summary = attrs.get("summary") or {}
        rows += [{**base, "metric": m, "value": summary[m]} for m in SUMMARY_METRICS if summary.get(m) is not None]
        # the compile-ahead twins alive as each was read (compiling beside it before 6b2a494, stopped since)
        beside = attrs.get("windows_beside_twins") or []
        rows += [{**base, "metric": "window/tokens_per_s_per_gpu", "value": w,
                  "note": f"{note}; window {i}" + (f", {beside[i]} twin(s) beside" if i < len(beside) else "")}
                 for i, (_, w) in enumerate(sorted(t.intermediate_values.items()))]  # (as told to the pruner)
        rows += [{**base, "metric": f"time/{ph}_s_per_step", "value": v}
                 for ph, v in (summary.get("phase_s_per_step") or {}).items() if v is not None]
        rows += [{**base, "metric": m, "value": summary[m]} for m in CACHE_METRICS if summary.get(m) is not None]
        if isinstance(attrs.get("wall_s"), (int, float)):  # the trial's device seconds (0: refused without a run)
            rows.append({**base, "metric": "time/trial_wall_s", "value": attrs["wall_s"]})
        tl = attrs.get("timeline") or {}  # the watchdog's marks: seconds after the launch (workbench.tune.trial)
        rows += [{**base, "metric": f"timeline/{k}" + ("" if k.endswith("_s") else "_s"), "value": v}
                 for k, v in tl.items() if isinstance(v, (int, float))]
        ahead = attrs.get("compile_ahead") or {}  # its twin's compile, run while the trial before it ran
        rows += [{**base, "metric": f"compile_ahead/{k}", "value": ahead[k], "note": f"twin {ahead.get('status')}"}
                 for k in ("wall_s", COMPILE_S, "waited_s", "paused_s") if isinstance(ahead.get(k), (int, float))]
        held = attrs.get("start_ahead") or {}  # its process, started while the trial before it ran
        rows += [{**base, "metric": f"start_ahead/{k}", "value": held[k], "note": "from the launch"}
                 for k in ("held_s", "ready_s") if isinstance(held.get(k), (int, float))]
        check = attrs.get("numerics") or {}  # the numerics guard's check of a trial that changed FP8
        rows += [{**base, "metric": f"numerics/{k}", "value": check[k]} for k in ("loss", "reference_loss",
                                                                                  "rel_diff", "tolerance")
                 if isinstance(check.get(k), (int, float))]
    if tune.get("sessions"):  # the coordinator's wall time, baseline to report, summed over resumed calls
        n = len(tune["sessions"])
        rows.append({**common, "phase": "study", "trial": "", "config": "",
                     "note": f"tune.json wall_s: {n} coordinator session(s)", "metric": "time/study_wall_s",
                     "value": tune["wall_s"]})
    elif tune.get("started") and tune.get("finished"):  # a tune.json from before sessions were recorded
        import datetime as dt

        wall = (dt.datetime.fromisoformat(tune["finished"]) - dt.datetime.fromisoformat(tune["started"])).total_seconds()
        rows.append({**common, "phase": "study", "trial": "", "config": "", "note": "tune.json started..finished",
                     "metric": "time/study_wall_s", "value": wall})
    gpu = tune.get("gpu_minutes") or {}  # device minutes by phase, against the study's budget
    for phase, minutes in (gpu.get("by_phase") or {}).items():
        rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": f"gpu_minutes/{phase}",
                     "value": minutes, "note": f"budget {gpu.get('budget')} GPU-minutes"})
    if gpu.get("total") is not None:
        rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": "gpu_minutes/total",
                     "value": gpu["total"], "note": f"budget {gpu.get('budget')} GPU-minutes"})
    screening = tune.get("screening") or {}
    for key in ("configs_evaluated", "configs_per_gpu_minute", "refused_without_run"):
        if screening.get(key) is not None:
            stages = ", ".join(f"{s['trials']} at {s['windows']} window(s)" for s in screening.get("stages") or [])
            rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": f"screening/{key}",
                         "value": screening[key], "note": f"pruner {screening.get('pruner')}: {stages}"})
    sec = screening.get("screen_seconds") or {}  # medians over the search trials' timelines
    for key in ("before_first_step", "compile", "stepping", "after_last_window", "total"):
        if isinstance(sec.get(key), (int, float)):
            rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": f"screen_seconds/{key}",
                         "value": sec[key], "note": f"median over {sec.get('trials')} search trials"})
    ahead = screening.get("compile_ahead") or {}
    for key in ("twins", "finished", "waited_s", "paused_s", "median_compile_s_after_twin",
                "median_compile_s_without"):
        if isinstance(ahead.get(key), (int, float)):
            rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": f"compile_ahead/{key}",
                         "value": ahead[key], "note": f"{ahead.get('asked_ahead')} asked ahead"})
    if isinstance(beside := ahead.get("windows_beside_twins"), dict):
        rows.append({**common, "phase": "study", "trial": "", "config": "",
                     "metric": "compile_ahead/windows_beside_twins", "value": beside.get("beside"),
                     "note": f"of {beside.get('of')} windows the search measured"})
    held = screening.get("start_ahead") or {}
    for key in ("held", "ready_at_gate", "median_ready_s", "waited_s"):
        if isinstance(held.get(key), (int, float)):
            rows.append({**common, "phase": "study", "trial": "", "config": "", "metric": f"start_ahead/{key}",
                         "value": held[key], "note": "trials run from a held process"})
    walls = study.user_attrs.get("baseline_wall_s") or []
    for i, wall in enumerate(walls):
        rows.append({**common, "phase": "baseline", "trial": i, "config": "study base", "note": "",
                     "metric": "time/trial_wall_s", "value": wall})
    profiled = study.user_attrs.get("baseline_profile_s")
    if walls and isinstance(profiled, (int, float)):  # the last repeat's steps profiled after its measurement
        rows.append({**common, "phase": "baseline", "trial": len(walls) - 1, "config": "study base",
                     "note": "of its wall", "metric": "time/profile_s", "value": profiled})
    val = d / "validation.json"
    v = json.loads(val.read_text()) if val.exists() else _validation_from_storage(tune, study)
    if v:
        losses = study.user_attrs.get("baseline_losses") or []
        for i, x in enumerate(v.get("baseline_runs", [])):
            rows.append({**common, "phase": "baseline", "trial": i, "config": "study base", "note": "",
                         "metric": "objective/tokens_per_s_per_gpu", "value": x})
            if i < len(losses) and losses[i] is not None:  # the last window's mean loss: the guard's reference
                rows.append({**common, "phase": "baseline", "trial": i, "config": "study base", "note": "",
                             "metric": "loss/last_window_mean", "value": losses[i]})
        for c in v.get("candidates", []):
            config = " ".join(f"{k}={val_}" for k, val_ in c.get("params", {}).items())
            base = {**common, "phase": "validation", "trial": c.get("trial"), "config": config,
                    "note": f"{v.get('method')}, {v.get('confidence')} confidence, {len(c.get('ratios') or [])} A/B "
                            f"pairs (at most {v.get('ab_rounds')})"}
            for key in ("speedup_median", "ci_low", "ci_high"):
                if c.get(key) is not None:
                    rows.append({**base, "metric": f"validation/{key}", "value": c[key]})
            for i, (x, y) in enumerate(zip(c.get("runs", []), c.get("baseline_runs", []))):
                rows.append({**base, "metric": f"validation/pair{i}_candidate_tokens_per_s", "value": x})
                rows.append({**base, "metric": f"validation/pair{i}_baseline_tokens_per_s", "value": y})
            for f in c.get("failures") or []:  # a pair with a run that failed: its round, and why
                rows.append({**base, "metric": "validation/failed_pair_round", "value": f.get("round"),
                             "note": f"baseline {f.get('baseline')}, candidate {f.get('candidate')}"
                                     + (", profiled" if f.get("profiled") else "") + f": {f.get('reason')}"[:300]})
    return rows


def _validation_from_storage(tune: dict, study: optuna.Study) -> dict | None:
    """validation.json's fields these rows read, where a copy of the study holds tune.json and study.db only:
    the candidates' intervals from tune.json's result, their pairs from the study attr ``ab_pairs`` (keyed
    ``validation/<trial>-<round>``, [baseline, candidate] tokens/s)."""
    result, pairs = tune.get("result") or {}, study.user_attrs.get("ab_pairs") or {}
    if not result:  # (a study stopped before its result)
        return None
    protocol = result.get("protocol") or {}
    cands = []
    for c in result.get("candidates") or []:  # (none: the baseline repeats alone, as validation.json has them)
        runs = sorted((int(k.rsplit("-", 1)[1]), p["values"]) for k, p in pairs.items()
                      if k.startswith(f"validation/{c.get('trial')}-"))
        cands.append({"trial": c.get("trial"), "params": c.get("params") or {}, "speedup_median": c.get("speedup"),
                      "ci_low": c.get("ci_low"), "ci_high": c.get("ci_high"), "ratios": [b / a for _, (a, b) in runs],
                      "runs": [b for _, (_, b) in runs], "baseline_runs": [a for _, (a, _) in runs]})
    return {"method": protocol.get("method"), "confidence": protocol.get("confidence"),
            "ab_rounds": protocol.get("max_pairs"), "candidates": cands,
            "baseline_runs": study.user_attrs.get("baseline_runs") or []}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("studies", nargs="+", help="study directories (runs/<study>)")
    p.add_argument("--out", required=True)
    p.add_argument("--storage", help="the Optuna storage URL the studies were tuned with (default: each study "
                                     "directory's study.db)")
    a = p.parse_args(argv)
    rows = []
    for s in a.studies:
        d = Path(s)
        if not (d / "tune.json").exists():
            sys.exit(f"study_results: {d}: no tune.json (expected a study directory written by workbench.tune)")
        rows += study_rows(d, a.storage)
    df = pd.DataFrame(rows, columns=["study", "phase", "trial", "config", "metric", "value", "note", "gpu",
                                     "torch", "triton", "cuda", "timestamp"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out, index=False)
    obj = df[df["metric"] == "objective/tokens_per_s_per_gpu"]
    print(obj.groupby(["study", "phase"])["value"].agg(["count", "median", "max"]).to_string())


if __name__ == "__main__":
    main()
