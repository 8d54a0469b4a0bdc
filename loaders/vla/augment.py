"""Image augmentation of vla records on the loader side: ``AugmentSettings`` and ``augment_image``.

numpy only; run by the pipeline's decode workers on each decoded frame, one generator per sample seeded from
(pipeline seed, epoch, record id), so a sample's augmentation does not depend on the number of workers, the
batch it lands in or the order frames are decoded in. What each setting does and why the flip is off by default
is in docs/loaders.md ("VLA records", augmentation); import these names from ``loaders.vla``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

# Separate the augmentation streams and the samples' draw keys from the plans' SeedSequence([seed, epoch]) streams.
_AUG_STREAM = 0x5A17
_KEY_STREAM = 0x6E01
# ITU-R BT.601 luma weights: the grey of torchvision's rgb_to_grayscale, used by contrast and saturation.
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) \
        and math.isfinite(float(x))  # type: ignore[arg-type]


@dataclass(kw_only=True, frozen=True)
class AugmentSettings:
    """Per-sample image augmentation of the VLA pipeline (decode workers, numpy). Defaults follow GR00T N1's
    training transforms (Isaac-GR00T ``data_config.py``: ``VideoCrop(scale=0.95)``, ``VideoColorJitter(
    brightness=0.3, contrast=0.4, saturation=0.5)``); hue jitter is not done (it needs an HSV round trip)."""

    enabled: bool = True
    """The off switch: False leaves every image exactly as stored."""
    crop_scale: float = 0.95
    """Side of a random crop as a fraction of the image's side (same aspect ratio, uniform position), resized back
    to the stored size (bilinear); 1.0: no crop."""
    shift_px: int = 0
    """Random translation by up to this many pixels in each direction (edge pixels repeated); 0: none."""
    hflip_prob: float = 0.0
    """Probability of a horizontal flip. Off by default: the actions are not mirrored with the image, and an
    action chunk is direction-dependent (an end-effector moving left stays 'left' in the labels), so a flip
    would teach the mirror image of the wrong motion. Turn it on only for left-right symmetric action spaces."""
    brightness: float = 0.3
    """Brightness factor drawn uniformly in [1 - brightness, 1 + brightness] (pixels multiplied); 0: none."""
    contrast: float = 0.4
    """Contrast factor drawn in [1 - contrast, 1 + contrast]: blend with the image's mean grey; 0: none."""
    saturation: float = 0.5
    """Saturation factor drawn in [1 - saturation, 1 + saturation]: blend with the pixel's grey (3 channels
    only); 0: none."""

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {allowed}")

        need(isinstance(self.enabled, (bool, np.bool_)), "enabled", "true or false")
        need(_is_num(self.crop_scale) and 0.1 <= self.crop_scale <= 1.0, "crop_scale", "a number in 0.1..1")
        need(isinstance(self.shift_px, (int, np.integer)) and not isinstance(self.shift_px, bool)
             and 0 <= self.shift_px <= 1024, "shift_px", "an integer in 0..1024")
        need(_is_num(self.hflip_prob) and 0 <= self.hflip_prob <= 1, "hflip_prob", "a probability in 0..1")
        for name in ("brightness", "contrast", "saturation"):
            need(_is_num(getattr(self, name)) and 0 <= getattr(self, name) <= 1, name, "a number in 0..1")

    @property
    def active(self) -> bool:
        """Whether any image can change: enabled and at least one transform not at its identity."""
        return bool(self.enabled) and (self.crop_scale < 1 or self.shift_px > 0 or self.hflip_prob > 0
                                       or self.brightness > 0 or self.contrast > 0 or self.saturation > 0)

    @classmethod
    def from_section(cls, section: Any, key: str = "data.augment") -> "AugmentSettings":
        """Settings read duck-typed from a config section (an object with these attribute names, or a mapping);
        a missing name is a ``TypeError`` naming ``key.<name>``; None: augmentation off."""
        if section is None:
            return cls(enabled=False)
        if isinstance(section, cls):
            return section
        values = {}
        for f in fields(cls):
            try:
                values[f.name] = section[f.name] if isinstance(section, dict) else getattr(section, f.name)
            except (KeyError, AttributeError):
                raise TypeError(f"{key}.{f.name}: the section given ({type(section).__name__}) has no "
                                f"{'key' if isinstance(section, dict) else 'attribute'} {f.name!r}") from None
        return cls(**values)


