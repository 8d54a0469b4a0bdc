"""Staging of vla batches: ``VLALayout``, where each tensor of a [B] batch sits in a staging block, and
``VLABatch``, the tensors handed to the consumer with the block's lifetime rule (the token ``Batch``'s).

Blocks come from the same ``StagingRing`` as token batches (pinned on CUDA, reused round-robin, refilled only
after the copy's event or the consumer's release). Described in docs/loaders.md ("VLA records"); import these
names from ``loaders.vla``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._staging import PAGE, HostToken

# Every tensor of a batch starts on a 64-byte boundary of the block: aligned for any dtype, and a device view of
# a float32 / int32 region needs an offset that is a multiple of 4.
_ALIGN = 64


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class VLALayout:
    """Byte offsets of a [B] vla batch in a staging block: actions float32 [B, K, A], keys int32 [B], input_ids
    int32 [B, T], position_ids int32 [B, T], attention_mask uint8 [B, T], images uint8 [B, C, H, W], in that
    order, each 64-byte aligned."""

    B: int
    T: int
    image_shape: tuple[int, int, int]
    action_shape: tuple[int, int]

    @property
    def regions(self) -> dict[str, tuple[int, int, torch.dtype, tuple[int, ...]]]:
        """name -> (byte offset, byte length, dtype, shape)."""
        B, T = self.B, self.T
        parts = [("actions", torch.float32, 4, (B, *self.action_shape)), ("keys", torch.int32, 4, (B,)),
                 ("input_ids", torch.int32, 4, (B, T)),
                 ("position_ids", torch.int32, 4, (B, T)), ("attention_mask", torch.uint8, 1, (B, T)),
                 ("images", torch.uint8, 1, (B, *self.image_shape))]
        out, off = {}, 0
        for name, dt, size, shape in parts:
            n = size * math.prod(shape)
            out[name] = (off, n, dt, shape)
            off = _up(off + n)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the block the batch uses (up to the end of its last region)."""
        off, n, _, _ = self.regions["images"]
        return off + n

    def block_bytes(self) -> int:
        """The default staging block: the batch's bytes rounded up to whole 4 KiB pages."""
        return -(-self.nbytes // PAGE) * PAGE

    def views(self, buf: Any) -> dict[str, Any]:
        """Views of ``buf`` (a uint8 torch tensor: a staging block or its device copy) per region, shaped;
        numpy views when ``buf`` is a numpy array."""
        out = {}
        for name, (off, n, dt, shape) in self.regions.items():
            part = buf[off:off + n]
            if isinstance(part, np.ndarray):
                out[name] = part.view(_NP[dt]).reshape(shape)
            else:
                out[name] = part.view(dt).view(shape)
        return out


_NP = {torch.float32: np.float32, torch.int32: np.int32, torch.uint8: np.uint8}


@dataclass(eq=False)
class VLABatch:
    """One micro-batch of ``B`` vla samples, every tensor of a fixed shape (CUDA graphs can replay it):

    ``images`` uint8 [B, C, H, W]; ``input_ids`` int32 [B, T], each instruction left-aligned and padded with 0
    to the configured text length ``T``; ``position_ids`` int32 [B, T] (0, 1, ... on the text, 0 on padding);
    ``attention_mask`` uint8 [B, T] (1 on the text, 0 on padding); ``actions`` float32 [B, K, A]; ``keys`` int32
    [B], each sample's draw key (``sample_keys``: a function of the pipeline's seed, the epoch and the record).
    ``text_lengths`` (host, int64 [B]) are the instructions' lengths; ``real_tokens`` their sum, ``padded_tokens``
    B x T. Lifetime as the token ``Batch``'s: CUDA tensors may be kept (``ready()`` makes a stream wait for the
    copy); CPU tensors view the staging block and are valid until the next ``next()`` or ``release()``.
    """

    images: torch.Tensor          # uint8 [B, C, H, W]
    input_ids: torch.Tensor       # int32 [B, T]
    position_ids: torch.Tensor    # int32 [B, T]
    attention_mask: torch.Tensor  # uint8 [B, T]
    actions: torch.Tensor         # float32 [B, K, A]
    keys: torch.Tensor            # int32 [B]
    text_lengths: np.ndarray      # int64 [B]
    length: int                   # T
    real_tokens: int
    padded_tokens: int
    epoch: int
    index: int                    # batch index within the epoch
    record_ids: np.ndarray        # global record ids, row order
    bucket: int = 0               # one bucket: the text length
    event: Any = field(default=None, repr=False)    # CUDA: the h2d copy's event
    _token: HostToken | None = field(default=None, repr=False)

    @property
    def samples(self) -> int:
        """``B``, the samples of the batch."""
        return len(self.record_ids)

    @property
    def seq_len(self) -> int:
        """``T``, the padded text length (an alias of ``length``)."""
        return self.length

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.images, self.input_ids, self.position_ids, self.attention_mask, self.actions, self.keys

    def ready(self, stream: Any = None) -> None:
        """Make ``stream`` (default: the current CUDA stream) wait for this batch's copy; no-op on CPU."""
        if self.event is None:
            return
        stream = stream if stream is not None else torch.cuda.current_stream(self.images.device)
        stream.wait_event(self.event)  # no host sync: the stream waits, the CPU does not
        for t in self.tensors():
            t.record_stream(stream)  # the caching allocator must not reuse the memory before `stream` is done

    def release(self) -> None:
        """Give the staging block back (CPU batches view it); idempotent. The tensors must not be used after."""
        if self._token is not None:
            self._token.complete()
            self._token = None
