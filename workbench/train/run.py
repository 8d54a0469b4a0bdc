"""What ``python -m workbench.train`` runs once its arguments are parsed: the config with its overrides, the
synthetic corpus when no shards are given, the Trainer inside the run context, and the run's outcome (a key of
workbench.vocab's exit codes)."""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loaders.preprocess import preprocess
from loaders.synth import SynthSpec, VLASynthSpec, generate_documents, write_npy, write_vla_shards
from workbench.config import (DEFAULT_PROMETHEUS_PORT, Config, dumps_config, load_config, merge_overrides,
                              parse_overrides, preset_config)
from workbench.train.context import RunContext, classify_exception
from workbench.vocab import COMPILE_S, MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, MAX_RSS_GIB, REAL_TOKENS_PER_S, STEP_S

if TYPE_CHECKING:
    from workbench.train.vla import VLAArgs

# The modules that import torch (the trainer, the models, the config reloader) are imported where a run starts:
# a config error, or --print-config, is told without the second of torch's import.

__all__ = ["cache_root", "classify_exception", "load_run_config", "print_summary", "run", "run_command",
           "synthetic_data_dir", "synthetic_dir_for", "synthetic_vla_dir"]

# A synthetic corpus is stored at a fine bucket width; the run's data.bucket_width
# groups stored buckets, so tuning the width needs no re-preprocessing.
SYNTH_STORED_WIDTH = 32


def cache_root() -> Path:
    return Path(os.environ.get("LOONGFORGE_CACHE", Path.home() / ".cache" / "loongforge-workbench"))


def _cached_corpus(key: str, write: Callable[[Path, Path], None]) -> Path:
    """``cache_root()/key``, written once by ``write(out, root)`` unless its manifest is there. Concurrent callers
    (parallel trials) serialise on a lock file; the writers' atomic rename means a reader never sees a half-written
    directory."""
    root = cache_root()
    out = root / key
    if (out / "manifest.json").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one generator at a time; the others wait, then reuse
        if not (out / "manifest.json").exists():
            write(out, root)
    return out


def synthetic_data_dir(*, vocab_size: int, seq_len: int, num_docs: int = 2000, seed: int = 0,
                       min_len: int = 64, short: str = "pack", zstd_level: int = 12,
                       dict_size: int = 262144) -> Path:
    """Generate and preprocess the synthetic corpus once per parameters; return its shard dir."""
    min_len = min(min_len, seq_len)
    key = (f"synth-v{vocab_size}-L{seq_len}-m{min_len}-{short}-w{SYNTH_STORED_WIDTH}-n{num_docs}-s{seed}"
           f"-z{zstd_level}")

    def write(out: Path, root: Path) -> None:
        docs = generate_documents(SynthSpec(vocab_size=vocab_size, num_docs=num_docs, seed=seed))
        src = root / f"{key}.npy"
        eos = vocab_size - 1
        write_npy(docs, src, eos)
        preprocess([str(src)], str(out), bucket_width=SYNTH_STORED_WIDTH, min_len=min_len,
                   max_len=seq_len, num_workers=2, zstd_level=zstd_level, vocab_size=vocab_size, eos_id=eos,
                   dict_size=dict_size, short=short, compare=False, quiet=True)
        src.unlink()

    return _cached_corpus(key, write)


def synthetic_vla_dir(args: VLAArgs, *, num_samples: int = 512, seed: int = 0) -> Path:
    """The synthetic VLA corpus of a VLA model's shapes (images, instruction length, action chunk), written once per
    shapes and seed under the cache, as :func:`synthetic_data_dir` does for tokens."""
    spec = VLASynthSpec(num_samples=num_samples, image_size=(args.image_size, args.image_size),
                        text_len=args.text_tokens, action_steps=args.action_horizon, action_dim=args.action_dim,
                        vocab_size=min(args.backbone.vocab_size, 65535), seed=seed)
    key = (f"synth-vla-i{args.image_size}-t{args.text_tokens}-a{args.action_horizon}x{args.action_dim}"
           f"-v{spec.vocab_size}-n{num_samples}-s{seed}")
    return _cached_corpus(key, lambda out, root: write_vla_shards(spec, out))


def synthetic_dir_for(cfg: Config, packing: str = "pack") -> Path:
    """The synthetic corpus a config trains on when it names no shards: VLA records for a VLA preset, else
    token documents of the model's vocabulary at ``data.seq_len`` (``packing``: how short documents are stored)."""
    from workbench.train.trainer import build_model_args
    from workbench.train.vla import VLA_PRESETS, get_vla_preset

    if cfg.model.name in VLA_PRESETS:
        return synthetic_vla_dir(get_vla_preset(cfg.model.name), seed=cfg.data.seed)
    margs = build_model_args(cfg)
    return synthetic_data_dir(vocab_size=min(margs.vocab_size, 65535), seq_len=cfg.data.seq_len,
                              min_len=cfg.data.min_len, short=packing, seed=cfg.data.seed)


