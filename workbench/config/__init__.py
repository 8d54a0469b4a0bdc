"""Typed config of the workbench: the schema of ``config.yaml``, YAML load/dump, strict validation.

Every section is a ``@dataclass(kw_only=True)``; the one-line string under each
field is its documentation (it is also written as a comment by ``dump_config``).
Defaults run on a CPU with the ``tiny`` model preset.

Validation has one mechanism, used both when a file is loaded and when a
dataclass is constructed directly:

- the field's type hint (``int``, ``float``, ``bool``, ``str``, ``X | None``,
  ``Literal[...]``, ``list[X]``, ``dict[str, X]``, nested sections) is checked by
  ``_coerce`` (bool is not an int; an int is accepted for a float; nothing is
  parsed from strings);
- simple bounds live in the field's metadata (``ge``, ``gt``, ``le``, ``lt``,
  ``power_of_two``, ``multiple_of``; for lists and dicts they apply to every
  number inside) and are checked by ``_check_ranges``, which every
  ``__post_init__`` calls;
- rules between fields of one section are in that section's ``__post_init__``;
  rules between sections are in ``validate``, called by ``Config.__post_init__``.

Every failure raises ``ConfigError`` naming the key path (``data.micro_batch_size``),
the value and what is allowed.

Configs are plain (mutable) dataclasses; ``merge_overrides`` is the validated way to
change one, and ``validate(cfg)`` re-checks a config that was edited in place.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import difflib
import functools
import hashlib
import inspect
import json
import math
import numbers
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from workbench.errors import ConfigError, _join

__all__ = [
    "CONFIG_VERSION",
    "DEFAULT_PROMETHEUS_PORT",
    "MODEL_PRESETS",
    "AllocatorConfig",
    "ComputeDomainConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "HardwareConfig",
    "IODomainConfig",
    "LoongforgeConfig",
    "MemoryDomainConfig",
    "MetricsConfig",
    "ModelConfig",
    "OpsConfig",
    "OverlapConfig",
    "Provenance",
    "TrainingConfig",
    "config_hash",
    "dump_config",
    "dumps_config",
    "field_docs",
    "from_dict",
    "load_config",
    "loads_config",
    "merge_overrides",
    "parse_overrides",
    "preset_config",
    "to_dict",
    "validate",
]

CONFIG_VERSION = 1
"""Schema version written by ``dump_config``; files with a newer version are rejected."""

MODEL_PRESETS = ("tiny", "gr00t-n1.6")
"""Model presets known by name; any other model needs ``model.config_path``."""

DEFAULT_PROMETHEUS_PORT = 9091
"""The documented port for ``metrics.prometheus_port`` (the exporter is off unless it is set)."""

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class _Mismatch(ConfigError):
    """A value of the wrong type at exactly ``key`` (lets a union re-describe what it allows)."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _suggest(word: Any, choices: Iterable[str]) -> str | None:
    if not isinstance(word, str):
        return None
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


# --------------------------------------------------------------------------- model


