"""The training loop on the CPU: loss goes down, the golden curve holds, resume is
exact, HF configs run, phases add up, errors are clear, Ctrl-C checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from _signals import default_signals

from workbench.train import ops
from workbench.config import merge_overrides, preset_config
from workbench.train.trainer import Trainer
from workbench.train.memory_model import predict_peak
from workbench.train.timing import PHASES
from workbench.train import synthetic_data_dir

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "assets" / "losses" / "tiny_seed0.json"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """A small synthetic shard dir for the tiny model (vocab 4096, records up to 256 tokens)."""
    os.environ["LOONGFORGE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return synthetic_data_dir(vocab_size=4096, seq_len=256, num_docs=300, seed=0)


def _cfg(**over):
    base = {"hardware.device": "cpu", "data.seq_len": 256, "data.micro_batch_size": 4, "data.bucket_width": 64,
            "data.num_workers": 1, "training.dtype": "fp32", "training.log_every": 4,
            "training.warmup_measure_steps": 2, "training.learning_rate": 1e-3, "training.warmup_steps": 4}
    base.update(over)
    return merge_overrides(preset_config("tiny"), base)


def _run(cfg, data_dir, out_dir=None, stop_at=None):
    trainer = Trainer(cfg, data_dir=data_dir, out_dir=out_dir)
    try:
        return trainer.run(stop_at)
    finally:
        trainer.close()


def _losses(out_dir: Path) -> list[float]:
    return pd.read_csv(out_dir / "phases.csv")["loss"].tolist()


def test_loss_decreases_and_phases_add_up(synth, tmp_path):
    s = _run(_cfg(**{"training.max_steps": 36}), synth, tmp_path)
    losses = _losses(tmp_path)
    assert len(losses) == 36
    # ln(4096) = 8.32 at init; 36 steps at lr 1e-3 on a structured corpus must learn the unigram statistics
    assert losses[0] == pytest.approx(8.32, abs=0.15)
    assert sum(losses[-6:]) / 6 < losses[0] - 1.0
    steps = pd.read_csv(tmp_path / "phases.csv")
    # phases.csv keeps 7 significant digits: the sum matches the step time to that precision
    assert ((steps[list(PHASES)].sum(axis=1) - steps["step_s"]).abs() <= 1e-5 * steps["step_s"]).all()
    assert (steps["real_tokens"] <= steps["padded_tokens"]).all()
    assert s["measured_steps"] == 34 and s["throughput/real_tokens_per_s_per_gpu"] > 0
    assert s["first_loss"] == pytest.approx(losses[0]) and s["last_loss"] == pytest.approx(losses[-1])
    # the memory model's prediction for this run, fp32 on the CPU (no autocast)
    predicted = predict_peak(_cfg(**{"training.max_steps": 36}), autocast=False)
    assert s["memory/predicted_peak_gib"] == round(predicted.total / 2**30, 3) > 0
    assert s["memory/predicted"]["activations"] == round(predicted.activations / 2**30, 3)
    windows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [w["step"] for w in windows] == [6, 10, 14, 18, 22, 26, 30, 34, 36]
    for w in windows:
        assert sum(w[f"time/{p}_pct"] for p in PHASES) == pytest.approx(100.0)
        assert w["io/backend"] in ("io_uring", "threadpool")


def test_fused_residual_norm_follows_the_golden_curve(synth, tmp_path):
    """compute_domain.fused_residual_norm: each block's second residual add goes through ops.rmsnorm_add (on
    the CPU its torch reference: the same add and norm), so the loss curve is the golden one, and the model was
    built with the fused op (on a GPU with the rmsnorm op on Triton: one kernel)."""
    trainer = Trainer(_cfg(**{"training.max_steps": 12, "loongforge.compute_domain.fused_residual_norm": True}),
                      data_dir=synth, out_dir=tmp_path)
    try:
        assert trainer.model.ops.rmsnorm_add is ops.rms_norm_add_torch
        trainer.run()
    finally:
        trainer.close()
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert _losses(tmp_path) == pytest.approx(golden, rel=1e-3)  # the golden test's tolerance (thread count)


def test_golden_loss_curve(synth, tmp_path):
    """Guards the numerics: model init, data order, loss, optimizer, schedule (fixed seed)."""
    _run(_cfg(**{"training.max_steps": 12}), synth, tmp_path)
    losses = _losses(tmp_path)
    if os.environ.get("WORKBENCH_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"steps": 12, "losses": losses}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())["losses"]
    # float32 on the CPU: summation order may differ with the thread count (2e-4 relative seen
    # between 1 and 2 threads); a changed init, data order or schedule moves losses by >1e-2.
    assert losses == pytest.approx(golden, rel=1e-3)


def test_checkpoint_resume_reproduces_uninterrupted_curve(synth, tmp_path):
    full = tmp_path / "full"
    _run(_cfg(**{"training.max_steps": 12}), synth, full)
    ck = tmp_path / "ck"
    part = tmp_path / "part"
    # the same run (same schedule), stopped after 6 of its 12 steps
    _run(_cfg(**{"training.max_steps": 12, "training.checkpoint_dir": str(ck)}), synth, part, stop_at=6)
    assert (ck / "latest.pt").exists()
    rest = tmp_path / "rest"
    s = _run(_cfg(**{"training.max_steps": 12, "training.checkpoint_dir": str(ck)}), synth, rest)
    assert s["steps"] == 12
    resumed = pd.read_csv(rest / "phases.csv")
    assert resumed["step"].tolist() == list(range(7, 13))
    assert resumed["loss"].tolist() == pytest.approx(_losses(full)[6:], rel=1e-5)


def test_config_errors_name_the_key(tmp_path, subprocess_env):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {micro_batch_size: 0}\n")
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(bad), "--out",
                        str(tmp_path / "o")], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "data.micro_batch_size" in r.stderr and "bad.yaml" in r.stderr
    assert json.loads((tmp_path / "o" / "failure.json").read_text())["kind"] == "invalid_config"
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny", "--set",
                        "data.micro_batchsize=2"], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "micro_batchsize" in r.stderr and "micro_batch_size" in r.stderr
    # a value of the wrong type: named as a ConfigError, not by the private class that found it
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny", "--set",
                        "data.micro_batch_size=abc"], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "ConfigError: data.micro_batch_size: got 'abc' (str); expected an integer >= 1" in r.stderr
    assert "_Mismatch" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny", "--steps", "0"],
                       env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "training.max_steps: got 0, out of range; expected an integer >= 1" in r.stderr


def test_unreadable_config_file_is_a_config_error(tmp_path, subprocess_env):
    missing = tmp_path / "missing.yaml"
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(missing), "--out",
                        str(tmp_path / "o")], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{missing}: no such config file" in r.stderr and "Traceback" not in r.stderr
    assert json.loads((tmp_path / "o" / "failure.json").read_text())["kind"] == "invalid_config"


@pytest.mark.parametrize(("content", "words"), [
    (b"", "is empty; expected a YAML config (to run a preset's defaults, pass --preset NAME instead of --config)"),
    (b"model:\n  name: tiny\x00\n", "holds a NUL byte (character 19); expected a YAML config"),
])
def test_an_empty_or_binary_config_is_refused_in_one_line(tmp_path, subprocess_env, content, words):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(path), "--synthetic", "--out",
                        str(tmp_path / "o")], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not (tmp_path / "o" / "phases.csv").exists()  # nothing trained
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], r.stderr


class _RunsCode:
    """Pickles as a call of ``os.system``: loading it with pickle runs the command."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _wait_heartbeat(hb: Path, at_least: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        text = hb.read_text().strip() if hb.exists() else ""
        if text.isdigit() and int(text) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"heartbeat {hb} never reached {at_least} (rc {proc.poll()})")