def sample_rng(seed: int, epoch: int, record: int) -> np.random.Generator:
    """The generator of one sample's augmentation: a pure function of (seed, epoch, global record id)."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, record, _AUG_STREAM]))


def sample_keys(seed: int, epoch: int, records: np.ndarray) -> np.ndarray:
    """Each sample's draw key (int32 in [0, 2**31)): a pure function of (seed, epoch, global record id), new every
    epoch. A model that draws per sample from its key (the VLA's flow-matching time and noise) draws the same
    numbers for a sample in any micro-batch, eager, compiled or captured."""
    out = np.empty(len(records), np.int32)
    for i, r in enumerate(np.asarray(records).tolist()):
        out[i] = np.random.SeedSequence([seed, epoch, r, _KEY_STREAM]).generate_state(1)[0] >> 1
    return out


def _axis(n: int, start: float, size: float, shift: float, flip: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps along one axis of ``n`` pixels resampled to ``n``: output pixel i samples the source at
    start + (i + 0.5) x size / n - 0.5 + shift (pixel centres, as torch's align_corners=False), clamped to the
    image (edge pixels repeated)."""
    c = start + (np.arange(n, dtype=np.float64) + 0.5) * (size / n) - 0.5 + shift
    if flip:
        c = c[::-1]
    c = np.clip(c, 0, n - 1)
    lo = np.floor(c).astype(np.intp)
    hi = np.minimum(lo + 1, n - 1)
    return lo, hi, (c - lo).astype(np.float32)


_local = threading.local()


def _scratch(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three float32 work images of ``shape``, one set per thread and shape, reused from call to call: a fresh
    600 KB temporary per operation is a fresh mmap of the allocator, and its page faults cost more than the
    arithmetic (measured: 5.3 ms against 0.6 ms for the crop of a 3 x 224 x 224 image)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None or bufs[0].shape != shape:
        bufs = _local.bufs = tuple(np.empty(shape, np.float32) for _ in range(3))
    return bufs


def augment_image(src: np.ndarray, out: np.ndarray, rng: np.random.Generator, s: AugmentSettings) -> None:
    """Write an augmented copy of ``src`` (uint8 [C, H, W]) into ``out`` (same shape and dtype).

    Geometry first (crop resized back, shift, flip: one bilinear resampling), then colour (brightness,
    contrast, saturation, in that order), then rounding to uint8. The draws are made in a fixed order, each
    only when its transform is on, so the same settings and generator give the same image. With ``enabled``
    False ``out`` is a plain copy of ``src``.
    """
    if not s.enabled:
        out[...] = src
        return
    C, H, W = src.shape
    crop = s.crop_scale < 1
    ch, cw = (s.crop_scale * H, s.crop_scale * W) if crop else (float(H), float(W))
    y0 = rng.uniform(0, H - ch) if crop else 0.0
    x0 = rng.uniform(0, W - cw) if crop else 0.0
    dy, dx = (rng.integers(-s.shift_px, s.shift_px + 1, 2).tolist() if s.shift_px else (0, 0))
    flip = bool(s.hflip_prob > 0 and rng.random() < s.hflip_prob)
    b = rng.uniform(1 - s.brightness, 1 + s.brightness) if s.brightness else 1.0
    c = rng.uniform(1 - s.contrast, 1 + s.contrast) if s.contrast else 1.0
    sat = rng.uniform(1 - s.saturation, 1 + s.saturation) if s.saturation and C == 3 else 1.0
    colour = b != 1.0 or c != 1.0 or sat != 1.0

    if not crop:  # whole-pixel moves (or none): a gather, no interpolation
        if dy or dx or flip:
            rows = np.clip(np.arange(H) + dy, 0, H - 1)
            cols = np.clip(np.arange(W) + dx, 0, W - 1)
            src = src[:, rows][:, :, cols[::-1] if flip else cols]
        if not colour:
            out[...] = src
            return
    img, t0, t1 = _scratch(src.shape)
    np.copyto(img, src)  # uint8 -> float32
    if crop:  # fractional source coordinates: bilinear, rows then columns, in the scratch images
        ylo, yhi, wy = _axis(H, y0, ch, dy, False)
        xlo, xhi, wx = _axis(W, x0, cw, dx, flip)
        np.take(img, ylo, axis=1, out=t0)
        np.take(img, yhi, axis=1, out=t1)
        t1 -= t0
        t1 *= wy[None, :, None]
        t0 += t1                                  # rows resampled, in t0
        np.take(t0, xlo, axis=2, out=img)
        np.take(t0, xhi, axis=2, out=t1)
        t1 -= img
        t1 *= wx[None, None, :]
        img += t1                                 # columns too, in img
    if b != 1.0:
        img *= b
        np.minimum(img, 255, out=img)
    if c != 1.0:  # blend with the mean grey of the whole image
        grey = float(np.tensordot(_LUMA, img, 1).mean()) if C == 3 else float(img.mean())
        img *= c
        img += (1 - c) * grey
        np.clip(img, 0, 255, out=img)
    if sat != 1.0:  # blend each pixel with its own grey
        grey_HW = np.tensordot(_LUMA, img, 1)
        grey_HW *= 1 - sat
        img *= sat
        img += grey_HW[None]
        np.clip(img, 0, 255, out=img)
    if crop and not colour:
        np.clip(img, 0, 255, out=img)  # bilinear weights are convex: only rounding noise can leave 0..255
    np.rint(img, out=img)
    np.copyto(out, img, casting="unsafe")
