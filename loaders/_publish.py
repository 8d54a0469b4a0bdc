"""Publishing a shard directory atomically: the writer's temporary and moved-aside directories, the rename into
place (``renameat2(RENAME_EXCHANGE)`` where the kernel has it), durable writes, ``remove_stale_partials``, and
the preprocessors' checks of an output path. A single file is written with ``workbench.files.atomic_write``.

See docs/loaders.md ("The shard format", directory layout); ``loaders.format`` re-exports
``remove_stale_partials``.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

from ._layout import INDEX_NAME, MANIFEST_NAME

PARTIAL = ".partial-"  # temporary directory: .<name>.partial-<pid>@<host>-<random>
_OLD = ".old-"          # previous directory moved aside (fallback overwrite path): .<name>.old-<pid>@<host>


def owner_tag() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(out_dir: str | os.PathLike) -> list[Path]:
    """Clean up after writers of ``out_dir`` that were killed (SIGKILL, power loss).

    Removes ``.<name>.partial-*`` temporary directories whose writer process
    (named in the directory name) ran on this host and no longer runs. A
    ``.<name>.old-*`` directory (the previous ``out_dir``, moved aside by an
    overwrite that was killed between its two renames) is moved back when
    ``out_dir`` is missing, else removed. Directories of live processes or of
    other hosts are left alone. Returns the paths acted on.
    """
    out = Path(out_dir)
    if not out.parent.is_dir():
        return []
    host = socket.gethostname()
    acted = []
    for p in sorted(out.parent.iterdir()):
        for tag in (PARTIAL, _OLD):
            prefix = f".{out.name}{tag}"
            if not p.name.startswith(prefix):
                continue
            pid, at, rest = p.name[len(prefix):].partition("@")
            phost = rest.rsplit("-", 1)[0] if tag == PARTIAL else rest
            if not at or not pid.isdigit() or phost != host or _pid_alive(int(pid)):
                continue
            if tag == _OLD and not out.exists():
                os.rename(p, out)
            else:
                shutil.rmtree(p, ignore_errors=True)
            acted.append(p)
    return acted


_renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = (fn, ctypes)
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    fn, ctypes = _renameat2
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # kernel or filesystem without RENAME_EXCHANGE
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``. An existing ``out`` is swapped out atomically where the kernel has
    RENAME_EXCHANGE; elsewhere it is moved aside first and moved back if the second rename fails."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous directory
        return
    old = out.with_name(f".{out.name}{_OLD}{owner_tag()}")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        if not out.exists():
            os.rename(old, out)  # put the previous directory back
        raise
    shutil.rmtree(old, ignore_errors=True)


def close_synced(fh) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


def check_output_path(out: Path, overwrite: bool) -> None:
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise FileExistsError(f"{out}: already exists (pass --overwrite to replace it)")
    if not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory; refusing to replace it")
    if any(out.iterdir()) and not ((out / MANIFEST_NAME).exists() or (out / INDEX_NAME).exists()):
        raise FileExistsError(f"{out}: exists and is not a shard directory (no {MANIFEST_NAME} or "
                              f"{INDEX_NAME}); refusing to replace it with --overwrite")


def missing_ancestors(path: Path) -> list[Path]:
    """Directories above ``path`` that do not exist yet, deepest first."""
    missing = []
    p = path.parent
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing
