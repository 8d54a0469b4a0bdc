"""The errors every layer raises: a config value rejected at its key path, and the tuner's own stop. A leaf
module: no import of the project's packages, no torch."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "DiskError", "TuneError", "UnsafePathError"]


class ConfigError(ValueError):
    """A config value, key or file was rejected.

    ``key`` is the dotted path of the offending key (``loongforge.io_domain.io_uring_entries``),
    ``source`` the file it came from, ``line`` the 1-based line where known.
    """

    def __init__(
        self, message: str, *, key: str = "", source: str | None = None, line: int | None = None
    ) -> None:
        self.message = message
        self.key = key
        self.source = source
        self.line = line
        super().__init__(message)

    def __str__(self) -> str:
        where = self.source or ""
        if where and self.line is not None:
            where = f"{where}:{self.line}"
        return ": ".join(part for part in (where, self.key, self.message) if part)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (self.message, self.key, self.source, self.line))

    def with_prefix(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` prepended to its key path."""
        return type(self)(self.message, key=join_keys(prefix, self.key), source=self.source, line=self.line)

    def with_source(self, source: str) -> ConfigError:
        """The same error attributed to the file ``source``."""
        return type(self)(self.message, key=self.key, source=source, line=self.line)


def _rebuild_error(message: str, key: str, source: str | None, line: int | None) -> ConfigError:
    return ConfigError(message, key=key, source=source, line=line)


def join_keys(prefix: str, key: str) -> str:
    if not prefix:
        return key
    if not key:
        return prefix
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"


class TuneError(RuntimeError):
    """The tuner cannot go on (failing baseline, spec mismatch with the stored study...)."""


class UnsafePathError(TuneError):
    """A path the tuner would delete or write through is a symlink, or lies outside ``--out``."""


class DiskError(OSError):
    """A file could not be written (full disk, read-only folder); its temp file is gone and the file it would
    have replaced is unchanged. Failure kind ``disk``: the machine's fault, not the config's."""

    def __init__(self, message: str, *, filename: str | None = None, errno: int | None = None,
                 strerror: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.filename, self.errno, self.strerror = filename, errno, strerror  # type: ignore[assignment]

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,), {"filename": self.filename, "errno": self.errno,
                                              "strerror": self.strerror})