@dataclass(kw_only=True)
class ModelConfig:
    """Which model to build."""

    name: str = "tiny"
    """Preset name ('tiny' or 'gr00t-n1.6'); a free label such as 'custom' when config_path is set."""
    config_path: str | None = None
    """HF-format config.json describing the model; takes precedence over the preset name."""
    checkpoint_path: str | None = None
    """Weights to load before training; null starts from a random init."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        if self.config_path is None and self.name not in MODEL_PRESETS:
            hint = _suggest(self.name, MODEL_PRESETS)
            raise ConfigError(
                f"got {self.name!r}; expected a preset, one of {_choices(MODEL_PRESETS)}"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + ", or set config_path to an HF-format config.json for a custom model",
                key="name",
            )


# --------------------------------------------------------------------------- data


@dataclass(kw_only=True)
class DataConfig:
    """Shards, batching and the host-side loader pipeline."""

    loongbin_dir: str | None = None
    """Shard directory written by `python -m loaders.preprocess`; null with --synthetic."""
    micro_batch_size: int = field(default=4, metadata={"ge": 1})
    """Samples per GPU per forward/backward."""
    seq_len: int = field(default=256, metadata={"ge": 16})
    """Max tokens per sample; the largest bucket."""
    bucket_width: int = field(default=64, metadata={"ge": 8})
    """Step between sequence bucket lengths (padding waste vs number of distinct shapes); <= seq_len."""
    min_len: int = field(default=32, metadata={"ge": 1})
    """Shortest sample kept, in tokens; <= seq_len."""
    num_workers: int = field(default=2, metadata={"ge": 0})
    """Decode threads (0 decodes on the training thread)."""
    prefetch_batches: int = field(default=4, metadata={"ge": 1})
    """Batches decoded ahead of the training step."""
    shuffle_window_frames: int = field(default=4, metadata={"ge": 1})
    """Shard frames shuffled together."""
    seed: int = field(default=0, metadata={"ge": 0})
    """Seed of the data order."""
    packing: Literal["bucket", "fill"] = "bucket"
    """How stored records become rows at load time: bucket (each row one record, padded to its bucket's length)
    or fill (records laid end to end and cut into full rows of seq_len, no padding: a plain loop's batches)."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        if self.bucket_width > self.seq_len:
            raise ConfigError(
                f"got {self.bucket_width}; must be <= seq_len ({self.seq_len})", key="bucket_width"
            )
        if self.min_len > self.seq_len:
            raise ConfigError(f"got {self.min_len}; must be <= seq_len ({self.seq_len})", key="min_len")


# --------------------------------------------------------------------------- training


@dataclass(kw_only=True)
class TrainingConfig:
    """Optimisation, schedule, checkpoints and the measurement protocol of the loop."""

    max_steps: int = field(default=200, metadata={"ge": 1})
    """Optimizer steps to run."""
    global_batch_size: int | None = field(default=None, metadata={"ge": 1})
    """Samples per optimizer step; a multiple of data.micro_batch_size x hardware.gpus (sets grad accumulation)."""
    grad_accum_steps: int = field(default=1, metadata={"ge": 1})
    """Micro-batches per optimizer step; with global_batch_size set it must be 1 (derived) or agree with it."""
    learning_rate: float = field(default=3e-4, metadata={"gt": 0})
    """Peak learning rate."""
    min_lr_ratio: float = field(default=0.1, metadata={"ge": 0, "le": 1})
    """Final learning rate of the cosine schedule, as a fraction of the peak."""
    warmup_steps: int = field(default=10, metadata={"ge": 0})
    """Linear learning-rate warm-up steps."""
    weight_decay: float = field(default=0.1, metadata={"ge": 0})
    """AdamW decoupled weight decay."""
    beta1: float = field(default=0.9, metadata={"ge": 0, "lt": 1})
    """AdamW first-moment decay."""
    beta2: float = field(default=0.95, metadata={"ge": 0, "lt": 1})
    """AdamW second-moment decay."""
    grad_clip: float = field(default=1.0, metadata={"ge": 0})
    """Max global gradient norm; 0 turns clipping off."""
    optimizer: Literal["adamw"] = "adamw"
    """Optimizer."""
    scheduler: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after warm-up."""
    seed: int = field(default=0, metadata={"ge": 0})
    """Seed of the model init."""
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """Compute dtype; auto = bf16 autocast on GPU, fp32 on CPU."""
    checkpoint_dir: str | None = None
    """Where checkpoints are written; null writes none."""
    checkpoint_every: int = field(default=0, metadata={"ge": 0})
    """Steps between checkpoints; 0 = only at the end or on interrupt (when checkpoint_dir is set)."""
    log_every: int = field(default=10, metadata={"ge": 1})
    """Steps per measurement window (one log line and one intermediate value each)."""
    warmup_measure_steps: int = field(default=3, metadata={"ge": 0})
    """First steps excluded from measurement (compile, graph capture, allocator settling)."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Decoder blocks whose activations are recomputed in backward instead of kept: none, selective (every
    activation_checkpointing_every-th block) or full (every block); trades compute for memory."""
    activation_checkpointing_every: int = field(default=2, metadata={"ge": 1})
    """N of selective checkpointing: every N-th decoder block is recomputed."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        if self.checkpoint_every > 0 and self.checkpoint_dir is None:
            raise ConfigError(
                f"got {self.checkpoint_every}, but checkpoint_dir is not set; "
                "set checkpoint_dir or checkpoint_every: 0",
                key="checkpoint_every",
            )


# --------------------------------------------------------------------------- loongforge domains


@dataclass(kw_only=True)
class IODomainConfig:
    """IO domain: async shard reads and zstd decode."""

    io_backend: Literal["auto", "io_uring", "threadpool"] = "auto"
    """Read backend; auto = io_uring where available, else the thread pool."""
    io_uring_entries: int = field(default=64, metadata={"power_of_two": True, "ge": 1, "le": 4096})
    """io_uring submission ring depth (reads in flight)."""
    zstd_dict_size: int = field(default=262144, metadata={"ge": 1024})
    """Bytes of each bucket's zstd dictionary (used by preprocess)."""
    zstd_level: int = field(default=12, metadata={"ge": 1, "le": 22})
    """zstd compression level (used by preprocess)."""
    read_threads: int = field(default=4, metadata={"ge": 1})
    """Reader threads of the thread-pool backend."""

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass(kw_only=True)
class AllocatorConfig:
    """PyTorch CUDA caching-allocator settings (PYTORCH_CUDA_ALLOC_CONF); null leaves torch's default."""

    expandable_segments: bool | None = None
    """Grow segments in place instead of allocating new ones."""
    roundup_power2_divisions: int | None = field(
        default=None, metadata={"power_of_two": True, "ge": 1, "le": 256}
    )
    """Split each power-of-two size range into this many rounding steps."""
    max_split_size_mb: int | None = field(default=None, metadata={"ge": 20})
    """Blocks larger than this are never split (torch's minimum is 20)."""
    garbage_collection_threshold: float | None = field(default=None, metadata={"gt": 0, "lt": 1})
    """Reclaim cached blocks when usage exceeds this fraction of the allowed memory."""

    def __post_init__(self) -> None:
        _check_ranges(self)

    def to_env(self) -> str:
        """The PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF value for the set fields; "" when none is set."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            parts.append(f"{f.name}:{value!s}")  # torch parses True/False and plain numbers
        return ",".join(parts)


@dataclass(kw_only=True)
class MemoryDomainConfig:
    """Memory domain: pinned host staging and the device allocator."""

    pinned_block_kb: int | None = field(default=None, metadata={"ge": 4, "multiple_of": 4})
    """Pinned staging block in KiB (whole 4 KiB pages); null = ceil(bytes/sample x micro-batch / 4096) x 4096 bytes."""
    num_staging_blocks: int = field(default=4, metadata={"ge": 2})
    """Pinned staging blocks in rotation (2 = double buffering)."""
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    """CUDA caching-allocator settings, applied through the environment of the trial process."""

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass(kw_only=True)
class OpsConfig:
    """Backend of each fused op."""

    rmsnorm: Literal["torch", "triton"] = "torch"
    """RMSNorm backend."""
    swiglu: Literal["torch", "triton"] = "torch"
    """SwiGLU MLP activation backend."""
    rope: Literal["torch", "triton"] = "torch"
    """Rotary position embedding backend."""
    loss: Literal["torch", "triton"] = "torch"
    """Cross-entropy loss backend."""

    def __post_init__(self) -> None:
        _check_ranges(self)


_GRAPH_CAPTURING_COMPILE_MODES = ("reduce-overhead", "max-autotune")


@dataclass(kw_only=True)
class Fp8ModulesConfig:
    """Which Linears FP8 training converts (module names as in HF checkpoints: ``layers.0.mlp.up_proj``)."""

    include: list[str] = field(default_factory=lambda: ["layers.*"])
    """Glob patterns (fnmatch) of the Linears to convert; the default is every decoder-block Linear."""
    exclude: list[str] = field(default_factory=list)
    """Glob patterns of Linears kept in high precision even where include matches."""
    size_filter: bool = True
    """Also apply torchao's size thresholds for the recipe (small matmuls are slower in FP8; dims must be
    multiples of 16)."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        for key in ("include", "exclude"):
            for i, pattern in enumerate(getattr(self, key)):
                if not pattern.strip():
                    raise ConfigError("empty pattern; expected a glob such as 'layers.*.mlp.*'", key=f"{key}[{i}]")


