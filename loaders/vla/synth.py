"""A deterministic synthetic VLA corpus: tabletop images, pick-up instructions, action chunks that follow from both.

``VLASynthSpec`` (validated parameters), ``iter_vla_samples`` / ``generate_vla`` (the samples),
``write_vla_npz`` (the ``.npz`` that ``python -m loaders.preprocess --kind vla`` reads) and
``write_vla_shards`` (straight into a shard directory). The model of a scene is described in docs/loaders.md
("VLA records", the synthetic corpus); import these names from ``loaders.synth``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.files import atomic_write
from ..format import VLAShardWriter

__all__ = ["VLASynthSpec", "iter_vla_samples", "generate_vla", "write_vla_npz", "write_vla_shards",
           "VLA_COLOURS", "VLA_SHAPES", "VLA_WORDS"]

# Object colours (RGB) and shapes an instruction can name; a scene's objects have distinct colours.
VLA_COLOURS = {"red": (200, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 200), "yellow": (220, 200, 40),
               "purple": (140, 60, 170), "orange": (230, 130, 30)}
VLA_SHAPES = ("block", "ball")
# Token ids: 0 pads, then the instruction's words, then filler words (Zipf-ranked) up to the vocabulary.
_PAD, _BOS = 0, 1
_VERBS = ("pick up", "grab", "lift")
_WORDS = ("pick", "up", "grab", "lift", "the", *VLA_COLOURS, *VLA_SHAPES, "and", "hold", "it")
_FIRST_FILLER = 2 + len(_WORDS)
VLA_WORDS = {w: 2 + i for i, w in enumerate(_WORDS)}
"""The token id of each instruction word (ids from ``_FIRST_FILLER`` on are filler words)."""
_FILLER_MEAN = 6.0       # extra words per instruction (Poisson mean): instructions of ~6..20 tokens
_ACTION_NOISE = 0.01     # std of the noise added to every action element
_JOINT_SEED = 0x0A11     # the fixed "arm": joint features are one random map of the end-effector state, per corpus
_LAYOUT_TRIES = 100      # draws of a scene's layout before one with touching objects is kept (rare)


@dataclass(kw_only=True)
class VLASynthSpec:
    """Parameters of a synthetic VLA corpus; validated on construction."""

    num_samples: int = 256
    """Samples to generate."""
    image_size: tuple[int, int] = (224, 224)
    """Image height and width (pixels); the images are RGB, 3 x H x W uint8."""
    text_len: int = 256
    """Longest instruction in tokens (the shard set's text length)."""
    action_steps: int = 16
    """K: steps of an action chunk."""
    action_dim: int = 32
    """A: dimensions of an action; 4 or more (x, y, height, gripper, then joint features)."""
    vocab_size: int = 4096
    """Token ids are below this (the tiny model's vocabulary, as the token corpus)."""
    num_objects: int = 3
    """Objects on the table, one of them the instruction's target (at most the number of colours)."""
    noise: float = 4.0
    """Standard deviation of the per-pixel sensor noise, in 0..255 units (what limits zstd's ratio)."""
    seed: int = 0
    """Same spec -> bit-identical corpus; sample i depends on (seed, i) only."""

    def __post_init__(self) -> None:
        if isinstance(self.image_size, (int, np.integer)):
            self.image_size = (int(self.image_size), int(self.image_size))
        self.image_size = tuple(self.image_size)  # type: ignore[assignment]
        checks = [("num_samples", self.num_samples, 1), ("text_len", self.text_len, 8),
                  ("action_steps", self.action_steps, 1), ("action_dim", self.action_dim, 4),
                  ("num_objects", self.num_objects, 1), ("seed", self.seed, 0)]
        for name, v, lo in checks:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
                raise ValueError(f"VLASynthSpec.{name}={v!r}: must be an int >= {lo}")
        if len(self.image_size) != 2 or not all(isinstance(x, (int, np.integer)) and 16 <= x <= 4096
                                                for x in self.image_size):
            raise ValueError(f"VLASynthSpec.image_size={self.image_size!r}: must be (H, W), each in 16..4096")
        if self.num_objects > len(VLA_COLOURS):
            raise ValueError(f"VLASynthSpec.num_objects={self.num_objects}: at most {len(VLA_COLOURS)} (one colour "
                             f"each)")
        if not isinstance(self.vocab_size, (int, np.integer)) or not _FIRST_FILLER + 16 <= self.vocab_size <= 1 << 24:
            raise ValueError(f"VLASynthSpec.vocab_size={self.vocab_size!r}: must be an int in "
                             f"{_FIRST_FILLER + 16}..{1 << 24}")
        if not (isinstance(self.noise, (int, float)) and math.isfinite(self.noise) and 0 <= self.noise <= 64):
            raise ValueError(f"VLASynthSpec.noise={self.noise!r}: must be a number in 0..64")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, *self.image_size)

    @property
    def action_shape(self) -> tuple[int, int]:
        return (self.action_steps, self.action_dim)


