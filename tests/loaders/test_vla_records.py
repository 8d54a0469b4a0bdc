"""vla records in the loongbin format: the exact round trip, the kind in the index, corruption named (frame and
index), loaders.verify, the .npz preprocess path (both image layouts, padded and object tokens, the CLI) and the
synthetic VLA corpus."""

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

from conftest import VLA_SPEC, write_vla
from loaders._layout import file_xxh3
from loaders.format import (FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, ShardFormatError, ShardSet, VLAFrame,
                            VLAShardWriter)
from loaders.pipeline import BatchPipeline
from loaders.preprocess import preprocess_vla
from loaders.synth import VLA_COLOURS, VLA_WORDS, VLASynthSpec, generate_vla, write_vla_npz, write_vla_shards
from loaders.verify import verify
from loaders.vla import VLAPipeline

ROOT = Path(__file__).resolve().parents[2]
DATA = f"b{VLA_SPEC.text_len}.lbd"  # the one data file: one bucket of the text length


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=60)


def _records(root) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    with ShardSet(root) as s:
        return [tuple(np.array(x) for x in r[1:]) for r in s.iter_records()]


def _assert_same(records, data, order=None):
    """``records`` (image, tokens, actions) equal ``data``'s samples (in ``order``), bit for bit."""
    order = range(len(data["images"])) if order is None else order
    assert len(records) == len(order)
    for (img, tok, act), i in zip(records, order):
        assert img.dtype == np.uint8 and np.array_equal(img, data["images"][i])
        assert np.array_equal(tok, data["tokens"][i, :data["lengths"][i]])
        assert act.dtype == np.float32 and np.array_equal(act, data["actions"][i])


# --------------------------------------------------------------------------- the format


def test_records_round_trip_and_the_index_names_the_kind(vla_dir, vla_data):
    _assert_same(_records(vla_dir), vla_data)
    m = json.loads((vla_dir / MANIFEST_NAME).read_text())
    assert (m["version"], m["record_kind"], m["image_shape"], m["action_shape"], m["text_len"]) == \
        (FORMAT_VERSION, "vla", [3, 24, 40], [4, 6], 20)
    assert m["real_tokens"] == int(vla_data["lengths"].sum()) and m["padded_tokens"] == 120 * 20
    with ShardSet(vla_dir) as s:
        assert (s.version, s.record_kind, s.image_shape, s.action_shape) == (2, "vla", (3, 24, 40), (4, 6))
        assert s.n_buckets == 1 and s.n_frames >= 4  # frames of whole records, ~20 each
        fr = s.load_frame(1)
        assert isinstance(fr, VLAFrame) and fr.images.shape == (int(s.frame_n_rec[1]), 3, 24, 40)
    head = (vla_dir / INDEX_NAME).read_bytes()[:128]
    assert struct.unpack_from("<I", head, 8)[0] == 2 and struct.unpack_from("<6I", head, 64) == (1, 3, 24, 40, 4, 6)
    assert verify(vla_dir)["record_kind"] == "vla"


def test_token_shards_stay_version_1_and_the_pipelines_refuse_the_other_kind(tmp_path, vla_dir):
    from loaders.format import ShardWriter

    with ShardWriter(tmp_path / "tok", vocab_size=100, bucket_width=8, max_len=16, compare_baselines=False) as w:
        for n in range(1, 17):
            w.add(np.arange(n) % 100)
    assert struct.unpack_from("<I", (tmp_path / "tok" / INDEX_NAME).read_bytes(), 8)[0] == 1  # older readers read it
    assert (tmp_path / "tok" / INDEX_NAME).read_bytes()[64:128] == bytes(64)                 # reserved, zero
    with ShardSet(tmp_path / "tok") as s:
        assert s.record_kind == "tokens" and s.image_shape is None
    with pytest.raises(ValueError, match=r"holds vla records, BatchPipeline reads tokens records; use "
                                         r"loaders\.vla\.VLAPipeline"):
        BatchPipeline(vla_dir, micro_batch_size=4)
    with pytest.raises(ValueError, match=r"holds tokens records, VLAPipeline reads vla records; use "
                                         r"loaders\.pipeline\.BatchPipeline"):
        VLAPipeline(tmp_path / "tok", micro_batch_size=4)


