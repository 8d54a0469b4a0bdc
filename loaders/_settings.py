"""Where ``BatchPipeline``'s settings come from in the workbench config, and errors that name the config's keys.

loaders sits below workbench (import-linter's layers), so the config sections are read duck-typed, by their
attribute names; the table below is the one place those names live. See docs/loaders.md ("From a config").
"""

from __future__ import annotations

import re
from typing import Any

# Where each section sits in the workbench config: the prefix of a key named in an error.
SECTION_KEYS = {"data": "data", "io": "loongforge.io_domain", "memory": "loongforge.memory_domain"}

# BatchPipeline argument -> (section, the section's attribute).
CONFIG_FIELDS = {
    "micro_batch": ("data", "micro_batch_size"),
    "num_workers": ("data", "num_workers"),
    "prefetch_batches": ("data", "prefetch_batches"),
    "shuffle_window_frames": ("data", "shuffle_window_frames"),
    "bucket_width": ("data", "bucket_width"),
    "packing": ("data", "packing"),
    "seq_len": ("data", "seq_len"),
    "io_backend": ("io", "io_backend"),
    "ring_depth": ("io", "io_uring_entries"),
    "read_threads": ("io", "read_threads"),
    "num_staging_blocks": ("memory", "num_staging_blocks"),
    "pinned_block_kb": ("memory", "pinned_block_kb"),
}


def _key(section: str, attr: str) -> str:
    return f"{SECTION_KEYS[section]}.{attr}"


def _read(sections: dict[str, Any], section: str, attr: str) -> Any:
    try:
        return getattr(sections[section], attr)
    except AttributeError:
        raise TypeError(f"{_key(section, attr)}: the {section} section given "
                        f"({type(sections[section]).__name__}) has no attribute {attr!r}") from None


def config_arguments(data: Any, io: Any, memory: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """BatchPipeline's arguments read from the three sections, and the config key each one came from."""
    sections = {"data": data, "io": io, "memory": memory}
    kwargs = {arg: _read(sections, section, attr) for arg, (section, attr) in CONFIG_FIELDS.items()}
    return kwargs, {arg: _key(section, attr) for arg, (section, attr) in CONFIG_FIELDS.items()}


def config_shards(data: Any) -> Any:
    """The shard directory of the data section (``data.loongbin_dir``)."""
    path = _read({"data": data}, "data", "loongbin_dir")
    if not path:
        raise ValueError("data.loongbin_dir is not set: point it at a shard directory written by "
                         "`python -m loaders.preprocess`, or pass shards=")
    return path


def config_error(e: ValueError, keys: dict[str, str]) -> ValueError | None:
    """``e``'s message with each argument named as its config key (``micro_batch=0`` ->
    ``data.micro_batch_size=0``, ``need pinned_block_kb >= 12`` -> ``need loongforge.memory_domain...``); None
    when ``e`` is a subclass (``ShardFormatError`` keeps its type and words) or names none of them."""
    if type(e) is not ValueError or not keys:
        return None
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, keys)) + r")(?=\s?[<>]?=)")
    msg, n = pattern.subn(lambda m: keys[m.group(1)], str(e))
    return ValueError(msg) if n else None
