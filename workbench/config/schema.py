"""The schema of ``config.yaml``: one ``@dataclass(kw_only=True)`` a section, the one-line string under each field its
documentation (read by ``field_docs``), rules between sections in ``validate``, and the conversion from and to plain
dicts (``from_dict``, ``to_dict``)."""

from __future__ import annotations

import ast
import datetime
import functools
import hashlib
import inspect
import ipaddress
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, TypeVar


from kernels.registry import LAUNCH_SPACES
from workbench.config.typecheck import check_ranges, choices_text, show_value, suggest, schema_root, to_dict
from workbench.errors import ConfigError, join_keys


CONFIG_VERSION = 1
"""Schema version written by ``dump_config``; files with a newer version are rejected."""

MODEL_PRESETS = ("tiny", "gr00t-n1.6", "tiny-vla", "gr00t-n1.6-vla")
"""Model presets known by name; any other model needs ``model.config_path``."""

DEFAULT_PROMETHEUS_PORT = 9091
"""The port ``python -m workbench.train`` serves on when ``metrics.prometheus_port`` is null (the Trainer
itself, and a tuner's trial, serve none unless the port is set)."""

T = TypeVar("T")


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
        check_ranges(self)


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
        check_ranges(self)

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
        check_ranges(self)


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
        check_ranges(self)


GRAPH_CAPTURING_COMPILE_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that capture CUDA graphs themselves: graph_capture stays none under them."""


def graph_capture_on(graph_capture: Any) -> bool:
    """Whether a ``graph_capture`` value captures any segment of the step (None and False read as none)."""
    return graph_capture not in (None, False, "none")


MIB = 1024 ** 2


def bucket_bytes(bucket_size_mb: float) -> int:
    """A gradient bucket's target size in bytes: the one conversion of ``bucket_size_mb`` (MiB)."""
    return max(1, int(bucket_size_mb * MIB))


def accumulation(global_batch: int, micro_batch: int, world: int) -> int | None:
    """Micro-batches per optimizer step that keep ``global_batch`` samples with ``micro_batch`` samples on each of
    ``world`` processes; None when they do not divide it. The one global-batch rule: the config's checks, the
    trainer's accumulation and a hot reload's new micro-batch all read it."""
    per_step = micro_batch * world
    return global_batch // per_step if global_batch % per_step == 0 else None


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
        check_ranges(self)
        for key in ("include", "exclude"):
            for i, pattern in enumerate(getattr(self, key)):
                if not pattern.strip():
                    raise ConfigError("empty pattern; expected a glob such as 'layers.*.mlp.*'", key=f"{key}[{i}]")


def _check_kernel_launch(kernels_cfg: Mapping[str, Mapping[str, int]]) -> None:
    """The checks of ``kernels`` that hold at every shape (a known kernel and parameter, a value some shape allows,
    constraints between parameters), at load: a typo fails here, not only on a GPU that runs the kernel. The checks
    that depend on the shape run at launch."""
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
    graph_capture: Literal["none", "fwd_bwd", "fwd_bwd+optimizer"] | bool = "none"
    """CUDA graph capture, by segment: fwd_bwd (forward + backward in one graph per bucket shape; the optimizer runs
    eagerly on the graphs' gradient tensors), fwd_bwd+optimizer (and clip + AdamW in a second graph, its state
    allocated before capture); data loading stays outside. All captured before the first step. true and false
    are read as fwd_bwd+optimizer and none."""
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
    fp8_cast: Literal["torchao", "triton"] = "torchao"
    """Who casts to FP8 under fp8: tensorwise: torchao's Float8Linear, or the project's Triton kernels
    (kernels/fp8_cast.py: one amax read, one pass writing both layouts, a shared input cast once; torchao's
    numerics, launch parameters under kernels.fp8_amax and kernels.fp8_cast). CUDA only; with fp8: none it has
    nothing to cast."""
    fp8_head: bool = False
    """The LM head's matmuls in FP8 too, under fp8: tensorwise (with none it has nothing to do), cast by the
    project's kernels whatever fp8_cast says: the loss op becomes the FP8 one whatever ops.loss says, with the
    vocabulary padded to a multiple of 64 and the padded logits sliced off before the fp32 softmax. The logits are
    materialised, as with ops.loss: torch."""

    def __post_init__(self) -> None:
        check_ranges(self)
        _check_kernel_launch(self.kernels)
        if self.fp8_cast == "triton" and self.fp8 not in ("none", "tensorwise"):  # with none: nothing to cast
            raise ConfigError(f"got 'triton' with fp8: {self.fp8!r}; the Triton casts implement the tensorwise recipe "
                              "only: set fp8: tensorwise or fp8_cast: torchao", key="fp8_cast")
        if self.fp8_head and self.fp8 not in ("none", "tensorwise"):  # with none: no FP8 at all
            raise ConfigError(f"got true with fp8: {self.fp8!r}; the FP8 LM head implements the tensorwise recipe "
                              "only: set fp8: tensorwise or fp8_head: false", key="fp8_head")
        if isinstance(self.graph_capture, bool):  # the switch's older form
            self.graph_capture = "fwd_bwd+optimizer" if self.graph_capture else "none"
        if self.captures and self.compile in GRAPH_CAPTURING_COMPILE_MODES:
            raise ConfigError(
                f"{self.graph_capture!r} cannot be combined with compile: {self.compile!r}, "
                "which captures CUDA graphs itself; set graph_capture: none or "
                "compile: 'max-autotune-no-cudagraphs'",
                key="graph_capture",
            )

    @property
    def captures(self) -> bool:
        """Whether any segment of the step is captured in a CUDA graph."""
        return graph_capture_on(self.graph_capture)

    def effective_ops(self) -> dict[str, str]:
        """Backend of each op ('torch' or 'triton') once triton_fusion is applied; the loss's is 'fp8' under
        fp8_head."""
        ops = {f.name: "triton" if self.triton_fusion else getattr(self.ops, f.name) for f in fields(self.ops)}
        if self.fp8_head and self.fp8 == "tensorwise":
            ops["loss"] = "fp8"
        return ops

    @property
    def triton_casts(self) -> bool:
        """The project's FP8 cast kernels run: under fp8: tensorwise, for the Linears (fp8_cast: triton) or the
        head (fp8_head)."""
        return self.fp8 == "tensorwise" and (self.fp8_cast == "triton" or self.fp8_head)


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
        check_ranges(self)

    @property
    def bucket_bytes(self) -> int:
        """``bucket_size_mb`` in bytes (:func:`bucket_bytes`)."""
        return bucket_bytes(self.bucket_size_mb)


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
        check_ranges(self)


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

    def __post_init__(self) -> None:
        check_ranges(self)
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


def config_hash(cfg: Config, length: int = 12) -> str:
    """Short stable hash of the config's content, excluding provenance. A section added after configs were stored
    (:data:`_LATER_SECTIONS`) counts only once it leaves its defaults, so the hash of an earlier config holds."""
    data = to_dict(cfg)
    data.pop("provenance", None)
    for name, default in _LATER_SECTIONS.items():
        if data.get(name) == to_dict(default()):
            data.pop(name)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


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
