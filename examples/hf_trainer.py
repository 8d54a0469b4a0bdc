"""A Hugging Face ``transformers.Trainer`` run, tuned by the workbench through ``WorkbenchCallback``.

    python -m workbench.tune --study examples/hf_trainer.yaml   # tune it
    python examples/hf_trainer.py                               # run it alone, on the default config

The study's model (``model:``, a preset or an HF config.json; ``tiny`` by default) as a ``LlamaForCausalLM``, on
windows of a seeded synthetic stream it can learn (``user.doc_lengths: varied``: documents of ``data.min_len`` to
``seq_len`` tokens instead, batched by ``run.collator()`` as ``data.packing`` says: padding-free or padded). The trial's config sets the micro-batch
(``per_device_train_batch_size``; accumulation holds ``training.global_batch_size``) and the loop's own
``user.optim``; ``run.prepare(model)`` applies the rest to the model (workbench/train/hf_prepare.py): the attention
implementation, Liger's or the project's kernels, FP8, activation checkpointing and per-layer ``torch.compile``.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import workbench
from workbench.train.flops import flops_per_token
from workbench.train.hf import hf_config_dict, model_args
from workbench.train.hf_callback import WorkbenchCallback


class Windows(torch.utils.data.Dataset):
    """``n`` windows of ``seq_len`` tokens from one seeded stream that a model can learn: each token is its
    predecessor's fixed successor (a random table of the seed) three times in four, else a random token, so the
    loss falls from ln(vocab) towards the stream's entropy and a patch that changes the numerics shows in it. The
    labels are the inputs (the model shifts them)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        successor = torch.randint(0, vocab, (vocab,), generator=g)
        noise = torch.randint(0, vocab, (n, seq_len), generator=g)
        keep = torch.rand(n, seq_len, generator=g) < 0.75
        ids = noise.clone()
        for t in range(1, seq_len):
            ids[:, t] = torch.where(keep[:, t], successor[ids[:, t - 1]], noise[:, t])
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Documents(Windows):
    """The same stream as documents of ``min_len`` to ``seq_len`` tokens (a seeded draw each): what a corpus of
    one's own looks like before it is batched. ``run.collator()`` batches them as ``data.packing`` says."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int, min_len: int) -> None:
        super().__init__(n, seq_len, vocab, seed)
        self.lengths = torch.randint(min(min_len, seq_len), seq_len + 1, (n,),
                                     generator=torch.Generator().manual_seed(seed + 1)).tolist()

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i, :self.lengths[i]]}


def main() -> None:
    with workbench.run() as run:
        cfg = run.config
        torch.manual_seed(cfg.training.seed)
        # the study's model (a preset or a config.json) as a transformers LlamaForCausalLM
        args = model_args(cfg.model.name, cfg.model.config_path)
        hf = hf_config_dict(args)
        hf["max_position_embeddings"] = max(hf["max_position_embeddings"], cfg.data.seq_len)
        with run.device:  # built where it trains: no copy of the weights from the host
            model = LlamaForCausalLM(LlamaConfig(**hf))
        model = run.prepare(model)  # the trial's knobs on the model, before the Trainer wraps it
        B, accum = cfg.data.micro_batch_size, cfg.effective_grad_accum_steps()
        training = TrainingArguments(
            output_dir=str(run.out_dir or "hf-trainer-out"), max_steps=run.max_steps, per_device_train_batch_size=B,
            gradient_accumulation_steps=accum, learning_rate=cfg.training.learning_rate,
            weight_decay=cfg.training.weight_decay, max_grad_norm=cfg.training.grad_clip,
            optim=run.user.get("optim", "adamw_torch"), use_cpu=run.device.type == "cpu",
            bf16=cfg.training.dtype == "bf16" or (cfg.training.dtype == "auto" and run.device.type == "cuda"),
            dataloader_num_workers=0, logging_strategy="no", save_strategy="no", report_to=[],
            disable_tqdm=True, seed=cfg.training.seed,
            # the Trainer's own waits for the device, the loop's knobs: its NaN/Inf check reads every micro-batch's
            # loss back (user.nan_inf_filter), and its batches go over in blocking copies unless non-blocking
            # from pinned memory (user.non_blocking)
            logging_nan_inf_filter=bool(run.user.get("nan_inf_filter", True)),
            accelerator_config={"non_blocking": bool(run.user.get("non_blocking", False))})
        if run.user.get("doc_lengths", "full") == "varied":  # documents, batched padding-free or padded
            data = Documents(run.max_steps * B * accum, cfg.data.seq_len, hf["vocab_size"], cfg.data.seed,
                             cfg.data.min_len)
            collate = run.collator()
        else:  # full windows: nothing to pad
            data = Windows(run.max_steps * B * accum, cfg.data.seq_len, hf["vocab_size"], cfg.data.seed)
            collate = None
        report = WorkbenchCallback(run, flops_per_token=flops_per_token(args, cfg.data.seq_len))
        trainer = Trainer(model=model, args=training, train_dataset=data, data_collator=collate, callbacks=[report])
        trainer.train()


if __name__ == "__main__":
    main()
