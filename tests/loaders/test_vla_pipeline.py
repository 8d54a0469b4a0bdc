"""loaders.vla: VLA batches (exact contents, fixed shapes, padding), augmentation in the decode workers (seeded per
sample, geometry and colour), the staging guard under a slow consumer, resume, metrics, building from config
sections, and the CUDA copy."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import VLA_SPEC
from loaders.pipeline import EpochPlan
from loaders.reader import probe_io_uring
from loaders.vla import AugmentSettings, VLAPipeline, augment_image, sample_keys, sample_rng

MB = 8
URING_BACKEND = "io_uring" if probe_io_uring()[0] else "threadpool"
C, H, W = VLA_SPEC.image_shape
K, A = VLA_SPEC.action_shape


def _check_batch(b, data, T=VLA_SPEC.text_len, images=True):
    """Shapes and dtypes fixed; every row is its record's sample; the text padded with 0 to ``T``."""
    assert b.images.shape == (MB, C, H, W) and b.images.dtype == torch.uint8
    assert b.input_ids.shape == b.position_ids.shape == b.attention_mask.shape == (MB, T)
    assert b.input_ids.dtype == b.position_ids.dtype == torch.int32 and b.attention_mask.dtype == torch.uint8
    assert b.actions.shape == (MB, K, A) and b.actions.dtype == torch.float32
    assert b.samples == MB and b.seq_len == b.length == T and b.padded_tokens == MB * T
    ids, pos, mask = (t.cpu().numpy() for t in (b.input_ids, b.position_ids, b.attention_mask))
    for row, r in enumerate(b.record_ids.tolist()):
        L = int(data["lengths"][r])
        assert b.text_lengths[row] == L
        assert np.array_equal(ids[row, :L], data["tokens"][r, :L]) and not ids[row, L:].any()
        assert np.array_equal(pos[row], np.where(np.arange(T) < L, np.arange(T), 0))
        assert np.array_equal(mask[row], (np.arange(T) < L).astype(np.uint8))
        assert np.array_equal(b.actions[row].cpu().numpy(), data["actions"][r])
        if images:
            assert np.array_equal(b.images[row].cpu().numpy(), data["images"][r])
    assert b.real_tokens == int(data["lengths"][b.record_ids].sum())


@pytest.mark.parametrize("backend, workers", [("threadpool", 0), (URING_BACKEND, 2)])
def test_batches_are_the_records_exactly_in_the_plans_order(vla_dir, vla_data, backend, workers):
    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=4, io_backend=backend, num_workers=workers, epochs=1) as pl:
        plan = EpochPlan(pl.shards, micro_batch_size=MB, seed=4, epoch=0)
        seen = []
        for k, b in enumerate(pl):
            assert (b.epoch, b.index) == (0, k) and np.array_equal(b.record_ids, plan.batches[k])
            _check_batch(b, vla_data)
            seen += b.record_ids.tolist()
        assert len(seen) == len(set(seen)) == pl.batches_per_epoch * MB == 120 - 120 % MB
        m = pl.metrics()
        assert m["io/reads"] == pl.shards.n_frames and m["data/samples"] == len(seen)
        assert m["decode/samples_per_s"] > 0 and m["io/backend"] == backend


def test_text_is_padded_to_the_configured_length(vla_dir, vla_data):
    with VLAPipeline(vla_dir, micro_batch_size=MB, text_len=32, epochs=1, num_workers=0) as pl:
        assert pl.batch_lengths() == [32] and pl.layout.T == 32
        for b in pl:
            _check_batch(b, vla_data, T=32)
    longest = int(vla_data["lengths"].max())
    with pytest.raises(ValueError, match=rf"text_len={longest - 1}: the shard set .* has instructions of up to "
                                         rf"{longest} tokens"):
        VLAPipeline(vla_dir, micro_batch_size=MB, text_len=longest - 1)
    with pytest.raises(ValueError, match=r"image_size=\[24, 24\]: the shard set .* holds 3 x 24 x 40 images"):
        VLAPipeline(vla_dir, micro_batch_size=MB, image_size=24)
    with pytest.raises(ValueError, match=r"action_shape=\[4, 7\]: the shard set .* holds action chunks of 4 x 6"):
        VLAPipeline(vla_dir, micro_batch_size=MB, action_shape=(4, 7))
    VLAPipeline(vla_dir, micro_batch_size=MB, image_size=(24, 40), action_shape=(4, 6)).close()  # the stored ones pass


