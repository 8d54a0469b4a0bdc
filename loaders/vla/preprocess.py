"""VLA samples in ``.npz`` files -> a shard directory of vla records (``python -m loaders.preprocess --kind vla``).

``open_vla_npz`` checks a file's members without reading their data; ``VLAInput.iter_samples`` streams them
(images a block of rows at a time straight from the zip); ``preprocess_vla`` writes them with
``VLAShardWriter``. The input layout and the flags are described in docs/loaders.md ("VLA records",
preprocessing); the CLI is ``loaders.preprocess``'s.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .._publish import check_output_path, missing_ancestors
from ..format import MAX_FRAME_BYTES, MIN_FRAME_BYTES, VLAShardWriter, remove_stale_partials
from ..inputs import read_npy_header

__all__ = ["IMAGE_LAYOUTS", "VLAInput", "open_vla_npz", "preprocess_vla"]

IMAGE_LAYOUTS = ("auto", "nchw", "nhwc")
# Bytes of a member read per block of rows (images: ~50 records of 3 x 224 x 224).
_ROW_BLOCK_BYTES = 8 << 20


@dataclass
class _Member:
    name: str
    zip_name: str
    shape: tuple
    dtype: np.dtype
    fortran: bool


@dataclass
class VLAInput:
    """One checked ``.npz`` of vla samples: ``images``, ``tokens`` (padded with ``lengths``, or an object array of
    1-D arrays), ``actions``. ``iter_samples()`` yields (image [C, H, W] uint8, tokens [L], actions [K, A])."""

    path: Path
    nbytes: int
    samples: int
    image_shape: tuple[int, int, int]
    layout: str                      # "nchw" | "nhwc": how the file stores the images
    action_shape: tuple[int, int]
    text_len: int                    # the padded width, or the longest instruction of an object array
    tokens_format: str               # "padded" | "object"
    _members: dict = field(default_factory=dict, repr=False)
    _objects: np.ndarray | None = field(default=None, repr=False)

    def _rows(self, zf: zipfile.ZipFile, m: _Member) -> Iterator[np.ndarray]:
        """Blocks of rows of a member, in order, without loading it whole (a Fortran-order one is)."""
        n = m.shape[0]
        row = math.prod(m.shape[1:]) * m.dtype.itemsize
        step = max(1, _ROW_BLOCK_BYTES // max(1, row))
        with zf.open(m.zip_name) as fh:
            if m.fortran:
                arr = np.load(fh, allow_pickle=False)
                for r0 in range(0, n, step):
                    yield arr[r0:r0 + step]
                return
            read_npy_header(fh, f"{self.path}: {m.name}")
            for r0 in range(0, n, step):
                r = min(step, n - r0)
                buf = fh.read(r * row)
                if len(buf) != r * row:
                    raise ValueError(f"{self.path}: {m.name}: truncated at sample {r0 + len(buf) // row} of {n}")
                yield np.frombuffer(buf, m.dtype).reshape(r, *m.shape[1:])

    def _token_rows(self, zf: zipfile.ZipFile) -> Iterator[list[np.ndarray]]:
        if self._objects is not None:
            yield list(self._objects)
            return
        lengths = self._rows(zf, self._members["lengths"])
        for block in self._rows(zf, self._members["tokens"]):
            lens = next(lengths)
            yield [block[i, :int(lens[i])] for i in range(len(block))]

    def iter_samples(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The samples in file order; every error names the file and the sample."""
        with zipfile.ZipFile(self.path) as zf:
            images = self._rows(zf, self._members["images"])
            if self.layout == "nhwc":
                images = (np.ascontiguousarray(b.transpose(0, 3, 1, 2)) for b in images)
            rows = zip(_each(images), _each(self._token_rows(zf)), _each(self._rows(zf, self._members["actions"])))
            for i, (image, tokens, actions) in enumerate(rows):
                if len(tokens) == 0:
                    raise ValueError(f"{self.path}: sample {i}: no tokens (a record needs 1 or more; use a BOS or "
                                     f"pad id for an empty instruction)")
                yield image, tokens, actions

    def max_id(self) -> int:
        """The largest token id of the file (padding excluded), in one pass over the tokens."""
        best = -1
        with zipfile.ZipFile(self.path) as zf:
            for block in self._token_rows(zf):
                best = max([best, *(int(t.max()) for t in block if len(t))])
        return best


def _layout_of(shape: tuple, layout: str, where: str) -> str:
    if layout != "auto":
        return layout
    first, last = shape[1] in (1, 3, 4), shape[3] in (1, 3, 4)
    if first and not last:
        return "nchw"
    if last and not first:
        return "nhwc"
    raise ValueError(f"{where}: images shape {list(shape)}: cannot tell channels-first from channels-last; pass "
                     f"--image-layout nchw or nhwc")


