"""The Hugging Face forms of a model: ``config.json`` in (the supported model types, checked field by field) and out,
weights in (``model.safetensors``, a sharded ``model.safetensors.index.json``, or the loop's own ``latest.pt``) and
out (``model.safetensors`` + ``config.json`` that ``transformers`` loads).

The module names of :class:`~workbench.train.model.Llama` are HF's ``LlamaForCausalLM`` names without the
``model.`` prefix (``lm_head`` keeps its name), so a weight maps onto a parameter by name alone.

Every refusal is a :class:`~workbench.errors.ConfigError` at ``model.config_path`` or ``model.checkpoint_path``
naming the file and the field: a study or a run learns it before its first step, as ``invalid_config``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from workbench.files import atomic_write, write_json
from workbench.config import Config
from workbench.errors import ConfigError
from workbench.train.model import Llama, ModelArgs, get_preset

__all__ = ["SUPPORTED_MODEL_TYPES", "check_checkpoint", "check_model", "hf_config_dict", "load_weights", "model_args",
           "read_hf_config", "save_hf", "weight_shapes"]

SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "Llama 2/3 (attention_bias, mlp_bias, rope_scaling linear or llama3 included)",
    "mistral": "Mistral without a sliding window (sliding_window null, or >= max_position_embeddings)",
    "qwen2": "Qwen2/2.5 with their q/k/v biases, use_sliding_window false",
}
"""HF ``model_type`` -> what of it is implemented. A config without ``model_type`` is read as llama."""

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_ROPE_TYPES = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
# fields that, set, mean an architecture this loop does not build (experts, per-head norms, another attention)
_UNBUILT = {
    "num_local_experts": "mixture of experts", "num_experts": "mixture of experts",
    "n_routed_experts": "mixture of experts", "moe_intermediate_size": "mixture of experts",
    "num_experts_per_tok": "mixture of experts", "q_lora_rank": "latent attention",
    "kv_lora_rank": "latent attention", "qk_norm": "q/k norms", "use_qk_norm": "q/k norms",
}
_KEY = "model.config_path"


def model_args(name: str, config_path: str | None = None) -> ModelArgs:
    """The args of a config's model section: its HF ``config.json`` when given, else the preset ``name``."""
    return read_hf_config(config_path) if config_path else get_preset(name)


def check_model(cfg: Config) -> ModelArgs:
    """The model of ``cfg`` checked before anything runs: its config.json read (a refused field is named), its
    checkpoint's tensor names and shapes against that model (headers only), ``data.seq_len`` within its RoPE
    table. Raises ``ConfigError``; returns the args."""
    args = model_args(cfg.model.name, cfg.model.config_path)
    if cfg.data.seq_len > args.max_position_embeddings:
        raise ConfigError(f"got {cfg.data.seq_len}, above the model's max_position_embeddings "
                          f"({args.max_position_embeddings})", key="data.seq_len")
    if cfg.model.checkpoint_path:
        check_checkpoint(args, cfg.model.checkpoint_path)
    return args


# --------------------------------------------------------------------------- config.json in


