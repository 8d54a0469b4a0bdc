"""Overlap scheduler: the bucket plan on the real Llama layer structure; under two gloo processes, gradients and
parameters equal those of a single-process run on the concatenated batch and of DistributedDataParallel, for
bucket sizes x overlap ratios x gradient accumulation; the training loop in both sync modes; config and knobs.

The two-process part runs once per module (``dist_results``): one ``torch.multiprocessing`` spawn of 2 ranks
on gloo over a file store (no network), which runs every case and writes what it measured; the tests assert
on that. Spawning costs ~5 s on 2 cores, so it is done once.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from _ranks import join_or_fail
from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.tune.knobs import get_knob
from workbench.train.model import Llama, ModelArgs, get_preset
from workbench.train.overlap import layer_units, overlap_count, plan_buckets
from workbench.train.timing import interval_union

WORLD = 2
# untied, 3 blocks: 6 layers (embed, 3 blocks, norm, lm_head); a block is 9,280 fp32 parameters = 37,120 bytes
ARGS = ModelArgs(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=3, vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)
BUCKETS_MB = {"tiny": 1e-6, "medium": 0.07, "huge": 1e4}  # one layer per bucket; ~2 blocks; one bucket
RATIOS = (0.0, 0.5, 1.0)
B, T, STEPS = 2, 16, 2
LR, MOMENTUM = 0.5, 0.9
# fp32 sums of the same terms in a different order (one GEMM over all rows vs per-rank GEMMs, then the
# all-reduce) differ by a few ulps of the largest partial sums: measured 2.1e-7 (accumulation 1) and 3.8e-7
# (accumulation 2) of the largest gradient here. 4e-6 leaves 10x room for other BLAS blockings and is still
# 2.5e5 times smaller than the gap between a rank's own gradients and the average (~1.0, asserted below).
REL_TOL = 4e-6


# --------------------------------------------------------------------------- the bucket plan (no processes)


def _meta_llama(args: ModelArgs) -> Llama:
    with torch.device("meta"):  # the real structure and sizes, no memory
        return Llama(args)


@pytest.mark.parametrize("preset,bucket_mb", [("gr00t-n1.6", 25), ("gr00t-n1.6", 400), ("gr00t-n1.6", 1e6),
                                              ("tiny", 1e-6), ("tiny", 0.2), ("tiny", 25)])
def test_bucket_boundaries_never_split_a_layer(preset, bucket_mb):
    model = _meta_llama(get_preset(preset))
    units = layer_units(model)
    names = [n for n, _ in units]
    args = model.args
    assert names == ["embed_tokens", *[f"layers.{i}" for i in range(args.num_hidden_layers)], "norm"] + \
        ([] if args.tie_word_embeddings else ["lm_head"])
    plan = plan_buckets(units, int(bucket_mb * 2 ** 20))
    # buckets are runs of whole layers, in reverse layer order (the order backward produces gradients)
    assert [n for b in plan for n in b.layers] == names[::-1]
    owner = {id(p): i for i, b in enumerate(plan) for p in b.params}
    assert len(owner) == sum(len(b.params) for b in plan) == len(list(model.parameters()))
    for name, params in units:
        assert len({owner[id(p)] for p in params}) == 1, f"{name} is split across buckets"
    for b in plan:
        assert b.nbytes == 4 * b.numel == 4 * sum(p.numel() for p in b.params)
    target = int(bucket_mb * 2 ** 20)
    sizes = {n: 4 * sum(p.numel() for p in ps) for n, ps in units}
    for b, nxt in zip(plan, plan[1:]):  # a bucket closed only because its next layer would move it away
        assert abs(b.nbytes + sizes[nxt.layers[0]] - target) > abs(b.nbytes - target)
    if preset == "gr00t-n1.6":  # a 196 MiB block: alone at 25 MiB, in pairs at 400, all in one at 1e6
        assert len(plan) == {25: 31, 400: 16, 1e6: 1}[bucket_mb]


def test_overlap_count_and_interval_union():
    assert [overlap_count(6, r) for r in (0, 0.25, 0.5, 1)] == [0, 2, 3, 6]
    assert overlap_count(1, 0.5) == 1 and overlap_count(3, 0.5) == 2 and overlap_count(0, 1) == 0
    with pytest.raises(ValueError):
        overlap_count(4, 1.5)
    assert interval_union([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert interval_union([]) == 0.0


# --------------------------------------------------------------------------- two processes


def _batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    ids = torch.randint(0, ARGS.vocab_size, (B, T), generator=g)
    pos = torch.arange(T).expand(B, T).contiguous()
    return ids, pos, torch.ones(B, T, dtype=torch.bool)  # full masks: every micro-batch counts B x (T-1) tokens


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(ARGS)


def _loss(model: nn.Module, ids, pos, mask, accum: int) -> torch.Tensor:
    loss_sum, n = model(ids, pos, mask) if not isinstance(model, Llama) else model.loss(ids, pos, mask)
    return loss_sum / n / accum  # as workbench/train/trainer.py scales it


def _grads(model: Llama) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _params(model: Llama) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _reference(accum: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """One process, every rank's micro-batches concatenated: (grads, params) after each step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    out = []
    for step in range(STEPS):
        parts = [_batch(step, m, r) for r in range(WORLD) for m in range(accum)]
        ids, pos, mask = (torch.cat([p[i] for p in parts]) for i in range(3))
        _loss(model, ids, pos, mask, 1).backward()
        g = _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((g, _params(model)))
    return out


