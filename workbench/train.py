"""``python -m workbench.train``: run the training loop from a config.yaml.

    python -m workbench.train --config config.yaml [--steps N] [--synthetic] [--summary PATH]
    python -m workbench.train --preset tiny --synthetic --steps 50

Prints one progress line per measured window (tokens/s, MFU, phase shares,
memory, loss) and a summary, also written as JSON to ``--summary``.
``--synthetic`` generates a synthetic corpus and preprocesses it into a cache
directory when ``data.loongbin_dir`` is not set. Ctrl-C finishes the current
step, writes a checkpoint when ``training.checkpoint_dir`` is set, and exits.

Exit codes name the failure kind (the tuner reads them, and ``failure.json`` in
the output directory): 0 ok, 2 invalid_config, 3 oom, 4 nan_loss,
5 compile_error, 130 interrupted, anything else a crash.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

# OpenMP threads that spin while waiting collapse when the cores are shared (the
# loader's threads, parallel trials, CI): measured on 2 cores under load, a tiny
# forward+backward took 2.18 s with the default policy and 0.13 s with PASSIVE.
# Set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["main", "synthetic_data_dir", "EXIT_CODES", "classify_exception"]

EXIT_CODES = {"ok": 0, "crash": 1, "invalid_config": 2, "oom": 3, "nan_loss": 4, "compile_error": 5,
              "interrupted": 130}

# A synthetic corpus is stored at a fine bucket width; the run's data.bucket_width
# groups stored buckets, so tuning the width needs no re-preprocessing.
SYNTH_STORED_WIDTH = 32


def cache_root() -> Path:
    return Path(os.environ.get("LOONGFORGE_CACHE", Path.home() / ".cache" / "loongforge-workbench"))


def synthetic_data_dir(*, vocab_size: int, seq_len: int, num_docs: int = 2000, seed: int = 0,
                       min_len: int = 64, short: str = "pack", zstd_level: int = 12,
                       dict_size: int = 262144) -> Path:
    """Generate and preprocess the synthetic corpus once per parameters; return its shard dir.

    Concurrent callers (parallel trials) serialise on a lock file; the writer's
    atomic rename means a reader never sees a half-written directory.
    """
    from loaders.preprocess import preprocess
    from loaders.synth import SynthSpec, generate_documents, write_npy

    min_len = min(min_len, seq_len)
    key = (f"synth-v{vocab_size}-L{seq_len}-m{min_len}-{short}-w{SYNTH_STORED_WIDTH}-n{num_docs}-s{seed}"
           f"-z{zstd_level}")
    root = cache_root()
    out = root / key
    if (out / "manifest.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one generator at a time; the others wait, then reuse
        if (out / "manifest.json").exists():
            return out
        docs = generate_documents(SynthSpec(vocab_size=vocab_size, num_docs=num_docs, seed=seed))
        src = root / f"{key}.npy"
        eos = vocab_size - 1
        write_npy(docs, src, eos)
        preprocess([str(src)], str(out), bucket_width=SYNTH_STORED_WIDTH, min_len=min_len,
                   max_len=seq_len, num_workers=2, zstd_level=zstd_level, vocab_size=vocab_size, eos_id=eos,
                   dict_size=dict_size, short=short, compare=False, quiet=True)
        src.unlink()
    return out


def classify_exception(e: BaseException) -> str:
    """Map an exception to a DESIGN.md failure kind."""
    import torch

    from loaders.format import ShardFormatError
    from workbench.config import ConfigError
    from workbench.loop import NanLossError

    if isinstance(e, (ConfigError, ShardFormatError)):  # the config's data.loongbin_dir is unusable as it is
        return "invalid_config"
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "oom"
    if isinstance(e, NanLossError):
        return "nan_loss"
    mod = type(e).__module__ or ""
    if mod.startswith(("torch._dynamo", "torch._inductor")) or "BackendCompilerFailed" in type(e).__name__ \
            or mod.startswith("triton"):
        return "compile_error"
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return "crash"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="config.yaml (as exported by the tuner)")
    src.add_argument("--preset", help="run a model preset's default config (tiny, gr00t-n1.6)")
    p.add_argument("--steps", type=int, help="override training.max_steps")
    p.add_argument("--synthetic", action="store_true",
                   help="generate + preprocess a synthetic corpus when data.loongbin_dir is not set")
    p.add_argument("--synthetic-packing", choices=("pack", "fill"), default="pack",
                   help="how the synthetic corpus packs short pieces: pack (records of varied lengths, the "
                        "default) or fill (a token stream cut into full records, as nanoGPT does)")
    p.add_argument("--summary", help="write the summary JSON here")
    p.add_argument("--out", help="directory for metrics.jsonl / phases.csv (default metrics.out_dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set data.micro_batch_size=8 (YAML value)")
    p.add_argument("--heartbeat", help=argparse.SUPPRESS)  # file touched every step (the tuner's watchdog)
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--debug", action="store_true", help="print the traceback of any error, not only of a crash")
    return p.parse_args(argv)


def load_run_config(args: argparse.Namespace):
    from workbench.config import Config, load_config, merge_overrides, parse_overrides, preset_config

    cfg = load_config(args.config) if args.config else preset_config(args.preset)
    overrides: dict[str, Any] = parse_overrides(args.set)
    if args.steps is not None:  # 0 or less: rejected by the config, not ignored
        overrides["training.max_steps"] = args.steps
    if overrides:
        cfg = merge_overrides(cfg, overrides)
    assert isinstance(cfg, Config)
    return cfg


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workbench.config import apply_allocator_env

    cfg = load_run_config(args)
    apply_allocator_env(cfg)  # before CUDA initialises in this process
    from workbench.loop import Trainer, build_model_args

    data_dir = None
    if not cfg.data.loongbin_dir:
        if not args.synthetic:
            raise SystemExit("data.loongbin_dir is not set: pass --synthetic to generate a synthetic corpus, "
                             "or point data.loongbin_dir at `python -m loaders.preprocess` output")
        margs = build_model_args(cfg)
        data_dir = synthetic_data_dir(vocab_size=min(margs.vocab_size, 65535), seq_len=cfg.data.seq_len,
                                      min_len=cfg.data.min_len, short=args.synthetic_packing,
                                      seed=cfg.data.seed)
    trainer = Trainer(cfg, out_dir=args.out, data_dir=data_dir, heartbeat=args.heartbeat)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return summary


def print_summary(s: dict[str, Any]) -> None:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    print(f"summary: {s['steps']} steps ({s['measured_steps']} measured), "
          f"{f(s['throughput/real_tokens_per_s_per_gpu'], ',.0f')} real tok/s/gpu, "
          f"MFU {f(s['mfu_pct'], '.1f')}%, step {f(s['time/step_s'], '.4f')} s, "
          f"loss {f(s['first_loss'], '.4f')} -> {f(s['last_loss'], '.4f')}")
    ph = s["phase_s_per_step"]
    print("  phases s/step: " + ", ".join(f"{k} {f(v, '.4f')}" for k, v in ph.items()))
    mem = s.get("memory/max_reserved_gib")
    print(f"  memory: peak reserved {f(mem, '.2f')} GiB, allocated {f(s.get('memory/max_allocated_gib'), '.2f')}"
          f" GiB" if mem is not None else f"  memory: peak RSS {f(s.get('memory/max_rss_gib'), '.2f')} GiB")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(name)s: %(message)s")
    out = Path(args.out) if args.out else None
    try:
        summary = run(args)
    except BaseException as e:  # noqa: BLE001 - classified, recorded, re-exit with its code
        if isinstance(e, SystemExit):
            raise
        from workbench.config import ConfigError

        kind = classify_exception(e)
        # a ConfigError's subclasses are details of where it was raised (LaunchConfigError excepted)
        name = "ConfigError" if isinstance(e, ConfigError) and type(e).__name__.startswith("_") else type(e).__name__
        msg = f"{name}: {e}"
        print(f"error ({kind}): {msg}", file=sys.stderr)
        # a crash is a bug to report: its traceback goes to the log; a file the run cannot read or write is not
        if args.debug or (kind == "crash" and not isinstance(e, OSError)):
            traceback.print_exc()
        if out:
            try:
                out.mkdir(parents=True, exist_ok=True)
                (out / "failure.json").write_text(json.dumps({"kind": kind, "message": msg[:4000]}) + "\n")
            except OSError as werr:  # the output directory itself may be what failed: the line above says it
                print(f"  (failure.json not written: {werr.strerror or werr}: {werr.filename or out})",
                      file=sys.stderr)
        return EXIT_CODES[kind]
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.summary + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        os.replace(tmp, args.summary)
    if not args.quiet:
        print_summary(summary)
    return EXIT_CODES["interrupted"] if summary.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
