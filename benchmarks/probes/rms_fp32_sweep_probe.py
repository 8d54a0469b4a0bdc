"""Which launch of our RMSNorm forward matches inductor's in fp32? (GPU run AM; a record of what ran, not a test.)

Run AL showed inductor's kernel for the fp32 forward is, like ours, two passes over column chunks (evict_last,
then evict_first), and that at hidden 2,048 it is within 0.4% of the fastest kernel moving the same bytes, at
4,096 faster than all of them. Ours trailed by 0.9-1.4% at 2,048 over 5 launches, all at Triton's default
num_stages (3). This probe

1. reads the configuration inductor's autotuner picked (the ``.best_config`` file it writes next to the kernel in
   its cache, TORCHINDUCTOR_CACHE_DIR);
2. screens kernels.rmsnorm's forward (unmasked, as the launcher runs it without a residual) over block rows
   {1, 2} x column chunk {256, 512, 1,024, 2,048} x warps {4, 8, 16} x num_stages {1, 2, 3}, one timing each;
3. times the 6 fastest of the screen, the registry's default and the fastest no-arithmetic mover of run AL
   (Triton, 1,024 elements, 8 warps) against torch.compile in 8 interleaved rounds, paired per round.

At hidden 2,048 and 4,096, fp32 in and out, 8 x 2,048 rows.

Usage: python benchmarks/probes/rms_fp32_sweep_probe.py OUT_CSV
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceiling_probe import _traffic  # noqa: E402
from kernels import registry  # noqa: E402
from kernels.bench import do_bench  # noqa: E402
from kernels.rmsnorm import _rmsnorm_fwd_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import context, paired_lines, timed_rounds, timing_row, write_csv  # noqa: E402

ROUNDS = 8
TOP = 6


def _inductor_picks() -> list[str]:
    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    out = []
    for p in sorted(root.rglob("*.best_config")):
        src = next(iter(p.parent.glob("*.py")), None)
        name = ""
        if src is not None:
            name = next((ln.split("(")[0][4:] for ln in src.read_text().splitlines() if ln.startswith("def triton")),
                        "")
        out.append(f"{name or p.name}: {json.loads(p.read_text())}")
    return out


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rows: list[dict] = []
    tables = []
    for D in (2048, 4096):
        x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
        M = x.numel() // D
        x2 = x.view(M, D)
        y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)
        fy = torch.empty_like(x2)
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
        want = ref(x, w).reshape(M, D)
        torch.cuda.synchronize()
        picks = _inductor_picks()
        print(f"hidden {D}: inductor's picks so far: {picks}")
        nbytes = 2 * M * D * 4

        def ours(br, chunk, nw, ns):
            return lambda: _rmsnorm_fwd_kernel[(M // br,)](
                x2, x2, w, y, y, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=False, BLOCK_ROWS=br, BLOCK_D=chunk,
                TWO_PASS=chunk < D, EVEN=True, num_warps=nw, num_stages=ns)

        screen = {}
        for br in (1, 2):
            for chunk in sorted({256, 512, 1024, 2048, D}):
                for nw in (4, 8, 16):
                    if br * chunk // (32 * nw) < 4:  # fewer than 4 elements a thread: no 16-byte access
                        continue
                    for ns in (1, 2, 3):
                        name = f"r{br} c{chunk} w{nw} s{ns}"
                        call = ours(br, chunk, nw, ns)
                        y.fill_(float("nan"))
                        call()
                        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
                        ms = do_bench(call, False)
                        screen[name] = (ms[0], call)
                        rows.append(timing_row({"hidden": D, "stage": "screen"}, name, 0, ms, nbytes, ceiling, base,
                                               {"inductor_picks": ""}))
        p = registry.RMSNORM.defaults({"rows": M, "hidden": D})
        final = {"torch.compile": lambda: ref(x, w)}
        for name in sorted(screen, key=lambda k: screen[k][0])[:TOP]:
            final[f"ours {name}"] = screen[name][1]
        chunk = min(p["fwd_block_size"], p["block_size"])
        final[f"ours default r{p['block_rows']} c{chunk} w{p['num_warps']} s{p['num_stages']}"] = ours(
            p["block_rows"], chunk, p["num_warps"], p["num_stages"])
        n = x2.numel()
        final["floor: triton b1024 w8"] = lambda: _traffic[(n // 1024,)](x2, x2, x2, fy, fy, NIN=1, NOUT=1,
                                                                          BLOCK=1024, num_warps=8)
        case_rows = timed_rounds(final, ROUNDS, {"hidden": D, "stage": "paired"}, nbytes, ceiling, base,
                                 {"inductor_picks": " | ".join(picks)})
        rows += case_rows
        write_csv(out_csv, rows)
        tables.append((D, sorted(screen.items(), key=lambda kv: kv[1][0])[:TOP], case_rows))
        del x, x2, y, fy, ref, screen, final
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for line in _inductor_picks():
        print(f"inductor: {line}")
    for D, top, case_rows in tables:
        print(f"rmsnorm fp32 fwd, hidden {D}; screen top: " + ", ".join(f"{k} {v[0]:.4f}" for k, v in top))
        print("\n".join(paired_lines(case_rows, 36)))


if __name__ == "__main__":
    main()
