"""What the paired-round probes share: their set-up, their interleaved rounds, their CSV, and the table of each
variant against torch.compile.

Each probe times every variant and torch.compile once per round, in interleaved rounds, and pairs the ratios per
round (compile ms / variant ms in the same round), so drift between rounds cancels. Factored out of the probes
after they ran; their printed tables are unchanged (checked against the logs of runs AI and AJ).
"""

from __future__ import annotations

import csv
import datetime as dt
import statistics
from pathlib import Path
from typing import Callable


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def paired_lines(rows: list[dict], width: int) -> list[str]:
    """One line per variant of ``rows`` (one case; keys variant, round, median_ms, pct_of_copy_ceiling): median
    ms, median % of copy, the per-round ratio to torch.compile (median, min-max) and the rounds it was faster in."""
    comp = {r["round"]: r["median_ms"] for r in rows if r["variant"] == "torch.compile"}
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        v = [r for r in rows if r["variant"] == name]
        ratios = [comp[r["round"]] / r["median_ms"] for r in v]
        out.append(f"  {name:>{width}} {statistics.median(r['median_ms'] for r in v):8.4f} ms "
                   f"{statistics.median(r['pct_of_copy_ceiling'] for r in v):6.1f}% "
                   f"{statistics.median(ratios):7.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) "
                   f"faster in {sum(x > 1 for x in ratios)}/{len(ratios)}")
    return out


def context(dev) -> tuple[float, dict]:
    """-> (the copy ceiling measured now, GB/s; the columns every row carries: timestamp, GPU, versions)."""
    import torch

    from kernels.bench import copy_ceiling_gb_per_s
    from workbench.fingerprint import versions

    ver = versions()
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    ceiling = copy_ceiling_gb_per_s(False, dev)
    return ceiling, {"timestamp": stamp, "gpu": torch.cuda.get_device_name(),
                     **{k: ver[k] for k in ("torch", "triton", "cuda")}}


def timing_row(lead: dict, variant: str, rnd: int, ms: tuple, nbytes: float, ceiling: float, base: dict,
               tail: dict | None = None) -> dict:
    """One timing's row: ``lead``'s columns, the variant, the round, (median, p20, p80) ms, % of the copy ceiling
    for ``nbytes``, the ceiling, ``tail``'s columns, then ``base``'s (see :func:`context`)."""
    return {**lead, "variant": variant, "round": rnd, "median_ms": ms[0], "p20_ms": ms[1], "p80_ms": ms[2],
            "pct_of_copy_ceiling": 100 * nbytes / (ms[0] * 1e-3) / 1e9 / ceiling, "copy_ceiling_gb_per_s": ceiling,
            **(tail or {}), **base}


def timed_rounds(calls: dict[str, Callable], rounds: int, lead: dict, nbytes: float, ceiling: float, base: dict,
                 tail: dict | None = None) -> list[dict]:
    """``rounds`` interleaved rounds over ``calls`` (in order, then reversed, alternately), each timed by
    kernels.bench.do_bench: one :func:`timing_row` per timing."""
    from kernels.bench import do_bench

    out = []
    for rnd in range(rounds):
        for name in (list(calls) if rnd % 2 == 0 else list(reversed(calls))):
            out.append(timing_row(lead, name, rnd, do_bench(calls[name], False), nbytes, ceiling, base, tail))
    return out


def rms_training_case(kind: str, D: int, dev):
    """One RMSNorm forward case of kernels.bench's ``fwd`` mode, inputs requiring grad, 8 x 2,048 rows of ``D``:
    ``kind`` "fp32" (in and out), "bf16 out" (fp32 in) or "fused add" (bf16 branch + fp32 stream, bf16 out).
    -> add, M, x, r (None without the add), w, out_dtype, args, ref (torch.compile of the reference),
    triton_fn (the kernel as the model calls it: ``triton_fn(*args, eps, out_dtype)``), want (ref's normalised
    output, M x D, detached) and nbytes (the bytes the forward moves: x read and y written; with the add, the
    bf16 branch and fp32 stream read, the fp32 sum and bf16 y written)."""
    from types import SimpleNamespace

    import torch

    import kernels
    from workbench import ops

    M = 8 * 2048
    add = kind == "fused add"
    x = torch.randn(8, 2048, D, device=dev, dtype=torch.bfloat16 if add else torch.float32, requires_grad=True)
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
    nbytes = 12 * M * D if add else M * D * (4 + out_dtype.itemsize)
    return SimpleNamespace(add=add, M=M, x=x, r=r, w=w, out_dtype=out_dtype, args=args, ref=ref, triton_fn=triton_fn,
                           want=want, nbytes=nbytes)


def ce_loss_case(D: int, dev, N: int = 8 * 2047, V: int = 50257) -> Callable[[Callable], Callable[[], tuple]]:
    """The whole loss of kernels.bench (seed 0): h (N, D) and W (V, D) in fp32 requiring grad, labels, a mask
    true at 95% of positions. -> ``full_of(loss_fn)``: a call of ``loss_fn(h, W, labels, mask)[0]`` under bf16
    autocast and its gradients to h and W (torch.autograd.grad), forward + backward."""
    import torch

    torch.manual_seed(0)
    h = torch.randn(N, D, device=dev, requires_grad=True)
    w = (torch.randn(V, D, device=dev) * 0.02).requires_grad_()
    labels = torch.randint(0, V, (N,), device=dev)
    mask = torch.rand(N, device=dev) < 0.95

    def full_of(loss_fn: Callable) -> Callable[[], tuple]:
        def full():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = loss_fn(h, w, labels, mask)[0]
            return torch.autograd.grad(loss, [h, w])
        return full
    return full_of


class Recorder:
    """A probe's rows, every case's appended to one CSV (rewritten after each case, so a crash keeps what ran),
    and its tables, printed at the end."""

    def __init__(self, out_csv: Path) -> None:
        self.out_csv, self.rows, self.tables = out_csv, [], []

    def add(self, label: str, case_rows: list[dict]) -> None:
        self.rows += case_rows
        write_csv(self.out_csv, self.rows)
        self.tables.append((label, case_rows))

    def print_tables(self, width: int) -> None:
        for label, case_rows in self.tables:
            print(label)
            print("\n".join(paired_lines(case_rows, width)))
