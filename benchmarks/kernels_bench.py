"""Benchmark of the Triton kernels against torch eager and torch.compile of the references (CUDA only).

    python benchmarks/kernels_bench.py [--out DIR] [--quick] [--e2e] [--kernels rmsnorm,swiglu,rope,fused_linear_ce]
                            [--shapes 'fused add,bf16 out'] [--providers triton,torch,torch_compile]
                            [--full-sweep] [--kernel-sweep PATH] [--e2e-isolation none --e2e-rounds N]

What it times and how, what it writes and how long it takes: docs/kernel-notes.md, "The benchmark". This file is
the command line; its helpers sit next to it: ``_kbench_setup`` (shapes, constants, timers), ``_kbench_cases``
(the kernels' cases and launch sweeps), ``_kbench_e2e`` (the end-to-end step), ``_kbench_summary`` (best launch,
summary table, goal checks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
if str(Path(__file__).resolve().parent) not in sys.path:  # its helpers, also when loaded by file path (the tests)
    sys.path.append(str(Path(__file__).resolve().parent))
import _kbench_setup as setup  # noqa: E402
from _kbench_cases import _bench_case, _cases  # noqa: E402
from _kbench_e2e import _bench_e2e, _bench_e2e_isolated  # noqa: E402
from _kbench_setup import CSV_COLUMNS, PROVIDERS, _Device  # noqa: E402
from _kbench_summary import _best_launch, _summary  # noqa: E402

from workbench.train.fingerprint import versions  # noqa: E402

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/kernels_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/out", help="output folder (default: benchmarks/out)")
    p.add_argument("--quick", action="store_true", help="gr00t shapes only, a smaller sweep, shorter timing")
    p.add_argument("--full-sweep", action="store_true", help="every valid launch configuration (long)")
    p.add_argument("--kernels", default="rmsnorm,swiglu,rope,fused_linear_ce")
    p.add_argument("--shapes", help="only the cases whose shape label contains one of these comma-separated "
                                    "strings, e.g. 'fused add,bf16 out'")
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--e2e", action="store_true", help="also the end-to-end gr00t-n1.6 step, eager and compiled")
    p.add_argument("--kernel-sweep", help="also write the gr00t-shape triton rows as a report kernel_sweep.csv")
    p.add_argument("--launch", help="best_launch.json of an earlier run: the end-to-end step's Triton launch "
                                    "parameters when this run sweeps no kernel (--kernels none --e2e)")
    p.add_argument("--e2e-isolation", choices=("auto", "process", "none"), default="auto",
                   help="run each end-to-end variant in its own process (auto: on CUDA) or all in this one")
    p.add_argument("--e2e-variants",
                   help="end-to-end variants to run, OPS:MODE, e.g. torch:eager,triton:compile,rmsnorm+loss:graphs "
                        "(OPS: torch, triton, triton_fused, or op names joined by +; MODE: eager, compile, graphs; "
                        "default: torch and triton ops, eager and compile)")
    p.add_argument("--e2e-rounds", type=int,
                   help="interleaved rounds of timed steps per variant when the variants share a process "
                        "(--e2e-isolation none; default 2): each variant's per-round medians are "
                        "paired with the torch ops' (column note) and every step is written to e2e_steps.csv")
    p.add_argument("--e2e-profile", action="store_true",
                   help="also profile two end-to-end steps per variant (torch.profiler): e2e_profile.csv, the time "
                        "per kernel / op, to see where one variant loses to another")
    p.add_argument("--e2e-worker", help=argparse.SUPPRESS)  # OPS:MODE, one variant (internal)
    p.add_argument("--e2e-shape", help=argparse.SUPPRESS)  # PRESET:BATCH:SEQ (internal)
    p.add_argument("--launch-json", help=argparse.SUPPRESS)  # the launch parameters as JSON (internal)
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)

    import torch

    if args.e2e_worker:
        return _e2e_worker(args, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if not torch.cuda.is_available():
        print("kernels_bench needs a CUDA GPU (torch.cuda.is_available() is False here). The kernels' "
              "correctness tests run on the CPU: pytest tests/kernels (under TRITON_INTERPRET=1).",
              file=sys.stderr)
        return 2
    import kernels

    chosen = [k.strip() for k in args.kernels.split(",") if k.strip() and k.strip() != "none"]
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    op_kernels = list(kernels.KERNEL_OF_OP.values())  # the FP8 casts: benchmarks/fp8_cast_bench.py
    if set(chosen) - set(op_kernels) or set(providers) - set(PROVIDERS):
        p.error(f"kernels must be among {op_kernels}, providers among {list(PROVIDERS)}")
    return run(args, torch.device("cuda"))


def run(args: argparse.Namespace, dev) -> int:
    """The benchmark with parsed ``args`` on ``dev`` (CUDA; the tests smoke-run it on the CPU interpreter)."""
    import pandas as pd

    device = _Device(dev)
    chosen = [k.strip() for k in args.kernels.split(",") if k.strip() and k.strip() != "none"]
    providers = [x.strip() for x in args.providers.split(",") if x.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f} s] {msg}", flush=True)

    from torch import _dynamo

    _dynamo.config.cache_size_limit = max(64, _dynamo.config.cache_size_limit)
    ver = versions()
    common = {**ver, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    ceiling = setup.copy_ceiling_gb_per_s(args.quick, dev)
    log(f"{ver['gpu']}, torch {ver['torch']}, triton {ver['triton']}: copy ceiling {ceiling:,.0f} GB/s")
    rows: list[dict[str, Any]] = [{
        "kernel": "copy", "shape": f"{setup.COPY_BYTES // 2**20} MiB", "mode": "copy", "provider": "torch",
        "sweep": "ceiling", "gb_per_s": ceiling, "pct_of_copy_ceiling": 100.0, "copy_ceiling_gb_per_s": ceiling,
        "median_ms": 2 * setup.COPY_BYTES / ceiling / 1e6, "dtype": "bfloat16", **common}]
    models = [setup.MAIN_MODEL] if args.quick else list(setup.MODELS)
    shapes = [x.strip() for x in (args.shapes or "").split(",") if x.strip()]
    for case in _cases(models, dev):
        if case.kernel in chosen and (not shapes or any(x in case.shape_label for x in shapes)):
            rows += _bench_case(case, providers, args, ceiling, common, log, device)
    df = pd.DataFrame(rows)
    best = _best_launch(df)
    main_best = _main_launch(best, args.launch)
    if args.e2e and (args.e2e_isolation == "process" or (args.e2e_isolation == "auto" and device.cuda)):
        log(f"end to end {setup.E2E_PRESET} {setup.BATCH}x{setup.SEQ}, one process per variant, Triton launch "
            f"parameters {main_best or 'defaults'}")
        rows += _bench_e2e_isolated(main_best, args, common, log)
        df = pd.DataFrame(rows)
    elif args.e2e:
        log(f"end to end {setup.E2E_PRESET} {setup.BATCH}x{setup.SEQ}, Triton launch parameters "
            f"{main_best or 'defaults'}")
        rows += _bench_e2e(main_best, args, common, log, device)
        df = pd.DataFrame(rows)
    prof = _write_e2e_steps(rows, common, out, log)
    df = df.reindex(columns=CSV_COLUMNS)
    df.to_csv(out / "kernels_bench.csv", index=False)
    (out / "best_launch.json").write_text(json.dumps(
        {"by_shape": best, "loongforge.compute_domain.kernels": main_best}, indent=1, sort_keys=True))
    if args.kernel_sweep:
        sweep = df[(df["provider"] == "triton") & (df["mode"] == "full") & df["shape"].str.startswith(setup.MAIN_MODEL)]
        Path(args.kernel_sweep).parent.mkdir(parents=True, exist_ok=True)
        sweep.dropna(axis=1, how="all").to_csv(args.kernel_sweep, index=False)
    table, goals = _summary(df, ceiling)
    (out / "summary.md").write_text(table + "\n" + "\n".join(f"- {g}" for g in goals) + "\n")
    print()
    print(table)
    for g in goals:
        print(g)
    print(f"\nwrote {out / 'kernels_bench.csv'} ({len(df)} rows), best_launch.json, summary.md"
          f"{', e2e_profile.csv' if prof else ''} "
          f"in {time.time() - t_start:.0f} s")
    return 0


def _main_launch(best: dict[str, dict[str, dict[str, int]]], launch_file: str | None) -> dict[str, dict[str, int]]:
    """The end-to-end step's launch parameters: the main model's shapes' best, the fused residual add's RMSNorm
    last (so its best wins: the fused-add norms are all but one of the step's norms when the adds are fused); an
    earlier run's file (``--launch``) fills in the kernels this run did not sweep."""
    main_best: dict[str, dict[str, int]] = {}
    for shape, per_kernel in sorted(best.items(), key=lambda kv: "fused add" in kv[0]):
        if shape.startswith(setup.MAIN_MODEL):
            main_best.update(per_kernel)
    if launch_file:
        earlier = json.loads(Path(launch_file).read_text())["loongforge.compute_domain.kernels"]
        main_best = {**earlier, **main_best}
    return main_best


def _write_e2e_steps(rows: list[dict[str, Any]], common: dict[str, str], out: Path, log) -> bool:
    """The end-to-end variants' timed steps with their rounds (``e2e_steps.csv``, for paired comparisons) and
    their profiles (``e2e_profile.csv``, one row per variant and kernel), each logged in short; returns whether a
    profile was written."""
    import pandas as pd

    steps = [{"provider": r["provider"], **k, **common} for r in rows if r.get("steps") for k in r["steps"]]
    if steps:
        pd.DataFrame(steps).to_csv(out / "e2e_steps.csv", index=False)
        for r in rows:
            if r.get("note", "").startswith("paired"):
                log(f"  {r['provider']}: {r['note']}")
    prof = [{"provider": r["provider"], "rank": i + 1, **k, **common}
            for r in rows if r.get("profile") for i, k in enumerate(r["profile"])]
    if prof:
        pd.DataFrame(prof).to_csv(out / "e2e_profile.csv", index=False)
        for provider, g in pd.DataFrame(prof).groupby("provider", sort=False):
            log(f"  profile {provider}: " + "; ".join(f"{n[:40]} {ms:.2f} ms" for n, ms in
                                                     zip(g["name"][:4], g["self_ms_per_step"][:4])))
    return bool(prof)


def _e2e_worker(args: argparse.Namespace, dev) -> int:
    """One end-to-end variant in this process; prints ``E2E_ROWS <json>`` (the parent adds versions)."""
    ops_name, mode = args.e2e_worker.split(":")
    if args.e2e_shape:
        preset, b, t = args.e2e_shape.split(":")
        setup.E2E_PRESET, setup.BATCH, setup.SEQ = preset, int(b), int(t)
    best = json.loads(args.launch_json) if args.launch_json else {}
    rows = _bench_e2e(best, args, {}, lambda msg: print(msg, flush=True), _Device(dev), variants=[(ops_name, mode)])
    if rows and rows[0].get("error"):
        print(rows[0]["error"], file=sys.stderr)
        return 1
    print("E2E_ROWS " + json.dumps(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
