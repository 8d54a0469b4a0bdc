"""The batch pipeline: shards -> ordered async reads -> zstd decode -> staging blocks -> device.

``BatchPipeline``: its settings, plans, batches and state. Its reader and assembler threads and the queue its
consumer takes batches from are ``loaders._threads``'s (``PipelineThreads``, the base class). The plans
(``EpochPlan``, ``FillPlan``) and the staging ring (``StagingRing``, ``Batch``) are defined in ``loaders._plans`` and
``loaders._staging`` and re-exported here.
Packing, the threads, the staging-block rule, the metrics, resuming and ``from_config`` are described in
docs/loaders.md ("The batch pipeline").
"""

from __future__ import annotations

import collections
import math
import os
import threading
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from ._plans import PACKINGS, EpochPlan, FillPlan, plan_buckets, record_frames
from ._settings import CONFIG_FIELDS, check_arguments, config_arguments, config_error, config_shards
from ._staging import (STAGED_BYTES_PER_TOKEN, Batch, StagingRing, batch_bytes, fill_row, fill_span,
                       bytes_per_sample, default_block_bytes)
from ._threads import PipelineThreads, Stopped
from .format import Frame, ShardSet
from .reader import OrderedReader, make_reader
from workbench.vocab import PADDING_RATIO

__all__ = [
    "EpochPlan",
    "FillPlan",
    "PACKINGS",
    "StagingRing",
    "Batch",
    "BatchPipeline",
    "bytes_per_sample",
    "default_block_bytes",
    "plan_buckets",
    "record_frames",
    "upgrade_state",
]

_STATE_VERSION = 1
# Keys a version-1 state was written with before the loaders took the config's names -> the key now. Such states
# (checkpoints) are still read; only the new key is written.
_RENAMED_STATE_KEYS = {"micro_batch": "micro_batch_size"}


