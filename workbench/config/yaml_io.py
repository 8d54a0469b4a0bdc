"""``config.yaml`` in and out: the strict YAML loader (no implicit timestamps, no duplicate keys), the commented
dumper, and the checks that name the file and line of what is wrong."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

import yaml

from workbench.config.schema import Config, config_hash, field_docs
from workbench.config.typecheck import type_hints_of, section_class, from_dict, to_dict
from workbench.errors import ConfigError
from workbench.files import write_text


# --------------------------------------------------------------------------- YAML


_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML 1.1 (PyYAML) reads 3e-4 as a string because it wants a dot; accept exponent forms too.
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def _resolvers_without(base: type, drop: set[str]) -> dict[str, list[Any]]:
    return {ch: [(tag, rx) for tag, rx in lst if tag not in drop] for ch, lst in base.yaml_implicit_resolvers.items()}


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that reads 3e-4 as a float, keeps timestamps as strings and rejects duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


StrictLoader.yaml_implicit_resolvers = _resolvers_without(yaml.SafeLoader, {_FLOAT_TAG, _TIMESTAMP_TAG})
StrictLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes any string our loader (or a plain YAML 1.1 reader) would read as non-string."""


_Dumper.yaml_implicit_resolvers = _resolvers_without(yaml.SafeDumper, set())
_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT_RE, list("-+0123456789."))


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Double quotes keep newlines and control characters on one line as escapes.
    style = None if data.isprintable() else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def _flow(value: Any) -> str:
    """One-line YAML for a scalar or a small list/dict."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=sys.maxsize, allow_unicode=True, sort_keys=False
    )
    if text.endswith("\n...\n"):  # document-end marker after a plain top-level scalar
        text = text[: -len("\n...\n")]
    return text.rstrip("\n")


def _emit(data: Mapping[str, Any], tp: Any, indent: int, out: list[str], comments: bool) -> None:
    section = section_class(tp)
    docs = field_docs(section) if comments and section is not None else {}
    pad = "  " * indent
    for key, value in data.items():
        child_tp = type_hints_of(section)[key] if section is not None else (get_args(tp)[1] if get_args(tp) else Any)
        if indent == 0:
            out.append("")
        if key in docs:
            out.append(f"{pad}# {docs[key]}")
        if isinstance(value, dict) and value:
            out.append(f"{pad}{_flow(key)}:")
            _emit(value, child_tp, indent + 1, out, comments)
        else:
            out.append(f"{pad}{_flow(key)}: {_flow(value)}")


def dumps_config(cfg: Config, *, comments: bool = True) -> str:
    """YAML text of ``cfg``: sections in schema order, each key preceded by its documentation when ``comments``."""
    lines = [
        f"# LoongForge workbench config, schema version {cfg.version}; config_hash {config_hash(cfg)}.",
        "# Keys and allowed values: workbench/config/schema.py. Unknown keys are rejected on load.",
    ]
    _emit(to_dict(cfg), Config, 0, lines, comments)
    return "\n".join(lines) + "\n"


def dump_config(cfg: Config, path: str | os.PathLike[str], *, comments: bool = True) -> Path:
    """Write ``cfg`` as YAML to ``path`` atomically (workbench.files: the mode follows the umask); returns the
    path."""
    return write_text(path, dumps_config(cfg, comments=comments))


def check_yaml_text(text: str, source: str, what: str = "config") -> None:
    """A NUL byte (a binary or damaged file) and a file with nothing in it are ConfigErrors of one line."""
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise ConfigError(f"holds a NUL byte (character {nul}); expected a YAML {what} (is it a binary file?)",
                          source=source, line=line)
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise ConfigError(f"is empty; expected a YAML {what}"
                          + (" (to run a preset's defaults, pass --preset NAME instead of --config)"
                             if what == "config" else ""), source=source)


def load_yaml(text: str, source: str, what: str = "config") -> Any:
    """The strict YAML parse every project file goes through (config.yaml, study specs): no NUL byte, not empty,
    3e-4 read as a float, timestamps kept as strings, duplicate keys refused; a syntax error is a ConfigError
    naming ``source`` and the line."""
    check_yaml_text(text, source, what)
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = "invalid YAML" + (f" (column {mark.column + 1})" if mark is not None else "")
        message += f": {e.problem or e.context}"
        if e.problem and e.context:
            where = f" at line {e.context_mark.line + 1}" if e.context_mark is not None else ""
            message += f" ({e.context}{where})"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(message, source=source, line=line) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"YAML error: {e}", source=source) from None


def loads_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate YAML text; errors name ``source`` (and the line, for YAML syntax errors). An empty
    text is refused: an empty file is a mistake, not a request for the defaults."""
    data = load_yaml(text, source)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"top level is {type(data).__name__}; expected a mapping of sections "
            f"({', '.join(f.name for f in fields(Config))})",
            source=source,
        )
    try:
        return from_dict(Config, data)
    except ConfigError as e:
        raise e.with_source(source) from None


def read_yaml_text(path: Path, what: str = "config") -> str:
    """The text of a YAML file; a missing, unreadable or non-UTF-8 file is a ConfigError naming it
    (``what``: the kind of file, for the message)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such {what} file", source=str(path)) from None
    except IsADirectoryError:
        raise ConfigError(f"is a directory; expected a {what} file", source=str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}); expected a YAML {what}", source=str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", source=str(path)) from None


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config.yaml; ConfigError messages start with the file name."""
    path = Path(path)
    return loads_config(read_yaml_text(path), source=str(path))
