"""loaders.pipeline built from a workbench config's sections (``BatchPipeline.from_config``): the settings read by
their own field names, and errors that name the config key."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.pipeline import BatchPipeline
from workbench.config import Config, merge_overrides

MB = 8  # micro-batch of every test here


def _sections(**overrides):
    """The data, io and memory sections of a validated workbench Config, with settings unlike the defaults."""
    cfg = merge_overrides(Config(), {
        "data.micro_batch_size": MB, "data.seq_len": 512, "data.bucket_width": 256, "data.num_workers": 1,
        "data.prefetch_batches": 3, "data.shuffle_window_frames": 2,
        "loongforge.io_domain.io_backend": "threadpool", "loongforge.io_domain.io_uring_entries": 16,
        "loongforge.io_domain.read_threads": 3, "loongforge.memory_domain.num_staging_blocks": 3,
        "loongforge.memory_domain.pinned_block_kb": 64, **overrides})
    return cfg.data, cfg.loongforge.io_domain, cfg.loongforge.memory_domain


def test_from_config_reads_the_sections_own_names(shards, shard_dir):
    d, io, mem = _sections()
    with BatchPipeline.from_config(d, io, mem, seed=5, device="cpu", shards=shards, epochs=1) as pl:
        assert (pl.micro_batch_size, pl.seed, pl.num_workers, pl.prefetch_batches, pl.shuffle_window_frames) == \
            (MB, 5, 1, 3, 2)
        assert pl.bucket_width == 256 and pl.packing == "bucket" and pl.seq_len is None
        assert pl.batch_lengths() == [512, 256]
        assert (pl.reader.name, pl.reader.depth, pl.reader.threads) == ("threadpool", 16, 3)
        assert len(pl.ring) == 3 and pl.ring.block_bytes == 64 * 1024
        got = [b.record_ids.copy() for b in pl]
    with BatchPipeline(shards, micro_batch_size=MB, seed=5, bucket_width=256, shuffle_window_frames=2, epochs=1,
                       io_backend="threadpool") as pl:  # the same plan built by hand
        assert all(np.array_equal(a, b.record_ids) for a, b in zip(got, pl, strict=True))

    d, io, mem = _sections(**{"data.packing": "fill", "data.seq_len": 128, "data.bucket_width": 64})
    with BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards) as pl:
        assert pl.packing == "fill" and pl.seq_len == 128 and pl.batch_lengths() == [128]

    # the shards of data.loongbin_dir (opened and closed by the pipeline); an override wins over the config
    d, io, mem = _sections(**{"data.loongbin_dir": str(shard_dir)})
    with BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", num_workers=0, num_staging_blocks=2) as pl:
        assert pl.shards.root == shard_dir and pl.num_workers == 0 and len(pl.ring) == 2
        assert next(pl).length in (256, 512)


def test_from_config_errors_name_the_config_keys(shards):
    d, io, mem = _sections(**{"data.micro_batch_size": 100_000})
    with pytest.raises(ValueError, match=r"^data\.micro_batch_size=100000: no bucket holds that many records"):
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards)
    d, io, mem = _sections(**{"loongforge.memory_domain.pinned_block_kb": 4})
    with pytest.raises(ValueError, match=r"^loongforge\.memory_domain\.pinned_block_kb=4\b.*"
                                         r"need loongforge\.memory_domain\.pinned_block_kb >= 36"):
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards)
    d, io, mem = _sections(**{"data.packing": "fill", "data.seq_len": 10**6})
    with pytest.raises(ValueError, match=r"^data\.micro_batch_size=8, data\.seq_len=1000000: the epoch's"):
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards)
    d, io, mem = _sections()
    io.io_uring_entries = 0  # edited in place, past the config's own validation
    with pytest.raises(ValueError, match=r"^loongforge\.io_domain\.io_uring_entries=0: expected an int >= 1"):
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards)
    d, io, mem = _sections()
    with pytest.raises(ValueError, match=r"^num_workers=-1: "):  # an override keeps the caller's name
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu", shards=shards, num_workers=-1)
    with pytest.raises(ValueError, match=r"^data\.loongbin_dir is not set"):
        BatchPipeline.from_config(d, io, mem, seed=0, device="cpu")
    with pytest.raises(TypeError, match=r"^data\.micro_batch_size: the data section given \(object\)"):
        BatchPipeline.from_config(object(), io, mem, seed=0, device="cpu", shards=shards)
