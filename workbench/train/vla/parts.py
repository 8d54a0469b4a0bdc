"""The VLA's four parts: the ViT encoder, the projector, the Llama backbone and the flow-matching action head.

:mod:`workbench.train.vla` assembles them (``VLA``) and documents the shapes and the loss; this module holds the
layers. The backbone is built from :mod:`workbench.train.model`'s ``Block``, ``RMSNorm`` and ``RotaryCache``
(so the ops switch reaches it); the ViT and the action head are bidirectional transformers with LayerNorm and
GELU (SigLIP's and DiT's layers), whose ops are torch's.

Shape legend (as in model.py; letters of its own below):

    B  batch             C  image channels (3)      I  image tokens (patches)   P  patch pixels (C * p * p)
    T  text tokens       S  backbone sequence, I + T
    E  ViT width         D  backbone width          G  action-head width        H  heads (of the block at hand)
    K  action horizon    A  action dim              Z  timestep sinusoid features
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from workbench.train.model import Block, ModelArgs, RMSNorm, RotaryCache
from workbench.train.ops import OpSet

__all__ = ["ActionHead", "Backbone", "Projector", "VisionEncoder", "PIXEL_MEAN", "PIXEL_STD"]

PIXEL_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
"""Per-channel RGB mean of pixels scaled to [0, 1]: CLIP's (OpenAI's ViT-L/14 preprocessing)."""
PIXEL_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel RGB standard deviation, CLIP's."""


def _attend(q_BNG: torch.Tensor, k_BMG: torch.Tensor, v_BMG: torch.Tensor, heads: int) -> torch.Tensor:
    """Bidirectional multi-head attention of N queries over M keys (no mask) -> ``o_BNG``."""
    B, N, G = q_BNG.shape
    M, d = k_BMG.shape[1], G // heads
    q_BHNd = q_BNG.reshape(B, N, heads, d).transpose(1, 2)
    k_BHMd = k_BMG.reshape(B, M, heads, d).transpose(1, 2)
    v_BHMd = v_BMG.reshape(B, M, heads, d).transpose(1, 2)
    o_BHNd = F.scaled_dot_product_attention(q_BHNd, k_BHMd, v_BHMd)
    return o_BHNd.transpose(1, 2).reshape(B, N, G)


class SelfAttention(nn.Module):
    """Bidirectional self-attention with a fused, biased ``qkv`` projection and a biased ``proj``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x_BNG: torch.Tensor) -> torch.Tensor:
        q_BNG, k_BNG, v_BNG = self.qkv(x_BNG).chunk(3, dim=-1)
        return self.proj(_attend(q_BNG, k_BNG, v_BNG, self.heads))


class CrossAttention(nn.Module):
    """Queries from the action tokens (width G), keys and values from the backbone's states (width D)."""

    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(context_dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x_BKG: torch.Tensor, h_BSD: torch.Tensor) -> torch.Tensor:
        k_BSG, v_BSG = self.kv(h_BSD).chunk(2, dim=-1)
        return self.proj(_attend(self.q(x_BKG), k_BSG, v_BSG, self.heads))


class GeluMLP(nn.Module):
    """``fc2(gelu_tanh(fc1(x)))``, both biased (SigLIP's and DiT's MLP)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def _run(layer: nn.Module, checkpointed: bool, *inputs: torch.Tensor | None):
    """Call ``layer`` plainly or under activation checkpointing. The module itself is checkpointed (as in
    ``Llama.forward``), so a layer compiled in place runs its compiled graph inside the checkpoint."""
    if checkpointed:
        return torch.utils.checkpoint.checkpoint(layer, *inputs, use_reentrant=False)
    return layer(*inputs)


# ---------------------------------------------------------------------------
# Vision encoder
# ---------------------------------------------------------------------------


class VisionBlock(nn.Module):
    """Pre-norm ViT block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, mlp: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = GeluMLP(dim, mlp)

    def forward(self, x_BIE: torch.Tensor) -> torch.Tensor:
        x_BIE = x_BIE + self.attn(self.norm1(x_BIE))
        return x_BIE + self.mlp(self.norm2(x_BIE))


