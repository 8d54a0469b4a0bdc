"""Tests for reports on the study of ``study_fixture.make_study`` (conftest.py's ``fx``, ``rep`` and ``page``):
assertions on each section's data and on the HTML file. Degraded and partial studies: test_report_degraded.py.
"""

from __future__ import annotations

import html.parser
import json
import math
import re
import shutil
import statistics

import pandas as pd
import pytest

import reports
from reports import build_report, compute_sections
from reports._load import PHASES
from reports.render.figures import Figures
from reports.render.memory import render_memory
from reports.render.tables import missing_note
from study_fixture import BASELINE_PARAMS, FAILURES, KERNEL_KNOB, LIFETIMES, PRUNED, SPACE

SECTION_IDS = ("summary", "guide", "search", "time", "gpu", "compile", "numerics", "memory", "kernels", "data",
               "trials", "environment")


# --------------------------------------------------------------------------- section data


def test_no_section_failed(rep):
    for key in SECTION_IDS:
        assert not isinstance(getattr(rep, key), reports.sections.SectionFailed), getattr(rep, key)


def test_summary_best_vs_baseline(rep, fx):
    s = rep.summary
    assert s.message is None
    assert s.best_trial == fx.best and s.best_how == "validated winner"
    cand = next(c for c in fx.validation["candidates"] if c["trial"] == fx.best)
    row = s.table.set_index("metric").loc["throughput/real_tokens_per_s_per_gpu"]
    assert row["baseline"] == pytest.approx(statistics.median(cand["baseline_runs"]))
    assert row["best"] == pytest.approx(statistics.median(cand["runs"]))
    assert row["ratio"] == pytest.approx(row["best"] / row["baseline"])
    assert row["best"] > row["baseline"]
    w = fx.validation["winner"]
    assert s.speedup.median == pytest.approx(w["speedup_median"])
    assert (s.speedup.ci_low, s.speedup.ci_high) == pytest.approx((w["ci_low"], w["ci_high"]))
    assert s.speedup.ci_low <= s.speedup.median <= s.speedup.ci_high
    assert s.speedup.rounds == 5 and s.speedup.significant == w["significant"]
    metrics = set(s.table["metric"])
    assert {"mfu_pct", "memory/max_reserved_gib", "time/step_s"} <= metrics
    # Peak memory of the best: median over its trial dir and validation re-runs.
    mem = s.table.set_index("metric").loc["memory/max_reserved_gib"]
    assert mem["best"] == pytest.approx(rep.memory.peaks.loc["best", "max_reserved_gib"])


def test_summary_changed_knobs(rep, fx):
    k = rep.summary.knobs.set_index("knob")
    best = fx.params[fx.best]
    assert set(k.index) == set(SPACE)
    for knob, v in best.items():
        assert k.loc[knob, "best"] == v
        if knob in BASELINE_PARAMS:
            assert k.loc[knob, "baseline"] == BASELINE_PARAMS[knob]
            assert k.loc[knob, "changed"] == (v != BASELINE_PARAMS[knob])
    # Unset in the base config (torch's default): unknown baseline, shown as a change.
    assert k.loc["max_split_size_mb", "changed"] is None
    assert rep.summary.config_text.startswith("# Exported by python -m workbench.tune")


def test_summary_ab_runs(rep, fx):
    ab = rep.summary.ab_runs
    assert len(ab) == 3 * 5 * 2 and set(ab["arm"]) == {"baseline", "candidate"}
    assert list(rep.summary.candidates["trial"]) == [c["trial"] for c in fx.validation["candidates"]]


