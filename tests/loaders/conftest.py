"""Fixtures of the vla record tests: a small synthetic VLA corpus and its shard directory."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.format import VLAShardWriter
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
