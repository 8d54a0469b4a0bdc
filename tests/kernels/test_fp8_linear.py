"""FP8 Linears with the project's casts (``fp8_cast: triton``, workbench/train/fp8_linear.py) against torchao's
``Float8Linear`` (tensorwise), which they must reproduce: the casts are bit-identical (test_fp8_cast.py) and the
matmuls the same ``torch._scaled_mm`` calls (off CUDA, torchao's ``emulate`` formula), so outputs and weight
gradients are equal exactly; the input's gradient is a sum over the Linears sharing it, formed in another order
than autograd's (fp32 rounding only). On the CPU the kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from _kernel_testing import DEVICE, randn

from workbench.config import ConfigError, merge_overrides, preset_config
from workbench.train import ops
from workbench.train.fp8 import convert_to_fp8, torchao_config
from workbench.train.model import Llama, get_preset, project

pytest.importorskip("torchao")
from torchao.float8 import convert_to_float8_training  # noqa: E402

from workbench.train.fp8_linear import Fp8Linear  # noqa: E402


def _cd(**over):
    base = {"loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_cast": "triton",
            "loongforge.compute_domain.fp8_modules.size_filter": False}
    return merge_overrides(preset_config("tiny"), {**base, **over}).loongforge.compute_domain


def test_shared_input_projections_match_torchao(gen):
    """x through three Linears that share it (q/k/v): x cast once, three matmuls; forward, weight gradients
    equal torchao's exactly, the input gradient to fp32 rounding of a 3-term sum."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(64, n, bias=False).to(DEVICE) for n in (64, 32, 32)]
    ours = [copy.deepcopy(m) for m in linears]
    for m in ours:
        m.__class__ = Fp8Linear
    ref = torch.nn.Sequential(*copy.deepcopy(linears))
    convert_to_float8_training(ref, config=torchao_config("tensorwise", DEVICE.type))
    x = randn(gen, 2, 16, 64, scale=3.0)
    up = [randn(gen, 2, 16, m.out_features) for m in linears]

    x1 = x.clone().requires_grad_(True)
    outs = project(x1, tuple(ours))
    torch.autograd.backward(outs, up)
    x2 = x.clone().requires_grad_(True)
    ref_outs = [m(x2) for m in ref]
    torch.autograd.backward(ref_outs, up)

    for a, b in zip(outs, ref_outs):
        assert torch.equal(a, b)
    for a, b in zip(ours, ref):
        assert torch.equal(a.weight.grad, b.weight.grad)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-6, atol=1e-6)
    # and FP8's own error is visible: the same Linears in fp32 differ by far more than that
    exact = linears[0](x)
    assert (outs[0] - exact).abs().max() > 1e-3 * exact.abs().max()


def test_the_tiny_model_trains_as_with_torchao(gen):
    """Three AdamW steps of a 2-block tiny model with every decoder Linear in FP8: the project's casts give the
    losses torchao gives, to fp32 rounding (the input gradients' sums), and far from the fp32 losses' offset."""
    args = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2)
    B, T = 2, 16  # B x T a multiple of 16, as FP8 matmuls need
    ids = torch.randint(0, args.vocab_size, (B, T), generator=gen, device=DEVICE)
    pos = torch.arange(T, device=DEVICE).repeat(B, 1)
    mask = torch.ones(B, T, dtype=torch.bool, device=DEVICE)

    def run(fp8_cast: str | None) -> list[float]:
        torch.manual_seed(0)
        model = Llama(args, ops.resolve({op: "torch" for op in ops.OP_NAMES})).to(DEVICE)
        if fp8_cast is not None:
            chosen = convert_to_fp8(model, _cd(**{"loongforge.compute_domain.fp8_cast": fp8_cast}), DEVICE.type)
            assert len(chosen) == 2 * 7
            kind = Fp8Linear if fp8_cast == "triton" else torch.nn.Linear
            assert all(isinstance(model.get_submodule(n), kind) for n in chosen)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            loss_sum, n = model.loss(ids, pos, mask)
            (loss_sum / n).backward()
            opt.step()
            opt.zero_grad()
            losses.append((loss_sum / n).item())
        return losses

    ours, theirs, fp32 = run("triton"), run("torchao"), run(None)
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert max(abs(a - b) for a, b in zip(ours, fp32)) > 1e-4  # the FP8 path did run


def test_triton_casts_are_refused_off_tensorwise_and_without_the_interpreter(monkeypatch):
    with pytest.raises(ConfigError, match=r"fp8_cast: got 'triton' with fp8: 'rowwise'; the Triton casts implement "
                                          r"the tensorwise recipe only"):
        _cd(**{"loongforge.compute_domain.fp8": "rowwise"})
    from kernels import fp8_cast

    monkeypatch.setattr(fp8_cast, "INTERPRETED", False)
    model = Llama(dataclasses.replace(get_preset("tiny"), num_hidden_layers=1))
    with pytest.raises(ConfigError, match=r"loongforge\.compute_domain\.fp8_cast: got 'triton', but the Triton casts "
                                          r"run on CUDA"):
        convert_to_fp8(model, _cd(), "cpu")
    with pytest.raises(ConfigError, match=r"loongforge\.compute_domain\.fp8_head: got true, but the Triton casts "
                                          r"run on CUDA .*; set fp8_head: false"):
        convert_to_fp8(model, _cd(**{"loongforge.compute_domain.fp8_cast": "torchao",
                                     "loongforge.compute_domain.fp8_head": True}), "cpu")