def _instruction(rng: np.random.Generator, colour: str, shape: str, spec: VLASynthSpec) -> np.ndarray:
    """[BOS] verb "the" colour shape, then Zipf-ranked filler words, cut to text_len."""
    verb = _VERBS[int(rng.integers(len(_VERBS)))].split()
    words = [_BOS, *(VLA_WORDS[w] for w in verb), VLA_WORDS["the"], VLA_WORDS[colour], VLA_WORDS[shape]]
    if rng.random() < 0.5:
        words += [VLA_WORDS["and"], VLA_WORDS["hold"], VLA_WORDS["it"]]
    n_fill = int(rng.poisson(_FILLER_MEAN))
    if n_fill:
        ranks = rng.zipf(1.3, n_fill) - 1
        words += (_FIRST_FILLER + ranks % (spec.vocab_size - _FIRST_FILLER)).tolist()
    return np.asarray(words[:spec.text_len], np.int32)


def _joint_map(spec: VLASynthSpec) -> np.ndarray:
    """The fixed map from (x, y, height, gripper, 1) to the A - 4 joint features: the same for every sample."""
    return np.random.default_rng(_JOINT_SEED).normal(0, 0.8, (5, spec.action_dim - 4)).astype(np.float32)


def _actions(rng: np.random.Generator, start: np.ndarray, target: np.ndarray, joints: np.ndarray,
             spec: VLASynthSpec) -> np.ndarray:
    """The chunk: the end-effector moves from ``start`` to ``target`` (image coordinates in -1..1) on a
    smoothstep, descends, and closes the gripper over the last quarter; joint features follow from that state."""
    K = spec.action_steps
    t = (np.arange(1, K + 1, dtype=np.float32) / K)
    s = t * t * (3 - 2 * t)
    xy = start[None, :] + (target - start)[None, :] * s[:, None]         # [K, 2]
    height = 1 - s
    grip = (t <= 0.75).astype(np.float32)                                # 1 open, 0 closed
    state = np.column_stack([xy, height, grip, np.ones(K, np.float32)])  # [K, 5]
    out = np.concatenate([state[:, :4], np.tanh(state @ joints)], axis=1)
    out += rng.normal(0, _ACTION_NOISE, out.shape).astype(np.float32)
    return out.astype(np.float32)


