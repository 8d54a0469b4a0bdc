"""The loongbin format's on-disk layout: file names, the version, the dtype and bucket rules, and the index file
(header, column directory, aligned columns) with its writer ``write_index``.

The layout is described in docs/loaders.md ("The shard format"); the public names are re-exported by
``loaders.format``.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import xxhash

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

# Decompressed bytes of a frame: the writer's bounds (a record larger than the maximum is a frame of its own).
MIN_FRAME_BYTES, MAX_FRAME_BYTES = 64 * 1024, 1024 * 1024


class ShardFormatError(ValueError):
    """A shard directory is missing, incomplete, corrupt or of an unknown version."""


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65,536, so ids < 65,536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def position_dtype_for(max_len: int) -> np.dtype:
    return np.dtype("<u2") if max_len <= 65536 else np.dtype("<u4")


def bucket_length(length: int, width: int, max_len: int) -> int:
    """The padded length of a record: ``length`` rounded up to ``width``, capped at ``max_len``."""
    return min(max_len, -(-length // width) * width)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _file_xxh3(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