def open_vla_npz(path: str | Path, *, image_layout: str = "auto", allow_pickle: bool = False) -> VLAInput:
    """Check one ``.npz`` of vla samples (members, shapes, dtypes) without reading its images."""
    p = Path(path)
    if image_layout not in IMAGE_LAYOUTS:
        raise ValueError(f"image_layout={image_layout!r}: expected one of {', '.join(IMAGE_LAYOUTS)}")
    if p.suffix.lower() != ".npz":
        raise ValueError(f"{p}: --kind vla reads .npz files (images, tokens, actions), not {p.suffix or 'this'}")
    try:
        nbytes = p.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such file") from None
    try:
        zf = zipfile.ZipFile(p)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{p}: not a valid .npz ({e})") from None
    with zf:
        names = {n[:-4] if n.endswith(".npy") else n: n for n in zf.namelist()}
        missing = [k for k in ("images", "tokens", "actions") if k not in names]
        if missing:
            raise ValueError(f"{p}: no {', '.join(map(repr, missing))} array (keys: {', '.join(sorted(names)) or 'none'})")
        members = {}
        for key in ("images", "tokens", "actions", "lengths"):
            if key in names:
                with zf.open(names[key]) as fh:
                    shape, fortran, dtype = read_npy_header(fh, f"{p}: {key}")
                members[key] = _Member(key, names[key], shape, dtype, fortran)
        img, act, tok = members["images"], members["actions"], members["tokens"]
        if img.dtype != np.uint8 or len(img.shape) != 4:
            raise ValueError(f"{p}: images {img.dtype} {list(img.shape)}, expected uint8 [N, 3, H, W] or [N, H, W, 3]")
        layout = _layout_of(img.shape, image_layout, str(p))
        N = img.shape[0]
        image_shape = tuple(img.shape[1:]) if layout == "nchw" else (img.shape[3], img.shape[1], img.shape[2])
        if len(act.shape) != 3 or act.dtype.hasobject or act.dtype.kind not in "fiu":
            raise ValueError(f"{p}: actions {act.dtype} {list(act.shape)}, expected real numbers [N, K, A]")
        objects = None
        if tok.dtype.hasobject:
            if not allow_pickle:
                raise ValueError(f"{p}: tokens is an object array; loading it runs pickle, which can execute code "
                                 f"from the file: pass --allow-pickle if you trust it, or store tokens padded "
                                 f"[N, T] with lengths [N]")
            with zf.open(names["tokens"]) as fh:
                objects = np.load(fh, allow_pickle=True)
            if objects.ndim != 1:
                raise ValueError(f"{p}: tokens object array of shape {list(objects.shape)}, expected [N]")
            arrs = []
            for i, t in enumerate(objects):
                a = np.asarray(t)
                if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                    raise ValueError(f"{p}: tokens[{i}]: {a.dtype} {list(a.shape)}, expected 1-D integer ids")
                arrs.append(a)
            objects = np.empty(len(arrs), object)
            objects[:] = arrs
            text_len, tokens_format, n_tok = max((len(a) for a in arrs), default=0), "object", len(arrs)
        else:
            if len(tok.shape) != 2 or tok.dtype.kind not in "iu":
                raise ValueError(f"{p}: tokens {tok.dtype} {list(tok.shape)}, expected integer ids [N, T] (with "
                                 f"lengths [N]) or an object array of 1-D arrays")
            lens = members.get("lengths")
            if lens is None:
                raise ValueError(f"{p}: tokens is padded [N, T] = {list(tok.shape)}: a 'lengths' array [N] must say "
                                 f"how many of each row are real")
            if len(lens.shape) != 1 or lens.dtype.kind not in "iu" or lens.shape[0] != tok.shape[0]:
                raise ValueError(f"{p}: lengths {lens.dtype} {list(lens.shape)}, expected integers [{tok.shape[0]}]")
            text_len, tokens_format, n_tok = tok.shape[1], "padded", tok.shape[0]
        if not (act.shape[0] == n_tok == N):
            raise ValueError(f"{p}: images, tokens and actions hold {N}, {n_tok} and {act.shape[0]} samples; "
                             f"expected the same number")
        if N == 0:
            raise ValueError(f"{p}: no samples")
    f = VLAInput(p, nbytes, N, image_shape, layout, tuple(act.shape[1:]), int(text_len), tokens_format,  # type: ignore[arg-type]
                 members, objects)
    if tokens_format == "padded":
        with zipfile.ZipFile(p) as zf:
            for r0, block in _enumerate_blocks(f._rows(zf, members["lengths"])):
                bad = (block < 0) | (block > text_len)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise ValueError(f"{p}: lengths[{r0 + i}] = {int(block[i])}, expected 0..{text_len} (the width "
                                     f"of tokens)")
    return f


def _each(blocks: Iterator) -> Iterator:
    """The rows of a stream of blocks, one by one."""
    for block in blocks:
        yield from block


def _enumerate_blocks(blocks: Iterator[np.ndarray]) -> Iterator[tuple[int, np.ndarray]]:
    r0 = 0
    for b in blocks:
        yield r0, b
        r0 += len(b)


