"""The VLA on two gloo processes through the Trainer: the overlap scheduler buckets its gradients (the knobs of a
several-GPU VLA study, studies/gr00t-n1.6-vla-2gpu.yaml), both ranks end with the same parameters, and the
communication figures are there. One spawn of 2 ranks over a file store (no network)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _ranks import join_or_fail
from workbench.config import merge_overrides, preset_config

WORLD = 2


def _worker(rank: int, store: str, out: str, data_dir: str) -> None:
    from workbench.train.trainer import Trainer

    torch.set_num_threads(1)  # two processes on two shared cores
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        cfg = merge_overrides(preset_config("tiny-vla"), {
            "hardware.device": "cpu", "hardware.gpus": WORLD, "data.micro_batch_size": 4, "data.num_workers": 0,
            "training.dtype": "fp32", "training.global_batch_size": 16, "training.max_steps": 4,
            "training.log_every": 3, "training.warmup_measure_steps": 1, "loongforge.overlap.mode": "scheduler",
            "loongforge.overlap.bucket_size_mb": 0.25, "loongforge.overlap.overlap_ratio": 0.5})
        trainer = Trainer(cfg, data_dir=data_dir, out_dir=Path(out) / "run" if rank == 0 else None)
        try:
            s = trainer.run()
            torch.save([p.detach() for p in trainer.model.parameters()], Path(out) / f"params-{rank}.pt")
        finally:
            trainer.close()
        keep = {k: v for k, v in s.items() if k.startswith("comm/") or k in ("grad_accum_steps", "last_loss")}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(keep))
    finally:
        dist.destroy_process_group()


def test_the_vla_trains_on_two_ranks_under_the_overlap_scheduler(tmp_path, monkeypatch):
    from workbench.train.run import synthetic_vla_dir
    from workbench.train.vla import get_vla_preset

    monkeypatch.setenv("LOONGFORGE_CACHE", str(tmp_path / "cache"))
    data_dir = synthetic_vla_dir(get_vla_preset("tiny-vla"), num_samples=128)
    ctx = mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path), str(data_dir)), nprocs=WORLD,
                             join=False, start_method="spawn")
    join_or_fail(ctx, 180, "the two-rank VLA run")
    p0, p1 = (torch.load(tmp_path / f"params-{r}.pt") for r in range(WORLD))
    assert all(torch.equal(a, b) for a, b in zip(p0, p1)), "the ranks diverged"
    for r in range(WORLD):
        s = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert s["comm/mode"] == "scheduler" and s["grad_accum_steps"] == 2  # 16 = 4 x 2 ranks x 2
        assert s["comm/buckets"] >= 2 and s["comm/total_s"] > 0 and 0 <= s["comm/overlap_pct"] <= 100
