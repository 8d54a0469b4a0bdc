"""The loongforge section of ``config.yaml``: the orchestrator's three domains (IO, memory, compute) and the
communication overlap, with the rules their fields share with the trainer (which compile modes capture graphs,
whether a ``graph_capture`` value captures, a bucket's bytes). Imported through ``workbench.config.schema`` (or the
package)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from kernels.registry import LAUNCH_SPACES
from workbench.config.typecheck import check_ranges
from workbench.errors import ConfigError

__all__ = ["GRAPH_CAPTURING_COMPILE_MODES", "MIB", "AllocatorConfig", "ComputeDomainConfig", "Fp8ModulesConfig",
           "IODomainConfig", "LoongforgeConfig", "MemoryDomainConfig", "OpsConfig", "OverlapConfig", "bucket_bytes",
           "graph_capture_on"]


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


@dataclass(kw_only=True)
class Fp8ModulesConfig:
    """Which Linears FP8 training converts (module names as in HF checkpoints: ``layers.0.mlp.up_proj``; a VLA's
    ``vision.layers.0.mlp.fc1``, ``backbone.layers.0.mlp.up_proj``, ``action_head.layers.0.ada``)."""

    include: list[str] = field(default_factory=lambda: ["layers.*", "vision.layers.*", "backbone.layers.*"])
    """Glob patterns (fnmatch) of the Linears to convert; the default is every decoder-block Linear, and a VLA's
    vision and backbone blocks (its action head's blocks run on a few tokens a sample, too few rows for FP8
    matmuls to pay for their casts)."""
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

