"""Readers that turn tokenized input files into documents (1-D integer arrays).

``open_input(path, eos_id=, bin_dtype=)`` picks the reader by the file's suffix (``.npz``, ``.npy``, ``.bin``);
``InputFile.iter_documents()`` yields the documents, EOS dropped, empty ones skipped and counted, every error naming
the file and the document. The formats and the rules common to them are described in docs/loaders.md ("Inputs").
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

import numpy as np

__all__ = ["FORMATS", "BIN_DTYPES", "CHUNK_TOKENS", "InputFile", "open_input", "iter_documents"]

FORMATS = ("bin", "npy", "npz")
BIN_DTYPES = ("uint16", "uint32")
# Tokens scanned per step for EOS: 4 Mi tokens is 8 MB of uint16 plus a 4 MB
# boolean temporary, small next to the page cache and large enough that the
# per-chunk Python overhead is negligible.
CHUNK_TOKENS = 1 << 22
# Bytes of a 2-D input read per block of rows.
_ROW_BLOCK_BYTES = 8 << 20


@dataclass
class _Member:
    """Where the rows of a 2-D array come from: a memmap, or a stream inside a zip."""

    name: str
    shape: tuple
    dtype: np.dtype
    array: np.ndarray | None = None      # memmap or fully loaded (Fortran-order) array
    zip_path: str | None = None          # member name inside the .npz
    fortran: bool = False


def read_npy_header(fh: IO[bytes], where: str) -> tuple[tuple, bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{where}: not a valid .npy array ({e})") from None
    return tuple(shape), bool(fortran), np.dtype(dtype)


def _check_int_dtype(dtype: np.dtype, where: str, allow_bool: bool = False) -> None:
    if dtype.hasobject or not (np.issubdtype(dtype, np.integer) or (allow_bool and dtype == np.bool_)):
        raise ValueError(f"{where}: dtype {dtype}, expected integer token ids")


@dataclass
class InputFile:
    """One validated input file; ``iter_documents()`` yields its documents.

    Counters (``documents``, ``empty_documents``, ``tokens``, ``bytes_done``)
    advance during iteration; ``location`` describes the current document for
    error messages ("document 12 (row 12)").
    """

    path: Path
    format: str
    nbytes: int
    eos_id: int | None = None
    bin_dtype: str = "uint16"
    documents: int = 0
    empty_documents: int = 0
    tokens: int = 0
    bytes_done: int = 0
    location: str = ""
    _ids: _Member | None = field(default=None, repr=False)
    _mask: _Member | None = field(default=None, repr=False)
    _stream: np.ndarray | None = field(default=None, repr=False)
    _stream_base: int = field(default=0, repr=False)

    # -- opening: every check that does not need the data itself
    def _open(self) -> None:
        p = self.path
        if self.nbytes == 0:
            raise ValueError(f"{p}: empty file (0 bytes)")
        if self.format == "bin":
            dt = np.dtype(self.bin_dtype).newbyteorder("<")
            if self.nbytes % dt.itemsize:
                raise ValueError(f"{p}: {self.nbytes} bytes is not a whole number of {self.bin_dtype} tokens "
                                 f"(wrong --bin-dtype?)")
            self._need_eos("a flat .bin token stream")
            self._stream = np.memmap(p, dt, "r")
        elif self.format == "npy":
            with open(p, "rb") as fh:
                shape, fortran, dtype = read_npy_header(fh, str(p))
            _check_int_dtype(dtype, str(p))
            if len(shape) not in (1, 2):
                raise ValueError(f"{p}: shape {shape}, expected a 1-D token stream or a 2-D [documents, length] array")
            try:
                arr = np.load(p, mmap_mode="r", allow_pickle=False)
            except ValueError as e:
                raise ValueError(f"{p}: cannot memory-map ({e})") from None
            if arr.size == 0:
                raise ValueError(f"{p}: no tokens (shape {shape})")
            if arr.ndim == 1:
                self._need_eos("a 1-D .npy token stream")
                self._stream = arr
                self._stream_base = self.nbytes - arr.nbytes
            else:
                self._ids = _Member("input_ids", shape, dtype, array=arr)
        elif self.format == "npz":
            self._open_npz()
        if self.eos_id is not None:
            dt = self._ids.dtype if self._ids is not None else self._stream.dtype
            if np.issubdtype(dt, np.integer) and not np.iinfo(dt).min <= self.eos_id <= np.iinfo(dt).max:
                raise ValueError(f"{p}: --eos-id {self.eos_id} cannot occur in {dt} token ids")

    def _need_eos(self, what: str) -> None:
        if self.eos_id is None:
            raise ValueError(f"{self.path}: --eos-id is required to split {what} into documents")

    def _open_npz(self) -> None:
        p = self.path
        try:
            zf = zipfile.ZipFile(p)
        except zipfile.BadZipFile as e:
            raise ValueError(f"{p}: not a valid .npz ({e})") from None
        with zf:
            names = {n[:-4] if n.endswith(".npy") else n: n for n in zf.namelist()}
            if "input_ids" not in names:
                raise ValueError(f"{p}: no 'input_ids' array (keys: {', '.join(sorted(names)) or 'none'})")
            members = {}
            for key in ("input_ids", "attention_mask"):
                if key not in names:
                    continue
                with zf.open(names[key]) as fh:
                    shape, fortran, dtype = read_npy_header(fh, f"{p}: {key}")
                _check_int_dtype(dtype, f"{p}: {key}", allow_bool=key == "attention_mask")
                members[key] = _Member(key, shape, dtype, zip_path=names[key], fortran=fortran)
        ids, mask = members["input_ids"], members.get("attention_mask")
        if len(ids.shape) != 2:
            raise ValueError(f"{p}: input_ids has shape {ids.shape}, expected [N, L]")
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"{p}: attention_mask shape {mask.shape} differs from input_ids shape {ids.shape}")
        if ids.shape[0] * ids.shape[1] == 0:
            raise ValueError(f"{p}: input_ids is empty (shape {ids.shape})")
        self._ids, self._mask = ids, mask

    # -- row blocks of 2-D inputs
    def _row_blocks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
        """(first row, ids[r, L], mask[r, L] or None) blocks of about ``_ROW_BLOCK_BYTES``."""
        ids, mask = self._ids, self._mask
        n_rows, L = ids.shape
        step = max(1, _ROW_BLOCK_BYTES // max(1, L * ids.dtype.itemsize))
        if ids.array is not None:  # .npy: memory-mapped
            for r0 in range(0, n_rows, step):
                yield r0, np.asarray(ids.array[r0:r0 + step]), None
            return
        with zipfile.ZipFile(self.path) as zf:
            readers = [self._member_rows(zf, m, step) for m in (ids, mask) if m is not None]
            r0 = 0
            for blocks in zip(*readers):
                yield r0, blocks[0], (blocks[1] if len(blocks) > 1 else None)
                r0 += len(blocks[0])

    def _member_rows(self, zf: zipfile.ZipFile, m: _Member, step: int) -> Iterator[np.ndarray]:
        n_rows, L = m.shape
        if m.fortran:  # rare: column-major rows are not contiguous in the stream; load it whole
            with zf.open(m.zip_path) as fh:
                arr = np.load(fh, allow_pickle=False)
            for r0 in range(0, n_rows, step):
                yield arr[r0:r0 + step]
            return
        with zf.open(m.zip_path) as fh:
            read_npy_header(fh, f"{self.path}: {m.name}")
            row_bytes = L * m.dtype.itemsize
            for r0 in range(0, n_rows, step):
                r = min(step, n_rows - r0)
                buf = fh.read(r * row_bytes)
                if len(buf) != r * row_bytes:
                    raise ValueError(f"{self.path}: {m.name}: truncated at row {r0 + len(buf) // row_bytes} "
                                     f"of {n_rows}")
                yield np.frombuffer(buf, m.dtype).reshape(r, L)

    # -- documents
    def _emit(self, doc: np.ndarray, seg: int, row: int | None) -> bool:
        """Account for one document; False when it is empty (skipped)."""
        if len(doc) == 0:
            self.empty_documents += 1
            return False
        self.location = f"document {seg}" + (f" (row {row})" if row is not None else "")
        if doc.dtype.kind == "i" and int(doc.min()) < 0:
            raise ValueError(f"{self.path}: {self.location}: negative token id {int(doc.min())}")
        self.documents += 1
        self.tokens += len(doc)
        return True

    def iter_documents(self) -> Iterator[np.ndarray]:
        """Yield the file's documents in order (rules: docs/loaders.md, "Inputs")."""
        self.documents = self.empty_documents = self.tokens = self.bytes_done = 0
        if self._stream is not None:
            yield from self._iter_stream()
        else:
            yield from self._iter_rows()
        self.bytes_done = self.nbytes
        if self.documents == 0:
            raise ValueError(f"{self.path}: no documents (only {self.empty_documents} empty ones)")

    def _iter_stream(self) -> Iterator[np.ndarray]:
        arr, eos = self._stream, self.eos_id
        n, item = len(arr), arr.dtype.itemsize
        start = seg = 0
        for c0 in range(0, n, CHUNK_TOKENS):
            c1 = min(n, c0 + CHUNK_TOKENS)
            for e in (np.flatnonzero(arr[c0:c1] == eos) + c0).tolist():
                doc = arr[start:e]
                if self._emit(doc, seg, None):
                    yield doc
                start, seg = e + 1, seg + 1
            self.bytes_done = self._stream_base + c1 * item
        if start < n:  # the last document need not end with EOS
            doc = arr[start:n]
            if self._emit(doc, seg, None):
                yield doc

    def _iter_rows(self) -> Iterator[np.ndarray]:
        n_rows, L = self._ids.shape
        eos = self.eos_id
        seg = 0
        cols = np.arange(L)
        for r0, ids, mask in self._row_blocks():
            if mask is not None:
                bad = (mask != 0) & (mask != 1)
                if bad.any():
                    r, c = np.argwhere(bad)[0]
                    raise ValueError(f"{self.path}: attention_mask row {r0 + r} column {c}: value "
                                     f"{mask[r, c]}, expected 0 or 1")
                keep = mask.astype(bool)
                lengths = keep.sum(1)
                # right-padded rows (the usual case) are a prefix slice; others are gathered
                prefix = (keep == (cols[None, :] < lengths[:, None])).all(1)
            for i in range(len(ids)):
                row = ids[i]
                if mask is not None:
                    row = row[:lengths[i]] if prefix[i] else row[keep[i]]
                if eos is None:
                    if self._emit(row, seg, r0 + i):
                        yield row
                    seg += 1
                    continue
                at = np.flatnonzero(row == eos)
                # EOS at the end of a row ends its last document and pads the row: no empty documents there
                stop = len(row)
                while len(at) and at[-1] == stop - 1:
                    stop, at = stop - 1, at[:-1]
                start = 0
                for e in at.tolist() + [stop]:
                    doc = row[start:e]
                    if self._emit(doc, seg, r0 + i):
                        yield doc
                    start, seg = e + 1, seg + 1
            self.bytes_done = int(self.nbytes * min(1.0, (r0 + len(ids)) / n_rows))

    def max_id(self) -> int:
        """The largest token id of the file (masked-out positions excluded; EOS included), in one pass."""
        if self._stream is not None:
            arr = self._stream
            return max(int(arr[c0:c0 + CHUNK_TOKENS].max()) for c0 in range(0, len(arr), CHUNK_TOKENS))
        best = -1
        for _, ids, mask in self._row_blocks():
            if mask is not None:
                ids = ids[mask.astype(bool)]
            if ids.size:
                best = max(best, int(ids.max()))
        return best


def _format_of(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"{path}: unknown input format {path.suffix or '(no suffix)'!r} "
                         f"(expected .bin, .npy or .npz)")
    return fmt


def open_input(path: str | os.PathLike, *, eos_id: int | None = None, bin_dtype: str = "uint16") -> InputFile:
    """Validate one input file (suffix, header, shapes, dtypes, EOS) without reading its data."""
    p = Path(path)
    if bin_dtype not in BIN_DTYPES:
        raise ValueError(f"bin_dtype={bin_dtype!r}: expected one of {', '.join(BIN_DTYPES)}")
    if eos_id is not None and eos_id < 0:
        raise ValueError(f"eos_id={eos_id}: expected a non-negative token id")
    fmt = _format_of(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no such file") from None
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file")
    f = InputFile(path=p, format=fmt, nbytes=st.st_size, eos_id=eos_id, bin_dtype=bin_dtype)
    f._open()
    return f


def iter_documents(path: str | os.PathLike, *, eos_id: int | None = None,
                   bin_dtype: str = "uint16") -> Iterator[np.ndarray]:
    """Documents of one file: ``open_input(path, ...).iter_documents()``."""
    return open_input(path, eos_id=eos_id, bin_dtype=bin_dtype).iter_documents()
