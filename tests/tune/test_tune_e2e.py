"""A real tiny study end to end through the CLI: baseline, search, A/B validation, export, report;
the exported config runs with the train CLI and reproduces the measured throughput."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from workbench.config import load_config
from workbench.tune.result import result_headline
from workbench.tune.trial import STATUSES


def test_tiny_study_end_to_end(study_spec_file, tmp_path, subprocess_env):
    # the GP sampler after one random trial: trials 1 and 2 are proposed by workbench.tune.samplers.OrdinalGPSampler
    # from the study's SQLite storage (its ordered view of micro-batch, the constraints every trial carries)
    spec_path = study_spec_file("e2e", trials=3, sampler={"name": "gp", "seed": 0, "n_startup_trials": 1})
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec_path), "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sdir = out / "e2e"
    assert "noise floor: median" in proc.stderr
    # each search line carries the noise floor beside its ratio to the baseline
    assert re.search(r"x the baseline median \(one search run; noise floor \d+%\)", proc.stderr), proc.stderr
    assert any(v in proc.stdout for v in ("winner: trial #", "no significant gain", "no candidate beat"))
    tune, study, counted = _check_tune_json_and_trials(proc, sdir)
    val, w = _check_validation(sdir)
    cfg, prov = _check_export(proc, sdir, study, w)
    result = _check_one_result(proc, sdir, tune, prov)
    _check_the_export_reproduces(tmp_path, subprocess_env, sdir, tune, prov)
    _check_subcommands(tmp_path, subprocess_env, spec_path, out, sdir, prov, result)
    _check_results_csv(tmp_path, subprocess_env, sdir, counted, val, w)


def _check_tune_json_and_trials(proc, sdir):
    # tune.json: the contract the report reads
    tune = json.loads((sdir / "tune.json").read_text())
    assert set(tune) >= {"study_name", "storage_url", "spec", "dropped_knobs", "hardware", "noise_floor",
                         "started", "finished", "sessions", "wall_s"}
    assert len(tune["sessions"]) == 1 and tune["sessions"][0]["finished"] == tune["finished"]
    assert tune["finished"] and tune["spec"]["name"] == "e2e" and tune["noise_floor"]["n"] == 2
    assert tune["noise_floor"]["runs"] == json.loads((sdir / "validation.json").read_text())["baseline_runs"]
    assert tune["storage_url"] == f"sqlite:///{(sdir / 'study.db').resolve()}"

    # every trial: status, log tail, config, dir, summary, constraint
    study = optuna.load_study(study_name="e2e", storage=tune["storage_url"])
    trials = study.get_trials()
    counted = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(counted) == 3
    for t in counted:
        ua = t.user_attrs
        assert ua["status"] in STATUSES
        assert set(ua) >= {"status", "failure_reason", "log_tail", "config_path", "trial_dir", "summary",
                           "constraint"}
        assert ua["trial_dir"] == str(sdir / "trials" / str(t.number))
        assert (sdir / "trials" / str(t.number) / "log.txt").exists()
        if ua["status"] == "ok":
            assert ua["constraint"] == [0.0, 0.0, 0.0] and t.values[0] > 0
            assert ua["summary"]["throughput/real_tokens_per_s_per_gpu"] > 0
            assert (sdir / "trials" / str(t.number) / "phases.csv").exists()
            assert len(t.intermediate_values) == 2  # one per measured window
    assert len(list((sdir / "baseline").iterdir())) == 2

    return tune, study, counted


def _check_validation(sdir):
    # validation.json
    val = json.loads((sdir / "validation.json").read_text())
    assert set(val) >= {"baseline_runs", "candidates", "winner"}
    assert len(val["baseline_runs"]) == 2
    for c in val["candidates"]:
        assert len(c["runs"]) == len(c["baseline_runs"]) == len(c["ratios"]) == 2
        assert c["ci_low"] <= c["speedup_median"] <= c["ci_high"] or c["ci_low"] is None
        assert (sdir / "validation" / f"trial-{c['trial']}-0").is_dir()
    w = val["winner"]
    assert set(w) == {"trial", "significant", "speedup_median", "ci_low", "ci_high", "decided_by", "duels"}
    for d in w["duels"]:  # two significant candidates whose intervals overlapped were measured head to head
        assert {d["a"], d["b"]} <= {c["trial"] for c in val["candidates"]} and d["faster"] in (d["a"], d["b"])
        assert (sdir / "validation" / f"duel-{d['a']}-{d['b']}" / f"trial-{d['b']}-0").is_dir()

    return val, w


def _check_export(proc, sdir, study, w):
    # exported config with provenance; environment.json; report.html
    cfg = load_config(sdir / "config.yaml")
    prov = cfg.provenance
    assert prov is not None and prov.study == "e2e" and prov.trial == w["trial"]
    assert prov.significant is bool(w["significant"])
    assert prov.tokens_per_s_per_gpu > 0 and prov.baseline_tokens_per_s_per_gpu > 0
    assert {"python", "torch", "hostname", "cpu_count"} <= set(prov.fingerprint)
    assert json.loads((sdir / "environment.json").read_text()) == prov.fingerprint
    if w["trial"] is None:
        assert prov.speedup == 1.0 and prov.speedup_ci is None
    else:
        assert prov.speedup == pytest.approx(w["speedup_median"]) and prov.speedup_ci[0] > 1.0
        winner = study.trials[w["trial"]]
        assert cfg.data.micro_batch_size == winner.params.get("micro_batch_size", 4)
    assert cfg.training.max_steps == 16  # the base's run length, not the protocol's
    assert (sdir / "report.html").stat().st_size > 0
    # the base config's gradient lifetimes (python -m workbench.memory lifetimes), written once after the baseline
    lifetimes = json.loads((sdir / "lifetimes.json").read_text())
    assert lifetimes["model"] == "tiny" and lifetimes["buckets"] and f"gradient lifetimes: {sdir}" in proc.stderr

    return cfg, prov


def _check_one_result(proc, sdir, tune, prov):
    page = (sdir / "report.html").read_text()
    # one result, told the same everywhere: the terminal, tune.json, the exported provenance and the report
    result = tune["result"]
    best, headline = result["best"], result_headline(result)
    assert headline in proc.stdout and html.escape(headline) in page
    # the report of a real study: every section there, none of them failed
    ids = set(re.findall(r'<section id="([^"]+)"', page))
    assert {"summary", "guide", "search", "time", "memory", "data", "trials", "environment"} <= ids
    assert "section-error" not in page and "<h3>Gradient lifetimes</h3>" in page
    base_tps = f"{result['baseline']['tokens_per_s']:,.0f}"
    assert base_tps in proc.stdout and base_tps in page  # "vs baseline N", or the noise floor's when no candidate
    assert prov.baseline_tokens_per_s_per_gpu == result["baseline"]["tokens_per_s"]
    assert prov.verdict == result["verdict"] and prov.searched_knobs == result["searched"] == tune["active_knobs"]
    assert prov.commit == result["commit"] and prov.data == result["data"] == {"source": "synthetic"}
    assert prov.budget == result["budget"] and result["budget"]["trials_run"] == 3
    assert "data: synthetic corpus" in proc.stderr  # the first lines say where the data comes from
    if result["verdict"] == "winner":
        assert (prov.trial, prov.speedup, prov.speedup_ci, prov.ab_pairs, prov.tokens_per_s_per_gpu) == (
            best["trial"], best["speedup"], [best["ci_low"], best["ci_high"]], best["pairs"], best["tokens_per_s"])
        assert prov.changed_knobs == best["changed"] and f"{best['speedup']:.3f}x" in page
    else:
        assert prov.trial is None and prov.speedup == 1.0 and prov.changed_knobs == {}
        assert best is None or (prov.best_candidate["trial"] == best["trial"]
                                and prov.best_candidate["why_lost"] == best["why_lost"])

    return result


def _check_the_export_reproduces(tmp_path, subprocess_env, sdir, tune, prov):
    # The exported config runs as is and reproduces its speedup: run beside the base config (the baseline's own
    # config.yaml), one after the other, the same steps each, their ratio is at least the exported speedup less the
    # noise floor. Side by side, because on 2 CPU cores shared with the suite's other workers absolute throughput
    # swings 1.4x either way between the study and a later run (CI saw 3,191 -> 4,573 once, 3,496 -> 1,530
    # another time); a pair measured together shares the load. The bound is max(spread, 25%): the spread of the
    # tiny study's baseline repeats was 1-20% here, and 25% is still below what separates a wrong config
    # (micro-batch 2 vs 8 differ by ~1.5x). A neighbour's burst can still slow one run of a pair (CI saw the exported
    # run at 0.68x and 0.51x of the base in two pairs once, with the base config exported), so up to three pairs
    # are allowed, each in the other order from the one before: a config that does not reproduce fails them all.
    bound = max(tune["noise_floor"]["rel_spread"], 0.25)
    steps = load_config(sdir / "baseline" / "0" / "config.yaml").training.max_steps
    want = prov.speedup * (1 - bound)
    ratios = []
    pair = [("base", sdir / "baseline" / "0" / "config.yaml"), ("exported", sdir / "config.yaml")]
    for attempt in range(3):
        tps = {}
        for name, config in pair if attempt % 2 == 0 else pair[::-1]:
            summary = tmp_path / f"rerun-{name}{attempt}.json"
            rerun = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(config), "--synthetic",
                                    "--steps", str(steps), "--summary", str(summary), "-q"], capture_output=True,
                                   text=True, env=subprocess_env, cwd=tmp_path, timeout=300)
            assert rerun.returncode == 0, rerun.stdout + rerun.stderr
            tps[name] = json.loads(summary.read_text())["throughput/real_tokens_per_s_per_gpu"]
        ratios.append(tps["exported"] / tps["base"])
        if ratios[-1] >= want:
            break
    else:
        raise AssertionError(f"exported config at {ratios} of the base beside it; exported speedup "
                             f"{prov.speedup:.3f}, bound {bound:.0%}")



def _check_subcommands(tmp_path, subprocess_env, spec_path, out, sdir, prov, result):
    best, headline = result["best"], result_headline(result)
    # the export and report subcommands work on the finished study
    for sub in ("export", "report"):
        p = subprocess.run([sys.executable, "-m", "workbench.tune", sub, "--study", str(spec_path), "--out",
                            str(out)], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    again = load_config(sdir / "config.yaml").provenance
    assert (again.trial, again.speedup, again.tokens_per_s_per_gpu) == (prov.trial, prov.speedup,
                                                                      prov.tokens_per_s_per_gpu)

    # the finished study is not run again: the same command says so and how to re-measure or extend it
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec_path), "--out", str(out),
                        "--no-progress"], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path,
                       timeout=300)
    assert p.returncode == 0 and "is finished (3 trials)" in p.stdout and "workbench.tune verify" in p.stdout
    assert headline in p.stdout and len(list((sdir / "baseline").iterdir())) == 2  # nothing re-measured

    # verify re-measures the exported config interleaved with the baseline (2 pairs here)
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "verify", "--study", str(spec_path), "--out",
                        str(out), "--pairs", "2"], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path,
                       timeout=300)
    if result["verdict"] == "winner":
        assert p.returncode in (0, 1) and f"verify trial #{best['trial']}:" in p.stdout, p.stdout + p.stderr
        record = json.loads((sdir / "verify.json").read_text())[-1]
        assert record["pairs"] == 2 and len(list((sdir / "verify").glob("*/trial-*"))) == 2
        assert record["inside"] == (record["validated"]["ci_low"] <= record["speedup_median"]
                                    <= record["validated"]["ci_high"])
        assert record["verdict"] in ("holds", "does not hold", "inconclusive")
        assert record["holds"] == (record["verdict"] == "holds") and record["verdict"] in p.stdout.replace("NOT ", "not ")
        assert p.returncode == (0 if record["holds"] else 1)
    else:
        assert p.returncode == 0 and "nothing to verify" in p.stdout, p.stdout + p.stderr



def _check_results_csv(tmp_path, subprocess_env, sdir, counted, val, w):
    # the study as a results CSV (benchmarks/study_results.py): every counted trial's objective as the sampler
    # was told it, the baseline runs, and the winner's validation interval
    import pandas as pd

    csv = tmp_path / "study.csv"
    repo = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, str(repo / "benchmarks" / "study_results.py"), str(sdir), "--out", str(csv)],
                       capture_output=True, text=True, env=subprocess_env, cwd=repo, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    df = pd.read_csv(csv)
    obj = df[df["metric"] == "objective/tokens_per_s_per_gpu"]
    search = obj[obj["phase"] == "search"].set_index("trial")["value"]
    assert search.to_dict() == pytest.approx({t.number: t.values[0] for t in counted})
    assert obj[obj["phase"] == "baseline"]["value"].tolist() == pytest.approx(val["baseline_runs"])
    walls = df[df["metric"] == "time/trial_wall_s"]  # each run's device seconds, as the GPU budget counted them
    assert walls[walls["phase"] == "search"].set_index("trial")["value"].to_dict() == pytest.approx(
        {t.number: t.user_attrs["wall_s"] for t in counted})
    assert len(walls[walls["phase"] == "baseline"]) == len(val["baseline_runs"])
    attrs = optuna.load_study(study_name="e2e", storage=f"sqlite:///{sdir / 'study.db'}").user_attrs
    profiled = df[df["metric"] == "time/profile_s"]["value"].tolist()  # the profiled steps past the measurement
    assert profiled == ([attrs["baseline_profile_s"]] if "baseline_profile_s" in attrs else [])
    assert (walls["value"] > 0).all()
    ends = df[df["metric"] == "timeline/end_s"].set_index("trial")["value"]  # the watchdog's marks of each trial
    assert len(ends) > 0 and ends.to_dict() == pytest.approx(
        {t.number: t.user_attrs["timeline"]["end"] for t in counted if t.user_attrs.get("timeline")})
    windows = df[df["metric"] == "window/tokens_per_s_per_gpu"].groupby("trial")["value"].apply(list)
    told = {t.number: [v for _, v in sorted(t.intermediate_values.items())] for t in counted if t.intermediate_values}
    assert len(windows) > 0 and windows.to_dict() == told  # each window as the pruner was told it
    if w["trial"] is not None:
        v = df[(df["phase"] == "validation") & (df["trial"] == w["trial"])].set_index("metric")["value"]
        assert v["validation/speedup_median"] == pytest.approx(w["speedup_median"])
        assert v["validation/ci_low"] == pytest.approx(w["ci_low"])
    assert (df["study"] == "e2e").all()
    # a study tuned in a storage of its own (--storage, shared by studies): the same rows from there
    shared = tmp_path / "shared.db"
    (sdir / "study.db").rename(shared)
    try:
        p = subprocess.run([sys.executable, str(repo / "benchmarks" / "study_results.py"), str(sdir), "--out",
                            str(tmp_path / "shared.csv"), "--storage", f"sqlite:///{shared}"],
                           capture_output=True, text=True, env=subprocess_env, cwd=repo, timeout=120)
    finally:
        shared.rename(sdir / "study.db")
    assert p.returncode == 0, p.stdout + p.stderr
    assert pd.read_csv(tmp_path / "shared.csv").equals(df)
    # a copy of tune.json and study.db alone (benchmarks/campaign.sh's): the same validation and baseline rows
    copy = tmp_path / "copy" / sdir.name
    copy.mkdir(parents=True)
    for name in ("tune.json", "study.db"):
        shutil.copy(sdir / name, copy / name)
    p = subprocess.run([sys.executable, str(repo / "benchmarks" / "study_results.py"), str(copy), "--out",
                        str(tmp_path / "copy.csv")], capture_output=True, text=True, env=subprocess_env, cwd=repo,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr

    def measured(frame):
        rows = frame[frame["phase"].isin(["validation", "baseline"]) & frame["metric"].str.match(
            r"validation/(speedup|ci_|pair)|objective/")]
        return sorted(zip(rows["phase"], rows["trial"].astype(str), rows["metric"], rows["value"].round(6)))

    assert measured(pd.read_csv(tmp_path / "copy.csv")) == measured(df)
    assert len(measured(df)) > len(val["baseline_runs"]) or w["trial"] is None