def _run_scheduler(rank: int, accum: int, bucket_mb: float, ratio: float):
    from workbench.train.overlap import OverlapScheduler

    model = _model()
    sched = OverlapScheduler(layer_units(model), bucket_size_mb=bucket_mb, overlap_ratio=ratio)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    out, launched, local = [], [], []
    for step in range(STEPS):
        for micro in range(accum):
            last = micro == accum - 1
            with sched.no_sync() if not last else _null():
                _loss(model, *_batch(step, micro, rank), accum).backward()
            launched.append(sched._next)  # buckets in flight before finish(): none on micro-steps
        local.append(_grads(model))
        sched.finish()
        g = _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((g, _params(model)))
    timings = sched.flush()
    sched.remove()
    return out, launched, len(sched.plan), sched.n_overlap, timings, local


def _run_scheduler_block_compiled(rank: int):
    """compile_scope: layer, as the loop does it (each block compiled in place; aot_eager: the backend does not
    matter here, only that each block becomes a compiled unit with its own backward node), one layer per
    bucket, ratio 1. Records the order of bucket launches and of the input gradients of the blocks."""
    from workbench.train.overlap import OverlapScheduler

    torch._dynamo.reset()
    model = _model()
    order: list[str] = []
    def watch_input(i: int):
        def pre_hook(_mod, args) -> None:  # returns None: the inputs are left as they are
            if args[0].requires_grad:
                args[0].register_hook(lambda g: order.append(f"grad_in.layers.{i}"))
        return pre_hook

    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(watch_input(i))
        layer.compile(backend="aot_eager", dynamic=False)
    sched = OverlapScheduler(layer_units(model), bucket_size_mb=BUCKETS_MB["tiny"], overlap_ratio=1.0)
    launch = sched._launch

    def recording_launch(index: int) -> None:
        order.append("bucket." + ",".join(sched.plan[index].layers))
        launch(index)

    sched._launch = recording_launch
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    out = []
    for step in range(STEPS):
        order.clear()
        _loss(model, *_batch(step, 0, rank), 1).backward()
        sched.finish()
        g = _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((g, _params(model)))
    sched.flush()
    sched.remove()
    compiled = all(getattr(layer, "_compiled_call_impl", None) is not None for layer in model.layers)
    return out, list(order), compiled


def _run_ddp(rank: int, accum: int):
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(_LossModule(model))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    out = []
    for step in range(STEPS):
        for micro in range(accum):
            with ddp.no_sync() if micro < accum - 1 else _null():
                _loss(ddp, *_batch(step, micro, rank), accum).backward()
        g = _grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((g, _params(model)))
    return out


