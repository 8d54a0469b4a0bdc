"""The tuner's knobs: one declaration per knob, in ``KNOBS`` below.

A knob names a config key the tuner may change, the kind of value it takes, the
hardware capabilities it needs to act at all, and (for a conditional knob) when
it is active given the values of the knobs before it. Its range is not here: a
study spec (``studies/*.yaml``) gives each knob it searches a range or choices.

Adding a knob is one ``Knob(...)`` line in ``KNOBS``; the study loader, the
sampler, the trial runner, the exporter and the report all read this registry.

Capabilities (``detect_capabilities``):

* ``cuda``: a CUDA device is visible to torch;
* ``multi_gpu``: the study asks for more than one GPU and this host has that many
  (overlap and gradient-bucket knobs do nothing on one process);
* ``io_uring``: the kernel lets this process set up an io_uring ring
  (``loaders.reader.probe_io_uring`` where the loader provides it, else liburing);
* ``fp8``: a CUDA device of compute capability 8.9 or newer and torchao installed
  (``workbench.train.fp8.fp8_unsupported_reason``);
* ``liger``: a CUDA device and Liger-Kernel installed (its Triton kernels do not run under Triton's CPU
  interpreter).

A knob that changes the numbers the loop computes, not only how fast
(``numerics=True``: FP8), must also pass the tuner's numerics guard: its loss is
compared with the base config's on the same seed and data.

Knobs that need a missing capability are dropped from the search space and the
run says which (``drop_unsupported``, ``format_dropped``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kernels.registry import LAUNCH_SPACES
from workbench.config import GRAPH_CAPTURING_COMPILE_MODES, graph_capture_on
from workbench.train import fp8
from workbench.train.allocator import env_option
from workbench.vocab import KERNEL_KINDS, PHASES

__all__ = [
    "CAPABILITIES",
    "KNOBS",
    "DroppedKnob",
    "Knob",
    "detect_capabilities",
    "drop_unsupported",
    "format_dropped",
    "get_knob",
    "is_user_knob",
    "knob_names",
    "numerics_knobs",
    "user_knob",
]

CAPABILITIES = frozenset({"cuda", "multi_gpu", "io_uring", "fp8", "liger"})
"""Every capability a knob may require."""

KnobKind = Literal["int", "float", "categorical", "bool"]



@dataclass(frozen=True, kw_only=True)
class Knob:
    """One tunable config key."""

    name: str
    """Short name: the Optuna parameter name and the key under a study's ``space``."""
    key: str
    """Dotted config key the value is written to (``data.bucket_width``)."""
    kind: KnobKind
    """Value type: int, float, categorical (strings or mixed) or bool."""
    requires: frozenset[str] = field(default_factory=frozenset)
    """Capabilities (subset of CAPABILITIES) without which the knob cannot act."""
    condition: Callable[[Mapping[str, Any]], bool] | None = None
    """Active only when this returns True for the values of the knobs declared before it."""
    inactive: Any = None
    """Value written when ``condition`` is False (None: leave the base config's value)."""
    doc: str = ""
    """What the knob acts on (shown in the report and in error messages)."""
    numerics: bool = False
    """Changes the loop's numbers (not only its speed): a trial that sets it off its base value passes the
    numerics guard (workbench.tune.numerics) before it can win."""
    unset: Callable[[Mapping[str, str]], Any] | None = None
    """What a config that leaves the key unset (null) runs with, given the trial's environment; None where that is
    no single value of the knob. The cold walk starts such a base config from this value, which the baseline
    measured (workbench.tune.profiled)."""
    phases: frozenset[str] = frozenset(PHASES)
    """The step phases (workbench.vocab.PHASES) whose time the knob changes: the base run's profile weighs the
    knob by their share (workbench.tune.profiled). Every phase when unknown (a loop of one's own)."""
    kernels: frozenset[str] | None = None
    """The kinds of device time (workbench.vocab.KERNEL_KINDS) the knob can take away: its reach is their share of
    the base step in its kernel profile, which orders the cold walk (workbench.tune.profiled); empty where it can
    only add time (recompute); None where its phases are its reach (the data pipeline, the gradient sync)."""
    kernel_bound: float = 1.0
    """The largest part of its kinds' time the knob can take away: FP8's matmuls run at most twice bf16's peak."""

    def __post_init__(self) -> None:
        unknown = set(self.requires) - CAPABILITIES
        if unknown:
            raise ValueError(
                f"knob {self.name!r}: unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")
        if self.kind not in ("int", "float", "categorical", "bool"):
            raise ValueError(f"knob {self.name!r}: kind {self.kind!r} is not int, float, categorical or bool")
        if not self.phases or not self.phases <= set(PHASES):
            raise ValueError(f"knob {self.name!r}: phases {sorted(self.phases)} must be a non-empty subset of "
                             f"{', '.join(PHASES)}")
        if self.kernels is not None and not self.kernels <= set(KERNEL_KINDS):
            raise ValueError(f"knob {self.name!r}: kernels {sorted(self.kernels)} must be a subset of "
                             f"{', '.join(KERNEL_KINDS)}")
        if not 0 < self.kernel_bound <= 1:
            raise ValueError(f"knob {self.name!r}: kernel_bound {self.kernel_bound} must be in (0, 1]")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` has this knob's type (a bool is not an int; an int is a float)."""
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if self.kind == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, (str, int, float, bool)) or value is None

    def active(self, values: Mapping[str, Any]) -> bool:
        """Whether the knob is searched, given the values of the knobs before it."""
        return self.condition is None or bool(self.condition(values))


def _graph_capture_allowed(values: Mapping[str, Any]) -> bool:
    return values.get("compile", "none") not in GRAPH_CAPTURING_COMPILE_MODES


def _overlap_can_act(values: Mapping[str, Any]) -> bool:
    # Config.effective_overlap_ratio's rule, on knob values: 0 in effect under graph capture
    return not graph_capture_on(values.get("graph_capture"))


_CUDA = frozenset({"cuda"})

# the phases a knob's time moves in (Knob.phases)
_DATA = frozenset({"data_wait"})
_COMPUTE = frozenset({"forward", "backward"})
_SHAPES = frozenset({"data_wait", "forward", "backward"})  # what a batch's shape changes: decode, then compute
_STEP = frozenset({"forward", "backward", "optimizer", "other"})  # the whole step on the device, launches included
_LAUNCH = frozenset({"forward", "backward", "other"})  # the model's kernels and the launches between them
_SYNC = frozenset({"grad_sync"})

# the kinds of device time a knob can take away (Knob.kernels)
_IDLE = frozenset({"idle"})  # launches and host work the device waits on
_ALLOC = frozenset({"alloc"})  # the device allocator's calls the device waits on
_FUSED_OPS = frozenset({"norm", "activation", "rope", "loss"})  # the ops the project's Triton kernels replace
_OP_KERNELS = {"rmsnorm": frozenset({"norm"}), "swiglu": frozenset({"activation"}), "rope": frozenset({"rope"}),
               "loss": frozenset({"loss"}), "fp8_linear": frozenset({"cast"})}  # (kernels/registry.py's ops)


def _allocator_flag(option: str, environ: Mapping[str, str]) -> bool:
    """An allocator flag left unset: the environment's setting, else torch's default (off)."""
    return (env_option(option, environ) or "false").lower() == "true"


def _op_backend_free(values: Mapping[str, Any]) -> bool:
    return not values.get("triton_fusion")  # triton_fusion: true overrides the per-op choice


def _liger_can_act(values: Mapping[str, Any]) -> bool:
    """No op Liger patches runs on the project's kernels (run.prepare's rule, workbench/train/hf_prepare.py): its
    fused loss always takes the loss op's place, so the project's loss (``loss_backend: triton``, or the FP8 head)
    turns it off; eagerly (compile: none) it patches RMSNorm, SwiGLU and RoPE too, under compile nothing else, so
    there the project's Triton RMSNorm and SwiGLU go with it."""
    if values.get("triton_fusion") or values.get("fp8_head"):  # the loss on Triton, or on the FP8 head's op
        return False
    patched = ("rmsnorm", "swiglu", "rope", "loss") if values.get("compile", "none") == "none" else ("loss",)
    return all(values.get(f"{op}_backend", "torch") == "torch" for op in patched)


def _op_uses_triton(op: str, values: Mapping[str, Any]) -> bool:
    if op == "loss" and values.get("fp8_head"):  # the FP8 head is the loss op whatever the backend says
        return False
    return bool(values.get("triton_fusion")) or values.get(f"{op}_backend") == "triton"


def _kernel_knob(kernel: str, op: str, param: str, doc: str) -> Knob:
    """A launch parameter of a Triton kernel (kernels/registry.py holds its candidates and constraints):
    searched only on CUDA and only while the op it serves runs on Triton."""
    return Knob(name=f"{kernel}_{param}", key=f"loongforge.compute_domain.kernels.{kernel}.{param}", kind="int",
                requires=_CUDA, phases=_COMPUTE, condition=functools.partial(_op_uses_triton, op),
                doc=f"{kernel} kernel: {doc}", kernels=_OP_KERNELS.get(op, frozenset({"elementwise"})))


_FP8_CUDA = frozenset({"fp8", "cuda"})


def _triton_casts(values: Mapping[str, Any]) -> bool:
    """The project's FP8 casts run: under tensorwise, for the Linears or the head (ComputeDomainConfig's rule)."""
    return values.get("fp8") == "tensorwise" and (values.get("fp8_cast") == "triton" or bool(values.get("fp8_head")))


def _fp8_kernel_knob(kernel: str, param: str, doc: str) -> Knob:
    """A launch parameter of an FP8 cast kernel: searched only while the Triton casts run."""
    return Knob(name=f"{kernel}_{param}", key=f"loongforge.compute_domain.kernels.{kernel}.{param}", kind="int",
                requires=_FP8_CUDA, phases=_COMPUTE, condition=_triton_casts, doc=f"{kernel} kernel: {doc}",
                kernels=_OP_KERNELS["fp8_linear"])


def _launch_knobs() -> tuple[Knob, ...]:
    """A knob for every launch parameter of every kernel, from the kernels' registry (``LAUNCH_SPACES``), in its
    order; the FP8 casts' (op ``fp8_linear``) are searched while those casts run, the others while their op runs
    on Triton."""
    return tuple(_fp8_kernel_knob(space.kernel, p.name, p.doc) if space.op == "fp8_linear"
                 else _kernel_knob(space.kernel, space.op, p.name, p.doc)
                 for space in LAUNCH_SPACES.values() for p in space.params)


# Declaration order is sampling order: a conditional knob comes after the knobs its condition reads.
KNOBS: tuple[Knob, ...] = (
    # IO domain and batching
    Knob(name="bucket_width", key="data.bucket_width", kind="int",
         doc="sequence bucket width: padding waste vs number of distinct shapes", phases=_SHAPES,
         kernels=frozenset({"padding"})),
    Knob(name="io_uring_entries", key="loongforge.io_domain.io_uring_entries", kind="int",
         requires=frozenset({"io_uring"}), doc="io_uring ring depth: shard reads in flight", phases=_DATA),
    Knob(name="num_workers", key="data.num_workers", kind="int", doc="decode workers: CPU decode parallelism",
         phases=_DATA),
    Knob(name="micro_batch_size", key="data.micro_batch_size", kind="int",
         doc="samples per forward/backward (the global batch stays fixed: accumulation absorbs it)", phases=_STEP,
         kernels=_IDLE),
    Knob(name="packing", key="data.packing", kind="categorical",
         doc="records padded to their bucket (bucket) or laid end to end into full rows (fill, no padding)",
         phases=_SHAPES, kernels=frozenset({"padding"})),
    Knob(name="activation_checkpointing", key="training.activation_checkpointing", kind="categorical",
         doc="decoder blocks recomputed in backward (none, selective, full): memory for bigger micro-batches",
         phases=_COMPUTE, kernels=frozenset()),
    Knob(name="activation_checkpointing_every", key="training.activation_checkpointing_every", kind="int",
         condition=lambda v: v.get("activation_checkpointing") == "selective",
         doc="selective checkpointing: every N-th block is recomputed", phases=_COMPUTE, kernels=frozenset()),
    # compute domain
    Knob(name="compile", key="loongforge.compute_domain.compile", kind="categorical",
         doc="torch.compile mode of the model", phases=_LAUNCH,
         kernels=_IDLE | _FUSED_OPS | {"cast", "copy", "elementwise"}),
    Knob(name="compile_scope", key="loongforge.compute_domain.compile_scope", kind="categorical",
         condition=lambda v: v.get("compile", "none") != "none", inactive="layer",
         doc="what one compiled graph covers: the whole loss, or each decoder block (compile time, overlap)",
         phases=_LAUNCH, kernels=_IDLE),
    Knob(name="compile_shapes", key="loongforge.compute_domain.compile_shapes", kind="categorical",
         condition=lambda v: v.get("compile", "none") != "none", inactive="dynamic",
         doc="one compiled graph with a symbolic length for every bucket, or one specialised graph per bucket",
         phases=_LAUNCH, kernels=_IDLE),
    Knob(name="fp8", key="loongforge.compute_domain.fp8", kind="categorical", requires=frozenset({"fp8"}),
         numerics=True, doc="FP8 training of the block Linears (fp8_modules) through torchao.float8 (recipe), or none",
         phases=_COMPUTE, kernels=frozenset({"matmul"}), kernel_bound=0.5),
    Knob(name="fp8_cast", key="loongforge.compute_domain.fp8_cast", kind="categorical", requires=_FP8_CUDA,
         condition=lambda v: v.get("fp8") == "tensorwise", inactive="torchao", numerics=True,
         doc="who casts to FP8 under the tensorwise recipe: torchao, or the project's Triton kernels (one read "
             "for the amax, one pass writing both layouts, a shared input cast once)", phases=_COMPUTE,
         kernels=frozenset({"cast"})),
    Knob(name="fp8_head", key="loongforge.compute_domain.fp8_head", kind="bool", requires=_FP8_CUDA,
         condition=lambda v: v.get("fp8") == "tensorwise", inactive=False, numerics=True,
         doc="the LM head's matmuls in FP8 too, on the project's casts (vocabulary padded to a multiple of 64, the "
             "loss in fp32): FP8 matmul speed against materialised logits", phases=_COMPUTE,
         kernels=frozenset({"loss"})),
    Knob(name="graph_capture", key="loongforge.compute_domain.graph_capture", kind="categorical", requires=_CUDA,
         condition=_graph_capture_allowed, inactive="none",
         doc="CUDA graphs of the step by segment: none, fwd_bwd, fwd_bwd+optimizer (none when the compile mode "
             "captures graphs itself)", phases=_STEP, kernels=_IDLE | _ALLOC),  # (a graph's pool: no allocator calls)
    # Triton kernels: which ops use them, then each kernel's launch parameters
    Knob(name="triton_fusion", key="loongforge.compute_domain.triton_fusion", kind="bool", requires=_CUDA,
         doc="every fused op (RMSNorm, SwiGLU, RoPE, loss) through its Triton kernel", phases=_COMPUTE,
         kernels=_FUSED_OPS),
    Knob(name="rmsnorm_backend", key="loongforge.compute_domain.ops.rmsnorm", kind="categorical", requires=_CUDA,
         condition=_op_backend_free, doc="RMSNorm backend (torch or triton) when triton_fusion is off",
         phases=_COMPUTE, kernels=_OP_KERNELS["rmsnorm"]),
    Knob(name="swiglu_backend", key="loongforge.compute_domain.ops.swiglu", kind="categorical", requires=_CUDA,
         condition=_op_backend_free, doc="SwiGLU backend (torch or triton) when triton_fusion is off", phases=_COMPUTE,
         kernels=_OP_KERNELS["swiglu"]),
    Knob(name="rope_backend", key="loongforge.compute_domain.ops.rope", kind="categorical", requires=_CUDA,
         condition=_op_backend_free, doc="RoPE backend (torch or triton) when triton_fusion is off", phases=_COMPUTE,
         kernels=_OP_KERNELS["rope"]),
    Knob(name="loss_backend", key="loongforge.compute_domain.ops.loss", kind="categorical", requires=_CUDA,
         condition=lambda v: _op_backend_free(v) and not v.get("fp8_head"),
         doc="LM head + cross-entropy backend (torch or triton) when triton_fusion is off", phases=_COMPUTE,
         kernels=_OP_KERNELS["loss"]),
    Knob(name="fused_residual_norm", key="loongforge.compute_domain.fused_residual_norm", kind="bool",
         requires=_CUDA, condition=functools.partial(_op_uses_triton, "rmsnorm"), inactive=False,
         doc="every residual add inside the RMSNorm after it (one kernel; searched where RMSNorm runs on Triton)",
         phases=_COMPUTE, kernels=frozenset({"norm", "elementwise"})),
    # a Hugging Face model's own switches (run.prepare: workbench/train/hf_prepare.py)
    Knob(name="hf_attention", key="hf.attention", kind="categorical",
         doc="attention implementation of a Hugging Face model (sdpa, eager, flash_attention_2)", phases=_COMPUTE,
         kernels=frozenset({"attention"})),
    Knob(name="liger", key="hf.liger", kind="bool", requires=frozenset({"cuda", "liger"}),
         condition=_liger_can_act, inactive=False,
         doc="Liger-Kernel's RMSNorm, SwiGLU, RoPE and fused linear cross-entropy in a Hugging Face model (under "
             "compile its fused loss alone)",
         phases=_COMPUTE, kernels=_FUSED_OPS),
    Knob(name="hf_pad_vocab", key="hf.pad_vocab_multiple", kind="categorical",
         doc="pad a Hugging Face model's vocabulary to a multiple of this (0: as it is), for aligned LM-head GEMMs",
         phases=_COMPUTE, kernels=frozenset({"matmul", "loss"})),
    Knob(name="hf_packed_check", key="hf.packed_check", kind="bool",
         doc="a Hugging Face model's packed-sequence check of its own position ids (a host sync every forward)",
         phases=_COMPUTE, kernels=_IDLE),
    *_launch_knobs(),
    # communication overlap
    Knob(name="bucket_size_mb", key="loongforge.overlap.bucket_size_mb", kind="float",
         requires=frozenset({"multi_gpu"}), doc="gradient all-reduce bucket size (MiB)", phases=_SYNC),
    Knob(name="overlap_ratio", key="loongforge.overlap.overlap_ratio", kind="float",
         requires=frozenset({"multi_gpu"}), condition=_overlap_can_act, inactive=0.0,
         doc="share of gradient buckets all-reduced during backward (0 under CUDA graphs, which it cannot act in)",
         phases=_SYNC),
    # memory domain
    Knob(name="pinned_block_kb", key="loongforge.memory_domain.pinned_block_kb", kind="int", requires=_CUDA,
         doc="pinned host staging block (KiB)", phases=frozenset({"h2d"})),
    Knob(name="expandable_segments", key="loongforge.memory_domain.allocator.expandable_segments", kind="bool",
         requires=_CUDA, doc="allocator: grow segments in place", phases=_STEP, kernels=_ALLOC,
         unset=functools.partial(_allocator_flag, "expandable_segments")),
    Knob(name="roundup_power2_divisions", key="loongforge.memory_domain.allocator.roundup_power2_divisions",
         kind="int", requires=_CUDA, doc="allocator: rounding steps per power-of-two size range", phases=_STEP,
         kernels=_ALLOC),
    Knob(name="max_split_size_mb", key="loongforge.memory_domain.allocator.max_split_size_mb", kind="int",
         requires=_CUDA, doc="allocator: blocks larger than this are never split", phases=_STEP, kernels=_ALLOC),
    Knob(name="garbage_collection_threshold", phases=_STEP, kernels=_ALLOC,
         key="loongforge.memory_domain.allocator.garbage_collection_threshold", kind="float", requires=_CUDA,
         doc="allocator: reclaim cached blocks above this share of allowed memory"),
)
"""Every knob the tuner knows, in sampling order."""


def _check_registry(knobs: Iterable[Knob]) -> None:
    names: set[str] = set()
    keys: set[str] = set()
    for k in knobs:
        if k.name in names or k.key in keys:
            raise ValueError(f"knob {k.name!r} ({k.key}) is declared twice")
        names.add(k.name)
        keys.add(k.key)


_check_registry(KNOBS)
_BY_NAME = {k.name: k for k in KNOBS}


def knob_names() -> tuple[str, ...]:
    """Names of every registered knob, in sampling order."""
    return tuple(_BY_NAME)


def numerics_knobs() -> tuple[str, ...]:
    """Names of the knobs that change numerics (``Knob.numerics``), in sampling order."""
    return tuple(k.name for k in KNOBS if k.numerics)


def get_knob(name: str) -> Knob:
    """The knob called ``name``; KeyError lists the known names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown knob {name!r}; known knobs: {', '.join(_BY_NAME)}") from None


USER_PREFIX = "user."
"""A study's own knobs: ``user.<name>`` in its space is written to the config's ``user`` section, for a loop of one's
own (a study's ``trainer.command``) to read; its kind comes from the range the study gives it."""


def is_user_knob(name: str) -> bool:
    return name.startswith(USER_PREFIX)


def user_knob(name: str, kind: KnobKind) -> Knob:
    """The knob ``user.<x>`` of ``kind``: config key ``user.<x>``, no capability needed."""
    rest = name[len(USER_PREFIX):]
    if not rest.isidentifier():
        raise ValueError(f"knob {name!r}: a user knob is 'user.' followed by an identifier")
    return Knob(name=name, key=name, kind=kind, doc="a knob of the study's own training loop (config user section)")


# --------------------------------------------------------------------------- hardware


def _probe_io_uring() -> bool:
    """Whether an io_uring ring can be set up here (containers often forbid it)."""
    try:
        reader = importlib.import_module("loaders.reader")
    except ImportError:
        reader = None
    probe = getattr(reader, "probe_io_uring", None)
    if callable(probe):
        try:
            result = probe()  # (ok, reason) in the loader; a plain bool is accepted too
        except Exception:  # noqa: BLE001 - a failing probe means no io_uring
            return False
        return bool(result[0]) if isinstance(result, tuple) else bool(result)
    try:
        import liburing  # type: ignore[import-not-found]
    except ImportError:
        return False
    try:
        ring = liburing.Ring()
        if liburing.io_uring_queue_init(8, ring, 0) != 0:
            return False
        liburing.io_uring_queue_exit(ring)
        return True
    except Exception:  # noqa: BLE001 - ENOSYS/EPERM under seccomp, or an older binding
        return False


def detect_capabilities(gpus: int = 1) -> frozenset[str]:
    """Capabilities of this host for a study of ``gpus`` processes (see the module docstring)."""
    caps: set[str] = set()
    try:
        import torch

        if torch.cuda.is_available():  # note: does not create a CUDA context
            caps.add("cuda")
            if gpus > 1 and torch.cuda.device_count() >= gpus:
                caps.add("multi_gpu")
    except ImportError:
        pass
    if _probe_io_uring():
        caps.add("io_uring")
    if "cuda" in caps and fp8.fp8_unsupported_reason("cuda") is None:
        caps.add("fp8")
    if "cuda" in caps and importlib.util.find_spec("liger_kernel") is not None:
        caps.add("liger")
    return frozenset(caps)


@dataclass(frozen=True)
class DroppedKnob:
    """A knob left out of the search space, and why."""

    knob: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"knob": self.knob, "reason": self.reason}


_NEEDS = {"fp8": "an FP8 GPU (compute capability 8.9+) and torchao", "liger": "Liger-Kernel (pip install liger-kernel)"}


def drop_unsupported(names: Iterable[str], capabilities: Iterable[str]) -> tuple[list[str], list[DroppedKnob]]:
    """Split knob ``names`` into those that can act with ``capabilities`` and those dropped (with the reason)."""
    caps = frozenset(capabilities)
    kept: list[str] = []
    dropped: list[DroppedKnob] = []
    for name in names:
        missing = [] if is_user_knob(name) else sorted(get_knob(name).requires - caps)
        if missing:
            dropped.append(DroppedKnob(name, "needs " + " and ".join(_NEEDS.get(m, m.replace("_", "-"))
                                                                     for m in missing)))
        else:
            kept.append(name)
    return kept, dropped


def format_dropped(dropped: Iterable[DroppedKnob]) -> str:
    """``dropped for this hardware: graph_capture (needs cuda), ...``; "" when none was dropped."""
    items = [f"{d.knob} ({d.reason})" for d in dropped]
    return "dropped for this hardware: " + ", ".join(items) if items else ""
