"""The profiler traces in "Where the time goes": the kept traces' table and the top ops by self time, parsed from
Chrome trace JSON fixtures (a CPU trace of nested aten ops, a CUDA trace of kernels)."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pytest

from reports import build_report, compute_sections
from reports.sections._traces import op_self_times, top_ops
from test_report import _parse
from workbench.tune.result import build_result


def _x(name, ts, dur, cat="cpu_op", tid=1, pid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


# Two steps on the main thread, a backward op on the autograd thread, and noise the parser must ignore.
CPU_EVENTS = [
    _x("step 3", 0, 1000, cat="user_annotation"),
    _x("forward", 0, 600, cat="user_annotation"),
    _x("aten::linear", 10, 300),          # self 300 - 250 = 50
    _x("aten::addmm", 20, 250),           # self 250 - 100 = 150
    _x("aten::copy_", 30, 100),           # self 100
    _x("aten::mul", 400, 150.5),          # self 150.5
    _x("optimizer", 600, 400, cat="user_annotation"),
    _x("aten::_foreach_add_", 610, 380),  # self 380
    _x("step 4", 1000, 800, cat="user_annotation"),
    _x("aten::addmm", 1010, 200),         # self 200
    _x("aten::mm", 100, 500, tid=2),      # self 500, another thread: no parent
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    {"ph": "i", "name": "marker", "ts": 5, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": "broken", "pid": 1, "tid": 1},  # no ts/dur
]
CUDA_EVENTS = [
    _x("step 3", 0, 1000, cat="user_annotation"),
    _x("aten::mm", 10, 50),
    _x("cudaLaunchKernel", 20, 10, cat="cuda_runtime"),
    _x("sm90_xmma_gemm_bf16", 30, 400, cat="kernel", pid=0, tid=7),
    _x("sm90_xmma_gemm_bf16", 500, 300, cat="kernel", pid=0, tid=7),
    _x("rmsnorm_kernel", 810, 100, cat="kernel", pid=0, tid=7),
    _x("forward", 0, 900, cat="gpu_user_annotation", pid=0, tid=8),
]


def _write_trace(path: Path, events) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_self_time_is_duration_less_direct_children():
    df = op_self_times(CPU_EVENTS)
    got = {(r.name, r.dur_us): r.self_us for r in df.itertuples()}
    assert got[("aten::linear", 300)] == 50 and got[("aten::addmm", 250)] == 150 and got[("aten::copy_", 100)] == 100
    assert got[("forward", 600)] == 600 - 300 - 150.5 and got[("step 3", 1000)] == 0
    assert got[("aten::mm", 500)] == 500 and "broken" not in set(df["name"])
    assert len(df) == 11  # every complete event with a time, metadata and instants left out


def test_top_ops_ranks_aten_ops_on_cpu_and_kernels_on_cuda(tmp_path):
    ops, kind = top_ops(_write_trace(tmp_path / "cpu.json", CPU_EVENTS), steps=2)
    assert kind == "CPU ops"
    assert list(ops["name"]) == ["aten::mm", "aten::_foreach_add_", "aten::addmm", "aten::mul", "aten::copy_",
                                 "aten::linear"]  # no range of a step or phase
    addmm = ops[ops["name"] == "aten::addmm"].iloc[0]
    assert addmm["calls"] == 2 and addmm["self_ms"] == pytest.approx(0.35) and addmm["total_ms"] == pytest.approx(0.45)
    assert addmm["self_ms_per_step"] == pytest.approx(0.175)
    assert ops["self_pct"].sum() == pytest.approx(100)
    ops, kind = top_ops(_write_trace(tmp_path / "cuda.json", CUDA_EVENTS), steps=1)
    assert kind == "GPU kernels" and list(ops["name"]) == ["sm90_xmma_gemm_bf16", "rmsnorm_kernel"]
    assert ops["self_ms"].tolist() == pytest.approx([0.7, 0.1]) and ops["self_pct"].iloc[0] == pytest.approx(87.5)
    many = [_x(f"aten::op{i}", 10 * i, i + 1) for i in range(15)]
    ops, _ = top_ops(_write_trace(tmp_path / "many.json", many))
    assert len(ops) == 10 and ops["name"].iloc[0] == "aten::op14" and ops["self_ms_per_step"].isna().all()


def _study(tmp_path: Path, *, winner: bool = True) -> Path:
    sdir = tmp_path / "s"
    base = _write_trace(sdir / "traces" / "baseline" / "trace.json", CUDA_EVENTS)
    traces = {"steps": 2, "baseline": {"trial": None, "run_dir": str(base.parent), "path": str(base),
                                       "memory_snapshot": str(base.parent / "memory_snapshot.pickle"), "status": "ok"},
              "winner": None}
    if winner:
        w = _write_trace(sdir / "traces" / "winner" / "trace.json", CPU_EVENTS)
        traces["winner"] = {"trial": 3, "run_dir": str(w.parent), "path": str(w), "memory_snapshot": None,
                            "status": "ok"}
    # the result as the tuner builds it (workbench.tune.result): traces from validation.json
    result = build_result({"traces": traces}, study="s", base_values={}, baseline_repeats=[100.0, 110.0],
                          searched=[], budget={}, data={"source": "synthetic"}, commit=None)
    assert result["traces"] == traces
    (sdir / "tune.json").write_text(json.dumps({"study_name": "s", "result": result}))
    return sdir


def test_the_report_lists_the_traces_and_the_winners_top_ops(tmp_path):
    sdir = _study(tmp_path)
    t = compute_sections(sdir).time
    assert list(t.traces.index) == ["baseline", "winner"] and t.traces_message is None
    assert t.traces.loc["winner", "file"] == "traces/winner/trace.json" and bool(t.traces["exists"].all())
    assert t.top_ops_of == "winner" and t.top_ops_kind == "CPU ops" and t.top_ops["name"].iloc[0] == "aten::mm"
    # per profiled step: the traces' 2 steps (a DataFrame cell, a numpy integer, is a number too)
    assert t.top_ops["self_ms_per_step"].to_numpy() == pytest.approx(t.top_ops["self_ms"].to_numpy() / 2)
    assert t.traces["trace_href"].tolist() == ["traces/baseline/trace.json", "traces/winner/trace.json"]
    assert t.traces["snapshot_href"].isna().all()  # no snapshot file was written
    raw = build_report(sdir).read_text()
    page = html.unescape(raw)
    assert "Profiler traces" in page and "traces/winner/trace.json" in page and "#3" in page
    assert "Top 6 CPU ops by self time (winner's trace)" in page and "aten::_foreach_add_" in page
    assert "traces/baseline/memory_snapshot.pickle" in page and "ui.perfetto.dev" in page
    # the trace files are links, relative to report.html, to files inside the study directory
    assert '<a href="traces/winner/trace.json">traces/winner/trace.json</a>' in raw
    assert '<a href="traces/baseline/trace.json">' in raw and 'href="traces/baseline/memory_snapshot' not in raw
    assert_links_stay_inside(raw, sdir)


def assert_links_stay_inside(page: str, study_dir: Path) -> None:
    """The page fetches nothing: every reference is a fragment or a data: URL, except <a> links, each relative and
    to a file that exists inside the study directory."""
    p = _parse(page)
    links = 0
    for tag, attr, ref in p.refs:
        if ref.startswith(("#", "data:")):
            continue
        assert tag == "a" and attr == "href", (tag, attr, ref)
        target = (study_dir / unquote(ref)).resolve()
        assert "://" not in ref and not ref.startswith("/") and target.is_file(), ref
        assert target.is_relative_to(study_dir.resolve()), ref
        links += 1
    assert links


def test_a_snapshot_in_the_study_dir_is_linked_one_outside_it_is_not(tmp_path):
    sdir = _study(tmp_path)
    (sdir / "traces" / "baseline" / "memory_snapshot.pickle").write_bytes(b"\x80")
    outside = _write_trace(tmp_path / "elsewhere" / "trace.json", CPU_EVENTS)
    (sdir / "traces" / "winner" / "trace.json").unlink()  # the winner's trace only outside the study directory
    tune = json.loads((sdir / "tune.json").read_text())
    tune["result"]["traces"]["winner"]["path"] = str(outside)
    (sdir / "tune.json").write_text(json.dumps(tune))
    t = compute_sections(sdir).time
    assert t.traces.loc["baseline", "snapshot_href"] == "traces/baseline/memory_snapshot.pickle"
    assert t.traces.loc["baseline", "memory_snapshot"] == "traces/baseline/memory_snapshot.pickle"
    assert pd.isna(t.traces.loc["winner", "trace_href"]) and t.traces.loc["winner", "file"] == str(outside)
    raw = build_report(sdir).read_text()
    assert '<a href="traces/baseline/memory_snapshot.pickle">' in raw and str(outside) in raw
    assert_links_stay_inside(raw, sdir)


def test_a_copied_study_links_its_own_traces(tmp_path):
    """A study folder copied elsewhere while the original stays: the report reads and links the copy's files."""
    sdir = _study(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(sdir, copy)
    t = compute_sections(copy).time
    assert t.traces["path"].tolist() == [str(copy / "traces" / a / "trace.json") for a in ("baseline", "winner")]
    assert t.traces["trace_href"].tolist() == ["traces/baseline/trace.json", "traces/winner/trace.json"]


def test_without_a_winner_the_baselines_trace_is_ranked_and_a_moved_study_still_finds_it(tmp_path):
    sdir = _study(tmp_path, winner=False)
    moved = tmp_path / "moved"
    sdir.rename(moved)
    t = compute_sections(moved).time
    assert list(t.traces.index) == ["baseline"] and t.traces.loc["baseline", "file"] == "traces/baseline/trace.json"
    assert t.top_ops_of == "baseline" and t.top_ops_kind == "GPU kernels"
    assert t.top_ops["name"].tolist() == ["sm90_xmma_gemm_bf16", "rmsnorm_kernel"]


def test_traces_profiled_in_measured_runs_are_found_after_the_study_moved(tmp_path):
    """A study's traces in the folders of the runs they were profiled after (the winner's A/B pair, with its
    memory snapshot), their paths recorded where the study was: the moved study's own files are read and linked."""
    sdir = tmp_path / "s"
    base = _write_trace(sdir / "validation" / "baseline-3-0" / "trace.json", CUDA_EVENTS)
    win = _write_trace(sdir / "validation" / "trial-3-0" / "trace.json", CPU_EVENTS)
    (win.parent / "memory_snapshot.pickle").write_bytes(b"\x80")
    was = Path("/gone/runs/s")  # where the study ran
    rec = {name: {"trial": trial, "run_dir": str(was / "validation" / run), "status": "ok",
                  "path": str(was / "validation" / run / "trace.json"),
                  "memory_snapshot": str(was / "validation" / run / "memory_snapshot.pickle") if trial else None}
           for name, trial, run in (("baseline", None, base.parent.name), ("winner", 3, win.parent.name))}
    result = build_result({"traces": {"steps": 2, **rec}}, study="s", base_values={}, baseline_repeats=[100.0],
                          searched=[], budget={}, data={"source": "synthetic"}, commit=None)
    (sdir / "tune.json").write_text(json.dumps({"study_name": "s", "result": result}))
    t = compute_sections(sdir).time
    assert t.traces["path"].tolist() == [str(base), str(win)] and bool(t.traces["exists"].all())
    assert t.traces["trace_href"].tolist() == ["validation/baseline-3-0/trace.json", "validation/trial-3-0/trace.json"]
    assert t.traces.loc["winner", "snapshot_href"] == "validation/trial-3-0/memory_snapshot.pickle"
    assert t.top_ops_of == "winner" and t.top_ops["name"].iloc[0] == "aten::mm"
    assert_links_stay_inside(build_report(sdir).read_text(), sdir)


def test_a_study_without_traces_says_so(tmp_path):
    result = build_result({}, study="s", base_values={}, baseline_repeats=[100.0], searched=[], budget={},
                          data={"source": "synthetic"}, commit=None)
    assert result["traces"] is None
    (tmp_path / "tune.json").write_text(json.dumps({"study_name": "s", "result": result}))
    t = compute_sections(tmp_path).time
    assert t.traces.empty and t.traces_message.startswith("No profiler traces")
    assert t.top_ops.empty and t.top_ops_message == t.traces_message
    # no phase timings either: the section is its one line, as every empty section (test_report.py)
    assert "No profiler traces" not in html.unescape(build_report(tmp_path).read_text())
