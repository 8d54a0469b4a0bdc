"""Launch spaces and the registry (kernels/registry.py): the spaces as data, validation, defaults, the launch record,
the ops' Triton backends and the tuner's knobs that mirror the spaces."""

from __future__ import annotations

import inspect

import pytest
import torch
from _kernel_testing import DEVICE, randn

import kernels
from kernels import registry
from workbench.train import ops


# --------------------------------------------------------------------------- the ops' Triton backends


def test_triton_backends_are_registered_with_the_torch_signatures():
    refs = {"rmsnorm": ops.rms_norm_torch, "swiglu": ops.swiglu_torch, "rope": ops.rope_torch,
            "loss": ops.linear_cross_entropy_torch}
    for op, ref in refs.items():
        fn = kernels.TRITON_OPS[op]
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(ref).parameters), op
        assert registry.get_space(registry.KERNEL_OF_OP[op]).op == op
    # the ops switch finds them through kernels.TRITON_OPS when first asked
    opset = ops.resolve({op: "triton" for op in ops.OP_NAMES})
    assert opset.rmsnorm is kernels.rms_norm_triton and opset.loss is kernels.linear_cross_entropy_triton
    assert ops.OPS["rmsnorm_add"]["triton"] is kernels.rms_norm_add_triton


# --------------------------------------------------------------------------- launch spaces and validation


GR00T_SHAPES = {  # gr00t-n1.6 at micro-batch 8 x 2,048 (the benchmark's shapes)
    "rmsnorm": {"rows": 16384, "hidden": 2048},
    "swiglu": {"numel": 16384 * 5632},
    "rope": {"tokens": 16384, "q_heads": 32, "k_heads": 32, "head_dim": 64},
    "fused_linear_ce": {"rows": 8 * 2047, "hidden": 2048, "vocab": 50257},
    "fp8_amax": {"numel": 16384 * 5632},
    "fp8_cast": {"rows": 16384, "cols": 5632},
}


HIDDEN_4096_SHAPES = {  # the benchmark's larger shapes
    "rmsnorm": {"rows": 16384, "hidden": 4096},
    "swiglu": {"numel": 16384 * 11008},
    "rope": {"tokens": 16384, "q_heads": 32, "k_heads": 8, "head_dim": 128},
    "fused_linear_ce": {"rows": 8 * 2047, "hidden": 4096, "vocab": 50257},
    "fp8_amax": {"numel": 16384 * 11008},
    "fp8_cast": {"rows": 16384, "cols": 11008},
}


def test_every_space_is_valid_data():
    for kernel, space in registry.LAUNCH_SPACES.items():
        big = HIDDEN_4096_SHAPES[kernel]
        space.validate(space.defaults(big), big)
        assert len(space.sweep(big)) >= 1
        shape = GR00T_SHAPES[kernel]
        space.validate(space.defaults(shape), shape)
        sweep = space.sweep(shape)
        assert 1 <= len(sweep) <= 640, (kernel, len(sweep))  # --full-sweep: minutes, not hours, per shape
        for params in sweep:
            assert set(params) == set(space.param_names())
            space.validate(params, shape)
        assert "num_warps" in space.param_names()
    # RMSNorm's forward defaults: a whole-row tile read once below a row of 2,048, with 4 warps: 16 rows a program
    # up to a tile of 256 columns, 4 rows at 512 (run AY), one row from a tile of 1,024 (run AT); from a row of
    # 2,048 one row a program, two passes over chunks of half the row (at most 2,048 columns), 4 elements a thread
    # (runs AO, AR, AS)
    rms = registry.get_space("rmsnorm")
    fwd = ("block_rows", "fwd_block_size", "num_warps", "fwd_passes")
    assert [[rms.defaults({"rows": 16384, "hidden": d})[k] for k in fwd] for d in (200, 512, 1000, 1536, 2048, 4096,
                                                                                  8192)] == [
        [16, 256, 4, 1], [4, 512, 4, 1], [1, 1024, 4, 1], [1, 2048, 4, 1], [1, 1024, 8, 1], [1, 2048, 16, 1],
        [1, 2048, 16, 1]]
    # the largest power of two of rows whose bf16 logits fit in 512 MiB, capped by the rows there are
    ce = registry.get_space("fused_linear_ce")
    assert ce.defaults(GR00T_SHAPES["fused_linear_ce"])["chunk_size"] == 4096
    assert ce.defaults({"rows": 18, "hidden": 128, "vocab": 4096})["chunk_size"] == 256
    assert ce.defaults({"rows": 16384, "hidden": 4096, "vocab": 128256})["chunk_size"] == 2048


