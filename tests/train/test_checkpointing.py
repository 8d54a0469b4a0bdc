"""Activation checkpointing of decoder blocks (``Llama.set_activation_checkpointing``).

The tiny preset on the CPU in float32, B x T = 2 x 64. A checkpointed block recomputes the same ops on the
same inputs, so the loss and gradients match the plain forward to float32 rounding; the comparisons use
rtol = atol = 1e-6. ``torch.compile`` is not exercised here (too slow on the CPU); the contract it relies
on, that the checkpoint wraps the block module itself, is tested directly.
"""

from __future__ import annotations

import pytest
import torch

from workbench.train.model import Llama, get_preset
from workbench.train.ops import resolve

B, T = 2, 64
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _batch(vocab_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids_BT = torch.randint(0, vocab_size, (B, T), generator=g)
    pos_BT = torch.arange(T).expand(B, T)
    mask_BT = torch.ones(B, T, dtype=torch.bool)
    mask_BT[1, T // 2:] = False  # some positions out of the loss
    return ids_BT, pos_BT, mask_BT


def _pair(fused_residual_norm: bool = False) -> tuple[Llama, Llama]:
    """Two tiny models with the same weights, in training mode."""
    args = get_preset("tiny")
    torch.manual_seed(0)
    ref = Llama(args, ops=resolve(fused_residual_norm=fused_residual_norm))
    other = Llama(args, ops=resolve(fused_residual_norm=fused_residual_norm))
    other.load_state_dict(ref.state_dict())
    return ref.train(), other.train()


def _loss_and_grads(model: Llama, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss_sum, n_tokens = model.loss(*batch)
    (loss_sum / n_tokens).backward()
    return loss_sum.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def _count_checkpoint_calls(monkeypatch) -> list:
    """Record the function passed to each ``torch.utils.checkpoint.checkpoint`` call, then run it."""
    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    return calls


@pytest.mark.parametrize("fused_residual_norm", [False, True], ids=["plain_residual", "fused_residual"])
@pytest.mark.parametrize(("mode", "every"), [("full", 1), ("selective", 2), ("selective", 1)])
def test_checkpointing_matches_plain_loss_and_grads(mode, every, fused_residual_norm):
    ref, ckpt = _pair(fused_residual_norm)
    ckpt.set_activation_checkpointing(mode, every)
    assert ckpt.checkpointed_blocks  # something is checkpointed
    batch = _batch(ref.args.vocab_size)
    loss_ref, grads_ref = _loss_and_grads(ref, batch)
    loss_ckpt, grads_ckpt = _loss_and_grads(ckpt, batch)
    torch.testing.assert_close(loss_ckpt, loss_ref, **TOL)
    assert grads_ckpt.keys() == grads_ref.keys()
    for name, grad_ref in grads_ref.items():
        torch.testing.assert_close(grads_ckpt[name], grad_ref, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_checkpointed_blocks_follow_the_rule():
    model = Llama(get_preset("tiny"))  # 4 blocks
    assert model.checkpointed_blocks == []
    assert model.activation_checkpointing == ("none", 1)
    model.set_activation_checkpointing("full")
    assert model.checkpointed_blocks == [0, 1, 2, 3]
    model.set_activation_checkpointing("selective", every=2)
    assert model.checkpointed_blocks == [1, 3]  # (i + 1) % every == 0
    assert model.activation_checkpointing == ("selective", 2)
    model.set_activation_checkpointing("selective", every=1)
    assert model.checkpointed_blocks == [0, 1, 2, 3]  # every=1 is full
    model.set_activation_checkpointing("selective", every=3)
    assert model.checkpointed_blocks == [2]
    model.set_activation_checkpointing("selective", every=5)
    assert model.checkpointed_blocks == []
    model.set_activation_checkpointing("none")
    assert model.checkpointed_blocks == []


@pytest.mark.parametrize("fused_residual_norm", [False, True], ids=["plain_residual", "fused_residual"])
def test_training_forward_checkpoints_the_block_modules(monkeypatch, fused_residual_norm):
    # The module itself (not its bound forward) goes to checkpoint, so a block compiled in place
    # with layer.compile runs its compiled forward inside the checkpoint.
    _, model = _pair(fused_residual_norm)
    model.set_activation_checkpointing("selective", every=2)
    calls = _count_checkpoint_calls(monkeypatch)
    model.loss(*_batch(model.args.vocab_size))
    assert calls == [model.layers[1], model.layers[3]]
    assert all(isinstance(fn, torch.nn.Module) for fn in calls)


@pytest.mark.parametrize("context", ["eval", "no_grad"])
def test_no_checkpointing_in_eval_or_no_grad(monkeypatch, context):
    ref, ckpt = _pair()
    ckpt.set_activation_checkpointing("full")
    ids_BT, pos_BT, _ = _batch(ref.args.vocab_size)
    calls = _count_checkpoint_calls(monkeypatch)
    if context == "eval":
        ref.eval(), ckpt.eval()
        h_ref_BTD, h_ckpt_BTD = ref(ids_BT, pos_BT), ckpt(ids_BT, pos_BT)
    else:
        with torch.no_grad():
            h_ref_BTD, h_ckpt_BTD = ref(ids_BT, pos_BT), ckpt(ids_BT, pos_BT)
    assert calls == []
    torch.testing.assert_close(h_ckpt_BTD, h_ref_BTD, rtol=0, atol=0)


def test_none_after_full_runs_the_plain_forward(monkeypatch):
    ref, model = _pair()
    model.set_activation_checkpointing("full")
    model.set_activation_checkpointing("none")
    calls = _count_checkpoint_calls(monkeypatch)
    batch = _batch(ref.args.vocab_size)
    loss_ref, grads_ref = _loss_and_grads(ref, batch)
    loss, grads = _loss_and_grads(model, batch)
    assert calls == []
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
    for name, grad_ref in grads_ref.items():
        torch.testing.assert_close(grads[name], grad_ref, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("mode", "every", "runs"),
    [("none", 1, [1, 1, 1, 1]), ("full", 1, [2, 2, 2, 2]), ("selective", 2, [1, 2, 1, 2])],
)
def test_checkpointed_blocks_recompute_in_backward(mode, every, runs):
    _, model = _pair()
    model.set_activation_checkpointing(mode, every)
    counts = [0] * len(model.layers)
    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda module, args, i=i: counts.__setitem__(i, counts[i] + 1))
    loss_sum, n_tokens = model.loss(*_batch(model.args.vocab_size))
    assert counts == [1, 1, 1, 1]  # the forward pass runs each block once
    (loss_sum / n_tokens).backward()
    assert counts == runs  # backward runs the checkpointed ones again


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"mode": "partial"}, "mode"),
        ({"mode": "Full"}, "mode"),
        ({"mode": "selective", "every": 0}, "every"),
        ({"mode": "selective", "every": -2}, "every"),
        ({"mode": "selective", "every": 1.5}, "every"),
        ({"mode": "full", "every": True}, "every"),
    ],
)
def test_bad_mode_or_every_raises(kwargs, argument):
    model = Llama(get_preset("tiny"))
    with pytest.raises(ValueError, match=argument) as excinfo:
        model.set_activation_checkpointing(**kwargs)
    if argument == "mode":
        assert all(m in str(excinfo.value) for m in ("'none'", "'selective'", "'full'"))
    else:
        assert ">= 1" in str(excinfo.value)
    assert model.checkpointed_blocks == []  # unchanged
