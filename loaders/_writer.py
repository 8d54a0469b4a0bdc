"""``ShardWriter``: buckets records, trains one zstd dictionary per bucket, compresses the frames and writes the
index and the manifest into a temporary directory that is published atomically.

The format is described in docs/loaders.md ("The shard format"); import ``ShardWriter`` from ``loaders.format``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import xxhash
import zstandard as zstd

from ._layout import (FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, MAX_FRAME_BYTES, MIN_FRAME_BYTES, file_xxh3,
                      bucket_length, position_dtype_for, token_dtype_for, write_index)
from workbench.files import fsync_dir, write_json

from ._publish import PARTIAL, close_synced, move_into_place, owner_tag

# The sizes and parameters below are measured choices; docs/loaders.md ("Why these sizes") has the figures.
# A frame amortises its read, checksum and context over ~25 records of 2,048 tokens and stays cheap to seek.
DEFAULT_FRAME_BYTES = 256 * 1024
# A dictionary gets within 2% of whole-file zstd's ratio; larger ones double the training time per bucket.
DEFAULT_DICT_SIZE = 256 * 1024
# Fixed COVER parameters, not zstd's search (k=d=0): 5x faster to train, and the frames come out smaller.
_DICT_K, _DICT_D = 256, 8
# zstd dictionary training wants ~100x the dictionary size in samples.
_SAMPLES_PER_DICT_BYTE = 100
_GLOBAL_DICT_MAX_SAMPLES = 20000


def ordered_buckets(pool: ThreadPoolExecutor, fn, items, window: int):
    """``map(fn, items)`` on the pool with at most ``window`` tasks in flight, results in order."""
    pending: deque = deque()
    for x in items:
        pending.append(pool.submit(fn, x))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


class Spill:
    """One bucket's records as they arrive: a file per column, plus the record lengths."""

    COLUMNS = ("tok", "pos", "mask")

    def __init__(self, root: Path, blen: int) -> None:
        self.paths = [root / f"{blen}.{c}" for c in self.COLUMNS]
        self.files = [open(p, "wb") for p in self.paths]
        self.lengths: list[int] = []

    def close(self) -> None:
        for f in self.files:
            f.close()


@dataclass
class Bucket:
    """A bucket while the writer closes: spilled columns (memory-mapped), dictionary, frames."""

    index: int
    length: int
    lens: np.ndarray                # tokens per record
    offs: np.ndarray                # token offset of each record in the bucket, plus the total
    cols: tuple                     # (tokens, positions, loss mask) memmaps
    frames: list                    # (first record, record count) per frame
    dict: object                    # zstd.ZstdCompressionDict or None
    dict_id: int
    samples: list | None
    written: list | None = None     # (offset, clen, dlen, first, n, xxh3) per frame
    compressed_bytes: int = 0
    raw_bytes: int = 0

    def payload(self, first: int, n: int) -> bytes:
        a, b = int(self.offs[first]), int(self.offs[first + n])
        tok, pos, mask = self.cols
        return b"".join((tok[a:b], pos[a:b], mask[a:b]))


