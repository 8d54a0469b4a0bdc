"""The one-pass RMSNorm forward's rstd store, and two passes over the whole row (GPU run AT; a record, not a test).

Run AQ moved the two-pass forward's rstd store after its second pass (bf16 out at 4,096: 0.993x -> 1.002x
torch.compile's training forward). The one-pass branch, which the registry's defaults use below a row of 2,048 and
the tuner may pick at any size, still stores rstd between the row's load and its store: not measured. Also not
measured beyond fp32: two passes over the whole row (inductor's shape, fwd_block_size = the row, TWO_PASS forced),
which the launch space cannot express.

For each case (fp32 in and out; fp32 in, bf16 out; the fused add: bf16 branch + fp32 stream, bf16 out) at hidden
1,024, 1,536 (masked) and 2,048, inputs requiring grad, 8 interleaved rounds paired with torch.compile's training
forward:

- kernels.rms_norm_triton / rms_norm_add_triton as the model calls them, at the registry's defaults;
- this commit's ``_rmsnorm_fwd_kernel``, launched directly, one pass at each launch of ``ONE_PASS``;
- the same kernel with the one-pass rstd store moved after the y store ("rstd last"): built from kernels/rmsnorm.py's
  source by moving that one line (``_rstd_last_source``), so the two differ in nothing else;
- at 2,048, the kernel with TWO_PASS forced over one chunk of the whole row, at the launches of ``WHOLE_ROW``.

Usage: python benchmarks/probes/rms_one_pass_rstd_probe.py OUT_CSV
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from kernels.rmsnorm import _rmsnorm_fwd_kernel as current_kernel  # noqa: E402
from paired import Recorder, context, rms_training_case, timed_rounds  # noqa: E402

ROUNDS = 8
HIDDEN = (1024, 1536, 2048)
KINDS = ("fp32", "bf16 out", "fused add")
# (block_rows, num_warps) of the one-pass launches per hidden size; the first is the registry's default below 2,048
ONE_PASS = {1024: ((4, 8), (2, 4), (1, 4)), 1536: ((2, 8), (1, 8), (1, 4)), 2048: ((1, 16), (1, 8), (2, 16))}
WHOLE_ROW = ((1, 8), (2, 16))  # inductor's launch at 2,048 (run AN): 2 rows, 16 warps
STORE_LINE = "        _store(RSTD + rows, rstd, row_ok, EVEN)\n"
Y_STORE = ("        _store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask, EVEN)\n"
           "\n\n@triton.jit\ndef _rmsnorm_bwd_load(")


def _rstd_last_source() -> str:
    """kernels/rmsnorm.py with the one-pass branch's rstd store moved after its y store (and nothing else)."""
    src = (ROOT / "kernels" / "rmsnorm.py").read_text()
    one_pass = src.index("    else:  # one pass: the tile holds whole rows")
    head, tail = src[:one_pass], src[one_pass:]
    assert tail.count(STORE_LINE) == 1 and tail.count(Y_STORE) == 1, "kernels/rmsnorm.py changed: update the probe"
    tail = tail.replace(STORE_LINE, "").replace(Y_STORE, Y_STORE.replace("EVEN)\n", "EVEN)\n" + STORE_LINE, 1))
    return head + tail


def _load_rstd_last():
    path = Path(tempfile.mkdtemp()) / "rmsnorm_rstd_last.py"
    path.write_text(_rstd_last_source())
    spec = importlib.util.spec_from_file_location("rmsnorm_rstd_last", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._rmsnorm_fwd_kernel


def main() -> None:
    rstd_last_kernel = _load_rstd_last()
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(Path(sys.argv[1]))
    for D in HIDDEN:
        for kind in KINDS:
            c = rms_training_case(kind, D, dev)
            M, add = c.M, c.add
            x2 = c.x.detach().reshape(M, D)
            r2 = c.r.detach().reshape(M, D) if add else x2
            s_in = (x2.float() + r2) if add else x2
            want_rstd = torch.rsqrt(s_in.float().pow(2).mean(-1) + 1e-5)
            y, rstd = torch.empty(M, D, device=dev, dtype=c.out_dtype), torch.empty(M, device=dev)
            s = torch.empty(M, D, device=dev) if add else y
            wd = c.w.detach()

            def direct(kernel, br, nw, chunk, two_pass, M=M, add=add, x2=x2, r2=r2, wd=wd, y=y, s=s, rstd=rstd):
                even = not add and M % br == 0 and D % chunk == 0
                return lambda: kernel[(triton_cdiv(M, br),)](
                    x2, r2, wd, y, s, rstd, M, D, D, D, D, 1e-5, D=D, HAS_RESIDUAL=add, BLOCK_ROWS=br,
                    BLOCK_D=chunk, TWO_PASS=two_pass, EVEN=even, num_warps=nw, num_stages=2)

            def model_call(c=c):
                with kernels.using({"rmsnorm": {}}):
                    return c.triton_fn(*c.args, 1e-5, c.out_dtype)

            block = 1 << (D - 1).bit_length()
            calls = {"torch.compile": lambda c=c: c.ref(*c.args), "ours, registry defaults": model_call}
            for br, nw in ONE_PASS[D]:
                calls[f"one pass r{br} w{nw}: rstd between"] = direct(current_kernel, br, nw, block, False)
                calls[f"one pass r{br} w{nw}: rstd last"] = direct(rstd_last_kernel, br, nw, block, False)
            if D == 2048:
                for br, nw in WHOLE_ROW:
                    calls[f"two passes, whole row, r{br} w{nw}"] = direct(current_kernel, br, nw, block, True)
            tol = dict(rtol=1e-5, atol=1e-5) if c.out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
            out = model_call()
            torch.testing.assert_close((out[0] if add else out).detach().reshape(M, D), c.want, **tol)
            for name, call in calls.items():
                if name.startswith(("one pass", "two passes")):
                    y.fill_(float("nan"))
                    rstd.fill_(float("nan"))
                    call()
                    torch.testing.assert_close(y, c.want, **tol)
                    torch.testing.assert_close(rstd, want_rstd, rtol=1e-4, atol=1e-5)
            label = f"{kind}, hidden {D}, training forward"
            rec.add(label, timed_rounds(calls, ROUNDS, {"case": label}, c.nbytes, ceiling, base))
            del c, calls
            torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    rec.print_tables(38)

def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    main()