def _grid(H: int, W: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres in -1..1 (y down, x right), [H, 1] and [1, W]."""
    return ((np.arange(H, dtype=np.float32) + 0.5) / H * 2 - 1)[:, None], \
        ((np.arange(W, dtype=np.float32) + 0.5) / W * 2 - 1)[None, :]


def _layout(rng: np.random.Generator, n: int, edge: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Object centres [n, 2] on the table, their half-sizes [n] and the gripper's start [2], drawn again (up to
    _LAYOUT_TRIES times) until no two objects touch and the gripper is clear of them, so that every object the
    instruction can name is visible and the start can be seen."""
    for _ in range(_LAYOUT_TRIES):
        centres = np.column_stack([rng.uniform(-0.75, 0.75, n),
                                   rng.uniform(max(edge, -0.6) + 0.15, 0.8, n)]).astype(np.float32)
        sizes = rng.uniform(0.08, 0.16, n).astype(np.float32)
        start = rng.uniform(-0.8, 0.8, 2).astype(np.float32)
        gap = np.linalg.norm(centres[:, None] - centres[None], axis=-1) - 1.5 * (sizes[:, None] + sizes[None])
        clear = np.linalg.norm(centres - start, axis=1) - 1.5 * sizes - 0.06
        if (gap[~np.eye(n, dtype=bool)] > 0).all() and (clear > 0).all():
            break
    return centres, sizes, start


def iter_vla_samples(spec: VLASynthSpec) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(image uint8 [3, H, W], tokens int32 [L], actions float32 [K, A]) of every sample, in order.

    A scene: a wall and a table (two colours, a soft edge between them), ``num_objects`` blocks or balls of
    distinct colours at random places, the gripper (a grey ring) at a random start, and sensor noise. The
    instruction names one object by colour and shape; the actions move the gripper from its start to that
    object. So the actions depend on the image (where things are) and on the text (which one)."""
    H, W = spec.image_size
    yy, xx = _grid(H, W)
    joints = _joint_map(spec)
    names = list(VLA_COLOURS)
    for i in range(spec.num_samples):
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, i]))
        wall, table = rng.integers(60, 230, (2, 3)).astype(np.float32)
        edge = rng.uniform(-0.6, -0.1)
        blend = np.clip((yy - edge) * 8 + 0.5, 0, 1)                     # [H, 1]: 0 wall, 1 table
        img = wall[:, None, None] * (1 - blend)[None] + table[:, None, None] * blend[None]
        img = np.broadcast_to(img, (3, H, W)).copy()
        colours = rng.choice(len(names), spec.num_objects, replace=False)
        shapes = rng.integers(len(VLA_SHAPES), size=spec.num_objects)
        centres, sizes, start = _layout(rng, spec.num_objects, edge)
        for c, (cx, cy), r, sh in zip(colours, centres, sizes, shapes):
            dx, dy = xx - cx, yy - cy
            inside = (dx * dx + dy * dy < r * r) if VLA_SHAPES[sh] == "ball" else \
                (np.abs(dx) < r) & (np.abs(dy) < r)
            shade = 1 - 0.25 * np.clip(dy / r, -1, 1)                   # lit from above
            for ch in range(3):
                img[ch] = np.where(inside, VLA_COLOURS[names[c]][ch] * shade, img[ch])
        d2 = (xx - start[0]) ** 2 + (yy - start[1]) ** 2
        ring = (d2 > 0.04 ** 2) & (d2 < 0.06 ** 2)
        img[:, ring] = 128.0
        if spec.noise:
            img += rng.normal(0, spec.noise, img.shape).astype(np.float32)
        image = np.clip(np.rint(img), 0, 255).astype(np.uint8)
        t = int(rng.integers(spec.num_objects))
        tokens = _instruction(rng, names[colours[t]], VLA_SHAPES[shapes[t]], spec)
        yield image, tokens, _actions(rng, start, centres[t], joints, spec)


def generate_vla(spec: VLASynthSpec) -> dict[str, np.ndarray]:
    """All samples as arrays: ``images`` uint8 [N, 3, H, W], ``tokens`` int32 [N, text_len] (padded with 0),
    ``lengths`` int64 [N], ``actions`` float32 [N, K, A]: the layout ``write_vla_npz`` stores."""
    N, (H, W), T = spec.num_samples, spec.image_size, spec.text_len
    out = {"images": np.empty((N, 3, H, W), np.uint8), "tokens": np.full((N, T), _PAD, np.int32),
           "lengths": np.empty(N, np.int64), "actions": np.empty((N, *spec.action_shape), np.float32)}
    for i, (image, tokens, actions) in enumerate(iter_vla_samples(spec)):
        out["images"][i], out["actions"][i] = image, actions
        out["tokens"][i, :len(tokens)], out["lengths"][i] = tokens, len(tokens)
    return out


def write_vla_npz(data: dict[str, np.ndarray], path: str | os.PathLike, *, layout: str = "nchw") -> Path:
    """Write ``generate_vla``'s arrays as an uncompressed ``.npz`` (images as [N, 3, H, W] with
    ``layout="nchw"``, [N, H, W, 3] with ``"nhwc"``); atomic (temp file + rename)."""
    if layout not in ("nchw", "nhwc"):
        raise ValueError(f"layout={layout!r}: expected 'nchw' or 'nhwc'")
    images = data["images"] if layout == "nchw" else np.ascontiguousarray(data["images"].transpose(0, 2, 3, 1))
    arrays = {**data, "images": images}
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def write_vla_shards(spec: VLASynthSpec, out_dir: str | os.PathLike, **writer: Any) -> dict:
    """Generate the corpus straight into a shard directory (``VLAShardWriter``; ``writer`` are its further
    keyword arguments, e.g. ``zstd_level``, ``overwrite``); returns the manifest."""
    with VLAShardWriter(out_dir, vocab_size=spec.vocab_size, text_len=spec.text_len, image_shape=spec.image_shape,
                        action_shape=spec.action_shape, **writer) as w:
        for image, tokens, actions in iter_vla_samples(spec):
            w.add(image, tokens, actions)
        return w.close(extra_manifest={"synth": {"kind": "vla", "num_samples": spec.num_samples,
                                                 "noise": spec.noise, "num_objects": spec.num_objects,
                                                 "seed": spec.seed}})
