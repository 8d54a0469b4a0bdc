"""A study's Optuna storage: its URL (SQLite by default, PostgreSQL to scale out), the RDB storage with heartbeats
and lock timeouts, and the liveness of the processes (pid and start time) that write to it."""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc

from workbench.errors import ConfigError, TuneError

__all__ = ["HEARTBEAT_GRACE_S", "HEARTBEAT_INTERVAL_S", "SQLITE_TIMEOUT_S", "alive", "check_sqlite", "default_storage_url",
           "make_storage", "mask_url", "normalize_storage_url", "proc_identity", "proc_start"]

HEARTBEAT_INTERVAL_S = 10
"""Storage heartbeat of a running trial (Optuna RDB heartbeat table)."""
HEARTBEAT_GRACE_S = 60
"""A RUNNING trial whose storage heartbeat is older than this is failed (its tuner is gone)."""
SQLITE_TIMEOUT_S = 60  # concurrent writers (coordinator, workers, heartbeat threads) wait for the lock


def default_storage_url(study_dir: Path) -> str:
    """``sqlite:///<abs>/runs/<study>/study.db``."""
    return f"sqlite:///{(Path(study_dir) / 'study.db').resolve()}"


def normalize_storage_url(url: str) -> str:
    """Make a PostgreSQL URL usable with the installed driver.

    SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3; the project's ``postgres`` extra installs
    psycopg2, so a plain URL becomes ``postgresql+psycopg2://`` when only psycopg2 is importable.
    ``postgres://`` (Heroku style) is read as ``postgresql://``.
    """
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def mask_url(url: str) -> str:
    """``url`` with its password shown as ``***`` (``postgresql://user:***@host/db``): the one form of a storage URL
    that is printed or written down. Everything between ``://user:`` and the last ``@`` of the URL is the password
    (an unquoted ``@`` or ``/`` in it included: SQLAlchemy reads both so; a ``@`` further on hides more, never
    less), and so is a ``password=`` query value."""
    shown = re.sub(r"(://[^:/@]*:).*@", r"\1***@", url)
    return re.sub(r"(?i)(password=)[^&;]*", r"\1***", shown)


def check_sqlite(path: Path) -> None:
    """An existing SQLite file passes ``PRAGMA quick_check`` on a read-only connection, or a ConfigError names it;
    a missing file is a new study."""
    if not path.exists():
        return
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=SQLITE_TIMEOUT_S)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
        problem = None if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:3])
    except sqlite3.DatabaseError as e:  # (sqlite3.OperationalError too: not a database, unreadable)
        problem = str(e)
    if problem:
        raise ConfigError(f"the study storage cannot be used ({problem}); nothing was written to it: if it is "
                          "damaged, move it aside and start the study again, or give another --out / --storage",
                          source=str(path))


def make_storage(url: str) -> optuna.storages.RDBStorage:
    """RDB storage with heartbeats (stale trials become FAIL) and a lock timeout for SQLite."""
    url = normalize_storage_url(url)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            check_sqlite(Path(path))  # before Optuna (or the lease) writes anything to it
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    else:
        engine_kwargs["pool_pre_ping"] = True  # survive server-side connection drops during long trials
    shown = mask_url(url)
    try:
        sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise ConfigError(f"{shown!r} is not a database URL; expected e.g. sqlite:///runs/study.db or "
                          "postgresql://user:password@host/db", key="--storage") from None
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                                  heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                                  grace_period=HEARTBEAT_GRACE_S)
        except RuntimeError as e:
            if "table schema" not in str(e):
                raise
            # Optuna's schema check: the storage was set up by another optuna version, older (upgradable) or newer
            fix = ("back it up, then run `optuna storage upgrade --storage URL` with this optuna"
                   if "storage upgrade" in str(e) else "use the newer optuna that wrote it")
            raise ConfigError(f"{shown}: {str(e).split('. ')[0]}; {fix}", key="--storage") from None
        except (sqlalchemy.exc.NoSuchModuleError, ModuleNotFoundError) as e:
            raise ConfigError(f"{shown}: no database driver for this URL ({e}); expected sqlite:///... or "
                              "postgresql://... (psycopg2)", key="--storage") from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as e:
            # two processes creating the schema of a new database at once: one loses the race, then
            # finds the tables there on the next attempt
            if attempt == 4:
                reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
                raise TuneError(f"cannot open the study storage {shown} after 5 attempts: {reason}") from e
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def proc_start(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot, from /proc) to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def proc_identity(pid: int) -> dict[str, str] | None:
    """What tells process ``pid`` apart from a later one that reuses its pid: its start time, which a later
    process cannot share and which an exec keeps (the command line is not used: a child recorded between its fork
    and its exec would not match itself afterwards); None when /proc cannot say."""
    start = proc_start(pid)
    return None if start is None else {"start": start}


def alive(pid: int, start: str | None) -> bool:
    if Path("/proc").is_dir() and Path("/proc/self/stat").exists():
        now = proc_start(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
