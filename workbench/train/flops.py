"""FLOP accounting and model FLOPs utilisation (MFU).

Formula (the PaLM paper's appendix B)::

    flops_per_token = 6 * N + 12 * L * D * T

- ``N``: the parameters that do a matmul per token: every parameter except the
  input token-embedding table (a lookup, no FLOPs), plus the LM head's V x D
  matrix, counted whether or not it is tied to the embedding (the matmul runs
  either way). RMSNorm scales are included; they are negligible.
- ``6``: 2 FLOPs per multiply-add, forward once and backward twice.
- ``12 * L * D * T``: attention scores and weighted sum (QK^T and AV, 2 * 2 *
  T * D per token per layer, times 3 for forward + backward) over the full
  T x T square, not halved for the causal mask, as in PaLM and nanoGPT.

MFU = tokens/s per GPU x flops_per_token / peak, with the peak taken from
:data:`PEAK_TFLOPS`. Count only real (non-padding) tokens in tokens/s: FLOPs
spent on padding are waste, not model FLOPs.
"""

from __future__ import annotations

import torch

from workbench.train.model import ModelArgs, num_params

__all__ = ["PEAK_TFLOPS", "flops_per_token", "mfu", "peak_tflops"]


PEAK_TFLOPS: dict[str, float] = {
    "H100": 989.0,  # H100 SXM5
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.0,  # H200 SXM; GH200 matches here too
    "H800": 989.0,
    "H20": 148.0,
    "A100": 312.0,  # SXM and PCIe alike
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "B200": 2250.0,
    "MI300X": 1307.0,  # AMD Instinct MI300X
}
"""Dense (no 2:4 sparsity) BF16 tensor-core peak per GPU in TFLOP/s, from the
vendors' datasheets (NVIDIA H100/H200/A100/L40S/L4/B200, AMD MI300X; sparse
figures halved). Keys match as case-insensitive substrings of the device name
(``torch.cuda.get_device_name()``), the longest key first, so
"NVIDIA H100 PCIe" takes "H100 PCIe" and "NVIDIA H100 80GB HBM3" takes "H100"."""


def flops_per_token(args: ModelArgs, seq_len: int) -> int:
    """Training FLOPs per token: ``6 * N + 12 * L * D * seq_len`` (see the module docstring).

    ``N`` = parameters without the input embedding, plus the LM head's V x D
    (included even when tied, since its matmul still runs).
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0, got {seq_len!r}")
    lm_head = args.vocab_size * args.hidden_size
    # num_params(exclude_embedding=True) already keeps an untied head, drops a tied one.
    n = num_params(args, exclude_embedding=True) + (lm_head if args.tie_word_embeddings else 0)
    return 6 * n + 12 * args.num_hidden_layers * args.hidden_size * seq_len


def peak_tflops(gpu_name: str | None, override: float | None = None) -> float | None:
    """Dense BF16 peak TFLOP/s for a device name; ``override`` wins when given.

    Returns ``None`` for an unknown device or a CPU (no meaningful peak), in
    which case MFU is not reported.
    """
    if override is not None:
        if not override > 0:
            raise ValueError(f"peak TFLOP/s override must be > 0, got {override!r}")
        return float(override)
    if not gpu_name:
        return None
    name = gpu_name.lower()
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in name:
            return PEAK_TFLOPS[key]
    return None


def device_peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """:func:`peak_tflops` of ``device`` (its CUDA name; None on a CPU), ``override`` (``hardware.peak_tflops``)
    first: the peak the built-in loop and ``workbench.run()`` both divide by."""
    return peak_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else None, override)


def mfu(tokens_per_s: float, args: ModelArgs, seq_len: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (multiply by 100 for ``mfu_pct``).

    ``tokens_per_s``: real tokens per second per GPU; ``peak``: that GPU's
    TFLOP/s (see :func:`peak_tflops`); ``None`` peak gives ``None``.
    """
    if peak is None:
        return None
    return tokens_per_s * flops_per_token(args, seq_len) / (peak * 1e12)