def preprocess_vla(inputs: list[str], output: str, *, text_len: int | None = None, vocab_size: int | None = None,
                   image_layout: str = "auto", zstd_level: int = 3, frame_kb: int = 1024, num_workers: int = 1,
                   overwrite: bool = False, compare: bool = True, quiet: bool = True, allow_pickle: bool = False,
                   tokenizer: str | None = None) -> dict:
    """Preprocess ``.npz`` files of vla samples into the shard directory ``output``; returns the manifest.

    ``text_len``: the longest instruction accepted (a longer one is an error naming the sample); None: the
    widest of the inputs (the padded width, or the longest instruction of an object array). ``vocab_size``:
    ids >= it are an error; None: max id + 1, with a warning. Errors (``ValueError``, ``FileNotFoundError``,
    ``FileExistsError``) leave ``output`` as it was.
    """
    t0 = time.perf_counter()
    if not inputs:
        raise ValueError("no inputs given")
    if not (isinstance(frame_kb, int) and MIN_FRAME_BYTES <= frame_kb * 1024 <= MAX_FRAME_BYTES):
        raise ValueError(f"frame_kb={frame_kb!r}: expected an integer in {MIN_FRAME_BYTES // 1024}.."
                         f"{MAX_FRAME_BYTES // 1024}")
    out = Path(output)
    check_output_path(out, overwrite)  # an existing directory is replaced only when it is a shard directory
    files = [open_vla_npz(p, image_layout=image_layout, allow_pickle=allow_pickle) for p in inputs]
    for f in files[1:]:
        if (f.image_shape, f.action_shape) != (files[0].image_shape, files[0].action_shape):
            raise ValueError(f"{f.path}: images {list(f.image_shape)} and actions {list(f.action_shape)}, but "
                             f"{files[0].path} holds {list(files[0].image_shape)} and {list(files[0].action_shape)}")
    T = max(f.text_len for f in files) if text_len is None else text_len
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"text_len={text_len!r}: expected a positive integer")
    vocab = vocab_size
    if vocab is None:
        vocab = max(f.max_id() for f in files) + 1
        warnings.warn(f"--vocab-size not given: inferred {vocab} (max id + 1) from the inputs; pass --vocab-size "
                      f"to fix the token dtype and reject out-of-range ids", stacklevel=2)
    for p in remove_stale_partials(out):
        if not quiet:
            print(f"removed {p} (left by an interrupted run)", file=sys.stderr)
    created = missing_ancestors(out)
    try:
        return _write(files, out, vocab, vocab_size is None, T, image_layout, zstd_level, frame_kb, num_workers,
                      overwrite, compare, tokenizer, t0)
    except BaseException:
        for d in created:  # directories this run created above the output, if left empty
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _write(files: list[VLAInput], out: Path, vocab: int, inferred: bool, T: int, image_layout: str, zstd_level: int,
           frame_kb: int, num_workers: int, overwrite: bool, compare: bool, tokenizer: str | None, t0: float) -> dict:
    """The samples of ``files`` through a ``VLAShardWriter`` into ``out``; returns the manifest."""
    with VLAShardWriter(out, vocab_size=vocab, text_len=T, image_shape=files[0].image_shape,
                        action_shape=files[0].action_shape, zstd_level=zstd_level, frame_bytes=frame_kb * 1024,
                        num_workers=num_workers, overwrite=overwrite, compare_baselines=compare) as w:
        for f in files:
            for i, (image, tokens, actions) in enumerate(f.iter_samples()):
                if len(tokens) > T:
                    raise ValueError(f"{f.path}: sample {i}: {len(tokens)} tokens > --text-len {T}")
                try:
                    w.add(image, tokens, actions)
                except ValueError as e:  # "record N: ..." -> the file and its sample
                    raise ValueError(f"{f.path}: sample {i}: {str(e).split(': ', 1)[-1]}") from None
        t_read = time.perf_counter() - t0
        samples = sum(f.samples for f in files)
        extra = {"preprocess": {
            "kind": "vla",
            "inputs": [{"path": str(f.path.resolve()), "format": "npz", "bytes": f.nbytes, "samples": f.samples,
                        "image_layout": f.layout, "tokens": f.tokens_format} for f in files],
            "flags": {"text_len": T, "vocab_size": vocab, "vocab_size_inferred": inferred,
                      "image_layout": image_layout, "zstd_level": zstd_level, "frame_kb": frame_kb,
                      "num_workers": num_workers, "overwrite": overwrite, "compare": compare},
            "samples": samples, "read_s": round(t_read, 3)}, "tokenizer": tokenizer}

        def finish(manifest: dict) -> None:
            elapsed = time.perf_counter() - t0
            manifest["preprocess"]["elapsed_s"] = round(elapsed, 3)
            manifest["preprocess"]["samples_per_s"] = round(samples / elapsed, 1)
            c = manifest["compression"]
            c["input_file_bytes"] = sum(f.nbytes for f in files)
            c["ratio_input_files"] = round(c["input_file_bytes"] / c["stored_bytes"], 4)

        return w.close(extra_manifest=extra, on_manifest=finish)
