"""The typed checking of config sections: a value against its field's type hint (``_coerce``) and the bounds in
the field's metadata (``check_ranges``), generic over any dataclass; every failure a ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import types
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints


from workbench.errors import ConfigError, join_keys

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class _Mismatch(ConfigError):
    """A value of the wrong type at exactly ``key`` (lets a union re-describe what it allows)."""


def show_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def suggest(word: Any, choices: Iterable[str]) -> str | None:
    if not isinstance(word, str):
        return None
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


# --------------------------------------------------------------------------- typed checking


@functools.cache
def type_hints_of(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def section_class(tp: Any) -> type | None:
    """The dataclass in ``tp`` (``Section`` or ``Section | None``), else None."""
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        return section_class(members[0]) if len(members) == 1 else None
    return tp if isinstance(tp, type) and is_dataclass(tp) else None


def choices_text(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _leaf_type(tp: Any) -> Any:
    """The scalar type at the bottom of ``X | None``, ``list[X]``, ``dict[str, X]``."""
    while True:
        if _is_union(tp):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return tp


def _describe_bounds(meta: Mapping[str, Any], leaf: Any) -> str:
    noun = "a power of two" if meta.get("power_of_two") else ("an integer" if leaf is int else "a number")
    lo = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    hi = (meta["le"], "]") if "le" in meta else (meta["lt"], ")") if "lt" in meta else None
    if lo and hi:
        text = f"{noun} in {lo[0]}{lo[1]}, {hi[0]}{hi[1]}"
    elif lo:
        text = f"{noun} {'>=' if lo[0] == '[' else '>'} {lo[1]}"
    elif hi:
        text = f"{noun} {'<=' if hi[1] == ']' else '<'} {hi[0]}"
    else:
        text = noun
    if "multiple_of" in meta:
        text += f" and a multiple of {meta['multiple_of']}"
    return text


def describe_type(tp: Any, meta: Mapping[str, Any] | None = None) -> str:
    """What values of type ``tp`` (with bounds ``meta`` on its numbers) look like, in words."""
    meta = meta or {}
    if _is_union(tp):
        args = get_args(tp)
        parts = [describe_type(a, meta) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " or ".join(parts)
    origin = get_origin(tp)
    if origin is Literal:
        return f"one of {choices_text(get_args(tp))}"
    if origin is list:
        return f"a list of ({describe_type(get_args(tp)[0], meta)})"
    if origin is dict:
        return f"a mapping (name -> {describe_type(get_args(tp)[1], meta)})"
    if tp is bool:
        return "a boolean (true/false)"
    if tp in (int, float):
        return _describe_bounds(meta, tp)
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and is_dataclass(tp):
        return f"a mapping (the section {tp.__name__})"
    return str(tp)


def _mismatch(value: Any, tp: Any, path: str, meta: Mapping[str, Any] | None, note: str = "") -> _Mismatch:
    message = f"got {show_value(value)} ({type(value).__name__}); expected {describe_type(tp, meta)}"
    return _Mismatch(message + note, key=path)


def _coerce(value: Any, tp: Any, path: str, meta: Mapping[str, Any] | None = None) -> Any:
    """Check ``value`` against the type hint ``tp`` and return it in canonical form.

    Canonical: ints become floats where a float is expected, tuples become lists,
    mappings become section dataclasses (through ``from_dict``). Nothing is parsed
    from strings, and a bool is never an int.
    """
    if tp is Any:
        return value
    origin, args = get_origin(tp), get_args(tp)
    if _is_union(tp):
        if value is None:
            if type(None) in args:
                return None
            raise _mismatch(value, tp, path, meta)
        members = [a for a in args if a is not type(None)]
        for member in members:
            try:
                return _coerce(value, member, path, meta)
            except _Mismatch as e:
                if e.key != path:
                    raise  # a mismatch deeper inside (a list item, a section key) says more
        raise _mismatch(value, tp, path, meta)
    if origin is Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return value
        hint = suggest(value, [a for a in args if isinstance(a, str)])
        raise _mismatch(value, tp, path, meta, f" (did you mean {hint!r}?)" if hint else "")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _mismatch(value, tp, path, meta)
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
        raise _mismatch(value, tp, path, meta, note)
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                return number
            raise _mismatch(value, tp, path, meta, " (must be finite)")
        note = " (a boolean is not a number)" if isinstance(value, bool) else ""
        raise _mismatch(value, tp, path, meta, note)
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise _mismatch(value, tp, path, meta)
    if origin is list:
        if isinstance(value, (list, tuple)):
            return [_coerce(item, args[0], f"{path}[{i}]", meta) for i, item in enumerate(value)]
        raise _mismatch(value, tp, path, meta)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _mismatch(value, tp, path, meta)
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Mismatch(f"key {show_value(key)} ({type(key).__name__}) is not a string", key=path)
            out[key] = _coerce(item, args[1], join_keys(path, key), meta)
        return out
    if isinstance(tp, type) and is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return from_dict(tp, value, path)
        raise _mismatch(value, tp, path, meta)
    raise TypeError(f"{path}: unsupported type hint {tp!r} in the config schema")


def _check_bounds(value: Any, meta: Mapping[str, Any], path: str, leaf: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_bounds(item, meta, f"{path}[{i}]", leaf)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_bounds(item, meta, join_keys(path, key), leaf)
        return
    if not isinstance(value, numbers.Real):
        return
    allowed = _describe_bounds(meta, leaf)
    if meta.get("power_of_two") and not (isinstance(value, int) and value > 0 and value & (value - 1) == 0):
        raise ConfigError(f"got {show_value(value)}, not a power of two; expected {allowed}", key=path)
    if (
        ("ge" in meta and not value >= meta["ge"])
        or ("gt" in meta and not value > meta["gt"])
        or ("le" in meta and not value <= meta["le"])
        or ("lt" in meta and not value < meta["lt"])
    ):
        raise ConfigError(f"got {show_value(value)}, out of range; expected {allowed}", key=path)
    if "multiple_of" in meta and value % meta["multiple_of"]:
        raise ConfigError(f"got {show_value(value)}, not a multiple of {meta['multiple_of']}; expected {allowed}", key=path)


def check_ranges(obj: Any) -> None:
    """Check every field of a config dataclass against its type hint, then its metadata bounds.

    Called from each section's ``__post_init__``, so a section built directly is held to the
    same rules as one loaded from YAML. Values are stored back in canonical form (int -> float
    where a float is expected, tuple -> list, mapping -> section). Error keys are relative to
    ``obj``; ``from_dict`` prefixes them with the section's path.
    """
    hints = type_hints_of(type(obj))
    for f in fields(obj):
        tp = hints[f.name]
        value = _coerce(getattr(obj, f.name), tp, f.name, f.metadata)
        object.__setattr__(obj, f.name, value)
        if f.metadata:
            _check_bounds(value, f.metadata, f.name, _leaf_type(tp))


# --------------------------------------------------------------------------- dict conversion

_ROOTS: list[type] = []


def schema_root(cls: type[T]) -> type[T]:
    """Mark ``cls`` as the schema's top level: an unknown key elsewhere names the section that has it."""
    _ROOTS.insert(0, cls)
    return cls