def test_writer_refuses_bad_records(tmp_path):
    with VLAShardWriter(tmp_path / "w", vocab_size=50, text_len=4, image_shape=(3, 2, 2), action_shape=(1, 2)) as w:
        img, act = np.zeros((3, 2, 2), np.uint8), np.zeros((1, 2))
        for bad, pattern in [((img.astype(np.float32), [1], act), r"record 0: image float32 \[3, 2, 2\], expected "
                                                                  r"uint8 \[3, 2, 2\] \(channels first\)"),
                             ((img.transpose(1, 2, 0), [1], act), r"image uint8 \[2, 2, 3\]"),
                             ((img, [], act), r"0 tokens, expected 1\.\.4 \(text_len\)"),
                             ((img, [1] * 5, act), r"5 tokens, expected 1\.\.4"),
                             ((img, [50], act), r"token id 50 outside 0\.\.49"),
                             ((img, [1], np.zeros((2, 1))), r"actions float64 \[2, 1\], expected real numbers \[1, 2\]"),
                             ((img, [1], np.array([[0, np.nan]])), r"actions\[0, 1\] is nan")]:
            with pytest.raises(ValueError, match=pattern):
                w.add(*bad)
        assert w.n_records == 0
        w.add(img, [1], act)
    with pytest.raises(ValueError, match=r"image_shape=\(3, 0, 2\): expected 3 positive integers"):
        VLAShardWriter(tmp_path / "x", vocab_size=50, text_len=4, image_shape=(3, 0, 2), action_shape=(1, 2))