# --------------------------------------------------------------------------- augmentation


def _images_by_record(pl) -> dict[int, np.ndarray]:
    out = {}
    for b in pl:
        for row, r in enumerate(b.record_ids.tolist()):
            out[r] = b.images[row].numpy().copy()
    return out


def test_augmentation_is_seeded_per_sample_and_leaves_text_and_actions(vla_dir, vla_data):
    aug = AugmentSettings()  # the defaults: crop 0.95 resized back, brightness, contrast, saturation
    runs = {}
    for name, seed, workers in (("a", 1, 0), ("b", 1, 2), ("c", 2, 2)):
        with VLAPipeline(vla_dir, micro_batch_size=MB, seed=seed, augment=aug, num_workers=workers, epochs=2) as pl:
            per_epoch = [{}, {}]
            for b in pl:
                _check_batch(b, vla_data, images=False)  # tokens and actions untouched
                for row, r in enumerate(b.record_ids.tolist()):
                    per_epoch[b.epoch][r] = b.images[row].numpy().copy()
            runs[name] = per_epoch
            assert pl.metrics()["decode/augment_busy_s"] > 0
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert a[0].keys() == b[0].keys() and all(np.array_equal(a[0][r], b[0][r]) for r in a[0])  # workers: no effect
    common = a[0].keys() & c[0].keys()
    assert len(common) > 50 and all(not np.array_equal(a[0][r], c[0][r]) for r in common)  # another seed
    with VLAPipeline(vla_dir, micro_batch_size=4, seed=1, augment=aug, shuffle_window_frames=1, epochs=1) as pl:
        other_plan = _images_by_record(pl)  # other batches, other frame order: the same image per record
    common = a[0].keys() & other_plan.keys()
    assert len(common) > 50 and all(np.array_equal(a[0][r], other_plan[r]) for r in common)
    again = a[0].keys() & a[1].keys()
    assert all(not np.array_equal(a[0][r], a[1][r]) for r in again)  # each epoch augments anew
    for r, img in a[0].items():  # changed, same shape and dtype (checked in _check_batch too)
        raw = vla_data["images"][r]
        assert img.shape == raw.shape and img.dtype == np.uint8
        assert np.mean(img != raw) > 0.5
    # the off switch: exactly the stored images
    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=1, augment=AugmentSettings(enabled=False), epochs=1) as pl:
        for b in pl:
            _check_batch(b, vla_data)


def test_each_samples_key_is_its_seed_epoch_and_record(vla_dir):
    """A batch's ``keys`` are ``sample_keys`` of its records: the same key for a record at any micro-batch and frame
    order, new each epoch, another under another seed, all in [0, 2**31)."""
    def keys_by_record(mb: int, seed: int, window: int = 4) -> list[dict[int, int]]:
        per_epoch: list[dict[int, int]] = [{}, {}]
        with VLAPipeline(vla_dir, micro_batch_size=mb, seed=seed, shuffle_window_frames=window, epochs=2) as pl:
            for b in pl:
                assert b.keys.dtype == torch.int32 and b.keys.shape == (mb,)
                assert np.array_equal(b.keys.numpy(), sample_keys(seed, b.epoch, b.record_ids))
                per_epoch[b.epoch].update(zip(b.record_ids.tolist(), b.keys.tolist()))
        return per_epoch

    a, other, c = keys_by_record(MB, 1), keys_by_record(4, 1, window=1), keys_by_record(MB, 2)
    common = a[0].keys() & other[0].keys()
    assert len(common) > 50 and all(a[0][r] == other[0][r] for r in common)
    assert all(a[0][r] != a[1][r] for r in a[0].keys() & a[1].keys())
    assert all(a[0][r] != c[0][r] for r in a[0].keys() & c[0].keys())
    assert all(0 <= k < 2**31 for k in a[0].values()) and len(set(a[0].values())) == len(a[0])


