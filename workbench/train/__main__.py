"""``python -m workbench.train``: run the training loop from a config.yaml.

    python -m workbench.train --config config.yaml [--steps N] [--synthetic] [--summary PATH]
    python -m workbench.train --preset tiny --synthetic --steps 50
    python -m workbench.train --preset tiny --synthetic --steps 20 --profile 3 --out runs/prof  # runs/prof/trace.json
    python -m workbench.train --preset gr00t-n1.6 --print-config > my.yaml  # the full commented config, to edit

Prints one progress line per measured window (tokens/s, MFU, phase shares,
memory, loss) and a summary, also written as JSON to ``--summary``. Serves
Prometheus metrics on 127.0.0.1:9091 (``metrics.prometheus_port``, ``--prometheus-port N``;
``metrics.prometheus_addr``, ``--prometheus-addr 0.0.0.0`` to serve every interface;
``--no-prometheus`` for none; a port in use is one warning line, the run goes on).
``--synthetic`` generates a synthetic corpus and preprocesses it into a cache
directory when ``data.loongbin_dir`` is not set. Ctrl-C finishes the current
step, writes a checkpoint when ``training.checkpoint_dir`` is set, and exits.
SIGTERM does the same as Ctrl-C (SIGINT); a second one stops at once.
``kill -USR1 <pid>`` re-reads the ``--config`` file between steps and applies the
keys that may change while running, or rejects the reload with the reason
(workbench/train/reload.py; README, "Hot reload"); before the loop starts and
after it ends, SIGUSR1 is ignored with one line. A ``latest.pt`` loads with
``weights_only=True``; one that needs pickle is refused (exit 2) unless
``--trust-checkpoint`` is passed.

Exit codes name the failure kind (the tuner reads them, and ``failure.json`` in
the output directory): 0 ok, 2 invalid_config, 3 oom, 4 nan_loss,
5 compile_error, 130 interrupted, anything else a crash.
"""

from __future__ import annotations

import os

# OpenMP threads that spin while waiting collapse when the cores are shared (the
# loader's threads, parallel trials, CI): measured on 2 cores under load, a tiny
# forward+backward took 2.18 s with the default policy and 0.13 s with PASSIVE.
# Set before torch is imported (workbench.train's own __init__ imports nothing); a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from workbench.config.schema import MODEL_PRESETS  # noqa: E402
from workbench.train.context import HOLD_ENV, RunContext  # noqa: E402  (no torch: the heartbeat comes before it)
from workbench.vocab import EXIT_CODES  # noqa: E402

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.train", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="config.yaml (as exported by the tuner)")
    src.add_argument("--preset", metavar="NAME",
                     help=f"run a model preset's default config ({', '.join(MODEL_PRESETS)})")
    p.add_argument("--steps", type=int, help="override training.max_steps (default: the config's)")
    p.add_argument("--synthetic", action="store_true",
                   help="generate + preprocess a synthetic corpus when data.loongbin_dir is not set")
    p.add_argument("--synthetic-packing", choices=("pack", "fill"), default="pack",
                   help="how the synthetic corpus packs short pieces: pack (records of varied lengths, the "
                        "default) or fill (a token stream cut into full records, as nanoGPT does)")
    p.add_argument("--summary", help="write the summary JSON here")
    p.add_argument("--save-hf", metavar="DIR",
                   help="after the run, write the model as DIR/model.safetensors + DIR/config.json (transformers "
                        "loads it with from_pretrained)")
    p.add_argument("--out", help="directory for metrics.jsonl / phases.csv (default metrics.out_dir)")
    p.add_argument("--profile", type=int, metavar="N",
                   help="write a torch.profiler trace of N steps after the warm-up to <out>/trace.json (Perfetto); "
                        "on CUDA also <out>/memory_snapshot.pickle (sets metrics.profile_steps)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set data.micro_batch_size=8 (YAML value)")
    prom = p.add_mutually_exclusive_group()
    prom.add_argument("--prometheus-port", type=int, metavar="N",
                      help="serve /metrics on port N (default: metrics.prometheus_port, else 9091)")
    prom.add_argument("--no-prometheus", action="store_true", help="serve no Prometheus endpoint")
    p.add_argument("--prometheus-addr", metavar="ADDR",
                   help="address /metrics listens on (default: metrics.prometheus_addr, 127.0.0.1; 0.0.0.0 serves "
                        "every interface)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="resume from a <training.checkpoint_dir>/latest.pt that needs pickle to load (an older "
                        "format): loading it can run code, so pass this only for a file you wrote")
    p.add_argument("--print-config", action="store_true",
                   help="print the full config (the preset's or the file's, with --set and --steps applied), every "
                        "key documented in a comment, and exit without training")
    p.add_argument("--compile-only", action="store_true",
                   help="compile what the run would compile (every bucket shape; the capture too), then exit "
                        "without a training step: fills the compile cache (TORCHINDUCTOR_CACHE_DIR) for a later run")
    p.add_argument("--blocks", type=int, metavar="K",
                   help="with --compile-only: a model of at most K blocks in each stack (every block of a stack "
                        "compiles to the same graph, so K blocks fill the cache for the full depth)")
    p.add_argument("--heartbeat", help=argparse.SUPPRESS)  # file touched every step (the tuner's watchdog)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no line per measured window, warnings only in the log; the summary is still printed")
    p.add_argument("--debug", action="store_true", help="print the traceback of any error, not only of a crash")
    return p.parse_args(argv)


def _ignore_sigusr1(signum, frame) -> None:
    os.write(2, b"workbench.train: SIGUSR1 ignored: the config reloads only while the training loop runs\n")


def main(argv: list[str] | None = None) -> int:
    # SIGUSR1's default action ends the process: until the loop installs its reload handler, and after the loop
    # restores this one, a reload request is ignored with one line
    signal.signal(signal.SIGUSR1, _ignore_sigusr1)
    args = parse_args(argv)
    if args.blocks is not None and (not args.compile_only or args.blocks < 1):
        raise SystemExit("--blocks K needs --compile-only and K >= 1")
    # the trial contract's files and signals are the run context's; --out gets failure.json; a training run started
    # ahead by the tuner (start-ahead) is held at $WORKBENCH_HOLD's gate once its imports and config are done
    hold = os.environ.get(HOLD_ENV) if not (args.compile_only or args.print_config) else None
    context = RunContext(heartbeat=args.heartbeat, summary=args.summary, failure_dir=args.out, gate=hold)
    # step 0: the process reports (the tuner's no_report watchdog counts from launch), before the imports of torch
    # and the loop, which take seconds on a loaded host; compiling may take a while after it. A held process
    # reports when its gate opens (run.run), which is its launch to the watchdog.
    if hold is None:
        context.beat(0)
    from workbench.train.run import run_command

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(name)s: %(message)s")
    return EXIT_CODES[run_command(args, context)]


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        # Python's finalization puts a handler it set back to SIG_DFL (whose action ends the process), but leaves
        # SIG_IGN: a reload request while the interpreter shuts down is dropped, not fatal
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
