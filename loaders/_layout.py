"""The loongbin format's on-disk layout: file names, the version, the dtype and bucket rules, and the index file
(header, column directory, aligned columns) with its writer ``write_index``.

The layout is described in docs/loaders.md ("The shard format"); the public names are re-exported by
``loaders.format``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import IO

import numpy as np
import xxhash

from workbench.files import atomic_write

# The newest index version this code reads. A writer writes the oldest version that can hold its record kind:
# token shards stay version 1 (readable by every earlier reader), vla shards are version 2 (an older reader
# refuses them as "newer than this reader supports" instead of misreading their frames as tokens).
FORMAT_VERSION = 2
MAGIC = b"LBINDEX\x00"
# What a record is. "tokens": token ids, position ids, loss mask. "vla": an image, an instruction's token ids and
# an action chunk (docs/loaders.md, "VLA records").
RECORD_KINDS = ("tokens", "vla")
_KIND_VERSION = {"tokens": 1, "vla": 2}
INDEX_NAME = "index.lbx"
MANIFEST_NAME = "manifest.json"
HEADER = struct.Struct("<8sIIIIQIIQQI")  # up to the crc, 60 bytes
HEADER_SIZE = 128
# Version 2: bytes 64..127 of the header (reserved, zero, in version 1): record kind (index into RECORD_KINDS),
# image channels, height, width, action steps, action dimension, 36 reserved bytes, crc32 of bytes 64..123.
HEADER_EXT = struct.Struct("<IIIIII")
HEADER_EXT_AT, HEADER_EXT_CRC_AT = 64, 124
COLDIR = struct.Struct("<16sIIQ")
_ALIGN = 64
# numpy dtype codes stored in the column directory
DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8"),
           14: np.dtype("<i4"), 18: np.dtype("<i8")}
_DTYPE_CODES = {v: k for k, v in DTYPES.items()}

# A vla record's image and action element types (fixed by the kind; docs/loaders.md, "VLA records").
IMAGE_DTYPE = np.dtype("u1")
ACTION_DTYPE = np.dtype("<f4")

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


def align_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def file_xxh3(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def header_extension(record_kind: str, image_shape: tuple[int, int, int] = (0, 0, 0),
                     action_shape: tuple[int, int] = (0, 0)) -> bytes:
    """Bytes 64..127 of a version-2 header: the record kind and the vla shapes, with their crc32."""
    ext = HEADER_EXT.pack(RECORD_KINDS.index(record_kind), *image_shape, *action_shape)
    ext = ext.ljust(HEADER_EXT_CRC_AT - HEADER_EXT_AT, b"\0")
    return ext + struct.pack("<I", zlib.crc32(ext))


def write_index(path: Path, cols: dict[str, np.ndarray], *, tok_itemsize: int, pos_itemsize: int,
                bucket_width: int, vocab_size: int, n_dicts: int, record_kind: str = "tokens",
                image_shape: tuple[int, int, int] = (0, 0, 0), action_shape: tuple[int, int] = (0, 0)) -> None:
    """Write the index file: header, column directory, aligned columns.

    The version is the oldest that holds ``record_kind``: 1 for tokens (bytes 64..127 zero), 2 for vla (bytes
    64..127 the ``header_extension``)."""
    version = _KIND_VERSION[record_kind]
    n_buckets = len(cols["bucket.length"])
    n_frames = len(cols["frame.offset"])
    n_records = len(cols["rec.length"])
    head = HEADER.pack(MAGIC, version, tok_itemsize, pos_itemsize, bucket_width, vocab_size,
                        n_buckets, n_dicts, n_frames, n_records, len(cols))
    head += struct.pack("<I", zlib.crc32(head))
    head = head.ljust(HEADER_EXT_AT, b"\0")
    head += header_extension(record_kind, image_shape, action_shape) if version >= 2 else b""
    head = head.ljust(HEADER_SIZE, b"\0")
    pos = align_up(HEADER_SIZE + COLDIR.size * len(cols))
    directory, blobs = b"", []
    for name, arr in cols.items():
        assert len(name.encode()) <= 16, f"column name {name!r} longer than 16 bytes"
        arr = np.ascontiguousarray(arr)
        directory += COLDIR.pack(name.encode(), _DTYPE_CODES[arr.dtype.newbyteorder("<")], 0, pos)
        blobs.append((pos, arr.astype(arr.dtype.newbyteorder("<")).tobytes()))
        pos = align_up(pos + arr.nbytes)
    def write(fh: IO[bytes]) -> None:
        fh.write(head + directory)
        for off, blob in blobs:
            fh.seek(off)
            fh.write(blob)
        fh.truncate(max(pos, fh.tell()))

    atomic_write(path, write)
