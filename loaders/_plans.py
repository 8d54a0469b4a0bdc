"""Epoch plans: which records form which batch, in which order, for one (seed, epoch), computed from the index
alone. ``EpochPlan`` (bucket packing), ``FillPlan`` (fill packing), ``plan_buckets`` and ``record_frames``.

Packing and the plans' rules are described in docs/loaders.md ("The batch pipeline"); import these names from
``loaders.pipeline``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .format import ShardSet

PACKINGS = ("bucket", "fill")


class EpochPlan:
    """Which records form which batch, in which order, for one (seed, epoch): computed from the index alone.

    Per bucket: permute its frames; walk them in windows of
    ``shuffle_window_frames``; shuffle the records of a window; cut batches of
    ``micro_batch_size`` records, carrying the leftovers into the next window.
    The last partial batch of each bucket (< ``micro_batch_size`` records) is
    dropped for this epoch; the permutation differs per epoch, so different
    records are dropped each time. Then the buckets are interleaved by shuffling
    a list that holds each bucket id once per batch it has: a bucket's share of
    steps is its share of records (to within one batch), and its share of tokens
    is its share of tokens, unbiased by length.

    Buckets: by default the shards' own. With ``bucket_width`` W, stored buckets
    are grouped at load time: a stored bucket of length L joins the plan bucket
    of length min(max_len, ceil(L / W) x W), so the bucket-width knob needs no
    re-preprocessing (padding stays under W plus the stored width; a W that is a
    multiple of the stored width buckets exactly as preprocessing at W would).

    Attributes: ``batches`` int64 [n_batches, micro_batch_size] global record ids;
    ``batch_bucket`` [n_batches] plan bucket of each batch; ``bucket_length``
    [n_plan_buckets] its padded length T; ``bucket_groups`` the stored buckets of
    each plan bucket; ``frame_order`` frames in first-use order;
    ``frame_first_use`` the batch that first needs each of them;
    ``dropped_records`` [n_plan_buckets].
    """

    def __init__(self, shards: ShardSet, *, micro_batch_size: int, seed: int, epoch: int,
                 shuffle_window_frames: int = 4, bucket_width: int | None = None,
                 rec_frame: np.ndarray | None = None) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size}: expected >= 1")
        if shuffle_window_frames < 1:
            raise ValueError(f"shuffle_window_frames={shuffle_window_frames}: expected >= 1")
        if seed < 0 or epoch < 0:
            raise ValueError(f"seed={seed}, epoch={epoch}: expected >= 0")
        if bucket_width is not None and bucket_width < 1:
            raise ValueError(f"bucket_width={bucket_width}: expected None (the shards' buckets) or >= 1")
        self.bucket_width = bucket_width
        self.micro_batch_size, self.seed, self.epoch = micro_batch_size, seed, epoch
        self.shuffle_window_frames = shuffle_window_frames
        first_rec = np.asarray(shards.frame_first_rec, np.int64)
        n_rec = np.asarray(shards.frame_n_rec, np.int64)
        self.rec_frame = rec_frame if rec_frame is not None else record_frames(shards)
        self.bucket_length, self.bucket_groups = plan_buckets(shards, bucket_width)
        n_buckets = len(self.bucket_length)
        streams = np.random.SeedSequence([seed, epoch]).spawn(n_buckets + 1)
        per_bucket: list[np.ndarray] = []
        self.dropped_records = np.zeros(n_buckets, np.int64)
        mb, W = micro_batch_size, shuffle_window_frames
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
        return frames[o], first[o] // self.micro_batch_size + start, count[o]


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
    """Which record slices fill which packed [micro_batch_size, seq_len] batch, for one (seed, epoch).

    The record order is ``EpochPlan``'s at ``micro_batch_size=1`` on the shards' own
    buckets: the same seeded frame permutation and window shuffle per bucket,
    the buckets interleaved record by record, no record dropped; so it is a pure
    function of (seed, epoch) and the index. Those records are laid end to end as
    one stream of tokens; batch ``k`` is tokens ``k x N .. (k + 1) x N`` of it
    (``N = micro_batch_size x seq_len``), row-major: row ``i`` is its tokens
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

    def __init__(self, shards: ShardSet, *, micro_batch_size: int, seq_len: int, seed: int, epoch: int,
                 shuffle_window_frames: int = 4, rec_frame: np.ndarray | None = None,
                 rec_length: np.ndarray | None = None) -> None:
        if micro_batch_size < 1 or seq_len < 1:
            raise ValueError(f"micro_batch_size={micro_batch_size}, seq_len={seq_len}: expected >= 1")
        order = EpochPlan(shards, micro_batch_size=1, seed=seed, epoch=epoch,
                          shuffle_window_frames=shuffle_window_frames, rec_frame=rec_frame)
        self.micro_batch_size, self.seq_len, self.seed, self.epoch = micro_batch_size, seq_len, seed, epoch
        self.shuffle_window_frames = shuffle_window_frames
        self.rec_frame = order.rec_frame
        self.bucket_length = np.array([seq_len], np.int64)
        self.records = order.batches.ravel()
        rec_len = np.asarray(rec_length if rec_length is not None else shards.rec_length, np.int64)
        N = micro_batch_size * seq_len
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
        batch's flat ``micro_batch_size x seq_len`` tokens); the lengths sum to that many tokens."""
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
