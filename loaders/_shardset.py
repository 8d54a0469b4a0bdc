"""``ShardSet``: a complete shard directory opened for random access by frame, checked on open (manifest, index
header and checksum, structure) and on every frame read; ``Frame``, one decoded frame of token records, and
``VLAFrame``, one of vla records.

The format and its integrity layers are described in docs/loaders.md ("The shard format"); import these names
from ``loaders.format``.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import xxhash
import zstandard as zstd

from ._layout import (COLDIR, DTYPES, HEADER, HEADER_EXT, HEADER_EXT_AT, HEADER_EXT_CRC_AT, HEADER_SIZE,
                      ACTION_DTYPE, FORMAT_VERSION, IMAGE_DTYPE, INDEX_NAME, MAGIC, MANIFEST_NAME, RECORD_KINDS,
                      ShardFormatError, align_up, file_xxh3, bucket_length)

# Frames whose index rows are checked per step when a directory is opened (bounds the memory on huge ones).
_CHECK_FRAME_BLOCK = 1 << 16


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


@dataclass(frozen=True)
class VLAFrame:
    """One decoded frame of vla records: flat token ids plus each record's slice, and one image and one action
    chunk per record (read-only views of the decompressed frame, unless a pipeline replaced ``images`` by
    augmented copies)."""

    tokens: np.ndarray           # the records' token ids, back to back
    images: np.ndarray           # uint8 [n, C, H, W]
    actions: np.ndarray          # float32 [n, K, A]
    rec_offset: np.ndarray
    rec_length: np.ndarray

    def record(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Record ``i`` of the frame: (image [C, H, W], token ids [L], actions [K, A])."""
        a = int(self.rec_offset[i])
        return self.images[i], self.tokens[a:a + int(self.rec_length[i])], self.actions[i]


def _decompressor(root: Path, dict_id: int) -> zstd.ZstdDecompressor:
    if dict_id < 0:
        return zstd.ZstdDecompressor()
    path = root / "dicts" / f"{dict_id}.zdict"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ShardFormatError(f"{path}: zstd dictionary {dict_id} is missing") from None
    return zstd.ZstdDecompressor(dict_data=zstd.ZstdCompressionDict(data))


_MANIFEST_TYPES: dict[str, tuple[type, ...]] = {
    "max_len": (int,), "text_len": (int,), "real_tokens": (int,), "padded_tokens": (int,), "records": (int,),
    "vocab_size": (int,), "record_kind": (str,), "token_dtype": (str,), "tokenizer": (str, type(None)),
    "checksums": (dict,), "compression": (dict,), "preprocess": (dict,), "buckets": (list,), "complete": (bool,),
}
"""The manifest keys the readers use, and the JSON types each may have (ints are never bools)."""


def _check_manifest(path: Path, manifest: object) -> None:
    """A manifest is a JSON object whose known keys have their types; else a ShardFormatError naming the key."""
    if not isinstance(manifest, dict):
        raise ShardFormatError(f"{path}: a JSON {type(manifest).__name__}, expected an object (the manifest "
                               "`python -m loaders.preprocess` writes)")
    for key, types in _MANIFEST_TYPES.items():
        if key not in manifest:
            continue
        v = manifest[key]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types) \
                or (isinstance(v, int) and not isinstance(v, bool) and v < 0):
            want = " or ".join("null" if t is type(None) else {"int": "a non-negative integer", "str": "a string",
                                                                "dict": "an object", "list": "a list",
                                                                "bool": "true or false"}[t.__name__]
                               for t in types)
            raise ShardFormatError(f"{path}: {key}: got {v!r}; expected {want}")


