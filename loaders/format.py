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
directory ``.DIR.partial-<pid>@<host>-<random>`` and renames it into place (an
existing ``DIR`` is swapped out atomically with ``renameat2(RENAME_EXCHANGE)``
where the kernel has it), so a crash never leaves a ``DIR`` that reads as
complete, nor a half-replaced one. ``remove_stale_partials(DIR)`` removes what
a killed writer left behind.

Frames
    A frame holds several consecutive records of one bucket, 64 KiB to 1 MiB
    decompressed (``frame_bytes``, 256 KiB by default; one record larger than
    that is a frame of its own; a bucket's last frame is merged with the one
    before it when it would be under 64 KiB, so only a bucket smaller than
    64 KiB has a smaller frame). Decompressed, a frame of ``n`` tokens is three
    columns back to back: ``tokens[n]`` (uint16 when the vocabulary has at most
    65,536 ids, else uint32), ``position_ids[n]`` (uint16 when the maximum length
    is at most 65,536, else uint32) and ``loss_mask[n]`` (uint8). Each frame is
    one zstd frame (content size and content checksum stored) compressed with
    its bucket's dictionary. Columns compress better than interleaved records:
    each one is homogeneous.

Integrity
    Three layers: the index stores the xxh3-64 of each frame's compressed bytes
    (checked on every read, before decompressing); each zstd frame carries
    zstd's own checksum of its decompressed content (catches a damaged
    dictionary); and the manifest's ``checksums`` hold the xxh3-64 of the index
    file (checked by ``ShardSet`` when it opens the directory) and of every
    dictionary (checked by ``python -m loaders.verify``). On open ``ShardSet``
    also checks every record against its frame and bucket (contiguous, inside
    the frame's tokens, 1 to the bucket's length long), so a damaged index is
    a ``ShardFormatError`` naming the record, never a batch built from it.

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

from ._layout import (FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, MAX_FRAME_BYTES, MIN_FRAME_BYTES, ShardFormatError,
                      bucket_length, position_dtype_for, token_dtype_for, write_index)
from ._publish import remove_stale_partials
from ._shardset import Frame, ShardSet
from ._writer import DEFAULT_DICT_SIZE, DEFAULT_FRAME_BYTES, ShardWriter

# The format's public names; each lives in one private module (layout, publishing, writer, reader).
__all__ = [
    "FORMAT_VERSION",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "MIN_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "DEFAULT_FRAME_BYTES",
    "DEFAULT_DICT_SIZE",
    "ShardFormatError",
    "ShardWriter",
    "ShardSet",
    "Frame",
    "bucket_length",
    "token_dtype_for",
    "position_dtype_for",
    "remove_stale_partials",
    "write_index",
]
