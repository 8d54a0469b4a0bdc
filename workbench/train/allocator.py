"""The CUDA caching allocator's settings, from ``loongforge.memory_domain.allocator``, in one place: written to
``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` (torch reads them when CUDA initialises), and checked with
the installed torch's own allocator-config parser, so that an option this torch does not know, or a value it
refuses, is a ``ConfigError`` naming the config key before any CUDA work. A CPU-only torch parses the values but
registers no CUDA parser, so it cannot tell an unknown option from a known one; there the settings act on nothing
anyway."""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import fields
from typing import Any

from workbench.config import AllocatorConfig, Config
from workbench.errors import ConfigError

__all__ = ["apply_allocator_env", "apply_allocator_settings", "check_allocator_settings", "env_option", "set_options"]

_KEY = "loongforge.memory_domain.allocator"


_ALLOC_ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # CUDA-specific name, newer generic name


def _env_options(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator options ``environ`` sets, option -> value: PYTORCH_CUDA_ALLOC_CONF's first, then those only
    PYTORCH_ALLOC_CONF sets."""
    merged: dict[str, str] = {}
    for var in _ALLOC_ENV_VARS:
        for item in filter(None, environ.get(var, "").split(",")):
            option, _, value = item.partition(":")
            merged.setdefault(option.strip(), value.strip())
    return merged


def env_option(option: str, environ: Mapping[str, str]) -> str | None:
    """The value ``environ`` gives the allocator ``option``, which a config that leaves the option unset (null)
    runs with; None where the environment does not set it (torch's default then)."""
    return _env_options(environ).get(option)


def apply_allocator_env(cfg: Config, environ: MutableMapping[str, str] | None = None) -> str:
    """Put the config's allocator settings into PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF.

    Settings already in the environment are kept unless the config sets the same option.
    Returns the value written ("" and nothing written when the config sets no option).
    Torch reads these variables when CUDA initialises, so call this before that.
    """
    environ = os.environ if environ is None else environ
    ours = cfg.loongforge.memory_domain.allocator.to_env()
    if not ours:
        return ""
    merged = _env_options(environ)
    for item in ours.split(","):
        option, _, value = item.partition(":")
        merged[option] = value
    text = ",".join(f"{option}:{value}" for option, value in merged.items())
    for var in _ALLOC_ENV_VARS:
        environ[var] = text
    torch = sys.modules.get("torch")
    if environ is os.environ and torch is not None and torch.cuda.is_initialized():
        warnings.warn(
            "apply_allocator_env: CUDA is already initialised in this process; the allocator "
            "settings take effect only in processes started after this call",
            stacklevel=2,
        )
    return text


def apply_allocator_settings(cfg: Config, environ: MutableMapping[str, str] | None = None) -> str:
    """Put the config's allocator settings into the environment and check them with the installed torch.

    Returns the settings string written ("" when the config sets none). The
    check (``check_allocator_settings``) runs only for this process's own
    environment (``environ`` None); call this before CUDA initialises.
    """
    text = apply_allocator_env(cfg, environ)
    if text and environ is None:
        check_allocator_settings(text, config_options=set_options(cfg.loongforge.memory_domain.allocator))
    return text


def set_options(alloc: AllocatorConfig) -> dict[str, Any]:
    return {f.name: getattr(alloc, f.name) for f in fields(alloc) if getattr(alloc, f.name) is not None}


def _allocator_setter() -> Callable[[str], Any] | None:
    import torch

    for name in ("_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings"):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            return fn
    return None


def check_allocator_settings(text: str, *, config_options: Mapping[str, Any] | None = None,
                             setter: Callable[[str], Any] | None = None) -> None:
    """Parse ``text`` (``option:value,...``) with the installed torch's allocator-config parser.

    Raises ``ConfigError`` naming ``loongforge.memory_domain.allocator.<option>``
    when torch rejects an option the config set (``config_options``), or naming
    the environment variable when the option came from there. The parser also
    applies the settings to this process's allocator config: the same values
    the environment gives it when CUDA initialises. No-op when this torch has
    no parser to call.
    """
    import torch

    setter = setter or _allocator_setter()
    if setter is None or not text:
        return
    try:
        setter(text)
    except (RuntimeError, ValueError) as e:
        msg = " ".join(str(e).split("\n")[0].split())
        option = _offending_option(msg, text)
        ours = dict(config_options or {})
        where = f"torch {torch.__version__} rejects the allocator setting"
        if option in ours:
            raise ConfigError(f"{where} {option}:{ours[option]}: {msg}", key=f"{_KEY}.{option}") from None
        if option is not None:
            raise ConfigError(f"{where} {option!r} from the environment (PYTORCH_CUDA_ALLOC_CONF / "
                              f"PYTORCH_ALLOC_CONF = {text!r}): {msg}", key="PYTORCH_CUDA_ALLOC_CONF") from None
        raise ConfigError(f"{where}s {text!r}: {msg}", key=_KEY) from None


def _tokens(text: str) -> list[str]:
    """Tokens as torch's ConfigTokenizer makes them: words and the separators , : [ ]."""
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _offending_option(message: str, text: str) -> str | None:
    """The option a torch allocator-config error is about (its name, a token index, or a mention)."""
    m = re.search(r"Unrecognized key '([^']+)'|Unrecognized CachingAllocator option: ?(\w+)", message)
    if m:
        return m.group(1) or m.group(2)
    tokens = _tokens(text)
    keys: list[str | None] = []
    current, depth = None, 0
    for i, t in enumerate(tokens):
        depth += (t == "[") - (t == "]")
        if depth == 0 and i + 1 < len(tokens) and tokens[i + 1] == ":" and (i == 0 or tokens[i - 1] == ","):
            current = t
        keys.append(current)
    m = re.search(r"at index (\d+)", message)
    if m and int(m.group(1)) < len(keys):
        return keys[int(m.group(1))]
    present = [k for k in dict.fromkeys(k for k in keys if k)]
    aliases = {"garbage_collect": "garbage_collection_threshold", "roundup": "roundup_power2_divisions",
               "max_split_size": "max_split_size_mb", "expandable": "expandable_segments"}
    for word, option in aliases.items():
        if word in message and option in present:
            return option
    for option in present:
        if option in message:
            return option
    return None


# --------------------------------------------------------------------------- the analysis (pure)
