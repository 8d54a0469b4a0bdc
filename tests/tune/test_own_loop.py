"""A study's own training loop (docs/trial-contract.md), the parts the examples' end-to-end runs do not isolate:
user knobs in the spec, a process that never reports, the command run without a shell, and a spec from elsewhere
shown before it runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from workbench.config import ConfigError
from workbench.tune import TuneError, Tuner
from workbench.tune.study import load_study_spec, loads_study_spec
from workbench.tune.trial import command_launcher, run_trial

SPEC = {"name": "own", "trainer": {"command": ["python", "loop.py"]},
        "base": {"hardware": {"device": "cpu"}, "training": {"global_batch_size": 8}},
        "space": {"micro_batch_size": {"choices": [1, 8]}, "user.lr_scale": {"low": 0.5, "high": 2.0},
                  "user.workers": {"low": 0, "high": 4}, "user.fused": {"choices": [False, True]},
                  "user.kernel": {"choices": ["a", "b"]}},
        "budget": {"trials": 2}}


def test_user_knobs_take_their_kind_from_their_range_and_land_in_the_user_section(tmp_path):
    spec = loads_study_spec(yaml.safe_dump(SPEC, sort_keys=False), source="own.yaml", base_dir=tmp_path)
    assert [spec.knob(n).kind for n in ("user.lr_scale", "user.workers", "user.fused", "user.kernel")] == \
        ["float", "int", "bool", "categorical"]
    assert spec.knob_order() == ["micro_batch_size", "user.lr_scale", "user.workers", "user.fused", "user.kernel"]
    assert spec.trainer.cwd == str(tmp_path)  # the command runs beside its spec file by default
    cfg = spec.trial_config({"micro_batch_size": 8, "user.workers": 3, "user.kernel": "b"})
    assert cfg.user == {"workers": 3, "kernel": "b"} and cfg.data.micro_batch_size == 8


@pytest.mark.parametrize(("change", "words"), [
    ({"trainer": None}, "space.user.lr_scale: a user.* knob needs a loop of one's own"),
    ({"space": {"user.2x": {"choices": [1]}}}, "space.user.2x: knob 'user.2x': a user knob is 'user.' followed by"),
    ({"trainer": {"command": []}}, "trainer.command: got []; expected a non-empty list"),
    ({"trainer": {"command": ["python"], "env": {"WORKBENCH_OUT": "x"}}}, "trainer.env.WORKBENCH_OUT"),
])
def test_bad_own_loop_specs_name_the_key(change, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
        loads_study_spec(yaml.safe_dump({**SPEC, **change}, sort_keys=False), source="own.yaml")


def test_a_process_that_never_reports_is_no_report_not_a_hang(tmp_path):
    from workbench.config import Config

    silent = command_launcher(["python", "-c", "import time; time.sleep(60)"])
    out = run_trial(Config(), tmp_path / "silent", timeout_s=60, heartbeat_timeout_s=1.5, launch=silent)
    assert out.status == "no_report" and "no heartbeat 1.5 s after launch" in out.failure_reason
    assert out.wall_s < 10
    quiet = command_launcher(["python", "-c", "import workbench\nwith workbench.run(): pass"])
    out = run_trial(Config(), tmp_path / "quiet", timeout_s=60, heartbeat_timeout_s=30, launch=quiet)
    assert out.status == "no_report" and "without reporting a measured window" in out.failure_reason
    missing = command_launcher(["/nonexistent/train"])
    out = run_trial(Config(), tmp_path / "missing", timeout_s=60, heartbeat_timeout_s=30, launch=missing)
    assert out.status == "invalid_config" and "cannot start '/nonexistent/train'" in out.failure_reason


def test_the_command_runs_without_a_shell_with_the_trial_in_its_environment(tmp_path):
    from workbench.config import Config

    probe = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
             "'config': os.environ['WORKBENCH_CONFIG'], 'out': os.environ['WORKBENCH_OUT']}, "
             "open(os.path.join(os.environ['WORKBENCH_OUT'], 'seen.json'), 'w'))")
    (tmp_path / "cwd").mkdir()
    launch = command_launcher(["python", "-c", probe, "a b; rm -rf $HOME", "$(touch pwned)"])
    run_trial(Config(), tmp_path / "t", timeout_s=60, heartbeat_timeout_s=30, launch=launch, cwd=tmp_path / "cwd")
    seen = json.loads((tmp_path / "t" / "seen.json").read_text())
    assert seen["argv"] == ["a b; rm -rf $HOME", "$(touch pwned)"]  # literal: no shell saw them
    assert seen["cwd"] == str(tmp_path / "cwd") and Path(seen["config"]) == tmp_path / "t" / "config.yaml"
    assert seen["out"] == str(tmp_path / "t") and not list(tmp_path.rglob("pwned"))


def test_a_spec_from_elsewhere_is_shown_and_needs_yes(tmp_path, monkeypatch, capsys):
    from workbench.tune.__main__ import _confirm_command

    (tmp_path / "mine").mkdir()
    spec_file = tmp_path / "elsewhere" / "own.yaml"
    spec_file.parent.mkdir()
    spec_file.write_text(yaml.safe_dump({**SPEC, "space": {"micro_batch_size": {"choices": [1, 8]}}}))
    spec = load_study_spec(str(spec_file))
    asked = []
    monkeypatch.chdir(tmp_path / "mine")
    Tuner(spec, out_root=tmp_path / "runs", progress=False, confirm=asked.append).open()
    assert asked == [spec]  # a file outside the working directory: shown first
    monkeypatch.chdir(tmp_path)
    Tuner(spec, out_root=tmp_path / "runs2", progress=False, confirm=asked.append).open()
    assert asked == [spec]  # under it: the user's own, no question
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # not a terminal
    with pytest.raises(TuneError, match="pass --yes to run it"):
        _confirm_command(False)(spec)
    _confirm_command(True)(spec)
    err = capsys.readouterr().err
    assert f"study 'own' from {spec_file} runs its own command in every trial:\n  python loop.py\n  cwd " in err