class _LossModule(nn.Module):
    def __init__(self, model: Llama) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, pos, mask):
        return self.model.loss(ids, pos, mask)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max |a - b| over every tensor, relative to the largest |b| (the tolerance's scale)."""
    scale = max(float(x.abs().max()) for x in b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / scale


def _equivalence_cases(rank: int) -> list[dict]:
    rows = []
    for accum in (1, 2):
        ref = _reference(accum)
        ddp = _run_ddp(rank, accum)
        rows.append({"case": f"ddp accum={accum}", "accum": accum,
                     "grad_vs_ref": [_max_rel(d[0], r[0]) for d, r in zip(ddp, ref)],
                     "param_vs_ref": [_max_rel(d[1], r[1]) for d, r in zip(ddp, ref)]})
        for bname, bmb in BUCKETS_MB.items():
            for ratio in RATIOS:
                out, launched, n_buckets, n_overlap, timings, local = _run_scheduler(rank, accum, bmb, ratio)
                rows.append({
                    "case": f"scheduler bucket={bname} ratio={ratio} accum={accum}", "accum": accum,
                    "bucket": bname, "ratio": ratio, "buckets": n_buckets, "overlapped": n_overlap,
                    "launched_in_backward": launched,
                    "grad_vs_ref": [_max_rel(o[0], r[0]) for o, r in zip(out, ref)],
                    "param_vs_ref": [_max_rel(o[1], r[1]) for o, r in zip(out, ref)],
                    "grad_equal_ddp": [all(torch.equal(x, y) for x, y in zip(o[0], d[0])) for o, d in zip(out, ddp)],
                    "param_equal_ddp": [all(torch.equal(x, y) for x, y in zip(o[1], d[1]))
                                        for o, d in zip(out, ddp)],
                    "local_vs_ref": [_max_rel(lg, r[0]) for lg, r in zip(local, ref)],
                    "comm_total_s": [t["total_s"] for t in timings]})
    ref = _reference(1)
    out, order, compiled = _run_scheduler_block_compiled(rank)
    rows.append({"case": "block_compiled", "compiled": compiled, "order": order,
                 "grad_vs_ref": [_max_rel(o[0], r[0]) for o, r in zip(out, ref)],
                 "param_vs_ref": [_max_rel(o[1], r[1]) for o, r in zip(out, ref)]})
    return rows


def _trainer_runs(rank: int, data_dir: str, out: Path) -> dict:
    """The training loop itself, two processes, in both sync modes (tiny preset, accumulation 2)."""
    from workbench.train.trainer import Trainer

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    res = {}
    fp8 = {"loongforge.compute_domain.fp8": "rowwise", "loongforge.compute_domain.fp8_modules.size_filter": False}
    runs = [("scheduler", {}), ("ddp", {})]
    if importlib.util.find_spec("torchao") is not None:  # FP8 (torchao's CPU emulation) under both sync modes
        runs += [("scheduler+fp8", fp8), ("ddp+fp8", fp8)]
    for name, extra in runs:
        mode = name.split("+")[0]
        cfg = merge_overrides(preset_config("tiny"), {
            "hardware.device": "cpu", "hardware.gpus": WORLD, "data.seq_len": 256, "data.micro_batch_size": 2,
            "data.bucket_width": 64, "data.num_workers": 0, "training.dtype": "fp32", "training.global_batch_size": 8,
            "training.max_steps": 4, "training.log_every": 3, "training.warmup_measure_steps": 1,
            "loongforge.io_domain.io_backend": "threadpool", "loongforge.overlap.mode": mode,
            "loongforge.overlap.bucket_size_mb": 0.5, "loongforge.overlap.overlap_ratio": 0.5, **extra})
        run_dir = out / f"{name}-{rank}"
        trainer = Trainer(cfg, data_dir=data_dir, out_dir=run_dir if rank == 0 else None)
        try:
            summary = trainer.run()
            torch.save([p.detach() for p in trainer.model.parameters()], out / f"params-{name}-{rank}.pt")
        finally:
            trainer.close()
        res[name] = {k: v for k, v in summary.items() if k.startswith(("comm/", "fp8/")) or k in (
            "grad_accum_steps", "phase_s_per_step", "last_loss")}
    return res


def _worker(rank: int, store: str, out: str, data_dir: str) -> None:
    torch.set_num_threads(1)  # two processes on two shared cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))  # a hung collective fails instead of hanging
    try:
        result = {"equivalence": _equivalence_cases(rank), "trainer": _trainer_runs(rank, data_dir, Path(out))}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dist_results(tmp_path_factory):
    from workbench.train import synthetic_data_dir

    root = tmp_path_factory.mktemp("overlap")
    old_cache = os.environ.get("LOONGFORGE_CACHE")
    os.environ["LOONGFORGE_CACHE"] = str(root / "cache")
    try:
        data_dir = synthetic_data_dir(vocab_size=4096, seq_len=256, num_docs=300, seed=0)
    finally:
        if old_cache is None:
            os.environ.pop("LOONGFORGE_CACHE")
        else:
            os.environ["LOONGFORGE_CACHE"] = old_cache
    ctx = mp.start_processes(_worker, args=(str(root / "store"), str(root), str(data_dir)), nprocs=WORLD,
                             join=False, start_method="spawn")
    join_or_fail(ctx, 240, "the two-process overlap run")
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)], root