@pytest.mark.parametrize("cfg,match", [
    ({"rmsnorm": {"num_warps": 3}}, r"kernel 'rmsnorm': num_warps=3 must be one of \[1, 2, 4, 8, 16, 32\]"),
    ({"rmsnorm": {"block_size": 96}}, r"block_size=96 must be a power of two"),
    ({"rope": {"num_stages": 0}}, r"kernel 'rope': num_stages=0 must be between 1 and 8"),
    ({"swiglu": {"num_stages": 2}}, r"kernel 'swiglu': num_stages=2 is not a launch parameter.*'block_size'"),
    ({"swiglu": {"block_size": 65536, "num_warps": 4}}, r"block_size=65536 gives 512 tile elements per thread"),
    ({"layernorm": {"num_warps": 4}}, r"'layernorm' is not a kernel; kernels: \['rmsnorm'"),
    ({"fused_linear_ce": {"chunk_size": True}}, r"chunk_size=True must be an integer"),
])
def test_an_invalid_launch_config_is_refused_naming_kernel_param_value_and_constraint(cfg, match):
    kernels.configure({"rope": {"block_h": 2}})
    with pytest.raises(kernels.LaunchConfigError, match=match) as info:
        kernels.configure(cfg)
    from workbench.config import ConfigError

    assert isinstance(info.value, ConfigError)  # a trial that hits it fails as invalid_config
    assert info.value.key.startswith("loongforge.compute_domain.kernels.")
    assert kernels.active_config()["rope"] == {"block_h": 2}  # nothing changed


def test_a_config_that_does_not_fit_the_shape_fails_before_launch(gen, monkeypatch):
    class NotLaunched:
        def __getitem__(self, grid):
            raise AssertionError("launched")

    monkeypatch.setattr(kernels.rmsnorm, "_rmsnorm_fwd_kernel", NotLaunched())
    kernels.configure({"rmsnorm": {"block_size": 128}})  # a power of two: fine until the hidden size is known
    with pytest.raises(kernels.LaunchConfigError, match=r"block_size=128 must be a power of two >= the hidden "
                                                        r"size 200 \(the one-pass kernel holds a whole row"):
        kernels.rms_norm_triton(randn(gen, 4, 200), torch.ones(200, device=DEVICE), 1e-5)
    assert kernels.launch_record() == []


def test_launch_params_fill_defaults_and_are_recorded():
    kernels.configure({"rmsnorm": {"num_warps": 8}})
    p = kernels.launch_params("rmsnorm", {"rows": 10, "hidden": 200})
    assert p == {"num_warps": 8, "num_stages": 2, "block_rows": 16, "block_size": 256, "fwd_block_size": 256,
                 "fwd_passes": 1, "bwd_num_warps": 8, "bwd_block_rows": 16, "programs_per_sm": 2,
                 "bwd_tiles_in_flight": 2}
    assert kernels.launch_record() == [{"kernel": "rmsnorm", "hidden": 200, "rows": 10, **p,
                                        "configured": ["num_warps"]}]


# --------------------------------------------------------------------------- the tuner's knobs


def test_kernel_knobs_mirror_the_launch_spaces():
    from workbench.config import Config, merge_overrides
    from workbench.tune.knobs import KNOBS, drop_unsupported, get_knob

    declared = {k.key for k in KNOBS if ".kernels." in k.key}
    expected = {f"loongforge.compute_domain.kernels.{kernel}.{p}"
                for kernel, space in registry.LAUNCH_SPACES.items() for p in space.param_names()}
    assert declared == expected
    for key in expected:  # each key is accepted by the config (a dict field, set entry by entry)
        kernel, param = key.split(".")[-2:]
        cfg = merge_overrides(Config(), {key: registry.get_space(kernel).param(param).candidates(
            GR00T_SHAPES[kernel])[0]})
        registry.configure(cfg.loongforge.compute_domain.kernels)
    names = [k.name for k in KNOBS if ".kernels." in k.key]
    kept, dropped = drop_unsupported(names + ["triton_fusion", "loss_backend"], set())
    assert kept == []  # left out on a CPU host: the op kernels' knobs need CUDA, the FP8 casts' an FP8 GPU too
    assert {d.reason for d in dropped} == {"needs cuda", "needs cuda and an FP8 GPU (compute capability 8.9+) and "
                                                         "torchao"}
    cast = get_knob("fp8_cast_block_m")
    assert cast.active({"fp8": "tensorwise", "fp8_cast": "triton"})
    assert not cast.active({"fp8": "tensorwise", "fp8_cast": "torchao"}) and not cast.active({"fp8": "none"})
    assert get_knob("fp8_cast").active({"fp8": "tensorwise"}) and not get_knob("fp8_cast").active({"fp8": "rowwise"})
    k = get_knob("fused_linear_ce_chunk_size")
    assert k.key == "loongforge.compute_domain.kernels.fused_linear_ce.chunk_size" and k.kind == "int"
    assert not k.active({"triton_fusion": False, "loss_backend": "torch", "rmsnorm_backend": "triton"})
    assert k.active({"triton_fusion": False, "loss_backend": "triton"})
    assert k.active({"triton_fusion": True, "loss_backend": "torch"})
    assert get_knob("rmsnorm_backend").active({"triton_fusion": False})
    assert not get_knob("rmsnorm_backend").active({"triton_fusion": True})
    fused = get_knob("fused_residual_norm")  # one Triton kernel; with torch norms the same add and norm
    assert fused.key == "loongforge.compute_domain.fused_residual_norm" and fused.inactive is False
    assert fused.active({"triton_fusion": True}) and fused.active({"rmsnorm_backend": "triton"})
    assert not fused.active({"triton_fusion": False, "rmsnorm_backend": "torch", "loss_backend": "triton"})
