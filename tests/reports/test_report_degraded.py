"""Tests for reports on degraded and partial studies (an empty folder, a study in progress, broken files, one
GPU, a multi-objective study, fill packing), on what a real H200 run wrote, and the CLI."""

from __future__ import annotations

import html.parser
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

import reports
from reports import build_report, compute_sections
from study_fixture import KERNEL_KNOB, OVERLAP_KNOBS, REPO, make_study
from test_report import SECTION_IDS, _parse


# --------------------------------------------------------------------------- degraded studies


def test_empty_dir_every_section_one_line(tmp_path):
    out = build_report(tmp_path, None, None)
    page = out.read_text()
    p = _parse(page)
    assert not p.errors and all(s in p.ids for s in SECTION_IDS)
    assert "section-error" not in page
    assert not (tmp_path / "study.db").exists(), "reading must not create a database"
    rep = compute_sections(tmp_path)
    for key in SECTION_IDS:
        assert getattr(rep, key).message, key
    assert rep.memory.analysis_message.startswith("Memory analysis not run")


def test_study_in_progress_and_broken_files(tmp_path):
    """One trial finished, no validation, no export; a truncated metrics.jsonl and garbage summary.json."""
    fx = make_study(tmp_path, name="early", n_trials=2, validate=False, running=True, cpu=True, seed=3)
    for f in ("config.yaml", "environment.json"):
        (fx.dir / f).unlink()
    (fx.dir / "trials" / "1" / "metrics.jsonl").open("a").write('{"step": 60, "throughp')
    (fx.dir / "baseline" / "2" / "summary.json").write_text("{not json")
    (fx.dir / "trials" / "0" / "phases.csv").write_text("")
    rep = compute_sections(fx.dir)
    assert rep.summary.best_trial == max(fx.trial_tput, key=fx.trial_tput.get)
    assert rep.summary.best_how.startswith("best objective")
    assert any("not re-measured" in n for n in rep.summary.notes)
    assert math.isnan(rep.summary.speedup.ci_low)
    assert rep.search.importances is None and "Too few" in rep.search.importances_message
    assert rep.environment.fingerprint.empty
    assert rep.memory.message.startswith("No device memory figures: the runs were on the CPU")
    assert rep.memory.peaks["max_rss_gib"].tolist() == [3.2, 3.2]
    page = build_report(fx.dir).read_text()
    assert "section-error" not in page and "No config exported yet" in page
    assert not _parse(page).errors


def test_multi_objective_pareto_and_one_gpu(tmp_path):
    fx = make_study(tmp_path, name="mo-1gpu", n_trials=14, gpus=1, multi_objective=True, validate=False,
                    running=False, seed=1)
    rep = compute_sections(fx.dir)
    p = rep.search.pareto
    assert p is not None and list(p.columns) == ["trial", "throughput/real_tokens_per_s_per_gpu",
                                                 "memory/max_reserved_gib", "on_front"]
    assert set(p["trial"]) == set(fx.trial_tput)
    front = p[p["on_front"]]
    for _, a in front.iterrows():  # nothing dominates a point on the front
        assert not ((p.iloc[:, 1] >= a.iloc[1]) & (p.iloc[:, 2] <= a.iloc[2])
                    & ((p.iloc[:, 1] > a.iloc[1]) | (p.iloc[:, 2] < a.iloc[2]))).any()
    assert p.loc[p.iloc[:, 1].idxmax(), "on_front"]
    # fewer than 10 finished trials: no importances, and the report says why
    assert len(fx.trial_tput) < 10 and rep.search.importances is None
    assert rep.search.importances_message == (f"Too few finished trials for parameter importances "
                                              f"({len(fx.trial_tput)}; 10 needed: with fewer, a ranking of the knobs "
                                              "would rank noise).")
    assert rep.trials.objective_columns == ["throughput/real_tokens_per_s_per_gpu", "memory/max_reserved_gib"]
    assert set(rep.environment.dropped["knob"]) == set(OVERLAP_KNOBS)
    assert "grad_sync" in rep.time.breakdown.columns
    assert (rep.time.breakdown["grad_sync"] == 0).all()
    page = build_report(fx.dir).read_text()
    assert "Pareto front" in page and "one GPU: there is no gradient all-reduce" in page


