"""A plain PyTorch training loop of the same model and data, nanoGPT style.

The yardstick for the workbench's loop: no loader threads, no phase timer, no
buckets. Batches are random windows of a flat uint16 token file (nanoGPT's
``get_batch``: np.memmap, pinned, non-blocking copy), the model is
``workbench.train.model.Llama`` with the torch ops, AdamW is fused, attention is SDPA,
bf16 autocast; optionally ``torch.compile`` of the model's loss. With ``--global-batch G`` an optimizer step
accumulates micro-batches up to G sequences, as the workbench's loop does for the same global batch, so both
take the same optimizer steps per token (where the micro-batch does not divide G, the last one is smaller:
24 + 8 for G = 32).

``--recipe`` trains the model the way torchtitan's float8 docs tell a user to on one GPU: torchao's
``convert_to_float8_training`` with the ``tensorwise`` recipe on every decoder Linear (the LM head stays
bf16, as torchtitan's ``filter_fqns=["output"]`` leaves it), then each decoder block compiled on its own
(torchtitan's per-block ``torch.compile``) and the loss compiled apart.

    python benchmarks/reference_loop.py --preset gr00t-n1.6 --micro-batch 8 --seq-len 2048 \
        --global-batch 32 --steps 40 --warmup 10 [--compile | --recipe] --json out.json

Every token of a window is a real token (no padding), so its tokens/s is
directly comparable with the workbench's real tokens/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders.synth import SynthSpec, generate_documents, write_bin  # noqa: E402
from workbench.train.flops import flops_per_token, peak_tflops  # noqa: E402
from workbench.train.fp8 import torchao_config  # noqa: E402
from workbench.train.model import Llama, get_preset  # noqa: E402
from workbench.vocab import MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, PADDED_TOKENS_PER_S, REAL_TOKENS_PER_S, STEP_S


def apply_recipe(model: Llama) -> list[str]:
    """torchtitan's single-GPU FP8 recipe on ``model`` in place; returns the converted Linears.

    torchao float8 ``tensorwise`` on every Linear but the LM head (torchtitan's ``filter_fqns=["output"]``; here
    the head is read by the loss, not called as a Linear), then each decoder block compiled on its own
    (``apply_compile``: ``fullgraph=True``) and the loss after the blocks compiled apart. On the CPU torchao
    emulates the FP8 matmuls (the numbers are FP8's, the speed is not)."""
    from torchao.float8 import convert_to_float8_training

    converted: list[str] = []

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        ok = isinstance(module, torch.nn.Linear) and fqn != "lm_head"
        if ok:
            converted.append(fqn)
        return ok

    device_type = next(model.parameters()).device.type
    convert_to_float8_training(model, module_filter_fn=keep, config=torchao_config("tensorwise", device_type))
    for block in model.layers:
        block.compile(fullgraph=True)
    model.head_loss = torch.compile(model.head_loss)
    return converted


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="gr00t-n1.6")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step (default: one micro-batch)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="torch.compile of the model's loss")
    p.add_argument("--recipe", action="store_true",
                   help="torchtitan's single-GPU FP8 recipe: torchao float8 tensorwise + per-block compile")
    p.add_argument("--data", default="/tmp/reference_tokens.bin")
    p.add_argument("--json")
    return p


def _token_file(path: Path, vocab_size: int) -> np.memmap:
    """The flat uint16 token file, written once from the synthetic corpus when it is missing."""
    if not path.exists():
        docs = generate_documents(SynthSpec(vocab_size=min(vocab_size, 65535), num_docs=2000, seed=0))
        write_bin(docs, path, eos_id=min(vocab_size, 65535) - 1)
    return np.memmap(path, dtype=np.uint16, mode="r")


def _batches(data: np.memmap, T: int, device: torch.device) -> Callable[[int], torch.Tensor]:
    """nanoGPT's ``get_batch``: ``b`` random windows of ``T`` tokens, pinned and copied non-blocking on CUDA."""
    rng = np.random.default_rng(0)  # the same windows in every run: variants see the same data

    def get_batch(b: int) -> torch.Tensor:
        ix = rng.integers(0, len(data) - T - 1, b)
        x = torch.from_numpy(np.stack([data[i:i + T].astype(np.int64) for i in ix]))
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True)
        return x

    return get_batch


def _train_step(a: argparse.Namespace, model: Llama, device: torch.device, sizes: list[int], T: int,
                get_batch: Callable[[int], torch.Tensor]) -> tuple[Callable[[torch.Tensor], Any], list[str]]:
    """One optimizer step over the micro-batches ``sizes`` (the first one's tokens given, the next ones fetched
    ahead), with fused AdamW, bf16 autocast on CUDA and the variant's compile or recipe; returns it and the
    Linears the recipe converted to FP8."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    pos = {b: torch.arange(T, device=device).expand(b, T) for b in set(sizes)}
    mask = {b: torch.ones(b, T, dtype=torch.bool, device=device) for b in set(sizes)}
    loss_fn = model.loss
    fp8_linears: list[str] = []
    if a.compile:
        loss_fn = torch.compile(model.loss)
    elif a.recipe:
        fp8_linears = apply_recipe(model)
    amp = torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda")
    denom = sum(sizes) * (T - 1)  # every target of the step counts once: micro-batches of unequal size weigh by tokens

    def step(x):
        total = 0.0
        for i, b in enumerate(sizes):  # the next micro-batch's copy is issued before this one's compute
            nxt = get_batch(sizes[i + 1]) if i < len(sizes) - 1 else None
            with amp:
                loss_sum, n = loss_fn(x, pos[b], mask[b])
                loss = loss_sum / denom
            loss.backward()
            total = total + loss.detach()
            x = nxt if nxt is not None else x
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return step, fp8_linears


def _timed_steps(step: Callable[[torch.Tensor], Any], get_batch: Callable[[int], torch.Tensor], first: int,
                 warmup: int, steps: int, device: torch.device) -> tuple[list[float], float, Any]:
    """``warmup`` untimed steps, then ``steps`` timed ones (CUDA events, read back once at the end; host times on
    the CPU); returns each step's seconds, the wall time of the timed steps and the last loss."""
    x = get_batch(first)
    for _ in range(warmup):
        step(x)
        x = get_batch(first)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    cuda = device.type == "cuda"
    stamps = []  # CUDA events (no sync inside the loop) or host times
    t0 = time.perf_counter()
    for _ in range(steps):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            stamps.append(ev)
        else:
            stamps.append(time.perf_counter())
        loss = step(x)
        x = get_batch(first)
    if cuda:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        stamps.append(ev)
        torch.cuda.synchronize()  # note: the one CPU-GPU sync, at the end of the timed steps
        times = [a_.elapsed_time(b_) / 1e3 for a_, b_ in zip(stamps, stamps[1:])]
    else:
        stamps.append(time.perf_counter())
        times = [b_ - a_ for a_, b_ in zip(stamps, stamps[1:])]
    return times, time.perf_counter() - t0, loss


def main(argv: list[str] | None = None) -> dict:
    p = _parser()
    a = p.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args = get_preset(a.preset)
    data = _token_file(Path(a.data), args.vocab_size)
    B, T = a.micro_batch, a.seq_len
    G = a.global_batch or B
    if G < B:
        p.error(f"--global-batch {G} is smaller than --micro-batch {B}")
    if a.compile and a.recipe:
        p.error("--compile and --recipe are two references; pass one")
    sizes = [B] * (G // B) + ([G % B] if G % B else [])  # micro-batches of one optimizer step

    get_batch = _batches(data, T, device)
    model = Llama(args).to(device)
    step, fp8_linears = _train_step(a, model, device, sizes, T, get_batch)
    times, wall, loss = _timed_steps(step, get_batch, sizes[0], a.warmup, a.steps, device)
    tok_s = a.steps * G * T / wall
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = peak_tflops(name)
    out = {
        "variant": "reference_recipe" if a.recipe else "reference_compiled" if a.compile else "reference_eager",
        REAL_TOKENS_PER_S: tok_s,
        PADDED_TOKENS_PER_S: tok_s,  # no padding in random windows
        "mfu_pct": 100 * tok_s * flops_per_token(args, T) / (peak * 1e12) if peak else None,
        STEP_S: wall / a.steps,
        "time/step_s_median": float(np.median(times)),
        "time/step_s_p20": float(np.percentile(times, 20)),
        "time/step_s_p80": float(np.percentile(times, 80)),
        MAX_RESERVED_GIB: torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None,
        MAX_ALLOCATED_GIB: torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda"
        else None,
        "last_loss": float(loss.detach()),
        "steps": a.steps, "micro_batch": B, "global_batch": G, "grad_accum_steps": len(sizes), "seq_len": T,
        "gpu_name": name, "fp8_linears": len(fp8_linears),
    }
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
