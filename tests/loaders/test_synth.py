"""Tests for loaders.synth: determinism, value ranges, length distribution,
text-like compressibility, the three writers and spec validation."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
import zstandard as zstd

from loaders import synth
from loaders.synth import (
    SynthSpec,
    corpus_stats,
    generate_documents,
    write_bin,
    write_npy,
    write_npz,
)

SMALL = dict(num_docs=200, mean_len=256.0)  # ~50k tokens: cheap


@pytest.fixture(scope="module")
def default_docs() -> tuple[SynthSpec, list[np.ndarray]]:
    """2000 documents with the default length model (~3.5M tokens, well under 1 s), over a 32,000-token
    vocabulary (a real tokenizer's size: the text-structure tests need the long tail)."""
    spec = SynthSpec(num_docs=2000, vocab_size=32000, seed=1)
    return spec, generate_documents(spec)


@pytest.fixture(scope="module")
def small_docs() -> tuple[SynthSpec, list[np.ndarray]]:
    spec = SynthSpec(**SMALL, seed=7)
    return spec, generate_documents(spec)


def _split_on_eos(stream: np.ndarray, eos: int) -> list[np.ndarray]:
    ends = np.flatnonzero(stream == eos)
    assert ends.size == 0 or ends[-1] == stream.size - 1, "stream must end with EOS"
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [stream[s:e] for s, e in zip(starts, ends)]


# ---------------------------------------------------------------------------
# Determinism and value ranges
# ---------------------------------------------------------------------------
def test_same_spec_is_bit_identical(small_docs):
    spec, docs = small_docs
    again = generate_documents(SynthSpec(**SMALL, seed=7))
    assert len(again) == len(docs) == spec.num_docs
    for a, b in zip(docs, again):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_different_seed_differs(small_docs):
    _, docs = small_docs
    other = generate_documents(SynthSpec(**SMALL, seed=8))
    lens_a = [d.size for d in docs]
    lens_b = [d.size for d in other]
    assert lens_a != lens_b
    n = min(docs[0].size, other[0].size)
    # Different lexicon and streams: the first documents share almost no positions.
    assert np.mean(docs[0][:n] == other[0][:n]) < 0.2


def test_ids_in_range_no_eos_and_dtype(small_docs):
    spec, docs = small_docs
    flat = np.concatenate(docs)
    assert flat.dtype == np.uint16 == spec.dtype
    assert int(flat.max()) < spec.vocab_size
    assert spec.resolved_eos_id == spec.vocab_size - 1
    assert not np.any(flat == spec.resolved_eos_id)
    assert all(spec.min_doc_len <= d.size <= spec.max_doc_len for d in docs)


def test_custom_eos_and_large_vocab_dtype():
    spec = SynthSpec(vocab_size=100_000, num_docs=50, mean_len=300.0, eos_id=0, seed=2)
    flat = np.concatenate(generate_documents(spec))
    assert flat.dtype == np.uint32
    assert int(flat.max()) < 100_000 and int(flat.min()) >= 1  # 0 is EOS
    assert np.unique(flat).size > 1000  # real use of the large vocabulary


def test_tiny_vocab_and_clipped_lengths():
    spec = SynthSpec(vocab_size=3, num_docs=100, mean_len=20.0, min_doc_len=5,
                     max_doc_len=12, eos_id=1)
    docs = generate_documents(spec)
    flat = np.concatenate(docs)
    assert set(np.unique(flat).tolist()) <= {0, 2}
    assert all(5 <= d.size <= 12 for d in docs)


# ---------------------------------------------------------------------------
# Length distribution
# ---------------------------------------------------------------------------
def _mixture_cdf(x: float, spec: SynthSpec) -> float:
    mu = math.log(spec.mean_len) - spec.sigma ** 2 / 2
    body = NormalDist(mu, spec.sigma).cdf(math.log(x + 0.5))
    short = min(1.0, max(0.0, (math.floor(x) - spec.min_doc_len + 1) / (256 - spec.min_doc_len + 1)))
    return spec.short_frac * short + (1 - spec.short_frac) * body


def test_length_distribution(default_docs):
    spec, docs = default_docs
    lens = np.array([d.size for d in docs])
    # Median of the short-tail + log-normal mixture, by bisection on its CDF.
    lo, hi = 1.0, float(spec.max_doc_len)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _mixture_cdf(mid, spec) < 0.5 else (lo, mid)
    expected_median = lo  # ~1512 for the defaults
    assert 1300 < expected_median < 1700
    assert abs(np.median(lens) / expected_median - 1) < 0.25

    short_share = np.mean(lens <= 256)
    assert abs(short_share - _mixture_cdf(256, spec)) < 0.03
    assert abs(short_share - spec.short_frac) < 0.04

    body = lens[lens > 256]  # the log-normal body: its mean is mean_len
    assert abs(body.mean() / spec.mean_len - 1) < 0.1


def test_short_frac_extremes():
    none_short = generate_documents(SynthSpec(num_docs=300, short_frac=0.0, mean_len=4096.0))
    assert np.mean([d.size <= 256 for d in none_short]) < 0.01
    all_short = generate_documents(SynthSpec(num_docs=300, short_frac=1.0))
    assert all(8 <= d.size <= 256 for d in all_short)


# ---------------------------------------------------------------------------
# Text-like structure
# ---------------------------------------------------------------------------
def test_zstd_compresses_synthetic_but_not_uniform(default_docs):
    spec, docs = default_docs
    raw = np.concatenate(docs)[:1_000_000].astype("<u2").tobytes()
    assert len(raw) == 2_000_000
    cctx = zstd.ZstdCompressor(level=3)
    ratio = len(raw) / len(cctx.compress(raw))
    assert ratio >= 1.5, ratio

    rand = np.random.default_rng(0).integers(0, spec.vocab_size, 1_000_000)
    rand_raw = rand.astype("<u2").tobytes()
    assert len(cctx.compress(rand_raw)) >= 0.95 * len(rand_raw)


def test_zipf_like_unigram(default_docs):
    _, docs = default_docs
    flat = np.concatenate(docs)[:1_000_000]
    counts = np.sort(np.bincount(flat))[::-1]
    share = counts / counts.sum()
    assert 0.01 < share[0] < 0.15  # a "the", not a degenerate stream
    assert share[:100].sum() > 0.3  # heavy head
    assert (counts > 0).sum() > 5000  # long tail actually used
    # Frequent tokens get small ids (BPE-like): high byte skewed towards 0.
    assert np.median(flat) < 4000


def test_zstd_dictionary_helps_on_short_docs(small_docs):
    _, docs = small_docs
    blobs = [d.astype("<u2").tobytes() for d in docs]
    train, test = blobs[:150], blobs[150:]
    dict_data = zstd.train_dictionary(16384, train)
    plain = zstd.ZstdCompressor(level=3)
    with_dict = zstd.ZstdCompressor(level=3, dict_data=dict_data)
    size_plain = sum(len(plain.compress(b)) for b in test)
    size_dict = sum(len(with_dict.compress(b)) for b in test)
    assert size_dict < 0.85 * size_plain


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------
def test_write_bin_round_trip(small_docs, tmp_path):
    spec, docs = small_docs
    path = write_bin(docs, tmp_path / "c.bin", spec.resolved_eos_id)
    stream = np.fromfile(path, dtype=np.uint16)
    assert stream.size == sum(d.size for d in docs) + len(docs)
    back = _split_on_eos(stream, spec.resolved_eos_id)
    assert len(back) == len(docs)
    assert all(np.array_equal(a, b) for a, b in zip(back, docs))
    assert sorted(os.listdir(tmp_path)) == ["c.bin"]  # no temp file left behind


def test_write_bin_rejects_wide_ids(tmp_path):
    with pytest.raises(ValueError, match="65536"):
        write_bin([np.array([1, 70_000], dtype=np.uint32)], tmp_path / "x.bin", 0)
    with pytest.raises(ValueError, match="eos_id"):
        write_bin([np.array([1, 2])], tmp_path / "x.bin", 65536)
    with pytest.raises(ValueError, match="eos_id"):  # EOS inside a document
        write_bin([np.array([1, 2]), np.array([3, 9, 4])], tmp_path / "x.bin", 9)
    assert not any(tmp_path.iterdir())


def test_write_npy_round_trip_and_dtype(small_docs, tmp_path):
    spec, docs = small_docs
    path = write_npy(docs, tmp_path / "c.npy", spec.resolved_eos_id)
    stream = np.load(path)
    assert stream.ndim == 1 and stream.dtype == np.uint16
    assert np.array_equal(stream, np.fromfile(write_bin(docs, tmp_path / "c.bin",
                                                        spec.resolved_eos_id), np.uint16))
    back = _split_on_eos(stream, spec.resolved_eos_id)
    assert all(np.array_equal(a, b) for a, b in zip(back, docs)) and len(back) == len(docs)

    small = [np.array([1, 2, 3]), np.array([4])]
    assert np.load(write_npy(small, tmp_path / "u8.npy", 255)).dtype == np.uint8
    wide = [np.array([1, 70_000], dtype=np.uint32)]
    assert np.load(write_npy(wide, tmp_path / "u32.npy", 0)).dtype == np.uint32


def test_write_npz_round_trip(small_docs, tmp_path):
    _, docs = small_docs
    path = write_npz(docs, tmp_path / "c.npz", pad_id=0)
    with np.load(path) as z:
        ids, mask = z["input_ids"], z["attention_mask"]
    longest = max(d.size for d in docs)
    assert ids.shape == mask.shape == (len(docs), longest)
    assert ids.dtype == mask.dtype == np.int64
    assert set(np.unique(mask).tolist()) == {0, 1}
    assert np.array_equal(mask.sum(1), [d.size for d in docs])
    for row, m, d in zip(ids, mask, docs):
        assert np.array_equal(row[m == 1], d)
        assert np.all(row[m == 0] == 0)
        assert np.all(np.diff(m) <= 0)  # right padding


def test_write_npz_truncates_and_pads(tmp_path):
    docs = [np.arange(1, 11), np.array([5, 6])]
    with np.load(write_npz(docs, tmp_path / "t.npz", pad_id=-100, row_len=4)) as z:
        ids, mask = z["input_ids"], z["attention_mask"]
    assert ids.tolist() == [[1, 2, 3, 4], [5, 6, -100, -100]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="row_len"):
        write_npz(docs, tmp_path / "bad.npz", row_len=0)


def test_writers_are_atomic(tmp_path, monkeypatch):
    target = tmp_path / "c.bin"
    target.write_bytes(b"old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(synth.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_bin([np.array([1, 2])], target, 0)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["c.bin"]


# ---------------------------------------------------------------------------
# Stats and CLI
# ---------------------------------------------------------------------------
def test_corpus_stats():
    docs = [np.zeros(n, dtype=np.uint16) for n in (10, 20, 30, 40, 100)]
    st = corpus_stats(docs)
    assert st["num_docs"] == 5 and st["total_tokens"] == 200
    assert st["mean_len"] == 40.0 and st["median_len"] == 30.0
    assert st["p10_len"] == pytest.approx(14.0) and st["p90_len"] == pytest.approx(76.0)
    assert st["min_len"] == 10 and st["max_len"] == 100
    json.dumps(st)  # plain Python types
    assert corpus_stats([])["num_docs"] == 0


@pytest.mark.parametrize("fmt", ["bin", "npz", "npy"])
def test_cli(tmp_path, capsys, fmt):
    out = tmp_path / f"corpus.{fmt}"
    assert synth.main(["--output", str(out), "--docs", "30", "--vocab", "5000",
                       "--mean-len", "200", "--seed", "4"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["format"] == fmt and Path(st["path"]) == out and out.exists()
    docs = generate_documents(SynthSpec(num_docs=30, vocab_size=5000, mean_len=200.0, seed=4))
    assert st["num_docs"] == 30 and st["total_tokens"] == sum(d.size for d in docs)


def test_cli_format_flag_and_errors(tmp_path, capsys):
    out = tmp_path / "data.tokens"
    assert synth.main(["--output", str(out), "--format", "npy", "--docs", "5"]) == 0
    assert np.load(out, allow_pickle=False).ndim == 1
    with pytest.raises(SystemExit):
        synth.main(["--output", str(tmp_path / "x.txt")])  # cannot infer the format
    with pytest.raises(SystemExit):
        synth.main(["--output", str(tmp_path / "x.bin"), "--vocab", "100000"])
    with pytest.raises(SystemExit):
        synth.main(["--output", str(tmp_path / "x.bin"), "--docs", "0"])
    assert "num_docs" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", 1),
        ("vocab_size", 32000.0),
        ("vocab_size", True),
        ("num_docs", 0),
        ("mean_len", 0.0),
        ("mean_len", float("nan")),
        ("sigma", -0.1),
        ("sigma", float("inf")),
        ("short_frac", 1.5),
        ("short_frac", -0.01),
        ("min_doc_len", 0),
        ("max_doc_len", 4),  # < min_doc_len (8)
        ("zipf_a", 0.0),
        ("zipf_a", -1.0),
        ("eos_id", 32000),
        ("eos_id", -1),
        ("seed", -1),
        ("seed", "0"),
    ],
)
def test_invalid_spec_names_field(field, value):
    with pytest.raises(ValueError, match=re.escape(f"SynthSpec.{field}={value!r}")) as exc:
        SynthSpec(**{field: value})
    assert "must be" in str(exc.value)


# ---------------------------------------------------------------------------
# Speed (timing-sensitive: kept out of the default run)
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_generation_speed_10m_tokens():
    import time

    spec = SynthSpec(num_docs=5800, seed=0)  # ~10.2M tokens
    t0 = time.perf_counter()
    docs = generate_documents(spec)
    elapsed = time.perf_counter() - t0
    assert sum(d.size for d in docs) > 10_000_000
    assert elapsed < 3.0, f"{elapsed:.2f} s for 10M tokens"


def test_the_default_vocabulary_is_the_tiny_models():
    """`python -m loaders.synth` with no --vocab writes ids the default model (the tiny preset) can embed."""
    from workbench.train.model import get_preset

    assert SynthSpec().vocab_size == get_preset("tiny").vocab_size == 4096


def test_synth_prints_the_preprocess_command_that_works(tmp_path):
    """Issue 40: synth said eos_id 4095, and preprocess on its .bin then failed asking for --eos-id. synth prints
    the command (on stderr: stdout stays one JSON document), and that command, as printed, writes the shards."""
    import shlex
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "loaders.synth", "--output", "c.bin", "--docs", "60"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("next: ")]
    cmd = shlex.split(line[len("next: "):])
    assert cmd[:3] == ["python", "-m", "loaders.preprocess"] and f"--eos-id {stats['eos_id']}" in line
    p = subprocess.run([sys.executable, *cmd[1:], "--min-len", "64", "--max-len", "512", "--bucket-width", "64"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["vocab_size"] == stats["vocab_size"]


def test_shards_larger_than_their_input_are_flagged():
    from loaders.preprocess import larger_than_input

    big = {"compression": {"ratio_input_files": 0.7, "stored_bytes": 1_000_000, "input_file_bytes": 700_000}}
    assert "more than the 700,000 of the input files (0.70x)" in larger_than_input(big)
    assert larger_than_input({"compression": {"ratio_input_files": 1.2}}) is None
    assert larger_than_input({}) is None
