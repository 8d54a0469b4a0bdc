"""Llama decoder, HF config loading, the ops switch point and FLOP accounting.

Shapes are small so the file runs in a few seconds on 2 CPU cores. Float32
comparisons use atol 1e-5: the paths compared do the same math in a different
order (fused SDPA vs explicit softmax, one sequence vs a packed row), so they
differ by float32 rounding (~1e-7 relative) on O(1) activations, well below it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from workbench.train import model as model_mod
from workbench.train import ops as ops_mod
from workbench.train.flops import PEAK_TFLOPS, flops_per_token, mfu, peak_tflops
from workbench.train.model import (
    GR00T_N1_6,
    Llama,
    ModelArgs,
    get_preset,
    num_params,
    rope_cos_sin,
)
from workbench.train.ops import linear_cross_entropy_torch, register, resolve, rms_norm_torch, rope_torch
from workbench.train.hf import read_hf_config

ASSETS = Path(__file__).parents[1] / "assets"
GQA_CONFIG = ASSETS / "gqa_config.json"
ATOL = 1e-5


def _small_args(**overrides) -> ModelArgs:
    return replace(read_hf_config(GQA_CONFIG), **overrides)


def _batch(args: ModelArgs, B: int, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids_BT = torch.randint(0, args.vocab_size, (B, T), generator=g)
    pos_BT = torch.arange(T).expand(B, T)
    return ids_BT, pos_BT


# ---------------------------------------------------------------------------
# Shapes, presets, config
# ---------------------------------------------------------------------------


def test_tiny_preset_shapes():
    args = get_preset("tiny")
    assert (args.hidden_size, args.num_attention_heads, args.num_key_value_heads) == (128, 4, 2)
    assert args.vocab_size == 4096 and args.tie_word_embeddings
    torch.manual_seed(0)
    model = Llama(args)
    ids_BT, pos_BT = _batch(args, B=2, T=16)
    assert model(ids_BT, pos_BT).shape == (2, 16, 128)
    assert model.logits(ids_BT, pos_BT).shape == (2, 16, 4096)
    loss_sum, n_tokens = model.loss(ids_BT, pos_BT, torch.ones(2, 16, dtype=torch.bool))
    assert loss_sum.shape == () and loss_sum.dtype == torch.float32
    assert n_tokens.item() == 2 * 15
    # Untrained, the mean loss is close to ln(V): init keeps logits small.
    assert abs(loss_sum.item() / n_tokens.item() - math.log(4096)) < 0.5


def test_get_preset_returns_copy_and_lists_names():
    args = get_preset("tiny")
    args.num_hidden_layers = 99
    assert get_preset("tiny").num_hidden_layers == 4
    with pytest.raises(ValueError, match=r"gr00t-n1\.6.*tiny"):
        get_preset("llama-70b")


def test_hf_gqa_config_loads_and_trains():
    args = read_hf_config(GQA_CONFIG)
    assert args.num_key_value_heads == 2 < args.num_attention_heads == 4
    assert args.rope_theta == 500000.0 and args.rms_norm_eps == 1e-6
    assert args.tie_word_embeddings is False
    torch.manual_seed(0)
    model = Llama(args)
    ids_BT, pos_BT = _batch(args, B=2, T=12)
    loss_sum, n_tokens = model.loss(ids_BT, pos_BT, torch.ones(2, 12, dtype=torch.bool))
    (loss_sum / n_tokens).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_model_args_validation_names_field():
    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=32,
        max_position_embeddings=16,
    )
    with pytest.raises(ValueError, match="num_attention_heads=5 must divide hidden_size=64"):
        ModelArgs(**{**base, "num_attention_heads": 5, "num_key_value_heads": 5})
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        ModelArgs(**{**base, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="vocab_size"):
        ModelArgs(**{**base, "vocab_size": 0})


# ---------------------------------------------------------------------------
# Attention and RoPE
# ---------------------------------------------------------------------------


def _reference_attention(attn, x_BTD, cos_BTd, sin_BTd):
    """Explicit HF-style attention: repeat_kv, masked softmax, no SDPA."""
    B, T, _ = x_BTD.shape
    H, K, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q_BHTd = attn.q_proj(x_BTD).view(B, T, H, d).transpose(1, 2)
    k_BKTd = attn.k_proj(x_BTD).view(B, T, K, d).transpose(1, 2)
    v_BKTd = attn.v_proj(x_BTD).view(B, T, K, d).transpose(1, 2)
    q_BHTd, k_BKTd = rope_torch(q_BHTd, k_BKTd, cos_BTd, sin_BTd)
    # HF repeat_kv: kv head j serves query heads j*(H/K) .. (j+1)*(H/K)-1.
    k_BHTd = k_BKTd[:, :, None].expand(B, K, H // K, T, d).reshape(B, H, T, d)
    v_BHTd = v_BKTd[:, :, None].expand(B, K, H // K, T, d).reshape(B, H, T, d)
    scores_BHTT = q_BHTd @ k_BHTd.transpose(-1, -2) / math.sqrt(d)
    future_TT = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs_BHTT = scores_BHTT.masked_fill(future_TT, float("-inf")).softmax(-1)
    o_BTD = (probs_BHTT @ v_BHTd).transpose(1, 2).reshape(B, T, H * d)
    return attn.o_proj(o_BTD)


@pytest.mark.parametrize("sdpa_gqa", [True, False], ids=["enable_gqa", "repeat_interleave"])
def test_gqa_attention_matches_repeat_kv_reference(monkeypatch, sdpa_gqa):
    monkeypatch.setattr(model_mod, "_SDPA_HAS_GQA", sdpa_gqa and model_mod._SDPA_HAS_GQA)
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args)
    attn = model.layers[0].self_attn
    x_BTD = torch.randn(2, 10, args.hidden_size)
    pos_BT = torch.tensor([list(range(10)), [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    cos_BTd, sin_BTd = model.rotary(pos_BT)
    with torch.no_grad():
        got = attn(x_BTD, cos_BTd, sin_BTd)
        want = _reference_attention(attn, x_BTD, cos_BTd, sin_BTd)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_rope_relative_property():
    """q_m . k_n depends on m - n only."""
    d, theta = 16, 10000.0
    g = torch.Generator().manual_seed(0)
    q_d, k_d = torch.randn(d, generator=g), torch.randn(d, generator=g)

    def dot(m: int, n: int) -> float:
        cos_2d, sin_2d = rope_cos_sin(d, torch.tensor([m, n]), theta)
        q_11Td = q_d.expand(1, 1, 2, d)
        k_11Td = k_d.expand(1, 1, 2, d)
        q_rot, k_rot = rope_torch(q_11Td, k_11Td, cos_2d[None], sin_2d[None])
        return float(q_rot[0, 0, 0] @ k_rot[0, 0, 1])

    base = dot(7, 3)
    for shift in (1, 25, 300):
        assert dot(7 + shift, 3 + shift) == pytest.approx(base, abs=1e-4)
    assert dot(8, 3) != pytest.approx(base, abs=1e-2)  # and it does depend on m - n


def test_rope_rotates_half_pairs():
    """Rotate-half convention: dims i and i + d/2 form a pair (not 2i, 2i+1)."""
    d = 4
    cos_1d, sin_1d = rope_cos_sin(d, torch.tensor([3]), 10000.0)
    q_111d = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, d)
    q_rot, _ = rope_torch(q_111d, q_111d, cos_1d[None], sin_1d[None])
    angle = 3.0  # position 3 x inv_freq[0] = 1
    torch.testing.assert_close(q_rot.flatten(), torch.tensor([math.cos(angle), 0.0, math.sin(angle), 0.0]))


def test_rope_table_matches_hf_layout():
    cos_Pd, sin_Pd = rope_cos_sin(8, 5, 10000.0)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.outer(torch.arange(5).float(), inv_freq)
    torch.testing.assert_close(cos_Pd, torch.cat((freqs, freqs), -1).cos())
    torch.testing.assert_close(sin_Pd, torch.cat((freqs, freqs), -1).sin())


def test_packed_documents_prefix_matches_separate_run():
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args).eval()
    g = torch.Generator().manual_seed(1)
    doc_a, doc_b = torch.randint(0, args.vocab_size, (7,), generator=g), torch.randint(
        0, args.vocab_size, (9,), generator=g
    )
    packed_1T = torch.cat((doc_a, doc_b))[None]
    restart_1T = torch.cat((torch.arange(7), torch.arange(9)))[None]
    with torch.no_grad():
        h_packed = model(packed_1T, restart_1T)
        h_a = model(doc_a[None], torch.arange(7)[None])
        h_continuous = model(packed_1T, torch.arange(16)[None])
    # Causal: the first document is unaffected by what is packed after it.
    torch.testing.assert_close(h_packed[:, :7], h_a, atol=ATOL, rtol=0)
    # Position ids reach RoPE: restarting them changes the second document's states.
    assert not torch.allclose(h_packed[:, 7:], h_continuous[:, 7:], atol=1e-3)


def test_forward_invariant_to_shifting_all_positions():
    """RoPE only encodes relative position, so a global offset changes nothing."""
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args).eval()
    ids_BT, pos_BT = _batch(args, B=2, T=12)
    with torch.no_grad():
        torch.testing.assert_close(model(ids_BT, pos_BT + 50), model(ids_BT, pos_BT), atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------


def test_loss_ignores_masked_positions():
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args).eval()
    B, T = 2, 12
    ids_BT, pos_BT = _batch(args, B, T)
    mask_BT = torch.ones(B, T, dtype=torch.bool)
    mask_BT[0, 9:] = False  # row 0 padded at its tail
    mask_BT[1, 0] = False  # position 0 is never a label, masked or not
    with torch.no_grad():
        loss_sum, n_tokens = model.loss(ids_BT, pos_BT, mask_BT)
        # Padding tokens are labels only of masked positions and inputs only of
        # later (also masked) ones: changing them must not move the loss.
        padded_BT = ids_BT.clone()
        padded_BT[0, 9:] = (ids_BT[0, 9:] + 1) % args.vocab_size
        loss_padded, n_padded = model.loss(padded_BT, pos_BT, mask_BT)
        logits_BTV = model.logits(ids_BT, pos_BT)
    assert n_tokens.item() == n_padded.item() == mask_BT[:, 1:].sum().item() == 8 + 11
    torch.testing.assert_close(loss_padded, loss_sum, atol=ATOL, rtol=0)
    # Matches a plain cross-entropy over the unmasked next-token pairs.
    keep_BT1 = mask_BT[:, 1:]
    want = F.cross_entropy(logits_BTV[:, :-1][keep_BT1], ids_BT[:, 1:][keep_BT1], reduction="sum")
    torch.testing.assert_close(loss_sum, want, atol=1e-4, rtol=1e-6)


def test_linear_cross_entropy_masked_labels_may_be_garbage():
    g = torch.Generator().manual_seed(0)
    h_ND, w_VD = torch.randn(6, 8, generator=g), torch.randn(11, 8, generator=g)
    labels_N = torch.tensor([1, 2, 3, 4, 5, 6])
    mask_N = torch.tensor([1, 1, 0, 1, 0, 1], dtype=torch.bool)
    loss_sum, n = linear_cross_entropy_torch(h_ND, w_VD, labels_N, mask_N)
    garbage_N = labels_N.masked_fill(~mask_N, -1)  # e.g. a padding id outside the vocab
    loss_garbage, _ = linear_cross_entropy_torch(h_ND, w_VD, garbage_N, mask_N)
    assert n.item() == 4 and loss_garbage.item() == loss_sum.item()
    want = F.cross_entropy(h_ND[mask_N] @ w_VD.T, labels_N[mask_N], reduction="sum")
    torch.testing.assert_close(loss_sum, want)


# ---------------------------------------------------------------------------
# Ops switch point
# ---------------------------------------------------------------------------


def test_resolve_unknown_backend_names_op_and_backends():
    with pytest.raises(ValueError, match=r"'rmsnorm'.*'nope'.*\['torch'"):
        resolve({"rmsnorm": "nope"})
    with pytest.raises(ValueError, match="unknown op"):
        resolve({"layernorm": "torch"})
    with pytest.raises(ValueError, match="unknown op"):
        register("layernorm", "torch", rms_norm_torch)
    assert resolve().backends == {"rmsnorm": "torch", "swiglu": "torch", "rope": "torch", "loss": "torch"}


def test_registered_backend_is_used_by_model(monkeypatch):
    calls = []

    def counting_rmsnorm(x, weight, eps, out_dtype=None):
        calls.append(x.shape)
        return rms_norm_torch(x, weight, eps, out_dtype)

    monkeypatch.setitem(ops_mod.OPS, "rmsnorm", dict(ops_mod.OPS["rmsnorm"]))
    register("rmsnorm", "counting", counting_rmsnorm)
    args = _small_args()
    torch.manual_seed(0)
    reference = Llama(args)
    torch.manual_seed(0)
    model = Llama(args, ops=resolve({"rmsnorm": "counting"}))
    ids_BT, pos_BT = _batch(args, B=1, T=5)
    with torch.no_grad():
        torch.testing.assert_close(model(ids_BT, pos_BT), reference(ids_BT, pos_BT))
    assert len(calls) == 2 * args.num_hidden_layers + 1  # two per block + the final norm
    reference.set_ops(resolve({"rmsnorm": "counting"}))
    with torch.no_grad():
        reference(ids_BT, pos_BT)
    assert len(calls) == 2 * (2 * args.num_hidden_layers + 1)


def test_rms_norm_keeps_dtype():
    x_BTD = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    w_D = torch.randn(8)
    y = rms_norm_torch(x_BTD, w_D, 1e-6)
    assert y.dtype == torch.bfloat16
    xf = x_BTD.float()
    want = xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w_D
    torch.testing.assert_close(y, want.bfloat16())
    assert rms_norm_torch(x_BTD.float(), w_D, 1e-6, torch.bfloat16).dtype == torch.bfloat16


def test_norms_write_autocast_dtype(monkeypatch):
    """Under autocast the norms write their output in autocast's dtype (their consumers are all matmuls that
    would cast it first): the forward is bitwise that of norms that return float32 and leave the cast to
    autocast. The gradients differ only where a norm feeds several matmuls (q, k, v; gate, up): their bf16
    gradients are summed in bf16 instead of fp32, one more bf16 rounding."""
    seen = []

    def fp32_rmsnorm(x, weight, eps, out_dtype=None):  # the old contract: out_dtype ignored
        seen.append(out_dtype)
        return rms_norm_torch(x, weight, eps)

    monkeypatch.setitem(ops_mod.OPS, "rmsnorm", dict(ops_mod.OPS["rmsnorm"]))
    register("rmsnorm", "fp32", fp32_rmsnorm)
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args)
    ids_BT, pos_BT = _batch(args, B=2, T=7)
    mask_BT = torch.ones_like(ids_BT, dtype=torch.bool)
    results = []
    for backend in ("torch", "fp32"):
        model.set_ops(resolve({"rmsnorm": backend}))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model(ids_BT, pos_BT)
            loss_sum, n = model.loss(ids_BT, pos_BT, mask_BT)
        grads = torch.autograd.grad(loss_sum / n, list(model.parameters()))
        results.append((h, loss_sum.detach(), grads))
    assert results[0][0].dtype == torch.bfloat16 and results[1][0].dtype == torch.float32
    assert torch.equal(results[0][0], results[1][0].bfloat16())
    assert set(seen) == {torch.bfloat16}
    assert torch.equal(results[0][1], results[1][1])
    for (name, _), a, b in zip(model.named_parameters(), results[0][2], results[1][2]):
        if name.startswith(("lm_head", "norm.", f"layers.{args.num_hidden_layers - 1}.mlp.")):
            assert torch.equal(a, b), name  # upstream of every multi-consumer norm: the same gradient
        else:  # the bf16 sum: a relative rounding of 2^-8 per sum, compounded over the layers after it
            torch.testing.assert_close(a, b, rtol=0, atol=2e-2 * b.abs().max().item(), msg=name)
    model.set_ops(resolve())
    assert model(ids_BT, pos_BT).dtype == torch.float32  # no autocast: x's dtype


# ---------------------------------------------------------------------------
# Init, dtype, parameter count, FLOPs
# ---------------------------------------------------------------------------


def test_init_deterministic_and_scaled():
    args = get_preset("tiny")
    torch.manual_seed(3)
    a = Llama(args)
    torch.manual_seed(3)
    b = Llama(args)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    resid_std = 0.02 / math.sqrt(2 * args.num_hidden_layers)
    # 16k-49k samples each: the std estimate is within ~1% of the truth.
    assert a.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(resid_std, rel=0.05)
    assert a.layers[0].mlp.down_proj.weight.std().item() == pytest.approx(resid_std, rel=0.05)
    assert a.layers[0].self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(a.norm.weight, torch.ones(args.hidden_size))


def test_rope_table_stays_float32_under_bf16():
    args = _small_args()
    torch.manual_seed(0)
    model = Llama(args).to(torch.bfloat16)
    assert model.rotary.cos_Pd.dtype == torch.float32
    assert "rotary.cos_Pd" not in model.state_dict()  # non-persistent
    ids_BT, pos_BT = _batch(args, B=1, T=6)
    assert model(ids_BT, pos_BT).dtype == torch.bfloat16


@pytest.mark.parametrize("tied", [True, False])
def test_num_params_from_args_matches_model(tied):
    args = _small_args(tie_word_embeddings=tied)
    model = Llama(args)
    assert num_params(args) == num_params(model)
    assert num_params(args, exclude_embedding=True) == num_params(model, exclude_embedding=True)


def test_gr00t_param_count_without_instantiating():
    n = num_params(GR00T_N1_6)
    assert 1.5e9 < n < 1.7e9
    assert n == 1_644_615_680
    assert num_params(get_preset("tiny")) == 1_311_872


def test_flops_per_token_tiny_by_hand():
    args = get_preset("tiny")
    D, F_, L, V = 128, 384, 4, 4096
    per_block = (D * D + 2 * D * 64 + D * D) + 3 * D * F_ + 2 * D  # q, k, v (2 kv heads x 32), o; mlp; norms
    assert per_block == 196_864
    n = L * per_block + D + V * D  # blocks, final norm, LM head (tied, still a matmul)
    assert n == 1_311_872
    assert flops_per_token(args, 256) == 6 * n + 12 * L * D * 256 == 9_444_096
    assert flops_per_token(args, 1024) == 6 * n + 12 * L * D * 1024


def test_peak_and_mfu():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == PEAK_TFLOPS["H100 PCIe"]
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("cpu") is None and peak_tflops(None) is None
    assert peak_tflops("cpu", override=1.5) == 1.5
    args = get_preset("tiny")
    tokens_per_s = 1e6
    assert mfu(tokens_per_s, args, 256, 989.0) == pytest.approx(1e6 * 9_444_096 / 989e12)
    assert mfu(tokens_per_s, args, 256, None) is None


def test_linear_cross_entropy_pads_the_vocab_without_changing_loss_or_grads():
    """Vocab 131 (not a multiple of 64): the op pads W with zero rows for aligned matmuls; the padded columns
    never enter the softmax, so loss and both gradients equal the unpadded computation's."""
    g = torch.Generator().manual_seed(1)
    h_ND = torch.randn(9, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w_VD = torch.randn(131, 16, generator=g, dtype=torch.float64, requires_grad=True)
    labels_N = torch.randint(0, 131, (9,), generator=g)
    labels_N[0] = 130  # the last real class, next to the padding
    mask_N = torch.ones(9, dtype=torch.bool)
    loss_sum, _ = linear_cross_entropy_torch(h_ND, w_VD, labels_N, mask_N)
    dh, dw = torch.autograd.grad(loss_sum, (h_ND, w_VD))
    # the unpadded computation, the op's numerics otherwise (float64 logits, cross-entropy in float32)
    want = F.cross_entropy((h_ND @ w_VD.T).float(), labels_N, reduction="sum")
    wdh, wdw = torch.autograd.grad(want, (h_ND, w_VD))
    assert dw.shape == (131, 16)
    assert loss_sum.item() == want.item()  # the same float32 softmax over the same 131 logits
    torch.testing.assert_close(dh, wdh, rtol=0, atol=1e-12)
    torch.testing.assert_close(dw, wdw, rtol=0, atol=1e-12)
