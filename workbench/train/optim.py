"""The optimizer and its learning-rate schedule, built from the ``training`` section: AdamW (fused on CUDA, its
learning rate a device tensor under the optimizer's graph capture), a linear warm-up, then cosine down to
``min_lr_ratio`` of the peak or constant."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

__all__ = ["build_optimizer", "lr_at", "set_lr"]


def build_optimizer(model: nn.Module, training: Any, device: torch.device, *,
                    capturable: bool) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters, weight decay on the matrices only; fused on CUDA; ``capturable`` (the lr
    a device tensor) for a CUDA graph of the optimizer step."""
    t = training
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    lr: float | torch.Tensor = t.learning_rate
    if capturable:
        lr = torch.tensor(t.learning_rate, device=device)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(t.beta1, t.beta2), fused=device.type == "cuda",
        capturable=capturable)


def lr_at(training: Any, step: int) -> float:
    """The learning rate of step ``step`` (0-based) under ``training``'s schedule."""
    t = training
    if step < t.warmup_steps:
        return t.learning_rate * (step + 1) / t.warmup_steps
    if t.scheduler == "constant":
        return t.learning_rate
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))
    cos = 0.5 * (1 + math.cos(math.pi * progress))
    return t.learning_rate * (t.min_lr_ratio + (1 - t.min_lr_ratio) * cos)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into every group: in place into a capturable optimizer's device tensor (a graph holds it)."""
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr
