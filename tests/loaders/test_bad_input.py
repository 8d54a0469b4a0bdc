"""Bad inputs and damaged shard directories: every failure is loud and names the file (and frame/record)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard as zstd

from loaders.format import FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, ShardFormatError, ShardSet, write_index
from loaders.inputs import iter_documents, open_input
from loaders.preprocess import main as preprocess_main
from loaders.preprocess import preprocess
from loaders.verify import main as verify_main
from loaders.verify import verify

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("bucket.length", "bucket.dict", "bucket.frame0", "bucket.nframes", "frame.bucket", "frame.offset",
           "frame.clen", "frame.dlen", "frame.first_rec", "frame.n_rec", "frame.xxh3", "rec.offset", "rec.length")
VOCAB, EOS = 1000, 999


def _docs(seed: int = 0, n: int = 120) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # structured enough to compress: ids from a skewed distribution
    return [(rng.zipf(1.3, int(rng.integers(20, 700))) % (VOCAB - 1)).astype(np.uint16) for _ in range(n)]


def _write_bin(docs, path: Path, eos: int = EOS) -> Path:
    np.concatenate([np.append(d, eos) for d in docs]).astype("<u2").tofile(path)
    return path


def _fast(**kw) -> dict:
    """Small, fast preprocess settings."""
    return {"bucket_width": 32, "min_len": 64, "max_len": 256, "zstd_level": 3, "dict_size": 4096,
            "frame_kb": 64, "compare": False, "vocab_size": VOCAB, "eos_id": EOS, **kw}


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("good")
    src = _write_bin(_docs(), d / "in.bin")
    preprocess([str(src)], str(d / "shards"), **_fast())
    return d / "shards"


@pytest.fixture
def shards(good_dir, tmp_path) -> Path:
    dst = tmp_path / "shards"
    shutil.copytree(good_dir, dst)
    return dst


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=60)


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _fix_header_crc(path: Path) -> None:
    head = path.read_bytes()[:60]
    _patch(path, 60, struct.pack("<I", zlib.crc32(head)))


def _read_cols(root: Path) -> tuple[dict, dict]:
    with ShardSet(root) as s:
        cols = {name: np.array(s.col(name)) for name in COLUMNS}
        meta = dict(tok_itemsize=s.tok_dtype.itemsize, pos_itemsize=s.pos_dtype.itemsize,
                    bucket_width=s.bucket_width, vocab_size=s.vocab_size, n_dicts=s.n_dicts)
    return cols, meta


def _write_cols(root: Path, cols: dict, meta: dict) -> None:
    """Write the index; keep the manifest's index checksum and compressed size in step."""
    write_index(root / INDEX_NAME, cols, **meta)
    m = json.loads((root / MANIFEST_NAME).read_text())
    m["checksums"]["index_xxh3"] = xxhash.xxh3_64((root / INDEX_NAME).read_bytes()).hexdigest()
    m["compression"]["per_bucket_dict_bytes"] = int(cols["frame.clen"].astype(np.int64).sum())
    (root / MANIFEST_NAME).write_text(json.dumps(m))


def _rewrite_index(root: Path, change) -> None:
    cols, meta = _read_cols(root)
    change(cols)
    _write_cols(root, cols, meta)


def _forge_frame(root: Path, frame: int, mutate) -> None:
    """Replace one frame by a well-formed one (valid zstd, right dictionary, right xxh3, index and manifest
    checksums updated) whose columns went through ``mutate(tokens, positions, loss_mask)``."""
    cols, meta = _read_cols(root)
    with ShardSet(root) as s:
        fr = s.load_frame(frame)
        parts = (fr.tokens.copy(), fr.position_ids.copy(), fr.loss_mask.copy())
        mutate(*parts)
        payload = b"".join(c.tobytes() for c in parts)
        bucket = int(s.frame_bucket[frame])
        d = int(s.bucket_dict[bucket])
        zdict = zstd.ZstdCompressionDict((root / "dicts" / f"{d}.zdict").read_bytes()) if d >= 0 else None
        comp = zstd.ZstdCompressor(level=3, dict_data=zdict, write_checksum=True).compress(payload)
        frames = list(s.frames_of_bucket(bucket))
        path = s.data_path(frame)
        data = path.read_bytes()
        blobs = [comp if f == frame else data[int(s.frame_offset[f]):int(s.frame_offset[f] + s.frame_clen[f])]
                 for f in frames]
    path.write_bytes(b"".join(blobs))
    off = 0
    for f, blob in zip(frames, blobs):
        cols["frame.offset"][f], cols["frame.clen"][f] = off, len(blob)
        cols["frame.xxh3"][f] = xxhash.xxh3_64_intdigest(blob)
        off += len(blob)
    _write_cols(root, cols, meta)