def test_augment_image_geometry_and_colour():
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    ramp = np.broadcast_to(2 * y + 3 * x + 10, (C, H, W)).round().astype(np.uint8)  # 10..192
    out = np.empty_like(ramp)
    geometry = AugmentSettings(brightness=0, contrast=0, saturation=0, crop_scale=0.5)
    augment_image(ramp, out, sample_rng(0, 0, 0), geometry)
    # a crop of half the side resized back: the ramp's slopes halve along each axis (rows: 2 -> 1, columns:
    # 3 -> 1.5); swapped axes or a wrong scale would move them; +-0.05: the rounding of 1,000 pixels' slopes
    assert np.diff(out.astype(float), axis=1).mean() == pytest.approx(1.0, abs=0.05)
    assert np.diff(out.astype(float), axis=2).mean() == pytest.approx(1.5, abs=0.05)
    assert np.array_equal(out[0], out[1]) and np.array_equal(out[1], out[2])
    flip = AugmentSettings(brightness=0, contrast=0, saturation=0, crop_scale=1.0, hflip_prob=1.0)
    augment_image(ramp, out, sample_rng(0, 0, 0), flip)
    assert np.array_equal(out, ramp[:, :, ::-1])
    shift = AugmentSettings(brightness=0, contrast=0, saturation=0, crop_scale=1.0, shift_px=3)
    augment_image(ramp, out, sample_rng(0, 0, 5), shift)
    moved = out[:, 3:-3, 3:-3].astype(int) - ramp[:, 3:-3, 3:-3]  # inside the edges: the ramp moved by (dy, dx)
    assert len(np.unique(moved)) == 1 and moved.flat[0] != 0
    assert moved.flat[0] in {2 * dy + 3 * dx for dy in range(-3, 4) for dx in range(-3, 4)}
    bright = AugmentSettings(brightness=0.3, contrast=0, saturation=0, crop_scale=1.0)
    ratios = []
    for r in range(20):
        augment_image(ramp, out, sample_rng(0, 0, r), bright)
        ratios.append(out.astype(float).mean() / ramp.astype(float).mean())
    assert 0.69 < min(ratios) < max(ratios) < 1.31 and max(ratios) - min(ratios) > 0.2
    for bad, pattern in ((dict(crop_scale=2), r"crop_scale=2: expected a number in 0\.1\.\.1"),
                         (dict(hflip_prob=-1), r"hflip_prob=-1"), (dict(shift_px=1.5), r"shift_px=1\.5")):
        with pytest.raises(ValueError, match=pattern):
            AugmentSettings(**bad)


# --------------------------------------------------------------------------- staging


def _held_batch_survives(vla_dir, vla_data, guard: bool) -> tuple[bool, int]:
    """A slow consumer holds batch 0 while the producer runs ahead on 2 staging blocks; is batch 0 still right?"""
    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=2, num_staging_blocks=2, prefetch_batches=4, num_workers=0,
                     io_backend="threadpool", epochs=1, guard=guard) as pl:
        held = next(pl)
        t0 = time.monotonic()
        while time.monotonic() < t0 + 5 and pl.metrics()["data/batches_assembled"] < 2:
            time.sleep(0.01)
        deadline = time.monotonic() + (0.3 if guard else 5.0)
        while time.monotonic() < deadline and pl.metrics()["data/batches_assembled"] < 4:
            time.sleep(0.01)
        ahead = pl.metrics()["data/batches_assembled"]
        try:
            _check_batch(held, vla_data)  # against the inputs, not a snapshot taken late
        except AssertionError:
            return False, ahead
        assert pl.metrics()["memory/staging_acquires"] == ahead
        return True, ahead