class ShardWriter:
    """Buckets records, trains one dictionary per bucket, writes frames and the index.

    Records are spilled to per-bucket column files in the temporary directory
    as they arrive, and read back through ``np.memmap`` one frame at a time, so
    memory stays flat on large inputs. ``close()`` trains the dictionaries,
    compresses the frames (``num_workers`` threads: zstd releases the GIL),
    writes the index and the manifest, and renames the directory into place.
    ``abort()`` (or an exception, Ctrl-C included, inside a ``with`` block or
    during ``close()``) removes the temporary directory; a pre-existing
    ``out_dir`` is replaced only by the final atomic rename.
    """

    def __init__(self, out_dir: str | os.PathLike, *, vocab_size: int, bucket_width: int,
                 max_len: int, zstd_level: int = 12, dict_size: int = DEFAULT_DICT_SIZE,
                 frame_bytes: int = DEFAULT_FRAME_BYTES, num_workers: int = 1,
                 overwrite: bool = False, compare_baselines: bool = True) -> None:
        if not MIN_FRAME_BYTES <= frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError(f"frame_bytes={frame_bytes}: expected {MIN_FRAME_BYTES}..{MAX_FRAME_BYTES}")
        if bucket_width < 1 or max_len < 1:
            raise ValueError(f"bucket_width={bucket_width}, max_len={max_len}: expected positive integers")
        if not 1 <= zstd_level <= 22:
            raise ValueError(f"zstd_level={zstd_level}: expected 1..22")
        if not 1 <= vocab_size <= 1 << 32:
            raise ValueError(f"vocab_size={vocab_size}: expected 1..{1 << 32}")
        if dict_size < 256:
            raise ValueError(f"dict_size={dict_size}: expected at least 256 bytes")
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not overwrite:
            raise FileExistsError(f"{self.out_dir}: already exists (pass overwrite=True / --overwrite to replace it)")
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise FileExistsError(f"{self.out_dir}: exists and is not a directory; refusing to replace it")
        self.vocab_size = vocab_size
        self.bucket_width = bucket_width
        self.max_len = max_len
        self.level = zstd_level
        self.dict_size = dict_size
        self.frame_bytes = frame_bytes
        self.num_workers = max(1, num_workers)
        self.compare_baselines = compare_baselines
        self.tok_dtype = token_dtype_for(vocab_size)
        self.pos_dtype = position_dtype_for(max_len)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}{PARTIAL}{owner_tag()}-",
                                         dir=self.out_dir.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; the result is read by other jobs
        (self.tmp / "spill").mkdir()
        self._spill: dict[int, Spill] = {}
        self.n_records = 0
        self.real_tokens = 0
        # the reference: the input's token ids (at the stored width) as one plain zstd stream, same level, no
        # dictionary, compressed as the records arrive, in input order
        self.input_token_bytes = 0
        self._plain = zstd.ZstdCompressor(level=zstd_level).compressobj()
        self._plain_bytes = 0
        self._closed = False
        self._local = threading.local()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    @property
    def per_token_bytes(self) -> int:
        return self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1

    def _record_bytes(self, lens: np.ndarray) -> np.ndarray:
        """Decompressed bytes of each record of ``lens`` tokens (a record kind with fixed-size parts adds them)."""
        return lens.astype(np.int64) * self.per_token_bytes

    def add(self, tokens: np.ndarray, loss_mask: np.ndarray | None = None,
            position_ids: np.ndarray | None = None) -> None:
        """Append one record (1-D arrays of equal length, 1..max_len tokens)."""
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        n = len(tokens)
        if not 1 <= n <= self.max_len:
            raise ValueError(f"record {self.n_records}: length {n}, expected 1..{self.max_len}")
        if int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"record {self.n_records}: token id {int(tokens.max())} >= vocab_size {self.vocab_size}")
        if int(tokens.min()) < 0:
            raise ValueError(f"record {self.n_records}: negative token id {int(tokens.min())}")
        if loss_mask is None:
            loss_mask = np.ones(n, np.uint8)
        if position_ids is None:
            position_ids = np.arange(n)
        if len(loss_mask) != n or len(position_ids) != n:
            raise ValueError(f"record {self.n_records}: tokens, loss_mask and position_ids differ in length "
                             f"({n}, {len(loss_mask)}, {len(position_ids)})")
        blen = bucket_length(n, self.bucket_width, self.max_len)
        spill = self._spill.get(blen)
        if spill is None:
            spill = self._spill[blen] = Spill(self.tmp / "spill", blen)
        ft, fp, fm = spill.files
        tok = np.ascontiguousarray(tokens, self.tok_dtype)
        ft.write(tok.data)
        self.input_token_bytes += tok.nbytes
        self._plain_bytes += len(self._plain.compress(tok.data))
        fp.write(np.ascontiguousarray(position_ids, self.pos_dtype).data)
        fm.write(np.ascontiguousarray(loss_mask, np.uint8).data)
        spill.lengths.append(n)
        self.n_records += 1
        self.real_tokens += n

    # -- close: dictionaries, frames, index, manifest
    def _frames_of(self, lens: np.ndarray) -> list[tuple[int, int]]:
        """Split a bucket's records into frames: (first record, record count).

        Greedy up to ``frame_bytes``; a record larger than that is a frame of its
        own. A last frame under ``MIN_FRAME_BYTES`` is merged into the one
        before it, or, when the two together exceed ``MAX_FRAME_BYTES``, the two
        are split in halves, so only a bucket smaller than ``MIN_FRAME_BYTES``
        has a frame under it.
        """
        sizes = self._record_bytes(lens)
        frames, first, size = [], 0, 0
        for i, n in enumerate(sizes.tolist()):
            if size and size + n > self.frame_bytes:
                frames.append((first, i - first))
                first, size = i, 0
            size += n
        if len(lens) > first:
            frames.append((first, len(lens) - first))
        if len(frames) >= 2:
            (f1, n1), (f2, n2) = frames[-2], frames[-1]
            rec_bytes = sizes[f1:f2 + n2]
            if int(rec_bytes[n1:].sum()) < MIN_FRAME_BYTES:
                if int(rec_bytes.sum()) <= MAX_FRAME_BYTES:
                    frames[-2:] = [(f1, n1 + n2)]
                else:
                    cum = np.cumsum(rec_bytes)
                    k = int(np.searchsorted(cum, cum[-1] / 2)) + 1
                    k = min(max(k, 1), n1 + n2 - 1)
                    frames[-2:] = [(f1, k), (f1 + k, n1 + n2 - k)]
        return frames

    def _dict_samples(self, cols: tuple, offs: np.ndarray) -> list[bytes]:
        """Samples shaped like frame columns, evenly spread over the bucket, ~100x the dictionary size."""
        budget = _SAMPLES_PER_DICT_BYTE * self.dict_size
        n_rec = len(offs) - 1
        step = max(1, int(offs[-1]) * self.per_token_bytes // budget)
        samples, used = [], 0
        for i in range(0, n_rec, step):
            a, b = int(offs[i]), int(offs[i + 1])
            for col in cols:
                s = col[a:b].tobytes()
                samples.append(s)
                used += len(s)
            if used >= budget:
                break
        return samples

    def _train(self, samples: list[bytes]) -> zstd.ZstdCompressionDict | None:
        if sum(len(s) for s in samples) < 8 * 1024 or len(samples) < 8:
            return None  # too little data to train on: frames are compressed without a dictionary
        try:
            d = zstd.train_dictionary(self.dict_size, samples, k=_DICT_K, d=_DICT_D, level=self.level)
        except zstd.ZstdError:
            return None
        d.precompute_compress(level=self.level)
        return d

    def _prepare_bucket(self, args: tuple[int, int]) -> Bucket:
        """Map a bucket's spilled columns, plan its frames and train its dictionary (in a worker thread)."""
        bi, blen = args
        spill = self._spill[blen]
        lens = np.asarray(spill.lengths, np.int64)
        offs = np.concatenate([[0], np.cumsum(lens)])
        cols = tuple(np.memmap(p, dt, "r") for p, dt in zip(spill.paths, (self.tok_dtype, self.pos_dtype, np.uint8)))
        samples = self._dict_samples(cols, offs)
        d = self._train(samples)
        dict_id = bi if d is not None else -1
        if d is not None:
            with open(self.tmp / "dicts" / f"{dict_id}.zdict", "wb") as fh:
                fh.write(d.as_bytes())
                fh.flush()
                os.fsync(fh.fileno())
        return Bucket(bi, blen, lens, offs, cols, self._frames_of(lens), d, dict_id,
                      samples if self.compare_baselines else None)

    def _compressor(self, key, dict_data) -> zstd.ZstdCompressor:
        """A per-thread compressor (zstd contexts must not be shared between threads)."""
        cache = getattr(self._local, "cctx", None)
        if cache is None:
            cache = self._local.cctx = {}
        c = cache.get(key)
        if c is None:
            c = cache[key] = zstd.ZstdCompressor(level=self.level, dict_data=dict_data,
                                                 write_content_size=True, write_checksum=True)
        return c

    def _compress_frame(self, task: tuple[Bucket, tuple[int, int]]) -> tuple[bytes, int]:
        b, (first, n) = task
        payload = b.payload(first, n)
        return self._compressor(("bucket", b.index), b.dict).compress(payload), len(payload)

    def abort(self) -> None:
        """Remove the temporary directory; ``out_dir`` is left as it was."""
        for s in self._spill.values():
            s.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._closed = True

    def close(self, extra_manifest: dict | None = None, *,
              on_manifest: Callable[[dict], None] | None = None,
              progress: Callable[[str, int, int], None] | None = None) -> dict:
        """Finish the directory and rename it into place; returns the manifest.

        ``extra_manifest`` is merged into the manifest; ``on_manifest(manifest)``
        is called just before the manifest is written (after compression), so a
        caller can add end-to-end figures such as elapsed time.
        ``progress(stage, done, total)`` is called after each frame of the
        stages ``"compress"`` and ``"baselines"``.
        """
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        self._progress = progress or (lambda stage, done, total: None)
        try:
            return self._close(extra_manifest or {}, on_manifest)
        except BaseException:
            self.abort()
            raise

    def _close(self, extra: dict, on_manifest) -> dict:
        if self.n_records == 0:
            raise ValueError("no records: the input held no usable documents")
        for s in self._spill.values():
            s.close()
        (self.tmp / "dicts").mkdir()
        (self.tmp / "data").mkdir()
        # cancel_futures: on an error or Ctrl-C, queued frames are dropped, not compressed first
        pool = ThreadPoolExecutor(self.num_workers)
        try:
            t0 = time.perf_counter()
            buckets = list(ordered_buckets(pool, self._prepare_bucket, enumerate(sorted(self._spill)),
                                           self.num_workers))
            t1 = time.perf_counter()
            self._write_frames(pool, buckets)
            t2 = time.perf_counter()
            baselines = self._baselines(pool, buckets) if self.compare_baselines else {}
            t3 = time.perf_counter()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        timing = {"train_dicts": round(t1 - t0, 3), "compress": round(t2 - t1, 3), "baselines": round(t3 - t2, 3)}
        for b in buckets:
            b.cols = ()
        shutil.rmtree(self.tmp / "spill")
        self._write_index(buckets)
        manifest = self._manifest(buckets, baselines, timing, extra)
        if on_manifest is not None:
            on_manifest(manifest)
        write_json(self.tmp / MANIFEST_NAME, manifest)
        for sub in ("data", "dicts", "."):  # data and dictionaries are durable before the rename publishes them
            fsync_dir(self.tmp / sub)
        move_into_place(self.tmp, self.out_dir)
        fsync_dir(self.out_dir.parent)
        self._closed = True
        return manifest

    def _write_frames(self, pool: ThreadPoolExecutor, buckets: list[Bucket]) -> None:
        """Compress every frame (in parallel, bounded) and append it to its bucket's data file, in order."""
        tasks = [(b, f) for b in buckets for f in b.frames]
        fh, cur = None, None
        try:
            for i, ((b, (first, n)), (comp, dlen)) in enumerate(zip(tasks, ordered_buckets(
                    pool, self._compress_frame, tasks, 2 * self.num_workers))):
                self._progress("compress", i, len(tasks))
                if b is not cur:
                    if fh is not None:
                        close_synced(fh)
                    fh, cur, off = open(self.tmp / "data" / f"b{b.length}.lbd", "wb"), b, 0
                    b.written = []
                fh.write(comp)
                b.written.append((off, len(comp), dlen, first, n, xxhash.xxh3_64_intdigest(comp)))
                off += len(comp)
                b.compressed_bytes += len(comp)
                b.raw_bytes += dlen
            self._progress("compress", len(tasks), len(tasks))
            if fh is not None:
                close_synced(fh)
                fh = None
        finally:
            if fh is not None:
                fh.close()

    def _write_index(self, buckets: list[Bucket]) -> None:
        nf = [len(b.written) for b in buckets]
        fr = np.array([f for b in buckets for f in b.written], dtype=np.uint64).reshape(-1, 6)
        first_frame = np.cumsum([0] + nf)[:-1]
        rec_base = np.cumsum([0] + [len(b.lens) for b in buckets])[:-1]
        rec_off = [np.concatenate([b.offs[f:f + n] - b.offs[f] for f, n in b.frames]) for b in buckets]
        cols = {
            "bucket.length": np.array([b.length for b in buckets], np.uint32),
            "bucket.dict": np.array([b.dict_id for b in buckets], np.int32),
            "bucket.frame0": first_frame.astype(np.uint64),
            "bucket.nframes": np.array(nf, np.uint64),
            "frame.bucket": np.repeat(np.arange(len(buckets), dtype=np.uint32), nf),
            "frame.offset": fr[:, 0].astype(np.uint64),
            "frame.clen": fr[:, 1].astype(np.uint32),
            "frame.dlen": fr[:, 2].astype(np.uint32),
            "frame.first_rec": (fr[:, 3] + np.repeat(rec_base, nf).astype(np.uint64)).astype(np.uint64),
            "frame.n_rec": fr[:, 4].astype(np.uint32),
            "frame.xxh3": fr[:, 5].astype(np.uint64),
            "rec.offset": np.concatenate(rec_off).astype(np.uint32),
            "rec.length": np.concatenate([b.lens for b in buckets]).astype(np.uint32),
        }
        write_index(self.tmp / INDEX_NAME, cols, **self._index_header(buckets))

    def _index_header(self, buckets: list[Bucket]) -> dict:
        """The index header's fields (``write_index``'s keyword arguments); a record kind adds its own."""
        return {"tok_itemsize": self.tok_dtype.itemsize, "pos_itemsize": self.pos_dtype.itemsize,
                "bucket_width": self.bucket_width, "vocab_size": self.vocab_size,
                "n_dicts": sum(b.dict_id >= 0 for b in buckets)}

    def _manifest(self, buckets: list[Bucket], baselines: dict, timing: dict, extra: dict) -> dict:
        rows = []
        padded_total = 0
        for b in buckets:
            n = len(b.lens)
            padded = n * b.length
            padded_total += padded
            real = int(b.lens.sum())
            rows.append({"length": b.length, "records": n, "frames": len(b.written),
                         "real_tokens": real, "padded_tokens": padded,
                         "padding_ratio": round(1 - real / padded, 6),
                         "raw_bytes": b.raw_bytes, "compressed_bytes": b.compressed_bytes,
                         "dict_id": b.dict_id})
        raw = sum(b.raw_bytes for b in buckets)
        comp = sum(b.compressed_bytes for b in buckets)
        dicts = sum((self.tmp / "dicts" / f"{b.dict_id}.zdict").stat().st_size for b in buckets if b.dict_id >= 0)
        plain = self._plain_bytes + len(self._plain.flush())
        stored = comp + dicts
        compression = {
            "level": self.level, "frame_bytes": self.frame_bytes, "dict_size": self.dict_size,
            # the ratio: the input's own bytes (its token ids, stored width) over what stores them on disk
            "ratio": round(self.input_token_bytes / stored, 4),
            "ratio_meaning": "input_token_bytes / stored_bytes (data files + dictionaries); the ratio_* keys "
                             "below are record payloads (tokens, positions, mask) over frames, dictionaries "
                             "not counted",
            "input_token_bytes": self.input_token_bytes, "input_token_dtype": self.tok_dtype.name,
            "data_bytes": comp, "dict_bytes": dicts, "stored_bytes": stored,
            "index_bytes": (self.tmp / INDEX_NAME).stat().st_size,
            "plain_zstd_bytes": plain, "ratio_plain_zstd": round(self.input_token_bytes / plain, 4),
            "stored_vs_plain_zstd": round(stored / plain, 4),
            "raw_bytes": raw, "per_bucket_dict_bytes": comp,
            "ratio_per_bucket_dict": round(raw / comp, 4), **baselines}
        checksums = {"index_xxh3": file_xxh3(self.tmp / INDEX_NAME),
                     "dicts": {str(b.dict_id): file_xxh3(self.tmp / "dicts" / f"{b.dict_id}.zdict")
                               for b in buckets if b.dict_id >= 0}}
        return {
            "format": "loongbin", "version": FORMAT_VERSION, "complete": True,
            "vocab_size": self.vocab_size, "token_dtype": self.tok_dtype.name,
            "bucket_width": self.bucket_width, "max_len": self.max_len,
            "records": self.n_records, "real_tokens": self.real_tokens,
            "padded_tokens": padded_total,
            "padding_ratio": round(1 - self.real_tokens / padded_total, 6),
            "buckets": rows, "compression": compression, "checksums": checksums,
            "writer_seconds": timing, **extra,
        }

    def _baselines(self, pool: ThreadPoolExecutor, buckets: list[Bucket]) -> dict:
        """Same frames with one global dictionary and with none; and the whole payload as one zstd stream."""
        samples = [s for b in buckets for s in (b.samples or [])]
        gdict = self._train(samples[:: max(1, len(samples) // _GLOBAL_DICT_MAX_SAMPLES)])

        def both(task):
            b, (first, n) = task
            payload = b.payload(first, n)
            g = len(self._compressor("global", gdict).compress(payload))
            none = len(self._compressor("none", None).compress(payload))
            return payload, g, none

        whole = zstd.ZstdCompressor(level=self.level).compressobj()
        g = n = w = 0
        tasks = [(b, f) for b in buckets for f in b.frames]
        for i, (payload, gl, nl) in enumerate(ordered_buckets(pool, both, tasks, 2 * self.num_workers)):
            self._progress("baselines", i, len(tasks))
            g += gl
            n += nl
            w += len(whole.compress(payload))  # in this thread, overlapping the pool's work
        w += len(whole.flush())
        self._progress("baselines", len(tasks), len(tasks))
        raw = sum(b.raw_bytes for b in buckets)
        comp = sum(b.compressed_bytes for b in buckets)
        return {"global_dict_bytes": g, "no_dict_bytes": n, "whole_file_bytes": w,
                "ratio_global_dict": round(raw / g, 4), "ratio_no_dict": round(raw / n, 4),
                "ratio_whole_file": round(raw / w, 4),
                "per_bucket_dict_vs_whole_file": round(w / comp, 4)}
