"""How the project writes and deletes files, defined once: atomic writes (temp file, fsync, ``os.replace``, fsync of
the folder), the rule for names that become paths, and deletes that never follow a symlink. Imports only
``workbench.errors``: loaders, kernels and every layer above use it; no torch.

A write that fails (a full disk, a read-only folder) removes its temp file and raises :class:`DiskError`; the file
it replaces, if any, is left as it was."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from workbench.errors import ConfigError, DiskError, UnsafePathError

__all__ = ["NAME_RE", "atomic_write", "check_name", "fsync_dir", "remove_tree", "write_json", "write_text"]

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
"""Every name that becomes a path (study names, trial folders) matches this in full, and is not ``.`` or ``..``."""


_UMASK = os.umask(0o022)  # read once at import: os.umask can only be read by setting it (racy under threads)
os.umask(_UMASK)


def _umask() -> int:
    """The process's umask now: Linux tells it in /proc/self/status without changing it; elsewhere the one at
    import."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return _UMASK


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the folder ``path``, so that a rename in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None], *, mode: int | None = None) -> Path:
    """Write ``path`` through ``write(fileobj)``: a temp file beside it, fsync, ``os.replace``, fsync of the folder.
    A reader sees the old file or the whole new one. The file gets ``mode`` (default 0o666) less the umask. On any
    failure the temp file is removed; an OSError is raised as one :class:`DiskError` naming ``path``."""
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, (0o666 if mode is None else mode) & ~_umask())  # mkstemp makes it 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        cause = _os_error(e)
        if cause is None or isinstance(e, DiskError):
            raise
        raise DiskError(f"{path}: could not be written ({cause.strerror or cause}); the previous file, if any, is "
                        "unchanged: free space or fix the folder's permissions", filename=str(path),
                        errno=cause.errno, strerror=cause.strerror) from e
    return path


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind ``e``: ``e`` itself, or one it was raised from or while handling (torch.save reports a
    failed write as a RuntimeError raised while handling the OSError)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """:func:`atomic_write` of ``text`` (UTF-8)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data), mode=mode)


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, mode: int | None = None,
               default: Callable[[Any], Any] | None = None) -> Path:
    """:func:`atomic_write` of ``obj`` as JSON with a final newline."""
    return write_text(path, json.dumps(obj, indent=indent, default=default) + "\n", mode=mode)


def check_name(name: str, what: str, *, key: str = "") -> str:
    """``name`` if it may become one path component (:data:`NAME_RE`, not ``.``/``..``); else a ConfigError
    naming ``what`` (``--study-name``, the spec's ``name``)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", "..") or ".." in name:
        raise ConfigError(f"{what} {name!r}: expected letters, digits, '.', '_' or '-' (no '..', no '/'), so that "
                          "it names one folder inside --out", key=key)
    return name


def _real_below(path: Path) -> bool:
    """``path``'s folder has no symlink in it: its real path is its absolute path."""
    parent = os.path.abspath(path.parent)
    return os.path.realpath(parent) == parent


def remove_tree(path: str | os.PathLike[str], *, missing_ok: bool = True) -> None:
    """Delete the folder ``path`` and everything in it, never through a symlink: a ``path`` that is a symlink, or
    whose folder is reached through one, is refused with :class:`UnsafePathError`; links inside it are removed,
    not followed (``shutil.rmtree`` opens each entry with ``O_NOFOLLOW``)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    if stat.S_ISLNK(st.st_mode) or not _real_below(path):
        raise UnsafePathError(f"{path}: is or lies behind a symlink; the tuner never deletes through one (it "
                              "would delete the link's target): remove the link yourself")
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    shutil.rmtree(path)
