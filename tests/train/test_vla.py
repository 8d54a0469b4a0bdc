"""The GR00T N1.6 VLA (workbench/train/vla/): training, parameter count, shapes, the flow-matching loss's
randomness, gradients, activation checkpointing and FLOPs.

The tiny preset on the CPU in float32; the full preset only on the meta device (structure and sizes, no memory).
Comparisons of the same math in another order (a checkpointed recompute) use rtol = atol = 1e-6, float32
rounding on O(1) values being ~1e-7.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from workbench.train.model import Llama, get_preset
from workbench.train.vla import (
    GR00T_N1_6_VLA,
    VLA,
    VLAArgs,
    _checkpointed,
    draws,
    get_vla_preset,
    vla_flops_per_sample,
    vla_num_params,
    vla_param_counts,
)

FULL_PARAMS = 1_838_436_384  # the figure GR00T_N1_6_VLA's docstring and docs/training.md state
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _batch(args: VLAArgs, B: int, seed: int = 0, T: int | None = None):
    """Fixed random data: uint8 images, instruction tokens from position 0, action chunks that share one random
    chunk (the task) plus a per-sample variation of 0.3 its size, and the samples' draw keys."""
    g = torch.Generator().manual_seed(seed)
    T = args.text_tokens if T is None else T
    images = torch.randint(0, 256, (B, 3, args.image_size, args.image_size), dtype=torch.uint8, generator=g)
    ids = torch.randint(0, args.backbone.vocab_size, (B, T), generator=g)
    pos = torch.arange(T).expand(B, T)
    K, A = args.action_horizon, args.action_dim
    actions = torch.randn(1, K, A, generator=g) + 0.3 * torch.randn(B, K, A, generator=g)
    keys = torch.randint(0, 2**31 - 1, (B,), dtype=torch.int32, generator=g)
    return images, ids, pos, actions, keys


def _tiny(seed: int = 0) -> VLA:
    torch.manual_seed(seed)
    return VLA(get_vla_preset("tiny-vla"))


@pytest.fixture(scope="module")
def full_meta() -> VLA:
    with torch.device("meta"):  # the real structure and sizes, no memory
        return VLA(get_vla_preset("gr00t-n1.6-vla"))


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def test_tiny_vla_trains():
    model = _tiny().train()
    batch = _batch(model.args, B=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses, t0 = [], time.perf_counter()
    for step in range(30):  # the same samples, new draws each step (as each epoch's keys are new)
        loss_sum, n = model.loss(*batch[:4], batch[4] + 8 * step)
        loss = loss_sum / n
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    per_step = (time.perf_counter() - t0) / 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"tiny-vla: loss {first:.3f} -> {last:.3f} (first/last 5 steps), {per_step * 1e3:.0f} ms/step")
    assert all(torch.isfinite(torch.tensor(losses)))
    # the velocity of the shared chunk is learnable from x_t and t alone, the variation needs the conditioning;
    # over seeds 0-3 of model and data the ratio was 0.35-0.39 (at lr 1e-2 0.70-0.79: the margin is lr's)
    assert last < 0.6 * first, losses


# ---------------------------------------------------------------------------
# Parameter count and shapes
# ---------------------------------------------------------------------------


def _part_numels(model: VLA) -> dict[str, int]:
    return {name: sum(p.numel() for p in getattr(model, name).parameters()) for name in vla_param_counts(model.args)}


def test_param_count_formula_matches_tiny_model():
    model = _tiny()
    assert vla_param_counts(model.args) == _part_numels(model)
    assert vla_num_params(model.args) == vla_num_params(model) == sum(p.numel() for p in model.parameters())


def test_param_count_formula_matches_full_preset_on_meta(full_meta):
    counts = vla_param_counts(full_meta.args)
    print("gr00t-n1.6-vla parameters:", {k: f"{v:,}" for k, v in counts.items()}, f"total {sum(counts.values()):,}")
    assert counts == _part_numels(full_meta)
    assert vla_num_params(full_meta) == vla_num_params(GR00T_N1_6_VLA) == FULL_PARAMS


def test_full_preset_encoder_shape_on_meta(full_meta):
    images = torch.zeros(2, 3, 224, 224, dtype=torch.uint8, device="meta")
    v_BIE = full_meta.vision(images)
    assert v_BIE.shape == (2, 256, 1024)
    assert full_meta.projector(v_BIE).shape == (2, 256, 2048)
    assert len(full_meta.vision.layers) == 24 and len(full_meta.backbone.layers) == 12
    assert GR00T_N1_6_VLA.num_image_tokens == 256 and GR00T_N1_6_VLA.seq_len == 512