def test_signals_and_a_checkpoint_that_would_run_code(synth, tmp_path, subprocess_env):
    """SIGUSR1 before the loop is ignored with one line; SIGTERM finishes the step and leaves a checkpoint that
    loads with weights_only=True; a latest.pt that needs pickle runs no code and is refused in one line (exit 2),
    unless --trust-checkpoint is passed."""
    import torch

    cfg = tmp_path / "c.yaml"
    ck = tmp_path / "ck"
    cfg.write_text(f"""
data: {{loongbin_dir: {synth}, seq_len: 256, micro_batch_size: 4, bucket_width: 64}}
training: {{max_steps: 100000, log_every: 4, warmup_measure_steps: 2, checkpoint_dir: {ck}}}
hardware: {{device: cpu}}
""")
    hb = tmp_path / "hb"
    cmd = [sys.executable, "-m", "workbench.train", "--config", str(cfg), "--heartbeat", str(hb), "-q",
           "--no-prometheus"]  # :9091 may be another test's: its "cannot serve" line would be a second line
    p = subprocess.Popen(cmd, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    _wait_heartbeat(hb, 0, p)  # written before torch is imported: the loop's handlers are not installed yet
    p.send_signal(signal.SIGUSR1)
    _wait_heartbeat(hb, 3, p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "SIGUSR1 ignored" in err, err[-2000:]
    ck_data = torch.load(ck / "latest.pt", weights_only=True)  # tensors and plain types only
    # one micro-batch per step: the loader's position equals the step count (within the first epoch)
    assert ck_data["step"] >= 3
    assert ck_data["data"]["epoch"] * ck_data["data"]["batches_per_epoch"] + ck_data["data"]["batch"] \
        == ck_data["step"]
    assert not list(ck.glob("*.tmp"))

    marker = tmp_path / "code-ran"
    torch.save({**ck_data, "extra": _RunsCode(f"touch {marker}")}, ck / "latest.pt")
    steps = str(ck_data["step"] + 1)
    r = subprocess.run([*cmd, "--steps", steps, "--out", str(tmp_path / "o")], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not marker.exists(), r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(ck / "latest.pt") in lines[0] and "--trust-checkpoint" in lines[0], r.stderr
    assert json.loads((tmp_path / "o" / "failure.json").read_text())["kind"] == "invalid_config"

    r = subprocess.run([*cmd, "--steps", steps, "--trust-checkpoint"], env=subprocess_env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and marker.exists(), r.stderr[-2000:]  # the user's own choice: it loads with pickle
    assert torch.load(ck / "latest.pt", weights_only=True)["step"] == int(steps)


def test_sigusr1_never_ends_a_run(synth, tmp_path, subprocess_env):
    """Issue 39: SIGUSR1 before the loop's handler was installed, and after it was reset before the final save,
    killed the run (rc 138, no failure.json). Sent every 20 ms from the first heartbeat (written once the CLI has
    set its handler, before torch is imported; before it, Python's own start-up holds the default) to exit, it is
    ignored before and after the loop and is a hot reload inside it: the run ends 0, summary and checkpoint
    written."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
data: {{loongbin_dir: {synth}, seq_len: 256, micro_batch_size: 4, bucket_width: 64}}
training: {{max_steps: 12, log_every: 4, warmup_measure_steps: 2, checkpoint_dir: {tmp_path / "ck"}}}
hardware: {{device: cpu}}
""")
    hb = tmp_path / "hb"
    p = subprocess.Popen([sys.executable, "-m", "workbench.train", "--config", str(cfg), "-q", "--no-prometheus",
                          "--heartbeat", str(hb), "--summary", str(tmp_path / "summary.json"),
                          "--out", str(tmp_path / "o")],
                         env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    _wait_heartbeat(hb, 0, p)
    sent = 0
    deadline = time.monotonic() + 180
    while p.poll() is None and time.monotonic() < deadline:
        try:
            p.send_signal(signal.SIGUSR1)
            sent += 1
        except ProcessLookupError:
            break
        time.sleep(0.02)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (p.returncode, err[-2000:])
    assert sent > 20 and "SIGUSR1 ignored" in err
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 12
    assert (tmp_path / "ck" / "latest.pt").exists() and not (tmp_path / "o" / "failure.json").exists()


@pytest.mark.parametrize("shapes", ["dynamic", "static"])
def test_every_bucket_shape_is_compiled_before_the_first_step(synth, tmp_path, aot_eager, shapes):
    """No measured step compiles: precompile() makes the graphs of every bucket shape (dynamic: one graph with a
    symbolic length for all of them; static: one per shape) before step 1, leaving parameters and gradients as
    they were; the steps after it compile nothing (dynamo's frame counter does not move) and the loss curve is
    the eager golden one. Scope model compiles the model as one unit, in place (parameter names unchanged)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = _cfg(**{"training.max_steps": 12, "loongforge.compute_domain.compile": "default",
                  "loongforge.compute_domain.compile_scope": "model",  # one compiled unit: graphs = shapes
                  "loongforge.compute_domain.compile_shapes": shapes})
    trainer = Trainer(cfg, data_dir=synth, out_dir=tmp_path)
    try:
        names_before = [n for n, _ in trainer.model.named_parameters()]
        lengths = trainer.bucket_lengths()
        assert lengths == [256, 192, 128, 64]  # records of 64..256 tokens in buckets of 64
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.precompile()
        assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
        assert all(p.grad is None for p in trainer.model.parameters())
        graphs = counters["stats"]["unique_graphs"]
        assert graphs == (1 if shapes == "dynamic" else len(lengths))
        for T in lengths:  # a batch of any bucket length finds its graph
            ids = torch.randint(0, 4096, (4, T), dtype=torch.int32)
            pos = torch.arange(T, dtype=torch.int32).expand(4, T).contiguous()
            loss_sum, n_tok = trainer.compute(ids, pos, torch.ones(4, T, dtype=torch.uint8))
            (loss_sum / n_tok).backward()
        trainer.opt.zero_grad(set_to_none=True)
        assert counters["stats"]["unique_graphs"] == graphs
        summary = trainer.run()
        assert counters["stats"]["unique_graphs"] == graphs  # no step compiled
        assert summary["time/compile_s"] > 0
        assert set(pd.read_csv(tmp_path / "phases.csv")["seq_len"]) <= set(lengths)
        assert aot_eager == ["default"] and [n for n, _ in trainer.model.named_parameters()] == names_before
        assert all(getattr(layer, "_compiled_call_impl", None) is None for layer in trainer.model.layers)
    finally:
        trainer.close()
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert _losses(tmp_path) == pytest.approx(golden, rel=1e-3)


def test_compiled_loop_follows_the_golden_curve(synth, tmp_path, aot_eager):
    """compile: default with scope layer follows the eager golden curve, every decoder block and the head
    compiled units (in place: parameter names and checkpoints unchanged); scope model: the bucket-shape test above.
    The backend is switched to aot_eager (the same graphs and autograd, without inductor's C++ build, ~40 s per
    graph on 2 cores)."""
    import torch

    torch._dynamo.reset()
    cfg = _cfg(**{"training.max_steps": 12, "loongforge.compute_domain.compile": "default",
                  "loongforge.compute_domain.compile_scope": "layer"})
    trainer = Trainer(cfg, data_dir=synth, out_dir=tmp_path)
    try:
        names_before = [n for n, _ in trainer.model.named_parameters()]
        trainer.run()
        layers = trainer.model.layers
        assert all(getattr(layer, "_compiled_call_impl", None) is not None for layer in layers)
        assert len(aot_eager) == len(layers) + 2 and set(aot_eager) == {"default"}  # blocks, the norm, the head
        assert [n for n, _ in trainer.model.named_parameters()] == names_before
    finally:
        trainer.close()
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert _losses(tmp_path) == pytest.approx(golden, rel=1e-3)


def test_quiet_prints_the_summary_and_no_window_lines(tmp_path, subprocess_env):
    """Issue 40: -q printed every window's line and hid the summary, the opposite of its help. A CPU's MFU says why
    it is n/a; a run whose steps are all warm-up says why nothing was measured."""
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "workbench.train", "--preset", "tiny", "--synthetic", "--no-prometheus",
           "--set", "training.log_every=2", "--set", "training.warmup_measure_steps=2"]
    loud = subprocess.run([*cmd, "--steps", "6"], env=env, capture_output=True, text=True, timeout=180)
    quiet = subprocess.run([*cmd, "--steps", "6", "-q"], env=env, capture_output=True, text=True, timeout=180)
    assert loud.returncode == quiet.returncode == 0, quiet.stderr[-2000:]
    assert sum(ln.startswith("step ") for ln in loud.stdout.splitlines()) == 2  # windows of steps 3-4 and 5-6
    # the start line: model, parameters, device, data, endpoint
    assert "workbench: model tiny: 1,311,872 parameters on cpu x 1; data " in loud.stderr, loud.stderr
    assert "(synthetic corpus); no /metrics endpoint" in loud.stderr and "parameters on" not in quiet.stderr
    assert not any(ln.startswith("step ") for ln in quiet.stdout.splitlines()), quiet.stdout
    summary = [ln for ln in quiet.stdout.splitlines() if ln.startswith("summary: ")]
    assert len(summary) == 1 and "6 steps (4 measured)" in summary[0], quiet.stdout
    assert "MFU n/a (no peak FLOP/s for this device)" in summary[0] and "n/a%" not in quiet.stdout
    warm = subprocess.run([*cmd, "--steps", "2", "-q"], env=env, capture_output=True, text=True, timeout=180)
    assert "2 steps (0 measured: the steps after the warm-up (training.warmup_measure_steps) filled no window" \
        in warm.stdout, warm.stdout


def test_print_config_writes_the_full_config_that_loads(tmp_path, subprocess_env):
    """Issue 40: there was no way to write a preset's full config to a file to start from. --print-config prints
    it, every key commented, --set applied; the file loads to the same config; nothing trains."""
    from workbench.config import config_hash, load_config, merge_overrides, preset_config

    r = subprocess.run([sys.executable, "-m", "workbench.train", "--preset", "tiny-vla", "--print-config", "--set",
                        "data.micro_batch_size=3", "--out", str(tmp_path / "o")], env=subprocess_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (tmp_path / "my.yaml").write_text(r.stdout)
    cfg = load_config(tmp_path / "my.yaml")
    want = merge_overrides(preset_config("tiny-vla"), {"data.micro_batch_size": 3, "metrics.prometheus_port": 9091})
    assert config_hash(cfg) == config_hash(want)
    comments = sum(ln.lstrip().startswith("# ") for ln in r.stdout.splitlines())
    assert comments > 50 and not (tmp_path / "o").exists()  # every key documented; no run, no output folder


def test_an_unwritable_out_is_one_line_and_debug_adds_the_traceback(tmp_path, subprocess_env):
    (tmp_path / "afile").write_text("x")
    cmd = [sys.executable, "-m", "workbench.train", "--preset", "tiny", "--synthetic", "--steps", "2", "-q",
           "--no-prometheus",  # :9091 may be another test's: its "cannot serve" line is not this test's subject
           "--out", str(tmp_path / "afile" / "out")]
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("loaders:")]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == f"error (crash): NotADirectoryError: [Errno 20] Not a directory: '{tmp_path / 'afile' / 'out'}'"
    assert lines[1].startswith("  (failure.json not written: Not a directory") and len(lines) == 2
    r = subprocess.run([*cmd, "--debug"], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_a_full_disk_during_a_checkpoint_is_a_disk_failure_that_keeps_the_last_one(synth, tmp_path, subprocess_env):
    """A checkpoint write that fails (here: a file size limit, EFBIG, as a full disk gives ENOSPC) leaves no temp
    file and the previous latest.pt as it was, and the run ends with one line, exit 6 and a whole failure.json of
    kind ``disk`` (not a crash, not the config's fault)."""
    import resource

    import torch

    cfg = tmp_path / "c.yaml"
    ck = tmp_path / "ck"
    cfg.write_text(f"""
data: {{loongbin_dir: {synth}, seq_len: 256, micro_batch_size: 4, bucket_width: 64}}
training: {{max_steps: 2, log_every: 1, warmup_measure_steps: 1, checkpoint_dir: {ck}}}
hardware: {{device: cpu}}
""")
    cmd = [sys.executable, "-m", "workbench.train", "--config", str(cfg), "-q", "--no-prometheus"]
    r = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before = (ck / "latest.pt").read_bytes()
    limit = len(before) // 2  # every other file the run writes is far smaller

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # (Python ignores SIGXFSZ: writes get EFBIG)

    r = subprocess.run([*cmd, "--steps", "4", "--out", str(tmp_path / "o")], env=subprocess_env,
                       capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert r.returncode == 6, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error (disk): ") and str(ck / "latest.pt") in lines[0], r.stderr
    assert json.loads((tmp_path / "o" / "failure.json").read_text())["kind"] == "disk"
    assert sorted(p.name for p in ck.iterdir()) == ["latest.pt"]  # no temp file left behind
    assert (ck / "latest.pt").read_bytes() == before
    assert torch.load(ck / "latest.pt", weights_only=True)["step"] == 2


def test_the_heap_left_before_the_first_step_is_frozen_for_the_steps_and_returned_after(synth, tmp_path,
                                                                                        monkeypatch):
    """On one H200 a compiled VLA trial's first measured step took 2.24 s against 0.40 for the next (its forward
    1.84 s against 0.12; vlaw-h200 trial 4), and the screen's one window dropped compile at micro-batch 32. On this
    CPU the compiled VLA leaves 1.35M objects, whose first full collection took 1.0 s. So the objects left before
    the first step are collected and frozen: the collections during the steps do not scan them (gen 2 holds
    less than was frozen), and the run's end returns them to the collector."""
    import gc

    trainer = Trainer(_cfg(**{"training.max_steps": 4}), data_dir=synth, out_dir=tmp_path)
    seen: list[tuple[int, int]] = []
    step = trainer.train_step

    def first_step():
        if not seen:
            seen.append((gc.get_freeze_count(), len(gc.get_objects(generation=2))))
        return step()

    monkeypatch.setattr(trainer, "train_step", first_step)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    frozen, gen2 = seen[0]
    assert frozen > 10_000 and gen2 < frozen  # (torch alone leaves tens of thousands)
    # (a frozen object still dies when its last reference goes: the count at the first step may be a few lower)
    assert 0 <= summary["gc/frozen_objects"] - frozen < 0.001 * frozen and summary["gc/settle_s"] > 0
    assert gc.get_freeze_count() == 0  # returned at the run's end
