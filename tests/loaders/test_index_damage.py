"""A damaged index is never trained on: any flipped byte of index.lbx fails the manifest's checksum when the
directory is opened; an index rewritten with a matching checksum but a wrong record offset or length fails the
structural check, naming the record; and the train CLI stops with one line naming the file, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from loaders._layout import file_xxh3
from loaders.format import INDEX_NAME, MANIFEST_NAME, ShardFormatError, ShardSet
from test_format import _random_records, _write


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "s"
    _write(d, _random_records(np.random.default_rng(0), 300, 1000, 512, min_len=40))
    return d


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_every_flipped_index_byte_is_caught_at_open(shards):
    index = shards / INDEX_NAME
    clean = index.read_bytes()
    rng = np.random.default_rng(1)
    offsets = sorted({*rng.integers(0, len(clean), 40).tolist(), len(clean) - 1, 200, 128})
    for off in offsets:
        index.write_bytes(clean)
        _flip(index, off)
        with pytest.raises(ShardFormatError, match=rf"{INDEX_NAME}: "):  # named, whichever check fires first
            ShardSet(shards)
    index.write_bytes(clean)
    ShardSet(shards).close()


def _rewrite_checksum(d):
    m = json.loads((d / MANIFEST_NAME).read_text())
    m["checksums"]["index_xxh3"] = file_xxh3(d / INDEX_NAME)
    (d / MANIFEST_NAME).write_text(json.dumps(m))


def _poke(d, column, row, value):
    with ShardSet(d) as s:
        col = s.col(column)
        off = col.offset + row * col.dtype.itemsize  # np.memmap's byte offset in the file
        raw = np.array([value], col.dtype).tobytes()
    data = bytearray((d / INDEX_NAME).read_bytes())
    data[off:off + len(raw)] = raw
    (d / INDEX_NAME).write_bytes(bytes(data))
    _rewrite_checksum(d)


def test_a_consistent_but_wrong_record_is_named(shards):
    with ShardSet(shards) as s:
        r = int(s.frame_first_rec[1]) + 1  # the second record of frame 1
        off = int(s.rec_offset[r])
        last = int(s.frame_first_rec[1] + s.frame_n_rec[1]) - 1  # the last record of frame 1
        length = int(s.rec_length[last])
    clean = (shards / INDEX_NAME).read_bytes(), (shards / MANIFEST_NAME).read_text()
    _poke(shards, "rec.offset", r, off + 16)  # shifted by 16 tokens, as the fault campaign did
    with pytest.raises(ShardFormatError, match=rf"index\.lbx: record {r} \(frame 1\): rec\.offset {off + 16}, "
                                               rf"expected {off} \(records are back to back\)"):
        ShardSet(shards)
    (shards / INDEX_NAME).write_bytes(clean[0])
    (shards / MANIFEST_NAME).write_text(clean[1])
    _poke(shards, "rec.length", last, length + 900)  # longer than its bucket
    with pytest.raises(ShardFormatError, match=rf"index\.lbx: record {last} \(frame 1\): rec\.length "
                                               rf"{length + 900} does not belong in bucket \d+"):
        ShardSet(shards)


def test_train_refuses_a_damaged_index_in_one_line(shards, tmp_path, subprocess_env):
    from workbench.config import dump_config, merge_overrides, preset_config

    cfg = merge_overrides(preset_config("tiny"), {"data.loongbin_dir": str(shards), "data.seq_len": 512,
                                                   "data.num_workers": 0, "hardware.device": "cpu",
                                                   "training.max_steps": 2, "training.dtype": "fp32"})
    dump_config(cfg, tmp_path / "c.yaml")
    _flip(shards / INDEX_NAME, (shards / INDEX_NAME).stat().st_size - 3)  # a record's length, in the body
    r = subprocess.run([sys.executable, "-m", "workbench.train", "--config", str(tmp_path / "c.yaml"), "-q",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=subprocess_env,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error (invalid_config): ShardFormatError: ") and INDEX_NAME in lines[-1]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "phases.csv").exists()  # not one step trained
    failure = json.loads((tmp_path / "out" / "failure.json").read_text())
    assert failure["kind"] == "invalid_config" and "checksum mismatch" in failure["message"]
