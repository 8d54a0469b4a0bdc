"""The RMSNorm forward's registry defaults after run AT, through the model's call (GPU run AU; a record, not a test).

Run AT timed launches directly. Here every variant goes through kernels.rms_norm_triton / rms_norm_add_triton as
the model calls them (inputs requiring grad), with the launch set by ``kernels.using``, in 8 interleaved rounds
paired with torch.compile's training forward, for fp32 in and out, fp32 in and bf16 out, and the fused add:

- hidden 1,024 and 1,536: the new defaults (one pass, a row a program, 4 warps) and the ones before (1,024: 4 rows,
  8 warps; 1,536: two passes over chunks of 1,024, 8 warps), pinned explicitly;
- hidden 2,048: the defaults, and ``fwd_passes: 2`` over the whole row at inductor's launch (2 rows, 16 warps).

Usage: python benchmarks/probes/rms_defaults_probe.py OUT_CSV
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from workbench import ops  # noqa: E402
from paired import context, paired_lines, timed_rounds, write_csv  # noqa: E402

ROUNDS = 8
KINDS = ("fp32", "bf16 out", "fused add")
LAUNCHES = {  # hidden -> variant -> rmsnorm launch parameters ({} = the registry's defaults)
    1024: {"defaults (r1 w4)": {}, "before (r4 w8)": {"block_rows": 4, "num_warps": 8}},
    1536: {"defaults (r1 w4)": {}, "before (2 passes c1024 w8)": {"fwd_block_size": 1024, "num_warps": 8}},
    2048: {"defaults (2 passes c1024 w8)": {},
           "fwd_passes 2, whole row, r2 w16": {"fwd_passes": 2, "fwd_block_size": 2048, "block_rows": 2,
                                               "num_warps": 16}},
}


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rows: list[dict] = []
    tables = []
    for D, launches in LAUNCHES.items():
        for kind in KINDS:
            M = 8 * 2048
            add = kind == "fused add"
            x = torch.randn(8, 2048, D, device=dev, dtype=torch.bfloat16 if add else torch.float32,
                            requires_grad=True)
            r = torch.randn(8, 2048, D, device=dev, requires_grad=True) if add else None
            w = torch.randn(D, device=dev, requires_grad=True)
            out_dtype = torch.float32 if kind == "fp32" else torch.bfloat16
            if add:
                ref = torch.compile(lambda x, r, w: ops.rms_norm_add_torch(x, r, w, 1e-5, out_dtype), dynamic=False)
                args, triton_fn = (x, r, w), kernels.rms_norm_add_triton
            else:
                ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5, out_dtype), dynamic=False)
                args, triton_fn = (x, w), kernels.rms_norm_triton
            want = ref(*args)
            want = (want[0] if add else want).detach().reshape(M, D)

            def ours(launch):
                def call():
                    with kernels.using({"rmsnorm": launch}):
                        return triton_fn(*args, 1e-5, out_dtype)
                return call

            calls = {"torch.compile": lambda: ref(*args), **{name: ours(p) for name, p in launches.items()}}
            tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
            resolved = {}
            for name, launch in launches.items():
                with kernels.using({"rmsnorm": launch}):
                    out = triton_fn(*args, 1e-5, out_dtype)
                    resolved[name] = kernels.launch_record()[-1]
                torch.testing.assert_close((out[0] if add else out).detach().reshape(M, D), want, **tol)
            nbytes = 12 * M * D if add else M * D * (4 + out_dtype.itemsize)
            label = f"{kind}, hidden {D}, training forward"
            case_rows = timed_rounds(calls, ROUNDS, {"case": label}, nbytes, ceiling, base)
            for row in case_rows:  # the launch each variant resolved to, defaults included
                rec = resolved.get(row["variant"], {})
                row["launch"] = " ".join(f"{k}={rec[k]}" for k in ("block_rows", "fwd_block_size", "num_warps",
                                                                    "fwd_passes", "num_stages") if k in rec)
            rows += case_rows
            write_csv(out_csv, rows)
            tables.append((label, case_rows))
            torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for label, case_rows in tables:
        print(label)
        print("\n".join(paired_lines(case_rows, 34)))


if __name__ == "__main__":
    main()