def _cases(results, prefix):
    return [c for rank in results for c in rank["equivalence"] if c["case"].startswith(prefix)]


def test_scheduler_equals_single_process_and_ddp(dist_results):
    results, _ = dist_results
    cases = _cases(results, "scheduler")
    assert len(cases) == WORLD * len(BUCKETS_MB) * len(RATIOS) * 2
    for c in cases:
        # (a) the single-process run on the concatenated batch, after each of the 2 optimizer steps
        assert max(c["grad_vs_ref"]) < REL_TOL, c["case"]
        assert max(c["param_vs_ref"]) < REL_TOL, c["case"]
        # (b) DDP: the same local gradients, divided by 2 (exact) and summed over 2 ranks (exact and commutative)
        assert all(c["grad_equal_ddp"]) and all(c["param_equal_ddp"]), c["case"]
        # the tolerance can fail: a rank's own (unsynchronised) gradients are far from the average
        assert min(c["local_vs_ref"]) > 1e3 * REL_TOL, c["case"]
    for c in _cases(results, "ddp"):  # and DDP itself matches the single-process run
        assert max(c["grad_vs_ref"]) < REL_TOL and max(c["param_vs_ref"]) < REL_TOL, c["case"]


def test_buckets_launch_during_backward_for_the_overlapped_share_only(dist_results):
    results, _ = dist_results
    for c in _cases(results, "scheduler"):
        expected = {"tiny": 6, "medium": None, "huge": 1}[c["bucket"]]
        if expected is not None:
            assert c["buckets"] == expected, c["case"]
        assert 1 < c["buckets"] < 6 if c["bucket"] == "medium" else True
        assert c["overlapped"] == overlap_count(c["buckets"], c["ratio"])
        per_step = [c["launched_in_backward"][i:i + c["accum"]] for i in range(0, STEPS * c["accum"], c["accum"])]
        for micro in per_step:
            assert micro[:-1] == [0] * (c["accum"] - 1), c["case"]  # accumulation micro-steps: nothing launched
            assert micro[-1] == c["overlapped"], c["case"]  # the overlapped share, during the last backward
        assert len(c["comm_total_s"]) == STEPS and all(t > 0 for t in c["comm_total_s"])


def test_block_compiled_buckets_launch_while_lower_blocks_are_still_in_backward(dist_results):
    """compile_scope: layer keeps the overlap: block k's bucket is launched before block k-1 has produced the
    gradient of its input (i.e. while the blocks below are still in their backward); results stay exact."""
    results, _ = dist_results
    for c in _cases(results, "block_compiled"):
        assert c["compiled"]
        assert max(c["grad_vs_ref"]) < REL_TOL and max(c["param_vs_ref"]) < REL_TOL
        order = c["order"]
        n = ARGS.num_hidden_layers
        for k in range(1, n):
            assert order.index(f"bucket.layers.{k}") < order.index(f"grad_in.layers.{k - 1}"), order
        assert order[-1] == "bucket.embed_tokens"  # the embedding's gradient comes last