def _check_kernel_launch(kernels_cfg: Mapping[str, Mapping[str, int]]) -> None:
    """The checks of ``kernels`` that hold at every shape (a known kernel and parameter, a value some shape allows,
    constraints between parameters), at load: a typo fails here, not only on a GPU that runs the kernel. The checks
    that depend on the shape run at launch."""
    if not kernels_cfg:
        return
    try:  # imported here: kernels.registry imports this module (and the kernels package, torch and triton)
        from kernels.registry import LAUNCH_SPACES
    except ImportError:  # no Triton on this machine: its kernels cannot run here, and are checked where they can
        return
    for kernel, params in kernels_cfg.items():
        space = LAUNCH_SPACES.get(kernel)
        if space is None:
            raise ConfigError(f"unknown kernel; kernels: {', '.join(LAUNCH_SPACES)}", key=f"kernels.{kernel}")
        for e in space.problems(params)[:1]:
            known = e.param in space.param_names()
            raise ConfigError(f"got {e.value!r}; {e.constraint}" if known else e.constraint,
                              key=f"kernels.{kernel}.{e.param}")


@dataclass(kw_only=True)
class ComputeDomainConfig:
    """Compute domain: compilation, CUDA graphs and Triton kernels."""

    compile: Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "none"
    """torch.compile mode of the model; none runs eagerly."""
    compile_scope: Literal["model", "layer"] = "layer"
    """What one compiled graph covers: the whole loss (model), or each decoder block plus the final norm and loss
    (layer: one compile reused by every block, far shorter compile times, and per-block backward nodes, so the
    overlap scheduler's all-reduces start during the backward as they do eagerly)."""
    compile_shapes: Literal["dynamic", "static"] = "dynamic"
    """How compiled graphs treat the bucket length: dynamic (a symbolic sequence length: one compile serves every
    bucket) or static (one compile per bucket shape, each specialised; compile time grows with the number of
    buckets). Either way every shape is compiled before the first step, so no measured step compiles."""
    graph_capture: bool = False
    """Capture the training step in CUDA graphs (one per bucket shape, all captured before the first step)."""
    triton_fusion: bool = False
    """Every op uses its Triton kernel, whatever `ops` says (the orchestrator's switch)."""
    fused_residual_norm: bool = False
    """Every residual add runs inside the RMSNorm that follows it (one Triton kernel with the rmsnorm op on
    Triton; the same add and norm with torch). On an H200: 1.02x eager, 1.01x compiled over Triton ops without
    it (docs/kernel-notes.md, RMSNorm)."""
    ops: OpsConfig = field(default_factory=OpsConfig)
    """Per-op backend choice, used when triton_fusion is false."""
    kernels: dict[str, dict[str, int]] = field(default_factory=dict, metadata={"ge": 1})
    """Launch parameters per kernel, e.g. {rmsnorm: {num_warps: 8, num_stages: 2, block_size: 1024}}."""
    fp8: Literal["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"] = "none"
    """FP8 training of the Linears in fp8_modules through torchao.float8 (the recipe's name); none keeps them in
    the compute dtype. Needs torchao (the [fp8] extra) and, on CUDA, compute capability 8.9 or newer; changes
    numerics, so the tuner checks its loss against the base config's."""
    fp8_modules: Fp8ModulesConfig = field(default_factory=Fp8ModulesConfig)
    """Which Linears FP8 converts."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_kernel_launch(self.kernels)
        if self.graph_capture and self.compile in _GRAPH_CAPTURING_COMPILE_MODES:
            raise ConfigError(
                f"true cannot be combined with compile: {self.compile!r}, "
                "which captures CUDA graphs itself; set graph_capture: false or "
                "compile: 'max-autotune-no-cudagraphs'",
                key="graph_capture",
            )

    def effective_ops(self) -> dict[str, str]:
        """Backend of each op ('torch' or 'triton') once triton_fusion is applied."""
        return {
            f.name: "triton" if self.triton_fusion else getattr(self.ops, f.name) for f in fields(self.ops)
        }


@dataclass(kw_only=True)
class OverlapConfig:
    """Gradient communication: bucketing and overlap with backward."""

    bucket_size_mb: float = field(default=25.0, metadata={"gt": 0})
    """Gradient all-reduce bucket size in MiB."""
    overlap_ratio: float = field(default=1.0, metadata={"ge": 0, "le": 1})
    """Share of gradient buckets all-reduced during backward; the rest after it (0 in effect under graph_capture)."""
    mode: Literal["scheduler", "ddp"] = "scheduler"
    """Gradient sync with several GPUs: the workbench's overlap scheduler, or DistributedDataParallel (a baseline)."""

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass(kw_only=True)
class LoongforgeConfig:
    """The orchestrator's three domains plus communication overlap."""

    io_domain: IODomainConfig = field(default_factory=IODomainConfig)
    """Async shard reads and decode."""
    memory_domain: MemoryDomainConfig = field(default_factory=MemoryDomainConfig)
    """Pinned staging buffers and the allocator."""
    compute_domain: ComputeDomainConfig = field(default_factory=ComputeDomainConfig)
    """Compilation, CUDA graphs and kernels."""
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    """Gradient bucketing and communication/compute overlap."""

    def __post_init__(self) -> None:
        _check_ranges(self)