class ShardSet:
    """A complete shard directory, opened for random access by frame.

    The index columns are memory-mapped numpy arrays (``self.col("frame.offset")``
    and friends, or the attributes below). Decompressors are per thread, so
    ``decode_frame`` may be called from several threads at once.

    ``record_kind`` says what the records are (``"tokens"``: ``decode_frame``
    returns a ``Frame``; ``"vla"``: a ``VLAFrame``, and ``image_shape`` (C, H, W)
    and ``action_shape`` (K, A) are set; None for tokens). A frame of ``t``
    tokens and ``n`` records decompresses to ``t x bytes_per_token + n x
    bytes_per_record`` bytes.
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
        _check_manifest(mpath, self.manifest)
        if self.manifest.get("complete") is not True:
            raise ShardFormatError(f"{mpath}: does not say complete=true: the directory is incomplete")
        self._read_index(self.root / INDEX_NAME)
        self._check_index_checksum(self.root / INDEX_NAME)
        self._local = threading.local()
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        for d in np.unique(self.bucket_dict):
            if d >= 0 and not (self.root / "dicts" / f"{int(d)}.zdict").is_file():
                raise ShardFormatError(f"{self.root / 'dicts' / f'{int(d)}.zdict'}: zstd dictionary {int(d)} "
                                       f"is missing (needed by bucket(s) "
                                       f"{self.bucket_length[self.bucket_dict == d].tolist()})")
        for b, L in enumerate(self.bucket_length.tolist()):
            path = self.data_path_for_length(L)
            if not path.is_file():
                raise ShardFormatError(f"{path}: data file of bucket {L} is missing")
            f0, nf = int(self.bucket_first_frame[b]), int(self.bucket_n_frames[b])
            if f0 + nf > self.n_frames:
                raise ShardFormatError(f"{self.root / INDEX_NAME}: bucket {L}: frames {f0}..{f0 + nf - 1} are out "
                                       f"of range (the index has {self.n_frames} frames)")
            if nf:  # frames are stored in order, so the last one ends the file
                last = f0 + nf - 1
                end = int(self.frame_offset[last]) + int(self.frame_clen[last])
                size = path.stat().st_size
                if size < end:
                    raise ShardFormatError(f"{path}: truncated: {size} bytes, but frame {last} (the last of "
                                           f"bucket {L}) ends at byte {end}")
        self._check_structure()

    def _read_index(self, path: Path) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ShardFormatError(f"{path}: index file is missing") from None
        if size < HEADER_SIZE:
            raise ShardFormatError(f"{path}: truncated ({size} bytes, the header alone is {HEADER_SIZE})")
        with open(path, "rb") as fh:
            head = fh.read(HEADER_SIZE)
        fields = HEADER.unpack_from(head)
        (magic, version, ti, pi, width, vocab, nb, nd, nf, nr, ncol) = fields
        if magic != MAGIC:
            raise ShardFormatError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}: not a loongbin index")
        if version > FORMAT_VERSION:
            raise ShardFormatError(f"{path}: format version {version} is newer than this reader supports "
                                   f"({FORMAT_VERSION}); upgrade loongforge-workbench to read it")
        if version < 1:
            raise ShardFormatError(f"{path}: format version {version} is not a valid version")
        (crc,) = struct.unpack_from("<I", head, HEADER.size)
        if crc != zlib.crc32(head[:HEADER.size]):
            raise ShardFormatError(f"{path}: header checksum mismatch (corrupt index)")
        if ti not in (2, 4) or pi not in (2, 4):
            raise ShardFormatError(f"{path}: token/position itemsize {ti}/{pi}, expected 2 or 4")
        self.version, self.vocab_size, self.bucket_width = version, vocab, width
        self.tok_dtype = np.dtype(f"<u{ti}")
        self.pos_dtype = np.dtype(f"<u{pi}")
        self._read_kind(path, head)
        self.n_buckets, self.n_dicts, self.n_frames, self.n_records = nb, nd, nf, nr
        rows = {"bucket": nb, "frame": nf, "rec": nr}
        self._cols: dict[str, np.ndarray] = {}
        with open(path, "rb") as fh:
            fh.seek(HEADER_SIZE)
            directory = fh.read(COLDIR.size * ncol)
        if len(directory) < COLDIR.size * ncol:
            raise ShardFormatError(f"{path}: truncated column directory")
        end = 0
        for i in range(ncol):
            raw_name, code, _, off = COLDIR.unpack_from(directory, i * COLDIR.size)
            try:
                name = raw_name.rstrip(b"\0").decode("ascii")
            except UnicodeDecodeError:
                raise ShardFormatError(f"{path}: column directory entry {i}: name {raw_name!r} is not ASCII "
                                       f"(corrupt index)") from None
            if code not in DTYPES:
                raise ShardFormatError(f"{path}: column {name}: unknown dtype code {code}")
            n = rows.get(name.split(".")[0])
            if n is None:
                raise ShardFormatError(f"{path}: unknown column {name!r}")
            dt = DTYPES[code]
            if off + n * dt.itemsize > size:
                raise ShardFormatError(f"{path}: truncated: column {name} needs bytes up to "
                                       f"{off + n * dt.itemsize}, the file has {size}")
            self._cols[name] = np.memmap(path, dt, "r", off, (n,)) if n else np.zeros(0, dt)
            end = max(end, align_up(off + n * dt.itemsize))
        if size < end:  # the writer pads the file to the aligned end of its last column
            raise ShardFormatError(f"{path}: truncated: {size} bytes, the columns end at byte {end}")
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

    def _read_kind(self, path: Path, head: bytes) -> None:
        """The record kind and the vla shapes: version 1 holds tokens; version 2 says so in bytes 64..127."""
        kind, C, H, W, K, A = 0, 0, 0, 0, 0, 0
        if self.version >= 2:
            ext = head[HEADER_EXT_AT:HEADER_EXT_CRC_AT]
            (crc,) = struct.unpack_from("<I", head, HEADER_EXT_CRC_AT)
            if crc != zlib.crc32(ext):
                raise ShardFormatError(f"{path}: header extension checksum mismatch (corrupt index)")
            kind, C, H, W, K, A = HEADER_EXT.unpack_from(ext)
            if kind >= len(RECORD_KINDS):
                raise ShardFormatError(f"{path}: record kind {kind} is unknown to this reader (it knows "
                                       f"{', '.join(f'{i} {k}' for i, k in enumerate(RECORD_KINDS))})")
        self.record_kind = RECORD_KINDS[kind]
        want = self.manifest.get("record_kind", "tokens")
        if want != self.record_kind:
            raise ShardFormatError(f"{path}: the index holds {self.record_kind} records, {MANIFEST_NAME} says "
                                   f"record_kind={want!r}")
        if self.record_kind == "vla":
            if min(C, H, W, K, A) < 1:
                raise ShardFormatError(f"{path}: vla shapes: image {C} x {H} x {W}, actions {K} x {A}; expected "
                                       f"positive sizes")
            self.image_shape: tuple[int, int, int] | None = (C, H, W)
            self.action_shape: tuple[int, int] | None = (K, A)
            self.bytes_per_token = self.tok_dtype.itemsize
            self.bytes_per_record = C * H * W * IMAGE_DTYPE.itemsize + K * A * ACTION_DTYPE.itemsize
        else:
            self.image_shape = self.action_shape = None
            self.bytes_per_token = self.tok_dtype.itemsize + self.pos_dtype.itemsize + 1
            self.bytes_per_record = 0

    def _check_index_checksum(self, path: Path) -> None:
        """The index file against the manifest's xxh3-64 of it (a directory written before the manifest held
        checksums is checked by the structure alone)."""
        want = (self.manifest.get("checksums") or {}).get("index_xxh3")
        if want is None:
            return
        if file_xxh3(path) != want:
            raise ShardFormatError(f"{path}: checksum mismatch (xxh3-64 differs from {MANIFEST_NAME}): the index is "
                                   f"corrupt; re-run `python -m loaders.preprocess`")

    def _check_structure(self) -> None:
        """The index's structure (the rules of loaders.verify's check 1); the first bad item is named. In order:
        the buckets, each bucket's frames and data file, then the records of every frame."""
        nb, nf, nr = self.n_buckets, self.n_frames, self.n_records
        if nb == 0 or nf == 0 or nr == 0:
            raise self._index_error(f"empty ({nb} buckets, {nf} frames, {nr} records)")
        lengths, f0, nfr = self._check_buckets()
        self._check_bucket_frames(lengths, f0, nfr)
        self._check_records(lengths)

    def _index_error(self, what: str) -> ShardFormatError:
        return ShardFormatError(f"{self.root / INDEX_NAME}: {what}")

    def _check_buckets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bucket lengths rise; each bucket's frames are a non-empty range right after the previous bucket's, and
        together they are every frame. Returns the lengths, first frames and frame counts."""
        nb, nf, bad = self.n_buckets, self.n_frames, self._index_error
        lengths = np.asarray(self.bucket_length, np.int64)
        if np.any(np.diff(lengths) <= 0):
            b = int(np.flatnonzero(np.diff(lengths) <= 0)[0]) + 1
            raise bad(f"bucket {b}: bucket.length {lengths[b]} not above the previous one ({lengths[b - 1]})")
        f0 = np.asarray(self.bucket_first_frame, np.int64)
        nfr = np.asarray(self.bucket_n_frames, np.int64)
        want_f0 = np.concatenate([[0], np.cumsum(nfr)[:-1]])
        for b in range(nb):
            if nfr[b] < 1 or f0[b] != want_f0[b]:
                raise bad(f"bucket {b} (length {lengths[b]}): frames {f0[b]}+{nfr[b]}, expected a non-empty range "
                          f"starting at {want_f0[b]}")
        if int(nfr.sum()) != nf:
            raise bad(f"bucket.nframes add up to {int(nfr.sum())}, the header says {nf} frames")
        return lengths, f0, nfr

    def _check_bucket_frames(self, lengths: np.ndarray, f0: np.ndarray, nfr: np.ndarray) -> None:
        """The frames of a bucket are back to back and fill its data file exactly."""
        bad = self._index_error
        for b in range(self.n_buckets):
            a, z = int(f0[b]), int(f0[b] + nfr[b])
            fb = np.asarray(self.frame_bucket[a:z], np.int64)
            if np.any(fb != b):
                f = a + int(np.flatnonzero(fb != b)[0])
                raise bad(f"frame {f}: frame.bucket {fb[f - a]}, expected {b}")
            off = np.asarray(self.frame_offset[a:z], np.int64)
            clen = np.asarray(self.frame_clen[a:z], np.int64)
            want = np.concatenate([[0], np.cumsum(clen)[:-1]])
            if np.any(off != want):
                f = a + int(np.flatnonzero(off != want)[0])
                raise bad(f"frame {f}: frame.offset {off[f - a]}, expected {want[f - a]} (frames are back to back)")
            path = self.data_path_for_length(int(lengths[b]))
            size, end = path.stat().st_size, int(clen.sum())
            if size < end:  # trailing bytes are harmless to a reader; loaders.verify names them
                raise ShardFormatError(f"{path}: {size} bytes, its {z - a} frames add up to {end} (truncated)")

    def _check_records(self, lengths: np.ndarray) -> None:
        """Records, a block of frames at a time: numbered in order, back to back in their frame, each in the
        bucket of its length, and the frame's decoded size is what its records hold."""
        nf, nr, bad = self.n_frames, self.n_records, self._index_error
        max_len = int(self.manifest.get("max_len", int(np.max(self.bucket_length)) if self.n_buckets else 0))
        per_tok, per_rec = self.bytes_per_token, self.bytes_per_record
        next_rec = 0
        for fa in range(0, nf, _CHECK_FRAME_BLOCK):
            fz = min(nf, fa + _CHECK_FRAME_BLOCK)
            first = np.asarray(self.frame_first_rec[fa:fz], np.int64)
            nrec = np.asarray(self.frame_n_rec[fa:fz], np.int64)
            want = next_rec + np.concatenate([[0], np.cumsum(nrec)[:-1]])
            if np.any(nrec < 1) or np.any(first != want):
                i = int(np.flatnonzero((nrec < 1) | (first != want))[0])
                raise bad(f"frame {fa + i}: records {first[i]}+{nrec[i]}, expected a non-empty range starting at "
                          f"{want[i]}")
            ra, rz = int(first[0]), int(first[-1] + nrec[-1])
            if rz > nr:
                raise bad(f"frame {fz - 1}: records up to {rz}, the header says {nr} records")
            next_rec = rz
            rlen = np.asarray(self.rec_length[ra:rz], np.int64)
            roff = np.asarray(self.rec_offset[ra:rz], np.int64)
            rec_frame = np.repeat(np.arange(fa, fz), nrec)
            start = np.cumsum(rlen) - rlen
            want_off = start - np.repeat(start[first - ra], nrec)
            if np.any(roff != want_off):
                i = int(np.flatnonzero(roff != want_off)[0])
                raise bad(f"record {ra + i} (frame {rec_frame[i]}): rec.offset {roff[i]}, expected {want_off[i]} "
                          f"(records are back to back)")
            blen = lengths[np.asarray(self.frame_bucket[fa:fz], np.int64)][rec_frame - fa]
            want_blen = np.minimum(max_len, -(-rlen // self.bucket_width) * self.bucket_width)
            if np.any(rlen < 1) or np.any(blen != want_blen):
                i = int(np.flatnonzero((rlen < 1) | (blen != want_blen))[0])
                raise bad(f"record {ra + i} (frame {rec_frame[i]}): rec.length {rlen[i]} does not belong in bucket "
                          f"{blen[i]} (expected bucket {bucket_length(max(int(rlen[i]), 1), self.bucket_width, max_len)})")
            toks = np.add.reduceat(rlen, first - ra)
            dlen = np.asarray(self.frame_dlen[fa:fz], np.int64)
            want_dlen = toks * per_tok + nrec * per_rec
            if np.any(dlen != want_dlen):
                i = int(np.flatnonzero(dlen != want_dlen)[0])
                held = f" and {nrec[i]} records x {per_rec} bytes" if per_rec else ""
                raise bad(f"frame {fa + i}: frame.dlen {dlen[i]}, its records hold {toks[i]} tokens{held} = "
                          f"{want_dlen[i]} bytes")
        if next_rec != nr:
            raise bad(f"frames hold {next_rec} records, the header says {nr}")

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

    def decode_frame(self, frame: int, raw: bytes | bytearray | memoryview) -> Frame | VLAFrame:
        """Verify and decompress one frame's bytes; every check names the file and frame. A ``Frame`` of token
        records, or a ``VLAFrame`` of vla records (``record_kind``)."""
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
        first, nrec = int(self.frame_first_rec[frame]), int(self.frame_n_rec[frame])
        body = dlen - nrec * self.bytes_per_record  # the token columns' bytes
        if body < 0 or body % self.bytes_per_token:
            raise ShardFormatError(f"{where}: size {dlen} is not a whole number of tokens")
        n = body // self.bytes_per_token
        rec_offset = np.asarray(self.rec_offset[first:first + nrec], np.int64)
        rec_length = np.asarray(self.rec_length[first:first + nrec], np.int64)
        if nrec == 0 or rec_offset[-1] + rec_length[-1] != n:
            raise ShardFormatError(f"{where}: records do not cover the frame's {n} tokens")
        buf = np.frombuffer(payload, np.uint8)
        if self.record_kind == "vla":  # actions [n, K, A], then the tokens, then images [n, C, H, W]
            a = nrec * self.action_shape[0] * self.action_shape[1] * ACTION_DTYPE.itemsize
            b = a + n * self.tok_dtype.itemsize
            tokens = buf[a:b].view(self.tok_dtype)
            fr: Frame | VLAFrame = VLAFrame(tokens, buf[b:].reshape(nrec, *self.image_shape),
                                            buf[:a].view(ACTION_DTYPE).reshape(nrec, *self.action_shape),
                                            rec_offset, rec_length)
        else:  # tokens, positions, loss mask
            a = n * self.tok_dtype.itemsize
            b = a + n * self.pos_dtype.itemsize
            tokens = buf[:a].view(self.tok_dtype)
            fr = Frame(tokens, buf[a:b].view(self.pos_dtype), buf[b:], rec_offset, rec_length)
        if n and int(tokens.max()) >= self.vocab_size:
            raise ShardFormatError(f"{where}: token id {int(tokens.max())} >= vocab_size {self.vocab_size}")
        return fr

    def load_frame(self, frame: int) -> Frame | VLAFrame:
        return self.decode_frame(frame, self.read_frame_bytes(frame))

    def frames_of_bucket(self, bucket: int) -> range:
        a = int(self.bucket_first_frame[bucket])
        return range(a, a + int(self.bucket_n_frames[bucket]))

    def iter_records(self) -> Iterable[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(bucket length, tokens, position ids, loss mask) of every record, in storage order; for vla records
        (bucket length, image, tokens, actions)."""
        for f in range(self.n_frames):
            fr = self.load_frame(f)
            L = int(self.bucket_length[self.frame_bucket[f]])
            for i in range(len(fr.rec_length)):
                yield (L, *fr.record(i))
