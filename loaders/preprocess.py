"""Tokenized documents (or VLA samples) -> a loongbin shard directory (``python -m loaders.preprocess``).

    python -m loaders.preprocess --input corpus.bin --output shards/ --eos-id 50256 \\
        --vocab-size 50304 --bucket-width 128 --min-len 512 --max-len 2048
    python -m loaders.preprocess --kind vla --input data.npz --output vla/ --vocab-size 4096 --text-len 256

Inputs (.npz, .npy, .bin: see loaders.inputs), how documents become records
(--short pack | fill | drop | keep), the manifest's preprocess section and
atomicity are described in docs/loaders.md ("Preprocessing"). --kind vla reads
.npz files of images, tokens (padded, with lengths, or an object array) and
actions into vla records (docs/loaders.md, "VLA records").

Exit status: 0 done; 2 bad input or arguments (one line naming the file, key
or value); 130 / 143 interrupted (SIGINT / SIGTERM); 1 other errors.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from loaders._publish import check_output_path, missing_ancestors
from loaders.format import (
    MAX_FRAME_BYTES,
    MIN_FRAME_BYTES,
    ShardWriter,
    remove_stale_partials,
)
from loaders.vla.preprocess import IMAGE_LAYOUTS, preprocess_vla
from loaders.inputs import BIN_DTYPES, InputFile, open_input
from loaders.verify import format_summary

__all__ = ["PreprocessConfig", "preprocess", "preprocess_vla", "main", "SHORT_POLICIES", "KINDS"]

SHORT_POLICIES = ("pack", "fill", "drop", "keep")
KINDS = ("tokens", "vla")
# Per-kind defaults of the flags both kinds take. vla: images compress no better above level 3 (the synthetic
# corpus 1.55x at 3 and 12, a photo 1.70x vs 1.68x) and level 12 compresses 4x slower; frames of 1 MiB hold
# ~6 records of 3 x 224 x 224 (docs/loaders.md, "VLA records").
_KIND_DEFAULTS = {"tokens": {"zstd_level": 12, "frame_kb": 256}, "vla": {"zstd_level": 3, "frame_kb": 1024}}
# Flags of one kind only (the argparse dest); given with the other kind they are an error, not ignored.
_TOKEN_ONLY = ("bucket_width", "min_len", "max_len", "eos_id", "bin_dtype", "dict_size", "short")
_VLA_ONLY = ("text_len", "image_layout", "allow_pickle")
# Largest record length accepted: position ids are stored as uint32 at most,
# and one record must fit a frame's uint32 byte count.
_MAX_LEN_LIMIT = 1 << 24


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass(kw_only=True)
class PreprocessConfig:
    """Flags of one preprocessing run; validated on construction."""

    bucket_width: int = 128
    """Records are padded to a multiple of this many tokens (the bucket's length)."""
    min_len: int = 512
    """Pieces shorter than this are short (see ``short``)."""
    max_len: int = 2048
    """Longest record; longer documents are cut into pieces of this length."""
    num_workers: int = 1
    """Threads that train dictionaries and compress frames."""
    zstd_level: int = 12
    """zstd compression level (1..22)."""
    vocab_size: int | None = None
    """Vocabulary size; ids >= it are an error. None: inferred as max id + 1."""
    eos_id: int | None = None
    """End-of-document id: splits flat streams (required for .bin and 1-D .npy); dropped."""
    dict_size: int = 262144
    """Bytes of each bucket's zstd dictionary."""
    frame_kb: int = 256
    """Target decompressed size of a frame, KiB (64..1024)."""
    short: str = "pack"
    """What to do with pieces shorter than min_len: pack, fill, drop or keep."""
    bin_dtype: str = "uint16"
    """Token dtype of .bin inputs: uint16 or uint32."""
    overwrite: bool = False
    """Replace an existing output directory (atomically, at the end)."""
    compare: bool = True
    """Also compress with a global dictionary, no dictionary and as one stream, for the manifest."""

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {allowed}")

        need(_is_int(self.max_len) and 1 <= self.max_len <= _MAX_LEN_LIMIT, "max_len",
             f"an integer in 1..{_MAX_LEN_LIMIT}")
        need(_is_int(self.bucket_width) and 1 <= self.bucket_width <= self.max_len, "bucket_width",
             f"an integer in 1..max_len ({self.max_len})")
        need(_is_int(self.min_len) and 1 <= self.min_len <= self.max_len, "min_len",
             f"an integer in 1..max_len ({self.max_len})")
        need(_is_int(self.num_workers) and self.num_workers >= 1, "num_workers", "an integer >= 1")
        need(_is_int(self.zstd_level) and 1 <= self.zstd_level <= 22, "zstd_level", "an integer in 1..22")
        need(self.vocab_size is None or (_is_int(self.vocab_size) and 1 <= self.vocab_size <= 1 << 32),
             "vocab_size", f"None or an integer in 1..{1 << 32}")
        need(self.eos_id is None or (_is_int(self.eos_id) and self.eos_id >= 0), "eos_id",
             "None or an integer >= 0")
        if self.vocab_size is not None and self.eos_id is not None and self.eos_id >= self.vocab_size:
            raise ValueError(f"eos_id={self.eos_id}: expected < vocab_size ({self.vocab_size})")
        need(_is_int(self.dict_size) and 256 <= self.dict_size <= 1 << 30, "dict_size",
             "an integer in 256..2**30 bytes")
        need(_is_int(self.frame_kb)
             and MIN_FRAME_BYTES <= self.frame_kb * 1024 <= MAX_FRAME_BYTES, "frame_kb",
             f"an integer in {MIN_FRAME_BYTES // 1024}..{MAX_FRAME_BYTES // 1024}")
        need(self.short in SHORT_POLICIES, "short", " / ".join(SHORT_POLICIES))
        need(self.bin_dtype in BIN_DTYPES, "bin_dtype", " / ".join(BIN_DTYPES))


@dataclass
class _Counts:
    """What happened to the documents; goes to the manifest's ``preprocess`` section."""

    documents_read: int = 0
    empty_documents: int = 0
    input_tokens: int = 0
    documents_chunked: int = 0      # documents longer than max_len
    pieces_chunked: int = 0         # pieces those documents were cut into
    pieces_short: int = 0           # pieces shorter than min_len
    pieces_packed: int = 0          # short pieces written into packed records
    records_packed: int = 0         # records built by packing
    records_below_min_len: int = 0  # records shorter than min_len that were written
    pieces_dropped: int = 0
    tokens_dropped: int = 0


class _Records:
    """Documents -> records (chunking, packing), fed to the writer in input order."""

    def __init__(self, writer: ShardWriter, cfg: PreprocessConfig, counts: _Counts) -> None:
        self.w, self.cfg, self.c = writer, cfg, counts
        self._arange = np.arange(cfg.max_len, dtype=np.uint32)
        self._mask = np.ones(cfg.max_len, np.uint8)
        self._mask[0] = 0  # first token of a document piece: not a prediction target
        self._pending: list[tuple[np.ndarray, int]] = []  # (tokens, position id of the first token)
        self._pending_len = 0

    def document(self, doc: np.ndarray) -> None:
        n, L = len(doc), self.cfg.max_len
        if n > L:
            self.c.documents_chunked += 1
            self.c.pieces_chunked += math.ceil(n / L)
        for a in range(0, n, L):
            piece = doc[a:a + L]
            if self.cfg.short == "fill":  # every piece joins the stream, so token order is kept
                if len(piece) < self.cfg.min_len:
                    self.c.pieces_short += 1
                self._fill(piece)
            elif len(piece) >= self.cfg.min_len:
                self._write([(piece, 0)])
            else:
                self._short(piece)

    def _short(self, piece: np.ndarray) -> None:
        self.c.pieces_short += 1
        if self.cfg.short == "drop":
            self.c.pieces_dropped += 1
            self.c.tokens_dropped += len(piece)
        elif self.cfg.short == "keep":
            self._write([(piece, 0)])
        else:
            if self._pending_len + len(piece) > self.cfg.max_len:
                self.flush()
            self._pending.append((piece, 0))
            self._pending_len += len(piece)
            if self._pending_len >= self.cfg.min_len:
                self.flush()

    def _fill(self, piece: np.ndarray) -> None:
        """Append a piece to the stream; a piece that does not fit is split across records."""
        start = 0
        while len(piece):
            take = min(len(piece), self.cfg.max_len - self._pending_len)
            self._pending.append((piece[:take], start))
            self._pending_len += take
            piece, start = piece[take:], start + take
            if self._pending_len >= self.cfg.min_len or len(piece):
                self.flush()

    def flush(self) -> None:
        """Write the pending packed record, if any."""
        if not self._pending:
            return
        self.c.pieces_packed += len(self._pending)
        self.c.records_packed += 1
        self._write(self._pending)
        self._pending, self._pending_len = [], 0

    def _write(self, pieces: list[tuple[np.ndarray, int]]) -> None:
        if len(pieces) == 1 and pieces[0][1] == 0:
            n = len(pieces[0][0])
            tokens, pos, mask = pieces[0][0], self._arange[:n], self._mask[:n]
        else:
            tokens = np.concatenate([p for p, _ in pieces])
            pos = np.concatenate([np.arange(a, a + len(p), dtype=np.uint32) for p, a in pieces])
            mask = (pos != 0).astype(np.uint8)
        if len(tokens) < self.cfg.min_len:
            self.c.records_below_min_len += 1
        self.w.add(tokens, mask, pos)


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr)


