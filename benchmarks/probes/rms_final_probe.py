"""The RMSNorm forward of this commit (D a constexpr, rstd stored after the second pass) against that of 1a5e719
and against torch.compile's training forward (GPU run AR; a record of what ran, not a test).

The cases of kernels.bench (fp32 in and out; fp32 in, bf16 out; the fused add: bf16 branch + fp32 stream, bf16
out) at hidden 2,048 and 4,096, inputs requiring grad as in its ``fwd`` mode. Variants, 8 interleaved rounds,
paired per round with torch.compile's training forward (which saves rstd for the backward, as ours does):

- kernels.rms_norm_triton / rms_norm_add_triton as the model calls them, at the registry's defaults and at the
  launches found best (runs AG, AM, AO, AQ);
- the kernel of 1a5e719 (``rms_fwd_runtime_d_kernel.py``) at the same best launch, launched directly.

Usage: python benchmarks/probes/rms_final_probe.py OUT_CSV
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from rms_fwd_runtime_d_kernel import _rmsnorm_fwd_kernel as before_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import context, paired_lines, timed_rounds, write_csv  # noqa: E402

ROUNDS = 8
# best launch per case: (block_rows, fwd_block_size, num_warps)
BEST = {("fp32", 2048): (1, 1024, 8), ("fp32", 4096): (1, 2048, 16), ("bf16 out", 2048): (1, 1024, 8),
        ("bf16 out", 4096): (1, 2048, 16), ("fused add", 2048): (1, 2048, 16), ("fused add", 4096): (1, 2048, 16)}


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rows: list[dict] = []
    tables = []
    for (kind, D), (br, chunk, nw) in BEST.items():
        M = 8 * 2048
        add = kind == "fused add"
        x = torch.randn(8, 2048, D, device=dev, dtype=torch.bfloat16 if add else torch.float32, requires_grad=True)
        r = torch.randn(8, 2048, D, device=dev, requires_grad=True) if add else None
        w = torch.randn(D, device=dev, requires_grad=True)
        out_dtype = torch.float32 if kind == "fp32" else torch.bfloat16
        if add:
            ref = torch.compile(lambda x, r, w: ops.rms_norm_add_torch(x, r, w, 1e-5, out_dtype), dynamic=False)
            args = (x, r, w)
            triton_fn = kernels.rms_norm_add_triton
        else:
            ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5, out_dtype), dynamic=False)
            args = (x, w)
            triton_fn = kernels.rms_norm_triton
        want = ref(*args)
        want = (want[0] if add else want).detach().reshape(M, D)
        best = {"rmsnorm": {"block_rows": br, "fwd_block_size": chunk, "num_warps": nw}}

        def ours(cfg):
            def call():
                with kernels.using(cfg):
                    return triton_fn(*args, 1e-5, out_dtype)
            return call

        x2 = x.detach().reshape(M, D)
        r2 = r.detach().reshape(M, D) if add else x2
        y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
        s = torch.empty(M, D, device=dev) if add else y
        wd = w.detach()

        def before():
            before_kernel[(M // br,)](x2, r2, wd, y, s, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=add, BLOCK_ROWS=br,
                                      BLOCK_D=chunk, TWO_PASS=chunk < D, EVEN=not add, num_warps=nw, num_stages=2)

        calls = {"torch.compile": lambda: ref(*args),
                 "ours, registry defaults": ours({"rmsnorm": {}}),
                 f"ours r{br} c{chunk} w{nw}": ours(best),
                 f"1a5e719 r{br} c{chunk} w{nw}": before}
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for name, call in calls.items():
            if name.startswith("ours"):
                out = call()
                torch.testing.assert_close((out[0] if add else out).detach().reshape(M, D), want, **tol)
        y.fill_(float("nan"))
        before()
        torch.testing.assert_close(y, want, **tol)
        nbytes = 12 * M * D if add else M * D * (4 + y.element_size())
        label = f"{kind}, hidden {D}, training forward"
        case_rows = timed_rounds(calls, ROUNDS, {"case": label}, nbytes, ceiling, base)
        rows += case_rows
        write_csv(out_csv, rows)
        tables.append((label, case_rows))
        del x, r, w, ref, args, calls, y, s, rstd
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for label, case_rows in tables:
        print(label)
        print("\n".join(paired_lines(case_rows, 30)))


if __name__ == "__main__":
    main()
