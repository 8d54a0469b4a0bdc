"""A search trial whose config was already measured is not run again: the sampler's repeat gets the earlier
trial's result (``duplicate_of``), counts against the budget, and costs no device time. A stand-in trainer that
follows the trial contract keeps the test fast."""

from __future__ import annotations

import sys

from workbench.tune import Tuner
from workbench.tune.study import load_study_spec

# the trial contract in a few lines: heartbeat, two measured windows (throughput = 1000 x micro-batch), summary
FAKE = """
import json, pathlib, sys, yaml
cfg, d = yaml.safe_load(open(sys.argv[1])), pathlib.Path(sys.argv[2])
mb = cfg["data"]["micro_batch_size"]
(d / "heartbeat").write_text("6")
with open(d / "metrics.jsonl", "w") as f:
    for step in (4, 6):
        f.write(json.dumps({"step": step, "throughput/real_tokens_per_s_per_gpu": 1000.0 * mb}) + "\\n")
(d / "summary.json").write_text(json.dumps({"last_loss": 1.0, "memory/max_rss_gib": 0.1, "windows": 2}))
with open(sys.argv[3], "a") as log:
    log.write(f"{d.name} {mb}\\n")
"""


def test_a_repeated_config_reuses_the_earlier_trial(tmp_path, study_spec_file):
    path = study_spec_file("dup", space={"micro_batch_size": {"choices": [2, 8]}}, trials=6,
                           sampler={"name": "random", "seed": 0},
                           protocol={"baseline_repeats": 1, "top_k": 0, "profile_steps": 0})
    launched = tmp_path / "launched.txt"
    script = tmp_path / "fake.py"
    script.write_text(FAKE)

    def launch(cfg, config_path, trial_dir):
        return [sys.executable, str(script), str(config_path), str(trial_dir), str(launched)]

    tuner = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, report=None, launch=launch)
    tuner.run()
    trials = sorted(tuner.study.get_trials(), key=lambda t: t.number)
    assert len(trials) == 6 and all(t.state.name == "COMPLETE" for t in trials)
    # the stand-in logs "<run folder> <micro-batch>" for every run; the baseline runs in an attempt folder (.0.<id>)
    runs = [line.split() for line in launched.read_text().splitlines()]
    search_runs = [r for r in runs if (tmp_path / "runs" / "dup" / "trials" / r[0]).is_dir()]
    # each distinct config ran once; every other trial names the first trial of its config
    first: dict[int, int] = {}
    for t in trials:
        mb = t.params["micro_batch_size"]
        assert t.values[0] == 1000.0 * mb
        if mb in first:
            assert t.user_attrs["duplicate_of"] == first[mb]
        else:
            first[mb] = t.number
            assert "duplicate_of" not in t.user_attrs
    assert sorted(int(r[0]) for r in search_runs) == sorted(first.values())
    assert len(first) == 2  # the seed gives both choices within 6 draws