def test_staging_blocks_are_reused_and_a_held_batch_stays_intact(vla_dir, vla_data):
    intact, ahead = _held_batch_survives(vla_dir, vla_data, guard=True)
    assert ahead == 2 and intact  # the producer filled the other block, then waited for the held one
    # expected failure, on purpose: without the guard the held block is refilled and the same check sees it
    intact, ahead = _held_batch_survives(vla_dir, vla_data, guard=False)
    assert ahead >= 4 and not intact, "the staging check did not see an overwrite with guard=False"
    with VLAPipeline(vla_dir, micro_batch_size=MB, num_staging_blocks=3, epochs=1) as pl:
        ptrs = {b.images.data_ptr() for b in pl}  # CPU batches view their block: 3 blocks, 3 addresses
        assert len(ptrs) == 3 and pl.metrics()["memory/staging_reuse_ratio"] == pytest.approx(1 - 3 / 15)
        assert pl.ring.block_bytes == pl.layout.block_bytes() and pl.ring.block_bytes % 4096 == 0
    need = pl.layout.block_bytes() // 1024
    with pytest.raises(ValueError, match=rf"pinned_block_kb=4: .* too small for a batch of 8 samples .*need "
                                         rf"pinned_block_kb >= {need}"):
        VLAPipeline(vla_dir, micro_batch_size=MB, pinned_block_kb=4)


def test_resume_continues_with_the_same_augmented_batch(vla_dir):
    aug = AugmentSettings(shift_px=2)

    def take(pl, n):
        return [(b.record_ids.copy(), b.images.clone()) for _, b in zip(range(n), pl)]  # range first: no extra next()

    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=3, augment=aug) as pl:
        full = take(pl, 20)  # crosses the epoch boundary (15 batches an epoch)
    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=3, augment=aug) as pl:
        take(pl, 13)
        state = pl.state_dict()
    assert state["record_kind"] == "vla" and state["text_len"] == VLA_SPEC.text_len
    with VLAPipeline(vla_dir, micro_batch_size=MB, seed=3, augment=aug, num_workers=1) as pl:
        pl.load_state_dict(state)
        rest = take(pl, 7)
    for (ra, ia), (rb, ib) in zip(full[13:], rest, strict=True):
        assert np.array_equal(ra, rb) and torch.equal(ia, ib)


# --------------------------------------------------------------------------- from config sections


def _sections(data=None, io=None, memory=None):
    d = dict(micro_batch_size=MB, num_workers=1, prefetch_batches=3, shuffle_window_frames=2, loongbin_dir=None,
             image_size=[24, 40], text_len=24, action_shape=[4, 6],
             augment=SimpleNamespace(enabled=True, crop_scale=0.9, shift_px=1, hflip_prob=0.0, brightness=0.1,
                                     contrast=0.0, saturation=0.0))
    i = dict(io_backend="threadpool", io_uring_entries=16, read_threads=3)
    m = dict(num_staging_blocks=3, pinned_block_kb=None)
    return (SimpleNamespace(**{**d, **(data or {})}), SimpleNamespace(**{**i, **(io or {})}),
            SimpleNamespace(**{**m, **(memory or {})}))


def test_from_config_reads_the_settings_by_name(vla_dir):
    d, io, mem = _sections(data={"loongbin_dir": str(vla_dir)})
    with VLAPipeline.from_config(d, io, mem, seed=5, device="cpu", epochs=1) as pl:
        assert (pl.micro_batch_size, pl.seed, pl.num_workers, pl.prefetch_batches, pl.shuffle_window_frames) == \
            (MB, 5, 1, 3, 2)
        assert (pl.text_len, pl.image_shape, pl.action_shape) == (24, (3, 24, 40), (4, 6))
        assert pl.augment == AugmentSettings(crop_scale=0.9, shift_px=1, brightness=0.1, contrast=0, saturation=0)
        assert (pl.reader.name, pl.reader.depth, pl.reader.threads, len(pl.ring)) == ("threadpool", 16, 3, 3)
        b = next(pl)
        assert b.input_ids.shape == (MB, 24)
    d, io, mem = _sections(data={"augment": {"enabled": False, "crop_scale": 1.0, "shift_px": 0, "hflip_prob": 0,
                                             "brightness": 0, "contrast": 0, "saturation": 0}, "text_len": None})
    with VLAPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=vla_dir) as pl:  # a mapping works too
        assert not pl.augment.enabled and pl.text_len == VLA_SPEC.text_len
    d, io, mem = _sections(data={"augment": None})
    with VLAPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=vla_dir) as pl:
        assert not pl.augment.active


def test_from_config_errors_name_the_config_keys(vla_dir):
    cases = [({"text_len": 3}, ValueError, r"^data\.text_len=3: the shard set"),
             ({"image_size": [224, 224]}, ValueError, r"^data\.image_size=\[224, 224\]: the shard set"),
             ({"action_shape": [4]}, ValueError, r"^data\.action_shape=\[4\]: expected None"),
             ({"augment": SimpleNamespace(**{**_sections()[0].augment.__dict__, "crop_scale": 2})}, ValueError,
              r"^data\.augment\.crop_scale=2: expected a number in 0\.1\.\.1"),
             ({"augment": SimpleNamespace(enabled=True)}, TypeError, r"^data\.augment\.crop_scale: the section given"),
             ({"micro_batch_size": 1000}, ValueError, r"^data\.micro_batch_size=1000: no bucket holds")]
    for data, exc, pattern in cases:
        d, io, mem = _sections(data=data)
        with pytest.raises(exc, match=pattern):
            VLAPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=vla_dir)
    d, io, mem = _sections(memory={"pinned_block_kb": 4})
    with pytest.raises(ValueError, match=r"^loongforge\.memory_domain\.pinned_block_kb=4: .*need "
                                         r"loongforge\.memory_domain\.pinned_block_kb >= \d+"):
        VLAPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=vla_dir)
    d, io, mem = _sections()
    del d.text_len
    with pytest.raises(TypeError, match=r"^data\.text_len: the data section given"):
        VLAPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=vla_dir)


# --------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_match_the_inputs_and_wait_for_their_block(vla_dir, vla_data):
    for guard in (True, False):
        with VLAPipeline(vla_dir, micro_batch_size=MB, seed=5, device="cuda", epochs=1, num_staging_blocks=2,
                         guard=guard) as pl:
            assert all(b.is_pinned() for b in pl.ring.blocks)
            with torch.cuda.stream(pl._copy_stream):
                torch.cuda._sleep(10**9)  # ~0.5 s of GPU clock ahead of the first h2d copy
            kept = list(pl)  # device batches may be kept: they do not view the staging blocks
            torch.cuda.synchronize()
        assert all(b.images.is_cuda and b.event is not None for b in kept)
        try:
            for b in kept:
                _check_batch(b, vla_data)
            intact = True
        except AssertionError:
            intact = False
        # with the guard every copy waited for its block; without it (on purpose) the blocks were refilled
        assert intact == guard
    with VLAPipeline(vla_dir, micro_batch_size=MB, device="cuda", epochs=1) as pl:
        b = next(pl)
        s = torch.cuda.Stream()
        b.ready(s)
        with torch.cuda.stream(s):
            total = b.images.sum(dtype=torch.int64) + b.actions.sum().round().long()
        s.synchronize()
        assert int(total) == int(b.images.cpu().sum(dtype=torch.int64) + b.actions.cpu().sum().round().long())
