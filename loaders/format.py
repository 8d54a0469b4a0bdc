"""The loongbin shard format: tokenized records bucketed by length, zstd frames compressed with one dictionary
per bucket, and an mmap-able index.

The format's public names, each defined in one private module: ``_layout`` (names, version, dtype and bucket
rules, the index file), ``_publish`` (the atomic rename into place), ``_writer`` (``ShardWriter``) and
``_shardset`` (``ShardSet``, ``Frame``). The directory layout, frames, integrity layers and the index file are
described in docs/loaders.md ("The shard format").
"""

from __future__ import annotations

from ._layout import (FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, MAX_FRAME_BYTES, MIN_FRAME_BYTES, ShardFormatError,
                      bucket_length, position_dtype_for, token_dtype_for, write_index)
from ._publish import remove_stale_partials
from ._shardset import Frame, ShardSet
from ._writer import DEFAULT_DICT_SIZE, DEFAULT_FRAME_BYTES, ShardWriter

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
