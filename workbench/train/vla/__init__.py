"""The GR00T N1.6 vision-language-action model: ViT encoder, projector, Llama backbone, flow-matching DiT head.

One sample: an RGB image (uint8), an instruction of T tokens and an action chunk of K steps x A values.

    images_BCHW  uint8 --vision--> v_BIE --projector--> x_BID ---+
    input_ids_BT --backbone.embed_tokens--> BTD -----------------+--> [image tokens, text tokens] S = I + T
                                                                       --backbone blocks, norm--> h_BSD
    actions_BKA, t_B, eps_BKA --> x_t --action_head(x_t, t, h_BSD)--> v_BKA  ~  actions - eps

The layers live in :mod:`workbench.train.vla.parts` (its docstring has the shape legend: I image tokens,
S = I + T backbone tokens, E/D/G the ViT/backbone/head widths, K action horizon, A action dim).

**The loss: flow matching** (pi0's and GR00T's convention: t = 0 is noise, t = 1 the data)::

    u ~ U(0, 1) per sample;  t = s * (1 - u ** (1 / alpha))     (s = flow_t_max, alpha = flow_beta_alpha)
    eps ~ N(0, 1) per action element
    x_t = (1 - t) * eps + t * actions;  target velocity = actions - eps
    loss_sum = sum over the chunk of (action_head(x_t, t, h) - (actions - eps))^2;  n = B * K * A

``u ** (1 / alpha)`` is Beta(alpha, 1) by inversion (its CDF is x ** alpha), so ``(s - t) / s ~ Beta(1.5, 1)``,
pi0's time density: it favours the noisy end, t near 0. ``alpha = 1`` is uniform t on [0, s]; s < 1 keeps
t = 1 (a clean input) out.

**The draws are the sample's, not the step's**: u and eps come from each sample's key (``keys_B``, int32, the
loader's ``sample_keys``: its seed, epoch and record) through a counter-based hash (``draws``): integer
arithmetic on the device, then Box-Muller for eps. A sample draws the same numbers in any micro-batch, and
eager, compiled and captured code agree (to the rounding of log and cos), so runs of one data stream at other
micro-batches or compile settings train on the same noise and their losses compare step by step (the tuner's
numerics guard relies on it). No host sync, no generator state, no Python branch on a tensor value: the step
can be captured in a CUDA graph, whose replays read the new batch's keys.

**Conditioning**: the action tokens cross-attend to the backbone's final-normed states in every head block;
the time enters through adaLN (shift and scale of each block's norms from a sinusoidal embedding of t, DiT's
way), not added to the tokens. The GR00T state encoder (proprioception) and embodiment-specific projections are
left out: the loss takes no robot state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from workbench.train.vla.parts import (
    PIXEL_MEAN,
    PIXEL_STD,
    ActionHead,
    Backbone,
    Projector,
    VisionEncoder,
)
from workbench.train.model import CHECKPOINT_MODES, GR00T_N1_6, ModelArgs, RMSNorm, num_params
from workbench.train.ops import OpSet, resolve

__all__ = [
    "GR00T_N1_6_VLA",
    "PIXEL_MEAN",
    "PIXEL_STD",
    "TINY_VLA",
    "VLA",
    "VLAArgs",
    "VLA_PRESETS",
    "draws",
    "get_vla_preset",
    "vla_flops_per_sample",
    "vla_num_params",
    "vla_param_counts",
]


# ---------------------------------------------------------------------------
# Args
# ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class VLAArgs:
    """Architecture of the VLA: ViT encoder, projector, Llama backbone, diffusion-transformer action head."""

    image_size: int
    """Image height = width in pixels; a multiple of patch_size."""
    patch_size: int
    """ViT patch side p; (image_size / p)^2 image tokens."""
    vision_layers: int
    """ViT blocks."""
    vision_hidden: int
    """ViT width E."""
    vision_heads: int
    """ViT attention heads; must divide vision_hidden."""
    vision_mlp: int
    """ViT MLP hidden dim."""
    channels: int = 3
    """Image channels: 3 (RGB; the normalisation has an RGB mean and std)."""
    backbone: ModelArgs
    """The Llama-family backbone (its LM head is not built: the VLA's only loss is the action head's)."""
    text_tokens: int
    """Instruction tokens per sample: the longest input_ids_BT row accepted; with the image tokens it sets the
    backbone sequence of :func:`vla_flops_per_sample`."""
    action_horizon: int
    """Action chunk length K (steps)."""
    action_dim: int
    """Values per action step A."""
    head_hidden: int
    """Action-head width G."""
    head_layers: int
    """Action-head (DiT) blocks."""
    head_heads: int
    """Action-head attention heads; must divide head_hidden."""
    head_mlp: int
    """Action-head MLP hidden dim."""
    timestep_freq_dim: int = 256
    """Sinusoidal features of the flow time t (DiT's 256); even."""
    norm_eps: float = 1e-6
    """Epsilon of the ViT's and the action head's LayerNorms (the backbone's is backbone.rms_norm_eps)."""
    flow_beta_alpha: float = 1.5
    """alpha of the time density: (s - t) / s ~ Beta(alpha, 1) (pi0's 1.5; 1 is uniform)."""
    flow_t_max: float = 0.999
    """s, the largest flow time sampled (pi0's 0.999); in (0, 1]."""

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "vision_layers", "vision_hidden", "vision_heads", "vision_mlp",
                     "text_tokens", "action_horizon", "action_dim", "head_hidden", "head_layers", "head_heads",
                     "head_mlp", "timestep_freq_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.channels != 3:
            raise ValueError(f"channels must be 3 (RGB), got {self.channels!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        for width, heads in (("vision_hidden", "vision_heads"), ("head_hidden", "head_heads")):
            if getattr(self, width) % getattr(self, heads):
                raise ValueError(f"{heads}={getattr(self, heads)} must divide {width}={getattr(self, width)}")
        if self.timestep_freq_dim % 2:
            raise ValueError(f"timestep_freq_dim must be even, got {self.timestep_freq_dim}")
        if not isinstance(self.backbone, ModelArgs):
            raise ValueError(f"backbone must be a ModelArgs, got {type(self.backbone).__name__}")
        if self.seq_len > self.backbone.max_position_embeddings:
            raise ValueError(
                f"image tokens {self.num_image_tokens} + text_tokens {self.text_tokens} = {self.seq_len} must not "
                f"exceed backbone.max_position_embeddings={self.backbone.max_position_embeddings}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        if not self.flow_beta_alpha > 0:
            raise ValueError(f"flow_beta_alpha must be > 0, got {self.flow_beta_alpha!r}")
        if not 0 < self.flow_t_max <= 1:
            raise ValueError(f"flow_t_max must be in (0, 1], got {self.flow_t_max!r}")

    @property
    def num_image_tokens(self) -> int:
        """I = (image_size / patch_size)^2."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def seq_len(self) -> int:
        """The backbone's sequence S = I + text_tokens."""
        return self.num_image_tokens + self.text_tokens


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------

GR00T_N1_6_VLA = VLAArgs(
    image_size=224, patch_size=14, vision_layers=24, vision_hidden=1024, vision_heads=16, vision_mlp=4096,
    backbone=replace(GR00T_N1_6, num_hidden_layers=12), text_tokens=256,
    action_horizon=16, action_dim=32, head_hidden=1024, head_layers=32, head_heads=16, head_mlp=4096,
)
"""The study's VLA: 1,838,436,384 parameters (:func:`vla_param_counts`).

- vision, ViT-L/14 at 224 px: 24 blocks, E 1024, 16 heads, MLP 4096; 16 x 16 = 256 patch tokens, output
  (B, 256, 1024). 303,176,704 parameters.
- projector 1024 -> 2048 -> 2048: 6,295,552.
- backbone: GR00T_N1_6's width (D 2048, FFN 5632, 32 heads, vocab 50,257) with 12 of its 28 blocks, over
  S = 256 image + 256 instruction tokens = 512: 719,540,224 (12 x 51,384,320 + the 102,926,336 embedding +
  2,048 final norm; no LM head). 12 because GR00T N1 conditions its action head on the 12th LLM layer (middle
  layers were faster and better for the policy than the last), and the seed's "12 layers" of the GR00T_N1_6
  docstring is that depth; the vocabulary and widths are the preset's, so its kernels' shapes hold here.
- action head, DiT with cross-attention: 32 blocks (N1.6's depth, twice N1.5's 16), G 1024, 16 heads of 64, MLP
  4096, over a 16 x 32 action chunk: 809,423,904 (25,185,280 a block, 6,297,600 of it the adaLN). GR00T's DiT
  is 1536 wide (32 heads of 48) and cross-attends in every other block; here every block does, at 1024.

Training FLOPs per sample (:func:`vla_flops_per_sample`): 2,928,029,199,360 (2.93 TFLOP)."""

TINY_VLA = VLAArgs(
    image_size=32, patch_size=8, vision_layers=2, vision_hidden=64, vision_heads=2, vision_mlp=128,
    backbone=ModelArgs(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=2, vocab_size=256, max_position_embeddings=64),
    text_tokens=16, action_horizon=8, action_dim=4, head_hidden=64, head_layers=2, head_heads=2, head_mlp=128,
    timestep_freq_dim=32,
)
"""CPU preset: 16 image tokens (32 px, patch 8) + 16 text tokens, an 8 x 4 action chunk; every width 64."""

VLA_PRESETS: dict[str, VLAArgs] = {"tiny-vla": TINY_VLA, "gr00t-n1.6-vla": GR00T_N1_6_VLA}
"""Preset name -> VLA args; use :func:`get_vla_preset` for a private copy."""


def get_vla_preset(name: str) -> VLAArgs:
    """A copy of preset ``name`` (its backbone args copied too); the error lists the preset names."""
    if name not in VLA_PRESETS:
        raise ValueError(f"unknown VLA preset {name!r}; presets: {sorted(VLA_PRESETS)}")
    args = VLA_PRESETS[name]
    return replace(args, backbone=replace(args.backbone))


# ---------------------------------------------------------------------------
# Parameter count and FLOPs
# ---------------------------------------------------------------------------


def _vision_counts(a: VLAArgs) -> tuple[int, int]:
    """(parameters applied to every image token as a matmul or norm, the position table)."""
    E, Fv, P = a.vision_hidden, a.vision_mlp, a.channels * a.patch_size ** 2
    block = 4 * E + (3 * E * E + 3 * E) + (E * E + E) + (E * Fv + Fv) + (Fv * E + E)  # 2 LNs, qkv, proj, mlp
    return (P * E + E) + a.vision_layers * block + 2 * E, a.num_image_tokens * E


def _head_counts(a: VLAArgs) -> tuple[int, int, int, int]:
    """Action-head parameters: (per action token, per backbone token (the cross-attention k/v), once per
    sample (time MLP, adaLN), the position table)."""
    G, Fh, A, D, L = a.head_hidden, a.head_mlp, a.action_dim, a.backbone.hidden_size, a.head_layers
    block_token = (3 * G * G + 3 * G) + (G * G + G) + 2 * (G * G + G) + (G * Fh + Fh) + (Fh * G + G)
    per_token = (A * G + G) + L * block_token + (G * A + A)  # action_in, blocks, action_out
    per_context = L * (D * 2 * G + 2 * G)
    once = (a.timestep_freq_dim * G + G) + (G * G + G) + L * (G * 6 * G + 6 * G) + (G * 2 * G + 2 * G)
    return per_token, per_context, once, a.action_horizon * G


def _backbone_counts(a: VLAArgs) -> tuple[int, int]:
    """(backbone parameters per token, the token-embedding table): ``num_params`` less the LM head."""
    b = a.backbone
    table = b.vocab_size * b.hidden_size
    # num_params(exclude_embedding=True) keeps an untied LM head (a tied one goes with the table): drop it
    return num_params(b, exclude_embedding=True) - (0 if b.tie_word_embeddings else table), table


def vla_param_counts(args: VLAArgs) -> dict[str, int]:
    """Parameters of each part the args build (no allocation): ``vision``, ``projector``, ``backbone``,
    ``action_head``; the keys are the VLA's submodule names."""
    E, D = args.vision_hidden, args.backbone.hidden_size
    return {
        "vision": sum(_vision_counts(args)),
        "projector": (E * D + D) + (D * D + D),
        "backbone": sum(_backbone_counts(args)),
        "action_head": sum(_head_counts(args)),
    }


def vla_num_params(model_or_args: nn.Module | VLAArgs) -> int:
    """Parameters of a model, or of the model ``VLAArgs`` would build (the sum of :func:`vla_param_counts`)."""
    if isinstance(model_or_args, VLAArgs):
        return sum(vla_param_counts(model_or_args).values())
    return sum(p.numel() for p in model_or_args.parameters())


def vla_flops_per_sample(args: VLAArgs, text_tokens: int | None = None) -> int:
    """Training (forward + backward) FLOPs of one sample, as :mod:`workbench.train.flops` counts a token.

    ``6 x parameters x rows`` for every matmul (2 FLOPs a multiply-add, backward twice the forward), with rows
    the tokens each part runs over: the ViT and the projector over I image tokens, the backbone over
    S = I + T, the head over K action tokens, its cross-attention k/v over S and its time MLP and adaLN once.
    Position tables and the token embedding are lookups and count 0; norms are counted (negligible). Plus
    attention, ``12 x layers x width x queries x keys`` (QK^T and AV, 2 x 2 FLOPs each, x 3): I x I in the ViT,
    S x S in the backbone (the causal square not halved, as flops.py), K x K and K x S in the head.
    ``text_tokens``: T, default ``args.text_tokens``.
    """
    T = args.text_tokens if text_tokens is None else text_tokens
    if T <= 0:
        raise ValueError(f"text_tokens must be > 0, got {T!r}")
    I, K = args.num_image_tokens, args.action_horizon
    S = I + T
    E, D, G = args.vision_hidden, args.backbone.hidden_size, args.head_hidden
    vision_tok, _ = _vision_counts(args)
    backbone_tok, _ = _backbone_counts(args)
    head_tok, head_ctx, head_once, _ = _head_counts(args)
    matmul = (vision_tok * I + vla_param_counts(args)["projector"] * I + backbone_tok * S
              + head_tok * K + head_ctx * S + head_once)
    attention = (args.vision_layers * E * I * I + args.backbone.num_hidden_layers * D * S * S
                 + args.head_layers * G * K * (K + S))
    return 6 * matmul + 12 * attention


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def _checkpointed(mode: str, every: int, n: int) -> list[int]:
    """The blocks of a stack of ``n`` that :meth:`VLA.set_activation_checkpointing` picks: Llama's rule."""
    if mode == "full":
        return list(range(n))
    if mode == "selective":
        return [i for i in range(n) if (i + 1) % every == 0]
    return []


# The draws: integers of 32 bits held in int64, so that every product below stays under 2**63 (no overflow in
# eager, compiled or captured code) and the same key gives the same bits on any device.
_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # below 2**27: its product with a 32-bit value is below 2**59


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of ``x`` (int64 in [0, 2**32)): xor-shift and multiply, twice."""
    x = ((x >> 16) ^ x) * _MIX & _M32
    x = ((x >> 16) ^ x) * _MIX & _M32
    return (x >> 16) ^ x


def _unit(bits: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) from 32 hashed bits: the top 24, at the centre of their cell (never 0: log is finite)."""
    return ((bits >> 8).float() + 0.5) * 2.0 ** -24


def draws(keys_B: torch.Tensor, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Counter-based draws of each sample -> ``(u_B ~ U(0, 1), eps ~ N(0, 1) of shape (B, *shape))``, float32.

    Sample b's draws are a pure function of ``keys_B[b]`` and the counter (the element's index): counter i of
    the sample hashes ``hash(key) + hash(i)``; eps is Box-Muller of counters ``i`` and ``n + i``, u counter
    ``2n``. So they do not depend on the micro-batch the sample is in, on the generator's state or on whether the
    code runs eager, compiled or captured."""
    n = math.prod(shape)
    base_B1 = _hash32(keys_B.to(torch.int64)[:, None] & _M32)
    counters = _hash32(torch.arange(2 * n + 1, device=keys_B.device, dtype=torch.int64))
    bits = _hash32((base_B1 + counters) & _M32)  # (B, 2n + 1)
    r = torch.sqrt(-2.0 * torch.log(_unit(bits[:, :n])))
    eps = r * torch.cos((2.0 * math.pi) * _unit(bits[:, n:2 * n]))
    return _unit(bits[:, 2 * n]), eps.view(-1, *shape)


class VLA(nn.Module):
    """The vision-language-action model (module docstring). Submodules, each a unit a per-part
    ``torch.compile`` can address: ``vision`` (``vision.layers.<i>``: ViT blocks), ``projector``, ``backbone``
    (``backbone.embed_tokens``, ``backbone.layers.<i>``: Llama ``Block``s, ``backbone.norm``) and
    ``action_head`` (``action_head.layers.<i>``: DiT blocks).

    The ops switch (``ops``, as for ``Llama``) reaches the backbone's RMSNorm, SwiGLU and RoPE; the ViT and the
    head use torch's LayerNorm, GELU and SDPA. ``forward`` is :meth:`loss`, so DDP can wrap the model itself.
    """

    def __init__(self, args: VLAArgs, ops: OpSet | None = None) -> None:
        super().__init__()
        self.args = args
        self.ops = ops if ops is not None else resolve()
        self.vision = VisionEncoder(
            image_size=args.image_size, patch_size=args.patch_size, channels=args.channels,
            layers=args.vision_layers, hidden=args.vision_hidden, heads=args.vision_heads, mlp=args.vision_mlp,
            eps=args.norm_eps)
        self.projector = Projector(args.vision_hidden, args.backbone.hidden_size)
        self.backbone = Backbone(args.backbone, self.ops)
        self.action_head = ActionHead(
            horizon=args.action_horizon, action_dim=args.action_dim, dim=args.head_hidden,
            context_dim=args.backbone.hidden_size, layers=args.head_layers, heads=args.head_heads,
            mlp=args.head_mlp, freq_dim=args.timestep_freq_dim, eps=args.norm_eps)
        self._checkpoint_mode = "none"
        self._checkpoint_every = 1
        self.init_weights()

    def set_ops(self, ops: OpSet) -> None:
        """Switch every submodule to ``ops`` (e.g. after ``import kernels``)."""
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = ops

    # ------------------------------------------------------------------ activation checkpointing
    def set_activation_checkpointing(self, mode: str, every: int = 1) -> None:
        """Which ViT and backbone blocks recompute their forward in backward: ``Llama``'s modes and rule
        (:data:`~workbench.train.model.CHECKPOINT_MODES`), applied to each stack on its own (``selective``:
        block i of the stack when ``(i + 1) % every == 0``). The action head is never checkpointed: its K
        tokens keep little. Only while training with grad enabled; the loss and gradients are the plain ones.
        """
        if mode not in CHECKPOINT_MODES:
            raise ValueError(f"mode must be one of {CHECKPOINT_MODES}, got {mode!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self._checkpoint_mode, self._checkpoint_every = mode, every

    @property
    def activation_checkpointing(self) -> tuple[str, int]:
        """``(mode, every)`` as last set (``("none", 1)`` by default)."""
        return self._checkpoint_mode, self._checkpoint_every

    @property
    def checkpointed_blocks(self) -> dict[str, list[int]]:
        """``{"vision": [...], "backbone": [...]}``: the block indices checkpointed in a training forward."""
        return {name: _checkpointed(self._checkpoint_mode, self._checkpoint_every, len(part.layers))
                for name, part in (("vision", self.vision), ("backbone", self.backbone))}

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """normal(0, 0.02) for every Linear, embedding and position table, biases 0, norm scales 1; the
        projections that write into a residual stream use 0.02 / sqrt(writes), writes = 2 per block in the ViT
        and the backbone (as ``Llama.init_weights``) and 3 in the head. Deterministic under ``torch.manual_seed``.
        """
        std = 0.02
        stacks = ((self.vision, ("attn.proj", "mlp.fc2"), 2 * self.args.vision_layers),
                  (self.projector, (), 1),
                  (self.backbone, ("o_proj", "down_proj"), 2 * self.args.backbone.num_hidden_layers),
                  (self.action_head, ("attn.proj", "mlp.fc2"), 3 * self.args.head_layers))
        for part, resid, writes in stacks:
            for name, module in part.named_modules():
                if isinstance(module, nn.Linear):
                    is_resid = bool(resid) and name.endswith(resid)
                    nn.init.normal_(module.weight, mean=0.0, std=std / math.sqrt(writes) if is_resid else std)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                elif isinstance(module, nn.LayerNorm) and module.weight is not None:
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
                elif isinstance(module, RMSNorm):
                    nn.init.ones_(module.weight)
        nn.init.normal_(self.vision.pos_embed, mean=0.0, std=std)
        nn.init.normal_(self.action_head.pos_embed, mean=0.0, std=std)

    # ------------------------------------------------------------------ forward
    def _check_inputs(self, images_BCHW: torch.Tensor, input_ids_BT: torch.Tensor,
                      position_ids_BT: torch.Tensor) -> None:
        # shapes and dtypes only: Python checks that read no tensor value (no sync, fine under capture)
        a = self.args
        want = (a.channels, a.image_size, a.image_size)
        if images_BCHW.dim() != 4 or tuple(images_BCHW.shape[1:]) != want or images_BCHW.dtype != torch.uint8:
            raise ValueError(f"images_BCHW must be uint8 of shape (B, {', '.join(map(str, want))}), got "
                             f"{images_BCHW.dtype} {tuple(images_BCHW.shape)}")
        if input_ids_BT.dim() != 2 or input_ids_BT.shape != position_ids_BT.shape:
            raise ValueError(f"input_ids_BT {tuple(input_ids_BT.shape)} and position_ids_BT "
                             f"{tuple(position_ids_BT.shape)} must have the same (B, T) shape")
        if input_ids_BT.shape[0] != images_BCHW.shape[0]:
            raise ValueError(f"input_ids_BT has {input_ids_BT.shape[0]} rows, images_BCHW {images_BCHW.shape[0]}")
        if input_ids_BT.shape[1] > a.text_tokens:
            raise ValueError(f"input_ids_BT has {input_ids_BT.shape[1]} tokens, over text_tokens={a.text_tokens}")

    def states(self, images_BCHW: torch.Tensor, input_ids_BT: torch.Tensor,
               position_ids_BT: torch.Tensor) -> torch.Tensor:
        """The backbone's final-normed states ``h_BSD`` over ``[I image tokens, T text tokens]``.

        ``images_BCHW``: uint8, (B, 3, image_size, image_size). ``position_ids_BT``: the text's positions
        (from 0); the backbone puts them after the image's (``I + position``)."""
        self._check_inputs(images_BCHW, input_ids_BT, position_ids_BT)
        ck = self.checkpointed_blocks if self.training and torch.is_grad_enabled() else {}
        v_BIE = self.vision(images_BCHW, frozenset(ck.get("vision", ())))
        return self.backbone(self.projector(v_BIE), input_ids_BT, position_ids_BT,
                             frozenset(ck.get("backbone", ())))

    def flow_inputs(self, actions_BKA: torch.Tensor,
                    keys_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw t and eps from each sample's key -> ``(x_t_BKA, t_B, velocity_BKA)``, float32 (module doc)."""
        a = self.args
        want = (a.action_horizon, a.action_dim)
        if actions_BKA.dim() != 3 or tuple(actions_BKA.shape[1:]) != want or not actions_BKA.is_floating_point():
            raise ValueError(f"actions_BKA must be floating of shape (B, {want[0]}, {want[1]}), got "
                             f"{actions_BKA.dtype} {tuple(actions_BKA.shape)}")
        if keys_B.shape != actions_BKA.shape[:1] or keys_B.is_floating_point() or keys_B.is_complex():
            raise ValueError(f"keys_B must be integer of shape ({actions_BKA.shape[0]},), one key per sample, got "
                             f"{keys_B.dtype} {tuple(keys_B.shape)}")
        actions_BKA = actions_BKA.float()
        u_B, eps_BKA = draws(keys_B, want)
        t_B = a.flow_t_max * (1.0 - u_B.pow(1.0 / a.flow_beta_alpha))  # (s - t) / s ~ Beta(alpha, 1)
        t_B11 = t_B[:, None, None]
        return (1.0 - t_B11) * eps_BKA + t_B11 * actions_BKA, t_B, actions_BKA - eps_BKA

    def head_loss(self, h_BSD: torch.Tensor, actions_BKA: torch.Tensor,
                  keys_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow-matching loss from the backbone's states -> ``(loss_sum, n)`` (see :meth:`loss`)."""
        x_BKA, t_B, velocity_BKA = self.flow_inputs(actions_BKA, keys_B)
        pred_BKA = self.action_head(x_BKA, t_B, h_BSD)
        loss_sum = (pred_BKA.float() - velocity_BKA).square().sum()
        n = torch.full((), velocity_BKA.numel(), dtype=torch.int64, device=velocity_BKA.device)
        return loss_sum, n

    def loss(self, images_BCHW: torch.Tensor, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor,
             actions_BKA: torch.Tensor, keys_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flow-matching loss ``(loss_sum, n)``: the squared error of the predicted velocity summed over the
        chunk (0-d float32) and the element count B * K * A (0-d int64), both on the device, not synced. As
        with ``Llama.loss`` the caller divides the summed ``loss_sum`` by the summed ``n`` over micro-batches.
        t and eps are drawn inside from the samples' keys ``keys_B`` (:meth:`flow_inputs`, the module doc)."""
        return self.head_loss(self.states(images_BCHW, input_ids_BT, position_ids_BT), actions_BKA, keys_B)

    forward = loss

    @torch.no_grad()
    def sample_actions(self, images_BCHW: torch.Tensor, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor,
                       steps: int = 10) -> torch.Tensor:
        """An action chunk ``a_BKA`` (float32) by Euler integration of the velocity from noise (t = 0) to t = 1
        in ``steps`` equal steps (GR00T's inference uses 4)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {steps!r}")
        h_BSD = self.states(images_BCHW, input_ids_BT, position_ids_BT)
        B, a = images_BCHW.shape[0], self.args
        x_BKA = torch.randn(B, a.action_horizon, a.action_dim, device=h_BSD.device)
        for i in range(steps):
            t_B = torch.full((B,), i / steps, device=h_BSD.device)
            x_BKA = x_BKA + self.action_head(x_BKA, t_B, h_BSD).float() / steps
        return x_BKA
