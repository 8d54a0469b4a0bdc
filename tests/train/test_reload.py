"""Config hot reload (workbench/train/reload.py): the diff and its rules, the data position at a new micro-batch,
the trainer's atomic apply, and a live ``python -m workbench.train`` run reloaded twice with SIGUSR1."""

from __future__ import annotations

import json
import logging
import math
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loaders.pipeline import BatchPipeline
from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train import synthetic_data_dir
from workbench.train.metrics import PrometheusExporter
from workbench.train.reload import (ConfigReloader, ConfigSource, ReloadRejected, carry_position, diff, plan_reload,
                                    position_for)
from workbench.train.trainer import Trainer

SEQ = 64


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """The synthetic corpus of the tiny model at 64 tokens, small (300 documents, ~8,800 records): quick to make."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOONGFORGE_CACHE", str(tmp_path_factory.mktemp("cache")))
        return synthetic_data_dir(vocab_size=4096, seq_len=SEQ, num_docs=300, seed=0, min_len=32)


def _cfg(**over):
    base = {"hardware.device": "cpu", "data.seq_len": SEQ, "data.min_len": 32, "data.micro_batch_size": 4,
            "data.packing": "fill", "data.num_workers": 0, "training.global_batch_size": 8, "training.dtype": "fp32"}
    return merge_overrides(preset_config("tiny"), {**base, **over})


# --------------------------------------------------------------------------- the rules (no training)


def test_diff_names_every_changed_key_old_and_new():
    a = _cfg()
    b = _cfg(**{"training.learning_rate": 1e-3, "loongforge.memory_domain.allocator.max_split_size_mb": 64,
                "provenance.study": "s"})
    assert diff(a, a) == {}
    d = diff(a, b)
    assert list(d) == ["training.learning_rate", "loongforge.memory_domain.allocator.max_split_size_mb",
                       "provenance"]  # provenance is null in a: it differs as a whole
    assert d["training.learning_rate"] == (3e-4, 1e-3)
    assert d["loongforge.memory_domain.allocator.max_split_size_mb"] == (None, 64)
    assert d["provenance"][0] is None and d["provenance"][1]["study"] == "s"


def test_allowed_keys_are_applied_and_the_global_batch_stays():
    run = _cfg()
    new = _cfg(**{"training.learning_rate": 2e-3, "training.scheduler": "constant", "training.warmup_steps": 0,
                  "training.min_lr_ratio": 0.5, "training.log_every": 3, "data.micro_batch_size": 2})
    p = plan_reload(run, new, run, world=1, grad_accum=2)
    assert p.grad_accum == (2, 4)  # 8 samples per optimizer step: 4 x 2 before, 2 x 4 after
    t = p.running.training
    assert (t.learning_rate, t.scheduler, t.warmup_steps, t.min_lr_ratio, t.log_every) == (2e-3, "constant", 0, 0.5, 3)
    assert p.running.data.micro_batch_size == 2 and p.running.effective_grad_accum_steps(1) == 4
    assert p.base is new and set(p.changes) == {"training.learning_rate", "training.scheduler",
                                                "training.warmup_steps", "training.min_lr_ratio",
                                                "training.log_every", "data.micro_batch_size"}


def test_explicit_grad_accum_is_re_derived_and_may_only_follow():
    run = _cfg(**{"training.global_batch_size": None, "training.grad_accum_steps": 2})  # 4 x 2 = 8 samples
    p = plan_reload(run, merge_overrides(run, {"data.micro_batch_size": 2}), run, world=1, grad_accum=2)
    assert p.grad_accum == (2, 4) and p.running.training.grad_accum_steps == 4
    # the file may say so itself ...
    both = merge_overrides(run, {"data.micro_batch_size": 2, "training.grad_accum_steps": 4})
    assert plan_reload(run, both, run, world=1, grad_accum=2).running.training.grad_accum_steps == 4
    # ... but not change the global batch
    with pytest.raises(ReloadRejected, match=r"training.grad_accum_steps: the global batch cannot change while "
                                             r"running \(was 8 samples per optimizer step, the file now makes it 12\)"):
        plan_reload(run, merge_overrides(run, {"training.grad_accum_steps": 3}), run, world=1, grad_accum=2)
    with pytest.raises(ReloadRejected, match=r"data.micro_batch_size=3 does not divide the global batch of 8 "):
        plan_reload(run, merge_overrides(run, {"data.micro_batch_size": 3}), run, world=1, grad_accum=2)


def test_any_other_key_rejects_the_whole_reload_naming_it():
    run = _cfg()
    new = _cfg(**{"model.name": "gr00t-n1.6", "training.learning_rate": 1e-3, "data.seq_len": 128})
    with pytest.raises(ReloadRejected) as e:
        plan_reload(run, new, run, world=1, grad_accum=2)
    assert str(e.value) == ("model.name cannot change while running (was 'tiny', now 'gr00t-n1.6'); "
                            "data.seq_len cannot change while running (was 64, now 128)")
    with pytest.raises(ReloadRejected, match=r"training.global_batch_size: the global batch cannot change"):
        plan_reload(run, _cfg(**{"training.global_batch_size": 16}), run, world=1, grad_accum=2)


def test_the_reloader_rejects_a_bad_file_and_several_processes():
    def bad():
        raise ConfigError("got 0; must be >= 1", key="data.micro_batch_size", source="c.yaml")

    r = ConfigReloader(ConfigSource("c.yaml", bad), _cfg())
    with pytest.raises(ReloadRejected, match=r"^c.yaml: data.micro_batch_size: got 0; must be >= 1$"):
        r.plan(_cfg(), world=1, grad_accum=2, device=torch.device("cpu"))
    ok = ConfigReloader(ConfigSource("c.yaml", lambda: _cfg(**{"training.learning_rate": 1e-3})), _cfg())
    with pytest.raises(ReloadRejected, match=r"needs a single process \(WORLD_SIZE=2\)"):
        ok.plan(_cfg(), world=2, grad_accum=1, device=torch.device("cpu"))
    rec = ok.rejected("why", step=5)
    assert (rec["kind"], rec["event"], rec["result"], rec["reason"], ok.counts) == \
        ("event", "config_reload", "rejected", "why", {"applied": 0, "rejected": 1})


def test_the_position_counts_rows_into_the_epoch():
    fill = {"epoch": 2, "batch": 9, "micro_batch_size": 4, "packing": "fill"}
    assert position_for(fill, 2, 1000) == ((2, 18), True)        # 36 rows: batch 18 of 2 rows
    assert position_for(fill, 8, 1000) == ((2, 5), False)        # 36 rows: 4 skipped to the next whole batch of 8
    assert position_for(fill, 8, 5) == ((3, 0), False)           # the epoch has no 6th batch of 8: the next one
    assert position_for({**fill, "packing": "bucket"}, 2, 1000) == ((2, 18), False)  # records, not their order


def test_the_position_of_a_state_written_before_the_rename():
    """A checkpoint's pipeline state from before the loaders took the config's names holds ``micro_batch``."""
    old = {"epoch": 2, "batch": 9, "micro_batch": 4, "packing": "fill"}
    assert position_for(old, 2, 1000) == ((2, 18), True)
    assert position_for(old, 8, 1000) == ((2, 5), False)


def test_a_fill_pipeline_rebuilt_at_a_new_micro_batch_hands_out_the_next_rows(synth):
    """Fill packing: the rows after a rebuild are the rows the old pipeline would have handed out next."""
    kw = dict(packing="fill", seq_len=SEQ, num_workers=0, seed=3)
    with BatchPipeline(synth, micro_batch_size=1, **kw) as ref:
        rows = [next(ref).input_ids.clone() for _ in range(16)]
    old = BatchPipeline(synth, micro_batch_size=4, **kw)
    new = BatchPipeline(synth, micro_batch_size=2, **kw)
    try:
        for _ in range(3):  # 12 rows
            next(old).release()
        assert carry_position(old, new) == "epoch 0 batch 3 -> epoch 0 batch 6 (exact)"
        new.continue_counters(old)
        new.start()
        got = [next(new).input_ids.clone() for _ in range(2)]
        assert torch.equal(torch.cat(got), torch.cat(rows[12:16]))
        m = new.metrics()
        assert m["data/batches"] == 5 and m["data/real_tokens"] == (12 + 4) * SEQ  # both pipelines' batches
        assert m["io/reads"] >= old.metrics()["io/reads"]
    finally:
        old.close()
        new.close()


def test_the_prometheus_counter_has_both_results():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = PrometheusExporter(port)
    try:
        before = _reloads_scraped(port)
        exp.reload("rejected")
        exp.reload("applied")
        exp.reload("rejected")
        after = _reloads_scraped(port)
    finally:
        exp.close()
    assert before == {"applied": 0, "rejected": 0} and after == {"applied": 1, "rejected": 2}


def _reloads_scraped(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}["workbench_config_reloads"]
    assert fam.type == "counter"
    return {s.labels["result"]: s.value for s in fam.samples if s.name == "workbench_config_reloads_total"}


# --------------------------------------------------------------------------- the trainer's apply


def test_a_micro_batch_that_fails_to_compile_is_rolled_back(synth, tmp_path, monkeypatch, caplog):
    """A failure after the plan (here out of memory in precompile) leaves config, accumulation and pipeline as
    they were, and the run goes on; a run without a file has nothing to reload."""
    cfg = _cfg(**{"training.max_steps": 6, "training.warmup_measure_steps": 1, "training.log_every": 2})
    src = ConfigSource("c.yaml", lambda: merge_overrides(cfg, {"data.micro_batch_size": 2}))
    tr = Trainer(cfg, data_dir=synth, out_dir=tmp_path, config_source=src)
    try:
        tr.run(2)
        pipe, calls = tr.pipeline, []

        def oom():
            calls.append(tr.cfg.data.micro_batch_size)
            if len(calls) == 1:
                raise torch.OutOfMemoryError("out of memory (a test)")
            return 0.0

        monkeypatch.setattr(tr, "precompile", oom)
        ev = tr.reload_config()
        assert ev["result"] == "rejected" and "out of memory (a test)" in ev["reason"]
        assert calls == [2, 4]  # the new shapes, then the old ones again
        assert tr.cfg is cfg and tr.grad_accum == 2 and tr.pipeline is pipe
        s = tr.run(4)
        assert s["steps"] == 4 and s["config/reloads_rejected"] == 1 and s["data/batches"] == 8
        tr.reloader.source = None
        with caplog.at_level(logging.WARNING, logger="workbench"):
            assert tr.reload_config() is None
        assert "nothing to reload" in caplog.text
    finally:
        tr.close()
    events = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"kind"' in x]
    assert [e["result"] for e in events] == ["rejected"]


# --------------------------------------------------------------------------- a live run, two reloads


def _lr(peak: float, step: int, *, warmup: int, max_steps: int, min_ratio: float) -> float:
    """The cosine schedule of docs/training.md, at ``step`` (0-based)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(x) for x in lines if x.endswith("}")]


