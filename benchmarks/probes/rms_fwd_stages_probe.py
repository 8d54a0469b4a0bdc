"""The two-pass fp32 RMSNorm forward over its launch space, num_stages 1 included (GPU run AE; a record of what
ran, not a test).

Run AD's profile showed inductor's kernel for the fp32 forward at hidden 2,048: 8,192 programs of 16 warps (two
rows each), 25 registers: the shape of kernels.rmsnorm's two-pass forward with fwd_block_size 1,024, block_rows 2,
num_warps 16, which ran 1.7% slower. Inductor's looped reductions use num_stages 1; the sweeps so far ran the
two-pass forward at 2 or 3 (software pipelining through shared memory). This probe times every combination of
chunk x rows x warps x stages once, then the four fastest and the one-pass default against torch.compile in 6
interleaved rounds (ratios paired per round). Kernel: benchmarks/probes/int32_index_probe.py's copy of the
forward, int64 offsets (as kernels.rmsnorm).

Usage: python benchmarks/probes/rms_fwd_stages_probe.py OUT_CSV
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from int32_index_probe import _rms_fwd  # noqa: E402
from paired import paired_lines, write_csv  # noqa: E402

from kernels.bench import copy_ceiling_gb_per_s, do_bench  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402


def main() -> None:
    out_csv = Path(sys.argv[1])
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows = []

    def add(D, variant, phase, r, ms):
        nbytes = 2 * 8 * 2048 * D * 4
        rows.append({"kernel": "rmsnorm", "shape": f"8x2048x{D}", "mode": "fwd", "dtype": "float32",
                     "variant": variant, "phase": phase, "round": r, "median_ms": ms[0], "p20_ms": ms[1],
                     "p80_ms": ms[2], "pct_of_copy_ceiling": 100 * nbytes / (ms[0] * 1e-3) / 1e9 / ceiling,
                     "copy_ceiling_gb_per_s": ceiling, "timestamp": stamp, "gpu": torch.cuda.get_device_name(),
                     **{k: ver[k] for k in ("torch", "triton", "cuda")}})

    for D in (2048, 4096):
        x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
        M = x.numel() // D
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5), dynamic=False)
        y, rstd = torch.empty(M, D, device=dev), torch.empty(M, device=dev)

        def launcher(br, chunk, nw, ns, x=x, w=w, y=y, rstd=rstd, M=M, D=D):
            def call():
                _rms_fwd[(triton.cdiv(M, br),)](x, w, y, rstd, M, D, 1e-5, BLOCK_ROWS=br, BLOCK_D=chunk or D,
                                                TWO_PASS=chunk is not None, I64=True, num_warps=nw, num_stages=ns)
            return call

        calls = {}
        for chunk in (512, 1024, 2048):
            if chunk >= D:
                continue
            for br in (1, 2):
                for nw in (8, 16):
                    for ns in (1, 2):
                        calls[f"two-pass c{chunk} r{br} w{nw} s{ns}"] = launcher(br, chunk, nw, ns)
        with torch.no_grad():
            for name, call in calls.items():
                call()
                torch.testing.assert_close(y, ref(x, w).reshape(M, D), rtol=1e-5, atol=1e-5)
                add(D, name, "sweep", 0, do_bench(call, False))
            sweep = sorted((r for r in rows if r["phase"] == "sweep" and r["shape"].endswith(f"x{D}")),
                           key=lambda r: r["median_ms"])
            paired = {"torch.compile": lambda x=x, w=w, ref=ref: ref(x, w),
                      "one-pass r2 w8": launcher(2, None, 8, 2)}
            paired.update({r["variant"]: calls[r["variant"]] for r in sweep[:4]})
            for rnd in range(6):
                for name in (list(paired) if rnd % 2 == 0 else list(reversed(paired))):
                    add(D, name, "paired", rnd, do_bench(paired[name], False))
        del x, y, rstd
        torch.cuda.empty_cache()
    write_csv(out_csv, rows)
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for D in (2048, 4096):
        sel = [r for r in rows if r["shape"].endswith(f"x{D}")]
        sw = sorted((r for r in sel if r["phase"] == "sweep"), key=lambda r: r["median_ms"])
        print(f"hidden {D}: sweep fastest: " + ", ".join(f"{r['variant']} {r['median_ms']:.4f}" for r in sw[:6]))
        print("\n".join(paired_lines([r for r in sel if r["phase"] == "paired"], 26)))


if __name__ == "__main__":
    main()