def test_full_preset_loss_runs_on_fake_tensors():
    """The whole full-preset step on fake tensors (shapes only, no memory): the backbone over 256 + 256 = 512
    tokens, a 0-d loss and a gradient for every parameter. (Not on meta: the backbone's RMSNorm asks autocast
    about the tensor's device, which meta is not.)"""
    with FakeTensorMode():
        model = VLA(get_vla_preset("gr00t-n1.6-vla"))
        images = torch.zeros(2, 3, 224, 224, dtype=torch.uint8)
        ids = torch.zeros(2, 256, dtype=torch.int64)
        pos = torch.arange(256).expand(2, 256)
        assert model.states(images, ids, pos).shape == (2, 512, 2048)
        loss_sum, n = model.loss(images, ids, pos, torch.zeros(2, 16, 32), torch.arange(2, dtype=torch.int32))
        assert loss_sum.shape == () and n.shape == ()
        loss_sum.backward()
        assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


@pytest.mark.parametrize("T", [16, 10])
def test_backbone_sequence_is_image_then_text_tokens(T):
    model = _tiny().eval()
    a = model.args
    images, ids, pos, _, _ = _batch(a, B=3, T=T)
    with torch.no_grad():
        h_BSD = model.states(images, ids, pos)
        other_ids = (ids + 1) % a.backbone.vocab_size
        h_other = model.states(images, other_ids, pos)
    assert h_BSD.shape == (3, a.num_image_tokens + T, a.backbone.hidden_size)
    # causal over [image, text]: the image tokens come first, so other text leaves their states unchanged
    I = a.num_image_tokens
    torch.testing.assert_close(h_other[:, :I], h_BSD[:, :I], rtol=0, atol=0)
    assert not torch.allclose(h_other[:, I:], h_BSD[:, I:])


def test_loss_shapes_and_count():
    model = _tiny()
    B = 8
    batch = _batch(model.args, B=B)
    loss_sum, n = model(*batch)  # forward is loss
    assert loss_sum.shape == () and loss_sum.dtype == torch.float32
    assert n.shape == () and n.dtype == torch.int64 and n.item() == B * 8 * 4
    # untrained, the prediction is small (output weights of std 0.02), so the mean is about E[(a - eps)^2] =
    # E[a^2] + 1; the mean of 256 squares of unit-variance terms has a relative sd under 10%, hence 30%
    expected = (batch[3] ** 2).mean().item() + 1
    assert abs(loss_sum.item() / n.item() - expected) < 0.3 * expected


# ---------------------------------------------------------------------------
# The flow-matching draws
# ---------------------------------------------------------------------------


