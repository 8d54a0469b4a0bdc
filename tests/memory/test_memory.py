"""Memory domain on the CPU: the snapshot analysis and its suggestion rules on synthetic snapshots (the structure
``torch.cuda.memory._snapshot()`` returns), the report reading ``memory_analysis.json``, allocator settings
checked against the installed torch, ``analyze`` refusing to run without CUDA, pinned staging blocks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from workbench.config import AllocatorConfig, ConfigError, merge_overrides, preset_config
from workbench.memory import FRAG_HIGH_PCT, GC_THRESHOLD, ROUND_WASTE_MAX, analyze_snapshot, format_table, round_block_size
from workbench.memory.__main__ import main as memory_main
from workbench.train import allocator
from workbench.train.allocator import apply_allocator_settings, check_allocator_settings

MiB, GiB = 2 ** 20, 2 ** 30


def _snapshot(trace: list[dict], segments: list[dict]) -> dict:
    return {"segments": segments, "device_traces": [trace]}


def _segment(total: int, blocks: list[tuple[int, str]]) -> dict:
    return {"device": 0, "address": 0, "total_size": total, "stream": 0, "segment_type": "large",
            "allocated_size": sum(s for s, st in blocks if st == "active_allocated"),
            "blocks": [{"size": s, "requested_size": s, "state": st, "address": 0} for s, st in blocks]}


def _allocs(sizes: list[int]) -> list[dict]:
    return [{"action": "alloc", "addr": i, "size": s, "stream": 0, "time_us": i} for i, s in enumerate(sizes)]


# --------------------------------------------------------------------------- the analysis


def test_round_block_size_follows_the_caching_allocator():
    assert round_block_size(1) == 512 and round_block_size(512) == 512 and round_block_size(513) == 1024
    # roundup_power2_divisions D: D equal steps between two powers of two (torch's roundup_power2_next_division)
    assert round_block_size(int(1.3 * MiB), 4) == int(1.5 * MiB)
    assert round_block_size(5 * MiB + 1, 2) == 6 * MiB
    assert round_block_size(4 * MiB, 4) == 4 * MiB  # a power of two stays
    assert round_block_size(2000, 4) == 2048  # at most 512 x D: plain 512-byte rounding
    assert round_block_size(3000, 4) == 3072


def test_histogram_timeline_peaks_and_fragmentation():
    trace = [{"action": "segment_alloc", "addr": 0, "size": 20 * MiB, "time_us": 0},
             {"action": "alloc", "addr": 0, "size": 4 * MiB, "time_us": 1},
             {"action": "alloc", "addr": 1, "size": 8 * MiB, "time_us": 2},
             {"action": "free_requested", "addr": 0, "size": 4 * MiB, "time_us": 3},
             {"action": "free_completed", "addr": 0, "size": 4 * MiB, "time_us": 4},
             {"action": "alloc", "addr": 2, "size": 2 * MiB, "time_us": 5},
             {"action": "alloc", "addr": 3, "size": 100, "time_us": 6}]
    seg = _segment(20 * MiB, [(8 * MiB, "active_allocated"), (2 * MiB, "active_allocated"),
                              (512, "active_allocated"), (10 * MiB - 512, "inactive")])
    doc = analyze_snapshot(_snapshot(trace, [seg]))
    assert doc["allocations"] == 4
    hist = {r["size_bytes"]: r["count"] for r in doc["allocation_size_histogram"]}
    assert hist == {128: 1, 2 * MiB: 1, 4 * MiB: 1, 8 * MiB: 1}  # bins (2^(k-1), 2^k] by upper edge
    tl = [(p["allocated_bytes"], p["reserved_bytes"]) for p in doc["timeline"]]
    assert tl == [(0, 20 * MiB), (4 * MiB, 20 * MiB), (12 * MiB, 20 * MiB), (8 * MiB, 20 * MiB),
                  (8 * MiB, 20 * MiB), (10 * MiB, 20 * MiB), (10 * MiB + 512, 20 * MiB)]
    assert doc["peak"] == {"allocated_bytes": 12 * MiB, "reserved_bytes": 20 * MiB, "source": "trace"}
    fr = doc["fragmentation"]
    assert fr["at_peak_allocated_bytes"] == 8 * MiB and fr["at_peak_allocated_pct"] == pytest.approx(40.0)
    assert fr["max_bytes"] == 20 * MiB and fr["final_bytes"] == 10 * MiB - 512
    assert doc["segments"]["largest_inactive_block_bytes"] == 10 * MiB - 512
    # the oldest entries fell out of the ring buffer: the end of the timeline is still exact
    cut = analyze_snapshot(_snapshot(trace[3:], [seg]))
    assert [(p["allocated_bytes"], p["reserved_bytes"]) for p in cut["timeline"]] == tl[3:]
    # the allocator's statistics give exact peaks and the retry count
    stats = {"allocated_bytes.all.peak": 13 * MiB, "reserved_bytes.all.peak": 22 * MiB, "num_alloc_retries": 0,
             "num_ooms": 0}
    doc = analyze_snapshot(_snapshot(trace, [seg]), stats=stats, steps=3)
    assert doc["peak"]["source"] == "memory_stats" and doc["peak"]["reserved_bytes"] == 22 * MiB
    assert doc["alloc_retries"] == 0 and doc["ooms"] == 0 and doc["steps"] == 3
    text = format_table(doc)
    assert "peak reserved" in text and "0.02 GiB" in text and "suggestions:" in text


def test_timeline_is_capped_but_keeps_the_peak():
    sizes = [MiB] * 500 + [64 * MiB] + [MiB] * 500
    trace = _allocs(sizes)
    for i in range(len(trace) - 1, -1, -1):  # free everything again, newest first
        trace.append({"action": "free_requested", "addr": i, "size": sizes[i]})
    seg = _segment(2 * GiB, [(2 * GiB, "inactive")])
    doc = analyze_snapshot(_snapshot(trace, [seg]), points=50)
    assert len(doc["timeline"]) <= 52
    assert max(p["allocated_bytes"] for p in doc["timeline"]) == doc["peak"]["allocated_bytes"] == 1064 * MiB


def test_no_suggestion_when_sizes_repeat_and_fragmentation_is_low():
    sizes = [64 * MiB, 3 * MiB, 200] * 50  # a fixed-shape loop: the same few sizes every step
    seg = _segment(int(64 * MiB * 1.05), [(64 * MiB, "active_allocated"), (int(64 * MiB * 0.05), "inactive")])
    trace = _allocs(sizes) + [{"action": "free_requested", "addr": 0, "size": 3 * MiB}] * 50 \
        + [{"action": "free_requested", "addr": 0, "size": 200}] * 50 \
        + [{"action": "free_requested", "addr": 0, "size": 64 * MiB}] * 49
    doc = analyze_snapshot(_snapshot(trace, [seg]), stats={"num_alloc_retries": 0})
    assert doc["suggested_allocator"] == {}
    texts = " ".join(s["text"] for s in doc["suggestions"])
    assert "already repeat" in texts and "Fragmentation is low" in texts
    assert all(s["key"] is None for s in doc["suggestions"])


def test_many_distinct_large_sizes_suggest_the_coarsest_rounding_within_the_waste_budget():
    # 200 sizes spread over [64, 128) MiB: 2 steps per power of two waste ~16%, 4 ~8%, 8 ~4% (< 5%)
    sizes = [64 * MiB + (i * 64 * MiB) // 200 + 4096 * (i % 7) + 1000 for i in range(200)]
    doc = analyze_snapshot(_snapshot(_allocs(sizes), []))
    assert doc["suggested_allocator"] == {"roundup_power2_divisions": 8}
    waste = sum(round_block_size(s, 8) - s for s in sizes) / sum(sizes)
    assert waste <= ROUND_WASTE_MAX < sum(round_block_size(s, 4) - s for s in sizes) / sum(sizes)
    (s,) = [s for s in doc["suggestions"] if s["key"]]
    assert s["key"] == "loongforge.memory_domain.allocator.roundup_power2_divisions" and s["value"] == 8
    assert "200 distinct sizes" in s["text"] and "leaves 8" in s["text"]
    # already in effect: not suggested again
    doc = analyze_snapshot(_snapshot(_allocs(sizes), []), allocator=AllocatorConfig(roundup_power2_divisions=8))
    assert "roundup_power2_divisions" not in doc["suggested_allocator"]


def test_high_fragmentation_and_retries_suggest_expandable_segments_split_and_gc():
    # 90 requests of 40 MiB and 10 of 1 GiB; at peak allocation 40% of the reserved memory is unused
    sizes = [40 * MiB] * 90 + [GiB] * 10
    trace = [{"action": "segment_alloc", "size": 24 * GiB}] + _allocs(sizes)
    alloc = 90 * 40 * MiB + 10 * GiB
    seg = _segment(24 * GiB, [(alloc, "active_allocated"), (24 * GiB - alloc, "inactive")])
    doc = analyze_snapshot(_snapshot(trace, [seg]), stats={"num_alloc_retries": 3})
    assert doc["fragmentation"]["at_peak_allocated_pct"] >= FRAG_HIGH_PCT
    assert doc["suggested_allocator"] == {"expandable_segments": True, "max_split_size_mb": 64,
                                          "garbage_collection_threshold": GC_THRESHOLD}
    split = next(s for s in doc["suggestions"] if s["key"] and s["key"].endswith("max_split_size_mb"))
    assert "at most 40.0 MiB" in split["text"] and "10 larger ones" in split["text"]
    # the suggested settings are valid config values
    cfg = merge_overrides(preset_config("tiny"), {f"loongforge.memory_domain.allocator.{k}": v
                                                  for k, v in doc["suggested_allocator"].items()})
    assert cfg.loongforge.memory_domain.allocator.max_split_size_mb == 64
    # retries alone count as high fragmentation; what is in effect is not suggested again
    doc = analyze_snapshot(_snapshot(_allocs([MiB * 2] * 10), []), stats={"num_alloc_retries": 1},
                           allocator=AllocatorConfig(expandable_segments=True))
    assert doc["suggested_allocator"] == {"garbage_collection_threshold": GC_THRESHOLD}


def test_the_report_reads_memory_analysis_json(tmp_path):
    from reports._load import load_study_data
    from reports.sections import memory_section, time_section

    trace = [{"action": "segment_alloc", "size": 20 * MiB}] + _allocs([4 * MiB, 8 * MiB])
    seg = _segment(20 * MiB, [(12 * MiB, "active_allocated"), (8 * MiB, "inactive")])
    doc = analyze_snapshot(_snapshot(trace, [seg]), stats={"allocated_bytes.all.peak": 12 * MiB,
                                                            "reserved_bytes.all.peak": 20 * MiB,
                                                            "num_alloc_retries": 0})
    (tmp_path / "memory_analysis.json").write_text(json.dumps(doc))
    base = tmp_path / "baseline" / "0"
    base.mkdir(parents=True)
    (base / "summary.json").write_text(json.dumps({
        "phase_s_per_step": {"forward": 0.1, "backward": 0.2, "grad_sync": 0.01},
        "comm/total_s": 0.05, "comm/exposed_s": 0.01, "comm/overlap_pct": 80.0, "comm/mode": "scheduler",
        "comm/buckets": 12, "comm/bucket_size_mb": 25.0, "comm/overlap_ratio": 1.0}))
    data = load_study_data(tmp_path)
    m = memory_section(data)
    assert m.analysis_message is None and m.analysis_source == "memory_analysis.json"
    assert dict(zip(m.histogram["size_bytes"], m.histogram["count"])) == {4 * MiB: 1, 8 * MiB: 1}
    assert m.suggestions == [s["text"] for s in doc["suggestions"]]
    summary = dict(zip(m.analysis_summary["metric"], m.analysis_summary["value"]))
    assert summary["peak reserved GiB"] == pytest.approx(20 / 1024)
    assert summary["unused reserved at peak allocation %"] == pytest.approx(40.0)
    assert list(m.fragmentation["fragmentation_gib"] * 1024) == pytest.approx([20, 16, 8])
    assert m.suggested_allocator == doc["suggested_allocator"]
    t = time_section(data)
    assert t.comm_message is None
    row = t.comm.loc["baseline"]
    assert (row["comm_total_s"], row["comm_exposed_s"], row["overlap_pct"]) == (0.05, 0.01, 80.0)
    assert row["mode"] == "scheduler" and row["buckets"] == 12
    # rendered: the communication table and the analysis summary and timeline reach the HTML
    from reports import build_report

    page = build_report(tmp_path).read_text()
    assert "Gradient communication" in page and "80" in page and "scheduler" in page
    assert "unused reserved at peak allocation %" in page and "Fragmentation over the recorded steps" in page
    assert "section-error" not in page
    (base / "summary.json").write_text(json.dumps({"phase_s_per_step": {"forward": 0.1}}))
    t = time_section(load_study_data(tmp_path))
    assert t.comm.empty and "single-process" in t.comm_message


# --------------------------------------------------------------------------- allocator settings


def _raiser(message: str):
    def setter(text: str) -> None:
        raise ValueError(message)
    return setter


def test_an_option_torch_does_not_know_is_a_config_error_naming_the_key():
    err = "Unrecognized key 'expandable_segments' in Accelerator allocator config."
    with pytest.raises(ConfigError) as e:
        check_allocator_settings("expandable_segments:True", config_options={"expandable_segments": True},
                                 setter=_raiser(err))
    assert e.value.key == "loongforge.memory_domain.allocator.expandable_segments"
    assert f"torch {torch.__version__} rejects the allocator setting expandable_segments:True" in str(e.value)
    assert err in str(e.value)
    # older torch words it differently
    with pytest.raises(ConfigError, match=r"allocator\.garbage_collection_threshold: .*Unrecognized Caching"):
        check_allocator_settings("max_split_size_mb:64,garbage_collection_threshold:0.6",
                                 config_options={"max_split_size_mb": 64, "garbage_collection_threshold": 0.6},
                                 setter=_raiser("Unrecognized CachingAllocator option: garbage_collection_threshold"))
    # an option that came from the user's environment, not the config
    with pytest.raises(ConfigError, match=r"^PYTORCH_CUDA_ALLOC_CONF: .*'pinned_bogus' from the environment"):
        check_allocator_settings("pinned_bogus:1,max_split_size_mb:64", config_options={"max_split_size_mb": 64},
                                 setter=_raiser("Unrecognized key 'pinned_bogus' in Accelerator allocator config."))


def test_values_the_installed_torch_refuses_name_their_option():
    # the installed torch's own parser (a CPU build parses values; only a CUDA build knows the option names)
    with pytest.raises(ConfigError, match=r"allocator\.max_split_size_mb: .*max_split_size_mb:5: .*>= 20"):
        check_allocator_settings("max_split_size_mb:5", config_options={"max_split_size_mb": 5})
    with pytest.raises(ConfigError, match=r"allocator\.expandable_segments: .*'maybe'"):
        check_allocator_settings("garbage_collection_threshold:0.5,expandable_segments:maybe",
                                 config_options={"garbage_collection_threshold": 0.5, "expandable_segments": "maybe"})
    check_allocator_settings("expandable_segments:False,roundup_power2_divisions:4,max_split_size_mb:512,"
                             "garbage_collection_threshold:0.8", config_options={})
    check_allocator_settings("", config_options={}, setter=_raiser("never called"))


def test_apply_allocator_settings_writes_the_environment_and_checks_before_the_loop(monkeypatch, tmp_path):
    cfg = merge_overrides(preset_config("tiny"), {"loongforge.memory_domain.allocator.max_split_size_mb": 128,
                                                  "loongforge.memory_domain.allocator.expandable_segments": True,
                                                  "hardware.device": "cpu"})
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:native"}
    assert apply_allocator_settings(cfg, env) == "backend:native,expandable_segments:True,max_split_size_mb:128"
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.setenv(var, "")  # recorded, so that teardown restores the variable whatever this test writes
        monkeypatch.delenv(var)
    assert apply_allocator_settings(preset_config("tiny")) == ""  # nothing set: nothing written or checked
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    seen = []
    monkeypatch.setattr(allocator, "_allocator_setter", lambda: seen.append)
    assert apply_allocator_settings(cfg) == "expandable_segments:True,max_split_size_mb:128"
    assert seen == ["expandable_segments:True,max_split_size_mb:128"]
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == seen[0]
    # the loop applies and checks them first thing: a rejected option is an invalid config, before any work
    from workbench.train.trainer import Trainer

    monkeypatch.setattr(allocator, "_allocator_setter",
                        lambda: _raiser("Unrecognized key 'expandable_segments' in Accelerator allocator config."))
    with pytest.raises(ConfigError, match=r"^loongforge\.memory_domain\.allocator\.expandable_segments"):
        Trainer(cfg, data_dir=tmp_path)


# --------------------------------------------------------------------------- the CLI without CUDA


def test_analyze_says_it_needs_cuda(capsys):
    assert not torch.cuda.is_available()
    assert memory_main(["analyze", "--preset", "tiny", "--steps", "2"]) == 2
    assert "workbench.memory analyze needs CUDA" in capsys.readouterr().err


def test_analyze_module_entry_point_exits_2_on_cpu(subprocess_env, tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench.memory", "analyze", "--preset", "tiny", "--out",
                        str(tmp_path)], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "workbench.memory analyze needs CUDA" in r.stderr
    assert not (tmp_path / "memory_analysis.json").exists()


# --------------------------------------------------------------------------- pinned staging blocks


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from workbench.train import synthetic_data_dir

    old = os.environ.get("LOONGFORGE_CACHE")
    os.environ["LOONGFORGE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        return synthetic_data_dir(vocab_size=4096, seq_len=256, num_docs=300, seed=0)
    finally:
        if old is None:
            os.environ.pop("LOONGFORGE_CACHE")
        else:
            os.environ["LOONGFORGE_CACHE"] = old


def test_staging_blocks_follow_the_seed_formula_and_are_allocated_once(synth):
    from loaders.format import ShardSet
    from loaders.pipeline import BatchPipeline, default_block_bytes

    mb = 4
    with ShardSet(synth) as shards:
        max_len = int(shards.manifest.get("max_len", int(shards.bucket_length.max())))
        with BatchPipeline(shards, micro_batch_size=mb, num_workers=0, io_backend="threadpool", epochs=2,
                           num_staging_blocks=3) as pl:
            assert pl.ring.block_bytes == default_block_bytes(max_len, mb) == math.ceil(max_len * 9 * mb / 4096) * 4096
            blocks = list(pl.ring.blocks)
            spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in blocks]
            n = 0
            for batch in pl:  # two whole epochs
                ptr = batch.input_ids.data_ptr()  # a CPU batch is a view of its staging block
                assert any(lo <= ptr < hi for lo, hi in spans)
                n += 1
            assert n == 2 * pl.batches_per_epoch and n > len(blocks)
            assert [b.data_ptr() for b in pl.ring.blocks] == [lo for lo, _ in spans]
            assert all(a is b for a, b in zip(pl.ring.blocks, blocks))


def test_the_loop_feeds_pinned_block_kb_from_the_config(synth):
    from loaders.pipeline import default_block_bytes
    from workbench.train.trainer import Trainer

    base = {"hardware.device": "cpu", "data.seq_len": 256, "data.micro_batch_size": 4, "data.num_workers": 0,
            "training.dtype": "fp32"}
    for kb, expected in ((64, 64 * 1024), (None, default_block_bytes(256, 4))):
        cfg = merge_overrides(preset_config("tiny"), {**base, "loongforge.memory_domain.pinned_block_kb": kb})
        trainer = Trainer(cfg, data_dir=synth)
        try:
            assert trainer.pipeline.ring.block_bytes == expected
        finally:
            trainer.close()
