"""What the Trainer trains, as the few things that differ between workloads: the model it builds, the tensors a batch
hands the loss, a dummy batch of each shape (compile and capture before the first step), what a batch counts
(tokens, FLOPs), the units a per-part compile addresses, and the batch pipeline. The step, the graphs, the
optimizer, the session and the checkpoints are the Trainer's, the same for every workload.

* ``LanguageModel``: the Llama decoder (``model.py``) on token shards; a batch is ``(input_ids, position_ids,
  loss_mask)`` of one bucket length.
* ``VisionLanguageAction``: GR00T's VLA (``vla.py``) on vla shards (``loaders.vla``); a batch is ``(images,
  input_ids, position_ids, actions)`` of one fixed shape. A sample counts as the backbone's sequence (image tokens
  plus the padded instruction) in the tokens figures, so tokens/s is samples/s times a constant.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loaders.format import ShardSet
from loaders.pipeline import BatchPipeline
from loaders.vla import VLAPipeline
from workbench.config import Config, ConfigError
from workbench.train.flops import flops_per_token
from workbench.train.hf import check_model, load_weights
from workbench.train.model import Llama
from workbench.train.ops import OpSet
from workbench.train.vla import VLA, VLA_PRESETS, get_vla_preset, vla_flops_per_sample
from workbench.vocab import REAL_TOKENS_PER_S

__all__ = ["LanguageModel", "VisionLanguageAction", "Workload", "is_vla", "workload_for"]


def is_vla(cfg: Config) -> bool:
    """Whether ``cfg`` trains the vision-language-action workload (a VLA preset) rather than the language model."""
    return cfg.model.name in VLA_PRESETS


class Workload:
    """The interface (see the module docstring); ``args`` is the model's args, ``model`` set by :meth:`build`."""

    name = ""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.model: nn.Module | None = None

    def build(self, ops: OpSet) -> nn.Module:  # pragma: no cover - interface
        raise NotImplementedError

    def keep_blocks(self, k: int) -> None:  # pragma: no cover - interface
        """Build the model with at most ``k`` blocks in each stack (``python -m workbench.train --compile-only
        --blocks k``): every block of a stack compiles to the same graph, so a shallow model compiles the graphs
        of the full depth in a fraction of its memory and time."""
        raise NotImplementedError

    def load_weights(self, path: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def open_shards(self, data_dir: Path) -> ShardSet:  # pragma: no cover - interface
        """The shard set at ``data_dir``, checked against the model: data it cannot take is a ConfigError."""
        raise NotImplementedError

    def pipeline(self, cfg: Config, shards: ShardSet, *, seed: int,
                 device: torch.device) -> BatchPipeline:  # pragma: no cover - interface
        """The batch pipeline of ``cfg`` (the running one: a reload may change the micro-batch) over ``shards``."""
        raise NotImplementedError

    def inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:  # pragma: no cover - interface
        raise NotImplementedError

    def dummy_inputs(self, B: int, T: int, device: torch.device) -> tuple[torch.Tensor, ...]:  # pragma: no cover
        raise NotImplementedError

    def counts(self, batch: Any) -> tuple[int, int, float]:  # pragma: no cover - interface
        """``(real_tokens, padded_tokens, flops)`` of one micro-batch."""
        raise NotImplementedError

    def compile_units(self) -> list[nn.Module]:  # pragma: no cover - interface
        """The blocks ``compile_scope: layer`` compiles in place, each on its own."""
        raise NotImplementedError

    def compile_parts(self, *, mode: str, dynamic: bool) -> None:
        """``compile_scope: layer``: each block compiled in place (same parameter names; one graph serves every
        block of a stack, parameters being graph inputs), and the head (``head_loss``: the LM's norm + loss, the
        VLA's flow loss and action head glue) as a unit of its own; embedding lookups and the glue stay eager."""
        for block in self.compile_units():
            block.compile(mode=mode, dynamic=dynamic)
        self.model.head_loss = torch.compile(self.model.head_loss, mode=mode, dynamic=dynamic)

    def summary_fields(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Figures of the run summary only this workload has."""
        return {}

    def checkpointed_blocks(self) -> int:
        ck = self.model.checkpointed_blocks  # type: ignore[union-attr]
        return sum(map(len, ck.values())) if isinstance(ck, dict) else len(ck)


class LanguageModel(Workload):
    name = "language_model"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.args = check_model(cfg)  # a model or checkpoint it cannot build is an invalid_config, before any work
        self._flops: dict[int, int] = {}

    def build(self, ops: OpSet) -> nn.Module:
        self.model = Llama(self.args, ops)
        return self.model

    def keep_blocks(self, k: int) -> None:
        self.args = replace(self.args, num_hidden_layers=min(k, self.args.num_hidden_layers))

    def load_weights(self, path: str) -> int:
        return load_weights(self.model, path)  # type: ignore[arg-type]

    def open_shards(self, data_dir: Path) -> ShardSet:
        d, shards = self.cfg.data, ShardSet(data_dir)
        if shards.vocab_size > self.args.vocab_size:
            raise ConfigError(f"data.loongbin_dir: {data_dir} has token ids up to {shards.vocab_size - 1} (its "
                              f"manifest's vocab_size {shards.vocab_size}), at or above the model's vocab_size "
                              f"{self.args.vocab_size}; write the shards with the model's tokenizer or use a model "
                              f"with a vocabulary of at least {shards.vocab_size}", key="data.loongbin_dir")
        longest = int(shards.bucket_length.max())
        if longest > d.seq_len:
            raise ConfigError(f"data.loongbin_dir: {data_dir} has records up to {longest} tokens, longer than "
                              f"data.seq_len={d.seq_len}; preprocess with --max-len {d.seq_len} or raise "
                              f"data.seq_len", key="data.seq_len")
        return shards

    def pipeline(self, cfg: Config, shards: ShardSet, *, seed: int, device: torch.device) -> BatchPipeline:
        d, io, mem = cfg.data, cfg.loongforge.io_domain, cfg.loongforge.memory_domain
        return BatchPipeline.from_config(d, io, mem, seed=seed, device=device, shards=shards)

    def inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:
        return batch.input_ids, batch.position_ids, batch.loss_mask

    def dummy_inputs(self, B: int, T: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        ids = torch.zeros(B, T, dtype=torch.int32, device=device)
        pos = torch.arange(T, dtype=torch.int32, device=device).expand(B, T).contiguous()
        return ids, pos, torch.ones(B, T, dtype=torch.uint8, device=device)

    def counts(self, batch: Any) -> tuple[int, int, float]:
        f = self._flops.get(batch.seq_len)
        if f is None:
            f = self._flops[batch.seq_len] = flops_per_token(self.args, batch.seq_len)
        return batch.real_tokens, batch.padded_tokens, float(batch.real_tokens * f)

    def compile_units(self) -> list[nn.Module]:
        return list(self.model.layers)  # type: ignore[union-attr]

    def compile_parts(self, *, mode: str, dynamic: bool) -> None:
        super().compile_parts(mode=mode, dynamic=dynamic)
        m = self.model
        m.norm.compile(mode=mode, dynamic=dynamic)
        if m.ops.rmsnorm_add is not None:  # the final norm adds the last block's MLP output
            m.norm.add_forward = torch.compile(m.norm.add_forward, mode=mode, dynamic=dynamic)


class VisionLanguageAction(Workload):
    name = "vision_language_action"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.vla_args = get_vla_preset(cfg.model.name)
        self.args = self.vla_args.backbone
        self.flops_per_sample = vla_flops_per_sample(self.vla_args)

    def build(self, ops: OpSet) -> nn.Module:
        self.model = VLA(self.vla_args, ops)
        return self.model

    def keep_blocks(self, k: int) -> None:
        a = self.vla_args
        self.args = replace(a.backbone, num_hidden_layers=min(k, a.backbone.num_hidden_layers))
        self.vla_args = replace(a, vision_layers=min(k, a.vision_layers), head_layers=min(k, a.head_layers),
                                backbone=self.args)

    def load_weights(self, path: str) -> int:
        """The loop's own ``latest.pt`` (a VLA has no HF form here)."""
        if not str(path).endswith(".pt"):
            raise ConfigError(f"got {path!r}; a VLA model loads this loop's own latest.pt only",
                              key="model.checkpoint_path")
        try:  # tensors and plain types only: a data file runs no code
            ck = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file (pickle-only objects too) is the same refusal
            raise ConfigError(f"{path}: not a readable checkpoint of this loop (tensors and plain types): "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
                              key="model.checkpoint_path") from None
        if not isinstance(ck, dict) or not isinstance(ck.get("model"), dict):
            raise ConfigError(f"{path}: a checkpoint of this loop holds a 'model' state dict; this file has none",
                              key="model.checkpoint_path")
        state = ck["model"]
        self.model.load_state_dict(state)  # type: ignore[union-attr]
        return len(state)

    def open_shards(self, data_dir: Path) -> ShardSet:
        return ShardSet(data_dir)

    def pipeline(self, cfg: Config, shards: ShardSet, *, seed: int, device: torch.device) -> BatchPipeline:
        a = self.vla_args
        d, io, mem = cfg.data, cfg.loongforge.io_domain, cfg.loongforge.memory_domain
        try:
            p = VLAPipeline.from_config(d, io, mem, seed=seed, device=device, shards=shards)
        except ConfigError:
            raise
        except ValueError as e:  # the loader names the config key: a config the data cannot serve
            raise ConfigError(str(e)) from None
        want = ((a.channels, a.image_size, a.image_size), (a.action_horizon, a.action_dim))
        if (tuple(p.image_shape), tuple(p.action_shape)) != want or p.text_len > a.text_tokens:
            p.close()
            raise ConfigError(f"data.loongbin_dir: {shards.root} holds images {tuple(p.image_shape)}, actions "
                              f"{tuple(p.action_shape)} and instructions of {p.text_len} tokens; model "
                              f"{cfg.model.name!r} takes images {want[0]}, actions {want[1]} and at most "
                              f"{a.text_tokens} tokens", key="data.loongbin_dir")
        return p

    def inputs(self, batch: Any) -> tuple[torch.Tensor, ...]:
        return batch.images, batch.input_ids, batch.position_ids, batch.actions, batch.keys

    def dummy_inputs(self, B: int, T: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        a = self.vla_args
        images = torch.zeros(B, a.channels, a.image_size, a.image_size, dtype=torch.uint8, device=device)
        ids = torch.zeros(B, T, dtype=torch.int32, device=device)
        pos = torch.arange(T, dtype=torch.int32, device=device).expand(B, T).contiguous()
        keys = torch.arange(B, dtype=torch.int32, device=device)
        return images, ids, pos, torch.zeros(B, a.action_horizon, a.action_dim, device=device), keys

    def summary_fields(self, summary: dict[str, Any]) -> dict[str, Any]:
        tps, text = summary.get(REAL_TOKENS_PER_S), self.cfg.data.text_len or self.vla_args.text_tokens
        return {"throughput/samples_per_s_per_gpu": tps / (self.vla_args.num_image_tokens + text) if tps else None}

    def counts(self, batch: Any) -> tuple[int, int, float]:
        tokens = batch.samples * (self.vla_args.num_image_tokens + batch.seq_len)
        return tokens, tokens, float(batch.samples * self.flops_per_sample)

    def compile_units(self) -> list[nn.Module]:
        m = self.model
        return [*m.vision.layers, *m.backbone.layers, *m.action_head.layers]  # type: ignore[union-attr]

    def compile_parts(self, *, mode: str, dynamic: bool) -> None:
        """As every workload's, with the action head's blocks run between the head's graphs, each in its own:
        traced into ``head_loss``, they would be unrolled into one graph per depth, which a shallow twin does
        not compile (``keep_blocks``) and which compiles every block's code again (the head has 32)."""
        head = self.model.action_head  # type: ignore[union-attr]
        head.run_layers = torch.compiler.disable(head.run_layers)
        super().compile_parts(mode=mode, dynamic=dynamic)


def workload_for(cfg: Config) -> Workload:
    """The workload of ``cfg``'s model: a VLA preset, else a language model."""
    return VisionLanguageAction(cfg) if is_vla(cfg) else LanguageModel(cfg)
