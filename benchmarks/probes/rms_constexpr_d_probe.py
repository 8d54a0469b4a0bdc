"""The RMSNorm forward with the row length a constexpr, against the same kernel with it a runtime argument and
against torch.compile (GPU run AO; a record of what ran, not a test).

Run AN ran our forward at inductor's exact launch (2 rows x 2,048 columns, 16 warps, 1 stage, two passes) and it
was 8% slower than inductor's kernel, whose code differs from ours mainly in that the row length (loop bound,
divisor, stride) is a literal. Here the kernel of 1a5e719 (``rms_fwd_runtime_d_kernel.py``, D a runtime argument)
and kernels.rmsnorm's (D a constexpr) run the same launches, paired per round with torch.compile, in the cases
kernels.bench times (fp32 in with fp32 or bf16 out, and the fused add: bf16 branch + fp32 stream, bf16 out) at
hidden 2,048 and 4,096:

1. the launches found best so far, with each kernel;
2. a screen of the constexpr kernel (one timing each): rows {1, 2} x column chunk {512, 1,024, 2,048, D} x warps
   {4, 8, 16} (and 2 at a whole row), two passes where the chunk is narrower than D, and both at a whole row;
   its 3 fastest join the paired rounds.

Usage: python benchmarks/probes/rms_constexpr_d_probe.py OUT_CSV
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.bench import do_bench  # noqa: E402
from kernels.rmsnorm import _rmsnorm_fwd_kernel as after_kernel  # noqa: E402
from rms_fwd_runtime_d_kernel import _rmsnorm_fwd_kernel as before_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import Recorder, context, timed_rounds, timing_row  # noqa: E402

ROUNDS = 8
TOP = 3
# (rows, chunk, warps, two passes): runs AG and AM (fp32), AG and launch_rms_H (bf16 out, fused add)
KNOWN = {("fp32", 2048): [(1, 1024, 8, True), (2, 1024, 16, True)],
         ("fp32", 4096): [(1, 2048, 16, True)],
         ("bf16 out", 2048): [(2, 2048, 8, False), (1, 2048, 2, False)],
         ("bf16 out", 4096): [(1, 4096, 8, False)],
         ("fused add", 2048): [(2, 2048, 8, False), (1, 2048, 2, False)],
         ("fused add", 4096): [(1, 4096, 16, False)]}


def _case(kind: str, D: int, dev):
    M = 8 * 2048
    x = torch.randn(M, D, device=dev, dtype=torch.bfloat16 if kind == "fused add" else torch.float32)
    r = torch.randn(M, D, device=dev) if kind == "fused add" else None
    w = torch.randn(D, device=dev)
    out_dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
    s = torch.empty(M, D, device=dev) if r is not None else y
    if r is None:
        ref = torch.compile(lambda x, w: ops.rms_norm_torch(x, w, 1e-5, out_dtype), dynamic=False)
        args = (x, w)
        want = ref(*args)
    else:
        ref = torch.compile(lambda x, r, w: ops.rms_norm_add_torch(x, r, w, 1e-5, out_dtype), dynamic=False)
        args = (x, r, w)
        want = ref(*args)[0]
    rr = r if r is not None else x

    def launch(kernel, br, chunk, nw, two_pass):
        common = dict(HAS_RESIDUAL=r is not None, BLOCK_ROWS=br, BLOCK_D=chunk, TWO_PASS=two_pass,
                      EVEN=r is None, num_warps=nw, num_stages=2)
        if kernel is before_kernel:
            return lambda: kernel[(M // br,)](x, rr, w, y, s, rstd, M, D, D, D, D, D, 1e-5, **common)
        return lambda: kernel[(M // br,)](x, rr, w, y, s, rstd, M, D, D, D, D, 1e-5, D=D, **common)

    def check():
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        torch.testing.assert_close(y, want, **tol)

    nbytes = M * D * (4 + y.element_size()) if r is None else 12 * M * D
    return (lambda: ref(*args)), launch, check, y, nbytes


def _name(br, chunk, nw, two_pass):
    return f"r{br} c{chunk} w{nw} {'2-pass' if two_pass else '1-pass'}"


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(out_csv)

    for (kind, D), known in KNOWN.items():
        label = f"{kind}, hidden {D}"
        ref, launch, check, y, nbytes = _case(kind, D, dev)
        screen = {}
        for br in (1, 2):
            for chunk in sorted({512, 1024, 2048, D}):
                for nw in (4, 8, 16) + ((2,) if chunk == D else ()):
                    if br * chunk // (32 * nw) < 4:  # fewer than 4 elements a thread: no 16-byte access
                        continue
                    for two_pass in sorted({chunk < D, True}):
                        call = launch(after_kernel, br, chunk, nw, two_pass)
                        y.fill_(float("nan"))
                        call()
                        check()
                        ms = do_bench(call, False)
                        screen[_name(br, chunk, nw, two_pass)] = (ms[0], call)
                        rec.rows.append(timing_row({"case": label, "stage": "screen"},
                                                   "constexpr D " + _name(br, chunk, nw, two_pass), 0, ms, nbytes,
                                                   ceiling, base))
        calls = {"torch.compile": ref}
        for cfg in known:
            calls[f"runtime D {_name(*cfg)}"] = launch(before_kernel, *cfg)
            calls[f"constexpr D {_name(*cfg)}"] = launch(after_kernel, *cfg)
        for name in sorted(screen, key=lambda k: screen[k][0])[:TOP]:
            calls.setdefault(f"constexpr D {name}", screen[name][1])
        for name, call in calls.items():
            if name != "torch.compile":
                y.fill_(float("nan"))
                call()
                check()
        case_rows = timed_rounds(calls, ROUNDS, {"case": label, "stage": "paired"}, nbytes, ceiling, base)
        rec.add(label, case_rows)
        del ref, launch, check, y, screen, calls
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    rec.print_tables(34)


if __name__ == "__main__":
    main()
