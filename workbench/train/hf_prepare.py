"""The trial's knobs applied to a Hugging Face ``transformers`` model: ``model = run.prepare(model)``.

The same call serves a plain loop and an HF ``Trainer`` (prepare the model before handing it over). It reads the
config the study wrote for the trial, so the exported config runs the same patches again through the same call:

* ``hf.attention``: the model's attention implementation (``set_attn_implementation``);
* ``hf.pad_vocab_multiple``: the embedding and LM head padded to a multiple of this many rows, so the head's GEMMs
  run on aligned kernels (HF's ``resize_token_embeddings``; GPT-2's 50,257 rows put them on CUTLASS's ``align1``
  kernels, about a quarter of an H200 step of gr00t-n1.6's shapes);
* ``hf.packed_check: false``: the causal-mask builder's packed-sequence check skipped for a forward given neither
  an attention mask nor position ids (:func:`_skip_packed_check`): transformers reads it back with an ``.all()``,
  one wait for the device at every forward, which drains the queue the host had launched ahead;
* ``hf.liger``: Liger-Kernel's patches of the instance (RMSNorm, SwiGLU, RoPE, the fused linear cross-entropy,
  which never materialises the fp32 logits HF's loss upcasts to: what lets a bigger micro-batch fit); under
  ``torch.compile`` the fused loss alone, outside the compiled code (Dynamo cannot trace Liger's kernels);
* ``loongforge.compute_domain.ops`` (or ``triton_fusion``): the project's Triton RMSNorm and SwiGLU in place of the
  model's (RoPE lives inside HF's functions, not in a module: for it, ``hf.liger``). With ``hf.liger`` they go
  together only under ``torch.compile``, where Liger patches its fused loss alone; eagerly Liger patches the same
  RMSNorm and MLP modules, and the pair is refused (key ``hf.liger``);
* ``loongforge.compute_domain.fused_residual_norm`` (with the Triton RMSNorm): in each decoder layer the residual
  add before the post-attention norm runs inside that norm (``rmsnorm_add``: one kernel reads the attention output
  and the residual once; the layer's forward is patched on the instance, the same sums in the same order). The add
  after the MLP stays HF's: the layers hand each other one tensor, so it cannot reach the next layer's norm as the
  built-in model's does. With the torch RMSNorm it changes nothing (as in the built-in loop);
* ``loongforge.compute_domain.fp8``: FP8 training of the decoder's Linears (``fp8_modules``, matched against names
  under the decoder, ``layers.0.mlp.up_proj``), cast by torchao (``Float8Linear``) or, with ``fp8_cast: triton``
  (tensorwise), by the project's kernels (``workbench.train.fp8_linear.Fp8Linear``: each Linear casts its own
  input; the built-in model's casting of a shared input once does not reach HF's modules, though in a compiled
  layer the casts of the input q/k/v or gate/up share are one, the same pure op on the same tensor). A layer
  compiled apart that would not compile in one graph goes back to the compute dtype at its first call, and says so;
* ``loongforge.compute_domain.ops.loss: triton`` or ``fp8_head: true`` (under ``fp8: tensorwise`` only; with
  ``fp8: none`` it is refused, key ``fp8_head``): the LM head and the loss through the project's loss op (the
  fused Triton linear cross-entropy, or the head's matmuls in FP8 on the project's casts, as the built-in loop
  picks its backend), in place of HF's ``lm_head`` + cross-entropy. The model's forward is patched on the instance
  (as Liger's fused loss is): a training forward with labels takes the final hidden states and ``lm_head.weight``
  to the op, the labels shifted as HF shifts them (or ``shift_labels``), -100 never counting, and divides the
  loss's sum by the counted tokens (HF's mean) or by ``num_items_in_batch`` where the ``Trainer`` passes it
  (gradient accumulation); its logits are None, never materialised. Any other call (evaluation, generation, no
  labels, ``logits_to_keep``) is HF's forward, logits and all. The rule with ``hf.liger``: refused (key
  ``hf.liger``). Liger's fused linear cross-entropy and the project's are two losses for one head, and without its
  loss Liger would patch nothing under compile; eagerly its RMSNorm and SwiGLU have the project's ops as the
  alternative;
* ``training.activation_checkpointing``: every decoder layer (full) or every ``activation_checkpointing_every``-th
  (selective), through HF's own per-layer switch, non-reentrant;
* ``loongforge.compute_domain.compile``: each decoder layer compiled apart (``compile_scope: layer``), or the whole
  model (the whole decoder under ``hf.liger`` or the project's loss, the head and its loss apart), in the config's
  mode. A mode that captures CUDA graphs is refused per layer: the layers' replays write over the outputs that
  the next layer saved for its backward (on the H200, torch 2.11: "accessing tensor output of CUDAGraphs that
  has been overwritten by a subsequent run", in the backward of the first step).

Order matters and is fixed: kernels and FP8 swap modules, the loss patches the forward, checkpointing wraps
layers, compile comes last. A model whose layout the patches do not know (a decoder at ``model.model.layers`` with
``*RMSNorm`` and gated ``*MLP`` modules, of a type in :data:`MODEL_TYPES`) is refused with one ConfigError naming
its type and the knob that asked (an ``invalid_config`` trial). :func:`prepare` returns the model and one line per
change, which the run's summary keeps (``hf/patches``) with the versions of the libraries that made them
(``hf/versions``).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.config import GRAPH_CAPTURING_COMPILE_MODES, Config, ConfigError
from workbench.train.fp8 import convert_to_fp8
from workbench.train.ops import resolve

log = logging.getLogger("workbench")

__all__ = ["MODEL_TYPES", "collator", "describe", "prepare", "versions"]

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""HF model types whose layout the patches know: Liger patches each by its own function, and their decoders share
the modules the project's ops replace."""


