"""The FP8 Linear of ``loongforge.compute_domain.fp8_cast: triton``: torchao's tensorwise numerics, the project's
casts (``kernels.fp8_cast``). ``workbench.train.fp8.convert_to_fp8`` makes the selected Linears this class.

Shape legend: M rows of the flattened input (B x T), K input features, N output features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.vocab import padded_vocab

__all__ = ["Fp8Linear", "linear_cross_entropy_fp8"]

_FP8_ALIGN = 16
"""FP8 matmuls need every dimension a multiple of this (``kernels.fp8_cast`` refuses other shapes)."""
_IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
               out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """``a @ b`` of FP8 operands whose values are the originals times ``a_scale`` and ``b_scale``, in ``out_dtype``:
    ``torch._scaled_mm`` on CUDA; elsewhere torchao's ``emulate`` formula (``workbench.train.fp8``), an fp32
    matmul of the dequantised operands."""
    if a.device.type == "cuda":
        return torch._scaled_mm(a, b, scale_a=a_scale.reciprocal(), scale_b=b_scale.reciprocal(), out_dtype=out_dtype,
                                use_fast_accum=fast_accum)
    return torch.mm(a.float() / a_scale, b.float() / b_scale).to(out_dtype)


class _Fp8Project(torch.autograd.Function):
    """``y_i = x @ w_i.T`` for every weight, in FP8 tensorwise with torchao's numerics: e4m3 input and weights,
    e5m2 output gradient, scales from each tensor's amax, fast accumulation in the forward's matmul only
    (torchao's ``Float8LinearConfig()``). ``x`` is cast once for all the weights; the backward keeps the FP8
    transposed copies of ``x`` and of each weight, and casts each output gradient once into both layouts."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from kernels.fp8_cast import fp8_cast_transpose

        lead, K = x.shape[:-1], x.shape[-1]
        xq_MK, xq_KM, x_scale = fp8_cast_transpose(x.reshape(-1, K), torch.float8_e4m3fn)
        outs, saved = [], [xq_KM, x_scale]
        for w_NK in weights:
            wq_NK, wq_KN, w_scale = fp8_cast_transpose(w_NK, torch.float8_e4m3fn)
            # A row-major, B column-major (wq_NK.t())
            y = _scaled_mm(xq_MK, wq_NK.t(), x_scale, w_scale, x.dtype, fast_accum=True)
            outs.append(y.view(*lead, -1))
            saved += [wq_KN, w_scale]
        ctx.save_for_backward(*saved)
        ctx.x_shape = x.shape
        ctx.w_dtypes = [w.dtype for w in weights]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from kernels.fp8_cast import fp8_cast_transpose

        xq_KM, x_scale, *per_weight = ctx.saved_tensors
        grad_x = None
        grad_ws = []
        for i, g in enumerate(grads):
            wq_KN, w_scale = per_weight[2 * i], per_weight[2 * i + 1]
            gq_MN, gq_NM, g_scale = fp8_cast_transpose(g.reshape(-1, g.shape[-1]), torch.float8_e5m2)
            gx = _scaled_mm(gq_MN, wq_KN.t(), g_scale, w_scale, g.dtype)
            grad_x = gx if grad_x is None else grad_x + gx  # the sum autograd forms for a shared input
            gw = _scaled_mm(gq_NM, xq_KM.t(), g_scale, x_scale, g.dtype)
            grad_ws.append(gw.to(ctx.w_dtypes[i]))
        return (grad_x.view(ctx.x_shape), *grad_ws)


class Fp8Linear(nn.Linear):
    """A Linear trained in FP8 tensorwise through the project's casts (``fp8_cast: triton``): torchao's
    ``Float8Linear`` numerics, as :class:`_Fp8Project` computes them. Under autocast the input is first cast to
    autocast's dtype, as torchao does; the output has the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x, (self,))[0]

    @staticmethod
    def project(x: torch.Tensor, linears: tuple[Fp8Linear, ...]) -> tuple[torch.Tensor, ...]:
        """``x`` through every Linear of ``linears`` (which share it as input), ``x`` cast once."""
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            x = x.to(torch.get_autocast_dtype(dev))
        outs = _Fp8Project.apply(x, *(m.weight for m in linears))
        return tuple(y if m.bias is None else y + m.bias.to(y.dtype) for y, m in zip(outs, linears))


def linear_cross_entropy_fp8(
    h_ND: torch.Tensor, weight_VD: torch.Tensor, labels_N: torch.Tensor, mask_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backend ``fp8`` of op ``loss`` (``compute_domain.fp8_head``): the torch loss with the LM head's matmuls in
    FP8 tensorwise, cast and multiplied as :class:`Fp8Linear` does (e4m3 hidden states and weight, e5m2 logit
    gradient). The vocabulary is padded with zero rows to a multiple of 64 and the positions with zero rows to a
    multiple of 16; zeros change no amax, so no scale, and the padded logits are sliced off before the fp32
    softmax, so they neither count in the loss nor get a gradient. Same signature and return as
    ``workbench.train.ops.linear_cross_entropy_torch``."""
    N, D = h_ND.shape
    V = weight_VD.shape[0]
    if D % _FP8_ALIGN:
        raise ValueError(f"fp8_head: the hidden size ({D}) is not a multiple of {_FP8_ALIGN}, which FP8 matmuls need")
    dev = h_ND.device.type
    if torch.is_autocast_enabled(dev):
        h_ND = h_ND.to(torch.get_autocast_dtype(dev))
    Np, Vp = -(-N // _FP8_ALIGN) * _FP8_ALIGN, padded_vocab(V)
    h_pad = F.pad(h_ND, (0, 0, 0, Np - N)) if Np != N else h_ND
    w_pad = F.pad(weight_VD, (0, 0, 0, Vp - V)) if Vp != V else weight_VD
    with torch.autocast(dev, enabled=False):  # the dtypes are explicit: logits in h's, the softmax in fp32
        (logits_NpVp,) = _Fp8Project.apply(h_pad, w_pad)
        mask_N = mask_N.bool()
        labels_N = labels_N.long().masked_fill(~mask_N, _IGNORE_INDEX)
        loss_sum = F.cross_entropy(logits_NpVp[:N, :V].float(), labels_N, ignore_index=_IGNORE_INDEX,
                                   reduction="sum")
    return loss_sum, mask_N.sum()
