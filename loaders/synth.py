"""Deterministic synthetic tokenized corpus (the embedded default dataset).

Token streams with the statistics of tokenized text that compression and I/O are sensitive to (Zipf-Mandelbrot
tokens and words, recurring phrases, topic words, a mixture of document lengths), bit-reproducible from a seed,
and writers for the three input formats of the preprocessor. The model of text and its consequences are
described in docs/loaders.md ("The synthetic corpus").

Its VLA variant (``VLASynthSpec``, ``generate_vla``, ``write_vla_npz``, ``write_vla_shards``, defined in
``loaders.vla.synth``): tabletop images, pick-up instructions and action chunks that follow from both
(docs/loaders.md, "VLA records").

CLI::

    python -m loaders.synth --output data/synth.bin [--format bin|npz|npy]
        [--docs N] [--vocab V] [--mean-len L] [--seed S]
    python -m loaders.synth --kind vla --output data/vla.npz [--samples N] [--image-size H [W]]
        [--text-len T] [--action-shape K A] [--layout nchw|nhwc] [--vocab V] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.files import atomic_write
from .vla.synth import (VLA_COLOURS, VLA_SHAPES, VLA_WORDS, VLASynthSpec, generate_vla, iter_vla_samples,
                         write_vla_npz, write_vla_shards)

__all__ = [
    "SynthSpec",
    "VLASynthSpec",
    "VLA_COLOURS",
    "VLA_SHAPES",
    "VLA_WORDS",
    "generate_vla",
    "iter_vla_samples",
    "write_vla_npz",
    "write_vla_shards",
    "generate_documents",
    "write_bin",
    "write_npz",
    "write_npy",
    "corpus_stats",
    "main",
]

# ---------------------------------------------------------------------------
# Model constants (not part of the spec: they shape "text-likeness").
# ---------------------------------------------------------------------------
_P_FOLLOW = 0.4  # share of word positions that follow the previous word
_P_TOPIC = 0.1  # share of word positions drawn from the document's topic words
_P_GLOBAL = 1.0 - _P_FOLLOW - _P_TOPIC
_N_SUCC = 8  # successor-list size per word
_N_TOPIC = 16  # topic words per document
_TOPIC_MIN_RANK = 50  # topic words are drawn (log-uniformly) from ranks >= this
_MAX_WORD_TOKENS = 6
_SHORT_MAX = 256  # upper end of the short-text tail
_ID_JITTER = 0.35  # log-normal sigma of the rank -> id jitter
_MAX_VOCAB = 1 << 24  # generation is O(vocab); keep it bounded
_WORDS_SLACK = 1.1  # over-generation factor of words per document
_ZIPF_Q = 2.7  # Zipf-Mandelbrot rank offset (Mandelbrot's fit to word counts)
_TOKEN_A_SCALE = 0.9  # token-unigram exponent = zipf_a * this
_WORDS_PER_TOKEN = 2  # lexicon size relative to vocab_size
_MAX_WORDS = 100_000
_LEN_BASE = 0.3  # word length ~ 1 + Poisson(_LEN_BASE + _LEN_SLOPE * log10(rank + 1))
_LEN_SLOPE = 0.45


@dataclass(kw_only=True)
class SynthSpec:
    """Parameters of a synthetic corpus; validated on construction."""

    vocab_size: int = 4096
    """Vocabulary size; token ids are in [0, vocab_size). The default is the ``tiny`` model preset's, so that the
    default corpus trains the default model (tests/loaders/test_synth.py keeps them equal)."""
    num_docs: int = 1000
    """Number of documents to generate."""
    mean_len: float = 2048.0
    """Mean (in tokens) of the log-normal body of the document-length distribution."""
    sigma: float = 0.6
    """Sigma (log-space standard deviation) of the log-normal length body."""
    short_frac: float = 0.15
    """Share of documents drawn from the short-text tail, uniform in [min_doc_len, 256]."""
    min_doc_len: int = 8
    """Lower clip of document lengths (tokens, EOS not counted)."""
    max_doc_len: int = 16384
    """Upper clip of document lengths (tokens, EOS not counted)."""
    zipf_a: float = 1.1
    """Zipf exponent of the token unigram and of the word frequencies."""
    eos_id: int | None = None
    """End-of-document id, never emitted inside documents; None means vocab_size - 1."""
    seed: int = 0
    """Seed of the generator; same spec -> bit-identical corpus."""

    def __post_init__(self) -> None:
        _check_int("vocab_size", self.vocab_size, 2, _MAX_VOCAB)
        _check_int("num_docs", self.num_docs, 1, None)
        _check_float("mean_len", self.mean_len, 1.0, None, "a finite number >= 1")
        _check_float("sigma", self.sigma, 0.0, 10.0, "a finite number in [0, 10]")
        _check_float("short_frac", self.short_frac, 0.0, 1.0, "a number in [0, 1]")
        _check_int("min_doc_len", self.min_doc_len, 1, None)
        _check_int("max_doc_len", self.max_doc_len, self.min_doc_len, None,
                   "an int >= min_doc_len")
        _check_float("zipf_a", self.zipf_a, 0.0, 10.0, "a finite number in (0, 10]")
        if self.zipf_a == 0.0:
            raise ValueError(f"SynthSpec.zipf_a={self.zipf_a!r}: must be > 0")
        if self.eos_id is not None:
            _check_int("eos_id", self.eos_id, 0, self.vocab_size - 1,
                       f"None or an int in [0, vocab_size - 1 = {self.vocab_size - 1}]")
        _check_int("seed", self.seed, 0, None)

    @property
    def resolved_eos_id(self) -> int:
        """The EOS id actually used: ``eos_id`` or ``vocab_size - 1``."""
        return self.vocab_size - 1 if self.eos_id is None else int(self.eos_id)

    @property
    def dtype(self) -> np.dtype:
        """Token dtype of generated documents: uint16 if vocab_size <= 65536 else uint32."""
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value: object, lo: int, hi: int | None,
               allowed: str | None = None) -> None:
    if allowed is None:
        allowed = f"an int in [{lo}, {hi}]" if hi is not None else f"an int >= {lo}"
    if not _is_int(value) or value < lo or (hi is not None and value > hi):  # type: ignore[operator]
        raise ValueError(f"SynthSpec.{name}={value!r}: must be {allowed}")


def _check_float(name: str, value: object, lo: float, hi: float | None, allowed: str) -> None:
    ok = (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_))
          and math.isfinite(float(value))  # type: ignore[arg-type]
          and float(value) >= lo  # type: ignore[arg-type]
          and (hi is None or float(value) <= hi))  # type: ignore[arg-type]
    if not ok:
        raise ValueError(f"SynthSpec.{name}={value!r}: must be {allowed}")


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------
def _zipf_cdf(n: int, a: float, q: float = 0.0) -> np.ndarray:
    """CDF over ranks 0..n-1 with P(r) proportional to (r + 1 + q) ** -a (Zipf-Mandelbrot)."""
    w = (np.arange(1, n + 1, dtype=np.float64) + q) ** -a
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return cdf


def _draw(cdf: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """Inverse-CDF sampling of ``size`` ranks (int32)."""
    idx = np.searchsorted(cdf, rng.random(size), side="right")
    np.minimum(idx, cdf.size - 1, out=idx)
    return idx.astype(np.int32, copy=False)


@dataclass
class _Lexicon:
    tokens: np.ndarray  # flat token ids of all words (spec dtype)
    offsets: np.ndarray  # int64 start of each word in ``tokens``
    lengths: np.ndarray  # int64 tokens per word
    word_cdf: np.ndarray  # Zipf CDF over word ranks
    succ: np.ndarray  # int32 [W, _N_SUCC] successor lists
    succ_cdf: np.ndarray  # Zipf CDF over successor slots
    topic_cdf: np.ndarray  # Zipf CDF over a document's topic slots
    mean_word_len: float  # expected tokens per globally drawn word


def _build_lexicon(spec: SynthSpec, rng: np.random.Generator) -> _Lexicon:
    n_tok = spec.vocab_size - 1  # every id except EOS
    eos = spec.resolved_eos_id
    # Popularity rank -> id, roughly in rank order (BPE-like: frequent = small ids).
    key = np.arange(1, n_tok + 1, dtype=np.float64) * np.exp(
        _ID_JITTER * rng.standard_normal(n_tok))
    id_of_rank = np.empty(n_tok, dtype=np.int64)
    id_of_rank[np.argsort(key, kind="stable")] = np.arange(n_tok, dtype=np.int64)
    id_of_rank += id_of_rank >= eos  # skip the EOS id

    n_words = int(np.clip(_WORDS_PER_TOKEN * spec.vocab_size, 512, _MAX_WORDS))
    rank = np.arange(n_words, dtype=np.float64)
    lam = _LEN_BASE + _LEN_SLOPE * np.log10(rank + 1.0)  # rarer words have more pieces
    lengths = np.minimum(1 + rng.poisson(lam), _MAX_WORD_TOKENS).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    # Pieces of multi-token words come from the Zipf token unigram; single-token
    # words get their own token, in word-rank order while ranks last (as a BPE
    # vocabulary holds its frequent words whole).
    tok_rank = _draw(_zipf_cdf(n_tok, spec.zipf_a * _TOKEN_A_SCALE, _ZIPF_Q), rng,
                     int(lengths.sum())).astype(np.int64)
    single = np.flatnonzero(lengths == 1)[:n_tok]
    tok_rank[offsets[single]] = np.arange(single.size)
    tokens = id_of_rank[tok_rank].astype(spec.dtype)

    word_cdf = _zipf_cdf(n_words, spec.zipf_a, _ZIPF_Q)
    succ = _draw(word_cdf, rng, n_words * _N_SUCC).reshape(n_words, _N_SUCC)
    pmf = np.diff(word_cdf, prepend=0.0)
    return _Lexicon(
        tokens=tokens, offsets=offsets, lengths=lengths, word_cdf=word_cdf, succ=succ,
        succ_cdf=_zipf_cdf(_N_SUCC, spec.zipf_a), topic_cdf=_zipf_cdf(_N_TOPIC, spec.zipf_a),
        mean_word_len=float(pmf @ lengths),
    )


def _doc_lengths(spec: SynthSpec, rng: np.random.Generator) -> np.ndarray:
    n = spec.num_docs
    mu = math.log(spec.mean_len) - 0.5 * spec.sigma ** 2  # so that E[body] = mean_len
    body = np.rint(rng.lognormal(mu, spec.sigma, n))
    short_hi = max(spec.min_doc_len, min(_SHORT_MAX, spec.max_doc_len))
    short = rng.integers(spec.min_doc_len, short_hi + 1, n)
    is_short = rng.random(n) < spec.short_frac
    lengths = np.where(is_short, short, np.clip(body, 1, 2 ** 62))
    return np.clip(lengths, spec.min_doc_len, spec.max_doc_len).astype(np.int64)


def _word_streams(lex: _Lexicon, nw: np.ndarray, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Word ids for a batch of documents with ``nw[i]`` words each (flat, int32).

    Returns ``(words, doc_of_word)``.
    """
    nb = nw.size
    n = int(nw.sum())
    doc_of = np.repeat(np.arange(nb, dtype=np.int64), nw)
    first = np.cumsum(nw) - nw  # index of each document's first word

    u = rng.random(n)
    follow = u < _P_FOLLOW
    topic = (u >= _P_FOLLOW) & (u < _P_FOLLOW + _P_TOPIC)
    follow[first] = False  # documents start fresh...
    topic[first] = False  # ...with a global word
    glob = ~(follow | topic)

    words = np.empty(n, dtype=np.int32)
    words[glob] = _draw(lex.word_cdf, rng, int(glob.sum()))

    # Topic words: _N_TOPIC per document, log-uniform over ranks >= _TOPIC_MIN_RANK.
    n_words = lex.lengths.size
    lo = math.log(min(_TOPIC_MIN_RANK, n_words - 1))
    topics = np.exp(rng.uniform(lo, math.log(n_words), (nb, _N_TOPIC))).astype(np.int32)
    np.minimum(topics, n_words - 1, out=topics)
    tpos = np.flatnonzero(topic)
    words[tpos] = topics[doc_of[tpos], _draw(lex.topic_cdf, rng, tpos.size)]

    # Follow words: resolve chains level by level (depth = distance to the
    # last non-follow word), all positions of one level at once.
    fpos = np.flatnonzero(follow)
    if fpos.size:
        idx = np.arange(n, dtype=np.int64)
        anchor = np.maximum.accumulate(np.where(follow, 0, idx))
        depth = (idx - anchor)[fpos]
        max_depth = int(depth.max())
        depth_small = depth.astype(np.uint8 if max_depth < 256 else np.uint32)
        order = np.argsort(depth_small, kind="stable")  # radix sort for uint8
        fpos = fpos[order]
        slot = _draw(lex.succ_cdf, rng, fpos.size)
        bounds = np.cumsum(np.bincount(depth_small, minlength=max_depth + 1))
        for d in range(1, max_depth + 1):
            p = fpos[bounds[d - 1]:bounds[d]]
            words[p] = lex.succ[words[p - 1], slot[bounds[d - 1]:bounds[d]]]
    return words, doc_of


