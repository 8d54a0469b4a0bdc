"""python -m loaders.preprocess and loaders.verify, end to end."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _signals import default_signals

from loaders.format import ShardFormatError, ShardSet, bucket_length
from loaders.inputs import iter_documents, open_input
from loaders.preprocess import preprocess
from loaders.verify import verify

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 5000
EOS = VOCAB - 1


def _run(module: str, *args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=120, **kw)


def _popen(module: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=default_signals)


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _fast(**kw) -> dict:
    return {"bucket_width": 64, "min_len": 128, "max_len": 512, "zstd_level": 3, "dict_size": 8192,
            "compare": False, "vocab_size": VOCAB, "eos_id": EOS, **kw}


def _fast_cli(*extra: str) -> list[str]:
    return ["--bucket-width", "64", "--min-len", "128", "--max-len", "512", "--zstd-level", "3",
            "--dict-size", "8192", "--vocab-size", str(VOCAB), "--eos-id", str(EOS), *extra]


def _pieces(root: Path) -> tuple[list[bytes], list[int]]:
    """Document pieces stored in a shard directory (records split where the position id restarts at 0),
    sorted; checks position ids and the loss mask rule on the way. Also returns the record lengths."""
    pieces, lengths = [], []
    with ShardSet(root) as s:
        for L, tok, pos, mask in s.iter_records():
            assert bucket_length(len(tok), s.bucket_width, int(s.manifest["max_len"])) == L
            starts = np.flatnonzero(pos == 0)
            assert starts[0] == 0
            assert np.array_equal(mask, (pos != 0).astype(np.uint8))  # 0 exactly at document starts
            for a, b in zip(starts, list(starts[1:]) + [len(tok)]):
                assert np.array_equal(pos[a:b], np.arange(b - a))
                pieces.append(np.asarray(tok[a:b], np.int64).tobytes())
            lengths.append(len(tok))
    return sorted(pieces), lengths


def _expected_pieces(docs, max_len: int, min_len: int = 0, drop: bool = False) -> list[bytes]:
    out = []
    for d in docs:
        for a in range(0, len(d), max_len):
            p = np.asarray(d[a:a + max_len], np.int64)
            if len(p) and not (drop and len(p) < min_len):
                out.append(p.tobytes())
    return sorted(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from loaders.synth import SynthSpec, generate_documents, write_bin, write_npy, write_npz

    d = tmp_path_factory.mktemp("corpus")
    docs = generate_documents(SynthSpec(vocab_size=VOCAB, num_docs=150, mean_len=400, seed=3, max_doc_len=3000))
    files = {"bin": write_bin(docs, d / "c.bin", eos_id=EOS), "npz": write_npz(docs, d / "c.npz"),
             "npy": write_npy(docs, d / "c.npy", eos_id=EOS)}
    rows = np.full((len(docs), max(map(len, docs)) + 1), EOS, np.int32)  # EOS-padded rows
    for i, doc in enumerate(docs):
        rows[i, :len(doc)] = doc
    np.save(d / "rows.npy", rows)
    files["npy2d"] = d / "rows.npy"
    return docs, files


@pytest.mark.parametrize("kind", ["bin", "npz", "npy", "npy2d"])
def test_each_format_through_the_cli(corpus, tmp_path, kind):
    docs, files = corpus
    out = tmp_path / "out"
    extra = ("--quiet",) if kind != "bin" else ()
    tok = ("--tokenizer", "meta-llama/Llama-3.2-1B") if kind == "npz" else ()
    r = _run("loaders.preprocess", "--input", str(files[kind]), "--output", str(out), "--no-compare",
             *_fast_cli(*extra, *tok))
    assert r.returncode == 0, r.stderr
    pieces, _ = _pieces(out)
    assert pieces == _expected_pieces(docs, 512)  # every token, once, in its document's order
    m = json.loads((out / "manifest.json").read_text())
    p = m["preprocess"]
    assert p["inputs"] == [{"path": str(Path(files[kind]).resolve()), "format": kind[:3],
                            "bytes": Path(files[kind]).stat().st_size, "documents": len(docs),
                            "empty_documents": 0, "tokens": sum(map(len, docs))}]
    assert m["real_tokens"] == p["input_tokens"] == sum(map(len, docs))
    # the tokenizer is recorded as given (a study on these shards names it), null when not given
    assert m["tokenizer"] == ("meta-llama/Llama-3.2-1B" if tok else None)
    if kind == "bin":  # the summary
        assert "buckets (" in r.stdout and f"{m['records']:,} records" in r.stdout
        assert f"padding ratio {m['padding_ratio']:.2%}" in r.stdout and "compression: " in r.stdout
    else:
        assert r.stdout == "" and r.stderr == ""


def test_function_several_inputs_and_manifest(corpus, tmp_path):
    docs, files = corpus
    t0 = time.perf_counter()
    m = preprocess([str(files["bin"]), str(files["npz"])], str(tmp_path / "out"), num_workers=2,
                   **_fast(compare=True, frame_kb=64))
    wall = time.perf_counter() - t0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == m
    p = m["preprocess"]
    n_tok = 2 * sum(map(len, docs))
    assert p["documents_read"] == 2 * len(docs) and p["input_tokens"] == n_tok == m["real_tokens"]
    long = [d for d in docs if len(d) > 512]
    assert p["documents_chunked"] == 2 * len(long) and p["pieces_chunked"] == 2 * sum(-(-len(d) // 512) for d in long)
    n_short = sum(1 for d in docs for a in range(0, len(d), 512) if len(d[a:a + 512]) < 128)
    assert p["pieces_short"] == 2 * n_short == p["pieces_packed"] > 0
    assert p["pieces_dropped"] == p["tokens_dropped"] == 0
    assert p["flags"] == {"bucket_width": 64, "min_len": 128, "max_len": 512, "num_workers": 2, "zstd_level": 3,
                          "vocab_size": VOCAB, "eos_id": EOS, "dict_size": 8192, "frame_kb": 64, "short": "pack",
                          "bin_dtype": "uint16", "overwrite": False, "compare": True,
                          "vocab_size_inferred": False}
    assert [i["format"] for i in p["inputs"]] == ["bin", "npz"]
    assert 0 < p["read_s"] <= p["elapsed_s"] <= wall
    assert p["tokens_per_s"] == pytest.approx(n_tok / p["elapsed_s"], rel=0.02)  # elapsed_s is rounded to ms
    c = m["compression"]
    assert {"ratio_per_bucket_dict", "ratio_global_dict", "ratio_no_dict", "ratio_whole_file"} <= set(c)
    assert c["ratio_per_bucket_dict"] > c["ratio_no_dict"]
    assert m["vocab_size"] == VOCAB and m["token_dtype"] == "uint16"
    summary = verify(tmp_path / "out")
    assert summary["records"] == m["records"] and summary["compression_ratio"] == c["ratio"]
    assert summary["record_ratio_per_bucket_dict"] == c["ratio_per_bucket_dict"]


def _disk_bytes(root: Path) -> tuple[int, int]:
    """Bytes of the data files and of the dictionaries, as they are on disk."""
    return (sum(f.stat().st_size for f in (root / "data").iterdir()),
            sum(f.stat().st_size for f in (root / "dicts").iterdir()))


def test_the_ratio_is_the_inputs_bytes_over_shards_and_dictionaries(corpus, tmp_path):
    docs, files = corpus
    m = preprocess([str(files["bin"])], str(tmp_path / "out"), **_fast(compare=False, frame_kb=64))
    c, out = m["compression"], tmp_path / "out"
    data, dicts = _disk_bytes(out)
    assert dicts > 0 and c["dict_bytes"] == dicts and c["data_bytes"] == data and c["stored_bytes"] == data + dicts
    assert c["index_bytes"] == (out / "index.lbx").stat().st_size  # metadata beside them, not in the ratio
    # the input's own bytes: its token ids as uint16 (EOS dropped), not the 5-byte records
    n_tok = sum(map(len, docs))
    assert c["input_token_dtype"] == "uint16" and c["input_token_bytes"] == 2 * n_tok
    assert c["ratio"] == pytest.approx(2 * n_tok / (data + dicts), abs=1e-4)
    assert c["input_file_bytes"] == files["bin"].stat().st_size == 2 * (n_tok + len(docs))  # + one EOS a document
    assert c["ratio_input_files"] == pytest.approx(files["bin"].stat().st_size / (data + dicts), abs=1e-4)
    # the reference: plain zstd of the same token bytes, same level, no dictionary, one stream
    import zstandard as zstd

    plain = zstd.ZstdCompressor(level=3).compress(np.concatenate(docs).astype(np.uint16).tobytes())
    assert c["plain_zstd_bytes"] == pytest.approx(len(plain), rel=0.02)  # one shot vs streamed record by record
    assert c["ratio_plain_zstd"] == pytest.approx(2 * n_tok / c["plain_zstd_bytes"], abs=1e-4)
    assert c["stored_vs_plain_zstd"] == pytest.approx((data + dicts) / c["plain_zstd_bytes"], abs=1e-4)
    # the old figure stays, named for what it is: record payloads (5 bytes a token here), no dictionaries
    assert c["raw_bytes"] == 5 * n_tok and c["ratio_per_bucket_dict"] == pytest.approx(5 * n_tok / data, abs=1e-4)
    assert "dictionaries" in c["ratio_meaning"]


def _records(root: Path) -> list[tuple[list[int], list[int], list[int]]]:
    with ShardSet(root) as s:
        recs = [(t.tolist(), p.tolist(), m.tolist()) for _, t, p, m in s.iter_records()]
    return sorted(recs, key=lambda r: (len(r[0]), r[0]))


def _bin(tmp_path: Path, lengths: list[int], name: str = "d.bin") -> tuple[Path, list[np.ndarray]]:
    docs, nxt = [], 1
    for n in lengths:  # distinct, recognisable ids: document k holds k*1000 + 0, 1, 2, ...
        docs.append((np.arange(n) % 1000 + 1000 * nxt).astype(np.uint16))
        nxt += 1
    np.concatenate([np.append(d, 65535) for d in docs]).astype("<u2").tofile(tmp_path / name)
    return tmp_path / name, docs


SMALL = {"bucket_width": 16, "min_len": 32, "max_len": 64, "zstd_level": 1, "dict_size": 4096, "compare": False,
         "vocab_size": 65536, "eos_id": 65535}


def test_chunking_restarts_positions(tmp_path):
    src, docs = _bin(tmp_path, [150])  # 64 + 64 + 22 (short, packed alone: it is the last)
    m = preprocess([str(src)], str(tmp_path / "o"), **SMALL)
    recs = _records(tmp_path / "o")
    assert [len(t) for t, _, _ in recs] == [22, 64, 64]
    for t, p, mask in recs:
        assert p == list(range(len(t))) and mask == [0] + [1] * (len(t) - 1)
    assert sorted(sum((t for t, _, _ in recs), [])) == sorted(docs[0].tolist())
    p = m["preprocess"]
    assert (p["documents_chunked"], p["pieces_chunked"], p["pieces_short"], p["records_below_min_len"]) == (1, 3, 1, 1)
    assert [b["length"] for b in m["buckets"]] == [32, 64] and [b["records"] for b in m["buckets"]] == [1, 2]


def test_packing(tmp_path):
    # 10, 10, 10 pending (30 < 32); the 40-token document is a record of its own; 5 -> 35 >= 32: close.
    # Then 30 and 30: 60 <= 64 and >= 32 after the second -> one record; 20 is left for the end.
    src, docs = _bin(tmp_path, [10, 10, 10, 40, 5, 30, 30, 20])
    m = preprocess([str(src)], str(tmp_path / "o"), **SMALL)
    with ShardSet(tmp_path / "o") as s:
        recs = [(t.tolist(), p.tolist(), k.tolist()) for _, t, p, k in s.iter_records()]
    d = [x.tolist() for x in docs]
    expected = [d[0] + d[1] + d[2] + d[4], d[3], d[5] + d[6], d[7]]
    assert sorted(t for t, _, _ in recs) == sorted(expected)
    packed = next(r for r in recs if r[0] == expected[0])
    assert packed[1] == list(range(10)) * 3 + list(range(5))  # positions restart at each document
    assert [i for i, v in enumerate(packed[2]) if v == 0] == [0, 10, 20, 30]  # mask 0 at each document start
    p = m["preprocess"]
    assert (p["pieces_short"], p["pieces_packed"], p["records_packed"], p["records_below_min_len"]) == (7, 7, 3, 1)

    # a piece that does not fit closes the pending record early, even under min_len
    src2, docs2 = _bin(tmp_path, [30, 40], "e.bin")
    m2 = preprocess([str(src2)], str(tmp_path / "o2"), **{**SMALL, "min_len": 48})
    assert sorted(len(t) for t, _, _ in _records(tmp_path / "o2")) == [30, 40]
    assert m2["preprocess"]["records_below_min_len"] == 2


def test_drop_and_keep(tmp_path):
    src, docs = _bin(tmp_path, [10, 100, 40, 5])  # 100 -> 64 + 36
    m = preprocess([str(src)], str(tmp_path / "drop"), short="drop", **SMALL)
    assert sorted(len(t) for t, _, _ in _records(tmp_path / "drop")) == [36, 40, 64]
    p = m["preprocess"]
    assert (p["pieces_short"], p["pieces_dropped"], p["tokens_dropped"]) == (2, 2, 15)
    assert m["real_tokens"] == 155 - 15
    m = preprocess([str(src)], str(tmp_path / "keep"), short="keep", **SMALL)
    recs = _records(tmp_path / "keep")
    assert [len(t) for t, _, _ in recs] == [5, 10, 36, 40, 64]
    assert all(p == list(range(len(t))) for t, p, _ in recs)
    assert m["preprocess"]["records_below_min_len"] == 2 and m["preprocess"]["pieces_dropped"] == 0
    assert [b["length"] for b in m["buckets"]] == [16, 48, 64]


def test_attention_mask_positions_kept(tmp_path):
    ids = np.array([[0, 0, 7, 8, 9],        # left padding
                    [1, 2, 3, 0, 0],        # right padding
                    [4, 0, 5, 0, 6],        # holes
                    [9, 9, 9, 9, 9]])       # all masked out: an empty document
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 1], [0, 0, 0, 0, 0]], bool)
    np.savez_compressed(tmp_path / "m.npz", input_ids=ids, attention_mask=mask)
    f = open_input(tmp_path / "m.npz")
    assert [d.tolist() for d in f.iter_documents()] == [[7, 8, 9], [1, 2, 3], [4, 5, 6]]
    assert (f.documents, f.empty_documents, f.tokens, f.bytes_done) == (3, 1, 9, f.nbytes)
    assert f.max_id() == 9
    # rows split on EOS when it is given; a trailing EOS does not make an empty document
    np.savez(tmp_path / "e.npz", input_ids=np.array([[5, 6, 99, 7, 99], [8, 99, 99, 99, 99], [99, 1, 99, 99, 2]]))
    f = open_input(tmp_path / "e.npz", eos_id=99)
    assert [d.tolist() for d in f.iter_documents()] == [[5, 6], [7], [8], [1], [2]]
    assert f.empty_documents == 2  # row 2: before its first EOS, and between its two EOS


def test_stream_documents_and_chunks(tmp_path, monkeypatch):
    import loaders.inputs as inputs

    monkeypatch.setattr(inputs, "CHUNK_TOKENS", 7)  # documents spanning chunk borders
    stream = np.array([1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 12, 13], "<u4")
    stream.tofile(tmp_path / "s.bin")
    f = open_input(tmp_path / "s.bin", eos_id=0, bin_dtype="uint32")
    assert [d.tolist() for d in f.iter_documents()] == [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [12, 13]]
    assert f.empty_documents == 1 and f.max_id() == 13
    assert [d.tolist() for d in iter_documents(tmp_path / "s.bin", eos_id=0, bin_dtype="uint32")][2] == [12, 13]


def test_vocab_inferred_with_warning(tmp_path):
    src, docs = _bin(tmp_path, [40, 50])
    with pytest.warns(UserWarning, match=r"--vocab-size not given: inferred 65536 \(max id \+ 1\)"):
        m = preprocess([str(src)], str(tmp_path / "o"), **{**SMALL, "vocab_size": None})
    assert m["vocab_size"] == 65536 and m["preprocess"]["flags"]["vocab_size_inferred"] is True
    np.save(tmp_path / "r.npy", np.array([[3, 1, 70000]], np.int64))
    with pytest.warns(UserWarning, match="inferred 70001"):
        m = preprocess([str(tmp_path / "r.npy")], str(tmp_path / "o2"), **{**SMALL, "vocab_size": None,
                                                                            "eos_id": None, "min_len": 1})
    assert m["token_dtype"] == "uint32"


def test_overwrite(tmp_path):
    src, _ = _bin(tmp_path, [40, 50])
    out = tmp_path / "o"
    preprocess([str(src)], str(out), **SMALL)
    with pytest.raises(FileExistsError, match=r"o: already exists \(pass --overwrite"):
        preprocess([str(src)], str(out), **SMALL)
    m = preprocess([str(src)], str(out), overwrite=True, **{**SMALL, "short": "keep"})
    assert m["preprocess"]["flags"]["short"] == "keep" and sorted(os.listdir(tmp_path)) == ["d.bin", "o"]


def test_verify_cli_on_a_good_directory(corpus, tmp_path):
    docs, files = corpus
    out = tmp_path / "o"
    preprocess([str(files["bin"])], str(out), **_fast(compare=True))
    r = _run("loaders.verify", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "OK" and "buckets (" in lines[0] and "padding ratio" in r.stdout
    assert "per-bucket dictionaries" in r.stdout and "whole file" in r.stdout
    r = _run("loaders.verify", "--json", str(out))
    s = json.loads(r.stdout)
    assert r.returncode == 0 and s["ok"] is True and s["real_tokens"] == sum(map(len, docs))
    assert s["buckets"] == len(s["bucket_lengths"]) and 0 <= s["padding_ratio"] < 64 / 128


# --------------------------------------------------------------------------- interruption


@pytest.fixture(scope="module")
def big_bin(tmp_path_factory) -> Path:
    """~3M tokens: long enough that a run is still going when its temporary directory appears."""
    rng = np.random.default_rng(7)
    stream = rng.zipf(1.2, 3_000_000).clip(max=EOS - 1).astype("<u2")
    stream[rng.integers(0, len(stream), 4000)] = EOS
    path = tmp_path_factory.mktemp("big") / "big.bin"
    stream.tofile(path)
    return path


def _wait_for_partial(parent: Path, name: str, proc: subprocess.Popen, timeout: float = 30) -> Path:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        found = [p for p in parent.iterdir() if p.name.startswith(f".{name}.partial-")]
        if found and (found[0] / "spill").exists() and any((found[0] / "spill").iterdir()):
            return found[0]
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.communicate()}"
        time.sleep(0.005)
    raise AssertionError("no temporary directory appeared")


def _old_dir(tmp_path: Path) -> tuple[Path, dict]:
    src, _ = _bin(tmp_path, [40, 50])
    out = tmp_path / "out"
    preprocess([str(src)], str(out), **SMALL)
    return out, _tree_digest(out)


def test_sigkill_leaves_no_complete_directory(big_bin, tmp_path):
    out, before = _old_dir(tmp_path)
    proc = _popen("loaders.preprocess", "--input", str(big_bin), "--output", str(out), "--overwrite",
                  *_fast_cli("--quiet", "--zstd-level", "9"))
    partial = _wait_for_partial(tmp_path, "out", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert _tree_digest(out) == before  # the pre-existing directory is untouched
    with pytest.raises(ShardFormatError, match="manifest.json: missing: the directory is incomplete"):
        ShardSet(partial)
    verify(out)
    # the next run for the same output removes what the killed one left
    r = _run("loaders.preprocess", "--input", str(tmp_path / "d.bin"), "--output", str(out), "--overwrite",
             "--no-compare", "--vocab-size", "65536", "--eos-id", "65535", "--min-len", "8", "--max-len", "64",
             "--bucket-width", "16")
    assert r.returncode == 0, r.stderr
    assert f"removed {partial} (left by an interrupted run)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "out"]


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_interrupt_cleans_up(big_bin, tmp_path, sig, code, word):
    out, before = _old_dir(tmp_path)
    proc = _popen("loaders.preprocess", "--input", str(big_bin), "--output", str(out), "--overwrite",
                  *_fast_cli("--quiet", "--zstd-level", "9"))
    _wait_for_partial(tmp_path, "out", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err == f"{word}: {out} was not written (left as it was)\n"
    assert _tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "out"]  # temporary directory removed


def test_fill_packs_a_stream_into_full_records(tmp_path):
    """--short fill: with min_len == max_len every record but the last is exactly max_len, and the
    tokens come back in order, split pieces continuing their position ids."""
    from loaders.format import ShardSet
    from loaders.preprocess import preprocess

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 500, int(n)).astype(np.uint16) for n in rng.integers(5, 300, 60)]
    src = tmp_path / "d.npy"
    np.save(src, np.concatenate([np.append(d, 511) for d in docs]).astype(np.uint16))
    m = preprocess([str(src)], str(tmp_path / "out"), bucket_width=32, min_len=128, max_len=128,
                   vocab_size=512, eos_id=511, short="fill", compare=False)
    recs = list(ShardSet(tmp_path / "out").iter_records())
    lengths = sorted((len(t) for _, t, _, _ in recs), reverse=True)
    assert lengths[:-1] == [128] * (len(recs) - 1) and 0 < lengths[-1] <= 128
    assert m["real_tokens"] == sum(len(d) for d in docs)
    # stored in input order within the bucket of 128: the concatenation equals the document stream
    full = [r for r in recs if len(r[1]) == 128]
    stream = np.concatenate([t for _, t, _, _ in full])
    assert np.array_equal(stream, np.concatenate(docs)[:len(stream)])
    # positions restart at each document (and every max_len tokens of a long one, as in chunking) and
    # continue across a split between records; mask 0 exactly where the position is 0
    pos = np.concatenate([p for _, _, p, _ in full]).astype(np.int64)
    expect = np.concatenate([np.arange(len(d)) % 128 for d in docs])[:len(pos)]
    assert np.array_equal(pos, expect)
    mask = np.concatenate([k for _, _, _, k in full])
    assert np.array_equal(mask == 0, pos == 0)