def versions() -> dict[str, str | None]:
    """The versions of the libraries a prepared model's patches come from (None: not installed)."""
    out: dict[str, str | None] = {}
    for dist in ("transformers", "torchao", "liger-kernel"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _asked(cfg: Config) -> list[str]:
    """The config keys that ask prepare() to change the model, in the order it applies them."""
    cd, t = cfg.loongforge.compute_domain, cfg.training
    keys = []
    if cfg.hf.attention != "sdpa":
        keys.append("hf.attention")
    if cfg.hf.pad_vocab_multiple:
        keys.append("hf.pad_vocab_multiple")
    if not cfg.hf.packed_check:
        keys.append("hf.packed_check")
    if cfg.hf.liger:
        keys.append("hf.liger")
    if any(b == "triton" for b in cd.effective_ops().values()):
        keys.append("loongforge.compute_domain.ops")
    if cd.fused_residual_norm:
        keys.append("loongforge.compute_domain.fused_residual_norm")
    if cd.fp8 != "none":
        keys.append("loongforge.compute_domain.fp8")
    if cd.fp8_head:
        keys.append("loongforge.compute_domain.fp8_head")
    if t.activation_checkpointing != "none":
        keys.append("training.activation_checkpointing")
    if cd.compile != "none":
        keys.append("loongforge.compute_domain.compile")
    return keys


def _decoder(model: nn.Module, cfg: Config) -> tuple[str, nn.Module, nn.ModuleList]:
    """(model type, the decoder, its layers), or a ConfigError naming the type and the first knob that asked."""
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if mtype in MODEL_TYPES and isinstance(layers, nn.ModuleList):
        return mtype, decoder, layers
    asked = _asked(cfg)
    raise ConfigError(
        f"run.prepare() patches Hugging Face decoders of type {', '.join(MODEL_TYPES)} (model.model.layers); this "
        f"model is {type(model).__name__} of type {mtype!r}: leave this knob at its default for it, or prepare the "
        "model yourself", key=asked[0] if asked else "hf")


def _liger_patches_layers(cfg: Config) -> bool:
    """Whether Liger patches the decoder's RMSNorm, SwiGLU and RoPE besides its fused loss: only eagerly (see
    :func:`_liger`). The project's Triton ops replace the same RMSNorm and MLP modules, so they can go with
    ``hf.liger`` only where this is False."""
    return cfg.loongforge.compute_domain.compile == "none"


def _liger(model: nn.Module, mtype: str, cfg: Config) -> str:
    """Liger-Kernel's patches of the instance. Its kernels are autograd Functions that Dynamo cannot trace
    (torch 2.11 fails an assertion in ``higher_order_ops`` on its RMSNorm), so under ``torch.compile`` only the
    fused linear cross-entropy is patched, and it stays outside what is compiled (see :func:`_compile`): inside
    the compiled layers Inductor fuses the norms, SwiGLU and RoPE itself, or the project's Triton ops run there
    (``loongforge.compute_domain.ops``)."""
    try:
        liger = importlib.import_module("liger_kernel.transformers")
    except ImportError as e:
        raise ConfigError(f"got true, but Liger-Kernel is not installed ({e}); pip install liger-kernel, or set "
                          "hf.liger: false", key="hf.liger") from None
    apply: Callable[..., None] = getattr(liger, f"apply_liger_kernel_to_{mtype}")
    layers = _liger_patches_layers(cfg)
    apply(model=model, rope=layers, swiglu=layers, rms_norm=layers, cross_entropy=False,
          fused_linear_cross_entropy=True)
    if layers:
        return f"liger: rms_norm, swiglu, rope, fused_linear_cross_entropy ({mtype})"
    ours = [op for op, b in cfg.loongforge.compute_domain.effective_ops().items()
            if op in ("rmsnorm", "swiglu") and b == "triton"]
    if ours:
        return (f"liger: fused_linear_cross_entropy ({mtype}; the compiled layers' {' and '.join(ours)} are the "
                "project's Triton kernels, the rest Inductor's)")
    return f"liger: fused_linear_cross_entropy ({mtype}; the compiled layers' norms, SwiGLU and RoPE are Inductor's)"


def _loss_backend(cfg: Config) -> str | None:
    """The backend of the project's loss op that runs the model's head and loss (``triton``, or ``fp8`` under
    ``fp8_head``: ``ComputeDomainConfig.effective_ops``), or None: HF's (or Liger's). Refuses ``fp8_head`` without
    FP8 and the project's loss beside ``hf.liger`` (the module docstring's rule)."""
    cd = cfg.loongforge.compute_domain
    if cd.fp8_head and cd.fp8 != "tensorwise":  # any other recipe is refused by the config itself
        raise ConfigError(f"got true with fp8: {cd.fp8!r}; the FP8 head runs under fp8: tensorwise only: set fp8: "
                          "tensorwise or fp8_head: false", key="loongforge.compute_domain.fp8_head")
    backend = cd.effective_ops()["loss"]
    if backend == "torch":
        return None
    if cfg.hf.liger:
        chosen = "fp8_head: true" if backend == "fp8" else "ops.loss: triton"
        raise ConfigError(f"got true with the project's loss ({chosen}): Liger's fused linear cross-entropy and the "
                          "project's are two losses for one head; choose one (hf.liger: false, or ops.loss: torch "
                          "and fp8_head: false)", key="hf.liger")
    return backend


def _pad_vocab(model: nn.Module, multiple: int) -> str | None:
    """The embedding and LM head padded to a multiple of ``multiple`` rows (the new rows the mean of the old, HF's
    default), so the head's GEMMs run on aligned kernels; None where the vocabulary already is one."""
    old = model.get_input_embeddings().weight.shape[0]
    if multiple == 0 or old % multiple == 0:
        return None
    model.resize_token_embeddings(None, pad_to_multiple_of=multiple)
    new = model.get_input_embeddings().weight.shape[0]
    return f"vocabulary padded: {old:,} -> {new:,} rows (a multiple of {multiple})"


_UNNUMBERED: contextvars.ContextVar[bool] = contextvars.ContextVar("workbench_hf_unnumbered", default=False)
"""True inside a prepared decoder's forward that was given neither an attention mask nor position ids."""
_MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask")


def _unchecked(builder: Callable) -> Callable:
    """``builder`` (transformers' mask builder, as the modeling module imported it) without the packed-sequence
    check where :data:`_UNNUMBERED` holds: the position ids it gets are then the decoder's own ``arange``, one
    sequence a row, so the check's answer is known; without them it skips the check and builds the same mask."""
    @functools.wraps(builder)
    def build(*args: Any, **kwargs: Any) -> Any:
        if _UNNUMBERED.get() and kwargs.get("position_ids") is not None:
            kwargs = {**kwargs, "position_ids": None}
        return builder(*args, **kwargs)
    build._workbench_unchecked = True  # type: ignore[attr-defined]
    return build


def _skip_packed_check(decoder: nn.Module, *, whole: bool) -> str:
    """The decoder's forward marks a call given neither ``attention_mask`` nor ``position_ids`` (its inputs by
    keyword, as the causal LM passes them), and its modeling module's mask builders, patched once a process, skip
    the packed-sequence check inside such a call. ``whole``: the whole model or decoder is compiled, and
    transformers skips the check while tracing: nothing to patch. A ConfigError where the module has no builder to
    patch (the first refusal: nothing is patched before it)."""
    module = sys.modules[type(decoder).__module__]
    names = [n for n in _MASK_BUILDERS if callable(getattr(module, n, None))]
    if "create_causal_mask" not in names:
        raise ConfigError(f"got false, but {module.__name__} builds its masks without transformers' "
                          "create_causal_mask (another transformers version); leave it true",
                          key="hf.packed_check")
    if whole:
        return "packed check: none to skip (the model is compiled whole: transformers skips it while tracing)"
    for n in names:
        if not getattr(getattr(module, n), "_workbench_unchecked", False):
            setattr(module, n, _unchecked(getattr(module, n)))
    hf_forward = decoder.forward

    @functools.wraps(hf_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 or kwargs.get("attention_mask") is not None or kwargs.get("position_ids") is not None:
            return hf_forward(*args, **kwargs)
        token = _UNNUMBERED.set(True)
        try:
            return hf_forward(*args, **kwargs)
        finally:
            _UNNUMBERED.reset(token)
    decoder.forward = forward
    return (f"packed check: skipped in {type(decoder).__name__}'s forwards given no attention mask or position ids "
            f"({', '.join(names)})")


def _norm_forward(norm: nn.Module, fn: Callable) -> Callable:
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        return fn(hidden_states, norm.weight, norm.variance_epsilon)
    return forward


def _mlp_forward(mlp: nn.Module, fn: Callable) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return mlp.down_proj(fn(mlp.gate_proj(x), mlp.up_proj(x)))
    return forward


def _fused_layer_forward(layer: nn.Module, add_norm: Callable) -> Callable:
    """A decoder layer's forward with the residual add before its post-attention norm inside that norm
    (``add_norm(x, residual, weight, eps) -> (norm(x + residual), x + residual)``). HF's decoder passes the layer
    everything but the hidden states by keyword, and the attention takes the same keywords; a call with more
    positional arguments runs HF's forward."""
    hf_forward, post = layer.forward, layer.post_attention_layernorm

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            return hf_forward(hidden_states, *args, **kwargs)
        h = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)[0]
        h, s = add_norm(h, hidden_states, post.weight, post.variance_epsilon)  # s: HF's residual + attention
        return s + layer.mlp(h)
    return forward


def _check_fusable(layers: nn.ModuleList) -> None:
    """A ConfigError where a layer is not the pre-norm decoder layer :func:`_fused_layer_forward` knows: its
    modules, and a forward that returns the hidden states alone."""
    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    for layer in layers:
        ret = inspect.signature(type(layer).forward).return_annotation
        if not all(hasattr(layer, p) for p in parts) or ret not in (torch.Tensor, "torch.Tensor"):
            raise ConfigError(f"got true, but {type(layer).__name__} is not a pre-norm decoder layer with "
                              f"{', '.join(parts)} that returns its hidden states alone (its forward returns "
                              f"{ret}); set it to false", key="loongforge.compute_domain.fused_residual_norm")


def _project_ops(model: nn.Module, layers: nn.ModuleList, cfg: Config, device: torch.device) -> list[str]:
    """The project's Triton RMSNorm and SwiGLU in place of the model's modules' forwards (instance attributes: the
    modules and their parameters stay), and under ``fused_residual_norm`` the decoder ``layers``' forwards
    (:func:`_fused_layer_forward`). RoPE on Triton is refused: it is an HF function, not a module (Liger
    patches it); the loss is :func:`_project_loss`'s. With ``hf.liger`` they are refused where Liger patches the
    same modules (eagerly, :func:`_liger_patches_layers`); under compile Liger patches only its loss, and both
    apply."""
    cd = cfg.loongforge.compute_domain
    backends = cd.effective_ops()
    if backends["rope"] == "triton":
        raise ConfigError("got 'triton', but a Hugging Face model's rope is a function of its modeling file, not a "
                          "module the project's kernel can replace; set it to torch, or hf.liger: true",
                          key="loongforge.compute_domain.ops.rope")
    wanted = {op: b for op, b in backends.items() if op in ("rmsnorm", "swiglu") and b == "triton"}
    if not wanted:
        return []
    if cfg.hf.liger and _liger_patches_layers(cfg):
        raise ConfigError("got true with the project's Triton ops chosen and compile: none: eagerly Liger patches "
                          "RMSNorm and SwiGLU too, so both replace the same modules; choose one, or compile (then "
                          "Liger patches only its fused loss)", key="hf.liger")
    fuse = cd.fused_residual_norm and "rmsnorm" in wanted
    if fuse:
        _check_fusable(layers)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":  # as the built-in loop's rule
        log.warning("Triton ops requested on the CPU: the model keeps its torch ops")
        return []
    ops = resolve(wanted, fused_residual_norm=fuse)
    out = []
    if "rmsnorm" in wanted:
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")]
        for m in norms:
            m.forward = _norm_forward(m, ops.rmsnorm)
        out.append(f"rmsnorm: the project's Triton kernel in {len(norms)} modules")
    if fuse:
        for layer in layers:
            layer.forward = _fused_layer_forward(layer, ops.rmsnorm_add)
        out.append(f"fused_residual_norm: the post-attention residual add inside the norm in {len(layers)} "
                   "decoder layers")
    if "swiglu" in wanted:
        mlps = [m for m in model.modules() if all(hasattr(m, p) for p in ("gate_proj", "up_proj", "down_proj"))]
        acts = {getattr(getattr(m, "config", None), "hidden_act", "silu") for m in mlps}
        if acts - {"silu"}:
            raise ConfigError(f"got 'triton', but the model's MLP activation is {sorted(acts)}, not silu (SwiGLU)",
                              key="loongforge.compute_domain.ops.swiglu")
        for m in mlps:
            m.forward = _mlp_forward(m, ops.swiglu)
        out.append(f"swiglu: the project's Triton kernel in {len(mlps)} MLPs")
    return out


_IGNORE_INDEX = -100  # HF's (and F.cross_entropy's) label that never counts


def _loss_forward(model: nn.Module, loss_op: Callable) -> Callable:
    """``model.forward`` with the head and loss of a training forward with labels through ``loss_op``
    (``(h_ND, weight_VD, labels_N, mask_N) -> (loss_sum, n_tokens)``); every other call is HF's forward. The
    decoder gets what HF's forward gives it, less the loss's arguments; the labels shift as HF's
    ``ForCausalLMLoss`` shifts them (hidden state t predicts label t + 1), and the reduction is its: the mean over
    the counted tokens, or the sum over ``num_items_in_batch`` (the Trainer's count under gradient accumulation).
    Returns a ``CausalLMOutputWithPast`` without logits (a tuple under ``return_dict=False``), as Liger's does."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    hf_forward = model.forward
    positional = [n for n, p in inspect.signature(hf_forward).parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    # wraps: the Trainer reads the signature (the batch's columns it keeps; **kwargs: it passes num_items_in_batch)
    @functools.wraps(hf_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(zip(positional, args))
        labels, shift_labels = kwargs.get("labels"), kwargs.get("shift_labels")
        keep = kwargs.get("logits_to_keep", 0)
        if not model.training or (labels is None and shift_labels is None) or not (isinstance(keep, int) and keep == 0):
            return hf_forward(**kwargs)  # evaluation, generation, a forward for its logits: HF's, logits and all
        return_dict = kwargs.pop("return_dict", None)
        n_items = kwargs.pop("num_items_in_batch", None)
        ignore = kwargs.pop("ignore_index", _IGNORE_INDEX)
        for name in ("labels", "shift_labels", "logits_to_keep"):
            kwargs.pop(name, None)
        outputs = model.model(**kwargs)
        h_BTD = outputs[0]
        if shift_labels is None:  # hidden state t predicts label t + 1; the last predicts nothing
            shift_labels = F.pad(labels, (0, 1), value=ignore)[..., 1:]
        labels_N = shift_labels.reshape(-1).to(h_BTD.device)
        loss_sum, n_tokens = loss_op(h_BTD.reshape(-1, h_BTD.shape[-1]), model.get_output_embeddings().weight,
                                     labels_N, labels_N != ignore)
        if n_items is None:
            loss = loss_sum / n_tokens  # HF's mean over the counted tokens (NaN where none counts, as HF's)
        else:
            loss = loss_sum / (n_items.to(loss_sum.device) if torch.is_tensor(n_items) else n_items)
        rest = {k: v for k, v in outputs.items() if k != "last_hidden_state"} if hasattr(outputs, "items") else {}
        out = CausalLMOutputWithPast(loss=loss, logits=None, **rest)
        if return_dict is None:
            return_dict = getattr(model.config, "return_dict", True)
        return out if return_dict else out.to_tuple()

    return forward


def _project_loss(model: nn.Module, backend: str | None, device: torch.device) -> str | None:
    """The model's head and loss through the project's loss op (:func:`_loss_backend`), by :func:`_loss_forward`
    on the instance; None where the model keeps HF's loss."""
    if backend is None:
        return None
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:  # none of MODEL_TYPES has one
        key, got = ("fp8_head", "true") if backend == "fp8" else ("ops.loss", "'triton'")
        raise ConfigError(f"got {got}, but the project's loss op takes an LM head's weight alone, and this model's "
                          f"head is a {type(head).__name__}" + (" with a bias" if isinstance(head, nn.Linear) else ""),
                          key=f"loongforge.compute_domain.{key}")
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        log.warning("the Triton loss requested on the CPU: the model keeps HF's loss")  # as _project_ops
        return None
    model.forward = _loss_forward(model, resolve({"loss": backend}).loss)
    if backend == "fp8":
        return "loss: the project's linear cross-entropy, the LM head's matmuls in FP8 (fp8 head)"
    return "loss: the project's fused linear cross-entropy (triton)"


def _checkpointing(model: nn.Module, layers: nn.ModuleList, cfg: Config) -> str | None:
    t = cfg.training
    if t.activation_checkpointing == "none":
        return None
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x; the older name before
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    every = 1 if t.activation_checkpointing == "full" else t.activation_checkpointing_every
    chosen = [i for i in range(len(layers)) if (i + 1) % every == 0]  # the built-in model's rule
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen
    return f"activation checkpointing: {len(chosen)} of {len(layers)} decoder layers"


def _unconvert_fp8(layer: nn.Module) -> int:
    """The layer's FP8 Linears (torchao's ``Float8Linear``, the project's ``Fp8Linear``) back to ``nn.Linear`` on
    the same parameter objects (what the optimizer holds); returns how many."""
    from torchao.float8.float8_linear import Float8Linear  # installed wherever FP8 ran (fp8_unsupported_reason)

    from workbench.train.fp8_linear import Fp8Linear

    swapped = 0
    for name, child in list(layer.named_modules()):
        if isinstance(child, Fp8Linear):  # a Linear subclass with no state of its own (fp8._use_triton_casts)
            child.__class__ = nn.Linear
            swapped += 1
        elif isinstance(child, Float8Linear):
            with torch.device("meta"):
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
            plain.weight, plain.bias = child.weight, child.bias
            parent, _, attr = name.rpartition(".")
            setattr(layer.get_submodule(parent) if parent else layer, attr, plain)
            swapped += 1
    return swapped


def _compile_fp8_layer(layer: nn.Module, index: int, *, mode: str | None, dynamic: bool, applied: list[str]) -> None:
    """Compile a decoder layer holding FP8 Linears in one graph (``fullgraph``): where Dynamo would break it, the
    first call leaves the layer's Linears in the compute dtype, compiles it as any layer, and says so (a line in
    ``applied``, the run's ``hf/patches``, and a warning). FP8 split across graphs loses the cast fusions it is
    there for. The swap happens before the layer's first forward, so no step has used its FP8 modules yet."""
    whole = torch.compile(layer._call_impl, mode=mode, dynamic=dynamic, fullgraph=True)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return whole(*args, **kwargs)
        except torch._dynamo.exc.Unsupported as e:
            n = _unconvert_fp8(layer)
            line = (f"fp8: decoder layer {index} breaks under torch.compile ({str(e).splitlines()[0][:120]}); its "
                    f"{n} Linears stay in the compute dtype")
            applied.append(line)
            log.warning("prepared: %s", line)
            layer._compiled_call_impl = torch.compile(layer._call_impl, mode=mode, dynamic=dynamic)
            return layer._compiled_call_impl(*args, **kwargs)

    layer._compiled_call_impl = call


def _compile(model: nn.Module, decoder: nn.Module, layers: nn.ModuleList, cfg: Config, applied: list[str],
             loss_apart: str | None) -> str | None:
    """``loss_apart``: whose loss stays outside a whole-model compile (Liger's, the project's), or None."""
    cd = cfg.loongforge.compute_domain
    if cd.compile == "none":
        return None
    mode = None if cd.compile == "default" else cd.compile
    dynamic = cd.compile_shapes == "dynamic"
    if cd.compile_scope == "layer":
        for i, layer in enumerate(layers):
            if cd.fp8 != "none":
                _compile_fp8_layer(layer, i, mode=mode, dynamic=dynamic, applied=applied)
            else:
                layer.compile(mode=mode, dynamic=dynamic)
        return f"torch.compile ({cd.compile}): each of {len(layers)} decoder layers"
    if loss_apart is not None:  # a patched loss stays eager: the decoder is compiled whole, the head and loss apart
        decoder.compile(mode=mode, dynamic=dynamic)
        return f"torch.compile ({cd.compile}): the whole decoder (the head and {loss_apart} apart)"
    model.compile(mode=mode, dynamic=dynamic)
    return f"torch.compile ({cd.compile}): the whole model"


def prepare(model: nn.Module, cfg: Config, device: torch.device) -> tuple[nn.Module, list[str]]:
    """Apply ``cfg``'s choices to the HF ``model`` in place (see the module docstring); returns the model and one
    line per change. Raises ConfigError naming the key for a choice this model cannot take."""
    if not _asked(cfg):
        return model, []
    mtype, decoder, layers = _decoder(model, cfg)
    cd = cfg.loongforge.compute_domain
    loss_backend = _loss_backend(cfg)  # the refusals first, before anything is patched
    if cd.compile_scope == "layer" and cd.compile in GRAPH_CAPTURING_COMPILE_MODES:
        raise ConfigError(f"got {cd.compile!r} with compile_scope: layer: each decoder layer's CUDA graph replays "
                          "over the outputs the next layer saved for its backward, and the first backward fails; "
                          "choose 'default' or 'max-autotune-no-cudagraphs'", key="loongforge.compute_domain.compile")
    applied: list[str] = []
    if not cfg.hf.packed_check:
        applied.append(_skip_packed_check(decoder, whole=cd.compile != "none" and cd.compile_scope != "layer"))
    if cfg.hf.attention != getattr(model.config, "_attn_implementation", None):
        try:
            model.set_attn_implementation(cfg.hf.attention)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"got {cfg.hf.attention!r}, which this model or machine cannot run ({e})",
                              key="hf.attention") from None
        applied.append(f"attention: {cfg.hf.attention}")
    padded = _pad_vocab(model, cfg.hf.pad_vocab_multiple)
    if padded is not None:
        applied.append(padded)
    applied += _project_ops(model, layers, cfg, device)
    if cfg.hf.liger:
        applied.append(_liger(model, mtype, cfg))
    if cd.fp8 != "none":  # the head's FP8 (fp8_head) is the loss op's, below
        chosen = convert_to_fp8(decoder, cd, device.type, device.index or 0)
        who = "the project's Triton casts" if cd.fp8_cast == "triton" else "torchao"
        applied.append(f"fp8 {cd.fp8} ({who}): {len(chosen)} decoder Linears")
    loss_line = _project_loss(model, loss_backend, device)
    if loss_line is not None:
        applied.append(loss_line)
    apart = "Liger's fused loss" if cfg.hf.liger else "the project's loss" if loss_line is not None else None
    for line in (_checkpointing(model, layers, cfg), _compile(model, decoder, layers, cfg, applied, apart)):
        if line is not None:
            applied.append(line)
    for line in applied:
        log.info("prepared: %s", line)
    return model, applied


