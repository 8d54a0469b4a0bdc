"""Is inductor's RMSNorm forward faster because it reads each row twice? (GPU run AN; a record, not a test.)

Inductor (torch 2.11/2.13, ``_reduction_configs``) compiles the RMSNorm forward as a looped reduction: one loop
sums the squares (loads evict_last), a second loop reads the row again (evict_first) to normalise. For an INNER
reduction of 2,048 it runs a single configuration, XBLOCK 2 x R0_BLOCK 2,048, 16 warps, 1 stage: each loop runs
once over the whole row, so the row is read twice, the second time from L2. At 4,096 it autotuned (run AM) to
XBLOCK 1 x R0_BLOCK 4,096, 16 warps, 1 stage: the same shape. kernels.rmsnorm's launcher runs two passes only
with column chunks narrower than the row (``fwd_block_size < hidden``); with a whole-row tile it holds the row in
registers and reads it once. Run AM: that one-pass launch at a whole row is the slowest of the screen (0.0702 ms at
2,048, against 0.0678 ms for torch.compile).

Variants, each in 8 interleaved rounds against torch.compile, paired per round, fp32 in, fp32 or bf16 out, at
hidden 2,048 and 4,096 (8 x 2,048 rows), no residual (the unmasked kernel, as the launcher runs it):
- kernels.rmsnorm's forward with TWO_PASS forced on and a whole-row chunk, rows {1, 2} x warps {8, 16} x stages
  {1, 2};
- the same tiles in one pass (as the launcher runs them today);
- the launches runs AJ/AK/AM found best (two passes over narrower chunks).
It also records the configuration inductor launched for every kernel it compiled (from its code cache).

Usage: python benchmarks/probes/rms_two_pass_probe.py OUT_CSV
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels.rmsnorm import _rmsnorm_fwd_kernel  # noqa: E402
from workbench import ops  # noqa: E402
from paired import Recorder, context, timed_rounds  # noqa: E402

ROUNDS = 8


def _inductor_launches() -> list[str]:
    """``kernel: config`` for every inductor kernel loaded so far that has launched."""
    from torch._inductor.codecache import PyCodeCache

    mods = list(getattr(PyCodeCache, "modules", [])) + list(getattr(PyCodeCache, "modules_no_attr", {}).values())
    out = []
    for m in mods:
        for name, obj in vars(m).items():
            launchers = getattr(obj, "launchers", None)
            if name.startswith("triton_") and launchers:
                cfgs = [str(getattr(ln, "config", "?")) for ln in launchers]
                out.append(f"{name} (size hints {getattr(obj, 'size_hints', '?')}): {' / '.join(cfgs)}")
    return sorted(set(out))


def main() -> None:
    out_csv = Path(sys.argv[1])
    dev = torch.device("cuda")
    ceiling, base = context(dev)
    rec = Recorder(out_csv)
    # the launches found best so far: run AG's sweep, run AM's screen (fp32) and launch_rms_H (bf16, r1 w2)
    best_known = {(2048, torch.float32): [(1, 1024, 8, 2), (2, 1024, 16, 2)],
                  (4096, torch.float32): [(1, 2048, 16, 2)],
                  (2048, torch.bfloat16): [(2, 2048, 8, 2), (1, 2048, 2, 2)],
                  (4096, torch.bfloat16): [(1, 4096, 8, 2)]}
    for D, out_dtype in ((2048, torch.float32), (4096, torch.float32), (2048, torch.bfloat16),
                         (4096, torch.bfloat16)):
        x, w = torch.randn(8, 2048, D, device=dev), torch.randn(D, device=dev)
        M = x.numel() // D
        x2 = x.view(M, D)
        y, rstd = torch.empty(M, D, device=dev, dtype=out_dtype), torch.empty(M, device=dev)
        ref = torch.compile(lambda x, w, o=out_dtype: ops.rms_norm_torch(x, w, 1e-5, o), dynamic=False)
        want = ref(x, w).reshape(M, D)
        nbytes = M * D * (4 + y.element_size())

        def ours(br, chunk, nw, ns, two_pass):
            return lambda: _rmsnorm_fwd_kernel[(M // br,)](
                x2, x2, w, y, y, rstd, M, D, D, D, D, D, 1e-5, HAS_RESIDUAL=False, BLOCK_ROWS=br, BLOCK_D=chunk,
                TWO_PASS=two_pass, EVEN=True, num_warps=nw, num_stages=ns)

        calls = {"torch.compile": lambda: ref(x, w)}
        for br, chunk, nw, ns in best_known[(D, out_dtype)]:
            calls[f"known r{br} c{chunk} w{nw} s{ns} {'2-pass' if chunk < D else '1-pass'}"] = ours(
                br, chunk, nw, ns, chunk < D)
        for br in (1, 2):
            for nw in (8, 16):
                for ns in (1, 2):
                    calls[f"whole row r{br} w{nw} s{ns} 2-pass"] = ours(br, D, nw, ns, True)
                calls[f"whole row r{br} w{nw} s1 1-pass"] = ours(br, D, nw, 1, False)
        tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for name, call in calls.items():
            if name != "torch.compile":
                y.fill_(float("nan"))
                call()
                torch.testing.assert_close(y, want, **tol)
        label = f"fp32 in, {str(out_dtype)[6:]} out, hidden {D}"
        case_rows = timed_rounds(calls, ROUNDS, {"case": label}, nbytes, ceiling, base)
        rec.add(label, case_rows)
        del x, x2, y, ref, calls
        torch.cuda.empty_cache()
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for line in _inductor_launches():
        print(f"inductor launched {line}")
    rec.print_tables(32)


if __name__ == "__main__":
    main()
