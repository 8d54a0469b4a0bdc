"""FP8 training through torchao.float8: which Linears convert, and the checks before any does.

``loongforge.compute_domain.fp8`` names torchao's recipe (``tensorwise``, ``rowwise``,
``rowwise_with_gw_hp``); ``none`` converts nothing. A Linear is converted when its module
name (HF naming, ``layers.3.mlp.up_proj``) matches a pattern of ``fp8_modules.include``,
none of ``fp8_modules.exclude``, and, with ``fp8_modules.size_filter``, torchao's size
thresholds for the recipe (``torchao.float8._auto_filter_for_recipe``: dims multiples of 16,
small matmuls left out; ``rowwise_with_gw_hp`` uses the rowwise thresholds).

The LM head is not called as a Linear here (the loss op reads its weight, fused or not),
so a pattern that selects it is refused; ``compute_domain.fp8_head`` runs it in FP8 instead (the loss op
``workbench.train.fp8_linear.linear_cross_entropy_fp8``, on the vocabulary padded to a multiple of 64).

``loongforge.compute_domain.fp8_cast: triton`` (tensorwise only) keeps torchao's numerics but makes the casts
the project's own (``kernels.fp8_cast``): the selected Linears become ``workbench.train.fp8_linear.Fp8Linear``, whose matmuls are
``torch._scaled_mm`` on operands cast by one amax read and one pass that writes each FP8 tensor both row-major and
transposed (torchao reads a tensor again for each layout, and casts the input again in the backward). Linears that
share an input (q/k/v, gate/up: ``workbench.train.model.project``) cast it once, and the backward keeps the FP8
copies, not the bf16 input.

Where FP8 cannot run, the config is refused with a ``ConfigError`` (``invalid_config``):
torchao missing, or a CUDA device before compute capability 8.9. Off CUDA torchao's
``emulate`` runs each FP8 matmul as an fp32 matmul of the FP8-rounded operands: the numbers are
FP8's, the speed is not; the CPU tests use it. (The CPU's own ``torch._scaled_mm`` takes a
path that can be orders of magnitude slower, by CPU and operand dtypes.)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
from collections.abc import Callable

from workbench.config import ComputeDomainConfig, ConfigError

__all__ = ["convert_to_fp8", "fp8_module_filter", "fp8_unsupported_reason", "torchao_config"]

MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards."""

_KEY = "loongforge.compute_domain.fp8"


def fp8_unsupported_reason(device_type: str, device_index: int = 0) -> str | None:
    """Why FP8 training cannot run on this device (None: it can)."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed; install the [fp8] extra (pip install 'loongforge-workbench[fp8]')"
    if device_type == "cuda":
        import torch

        cap = torch.cuda.get_device_capability(device_index)
        if cap < MIN_CAPABILITY:
            return (f"{torch.cuda.get_device_name(device_index)} has compute capability {cap[0]}.{cap[1]}; FP8 "
                    f"matmuls need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper)")
    return None


def torchao_config(recipe: str, device_type: str):
    """torchao's ``Float8LinearConfig`` for ``recipe`` on ``device_type``: emulated off CUDA (the module doc)."""
    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=device_type != "cuda")


def fp8_module_filter(cd: ComputeDomainConfig) -> Callable[[object, str], bool]:
    """torchao's ``module_filter_fn(module, fqn)`` for the recipe and ``fp8_modules`` of ``cd``."""
    import torch.nn as nn

    mods = cd.fp8_modules
    size_ok: Callable[[object, str], bool] | None = None
    if mods.size_filter:
        from torchao.float8 import _auto_filter_for_recipe

        size_ok = _auto_filter_for_recipe("rowwise" if cd.fp8 == "rowwise_with_gw_hp" else cd.fp8, filter_fqns=[])

    def keep(module: object, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        if not any(fnmatch.fnmatchcase(fqn, p) for p in mods.include):
            return False
        if any(fnmatch.fnmatchcase(fqn, p) for p in mods.exclude):
            return False
        return size_ok is None or size_ok(module, fqn)

    return keep


def convert_to_fp8(model, cd: ComputeDomainConfig, device_type: str, device_index: int = 0) -> list[str]:
    """Swap the selected Linears of ``model`` for torchao's ``Float8Linear`` in place, keeping their parameter
    tensors; returns the converted module names. Raises ConfigError where FP8 cannot run or would convert
    nothing."""
    if cd.fp8 == "none":
        return []
    reason = fp8_unsupported_reason(device_type, device_index)
    if reason is not None:
        raise ConfigError(f"got {cd.fp8!r}, but {reason}; set fp8: 'none'", key=_KEY)
    from torchao.float8 import convert_to_float8_training

    keep = fp8_module_filter(cd)
    head = getattr(model, "lm_head", None)
    if head is not None and keep(head, "lm_head"):
        raise ConfigError("selects lm_head, which runs inside the loss op, not as a Linear; exclude it (exclude: "
                          "['lm_head']) and set fp8_head: true to run the head in FP8",
                          key="loongforge.compute_domain.fp8_modules.include")
    chosen = [name for name, module in model.named_modules() if keep(module, name)]
    if not chosen:
        mods = cd.fp8_modules
        raise ConfigError(
            f"got {cd.fp8!r}, but no Linear matches fp8_modules (include {mods.include}, exclude {mods.exclude}"
            + (", torchao's size thresholds" if mods.size_filter else "") + "); widen include, or set "
            "fp8_modules.size_filter: false for small models", key=_KEY)
    if cd.triton_casts:
        from kernels import fp8_cast as kernels_fp8

        if device_type != "cuda" and not kernels_fp8.INTERPRETED:
            key, got, fix = (("fp8_cast", "'triton'", "fp8_cast: torchao") if cd.fp8_cast == "triton" else
                             ("fp8_head", "true", "fp8_head: false"))
            raise ConfigError(f"got {got}, but the Triton casts run on CUDA (the CPU only under TRITON_INTERPRET=1); "
                              f"set {fix}", key=f"loongforge.compute_domain.{key}")
    if cd.fp8_cast == "triton":
        _use_triton_casts(model, chosen)
    else:
        convert_to_float8_training(model, module_filter_fn=keep, config=torchao_config(cd.fp8, device_type))
    return chosen


def _use_triton_casts(model, chosen: list[str]) -> None:
    """Turn the Linears named ``chosen`` into ``Fp8Linear`` in place (the same parameter tensors)."""
    from workbench.train.fp8_linear import Fp8Linear

    modules = dict(model.named_modules())
    for name in chosen:
        modules[name].__class__ = Fp8Linear  # a Linear subclass with no state of its own
