"""``VLAShardWriter``: vision-language-action records (an image, an instruction's token ids, an action chunk) into
the loongbin format as its ``"vla"`` record kind.

It is a ``ShardWriter``: the same temporary directory, spill files, frame planning, threaded zstd compression
(content size and checksum stored, xxh3-64 of every frame in the index), index columns, checksums in the
manifest and atomic publish. What differs is the record: its columns, its fixed-size parts, the version-2 index
header that names the kind and the shapes, and the manifest. The layout is described in docs/loaders.md ("VLA
records"); import ``VLAShardWriter`` from ``loaders.format``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import zstandard as zstd

from .._layout import (ACTION_DTYPE, FORMAT_VERSION, IMAGE_DTYPE, INDEX_NAME, MAX_FRAME_BYTES, file_xxh3,
                      token_dtype_for)
from .._writer import ShardWriter, Bucket, ordered_buckets, Spill

# Frames of 1 MiB, the largest the format allows: 6 records of 3 x 224 x 224 (one 150,528-byte image nearly fills
# the 256 KiB token default alone). On the synthetic corpus (level 3) six records a frame compressed 1.52x, one a
# frame 1.36x; a 256 KiB dictionary gained nothing (1.5155x with and without). docs/loaders.md, "Compression".
DEFAULT_VLA_FRAME_BYTES = MAX_FRAME_BYTES
# Largest decompressed record: a frame's byte count is a uint32 in the index.
_MAX_RECORD_BYTES = (1 << 32) - 1


def _positive_shape(name: str, shape: object, n: int) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in shape)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        out = ()
    if len(out) != n or min(out) < 1 or any(x != y for x, y in zip(out, shape)):  # type: ignore[call-overload]
        raise ValueError(f"{name}={shape!r}: expected {n} positive integers")
    return out


class _VLASpill(Spill):
    """The vla bucket's records as they arrive: actions, tokens and images, one file each."""

    COLUMNS = ("act", "tok", "img")


@dataclass
class _VLABucket(Bucket):
    """The one bucket of a vla shard set; ``cols`` are (actions float32, tokens, images uint8) memmaps."""

    act_len: int = 0                # action elements per record (K x A)
    img_len: int = 0                # image bytes per record (C x H x W)

    def columns(self, first: int, n: int) -> tuple:
        """Records ``first .. first + n``: their actions, their tokens, their images (the frame's column order)."""
        a, b = int(self.offs[first]), int(self.offs[first + n])
        act, tok, img = self.cols
        return (act[first * self.act_len:(first + n) * self.act_len], tok[a:b],
                img[first * self.img_len:(first + n) * self.img_len])

    def payload(self, first: int, n: int) -> bytes:
        return b"".join(self.columns(first, n))