def preprocess(inputs: list[str], output: str, *, bucket_width: int = 128, min_len: int = 512,
               max_len: int = 2048, num_workers: int = 1, zstd_level: int = 12,
               vocab_size: int | None = None, eos_id: int | None = None, dict_size: int = 262144,
               frame_kb: int = 256, short: str = "pack", overwrite: bool = False, compare: bool = True,
               quiet: bool = True, bin_dtype: str = "uint16", tokenizer: str | None = None) -> dict:
    """Preprocess ``inputs`` into the shard directory ``output``; returns the manifest.

    ``tokenizer``: what produced the token ids (an HF tokenizer name or path), recorded as the manifest's
    ``tokenizer`` so that a study on these shards can say what it trained on; None records null.

    Raises ValueError (bad flags or input, naming the file/document/key),
    FileNotFoundError (a missing input) or FileExistsError (``output`` exists
    without ``overwrite``); in every failure ``output`` is left as it was.
    """
    t0 = time.perf_counter()
    cfg = PreprocessConfig(bucket_width=bucket_width, min_len=min_len, max_len=max_len,
                           num_workers=num_workers, zstd_level=zstd_level, vocab_size=vocab_size,
                           eos_id=eos_id, dict_size=dict_size, frame_kb=frame_kb, short=short,
                           bin_dtype=bin_dtype, overwrite=overwrite, compare=compare)
    if not inputs:
        raise ValueError("no inputs given")
    if tokenizer is not None and (not isinstance(tokenizer, str) or not tokenizer.strip()):
        raise ValueError(f"tokenizer={tokenizer!r}: expected a tokenizer name or path, or None")
    out = Path(output)
    check_output_path(out, overwrite)
    for p in remove_stale_partials(out):
        _log(quiet, f"removed {p} (left by an interrupted run)")
    files = [open_input(p, eos_id=cfg.eos_id, bin_dtype=cfg.bin_dtype) for p in inputs]

    vocab = cfg.vocab_size if cfg.vocab_size is not None else _inferred_vocab(files, cfg.eos_id)

    created = missing_ancestors(out)
    counts = _Counts()
    total_bytes = sum(f.nbytes for f in files)
    try:
        with ShardWriter(out, vocab_size=vocab, bucket_width=cfg.bucket_width, max_len=cfg.max_len,
                         zstd_level=cfg.zstd_level, dict_size=cfg.dict_size, frame_bytes=cfg.frame_kb * 1024,
                         num_workers=cfg.num_workers, overwrite=cfg.overwrite,
                         compare_baselines=cfg.compare) as writer:
            records = _Records(writer, cfg, counts)
            _read_all(files, records, vocab, cfg.vocab_size is not None, total_bytes, quiet)
            records.flush()
            t_read = time.perf_counter() - t0
            for f in files:
                counts.documents_read += f.documents
                counts.empty_documents += f.empty_documents
                counts.input_tokens += f.tokens
            _log(quiet, f"read {counts.documents_read:,} documents ({counts.input_tokens:,} tokens) in "
                        f"{t_read:.1f} s; training dictionaries and compressing {writer.n_records:,} records...")
            extra = {"preprocess": _preprocess_record(cfg, files, counts, t_read), "tokenizer": tokenizer}

            def finish(manifest: dict) -> None:
                _add_totals(manifest, time.perf_counter() - t0, counts, total_bytes)

            with _StageBars(quiet) as bars:
                return writer.close(extra_manifest=extra, on_manifest=finish, progress=bars)
    except BaseException:
        for d in created:  # directories this run created above the output, if left empty
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _inferred_vocab(files: list[InputFile], eos_id: int | None) -> int:
    """The vocabulary when --vocab-size is not given: the largest id of the inputs (or the EOS id) + 1, warned."""
    top = max(f.max_id() for f in files)
    vocab = max(top, eos_id if eos_id is not None else -1) + 1
    # stacklevel 3: the warning points at preprocess()'s caller, as it did when preprocess() warned itself
    warnings.warn(f"--vocab-size not given: inferred {vocab} (max id + 1) from the inputs; pass "
                  f"--vocab-size to fix the token dtype and reject out-of-range ids", stacklevel=3)
    return vocab


