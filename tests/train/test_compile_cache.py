"""One compile cache per study: the baseline compiles the tiny model's blocks with Inductor (cold) into
runs/<study>/compile-cache/, and the trial after it, whose graphs are the same, loads every one of them (warm)."""

from __future__ import annotations

import json

from workbench.tune.study import load_study_spec
from workbench.tune import Tuner


def test_trials_share_the_study_compile_cache(study_spec_file, tmp_path):
    base = {
        "data": {"seq_len": 128, "micro_batch_size": 4, "bucket_width": 128, "min_len": 128, "num_workers": 0,
                 "packing": "fill"},
        "training": {"global_batch_size": 4, "max_steps": 6, "dtype": "fp32"},
        "loongforge": {"compute_domain": {"compile": "default", "compile_scope": "layer"}},
        "hardware": {"device": "cpu"},
    }
    path = study_spec_file("cache", space={"num_workers": {"choices": [0, 1]}}, trials=1, base=base,
                           protocol={"baseline_repeats": 1, "top_k": 0, "warmup_steps": 1, "window_steps": 1,
                                     "windows": 2, "trial_timeout_s": 400, "heartbeat_timeout_s": 300})
    path.write_text(path.read_text() + "seed_trials:\n  - {num_workers: 1}\n")
    tuner = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, report=False)
    study = tuner.open()
    tuner.run()
    sdir = tmp_path / "runs" / "cache"
    cache = sdir / "compile-cache" / "inductor"
    assert cache.is_dir() and any(p.is_file() for p in cache.rglob("*"))
    cold = json.loads((sdir / "baseline" / "0" / "summary.json").read_text())
    (trial,) = study.get_trials()
    warm = trial.user_attrs["summary"]
    assert trial.params == {"num_workers": 1} and trial.user_attrs["status"] == "ok"
    assert cold["compile/fx_graph_cache_miss"] > 0 and cold["compile/fx_graph_cache_hit"] == 0
    assert warm["compile/fx_graph_cache_miss"] == 0
    assert warm["compile/fx_graph_cache_hit"] == cold["compile/fx_graph_cache_miss"]
    assert warm["time/compile_s"] < cold["time/compile_s"]
