"""The memory model: its prediction against peaks measured on an H200, what each knob changes in it, and the
tuner's rule for configs that cannot fit."""

from __future__ import annotations

import pytest

from workbench.config import merge_overrides, preset_config
from workbench.train.memory_model import MODEL_ERROR, predict_peak, predicted_oom
from workbench.train.model import get_preset, num_params

GIB = 2**30
FUSED = {"loongforge.compute_domain.ops.loss": "triton", "loongforge.compute_domain.ops.swiglu": "triton",
         "loongforge.compute_domain.ops.rope": "triton"}
FP8 = {"loongforge.compute_domain.fp8": "tensorwise"}


def _gr00t(**overrides):
    base = {"data.seq_len": 2048, "data.packing": "fill", "hardware.device": "cuda"}
    return merge_overrides(preset_config("gr00t-n1.6"), {**base, **overrides})


# Peak allocated GiB on one H200, gr00t-n1.6 at 2,048 tokens a row: memory/max_allocated_gib of
# benchmarks/results/study.csv (source study_gr00t-n1.6_static_h200_2026-12-01.csv, trials 0-3) and
# benchmarks/results/loop.csv (source loop_gr00t-n1.6_shapes_graphs_h200_2026-12-01.csv, variant B16).
MEASURED = [
    ("bf16, micro-batch 8, torch ops and loss", {"data.micro_batch_size": 8}, 59.6114),
    ("FP8, micro-batch 16, fused loss", {"data.micro_batch_size": 16, **FUSED, **FP8}, 75.2366),
    ("FP8, micro-batch 16, fused loss, Triton RMSNorm",
     {"data.micro_batch_size": 16, **FUSED, **FP8, "loongforge.compute_domain.ops.rmsnorm": "triton"}, 82.2367),
    ("FP8, micro-batch 16, every 2nd block checkpointed",
     {"data.micro_batch_size": 16, **FUSED, **FP8, "training.activation_checkpointing": "selective",
      "training.activation_checkpointing_every": 2}, 55.0699),
    ("bf16, micro-batch 16, fused loss", {"data.micro_batch_size": 16, **FUSED}, 89.7267),
]


@pytest.mark.parametrize("name,overrides,measured_gib", MEASURED, ids=[m[0] for m in MEASURED])
def test_prediction_within_its_error_of_the_h200_peaks(name, overrides, measured_gib):
    predicted = predict_peak(_gr00t(**overrides)).total / GIB
    assert abs(predicted - measured_gib) / measured_gib <= MODEL_ERROR, (name, predicted, measured_gib)


def test_parts():
    args = get_preset("gr00t-n1.6")
    cfg = _gr00t(**{"data.micro_batch_size": 8})
    p = predict_peak(cfg)
    assert p.state == 16 * num_params(args) == 16 * 1_644_615_680
    # the torch loss keeps the micro-batch's logits: 8 x 2,047 positions x the vocabulary padded to 50,304
    assert p.loss == 8 * 2047 * 50304 * 6
    D, F, K = 2048, 5632, 2048
    block = (16 * D + 4 * K + 6 * F) * 8 * 2048
    assert p.working_set == block and p.activations == 28 * block
    assert p.total == p.state + p.activations + p.loss + p.working_set

    fused = predict_peak(_gr00t(**{"data.micro_batch_size": 8, **FUSED}))
    assert fused.loss == 0 and fused.activations == p.activations  # the fused loss's saving is the logits
    fp8 = predict_peak(_gr00t(**{"data.micro_batch_size": 8, **FP8}))
    assert fp8.activations == 28 * (16 * D + 4 * K + 6 * F - 4 * D - 3 * F // 2) * 8 * 2048
    full = predict_peak(_gr00t(**{"data.micro_batch_size": 8, "training.activation_checkpointing": "full"}))
    assert full.activations == 28 * 4 * D * 8 * 2048  # only each block's fp32 input is kept
    every4 = predict_peak(_gr00t(**{"data.micro_batch_size": 8, "training.activation_checkpointing": "selective",
                                    "training.activation_checkpointing_every": 4}))
    assert every4.activations == 21 * block + 7 * 4 * D * 8 * 2048
    # doubling the micro-batch doubles everything but the state
    p16 = predict_peak(_gr00t(**{"data.micro_batch_size": 16}))
    assert (p16.activations, p16.loss, p16.working_set) == (2 * p.activations, 2 * p.loss, 2 * p.working_set)
    # fp32 activations without autocast; the CPU's torch ops in place of the config's Triton ones
    assert predict_peak(cfg, autocast=False).activations == 2 * p.activations
    cpu = predict_peak(_gr00t(**{"data.micro_batch_size": 8, **FUSED}), backends={"loss": "torch"})
    assert cpu.loss == p.loss


def test_predicted_oom_names_the_limit_and_spares_what_may_fit():
    big = _gr00t(**{"data.micro_batch_size": 32, **FUSED})  # about 157 GiB predicted
    why = predicted_oom(big, 139.8)
    assert "not launched" in why and "hardware.memory_fraction_limit 0.95 of 139.8 GiB" in why
    assert predicted_oom(big, 200.0) == ""
    fits = _gr00t(**{"data.micro_batch_size": 16, **FUSED, **FP8})
    assert predicted_oom(fits, 139.8) == ""
    # no GPU memory known, or a CPU run: never rejected
    assert predicted_oom(big, None) == ""
    assert predicted_oom(merge_overrides(big, {"hardware.device": "cpu"}), 139.8) == ""
    # within the model's error of the limit: launched, the run decides
    edge = predict_peak(big).total / GIB / 0.95 * (1 - MODEL_ERROR / 2)
    assert predicted_oom(big, edge) == ""