# --------------------------------------------------------------------------- corruption


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_flipped_frame_byte_is_named_not_decoded(vla_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(vla_dir, bad)
    with ShardSet(bad) as s:
        f = 2
        _flip(s.data_path(f), int(s.frame_offset[f]) + int(s.frame_clen[f]) // 2)  # inside an image, most likely
        with pytest.raises(ShardFormatError, match=rf"{DATA}: frame {f}: checksum mismatch \(xxh3-64\)"):
            s.load_frame(f)
    with pytest.raises(ShardFormatError, match=rf"data/{DATA}: frame {f}: checksum mismatch"):
        verify(bad)
    r = _run("loaders.verify", str(bad))
    assert r.returncode == 1 and f"{DATA}: frame {f}: checksum mismatch" in r.stderr
    with VLAPipeline(bad, micro_batch_size=4, epochs=1, num_workers=2, seed=1) as pl:
        n = 0
        with pytest.raises(ShardFormatError, match=rf"frame {f}: checksum mismatch"):
            for _ in pl:
                n += 1
        assert n < pl.batches_per_epoch  # the batches before the bad frame came, none built from it


@pytest.mark.parametrize("offset", [12, 66, 70, 100, 300, -5])
def test_a_flipped_index_byte_is_named(vla_dir, tmp_path, offset):
    """The header's kind and shapes (66: the kind, 70: the channels), reserved bytes, a column and the last
    record: each caught when the directory opens."""
    bad = tmp_path / "bad"
    shutil.copytree(vla_dir, bad)
    index = bad / INDEX_NAME
    _flip(index, offset % index.stat().st_size)
    with pytest.raises(ShardFormatError, match=rf"{INDEX_NAME}: "):
        ShardSet(bad)
    r = _run("loaders.verify", str(bad))
    assert r.returncode == 1 and INDEX_NAME in r.stderr


def test_a_consistent_but_wrong_index_names_the_frame(vla_dir, tmp_path):
    """A changed image shape with every checksum recomputed still fails: the frames' sizes no longer add up."""
    bad = tmp_path / "bad"
    shutil.copytree(vla_dir, bad)
    index = bad / INDEX_NAME
    data = bytearray(index.read_bytes())
    struct.pack_into("<I", data, 72, 25)                        # image height 24 -> 25
    struct.pack_into("<I", data, 124, zlib.crc32(bytes(data[64:124])))
    index.write_bytes(bytes(data))
    m = json.loads((bad / MANIFEST_NAME).read_text())
    m["checksums"]["index_xxh3"] = file_xxh3(index)
    (bad / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=rf"{INDEX_NAME}: frame 0: frame\.dlen \d+, its records hold \d+ tokens "
                                               rf"and \d+ records x 3\d+ bytes"):
        ShardSet(bad)


def test_the_manifest_and_the_index_must_agree_on_the_kind(vla_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(vla_dir, bad)
    m = json.loads((bad / MANIFEST_NAME).read_text())
    m.pop("record_kind")
    (bad / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=rf"{INDEX_NAME}: the index holds vla records, {MANIFEST_NAME} says "
                                               rf"record_kind='tokens'"):
        ShardSet(bad)
    m.update(record_kind="vla", action_shape=[4, 7])
    (bad / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ShardFormatError, match=r"manifest\.json: action_shape is \[4, 7\], the index says \[4, 6\]"):
        verify(bad)


# --------------------------------------------------------------------------- preprocess from .npz


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_npz_preprocess_both_layouts_round_trip(tmp_path, vla_data, layout):
    npz = write_vla_npz(vla_data, tmp_path / "d.npz", layout=layout)
    assert np.load(npz)["images"].shape[1:] == ((3, 24, 40) if layout == "nchw" else (24, 40, 3))
    m = preprocess_vla([str(npz)], str(tmp_path / "s"), vocab_size=VLA_SPEC.vocab_size, frame_kb=64)
    assert m["preprocess"]["inputs"][0]["image_layout"] == layout and m["text_len"] == VLA_SPEC.text_len
    _assert_same(_records(tmp_path / "s"), vla_data)
    verify(tmp_path / "s")


def test_npz_object_tokens_need_allow_pickle(tmp_path, vla_data):
    objs = np.empty(len(vla_data["lengths"]), object)
    objs[:] = [t[:n].astype(np.int64) for t, n in zip(vla_data["tokens"], vla_data["lengths"])]
    npz = tmp_path / "o.npz"
    np.savez(npz, images=vla_data["images"], tokens=objs, actions=vla_data["actions"].astype(np.float64))
    with pytest.raises(ValueError, match=r"o\.npz: tokens is an object array; loading it runs pickle.*--allow-pickle"):
        preprocess_vla([str(npz)], str(tmp_path / "s"), vocab_size=VLA_SPEC.vocab_size)
    assert not (tmp_path / "s").exists()
    with pytest.warns(UserWarning, match="inferred"):  # no --vocab-size: max id + 1
        m = preprocess_vla([str(npz)], str(tmp_path / "s"), allow_pickle=True, text_len=20, frame_kb=64)
    assert m["preprocess"]["inputs"][0]["tokens"] == "object"
    _assert_same(_records(tmp_path / "s"), vla_data)


def test_npz_errors_name_the_file_and_the_sample(tmp_path, vla_data):
    d = vla_data
    cases = [({k: v for k, v in d.items() if k != "actions"}, r"x\.npz: no 'actions' array"),
             ({**d, "lengths": None}, r"tokens is padded \[N, T\] = \[120, 20\]: a 'lengths' array"),
             ({**d, "actions": d["actions"][:-1]}, r"hold 120, 120 and 119 samples"),
             ({**d, "images": d["images"].astype(np.float32)}, r"images float32 \[120, 3, 24, 40\], expected uint8"),
             ({**d, "lengths": np.where(np.arange(120) == 7, 0, d["lengths"])}, r"x\.npz: sample 7: no tokens"),
             ({**d, "lengths": np.where(np.arange(120) == 9, 21, d["lengths"])}, r"lengths\[9\] = 21, expected 0\.\.20"),
             ({**d, "images": np.zeros((120, 3, 4, 3), np.uint8)}, r"cannot tell channels-first from channels-last")]
    for arrays, pattern in cases:
        np.savez(tmp_path / "x.npz", **{k: v for k, v in arrays.items() if v is not None})
        with pytest.raises(ValueError, match=pattern):
            preprocess_vla([str(tmp_path / "x.npz")], str(tmp_path / "s"), vocab_size=VLA_SPEC.vocab_size)
        assert not (tmp_path / "s").exists()
    np.savez(tmp_path / "x.npz", **d)
    T = int(d["lengths"].max()) - 1
    long = int(np.flatnonzero(d["lengths"] > T)[0])  # the first sample longer than --text-len T
    assert long > 0
    with pytest.raises(ValueError, match=rf"x\.npz: sample {long}: {T + 1} tokens > --text-len {T}"):
        preprocess_vla([str(tmp_path / "x.npz")], str(tmp_path / "s"), vocab_size=VLA_SPEC.vocab_size, text_len=T)
    with pytest.raises(ValueError, match=r"x\.npz: sample \d+: token id \d+ outside 0\.\.9"):
        preprocess_vla([str(tmp_path / "x.npz")], str(tmp_path / "a" / "b" / "s"), vocab_size=10)
    assert not (tmp_path / "a").exists()  # nor the directories it would have made
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not shards")
    with pytest.raises(FileExistsError, match=r"mine: exists and is not a shard directory"):
        preprocess_vla([str(tmp_path / "x.npz")], str(tmp_path / "mine"), vocab_size=VLA_SPEC.vocab_size,
                       overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not shards"


def test_preprocess_cli_kind_vla(tmp_path, vla_data):
    write_vla_npz(vla_data, tmp_path / "d.npz", layout="nhwc")
    r = _run("loaders.preprocess", "--kind", "vla", "--input", str(tmp_path / "d.npz"), "--output",
             str(tmp_path / "s"), "--vocab-size", str(VLA_SPEC.vocab_size), "--frame-kb", "64")
    assert r.returncode == 0, r.stderr
    assert "120 vla records" in r.stdout and "images 3 x 24 x 40 uint8" in r.stdout
    m = json.loads((tmp_path / "s" / MANIFEST_NAME).read_text())
    assert m["compression"]["level"] == 3 and m["compression"]["frame_bytes"] == 64 * 1024  # vla's level default
    assert m["compression"]["ratio_images"] > 1  # the baselines (each column alone) are on by default
    r = _run("loaders.verify", str(tmp_path / "s"))
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK")
    r = _run("loaders.preprocess", "--kind", "vla", "--input", str(tmp_path / "d.npz"), "--output",
             str(tmp_path / "t"), "--short", "drop")  # a flag of the token kind is refused, not ignored
    assert r.returncode == 2 and "--short applies to --kind tokens" in r.stderr
    r = _run("loaders.preprocess", "--kind", "vla", "--input", str(tmp_path / "d.npz"), "--output",
             str(tmp_path / "t"), "--vocab-size", "10")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "d.npz: sample" in r.stderr
    assert not (tmp_path / "t").exists()


# --------------------------------------------------------------------------- the synthetic corpus


def test_synthetic_corpus_is_deterministic_and_its_actions_follow_image_and_text(tmp_path):
    spec = VLASynthSpec(num_samples=40, image_size=(48, 64), text_len=24, action_steps=8, action_dim=8, noise=0)
    a, b = generate_vla(spec), generate_vla(spec)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    other = generate_vla(VLASynthSpec(**{**spec.__dict__, "seed": 1}))
    assert not np.array_equal(a["images"], other["images"])
    assert a["images"].shape == (40, 3, 48, 64) and a["actions"].shape == (40, 8, 8)
    assert 1 <= a["lengths"].min() and a["lengths"].max() <= 24 and not a["tokens"][0, a["lengths"][0]:].any()
    # the chunk ends on the object the instruction names: of the palette, the pixel there is nearest in hue (the
    # direction of its RGB vector: objects are shaded) to the colour the instruction names
    palette = np.array(list(VLA_COLOURS.values()), np.float64)
    palette /= np.linalg.norm(palette, axis=1, keepdims=True)
    colour_of = {VLA_WORDS[c]: k for k, c in enumerate(VLA_COLOURS)}
    for i in range(spec.num_samples):
        (named,) = [colour_of[t] for t in a["tokens"][i, :a["lengths"][i]].tolist() if t in colour_of]
        x, y = a["actions"][i, -1, :2]
        pixel = a["images"][i, :, int((y + 1) / 2 * 48), int((x + 1) / 2 * 64)].astype(np.float64)
        assert int(np.argmax(palette @ pixel)) == named, i


def test_synthetic_corpus_writes_shards_that_load(tmp_path):
    spec = VLASynthSpec(num_samples=30, image_size=(32, 32), text_len=16, action_steps=2, action_dim=4)
    m = write_vla_shards(spec, tmp_path / "s", frame_bytes=64 * 1024)
    assert m["records"] == 30 and m["synth"]["kind"] == "vla" and m["compression"]["ratio_images"] > 1
    assert verify(tmp_path / "s")["records"] == 30
    with VLAPipeline(tmp_path / "s", micro_batch_size=5, epochs=1, num_workers=0) as pl:
        assert sum(b.samples for b in pl) == 30
    r = _run("loaders.synth", "--kind", "vla", "--output", str(tmp_path / "c.npz"), "--samples", "6",
             "--image-size", "32", "--text-len", "16", "--action-shape", "2", "4", "--layout", "nhwc")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["image_shape"] == [3, 32, 32]
    assert np.load(tmp_path / "c.npz")["images"].shape == (6, 32, 32, 3)


def test_write_vla_keeps_records_in_order(tmp_path, vla_data):
    """Frames of several sizes hold the same records in the same order."""
    for kb in (64, 1024):
        write_vla(tmp_path / f"s{kb}", vla_data, frame_bytes=kb * 1024)
        _assert_same(_records(tmp_path / f"s{kb}"), vla_data)
    with ShardSet(tmp_path / "s1024") as s:
        assert s.n_frames == 1
