"""Knob registry: one declaration per knob, capabilities, dropping knobs the hardware cannot act on."""

from __future__ import annotations

import dataclasses

import pytest

from kernels.registry import LAUNCH_SPACES
from workbench.tune import knobs
from workbench.config import Config, ConfigError, merge_overrides, to_dict
from workbench.tune.knobs import KNOBS, Knob, detect_capabilities, drop_unsupported, format_dropped, get_knob, knob_names


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def test_every_knob_names_a_real_config_key_of_its_kind():
    data = to_dict(Config())
    for k in KNOBS:
        if ".kernels." in k.key:  # launch parameters live in a dict field that is empty by default
            kernel, param = k.key.split(".")[-2:]
            check = LAUNCH_SPACES[kernel].param(param).check
            value = next(v for v in [*range(1, 65), *(1 << i for i in range(7, 21))] if check(v) is None)
            cfg = merge_overrides(Config(), {k.key: value})  # ConfigError if the schema refuses the key
            assert _get(to_dict(cfg), k.key) == value
            with pytest.raises(ConfigError, match=rf"{k.key}: got {1 << 30}; "):  # the registry's check, at load
                merge_overrides(Config(), {k.key: 1 << 30})
            continue
        _get(data, k.key)  # KeyError if the schema has no such key
    assert [k.name for k in KNOBS] == list(knob_names())
    assert len(set(knob_names())) == len(KNOBS)


def test_the_issue_knobs_are_declared():
    expected = {
        "bucket_width": ("data.bucket_width", frozenset()),
        "io_uring_entries": ("loongforge.io_domain.io_uring_entries", {"io_uring"}),
        "num_workers": ("data.num_workers", frozenset()),
        "micro_batch_size": ("data.micro_batch_size", frozenset()),
        "compile": ("loongforge.compute_domain.compile", frozenset()),
        "graph_capture": ("loongforge.compute_domain.graph_capture", {"cuda"}),
        "bucket_size_mb": ("loongforge.overlap.bucket_size_mb", {"multi_gpu"}),
        "overlap_ratio": ("loongforge.overlap.overlap_ratio", {"multi_gpu"}),
        "pinned_block_kb": ("loongforge.memory_domain.pinned_block_kb", {"cuda"}),
        "expandable_segments": ("loongforge.memory_domain.allocator.expandable_segments", {"cuda"}),
        "roundup_power2_divisions": ("loongforge.memory_domain.allocator.roundup_power2_divisions", {"cuda"}),
        "max_split_size_mb": ("loongforge.memory_domain.allocator.max_split_size_mb", {"cuda"}),
        "garbage_collection_threshold": ("loongforge.memory_domain.allocator.garbage_collection_threshold",
                                         {"cuda"}),
    }
    for name, (key, requires) in expected.items():
        k = get_knob(name)
        assert (k.key, set(k.requires)) == (key, set(requires)), name


def test_graph_capture_is_conditional_on_the_compile_mode():
    k = get_knob("graph_capture")
    assert k.active({"compile": "none"}) and k.active({"compile": "max-autotune-no-cudagraphs"})
    assert not k.active({"compile": "reduce-overhead"}) and not k.active({"compile": "max-autotune"})
    assert k.inactive == "none"
    # the inactive value is what the config accepts with those modes
    merge_overrides(Config(), {"loongforge.compute_domain.compile": "reduce-overhead", k.key: k.inactive})


def test_compile_scope_is_searched_only_when_something_is_compiled():
    k = get_knob("compile_scope")
    assert k.key == "loongforge.compute_domain.compile_scope" and not k.requires
    assert not k.active({"compile": "none"}) and not k.active({})
    assert k.active({"compile": "default"}) and k.active({"compile": "max-autotune-no-cudagraphs"})
    assert k.inactive == "layer" == Config().loongforge.compute_domain.compile_scope  # per-block compile: the default
    cfg = merge_overrides(Config(), {"loongforge.compute_domain.compile": "default", k.key: "model"})
    assert cfg.loongforge.compute_domain.compile_scope == "model"
    with pytest.raises(ConfigError, match="compile_scope"):
        merge_overrides(Config(), {k.key: "block"})


def test_compile_shapes_is_searched_only_when_something_is_compiled():
    k = get_knob("compile_shapes")
    assert not k.active({"compile": "none"}) and k.active({"compile": "default"}) and k.inactive == "dynamic"
    assert merge_overrides(Config(), {k.key: "static"}).loongforge.compute_domain.compile_shapes == "static"
    with pytest.raises(ConfigError, match="compile_shapes"):
        merge_overrides(Config(), {k.key: "symbolic"})
    # Triton ops under compile take either (their launchers are custom ops: a symbolic length never reaches them)
    triton = {"loongforge.compute_domain.compile": "default", "loongforge.compute_domain.ops.loss": "triton"}
    for shapes in ("dynamic", "static"):
        cfg = merge_overrides(Config(), {**triton, k.key: shapes})
        assert cfg.loongforge.compute_domain.compile_shapes == shapes
        assert cfg.loongforge.compute_domain.effective_ops()["loss"] == "triton"


def test_liger_is_searched_beside_the_projects_ops_only_where_they_patch_different_modules():
    """run.prepare's rule (workbench/train/hf_prepare.py): eagerly Liger patches RMSNorm, SwiGLU and RoPE as the
    project's Triton ops would, so it is off beside any of them; compiled, it patches only its fused loss, so only
    the project's loss (or triton_fusion, which puts the loss on Triton too) turns it off."""
    k = get_knob("liger")
    assert k.active({}) and k.active({"compile": "default"}) and k.inactive is False
    for op in ("rmsnorm", "swiglu", "rope", "loss"):
        assert not k.active({"compile": "none", f"{op}_backend": "triton"}), op
    assert k.active({"compile": "default", "rmsnorm_backend": "triton", "swiglu_backend": "triton"})
    assert not k.active({"compile": "default", "loss_backend": "triton"})
    assert not k.active({"compile": "default", "triton_fusion": True})
    # the FP8 head is the project's loss op too (run.prepare refuses it beside Liger: two losses for one head)
    assert not k.active({"compile": "default", "fp8": "tensorwise", "fp8_head": True})
    assert k.active({"compile": "default", "fp8": "tensorwise", "fp8_head": False})