class VisionEncoder(nn.Module):
    """uint8 images -> patch features ``v_BIE`` (after the final LayerNorm); no class token (SigLIP's layout).

    Normalisation: ``(pixels / 255 - PIXEL_MEAN[c]) / PIXEL_STD[c]`` in float32. The patch embedding is a
    Linear over each patch's pixels flattened as ``(c, row, col)``, the order of a stride-p Conv2d's weight
    (``conv.weight.view(E, -1)`` converts one); patches are in raster order; positions are a learned table.
    """

    def __init__(self, *, image_size: int, patch_size: int, channels: int, layers: int, hidden: int, heads: int,
                 mlp: int, eps: float) -> None:
        super().__init__()
        self.patch_size = patch_size
        n_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Linear(channels * patch_size * patch_size, hidden)
        self.pos_embed = nn.Parameter(torch.zeros(n_patches, hidden))
        self.layers = nn.ModuleList(VisionBlock(hidden, heads, mlp, eps) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden, eps=eps)
        # float32 constants as buffers (not re-created per call: no host-to-device copy inside a captured step)
        self.register_buffer("pixel_mean_C11", torch.tensor(PIXEL_MEAN).view(3, 1, 1), persistent=False)
        self.register_buffer("pixel_std_C11", torch.tensor(PIXEL_STD).view(3, 1, 1), persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001 (torch's signature)
        # As RotaryCache does: a cast of the model (model.to(torch.bfloat16)) must not round the constants.
        super()._apply(fn, recurse)
        device = self.pixel_mean_C11.device
        self.pixel_mean_C11 = torch.tensor(PIXEL_MEAN, device=device).view(3, 1, 1)
        self.pixel_std_C11 = torch.tensor(PIXEL_STD, device=device).view(3, 1, 1)
        return self

    def patchify(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """Normalised pixels, one row per patch: ``x_BIP`` in float32."""
        B, C, H, W = images_BCHW.shape
        p = self.patch_size
        x_BCHW = (images_BCHW.float() / 255.0 - self.pixel_mean_C11) / self.pixel_std_C11
        x_BChpwp = x_BCHW.view(B, C, H // p, p, W // p, p)
        return x_BChpwp.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)

    def forward(self, images_BCHW: torch.Tensor, checkpointed: frozenset[int] = frozenset()) -> torch.Tensor:
        x_BIE = self.patch_embed(self.patchify(images_BCHW)) + self.pos_embed
        for i, layer in enumerate(self.layers):
            x_BIE = _run(layer, i in checkpointed, x_BIE)
        return self.norm(x_BIE)


class Projector(nn.Module):
    """ViT features to the backbone's width: ``fc2(gelu(fc1(v)))`` (LLaVA-1.5's ``mlp2x_gelu``)."""

    def __init__(self, vision_dim: int, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, v_BIE: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(v_BIE)))


# ---------------------------------------------------------------------------
# Backbone
# ---------------------------------------------------------------------------


class Backbone(nn.Module):
    """A Llama decoder without its LM head, over ``[image tokens, text tokens]``.

    Submodules as in :class:`~workbench.train.model.Llama`: ``embed_tokens``, ``layers.<i>`` (its ``Block``),
    ``norm``, ``rotary``. Attention is the block's causal attention over the whole sequence, so every text
    token sees every image token. RoPE positions: image token i is at position i, text token j at
    ``I + position_ids_BT[:, j]``.
    """

    def __init__(self, args: ModelArgs, ops: OpSet) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args, ops) for _ in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, ops)
        self.rotary = RotaryCache(args.head_dim, args.max_position_embeddings, args.rope_theta, args.rope_scaling)

    def forward(self, prefix_BID: torch.Tensor, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor,
                checkpointed: frozenset[int] = frozenset()) -> torch.Tensor:
        """Final-normed states ``h_BSD``, S = I + T."""
        B, I = prefix_BID.shape[:2]
        image_pos_BI = torch.arange(I, device=position_ids_BT.device).expand(B, I)
        cos_BSd, sin_BSd = self.rotary(torch.cat((image_pos_BI, position_ids_BT + I), dim=1))
        text_BTD = self.embed_tokens(input_ids_BT)
        x_BSD = torch.cat((prefix_BID.to(text_BTD.dtype), text_BTD), dim=1)  # the residual stream in fp32
        pending_BSD = None  # a branch output to add in the next norm (fused_residual_norm), as in Llama.forward
        for i, layer in enumerate(self.layers):
            x_BSD, pending_BSD = _run(layer, i in checkpointed, x_BSD, cos_BSd, sin_BSd, pending_BSD)
        if pending_BSD is None:
            return self.norm(x_BSD)
        return self.norm.add_forward(pending_BSD, x_BSD)[0]


# ---------------------------------------------------------------------------
# Action head
# ---------------------------------------------------------------------------