class VLAShardWriter(ShardWriter):
    """Writes a shard directory of vla records: ``add(image, tokens, actions)``, then ``close()``.

    Every record has one image of ``image_shape`` (C, H, W) uint8, 1..``text_len`` token ids below
    ``vocab_size``, and one action chunk of ``action_shape`` (K, A), stored as float32 (finite values only).
    All records form one bucket of length ``text_len`` (a batch pads the text to a fixed length, so length
    buckets would buy nothing). Frames hold whole records, ``frame_bytes`` decompressed (default 1 MiB); they
    are compressed without a dictionary (docs/loaders.md, "VLA records", says why). ``abort()``, ``with`` and
    the atomic publish behave as ``ShardWriter``'s.
    """

    def __init__(self, out_dir: str | os.PathLike, *, vocab_size: int, text_len: int,
                 image_shape: tuple[int, int, int], action_shape: tuple[int, int], zstd_level: int = 12,
                 frame_bytes: int = DEFAULT_VLA_FRAME_BYTES, num_workers: int = 1, overwrite: bool = False,
                 compare_baselines: bool = True) -> None:
        self.image_shape = _positive_shape("image_shape", image_shape, 3)
        self.action_shape = _positive_shape("action_shape", action_shape, 2)
        if not isinstance(text_len, (int, np.integer)) or text_len < 1:
            raise ValueError(f"text_len={text_len!r}: expected a positive integer")
        C, H, W = self.image_shape
        K, A = self.action_shape
        self._img_len, self._act_len = C * H * W, K * A
        if 1 <= vocab_size <= 1 << 32:  # else ShardWriter refuses it, naming vocab_size
            largest = text_len * token_dtype_for(vocab_size).itemsize + self._img_len + self._act_len * 4
            if largest > _MAX_RECORD_BYTES:
                raise ValueError(f"image_shape={self.image_shape}, action_shape={self.action_shape}: a record of "
                                 f"{largest} bytes does not fit a frame (at most {_MAX_RECORD_BYTES})")
        super().__init__(out_dir, vocab_size=vocab_size, bucket_width=int(text_len), max_len=int(text_len),
                         zstd_level=zstd_level, frame_bytes=frame_bytes, num_workers=num_workers,
                         overwrite=overwrite, compare_baselines=compare_baselines)
        self.text_len = int(text_len)
        self.input_image_bytes = self.input_action_bytes = 0

    def _record_bytes(self, lens: np.ndarray) -> np.ndarray:
        return (lens.astype(np.int64) * self.tok_dtype.itemsize + self._img_len * IMAGE_DTYPE.itemsize
                + self._act_len * ACTION_DTYPE.itemsize)

    def add(self, image: np.ndarray, tokens: np.ndarray, actions: np.ndarray) -> None:  # type: ignore[override]
        """Append one record: ``image`` uint8 [C, H, W], ``tokens`` 1-D integer ids (1..text_len of them),
        ``actions`` [K, A] real numbers (stored as float32; NaN and infinities are refused)."""
        if self._closed:
            raise RuntimeError("VLAShardWriter is closed")
        where = f"record {self.n_records}"
        image, tokens, actions = np.asarray(image), np.asarray(tokens), np.asarray(actions)
        if image.dtype != IMAGE_DTYPE or image.shape != self.image_shape:
            raise ValueError(f"{where}: image {image.dtype} {list(image.shape)}, expected uint8 "
                             f"{list(self.image_shape)} (channels first)")
        if tokens.ndim != 1 or not (np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0):
            raise ValueError(f"{where}: tokens {tokens.dtype} {list(tokens.shape)}, expected 1-D integer ids")
        n = len(tokens)
        if not 1 <= n <= self.text_len:
            raise ValueError(f"{where}: {n} tokens, expected 1..{self.text_len} (text_len)")
        if int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0:
            bad = int(tokens.max()) if int(tokens.max()) >= self.vocab_size else int(tokens.min())
            raise ValueError(f"{where}: token id {bad} outside 0..{self.vocab_size - 1} (vocab_size {self.vocab_size})")
        if actions.shape != self.action_shape or not (np.issubdtype(actions.dtype, np.floating)
                                                      or np.issubdtype(actions.dtype, np.integer)):
            raise ValueError(f"{where}: actions {actions.dtype} {list(actions.shape)}, expected real numbers "
                             f"{list(self.action_shape)}")
        act = np.ascontiguousarray(actions, ACTION_DTYPE)
        if not np.isfinite(act).all():
            i = np.argwhere(~np.isfinite(act))[0].tolist()
            raise ValueError(f"{where}: actions{i} is {act[tuple(i)]} as float32, expected a finite number")
        spill = self._spill.get(self.text_len)
        if spill is None:
            spill = self._spill[self.text_len] = _VLASpill(self.tmp / "spill", self.text_len)
        fa, ft, fi = spill.files
        tok = np.ascontiguousarray(tokens, self.tok_dtype)
        fa.write(act.data)
        ft.write(tok.data)
        fi.write(np.ascontiguousarray(image).data)
        spill.lengths.append(n)
        self.n_records += 1
        self.real_tokens += n
        self.input_token_bytes += tok.nbytes
        self.input_action_bytes += act.nbytes
        self.input_image_bytes += image.nbytes

    def _prepare_bucket(self, args: tuple[int, int]) -> Bucket:
        bi, blen = args
        spill = self._spill[blen]
        lens = np.asarray(spill.lengths, np.int64)
        offs = np.concatenate([[0], np.cumsum(lens)])
        cols = tuple(np.memmap(p, dt, "r") for p, dt in zip(spill.paths, (ACTION_DTYPE, self.tok_dtype, IMAGE_DTYPE)))
        return _VLABucket(bi, blen, lens, offs, cols, self._frames_of(lens), None, -1, None,
                          act_len=self._act_len, img_len=self._img_len)

    def _index_header(self, buckets: list[Bucket]) -> dict:
        return {**super()._index_header(buckets), "record_kind": "vla", "image_shape": self.image_shape,
                "action_shape": self.action_shape}

    def _manifest(self, buckets: list[Bucket], baselines: dict, timing: dict, extra: dict) -> dict:
        (b,) = buckets
        n, padded = len(b.lens), len(b.lens) * self.text_len
        inputs = self.input_image_bytes + self.input_action_bytes + self.input_token_bytes
        compression = {
            "level": self.level, "frame_bytes": self.frame_bytes, "dict_size": 0,
            "ratio": round(inputs / b.compressed_bytes, 4),
            "ratio_meaning": "input_bytes (images uint8 + actions float32 + token ids at the stored width) / "
                             "stored_bytes (data files; no dictionaries); ratio_images / _actions / _tokens: "
                             "each column of each frame compressed alone at the same level",
            "input_bytes": inputs, "input_image_bytes": self.input_image_bytes,
            "input_action_bytes": self.input_action_bytes, "input_token_bytes": self.input_token_bytes,
            "input_token_dtype": self.tok_dtype.name,
            "data_bytes": b.compressed_bytes, "dict_bytes": 0, "stored_bytes": b.compressed_bytes,
            "index_bytes": (self.tmp / INDEX_NAME).stat().st_size,
            "raw_bytes": b.raw_bytes, "per_bucket_dict_bytes": b.compressed_bytes,
            "ratio_per_bucket_dict": round(b.raw_bytes / b.compressed_bytes, 4), **baselines}
        return {
            "format": "loongbin", "version": FORMAT_VERSION, "record_kind": "vla", "complete": True,
            "vocab_size": self.vocab_size, "token_dtype": self.tok_dtype.name,
            "text_len": self.text_len, "bucket_width": self.bucket_width, "max_len": self.max_len,
            "image_shape": list(self.image_shape), "image_dtype": IMAGE_DTYPE.name,
            "action_shape": list(self.action_shape), "action_dtype": ACTION_DTYPE.name,
            "records": self.n_records, "real_tokens": self.real_tokens, "padded_tokens": padded,
            "padding_ratio": round(1 - self.real_tokens / padded, 6),
            "buckets": [{"length": b.length, "records": n, "frames": len(b.written), "real_tokens": self.real_tokens,
                         "padded_tokens": padded, "padding_ratio": round(1 - self.real_tokens / padded, 6),
                         "raw_bytes": b.raw_bytes, "compressed_bytes": b.compressed_bytes, "dict_id": -1}],
            "compression": compression,
            "checksums": {"index_xxh3": file_xxh3(self.tmp / INDEX_NAME), "dicts": {}},
            "writer_seconds": timing, **extra,
        }

    def _baselines(self, pool: ThreadPoolExecutor, buckets: list[Bucket]) -> dict:
        """Each column of each frame compressed alone (what images, actions and tokens cost apart), and the
        whole payload as one zstd stream; all at the writer's level, no dictionary."""
        (b,) = buckets
        assert isinstance(b, _VLABucket)

        def apart(frame: tuple[int, int]) -> tuple[bytes, list[int], list[int]]:
            cols = b.columns(*frame)
            c = self._compressor("none", None)
            return b"".join(cols), [x.nbytes for x in cols], [len(c.compress(x)) for x in cols]

        whole = zstd.ZstdCompressor(level=self.level).compressobj()
        raw, comp, w = [0, 0, 0], [0, 0, 0], 0
        for i, (payload, r, c) in enumerate(ordered_buckets(pool, apart, b.frames, 2 * self.num_workers)):
            self._progress("baselines", i, len(b.frames))
            raw, comp = [x + y for x, y in zip(raw, r)], [x + y for x, y in zip(comp, c)]
            w += len(whole.compress(payload))
        w += len(whole.flush())
        self._progress("baselines", len(b.frames), len(b.frames))
        out = {"whole_file_bytes": w, "ratio_whole_file": round(b.raw_bytes / w, 4),
               "per_bucket_dict_vs_whole_file": round(w / b.compressed_bytes, 4)}
        for name, r, c in zip(("actions", "tokens", "images"), raw, comp):
            out[f"{name}_alone_bytes"] = c
            out[f"ratio_{name}"] = round(r / c, 4) if c else None
        return out