def test_search_history_and_importances(rep, fx):
    s = rep.search
    h = s.history.set_index("trial")
    finished = [n for n, st in fx.statuses.items() if st not in ("running",)]
    assert sorted(h.index) == sorted(finished)
    ok = sorted(fx.trial_tput)
    expect = pd.Series([fx.trial_tput[n] for n in ok], index=ok).cummax()
    assert h.loc[ok, "best_so_far"].to_numpy() == pytest.approx(expect.to_numpy())
    assert h["best_so_far"].max() == pytest.approx(max(fx.trial_tput.values()))
    assert (h.loc[list(FAILURES), "value"] == 0).all()
    assert s.importances is not None and s.importances_message is None
    assert set(s.importances["knob"]) <= set(SPACE)
    assert s.importances["importance"].sum() == pytest.approx(1.0)
    assert list(s.knobs["trial"]) == ok and s.pareto is None
    # Each knob's kind (for its axis: category labels, whole-number ticks) and the categorical choices in order.
    kinds = {k: {"CategoricalDistribution": "categorical", "IntDistribution": "int"}.get(type(d).__name__, "float")
             for k, d in SPACE.items()}
    assert s.knob_kinds == kinds
    assert s.knob_choices == {k: list(d.choices) for k, d in SPACE.items() if kinds[k] == "categorical"}
    assert rep.memory.knob_kinds == {k: kinds[k] for k in rep.memory.memory_knobs}
    assert s.baseline_band[1] == pytest.approx(min(fx.baseline_repeats))


def test_search_says_where_the_gpu_minutes_went(rep, fx, tmp_path):
    m = rep.search.gpu_minutes.set_index("phase")
    assert list(m.index) == ["baseline", "screening", "trials", "numerics", "validation", "traces"]
    assert m.loc["screening", "gpu_minutes"] == 3.0 and m.loc["screening", "share"] == pytest.approx(0.5)
    assert m["share"].sum() == pytest.approx(1.0)
    assert rep.search.gpu_minutes_line == ("GPU-minutes: 6.0 of 10 (baseline 1.5, screening 3.0, validation 1.2, "
                                           "traces 0.3); trials measured: 7 at 1 window, 2 at 4 windows; 1 refused "
                                           "without a run; 1.33 configs a GPU-minute")
    # a study from before the budget (or on a machine that timed nothing): no table, nothing invented
    old = tmp_path / "old"
    shutil.copytree(fx.dir, old)
    tune = json.loads((old / "tune.json").read_text())
    del tune["gpu_minutes"], tune["screening"]
    (old / "tune.json").write_text(json.dumps(tune))
    s = compute_sections(old, f"sqlite:///{old / 'study.db'}", fx.name).search
    assert s.gpu_minutes is None and s.gpu_minutes_line is None
    # a CPU study's minutes are called what they are
    tune["gpu_minutes"] = {"device": "cpu", "budget": None, "total": 2.0, "by_phase": {"baseline": 1.0, "trials": 1.0}}
    (old / "tune.json").write_text(json.dumps(tune))
    s = compute_sections(old, f"sqlite:///{old / 'study.db'}", fx.name).search
    assert s.gpu_minutes.attrs["device"] == "cpu" and s.gpu_minutes_line.startswith("CPU-minutes: 2.0 (")


def test_time_phases_sum_to_step_time(rep):
    t = rep.time
    assert list(t.breakdown.index) == ["baseline", "best"]
    sums = t.breakdown[list(PHASES)].sum(axis=1)
    # phases.csv holds 7 significant digits (%.6e) per value: sums agree to ~1e-7, not to the last bit.
    assert sums.to_numpy() == pytest.approx(t.breakdown["step_s"].to_numpy(), rel=1e-6)
    assert not sums.to_numpy() == pytest.approx(t.breakdown["step_s"].to_numpy() * 1.001, rel=1e-6)
    # The timeline: contiguous phases, each step as long as its step time.
    for (run, step), g in t.timeline.groupby(["run", "step"]):
        g = g.set_index("phase").loc[list(PHASES)]
        assert (g["start_s"].iloc[1:].to_numpy() == pytest.approx(
            (g["start_s"] + g["duration_s"]).iloc[:-1].to_numpy()))
    assert t.timeline.groupby("run")["step"].nunique().to_dict() == {"baseline": 3, "best": 3}
    # Step times: 40 measured steps per run; baseline = 3 repeats + 15 interleaved runs.
    counts = t.step_times.groupby("run").size().to_dict()
    assert counts == {"baseline": 40 * (3 + 15), "best": 40 * (1 + 5)}
    assert t.step_stats.loc["best", "median_s"] < t.step_stats.loc["baseline", "median_s"]


