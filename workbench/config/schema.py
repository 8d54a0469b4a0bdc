"""The schema of ``config.yaml``: the top-level ``Config``, the rules between its sections (``validate``, the global
batch's ``accumulation``, ``Config``'s derived values), its hash and its fields' documentation (``field_docs``).
The sections, one ``@dataclass(kw_only=True)`` each with the one-line string under each field its documentation,
are in ``_sections.py`` (model, data, training, hardware, hf, metrics, provenance) and ``_domains.py`` (loongforge's
domains); this module is their public face. The conversion from and to plain dicts is ``typecheck``'s."""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from workbench.config._domains import (GRAPH_CAPTURING_COMPILE_MODES, MIB, AllocatorConfig, ComputeDomainConfig,
                                       Fp8ModulesConfig, IODomainConfig, LoongforgeConfig, MemoryDomainConfig,
                                       OpsConfig, OverlapConfig, bucket_bytes, graph_capture_on)
from workbench.config._sections import (DEFAULT_PROMETHEUS_PORT, MODEL_PRESETS, AugmentConfig, DataConfig, HFConfig,
                                        HardwareConfig, MetricsConfig, ModelConfig, Provenance, TrainingConfig)
from workbench.config.typecheck import check_ranges, schema_root, to_dict
from workbench.errors import ConfigError, join_keys

# the sections live in _sections.py and _domains.py; every name of the schema stays importable from here
__all__ = ["CONFIG_VERSION", "DEFAULT_PROMETHEUS_PORT", "GRAPH_CAPTURING_COMPILE_MODES", "MIB", "MODEL_PRESETS",
           "AllocatorConfig", "AugmentConfig", "ComputeDomainConfig", "Config", "DataConfig", "Fp8ModulesConfig",
           "HFConfig", "HardwareConfig", "IODomainConfig", "LoongforgeConfig", "MemoryDomainConfig", "MetricsConfig",
           "ModelConfig", "OpsConfig", "OverlapConfig", "Provenance", "TrainingConfig", "accumulation", "bucket_bytes",
           "config_hash", "field_docs", "graph_capture_on", "validate"]

CONFIG_VERSION = 1
"""Schema version written by ``dump_config``; files with a newer version are rejected."""


def accumulation(global_batch: int, micro_batch: int, world: int) -> int | None:
    """Micro-batches per optimizer step that keep ``global_batch`` samples with ``micro_batch`` samples on each of
    ``world`` processes; None when they do not divide it. The one global-batch rule: the config's checks, the
    trainer's accumulation and a hot reload's new micro-batch all read it."""
    per_step = micro_batch * world
    return global_batch // per_step if global_batch % per_step == 0 else None


# --------------------------------------------------------------------------- top level


@schema_root
@dataclass(kw_only=True)
class Config:
    """A complete, validated workbench config (the schema of config.yaml)."""

    version: int = field(default=CONFIG_VERSION, metadata={"ge": 1})
    """Schema version of this file."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model to build."""
    data: DataConfig = field(default_factory=DataConfig)
    """Shards, batching and the loader pipeline."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Optimisation, schedule, checkpoints and measurement."""
    loongforge: LoongforgeConfig = field(default_factory=LoongforgeConfig)
    """IO, memory and compute domains, and communication overlap."""
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    """Where the trial runs."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Measurement outputs."""
    hf: HFConfig = field(default_factory=HFConfig)
    """What ``run.prepare(model)`` changes in a Hugging Face model."""
    user: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    """Values of a loop of one's own: the study's user.* knobs land here (user.x -> user: {x: ...}); the built-in
    loop reads none of them."""
    provenance: Provenance | None = None
    """Set on exported configs: study, trial, measured speedup and environment."""

    def __post_init__(self) -> None:
        validate(self)

    @staticmethod
    def check_data(data: Mapping[str, Any]) -> None:
        """The raw data's checks before its fields are read: a config version newer than this workbench's."""
        _check_version(data.get("version"))

    def effective_grad_accum_steps(self, world_size: int | None = None) -> int:
        """Micro-batches per optimizer step (derived from global_batch_size when it is set) with ``world_size``
        processes (default hardware.gpus): the one rule the trainer and the config share."""
        gbs = self.training.global_batch_size
        if not gbs:
            return self.training.grad_accum_steps
        world = world_size or self.hardware.gpus
        accum = accumulation(gbs, self.data.micro_batch_size, world)
        return accum if accum is not None else gbs // (self.data.micro_batch_size * world)

    @property
    def effective_overlap_ratio(self) -> float:
        """The share of gradient buckets all-reduced during backward: 0 under graph capture, where every
        all-reduce runs after the replay (workbench/train/overlap.py), else ``overlap.overlap_ratio``."""
        return 0.0 if self.loongforge.compute_domain.captures else self.loongforge.overlap.overlap_ratio

    def ddp_capture_conflict(self, world: int) -> str | None:
        """Why this config cannot run with ``world`` processes: DDP's gradient hooks would be captured into the
        CUDA graph (the overlap scheduler composes with capture: it all-reduces after the replay); None when it
        can."""
        if self.loongforge.compute_domain.captures and world > 1 and self.loongforge.overlap.mode == "ddp":
            return (f"'ddp' cannot be combined with loongforge.compute_domain.graph_capture with {world} processes: "
                    "DDP's gradient hooks would be captured into the graph; set mode: 'scheduler' or "
                    "graph_capture: none")
        return None

    def effective_global_batch_size(self) -> int:
        """Samples per optimizer step across all GPUs."""
        return self.data.micro_batch_size * self.hardware.gpus * self.effective_grad_accum_steps()