def test_the_draws_are_the_samples_not_the_generators():
    """The same keys give the same loss whatever torch's generator state; other keys another loss."""
    model = _tiny()
    batch = _batch(model.args, B=2)

    def loss_at(seed: int, keys: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return model.loss(*batch[:4], keys)[0]

    assert torch.equal(loss_at(1, batch[4]), loss_at(2, batch[4]))
    assert not torch.equal(loss_at(1, batch[4]), loss_at(1, batch[4] + 1))


def test_a_samples_draws_do_not_depend_on_its_micro_batch_or_on_compile():
    """The same samples and weights give the same summed loss split into micro-batches of 4, 2 or 1, and with the
    head compiled: the numerics guard compares a VLA trial with the base at another micro-batch or compile setting
    (numerics.py). The tolerance is float32 rounding: a sum in another order, Box-Muller's log and cos."""
    model = _tiny()
    batch = _batch(model.args, B=8)

    def summed(fn, parts: int) -> float:
        with torch.no_grad():
            return sum(fn(*(x[i::parts] for x in batch))[0].item() for i in range(parts))

    whole = summed(model.loss, 1)
    for parts in (2, 4, 8):
        assert summed(model.loss, parts) == pytest.approx(whole, rel=1e-5), parts
    model.head_loss = torch.compile(model.head_loss)  # as compile_scope: layer compiles it (workload.py)
    assert summed(model.loss, 1) == pytest.approx(whole, rel=1e-5)
    assert summed(model.loss, 2) == pytest.approx(whole, rel=1e-5)


def test_draws_are_uniform_normal_and_independent():
    """u ~ U(0, 1) and eps ~ N(0, 1) from consecutive keys (the worst case for a hash): moments, the normal's
    tails, and no correlation between neighbouring elements or neighbouring samples. With 100,000 samples of 4
    elements the standard error of a correlation is 0.003 and of eps's mean 0.0016: the bounds are 5 of them."""
    u, eps = draws(torch.arange(100_000, dtype=torch.int32), (2, 2))
    assert u.shape == (100_000,) and eps.shape == (100_000, 2, 2) and eps.dtype == u.dtype == torch.float32
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    e = eps.flatten(1)
    assert abs(e.mean().item()) < 0.008 and abs(e.std().item() - 1) < 0.008
    assert abs((e.abs() > 1.96).float().mean().item() - 0.05) < 0.004  # the two-sided 5% tail
    for a, b in ((e[:, 0], e[:, 1]), (e[:-1, 0], e[1:, 0]), (u[:-1], u[1:]), (u, e[:, 0])):
        assert abs(torch.corrcoef(torch.stack((a, b)))[0, 1].item()) < 0.015
    again_u, again_eps = draws(torch.arange(100_000, dtype=torch.int64), (2, 2))  # the key's dtype does not matter
    assert torch.equal(again_u, u) and torch.equal(again_eps, eps)


def test_flow_inputs_interpolate_and_follow_the_time_density():
    model = _tiny()
    a = model.args
    actions = torch.randn(100_000, a.action_horizon, a.action_dim)
    x_t, t_B, velocity = model.flow_inputs(actions, torch.arange(100_000, dtype=torch.int32))
    t = t_B[:, None, None]
    # x_t = (1 - t) eps + t a and velocity = a - eps  =>  x_t + (1 - t) velocity = a
    torch.testing.assert_close(x_t + (1 - t) * velocity, actions, rtol=0, atol=1e-5)
    assert 0 <= t_B.min() and t_B.max() <= a.flow_t_max
    # (s - t) / s ~ Beta(1.5, 1): mean 1.5 / 2.5, so E[t] = 0.4 s; sd of t 0.26, so 6 standard errors < 0.005
    assert abs(t_B.mean().item() - 0.4 * a.flow_t_max) < 0.005
    eps = actions - velocity
    assert abs(eps.mean().item()) < 0.01 and abs(eps.std().item() - 1) < 0.01


# ---------------------------------------------------------------------------
# Gradients and activation checkpointing
# ---------------------------------------------------------------------------


def _loss_and_grads(model: VLA, batch):
    model.zero_grad(set_to_none=True)
    loss_sum, n = model.loss(*batch)
    (loss_sum / n).backward()
    return loss_sum.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_gradients_reach_every_parameter():
    model = _tiny().train()
    _, grads = _loss_and_grads(model, _batch(model.args, B=2))
    assert len(grads) == len(list(model.parameters()))
    for name, g in grads.items():
        assert g is not None, name
        assert torch.isfinite(g).all() and g.abs().sum() > 0, name


@pytest.mark.parametrize(("mode", "every"), [("full", 1), ("selective", 2)])
def test_activation_checkpointing_keeps_loss_and_grads(monkeypatch, mode, every):
    ref, other = _tiny().train(), _tiny().train()
    batch = _batch(ref.args, B=2)
    want_loss, want_grads = _loss_and_grads(ref, batch)
    calls = []
    real = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting)
    other.set_activation_checkpointing(mode, every)
    got_loss, got_grads = _loss_and_grads(other, batch)
    ck = other.checkpointed_blocks
    assert ck == ({"vision": [0, 1], "backbone": [0, 1]} if mode == "full" else {"vision": [1], "backbone": [1]})
    # the block modules themselves are checkpointed (a block compiled in place runs its graph inside)
    assert calls == [other.vision.layers[i] for i in ck["vision"]] + [other.backbone.layers[i] for i in ck["backbone"]]
    torch.testing.assert_close(got_loss, want_loss, **TOL)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **TOL, msg=name)


def test_checkpoint_rule_is_llamas():
    llama = Llama(get_preset("tiny"))  # 4 blocks
    cases = [("none", 1), ("full", 3), ("selective", 1), ("selective", 2), ("selective", 3), ("selective", 9)]
    for mode, every in cases:
        llama.set_activation_checkpointing(mode, every)
        assert _checkpointed(mode, every, len(llama.layers)) == llama.checkpointed_blocks, (mode, every)
    with pytest.raises(ValueError, match="mode must be one of"):
        _tiny().set_activation_checkpointing("some")


# ---------------------------------------------------------------------------
# FLOPs, sampling, args
# ---------------------------------------------------------------------------