def load_run_config(args: argparse.Namespace):
    cfg = load_config(args.config) if args.config else preset_config(args.preset)
    overrides: dict[str, Any] = parse_overrides(args.set)
    if args.steps is not None:  # 0 or less: rejected by the config, not ignored
        overrides["training.max_steps"] = args.steps
    # workbench.train's CLI serves Prometheus on 9091 unless told otherwise (a config's own port, --set, the
    # flags); a caller whose arguments have no such flags (workbench.memory) keeps the config's port
    if getattr(args, "no_prometheus", False):
        overrides["metrics.prometheus_port"] = None
    elif getattr(args, "prometheus_port", None) is not None:
        overrides["metrics.prometheus_port"] = args.prometheus_port
    elif hasattr(args, "no_prometheus") and "metrics.prometheus_port" not in overrides \
            and cfg.metrics.prometheus_port is None:
        overrides["metrics.prometheus_port"] = DEFAULT_PROMETHEUS_PORT
    if getattr(args, "prometheus_addr", None) is not None:
        overrides["metrics.prometheus_addr"] = args.prometheus_addr
    if getattr(args, "profile", None) is not None:
        overrides["metrics.profile_steps"] = args.profile
    if overrides:
        cfg = merge_overrides(cfg, overrides)
    assert isinstance(cfg, Config)
    return cfg


def run_command(args: argparse.Namespace, context: RunContext) -> str:
    """``python -m workbench.train`` with its parsed ``args``: the run (or ``--print-config``) in ``context``, whose
    summary file gets the summary and whose failure file an exception's kind (told in one line on stderr); returns
    the outcome: ``ok``, ``interrupted`` or the failure kind (a key of ``workbench.vocab.EXIT_CODES``)."""
    try:
        if args.print_config:  # what a run would train with, as a file it loads: nothing runs
            sys.stdout.write(dumps_config(load_run_config(args)))
            return "ok"
        summary = run(args, context)
    except BaseException as e:  # noqa: BLE001 - classified, recorded, told; the CLI exits with its code
        if isinstance(e, SystemExit):
            raise
        return context.tell_failure(e, debug=args.debug)
    context.finish(summary)
    print_summary(summary)
    return "interrupted" if summary.get("interrupted") else "ok"


def run(args: argparse.Namespace, context: RunContext | None = None) -> dict[str, Any]:
    """Train as ``args`` say, inside ``context`` (its signals and heartbeat; none: no files); returns the summary."""
    cfg = load_run_config(args)
    from workbench.train.hf import save_hf
    from workbench.train.reload import ConfigSource
    from workbench.train.trainer import Trainer, preload

    data_dir = None
    if not cfg.data.loongbin_dir:
        if not args.synthetic:
            raise SystemExit("data.loongbin_dir is not set: pass --synthetic to generate a synthetic corpus, "
                             "or point data.loongbin_dir at `python -m loaders.preprocess` output")
        data_dir = synthetic_dir_for(cfg, args.synthetic_packing)
    # SIGUSR1 re-reads the file with the same --set and --steps on top (workbench/train/reload.py); a preset has none
    source = ConfigSource(args.config, lambda: load_run_config(args)) if args.config else None
    compile_only = getattr(args, "compile_only", False)
    if context is not None and context.gate is not None:  # started ahead of its trial: held until it starts
        preload(cfg)
        context.hold()
    trainer = Trainer(cfg, out_dir=args.out, data_dir=data_dir, context=context, config_source=source,
                      trust_checkpoint=getattr(args, "trust_checkpoint", False),
                      echo=not getattr(args, "quiet", False), blocks=getattr(args, "blocks", None))
    try:
        if compile_only:
            return trainer.compile_only()
        summary = trainer.run()
        if getattr(args, "save_hf", None):
            summary["saved_hf"] = str(save_hf(trainer.model, args.save_hf))
    finally:
        trainer.close()
    return summary


def print_summary(s: dict[str, Any]) -> None:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    if s.get("compile_only"):
        print(f"summary: compiled in {f(s.get(COMPILE_S), '.1f')} s, no step run"
              + (f" ({s['blocks']} block(s) a stack)" if s.get("blocks") else "") + "; FX graph cache "
              f"{s.get('compile/fx_graph_cache_hit', 0)} hit(s), {s.get('compile/fx_graph_cache_miss', 0)} miss(es)")
        return

    measured = f"{s['measured_steps']} measured"
    if not s["measured_steps"]:  # say why the figures below are n/a
        measured += (": the steps after the warm-up (training.warmup_measure_steps) filled no window of "
                     "training.log_every steps; run more steps")
    mfu = s["mfu_pct"]
    # MFU needs a peak FLOP/s: known for GPUs by name (or hardware.peak_tflops), never for a CPU
    mfu_text = f"MFU {mfu:.1f}%" if isinstance(mfu, (int, float)) else "MFU n/a (no peak FLOP/s for this device)"
    print(f"summary: {s['steps']} steps ({measured}), "
          f"{f(s[REAL_TOKENS_PER_S], ',.0f')} real tok/s/gpu, "
          f"{mfu_text}, step {f(s[STEP_S], '.4f')} s, "
          f"loss {f(s['first_loss'], '.4f')} -> {f(s['last_loss'], '.4f')}")
    ph = s["phase_s_per_step"]
    print("  phases s/step: " + ", ".join(f"{k} {f(v, '.4f')}" for k, v in ph.items()))
    mem = s.get(MAX_RESERVED_GIB)
    print(f"  memory: peak reserved {f(mem, '.2f')} GiB, allocated {f(s.get(MAX_ALLOCATED_GIB), '.2f')}"
          f" GiB" if mem is not None else f"  memory: peak RSS {f(s.get(MAX_RSS_GIB), '.2f')} GiB")


