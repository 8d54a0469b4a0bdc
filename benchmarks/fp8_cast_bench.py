"""The FP8 tensorwise casts of one Linear operand (CUDA only): the project's kernels (kernels/fp8_cast.py: one amax
read, one pass writing both layouts) against torchao's cast compiled by Inductor, over the launch space of
``fp8_cast`` in kernels/registry.py, and against the copy-bandwidth bound.

    python benchmarks/fp8_cast_bench.py --out DIR [--quick]

Shapes: every operand cast of a gr00t-n1.6 decoder block at micro-batch 16 x 2,048 tokens (M = 32,768 rows): the
inputs of q/k/v, o and gate/up (2,048 wide) and of down (5,632), the output gradients of gate and up (5,632).
Bytes per element, the bound: a bf16 read for the amax, a bf16 read for the cast and two FP8 writes (6 B); a cast
that kept the amax out of its own pass (fused into the producer) would need 4 B. The copy bandwidth is measured in
the same run (a device-to-device copy, bytes read plus written). ``torchao`` is torchao's own functions
(``tensor_to_scale``, ``to_fp8_saturated``) for both layouts in one compiled graph: what Inductor makes of them at
best, when its CSE shares the amax. Writes ``fp8_cast.csv`` (long format) and prints a table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from _run import commit  # noqa: E402

from workbench.train.fingerprint import versions  # noqa: E402

SHAPES = {"input 2048 (q/k/v, o, gate/up)": (32768, 2048), "input 5632 (down)": (32768, 5632),
          "grad 5632 (gate, up)": (32768, 5632)}


def _copy_gbs(dev: torch.device, bench) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, of 512 MiB (far past the 60 MB L2)."""
    src = torch.randn(1 << 28, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / bench(lambda: dst.copy_(src)) / 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python benchmarks/fp8_cast_bench.py")
    p.add_argument("--out", default="benchmarks/out")
    p.add_argument("--quick", action="store_true", help="the defaults only, no launch sweep")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fp8_cast_bench: needs a CUDA GPU")
    import triton
    from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated

    import kernels
    from kernels.fp8_cast import fp8_cast_transpose
    from kernels.registry import get_space

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    ver = versions(("gpu", "torch", "triton", "cuda"))
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    rows: list[dict] = []

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # ms

    copy_gbs = _copy_gbs(dev, bench)

    def torchao_both(x, dtype):
        s = tensor_to_scale(x, dtype)
        q = to_fp8_saturated(x.to(torch.float32) * s, dtype)
        return q, q.t().contiguous(), s

    torchao_compiled = torch.compile(torchao_both)
    for label, (M, N) in SHAPES.items():
        dtype = torch.float8_e5m2 if label.startswith("grad") else torch.float8_e4m3fn
        xs = [torch.randn(M, N, device=dev, dtype=torch.bfloat16) * 3 for _ in range(3)]  # rotated: no L2 reuse
        it = iter(range(1 << 30))
        bound_ms = 6 * M * N / (copy_gbs * 1e6)
        ref = torchao_both(xs[0], dtype)
        ours = fp8_cast_transpose(xs[0], dtype)
        exact = all(torch.equal(o.view(torch.uint8), r.view(torch.uint8)) for o, r in zip(ours[:2], ref[:2]))
        ours = lambda: fp8_cast_transpose(xs[next(it) % 3], dtype)  # noqa: E731
        # each kernel's launch space swept with the other kernel at its defaults, then the two best together
        variants = [("torchao", {}, lambda: torchao_compiled(xs[next(it) % 3], dtype)), ("triton", {}, ours)]
        if not a.quick:
            for kernel, shape in (("fp8_cast", {"rows": M, "cols": N}), ("fp8_amax", {"numel": M * N})):
                variants += [("triton", {kernel: launch}, ours) for launch in get_space(kernel).sweep(shape)]
        for provider, launch, fn in variants:
            with kernels.using(launch):
                ms = bench(fn)
            rows.append({"date": now[:10], "timestamp": now, "commit": commit(), **ver, "benchmark": "fp8_cast",
                         "shape": label, "rows": M, "cols": N, "fp8": str(dtype).split(".")[-1],
                         "provider": provider, "launch": ";".join(f"{k}:" + ",".join(f"{p_}={v}" for p_, v in
                                                                                     kv.items())
                                                                  for k, kv in launch.items()) or "default",
                         "ms": ms, "bound_ms": bound_ms, "x_bound": ms / bound_ms, "copy_gbs": copy_gbs,
                         "bit_exact_vs_torchao": exact if provider == "triton" else None})
    df = pd.DataFrame(rows)
    df.to_csv(out / "fp8_cast.csv", index=False)
    best = df[df["provider"] == "triton"].sort_values("ms").groupby("shape").head(1).set_index("shape")
    default = df[(df["provider"] == "triton") & (df["launch"] == "default")].set_index("shape")
    torchao = df[df["provider"] == "torchao"].set_index("shape")
    table = pd.DataFrame({"bound_ms": default["bound_ms"], "torchao_ms": torchao["ms"], "triton_ms": default["ms"],
                          "best_ms": best["ms"], "best_launch": best["launch"],
                          "best_x_bound": best["x_bound"], "torchao/best": torchao["ms"] / best["ms"],
                          "exact": default["bit_exact_vs_torchao"]})
    print(f"copy {copy_gbs:,.0f} GB/s; {ver}")
    with pd.option_context("display.width", 250, "display.max_columns", 20, "display.float_format", "{:,.3f}".format):
        print(table)


if __name__ == "__main__":
    main()
