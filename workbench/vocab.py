"""The words every layer shares, defined once: step phases, trial statuses and failure kinds, exit codes and
metric keys. A leaf module: no import of the project's packages, no torch."""

from __future__ import annotations

__all__ = ["ALLOCATOR_REUSE_RATIO", "COMM_EXPOSED_S", "COMM_OVERLAP_PCT", "COMM_TOTAL_S", "COMPILE_S",
           "DEVICE_TOTAL_GIB", "EXIT_CODES", "FAILED_STATUSES", "FAILURE_KINDS", "KERNEL_KINDS", "KERNEL_SHARE",
           "LOSS_MEAN", "LOSS_STEPS", "MAX_ALLOCATED_GIB", "MAX_RESERVED_GIB", "MAX_RSS_GIB", "PADDED_TOKENS_PER_S",
           "PADDING_RATIO", "PHASES", "PREDICTED_PEAK_GIB", "REAL_TOKENS_PER_S", "STATUSES", "STEP_S", "TUNE_EXIT",
           "VOCAB_ALIGN", "padded_vocab"]

PHASES = ("data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer", "other")
"""The phases of a training step, in order; they add up to the step time."""

KERNEL_KINDS = ("matmul", "attention", "communication", "optimizer", "loss", "cast", "norm", "activation", "rope",
                "copy", "elementwise", "other", "alloc", "idle", "padding")
"""What a profiled step's device time is spent on (``workbench.train.profiling.kernel_kind`` sorts each kernel by its
name): the GEMMs, attention, the collectives, the optimizer, the loss (softmax, cross-entropy), the FP8 casts, the
norms, the activations, the rotary embedding, copies and sets, other element-wise and reduction kernels, the rest,
the time the device ran nothing while the host was in the allocator's calls (``alloc``: ``cudaMalloc``, ``cudaFree``
and the driver's memory mapping), the rest of the time it ran nothing (``idle``); and the share of the busy time
spent on padding tokens (``PADDING_RATIO``). Each knob names the kinds it can act on (``workbench.tune.knobs.Knob.kernels``)."""

KERNEL_SHARE = "profile/kernel_share/"
"""Prefix of a run summary's share of the profiled steps' span per kernel kind (``KERNEL_KINDS`` but padding)."""

STATUSES = ("ok", "pruned", "oom", "timeout", "crash", "nan_loss", "numerics", "compile_error", "invalid_config",
            "no_report", "interrupted", "disk")
"""Every status a trial can end with (user attr ``status``)."""

FAILURE_KINDS = ("oom", "timeout", "crash", "nan_loss", "numerics", "compile_error", "invalid_config", "no_report")
"""Statuses told to Optuna as infeasible. ``no_report``: the process never reported a measured window (it did not
touch its heartbeat within the heartbeat timeout of its launch, or it exited 0 without a window)."""

FAILED_STATUSES = (*FAILURE_KINDS, "interrupted", "disk")
"""Statuses of a run that did not finish: the failure kinds, ``interrupted`` (FAIL, run again on resume) and
``disk`` (a file could not be written: the machine's fault, not the config's; FAIL, run again on resume)."""

EXIT_CODES = {"ok": 0, "crash": 1, "invalid_config": 2, "oom": 3, "nan_loss": 4, "compile_error": 5,
              "disk": 6, "interrupted": 130}
"""Exit code of ``python -m workbench.train`` per outcome; the trial runner maps them back to statuses."""

TUNE_EXIT = {"ok": 0, "error": 1, "usage": 2, "interrupted": 130}
"""Exit codes of ``python -m workbench.tune``."""

REAL_TOKENS_PER_S = "throughput/real_tokens_per_s_per_gpu"
"""The objective's metric key: real (non-padding) tokens per second per GPU."""

# metric keys read in more than one module (summary.json, metrics.jsonl, the report)
LOSS_MEAN = "loss/mean"
"""A window's mean training loss over its steps."""

LOSS_STEPS = "loss/steps"
"""A window's training loss of each of its steps, in order (a list; the numerics guard's median reads them)."""

MAX_RESERVED_GIB = "memory/max_reserved_gib"
"""Peak device memory the caching allocator reserved (GiB)."""

MAX_ALLOCATED_GIB = "memory/max_allocated_gib"
"""Peak device memory allocated to tensors (GiB)."""

MAX_RSS_GIB = "memory/max_rss_gib"
"""Peak resident memory of the process on the host (GiB): a CPU run's peak."""

DEVICE_TOTAL_GIB = "memory/device_total_gib"
"""The device's total memory (GiB)."""

PREDICTED_PEAK_GIB = "memory/predicted_peak_gib"
"""The memory model's predicted peak of the config (GiB)."""

ALLOCATOR_REUSE_RATIO = "memory/allocator_reuse_ratio"
"""Share of allocations the allocator served from its cache."""

STEP_S = "time/step_s"
"""Mean wall time of a measured step (s)."""

COMPILE_S = "time/compile_s"
"""Time spent compiling before the first step (s)."""

PADDING_RATIO = "data/padding_ratio"
"""Padding tokens over all tokens of the measured batches."""

COMM_TOTAL_S = "comm/total_s"
"""Gradient all-reduce time a step (s)."""

COMM_EXPOSED_S = "comm/exposed_s"
"""All-reduce time a step that the backward does not hide (s)."""

COMM_OVERLAP_PCT = "comm/overlap_pct"
"""Share of the all-reduce time hidden behind the backward (%)."""

PADDED_TOKENS_PER_S = "throughput/padded_tokens_per_s_per_gpu"
"""Tokens per second per GPU, padding included."""

VOCAB_ALIGN = 64
"""The LM head's rows are padded to a multiple of this many (the torch and the Triton loss both)."""


def padded_vocab(V: int) -> int:
    """``V`` rounded up to a multiple of :data:`VOCAB_ALIGN`."""
    return -(-V // VOCAB_ALIGN) * VOCAB_ALIGN
