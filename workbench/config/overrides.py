"""Changing a config the validated way: dotted-key overrides (``merge_overrides``, ``parse_overrides`` for
``--set KEY=VALUE``) and the preset defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any, get_args, get_origin

import yaml

from workbench.config.schema import Config
from workbench.config.typecheck import describe_type, type_hints_of, section_class, show_value, unknown_key, from_dict, to_dict
from workbench.config.yaml_io import StrictLoader
from workbench.errors import ConfigError, join_keys


# --------------------------------------------------------------------------- overrides


def merge_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """A new validated Config with dotted-key overrides applied, e.g. {"data.micro_batch_size": 8}.

    A mapping given for a section is merged key by key; a mapping given for a dict field
    (``loongforge.compute_domain.kernels``) replaces it, and ``...kernels.rmsnorm.num_warps``
    sets one entry. Unknown keys raise ConfigError naming the key.
    """
    data = to_dict(cfg)
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"malformed override key {key!r}; expected a dotted key such as 'data.seq_len'")
        _apply_override(data, key.split("."), value)
    return from_dict(Config, data)


def _apply_override(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node, tp = data, Any
    section: type | None = Config
    for i, part in enumerate(parts):
        path = ".".join(parts[:i])
        if section is not None:
            if part not in {f.name for f in fields(section)}:
                raise unknown_key(section, part, path)
            tp = type_hints_of(section)[part]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            raise ConfigError(f"is {describe_type(tp)}, it has no key {part!r}", key=path)
        child_section = section_class(tp)
        if i == len(parts) - 1:
            if child_section is not None and isinstance(value, Mapping) and isinstance(node.get(part), dict):
                for key, item in value.items():  # merge into the section, key by key
                    _apply_override(data, [*parts, str(key)], item)
            else:
                node[part] = value
            return
        if node.get(part) is None:
            node[part] = {}  # e.g. provenance.study on a config without provenance
        if not isinstance(node[part], dict):
            raise ConfigError(f"is {show_value(node[part])}, it has no key {parts[i + 1]!r}", key=join_keys(path, part))
        node, section = node[part], child_section


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse command-line overrides ``["data.micro_batch_size=8", "training.dtype=bf16"]``.

    Each value is read as YAML (``8`` is an int, ``true`` a bool, ``null`` None, ``[1, 2]`` a list).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            out[key.strip()] = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse the value {text!r}: {e}", key=key.strip()) from None
    return out


# --------------------------------------------------------------------------- run helpers


def preset_config(name: str) -> Config:
    """The default config for the model preset ``name`` (one of MODEL_PRESETS); other keys keep their defaults."""
    return merge_overrides(Config(), {"model.name": name, "model.config_path": None})
