"""WorkbenchCallback inside a real transformers.Trainer (issue 41): the loss it reports for each optimizer step is
the Trainer's own logged loss, with gradient accumulation, whether the model divides by the step's token count
(``num_items_in_batch``) or the Trainer averages the micro-batches; the tokens it counts from the model's inputs
(padding apart, by the attention mask) and the FLOPs of the real ones."""

from __future__ import annotations

import types

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from workbench.train.hf_callback import WorkbenchCallback  # noqa: E402


class FakeRun:
    """What the callback uses of ``workbench.run()``'s Run: the session's marks, step() and stop_requested."""

    def __init__(self) -> None:
        self.session = types.SimpleNamespace(mark=lambda phase: None)
        self.steps: list[dict] = []
        self.stop_requested = False

    def step(self, **kw) -> None:
        self.steps.append(kw)


class Windows(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 128, (16, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.parametrize("loss_kwargs", [True, False])
def test_each_steps_loss_is_the_trainers_logged_loss(tmp_path, loss_kwargs):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        vocab_size=128, max_position_embeddings=16))
    model.accepts_loss_kwargs = loss_kwargs  # False: the Trainer averages the micro-batches' mean losses itself
    run = FakeRun()
    report = WorkbenchCallback(run, flops_per_token=1e6)  # tokens counted from the inputs
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        learning_rate=1e-2, use_cpu=True, logging_strategy="steps", logging_steps=1, save_strategy="no",
        report_to=[], disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[report])
    assert trainer.model_accepts_loss_kwargs is loss_kwargs
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(run.steps) == len(logged) == 4
    losses = [float(s["loss"]) for s in run.steps]
    assert losses == pytest.approx(logged, rel=1e-3)
    assert len(set(round(x, 4) for x in losses)) == 4  # four different steps, not one value repeated
    assert all(s["tokens"] == s["real_tokens"] == 64 and s["flops"] == 64e6 for s in run.steps)
    model.eval()
    model(input_ids=Windows().ids[:2], labels=Windows().ids[:2])  # after training: the hook is gone
    assert report._losses == []


def test_padded_and_real_tokens_are_counted_from_the_inputs(tmp_path):
    """Rows of different lengths padded to the longest: every input id counts as processed, the attention mask's
    ones as real (a device tensor, read with the loss); the FLOPs follow the real tokens."""
    lengths = [16, 9, 12, 5, 16, 3, 7, 11]

    class Docs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(lengths)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": torch.arange(lengths[i]) % 128}

    def pad(features: list[dict]) -> dict:
        n = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), n, dtype=torch.long)
        mask = torch.zeros(len(features), n, dtype=torch.long)
        for j, f in enumerate(features):
            ids[j, :len(f["input_ids"])], mask[j, :len(f["input_ids"])] = f["input_ids"], 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        vocab_size=128, max_position_embeddings=16))
    run = FakeRun()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        use_cpu=True, logging_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Docs(), data_collator=pad,
                                   callbacks=[WorkbenchCallback(run, flops_per_token=2.0)])
    trainer.train()
    assert len(run.steps) == 2
    reals = [int(s["real_tokens"]) for s in run.steps]
    assert sum(reals) == sum(lengths)  # every document once, its padding apart
    assert all(s["tokens"] > int(s["real_tokens"]) for s in run.steps)  # the padding counted as processed only
    assert [float(s["flops"]) for s in run.steps] == [2.0 * r for r in reals]
