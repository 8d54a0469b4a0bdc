"""The HF forms of a model (workbench/train/hf.py): config.json checked field by field, weights in from transformers'
own files (one file, sharded, the loop's latest.pt) with the same logits, weights out that transformers reloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from workbench.config import Config, ConfigError, load_config, merge_overrides
from workbench.train.hf import check_checkpoint, load_weights, read_hf_config, save_hf
from workbench.train.model import Llama, num_params, rope_cos_sin

ASSETS = Path(__file__).parents[1] / "assets"
REAL = json.loads((ASSETS / "hf_configs.json").read_text())
GQA = json.loads((ASSETS / "gqa_config.json").read_text())
ROOT = Path(__file__).resolve().parents[2]


def _hf_model(config: dict, seed: int = 0) -> transformers.PreTrainedModel:
    """A transformers model of ``config`` with every tensor random (HF zeroes biases at init: they must count)."""
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**config)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05 if p.dim() > 1 else 0.2)
    return model


def _ours(path: Path) -> Llama:
    torch.manual_seed(123)  # a different init: equal logits then come from the loaded weights
    model = Llama(read_hf_config(path))
    load_weights(model, path)
    return model.eval()


def _logits_close(ours: Llama, hf: transformers.PreTrainedModel, T: int = 40) -> None:
    ids = torch.randint(0, ours.args.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T).expand(2, T)
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        got = ours.logits(ids, pos)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(REAL))
def test_parameter_counts_of_real_configs_are_exact(name):
    args = read_hf_config(REAL[name]["config"])
    assert num_params(args) == REAL[name]["params"]
    with torch.device("meta"):  # the built model holds exactly those parameters (biases included)
        assert num_params(Llama(args)) == REAL[name]["params"]


def test_qwen2_has_its_qkv_biases_and_llama3_rope_is_read():
    qwen = read_hf_config(REAL["Qwen/Qwen2.5-0.5B"]["config"])
    assert (qwen.qkv_bias, qwen.o_bias, qwen.mlp_bias, qwen.model_type) == (True, False, False, "qwen2")
    llama = read_hf_config(REAL["meta-llama/Llama-3.2-1B"]["config"])
    assert llama.rope_scaling == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    # transformers 5 writes the RoPE base inside rope_parameters: it must not fall back to 10000
    v5 = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_hidden_layers=1, vocab_size=64,
                                  rope_parameters={"rope_type": "default", "rope_theta": 500000.0}).to_dict()
    assert read_hf_config(v5).rope_theta == 500000.0


@pytest.mark.parametrize(("change", "field"), [
    ({"model_type": "mixtral", "num_local_experts": 8}, "model_type='mixtral'"),
    ({"model_type": "qwen3"}, "model_type='qwen3'"),
    ({"num_local_experts": 8}, "num_local_experts=8"),
    ({"model_type": "mistral", "sliding_window": 64}, "sliding_window=64"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=True"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type='yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"head_dim": 32}, "head_dim=32"),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types="),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
])
def test_unbuilt_architectures_are_refused_by_field(tmp_path, change, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GQA, **change}))
    with pytest.raises(ConfigError) as err:
        read_hf_config(path)
    assert err.value.key == "model.config_path" and str(path) in str(err.value) and field in str(err.value)


def test_hf_config_missing_key_names_file_and_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in GQA.items() if k != "vocab_size"}))
    for where in (path, tmp_path):  # the file, or the folder holding it
        with pytest.raises(ConfigError, match=f"{path}: missing required key 'vocab_size'"):
            read_hf_config(where)
    kv = {k: v for k, v in GQA.items() if k not in ("num_key_value_heads", "head_dim")}
    assert read_hf_config(kv).num_key_value_heads == GQA["num_attention_heads"]


LLAMA_BIASED = {**GQA, "attention_bias": True, "mlp_bias": True, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
QWEN2 = {**{k: v for k, v in GQA.items() if k not in ("attention_bias", "mlp_bias", "head_dim")},
         "model_type": "qwen2", "tie_word_embeddings": True, "use_sliding_window": False}
MISTRAL = {**{k: v for k, v in GQA.items() if k not in ("attention_bias", "mlp_bias")},
           "model_type": "mistral", "sliding_window": None}


@pytest.mark.parametrize("config", [GQA, LLAMA_BIASED, QWEN2, MISTRAL], ids=["llama", "llama-biases-llama3rope",
                                                                             "qwen2-tied", "mistral"])
def test_transformers_checkpoint_gives_the_same_logits(tmp_path, config):
    hf = _hf_model(config)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    ours = _ours(tmp_path)
    _logits_close(ours, hf)
    if config is LLAMA_BIASED:  # the scaling is in effect at these positions (a no-op would also pass above)
        plain = rope_cos_sin(ours.args.head_dim, 40, 10000.0)[0]
        assert not torch.allclose(ours.rotary.cos_Pd[:40], plain)


def test_sharded_checkpoint_and_its_index(tmp_path):
    hf = _hf_model(GQA)
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.exists() and len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    _logits_close(_ours(tmp_path), hf)  # the folder finds the index
    model = Llama(read_hf_config(tmp_path))
    assert load_weights(model, index) == len(model.state_dict())  # and the index itself


def test_mismatched_tensors_are_one_error_and_nothing_is_copied(tmp_path):
    hf = _hf_model(GQA)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    del state["model.layers.1.mlp.up_proj.weight"], state["model.norm.weight"]
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    state["model.embed_tokens.weight"] = torch.zeros(300, 64)
    save_file(state, str(tmp_path / "model.safetensors"))
    args = read_hf_config(GQA)
    model = Llama(args)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as err:
        load_weights(model, tmp_path)
    msg = str(err.value)
    assert err.value.key == "model.checkpoint_path"
    assert "2 missing: model.layers.1.mlp.up_proj.weight, model.norm.weight" in msg
    assert "1 unexpected: model.layers.0.self_attn.q_proj.bias" in msg
    assert "1 mis-shaped: model.embed_tokens.weight [300, 64] (model: [256, 64])" in msg
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
        check_checkpoint(args, tmp_path)


def test_a_missing_checkpoint_is_an_error_at_config_load(tmp_path):
    with pytest.raises(ConfigError) as err:
        merge_overrides(Config(), {"model.checkpoint_path": str(tmp_path / "nope.safetensors")})
    assert err.value.key == "model.checkpoint_path" and "does not exist" in str(err.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model:\n  checkpoint_path: {tmp_path / 'nope'}\n")
    with pytest.raises(ConfigError, match=rf"c\.yaml: model\.checkpoint_path: got '{tmp_path}/nope', which does "
                                          "not exist"):
        load_config(cfg)


def test_a_refused_model_stops_the_study_before_any_run(tmp_path, study_spec_file):
    from workbench.tune import TuneError, Tuner
    from workbench.tune.study import load_study_spec

    bad = tmp_path / "mixtral.json"
    bad.write_text(json.dumps({**GQA, "model_type": "mixtral"}))
    path = study_spec_file("refused")
    path.write_text(path.read_text().replace("model: tiny", f"model: {bad}"))  # a config.json as the model
    tuner = Tuner(load_study_spec(str(path)), out_root=tmp_path / "runs", progress=False, report=None)
    with pytest.raises(TuneError, match="model is rejected.*model_type='mixtral' is not supported"):
        tuner.run()
    assert not (tmp_path / "runs" / "refused" / "baseline").exists()


def test_hf_round_trip_through_the_training_cli(tmp_path, subprocess_env):
    """An HF checkpoint in, 6 CPU steps, the HF form out: transformers reloads it with our logits, and the loop's
    own latest.pt loads as a checkpoint_path too."""
    start = _hf_model(GQA)
    start.save_pretrained(tmp_path / "hf")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
model: {{name: custom, config_path: {tmp_path / 'hf' / 'config.json'}, checkpoint_path: {tmp_path / 'hf'}}}
data: {{seq_len: 128, micro_batch_size: 2, bucket_width: 32, min_len: 32}}
training: {{max_steps: 6, log_every: 2, warmup_measure_steps: 2, checkpoint_dir: {tmp_path / 'ck'}}}
hardware: {{device: cpu}}
""")
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(cfg), "--synthetic", "--no-prometheus",
                        "--summary", str(tmp_path / "s.json"), "--save-hf", str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"loaded 21 tensors from {tmp_path / 'hf'}" in r.stderr  # embedding, 2 x 9 per block, norm, head
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["steps"] == 6 and s["saved_hf"] == str(tmp_path / "out")
    assert s["model_params"] == 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176 + 2 * 64) + 64 + 2 * 256 * 64
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    trained = _ours(tmp_path / "out")
    _logits_close(trained, reloaded)
    # trained from the checkpoint: every tensor moved, none by more than 6 AdamW steps at lr <= 3e-4 can (a fresh
    # init would be 0.05 away)
    for k, v in reloaded.state_dict().items():
        assert not torch.equal(v, start.state_dict()[k]), k
        assert (v - start.state_dict()[k]).abs().max() < 6 * 3e-4 * 1.5, k
    own = Llama(read_hf_config(tmp_path / "out"))
    load_weights(own, tmp_path / "ck" / "latest.pt")
    assert all(torch.equal(a, b) for a, b in zip(own.state_dict().values(), trained.state_dict().values()))


def test_save_hf_of_a_preset_loads_in_transformers(tmp_path):
    torch.manual_seed(0)
    from workbench.train.model import get_preset

    model = Llama(get_preset("tiny")).eval()
    save_hf(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # no temp left
    _logits_close(model, transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval())
