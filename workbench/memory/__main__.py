"""``python -m workbench.memory analyze``: run the training loop, record the allocator's history over a few steps,
and write ``memory_analysis.json``; ``python -m workbench.memory lifetimes``: derive when each gradient is produced
and consumed from the model's autograd graph, and write ``lifetimes.json`` (docs/memory.md).

    python -m workbench.memory analyze --config config.yaml [--steps N] [--out DIR] [--synthetic]
    python -m workbench.memory analyze --preset gr00t-n1.6 --synthetic --set data.micro_batch_size=8
    python -m workbench.memory lifetimes --preset gr00t-n1.6 [--set KEY=VALUE] [--out DIR] [--rebuild-dag]
    python -m workbench.memory fit --preset gr00t-n1.6-vla [--suggest] [--multiple 8] [--out DIR]

``fit`` finds the largest micro-batch that fits (workbench/memory/fit.py), with ``--suggest`` also under the
allocator settings ``analyze`` suggests at that micro-batch, and writes ``fit.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import torch

from workbench.files import write_json
from workbench.config import config_hash, merge_overrides
from workbench.errors import ConfigError
from workbench.memory import fit, lifetimes
from workbench.memory.analysis import analyze_snapshot, format_table
from workbench.train.run import load_run_config, synthetic_dir_for
from workbench.train.trainer import Trainer
from workbench.vocab import REAL_TOKENS_PER_S, STEP_S

__all__ = ["main"]


def _source(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A subcommand's config: --config or --preset, with --set on top."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="config.yaml")
    src.add_argument("--preset", help="a model preset's default config (tiny, gr00t-n1.6, gr00t-n1.6-vla)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    return parser


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.memory", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = _source(sub.add_parser("analyze", help="record the allocator over N training steps and suggest settings"))
    a.add_argument("--steps", type=int, default=5, help="recorded steps (default 5)")
    a.add_argument("--warmup", type=int, default=None,
                   help="steps before recording (default training.warmup_measure_steps)")
    a.add_argument("--out", default=".", help="directory for memory_analysis.json and the run's metrics (default: the working directory)")
    a.add_argument("--synthetic", action="store_true", help="generate a synthetic corpus when data.loongbin_dir "
                                                            "is not set")
    a.add_argument("--max-entries", type=int, default=500_000, help="allocator history ring size (default 500000)")
    a.add_argument("--snapshot", action="store_true",
                   help="also write memory_snapshot.pickle (for https://pytorch.org/memory_viz)")
    lt = _source(sub.add_parser("lifetimes", help="gradient production order, bucket lifetimes and a lifetime-aware "
                                                  "buffer plan, from the model's autograd graph (no GPU needed)"))
    lt.add_argument("--out", default=".", help="directory for lifetimes.json (default: the working directory)")
    lt.add_argument("--rebuild-dag", action="store_true", help="build the autograd DAG again instead of reading "
                                                              "it from the cache")
    f = _source(sub.add_parser("fit", help="the largest micro-batch that fits, by probe runs; with --suggest also "
                                           "under the allocator settings analyze suggests"))
    f.add_argument("--out", default="fit", help="directory for fit.json and the probes' runs (default: ./fit)")
    f.add_argument("--start", type=int, help="first micro-batch probed (default data.micro_batch_size)")
    f.add_argument("--multiple", type=int, default=8, help="probe multiples of this (default 8)")
    f.add_argument("--limit", type=int, default=4096, help="largest micro-batch probed (default 4096)")
    f.add_argument("--steps", type=int, default=3, help="steps per probe (default 3: the optimizer state exists "
                                                        "from the second)")
    f.add_argument("--timeout", type=float, default=600, help="seconds per probe (default 600)")
    f.add_argument("--suggest", action="store_true", help="analyze at the largest fitting micro-batch and search "
                                                          "again under the suggested allocator settings")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    return {"lifetimes": _lifetimes, "fit": _fit}.get(args.command, _analyze)(args)


def _fit(args: argparse.Namespace) -> int:
    try:
        cfg = load_run_config(argparse.Namespace(config=args.config, preset=args.preset, set=args.set, steps=None))
    except ValueError as e:
        print(f"error (invalid_config): {e}", file=sys.stderr)
        return 2
    source = ["--config", str(Path(args.config).resolve())] if args.config else ["--preset", args.preset]
    try:
        doc = fit.run_fit(source, start=args.start or cfg.data.micro_batch_size, multiple=args.multiple,
                          limit=args.limit, steps=args.steps, timeout=args.timeout, sets=args.set,
                          suggest=args.suggest, out=Path(args.out))
    except (fit.ProbeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"largest micro-batch that fits: {doc['config']['largest_micro_batch']} (the config's allocator settings)")
    if "analysis" in doc:
        settings = doc["analysis"]["suggested_allocator"]
        print("suggested allocator settings: "
              + (", ".join(f"{k}: {v}" for k, v in settings.items()) if settings else "none (no change suggested)"))
    if "suggested" in doc:
        print(f"largest micro-batch that fits: {doc['suggested']['largest_micro_batch']} (suggested settings), "
              f"{doc['ratio']:.2f}x")
    print(f"wrote {Path(args.out) / 'fit.json'}")
    return 0


def _lifetimes(args: argparse.Namespace) -> int:
    try:
        cfg = load_run_config(argparse.Namespace(config=args.config, preset=args.preset, set=args.set, steps=None))
        doc = lifetimes.analyze_lifetimes(cfg, rebuild_dag=args.rebuild_dag)
    except ValueError as e:  # a ConfigError, or model args an HF config.json cannot give
        print(f"error (invalid_config): {e}", file=sys.stderr)
        return 2
    path = lifetimes.write_lifetimes(doc, args.out)
    print(lifetimes.format_table(doc))
    print(f"wrote {path}")
    return 0


def _analyze(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():  # note: does not initialise the caching allocator
        print("workbench.memory analyze needs CUDA: torch.cuda.is_available() is False on this machine",
              file=sys.stderr)
        return 2
    try:
        cfg = load_run_config(argparse.Namespace(config=args.config, preset=args.preset, set=args.set, steps=None))
        warmup = cfg.training.warmup_measure_steps if args.warmup is None else args.warmup
        cfg = merge_overrides(cfg, {"training.max_steps": warmup + args.steps, "training.warmup_measure_steps": warmup,
                                    "training.log_every": args.steps, "hardware.device": "cuda"})
    except ConfigError as e:
        print(f"error (invalid_config): {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = None
    if not cfg.data.loongbin_dir:
        if not args.synthetic:
            print("data.loongbin_dir is not set: pass --synthetic", file=sys.stderr)
            return 2
        data_dir = synthetic_dir_for(cfg)
    try:
        trainer = Trainer(cfg, out_dir=out / "run", data_dir=data_dir)  # applies the allocator settings
    except ConfigError as e:
        print(f"error (invalid_config): {e}", file=sys.stderr)
        return 2
    dev = trainer.device
    try:
        if warmup:
            trainer.run(warmup)  # allocator settling, optimizer state, first bucket shapes
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        # no stack traces: the sizes and actions are what the analysis needs, and they cost ~2 us per event
        torch.cuda.memory._record_memory_history("all", context=None, max_entries=args.max_entries)
        summary = trainer.run(warmup + args.steps)
        torch.cuda.synchronize(dev)  # note: sync before reading the allocator state
        snapshot = torch.cuda.memory._snapshot()
        stats = torch.cuda.memory_stats(dev)
        torch.cuda.memory._record_memory_history(None)
    finally:
        trainer.close()
    if args.snapshot:
        with open(out / "memory_snapshot.pickle", "wb") as f:
            pickle.dump(snapshot, f)
    doc = analyze_snapshot(snapshot, device=dev.index or 0, stats=stats,
                           allocator=cfg.loongforge.memory_domain.allocator, steps=args.steps)
    doc["run"] = {
        "model": cfg.model.name, "micro_batch_size": cfg.data.micro_batch_size, "seq_len": cfg.data.seq_len,
        "grad_accum_steps": summary.get("grad_accum_steps"), "warmup_steps": warmup, "config_hash": config_hash(cfg),
        "allocator_env": trainer.allocator_env or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        REAL_TOKENS_PER_S: summary.get(REAL_TOKENS_PER_S),
        STEP_S: summary.get(STEP_S), "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "recording": "allocator history on during the measured steps (no stacks)",
    }
    write_json(out / "memory_analysis.json", doc, indent=1)
    print(format_table(doc))
    print(f"wrote {out / 'memory_analysis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