# --------------------------------------------------------------------------- the index


def test_wrong_magic(shards):
    _patch(shards / INDEX_NAME, 0, b"NOTANIDX")
    with pytest.raises(ShardFormatError, match=r"index\.lbx: bad magic b'NOTANIDX'.*not a loongbin index"):
        ShardSet(shards)


def test_newer_version(shards):
    _patch(shards / INDEX_NAME, 8, struct.pack("<I", FORMAT_VERSION + 1))
    _fix_header_crc(shards / INDEX_NAME)
    with pytest.raises(ShardFormatError, match=rf"index\.lbx: format version {FORMAT_VERSION + 1} is newer than "
                                               rf"this reader supports \({FORMAT_VERSION}\); upgrade"):
        ShardSet(shards)


def test_corrupt_header(shards):
    _patch(shards / INDEX_NAME, 24, struct.pack("<Q", 12345))  # vocab size, without fixing the crc
    with pytest.raises(ShardFormatError, match=r"index\.lbx: header checksum mismatch"):
        ShardSet(shards)


@pytest.mark.parametrize("keep,pattern", [(50, r"truncated \(50 bytes, the header alone is 128\)"),
                                         (140, r"truncated column directory"),
                                         (-8, r"truncated: \d+ bytes, the columns end at byte \d+"),
                                         (-300, r"truncated: column rec\.length needs bytes up to \d+, the file "
                                                r"has \d+")])
def test_truncated_index(shards, keep, pattern):
    idx = shards / INDEX_NAME
    size = idx.stat().st_size
    os.truncate(idx, keep if keep > 0 else size + keep)
    with pytest.raises(ShardFormatError, match=r"index\.lbx: " + pattern):
        ShardSet(shards)


def test_index_body_damage_found_by_verify(shards):
    idx = shards / INDEX_NAME
    data = bytearray(idx.read_bytes())
    data[-3] ^= 0x40  # inside the last column (rec.length): the header crc does not cover it
    idx.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=r"index\.lbx: checksum mismatch \(xxh3-64 differs from "
                                               r"manifest\.json\)"):
        verify(shards)