def test_time_breakdown_matches_phases_csv(rep, fx):
    run = pd.read_csv(fx.dir / "baseline" / "0" / "phases.csv")
    first = rep.time.step_times[rep.time.step_times["source"] == "baseline/0"]
    assert first["step_s"].to_numpy() == pytest.approx(run[run["measured"] == 1]["step_s"].to_numpy())


def test_memory(rep, fx):
    m = rep.memory
    assert m.message is None
    # the memory model's prediction sits beside the measured peak, per arm and per trial
    assert m.peaks.loc["best", "predicted_peak_gib"] == pytest.approx(m.peaks.loc["best", "max_allocated_gib"] * 1.02,
                                                                      abs=2e-3)
    assert (m.by_trial["predicted_peak_gib"] / m.by_trial["max_allocated_gib"]).round(2).eq(1.02).all()
    assert m.analysis_message.startswith("Memory analysis not run")
    assert m.histogram is None
    best = fx.params[fx.best]
    assert m.peaks.loc["best", "max_reserved_gib"] == pytest.approx(
        38.0 + 11.5 * best["micro_batch_size"] + (0 if best[
            "expandable_segments"] else 4.5))
    assert (m.peaks["reserved_minus_allocated_gib"] > 0).all()
    assert "expandable_segments" in m.memory_knobs
    assert len(m.by_trial) == len(fx.trial_tput)


def test_memory_gradient_lifetimes(rep, fx):
    """lifetimes.json in the study directory: the buckets in launch order, the two plans' peaks, the slots and the
    saving, as the analysis wrote them."""
    doc = json.loads(LIFETIMES.read_text())
    m = rep.memory
    assert m.lifetimes_message is None and m.lifetimes_notes == []
    assert len(m.lifetimes) == len(doc["buckets"]) == 31
    assert m.lifetimes["bucket"].tolist() == list(range(31))
    assert m.lifetimes.loc[0, "layers"] == "lm_head" and m.lifetimes.loc[30, "layers"] == "embed_tokens"
    assert m.lifetimes["first_tick"].is_monotonic_increasing  # buckets fill in launch order here
    assert m.lifetimes["mib"].sum() == pytest.approx(doc["total_bytes"] / 2 ** 20)
    summary = m.lifetimes_summary.set_index("metric")["value"]
    assert summary["peak live gradients MiB, today's plan"] == pytest.approx(doc["total_bytes"] / 2 ** 20)
    assert summary["peak live gradients MiB, lifetime-aware plan"] == pytest.approx(588.6, abs=0.05)
    assert summary["buffer slots, lifetime-aware plan"] == 2
    assert summary["saved MiB at this config"] == pytest.approx(doc["saved_bytes"] / 2 ** 20)
    assert m.lifetimes_timeline["today_mib"].iloc[-1] == pytest.approx(doc["total_bytes"] / 2 ** 20)
    assert m.lifetimes_timeline["lifetime_mib"].max() == pytest.approx(588.6, abs=0.05)


def _memory_html(memory) -> str:
    """The Memory section's HTML alone (its own figure numbering)."""
    return render_memory(memory, Figures())


def test_memory_without_lifetimes_renders_as_before(rep, fx, tmp_path):
    """No lifetimes.json (a study from before the analysis): nothing of it in the data, and the section's page is
    the one with the file less its gradient-lifetimes part; a broken file is one line."""
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    (d / "lifetimes.json").unlink()
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    assert m.lifetimes is None and m.lifetimes_summary is None and m.lifetimes_timeline is None
    assert m.lifetimes_message is None and m.lifetimes_notes == []
    without, with_file = _memory_html(m), _memory_html(rep.memory)
    assert "lifetimes" not in without.lower()
    assert with_file.startswith(without + "\n<h3>Gradient lifetimes</h3>")
    (d / "lifetimes.json").write_text("{")
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    assert m.lifetimes is None and m.lifetimes_message.startswith("lifetimes.json could not be read")
    assert _memory_html(m).endswith(f"<h3>Gradient lifetimes</h3>\n{missing_note(m.lifetimes_message)}")


