"""The run API inside Hugging Face's ``transformers.Trainer``: a ``TrainerCallback`` that reports each optimizer
step to ``workbench.run()`` (``pip install loongforge-workbench[hf]``; examples/hf_trainer.py).

The Trainer's loop is not ours to annotate, so the callback stamps phase ends at its hooks (the same timer, the
same files): ``data_wait`` up to ``on_step_begin`` (the batches are fetched before it), ``forward`` up to
``on_pre_optimizer_step`` (forward and backward of every micro-batch, and the gradient clipping: one phase, as
under graph capture), ``optimizer`` up to ``on_optimizer_step``; the scheduler and ``zero_grad`` fall in
``other``.

The tokens are counted from what the model is given (the same hook): ``input_ids``' size as processed, the
``attention_mask``'s ones as real, so padded batches and padding-free ones (``run.collator()``) compare by real
tokens/s.

The Trainer hands its callbacks no per-step loss, so the callback reads it where the model returns it: a forward
hook on the model keeps each training micro-batch's ``output.loss`` (on the device, detached; the window reads them
back with its one sync). The step's loss is the Trainer's own: the sum of the micro-batches' losses where the
Trainer passed ``num_items_in_batch`` (each is then already divided by the step's token count), else their mean.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from workbench.train.session import Run

__all__ = ["WorkbenchCallback"]


class WorkbenchCallback(TrainerCallback):
    """Reports the Trainer's steps to ``run``. ``tokens_per_step``: tokens one optimizer step processes on this
    process (micro-batch x sequence x accumulation), all real; by default the callback counts them from what the
    model is given: ``input_ids``' size (padding included) and the ``attention_mask``'s sum (the real ones; a
    batch without a mask, packed without padding, is all real), the sum kept on the device and read back with the
    loss. ``flops_per_token``: the model's training FLOPs per real token (``workbench.train.flops``), for MFU; 0
    leaves MFU out."""

    def __init__(self, run: Run, *, tokens_per_step: int | None = None, flops_per_token: float = 0.0) -> None:
        self.run = run
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = float(flops_per_token)
        self._losses: list[torch.Tensor] = []
        self._summed = False
        self._padded = 0
        self._real: list[torch.Tensor | int] = []
        self._hook: Any = None

    def _keep_loss(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if not module.training:
            return
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
            self._summed = kwargs.get("num_items_in_batch") is not None
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if isinstance(ids, torch.Tensor):
            self._padded += ids.numel()
            self._real.append(mask.sum() if isinstance(mask, torch.Tensor) else ids.numel())

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._keep_loss, with_kwargs=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("data_wait")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("forward")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("optimizer")

    def _step_loss(self) -> torch.Tensor | None:
        if not self._losses:
            return None
        total = torch.stack(self._losses).float().sum()
        loss = total if self._summed else total / len(self._losses)
        self._losses = []
        return loss

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.tokens_per_step is not None:
            padded = self.tokens_per_step
            real: int | torch.Tensor = padded
        elif self._padded:
            padded = self._padded
            real = sum(self._real)  # a tensor where any count is one (read back with the loss), else an int
        else:
            raise ValueError("WorkbenchCallback: the model was given no input_ids to count; give tokens_per_step")
        self._padded, self._real = 0, []
        self.run.step(tokens=padded, real_tokens=real, loss=self._step_loss(), flops=real * self.flops_per_token)
        if self.run.stop_requested:
            control.should_training_stop = True
        return control
