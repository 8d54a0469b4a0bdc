"""Vision-language-action batches: shards of vla records -> the same ordered reads, decode workers (which also
augment the images) and staging blocks as the token pipeline -> fixed-shape ``VLABatch`` es on the device.

``VLAPipeline`` is a ``BatchPipeline`` whose records are vla records (``loaders.format.VLAShardWriter``): the same
reader and assembler threads, epoch plans (one bucket), frame store, staging ring, CUDA side-stream copy, errors
in batch order, resume and metrics. The record kind, the batch, augmentation and the settings read from a config
are described in docs/loaders.md ("VLA records"). Public names: ``VLAPipeline``, ``VLABatch``, ``VLALayout``,
``AugmentSettings``, ``augment_image``, ``sample_rng``, ``sample_keys``, ``VLA_CONFIG_FIELDS``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import time
from typing import Any

import numpy as np
import torch

from .augment import AugmentSettings, augment_image, sample_keys, sample_rng
from .._plans import EpochPlan, FillPlan
from .._settings import VLA_CONFIG_FIELDS, check_vla_arguments
from .staging import VLABatch, VLALayout
from ..format import ShardSet, VLAFrame
from ..pipeline import BatchPipeline, Stopped

__all__ = ["VLAPipeline", "VLABatch", "VLALayout", "AugmentSettings", "augment_image", "sample_rng", "sample_keys",
           "VLA_CONFIG_FIELDS"]


class VLAPipeline(BatchPipeline):
    """Fixed-shape batches of vla samples from a shard directory, endless over epochs (or ``epochs`` of them).

    Shape legend: ``B`` micro-batch, ``T`` text length, ``C, H, W`` image, ``K, A`` action chunk. Every batch is
    ``images`` uint8 [B, C, H, W], ``input_ids`` / ``position_ids`` int32 [B, T], ``attention_mask`` uint8
    [B, T], ``actions`` float32 [B, K, A] (``VLABatch``), so a captured CUDA graph can replay any of them.

    Arguments (the others are ``BatchPipeline``'s, with the same meaning and config keys):
        text_len: ``data.text_len``: ``T``, the length every instruction is padded to; None: the shard set's
            (its manifest's ``text_len``). Shorter than the set's longest instruction is an error, not a cut.
        image_size: ``data.image_size``: (H, W) or an int (square), checked against the shard set's images
            (nothing is resized at load time); None: whatever the set holds.
        action_shape: ``data.action_shape``: (K, A), checked against the shard set's; None: the set's.
        augment: ``data.augment``: ``AugmentSettings`` (crop resized back, shift, flip, brightness, contrast,
            saturation), applied by the decode workers, seeded per sample by (``seed``, epoch, record id);
            None or ``enabled=False``: images exactly as stored.
        pinned_block_kb: the staging block; default: the batch's bytes (``VLALayout``) in whole 4 KiB pages.

    Not taken: ``packing``, ``bucket_width``, ``seq_len`` (one bucket, padded to ``T``). ``from_config(data, io,
    memory, *, seed, device, shards=None, **overrides)`` reads the settings by name (``VLA_CONFIG_FIELDS``):
    ``data.micro_batch_size``, ``num_workers``, ``prefetch_batches``, ``shuffle_window_frames``, ``image_size``,
    ``text_len``, ``action_shape``, ``augment`` (an object or mapping with ``AugmentSettings``' field names, or
    None), ``loongbin_dir``; ``loongforge.io_domain.io_backend``, ``io_uring_entries``, ``read_threads``;
    ``loongforge.memory_domain.num_staging_blocks``, ``pinned_block_kb``. A bad value is a ``ValueError`` naming
    its key (``data.text_len=8: ...``, ``data.augment.crop_scale=2: ...``).

    Attributes: ``text_len``, ``image_shape`` (C, H, W), ``action_shape`` (K, A), ``augment``, ``layout``,
    ``batches_per_epoch``.
    """

    RECORD_KIND = "vla"
    _CONFIG_FIELDS = VLA_CONFIG_FIELDS

    def __init__(self, shards: ShardSet | str | os.PathLike, *, micro_batch_size: int, seed: int = 0,
                 text_len: int | None = None, image_size: int | tuple[int, int] | None = None,
                 action_shape: tuple[int, int] | None = None, augment: AugmentSettings | None = None,
                 num_workers: int = 2, io_backend: str = "auto", io_uring_entries: int = 64,
                 read_threads: int = 4, prefetch_batches: int = 4, shuffle_window_frames: int = 4,
                 num_staging_blocks: int = 4, pinned_block_kb: int | None = None,
                 device: str | torch.device = "cpu", start_epoch: int = 0, epochs: int | None = None,
                 guard: bool = True) -> None:
        self._want = check_vla_arguments(text_len=text_len, image_size=image_size, action_shape=action_shape)
        if augment is not None and not isinstance(augment, AugmentSettings):
            raise ValueError(f"augment={augment!r}: expected None or an AugmentSettings")
        self.augment = augment if augment is not None else AugmentSettings(enabled=False)
        self._augment_on = self.augment.active
        super().__init__(shards, micro_batch_size=micro_batch_size, seed=seed, num_workers=num_workers,
                         io_backend=io_backend, io_uring_entries=io_uring_entries, read_threads=read_threads,
                         prefetch_batches=prefetch_batches, shuffle_window_frames=shuffle_window_frames,
                         num_staging_blocks=num_staging_blocks, pinned_block_kb=pinned_block_kb, device=device,
                         start_epoch=start_epoch, epochs=epochs, guard=guard)
        self._dec_samples = 0
        self._aug_s = 0.0

    @classmethod
    def _config_values(cls, kwargs: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
        if "augment" in keys:  # read from the config, not overridden: a section with the settings' names
            for f in dataclasses.fields(AugmentSettings):
                keys.setdefault(f.name, f"{keys['augment']}.{f.name}")  # crop_scale=2 -> data.augment.crop_scale=2
            kwargs = {**kwargs, "augment": AugmentSettings.from_section(kwargs["augment"], keys["augment"])}
        return kwargs

    def _setup(self, micro_batch_size: int, seed: int, num_workers: int, prefetch_batches: int,
               shuffle_window_frames: int, num_staging_blocks: int, pinned_block_kb: int | None,
               start_epoch: int, bucket_width: int | None, packing: str, seq_len: int | None,
               guard: bool) -> None:
        if self.shards.record_kind == self.RECORD_KIND:  # else BatchPipeline._setup refuses the kind
            self._resolve_shapes(micro_batch_size)
        super()._setup(micro_batch_size, seed, num_workers, prefetch_batches, shuffle_window_frames,
                       num_staging_blocks, pinned_block_kb, start_epoch, bucket_width, packing, seq_len, guard)

    def _resolve_shapes(self, micro_batch_size: int) -> None:
        """``text_len``, ``image_shape`` and ``action_shape`` from the shard set, checked against the wanted ones."""
        want_T, want_HW, want_KA = self._want
        C, H, W = self.shards.image_shape
        if want_HW is not None and want_HW != (H, W):
            raise ValueError(f"image_size={list(want_HW)}: the shard set {self.shards.root} holds {C} x {H} x {W} "
                             f"images (images are not resized at load time)")
        if want_KA is not None and want_KA != self.shards.action_shape:
            raise ValueError(f"action_shape={list(want_KA)}: the shard set {self.shards.root} holds action chunks "
                             f"of {self.shards.action_shape[0]} x {self.shards.action_shape[1]}")
        longest = int(np.max(self.shards.rec_length))
        stored = int(self.shards.manifest.get("text_len", int(np.max(self.shards.bucket_length))))
        T = stored if want_T is None else want_T
        if T < longest:
            raise ValueError(f"text_len={T}: the shard set {self.shards.root} has instructions of up to {longest} "
                             f"tokens (they are padded to text_len, never cut)")
        self.text_len = T
        self.image_shape, self.action_shape = (C, H, W), self.shards.action_shape
        self.layout = VLALayout(micro_batch_size, T, self.image_shape, self.action_shape)
        self._arange = np.arange(T, dtype=np.int32)

    def _staging_block_bytes(self, pinned_block_kb: int | None) -> int:
        need = self.layout.nbytes
        block = pinned_block_kb * 1024 if pinned_block_kb is not None else self.layout.block_bytes()
        if block < need:
            raise ValueError(f"pinned_block_kb={pinned_block_kb}: a staging block of {block} bytes is too small for "
                             f"a batch of {self.micro_batch_size} samples ({need} bytes: images, text, actions); "
                             f"need pinned_block_kb >= {math.ceil(self.layout.block_bytes() / 1024)}")
        return block

    def batch_lengths(self) -> list[int]:
        """``[text_len]``: every batch has the one text length."""
        return [self.text_len]

    # -- decode workers: decompress, then augment every image of the frame
    def _decode(self, epoch: int, frame: int, raw: memoryview | bytes) -> VLAFrame:
        t0 = time.perf_counter()
        fr = self.shards.decode_frame(frame, raw)
        t1 = time.perf_counter()
        if self._augment_on:
            first = int(self._first_rec[frame])
            images = np.empty_like(fr.images)
            for i in range(len(images)):
                augment_image(fr.images[i], images[i], sample_rng(self.seed, epoch, first + i), self.augment)
            fr = dataclasses.replace(fr, images=images)
        t2 = time.perf_counter()
        with self._dec_lock:
            self._dec_s += t2 - t0
            self._aug_s += t2 - t1
            self._dec_bytes += int(self.shards.frame_dlen[frame])
            self._dec_tokens += len(fr.tokens)
            self._dec_samples += len(fr.rec_length)
        return fr

    # -- assembler: one batch into one staging block
    def _assemble(self, epoch: int, k: int, plan: EpochPlan | FillPlan) -> VLABatch:
        _, ids = plan.batch(k)
        B, T = len(ids), self.text_len
        try:
            i = self.ring.acquire()
        except RuntimeError:
            raise Stopped from None
        blk = self.ring.blocks[i].numpy()
        v = self.layout.views(blk)
        regions = self.layout.regions
        a, z = regions["input_ids"][0], regions["attention_mask"][0] + regions["attention_mask"][1]
        blk[a:z] = 0  # the text's padding, one memset (ids 0, positions 0, mask 0); images and actions are overwritten
        ids_BT, pos_BT, mask_BT = v["input_ids"], v["position_ids"], v["attention_mask"]
        images, actions = v["images"], v["actions"]
        frames: dict[int, VLAFrame] = {}
        uses: collections.Counter = collections.Counter()
        lengths = np.empty(B, np.int64)
        for row, r in enumerate(ids.tolist()):
            f = int(self._rec_frame[r])
            fr = frames.get(f)
            if fr is None:
                fr = frames[f] = self._frame(epoch, f)
            uses[f] += 1
            image, tokens, act = fr.record(r - int(self._first_rec[f]))
            L = len(tokens)
            images[row] = image
            actions[row] = act
            ids_BT[row, :L] = tokens  # uint16 -> int32 on the way
            pos_BT[row, :L] = self._arange[:L]
            mask_BT[row, :L] = 1
            lengths[row] = L
        for f, n in uses.items():
            self._unref(epoch, f, n)
        v["keys"][:] = sample_keys(self.seed, epoch, ids)
        return self._ship_vla(i, T, lengths, epoch, k, ids)

    def _ship_vla(self, i: int, T: int, lengths: np.ndarray, epoch: int, k: int, ids: np.ndarray) -> VLABatch:
        """The batch in block ``i`` as tensors: copied to the device (CUDA) or lent as views of the block (CPU)."""
        n = self.layout.nbytes
        blk = self.ring.blocks[i]
        if self._cuda:
            with torch.cuda.stream(self._copy_stream):
                dev = torch.empty(n, dtype=torch.uint8, device=self.device)
                dev.copy_(blk[:n], non_blocking=True)  # pinned -> device, async on the side stream
                ev = torch.cuda.Event()
                ev.record(self._copy_stream)
            self.ring.set_event(i, ev)
            src, token = dev, None
        else:
            src, token, ev = blk, self.ring.hand_out(i), None
        t = self.layout.views(src)
        real = int(lengths.sum())
        return VLABatch(images=t["images"], input_ids=t["input_ids"], position_ids=t["position_ids"],
                        attention_mask=t["attention_mask"], actions=t["actions"], keys=t["keys"],
                        text_lengths=lengths, length=T,
                        real_tokens=real, padded_tokens=len(ids) * T, epoch=epoch, index=k, record_ids=ids,
                        event=ev, _token=token)

    # -- state and metrics
    def state_dict(self) -> dict:
        """``BatchPipeline``'s, plus the record kind and the text length."""
        return {**super().state_dict(), "record_kind": self.RECORD_KIND, "text_len": self.text_len}

    def continue_counters(self, prev: BatchPipeline) -> None:
        super().continue_counters(prev)
        if isinstance(prev, VLAPipeline):
            with prev._dec_lock, self._dec_lock:
                self._dec_samples += prev._dec_samples
                self._aug_s += prev._aug_s

    def metrics(self) -> dict[str, Any]:
        """``BatchPipeline``'s figures (``decode/*`` include augmentation, which runs in the decode workers; the
        token figures count instruction tokens), plus ``decode/samples_per_s`` (samples decoded and augmented per
        busy decode-second: a per-core capacity), ``decode/augment_busy_s`` and ``data/samples``."""
        m = super().metrics()
        with self._dec_lock:
            dec_s, samples, aug_s = self._dec_s, self._dec_samples, self._aug_s
        m["decode/samples_per_s"] = samples / dec_s if dec_s > 0 else float("nan")
        m["decode/augment_busy_s"] = aug_s
        m["data/samples"] = m["data/batches"] * self.micro_batch_size
        return m
