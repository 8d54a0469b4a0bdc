"""Preflight (``workbench.tune.preflight``): the data folder, the model config, the trainer command and the
output folder are checked before baseline 0, each one line and exit 2 (issue 40: a missing shard folder ran and
failed baseline 0, then printed 3 lines naming a temp folder that no longer existed, exit 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from workbench.errors import ConfigError
from workbench.tune.preflight import preflight
from workbench.tune.study import loads_study_spec


def test_a_missing_shard_folder_is_one_line_and_exit_2_before_any_run(study_spec_file, tmp_path, subprocess_env):
    spec = study_spec_file("pf", base={"data": {"loongbin_dir": str(tmp_path / "nope"), "seq_len": 256},
                                       "training": {"global_batch_size": 8}, "hardware": {"device": "cpu"}})
    p = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", "runs",
                        "--no-progress"], capture_output=True, text=True, env=subprocess_env, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == (f"error: {spec}: base.data.loongbin_dir: {tmp_path / 'nope'}: not a directory "
                                "(expected a shard directory written by `python -m loaders.preprocess`)")
    assert not (tmp_path / "runs").exists()  # no study stored, no baseline run


def _spec(tmp_path, **over):
    d = {"name": "pf", "model": "tiny", "base": {"hardware": {"device": "cpu"}, "training": {"global_batch_size": 8}},
         "space": {"micro_batch_size": {"choices": [1, 8]}}, "budget": {"trials": 1}, **over}
    return loads_study_spec(yaml.safe_dump(d), source="pf.yaml", base_dir=tmp_path)


def test_each_check_names_its_key(tmp_path):
    preflight(_spec(tmp_path))  # synthetic data, a preset: nothing to find
    with pytest.raises(ConfigError, match=r"^pf.yaml: model: .*missing.json: no such file"):
        preflight(_spec(tmp_path, model=str(tmp_path / "missing.json")))
    with pytest.raises(ConfigError, match=r"^pf.yaml: trainer.command: no-such-loop-xyz: not found on PATH"):
        preflight(_spec(tmp_path, trainer={"command": ["no-such-loop-xyz"]}))
    with pytest.raises(ConfigError, match=r"^pf.yaml: trainer.command: ./loop.sh: not found in "):
        preflight(_spec(tmp_path, trainer={"command": ["./loop.sh"]}))
    (tmp_path / "loop.sh").write_text("#!/bin/sh\n")
    (tmp_path / "loop.sh").chmod(0o755)
    preflight(_spec(tmp_path, trainer={"command": ["./loop.sh"]}))
    # a --out that is not a writable folder: tests/tune/test_tune_faults.py (one line, exit 2, before any run)