def _check_version(version: Any) -> None:
    if isinstance(version, int) and not isinstance(version, bool) and version > CONFIG_VERSION:
        raise ConfigError(
            f"config version {version} is newer than this workbench supports (version {CONFIG_VERSION}); "
            "update the workbench, or re-export the config with this one",
            key="version",
        )


def validate(cfg: Config) -> None:
    """Check the rules between sections; raises ConfigError naming the keys involved.

    Called by ``Config.__post_init__``. After editing a Config in place, call it again:
    it first re-checks every section (types, ranges and per-section rules).
    """
    _check_version(cfg.version)
    check_ranges(cfg)
    for path, section in _iter_sections(cfg):
        try:
            section.__post_init__()
        except ConfigError as e:
            raise e.with_prefix(path) from None

    data, training, hardware = cfg.data, cfg.training, cfg.hardware
    if training.global_batch_size is not None:
        gbs = training.global_batch_size
        derived = accumulation(gbs, data.micro_batch_size, hardware.gpus)
        if derived is None:
            raise ConfigError(
                f"got {gbs}; must be a multiple of data.micro_batch_size x hardware.gpus "
                f"= {data.micro_batch_size} x {hardware.gpus} = {data.micro_batch_size * hardware.gpus}",
                key="training.global_batch_size",
            )
        if training.grad_accum_steps not in (1, derived):
            raise ConfigError(
                f"got {training.grad_accum_steps}, but training.global_batch_size={gbs} with "
                f"data.micro_batch_size={data.micro_batch_size} and hardware.gpus={hardware.gpus} "
                f"means {derived}; leave grad_accum_steps at 1 (derived) or set it to {derived}",
                key="training.grad_accum_steps",
            )
    if (conflict := cfg.ddp_capture_conflict(hardware.gpus)) is not None:
        raise ConfigError(conflict, key="loongforge.overlap.mode")
    if cfg.loongforge.compute_domain.captures and hardware.device == "cpu":
        raise ConfigError(
            f"{cfg.loongforge.compute_domain.graph_capture!r} needs a CUDA device, but hardware.device is 'cpu'; "
            "set graph_capture: none or hardware.device: 'auto'",
            key="loongforge.compute_domain.graph_capture",
        )


def _iter_sections(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Nested section instances of ``obj``, deepest first, with their dotted paths."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        children = value.items() if isinstance(value, dict) else [(None, value)]
        for key, child in children:
            if is_dataclass(child) and not isinstance(child, type):
                child_path = join_keys(path, f.name if key is None else f"{f.name}.{key}")
                yield from _iter_sections(child, child_path)
                yield child_path, child


# --------------------------------------------------------------------------- dict conversion


_LATER_SECTIONS = {"hf": HFConfig}
"""Sections added after configs were stored (studies' hashes, exported configs): left out of the hash at defaults."""
_LATER_KEYS = {("metrics", "profile_after_measure"): False, ("hf", "packed_check"): True}
"""Keys of older sections added after configs were stored: left out of the hash at their default."""


def config_hash(cfg: Config, length: int = 12, *, leave_out: tuple[str, ...] = ()) -> str:
    """Short stable hash of the config's content, excluding provenance and the dotted keys or sections in
    ``leave_out``. A section or key added after configs were stored (:data:`_LATER_SECTIONS`, :data:`_LATER_KEYS`)
    counts only once it leaves its default, so the hash of an earlier config holds (a stored study's baseline and
    A/B pairs are still recognised on resume)."""
    data = to_dict(cfg)
    data.pop("provenance", None)
    for dotted in leave_out:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node.get(part) or {}
        node.pop(last, None)
    for name, default in _LATER_SECTIONS.items():
        if data.get(name) == to_dict(default()):
            data.pop(name)
    for (name, key), value in _LATER_KEYS.items():
        if name in data and data[name].get(key) == value:
            data[name].pop(key)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


# --------------------------------------------------------------------------- field documentation


@functools.cache
def _module_field_docs(module: str) -> dict[str, dict[str, str]]:
    """The field docstrings of every class of ``module`` (a section's docs are in the module that defines it)."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError):
        return {}  # no source (frozen app): dumps carry no comments
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs: dict[str, str] = {}
        body = node.body
        for stmt, nxt in zip(body, body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
        out[node.name] = docs
    return out


def field_docs(cls: type) -> dict[str, str]:
    """The one-line docstring of each field of a config section, by field name."""
    return dict(_module_field_docs(cls.__module__).get(cls.__name__, {}))
