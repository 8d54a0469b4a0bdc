"""The batch pipeline: shards -> ordered async reads -> zstd decode -> staging blocks -> device.

Shape legend: ``B`` micro-batch (rows per batch), ``T`` the batch's length: the
bucket length under ``packing="bucket"`` (every record of a batch is padded to
it), ``seq_len`` under ``packing="fill"``; ``N`` = B x T, a batch's tokens flat.

Packing
    ``"bucket"`` (``EpochPlan``): a batch is ``B`` records of one length bucket,
    each padded to the bucket length. ``"fill"`` (``FillPlan``): the epoch's
    records, in ``EpochPlan``'s seeded order at one record per batch, are laid
    end to end as one stream and cut into rows of exactly ``seq_len`` tokens,
    ``B`` rows a batch, no padding: a record that does not fit the rest of a
    row ends it with its head and starts the next row (or batch) with its tail,
    each slice keeping the record's own position ids and loss mask. The stream's
    tail short of a whole batch is dropped for that epoch (``dropped_tokens``).

Threads (all daemons, all joined by ``close()``)::

    reader     plan.frame_order -> reader.read_ordered() -> decode pool (num_workers threads;
               0 = decode on the reader thread) -> frame store {(epoch, frame): [future, refcount]}
    assembler  plan batches in order -> staging block (waits for the block's completion
               token / copy event) -> [B, T] columns (padded rows | packed rows) -> h2d copy
               (CUDA: non_blocking on a side stream, event recorded) -> output queue
    consumer   next(pipeline): the training thread; only waits on the queue

* Reads are issued in the future order the plan already knows; decoded frames
  are kept with a refcount of their record slices still to be assembled (a
  record split across two batches under fill packing counts once per batch)
  and dropped at 0, so every frame is read and decoded once per epoch. The
  reader runs at most ``prefetch_batches`` batches ahead of the assembler (plus
  ``ring_depth`` reads in flight).
* An error in any background thread (a corrupt frame's ``ShardFormatError``, an
  ``OSError`` from a read) is queued in batch order and re-raised by ``next()``;
  the batches before it are delivered first. Nothing is swallowed, nothing hangs.

Staging blocks and batch lifetime
    ``StagingRing`` allocates ``num_staging_blocks`` uint8 blocks once (pinned
    when the device is CUDA) and hands them out round-robin. A block is refilled
    only once the previous use of it has completed:

    * CUDA: the batch's tensors live on the device; the block's token is the
      copy's CUDA event, and the assembler waits on that event (host-side, on
      its own thread) before refilling the block. The batch's tensors may be
      kept as long as you like; ``next()`` makes the current stream wait on the
      copy (``batch.ready()`` does it for another stream).
    * CPU: there is no copy; the batch's tensors *are views of the block*. The
      block's token completes when the batch is released: explicitly with
      ``batch.release()``, or automatically when ``next()`` is called again.
      So **a CPU batch is valid until the following ``next()``** (or its
      ``release()``); ``.clone()`` what you keep longer.

Metrics (``metrics()``)
    ``io/read_latency_ms_p50|p90|p99`` submit to completion (see loaders.reader);
    ``io/read_mb_per_s`` compressed bytes over the span from the first submit to
    the latest completion (a delivered rate: it follows the consumer's pace);
    ``decode/mb_per_s`` and ``decode/tokens_per_s`` decompressed output per busy
    decode-second summed over workers (a per-core capacity); ``data/padding_ratio``
    padding over B x T of the batches consumed (0 under fill packing);
    ``data/consumer_wait_s`` time the training thread spent blocked in ``next()``;
    ``data/batches`` consumed; fill packing only: ``data/dropped_tokens_per_epoch``.

Resuming
    ``state_dict()`` records the position of the next batch to be consumed;
    ``load_state_dict()`` on a pipeline built with the same seed, micro-batch,
    shuffle window, packing (and seq_len or bucket width) and shards continues
    with exactly that batch (the plan is a pure function of (seed, epoch) and
    the index).
"""

from __future__ import annotations

import collections
import math
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from .format import Frame, ShardSet
from .reader import BACKENDS, OrderedReader, make_reader

__all__ = [
    "EpochPlan",
    "FillPlan",
    "PACKINGS",
    "StagingRing",
    "Batch",
    "BatchPipeline",
    "bytes_per_sample",
    "default_block_bytes",
]

_STATE_VERSION = 1
# Seconds between checks of the stop flag while a thread waits: short enough that
# close() returns promptly, long enough to cost nothing.
_POLL_S = 0.05
# int32 tokens, int32 position ids, uint8 loss mask: the staging layout of one token.
_STAGED_BYTES_PER_TOKEN = 4 + 4 + 1
_PAGE = 4096
PACKINGS = ("bucket", "fill")
# Shortest fill row accepted (data.seq_len's lower bound too).
_MIN_SEQ_LEN = 16


def bytes_per_sample(max_len: int) -> int:
    """Staging bytes of one record padded to ``max_len``: int32 tokens + int32 positions + uint8 mask."""
    return max_len * _STAGED_BYTES_PER_TOKEN


def _batch_bytes(B: int, T: int) -> int:
    """Staging bytes of a [B, T] batch."""
    return B * T * _STAGED_BYTES_PER_TOKEN


def default_block_bytes(max_len: int, micro_batch: int) -> int:
    """The seed's formula: ceil(bytes_per_sample x micro_batch / 4096) x 4096."""
    return math.ceil(bytes_per_sample(max_len) * micro_batch / _PAGE) * _PAGE


