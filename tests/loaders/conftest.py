"""Fixtures of the loader tests: the token shard set of the pipeline's tests (test_pipeline.py,
test_pipeline_config.py), and a small synthetic VLA corpus and its shard directory (the vla record tests)."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.format import ShardSet, ShardWriter, VLAShardWriter
from loaders.synth import VLASynthSpec, generate_vla

# Small enough for the CPU suite; a non-square image so that a swapped H and W cannot pass, and ~3 KB records so
# that 64 KiB frames hold ~20 of them (6 frames: shuffling, frame boundaries and refcounts are exercised).
VLA_SPEC = VLASynthSpec(num_samples=120, image_size=(24, 40), text_len=20, action_steps=4, action_dim=6, seed=3)
VLA_FRAME_BYTES = 64 * 1024


@pytest.fixture(scope="session")
def vla_data() -> dict[str, np.ndarray]:
    """The corpus as arrays: images [N, 3, 24, 40] uint8, tokens [N, 20] (lengths [N]), actions [N, 4, 6]."""
    return generate_vla(VLA_SPEC)


def write_vla(out, data: dict[str, np.ndarray], **kw) -> dict:
    """``data``'s samples, in order, through ``VLAShardWriter``; returns the manifest."""
    args = dict(vocab_size=VLA_SPEC.vocab_size, text_len=VLA_SPEC.text_len, image_shape=VLA_SPEC.image_shape,
                action_shape=VLA_SPEC.action_shape, zstd_level=3, frame_bytes=VLA_FRAME_BYTES,
                compare_baselines=False)
    with VLAShardWriter(out, **{**args, **kw}) as w:
        for img, tok, n, act in zip(data["images"], data["tokens"], data["lengths"], data["actions"]):
            w.add(img, tok[:n], act)
        return w.close()


@pytest.fixture(scope="session")
def vla_dir(tmp_path_factory, vla_data):
    out = tmp_path_factory.mktemp("vla") / "shards"
    write_vla(out, vla_data)
    return out


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """2,000 records of 1..512 tokens, 4 buckets of width 128, 64 KiB frames (~37 frames)."""
    out = tmp_path_factory.mktemp("pipeline") / "shards"
    rng = np.random.default_rng(7)
    with ShardWriter(out, vocab_size=1000, bucket_width=128, max_len=512, zstd_level=3, frame_bytes=64 * 1024,
                     compare_baselines=False) as w:
        for _ in range(2000):
            n = int(rng.integers(1, 513))
            doc = int(rng.integers(16, 300))  # packed documents: positions restart every `doc` tokens
            w.add(rng.integers(0, 1000, n).astype(np.uint16), loss_mask=(rng.random(n) < 0.9).astype(np.uint8),
                  position_ids=np.arange(n) % doc)
    return out


@pytest.fixture(scope="module")
def shards(shard_dir):
    with ShardSet(shard_dir) as ss:
        yield ss
