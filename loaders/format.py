"""The loongbin shard format: tokenized records bucketed by length, zstd frames
compressed with one dictionary per bucket, and an mmap-able index.

A record is one training sample: token ids, a loss mask (1 where the token is a
real prediction target) and position ids (they restart at every document, so a
record may pack several short documents). Records are grouped by *bucket*: the
record's length rounded up to a multiple of the bucket width (capped at the
maximum length); a batch is made of records of one bucket, padded to the
bucket's length, so padding waste is bounded by the bucket width.

Directory layout (``DIR`` is what ``python -m loaders.preprocess`` writes)::

    DIR/manifest.json         summary (counts, padding, compression); written last
    DIR/index.lbx             the index, described below
    DIR/dicts/<id>.zdict      zstd dictionary <id> (one per bucket)
    DIR/data/b<len>.lbd       the compressed frames of the bucket of length <len>

A directory is complete only when ``manifest.json`` exists and says
``"complete": true``; the writer builds everything in a sibling temporary
directory and renames it into place, so a crash never leaves a ``DIR`` that
reads as complete.

Frames
    A frame holds several consecutive records of one bucket, 64 KiB to 1 MiB
    decompressed (``frame_bytes``, 256 KiB by default; one record larger than
    that is a frame of its own). Decompressed, a frame of ``n`` tokens is three
    columns back to back: ``tokens[n]`` (uint16 when the vocabulary has fewer than
    65,536 ids, else uint32), ``position_ids[n]`` (uint16 when the maximum length
    is at most 65,536, else uint32) and ``loss_mask[n]`` (uint8). Each frame is
    one zstd frame (content size stored) compressed with its bucket's
    dictionary. Columns compress better than interleaved records: each one is
    homogeneous.

Index file ``index.lbx`` (little-endian)
    A 128-byte header::

        offset size field
        0      8    magic  b"LBINDEX\\0"
        8      4    u32 format version (this module writes and reads 1)
        12     4    u32 token itemsize (2 = uint16, 4 = uint32)
        16     4    u32 position itemsize (2 or 4)
        20     4    u32 bucket width
        24     8    u64 vocabulary size
        32     4    u32 number of buckets
        36     4    u32 number of dictionaries
        40     8    u64 number of frames
        48     8    u64 number of records
        56     4    u32 number of columns in the column directory
        60     4    u32 crc32 of bytes 0..59
        64     64   reserved (zero)

    then the column directory: one 32-byte entry per column (``16s`` name,
    ``u32`` numpy dtype code (see ``_DTYPES``), ``u32`` reserved, ``u64`` byte
    offset of the column in the file), and then the columns themselves, each
    aligned to 64 bytes, readable with ``np.memmap``. Columns:

    =====================  ==========  ==========================================
    column                 rows        meaning
    =====================  ==========  ==========================================
    ``bucket.length``      buckets     padded length of the bucket
    ``bucket.dict``        buckets     dictionary id of the bucket (-1: none)
    ``bucket.frame0``      buckets     first frame of the bucket
    ``bucket.nframes``     buckets     frames in the bucket
    ``frame.bucket``       frames      bucket index of the frame
    ``frame.offset``       frames      byte offset in the bucket's data file
    ``frame.clen``         frames      compressed length in bytes
    ``frame.dlen``         frames      decompressed length in bytes
    ``frame.first_rec``    frames      index of the frame's first record
    ``frame.n_rec``        frames      records in the frame
    ``frame.xxh3``         frames      xxh3-64 of the compressed bytes
    ``rec.offset``         records     token offset of the record in its frame
    ``rec.length``         records     real tokens of the record
    =====================  ==========  ==========================================

    A frame's dictionary is its bucket's. Records are numbered bucket by
    bucket, frame by frame, so ``frame.first_rec`` ranges are contiguous.

Versioning: a reader refuses an index whose version is newer than it knows,
with a message that says to upgrade; older versions are read or refused
explicitly, never guessed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import xxhash
import zstandard as zstd

__all__ = [
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "ShardFormatError",
    "ShardWriter",
    "ShardSet",
    "Frame",
    "bucket_length",
    "token_dtype_for",
    "position_dtype_for",
]

FORMAT_VERSION = 1
MAGIC = b"LBINDEX\x00"
INDEX_NAME = "index.lbx"
MANIFEST_NAME = "manifest.json"
_HEADER = struct.Struct("<8sIIIIQIIQQI")  # up to the crc, 60 bytes
_HEADER_SIZE = 128
_COLDIR = struct.Struct("<16sIIQ")
_ALIGN = 64
# numpy dtype codes stored in the column directory
_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8"),
           14: np.dtype("<i4"), 18: np.dtype("<i8")}
_DTYPE_CODES = {v: k for k, v in _DTYPES.items()}

# 256 KiB decompressed per frame: large enough that zstd reaches ~whole-file
# ratios and per-frame overhead (a read, a checksum, a context) is amortised
# over ~25 records of 2,048 tokens; small enough for cheap random access.
DEFAULT_FRAME_BYTES = 256 * 1024
MIN_FRAME_BYTES, MAX_FRAME_BYTES = 64 * 1024, 1024 * 1024


class ShardFormatError(ValueError):
    """A shard directory is missing, incomplete, corrupt or of an unknown version."""


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab < 65,536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def position_dtype_for(max_len: int) -> np.dtype:
    return np.dtype("<u2") if max_len <= 65536 else np.dtype("<u4")


def bucket_length(length: int, width: int, max_len: int) -> int:
    """The padded length of a record: ``length`` rounded up to ``width``, capped at ``max_len``."""
    return min(max_len, -(-length // width) * width)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class Frame:
    """One decoded frame: flat columns plus each record's slice."""

    tokens: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    rec_offset: np.ndarray
    rec_length: np.ndarray

    def record(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = int(self.rec_offset[i])
        b = a + int(self.rec_length[i])
        return self.tokens[a:b], self.position_ids[a:b], self.loss_mask[a:b]


# --------------------------------------------------------------------------- writer


class ShardWriter:
    """Buckets records, trains one dictionary per bucket, writes frames and the index.

    Records are spilled to per-bucket raw files in the temporary directory as
    they arrive (memory stays flat on large inputs); ``close()`` trains the
    dictionaries, compresses the frames (``num_workers`` threads: zstd releases
    the GIL), writes the index and the manifest, and renames the directory into
    place. ``abort()`` (or an exception inside a ``with`` block) removes it.
    """

    def __init__(self, out_dir: str | os.PathLike, *, vocab_size: int, bucket_width: int,
                 max_len: int, zstd_level: int = 12, dict_size: int = 112640,
                 frame_bytes: int = DEFAULT_FRAME_BYTES, num_workers: int = 1,
                 overwrite: bool = False, compare_baselines: bool = True) -> None:
        if not MIN_FRAME_BYTES <= frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError(f"frame_bytes={frame_bytes}: expected {MIN_FRAME_BYTES}..{MAX_FRAME_BYTES}")
        if bucket_width < 1 or max_len < 1:
            raise ValueError(f"bucket_width={bucket_width}, max_len={max_len}: expected positive integers")
        if not 1 <= zstd_level <= 22:
            raise ValueError(f"zstd_level={zstd_level}: expected 1..22")
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not overwrite:
            raise FileExistsError(f"{self.out_dir}: already exists (pass overwrite=True / --overwrite to replace it)")
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
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.partial-", dir=self.out_dir.parent))
        (self.tmp / "spill").mkdir()
        self._spill: dict[int, tuple[object, list[int]]] = {}
        self.n_records = 0
        self.real_tokens = 0
        self._closed = False

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    def add(self, tokens: np.ndarray, loss_mask: np.ndarray | None = None,
            position_ids: np.ndarray | None = None) -> None:
        """Append one record (1-D arrays of equal length, 1..max_len tokens)."""
        n = len(tokens)
        if not 1 <= n <= self.max_len:
            raise ValueError(f"record {self.n_records}: length {n}, expected 1..{self.max_len}")
        if n and int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"record {self.n_records}: token id {int(tokens.max())} >= vocab_size {self.vocab_size}")
        if n and int(tokens.min()) < 0:
            raise ValueError(f"record {self.n_records}: negative token id {int(tokens.min())}")
        if loss_mask is None:
            loss_mask = np.ones(n, np.uint8)
        if position_ids is None:
            position_ids = np.arange(n)
        if len(loss_mask) != n or len(position_ids) != n:
            raise ValueError(f"record {self.n_records}: tokens, loss_mask and position_ids differ in length "
                             f"({n}, {len(loss_mask)}, {len(position_ids)})")
        blen = bucket_length(n, self.bucket_width, self.max_len)
        if blen not in self._spill:
            self._spill[blen] = (open(self.tmp / "spill" / f"{blen}.raw", "wb"), [])
        fh, lengths = self._spill[blen]
        fh.write(np.ascontiguousarray(tokens, self.tok_dtype).tobytes())
        fh.write(np.ascontiguousarray(position_ids, self.pos_dtype).tobytes())
        fh.write(np.ascontiguousarray(loss_mask, np.uint8).tobytes())
        lengths.append(n)
        self.n_records += 1
        self.real_tokens += n

    # -- close: dictionaries, frames, index, manifest
    def _bucket_records(self, blen: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Read back one bucket's spill: flat tokens, positions, masks and lengths."""
        _, lengths = self._spill[blen]
        raw = np.fromfile(self.tmp / "spill" / f"{blen}.raw", np.uint8)
        lens = np.asarray(lengths, np.int64)
        per_tok = self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1
        ends = np.cumsum(lens * per_tok)
        starts = ends - lens * per_tok
        tok = np.empty(int(lens.sum()), self.tok_dtype)
        pos = np.empty(int(lens.sum()), self.pos_dtype)
        mask = np.empty(int(lens.sum()), np.uint8)
        t = 0
        ti, pi = self.tok_dtype.itemsize, self.pos_dtype.itemsize
        for s, n in zip(starts.tolist(), lens.tolist()):
            tok[t:t + n] = raw[s:s + n * ti].view(self.tok_dtype)
            pos[t:t + n] = raw[s + n * ti:s + n * (ti + pi)].view(self.pos_dtype)
            mask[t:t + n] = raw[s + n * (ti + pi):s + n * per_tok]
            t += n
        return tok, pos, mask, lens

    def _frames_of(self, lens: np.ndarray) -> list[tuple[int, int]]:
        """Split a bucket's records into frames: (first record, record count)."""
        per_tok = self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1
        frames, first, size = [], 0, 0
        for i, n in enumerate(lens.tolist()):
            if size and size + n * per_tok > self.frame_bytes:
                frames.append((first, i - first))
                first, size = i, 0
            size += n * per_tok
        if len(lens) > first:
            frames.append((first, len(lens) - first))
        return frames

    @staticmethod
    def _frame_payload(tok, pos, mask, a: int, b: int) -> bytes:
        return tok[a:b].tobytes() + pos[a:b].tobytes() + mask[a:b].tobytes()

    def _dict_samples(self, tok, pos, mask, lens) -> list[bytes]:
        """Samples shaped like frame columns, capped at ~100x the dictionary size."""
        budget = 100 * self.dict_size
        samples, used = [], 0
        offs = np.concatenate([[0], np.cumsum(lens)])
        step = max(1, int(offs[-1] * (self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1) // budget))
        for i in range(0, len(lens), step):
            a, b = int(offs[i]), int(offs[i + 1])
            for col in (tok[a:b], pos[a:b], mask[a:b]):
                s = col.tobytes()
                samples.append(s)
                used += len(s)
            if used >= budget:
                break
        return samples

    def _train(self, samples: list[bytes]) -> zstd.ZstdCompressionDict | None:
        if sum(len(s) for s in samples) < 8 * 1024 or len(samples) < 8:
            return None  # too little data to train on: frames are compressed without a dictionary
        try:
            return zstd.train_dictionary(self.dict_size, samples, level=self.level)
        except zstd.ZstdError:
            return None

    def _compress_bucket(self, bi: int, blen: int) -> dict:
        tok, pos, mask, lens = self._bucket_records(blen)
        samples = self._dict_samples(tok, pos, mask, lens)
        d = self._train(samples)
        dict_id = bi if d is not None else -1
        if d is not None:
            (self.tmp / "dicts" / f"{dict_id}.zdict").write_bytes(d.as_bytes())
        cctx = zstd.ZstdCompressor(level=self.level, dict_data=d, write_content_size=True)
        offs = np.concatenate([[0], np.cumsum(lens)])
        frames = []
        cbytes = raw_bytes = 0
        with open(self.tmp / "data" / f"b{blen}.lbd", "wb") as fh:
            off = 0
            for first, n in self._frames_of(lens):
                payload = self._frame_payload(tok, pos, mask, int(offs[first]), int(offs[first + n]))
                comp = cctx.compress(payload)
                fh.write(comp)
                frames.append((off, len(comp), len(payload), first, n, xxhash.xxh3_64_intdigest(comp)))
                off += len(comp)
                cbytes += len(comp)
                raw_bytes += len(payload)
        (self.tmp / "spill" / f"{blen}.raw").unlink()
        rec_off = np.concatenate([offs[f:f + n] - offs[f] for f, n in self._frames_of(lens)])
        return {"length": blen, "dict_id": dict_id, "frames": frames, "rec_offset": rec_off,
                "rec_length": lens, "compressed_bytes": cbytes, "raw_bytes": raw_bytes,
                "real_tokens": int(lens.sum()),
                "samples": samples if self.compare_baselines else None}

    def abort(self) -> None:
        for fh, _ in self._spill.values():
            fh.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._closed = True

    def close(self, extra_manifest: dict | None = None) -> dict:
        """Finish the directory and rename it into place; returns the manifest."""
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        try:
            return self._close(extra_manifest or {})
        except BaseException:
            self.abort()
            raise

    def _close(self, extra: dict) -> dict:
        if self.n_records == 0:
            raise ValueError("no records: the input held no usable documents")
        for fh, _ in self._spill.values():
            fh.close()
        (self.tmp / "dicts").mkdir()
        (self.tmp / "data").mkdir()
        blens = sorted(self._spill)
        with ThreadPoolExecutor(self.num_workers) as pool:
            results = list(pool.map(lambda a: self._compress_bucket(*a), enumerate(blens)))
        (self.tmp / "spill").rmdir()
        self._write_index(results)
        manifest = self._manifest(results, extra)
        _write_json_atomic(self.tmp / MANIFEST_NAME, manifest)
        _fsync_dir(self.tmp)
        if self.out_dir.exists():  # overwrite: move the old one aside first, delete it after
            old = self.out_dir.with_name(f".{self.out_dir.name}.old-{os.getpid()}")
            os.rename(self.out_dir, old)
            os.rename(self.tmp, self.out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.out_dir)
        _fsync_dir(self.out_dir.parent)
        self._closed = True
        return manifest

    def _write_index(self, results: list[dict]) -> None:
        frames = [f for r in results for f in r["frames"]]
        n_frames = len(frames)
        fr = np.array(frames, dtype=np.uint64).reshape(n_frames, 6)
        first_frame = np.cumsum([0] + [len(r["frames"]) for r in results])[:-1]
        rec_base = np.cumsum([0] + [len(r["rec_length"]) for r in results])[:-1]
        frame_bucket = np.concatenate([np.full(len(r["frames"]), i, np.uint32) for i, r in enumerate(results)])
        frame_first_rec = fr[:, 3] + np.repeat(rec_base, [len(r["frames"]) for r in results]).astype(np.uint64)
        cols = {
            "bucket.length": np.array([r["length"] for r in results], np.uint32),
            "bucket.dict": np.array([r["dict_id"] for r in results], np.int32),
            "bucket.frame0": first_frame.astype(np.uint64),
            "bucket.nframes": np.array([len(r["frames"]) for r in results], np.uint64),
            "frame.bucket": frame_bucket,
            "frame.offset": fr[:, 0].astype(np.uint64),
            "frame.clen": fr[:, 1].astype(np.uint32),
            "frame.dlen": fr[:, 2].astype(np.uint32),
            "frame.first_rec": frame_first_rec.astype(np.uint64),
            "frame.n_rec": fr[:, 4].astype(np.uint32),
            "frame.xxh3": fr[:, 5].astype(np.uint64),
            "rec.offset": np.concatenate([r["rec_offset"] for r in results]).astype(np.uint32),
            "rec.length": np.concatenate([r["rec_length"] for r in results]).astype(np.uint32),
        }
        write_index(self.tmp / INDEX_NAME, cols, tok_itemsize=self.tok_dtype.itemsize,
                    pos_itemsize=self.pos_dtype.itemsize, bucket_width=self.bucket_width,
                    vocab_size=self.vocab_size, n_dicts=sum(r["dict_id"] >= 0 for r in results))

    def _manifest(self, results: list[dict], extra: dict) -> dict:
        buckets = []
        padded_total = 0
        for r in results:
            n = len(r["rec_length"])
            padded = n * r["length"]
            padded_total += padded
            buckets.append({"length": r["length"], "records": n, "frames": len(r["frames"]),
                            "real_tokens": r["real_tokens"], "padded_tokens": padded,
                            "padding_ratio": round(1 - r["real_tokens"] / padded, 6),
                            "raw_bytes": r["raw_bytes"], "compressed_bytes": r["compressed_bytes"],
                            "dict_id": r["dict_id"]})
        raw = sum(r["raw_bytes"] for r in results)
        comp = sum(r["compressed_bytes"] for r in results)
        compression = {"level": self.level, "frame_bytes": self.frame_bytes, "dict_size": self.dict_size,
                       "raw_bytes": raw, "per_bucket_dict_bytes": comp,
                       "ratio_per_bucket_dict": round(raw / comp, 4)}
        if self.compare_baselines:
            compression.update(self._baselines(results))
        return {
            "format": "loongbin", "version": FORMAT_VERSION, "complete": True,
            "vocab_size": self.vocab_size, "token_dtype": self.tok_dtype.name,
            "bucket_width": self.bucket_width, "max_len": self.max_len,
            "records": self.n_records, "real_tokens": self.real_tokens,
            "padded_tokens": padded_total,
            "padding_ratio": round(1 - self.real_tokens / padded_total, 6),
            "buckets": buckets, "compression": compression, **extra,
        }

    def _baselines(self, results: list[dict]) -> dict:
        """Same frames, one global dictionary and no dictionary; and the whole payload as one zstd stream."""
        samples = [s for r in results for s in (r["samples"] or [])]
        gdict = self._train(samples[:: max(1, len(samples) // 20000)])
        c_global = zstd.ZstdCompressor(level=self.level, dict_data=gdict)
        c_none = zstd.ZstdCompressor(level=self.level)
        whole = zstd.ZstdCompressor(level=self.level).compressobj()
        g = n = w = 0
        for r in results:
            data = (self.tmp / "data" / f"b{r['length']}.lbd").read_bytes()
            dctx = _decompressor(self.tmp, r["dict_id"])
            for off, clen, *_ in r["frames"]:
                payload = dctx.decompress(data[off:off + clen])
                g += len(c_global.compress(payload))
                n += len(c_none.compress(payload))
                w += len(whole.compress(payload))
        w += len(whole.flush())
        raw = sum(r["raw_bytes"] for r in results)
        comp = sum(r["compressed_bytes"] for r in results)
        return {"global_dict_bytes": g, "no_dict_bytes": n, "whole_file_bytes": w,
                "ratio_global_dict": round(raw / g, 4), "ratio_no_dict": round(raw / n, 4),
                "ratio_whole_file": round(raw / w, 4),
                "per_bucket_dict_vs_whole_file": round(w / comp, 4)}


def write_index(path: Path, cols: dict[str, np.ndarray], *, tok_itemsize: int, pos_itemsize: int,
                bucket_width: int, vocab_size: int, n_dicts: int, version: int = FORMAT_VERSION) -> None:
    """Write the index file: header, column directory, aligned columns."""
    n_buckets = len(cols["bucket.length"])
    n_frames = len(cols["frame.offset"])
    n_records = len(cols["rec.length"])
    head = _HEADER.pack(MAGIC, version, tok_itemsize, pos_itemsize, bucket_width, vocab_size,
                        n_buckets, n_dicts, n_frames, n_records, len(cols))
    head += struct.pack("<I", zlib.crc32(head))
    head = head.ljust(_HEADER_SIZE, b"\0")
    pos = _align(_HEADER_SIZE + _COLDIR.size * len(cols))
    directory, blobs = b"", []
    for name, arr in cols.items():
        assert len(name.encode()) <= 16, f"column name {name!r} longer than 16 bytes"
        arr = np.ascontiguousarray(arr)
        directory += _COLDIR.pack(name.encode(), _DTYPE_CODES[arr.dtype.newbyteorder("<")], 0, pos)
        blobs.append((pos, arr.astype(arr.dtype.newbyteorder("<")).tobytes()))
        pos = _align(pos + arr.nbytes)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(head + directory)
        for off, blob in blobs:
            fh.seek(off)
            fh.write(blob)
        fh.truncate(max(pos, fh.tell()))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _decompressor(root: Path, dict_id: int) -> zstd.ZstdDecompressor:
    if dict_id < 0:
        return zstd.ZstdDecompressor()
    path = root / "dicts" / f"{dict_id}.zdict"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ShardFormatError(f"{path}: zstd dictionary {dict_id} is missing") from None
    return zstd.ZstdDecompressor(dict_data=zstd.ZstdCompressionDict(data))


# --------------------------------------------------------------------------- reader


class ShardSet:
    """A complete shard directory, opened for random access by frame.

    The index columns are memory-mapped numpy arrays (``self.col("frame.offset")``
    and friends, or the attributes below). Decompressors are per thread, so
    ``decode_frame`` may be called from several threads at once.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        mpath = self.root / MANIFEST_NAME
        if not self.root.is_dir():
            raise ShardFormatError(f"{self.root}: not a directory (expected a shard directory written by "
                                   f"`python -m loaders.preprocess`)")
        try:
            self.manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise ShardFormatError(f"{mpath}: missing: the directory is incomplete (an interrupted preprocess?) "
                                   f"or not a shard directory") from None
        except json.JSONDecodeError as e:
            raise ShardFormatError(f"{mpath}: not valid JSON ({e})") from None
        if self.manifest.get("complete") is not True:
            raise ShardFormatError(f"{mpath}: does not say complete=true: the directory is incomplete")
        self._read_index(self.root / INDEX_NAME)
        self._local = threading.local()
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        for d in np.unique(self.bucket_dict):
            if d >= 0 and not (self.root / "dicts" / f"{int(d)}.zdict").is_file():
                raise ShardFormatError(f"{self.root / 'dicts' / f'{int(d)}.zdict'}: zstd dictionary {int(d)} "
                                       f"is missing (needed by bucket(s) "
                                       f"{self.bucket_length[self.bucket_dict == d].tolist()})")
        for L in self.bucket_length.tolist():
            if not self.data_path_for_length(L).is_file():
                raise ShardFormatError(f"{self.data_path_for_length(L)}: data file of bucket {L} is missing")

    def _read_index(self, path: Path) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ShardFormatError(f"{path}: index file is missing") from None
        if size < _HEADER_SIZE:
            raise ShardFormatError(f"{path}: truncated ({size} bytes, the header alone is {_HEADER_SIZE})")
        with open(path, "rb") as fh:
            head = fh.read(_HEADER_SIZE)
        fields = _HEADER.unpack_from(head)
        (magic, version, ti, pi, width, vocab, nb, nd, nf, nr, ncol) = fields
        if magic != MAGIC:
            raise ShardFormatError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}: not a loongbin index")
        if version > FORMAT_VERSION:
            raise ShardFormatError(f"{path}: format version {version} is newer than this reader supports "
                                   f"({FORMAT_VERSION}); upgrade loongforge-workbench to read it")
        if version < 1:
            raise ShardFormatError(f"{path}: format version {version} is not a valid version")
        (crc,) = struct.unpack_from("<I", head, _HEADER.size)
        if crc != zlib.crc32(head[:_HEADER.size]):
            raise ShardFormatError(f"{path}: header checksum mismatch (corrupt index)")
        if ti not in (2, 4) or pi not in (2, 4):
            raise ShardFormatError(f"{path}: token/position itemsize {ti}/{pi}, expected 2 or 4")
        self.version, self.vocab_size, self.bucket_width = version, vocab, width
        self.tok_dtype = np.dtype(f"<u{ti}")
        self.pos_dtype = np.dtype(f"<u{pi}")
        self.n_buckets, self.n_dicts, self.n_frames, self.n_records = nb, nd, nf, nr
        rows = {"bucket": nb, "frame": nf, "rec": nr}
        self._cols: dict[str, np.ndarray] = {}
        with open(path, "rb") as fh:
            fh.seek(_HEADER_SIZE)
            directory = fh.read(_COLDIR.size * ncol)
        if len(directory) < _COLDIR.size * ncol:
            raise ShardFormatError(f"{path}: truncated column directory")
        for i in range(ncol):
            name, code, _, off = _COLDIR.unpack_from(directory, i * _COLDIR.size)
            name = name.rstrip(b"\0").decode()
            if code not in _DTYPES:
                raise ShardFormatError(f"{path}: column {name}: unknown dtype code {code}")
            n = rows.get(name.split(".")[0])
            if n is None:
                raise ShardFormatError(f"{path}: unknown column {name!r}")
            dt = _DTYPES[code]
            if off + n * dt.itemsize > size:
                raise ShardFormatError(f"{path}: truncated: column {name} needs bytes up to "
                                       f"{off + n * dt.itemsize}, the file has {size}")
            self._cols[name] = np.memmap(path, dt, "r", off, (n,)) if n else np.zeros(0, dt)
        for need in ("bucket.length", "bucket.dict", "bucket.frame0", "bucket.nframes", "frame.bucket",
                     "frame.offset", "frame.clen", "frame.dlen", "frame.first_rec", "frame.n_rec",
                     "frame.xxh3", "rec.offset", "rec.length"):
            if need not in self._cols:
                raise ShardFormatError(f"{path}: column {need} is missing")
        c = self._cols
        self.bucket_length, self.bucket_dict = c["bucket.length"], c["bucket.dict"]
        self.bucket_first_frame, self.bucket_n_frames = c["bucket.frame0"], c["bucket.nframes"]
        self.frame_bucket, self.frame_offset = c["frame.bucket"], c["frame.offset"]
        self.frame_clen, self.frame_dlen = c["frame.clen"], c["frame.dlen"]
        self.frame_first_rec, self.frame_n_rec = c["frame.first_rec"], c["frame.n_rec"]
        self.frame_xxh3 = c["frame.xxh3"]
        self.rec_offset, self.rec_length = c["rec.offset"], c["rec.length"]

    def col(self, name: str) -> np.ndarray:
        return self._cols[name]

    # -- paths and file descriptors
    def data_path_for_length(self, length: int) -> Path:
        return self.root / "data" / f"b{length}.lbd"

    def data_path(self, frame: int) -> Path:
        return self.data_path_for_length(int(self.bucket_length[self.frame_bucket[frame]]))

    def fd(self, bucket: int) -> int:
        """An O_RDONLY descriptor of a bucket's data file, opened once and shared."""
        fd = self._fds.get(bucket)
        if fd is None:
            with self._fd_lock:
                fd = self._fds.get(bucket)
                if fd is None:
                    fd = os.open(self.data_path_for_length(int(self.bucket_length[bucket])), os.O_RDONLY)
                    self._fds[bucket] = fd
        return fd

    def close(self) -> None:
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> "ShardSet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read_request(self, frame: int) -> tuple[int, int, int]:
        """(fd, offset, length) of a frame's compressed bytes: what an async reader needs."""
        b = int(self.frame_bucket[frame])
        return self.fd(b), int(self.frame_offset[frame]), int(self.frame_clen[frame])

    def read_frame_bytes(self, frame: int) -> bytes:
        fd, off, n = self.read_request(frame)
        data = os.pread(fd, n, off)
        if len(data) != n:
            raise ShardFormatError(f"{self.data_path(frame)}: frame {frame}: truncated file "
                                   f"(read {len(data)} of {n} bytes at offset {off})")
        return data

    # -- decoding
    def _dctx(self, dict_id: int) -> zstd.ZstdDecompressor:
        cache = getattr(self._local, "dctx", None)
        if cache is None:
            cache = self._local.dctx = {}
        d = cache.get(dict_id)
        if d is None:
            d = cache[dict_id] = _decompressor(self.root, dict_id)
        return d

    def decode_frame(self, frame: int, raw: bytes | bytearray | memoryview) -> Frame:
        """Verify and decompress one frame's bytes; every check names the file and frame."""
        where = f"{self.data_path(frame)}: frame {frame}"
        if len(raw) != int(self.frame_clen[frame]):
            raise ShardFormatError(f"{where}: {len(raw)} bytes, the index says {int(self.frame_clen[frame])} "
                                   f"(truncated file?)")
        if xxhash.xxh3_64_intdigest(raw) != int(self.frame_xxh3[frame]):
            raise ShardFormatError(f"{where}: checksum mismatch (xxh3-64): the frame is corrupt")
        dlen = int(self.frame_dlen[frame])
        bucket = int(self.frame_bucket[frame])
        try:
            payload = self._dctx(int(self.bucket_dict[bucket])).decompress(raw, max_output_size=dlen)
        except zstd.ZstdError as e:
            raise ShardFormatError(f"{where}: zstd error: {e}") from None
        if len(payload) != dlen:
            raise ShardFormatError(f"{where}: decompressed to {len(payload)} bytes, expected {dlen}")
        per_tok = self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1
        if dlen % per_tok:
            raise ShardFormatError(f"{where}: size {dlen} is not a whole number of tokens")
        n = dlen // per_tok
        buf = np.frombuffer(payload, np.uint8)
        a = n * self.tok_dtype.itemsize
        b = a + n * self.pos_dtype.itemsize
        tokens = buf[:a].view(self.tok_dtype)
        first, nrec = int(self.frame_first_rec[frame]), int(self.frame_n_rec[frame])
        rec_offset = np.asarray(self.rec_offset[first:first + nrec], np.int64)
        rec_length = np.asarray(self.rec_length[first:first + nrec], np.int64)
        if nrec == 0 or rec_offset[-1] + rec_length[-1] != n:
            raise ShardFormatError(f"{where}: records do not cover the frame's {n} tokens")
        if n and int(tokens.max()) >= self.vocab_size:
            raise ShardFormatError(f"{where}: token id {int(tokens.max())} >= vocab_size {self.vocab_size}")
        return Frame(tokens, buf[a:b].view(self.pos_dtype), buf[b:], rec_offset, rec_length)

    def load_frame(self, frame: int) -> Frame:
        return self.decode_frame(frame, self.read_frame_bytes(frame))

    def frames_of_bucket(self, bucket: int) -> range:
        a = int(self.bucket_first_frame[bucket])
        return range(a, a + int(self.bucket_n_frames[bucket]))

    def iter_records(self) -> Iterable[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(bucket length, tokens, position ids, loss mask) of every record, in storage order."""
        for f in range(self.n_frames):
            fr = self.load_frame(f)
            L = int(self.bucket_length[self.frame_bucket[f]])
            for i in range(len(fr.rec_length)):
                yield (L, *fr.record(i))


def open_shards(root: str | os.PathLike) -> ShardSet:
    return ShardSet(root)