# --------------------------------------------------------------------------- hardware, metrics, provenance


@dataclass(kw_only=True)
class HardwareConfig:
    """Where the trial runs."""

    gpus: int = field(default=1, metadata={"ge": 1})
    """Processes (one per GPU) of the trial; more than one launches torchrun."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device; auto = cuda when available, else cpu."""
    peak_tflops: float | None = field(default=None, metadata={"gt": 0})
    """Peak dense TFLOP/s per GPU for MFU; null looks the GPU up in the peak table."""
    memory_fraction_limit: float = field(default=0.95, metadata={"gt": 0, "le": 1})
    """Share of device memory the process may use."""

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass(kw_only=True)
class MetricsConfig:
    """What the trial measures and where it writes it."""

    prometheus_port: int | None = field(default=None, metadata={"ge": 1, "le": 65535})
    """Port of the Prometheus exporter; null = off (9091 is the documented port)."""
    phase_timing: bool = True
    """Time each step phase (data_wait, h2d, forward, backward, grad_sync, optimizer)."""
    out_dir: str | None = None
    """Directory for the metrics JSON and the per-step phase table; null writes none."""

    def __post_init__(self) -> None:
        _check_ranges(self)


@dataclass(kw_only=True)
class Provenance:
    """Where an exported config came from and what it measured."""

    study: str
    """Study that produced this config."""
    trial: int | None = field(default=None, metadata={"ge": 0})
    """Trial number within the study; null for the baseline or a hand-written config."""
    tokens_per_s_per_gpu: float | None = field(default=None, metadata={"ge": 0})
    """Measured real (non-padding) tokens per second per GPU."""
    speedup: float | None = field(default=None, metadata={"gt": 0})
    """Median speedup over the baseline from the interleaved re-measurement."""
    speedup_ci: list[float] | None = field(default=None, metadata={"gt": 0})
    """95% interval of the speedup, [low, high]."""
    significant: bool | None = None
    """Whether the speedup exceeds the baseline's noise."""
    baseline_tokens_per_s_per_gpu: float | None = field(default=None, metadata={"ge": 0})
    """Measured baseline tokens per second per GPU."""
    numerics: dict[str, Any] | None = None
    """The numerics guard's check of the winner when it changes numerics (FP8): its last-window loss against the
    reference's on the same data, the relative difference and the tolerance; null when no knob changes numerics."""
    fingerprint: dict[str, str] = field(default_factory=dict)
    """Environment: GPU, driver, CUDA, torch, Triton, NCCL versions."""
    created: str | None = None
    """ISO 8601 time of the export."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        if self.speedup_ci is not None:
            if len(self.speedup_ci) != 2:
                raise ConfigError(
                    f"got {_show(self.speedup_ci)}; expected two numbers [low, high]", key="speedup_ci"
                )
            low, high = self.speedup_ci
            if low > high:
                raise ConfigError(f"got {_show(self.speedup_ci)}; low must be <= high", key="speedup_ci")
        if self.created is not None:
            try:
                datetime.datetime.fromisoformat(self.created)
            except ValueError:
                raise ConfigError(
                    f"got {self.created!r}; expected an ISO 8601 time such as '2025-01-31T12:00:00+00:00'",
                    key="created",
                ) from None


# --------------------------------------------------------------------------- top level


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
    provenance: Provenance | None = None
    """Set on exported configs: study, trial, measured speedup and environment."""

    def __post_init__(self) -> None:
        validate(self)

    def effective_grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step (derived from global_batch_size when it is set)."""
        gbs = self.training.global_batch_size
        if gbs is None:
            return self.training.grad_accum_steps
        return gbs // (self.data.micro_batch_size * self.hardware.gpus)

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
    _check_ranges(cfg)
    for path, section in _iter_sections(cfg):
        try:
            section.__post_init__()
        except ConfigError as e:
            raise e.with_prefix(path) from None

    data, training, hardware = cfg.data, cfg.training, cfg.hardware
    per_step = data.micro_batch_size * hardware.gpus
    if training.global_batch_size is not None:
        gbs = training.global_batch_size
        if gbs % per_step:
            raise ConfigError(
                f"got {gbs}; must be a multiple of data.micro_batch_size x hardware.gpus "
                f"= {data.micro_batch_size} x {hardware.gpus} = {per_step}",
                key="training.global_batch_size",
            )
        derived = gbs // per_step
        if training.grad_accum_steps not in (1, derived):
            raise ConfigError(
                f"got {training.grad_accum_steps}, but training.global_batch_size={gbs} with "
                f"data.micro_batch_size={data.micro_batch_size} and hardware.gpus={hardware.gpus} "
                f"means {derived}; leave grad_accum_steps at 1 (derived) or set it to {derived}",
                key="training.grad_accum_steps",
            )
    if cfg.loongforge.compute_domain.graph_capture and hardware.gpus > 1 and cfg.loongforge.overlap.mode == "ddp":
        # workbench/train/overlap.py: the scheduler composes with capture (all-reduces after the replay); DDP does not
        raise ConfigError(
            f"'ddp' cannot be combined with loongforge.compute_domain.graph_capture on hardware.gpus="
            f"{hardware.gpus}: DDP's gradient hooks would be captured into the graph; "
            "set mode: 'scheduler' or graph_capture: false",
            key="loongforge.overlap.mode",
        )
    if cfg.loongforge.compute_domain.graph_capture and hardware.device == "cpu":
        raise ConfigError(
            "true needs a CUDA device, but hardware.device is 'cpu'; "
            "set graph_capture: false or hardware.device: 'auto'",
            key="loongforge.compute_domain.graph_capture",
        )