def _preprocess_record(cfg: PreprocessConfig, files: list[InputFile], counts: _Counts, t_read: float) -> dict:
    """The manifest's ``preprocess`` entry as the inputs are read: each input, the flags, the counts."""
    flags = {k: int(v) if _is_int(v) else v for k, v in asdict(cfg).items()}
    flags["vocab_size_inferred"] = cfg.vocab_size is None
    return {"inputs": [{"path": str(f.path.resolve()), "format": f.format, "bytes": f.nbytes,
                        "documents": f.documents, "empty_documents": f.empty_documents,
                        "tokens": f.tokens} for f in files],
            "flags": flags, **asdict(counts), "read_s": round(t_read, 3)}


def _add_totals(manifest: dict, elapsed: float, counts: _Counts, total_bytes: int) -> None:
    """The run's time and rate, and the stored bytes against the input files as they are on disk (headers, EOS,
    their dtype), added to the manifest once the shards are written."""
    manifest["preprocess"]["elapsed_s"] = round(elapsed, 3)
    manifest["preprocess"]["tokens_per_s"] = round(counts.input_tokens / elapsed, 1)
    c = manifest["compression"]
    c["input_file_bytes"] = total_bytes
    c["ratio_input_files"] = round(total_bytes / c["stored_bytes"], 4)