def collator(cfg: Config) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    """The batches of a Hugging Face run of documents of different lengths, as ``data.packing`` says (hand it to
    the ``Trainer`` as ``data_collator``; each document a dict with ``input_ids``, optionally ``labels``):

    * ``fill``: padding-free. The micro-batch's documents laid end to end in one row, ``position_ids`` restarting
      at each, and the label before each document's first token -100 (HF's ``DataCollatorWithFlattening``):
      no padding row, and attention stays within each document (transformers builds the block mask from the
      position ids, given ``use_cache=False`` which the batch carries; ``flash_attention_2`` gets the sequence
      boundaries). The row's length varies: compile with ``compile_shapes: dynamic``.
    * ``bucket``: each document a row, padded to the longest of the micro-batch rounded up to ``data.bucket_width``
      (a bounded set of shapes), with an ``attention_mask`` and labels -100 on the padding.

    ``WorkbenchCallback`` counts what each processed (the padding apart), so real tokens/s compares them."""
    if cfg.data.packing == "fill":
        from transformers import DataCollatorWithFlattening

        flat = DataCollatorWithFlattening(return_position_ids=True,
                                          return_flash_attn_kwargs=cfg.hf.attention == "flash_attention_2")
        # transformers finds the documents of a packed row only without a KV cache, which its models make by
        # default, in training too (then every token attends across documents): the batch turns it off
        return lambda features: {**flat(features), "use_cache": False}
    width, most = cfg.data.bucket_width, cfg.data.seq_len

    def pad(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        docs = [torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features]
        longest = max(len(d) for d in docs)
        n = min(-(-longest // width) * width, max(most, longest))
        ids = torch.zeros(len(docs), n, dtype=torch.long)
        mask = torch.zeros(len(docs), n, dtype=torch.long)
        labels = torch.full((len(docs), n), -100, dtype=torch.long)
        for i, (d, f) in enumerate(zip(docs, features)):
            ids[i, :len(d)], mask[i, :len(d)] = d, 1
            labels[i, :len(d)] = torch.as_tensor(f.get("labels", d), dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return pad


def describe(applied: list[str]) -> dict[str, Any]:
    """The summary's record of a prepared model: ``hf/patches`` and ``hf/versions``."""
    return {"hf/patches": applied, "hf/versions": versions()}  # the list itself: a layer's FP8 fallback, found at
    # its first forward, adds its line before the summary is written
