"""The run API inside Hugging Face's ``transformers.Trainer``: a ``TrainerCallback`` that reports each optimizer
step to ``workbench.run()`` (``pip install loongforge-workbench[hf]``; examples/hf_trainer.py).

The Trainer's loop is not ours to annotate, so the callback stamps phase ends at its hooks (the same timer, the
same files): ``data_wait`` up to ``on_step_begin`` (the batches are fetched before it), ``forward`` up to
``on_pre_optimizer_step`` (forward and backward of every micro-batch, and the gradient clipping: one phase, as
under graph capture), ``optimizer`` up to ``on_optimizer_step``; the scheduler and ``zero_grad`` fall in
``other``. The loss is not reported (the Trainer hands its callbacks no per-step loss).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from workbench.train.session import Run

__all__ = ["WorkbenchCallback"]


class WorkbenchCallback(TrainerCallback):
    """Reports the Trainer's steps to ``run``. ``tokens_per_step``: tokens one optimizer step processes on this
    process (micro-batch x sequence x accumulation); by default the growth of ``state.num_input_tokens_seen``
    (``TrainingArguments(include_num_input_tokens_seen=True)``)."""

    def __init__(self, run: Run, *, tokens_per_step: int | None = None) -> None:
        self.run = run
        self.tokens_per_step = tokens_per_step
        self._seen = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("data_wait")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("forward")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.session.mark("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        tokens = self.tokens_per_step
        if tokens is None:
            seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            if seen <= self._seen:
                raise ValueError("WorkbenchCallback: give tokens_per_step, or set "
                                 "TrainingArguments(include_num_input_tokens_seen=True)")
            tokens, self._seen = seen - self._seen, seen
        self.run.step(tokens=tokens)
        if self.run.stop_requested:
            control.should_training_stop = True
        return control