def _read_all(files: list[InputFile], records: _Records, vocab: int, check_vocab: bool,
              total_bytes: int, quiet: bool) -> None:
    from tqdm import tqdm

    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="preprocess", file=sys.stderr,
               disable=quiet or not sys.stderr.isatty(), leave=False)
    try:
        for f in files:
            seen = 0
            for doc in f.iter_documents():
                if check_vocab:
                    top = int(doc.max())
                    if top >= vocab:
                        raise ValueError(f"{f.path}: {f.location}: token id {top} >= --vocab-size {vocab}")
                records.document(doc)
                if f.bytes_done != seen:
                    bar.update(f.bytes_done - seen)
                    seen = f.bytes_done
            bar.update(f.nbytes - seen)
    finally:
        bar.close()


class _StageBars:
    """tqdm bars (stderr, TTY only) for the writer's frame stages: compress, baselines."""

    def __init__(self, quiet: bool) -> None:
        self.disable = quiet or not sys.stderr.isatty()
        self.bars: dict = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.disable:
            return
        from tqdm import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit="frame", file=sys.stderr, leave=False)
        bar.update(done - bar.n)

    def __enter__(self) -> "_StageBars":
        return self

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()


# --------------------------------------------------------------------------- CLI


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that the writer cleans up as on Ctrl-C."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


