"""Llama-family decoder: model args, presets, modules (``workbench.train.hf`` reads and writes the HF forms).

Shape legend (suffixes on tensor names, as in ``x_BTD``):

    B  batch (micro-batch rows)
    T  tokens per row (sequence length)
    D  model dim (hidden_size)
    H  attention heads
    K  key/value heads (grouped-query attention: K divides H)
    d  head dim (D // H)
    F  FFN dim (intermediate_size)
    V  vocab size
    P  positions in the RoPE table (max_position_embeddings)
    N  flattened positions (B * (T - 1) in the loss)

The fused ops (RMSNorm, SwiGLU, RoPE, LM-head + cross-entropy) go through an
:class:`~workbench.train.ops.OpSet`, so a Triton backend replaces one op at a time.

Packed records: a row may hold several documents whose ``position_ids`` restart
at 0 at each document start. Positions drive RoPE only; attention stays plainly
causal over the whole row (a document may attend to the documents packed
before it), as in most pretraining loops. Which positions count in the loss is
the data pipeline's ``loss_mask``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from workbench.train.ops import OpSet, resolve

__all__ = [
    "CHECKPOINT_MODES",
    "GR00T_N1_6",
    "Llama",
    "ModelArgs",
    "PRESETS",
    "TINY",
    "causal_attention",
    "get_preset",
    "num_params",
    "rope_cos_sin",
    "rope_inv_freq",
]


# ---------------------------------------------------------------------------
# Model args
# ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class ModelArgs:
    """Architecture of a Llama-family decoder (names as in HF ``config.json``)."""

    hidden_size: int
    """Model dim D."""
    intermediate_size: int
    """FFN dim F of the SwiGLU MLP."""
    num_attention_heads: int
    """Query heads H; must divide hidden_size."""
    num_key_value_heads: int
    """Key/value heads K; must divide num_attention_heads (K < H is GQA)."""
    num_hidden_layers: int
    """Decoder blocks."""
    vocab_size: int
    """Vocabulary size V."""
    max_position_embeddings: int
    """Rows of the RoPE table: position ids must be below this."""
    rms_norm_eps: float = 1e-5
    """Epsilon inside RMSNorm's square root."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    tie_word_embeddings: bool = False
    """LM head shares the token-embedding matrix."""
    qkv_bias: bool = False
    """q/k/v projections carry a bias (Qwen2; Llama's ``attention_bias``)."""
    o_bias: bool = False
    """The attention output projection carries a bias (Llama's ``attention_bias``)."""
    mlp_bias: bool = False
    """gate/up/down projections carry a bias (Llama's ``mlp_bias``)."""
    rope_scaling: dict[str, Any] | None = None
    """RoPE frequency scaling: None, ``{"rope_type": "linear", "factor": f}`` or Llama 3's
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (:func:`rope_inv_freq`)."""
    model_type: str = "llama"
    """The HF ``model_type`` these args are written back as (llama, mistral, qwen2)."""

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "num_hidden_layers",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must divide "
                f"hidden_size={self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"hidden_size / num_attention_heads = {self.head_dim} must be even for RoPE "
                f"(hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads})"
            )
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        for name in ("tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        """Head dim d = hidden_size // num_attention_heads."""
        return self.hidden_size // self.num_attention_heads


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------

TINY = ModelArgs(
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    vocab_size=4096,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
"""CPU preset: 1,311,872 parameters (524,288 of them the tied 4096 x 128
embedding), GQA with 2 kv heads for 4 query heads. The vocabulary is small on
purpose: with 32,000 ids the LM head was 25 of the step's 31 GFLOP and a step
took ~0.39 s on 2 CPU cores; with 4,096 the step is a few times cheaper, so the
preset trains at several steps per second (the synthetic corpus follows the
model's vocabulary)."""

GR00T_N1_6 = ModelArgs(
    hidden_size=2048,
    intermediate_size=5632,
    num_attention_heads=32,
    num_key_value_heads=32,
    num_hidden_layers=28,
    vocab_size=50257,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
"""The study's target model, ~1.6B parameters.

The seed gave both "12 layers" and "1.6B parameters"; with hidden 2048, FFN
5632, vocab 50257 and untied embeddings these disagree: 12 layers give
822,466,560 parameters. 28 layers give 1,644,615,680 (51,384,320 per block,
2 x 102,926,336 for the embedding and the LM head, 2,048 for the final norm),
so the preset keeps the parameter count and uses 28 layers."""

PRESETS: dict[str, ModelArgs] = {"tiny": TINY, "gr00t-n1.6": GR00T_N1_6}
"""Preset name -> model args; use :func:`get_preset` for a private copy."""


def get_preset(name: str) -> ModelArgs:
    """A copy of preset ``name``; the error lists the preset names."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {sorted(PRESETS)}")
    return replace(PRESETS[name])


# ---------------------------------------------------------------------------
# Parameter count
# ---------------------------------------------------------------------------


def num_params(model_or_args: nn.Module | ModelArgs, exclude_embedding: bool = False) -> int:
    """Parameters of a model, or of the model ``ModelArgs`` would build (no allocation).

    A tied LM head is counted once. ``exclude_embedding`` drops the input
    token-embedding table (V x D); an untied LM head stays (it is a matmul),
    while a tied one goes with the table it shares.
    """
    if isinstance(model_or_args, ModelArgs):
        a = model_or_args
        D, F_, L, V, d = a.hidden_size, a.intermediate_size, a.num_hidden_layers, a.vocab_size, a.head_dim
        H, K = a.num_attention_heads, a.num_key_value_heads
        attn = D * H * d + 2 * D * K * d + H * d * D  # q, k, v, o
        attn += (H * d + 2 * K * d) * a.qkv_bias + D * a.o_bias
        mlp = 3 * D * F_ + (2 * F_ + D) * a.mlp_bias  # gate, up, down
        norms = 2 * D
        total = V * D + L * (attn + mlp + norms) + D + (0 if a.tie_word_embeddings else V * D)
        return total - V * D if exclude_embedding else total
    total = sum(p.numel() for p in model_or_args.parameters())  # parameters() dedups tied weights
    if exclude_embedding:
        total -= model_or_args.embed_tokens.weight.numel()
    return total


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> torch.Tensor:
    """RoPE's ``head_dim / 2`` inverse frequencies (float64), scaled as HF's ``ROPE_INIT_FUNCTIONS`` do.

    ``linear`` divides every frequency by ``factor``. ``llama3`` keeps the frequencies whose wavelength is
    under ``original_max_position_embeddings / high_freq_factor``, divides those over ``... /
    low_freq_factor`` by ``factor``, and blends the two in between. Neither changes the attention scale.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    if kind != "default":
        raise ValueError(f"rope_scaling type {kind!r} is not implemented; implemented: default, linear, llama3")
    return inv_freq


def rope_cos_sin(
    head_dim: int,
    positions: int | torch.Tensor,
    theta: float,
    device: torch.device | str | None = None,
    scaling: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables ``cos_Pd, sin_Pd`` (float32) in HF Llama's ``cat(freqs, freqs)`` layout.

    ``positions`` is a count P (positions 0..P-1) or a 1-D tensor of positions; ``scaling`` is
    :attr:`ModelArgs.rope_scaling`. Angles are computed in float64, then rounded to float32.
    """
    if isinstance(positions, int):
        positions = torch.arange(positions, device=device)
    pos_P = positions.to(device=device, dtype=torch.float64)
    inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device=device)
    freqs_Pd2 = torch.outer(pos_P, inv_freq)
    emb_Pd = torch.cat((freqs_Pd2, freqs_Pd2), dim=-1)
    return emb_Pd.cos().float(), emb_Pd.sin().float()


class RotaryCache(nn.Module):
    """cos/sin tables for positions 0..P-1, gathered by position id.

    Non-persistent float32 buffers, computed once. ``model.to(torch.bfloat16)``
    would round them; instead ``_apply`` rebuilds them in float32 on the new
    device after any move or cast.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.theta, self.scaling = head_dim, max_positions, theta, scaling
        cos_Pd, sin_Pd = rope_cos_sin(head_dim, max_positions, theta, scaling=scaling)
        self.register_buffer("cos_Pd", cos_Pd, persistent=False)
        self.register_buffer("sin_Pd", sin_Pd, persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001 (torch's signature)
        super()._apply(fn, recurse)
        self.cos_Pd, self.sin_Pd = rope_cos_sin(
            self.head_dim, self.max_positions, self.theta, device=self.cos_Pd.device, scaling=self.scaling
        )
        return self

    def forward(self, position_ids_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Out-of-range ids raise on CPU and trip a device assert on GPU; no host check here
        # because that would be a CPU-GPU sync point inside the step.
        return self.cos_Pd[position_ids_BT], self.sin_Pd[position_ids_BT]


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale; the math is ``ops.rmsnorm``."""

    def __init__(self, dim: int, eps: float, ops: OpSet) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.ops.rmsnorm(x_BTD, self.weight, self.eps, _matmul_dtype(x_BTD))

    def add_forward(self, x_BTD: torch.Tensor, residual_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = x + residual; (norm(s), s)`` through ``ops.rmsnorm_add`` (one kernel with the Triton backend)."""
        return self.ops.rmsnorm_add(x_BTD, residual_BTD, self.weight, self.eps, _matmul_dtype(x_BTD))


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a norm writes its output in: autocast's when autocast is on, else ``x``'s.

    Every consumer of a norm's output here is a matmul (the q/k/v and gate/up projections, the LM head) that
    autocast would first cast to its dtype; the norm writing it so skips that pass, and its backward then reads
    the gradient in that dtype, as the cast's backward would have delivered it. The values are the same.
    """
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


# enable_gqa arrived in torch 2.5; before it, kv heads are repeated explicitly.
_SDPA_HAS_GQA = torch.__version__ >= "2.5"


def causal_attention(
    q_BHTd: torch.Tensor, k_BKTd: torch.Tensor, v_BKTd: torch.Tensor
) -> torch.Tensor:
    """Causal scaled-dot-product attention with grouped-query heads -> ``o_BHTd``.

    Query head h reads kv head ``h // (H // K)`` (HF's ``repeat_kv`` layout).
    """
    H, K = q_BHTd.shape[1], k_BKTd.shape[1]
    if H == K:
        return F.scaled_dot_product_attention(q_BHTd, k_BKTd, v_BKTd, is_causal=True)
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(
            q_BHTd, k_BKTd, v_BKTd, is_causal=True, enable_gqa=True
        )
    k_BHTd = k_BKTd.repeat_interleave(H // K, dim=1)
    v_BHTd = v_BKTd.repeat_interleave(H // K, dim=1)
    return F.scaled_dot_product_attention(q_BHTd, k_BHTd, v_BHTd, is_causal=True)


def project(x_BTD: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """``x`` through each Linear of ``linears``, which share it as input (q/k/v, gate/up). Where they are all of one
    class with a ``project`` method (``workbench.train.fp8.Fp8Linear``: FP8 with its own casts), that class takes
    them together and casts ``x`` once for all of them."""
    cls = type(linears[0])
    together = getattr(cls, "project", None)
    if together is not None and all(type(m) is cls for m in linears):
        return together(x_BTD, linears)
    return tuple(m(x_BTD) for m in linears)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE; q/k/v and o biases as the args say."""

    def __init__(self, args: ModelArgs, ops: OpSet) -> None:
        super().__init__()
        D, H, K, d = args.hidden_size, args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, K, d
        self.q_proj = nn.Linear(D, H * d, bias=args.qkv_bias)
        self.k_proj = nn.Linear(D, K * d, bias=args.qkv_bias)
        self.v_proj = nn.Linear(D, K * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(H * d, D, bias=args.o_bias)
        self.ops = ops

    def forward(self, x_BTD: torch.Tensor, cos_BTd: torch.Tensor, sin_BTd: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, K, d = self.n_heads, self.n_kv_heads, self.head_dim
        q_BTHd, k_BTKd, v_BTKd = project(x_BTD, (self.q_proj, self.k_proj, self.v_proj))
        q_BHTd = q_BTHd.view(B, T, H, d).transpose(1, 2)
        k_BKTd = k_BTKd.view(B, T, K, d).transpose(1, 2)
        v_BKTd = v_BTKd.view(B, T, K, d).transpose(1, 2)
        q_BHTd, k_BKTd = self.ops.rope(q_BHTd, k_BKTd, cos_BTd, sin_BTd)
        o_BHTd = causal_attention(q_BHTd, k_BKTd, v_BKTd)
        return self.o_proj(o_BHTd.transpose(1, 2).reshape(B, T, H * d))


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(swiglu(gate(x), up(x)))``; biases when ``args.mlp_bias``."""

    def __init__(self, args: ModelArgs, ops: OpSet) -> None:
        super().__init__()
        D, F_ = args.hidden_size, args.intermediate_size
        self.gate_proj = nn.Linear(D, F_, bias=args.mlp_bias)
        self.up_proj = nn.Linear(D, F_, bias=args.mlp_bias)
        self.down_proj = nn.Linear(F_, D, bias=args.mlp_bias)
        self.ops = ops

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        gate_BTF, up_BTF = project(x_BTD, (self.gate_proj, self.up_proj))
        return self.down_proj(self.ops.swiglu(gate_BTF, up_BTF))


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    With ``ops.rmsnorm_add`` (``compute_domain.fused_residual_norm``) every residual add runs inside the norm
    that follows it: the block takes the previous block's MLP output still to be added (``pending``) and adds
    it in its first norm, adds its attention output in its second, and hands its own MLP output on as the
    next ``pending`` (the final norm adds the last one). Same sums, same order; no separate add pass.
    """

    def __init__(self, args: ModelArgs, ops: OpSet) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, ops)
        self.self_attn = Attention(args, ops)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, ops)
        self.mlp = MLP(args, ops)

    def forward(
        self, x_BTD: torch.Tensor, cos_BTd: torch.Tensor, sin_BTd: torch.Tensor,
        pending_BTD: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> ``(x_BTD, pending_BTD)``: the residual stream and the branch output not yet added to it (None
        unless the adds are fused into the norms)."""
        if self.post_attention_layernorm.ops.rmsnorm_add is None:  # (pending is then always None)
            x_BTD = x_BTD + self.self_attn(self.input_layernorm(x_BTD), cos_BTd, sin_BTd)
            return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD)), None
        if pending_BTD is None:
            normed_BTD = self.input_layernorm(x_BTD)
        else:
            normed_BTD, x_BTD = self.input_layernorm.add_forward(pending_BTD, x_BTD)
        attn_BTD = self.self_attn(normed_BTD, cos_BTd, sin_BTd)
        normed_BTD, x_BTD = self.post_attention_layernorm.add_forward(attn_BTD, x_BTD)
        return x_BTD, self.mlp(normed_BTD)


CHECKPOINT_MODES: tuple[str, ...] = ("none", "selective", "full")
"""Activation-checkpointing modes of :meth:`Llama.set_activation_checkpointing`."""


class Llama(nn.Module):
    """Llama-family decoder. Submodule names follow HF's ``LlamaModel`` (minus
    the ``model.`` prefix): ``embed_tokens``, ``layers.<i>.self_attn.q_proj``, ...,
    ``norm``, ``lm_head`` (``None`` when tied to ``embed_tokens``).

    Activation checkpointing is off until :meth:`set_activation_checkpointing`;
    :attr:`checkpointed_blocks` lists the blocks it applies to."""

    def __init__(self, args: ModelArgs, ops: OpSet | None = None) -> None:
        super().__init__()
        self.args = args
        self.ops = ops if ops is not None else resolve()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args, self.ops) for _ in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, self.ops)
        self.lm_head = (
            None
            if args.tie_word_embeddings
            else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        )
        self.rotary = RotaryCache(args.head_dim, args.max_position_embeddings, args.rope_theta, args.rope_scaling)
        self._checkpoint_mode = "none"
        self._checkpoint_every = 1
        self.init_weights()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's ``weight_VD`` (the embedding matrix when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_ops(self, ops: OpSet) -> None:
        """Switch every submodule to ``ops`` (e.g. after ``import kernels``)."""
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = ops

    def set_activation_checkpointing(self, mode: str, every: int = 1) -> None:
        """Choose which decoder blocks recompute their forward in backward instead of keeping activations.

        - ``"none"``: no block (the default; the forward is the plain one).
        - ``"full"``: every block; ``every`` is ignored.
        - ``"selective"``: block ``i`` (0-based) when ``(i + 1) % every == 0``, i.e. the last block of each
          group of ``every``: ``every=1`` is every block (as ``"full"``), ``every=2`` blocks 1, 3, 5, ...;
          with ``every`` above the number of blocks, none.

        A checkpointed block keeps only its inputs; in backward it runs its forward again
        (``torch.utils.checkpoint.checkpoint``, ``use_reentrant=False``, RNG state preserved). The loss and
        gradients are those of the plain forward. It applies only while ``self.training`` and grad mode
        are on: in eval or under ``torch.no_grad`` every block runs plainly.

        Raises ``ValueError`` naming the argument and its allowed values when ``mode`` is not one of
        :data:`CHECKPOINT_MODES` or ``every`` is not an int >= 1 (checked for every mode).
        """
        if mode not in CHECKPOINT_MODES:
            raise ValueError(f"mode must be one of {CHECKPOINT_MODES}, got {mode!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self._checkpoint_mode = mode
        self._checkpoint_every = every

    @property
    def activation_checkpointing(self) -> tuple[str, int]:
        """``(mode, every)`` as last set by :meth:`set_activation_checkpointing` (``("none", 1)`` by default)."""
        return self._checkpoint_mode, self._checkpoint_every

    @property
    def checkpointed_blocks(self) -> list[int]:
        """Indices of the decoder blocks checkpointed in a training forward, ascending (see
        :meth:`set_activation_checkpointing` for the rule); ``[]`` for ``"none"``."""
        n = len(self.layers)
        if self._checkpoint_mode == "full":
            return list(range(n))
        if self._checkpoint_mode == "selective":
            return [i for i in range(n) if (i + 1) % self._checkpoint_every == 0]
        return []

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2/Llama init: normal(0, 0.02); the projections that write into the
        residual stream (``o_proj``, ``down_proj``) use 0.02 / sqrt(2 * layers) so
        the residual's variance does not grow with depth; biases are 0, RMSNorm scales 1.
        Deterministic under ``torch.manual_seed``."""
        std = 0.02
        resid_std = std / math.sqrt(2 * self.args.num_hidden_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_resid = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, mean=0.0, std=resid_std if is_resid else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states ``h_BTD``. ``position_ids_BT`` restart at 0 at
        each packed document and must be below ``max_position_embeddings``.

        In training with grad enabled, the blocks in :attr:`checkpointed_blocks` run under activation
        checkpointing; otherwise every block runs plainly."""
        if input_ids_BT.shape != position_ids_BT.shape:
            raise ValueError(
                f"input_ids {tuple(input_ids_BT.shape)} and position_ids "
                f"{tuple(position_ids_BT.shape)} must have the same (B, T) shape"
            )
        cos_BTd, sin_BTd = self.rotary(position_ids_BT)
        x_BTD = self.embed_tokens(input_ids_BT)
        pending_BTD = None  # a branch output to add in the next norm (fused_residual_norm)
        checkpointed = (
            frozenset(self.checkpointed_blocks) if self.training and torch.is_grad_enabled() else frozenset()
        )
        for i, layer in enumerate(self.layers):
            if i in checkpointed:
                # The module itself is checkpointed, not layer.forward: its __call__ runs the compiled forward
                # of a block compiled in place (layer.compile, compile_scope: layer), so the compiled graph
                # runs inside the checkpoint, in the forward and again in the recompute. A None pending_BTD
                # passes through as a non-tensor argument and comes back as a non-tensor output.
                x_BTD, pending_BTD = torch.utils.checkpoint.checkpoint(
                    layer, x_BTD, cos_BTd, sin_BTd, pending_BTD, use_reentrant=False
                )
            else:
                x_BTD, pending_BTD = layer(x_BTD, cos_BTd, sin_BTd, pending_BTD)
        if pending_BTD is None:
            return self.norm(x_BTD)
        return self.norm.add_forward(pending_BTD, x_BTD)[0]

    def logits(self, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor) -> torch.Tensor:
        """``logits_BTV`` (materialised; for tests and evaluation, not the training loss)."""
        return F.linear(self(input_ids_BT, position_ids_BT), self.lm_head_weight)

    def loss(
        self,
        input_ids_BT: torch.Tensor,
        position_ids_BT: torch.Tensor,
        loss_mask_BT: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token loss ``(loss_sum, n_tokens)`` through ``ops.loss``.

        The hidden state at t predicts token t+1 and counts where
        ``loss_mask_BT[:, t+1]`` is true, so ``n_tokens == loss_mask_BT[:, 1:].sum()``.
        The caller divides the summed ``loss_sum`` by the summed ``n_tokens``
        over micro-batches to average over real tokens.
        """
        return self.head_loss(self(input_ids_BT, position_ids_BT), input_ids_BT, loss_mask_BT)

    def head_loss(
        self, h_BTD: torch.Tensor, input_ids_BT: torch.Tensor, loss_mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss from the final hidden states (a unit of its own: ``compile_scope: layer`` compiles it
        apart from the decoder blocks)."""
        D = h_BTD.shape[-1]
        h_ND = h_BTD[:, :-1].reshape(-1, D)
        labels_N = input_ids_BT[:, 1:].reshape(-1)
        mask_N = loss_mask_BT[:, 1:].reshape(-1)
        return self.ops.loss(h_ND, self.lm_head_weight, labels_N, mask_N)