def test_inconsistent_index_names_record(shards, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(shards, other)

    cols, _ = _read_cols(shards)
    rec = int(cols["frame.first_rec"][1]) + 1  # the second record of frame 1
    assert cols["frame.n_rec"][1] >= 2

    def rec_offset(cols):
        cols["rec.offset"][rec] += 1

    _rewrite_index(shards, rec_offset)  # checksums updated: only the structure check can catch it
    with pytest.raises(ShardFormatError, match=rf"index\.lbx: record {rec} \(frame 1\): rec\.offset \d+, "
                                               rf"expected \d+ \(records are back to back\)"):
        verify(shards)

    def frame_bucket(cols):
        cols["frame.bucket"][0] = 1

    _rewrite_index(other, frame_bucket)
    with pytest.raises(ShardFormatError, match=r"index\.lbx: frame 0: frame\.bucket 1, expected 0"):
        verify(other)


# --------------------------------------------------------------------------- data files and dictionaries


def test_truncated_data_file(shards):
    with ShardSet(shards) as s:
        b = int(np.argmax(s.bucket_n_frames))
        path = s.data_path_for_length(int(s.bucket_length[b]))
        last = int(s.bucket_first_frame[b] + s.bucket_n_frames[b] - 1)
    os.truncate(path, path.stat().st_size - 10)
    with pytest.raises(ShardFormatError, match=rf"{path.name}: truncated: \d+ bytes, but frame {last} \(the "
                                               rf"last of bucket \d+\) ends at byte \d+"):
        ShardSet(shards)
    r = _run("loaders.verify", str(shards))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and f"{path}: truncated" in r.stderr and f"frame {last}" in r.stderr


def test_trailing_bytes_in_data_file(shards):
    path = sorted((shards / "data").iterdir())[0]
    with open(path, "ab") as fh:
        fh.write(b"\0" * 7)
    ShardSet(shards).close()  # readers do not care
    with pytest.raises(ShardFormatError, match=rf"{path.name}: \d+ bytes, its \d+ frames add up to \d+ "
                                               rf"\(trailing bytes\)"):
        verify(shards)


def test_flipped_byte_in_frame(shards):
    with ShardSet(shards) as s:
        f = s.n_frames - 1
        fd, off, n = s.read_request(f)
        path = s.data_path(f)
    _patch(path, off + n // 2, bytes([path.read_bytes()[off + n // 2] ^ 0x10]))
    with ShardSet(shards) as s, pytest.raises(ShardFormatError,
                                              match=rf"{path.name}: frame {f}: checksum mismatch \(xxh3-64\)"):
        s.load_frame(f)
    assert verify_main([str(shards)]) == 1


def test_missing_dictionary(shards):
    victim = sorted((shards / "dicts").iterdir())[0]
    victim.unlink()
    with pytest.raises(ShardFormatError, match=rf"dicts/{victim.name}: zstd dictionary {victim.stem} is missing "
                                               rf"\(needed by bucket\(s\) \[\d+\]\)"):
        ShardSet(shards)


def test_damaged_dictionary(shards):
    victim = sorted((shards / "dicts").iterdir())[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) - 100] ^= 0xFF  # in the content part of the dictionary
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match=rf"dicts/{victim.name}: dictionary {victim.stem}: checksum "
                                               rf"mismatch"):
        verify(shards)
    # without the manifest checksum, zstd's content checksum still refuses to return wrong tokens
    with ShardSet(shards) as s:
        b = int(np.flatnonzero(np.asarray(s.bucket_dict) == int(victim.stem))[0])
        errors = 0
        for f in s.frames_of_bucket(b):
            try:
                s.load_frame(f)
            except ShardFormatError as e:
                assert f"frame {f}: zstd error" in str(e)
                errors += 1
        assert errors > 0


def test_token_id_over_vocab_at_read_time(shards):
    def mutate(tok, pos, mask):
        tok[5] = VOCAB

    _forge_frame(shards, 1, mutate)
    with ShardSet(shards) as s, pytest.raises(ShardFormatError,
                                              match=rf"\.lbd: frame 1: token id {VOCAB} >= vocab_size {VOCAB}"):
        s.load_frame(1)
    with pytest.raises(ShardFormatError, match=rf"frame 1: token id {VOCAB} >= vocab_size {VOCAB}"):
        verify(shards)


def test_forged_positions_and_mask_found_by_verify(shards, tmp_path):
    with ShardSet(shards) as s:
        first = int(s.frame_first_rec[0])
    other = tmp_path / "other"
    shutil.copytree(shards, other)

    def positions(tok, pos, mask):
        pos[2] = 7

    def loss_mask(tok, pos, mask):
        mask[4] = 3

    _forge_frame(shards, 0, positions)
    with pytest.raises(ShardFormatError, match=rf"\.lbd: frame 0: record {first}: position id 7 at token 2 "
                                               rf"of the frame breaks the 0, 1, 2, \.\.\. sequence"):
        verify(shards)
    _forge_frame(other, 0, loss_mask)
    with pytest.raises(ShardFormatError, match=r"\.lbd: frame 0: loss mask value 3 at token 4, expected 0 or 1"):
        verify(other)
    _forge_frame(other, 0, lambda tok, pos, mask: mask.__setitem__(4, 1))
    verify(other)  # a well-formed forgery is indistinguishable from data, as it should be


# --------------------------------------------------------------------------- manifest


def test_missing_manifest(shards):
    (shards / MANIFEST_NAME).unlink()
    with pytest.raises(ShardFormatError, match=r"manifest\.json: missing: the directory is incomplete"):
        ShardSet(shards)
    assert verify_main([str(shards)]) == 1


def test_manifest_not_complete(shards):
    m = json.loads((shards / MANIFEST_NAME).read_text())
    m["complete"] = False
    (shards / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=r"manifest\.json: does not say complete=true"):
        ShardSet(shards)