def _rows(name: str, a: VLAArgs) -> int:
    """Rows per sample the parameter ``name`` is applied to (the formula's rule)."""
    part = name.split(".")[0]
    if part == "action_head":
        if ".kv." in name:
            return a.seq_len
        if name.startswith(("action_head.time_", "action_head.final_ada")) or ".ada." in name:
            return 1
        return a.action_horizon
    return a.seq_len if part == "backbone" else a.num_image_tokens


def test_flops_per_sample_matches_counted_matmuls():
    """FlopCounterMode counts every matmul and attention matmul of a real forward + backward. The formula counts
    6 x parameters x rows (flops.py's convention), so it is above the count by exactly what the counter does not
    see: biases and norm scales (added, not multiplied), and the input gradient of the three matmuls whose
    input needs none (patch_embed on pixels, action_in on x_t, time_in on the sinusoids: 2 of their 6)."""
    model = _tiny().train()
    a, B = model.args, 4
    batch = _batch(a, B=B)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):  # attention as matmuls
        loss_sum, n = model.loss(*batch)
        (loss_sum / n).backward()
    measured, rem = divmod(counter.get_total_flops(), B)
    assert rem == 0
    unseen = sum(6 * p.numel() * _rows(name, a) for name, p in model.named_parameters() if p.dim() == 1)
    h = model.action_head
    unseen += 2 * (model.vision.patch_embed.weight.numel() * a.num_image_tokens
                   + h.action_in.weight.numel() * a.action_horizon + h.time_in.weight.numel())
    formula = vla_flops_per_sample(a)
    print(f"tiny-vla FLOPs per sample: formula {formula:,}, counted {measured:,} + unseen {unseen:,}")
    assert formula == measured + unseen
    full = vla_flops_per_sample(GR00T_N1_6_VLA)
    assert full == 2_928_029_199_360  # the figure the preset's docstring states
    assert vla_flops_per_sample(GR00T_N1_6_VLA, text_tokens=128) < full


def test_sample_actions_shape_and_seed():
    model = _tiny().eval()
    images, ids, pos, _, _ = _batch(model.args, B=3)
    torch.manual_seed(5)
    a1 = model.sample_actions(images, ids, pos, steps=4)
    torch.manual_seed(5)
    a2 = model.sample_actions(images, ids, pos, steps=4)
    assert a1.shape == (3, 8, 4) and torch.isfinite(a1).all()
    assert torch.equal(a1, a2)


def test_inputs_are_checked():
    model = _tiny()
    images, ids, pos, actions, keys = _batch(model.args, B=2)
    with pytest.raises(ValueError, match="images_BCHW must be uint8"):
        model.loss(images.float(), ids, pos, actions, keys)
    with pytest.raises(ValueError, match="over text_tokens=16"):
        model.loss(images, torch.cat((ids, ids), 1), torch.cat((pos, pos), 1), actions, keys)
    with pytest.raises(ValueError, match="actions_BKA must be floating of shape"):
        model.loss(images, ids, pos, actions[:, :3], keys)
    with pytest.raises(ValueError, match=r"keys_B must be integer of shape \(2,\)"):
        model.loss(images, ids, pos, actions, keys[:1])
    with pytest.raises(ValueError, match="keys_B must be integer"):
        model.loss(images, ids, pos, actions, keys.float())


def test_args_validation_names_field():
    base = get_vla_preset("tiny-vla")
    with pytest.raises(ValueError, match="patch_size=7 must divide image_size=32"):
        replace(base, patch_size=7)
    with pytest.raises(ValueError, match="head_heads=3 must divide head_hidden=64"):
        replace(base, head_heads=3)
    with pytest.raises(ValueError, match="must not exceed backbone.max_position_embeddings=64"):
        replace(base, text_tokens=49)
    with pytest.raises(ValueError, match="vision_layers must be a positive int"):
        replace(base, vision_layers=0)
    with pytest.raises(ValueError, match="channels must be 3"):
        replace(base, channels=1)
    with pytest.raises(ValueError, match="flow_t_max must be in"):
        replace(base, flow_t_max=1.5)


def test_get_vla_preset_returns_copy_and_lists_names():
    args = get_vla_preset("gr00t-n1.6-vla")
    args.backbone.num_hidden_layers = 99
    assert get_vla_preset("gr00t-n1.6-vla").backbone.num_hidden_layers == 12
    with pytest.raises(ValueError, match=r"gr00t-n1\.6-vla.*tiny-vla"):
        get_vla_preset("pi0")
