"""FP8 training as a knob: config validation, the refusals, the module filter, and a CPU run (torchao emulates
the FP8 matmuls on the CPU, so the numbers are FP8's)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train.model import Llama, get_preset

torchao_missing = importlib.util.find_spec("torchao") is None
needs_torchao = pytest.mark.skipif(torchao_missing, reason="torchao (the [fp8] extra) is not installed")

FP8 = "loongforge.compute_domain.fp8"


def _cd(**over):
    return merge_overrides(preset_config("tiny"), over).loongforge.compute_domain


def test_fp8_head_is_tensorwise_only_and_runs_the_projects_casts():
    head = "loongforge.compute_domain.fp8_head"
    cd = _cd(**{FP8: "tensorwise", head: True})  # torchao's Linears, the project's casts for the head
    assert cd.effective_ops()["loss"] == "fp8" and cd.triton_casts
    cd = _cd(**{head: True})  # fp8: none: nothing in FP8, the head neither
    assert cd.effective_ops()["loss"] == "torch" and not cd.triton_casts
    with pytest.raises(ConfigError, match=r"loongforge\.compute_domain\.fp8_head: got true with fp8: 'rowwise'; the FP8 "
                                          r"LM head implements the tensorwise recipe only: set fp8: tensorwise or "
                                          r"fp8_head: false$"):
        _cd(**{FP8: "rowwise", head: True})


def test_fp8_config_values_and_errors():
    assert preset_config("tiny").loongforge.compute_domain.fp8 == "none"
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        assert _cd(**{FP8: recipe}).fp8 == recipe
    with pytest.raises(ConfigError, match=r"loongforge\.compute_domain\.fp8: got 'tensorwize'.*did you mean "
                                          r"'tensorwise'"):
        _cd(**{FP8: "tensorwize"})
    with pytest.raises(ConfigError, match=r"fp8_modules\.include\[1\]: empty pattern"):
        _cd(**{"loongforge.compute_domain.fp8_modules.include": ["layers.*", " "]})
    with pytest.raises(ConfigError, match=r"fp8_modules\.size_filtr: unknown key; did you mean 'size_filter'"):
        _cd(**{"loongforge.compute_domain.fp8_modules.size_filtr": False})


def _gr00t_on_meta():
    with torch.device("meta"):
        return Llama(get_preset("gr00t-n1.6"))


@needs_torchao
def test_module_filter_follows_torchao_thresholds_per_recipe():
    from workbench.train.fp8 import fp8_module_filter

    model = _gr00t_on_meta()
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]

    def chosen(**over):
        keep = fp8_module_filter(_cd(**over))
        return {n for n, m in linears if keep(m, n)}

    block0 = {f"layers.0.{p}" for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    tensorwise = chosen(**{FP8: "tensorwise"})
    assert len(tensorwise) == 28 * 7 and block0 <= tensorwise and "lm_head" not in tensorwise
    # rowwise: torchao leaves out N <= 2048 (q/k/v/o and down project to 2,048): only gate and up convert
    rowwise = chosen(**{FP8: "rowwise"})
    assert {n for n in rowwise if n.startswith("layers.0.")} == {"layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"}
    assert chosen(**{FP8: "rowwise_with_gw_hp"}) == rowwise
    only_mlp = chosen(**{FP8: "tensorwise", "loongforge.compute_domain.fp8_modules.include": ["layers.*.mlp.*"],
                         "loongforge.compute_domain.fp8_modules.exclude": ["layers.27.*"]})
    assert len(only_mlp) == 27 * 3 and "layers.27.mlp.up_proj" not in only_mlp
    # the tiny model's matmuls are all under torchao's thresholds: the size filter keeps them in high precision
    tiny = Llama(get_preset("tiny"))
    keep = fp8_module_filter(_cd(**{FP8: "tensorwise"}))
    assert not [n for n, m in tiny.named_modules() if keep(m, n)]


@needs_torchao
def test_default_include_reaches_the_vla_vision_and_backbone_blocks():
    from workbench.train.fp8 import fp8_module_filter
    from workbench.train.vla import VLA, get_vla_preset

    with torch.device("meta"):
        model = VLA(get_vla_preset("gr00t-n1.6-vla"))
    keep = fp8_module_filter(_cd(**{FP8: "tensorwise"}))
    chosen = {n for n, m in model.named_modules() if keep(m, n)}
    stacks = {n.split(".layers.")[0] for n in chosen}
    assert stacks == {"vision", "backbone"}  # the action head's 16 tokens a sample stay in bf16
    # tensorwise leaves out K <= 4096 with N <= 1024: a 1024-wide block's output projections stay in bf16
    assert {n.removeprefix("vision.layers.0.") for n in chosen if n.startswith("vision.layers.0.")} == {
        "attn.qkv", "mlp.fc1"}
    assert len([n for n in chosen if n.startswith("backbone.")]) == 12 * 7
    assert not any(n.startswith(("projector", "vision.patch_embed")) for n in chosen)


@needs_torchao
def test_refusals_name_the_key_and_the_reason(monkeypatch):
    import workbench.train.fp8 as fp8

    model = Llama(get_preset("tiny"))
    cd = _cd(**{FP8: "tensorwise"})
    with pytest.raises(ConfigError, match=r"fp8: got 'tensorwise', but no Linear matches fp8_modules .*size_filter: "
                                          r"false"):
        fp8.convert_to_fp8(model, cd, "cpu")
    # a GPU before compute capability 8.9
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"loongforge\.compute_domain\.fp8: got 'tensorwise', but NVIDIA A100-SXM4-"
                                          r"80GB has compute capability 8\.0; FP8 matmuls need 8\.9 or newer"):
        fp8.convert_to_fp8(model, cd, "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    assert fp8.fp8_unsupported_reason("cuda") is None
    # no torchao
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError, match=r"torchao is not installed; install the \[fp8\] extra"):
        fp8.convert_to_fp8(model, cd, "cuda")


@needs_torchao
def test_lm_head_is_refused_as_a_linear_and_fp8_head_named():
    from workbench.train.fp8 import convert_to_fp8

    with torch.device("meta"):
        model = Llama(get_preset("gr00t-n1.6"))  # untied head, vocab 50,257
    cd = _cd(**{FP8: "tensorwise", "loongforge.compute_domain.fp8_modules.include": ["*"],
                "loongforge.compute_domain.fp8_modules.size_filter": False})
    with pytest.raises(ConfigError, match=r"fp8_modules\.include: selects lm_head, which runs inside the loss op, "
                                          r"not as a Linear; .*set fp8_head: true"):
        convert_to_fp8(model, cd, "cpu")
    cd = _cd(**{FP8: "tensorwise", "loongforge.compute_domain.fp8_modules.include": ["*"],
                "loongforge.compute_domain.fp8_modules.exclude": ["lm_head"]})
    assert "lm_head" not in convert_to_fp8(model, cd, "cpu")


@needs_torchao
def test_trainer_trains_with_fp8_on_the_cpu(tmp_path):
    """Every decoder Linear of the tiny model converted (size filter off), with activation checkpointing: the loss
    is finite and falls, and the summary says what ran."""
    from torchao.float8.float8_linear import Float8Linear

    from test_train import _cfg, _losses  # the tiny loop's config and its per-step losses
    from workbench.train.trainer import Trainer
    from workbench.train import synthetic_data_dir

    cfg = _cfg(**{FP8: "rowwise", "loongforge.compute_domain.fp8_modules.size_filter": False,
                  "training.max_steps": 10, "training.activation_checkpointing": "selective",
                  "training.activation_checkpointing_every": 2})
    data = synthetic_data_dir(vocab_size=4096, seq_len=cfg.data.seq_len, min_len=cfg.data.min_len)
    trainer = Trainer(cfg, data_dir=data, out_dir=tmp_path)
    try:
        assert sum(isinstance(m, Float8Linear) for m in trainer.model.modules()) == 4 * 7
        summary = trainer.run()
    finally:
        trainer.close()
    assert summary["fp8/recipe"] == "rowwise" and summary["fp8/converted_linears"] == 28
    assert summary["training/checkpointed_blocks"] == 2
    losses = _losses(tmp_path)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
