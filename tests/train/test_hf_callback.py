"""WorkbenchCallback inside a real transformers.Trainer (issue 41): the loss it reports for each optimizer step is
the Trainer's own logged loss, with gradient accumulation, whether the model divides by the step's token count
(``num_items_in_batch``) or the Trainer averages the micro-batches; the FLOPs and tokens pass through."""

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
    report = WorkbenchCallback(run, tokens_per_step=4 * 16, flops_per_step=1e9)
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
    assert all(s["tokens"] == 64 and s["flops"] == 1e9 for s in run.steps)
    model.eval()
    model(input_ids=Windows().ids[:2], labels=Windows().ids[:2])  # after training: the hook is gone
    assert report._losses == []
