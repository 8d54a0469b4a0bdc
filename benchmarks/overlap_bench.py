"""Overlap scheduler vs DDP on several GPUs of one host: a grid of bucket sizes x overlap ratios against DDP with
its default buckets, in one ``torchrun`` run (written for two GPUs; any world size of 2 or more works).

    torchrun --standalone --nproc-per-node 2 benchmarks/overlap_bench.py --out benchmarks/out/overlap
    torchrun --standalone --nproc-per-node 8 benchmarks/overlap_bench.py --layers 28 --bucket-sizes 25,200 \
        --ratios 1 --out benchmarks/out/overlap8        # the 8-GPU comparison of issue 9

Model: the gr00t-n1.6 preset cut to ``--layers`` decoder blocks (default 8: 0.62 B parameters, 2.5 GB of fp32
gradients per step; the full 28 blocks with 15 configurations do not fit the 8-minute budget), full records of
``--seq-len`` tokens (one shape: no bucket-length noise), micro-batch ``--micro-batch``, bf16 autocast, eager,
no accumulation, a synthetic corpus. Every configuration builds a fresh ``workbench.train.trainer.Trainer`` (model,
optimizer, pipeline) in the same process group, runs ``--warmup`` steps, then ``--steps`` measured ones.

Configurations, in this order: ``ddp`` (DistributedDataParallel, its default 25 MiB buckets, all-reduces
timed by a comm hook), the grid of ``scheduler`` runs, ``ddp`` again (the repeat shows drift over the run),
and ``compute_only``: the scheduler with communication switched off (``enabled = False``), the step without
any gradient sync.

Per configuration (rank 0's measured steps; the ranks run in lockstep): tokens/s/GPU, step time, exposed
communication (the scheduler's grad_sync phase; DDP's tail between the last bucket becoming ready and the last
all-reduce ending), total communication (union of the all-reduce intervals, CUDA events), overlap achieved
(1 - exposed / total), and the cross-check ``exposed_vs_compute_only_s`` = step time - compute_only step time,
which needs no instrumentation at all.

Output: ``DIR/overlap_bench.csv`` in long format (one row per configuration and metric: median, p20, p80 over
the measured steps, GPU, versions, timestamp; written after every configuration, so a run cut short keeps what
it measured), ``DIR/overlap_bench.json``, and a table. Stops starting new configurations after ``--budget-s``.

``--compile default --compile-scope model|layer`` runs every configuration compiled: with ``model`` the
backward is one node and nothing overlaps; with ``layer`` each block is its own unit and the all-reduces
overlap again (workbench/train/overlap.py).

``--cpu`` runs the same plumbing on the CPU with gloo and the tiny preset (a smoke test of the script, not a
measurement): ``torchrun --standalone --nproc-per-node 2 benchmarks/overlap_bench.py --cpu --steps 2``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as workbench.train does

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from workbench.config import merge_overrides, preset_config  # noqa: E402
from workbench.train.fingerprint import versions  # noqa: E402
from workbench.train.model import get_preset  # noqa: E402
from workbench.vocab import COMM_EXPOSED_S, COMM_OVERLAP_PCT, COMM_TOTAL_S, REAL_TOKENS_PER_S, STEP_S  # noqa: E402


def model_config(layers: int, path: Path) -> Path:
    """An HF config.json of gr00t-n1.6 with ``layers`` decoder blocks."""
    a = get_preset("gr00t-n1.6")
    path.write_text(json.dumps({
        "hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
        "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
        "num_hidden_layers": layers, "vocab_size": a.vocab_size, "max_position_embeddings": a.max_position_embeddings,
        "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta, "tie_word_embeddings": a.tie_word_embeddings}))
    return path


def configurations(a: argparse.Namespace) -> list[dict]:
    grid = [{"name": f"scheduler_b{b:g}_r{r:g}", "provider": "scheduler", "bucket_size_mb": b, "overlap_ratio": r}
            for b in a.bucket_sizes for r in a.ratios]
    ddp = {"provider": "ddp", "bucket_size_mb": 25.0, "overlap_ratio": 1.0}  # DDP's default bucket_cap_mb
    return [{"name": "ddp", **ddp}, *grid, {"name": "ddp_repeat", **ddp},
            {"name": "compute_only", "provider": "compute_only", "bucket_size_mb": 25.0, "overlap_ratio": 1.0}]


def run_one(conf: dict, a: argparse.Namespace, model_json: Path | None, data_dir: Path, out: Path,
            rank: int) -> dict:
    from workbench.train.trainer import Trainer

    model = {"model.name": "tiny"} if a.cpu else \
        {"model.name": f"gr00t-n1.6-L{a.layers}", "model.config_path": str(model_json)}
    cfg = merge_overrides(preset_config("tiny" if a.cpu else "gr00t-n1.6"), {
        **model, "data.seq_len": a.seq_len, "data.bucket_width": a.seq_len, "data.min_len": a.seq_len,
        "data.micro_batch_size": a.micro_batch, "data.num_workers": 0 if a.cpu else 4,
        "training.dtype": "fp32" if a.cpu else "bf16", "training.global_batch_size": None,
        "training.grad_accum_steps": 1,
        "training.max_steps": a.warmup + a.steps, "training.warmup_measure_steps": a.warmup,
        "training.log_every": a.steps, "training.scheduler": "constant", "training.warmup_steps": 0,
        "hardware.gpus": int(os.environ["WORLD_SIZE"]), "hardware.device": "cpu" if a.cpu else "cuda",
        "loongforge.overlap.mode": "ddp" if conf["provider"] == "ddp" else "scheduler",
        "loongforge.overlap.bucket_size_mb": conf["bucket_size_mb"],
        "loongforge.overlap.overlap_ratio": conf["overlap_ratio"],
        "loongforge.compute_domain.compile": a.compile, "loongforge.compute_domain.compile_scope": a.compile_scope})
    run_dir = out / conf["name"]
    t0 = time.time()
    trainer = Trainer(cfg, out_dir=run_dir if rank == 0 else None, data_dir=data_dir)
    try:
        if conf["provider"] == "compute_only":
            trainer.comm.enabled = False  # gradients stay local: a timing reference, not training
        summary = trainer.run()
    finally:
        trainer.close()
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    res = {**conf, "wall_s": time.time() - t0, "summary": summary}
    if rank == 0:
        steps = pd.read_csv(run_dir / "phases.csv")
        res["steps"] = steps[steps["measured"] == 1].to_dict("list")
    return res


def rows_of(res: dict, ver: dict, stamp: str, config: str, compute_only_step: float | None) -> list[dict]:
    st = {k: np.asarray(v, dtype=float) for k, v in res.get("steps", {}).items()}
    if not len(st.get("step_s", [])):
        return []
    per_step = {REAL_TOKENS_PER_S: st["real_tokens"] / st["step_s"], STEP_S: st["step_s"],
                "time/grad_sync_s": st["grad_sync"]}
    if res["provider"] != "compute_only":
        per_step[COMM_TOTAL_S] = st["comm_s"]
        per_step[COMM_EXPOSED_S] = st["comm_exposed_s"]
        if compute_only_step is not None:
            per_step["exposed_vs_compute_only_s"] = st["step_s"] - compute_only_step
    base = {"benchmark": "overlap", "config_name": res["name"], "provider": res["provider"],
            "bucket_size_mb": res["bucket_size_mb"], "overlap_ratio": res["overlap_ratio"],
            "buckets": res["summary"].get("comm/buckets"), "gpu": ver["gpu"], "torch": ver["torch"],
            "cuda": ver["cuda"], "nccl": ver["nccl"], "timestamp": stamp, "config": config}
    out = [{**base, "metric": m, "value": float(np.median(v)), "p20": float(np.percentile(v, 20)),
            "p80": float(np.percentile(v, 80)), "n": len(v)} for m, v in per_step.items() if np.isfinite(v).all()]
    if res["summary"].get(COMM_OVERLAP_PCT) is not None and res["provider"] != "compute_only":
        out.append({**base, "metric": COMM_OVERLAP_PCT, "value": res["summary"][COMM_OVERLAP_PCT], "p20": None,
                    "p80": None, "n": len(st["step_s"])})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8, help="decoder blocks of the gr00t-n1.6 copy (the preset has 28)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--bucket-sizes", type=lambda s: [float(x) for x in s.split(",")], default=[5.0, 25.0, 100.0, 400.0])
    p.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.5, 1.0])
    p.add_argument("--steps", type=int, default=10, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=420, help="start no configuration after this many seconds")
    p.add_argument("--out", default="benchmarks/out/overlap")
    p.add_argument("--cpu", action="store_true", help="smoke-test the script on the CPU (gloo, tiny preset)")
    p.add_argument("--compile", choices=("none", "default"), default="none",
                   help="torch.compile mode of every configuration (default: eager)")
    p.add_argument("--compile-scope", choices=("model", "layer"), default="model",
                   help="with --compile: one graph for the loss (model) or one per decoder block (layer)")
    a = p.parse_args(argv)
    if a.cpu:
        a.seq_len, a.micro_batch, a.bucket_sizes, a.ratios = 256, 2, [0.1, 1.0], [0.0, 1.0]
    if int(os.environ.get("WORLD_SIZE", 1)) < 2 or not (a.cpu or torch.cuda.is_available()):
        raise SystemExit("run under torchrun on two or more GPUs: torchrun --standalone --nproc-per-node 2 "
                         "benchmarks/overlap_bench.py")
    rank = int(os.environ["RANK"])
    if not a.cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("gloo" if a.cpu else "nccl")
    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model_json = None if a.cpu else model_config(a.layers, out / f"model-L{a.layers}-rank{rank}.json")
    from workbench.train import synthetic_data_dir

    # both ranks ask; a lock file makes one generate and the other reuse it
    vocab = get_preset("tiny" if a.cpu else "gr00t-n1.6").vocab_size
    data_dir = synthetic_data_dir(vocab_size=min(vocab, 65535), seq_len=a.seq_len, min_len=a.seq_len, short="fill",
                                  num_docs=300 if a.cpu else 2000)
    dist.barrier()
    ver = versions(("gpu", "torch", "cuda", "nccl", "python"))
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    model = "tiny fp32 (cpu smoke test, not a measurement)" if a.cpu else f"gr00t-n1.6 layers={a.layers} bf16"
    mode = "eager" if a.compile == "none" else f"compile={a.compile} scope={a.compile_scope}"
    config = f"{model} seq_len={a.seq_len} micro_batch={a.micro_batch} {mode} steps={a.steps} warmup={a.warmup} world={os.environ['WORLD_SIZE']}"
    results: list[dict] = []
    for conf in configurations(a):
        go = torch.tensor([time.time() - t_start < a.budget_s], device="cpu" if a.cpu else "cuda")
        dist.broadcast(go, 0)  # both ranks start a configuration or neither does
        if not bool(go.item()):
            if rank == 0:
                print(f"budget of {a.budget_s:.0f} s spent: skipping {conf['name']} and the rest", flush=True)
            break
        res = run_one(conf, a, model_json, data_dir, out, rank)
        results.append(res)
        if rank != 0:
            continue
        s = res["summary"]
        print(f"[{conf['name']}] {s[REAL_TOKENS_PER_S] or 0:,.0f} tok/s/gpu, step "
              f"{1000 * (s[STEP_S] or 0):.1f} ms, comm {1000 * (s.get(COMM_TOTAL_S) or 0):.1f} ms, exposed "
              f"{1000 * (s.get(COMM_EXPOSED_S) or 0):.1f} ms, overlap {s.get(COMM_OVERLAP_PCT) or 0:.0f}% "
              f"({res['wall_s']:.0f} s)", flush=True)
        co = next((r for r in results if r["provider"] == "compute_only"), None)
        co_step = float(np.median(co["steps"]["step_s"])) if co and co.get("steps") else None
        rows = [row for r in results for row in rows_of(r, ver, stamp, config, co_step)]
        pd.DataFrame(rows).to_csv(out / "overlap_bench.csv", index=False)
    if rank == 0:
        (out / "overlap_bench.json").write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "steps"} for r in results], indent=1, default=str))
        df = pd.read_csv(out / "overlap_bench.csv")
        wide = df.pivot_table(index="config_name", columns="metric", values="value", aggfunc="first", sort=False)
        cols = [c for c in (REAL_TOKENS_PER_S, STEP_S, COMM_TOTAL_S, COMM_EXPOSED_S,
                            COMM_OVERLAP_PCT, "exposed_vs_compute_only_s") if c in wide.columns]
        print(f"\n{ver}\n{config}")
        with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format",
                               "{:,.4g}".format):
            print(wide[cols].rename(columns=lambda c: c.split("/")[-1]))
        print(f"total {time.time() - t_start:.0f} s; wrote {out / 'overlap_bench.csv'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