def generate_documents(spec: SynthSpec) -> list[np.ndarray]:
    """Generate ``spec.num_docs`` token documents (deterministic in ``spec``).

    Returns a list of 1-D arrays of dtype ``spec.dtype`` (uint16 for
    vocab_size <= 65536, else uint32); they are views into one contiguous
    buffer.  No document contains ``spec.resolved_eos_id``; all ids are
    < ``vocab_size``.  See docs/loaders.md ("The synthetic corpus") for the model of text.
    """
    lex_ss, len_ss, doc_ss = np.random.SeedSequence(spec.seed).spawn(3)
    lex = _build_lexicon(spec, np.random.default_rng(lex_ss))
    need = _doc_lengths(spec, np.random.default_rng(len_ss))
    rng = np.random.default_rng(doc_ss)

    starts = np.concatenate(([0], np.cumsum(need)[:-1])).astype(np.int64)
    out = np.empty(int(need.sum()), dtype=spec.dtype)
    pending = np.arange(spec.num_docs, dtype=np.int64)
    slack = _WORDS_SLACK
    while pending.size:
        need_b = need[pending]
        nw = np.ceil(need_b / lex.mean_word_len * slack).astype(np.int64) + 4
        words, doc_of = _word_streams(lex, nw, rng)
        wl = lex.lengths[words]
        # Token position of each word inside its document.
        wstart = np.cumsum(wl) - wl
        first = np.cumsum(nw) - nw
        pos = wstart - np.repeat(wstart[first], nw)
        got = np.add.reduceat(wl, first)
        ok = got >= need_b
        # Keep the words that start inside their (fully covered) document and
        # take from each only the tokens that fit (cuts each document's last word).
        need_w = np.repeat(np.where(ok, need_b, 0), nw)
        keepw = pos < need_w
        words, take = words[keepw], np.minimum(wl[keepw], need_w[keepw] - pos[keepw])
        total = int(take.sum())  # == need_b[ok].sum()
        tstart = np.cumsum(take) - take
        src = np.repeat(lex.offsets[words] - tstart, take)
        src += np.arange(total, dtype=np.int64)
        toks = lex.tokens[src]  # ok documents, concatenated in order
        if ok.all() and pending.size == spec.num_docs:
            out[:] = toks
        else:
            need_ok = need_b[ok]
            dest = np.repeat(starts[pending[ok]] - (np.cumsum(need_ok) - need_ok), need_ok)
            dest += np.arange(total, dtype=np.int64)
            out[dest] = toks
        pending = pending[~ok]
        slack *= 1.5
    return np.split(out, starts[1:]) if spec.num_docs > 1 else [out]


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------
def _as_docs(docs: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for i, d in enumerate(docs):
        a = np.asarray(d)
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise ValueError(f"docs[{i}]: expected a 1-D integer array, got "
                             f"shape {a.shape} dtype {a.dtype}")
        if a.size and np.issubdtype(a.dtype, np.signedinteger) and a.min() < 0:
            raise ValueError(f"docs[{i}]: negative token id {int(a.min())}")
        out.append(a)
    return out


def _flat_stream(docs: Sequence[np.ndarray], eos_id: int, dtype: np.dtype) -> np.ndarray:
    """Documents concatenated, each followed by ``eos_id``, as ``dtype``."""
    arrs = _as_docs(docs)
    lens = np.fromiter((a.size for a in arrs), dtype=np.int64, count=len(arrs))
    out = np.empty(int(lens.sum()) + len(arrs), dtype=dtype)
    if not arrs:
        return out
    eos_pos = np.cumsum(lens + 1) - 1
    is_tok = np.ones(out.size, dtype=bool)
    is_tok[eos_pos] = False
    flat = np.concatenate(arrs) if lens.sum() else np.empty(0, dtype=dtype)
    if flat.size and np.any(flat == eos_id):
        bad = int(np.searchsorted(np.cumsum(lens), np.flatnonzero(flat == eos_id)[0],
                                  side="right"))
        raise ValueError(f"docs[{bad}] contains eos_id={eos_id}; the EOS-separated "
                         "stream could not be split back into documents")
    out[is_tok] = flat
    out[eos_pos] = eos_id
    return out


def _max_id(docs: list[np.ndarray]) -> int:
    return max((int(a.max()) for a in docs if a.size), default=0)


def write_bin(docs: Sequence[np.ndarray], path: str | os.PathLike[str], eos_id: int) -> Path:
    """Write a nanoGPT/Megatron-style flat ``uint16`` stream (raw bytes, no header).

    Documents are concatenated, each followed by ``eos_id``.  Raises
    ValueError if any id (or ``eos_id``) is >= 65536 or negative, or if a
    document contains ``eos_id``.  Atomic (temp file + os.replace).
    Read back with ``np.fromfile(path, dtype=np.uint16)``.
    """
    arrs = _as_docs(docs)
    if not _is_int(eos_id) or not 0 <= eos_id < 1 << 16:
        raise ValueError(f"eos_id={eos_id!r}: .bin is uint16, must be an int in [0, 65535]")
    top = _max_id(arrs)
    if top >= 1 << 16:
        raise ValueError(f"token id {top} >= 65536 does not fit the uint16 .bin format; "
                         "use write_npy or write_npz")
    stream = _flat_stream(arrs, int(eos_id), np.dtype(np.uint16))
    return atomic_write(path, lambda f: f.write(memoryview(stream.astype("<u2", copy=False))))


def write_npz(docs: Sequence[np.ndarray], path: str | os.PathLike[str], pad_id: int = 0,
              row_len: int | None = None) -> Path:
    """Write an HF-tokenizer-style ``.npz`` with ``input_ids`` and ``attention_mask``.

    Both are int64 arrays of shape ``[num_docs, row_len]``: ``input_ids`` is
    right-padded with ``pad_id`` and ``attention_mask`` is 1 on real tokens,
    0 on padding.  ``row_len`` defaults to the longest document; documents
    longer than ``row_len`` are **truncated** to their first ``row_len``
    tokens (the rest is dropped, no overflow rows).  Atomic (temp file +
    os.replace); uncompressed ``np.savez``.
    """
    arrs = _as_docs(docs)
    if not _is_int(pad_id) or not -(1 << 63) <= pad_id < 1 << 63:
        raise ValueError(f"pad_id={pad_id!r}: must be an int64")
    lens = np.fromiter((a.size for a in arrs), dtype=np.int64, count=len(arrs))
    if row_len is None:
        row_len = int(lens.max()) if lens.size else 0
    elif not _is_int(row_len) or row_len < 1:
        raise ValueError(f"row_len={row_len!r}: must be None or an int >= 1")
    row_len = int(row_len)
    if _max_id(arrs) >= 1 << 63:
        raise ValueError("token ids do not fit int64")
    kept = np.minimum(lens, row_len)
    mask = np.arange(row_len, dtype=np.int64)[None, :] < kept[:, None]
    input_ids = np.full((len(arrs), row_len), int(pad_id), dtype=np.int64)
    if kept.sum():
        input_ids[mask] = np.concatenate([a[:row_len] for a in arrs]).astype(np.int64)
    attention_mask = mask.astype(np.int64)
    return atomic_write(path, lambda f: np.savez(f, input_ids=input_ids,
                                                  attention_mask=attention_mask))


def write_npy(docs: Sequence[np.ndarray], path: str | os.PathLike[str], eos_id: int) -> Path:
    """Write the flat EOS-separated stream (same content as ``.bin``) as a 1-D ``.npy``.

    The dtype is the smallest unsigned integer type holding every id and
    ``eos_id`` (uint8/16/32/64).  Raises ValueError on negative ids or if a
    document contains ``eos_id``.  Atomic (temp file + os.replace).
    """
    arrs = _as_docs(docs)
    if not _is_int(eos_id) or eos_id < 0:
        raise ValueError(f"eos_id={eos_id!r}: must be an int >= 0")
    top = max(_max_id(arrs), int(eos_id))
    dtype = next(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)
                 if top <= np.iinfo(t).max)
    stream = _flat_stream(arrs, int(eos_id), dtype)
    return atomic_write(path, lambda f: np.save(f, stream, allow_pickle=False))


