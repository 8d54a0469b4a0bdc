"""Convergence check of a numerics knob: the same model, seed and data, trained with and without it.

    python benchmarks/convergence.py --preset gr00t-n1.6 --steps 500 --micro-batch 4 --seq-len 2048 \
        --variants bf16,fp8_tensorwise --out DIR

Each variant runs ``python -m workbench.train`` in its own process on the same synthetic corpus, packed into
full rows (``data.packing: fill``), with the same model seed, data seed and schedule, so step k of every variant
trains on the same tokens. Results: ``DIR/convergence.csv`` in long format (one row per variant and step: loss,
step time; GPU, versions, commit, timestamp and config columns), and a table printed last (mean loss over the
last 50 steps per variant and its relative difference from the first variant).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from _run import ROOT, child_env, commit, run_logged

sys.path.insert(0, str(ROOT))
from workbench.train.fingerprint import versions  # noqa: E402

VARIANTS = {
    "bf16": [],
    "fp8_tensorwise": ["loongforge.compute_domain.fp8=tensorwise"],
    "fp8_tensorwise_triton": ["loongforge.compute_domain.fp8=tensorwise", "loongforge.compute_domain.fp8_cast=triton"],
    "fp8_tensorwise_triton_head": ["loongforge.compute_domain.fp8=tensorwise", "loongforge.compute_domain.fp8_cast=triton",
                                   "loongforge.compute_domain.fp8_head=true"],
    "fp8_rowwise": ["loongforge.compute_domain.fp8=rowwise"],
    "fp8_rowwise_with_gw_hp": ["loongforge.compute_domain.fp8=rowwise_with_gw_hp"],
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gr00t-n1.6")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--variants", default="bf16,fp8_tensorwise")
    p.add_argument("--tail", type=int, default=50, help="steps averaged at the end for the table")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--out", default="benchmarks/out/convergence")
    a = p.parse_args(argv)
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"data.micro_batch_size={a.micro_batch}", f"data.seq_len={a.seq_len}", "data.packing=fill",
            f"training.max_steps={a.steps}", f"training.learning_rate={a.lr}",
            f"training.warmup_steps={a.warmup_steps}", "training.global_batch_size=null", "training.log_every=50",
            "training.warmup_measure_steps=10", "training.dtype=bf16", "loongforge.compute_domain.compile=default",
            "loongforge.compute_domain.compile_scope=layer"]
    config = f"preset={a.preset} micro_batch={a.micro_batch} seq_len={a.seq_len} steps={a.steps} lr={a.lr} " \
             f"warmup={a.warmup_steps} packing=fill compile=default/layer"
    ver = versions(("gpu", "torch", "triton", "cuda", "python"))
    common = {"gpu": ver["gpu"], "torch": ver["torch"], "triton": ver["triton"], "cuda": ver["cuda"],
              "commit": commit(), "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "config": config}
    import pandas as pd

    frames = []
    for name in names:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "workbench.train", "--preset", a.preset, "--synthetic", "-q",
               "--synthetic-packing", "fill", "--summary", str(d / "summary.json"), "--out", str(d)]
        for s in [*sets, *VARIANTS[name]]:
            cmd += ["--set", s]
        t0 = time.time()
        rc = run_logged(cmd, d / "log.txt", env=child_env(), timeout=a.timeout, who="convergence")
        print(f"[{name}] rc={rc} in {time.time() - t0:.0f} s", flush=True)
        if rc != 0 or not (d / "phases.csv").exists():
            print((d / "log.txt").read_text()[-2000:], flush=True)
            continue
        steps = pd.read_csv(d / "phases.csv")
        frames.append(pd.DataFrame({"benchmark": "convergence", "variant": name, "step": steps["step"],
                                    "loss": steps["loss"], "step_s": steps.get("step_s"), **common}))
    if not frames:
        print("no results")
        return
    df = pd.concat(frames, ignore_index=True)
    df.to_csv(out / "convergence.csv", index=False)
    tail = df[df["step"] > df["step"].max() - a.tail].groupby("variant", sort=False)["loss"].mean()
    first = tail.iloc[0]
    print(f"\n{ver}\n{config}\nmean loss over the last {a.tail} steps:")
    for name, v in tail.items():
        print(f"  {name:24s} {v:.4f}  ({(v - first) / first:+.3%} vs {tail.index[0]})")


if __name__ == "__main__":
    main()
