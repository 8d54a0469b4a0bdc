"""Staging: ``StagingRing``, the reused host blocks a batch is assembled in, the rows written into them, and
``Batch``, the tensors handed to the consumer with the block's lifetime rule.

The staging-block rule (CUDA: the copy's event; CPU: valid until the next ``next()``) is described in
docs/loaders.md ("The batch pipeline"); import these names from ``loaders.pipeline``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# Seconds between checks of the stop flag while a thread waits: short enough that
# close() returns promptly, long enough to cost nothing.
POLL_S = 0.05
# int32 tokens, int32 position ids, uint8 loss mask: the staging layout of one token.
STAGED_BYTES_PER_TOKEN = 4 + 4 + 1
PAGE = 4096


def bytes_per_sample(max_len: int) -> int:
    """Staging bytes of one record padded to ``max_len``: int32 tokens + int32 positions + uint8 mask."""
    return max_len * STAGED_BYTES_PER_TOKEN


def batch_bytes(B: int, T: int) -> int:
    """Staging bytes of a [B, T] batch."""
    return B * T * STAGED_BYTES_PER_TOKEN


def default_block_bytes(max_len: int, micro_batch_size: int) -> int:
    """The seed's formula: ceil(bytes_per_sample x micro_batch_size / 4096) x 4096."""
    return math.ceil(bytes_per_sample(max_len) * micro_batch_size / PAGE) * PAGE


class HostToken:
    """Completion token of a CPU staging block: completes when the consumer releases the batch."""

    __slots__ = ("_ring", "done")

    def __init__(self, ring: "StagingRing") -> None:
        self._ring = ring
        self.done = False

    def complete(self) -> None:
        with self._ring._cv:
            self.done = True
            self._ring._cv.notify_all()


