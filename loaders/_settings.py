"""``BatchPipeline``'s and ``VLAPipeline``'s settings: the bounds of their arguments, where each comes from in the
workbench config, and errors that name the config's keys.

loaders sits below workbench (import-linter's layers), so the config sections are read duck-typed, by their
attribute names, which are the pipelines' argument names too; ``CONFIG_FIELDS`` says which section holds each.
See docs/loaders.md ("From a config").
"""

from __future__ import annotations

import re
from typing import Any

from ._plans import PACKINGS
from .reader import BACKENDS

# Shortest fill row accepted (data.seq_len's lower bound too).
_MIN_SEQ_LEN = 16

# Where each section sits in the workbench config: the prefix of a key named in an error.
SECTION_KEYS = {"data": "data", "io": "loongforge.io_domain", "memory": "loongforge.memory_domain"}

# BatchPipeline argument -> the section it is read from; the section's attribute has the argument's name.
CONFIG_FIELDS = {
    "micro_batch_size": "data",
    "num_workers": "data",
    "prefetch_batches": "data",
    "shuffle_window_frames": "data",
    "bucket_width": "data",
    "packing": "data",
    "seq_len": "data",
    "io_backend": "io",
    "io_uring_entries": "io",
    "read_threads": "io",
    "num_staging_blocks": "memory",
    "pinned_block_kb": "memory",
}

# VLAPipeline argument -> its section: the token pipeline's loader settings, no packing, and the vla shapes and
# augmentation (``data.augment``: an object with ``AugmentSettings``' field names).
VLA_CONFIG_FIELDS = {
    **{k: v for k, v in CONFIG_FIELDS.items() if k not in ("bucket_width", "packing", "seq_len")},
    "image_size": "data",
    "text_len": "data",
    "action_shape": "data",
    "augment": "data",
}


def check_arguments(*, micro_batch_size: int, seed: int, num_workers: int, io_uring_entries: int,
                    read_threads: int, prefetch_batches: int, shuffle_window_frames: int, num_staging_blocks: int,
                    start_epoch: int, epochs: int | None, bucket_width: int | None, packing: str,
                    seq_len: int | None, io_backend: str) -> None:
    """Refuse an argument of ``BatchPipeline`` outside its bounds, naming it (``micro_batch_size=0: ...``)."""
    for name, value, lo in (("micro_batch_size", micro_batch_size, 1), ("num_workers", num_workers, 0),
                            ("io_uring_entries", io_uring_entries, 1), ("read_threads", read_threads, 1),
                            ("prefetch_batches", prefetch_batches, 1),
                            ("shuffle_window_frames", shuffle_window_frames, 1),
                            ("num_staging_blocks", num_staging_blocks, 1), ("seed", seed, 0),
                            ("start_epoch", start_epoch, 0)):
        if not isinstance(value, int) or value < lo:
            raise ValueError(f"{name}={value!r}: expected an int >= {lo}")
    if bucket_width is not None and (not isinstance(bucket_width, int) or bucket_width < 1):
        raise ValueError(f"bucket_width={bucket_width!r}: expected None (the shards' buckets) or an int >= 1")
    if packing not in PACKINGS:
        raise ValueError(f"packing={packing!r}: expected one of {', '.join(map(repr, PACKINGS))}")
    if packing == "fill" and seq_len is None:
        raise ValueError(f"seq_len=None: packing='fill' needs seq_len, an int >= {_MIN_SEQ_LEN}")
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < _MIN_SEQ_LEN):
        raise ValueError(f"seq_len={seq_len!r}: expected None (bucket packing) or an int >= {_MIN_SEQ_LEN}")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs={epochs!r}: expected None (endless) or an int >= 1")
    if io_backend not in BACKENDS:
        raise ValueError(f"io_backend={io_backend!r}: expected one of {', '.join(BACKENDS)}")


def _shape(value: Any, n: int) -> tuple[int, ...] | None:
    """``value`` as a tuple of ``n`` positive ints, or None when it is not one."""
    try:
        out = tuple(value)
    except TypeError:
        return None
    ok = len(out) == n and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in out)
    return out if ok else None


def check_vla_arguments(*, text_len: Any, image_size: Any, action_shape: Any) -> tuple[Any, Any, Any]:
    """``VLAPipeline``'s shape arguments checked and normalised: ``text_len`` None or an int >= 1, ``image_size``
    None, an int (square) or (H, W), ``action_shape`` None or (K, A); returns (text_len, (H, W) | None,
    (K, A) | None)."""
    if text_len is not None and (not isinstance(text_len, int) or isinstance(text_len, bool) or text_len < 1):
        raise ValueError(f"text_len={text_len!r}: expected None (the shard set's) or an int >= 1")
    size = image_size
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        size = (image_size, image_size)
    if size is not None and _shape(size, 2) is None:
        raise ValueError(f"image_size={image_size!r}: expected None (the shard set's), an int or [height, width]")
    if action_shape is not None and _shape(action_shape, 2) is None:
        raise ValueError(f"action_shape={action_shape!r}: expected None (the shard set's) or [steps, dims]")
    return (text_len, None if size is None else tuple(size),
            None if action_shape is None else tuple(action_shape))


def _key(section: str, attr: str) -> str:
    return f"{SECTION_KEYS[section]}.{attr}"


def _read(sections: dict[str, Any], section: str, attr: str) -> Any:
    try:
        return getattr(sections[section], attr)
    except AttributeError:
        raise TypeError(f"{_key(section, attr)}: the {section} section given "
                        f"({type(sections[section]).__name__}) has no attribute {attr!r}") from None


def config_arguments(data: Any, io: Any, memory: Any, table: dict[str, str] = CONFIG_FIELDS,
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """A pipeline's arguments read from the three sections (``table``: ``CONFIG_FIELDS`` or
    ``VLA_CONFIG_FIELDS``; each argument is its section's attribute of the same name), and the config key each
    one came from."""
    sections = {"data": data, "io": io, "memory": memory}
    kwargs = {arg: _read(sections, section, arg) for arg, section in table.items()}
    return kwargs, {arg: _key(section, arg) for arg, section in table.items()}


def config_shards(data: Any) -> Any:
    """The shard directory of the data section (``data.loongbin_dir``)."""
    path = _read({"data": data}, "data", "loongbin_dir")
    if not path:
        raise ValueError("data.loongbin_dir is not set: point it at a shard directory written by "
                         "`python -m loaders.preprocess`, or pass shards=")
    return path


def config_error(e: ValueError, keys: dict[str, str]) -> ValueError | None:
    """``e``'s message with each argument named as its config key (``micro_batch_size=0`` ->
    ``data.micro_batch_size=0``, ``need pinned_block_kb >= 12`` -> ``need loongforge.memory_domain...``); None
    when ``e`` is a subclass (``ShardFormatError`` keeps its type and words) or names none of them."""
    if type(e) is not ValueError or not keys:
        return None
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, keys)) + r")(?=\s?[<>]?=)")
    msg, n = pattern.subn(lambda m: keys[m.group(1)], str(e))
    return ValueError(msg) if n else None