def _parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n", 2)
    p = argparse.ArgumentParser(prog="python -m loaders.preprocess", description=doc[0],
                                epilog=doc[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=KINDS, default="tokens",
                   help="record kind: tokens (default; .bin/.npy/.npz token ids) or vla (.npz of images, tokens, "
                        "actions)")
    p.add_argument("--input", nargs="+", required=True, metavar="X", help="input files: .bin, .npy or .npz")
    p.add_argument("--output", required=True, metavar="DIR", help="shard directory to write")
    p.add_argument("--bucket-width", type=int, default=128, help="bucket granularity in tokens (default 128)")
    p.add_argument("--min-len", type=int, default=512, help="pieces shorter than this are short (default 512)")
    p.add_argument("--max-len", type=int, default=2048,
                   help="longest record; longer documents are chunked (default 2048)")
    p.add_argument("--num-workers", type=int, default=1, help="compression threads (default 1)")
    p.add_argument("--zstd-level", type=int, default=None, help="zstd level 1..22 (default 12; --kind vla 3)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="ids >= this are an error (default: max id + 1, with a warning)")
    p.add_argument("--eos-id", type=int, default=None,
                   help="end-of-document id (required for .bin and 1-D .npy; dropped from documents)")
    p.add_argument("--bin-dtype", choices=BIN_DTYPES, default="uint16", help="token dtype of .bin inputs (default uint16)")
    p.add_argument("--dict-size", type=int, default=262144,
                   help="bytes per bucket dictionary (default 256 KiB; see loaders.format.DEFAULT_DICT_SIZE)")
    p.add_argument("--frame-kb", type=int, default=None,
                   help="decompressed KiB per frame, 64..1024 (default 256; --kind vla 1024)")
    p.add_argument("--short", choices=SHORT_POLICIES, default="pack",
                   help="pieces under --min-len: pack (default), fill (pack, splitting pieces to fill records), "
                        "drop or keep")
    p.add_argument("--tokenizer", metavar="NAME", default=None,
                   help="the tokenizer that produced the ids (an HF name or path), recorded in the manifest "
                        "(default: not recorded)")
    p.add_argument("--text-len", type=int, default=None,
                   help="--kind vla: longest instruction in tokens, the set's text length (default: the inputs' "
                        "padded width)")
    p.add_argument("--image-layout", choices=IMAGE_LAYOUTS, default="auto",
                   help="--kind vla: images are [N, 3, H, W] (nchw) or [N, H, W, 3] (nhwc); auto: by which axis is 3")
    p.add_argument("--allow-pickle", action="store_true",
                   help="--kind vla: read a tokens object array (runs pickle: trusted files only)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists (atomically, at the end)")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the global-dict / no-dict / whole-file compression baselines")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    wrong = _VLA_ONLY if args.kind == "tokens" else _TOKEN_ONLY
    for name in wrong:  # a flag of the other kind would be ignored: refuse it
        if getattr(args, name) != parser.get_default(name):
            parser.error(f"--{name.replace('_', '-')} applies to --kind {'vla' if args.kind == 'tokens' else 'tokens'}")
    for name, value in _KIND_DEFAULTS[args.kind].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    old_format, old_term = warnings.formatwarning, signal.getsignal(signal.SIGTERM)
    warnings.formatwarning = lambda msg, *a, **k: f"warning: {msg}\n"
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave SIGTERM alone
        old_term = None
    try:
        return _main(args)
    finally:
        warnings.formatwarning = old_format
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _main(args: argparse.Namespace) -> int:
    try:
        if args.kind == "vla":
            manifest = preprocess_vla(
                args.input, args.output, text_len=args.text_len, vocab_size=args.vocab_size,
                image_layout=args.image_layout, zstd_level=args.zstd_level, frame_kb=args.frame_kb,
                num_workers=args.num_workers, overwrite=args.overwrite, compare=not args.no_compare,
                quiet=args.quiet, allow_pickle=args.allow_pickle, tokenizer=args.tokenizer)
        else:
            manifest = preprocess(
                args.input, args.output, bucket_width=args.bucket_width, min_len=args.min_len,
                max_len=args.max_len, num_workers=args.num_workers, zstd_level=args.zstd_level,
                vocab_size=args.vocab_size, eos_id=args.eos_id, dict_size=args.dict_size,
                frame_kb=args.frame_kb, short=args.short, overwrite=args.overwrite,
                compare=not args.no_compare, quiet=args.quiet, bin_dtype=args.bin_dtype, tokenizer=args.tokenizer)
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, _Terminated) else "interrupted"
        print(f"{what}: {args.output} was not written (left as it was)", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(format_summary(manifest, args.output))
    warning = larger_than_input(manifest)
    if warning:
        print(f"warning: {args.output}: {warning}", file=sys.stderr)
    return 0


def larger_than_input(manifest: dict) -> str | None:
    """What to say when the shards take more bytes than the input files they came from (None: fewer)."""
    c = manifest.get("compression") or {}
    ratio, stored, given = c.get("ratio_input_files"), c.get("stored_bytes"), c.get("input_file_bytes")
    if not isinstance(ratio, (int, float)) or ratio >= 1:
        return None
    return (f"the shards take {stored:,} bytes, more than the {given:,} of the input files ({ratio:.2f}x): "
            "positions, loss masks, padding to --bucket-width and per-frame dictionaries cost more than zstd saves "
            "on this data (random-looking tokens compress little); a wider --frame-kb or a higher --zstd-level "
            "may help")

def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n"))


if __name__ == "__main__":
    sys.exit(main())