def unknown_key(cls: type, key: Any, path: str) -> ConfigError:
    names = [f.name for f in fields(cls)]
    section = f"'{path}'" if path else "the top level"
    hint = suggest(key, names)
    if hint is None and isinstance(key, str):
        elsewhere = [p for p in _schema_paths() if p.rsplit(".", 1)[-1] == key]
        hint = elsewhere[0] if elsewhere else None
    message = "unknown key" + (f"; did you mean {hint!r}?" if hint else "")
    message += f" Allowed keys of {section}: {', '.join(names)}"
    return ConfigError(message, key=join_keys(path, str(key)))


@functools.cache
def _schema_paths(cls: type | None = None, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema below ``cls`` (default: the class marked :func:`schema_root`)."""
    cls = cls or _ROOTS[0]
    out: list[str] = []
    for f in fields(cls):
        path = join_keys(prefix, f.name)
        out.append(path)
        section = section_class(type_hints_of(cls)[f.name])
        if section is not None:
            out.extend(_schema_paths(section, path))
    return tuple(out)


def from_dict(cls: type[T], data: Mapping[str, Any], path: str = "") -> T:
    """Build the config dataclass ``cls`` from plain data (as parsed from YAML), strictly.

    Rejects unknown keys (suggesting the close match), values of the wrong type and values
    out of range; a missing key takes its default. ``path`` is the dotted location of
    ``data`` inside the whole config, used in error messages.
    """
    if not isinstance(data, Mapping):
        raise _mismatch(data, cls, path, None)
    check = getattr(cls, "check_data", None)  # the root's checks of the raw data before its fields (version)
    if check is not None:
        try:
            check(data)
        except ConfigError as e:
            raise e.with_prefix(path) from None
    hints = type_hints_of(cls)
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise unknown_key(cls, key, path)
        kwargs[key] = _coerce(value, hints[key], join_keys(path, key), known[key].metadata)
    missing = [
        name
        for name, f in known.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(missing)}", key=path)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise e.with_prefix(path) from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass, keys in schema order (what ``dump_config`` writes)."""
    return dataclasses.asdict(cfg)