def test_manifest_disagrees_with_index(shards):
    m = json.loads((shards / MANIFEST_NAME).read_text())
    m["real_tokens"] += 1
    (shards / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=r"manifest\.json: real_tokens is \d+, the index says \d+"):
        verify(shards)
    (shards / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ShardFormatError, match=r"manifest\.json: not valid JSON"):
        ShardSet(shards)


@pytest.mark.parametrize("edit, message", [
    (lambda m: [m], r"manifest\.json: a JSON list, expected an object"),
    (lambda m: {**m, "max_len": "abc"}, r"manifest\.json: max_len: got 'abc'; expected a non-negative integer"),
    (lambda m: {**m, "max_len": True}, r"manifest\.json: max_len: got True; expected a non-negative integer"),
    (lambda m: {**m, "checksums": [1]}, r"manifest\.json: checksums: got \[1\]; expected an object"),
    (lambda m: {**m, "tokenizer": 3}, r"manifest\.json: tokenizer: got 3; expected a string or null"),
])
def test_a_manifest_of_the_wrong_shape_is_one_line(shards, tmp_path, edit, message):
    """Issue 39: a manifest that is a JSON list, or max_len "abc", was a traceback (AttributeError, ValueError).
    ShardSet names the file and the key, and the training CLI says it in one line with exit 2."""
    m = json.loads((shards / MANIFEST_NAME).read_text())
    (shards / MANIFEST_NAME).write_text(json.dumps(edit(m)))
    with pytest.raises(ShardFormatError, match=message):
        ShardSet(shards)
    assert verify_main([str(shards)]) == 1
    if "list" not in message and "abc" not in message:
        return  # the CLI's one line: the two cases of the issue (each a process of ~10 s)
    r = _run("workbench.train", "--preset", "tiny", "--steps", "1", "--no-prometheus", "--out", str(tmp_path / "o"),
             "--set", f"data.loongbin_dir={shards}")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(lines) == 1 and str(shards / MANIFEST_NAME) in lines[0], r.stderr


def test_not_a_directory(tmp_path):
    with pytest.raises(ShardFormatError, match=r"nowhere: not a directory"):
        ShardSet(tmp_path / "nowhere")


# --------------------------------------------------------------------------- preprocess inputs