class StagingRing:
    """``num_blocks`` staging blocks (torch uint8, pinned where asked), reused round-robin.

    ``acquire()`` returns the next block's index once its previous use has
    completed: a host token (``hand_out``; CPU) or a CUDA event (``set_event``).
    ``guard=False`` skips that wait; it exists only so a test can show that the
    staging test fails without the guard.
    """

    def __init__(self, num_blocks: int, block_bytes: int, *, pin: bool = False, guard: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_staging_blocks={num_blocks}: expected >= 1")
        if block_bytes < 1:
            raise ValueError(f"block size {block_bytes} bytes: expected >= 1")
        self.block_bytes = block_bytes
        self.blocks = [torch.empty(block_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(num_blocks)]
        self.pinned = pin
        self.guard = guard
        self._pending: list[Any] = [None] * num_blocks  # None | HostToken | torch.cuda.Event
        self._next = 0
        self._cv = threading.Condition()
        self._closed = False
        self._used = [False] * num_blocks
        self.acquires = 0
        """Blocks handed out by ``acquire()`` (one per batch)."""
        self.fresh = 0
        """Of them, first uses of a block; every other acquire reused a block an earlier batch was built in."""

    def __len__(self) -> int:
        return len(self.blocks)

    def acquire(self) -> int:
        """The next block, after its last use completed; raises ``RuntimeError`` once closed."""
        i = self._next
        with self._cv:
            while True:
                if self._closed:
                    raise RuntimeError("staging ring closed")
                tok = self._pending[i]
                if tok is None or not self.guard or not isinstance(tok, HostToken) or tok.done:
                    break
                self._cv.wait(POLL_S)
        if self.guard and tok is not None and not isinstance(tok, HostToken):
            tok.synchronize()  # CUDA event of the h2d copy out of this block; host wait, this thread only
        self._pending[i] = None
        self._next = (i + 1) % len(self.blocks)
        self.acquires += 1
        if not self._used[i]:
            self._used[i] = True
            self.fresh += 1
        return i

    def hand_out(self, i: int) -> HostToken:
        """Mark block ``i`` as lent to the consumer; it is refilled after the token completes."""
        tok = HostToken(self)
        self._pending[i] = tok
        return tok

    def set_event(self, i: int, event: Any) -> None:
        """Block ``i`` is being copied out; it is refilled after ``event`` completes."""
        self._pending[i] = event

    def views(self, i: int, B: int, T: int, *, zero: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed numpy views of block ``i``: tokens int32 [B, T], positions int32 [B, T], mask uint8 [B, T].

        Zeroing the batch's region once (one memset) is the padding: token 0, position 0, mask 0 (cheaper than
        padding each row's tail; docs/loaders.md, "Staging blocks and batch lifetime").
        ``zero=False`` leaves the block's old bytes: only for a caller that writes every element (fill packing).
        """
        n = B * T
        if n * STAGED_BYTES_PER_TOKEN > self.block_bytes:
            raise ValueError(f"a [{B}, {T}] batch needs {n * STAGED_BYTES_PER_TOKEN} staging bytes, "
                             f"the block has {self.block_bytes}")
        a = self.blocks[i].numpy()
        if zero:
            a[:n * STAGED_BYTES_PER_TOKEN] = 0
        return (a[:4 * n].view(np.int32).reshape(B, T), a[4 * n:8 * n].view(np.int32).reshape(B, T),
                a[8 * n:9 * n].reshape(B, T))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def fill_row(tok_BT: np.ndarray, pos_BT: np.ndarray, mask_BT: np.ndarray, i: int,
             t: np.ndarray, p: np.ndarray, m: np.ndarray) -> int:
    """Copy one record into row ``i`` of zeroed views (``StagingRing.views``: the rest is padding)."""
    L = len(t)
    tok_BT[i, :L] = t  # uint16 -> int32 on the way
    pos_BT[i, :L] = p
    mask_BT[i, :L] = m
    return L


def fill_span(tok_N: np.ndarray, pos_N: np.ndarray, mask_N: np.ndarray, d: int,
              t: np.ndarray, p: np.ndarray, m: np.ndarray) -> int:
    """Copy one record slice to flat offset ``d`` of a batch's [B x T] views (fill packing: rows end to end)."""
    L = len(t)
    tok_N[d:d + L] = t  # uint16 -> int32 on the way
    pos_N[d:d + L] = p
    mask_N[d:d + L] = m
    return L


@dataclass(eq=False)
class Batch:
    """One micro-batch: records of one bucket padded to its length ``T`` (bucket packing), or ``B`` rows of
    ``T = seq_len`` tokens cut from the epoch's record stream (fill packing: no padding, ``bucket`` 0,
    ``record_ids`` the records whose slices it holds, in stream order, not one per row).

    ``padded_tokens`` is ``B x T`` (as in the manifest: tokens after padding);
    ``real_tokens`` of them are real, the rest padding (fill packing: all ``B x T`` real).
    """

    input_ids: torch.Tensor      # int32 [B, T]
    position_ids: torch.Tensor   # int32 [B, T]
    loss_mask: torch.Tensor      # uint8 [B, T]
    length: int                  # T
    real_tokens: int
    padded_tokens: int
    epoch: int
    index: int                   # batch index within the epoch
    bucket: int
    record_ids: np.ndarray       # global record ids, row order (fill: stream order)
    event: Any = field(default=None, repr=False)    # CUDA: the h2d copy's event
    _token: HostToken | None = field(default=None, repr=False)

    @property
    def seq_len(self) -> int:
        """``T``, the bucket length or fill row length (an alias of ``length``)."""
        return self.length

    def ready(self, stream: Any = None) -> None:
        """Make ``stream`` (default: the current CUDA stream) wait for this batch's copy; no-op on CPU."""
        if self.event is None:
            return
        stream = stream if stream is not None else torch.cuda.current_stream(self.input_ids.device)
        stream.wait_event(self.event)  # no host sync: the stream waits, the CPU does not
        for t in (self.input_ids, self.position_ids, self.loss_mask):
            t.record_stream(stream)  # the caching allocator must not reuse the memory before `stream` is done

    def release(self) -> None:
        """Give the staging block back (CPU batches view it); idempotent. The tensors must not be used after."""
        if self._token is not None:
            self._token.complete()
            self._token = None