def read_hf_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> ModelArgs:
    """The :class:`ModelArgs` of an HF ``config.json`` (a file, its folder, or a dict).

    Keys that do not shape the model (``architectures``, ``torch_dtype``, ``bos_token_id``, ...) are ignored.
    ``num_key_value_heads`` defaults to ``num_attention_heads``; ``head_dim``, if present, must equal
    hidden_size / num_attention_heads. The RoPE base and scaling are read from ``rope_theta``/``rope_scaling``
    (transformers 4) or ``rope_parameters`` (transformers 5). Any field that would need an architecture not
    built here is refused by name (:data:`SUPPORTED_MODEL_TYPES`).
    """
    cfg, source = _read_json(path_or_dict)

    def refuse(field: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {field}={cfg.get(field)!r} {why}", key=_KEY)

    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{source}: model_type={model_type!r} is not supported; supported: "
                          + "; ".join(f"{k} ({v})" for k, v in SUPPORTED_MODEL_TYPES.items()), key=_KEY)
    for field, what in _UNBUILT.items():
        if cfg.get(field) not in (None, 0, False):
            raise refuse(field, f"needs {what}, which this loop does not build")
    required = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                "max_position_embeddings")
    for key in required:
        if key not in cfg:
            raise ConfigError(f"{source}: missing required key {key!r}", key=_KEY)
    kwargs: dict[str, Any] = {key: cfg[key] for key in required}
    kv_heads = cfg.get("num_key_value_heads")
    kwargs["num_key_value_heads"] = cfg["num_attention_heads"] if kv_heads is None else kv_heads
    for key in ("rms_norm_eps", "tie_word_embeddings"):
        if cfg.get(key) is not None:
            kwargs[key] = cfg[key]
    kwargs["model_type"] = model_type

    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise refuse("hidden_act", "is not supported; allowed: 'silu'")
    if cfg.get("attention_dropout") not in (None, 0, 0.0):
        raise refuse("attention_dropout", "is not supported (the loop has no dropout); allowed: 0.0")
    if any(kind != "full_attention" for kind in cfg.get("layer_types") or ()):
        raise refuse("layer_types", "has layers other than 'full_attention'; only full causal attention is built")
    if model_type == "qwen2":
        kwargs["qkv_bias"] = True  # Qwen2's q/k/v projections always carry a bias; its o_proj never
        if cfg.get("use_sliding_window"):
            raise refuse("use_sliding_window", "is not supported (sliding-window attention); allowed: false")
    else:
        for key in ("attention_bias", "mlp_bias"):
            if not isinstance(cfg.get(key, False), bool):
                raise refuse(key, "must be true or false")
        kwargs["qkv_bias"] = kwargs["o_bias"] = cfg.get("attention_bias", False)
        kwargs["mlp_bias"] = cfg.get("mlp_bias", False)
        window = cfg.get("sliding_window")
        if window is not None and window < cfg["max_position_embeddings"]:
            raise refuse("sliding_window", f"is not supported (a window under max_position_embeddings="
                                           f"{cfg['max_position_embeddings']}); allowed: null")
    kwargs["rope_theta"], kwargs["rope_scaling"] = _rope(cfg, source)
    try:
        args = ModelArgs(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}", key=_KEY) from None
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != args.head_dim:
        raise refuse("head_dim", f"must equal hidden_size / num_attention_heads = {args.head_dim} (a head dim of "
                                 "its own is not built)")
    return args


def _read_json(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "<config dict>"
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    source = str(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{source}: HF config.json not found", key=_KEY) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{source}: not valid JSON: {e}", key=_KEY) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(cfg).__name__}", key=_KEY)
    return cfg, source