def test_fp8_head_matches_torchao_on_the_unpadded_head(gen):
    """The FP8 loss op (``fp8_head``) on vocab 4,000 and 30 positions, both padded inside (to 4,032 and 32) against
    torchao's ``Float8Linear`` on the unpadded 4,000-row head: zero rows change no amax, so the same scales and FP8
    values, and the loss and both gradients agree to fp32 rounding; the padded logits take no part."""
    from workbench.train.fp8_linear import linear_cross_entropy_fp8

    N, D, V = 30, 64, 4000
    h = randn(gen, N, D, scale=2.0)
    w = randn(gen, V, D, scale=0.05)
    labels = torch.randint(0, V, (N,), generator=gen, device=DEVICE)
    labels[0] = V - 1  # the last real class, next to the padding
    mask = torch.ones(N, dtype=torch.bool, device=DEVICE)
    mask[3] = False

    h1, w1 = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, n = linear_cross_entropy_fp8(h1, w1, labels, mask)
    loss.backward()

    head = torch.nn.Sequential(torch.nn.Linear(D, V, bias=False)).to(DEVICE)
    head[0].weight.data.copy_(w)
    convert_to_float8_training(head, config=torchao_config("tensorwise", DEVICE.type))
    h2 = h.clone().requires_grad_(True)
    rows = torch.nn.functional.pad(h2, (0, 0, 0, 32 - N))  # torchao's matmul needs the rows a multiple of 16 too
    logits = head(rows)[:N].float()
    want = torch.nn.functional.cross_entropy(logits, labels.masked_fill(~mask, -100), reduction="sum")
    want.backward()

    assert n.item() == N - 1
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w1.grad, head[0].weight.grad, rtol=1e-5, atol=1e-6)
    assert h1.grad[3].abs().max() == 0  # a masked position gets no gradient
    # and the FP8 rounding is there: the fp32 loss differs by far more than that
    exact = torch.nn.functional.cross_entropy(h @ w.T, labels.masked_fill(~mask, -100), reduction="sum")
    assert abs(exact.item() - loss.item()) > 1e-4 * abs(exact.item())


def test_padded_vocab_tiny_model_gives_the_unpadded_loss(gen):
    """The tiny model at vocab 4,000 (not a multiple of 64): its loss through each loss op that pads the head's
    rows to 4,032 (torch, the fused Triton loss) equals the unpadded loss from the materialised logits to 1e-5."""
    args = dataclasses.replace(get_preset("tiny"), num_hidden_layers=2, vocab_size=4000)
    B, T = 2, 16
    ids = torch.randint(0, args.vocab_size, (B, T), generator=gen, device=DEVICE)
    pos = torch.arange(T, device=DEVICE).repeat(B, 1)
    mask = torch.ones(B, T, dtype=torch.bool, device=DEVICE)
    torch.manual_seed(0)
    model = Llama(args, ops.resolve({})).to(DEVICE)
    with torch.no_grad():
        logits = model.logits(ids, pos)[:, :-1].reshape(-1, args.vocab_size)
        want = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:].reshape(-1))
        for backend in ("torch", "triton"):
            model.ops = ops.resolve({"loss": backend})
            loss_sum, n = model.loss(ids, pos, mask)
            assert (loss_sum / n).item() == pytest.approx(want.item(), rel=1e-5, abs=1e-5), backend


def test_trainer_runs_the_fp8_head(tmp_path):
    """``fp8_head: true`` through the Trainer: the loss op is the FP8 one, every decoder Linear is an Fp8Linear,
    and the loss is finite."""
    from workbench.train import synthetic_data_dir
    from workbench.train.trainer import Trainer

    cfg = merge_overrides(preset_config("tiny"), {
        "hardware.device": "cpu", "data.seq_len": 64, "data.micro_batch_size": 2, "data.bucket_width": 64,
        "data.num_workers": 1, "data.packing": "fill", "training.dtype": "fp32", "training.max_steps": 3,
        "training.warmup_measure_steps": 1, "training.log_every": 1,
        "loongforge.compute_domain.fp8": "tensorwise", "loongforge.compute_domain.fp8_cast": "triton",
        "loongforge.compute_domain.fp8_head": True, "loongforge.compute_domain.fp8_modules.size_filter": False})
    data = synthetic_data_dir(vocab_size=4096, seq_len=64, min_len=cfg.data.min_len)
    trainer = Trainer(cfg, data_dir=data, out_dir=tmp_path)
    try:
        assert trainer.model.ops.loss.__name__ == "linear_cross_entropy_fp8"
        summary = trainer.run()
    finally:
        trainer.close()
    assert summary["ops/backends"]["loss"] == "fp8" and summary["fp8/converted_linears"] == 4 * 7
    import pandas as pd

    losses = pd.read_csv(tmp_path / "phases.csv")["loss"]
    assert len(losses) == 3 and losses.between(7.0, 9.0).all()  # ln(4096) = 8.3 at the start: finite, sane