def _beat(path: Path) -> int:
    """The step a heartbeat file holds, read once (the run rewrites it in place: a second read may find it
    empty); -1 while it holds none."""
    try:
        text = path.read_text().strip()
    except OSError:
        return -1
    return int(text) if text.isdigit() else -1


def _wait(pred, proc, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        assert proc.poll() is None, f"the run ended while waiting for {what}: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_live_run_applies_one_reload_and_rejects_the_next(synth, tmp_path, subprocess_env):
    steps, warm, every, gbs = 48, 2, 4, 4
    spec = {"model": {"name": "tiny"},
            "data": {"loongbin_dir": str(synth), "seq_len": SEQ, "min_len": 32, "micro_batch_size": 4,
                     "packing": "fill", "num_workers": 1},
            "training": {"max_steps": steps, "global_batch_size": gbs, "learning_rate": 1e-3, "warmup_steps": 4,
                         "min_lr_ratio": 0.1, "log_every": every, "warmup_measure_steps": warm, "dtype": "fp32"},
            "hardware": {"device": "cpu"}}
    cfg, out, hb = tmp_path / "cfg.yaml", tmp_path / "out", tmp_path / "hb"
    cfg.write_text(yaml.safe_dump(spec))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "workbench.train", "--config", str(cfg), "--out", str(out),
                          "--summary", str(out / "summary.json"), "--heartbeat", str(hb), "--prometheus-port",
                          str(port)], env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jsonl = out / "metrics.jsonl"
    try:
        # running, with a measured window at the first peak
        _wait(lambda: _beat(hb) >= 6, p, "step 6")
        spec["training"]["learning_rate"], spec["data"]["micro_batch_size"] = 3e-3, 2
        cfg.write_text(yaml.safe_dump(spec))
        p.send_signal(signal.SIGUSR1)
        _wait(lambda: [r for r in _records(jsonl) if r.get("kind") == "event"], p, "the first reload")
        # a forbidden key beside an allowed one: nothing of it applies
        spec["training"]["learning_rate"], spec["model"]["name"] = 5e-3, "gr00t-n1.6"
        cfg.write_text(yaml.safe_dump(spec))
        p.send_signal(signal.SIGUSR1)
        _wait(lambda: len([r for r in _records(jsonl) if r.get("kind") == "event"]) == 2, p, "the second reload")
        scraped = _reloads_scraped(port)
        log_text, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, log_text[-3000:]
    assert scraped == {"applied": 1, "rejected": 1}

    recs = _records(jsonl)
    applied, rejected = [r for r in recs if r.get("kind") == "event"]
    assert applied["result"] == "applied" and applied["changes"] == {
        "data.micro_batch_size": [4, 2], "training.learning_rate": [0.001, 0.003],
        "training.grad_accum_steps (derived)": [1, 2]}
    assert rejected["result"] == "rejected" and rejected["reason"] == \
        "model.name cannot change while running (was 'tiny', now 'gr00t-n1.6')"
    assert f"config reload at step {applied['step']} ({cfg}): applied data.micro_batch_size 4->2" in log_text
    assert f"config reload at step {rejected['step']} ({cfg}): rejected" in log_text
    s1, s2 = applied["step"], rejected["step"]
    assert 6 <= s1 < s2 <= steps - 2 * every  # both while it ran, windows after each

    windows = [r for r in recs if "kind" not in r]
    assert s1 in [w["step"] for w in windows]  # the reload closed the window it was in
    assert sum(w["step"] > s2 for w in windows) >= 2
    for w in windows:  # the new peak from the first reload on; the rejected one changed nothing
        peak = 1e-3 if w["step"] <= s1 else 3e-3
        assert w["lr"] == pytest.approx(_lr(peak, w["step"] - 1, warmup=4, max_steps=steps, min_ratio=0.1),
                                        rel=1e-12), w["step"]
        # micro-batches consumed: 1 a step (4 rows) to the reload, then 2 (2 rows each)
        assert w["data/batches"] == min(w["step"], s1) + 2 * max(0, w["step"] - s1), w["step"]
    phases = pd.read_csv(out / "phases.csv")
    assert len(phases) == steps
    assert (phases["padded_tokens"] == gbs * SEQ).all()  # samples per optimizer step: 4 throughout (fill rows)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["config/reloads_applied"] == 1 and summary["config/reloads_rejected"] == 1
    assert summary["grad_accum_steps"] == 2 and summary["steps"] == steps
    assert summary["data/batches"] == s1 + 2 * (steps - s1)