# ---------------------------------------------------------------------------
# Stats and CLI
# ---------------------------------------------------------------------------
def corpus_stats(docs: Sequence[np.ndarray]) -> dict[str, Any]:
    """Length statistics (tokens, EOS not counted) of a list of documents.

    Keys: num_docs, total_tokens, mean_len, median_len, p10_len, p90_len,
    min_len, max_len (plain Python numbers; all 0 for an empty list).
    """
    lens = np.fromiter((np.asarray(d).size for d in docs), dtype=np.int64)
    if lens.size == 0:
        return {"num_docs": 0, "total_tokens": 0, "mean_len": 0.0, "median_len": 0.0,
                "p10_len": 0.0, "p90_len": 0.0, "min_len": 0, "max_len": 0}
    p10, p50, p90 = np.percentile(lens, [10, 50, 90])
    return {
        "num_docs": int(lens.size),
        "total_tokens": int(lens.sum()),
        "mean_len": float(lens.mean()),
        "median_len": float(p50),
        "p10_len": float(p10),
        "p90_len": float(p90),
        "min_len": int(lens.min()),
        "max_len": int(lens.max()),
    }


_FORMATS = ("bin", "npz", "npy")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: generate a corpus, write it, print stats as JSON."""
    kind = argparse.ArgumentParser(add_help=False)
    kind.add_argument("--kind", choices=("tokens", "vla"), default="tokens")
    known, rest = kind.parse_known_args(argv)
    if known.kind == "vla":  # its own flags (and --help)
        return _main_vla(rest)
    p = argparse.ArgumentParser(prog="python -m loaders.synth",
                                description="Write a deterministic synthetic tokenized corpus "
                                            "(--kind vla: a VLA one; --kind vla --help for its flags).")
    p.add_argument("--kind", choices=("tokens", "vla"), default="tokens", help="tokens (default) or vla")
    p.add_argument("--output", required=True, help="output file (.bin, .npz or .npy)")
    p.add_argument("--format", choices=_FORMATS, default=None,
                   help="output format (default: from the --output extension)")
    p.add_argument("--docs", type=int, default=SynthSpec.num_docs, help="number of documents (default %(default)s)")
    p.add_argument("--vocab", type=int, default=SynthSpec.vocab_size,
                   help="vocabulary size (default %(default)s, the tiny model's)")
    p.add_argument("--mean-len", type=float, default=SynthSpec.mean_len,
                   help="mean of the log-normal document-length body (default %(default)s)")
    p.add_argument("--seed", type=int, default=SynthSpec.seed, help="generator seed (default %(default)s)")
    args = p.parse_args(argv)

    fmt = args.format
    if fmt is None:
        ext = Path(args.output).suffix.lower().lstrip(".")
        if ext not in _FORMATS:
            p.error(f"cannot infer --format from {args.output!r}; use --format {{bin,npz,npy}}")
        fmt = ext
    try:
        spec = SynthSpec(vocab_size=args.vocab, num_docs=args.docs, mean_len=args.mean_len,
                         seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    if fmt == "bin" and spec.vocab_size > 1 << 16:
        p.error(f"--vocab {spec.vocab_size} does not fit the uint16 .bin format; use npy/npz")

    docs = generate_documents(spec)
    if fmt == "bin":
        path = write_bin(docs, args.output, spec.resolved_eos_id)
    elif fmt == "npy":
        path = write_npy(docs, args.output, spec.resolved_eos_id)
    else:
        path = write_npz(docs, args.output)
    stats = {"path": str(path), "format": fmt, "vocab_size": spec.vocab_size,
             "eos_id": spec.resolved_eos_id, "seed": spec.seed, **corpus_stats(docs)}
    json.dump(stats, sys.stdout, indent=2)
    sys.stdout.write("\n")
    # the command that turns it into shards, on stderr (stdout stays one JSON document): a .bin or .npy stream
    # needs the EOS id that splits it into documents, and every input the vocabulary its ids come from
    eos = f" --eos-id {spec.resolved_eos_id}" if fmt in ("bin", "npy") else ""
    print(f"next: python -m loaders.preprocess --input {shlex.quote(str(path))} --output shards "
          f"--vocab-size {spec.vocab_size}{eos}", file=sys.stderr)
    return 0


def _main_vla(argv: list[str]) -> int:
    """``--kind vla``: generate a VLA corpus, write its .npz, print its figures as JSON."""
    d = VLASynthSpec()
    p = argparse.ArgumentParser(prog="python -m loaders.synth --kind vla",
                                description="Write a deterministic synthetic VLA corpus (.npz: images, tokens, "
                                            "lengths, actions) for python -m loaders.preprocess --kind vla.")
    p.add_argument("--output", required=True, help="output .npz")
    p.add_argument("--samples", type=int, default=d.num_samples, help="samples (default %(default)s)")
    p.add_argument("--image-size", type=int, nargs="+", default=list(d.image_size), metavar="PX",
                   help="H [W] (default %(default)s)")
    p.add_argument("--text-len", type=int, default=d.text_len, help="padded instruction width (default %(default)s)")
    p.add_argument("--action-shape", type=int, nargs=2, default=list(d.action_shape), metavar=("K", "A"),
                   help="steps and dims of an action chunk (default %(default)s)")
    p.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw", help="images axis order (default nchw)")
    p.add_argument("--vocab", type=int, default=d.vocab_size, help="vocabulary size (default %(default)s)")
    p.add_argument("--noise", type=float, default=d.noise, help="pixel noise std (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="generator seed (default %(default)s)")
    args = p.parse_args(argv)
    if not args.output.endswith(".npz"):
        p.error(f"--output {args.output!r}: the VLA corpus is an .npz")
    size = args.image_size * 2 if len(args.image_size) == 1 else args.image_size
    try:
        spec = VLASynthSpec(num_samples=args.samples, image_size=tuple(size), text_len=args.text_len,
                            action_steps=args.action_shape[0], action_dim=args.action_shape[1],
                            vocab_size=args.vocab, noise=args.noise, seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    data = generate_vla(spec)
    path = write_vla_npz(data, args.output, layout=args.layout)
    lens = data["lengths"]
    stats = {"path": str(path), "kind": "vla", "samples": spec.num_samples, "image_shape": list(spec.image_shape),
             "layout": args.layout, "text_len": spec.text_len, "action_shape": list(spec.action_shape),
             "vocab_size": spec.vocab_size, "seed": spec.seed, "mean_text_len": float(lens.mean()),
             "max_text_len": int(lens.max())}
    json.dump(stats, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