def test_memory_lifetimes_that_do_not_apply_say_why(fx, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(fx.dir, d)
    doc = json.loads(LIFETIMES.read_text())
    why = "training.grad_clip=1: clipping scales every gradient by the global norm"
    doc["lifetime"].update(applies=False, blocked_by=[why])
    doc["saved_bytes"] = 0
    (d / "lifetimes.json").write_text(json.dumps(doc))
    m = compute_sections(d, f"sqlite:///{d / 'study.db'}", fx.name).memory
    summary = m.lifetimes_summary.set_index("metric")["value"]
    assert summary["saved MiB at this config"] == 0
    assert summary["saved MiB without the reasons below"] == pytest.approx(doc["lifetime"]["saved_bytes"] / 2 ** 20)
    assert m.lifetimes_notes == [why]
    assert f"No saving at this config: {why}" in _memory_html(m)


def test_kernels_without_sweep(rep, fx):
    k = rep.kernels
    assert k.message.startswith("No kernel sweep ran")
    launch = k.launch.set_index("kernel")
    assert launch.loc["rmsnorm", "num_warps"] == fx.params[fx.best][KERNEL_KNOB]
    assert launch.loc["swiglu", "num_stages"] == 3
    assert launch["measured_ms"].isna().all()


def test_data_padding_per_bucket_width(rep, fx):
    d = rep.data
    pad = d.padding.set_index("bucket_width")
    assert set(pad.index) == set(fx.padding)
    for bw, ratios in fx.padding.items():
        assert pad.loc[bw, "trials"] == len(ratios)
        assert pad.loc[bw, "padding_ratio_median"] == pytest.approx(statistics.median(ratios))
    # Wider buckets pad more.
    assert pad["padding_ratio_median"].is_monotonic_increasing
    assert list(d.io.index) == ["baseline", "best"] and set(d.io["io_backend"]) == {"io_uring"}
    assert (d.io["read_latency_ms_p50"] < d.io["read_latency_ms_p90"]).all()
    assert (d.io["read_latency_ms_p90"] < d.io["read_latency_ms_p99"]).all()
    assert d.by_trial["decode_tokens_per_s"].notna().all()


def test_data_loader_headroom(rep):
    """decode/tokens_per_s is a per-core decode capacity (~3e7 here) and training ~1e4 tokens/s/GPU: the two are
    compared as a ratio, not on one axis."""
    d = rep.data
    bt = d.by_trial
    assert (bt["decode_tokens_per_s"] > 1e7).all() and (bt["value"] < 1e5).all()
    assert bt["loader_headroom"].to_numpy() == pytest.approx((bt["decode_tokens_per_s"] / bt["value"]).to_numpy())
    io = d.io
    assert io["loader_headroom"].to_numpy() == pytest.approx(
        (io["decode_tokens_per_s"] / io["real_tokens_per_s_per_gpu"]).to_numpy())
    from reports.sections.data import headroom

    assert math.isnan(headroom(3e7, 0.0)) and math.isnan(headroom(math.nan, 1e4)) and headroom(2e4, 1e4) == 2.0


def test_guide(rep, fx):
    g = rep.guide
    assert g.message is None
    assert g.base == "studies/llama3b-base.yaml" and g.baseline_repeats == 3
    assert (g.warmup_steps, g.window_steps, g.windows) == (3, 10, 4)
    assert g.ab_rounds == 5 and g.candidates == 3 and g.confidence == 0.95
    assert g.method == fx.validation["method"]
    assert g.phases == tuple(PHASES)
    files = g.files.set_index("path")["present"]
    assert files[["tune.json", "study.db", "trials/<n>/", "baseline/<i>/", "validation.json", "config.yaml",
                  "environment.json"]].all()


def test_trials_table(rep, fx):
    t = rep.trials
    tab = t.table.set_index("trial")
    assert len(tab) == len(fx.statuses)
    assert {"state", "status", "value", "failure_kind", "failure_reason", "duration_s"} <= set(tab.columns)
    assert set(SPACE) <= set(tab.columns)
    expected = pd.Series(fx.statuses).value_counts()
    assert t.status_counts.sort_index().to_dict() == expected.sort_index().to_dict()
    for n, (status, reason, _) in FAILURES.items():
        assert tab.loc[n, "failure_kind"] == status and tab.loc[n, "failure_reason"] == reason
        assert tab.loc[n, "state"] == "complete" and tab.loc[n, "value"] == 0.0
    assert tab.loc[PRUNED[0], "state"] == "pruned" and tab.loc[PRUNED[0], "failure_kind"] == ""
    assert tab.loc[max(fx.statuses), "state"] == "running"
    assert (tab.loc[list(fx.trial_tput), "duration_s"] > 100).all()
    assert set(t.log_tails["trial"]) == set(FAILURES)


def test_environment(rep, fx):
    e = rep.environment
    fp = e.fingerprint.set_index("key")["value"]
    assert fp["gpu"] == "NVIDIA H200" and fp["nccl"] == "2.21.5"
    assert e.dropped.empty
    assert e.noise.median == pytest.approx(statistics.median(fx.baseline_repeats))
    assert e.noise.runs == pytest.approx(fx.baseline_repeats)
    assert e.hardware.set_index("key").loc["gpu_count", "value"] == 8
    study = e.study.set_index("key")["value"]
    assert study["coordinator sessions"] == "2 (1 unfinished, not counted)"
    assert study["wall time, all sessions"] == "90 s"


# --------------------------------------------------------------------------- the HTML


class _WellFormed(html.parser.HTMLParser):
    """Checks that every non-void element is closed in order; collects ids and resource references."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.refs: list[tuple[str, str, str]] = []
        self.tags: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k == "id":
                self.ids.append(v)
            if k in ("src", "href", "xlink:href", "srcset", "data", "action", "poster") and v is not None:
                self.refs.append((tag, k, v))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k == "id":
                self.ids.append(v)
            if k in ("src", "href", "xlink:href") and v is not None:
                self.refs.append((tag, k, v))

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}> at {self.getpos()}")
        else:
            self.stack.pop()


def _parse(page: str) -> _WellFormed:
    p = _WellFormed()
    p.feed(page)
    p.close()
    return p


def test_html_well_formed_and_self_contained(page):
    p = _parse(page)
    assert not p.errors, p.errors[:5]
    assert p.stack == [], p.stack
    assert page.startswith("<!DOCTYPE html>")
    for sid in SECTION_IDS:
        assert sid in p.ids
    assert len(p.ids) == len(set(p.ids)), "duplicate element ids"
    for tag, attr, ref in p.refs:
        assert ref.startswith("#") or ref.startswith("data:"), (tag, attr, ref)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(http" not in page
    assert p.tags.get("svg", 0) >= 10, p.tags.get("svg")
    assert p.tags.get("img", 0) == 0 and p.tags.get("link", 0) == 0
    assert p.tags.get("script", 0) == 1  # the inline sort script only
    assert "<script src" not in page


def test_html_sections_and_content(page, fx):
    for i, heading in enumerate(("Summary", "How to read this report", "Search", "Where the time goes",
                                 "GPU time", "Compile time", "Numerics", "Memory", "Kernels", "Data", "Trials", "Environment"),
                                start=1):
        assert f"<h2>{i}. {heading}</h2>" in page
    assert 'class="section-error"' not in page and "section-error" not in page
    assert "Memory analysis not run" in page and "No kernel sweep ran" in page
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    assert "<h3>Against plain loops</h3>" in summary
    assert ("Against the plain compiled loop (torch.compile, default mode, no CUDA graphs): 1.300x [1.210, 1.390] "
            "over 2 interleaved A/B pairs.") in summary
    search = page.split('<section id="search">', 1)[1].split("</section>", 1)[0]
    assert "<h3>Where the GPU-minutes went</h3>" in search and "7 at 1 window, 2 at 4 windows" in search
    assert "CPU-minutes" not in search  # the fixture's tune.json names no device: a GPU study's
    assert "<h3>Gradient lifetimes</h3>" in page and 'data-title="Gradient buckets over the backward"' in page
    # Escaped: the config comment and a failure reason contain '<...>'.
    assert f"trial &lt;{fx.best}&gt;" in page and "&lt;after warm-up&gt;" in page
    assert "<after warm-up>" not in page
    assert 'table id="trials-table" class="sortable trials"' in page
    assert page.count("<tr") >= len(fx.statuses)
    guide = page.split('<section id="guide">', 1)[1].split("</section>", 1)[0]
    assert "Only the A/B validation decides the winner" in guide and "significant" in guide
    assert "<code>validation.json</code>" in guide and "<code>data_wait</code>" in guide
    assert len(re.sub(r"<[^>]+>", "", guide).split()) < 400  # short: a guide, not a manual
    # The trials table: the knob columns come before the failure's kind and reason (the widest column).
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", page.split('id="trials-table"', 1)[1].split("</thead>", 1)[0])
    heads = [h.replace("\u200b", "") for h in heads]
    assert heads.index("expandable_segments") < heads.index("failure") < heads.index("reason") == len(heads) - 1
    # The knob plots: a labelled colour bar for the trial number, category labels for categorical knobs.
    search = page.split('<section id="search">', 1)[1].split("</section>", 1)[0]
    assert "trial number (colour)" in search


def test_long_failure_text_is_one_clipped_line_and_tables_sit_in_a_box(page):
    """Issue 40: an OOM row of the trials table was a tall empty band (its reason wrapped at the far right); the
    reason is one line now, cut by the style sheet, with the full text as its title. Every table sits in a box that
    scrolls sideways (the trials table in its own), so no table widens the page."""
    trials = page.split('<section id="trials">', 1)[1].split("</section>", 1)[0]
    reason = html.escape(FAILURES[5][1], quote=True)
    assert f'<td class="reason"><div class="clip" title="{reason}">{reason}</div></td>' in trials
    css = page.split("<style>", 1)[1].split("</style>", 1)[0]
    clip = re.search(r"div\.clip \{([^}]*)\}", css).group(1)
    assert "white-space:nowrap" in clip and "overflow:hidden" in clip and "text-overflow:ellipsis" in clip
    assert re.search(r"div\.tbox \{[^}]*overflow-x:auto", css)
    body = page.split("<main>", 1)[1]
    tables = [m.start() for m in re.finditer(r"<table\b", body)]
    assert len(tables) >= 10
    for at in tables:
        before = body[:at]
        assert before.endswith('<div class="tbox">') or before.endswith('<div class="scroll">\n'), before[-80:]


def test_exported_config_is_collapsed(page, fx):
    """Issue 40: the whole exported config was expanded inside the Summary; it is one closed <details> now."""
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    m = re.search(r'<details class="config"><summary>([^<]*)</summary><pre class="config">', summary)
    assert m, "the exported config is not inside a <details> block"
    lines = len((fx.dir / "config.yaml").read_text().splitlines())
    assert m.group(1) == f"Show the exported config.yaml ({lines} lines)"
    assert summary.count('<pre class="config">') == 1 and "<details open" not in summary


def test_figures_carry_ids_for_the_browser_check(page):
    """Every figure's <svg> is numbered and titled, and names its axes and data artists (test_report_browser
    measures them in Chromium)."""
    svgs = re.findall(r"<svg\b[^>]*>.*?</svg>", page, re.S)
    assert len(svgs) >= 10
    for n, svg in enumerate(svgs, start=1):
        head = svg[:svg.index(">")]
        assert f'data-figure="{n}"' in head and 'data-title="' in head, head[:200]
        assert re.search(rf'id="f{n}-ax\d+-bg"', svg) and re.search(rf'id="f{n}-ax\d+-data\d+"', svg), n
    loader = next(s for s in svgs if 'data-title="Loader throughput vs training"' in s)
    assert not re.search(r'id="f\d+-ax\d+-ref\d+"', loader)  # headroom far above 1x: no reference line drawn


def test_report_is_deterministic_but_for_its_timestamp(fx, page):
    again = build_report(fx.dir, fx.storage_url, fx.name).read_text()
    strip = lambda s: re.sub(r"Generated [^<]* from", "", s)  # noqa: E731
    assert strip(again) == strip(page)
    assert oct((fx.dir / "report.html").stat().st_mode & 0o777) == "0o644"
    assert not list(fx.dir.glob(".report-*")), "temporary file left behind"
