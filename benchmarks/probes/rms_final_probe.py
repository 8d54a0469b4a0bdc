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
from paired import Recorder, context, rms_training_case, timed_rounds  # noqa: E402

ROUNDS = 8
# best launch per case: (block_rows, fwd_block_size, num_warps)
BEST = {("fp32", 2048): (1, 1024, 8), ("fp32", 4096): (1, 2048, 16), ("bf16 out", 2048): (1, 1024, 8),
        ("bf16 out", 4096): (1, 2048, 16), ("fused add", 2048): (1, 2048, 16), ("fused add", 4096): (1, 2048, 16)}


def main() -> None:
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(Path(sys.argv[1]))
    for (kind, D), (br, chunk, nw) in BEST.items():
        c = rms_training_case(kind, D, dev)
        M, add, out_dtype = c.M, c.add, c.out_dtype
        best = {"rmsnorm": {"block_rows": br, "fwd_block_size": chunk, "num_warps": nw}}

        def ours(cfg, c=c):
            def call():
                with kernels.using(cfg):
                    return c.triton_fn(*c.args, 1e-5, c.out_dtype)
            return call

        x2 = c.x.detach().reshape(M, D)
        r2 = c.r.detach().reshape(M, D) if add else x2
        y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
        s = torch.empty(M, D, device=dev) if add else y
        wd = c.w.detach()

        def before():
            before_kernel[(M // br,)](x2, r2, wd, y, s, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=add, BLOCK_ROWS=br,
                                      BLOCK_D=chunk, TWO_PASS=chunk < D, EVEN=not add, num_warps=nw, num_stages=2)

        calls = {"torch.compile": lambda c=c: c.ref(*c.args),
                 "ours, registry defaults": ours({"rmsnorm": {}}),
                 f"ours r{br} c{chunk} w{nw}": ours(best),
                 f"1a5e719 r{br} c{chunk} w{nw}": before}
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for name, call in calls.items():
            if name.startswith("ours"):
                out = call()
                torch.testing.assert_close((out[0] if add else out).detach().reshape(M, D), c.want, **tol)
        y.fill_(float("nan"))
        before()
        torch.testing.assert_close(y, c.want, **tol)
        label = f"{kind}, hidden {D}, training forward"
        rec.add(label, timed_rounds(calls, ROUNDS, {"case": label}, c.nbytes, ceiling, base))
        del c, calls
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    rec.print_tables(30)

if __name__ == "__main__":
    main()