def test_the_projects_loss_is_searched_for_a_hugging_face_model_too():
    """run.prepare runs an HF model's head and loss through the project's loss op (ops.loss: triton, or the FP8
    head): loss_backend is searched unless the FP8 head already chose the op, fp8_head under tensorwise only, and
    Liger, sampled after both, only beside HF's loss."""
    names = knob_names()
    assert names.index("fp8_head") < names.index("loss_backend") < names.index("liger")  # sampling order
    loss, head = get_knob("loss_backend"), get_knob("fp8_head")
    assert loss.active({}) and loss.active({"fp8": "tensorwise", "fp8_head": False})
    assert not loss.active({"fp8": "tensorwise", "fp8_head": True}) and not loss.active({"triton_fusion": True})
    assert head.active({"fp8": "tensorwise"}) and not head.active({"fp8": "none"}) and head.inactive is False


def test_kind_checks():
    assert get_knob("num_workers").accepts(2) and not get_knob("num_workers").accepts(True)
    assert not get_knob("num_workers").accepts(2.5)
    assert get_knob("overlap_ratio").accepts(1) and get_knob("overlap_ratio").accepts(0.5)
    assert get_knob("triton_fusion").accepts(False) and not get_knob("triton_fusion").accepts(0)
    assert get_knob("graph_capture").accepts("fwd_bwd") and not get_knob("graph_capture").accepts([1])


def test_a_bad_declaration_is_refused():
    with pytest.raises(ValueError, match="unknown capabilities"):
        Knob(name="x", key="data.seed", kind="int", requires=frozenset({"tpu"}))
    with pytest.raises(ValueError, match="declared twice"):
        knobs._check_registry([*KNOBS, dataclasses.replace(KNOBS[0])])
    with pytest.raises(KeyError, match="known knobs"):
        get_knob("bucket_widht")


def test_dropping_on_a_cpu_host():
    names = list(knob_names())
    kept, dropped = drop_unsupported(names, {"io_uring"})
    assert kept == ["bucket_width", "io_uring_entries", "num_workers", "micro_batch_size", "packing",
                    "activation_checkpointing", "activation_checkpointing_every", "compile", "compile_scope",
                    "compile_shapes", "hf_attention", "hf_pad_vocab", "hf_packed_check"]
    reasons = {d.knob: d.reason for d in dropped}
    assert reasons["liger"] == "needs cuda and Liger-Kernel (pip install liger-kernel)"
    assert reasons["graph_capture"] == "needs cuda"
    assert reasons["fp8"] == "needs an FP8 GPU (compute capability 8.9+) and torchao"
    assert reasons["bucket_size_mb"] == "needs multi-gpu"
    text = format_dropped(dropped)
    fp8_gpu = "an FP8 GPU (compute capability 8.9+) and torchao"
    assert reasons["fp8_cast"] == reasons["fp8_cast_block_m"] == f"needs cuda and {fp8_gpu}"
    assert text.startswith(f"dropped for this hardware: fp8 (needs {fp8_gpu}), fp8_cast (needs cuda and {fp8_gpu}), "
                           f"fp8_head (needs cuda and {fp8_gpu}), graph_capture (needs cuda), ")
    assert "overlap_ratio (needs multi-gpu)" in text
    assert format_dropped([]) == ""


def test_dropping_on_a_gpu_host_without_io_uring():
    kept, dropped = drop_unsupported(list(knob_names()), {"cuda"})
    assert "graph_capture" in kept and "pinned_block_kb" in kept
    fp8_casts = {"fp8_cast", "fp8_head", "fp8_amax_num_warps", "fp8_amax_block_size", "fp8_amax_programs_per_sm",
                 "fp8_cast_num_warps", "fp8_cast_block_m", "fp8_cast_block_n"}  # the Triton casts: FP8 GPUs only
    assert {d.knob for d in dropped} == {"io_uring_entries", "bucket_size_mb", "overlap_ratio", "fp8", "liger",
                                         *fp8_casts}
    kept, dropped = drop_unsupported(list(knob_names()), {"cuda", "multi_gpu", "io_uring", "fp8", "liger"})
    assert not dropped


def test_detect_capabilities_here(monkeypatch):
    import torch

    caps = detect_capabilities(1)
    assert caps <= knobs.CAPABILITIES
    assert ("cuda" in caps) == torch.cuda.is_available()
    assert "multi_gpu" not in caps  # one GPU asked for
    monkeypatch.setattr(knobs, "_probe_io_uring", lambda: False)
    assert "io_uring" not in detect_capabilities(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    import workbench.train.fp8 as fp8

    monkeypatch.setattr(fp8, "fp8_unsupported_reason", lambda *a: "no FP8 here")
    assert detect_capabilities(8) == {"cuda", "multi_gpu"}
    monkeypatch.setattr(fp8, "fp8_unsupported_reason", lambda *a: None)
    assert detect_capabilities(8) == {"cuda", "multi_gpu", "fp8"}
    assert detect_capabilities(16) == {"cuda", "fp8"}
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "liger_kernel" else real(n, *a))
    assert detect_capabilities(1) == {"cuda", "fp8", "liger"}  # Liger-Kernel installed, on a GPU