def test_token_id_over_vocab_at_preprocess(tmp_path, capsys):
    docs = _docs(1, 10)
    docs[3] = docs[3].copy()
    docs[3][7] = VOCAB + 5
    src = _write_bin(docs, tmp_path / "bad.bin", eos=EOS)
    out = tmp_path / "nested" / "deeper" / "out"
    with pytest.raises(ValueError, match=rf"bad\.bin: document 3: token id {VOCAB + 5} >= --vocab-size {VOCAB}"):
        preprocess([str(src)], str(out), **_fast())
    assert not (tmp_path / "nested").exists()  # neither the output nor the parents it would have created
    assert preprocess_main(["--input", str(src), "--output", str(out), "--vocab-size", str(VOCAB),
                            "--eos-id", str(EOS), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "bad.bin: document 3: token id 1005" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bin"]
    # rows: the row is named too
    ids = np.zeros((3, 8), np.int64)
    ids[2, 4] = VOCAB
    np.savez(tmp_path / "rows.npz", input_ids=ids)
    with pytest.raises(ValueError, match=rf"rows\.npz: document 2 \(row 2\): token id {VOCAB} >= --vocab-size"):
        preprocess([str(tmp_path / "rows.npz")], str(out), **_fast(eos_id=None))


def test_empty_inputs(tmp_path):
    (tmp_path / "zero.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"zero\.bin: empty file \(0 bytes\)"):
        open_input(tmp_path / "zero.bin", eos_id=EOS)
    _write_bin([np.array([], np.uint16)] * 4, tmp_path / "eos.bin")
    with pytest.raises(ValueError, match=r"eos\.bin: no documents \(only 4 empty ones\)"):
        list(iter_documents(tmp_path / "eos.bin", eos_id=EOS))
    np.savez(tmp_path / "none.npz", input_ids=np.zeros((0, 16), np.int64))
    with pytest.raises(ValueError, match=r"none\.npz: input_ids is empty \(shape \(0, 16\)\)"):
        open_input(tmp_path / "none.npz")
    np.savez(tmp_path / "masked.npz", input_ids=np.ones((2, 4), np.int64), attention_mask=np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match=r"masked\.npz: no documents \(only 2 empty ones\)"):
        list(iter_documents(tmp_path / "masked.npz"))
    np.save(tmp_path / "empty.npy", np.zeros(0, np.int32))
    with pytest.raises(ValueError, match=r"empty\.npy: no tokens"):
        open_input(tmp_path / "empty.npy", eos_id=0)
    r = _run("loaders.preprocess", "--input", str(tmp_path / "eos.bin"), "--output", str(tmp_path / "o"),
             "--eos-id", str(EOS), "--vocab-size", str(VOCAB))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"error: {tmp_path / 'eos.bin'}: no documents (only 4 empty ones)"
    assert not (tmp_path / "o").exists() and not any(p.name.startswith(".o.") for p in tmp_path.iterdir())


def test_mismatched_attention_mask_shape(tmp_path):
    np.savez(tmp_path / "m.npz", input_ids=np.ones((4, 12), np.int64), attention_mask=np.ones((4, 10), np.int64))
    with pytest.raises(ValueError, match=r"m\.npz: attention_mask shape \(4, 10\) differs from input_ids shape "
                                         r"\(4, 12\)"):
        preprocess([str(tmp_path / "m.npz")], str(tmp_path / "o"), **_fast())
    r = _run("loaders.preprocess", "--input", str(tmp_path / "m.npz"), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == (f"error: {tmp_path / 'm.npz'}: attention_mask shape (4, 10) differs from input_ids "
                        f"shape (4, 12)\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name,make,kwargs,pattern", [
    ("x.txt", lambda p: p.write_text("hi"), {}, r"x\.txt: unknown input format '\.txt'"),
    ("x.bin", lambda p: np.arange(5, dtype="<u2").tofile(p), {"eos_id": None},
     r"x\.bin: --eos-id is required to split a flat \.bin token stream"),
    ("x.bin", lambda p: p.write_bytes(b"\0" * 7), {}, r"x\.bin: 7 bytes is not a whole number of uint16 tokens"),
    ("x.bin", lambda p: np.arange(5, dtype="<u2").tofile(p), {"eos_id": 70000},
     r"x\.bin: --eos-id 70000 cannot occur in uint16 token ids"),
    ("x.npy", lambda p: np.save(p, np.arange(5)), {"eos_id": None},
     r"x\.npy: --eos-id is required to split a 1-D \.npy token stream"),
    ("x.npy", lambda p: np.save(p, np.ones(5, np.float32)), {}, r"x\.npy: dtype float32, expected integer"),
    ("x.npy", lambda p: np.save(p, np.ones((2, 2, 2), np.int32)), {}, r"x\.npy: shape \(2, 2, 2\), expected"),
    ("x.npy", lambda p: p.write_bytes(b"garbage!" * 10), {}, r"x\.npy: not a valid \.npy array"),
    ("x.npz", lambda p: np.savez(p, tokens=np.ones((2, 2), np.int64)), {},
     r"x\.npz: no 'input_ids' array \(keys: tokens\)"),
    ("x.npz", lambda p: np.savez(p, input_ids=np.ones((2, 3), np.int64), attention_mask=np.full((2, 3), 2)), {},
     r"x\.npz: attention_mask row 0 column 0: value 2, expected 0 or 1"),
    ("x.npz", lambda p: np.savez(p, input_ids=np.array([[1, -100, 3]])), {},
     r"x\.npz: document 0 \(row 0\): negative token id -100"),
    ("x.npz", lambda p: p.write_bytes(b"PK not a zip"), {}, r"x\.npz: not a valid \.npz"),
])
def test_bad_input_files(tmp_path, name, make, kwargs, pattern):
    p = tmp_path / name
    make(p)
    kw = {"eos_id": 0, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        list(iter_documents(p, **kw))


def test_bad_flags_and_paths(tmp_path, capsys):
    src = _write_bin(_docs(2, 5), tmp_path / "in.bin")
    with pytest.raises(FileNotFoundError, match=r"missing\.bin: no such file"):
        preprocess([str(tmp_path / "missing.bin")], str(tmp_path / "o"), **_fast())
    with pytest.raises(ValueError, match=r"min_len=300: expected an integer in 1\.\.max_len \(256\)"):
        preprocess([str(src)], str(tmp_path / "o"), **_fast(min_len=300))
    with pytest.raises(ValueError, match=r"eos_id=1000: expected < vocab_size \(1000\)"):
        preprocess([str(src)], str(tmp_path / "o"), **_fast(eos_id=1000))
    with pytest.raises(ValueError, match=r"frame_kb=2048: expected an integer in 64\.\.1024"):
        preprocess([str(src)], str(tmp_path / "o"), **_fast(frame_kb=2048))
    (tmp_path / "notshards").mkdir()
    (tmp_path / "notshards" / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"notshards: exists and is not a shard directory"):
        preprocess([str(src)], str(tmp_path / "notshards"), **_fast(overwrite=True))
    assert (tmp_path / "notshards" / "precious.txt").read_text() == "keep me"
    with pytest.raises(SystemExit) as e:
        preprocess_main(["--input", str(src), "--output", str(tmp_path / "o"), "--short", "squash"])
    assert e.value.code == 2
    capsys.readouterr()
    assert preprocess_main(["--input", str(src), "--output", str(tmp_path / "o"), "--eos-id", str(EOS),
                            "--vocab-size", str(VOCAB), "--max-len", "0"]) == 2
    assert capsys.readouterr().err == "error: max_len=0: expected an integer in 1..16777216\n"
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- fuzz


def test_fuzz_flipped_bytes_in_data_files(good_dir, tmp_path):
    """Flip one random byte at a random place of a data file, 30 times: verify catches every one."""
    root = tmp_path / "shards"
    shutil.copytree(good_dir, root)
    files = sorted((root / "data").iterdir())
    sizes = [f.stat().st_size for f in files]
    rng = np.random.default_rng(1234)
    with ShardSet(root) as s:
        n_frames = s.n_frames
    assert n_frames >= 8  # the flips land in many different frames
    for _ in range(30):
        i = int(rng.choice(len(files), p=np.array(sizes) / sum(sizes)))
        off = int(rng.integers(0, sizes[i]))
        xor = int(rng.integers(1, 256))
        original = files[i].read_bytes()
        damaged = bytearray(original)
        damaged[off] ^= xor
        files[i].write_bytes(bytes(damaged))
        with pytest.raises(ShardFormatError) as e:
            verify(root)
        assert f"{files[i]}: frame " in str(e.value) and "checksum mismatch" in str(e.value)
        files[i].write_bytes(original)
    verify(root)  # restored: clean again


def test_fuzz_index_and_dictionaries(good_dir, tmp_path):
    """Flipped bytes in the index or a dictionary: always a ShardFormatError naming that file, never another
    exception or a silent pass."""
    root = tmp_path / "shards"
    shutil.copytree(good_dir, root)
    files = [root / INDEX_NAME] + sorted((root / "dicts").iterdir())
    rng = np.random.default_rng(99)
    for it in range(30):
        f = files[0] if it % 2 else files[int(rng.integers(1, len(files)))]
        original = f.read_bytes()
        damaged = bytearray(original)
        # half the index flips land in the header and column directory, the rest anywhere
        off = int(rng.integers(0, 128 + 32 * 13)) if it % 4 == 1 else int(rng.integers(0, len(damaged)))
        damaged[off] ^= int(rng.integers(1, 256))
        f.write_bytes(bytes(damaged))
        with pytest.raises(ShardFormatError) as e:
            verify(root)
        assert f.name in str(e.value) or "index.lbx" in str(e.value), (f, off, str(e.value))
        f.write_bytes(original)


def test_shards_beyond_the_models_vocabulary_are_a_config_error(tmp_path):
    """Token ids at or above the model's vocabulary stop the run before its first step, as an invalid_config
    that names the key and both vocabularies, without a traceback."""
    src = _write_bin(_docs(), tmp_path / "in.bin", eos=4999)
    preprocess([str(src)], str(tmp_path / "shards"), **_fast(vocab_size=5000, eos_id=4999))
    p = _run("workbench.train", "--preset", "tiny", "--steps", "1", "-q", "--out", str(tmp_path / "run"),
             "--set", f"data.loongbin_dir={tmp_path / 'shards'}", "--set", "data.seq_len=256")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "error (invalid_config)" in p.stderr and "data.loongbin_dir" in p.stderr
    assert "vocab_size 5000" in p.stderr and "vocab_size 4096" in p.stderr and "Traceback" not in p.stderr
