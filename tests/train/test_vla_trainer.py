"""The VLA workload through the built-in Trainer (workbench/train/workload.py): vla shards in, the flow loss falls,
samples/s out; the config's vla keys reach the loader."""

from __future__ import annotations

import pytest

from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train.run import synthetic_vla_dir
from workbench.train.trainer import Trainer
from workbench.train.vla import get_vla_preset


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


def test_vla_shapes_are_checked_against_the_shards(tmp_path, monkeypatch):
    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data = synthetic_vla_dir(get_vla_preset("tiny-vla"), num_samples=64)
    with pytest.raises(ConfigError, match="data.image_size"):
        Trainer(_cfg(tmp_path, **{"data.image_size": 64}), data_dir=data)
