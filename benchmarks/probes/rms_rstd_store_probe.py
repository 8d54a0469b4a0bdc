"""The rstd store of the RMSNorm forward, in training and in inference (GPU run AQ; a record, not a test).

Run AP: at inductor's launch, a copy of our forward without the rstd store is level with torch.compile's inference
forward (0.993-1.000x); with it, 0.973-0.983x in bf16 out. Inductor's inference graph stores no rstd; its training
graph saves it for the backward (the partitioner does not recompute a reduction whose output is 4x smaller), as
ours does. Here, for each case:

- torch.compile of the reference, inference (inputs without grad) and training (inputs requiring grad, forward
  only: what kernels.bench's ``fwd`` mode times);
- kernels.rms_norm_triton as it runs in training (inputs requiring grad), at the launch given;
- a copy of our forward (two passes, unmasked) with rstd stored in five ways: not at all; between the passes as a
  1-D vector (as kernels.rmsnorm) or as a (rows, 1) column (as inductor); after the second pass, 1-D or column.

8 interleaved rounds, paired per round with torch.compile's training forward. The code inductor generates for the
training forward is written next to the CSV.

Usage: python benchmarks/probes/rms_rstd_store_probe.py OUT_CSV INDUCTOR_CODE_TXT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from workbench import ops  # noqa: E402
from paired import Recorder, context, timed_rounds  # noqa: E402

ROUNDS = 8
# (hidden, out dtype, rows, chunk, warps): inductor's launches (run AN) and the best of run AO
CASES = [(2048, torch.float32, 2, 2048, 16), (2048, torch.float32, 1, 1024, 8),
         (2048, torch.bfloat16, 1, 1024, 8), (4096, torch.bfloat16, 1, 2048, 16)]
STORES = {0: "no rstd", 1: "rstd between, 1-D", 2: "rstd between, column", 3: "rstd after, 1-D",
          4: "rstd after, column"}


@triton.jit
def _fwd_store(X, W, Y, RSTD, eps, D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
               STORE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, D, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        x = tl.load(X + rows[:, None] * D + cols[None, :], eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / D + eps)
    rstd2 = 1.0 / tl.sqrt(tl.sum(acc, axis=1)[:, None] / D + eps)
    if STORE == 1:
        tl.store(RSTD + rows, rstd)
    if STORE == 2:
        tl.store(RSTD + rows[:, None], rstd2)
    for c0 in range(0, D, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        x = tl.load(X + rows[:, None] * D + cols[None, :], eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y + rows[:, None] * D + cols[None, :], (x * rstd2 * w[None, :]).to(Y.dtype.element_ty))
    if STORE == 3:
        tl.store(RSTD + rows, rstd)
    if STORE == 4:
        tl.store(RSTD + rows[:, None], rstd2)


def main() -> None:
    out_csv, code_txt = Path(sys.argv[1]), Path(sys.argv[2])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(out_csv)
    codes = []
    for D, out_dtype, br, chunk, nw in CASES:
        M = 8 * 2048
        x = torch.randn(8, 2048, D, device=dev)
        xg = x.clone().requires_grad_(True)
        w = torch.randn(D, device=dev)
        wg = w.clone().requires_grad_(True)
        y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
        fn = lambda x, w, o=out_dtype: ops.rms_norm_torch(x, w, 1e-5, o)  # noqa: E731
        infer, train = torch.compile(fn, dynamic=False), torch.compile(fn, dynamic=False)
        want = infer(x, w).reshape(M, D)
        train(xg, wg)
        if not codes or (D, out_dtype) not in [c[0] for c in codes]:
            from torch._inductor.utils import run_and_get_code

            torch._dynamo.reset()
            train = torch.compile(fn, dynamic=False)
            _, code = run_and_get_code(lambda: train(xg, wg).sum().backward())
            codes.append(((D, out_dtype), "\n\n# ---- next module\n\n".join(code)))
        launch = {"rmsnorm": {"block_rows": br, "fwd_block_size": chunk, "num_warps": nw, "num_stages": 1}}
        nbytes = M * D * (4 + y.element_size())
        calls = {"torch.compile": lambda: train(xg, wg),  # its training forward, paired with below
                 "torch.compile inference fwd": lambda: infer(x, w)}

        def ours():
            with kernels.using(launch):
                return kernels.rms_norm_triton(xg, wg, 1e-5, out_dtype)

        calls["kernels.rms_norm_triton, training"] = ours
        x2 = x.view(M, D)
        for store, name in STORES.items():
            calls[f"copy: {name}"] = (lambda store=store: _fwd_store[(M // br,)](
                x2, w, y, rstd, 1e-5, D=D, BLOCK_ROWS=br, BLOCK_D=chunk, STORE=store, num_warps=nw, num_stages=1))
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        torch.testing.assert_close(ours().detach().reshape(M, D), want, **tol)
        for name, call in calls.items():
            if name.startswith("copy"):
                y.fill_(float("nan"))
                call()
                torch.testing.assert_close(y, want, **tol)
        label = f"fp32 in, {str(out_dtype)[6:]} out, hidden {D}, launch r{br} c{chunk} w{nw} s1"
        case_rows = timed_rounds(calls, ROUNDS, {"case": label}, nbytes, ceiling, base)
        rec.add(label, case_rows)
        del x, xg, y, infer, train, calls
        torch.cuda.empty_cache()
    code_txt.write_text("\n\n".join(f"# ======== hidden {k[0]}, {k[1]} out\n\n{c}" for k, c in codes))
    print(f"copy ceiling {ceiling:.0f} GB/s; 'torch.compile' below is its training forward")
    rec.print_tables(36)


if __name__ == "__main__":
    main()