def test_memory_analysis_and_kernel_sweep_when_present(fx, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    (d / "memory_analysis.json").write_text(json.dumps({
        "allocation_size_histogram": [{"size_bytes": 2 ** k, "count": 1000 // (k - 8)} for k in range(10, 32, 3)],
        "suggestions": ["Set expandable_segments: true: 5.1 GiB of reserved memory is fragmented.",
                        {"text": "max_split_size_mb: 256 keeps large blocks whole"}]}))
    best = fx.params[fx.best][KERNEL_KNOB]
    rows = [{"kernel": k, "num_warps": w, "num_stages": s, "block_size": b, "size": 4096,
             "median_ms": 0.05 + 0.01 * w + 0.002 * s, "gpu": "NVIDIA H200"}
            for k, b in (("rmsnorm", 4096), ("swiglu", 1024)) for w in (2, 4, 8, 16) for s in (2, 3)]
    pd.DataFrame(rows).to_csv(d / "kernel_sweep.csv", index=False)
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    assert rep.memory.analysis_message is None
    assert rep.memory.histogram["count"].sum() == sum(1000 // (k - 8) for k in range(10, 32, 3))
    assert len(rep.memory.suggestions) == 2
    k = rep.kernels.launch.set_index("kernel")
    assert rep.kernels.message is None
    assert k.loc["rmsnorm", "measured_ms"] == pytest.approx(0.05 + 0.01 * best + 0.002 * 2)
    assert k.loc["swiglu", "best_in_sweep_ms"] == pytest.approx(0.05 + 0.02 + 0.004)
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Allocation-size histogram" in page and "max_split_size_mb: 256 keeps" in page


def test_cli(tmp_path):
    """The CLI's plumbing; the defaults it relies on (storage and name from the study dir) are covered by
    ``test_study_in_progress_and_broken_files``."""
    r = subprocess.run([sys.executable, "-m", "reports", str(tmp_path), "--storage",
                        f"sqlite:///{tmp_path / 'other.db'}", "--study-name", "nightly"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == tmp_path / "report.html"
    assert f"no study database at {tmp_path / 'other.db'}" in (tmp_path / "report.html").read_text()
    r = subprocess.run([sys.executable, "-m", "reports", str(tmp_path / "nope")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_postgres_password_is_masked():
    from reports._load import mask_url

    assert mask_url("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert mask_url("sqlite:///runs/x/study.db") == "sqlite:///runs/x/study.db"


def test_validation_dirs_by_name_without_run_dirs(tmp_path):
    """Without run_dirs/baseline_dirs in validation.json, A/B runs are found by their directory names."""
    from reports._load import load_study_data

    for name in ("7-0", "trial-7-1", "17-0", "baseline-0", "baseline-7-1", "baseline-x", "notes"):
        (tmp_path / "validation" / name).mkdir(parents=True)
    (tmp_path / "validation.json").write_text(json.dumps({"candidates": [{"trial": 7, "runs": [1.0, 2.0]}]}))
    data = load_study_data(tmp_path)
    assert [r.path.name for r in data.validation_runs_of(7)] == ["7-0", "trial-7-1"]
    assert [r.path.name for r in data.validation_baseline_runs()] == ["baseline-0", "baseline-7-1"]


def test_kernels_section_from_a_real_h200_sweep(fx, tmp_path):
    """The kernel_sweep.csv that ``python benchmarks/kernels_bench.py --kernel-sweep`` wrote on an H200 (full-mode Triton rows
    at the gr00t-n1.6 shapes): the chosen configuration's time, the fastest of the sweep, and the drawn sweep."""
    from reports.sections import sweep_by_config

    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    real = pd.read_csv(Path(__file__).parents[1].joinpath("assets") / "kernel_sweep_h200_2026-11-29.csv")
    real.to_csv(d / "kernel_sweep.csv", index=False)
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    k = rep.kernels.launch.set_index("kernel")
    assert set(k.index) >= {"rmsnorm", "swiglu", "rope", "fused_linear_ce"}
    ce = real[real["kernel"] == "fused_linear_ce"]
    assert k.loc["fused_linear_ce", "best_in_sweep_ms"] == pytest.approx(ce["median_ms"].min())
    drawn = sweep_by_config(rep.kernels)
    assert len(drawn) == len(real)  # one point per launch configuration (the CSV has one full-mode row each)
    fastest = drawn.sort_values("ms").groupby("kernel").head(1).set_index("kernel")
    assert fastest.loc["fused_linear_ce", "launch"] == "num_warps=8 num_stages=1 block_v=4096 chunk_size=8192"
    assert fastest.loc["rope", "ms"] == pytest.approx(real[real["kernel"] == "rope"]["median_ms"].min())
    # the fixture's exported config sets swiglu {num_warps 8, num_stages 3, block_size 1024} (SwiGLU has no
    # num_stages: ignored) and rmsnorm block_size 4096, which the sweep at hidden 2048 never ran
    chosen = drawn[drawn["chosen"]]
    assert list(chosen["launch"]) == ["num_warps=8 block_size=1024"] and list(chosen["kernel"]) == ["swiglu"]
    sw = real[(real["kernel"] == "swiglu") & (real["num_warps"] == 8) & (real["block_size"] == 1024)]
    assert k.loc["swiglu", "measured_ms"] == pytest.approx(sw["median_ms"].median())
    assert math.isnan(k.loc["rmsnorm", "measured_ms"])
    assert k.loc["rmsnorm", "best_in_sweep_ms"] == pytest.approx(real[real["kernel"] == "rmsnorm"]["median_ms"].min())
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Launch-parameter sweep per kernel" in page and "3 fastest per kernel" in page


def test_memory_section_from_a_real_h200_analysis(fx, tmp_path):
    """The memory_analysis.json that ``python -m workbench.memory analyze`` wrote on an H200 (gr00t-n1.6,
    micro-batch 4, torch's default allocator settings; benchmarks/results/memory_h200_2026-11-30/): the
    histogram, the two suggestions with their reasons, and the suggested settings reach the Memory section."""
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    src = Path(__file__).parents[1].joinpath("assets") / "memory_analysis_h200_mb4_2026-11-30.json"
    doc = json.loads(src.read_text())
    shutil.copy(src, d / "memory_analysis.json")
    rep = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name)
    m = rep.memory
    assert m.analysis_message is None
    assert m.histogram["count"].sum() == sum(b["count"] for b in doc["allocation_size_histogram"])
    assert len(m.suggestions) == 2
    assert any(s.startswith("expandable_segments: true: 9.92 GiB (16%)") for s in m.suggestions)
    assert any(s.startswith("roundup_power2_divisions: 4: the 18,850 allocations") for s in m.suggestions)
    page = build_report(d, f"sqlite:///{d / 'study.db'}", fx.name).read_text()
    assert "Allocation-size histogram" in page and "9.92 GiB (16%)" in page


def test_under_fill_packing_no_plot_of_bucket_length_or_padding(tmp_path, rep):
    """Issue 40: "step time vs bucket length" was drawn under packing: fill, where every step has one length; so
    was padding against bucket width, where nothing pads. Each is one line saying why instead."""
    assert rep.time.by_length_runs == ["baseline", "best"] and rep.time.by_length_message is None
    assert rep.data.padding_message is None
    drawn = _figure_titles(reports.render_html(rep))
    assert any(t.startswith("Step time vs bucket length") for t in drawn) and "Padding vs bucket width" in drawn
    fx = make_study(tmp_path, name="fill", n_trials=6, cpu=True, seed=2)
    for cfg in fx.dir.rglob("config.yaml"):
        doc = yaml.safe_load(cfg.read_text())
        doc["data"]["packing"] = "fill"
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    for csv in fx.dir.rglob("phases.csv"):
        df = pd.read_csv(csv)
        df["seq_len"] = 4096
        df.to_csv(csv, index=False)
    r = compute_sections(fx.dir)
    assert r.time.by_length_runs == []
    assert r.time.by_length_message == (
        "Step time vs bucket length is not drawn: the baseline's data uses packing: fill (rows cut from the token "
        "stream: every step is 4,096 tokens long); the best's data uses packing: fill (rows cut from the token "
        "stream: every step is 4,096 tokens long), so bucket length explains none of the spread; the step-time "
        "distribution above is the noise.")
    assert r.data.padding_message.startswith("No padding to plot against bucket width: the data uses packing: fill")
    page = build_report(fx.dir).read_text()
    drawn = _figure_titles(page)
    assert not any(t.startswith("Step time vs bucket length") for t in drawn) and "Padding vs bucket width" not in drawn
    assert "bucket length explains none of the spread" in page and "No padding to plot" in page
    # a CPU study: the trials' MFU and reserved-memory columns would be dashes only
    assert not {"mfu_pct", "max_reserved_gib"} & set(r.trials.table.columns)
    assert r.trials.notes == ["No trial recorded MFU (no peak FLOP/s for the device: a CPU) or reserved memory (no "
                              "device memory: a CPU): those columns are left out."]
    assert r.trials.notes[0] in html.unescape(page)


def _figure_titles(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'<svg data-figure="\d+" data-title="([^"]*)"', page)]


def test_one_arm_with_one_length_is_left_out_of_the_bucket_length_plot():
    from reports.sections.phases import _by_length

    st = pd.DataFrame({"run": ["baseline"] * 4 + ["best"] * 3, "seq_len": [64, 128, 64, 192, 256, 256, 256],
                       "step_s": 0.1})
    drawn, why = _by_length({"baseline": [], "best": []}, st)
    assert drawn == ["baseline"]
    assert why == "Step time vs bucket length leaves out the best: in the best, every step is 256 tokens long."


def test_padding_of_one_bucket_width_or_none_is_one_line():
    from reports.sections.data import _padding_message

    def padding(widths, ratio):
        return pd.DataFrame({"bucket_width": widths, "trials": 2, "padding_ratio_median": ratio,
                             "padding_ratio_min": ratio, "padding_ratio_max": ratio, "tokens_per_s_median": 1e3})

    assert _padding_message(padding([64], 0.007), {"bucket"}) == (
        "Every finished trial used bucket width 64 (padding 0.7%, median): one point, no curve; search "
        "data.bucket_width to see padding against it.")
    assert _padding_message(padding([64, 128], 0.0), {"bucket"}).startswith("No trial padded a single token")
    assert _padding_message(padding([64, 128], 0.1), {"bucket", "fill"}) is None


def test_a_study_that_compiled_nothing_says_so_in_one_line(tmp_path):
    """Issue 40: on a CPU study the Compile time section was a table of zeros."""
    from reports._load import StudyData
    from reports.sections import compile_section

    summary = {"time/compile_s": 0.0, "compile/fx_graph_cache_hit": 0, "compile/fx_graph_cache_miss": 0,
               "compile/aot_autograd_cache_hit": 0, "compile/aot_autograd_cache_miss": 0}
    trials = [optuna.trial.create_trial(value=1.0, user_attrs={"summary": summary}) for _ in range(2)]
    for n, t in enumerate(trials):
        t.number = n
    c = compile_section(StudyData(study_dir=tmp_path, storage_url="", study_name=None, trials=trials))
    assert c.message == ("No trial compiled anything (2 trial(s), 0 s of compile each, no graph cached): the trials "
                         "ran eagerly (loongforge.compute_domain.compile: none).")
    trials[1].user_attrs["summary"] = {**summary, "time/compile_s": 21.5, "compile/fx_graph_cache_miss": 3}
    assert compile_section(StudyData(study_dir=tmp_path, storage_url="", study_name=None, trials=trials)).message is None


def test_summary_says_noise_and_how_the_winner_was_chosen(tmp_path):
    """Issue 40: the report said nothing of a 95% base spread; the winner rule's head-to-head is named."""
    from workbench.tune.result import build_result

    fx = make_study(tmp_path, name="noisy", n_trials=4, cpu=True, seed=5)
    tune = json.loads((fx.dir / "tune.json").read_text())
    w = fx.validation["winner"]
    validation = {**fx.validation, "winner": {**w, "decided_by": "faster than #9 head-to-head: #9 at 0.800x "
                                              "[0.700, 0.900] of #1 over 3 interleaved pairs",
                                              "duels": [{"a": w["trial"], "b": 9, "speedup_median": 0.8,
                                                         "ci_low": 0.7, "ci_high": 0.9, "pairs": 3,
                                                         "faster": w["trial"], "told_apart": True}]}}
    tune["result"] = build_result(validation, study="noisy", base_values={}, baseline_repeats=[100, 195, 150],
                                  searched=["micro_batch_size"], budget={"trials": 4, "trials_run": 4},
                                  data={"source": "synthetic"}, commit="abc")
    (fx.dir / "tune.json").write_text(json.dumps(tune))
    notes = compute_sections(fx.dir).summary.notes
    # the spread of every run of the base config: the 3 repeats and the base runs of the candidates' A/B pairs
    runs = 3 + sum(len(c["baseline_runs"]) for c in validation["candidates"])
    assert notes[0].startswith(f"Noisy machine: the base config's {runs} runs spread ") and "(above 10%)" in notes[0]
    assert any(n.startswith("Winner chosen: faster than #9 head-to-head") for n in notes)
    assert "Noisy machine: the base config" in build_report(fx.dir).read_text()