def upgrade_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` (a ``BatchPipeline.state_dict()``) with today's keys: a state written before the rename
    holds ``micro_batch``, read as ``micro_batch_size``."""
    out = dict(state)
    for old, new in _RENAMED_STATE_KEYS.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    return out


class BatchPipeline(PipelineThreads):
    """Fixed-shape batches from a shard directory, endless over epochs (or ``epochs`` of them).

    See docs/loaders.md ("The batch pipeline") for the threads, the staging-block rule and
    resuming. Use as an iterator and close it (or use ``with``).

    Arguments:
        shards: a ``ShardSet`` (left open by ``close()``) or a shard directory (opened and closed here).
        micro_batch_size: records per batch (``data.micro_batch_size``).
        seed: plan seed; the plan of an epoch is a pure function of (seed, epoch, index).
        num_workers: decode threads (``data.num_workers``); 0 decodes on the reader thread.
        io_backend: ``"auto"`` | ``"io_uring"`` | ``"threadpool"`` (see ``loaders.reader.make_reader``).
        io_uring_entries: reads in flight, the io_uring ring's entries (``loongforge.io_domain.io_uring_entries``;
            the thread pool's window too).
        read_threads: threads of the thread-pool reader.
        prefetch_batches: batches the reader and the assembler may run ahead of the consumer.
        shuffle_window_frames: frames whose records are shuffled together (see ``EpochPlan``).
        num_staging_blocks: staging blocks in the ring.
        pinned_block_kb: staging block size (``loongforge.memory_domain.pinned_block_kb``); default
            ceil(max_len x 9 x micro_batch_size / 4096) x 4096 bytes (fill packing: seq_len for max_len).
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

    Token records only; a shard set of vla records is refused (``loaders.vla.VLAPipeline`` reads those).
    """

    RECORD_KIND = "tokens"
    """The shards' ``record_kind`` this pipeline assembles."""
    _CONFIG_FIELDS = CONFIG_FIELDS
    """Constructor argument -> the config section ``from_config`` reads it from (the attribute of its name)."""

    def __init__(self, shards: ShardSet | str | os.PathLike, *, micro_batch_size: int, seed: int = 0,
                 num_workers: int = 2, io_backend: str = "auto", io_uring_entries: int = 64,
                 read_threads: int = 4, prefetch_batches: int = 4, shuffle_window_frames: int = 4,
                 num_staging_blocks: int = 4, pinned_block_kb: int | None = None,
                 device: str | torch.device = "cpu", start_epoch: int = 0, epochs: int | None = None,
                 bucket_width: int | None = None, packing: str = "bucket", seq_len: int | None = None,
                 guard: bool = True) -> None:
        check_arguments(micro_batch_size=micro_batch_size, seed=seed, num_workers=num_workers,
                        io_uring_entries=io_uring_entries, read_threads=read_threads,
                        prefetch_batches=prefetch_batches, shuffle_window_frames=shuffle_window_frames,
                        num_staging_blocks=num_staging_blocks, start_epoch=start_epoch, epochs=epochs,
                        bucket_width=bucket_width, packing=packing, seq_len=seq_len, io_backend=io_backend)
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
            self._setup(micro_batch_size, seed, num_workers, prefetch_batches, shuffle_window_frames,
                        num_staging_blocks, pinned_block_kb, start_epoch, bucket_width, packing, seq_len, guard)
            self.reader: OrderedReader = make_reader(io_backend, depth=io_uring_entries, threads=read_threads)
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
        self._io_before = {"reads": 0, "bytes": 0, "read_latency_ms_sum": 0.0}  # of the pipelines continued

    @classmethod
    def from_config(cls, data: Any, io: Any, memory: Any, *, seed: int, device: str | torch.device,
                    shards: ShardSet | str | os.PathLike | None = None, **overrides: Any) -> "BatchPipeline":
        """A pipeline whose settings are read from the workbench config's sections, by their own field names.

        The sections are read duck-typed (loaders does not import workbench): ``data`` (``data``):
        ``micro_batch_size``, ``num_workers``, ``prefetch_batches``, ``shuffle_window_frames``, ``bucket_width``,
        ``packing``, ``seq_len``, and ``loongbin_dir`` when ``shards`` is None; ``io``
        (``loongforge.io_domain``): ``io_backend``, ``io_uring_entries`` (the ring depth), ``read_threads``;
        ``memory`` (``loongforge.memory_domain``): ``num_staging_blocks``, ``pinned_block_kb``. ``overrides`` are
        further arguments of the constructor, or replace a value of the config. A bad value is a ``ValueError``
        naming the config key it came from (``data.micro_batch_size=...``).
        """
        kwargs, keys = config_arguments(data, io, memory, cls._CONFIG_FIELDS)
        for name in overrides:
            keys.pop(name, None)
        try:
            kwargs = cls._config_values({**kwargs, **overrides}, keys)
            return cls(config_shards(data) if shards is None else shards, seed=seed, device=device, **kwargs)
        except ValueError as e:
            renamed = config_error(e, keys)
            if renamed is None:
                raise
            raise renamed from e

    @classmethod
    def _config_values(cls, kwargs: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
        """The constructor's arguments from the values read (``keys``: argument -> config key, for errors)."""
        return kwargs

    def _setup(self, micro_batch_size: int, seed: int, num_workers: int, prefetch_batches: int,
               shuffle_window_frames: int, num_staging_blocks: int, pinned_block_kb: int | None,
               start_epoch: int, bucket_width: int | None, packing: str, seq_len: int | None,
               guard: bool) -> None:
        if self.shards.record_kind != self.RECORD_KIND:
            other = {"tokens": "loaders.pipeline.BatchPipeline", "vla": "loaders.vla.VLAPipeline"}
            raise ValueError(f"{self.shards.root}: holds {self.shards.record_kind} records, {type(self).__name__} "
                             f"reads {self.RECORD_KIND} records; use {other[self.shards.record_kind]}")
        self.micro_batch_size, self.seed, self.bucket_width = micro_batch_size, seed, bucket_width
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
            raise ValueError(f"micro_batch_size={micro_batch_size}, seq_len={seq_len}: the epoch's "
                             f"{int(self._rec_len.sum())} tokens fill no [{micro_batch_size}, {seq_len}] batch")
        if self.batches_per_epoch == 0:
            raise ValueError(f"micro_batch_size={micro_batch_size}: no bucket holds that many records, an epoch "
                             f"has no batch (records per bucket: "
                             f"{(plan.batches_per_bucket * micro_batch_size + plan.dropped_records).tolist()})")
        block = self._staging_block_bytes(pinned_block_kb)
        self.ring = StagingRing(num_staging_blocks, block, pin=self._cuda, guard=guard)
        self._ring_acquires = self._ring_fresh = 0  # of the rings replaced on a restart

    def _staging_block_bytes(self, pinned_block_kb: int | None) -> int:
        """The staging block size: ``pinned_block_kb``, or by default the seed's formula; a block too small for
        the largest batch is an error naming the least ``pinned_block_kb`` that fits."""
        B = self.micro_batch_size
        longest = int(self._bucket_len.max())
        max_len = int(self.shards.manifest.get("max_len", longest)) if self.packing == "bucket" else longest
        block = pinned_block_kb * 1024 if pinned_block_kb is not None else default_block_bytes(max_len, B)
        if block < batch_bytes(B, longest):
            what = "the packed rows" if self.packing == "fill" else "the largest bucket"
            raise ValueError(f"pinned_block_kb={pinned_block_kb}: a staging block of {block} bytes is too small for "
                             f"{what} ({B} x {longest} tokens x {STAGED_BYTES_PER_TOKEN} "
                             f"bytes = {batch_bytes(B, longest)} bytes); need pinned_block_kb >= "
                             f"{math.ceil(default_block_bytes(longest, B) / 1024)}")
        return block

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
                    p = FillPlan(self.shards, micro_batch_size=self.micro_batch_size, seq_len=self.seq_len,
                                 seed=self.seed, epoch=epoch, shuffle_window_frames=self.shuffle_window_frames,
                                 rec_frame=self._rec_frame, rec_length=self._rec_len)
                else:
                    p = EpochPlan(self.shards, micro_batch_size=self.micro_batch_size, seed=self.seed, epoch=epoch,
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

    def _assemble(self, epoch: int, k: int, plan: EpochPlan | FillPlan) -> Batch:
        if isinstance(plan, FillPlan):
            return self._assemble_fill(epoch, k, plan)
        bucket, ids = plan.batch(k)
        B, T = len(ids), int(self._bucket_len[bucket])
        try:
            i = self.ring.acquire()
        except RuntimeError:
            raise Stopped from None
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
            real += fill_row(tok_BT, pos_BT, mask_BT, row, *fr.record(r - int(self._first_rec[f])))
        for f, n in uses.items():
            self._unref(epoch, f, n)
        return self._ship(i, B, T, real=real, epoch=epoch, index=k, bucket=bucket, record_ids=ids)

    def _assemble_fill(self, epoch: int, k: int, plan: FillPlan) -> Batch:
        """Batch ``k`` of a fill plan: its record slices written end to end over the block's flat B x T."""
        rec, off, length, dest = (x.tolist() for x in plan.pieces(k))
        B, T = self.micro_batch_size, plan.seq_len
        try:
            i = self.ring.acquire()
        except RuntimeError:
            raise Stopped from None
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
            real += fill_span(tok_N, pos_N, mask_N, d, t[a:a + n], p[a:a + n], m[a:a + n])
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

    # -- state
    def state_dict(self) -> dict:
        """``epoch`` and ``batch`` (batches of that epoch consumed = index of the next one), plus the
        settings that must match for an exact resume."""
        epoch, k = self._pos
        return {"version": _STATE_VERSION, "epoch": epoch, "batch": k, "seed": self.seed,
                "micro_batch_size": self.micro_batch_size, "shuffle_window_frames": self.shuffle_window_frames,
                "bucket_width": self.bucket_width, "packing": self.packing, "seq_len": self.seq_len,
                "batches_per_epoch": self.batches_per_epoch, "n_records": int(self.shards.n_records),
                "n_frames": int(self.shards.n_frames)}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state``'s position: the next batch equals the next batch of an uninterrupted run.

        A state without ``packing`` / ``seq_len`` is a bucket-packing one; ``bucket_width`` is compared under
        bucket packing only (fill packing does not use it). A state holding ``micro_batch`` (written before the
        key was ``micro_batch_size``) is read as one holding ``micro_batch_size`` (``upgrade_state``)."""
        state = upgrade_state(state)
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r}: expected {_STATE_VERSION}")
        theirs = {"packing": "bucket", "seq_len": None, **state}
        mine = self.state_dict()
        keys = ["packing", "seq_len", "seed", "micro_batch_size", "shuffle_window_frames", "bucket_width",
                "batches_per_epoch", "n_records", "n_frames"]
        if self.packing == "fill":
            keys.remove("bucket_width")
        for key in keys:
            if theirs.get(key) != mine[key]:
                raise ValueError(f"state {key}={theirs.get(key)!r} differs from this pipeline's {mine[key]!r}: an "
                                 f"exact resume needs the same packing, seq_len, seed, micro_batch_size, "
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
    def continue_counters(self, prev: "BatchPipeline") -> None:
        """Count on from ``prev``'s totals: a pipeline that replaces ``prev`` mid-run (a new micro-batch) reports
        the run's batches, tokens, waits, decode work, reads and staging blocks in ``metrics()``; the read
        latency quantiles and ``io/read_mb_per_s`` are this pipeline's reader's own."""
        r = prev.reader.stats()
        for k in self._io_before:
            self._io_before[k] += prev._io_before[k] + r[k]
        self._n_batches += prev._n_batches
        self._real += prev._real
        self._padded += prev._padded
        self._wait_s += prev._wait_s
        with prev._dec_lock, self._dec_lock:
            self._dec_s += prev._dec_s
            self._dec_bytes += prev._dec_bytes
            self._dec_tokens += prev._dec_tokens
        self._ring_acquires += prev._ring_acquires + prev.ring.acquires
        self._ring_fresh += prev._ring_fresh + prev.ring.fresh

    def metrics(self) -> dict[str, Any]:
        """Namespaced, unit-carrying figures: io/*, decode/* (per busy decode-second), data/*."""
        r = dict(self.reader.stats())
        for k, v in self._io_before.items():
            r[k] += v
        acq, fresh = self._ring_acquires + self.ring.acquires, self._ring_fresh + self.ring.fresh
        with self._dec_lock:
            dec_s, dec_b, dec_t = self._dec_s, self._dec_bytes, self._dec_tokens
        m = {
            "io/backend": self.reader.name,
            "io/read_latency_ms_p50": r["read_latency_ms_p50"],
            "io/read_latency_ms_p90": r["read_latency_ms_p90"],
            "io/read_latency_ms_p99": r["read_latency_ms_p99"],
            "io/read_latency_ms_sum": r["read_latency_ms_sum"],
            "io/read_mb_per_s": r["mb_per_s"],
            "io/reads": r["reads"],
            "io/read_bytes": r["bytes"],
            "decode/mb_per_s": dec_b / 1e6 / dec_s if dec_s > 0 else float("nan"),
            "decode/tokens_per_s": dec_t / dec_s if dec_s > 0 else float("nan"),
            "decode/busy_s": dec_s,
            PADDING_RATIO: 1 - self._real / self._padded if self._padded else float("nan"),
            "data/consumer_wait_s": self._wait_s,
            "data/batches": self._n_batches,
            "data/batches_assembled": self._assembled if self._threads else 0,
            "data/real_tokens": self._real,
            "data/epoch": self._pos[0],
            # batches built in a staging block an earlier batch already used (not a fresh block), 0..1
            "memory/staging_reuse_ratio": 1 - fresh / acq if acq else float("nan"),
            "memory/staging_acquires": acq,
        }
        if self.packing == "fill":  # the stream's tail short of a whole batch, the same count every epoch
            m["data/dropped_tokens_per_epoch"] = self.dropped_tokens_per_epoch
        return m
