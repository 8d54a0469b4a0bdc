"""The loongbin shard format: tokenized records bucketed by length, zstd frames compressed with one dictionary
per bucket, and an mmap-able index; and its ``"vla"`` record kind (an image, token ids, an action chunk).

The format's public names, each defined in one private module: ``_layout`` (names, version, record kinds, dtype
and bucket rules, the index file), ``_publish`` (the atomic rename into place), ``_writer`` (``ShardWriter``),
``vla.writer`` (``VLAShardWriter``) and ``_shardset`` (``ShardSet``, ``Frame``, ``VLAFrame``). The directory
layout, frames, integrity layers and the index file are described in docs/loaders.md ("The shard format", "VLA
records").
"""

from __future__ import annotations

from ._layout import (ACTION_DTYPE, FORMAT_VERSION, IMAGE_DTYPE, INDEX_NAME, MANIFEST_NAME, MAX_FRAME_BYTES,
                      MIN_FRAME_BYTES, RECORD_KINDS, ShardFormatError, bucket_length, position_dtype_for,
                      token_dtype_for, write_index)
from ._publish import remove_stale_partials
from ._shardset import Frame, ShardSet, VLAFrame
from .vla.writer import DEFAULT_VLA_FRAME_BYTES, VLAShardWriter
from ._writer import DEFAULT_DICT_SIZE, DEFAULT_FRAME_BYTES, ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "RECORD_KINDS",
    "IMAGE_DTYPE",
    "ACTION_DTYPE",
    "INDEX_NAME",
    "MANIFEST_NAME",
    "MIN_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "DEFAULT_FRAME_BYTES",
    "DEFAULT_DICT_SIZE",
    "DEFAULT_VLA_FRAME_BYTES",
    "ShardFormatError",
    "ShardWriter",
    "VLAShardWriter",
    "ShardSet",
    "Frame",
    "VLAFrame",
    "bucket_length",
    "token_dtype_for",
    "position_dtype_for",
    "remove_stale_partials",
    "write_index",
]