def _rope(cfg: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` from transformers 4's keys or transformers 5's ``rope_parameters``."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" not in params and "rope_type" not in params:
        raise ConfigError(f"{source}: rope_parameters={dict(params)!r} holds per-layer-type RoPE, which is not "
                          "built", key=_KEY)
    scaling = params if isinstance(params, Mapping) else cfg.get("rope_scaling")
    theta = (params or {}).get("rope_theta", cfg.get("rope_theta")) if isinstance(params, Mapping) \
        else cfg.get("rope_theta")
    field = "rope_parameters" if isinstance(params, Mapping) else "rope_scaling"
    if scaling is None:
        return (10000.0 if theta is None else theta), None
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"{source}: {field}={scaling!r} must be an object or null", key=_KEY)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise ConfigError(f"{source}: {field}.rope_type={kind!r} is not implemented; implemented: "
                          f"{', '.join(_ROPE_TYPES)}", key=_KEY)
    missing = [k for k in _ROPE_TYPES[kind] if not isinstance(scaling.get(k), (int, float))]
    if missing:
        raise ConfigError(f"{source}: {field} of type {kind!r} needs numbers for {', '.join(missing)}", key=_KEY)
    out = None if kind == "default" else {"rope_type": kind, **{k: scaling[k] for k in _ROPE_TYPES[kind]}}
    return (10000.0 if theta is None else theta), out


# --------------------------------------------------------------------------- config.json out


def hf_config_dict(args: ModelArgs) -> dict[str, Any]:
    """The ``config.json`` that ``transformers`` builds the same model from (``AutoModelForCausalLM``)."""
    if args.model_type == "qwen2" and (args.o_bias or args.mlp_bias or not args.qkv_bias):
        raise ValueError("a qwen2 model has q/k/v biases and no other: these args cannot be written as qwen2")
    if args.model_type != "qwen2" and args.qkv_bias != args.o_bias:
        raise ValueError(f"{args.model_type}'s attention_bias covers q, k, v and o together: qkv_bias="
                         f"{args.qkv_bias} and o_bias={args.o_bias} cannot be written as {args.model_type}")
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[args.model_type]], "model_type": args.model_type,
        "hidden_size": args.hidden_size, "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.num_attention_heads, "num_key_value_heads": args.num_key_value_heads,
        "num_hidden_layers": args.num_hidden_layers, "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_position_embeddings, "head_dim": args.head_dim,
        "rms_norm_eps": args.rms_norm_eps, "rope_theta": args.rope_theta, "rope_scaling": args.rope_scaling,
        "tie_word_embeddings": args.tie_word_embeddings, "hidden_act": "silu", "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }
    if args.model_type == "qwen2":
        out["use_sliding_window"] = False
    else:
        out["attention_bias"], out["mlp_bias"] = args.qkv_bias, args.mlp_bias
    if args.model_type == "mistral":
        out["sliding_window"] = None
    return out


# --------------------------------------------------------------------------- weights in


def weight_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of ``args`` holds (the model built on the meta device)."""
    with torch.device("meta"):
        model = Llama(args)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _hf_to_module(name: str) -> str:
    return name.removeprefix("model.")


def _module_to_hf(name: str) -> str:
    return name if name.startswith("lm_head.") else f"model.{name}"


def _ignored(name: str) -> bool:
    # older checkpoints store RoPE's inverse frequencies, which the model computes
    return name.endswith("rotary_emb.inv_freq")


class _Checkpoint:
    """One checkpoint's tensors by module name, read lazily: safetensors (one file or sharded), or latest.pt."""

    def __init__(self, path: str | os.PathLike) -> None:
        p = Path(path)
        self.source = str(p)
        if p.is_dir():
            for name in ("model.safetensors.index.json", "model.safetensors", "latest.pt"):
                if (p / name).exists():
                    p = p / name
                    break
            else:
                raise ConfigError(f"{p}: no model.safetensors, model.safetensors.index.json or latest.pt in this "
                                  "folder", key="model.checkpoint_path")
        if not p.exists():
            raise ConfigError(f"{p}: no such file", key="model.checkpoint_path")
        self.path, self.hf = p, p.suffix != ".pt"
        self._state: dict[str, torch.Tensor] | None = None
        if p.name.endswith(".index.json"):
            try:
                weight_map = json.loads(p.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConfigError(f"{p}: not a safetensors index (a JSON object with a 'weight_map'): {e}",
                                  key="model.checkpoint_path") from None
            self.files = {name: p.parent / f for name, f in weight_map.items()}
        elif self.hf:
            self.files = {name: p for name in self._names(p)}
        else:
            self.files = {}

    def _names(self, file: Path) -> list[str]:
        try:
            with safe_open(str(file), framework="pt") as f:
                return list(f.keys())
        except (SafetensorError, OSError) as e:
            raise ConfigError(f"{file}: not a readable safetensors file: {e}", key="model.checkpoint_path") from None

    def _loop_state(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            try:
                ck = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - any unreadable file is the same refusal
                raise ConfigError(f"{self.path}: not a readable checkpoint of this loop: {e}",
                                  key="model.checkpoint_path") from None
            if not isinstance(ck, dict) or not isinstance(ck.get("model"), dict):
                raise ConfigError(f"{self.path}: a checkpoint of this loop holds a 'model' state dict; this file "
                                  "has none", key="model.checkpoint_path")
            self._state = ck["model"]
        return self._state

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Module name -> shape, without reading the data (safetensors headers)."""
        if not self.hf:
            return {n: tuple(t.shape) for n, t in self._loop_state().items()}
        out: dict[str, tuple[int, ...]] = {}
        for file, names in _by_file(self.files).items():
            if not file.exists():
                raise ConfigError(f"{self.path}: shard {file.name} is missing", key="model.checkpoint_path")
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    if not _ignored(name):
                        out[_hf_to_module(name)] = tuple(f.get_slice(name).get_shape())
        return out

    def tensors(self, names: Iterable[str]) -> Iterable[tuple[str, torch.Tensor]]:
        """``(module name, tensor)`` for the module names asked, one shard open at a time."""
        if not self.hf:
            state = self._loop_state()
            yield from ((n, state[n]) for n in names)
            return
        wanted = {_module_to_hf(n): n for n in names}
        for file, hf_names in _by_file({k: v for k, v in self.files.items() if k in wanted}).items():
            with safe_open(str(file), framework="pt") as f:
                for name in hf_names:
                    yield wanted[name], f.get_tensor(name)


def _by_file(files: Mapping[str, Path]) -> dict[Path, list[str]]:
    out: dict[Path, list[str]] = {}
    for name, file in files.items():
        out.setdefault(file, []).append(name)
    return out


def check_checkpoint(args: ModelArgs, path: str | os.PathLike) -> _Checkpoint:
    """Open the checkpoint at ``path`` and check its tensors' names and shapes against the model of ``args``
    (headers only); raise one ``ConfigError`` naming the first few missing, unexpected and mis-shaped tensors."""
    ck = _Checkpoint(path)
    have, want = ck.shapes(), weight_shapes(args)
    if args.tie_word_embeddings and "lm_head.weight" in have:  # a tied checkpoint may store the shared matrix twice
        del have["lm_head.weight"]
    name = _module_to_hf if ck.hf else str
    missing = [name(n) for n in want if n not in have]
    unexpected = [name(n) for n in have if n not in want]
    misshaped = [f"{name(n)} {list(have[n])} (model: {list(s)})" for n, s in want.items()
                 if n in have and have[n] != s]
    problems = [f"{len(items)} {what}: {', '.join(items[:4])}" + (", ..." if len(items) > 4 else "")
                for what, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
                if items]
    if problems:
        raise ConfigError(f"{ck.path} does not fit the model ({args.model_type}, {args.num_hidden_layers} layers, "
                          f"hidden {args.hidden_size}): " + "; ".join(problems), key="model.checkpoint_path")
    return ck


@torch.no_grad()
def load_weights(model: Llama, path: str | os.PathLike) -> int:
    """Copy the weights at ``path`` into ``model`` (cast to its dtype, on its device); returns the tensor count.
    Nothing is copied unless every tensor fits (:func:`check_checkpoint`)."""
    ck = check_checkpoint(model.args, path)
    params = model.state_dict(keep_vars=True)
    n = 0
    for name, tensor in ck.tensors(list(params)):
        params[name].copy_(tensor)
        n += 1
    return n


# --------------------------------------------------------------------------- weights out


def save_hf(model: nn.Module, out_dir: str | os.PathLike) -> Path:
    """Write ``model`` (a :class:`Llama`) as ``model.safetensors`` + ``config.json`` in ``out_dir``; returns the
    folder. ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads it; the files appear whole or not
    at all (each is written beside and renamed)."""
    assert isinstance(model, Llama)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config_dict(model.args)
    state = {_module_to_hf(n): t.detach().to("cpu", copy=True).contiguous()
             for n, t in model.state_dict().items()}
    data = save(state, metadata={"format": "pt"})  # safetensors' bytes, written as every file is (workbench.files)
    atomic_write(out / "model.safetensors", lambda f: f.write(data))
    write_json(out / "config.json", config)
    return out
