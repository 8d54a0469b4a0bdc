"""Loops of one's own tuned end to end (docs/trial-contract.md): examples/plain_loop.py and examples/hf_trainer.py,
each through the tune CLI on a smaller protocol, ending with an exported config, a report and a provenance that
records the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from workbench.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

# the examples' own protocol, cut to what shows every part working on 2 cores: 1 baseline run, a grid of the loop's
# knobs (2 trials of the plain loop, 1 of the HF run, whose every process imports transformers; compile stays off:
# inductor's CPU compile would double the test), 2 A/B pairs, no trace runs
SMALL = {"warmup_steps": 2, "window_steps": 3, "windows": 2, "baseline_repeats": 1, "top_k": 1, "ab_min_rounds": 2,
         "ab_rounds": 2, "trial_timeout_s": 240, "heartbeat_timeout_s": 60, "profile_steps": 1}


def _small_spec(tmp_path: Path, example: str, space: dict, base: dict, trials: int, **protocol) -> Path:
    spec = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    spec["trainer"]["cwd"] = str(EXAMPLES)  # the copy lives elsewhere; the command still runs beside the example
    spec.update(space=space, budget={"trials": trials}, sampler={"name": "grid", "seed": 0},
                protocol={**SMALL, **protocol})
    spec["base"] = {**spec["base"], **base}
    path = tmp_path / f"{example}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _tune(tmp_path: Path, spec: Path, subprocess_env: dict) -> tuple[subprocess.CompletedProcess, Path]:
    env = {**subprocess_env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    r = subprocess.run([sys.executable, "-m", "workbench.tune", "--study", str(spec), "--out", str(tmp_path / "runs"),
                        "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    return r, tmp_path / "runs" / yaml.safe_load(spec.read_text())["name"]


def _check_study(r: subprocess.CompletedProcess, study: Path, command: list[str], searched: set[str],
                 traces: bool = True) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    assert "runs its own command" not in r.stderr  # the user's own file: no question asked
    result = json.loads((study / "tune.json").read_text())["result"]
    assert set(result["searched"]) == searched
    assert result["data"] == {"source": "trainer", "command": command, "cwd": str(EXAMPLES)}
    # every trial ran the loop through the run API: windows with phases, all counted
    trials = sorted((study / "trials").iterdir())
    assert len(trials) == result["budget"]["trials_run"]
    for t in trials:
        rows = [json.loads(line) for line in (t / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == SMALL["windows"] and all(w["steps"] == SMALL["window_steps"] for w in rows)
        assert all(w["time/forward_s"] > 0 and w["time/optimizer_s"] > 0 for w in rows), t
    # the A/B interval of the best candidate, and the baseline's trace where the protocol asks for traces
    best = result["best"]
    assert best["pairs"] == 2 and best["ci_low"] <= best["speedup"] <= best["ci_high"]
    kept = result["traces"]  # profiled after the measurement of a run made anyway: no run of their own
    assert json.loads(Path(kept["baseline"]["path"]).read_text())["traceEvents"] if traces else kept is None
    assert not (study / "traces").exists()
    cfg = load_config(study / "config.yaml")
    assert cfg.provenance.trainer == {"command": command, "cwd": str(EXAMPLES), "env": cfg.provenance.trainer["env"],
                                      "safe_env": []}
    assert set(cfg.provenance.trainer["env"].values()) <= {"<set>"}  # values are never written down
    html = (study / "report.html").read_text()
    assert "Phase breakdown" in html and f"[{best['ci_low']:.3f}, {best['ci_high']:.3f}]" in html
    return result


def test_plain_loop_tunes_end_to_end(tmp_path, subprocess_env):
    space = {"micro_batch_size": {"choices": [1, 8]}, "compile": {"choices": ["none"]},
             "user.attention": {"choices": ["manual", "sdpa"]}}
    spec = _small_spec(tmp_path, "plain_loop", space, {"data": {"seq_len": 64, "micro_batch_size": 1},
                                                       "training": {"global_batch_size": 8}}, trials=2,
                       profile_steps=0)  # the run API's trace: tests/train/test_session.py
    r, study = _tune(tmp_path, spec, subprocess_env)
    result = _check_study(r, study, ["python", "plain_loop.py"], {"micro_batch_size", "compile", "user.attention"},
                          traces=False)
    exported = load_config(study / "config.yaml")
    params = result["exported"]["params"]
    assert exported.user.get("attention") == params.get("user.attention", None) or not params
    assert exported.data.micro_batch_size == params.get("micro_batch_size", 1)


def test_hf_trainer_tunes_end_to_end(tmp_path, subprocess_env):
    space = {"micro_batch_size": {"choices": [1, 8]}, "user.optim": {"choices": ["adamw_torch"]}}
    # run.prepare() applies the base's choices (eager attention, every other layer recomputed) in every run
    base = {"hf": {"attention": "eager"}, "training": {"global_batch_size": 8, "learning_rate": 0.001,
                                                       "activation_checkpointing": "selective",
                                                       "activation_checkpointing_every": 2}}
    spec = _small_spec(tmp_path, "hf_trainer", space, base, trials=1, profile_steps=0)
    r, study = _tune(tmp_path, spec, subprocess_env)
    _check_study(r, study, ["python", "hf_trainer.py"], {"micro_batch_size", "user.optim"}, traces=False)
    prov = load_config(study / "config.yaml").provenance
    assert prov.patches["applied"] == ["attention: eager", "activation checkpointing: 2 of 4 decoder layers"]
    assert prov.patches["versions"]["transformers"] and "liger-kernel" in prov.patches["versions"]
    page = (study / "report.html").read_text()
    assert 'id="model-patches"' in page and "activation checkpointing: 2 of 4 decoder layers" in page