def _iter_sections(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Nested section instances of ``obj``, deepest first, with their dotted paths."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        children = value.items() if isinstance(value, dict) else [(None, value)]
        for key, child in children:
            if is_dataclass(child) and not isinstance(child, type):
                child_path = _join(path, f.name if key is None else f"{f.name}.{key}")
                yield from _iter_sections(child, child_path)
                yield child_path, child


# --------------------------------------------------------------------------- typed checking


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _section_class(tp: Any) -> type | None:
    """The dataclass in ``tp`` (``Section`` or ``Section | None``), else None."""
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        return _section_class(members[0]) if len(members) == 1 else None
    return tp if isinstance(tp, type) and is_dataclass(tp) else None


def _choices(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _leaf_type(tp: Any) -> Any:
    """The scalar type at the bottom of ``X | None``, ``list[X]``, ``dict[str, X]``."""
    while True:
        if _is_union(tp):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return tp


def _describe_bounds(meta: Mapping[str, Any], leaf: Any) -> str:
    noun = "a power of two" if meta.get("power_of_two") else ("an integer" if leaf is int else "a number")
    lo = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    hi = (meta["le"], "]") if "le" in meta else (meta["lt"], ")") if "lt" in meta else None
    if lo and hi:
        text = f"{noun} in {lo[0]}{lo[1]}, {hi[0]}{hi[1]}"
    elif lo:
        text = f"{noun} {'>=' if lo[0] == '[' else '>'} {lo[1]}"
    elif hi:
        text = f"{noun} {'<=' if hi[1] == ']' else '<'} {hi[0]}"
    else:
        text = noun
    if "multiple_of" in meta:
        text += f" and a multiple of {meta['multiple_of']}"
    return text


def _describe(tp: Any, meta: Mapping[str, Any] | None = None) -> str:
    """What values of type ``tp`` (with bounds ``meta`` on its numbers) look like, in words."""
    meta = meta or {}
    if _is_union(tp):
        args = get_args(tp)
        parts = [_describe(a, meta) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " or ".join(parts)
    origin = get_origin(tp)
    if origin is Literal:
        return f"one of {_choices(get_args(tp))}"
    if origin is list:
        return f"a list of ({_describe(get_args(tp)[0], meta)})"
    if origin is dict:
        return f"a mapping (name -> {_describe(get_args(tp)[1], meta)})"
    if tp is bool:
        return "a boolean (true/false)"
    if tp in (int, float):
        return _describe_bounds(meta, tp)
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and is_dataclass(tp):
        return f"a mapping (the section {tp.__name__})"
    return str(tp)


def _mismatch(value: Any, tp: Any, path: str, meta: Mapping[str, Any] | None, note: str = "") -> _Mismatch:
    message = f"got {_show(value)} ({type(value).__name__}); expected {_describe(tp, meta)}"
    return _Mismatch(message + note, key=path)


def _coerce(value: Any, tp: Any, path: str, meta: Mapping[str, Any] | None = None) -> Any:
    """Check ``value`` against the type hint ``tp`` and return it in canonical form.

    Canonical: ints become floats where a float is expected, tuples become lists,
    mappings become section dataclasses (through ``from_dict``). Nothing is parsed
    from strings, and a bool is never an int.
    """
    if tp is Any:
        return value
    origin, args = get_origin(tp), get_args(tp)
    if _is_union(tp):
        if value is None:
            if type(None) in args:
                return None
            raise _mismatch(value, tp, path, meta)
        members = [a for a in args if a is not type(None)]
        for member in members:
            try:
                return _coerce(value, member, path, meta)
            except _Mismatch as e:
                if e.key != path:
                    raise  # a mismatch deeper inside (a list item, a section key) says more
        raise _mismatch(value, tp, path, meta)
    if origin is Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return value
        hint = _suggest(value, [a for a in args if isinstance(a, str)])
        raise _mismatch(value, tp, path, meta, f" (did you mean {hint!r}?)" if hint else "")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _mismatch(value, tp, path, meta)
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
        raise _mismatch(value, tp, path, meta, note)
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                return number
            raise _mismatch(value, tp, path, meta, " (must be finite)")
        note = " (a boolean is not a number)" if isinstance(value, bool) else ""
        raise _mismatch(value, tp, path, meta, note)
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise _mismatch(value, tp, path, meta)
    if origin is list:
        if isinstance(value, (list, tuple)):
            return [_coerce(item, args[0], f"{path}[{i}]", meta) for i, item in enumerate(value)]
        raise _mismatch(value, tp, path, meta)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _mismatch(value, tp, path, meta)
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Mismatch(f"key {_show(key)} ({type(key).__name__}) is not a string", key=path)
            out[key] = _coerce(item, args[1], _join(path, key), meta)
        return out
    if isinstance(tp, type) and is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, path)
        raise _mismatch(value, tp, path, meta)
    raise TypeError(f"{path}: unsupported type hint {tp!r} in the config schema")


def _check_bounds(value: Any, meta: Mapping[str, Any], path: str, leaf: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_bounds(item, meta, f"{path}[{i}]", leaf)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_bounds(item, meta, _join(path, key), leaf)
        return
    if not isinstance(value, numbers.Real):
        return
    allowed = _describe_bounds(meta, leaf)
    if meta.get("power_of_two") and not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
        raise ConfigError(f"got {_show(value)}, not a power of two; expected {allowed}", key=path)
    if (
        ("ge" in meta and not value >= meta["ge"])
        or ("gt" in meta and not value > meta["gt"])
        or ("le" in meta and not value <= meta["le"])
        or ("lt" in meta and not value < meta["lt"])
    ):
        raise ConfigError(f"got {_show(value)}, out of range; expected {allowed}", key=path)
    if "multiple_of" in meta and value % meta["multiple_of"]:
        raise ConfigError(f"got {_show(value)}, not a multiple of {meta['multiple_of']}; expected {allowed}", key=path)


def _check_ranges(obj: Any) -> None:
    """Check every field of a config dataclass against its type hint, then its metadata bounds.

    Called from each section's ``__post_init__``, so a section built directly is held to the
    same rules as one loaded from YAML. Values are stored back in canonical form (int -> float
    where a float is expected, tuple -> list, mapping -> section). Error keys are relative to
    ``obj``; ``from_dict`` prefixes them with the section's path.
    """
    hints = _hints(type(obj))
    for f in fields(obj):
        tp = hints[f.name]
        value = _coerce(getattr(obj, f.name), tp, f.name, f.metadata)
        object.__setattr__(obj, f.name, value)
        if f.metadata:
            _check_bounds(value, f.metadata, f.name, _leaf_type(tp))


# --------------------------------------------------------------------------- dict conversion


def _unknown_key(cls: type, key: Any, path: str) -> ConfigError:
    names = [f.name for f in fields(cls)]
    section = f"'{path}'" if path else "the top level"
    hint = _suggest(key, names)
    if hint is None and isinstance(key, str):
        elsewhere = [p for p in _schema_paths() if p.rsplit(".", 1)[-1] == key]
        hint = elsewhere[0] if elsewhere else None
    message = "unknown key" + (f"; did you mean {hint!r}?" if hint else "")
    message += f" Allowed keys of {section}: {', '.join(names)}"
    return ConfigError(message, key=_join(path, str(key)))


@functools.cache
def _schema_paths(cls: type | None = None, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema below ``cls`` (default: Config)."""
    cls = cls or Config
    out: list[str] = []
    for f in fields(cls):
        path = _join(prefix, f.name)
        out.append(path)
        section = _section_class(_hints(cls)[f.name])
        if section is not None:
            out.extend(_schema_paths(section, path))
    return tuple(out)


def from_dict(cls: type[T], data: Mapping[str, Any], path: str = "") -> T:
    """Build the config dataclass ``cls`` from plain data (as parsed from YAML), strictly.

    Rejects unknown keys (suggesting the close match), values of the wrong type and values
    out of range; a missing key takes its default. ``path`` is the dotted location of
    ``data`` inside the whole config, used in error messages.
    """
    if not isinstance(data, Mapping):
        raise _mismatch(data, cls, path, None)
    if cls is Config:
        try:
            _check_version(data.get("version"))
        except ConfigError as e:
            raise e.with_prefix(path) from None
    hints = _hints(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise _unknown_key(cls, key, path)
        kwargs[key] = _coerce(value, hints[key], _join(path, key), known[key].metadata)
    missing = [
        name
        for name, f in known.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(missing)}", key=path)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise e.with_prefix(path) from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass, keys in schema order (what ``dump_config`` writes)."""
    return dataclasses.asdict(cfg)


def config_hash(cfg: Config, length: int = 12) -> str:
    """Short stable hash of the config's content, excluding provenance."""
    data = to_dict(cfg)
    data.pop("provenance", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


# --------------------------------------------------------------------------- overrides


def merge_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """A new validated Config with dotted-key overrides applied, e.g. {"data.micro_batch_size": 8}.

    A mapping given for a section is merged key by key; a mapping given for a dict field
    (``loongforge.compute_domain.kernels``) replaces it, and ``...kernels.rmsnorm.num_warps``
    sets one entry. Unknown keys raise ConfigError naming the key.
    """
    data = to_dict(cfg)
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"malformed override key {key!r}; expected a dotted key such as 'data.seq_len'")
        _apply_override(data, key.split("."), value)
    return from_dict(Config, data)


def _apply_override(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node, tp = data, Any
    section: type | None = Config
    for i, part in enumerate(parts):
        path = ".".join(parts[:i])
        if section is not None:
            if part not in {f.name for f in fields(section)}:
                raise _unknown_key(section, part, path)
            tp = _hints(section)[part]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            raise ConfigError(f"is {_describe(tp)}, it has no key {part!r}", key=path)
        child_section = _section_class(tp)
        if i == len(parts) - 1:
            if child_section is not None and isinstance(value, Mapping) and isinstance(node.get(part), dict):
                for key, item in value.items():  # merge into the section, key by key
                    _apply_override(data, [*parts, str(key)], item)
            else:
                node[part] = value
            return
        if node.get(part) is None:
            node[part] = {}  # e.g. provenance.study on a config without provenance
        if not isinstance(node[part], dict):
            raise ConfigError(f"is {_show(node[part])}, it has no key {parts[i + 1]!r}", key=_join(path, part))
        node, section = node[part], child_section


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse command-line overrides ``["data.micro_batch_size=8", "training.dtype=bf16"]``.

    Each value is read as YAML (``8`` is an int, ``true`` a bool, ``null`` None, ``[1, 2]`` a list).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            out[key.strip()] = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse the value {text!r}: {e}", key=key.strip()) from None
    return out


# --------------------------------------------------------------------------- run helpers


def preset_config(name: str) -> Config:
    """The default config for the model preset ``name`` (one of MODEL_PRESETS); other keys keep their defaults."""
    return merge_overrides(Config(), {"model.name": name, "model.config_path": None})


# --------------------------------------------------------------------------- YAML


_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML 1.1 (PyYAML) reads 3e-4 as a string because it wants a dot; accept exponent forms too.
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def _resolvers_without(base: type, drop: set[str]) -> dict[str, list[Any]]:
    return {ch: [(tag, rx) for tag, rx in lst if tag not in drop] for ch, lst in base.yaml_implicit_resolvers.items()}


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads 3e-4 as a float, keeps timestamps as strings and rejects duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = _resolvers_without(yaml.SafeLoader, {_FLOAT_TAG, _TIMESTAMP_TAG})
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes any string our loader (or a plain YAML 1.1 reader) would read as non-string."""


_Dumper.yaml_implicit_resolvers = _resolvers_without(yaml.SafeDumper, set())
_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Double quotes keep newlines and control characters on one line as escapes.
    style = None if data.isprintable() else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def _flow(value: Any) -> str:
    """One-line YAML for a scalar or a small list/dict."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=sys.maxsize, allow_unicode=True, sort_keys=False
    )
    if text.endswith("\n...\n"):  # document-end marker after a plain top-level scalar
        text = text[: -len("\n...\n")]
    return text.rstrip("\n")


def _emit(data: Mapping[str, Any], tp: Any, indent: int, out: list[str], comments: bool) -> None:
    section = _section_class(tp)
    docs = field_docs(section) if comments and section is not None else {}
    pad = "  " * indent
    for key, value in data.items():
        child_tp = _hints(section)[key] if section is not None else (get_args(tp)[1] if get_args(tp) else Any)
        if indent == 0:
            out.append("")
        if key in docs:
            out.append(f"{pad}# {docs[key]}")
        if isinstance(value, dict) and value:
            out.append(f"{pad}{_flow(key)}:")
            _emit(value, child_tp, indent + 1, out, comments)
        else:
            out.append(f"{pad}{_flow(key)}: {_flow(value)}")


def dumps_config(cfg: Config, *, comments: bool = True) -> str:
    """YAML text of ``cfg``: sections in schema order, each key preceded by its documentation when ``comments``."""
    lines = [
        f"# LoongForge workbench config, schema version {cfg.version}; config_hash {config_hash(cfg)}.",
        "# Keys and allowed values: workbench/config/__init__.py. Unknown keys are rejected on load.",
    ]
    _emit(to_dict(cfg), Config, 0, lines, comments)
    return "\n".join(lines) + "\n"


def dump_config(cfg: Config, path: str | os.PathLike[str], *, comments: bool = True) -> Path:
    """Write ``cfg`` as YAML to ``path`` atomically (temp file + os.replace); returns the path."""
    path = Path(path)
    text = dumps_config(cfg, comments=comments)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename must not publish a file whose bytes are not on disk
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a config is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def check_yaml_text(text: str, source: str, what: str = "config") -> None:
    """A NUL byte (a binary or damaged file) and a file with nothing in it are ConfigErrors of one line."""
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise ConfigError(f"holds a NUL byte (character {nul}); expected a YAML {what} (is it a binary file?)",
                          source=source, line=line)
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise ConfigError(f"is empty; expected a YAML {what}"
                          + (" (to run a preset's defaults, pass --preset NAME instead of --config)"
                             if what == "config" else ""), source=source)


def loads_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate YAML text; errors name ``source`` (and the line, for YAML syntax errors). An empty
    text is refused: an empty file is a mistake, not a request for the defaults."""
    check_yaml_text(text, source)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = "invalid YAML" + (f" (column {mark.column + 1})" if mark is not None else "")
        message += f": {e.problem or e.context}"
        if e.problem and e.context:
            where = f" at line {e.context_mark.line + 1}" if e.context_mark is not None else ""
            message += f" ({e.context}{where})"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(message, source=source, line=line) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML error: {e}", source=source) from None
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"top level is {type(data).__name__}; expected a mapping of sections "
            f"({', '.join(f.name for f in fields(Config))})",
            source=source,
        )
    try:
        return from_dict(Config, data)
    except ConfigError as e:
        raise e.with_source(source) from None


def read_yaml_text(path: Path, what: str = "config") -> str:
    """The text of a YAML file; a missing, unreadable or non-UTF-8 file is a ConfigError naming it
    (``what``: the kind of file, for the message)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such {what} file", source=str(path)) from None
    except IsADirectoryError:
        raise ConfigError(f"is a directory; expected a {what} file", source=str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}); expected a YAML {what}", source=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", source=str(path)) from None


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config.yaml; ConfigError messages start with the file name."""
    path = Path(path)
    return loads_config(read_yaml_text(path), source=str(path))


# --------------------------------------------------------------------------- field documentation


@functools.cache
def _module_field_docs() -> dict[str, dict[str, str]]:
    try:
        tree = ast.parse(inspect.getsource(sys.modules[__name__]))
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
    return dict(_module_field_docs().get(cls.__name__, {}))
