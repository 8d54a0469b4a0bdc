"""The RMSNorm forward's registry defaults after run AT, through the model's call (GPU run AU; a record, not a test).

Run AT timed launches directly. Here every variant goes through kernels.rms_norm_triton / rms_norm_add_triton as
the model calls them (inputs requiring grad), with the launch set by ``kernels.using``, in 8 interleaved rounds
paired with torch.compile's training forward, for fp32 in and out, fp32 in and bf16 out, and the fused add:

- hidden 1,024 and 1,536: the new defaults (one pass, a row a program, 4 warps) and the ones before (1,024: 4 rows,
  8 warps; 1,536: two passes over chunks of 1,024, 8 warps), pinned explicitly;
- hidden 2,048: the defaults, and ``fwd_passes: 2`` over the whole row at inductor's launch (2 rows, 16 warps).

With --small (GPU run AY), the defaults below a tile of 1,024 columns, never measured before: hidden 256 and 512
(several rows a program) and 768 (one row of 4 warps, the rule of run AT reaching down), each against a few other
row and warp counts.

Usage: python benchmarks/probes/rms_defaults_probe.py OUT_CSV [--small]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from paired import Recorder, context, rms_training_case, timed_rounds  # noqa: E402

ROUNDS = 8
KINDS = ("fp32", "bf16 out", "fused add")
LAUNCHES = {  # hidden -> variant -> rmsnorm launch parameters ({} = the registry's defaults)
    1024: {"defaults (r1 w4)": {}, "before (r4 w8)": {"block_rows": 4, "num_warps": 8}},
    1536: {"defaults (r1 w4)": {}, "before (2 passes c1024 w8)": {"fwd_block_size": 1024, "num_warps": 8}},
    2048: {"defaults (2 passes c1024 w8)": {},
           "fwd_passes 2, whole row, r2 w16": {"fwd_passes": 2, "fwd_block_size": 2048, "block_rows": 2,
                                               "num_warps": 16}},
}
LAUNCHES_SMALL = {
    256: {"defaults": {}, **{f"r{r} w{w}": {"block_rows": r, "num_warps": w}
                             for r, w in ((1, 2), (2, 2), (4, 4), (8, 4), (16, 4))}},
    512: {"defaults": {}, **{f"r{r} w{w}": {"block_rows": r, "num_warps": w}
                             for r, w in ((1, 2), (1, 4), (2, 4), (4, 4), (4, 8))}},
    768: {"defaults": {}, **{f"r{r} w{w}": {"block_rows": r, "num_warps": w}
                             for r, w in ((1, 2), (1, 8), (2, 4), (2, 8), (4, 8))}},
}


def main() -> None:
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(Path(sys.argv[1]))
    for D, launches in (LAUNCHES_SMALL if "--small" in sys.argv else LAUNCHES).items():
        for kind in KINDS:
            c = rms_training_case(kind, D, dev)

            def ours(launch, c=c):
                def call():
                    with kernels.using({"rmsnorm": launch}):
                        return c.triton_fn(*c.args, 1e-5, c.out_dtype)
                return call

            calls = {"torch.compile": lambda c=c: c.ref(*c.args), **{name: ours(p) for name, p in launches.items()}}
            tol = dict(rtol=1e-5, atol=1e-5) if c.out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
            resolved = {}
            for name, launch in launches.items():
                with kernels.using({"rmsnorm": launch}):
                    out = c.triton_fn(*c.args, 1e-5, c.out_dtype)
                    resolved[name] = kernels.launch_record()[-1]
                torch.testing.assert_close((out[0] if c.add else out).detach().reshape(c.M, D), c.want, **tol)
            label = f"{kind}, hidden {D}, training forward"
            case_rows = timed_rounds(calls, ROUNDS, {"case": label}, c.nbytes, ceiling, base)
            for row in case_rows:  # the launch each variant resolved to, defaults included
                r = resolved.get(row["variant"], {})
                row["launch"] = " ".join(f"{k}={r[k]}" for k in ("block_rows", "fwd_block_size", "num_warps",
                                                                  "fwd_passes", "num_stages") if k in r)
            rec.add(label, case_rows)
            del c, calls
            torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    rec.print_tables(34)

if __name__ == "__main__":
    main()
