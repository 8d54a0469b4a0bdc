"""The VLA workload through the built-in Trainer (workbench/train/workload.py): vla shards in, the flow loss falls,
samples/s out; the config's vla keys reach the loader."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train.ops import resolve
from workbench.train.run import synthetic_vla_dir
from workbench.train.trainer import Trainer
from workbench.train.vla import get_vla_preset
from workbench.train.workload import VisionLanguageAction


def _cfg(tmp_path, **over):
    return merge_overrides(preset_config("tiny-vla"), {
        "hardware.device": "cpu", "training.max_steps": 24, "training.warmup_measure_steps": 4,
        "training.log_every": 10, "training.learning_rate": 3e-3, "training.warmup_steps": 2,
        "data.micro_batch_size": 8, "data.num_workers": 1, **over})


def test_tiny_vla_trains_through_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_vla_dir(get_vla_preset("tiny-vla"), num_samples=256)
    t = Trainer(_cfg(tmp_path), out_dir=tmp_path / "out", data_dir=data)
    try:
        s = t.run()
    finally:
        t.close()
    assert s["workload"] == "vision_language_action" and s["steps"] == 24 and s["windows"] == 2
    assert s["last_loss"] < 0.8 * s["first_loss"], (s["first_loss"], s["last_loss"])
    seq = get_vla_preset("tiny-vla").seq_len
    assert s["throughput/samples_per_s_per_gpu"] == pytest.approx(s["throughput/real_tokens_per_s_per_gpu"] / seq)
    assert s["training/checkpointed_blocks"] == 0 and "memory/predicted_peak_gib" not in s


def test_the_vla_trains_on_the_same_noise_at_any_micro_batch(tmp_path, monkeypatch):
    """Each sample draws its flow loss's time and noise from its loader key, so one data stream at micro-batch 8
    and at micro-batch 2 (4 accumulated, the same 8 samples an optimizer step) trains to the same step losses, to
    float rounding: the numerics guard compares a VLA trial with the base at another micro-batch (numerics.py).
    Another data seed (other records, other keys) trains to other losses."""
    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_vla_dir(get_vla_preset("tiny-vla"), num_samples=128)
    losses = {}
    for name, over in (("mb8", {}), ("mb2", {"data.micro_batch_size": 2}), ("seed", {"data.seed": 7})):
        cfg = _cfg(tmp_path, **{"training.max_steps": 6, "training.warmup_measure_steps": 0,
                                "training.global_batch_size": 8, **over})
        t = Trainer(cfg, out_dir=tmp_path / name, data_dir=data)
        try:
            t.run()
        finally:
            t.close()
        with open(tmp_path / name / "phases.csv") as f:  # every step's loss
            losses[name] = [float(row["loss"]) for row in csv.DictReader(f)]
    assert len(losses["mb8"]) == 6
    assert losses["mb2"] == pytest.approx(losses["mb8"], rel=1e-4)
    assert all(abs(a - b) > 1e-3 * b for a, b in zip(losses["seed"], losses["mb8"]))


def test_vla_shapes_are_checked_against_the_shards(tmp_path, monkeypatch):
    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_vla_dir(get_vla_preset("tiny-vla"), num_samples=64)
    with pytest.raises(ConfigError, match="data.image_size"):
        Trainer(_cfg(tmp_path, **{"data.image_size": 64}), data_dir=data)


def test_a_vla_study_measures_its_baseline_through_the_tuner(tmp_path, study_spec_file, monkeypatch):
    """The tuner's model check before the first run knows the VLA presets (it used to read every model as a
    language model and refused them)."""
    from workbench.tune import Tuner
    from workbench.tune.study import load_study_spec

    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    path = study_spec_file("vla", protocol={"baseline_repeats": 1, "warmup_steps": 1, "window_steps": 2,
                                            "windows": 1})
    path.write_text(path.read_text().replace("model: tiny", "model: tiny-vla"))
    tuner = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, report=None)
    tuner.open()
    (tput,) = tuner.run_baseline()
    assert tput > 0
    summary = json.loads((tmp_path / "runs" / "vla" / "baseline" / "0" / "summary.json").read_text())
    assert summary["workload"] == "vision_language_action" and summary["throughput/samples_per_s_per_gpu"] > 0


class _RunsCode:
    """Pickles as a call of ``os.system``: loading it with pickle runs the command."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        import os

        return (os.system, (self.cmd,))


def test_a_vla_checkpoint_that_needs_pickle_runs_no_code_and_is_one_error(tmp_path):
    """Issue 39: model.checkpoint_path of a VLA loads with weights_only=True; a file that needs pickle ran no code
    but ended in a traceback. It is one ConfigError naming the file and the key, and the marker is never made."""
    import torch

    from workbench.train.ops import resolve
    from workbench.train.workload import workload_for

    marker = tmp_path / "code-ran"
    bad = tmp_path / "latest.pt"
    torch.save({"model": {}, "extra": _RunsCode(f"touch {marker}")}, bad)
    w = workload_for(preset_config("tiny-vla"))
    w.build(resolve({}))
    with pytest.raises(ConfigError, match=r"model\.checkpoint_path: .*latest\.pt: not a readable checkpoint of this "
                                          r"loop \(tensors and plain types\)") as info:
        w.load_weights(str(bad))
    assert not marker.exists() and len(str(info.value).splitlines()) == 1
    torch.save([1, 2], bad)  # loads, but holds no 'model'
    with pytest.raises(ConfigError, match=r"latest\.pt: a checkpoint of this loop holds a 'model' state dict"):
        w.load_weights(str(bad))


_COMPILE = torch.compile


def _compiled_graphs(blocks: int, monkeypatch) -> set[str]:
    """The code of every graph a per-part compile of tiny-vla at ``blocks`` blocks a stack traces in a forward
    and backward, through a backend that records each graph (what Inductor would compile and key its cache on)."""
    torch._dynamo.reset()
    graphs: list[str] = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn=None, *, mode=None, dynamic=None, **kw: _COMPILE(
        fn, backend=record, dynamic=dynamic))
    w = VisionLanguageAction(merge_overrides(preset_config("tiny-vla"), {"hardware.device": "cpu"}))
    w.keep_blocks(blocks)
    model = w.build(resolve())
    w.compile_parts(mode="default", dynamic=False)
    loss_sum, n = model.loss(*w.dummy_inputs(2, w.vla_args.text_tokens, torch.device("cpu")))
    loss_sum.backward()
    torch._dynamo.reset()
    return set(graphs)


def test_a_one_block_twin_traces_every_graph_of_the_full_depth(monkeypatch):
    """A compile-ahead twin (``--compile-only --blocks 1``) fills the cache of the full depth only where every
    graph is the same at any depth: each block of the vision, backbone and action-head stacks is its own graph,
    and the head's graphs around its blocks hold none of them (traced into the head, the blocks were unrolled
    into one graph per depth: in study vlaw2-h200 a trial of gr00t-n1.6-vla compiled 89.5 s after its twin)."""
    one, full = _compiled_graphs(1, monkeypatch), _compiled_graphs(2, monkeypatch)
    assert len(full) >= 5  # a block of each of the three stacks, and the head's graphs before and after its blocks
    assert one == full