def timestep_features(t_B: torch.Tensor, dim: int) -> torch.Tensor:
    """DiT's sinusoidal features of ``1000 * t`` -> ``(cos, sin)`` concatenated, ``f_BZ`` in float32.

    Frequencies ``exp(-ln(10000) * i / (Z/2))``, i < Z/2; the scale 1000 maps t in [0, 1] onto the range of
    diffusion timesteps the embedding was designed for (GR00T discretises t into 1000 buckets; here it stays
    continuous)."""
    half = dim // 2
    freqs_Z2 = torch.exp(-math.log(10000.0) * torch.arange(half, device=t_B.device, dtype=torch.float32) / half)
    angles_BZ2 = 1000.0 * t_B.float()[:, None] * freqs_Z2[None]
    return torch.cat((angles_BZ2.cos(), angles_BZ2.sin()), dim=-1)


def _modulate(x_BKG: torch.Tensor, shift_B1G: torch.Tensor, scale_B1G: torch.Tensor) -> torch.Tensor:
    return x_BKG * (1 + scale_B1G) + shift_B1G


class ActionBlock(nn.Module):
    """DiT block with cross-attention: adaLN self-attention over the action tokens, adaLN cross-attention to
    the backbone's states, adaLN MLP.

    adaLN: each sub-layer's LayerNorm has no affine of its own; its shift and scale come from the timestep
    embedding (``ada``: ``silu(c) -> 6 G``, (shift, scale) for each of the three norms). Unlike DiT's
    adaLN-Zero there are no gates initialised at 0: such gates leave every attention and MLP weight without a
    gradient on the first step (and DiT zero-initialises for image quality from scratch, not needed here).
    """

    def __init__(self, dim: int, context_dim: int, heads: int, mlp: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.cross_attn = CrossAttention(dim, context_dim, heads)
        self.norm3 = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.mlp = GeluMLP(dim, mlp)
        self.ada = nn.Linear(dim, 6 * dim)

    def forward(self, x_BKG: torch.Tensor, c_BG: torch.Tensor, h_BSD: torch.Tensor) -> torch.Tensor:
        sh1, sc1, sh2, sc2, sh3, sc3 = self.ada(c_BG)[:, None].chunk(6, dim=-1)
        x_BKG = x_BKG + self.self_attn(_modulate(self.norm1(x_BKG), sh1, sc1))
        x_BKG = x_BKG + self.cross_attn(_modulate(self.norm2(x_BKG), sh2, sc2), h_BSD)
        return x_BKG + self.mlp(_modulate(self.norm3(x_BKG), sh3, sc3))


class ActionHead(nn.Module):
    """Diffusion transformer: noisy action chunk ``x_BKA``, time ``t_B`` and backbone states ``h_BSD`` ->
    predicted velocity ``v_BKA``.

    Tokens: ``action_in(x) + pos_embed`` (one token per action step, learned positions). Time:
    ``c = time_out(silu(time_in(timestep_features(t))))``, fed to every block's adaLN as ``silu(c)``. Output:
    ``action_out`` of the adaLN-modulated final norm (``final_ada``: shift, scale).
    """

    def __init__(self, *, horizon: int, action_dim: int, dim: int, context_dim: int, layers: int, heads: int,
                 mlp: int, freq_dim: int, eps: float) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.action_in = nn.Linear(action_dim, dim)
        self.pos_embed = nn.Parameter(torch.zeros(horizon, dim))
        self.time_in = nn.Linear(freq_dim, dim)
        self.time_out = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(ActionBlock(dim, context_dim, heads, mlp, eps) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)
        self.final_ada = nn.Linear(dim, 2 * dim)
        self.action_out = nn.Linear(dim, action_dim)

    def forward(self, x_BKA: torch.Tensor, t_B: torch.Tensor, h_BSD: torch.Tensor) -> torch.Tensor:
        c_BG = self.time_out(F.silu(self.time_in(timestep_features(t_B, self.freq_dim))))
        c_BG = F.silu(c_BG)
        x_BKG = self.run_layers(self.action_in(x_BKA) + self.pos_embed, c_BG, h_BSD)
        shift_B1G, scale_B1G = self.final_ada(c_BG)[:, None].chunk(2, dim=-1)
        return self.action_out(_modulate(self.final_norm(x_BKG), shift_B1G, scale_B1G))

    def run_layers(self, x_BKG: torch.Tensor, c_BG: torch.Tensor, h_BSD: torch.Tensor) -> torch.Tensor:
        """The blocks in order (a method of its own: a per-part compile keeps them out of the head's graph)."""
        for layer in self.layers:
            x_BKG = layer(x_BKG, c_BG, h_BSD)
        return x_BKG