# --------------------------------------------------------------------------- epoch plan


class EpochPlan:
    """Which records form which batch, in which order, for one (seed, epoch): computed from the index alone.

    Per bucket: permute its frames; walk them in windows of
    ``shuffle_window_frames``; shuffle the records of a window; cut batches of
    ``micro_batch`` records, carrying the leftovers into the next window. The
    last partial batch of each bucket (< ``micro_batch`` records) is dropped for
    this epoch; the permutation differs per epoch, so different records are
    dropped each time. Then the buckets are interleaved by shuffling a list that
    holds each bucket id once per batch it has: a bucket's share of steps is its
    share of records (to within one batch), and its share of tokens is its share
    of tokens, unbiased by length.

    Buckets: by default the shards' own. With ``bucket_width`` W, stored buckets
    are grouped at load time: a stored bucket of length L joins the plan bucket
    of length min(max_len, ceil(L / W) x W), so the bucket-width knob needs no
    re-preprocessing (padding stays under W plus the stored width; a W that is a
    multiple of the stored width buckets exactly as preprocessing at W would).

    Attributes: ``batches`` int64 [n_batches, micro_batch] global record ids;
    ``batch_bucket`` [n_batches] plan bucket of each batch; ``bucket_length``
    [n_plan_buckets] its padded length T; ``bucket_groups`` the stored buckets of
    each plan bucket; ``frame_order`` frames in first-use order;
    ``frame_first_use`` the batch that first needs each of them;
    ``dropped_records`` [n_plan_buckets].
    """

    def __init__(self, shards: ShardSet, *, micro_batch: int, seed: int, epoch: int,
                 shuffle_window_frames: int = 4, bucket_width: int | None = None,
                 rec_frame: np.ndarray | None = None) -> None:
        if micro_batch < 1:
            raise ValueError(f"micro_batch={micro_batch}: expected >= 1")
        if shuffle_window_frames < 1:
            raise ValueError(f"shuffle_window_frames={shuffle_window_frames}: expected >= 1")
        if seed < 0 or epoch < 0:
            raise ValueError(f"seed={seed}, epoch={epoch}: expected >= 0")
        if bucket_width is not None and bucket_width < 1:
            raise ValueError(f"bucket_width={bucket_width}: expected None (the shards' buckets) or >= 1")
        self.bucket_width = bucket_width
        self.micro_batch, self.seed, self.epoch = micro_batch, seed, epoch
        self.shuffle_window_frames = shuffle_window_frames
        first_rec = np.asarray(shards.frame_first_rec, np.int64)
        n_rec = np.asarray(shards.frame_n_rec, np.int64)
        self.rec_frame = rec_frame if rec_frame is not None else record_frames(shards)
        self.bucket_length, self.bucket_groups = plan_buckets(shards, bucket_width)
        n_buckets = len(self.bucket_length)
        streams = np.random.SeedSequence([seed, epoch]).spawn(n_buckets + 1)
        per_bucket: list[np.ndarray] = []
        self.dropped_records = np.zeros(n_buckets, np.int64)
        mb, W = micro_batch, shuffle_window_frames
        for b in range(n_buckets):
            rng = np.random.default_rng(streams[b])
            stored = [np.asarray(shards.frames_of_bucket(int(s)), np.int64) for s in self.bucket_groups[b]]
            frames = rng.permutation(np.concatenate(stored))
            carry = np.zeros(0, np.int64)
            out = []
            for w in range(0, len(frames), W):
                win = frames[w:w + W]
                recs = np.concatenate([np.arange(first_rec[f], first_rec[f] + n_rec[f]) for f in win])
                rng.shuffle(recs)
                pool = np.concatenate([carry, recs])
                k = len(pool) // mb
                out.append(pool[:k * mb].reshape(k, mb))
                carry = pool[k * mb:]
            self.dropped_records[b] = len(carry)
            per_bucket.append(np.concatenate(out) if out else np.zeros((0, mb), np.int64))
        counts = np.array([len(x) for x in per_bucket], np.int64)
        order = np.repeat(np.arange(n_buckets), counts)
        np.random.default_rng(streams[-1]).shuffle(order)
        self.batch_bucket = order
        self.batches = np.empty((len(order), mb), np.int64)
        for b in range(n_buckets):
            self.batches[order == b] = per_bucket[b]
        self.batches_per_bucket = counts
        self.frame_order, self.frame_first_use, _ = self.schedule(0)

    def __len__(self) -> int:
        return len(self.batches)

    def batch(self, k: int) -> tuple[int, np.ndarray]:
        """(bucket index, global record ids) of batch ``k``."""
        return int(self.batch_bucket[k]), self.batches[k]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return (self.batch(k) for k in range(len(self)))

    def schedule(self, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For batches ``start..``: frames in first-use order, the batch that first uses each, and
        how many of its records those batches use (the frame's refcount)."""
        flat = self.rec_frame[self.batches[start:].ravel()]
        frames, first, count = np.unique(flat, return_index=True, return_counts=True)
        o = np.argsort(first, kind="stable")
        return frames[o], first[o] // self.micro_batch + start, count[o]


def plan_buckets(shards: ShardSet, bucket_width: int | None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Plan buckets: their padded lengths (ascending) and the stored buckets each one groups."""
    stored = np.asarray(shards.bucket_length, np.int64)
    if bucket_width is None:
        lengths = stored
    else:
        manifest = getattr(shards, "manifest", None) or {}
        max_len = int(manifest.get("max_len", stored.max()))
        lengths = np.minimum(max_len, -(-stored // bucket_width) * bucket_width)
    T, inverse = np.unique(lengths, return_inverse=True)
    return T, [np.flatnonzero(inverse == g) for g in range(len(T))]


def record_frames(shards: ShardSet) -> np.ndarray:
    """The frame of every record (records are numbered frame by frame)."""
    return np.repeat(np.arange(int(shards.n_frames), dtype=np.int64), np.asarray(shards.frame_n_rec, np.int64))


class FillPlan:
    """Which record slices fill which packed [micro_batch, seq_len] batch, for one (seed, epoch).

    The record order is ``EpochPlan``'s at ``micro_batch=1`` on the shards' own
    buckets: the same seeded frame permutation and window shuffle per bucket,
    the buckets interleaved record by record, no record dropped; so it is a pure
    function of (seed, epoch) and the index. Those records are laid end to end as
    one stream of tokens; batch ``k`` is tokens ``k x N .. (k + 1) x N`` of it
    (``N = micro_batch x seq_len``), row-major: row ``i`` is its tokens
    ``i x seq_len ..``. A record crossing a row or batch edge is split there, each
    piece the slice of the record's tokens, positions and mask. The stream past
    the last whole batch is dropped for this epoch.

    Attributes: ``records`` int64 [n_records] global record ids in stream order;
    ``piece_rec`` / ``piece_off`` / ``piece_len`` / ``piece_dest`` int64 [n_pieces]:
    the record, the slice's start in it, its length and its start in the batch's
    flat N tokens, batch by batch; ``batch_first_piece`` int64 [n_batches + 1];
    ``bucket_length`` [seq_len] (one shape); ``frame_order`` / ``frame_first_use`` as
    ``EpochPlan``'s; ``dropped_tokens`` the stream's tokens in no batch;
    ``dropped_records`` records with no token in a batch. ``bucket_width`` does
    not apply: rows have no buckets.
    """

    def __init__(self, shards: ShardSet, *, micro_batch: int, seq_len: int, seed: int, epoch: int,
                 shuffle_window_frames: int = 4, rec_frame: np.ndarray | None = None,
                 rec_length: np.ndarray | None = None) -> None:
        if micro_batch < 1 or seq_len < 1:
            raise ValueError(f"micro_batch={micro_batch}, seq_len={seq_len}: expected >= 1")
        order = EpochPlan(shards, micro_batch=1, seed=seed, epoch=epoch, shuffle_window_frames=shuffle_window_frames,
                          rec_frame=rec_frame)
        self.micro_batch, self.seq_len, self.seed, self.epoch = micro_batch, seq_len, seed, epoch
        self.shuffle_window_frames = shuffle_window_frames
        self.rec_frame = order.rec_frame
        self.bucket_length = np.array([seq_len], np.int64)
        self.records = order.batches.ravel()
        rec_len = np.asarray(rec_length if rec_length is not None else shards.rec_length, np.int64)
        N = micro_batch * seq_len
        L = rec_len[self.records]
        end = np.cumsum(L)
        start = end - L
        n_batches = int(end[-1]) // N if len(end) else 0
        used = n_batches * N
        self.dropped_tokens = int(end[-1]) - used if len(end) else 0
        keep = start < used                                          # records with a token in some batch
        self.dropped_records = int((~keep).sum())
        start, end, recs = start[keep], end[keep], self.records[keep]
        first_b, last_b = start // N, np.minimum(end - 1, used - 1) // N
        n_pieces = last_b - first_b + 1                              # > 1: the record crosses batch edges
        idx = np.repeat(np.arange(len(recs)), n_pieces)
        pb = first_b[idx] + np.arange(len(idx)) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
        lo = np.maximum(start[idx], pb * N)
        hi = np.minimum(end[idx], (pb + 1) * N)
        self.piece_rec, self.piece_off, self.piece_len = recs[idx], lo - start[idx], hi - lo
        self.piece_dest, self.piece_batch = lo - pb * N, pb
        self.batch_first_piece = np.searchsorted(pb, np.arange(n_batches + 1), side="left").astype(np.int64)
        self.frame_order, self.frame_first_use, _ = self.schedule(0)

    def __len__(self) -> int:
        return len(self.batch_first_piece) - 1

    def pieces(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Batch ``k``'s slices in stream order: (global record id, start in the record, length, start in the
        batch's flat ``micro_batch x seq_len`` tokens); the lengths sum to that many tokens."""
        a, b = int(self.batch_first_piece[k]), int(self.batch_first_piece[k + 1])
        return self.piece_rec[a:b], self.piece_off[a:b], self.piece_len[a:b], self.piece_dest[a:b]

    def batch(self, k: int) -> tuple[int, np.ndarray]:
        """(bucket index, always 0; global record ids of batch ``k``'s slices, stream order)."""
        return 0, self.pieces(k)[0]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return (self.batch(k) for k in range(len(self)))

    def schedule(self, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For batches ``start..``: frames in first-use order, the batch that first uses each, and how many
        record slices those batches take from it (the frame's refcount)."""
        a = int(self.batch_first_piece[start])
        flat = self.rec_frame[self.piece_rec[a:]]
        frames, first, count = np.unique(flat, return_index=True, return_counts=True)
        o = np.argsort(first, kind="stable")
        return frames[o], self.piece_batch[a:][first[o]], count[o]


# --------------------------------------------------------------------------- staging ring


class _HostToken:
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
        self._pending: list[Any] = [None] * num_blocks  # None | _HostToken | torch.cuda.Event
        self._next = 0
        self._cv = threading.Condition()
        self._closed = False

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
                if tok is None or not self.guard or not isinstance(tok, _HostToken) or tok.done:
                    break
                self._cv.wait(_POLL_S)
        if self.guard and tok is not None and not isinstance(tok, _HostToken):
            tok.synchronize()  # CUDA event of the h2d copy out of this block; host wait, this thread only
        self._pending[i] = None
        self._next = (i + 1) % len(self.blocks)
        return i

    def hand_out(self, i: int) -> _HostToken:
        """Mark block ``i`` as lent to the consumer; it is refilled after the token completes."""
        tok = _HostToken(self)
        self._pending[i] = tok
        return tok

    def set_event(self, i: int, event: Any) -> None:
        """Block ``i`` is being copied out; it is refilled after ``event`` completes."""
        self._pending[i] = event

    def views(self, i: int, B: int, T: int, *, zero: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed numpy views of block ``i``: tokens int32 [B, T], positions int32 [B, T], mask uint8 [B, T].

        Zeroing the batch's region once (one memset) is the padding: token 0, position 0, mask 0; it
        measured ~20% cheaper than padding each row's tail with three more slice assignments.
        ``zero=False`` leaves the block's old bytes: only for a caller that writes every element (fill packing).
        """
        n = B * T
        if n * _STAGED_BYTES_PER_TOKEN > self.block_bytes:
            raise ValueError(f"a [{B}, {T}] batch needs {n * _STAGED_BYTES_PER_TOKEN} staging bytes, "
                             f"the block has {self.block_bytes}")
        a = self.blocks[i].numpy()
        if zero:
            a[:n * _STAGED_BYTES_PER_TOKEN] = 0
        return (a[:4 * n].view(np.int32).reshape(B, T), a[4 * n:8 * n].view(np.int32).reshape(B, T),
                a[8 * n:9 * n].reshape(B, T))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def _fill_row(tok_BT: np.ndarray, pos_BT: np.ndarray, mask_BT: np.ndarray, i: int,
              t: np.ndarray, p: np.ndarray, m: np.ndarray) -> int:
    """Copy one record into row ``i`` of zeroed views (``StagingRing.views``: the rest is padding)."""
    L = len(t)
    tok_BT[i, :L] = t  # uint16 -> int32 on the way
    pos_BT[i, :L] = p
    mask_BT[i, :L] = m
    return L


def _fill_span(tok_N: np.ndarray, pos_N: np.ndarray, mask_N: np.ndarray, d: int,
               t: np.ndarray, p: np.ndarray, m: np.ndarray) -> int:
    """Copy one record slice to flat offset ``d`` of a batch's [B x T] views (fill packing: rows end to end)."""
    L = len(t)
    tok_N[d:d + L] = t  # uint16 -> int32 on the way
    pos_N[d:d + L] = p
    mask_N[d:d + L] = m
    return L


# --------------------------------------------------------------------------- batch


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
    _token: _HostToken | None = field(default=None, repr=False)

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


# --------------------------------------------------------------------------- pipeline


class _Stopped(Exception):
    """Internal: a background thread noticed close()."""


_END = object()


class BatchPipeline:
    """Fixed-shape batches from a shard directory, endless over epochs (or ``epochs`` of them).

    See the module docstring for the threads, the staging-block rule and
    resuming. Use as an iterator and close it (or use ``with``).

    Arguments:
        shards: a ``ShardSet`` (left open by ``close()``) or a shard directory (opened and closed here).
        micro_batch: records per batch (``data.micro_batch_size``).
        seed: plan seed; the plan of an epoch is a pure function of (seed, epoch, index).
        num_workers: decode threads (``data.num_workers``); 0 decodes on the reader thread.
        io_backend: ``"auto"`` | ``"io_uring"`` | ``"threadpool"`` (see ``loaders.reader.make_reader``).
        ring_depth: reads in flight (``loongforge.io_domain.io_uring_entries``; the thread pool's window too).
        read_threads: threads of the thread-pool reader.
        prefetch_batches: batches the reader and the assembler may run ahead of the consumer.
        shuffle_window_frames: frames whose records are shuffled together (see ``EpochPlan``).
        num_staging_blocks: staging blocks in the ring.
        pinned_block_kb: staging block size (``loongforge.memory_domain.pinned_block_kb``); default
            ceil(max_len x 9 x micro_batch / 4096) x 4096 bytes (fill packing: seq_len for max_len).
        device: ``"cpu"`` or a CUDA device.
        start_epoch: first epoch.
        epochs: stop after epoch ``start_epoch + epochs - 1`` (kept across ``load_state_dict``); None: endless.
        bucket_width: ``data.bucket_width``: group the stored buckets into buckets of this width (see
            ``EpochPlan``); None: the shards' own buckets. Bucket packing only (fill rows have no buckets).
        packing: ``"bucket"``: records of one bucket padded to its length (``EpochPlan``); ``"fill"``: the
            record stream cut into full rows of ``seq_len`` tokens, no padding (``FillPlan``).
        seq_len: the row length of fill packing (required there), an int >= 16; not used by bucket packing.
        guard: only for tests: ``False`` lets the producer refill a block still in use.

    Attributes: ``batches_per_epoch``; ``batch_lengths()`` the distinct ``T`` it hands out; fill packing:
    ``seq_len`` and ``dropped_tokens_per_epoch`` (the stream's tail short of a whole batch; None under bucket
    packing, whose plans count ``dropped_records`` per bucket).
    """

    def __init__(self, shards: ShardSet | str | os.PathLike, *, micro_batch: int, seed: int = 0,
                 num_workers: int = 2, io_backend: str = "auto", ring_depth: int = 64, read_threads: int = 4,
                 prefetch_batches: int = 4, shuffle_window_frames: int = 4, num_staging_blocks: int = 4,
                 pinned_block_kb: int | None = None, device: str | torch.device = "cpu", start_epoch: int = 0,
                 epochs: int | None = None, bucket_width: int | None = None, packing: str = "bucket",
                 seq_len: int | None = None, guard: bool = True) -> None:
        for name, value, lo in (("micro_batch", micro_batch, 1), ("num_workers", num_workers, 0),
                                ("ring_depth", ring_depth, 1), ("read_threads", read_threads, 1),
                                ("prefetch_batches", prefetch_batches, 1),
                                ("shuffle_window_frames", shuffle_window_frames, 1),
                                ("num_staging_blocks", num_staging_blocks, 1), ("seed", seed, 0),
                                ("start_epoch", start_epoch, 0)):
            if not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}={value!r}: expected an int >= {lo}")
        if bucket_width is not None and (not isinstance(bucket_width, int) or bucket_width < 1):
            raise ValueError(f"bucket_width={bucket_width!r}: expected None (the shards' buckets) or an int >= 1")
        if packing not in PACKINGS:
            raise ValueError(f"packing={packing!r}: expected one of {', '.join(map(repr, PACKINGS))}")
        if packing == "fill" and seq_len is None:
            raise ValueError(f"seq_len=None: packing='fill' needs seq_len, an int >= {_MIN_SEQ_LEN}")
        if seq_len is not None and (not isinstance(seq_len, int) or seq_len < _MIN_SEQ_LEN):
            raise ValueError(f"seq_len={seq_len!r}: expected None (bucket packing) or an int >= {_MIN_SEQ_LEN}")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs={epochs!r}: expected None (endless) or an int >= 1")
        if io_backend not in BACKENDS:
            raise ValueError(f"io_backend={io_backend!r}: expected one of {', '.join(BACKENDS)}")
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}: expected a cpu or cuda device")
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available in this torch build / machine")
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

        self._own_shards = not isinstance(shards, ShardSet)
        self.shards = ShardSet(shards) if self._own_shards else shards
        try:
            self._setup(micro_batch, seed, num_workers, prefetch_batches, shuffle_window_frames, num_staging_blocks,
                        pinned_block_kb, start_epoch, bucket_width, packing, seq_len, guard)
            self.reader: OrderedReader = make_reader(io_backend, depth=ring_depth, threads=read_threads)
        except BaseException:
            if self._own_shards:
                self.shards.close()
            raise
        self._end_epoch = None if epochs is None else start_epoch + epochs
        self._pos = (start_epoch, 0)  # (epoch, index) of the next batch to be consumed
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._failed: BaseException | None = None
        self._finished = False
        self._last: Batch | None = None
        self._copy_stream = torch.cuda.Stream(self.device) if self._cuda else None
        # metrics
        self._n_batches = 0
        self._real = 0
        self._padded = 0
        self._wait_s = 0.0
        self._dec_lock = threading.Lock()
        self._dec_s = 0.0
        self._dec_bytes = 0
        self._dec_tokens = 0

    def _setup(self, micro_batch: int, seed: int, num_workers: int, prefetch_batches: int,
               shuffle_window_frames: int, num_staging_blocks: int, pinned_block_kb: int | None,
               start_epoch: int, bucket_width: int | None, packing: str, seq_len: int | None,
               guard: bool) -> None:
        self.micro_batch, self.seed, self.bucket_width = micro_batch, seed, bucket_width
        self.packing = packing
        self.seq_len = seq_len if packing == "fill" else None  # the fill row length; None: bucket packing
        self.num_workers, self.prefetch_batches = num_workers, prefetch_batches
        self.shuffle_window_frames = shuffle_window_frames
        self._rec_frame = record_frames(self.shards)
        self._first_rec = np.asarray(self.shards.frame_first_rec, np.int64)
        if packing == "fill":
            self._rec_len = np.asarray(self.shards.rec_length, np.int64)
            self._bucket_len = np.array([seq_len], np.int64)          # one shape: [B, seq_len]
        else:
            self._bucket_len, _ = plan_buckets(self.shards, bucket_width)  # T of each plan bucket
        self._plans: dict[int, EpochPlan | FillPlan] = {}
        self._plans_lock = threading.Lock()
        plan = self._plan(start_epoch)
        self.batches_per_epoch = len(plan)
        # fill: every epoch streams all records, so the tail short of a batch has the same length each epoch
        self.dropped_tokens_per_epoch = plan.dropped_tokens if packing == "fill" else None
        if self.batches_per_epoch == 0 and packing == "fill":
            raise ValueError(f"micro_batch={micro_batch}, seq_len={seq_len}: the epoch's "
                             f"{int(self._rec_len.sum())} tokens fill no [{micro_batch}, {seq_len}] batch")
        if self.batches_per_epoch == 0:
            raise ValueError(f"micro_batch={micro_batch}: no bucket holds that many records, an epoch has no "
                             f"batch (records per bucket: "
                             f"{(plan.batches_per_bucket * micro_batch + plan.dropped_records).tolist()})")
        # staging: the default size follows the seed's formula; a block too small for the largest batch is an error
        longest = int(self._bucket_len.max())
        max_len = int(self.shards.manifest.get("max_len", longest)) if packing == "bucket" else longest
        block = pinned_block_kb * 1024 if pinned_block_kb is not None else default_block_bytes(max_len, micro_batch)
        if block < _batch_bytes(micro_batch, longest):
            what = "the packed rows" if packing == "fill" else "the largest bucket"
            raise ValueError(f"pinned_block_kb={pinned_block_kb}: a staging block of {block} bytes is too small for "
                             f"{what} ({micro_batch} x {longest} tokens x {_STAGED_BYTES_PER_TOKEN} "
                             f"bytes = {_batch_bytes(micro_batch, longest)} bytes); need pinned_block_kb >= "
                             f"{math.ceil(default_block_bytes(longest, micro_batch) / 1024)}")
        self.ring = StagingRing(num_staging_blocks, block, pin=self._cuda, guard=guard)

    def batch_lengths(self) -> list[int]:
        """The lengths ``T`` of the batches this pipeline can hand out, distinct, longest first: the plan buckets'
        (``plan_buckets``) under bucket packing, ``[seq_len]`` under fill packing."""
        return sorted({int(x) for x in self._bucket_len}, reverse=True)

    # -- plans (shared by both threads; a pure function of (seed, epoch))
    def _plan(self, epoch: int) -> EpochPlan | FillPlan:
        with self._plans_lock:
            p = self._plans.get(epoch)
            if p is None:
                if self.packing == "fill":
                    p = FillPlan(self.shards, micro_batch=self.micro_batch, seq_len=self.seq_len, seed=self.seed,
                                 epoch=epoch, shuffle_window_frames=self.shuffle_window_frames,
                                 rec_frame=self._rec_frame, rec_length=self._rec_len)
                else:
                    p = EpochPlan(self.shards, micro_batch=self.micro_batch, seed=self.seed, epoch=epoch,
                                  shuffle_window_frames=self.shuffle_window_frames, bucket_width=self.bucket_width,
                                  rec_frame=self._rec_frame)
                self._plans[epoch] = p
                for old in [e for e in self._plans if e < epoch - 2]:
                    del self._plans[old]
            return p

    def _positions(self) -> Iterator[tuple[int, int]]:
        """(epoch, first batch) of every epoch from the start position on."""
        epoch, k = self._start
        while self._end_epoch is None or epoch < self._end_epoch:
            yield epoch, k
            epoch, k = epoch + 1, 0

    # -- lifecycle
    def _start_threads(self) -> None:
        self._start = self._pos
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._store: dict[tuple[int, int], list] = {}   # (epoch, frame) -> [future, records left]
        self._assembled = 0                              # batches assembled since _start
        self._reader_error: BaseException | None = None
        self._reader_done = False
        self._queue: queue.Queue = queue.Queue(maxsize=self.prefetch_batches)
        self._decode_pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="loaders-decode") \
            if self.num_workers > 0 else None
        self._threads = [threading.Thread(target=self._reader_main, name="loaders-reader", daemon=True),
                         threading.Thread(target=self._assembler_main, name="loaders-assembler", daemon=True)]
        for t in self._threads:
            t.start()

    def _stop_threads(self, restart: bool = True) -> None:
        if not self._threads:
            return
        self._stop.set()
        self.ring.close()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
        if self._decode_pool is not None:
            self._decode_pool.shutdown(wait=True, cancel_futures=True)
        if self._last is not None:
            self._last.release()
            self._last = None
        if restart:  # a fresh ring: the closed one refuses acquire()
            old = self.ring
            self.ring = StagingRing(len(old), old.block_bytes, pin=old.pinned, guard=old.guard)

    def close(self) -> None:
        """Stop and join the background threads, close the reader (and the shards if opened here)."""
        if self._closed:
            return
        self._stop_threads(restart=False)
        self._closed = True
        self.reader.close()
        if self._own_shards:
            self.shards.close()

    def __enter__(self) -> "BatchPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reader thread
    def _requests(self) -> Iterator[tuple]:
        for epoch, k in self._positions():
            plan = self._plan(epoch)
            frames, first_use, refs = plan.schedule(k)
            base = self._seq(epoch, 0)
            for f, u, r in zip(frames.tolist(), first_use.tolist(), refs.tolist()):
                fd, off, n = self.shards.read_request(f)
                yield (epoch, f, base + u, r), fd, off, n

    def _seq(self, epoch: int, k: int) -> int:
        """Batch sequence number counted from the start position."""
        e0, k0 = self._start
        return (epoch - e0) * self.batches_per_epoch + k - k0

    def _decode(self, frame: int, raw: memoryview | bytes) -> Frame:
        t = time.perf_counter()
        fr = self.shards.decode_frame(frame, raw)
        dt = time.perf_counter() - t
        with self._dec_lock:
            self._dec_s += dt
            self._dec_bytes += int(self.shards.frame_dlen[frame])
            self._dec_tokens += len(fr.tokens)
        return fr

    def _reader_main(self) -> None:
        hold = 2 * self.num_workers + 2  # decodes allowed in flight on pooled read buffers
        pending: collections.deque[Future] = collections.deque()
        gen = self.reader.read_ordered(self._requests(), hold=hold)
        try:
            while not self._stop.is_set():
                while len(pending) > hold:  # the buffer of that read is recycled on the next request
                    f = pending.popleft()
                    while not f.done():
                        if self._stop.is_set():
                            return
                        _wait_future(f)
                try:
                    (epoch, frame, first_use, refs), data = next(gen)
                except StopIteration:
                    return
                with self._cv:  # run at most prefetch_batches batches ahead of the assembler
                    while first_use >= self._assembled + self.prefetch_batches and not self._stop.is_set():
                        self._cv.wait(_POLL_S)
                if self._stop.is_set():
                    return
                if self._decode_pool is not None:
                    fut = self._decode_pool.submit(self._decode, frame, data)
                else:
                    fut = Future()
                    try:
                        fut.set_result(self._decode(frame, data))
                    except Exception as e:
                        fut.set_exception(e)
                pending.append(fut)
                with self._cv:
                    self._store[(epoch, frame)] = [fut, refs]
                    self._cv.notify_all()
        except BaseException as e:
            with self._cv:
                self._reader_error = e
                self._cv.notify_all()
        finally:
            for f in pending:  # read buffers must outlive their decodes
                _wait_future(f, None)
            gen.close()
            with self._cv:
                self._reader_done = True
                self._cv.notify_all()

    # -- assembler thread
    def _frame(self, epoch: int, frame: int) -> Frame:
        key = (epoch, frame)
        with self._cv:
            while key not in self._store:
                if self._stop.is_set():
                    raise _Stopped
                if self._reader_error is not None:
                    raise self._reader_error
                if self._reader_done:  # a bug, not a data error: say so rather than wait forever
                    raise RuntimeError(f"loaders: frame {frame} of epoch {epoch} is needed but the reader "
                                       f"thread finished without reading it")
                self._cv.wait(_POLL_S)
            fut = self._store[key][0]
        while True:
            if self._stop.is_set():
                raise _Stopped
            if _wait_future(fut):
                return fut.result()  # raises the decode error (ShardFormatError...) here, in batch order

    def _unref(self, epoch: int, frame: int, n: int) -> None:
        with self._cv:
            ent = self._store[(epoch, frame)]
            ent[1] -= n
            if ent[1] <= 0:
                del self._store[(epoch, frame)]

    def _assemble(self, epoch: int, k: int, plan: EpochPlan | FillPlan) -> Batch:
        if isinstance(plan, FillPlan):
            return self._assemble_fill(epoch, k, plan)
        bucket, ids = plan.batch(k)
        B, T = len(ids), int(self._bucket_len[bucket])
        try:
            i = self.ring.acquire()
        except RuntimeError:
            raise _Stopped from None
        tok_BT, pos_BT, mask_BT = self.ring.views(i, B, T)
        frames: dict[int, Frame] = {}
        uses: collections.Counter = collections.Counter()
        real = 0
        for row, r in enumerate(ids.tolist()):
            f = int(self._rec_frame[r])
            fr = frames.get(f)
            if fr is None:
                fr = frames[f] = self._frame(epoch, f)
            uses[f] += 1
            real += _fill_row(tok_BT, pos_BT, mask_BT, row, *fr.record(r - int(self._first_rec[f])))
        for f, n in uses.items():
            self._unref(epoch, f, n)
        return self._ship(i, B, T, real=real, epoch=epoch, index=k, bucket=bucket, record_ids=ids)

    def _assemble_fill(self, epoch: int, k: int, plan: FillPlan) -> Batch:
        """Batch ``k`` of a fill plan: its record slices written end to end over the block's flat B x T."""
        rec, off, length, dest = (x.tolist() for x in plan.pieces(k))
        B, T = self.micro_batch, plan.seq_len
        try:
            i = self.ring.acquire()
        except RuntimeError:
            raise _Stopped from None
        tok_BT, pos_BT, mask_BT = self.ring.views(i, B, T, zero=False)  # the slices cover all of it: no padding
        tok_N, pos_N, mask_N = tok_BT.reshape(-1), pos_BT.reshape(-1), mask_BT.reshape(-1)  # views, contiguous
        frames: dict[int, Frame] = {}
        uses: collections.Counter = collections.Counter()
        real = 0
        for r, a, n, d in zip(rec, off, length, dest):
            f = int(self._rec_frame[r])
            fr = frames.get(f)
            if fr is None:
                fr = frames[f] = self._frame(epoch, f)
            uses[f] += 1
            t, p, m = fr.record(r - int(self._first_rec[f]))
            real += _fill_span(tok_N, pos_N, mask_N, d, t[a:a + n], p[a:a + n], m[a:a + n])
        if real != B * T:  # a plan bug, not a data error: unwritten staging bytes would reach the model
            raise RuntimeError(f"loaders: fill batch {k} of epoch {epoch} has {real} tokens, expected {B} x {T}")
        for f, n in uses.items():
            self._unref(epoch, f, n)
        return self._ship(i, B, T, real=real, epoch=epoch, index=k, bucket=0, record_ids=np.asarray(rec, np.int64))

    def _ship(self, i: int, B: int, T: int, *, real: int, epoch: int, index: int, bucket: int,
              record_ids: np.ndarray) -> Batch:
        """The batch in block ``i`` as tensors: copied to the device (CUDA) or lent as views of the block (CPU)."""
        n = B * T
        blk = self.ring.blocks[i]
        if self._cuda:
            with torch.cuda.stream(self._copy_stream):
                dev = torch.empty(9 * n, dtype=torch.uint8, device=self.device)
                dev.copy_(blk[:9 * n], non_blocking=True)  # pinned -> device, async on the side stream
                ev = torch.cuda.Event()
                ev.record(self._copy_stream)
            self.ring.set_event(i, ev)
            src, token = dev, None
        else:
            src, token, ev = blk, self.ring.hand_out(i), None
        return Batch(input_ids=src[:4 * n].view(torch.int32).view(B, T),
                     position_ids=src[4 * n:8 * n].view(torch.int32).view(B, T),
                     loss_mask=src[8 * n:9 * n].view(B, T), length=T, real_tokens=real, padded_tokens=n,
                     epoch=epoch, index=index, bucket=bucket, record_ids=record_ids, event=ev, _token=token)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue
        raise _Stopped

    def _assembler_main(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self.device)
            for epoch, k0 in self._positions():
                plan = self._plan(epoch)
                for k in range(k0, len(plan)):
                    batch = self._assemble(epoch, k, plan)
                    self._put(batch)
                    with self._cv:
                        self._assembled += 1
                        self._cv.notify_all()
            self._put(_END)
        except _Stopped:
            pass
        except BaseException as e:
            try:
                self._put(e)
            except _Stopped:
                pass
            self._stop.set()  # the reader stops too; the consumer gets the error at next()

    # -- consumer
    def __iter__(self) -> "BatchPipeline":
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise RuntimeError("BatchPipeline is closed")
        if self._failed is not None:
            raise self._failed
        if self._finished:
            raise StopIteration
        if self._last is not None:  # the previous CPU batch's block goes back to the producer
            self._last.release()
            self._last = None
        if not self._threads:
            self._start_threads()
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._threads[1].is_alive() and self._queue.empty():
                    self._failed = RuntimeError("loaders: the assembler thread exited without a result")
                    raise self._failed
        self._wait_s += time.perf_counter() - t0
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._failed = item
            raise item
        batch: Batch = item
        if batch.event is not None:
            batch.ready()  # the current stream waits for the h2d copy; no host sync
        self._last = batch if batch._token is not None else None
        k = batch.index + 1
        self._pos = (batch.epoch, k) if k < self.batches_per_epoch else (batch.epoch + 1, 0)
        self._n_batches += 1
        self._real += batch.real_tokens
        self._padded += batch.padded_tokens
        return batch

    # -- state
    def state_dict(self) -> dict:
        """``epoch`` and ``batch`` (batches of that epoch consumed = index of the next one), plus the
        settings that must match for an exact resume."""
        epoch, k = self._pos
        return {"version": _STATE_VERSION, "epoch": epoch, "batch": k, "seed": self.seed,
                "micro_batch": self.micro_batch, "shuffle_window_frames": self.shuffle_window_frames,
                "bucket_width": self.bucket_width, "packing": self.packing, "seq_len": self.seq_len,
                "batches_per_epoch": self.batches_per_epoch, "n_records": int(self.shards.n_records),
                "n_frames": int(self.shards.n_frames)}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state``'s position: the next batch equals the next batch of an uninterrupted run.

        A state without ``packing`` / ``seq_len`` is a bucket-packing one; ``bucket_width`` is compared under
        bucket packing only (fill packing does not use it)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r}: expected {_STATE_VERSION}")
        theirs = {"packing": "bucket", "seq_len": None, **state}
        mine = self.state_dict()
        keys = ["packing", "seq_len", "seed", "micro_batch", "shuffle_window_frames", "bucket_width",
                "batches_per_epoch", "n_records", "n_frames"]
        if self.packing == "fill":
            keys.remove("bucket_width")
        for key in keys:
            if theirs.get(key) != mine[key]:
                raise ValueError(f"state {key}={theirs.get(key)!r} differs from this pipeline's {mine[key]!r}: an "
                                 f"exact resume needs the same packing, seq_len, seed, micro_batch, "
                                 f"shuffle_window_frames, bucket_width and shards")
        epoch, k = int(state["epoch"]), int(state["batch"])
        if not 0 <= k < self.batches_per_epoch or epoch < 0:
            raise ValueError(f"state epoch={epoch}, batch={k}: expected batch in 0..{self.batches_per_epoch - 1}")
        if self._closed:
            raise RuntimeError("BatchPipeline is closed")
        self._stop_threads()
        self._failed = None
        self._finished = False
        self._pos = (epoch, k)

    # -- metrics
    def metrics(self) -> dict[str, Any]:
        """Namespaced, unit-carrying figures: io/*, decode/* (per busy decode-second), data/*."""
        r = self.reader.stats()
        with self._dec_lock:
            dec_s, dec_b, dec_t = self._dec_s, self._dec_bytes, self._dec_tokens
        m = {
            "io/backend": self.reader.name,
            "io/read_latency_ms_p50": r["read_latency_ms_p50"],
            "io/read_latency_ms_p90": r["read_latency_ms_p90"],
            "io/read_latency_ms_p99": r["read_latency_ms_p99"],
            "io/read_mb_per_s": r["mb_per_s"],
            "io/reads": r["reads"],
            "io/read_bytes": r["bytes"],
            "decode/mb_per_s": dec_b / 1e6 / dec_s if dec_s > 0 else float("nan"),
            "decode/tokens_per_s": dec_t / dec_s if dec_s > 0 else float("nan"),
            "decode/busy_s": dec_s,
            "data/padding_ratio": 1 - self._real / self._padded if self._padded else float("nan"),
            "data/consumer_wait_s": self._wait_s,
            "data/batches": self._n_batches,
            "data/batches_assembled": self._assembled if self._threads else 0,
            "data/real_tokens": self._real,
            "data/epoch": self._pos[0],
        }
        if self.packing == "fill":  # the stream's tail short of a whole batch, the same count every epoch
            m["data/dropped_tokens_per_epoch"] = self.dropped_tokens_per_epoch
        return m


def _wait_future(f: Future, timeout: float | None = _POLL_S) -> bool:
    """Wait for ``f`` (without raising its exception); True once it is done."""
    try:
        f.exception(timeout=timeout)
    except TimeoutError:
        return False
    except BaseException:  # cancelled
        return True
    return True
