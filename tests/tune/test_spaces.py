"""Spaces a study need not write by hand (issue 38): ``space: auto`` for every built-in workload, and micro-batches
bounded by the global batch and by the memory model on the GPU the study opens on."""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train.memory_model import MODEL_ERROR, predict_peak
from workbench.tune import Tuner
from workbench.tune import opening
from workbench.tune.spaces import fit_micro_batches, micro_batch_choices
from workbench.tune.study import loads_study_spec

H200_GIB = 139.8


@pytest.mark.parametrize("model,gpus,base,expect", [
    ("tiny", 1, "{training: {global_batch_size: 8}}", {"packing", "fp8_head", "compile_shapes", "loss_backend"}),
    ("gr00t-n1.6", 1, "{training: {global_batch_size: 32}, hardware: {device: cuda}}", {"fp8", "graph_capture"}),
    ("gr00t-n1.6", 2, "{training: {global_batch_size: 32}, hardware: {device: cuda}}",
     {"bucket_size_mb", "overlap_ratio"}),
    ("gr00t-n1.6-vla", 1, "{training: {global_batch_size: 64}, hardware: {device: cuda}}",
     {"graph_capture", "compile", "expandable_segments"}),
])
def test_space_auto_loads_for_every_builtin_workload(model, gpus, base, expect):
    spec = loads_study_spec(f"name: auto-{gpus}\nmodel: {model}\ngpus: {gpus}\nbase: {base}\nspace: auto\n")
    assert expect <= set(spec.space) and "micro_batch_size" in spec.space
    per_gpu = spec.base_config().training.global_batch_size // gpus
    assert spec.space["micro_batch_size"].choices == [m for m in (1, 2, 4, 8, 16, 32, 64) if per_gpu % m == 0]
    if model.endswith("vla"):
        assert set(spec.space) == {"micro_batch_size", "compile", "graph_capture", "expandable_segments", "fp8"}
    else:
        assert ("bucket_size_mb" in spec.space) == (gpus > 1)
    # every choice of every knob makes a valid trial config on its own
    for name, rng in spec.space.items():
        for v in rng.choices:
            spec.trial_config({name: v})


def test_space_auto_is_refused_for_a_loop_of_ones_own():
    with pytest.raises(ConfigError, match=r"space: got 'auto', which is the built-in loop's space; a loop of one's "
                                          r"own lists its user\.\* knobs"):
        loads_study_spec("name: own\nspace: auto\ntrainer: {command: [python, loop.py]}\n", source="s.yaml")


def test_micro_batch_choices_divide_the_per_gpu_batch():
    cfg = preset_config("tiny")
    assert micro_batch_choices(merge_overrides(cfg, {"training.global_batch_size": 48})) == [1, 2, 4, 8, 16]
    assert micro_batch_choices(merge_overrides(cfg, {"training.global_batch_size": 48, "hardware.gpus": 2})) == \
        [1, 2, 4, 8]
    assert micro_batch_choices(merge_overrides(cfg, {"training.global_batch_size": None}))[-1] == 256


def _fits(cfg, gib: float) -> bool:
    return predict_peak(cfg).total / 2**30 * (1 - MODEL_ERROR) <= gib * cfg.hardware.memory_fraction_limit


@pytest.mark.parametrize("space", [{}, {"activation_checkpointing": ["none", "full"],
                                        "loss_backend": ["torch", "triton"]}])
def test_derived_micro_batches_match_the_memory_model(space):
    """gr00t-n1.6 (its model on no device: the memory model is arithmetic) on an H200: a micro-batch is kept when
    some setting of the space's memory knobs fits by the memory model, and only then; tiny fits whole."""
    base = merge_overrides(preset_config("gr00t-n1.6"), {"hardware.device": "cuda", "training.global_batch_size": 256,
                                                          "data.seq_len": 2048})
    choices = micro_batch_choices(base)
    kept, line = fit_micro_batches(base, choices, space, H200_GIB)
    combos = list(itertools.product(*[[(k, v) for v in vs] for k, vs in (
        ("training.activation_checkpointing", space.get("activation_checkpointing", [])),
        ("loongforge.compute_domain.ops.loss", space.get("loss_backend", []))) if vs]))
    want = [m for m in choices if any(_fits(merge_overrides(base, {"data.micro_batch_size": m, **dict(c)}), H200_GIB)
                                      for c in combos)]
    assert kept == want and 0 < len(kept) < len(choices)
    assert kept == choices[:len(kept)]  # memory grows with the micro-batch: the fit is a prefix
    dropped = choices[len(kept):]
    assert line.startswith(f"micro_batch_size: dropped {dropped}, which cannot fit this GPU under any memory "
                           f"setting of the space: at {dropped[0]}, the memory model predicts a peak of ")
    if space:  # checkpointing and the fused loss let bigger micro-batches fit
        assert len(kept) > len(fit_micro_batches(base, choices, {}, H200_GIB)[0])
    tiny = merge_overrides(preset_config("tiny"), {"hardware.device": "cuda", "training.global_batch_size": 64})
    assert fit_micro_batches(tiny, micro_batch_choices(tiny), space, H200_GIB) == (micro_batch_choices(tiny), "")
    assert fit_micro_batches(base, choices, space, None) == (choices, "")  # no GPU: nothing to bound by


def test_the_tuner_drops_what_cannot_fit_and_keeps_the_bound(tmp_path, monkeypatch, capsys):
    """A study opened on an (emulated) 80 GiB GPU drops the micro-batches the memory model refuses, says so in one
    line, and keeps that bound when opened again on a bigger GPU: its trials' distribution must not change."""
    gib = [80.0]
    monkeypatch.setattr(opening, "detect_capabilities", lambda gpus=1: frozenset({"cuda"}))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(
        total_memory=int(gib[0] * 2**30)))
    text = ("name: fit\nmodel: gr00t-n1.6\nbase: {training: {global_batch_size: 64}, data: {seq_len: 2048}, "
            "hardware: {device: cuda}}\nspace: {micro_batch_size: {choices: [4, 8, 16, 32, 64]}}\nbudget: {trials: 2}\n")
    base = loads_study_spec(text).base_config()
    want, _ = fit_micro_batches(base, [4, 8, 16, 32, 64], {}, 80.0)
    assert 0 < len(want) < 5
    t = Tuner(loads_study_spec(text), out_root=tmp_path / "runs", progress=False)
    t.open()
    assert t.session.spec.space["micro_batch_size"].choices == want
    err = capsys.readouterr().err
    assert err.count("micro_batch_size: dropped") == 1 and "Fake GPU" not in err
    gib[0] = 1000.0  # the same study on a bigger GPU: the stored bound holds
    t2 = Tuner(loads_study_spec(text), out_root=tmp_path / "runs", progress=False)
    t2.open()
    assert t2.session.spec.space["micro_batch_size"].choices == want and "dropped" not in capsys.readouterr().err
