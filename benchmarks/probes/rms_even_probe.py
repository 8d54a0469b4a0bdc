"""kernels.rmsnorm's forward with and without its unmasked path, against torch.compile (GPU run AJ; a record of what
ran, not a test).

Run AI (benchmarks/probes/mask_free_probe.py) found the forward's masks cost it 0.3-2.3%; kernels.rmsnorm now drops
them where every tile lies inside the tensor (``EVEN``). Here the forward as it is (kernels.rmsnorm._rmsnorm_fwd,
launch parameters through kernels.using) and the forward kernel of the commit given (its source cut out of
``git show REV:kernels/rmsnorm.py``, launched with the same arguments) run against torch.compile of the
reference in 6 interleaved rounds, ratios paired per round, for the cases kernels.bench times: fp32 in and out,
fp32 in and bf16 out (the model under autocast), the fused residual add (bf16 branch + fp32 stream, bf16 out), at
hidden 2,048 and 4,096, each at the launches that ran best in runs AE, AG and AI. Inputs require grad (the
training forward: inductor's saves rstd as ours does).

Usage: python benchmarks/probes/rms_even_probe.py OUT_CSV OLD_KERNEL_PY
(OLD_KERNEL_PY: a file holding the old forward kernel; runAJ.sh cuts it out of git.)
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels  # noqa: E402
from kernels.bench import copy_ceiling_gb_per_s, do_bench  # noqa: E402
from kernels.rmsnorm import _rmsnorm_fwd  # noqa: E402
from workbench import ops  # noqa: E402
from workbench.fingerprint import versions  # noqa: E402
from paired import paired_lines, write_csv  # noqa: E402

ROUNDS = 6
# (label, x dtype, residual dtype or None, out dtype, bytes per element moved, launches as (block_rows,
# fwd_block_size, num_warps): fwd_block_size >= D is the one-pass forward)
CASES = [
    ("fp32", torch.float32, None, torch.float32, 8, {2048: [(1, 1024, 8), (2, 1024, 16), (2, 2048, 8)],
                                                     4096: [(1, 2048, 16), (1, 2048, 8), (2, 2048, 16)]}),
    ("bf16 out", torch.float32, None, torch.bfloat16, 6, {2048: [(2, 2048, 8), (1, 2048, 4), (1, 1024, 8)],
                                                          4096: [(1, 2048, 16), (2, 4096, 16), (1, 4096, 8)]}),
    ("fused add", torch.bfloat16, torch.float32, torch.bfloat16, 12, {2048: [(2, 2048, 8), (1, 2048, 4)],
                                                                      4096: [(1, 2048, 16), (1, 4096, 8)]}),
]


def _old_kernel(path: str):
    spec = importlib.util.spec_from_file_location("old_rms_fwd", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._rmsnorm_fwd_kernel


def main() -> None:
    out_csv, old = Path(sys.argv[1]), _old_kernel(sys.argv[2])
    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    dev = torch.device("cuda")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    rows: list[dict] = []
    for label, xdt, rdt, odt, bpe, launches in CASES:
        for D, lls in launches.items():
            x = torch.randn(8, 2048, D, device=dev, dtype=xdt, requires_grad=True)
            r = torch.randn(8, 2048, D, device=dev, dtype=rdt, requires_grad=True) if rdt else None
            w = torch.ones(D, device=dev, requires_grad=True)
            M = x.numel() // D
            if r is None:
                ref = torch.compile(lambda x, w, odt=odt: ops.rms_norm_torch(x, w, 1e-5, odt), dynamic=False)
                calls = {"torch.compile": lambda ref=ref, x=x, w=w: ref(x, w)}
            else:
                ref = torch.compile(lambda x, r, w, odt=odt: ops.rms_norm_add_torch(x, r, w, 1e-5, odt),
                                    dynamic=False)
                calls = {"torch.compile": lambda ref=ref, x=x, r=r, w=w: ref(x, r, w)}
            want = ref(x, w) if r is None else ref(x, r, w)[0]
            xd, rd, wd = x.detach().view(M, D), (r.detach().view(M, D) if r is not None else None), w.detach()
            y_old = torch.empty(M, D, device=dev, dtype=odt)
            s_old = torch.empty(M, D, device=dev, dtype=torch.promote_types(xdt, rdt)) if r is not None else y_old
            rstd_old = torch.empty(M, device=dev)
            for br, fb, nw in lls:
                p = {"block_rows": br, "fwd_block_size": fb, "block_size": triton.next_power_of_2(D), "num_warps": nw}
                tag = f"r{br} {'one-pass' if fb >= D else f'c{fb}'} w{nw}"

                def new(p=p):
                    with kernels.using({"rmsnorm": p}):
                        return _rmsnorm_fwd(xd, rd, wd, 1e-5, odt)

                bd = min(fb, D)
                calls[f"new {tag}"] = new
                calls[f"old {tag}"] = (
                    lambda br=br, bd=bd, nw=nw, fb=fb: old[(triton.cdiv(M, br),)](
                        xd, rd if rd is not None else xd, wd, y_old, s_old, rstd_old, M, D, D, D, D, D, 1e-5,
                        HAS_RESIDUAL=rd is not None, BLOCK_ROWS=br, BLOCK_D=bd, TWO_PASS=fb < D, num_warps=nw,
                        num_stages=2))
            for name, call in calls.items():  # every variant checked against the reference before timing
                y_old.fill_(float("nan"))
                got = call()
                if name.startswith("new"):
                    torch.testing.assert_close(got[0].view_as(want), want, rtol=2e-2, atol=2e-2)
                elif name.startswith("old"):
                    torch.testing.assert_close(y_old.view_as(want), want, rtol=2e-2, atol=2e-2)
            for rnd in range(ROUNDS):
                for name in (list(calls) if rnd % 2 == 0 else list(reversed(calls))):
                    ms = do_bench(calls[name], False)
                    rows.append({"kernel": "rmsnorm", "case": label, "shape": f"8x2048x{D}", "mode": "fwd",
                                 "variant": name, "round": rnd, "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
                                 "pct_of_copy_ceiling": 100 * bpe * M * D / (ms[0] * 1e-3) / 1e9 / ceiling,
                                 "copy_ceiling_gb_per_s": ceiling, "timestamp": stamp,
                                 "gpu": torch.cuda.get_device_name(),
                                 **{k: ver[k] for k in ("torch", "triton", "cuda")}})
            del x, r, w, want, xd, rd, wd, y_old, s_old, rstd_old, calls, ref
            torch.cuda.empty_cache()
            write_csv(out_csv, rows)  # after every shape: a timeout keeps what was measured
    print(f"copy ceiling {ceiling:.0f} GB/s")
    for (label, shape) in dict.fromkeys((r["case"], r["shape"]) for r in rows):
        print(f"{label} {shape}")
        print("\n".join(paired_lines([r for r in rows if (r["case"], r["shape"]) == (label, shape)], 24)))


if __name__ == "__main__":
    main()
