"""The sections of ``config.yaml`` beside the loongforge domains (``_domains.py``): model, data, training,
hardware, hf, metrics and an exported config's provenance. One ``@dataclass(kw_only=True)`` a section, the one-line
string under each field its documentation; the rules inside a section are its ``__post_init__``, the rules between
sections ``workbench.config.schema.validate``. Imported through ``workbench.config.schema`` (or the package)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.config.typecheck import check_ranges, choices_text, show_value, suggest
from workbench.errors import ConfigError

__all__ = ["DEFAULT_PROMETHEUS_PORT", "MODEL_PRESETS", "AugmentConfig", "DataConfig", "HFConfig", "HardwareConfig",
           "MetricsConfig", "ModelConfig", "Provenance", "TrainingConfig"]

MODEL_PRESETS = ("tiny", "gr00t-n1.6", "tiny-vla", "gr00t-n1.6-vla")
"""Model presets known by name; any other model needs ``model.config_path``."""

DEFAULT_PROMETHEUS_PORT = 9091
"""The port ``python -m workbench.train`` serves on when ``metrics.prometheus_port`` is null (the Trainer
itself, and a tuner's trial, serve none unless the port is set)."""


# --------------------------------------------------------------------------- model


@dataclass(kw_only=True)
class ModelConfig:
    """Which model to build."""

    name: str = "tiny"
    """Preset name: the language models 'tiny' and 'gr00t-n1.6', the vision-language-action models 'tiny-vla' and
    'gr00t-n1.6-vla' (vla shards); a free label such as 'custom' when config_path is set."""
    config_path: str | None = None
    """HF-format config.json describing the model; takes precedence over the preset name."""
    checkpoint_path: str | None = None
    """Weights to load before training: an HF model.safetensors, its sharded .index.json, a folder holding either, or
    this loop's latest.pt; null starts from a random init. A checkpoint in training.checkpoint_dir takes precedence
    (a resumed run)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.checkpoint_path is not None and not os.path.exists(self.checkpoint_path):
            raise ConfigError(f"got {self.checkpoint_path!r}, which does not exist (from {os.getcwd()}); expected an "
                              "HF model.safetensors, model.safetensors.index.json, a folder holding one, or a "
                              "latest.pt of this loop", key="checkpoint_path")
        if self.config_path is None and self.name not in MODEL_PRESETS:
            hint = suggest(self.name, MODEL_PRESETS)
            raise ConfigError(
                f"got {self.name!r}; expected a preset, one of {choices_text(MODEL_PRESETS)}"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + ", or set config_path to an HF-format config.json for a custom model",
                key="name",
            )


# --------------------------------------------------------------------------- data


@dataclass(kw_only=True)
class AugmentConfig:
    """Image augmentation of vla samples, in the loader's decode workers (seeded per sample); GR00T N1's transforms
    by default. The token pipeline reads none of it."""

    enabled: bool = True
    """The off switch: false trains on the images exactly as stored."""
    crop_scale: float = field(default=0.95, metadata={"ge": 0.1, "le": 1})
    """Side of a random crop as a share of the image's, resized back; 1 = no crop."""
    shift_px: int = field(default=0, metadata={"ge": 0})
    """Random translation by up to this many pixels; 0 = none."""
    hflip_prob: float = field(default=0.0, metadata={"ge": 0, "le": 1})
    """Probability of a horizontal flip; off by default, since the actions are not mirrored with the image."""
    brightness: float = field(default=0.3, metadata={"ge": 0, "le": 1})
    """Brightness factor drawn in [1 - b, 1 + b]."""
    contrast: float = field(default=0.4, metadata={"ge": 0, "le": 1})
    """Contrast factor drawn in [1 - c, 1 + c]."""
    saturation: float = field(default=0.5, metadata={"ge": 0, "le": 1})
    """Saturation factor drawn in [1 - s, 1 + s]."""

    def __post_init__(self) -> None:
        check_ranges(self)


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
    text_len: int | None = field(default=None, metadata={"ge": 1})
    """vla shards: tokens every instruction is padded to (one shape a batch, for graph capture); null: the shard
    set's text length."""
    image_size: int | None = field(default=None, metadata={"ge": 1})
    """vla shards: the images' side in pixels, checked against the shard set's (nothing is resized); null: the set's."""
    action_shape: list[int] | None = None
    """vla shards: [steps, dims] of an action chunk, checked against the shard set's; null: the set's."""
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    """vla shards: image augmentation in the decode workers."""

    def __post_init__(self) -> None:
        check_ranges(self)
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
        check_ranges(self)
        if self.checkpoint_every > 0 and self.checkpoint_dir is None:
            raise ConfigError(
                f"got {self.checkpoint_every}, but checkpoint_dir is not set; "
                "set checkpoint_dir or checkpoint_every: 0",
                key="checkpoint_every",
            )


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
        check_ranges(self)


@dataclass(kw_only=True)
class HFConfig:
    """How ``run.prepare(model)`` changes a Hugging Face ``transformers`` model (workbench/train/hf_prepare.py); the
    built-in models read none of it. Compile, FP8, activation checkpointing and the Triton ops come from their own
    keys, for an HF model as for the built-in one."""

    attention: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """The model's attention implementation (``attn_implementation``)."""
    liger: bool = False
    """Liger-Kernel's patches of the model: RMSNorm, SwiGLU, RoPE, and the fused linear cross-entropy, which never
    materialises the logits (CUDA, ``pip install liger-kernel``). Excludes the project's Triton ops."""
    pad_vocab_multiple: int = field(default=0, metadata={"ge": 0, "le": 4096})
    """Pad the embedding and the LM head to a multiple of this many rows (HF's ``resize_token_embeddings``); 0 keeps
    the vocabulary. A vocabulary such as GPT-2's 50,257 (not a multiple of 8) puts the head's GEMMs on unaligned
    kernels; the new rows are never a label, but they take a share of the softmax and the saved model keeps them."""
    packed_check: bool = True
    """Whether the model's causal-mask builder checks its position ids for packed sequences, an ``.all()`` that
    makes the host wait for the device at every forward. false skips it for a forward given neither an attention
    mask nor position ids: the model then numbers the tokens itself, one sequence a row, which the check would find.
    A forward given either (a padded or a padding-free batch) is checked as before. Same masks, same numbers."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(kw_only=True)
class MetricsConfig:
    """What the trial measures and where it writes it."""

    prometheus_port: int | None = field(default=None, metadata={"ge": 1, "le": 65535})
    """Port of the Prometheus exporter; null = off in the Trainer and in trials, 9091 from the CLI."""
    prometheus_addr: str = "127.0.0.1"
    """Address the Prometheus exporter listens on: loopback only by default; ``0.0.0.0`` (or ``::``) serves every
    interface, on purpose."""
    phase_timing: bool = True
    """Time each step phase (data_wait, h2d, forward, backward, grad_sync, optimizer)."""
    out_dir: str | None = None
    """Directory for the metrics JSON and the per-step phase table; null writes none."""
    profile_steps: int = field(default=0, metadata={"ge": 0})
    """Steps after ``training.warmup_measure_steps`` to record with torch.profiler into ``<out_dir>/trace.json``
    (Perfetto), and on CUDA a memory snapshot; 0 = off. Needs an output directory."""
    profile_after_measure: bool = False
    """Profile the ``profile_steps`` steps after the measurement instead: the loop runs them after
    ``training.max_steps`` and they count in no window, loss or summary figure, so a measured run can carry a
    trace (the tuner's). Needs ``profile_steps`` > 0."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.profile_after_measure and self.profile_steps == 0:
            raise ConfigError("got true with profile_steps 0; set metrics.profile_steps to the steps to profile "
                              "after the measurement, or false", key="profile_after_measure")
        try:
            ipaddress.ip_address(self.prometheus_addr)
        except ValueError:
            raise ConfigError(f"got {self.prometheus_addr!r}; expected an IP address such as 127.0.0.1 (loopback, the "
                              "default) or 0.0.0.0 (every interface)", key="prometheus_addr") from None


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
    ab_pairs: int | None = field(default=None, metadata={"ge": 0})
    """Interleaved A/B pairs behind ``speedup`` and ``speedup_ci``; null when the base config is exported."""
    verdict: str | None = None
    """``winner``, ``no_significant_gain`` or ``no_candidate`` (the study's result in tune.json)."""
    best_candidate: dict[str, Any] | None = None
    """When the base config is exported: the best validated candidate (trial, params, speedup, interval, pairs)
    and why it lost."""
    searched_knobs: list[str] = field(default_factory=list)
    """The knobs the study searched."""
    changed_knobs: dict[str, Any] = field(default_factory=dict)
    """Knob -> {base, value} where the exported config differs from the study's base config."""
    budget: dict[str, Any] = field(default_factory=dict)
    """The study's budget and what it used: trials, trials_run, timeout_s, wall_s."""
    commit: str | None = None
    """Source revision of the workbench that ran the study (git), with ``-dirty`` for uncommitted changes."""
    data: dict[str, Any] = field(default_factory=dict)
    """Where the training data came from: ``source`` synthetic or shards, with the shards' path and tokenizer, or
    trainer (a loop of one's own, with its command)."""
    trainer: dict[str, Any] | None = None
    """The study's own training loop: ``command``, ``cwd``, ``env`` (docs/trial-contract.md); null for the built-in
    loop, which ``python -m workbench.train --config`` runs."""
    patches: dict[str, Any] | None = None
    """What ``run.prepare(model)`` changed in the Hugging Face model of the exported run (``applied``: one line each)
    and the versions of the libraries that did it (transformers, torchao, liger-kernel); null when nothing was
    prepared."""
    fingerprint: dict[str, str] = field(default_factory=dict)
    """Environment: GPU, driver, CUDA, torch, Triton, NCCL versions."""
    created: str | None = None
    """ISO 8601 time of the export."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.speedup_ci is not None:
            if len(self.speedup_ci) != 2:
                raise ConfigError(
                    f"got {show_value(self.speedup_ci)}; expected two numbers [low, high]", key="speedup_ci"
                )
            low, high = self.speedup_ci
            if low > high:
                raise ConfigError(f"got {show_value(self.speedup_ci)}; low must be <= high", key="speedup_ci")
        if self.created is not None:
            try:
                datetime.datetime.fromisoformat(self.created)
            except ValueError:
                raise ConfigError(
                    f"got {self.created!r}; expected an ISO 8601 time such as '2025-01-31T12:00:00+00:00'",
                    key="created",
                ) from None