def test_training_loop_syncs_with_the_scheduler_and_with_ddp(dist_results):
    results, root = dist_results
    for mode in ("scheduler", "ddp"):
        p0 = torch.load(root / f"params-{mode}-0.pt")
        p1 = torch.load(root / f"params-{mode}-1.pt")
        assert all(torch.equal(a, b) for a, b in zip(p0, p1)), f"{mode}: ranks diverged"
    # same data, same init, same averaged gradients: the two modes train to the same parameters
    ps = torch.load(root / "params-scheduler-0.pt")
    pd_ = torch.load(root / "params-ddp-0.pt")
    assert all(torch.equal(a, b) for a, b in zip(ps, pd_))
    if (root / "params-scheduler+fp8-0.pt").exists():  # FP8: the ranks agree, in both sync modes
        for name in ("scheduler+fp8", "ddp+fp8"):
            p0, p1 = (torch.load(root / f"params-{name}-{r}.pt") for r in (0, 1))
            assert all(torch.equal(a, b) for a, b in zip(p0, p1)), f"{name}: ranks diverged"
        for rank in results:
            for name in ("scheduler+fp8", "ddp+fp8"):
                s = rank["trainer"][name]
                assert s["fp8/converted_linears"] == 4 * 7 and math.isfinite(s["last_loss"])
                assert s["last_loss"] == pytest.approx(rank["trainer"][name.split("+")[0]]["last_loss"], rel=0.05)
    for rank in results:
        for name, s in rank["trainer"].items():
            mode = name.split("+")[0]
            assert s["grad_accum_steps"] == 2 and s["comm/mode"] == mode
            assert s["comm/total_s"] > 0 and 0 <= s["comm/exposed_s"]
            assert 0 <= s["comm/overlap_pct"] <= 100
        sched = rank["trainer"]["scheduler"]
        assert sched["comm/buckets"] >= 2 and sched["comm/overlapped_buckets"] == overlap_count(
            sched["comm/buckets"], 0.5)
        # exposed communication is the grad_sync phase (per step, averaged over the measured steps)
        assert sched["comm/exposed_s"] == pytest.approx(sched["phase_s_per_step"]["grad_sync"], rel=1e-6)
    import pandas as pd

    steps = pd.read_csv(root / "scheduler-0" / "phases.csv")
    measured = steps[steps["measured"] == 1]
    assert measured["comm_s"].notna().all() and (measured["comm_s"] > 0).all()
    assert (measured["comm_exposed_s"] == measured["grad_sync"]).all()
    windows = [json.loads(x) for x in (root / "scheduler-0" / "metrics.jsonl").read_text().splitlines()]
    assert all(w["comm/overlap_pct"] is not None and w["comm/total_s"] > 0 for w in windows)


# --------------------------------------------------------------------------- config, knobs, CUDA graphs


def test_graph_capture_on_several_gpus_rejects_ddp_and_takes_the_scheduler():
    base = preset_config("tiny")
    graphs = {"hardware.device": "cuda", "hardware.gpus": 2, "loongforge.compute_domain.graph_capture": True}
    with pytest.raises(ConfigError, match=r"^loongforge\.overlap\.mode: 'ddp' cannot be combined"):
        merge_overrides(base, {**graphs, "loongforge.overlap.mode": "ddp"})
    # the scheduler composes (all-reduces after the replay; the loop warns that the ratio has no effect)
    ok = merge_overrides(base, {**graphs, "loongforge.overlap.overlap_ratio": 1})
    assert ok.loongforge.overlap.mode == "scheduler"
    merge_overrides(base, {**graphs, "hardware.gpus": 1, "loongforge.overlap.mode": "ddp"})  # one GPU: no DDP
    with pytest.raises(ConfigError, match=r"loongforge\.overlap\.mode"):
        merge_overrides(base, {"loongforge.overlap.mode": "fsdp"})


def test_overlap_ratio_knob_is_off_under_graph_capture():
    k = get_knob("overlap_ratio")
    assert k.active({"graph_capture": False}) and k.active({}) and k.active({"graph_capture": "none"})
    assert not k.active({"graph_capture": True}) and not k.active({"graph_capture": "fwd_bwd"})
    assert k.inactive == 0.0
    cfg = merge_overrides(preset_config("tiny"), {"hardware.device": "cuda", "hardware.gpus": 2,
                                                  "loongforge.compute_domain.graph_capture": True, k.key: k.inactive})
    assert cfg.loongforge.overlap.overlap_ratio == 0.0
    assert get_knob("bucket_size_mb").requires == frozenset({"multi_gpu"})


def test_single_process_runs_report_no_communication():
    from workbench.train.metrics import StepRecord, summarize_comm, summarize_window

    recs = [StepRecord(i, 10, 12, 64, 1.0, phases={"step": 1.0, "grad_sync": 0.0}) for i in range(3)]
    m = summarize_window(recs)
    assert m["comm/total_s"] is None and m["comm/overlap_pct"] is None
    recs[0].comm_s, recs[0].comm_exposed_s = 0.2, 0.05
    recs[1].comm_s, recs[1].comm_exposed_s = 0.2, 0.25  # a step whose exposed time exceeds the total: clamped
    m = summarize_window(recs)
    assert m["comm/total_s"] == pytest.approx(0.2) and m["comm/exposed_s"] == pytest.approx(0.15)
    assert m["comm/overlap_pct"] == pytest.approx(25.0)
    assert summarize_comm([{**m, "steps": 2}, {**m, "steps": 1}])["comm/overlap_pct"] == pytest.approx(25.0)
    assert math.isclose(summarize_comm([])["comm/total_s"] or 0, 0)

