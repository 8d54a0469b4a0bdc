"""One coordinator per study: a lease in the study's user attrs (host, pid, process start, a token, a heartbeat
rewritten every LEASE_HEARTBEAT_S). A second coordinator refuses while the lease is live; a lease whose heartbeat
is older than LEASE_TTL_S, or whose process is gone from this host, is taken over. Every write of the lease is a
compare-and-set on its row in the storage's database (one statement: the value is written only where it is still
the one read), so of two coordinators that start at once exactly one holds the study, without waiting."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna
import sqlalchemy
from optuna.storages._rdb.models import StudyUserAttributeModel

from workbench.errors import TuneError
from workbench.tune.storage import alive

__all__ = ["LEASE_ATTR", "LEASE_HEARTBEAT_S", "LEASE_TTL_S", "Lease", "swap_lease"]

LEASE_ATTR = "coordinator_lease"
"""Study user attr: the coordinator holding the study {host, pid, start, token, heartbeat (unix time)}."""
LEASE_HEARTBEAT_S = 10
"""The holder rewrites its lease's heartbeat this often."""
LEASE_TTL_S = 60
"""A lease whose heartbeat is older than this is stale: another coordinator may take it over."""

_ATTRS = StudyUserAttributeModel.__table__  # Optuna's study_user_attributes: one row per (study_id, key)


def read_lease(storage: optuna.storages.RDBStorage, study_id: int) -> str | None:
    """The lease's row as stored (its JSON text), None where the study never had one."""
    with storage.engine.connect() as conn:
        return conn.execute(sqlalchemy.select(_ATTRS.c.value_json).where(
            _ATTRS.c.study_id == study_id, _ATTRS.c.key == LEASE_ATTR)).scalar_one_or_none()


def swap_lease(storage: optuna.storages.RDBStorage, study_id: int, expected: str | None, lease: Any) -> str | None:
    """Write ``lease`` where the stored lease is still ``expected`` (read_lease's text; None: no row yet) and
    return the text written, or None where another process wrote first. One UPDATE ... WHERE value_json =
    expected (or one INSERT, which the (study_id, key) unique constraint refuses to a second writer): SQLite and
    PostgreSQL alike apply it to the row as it is when the statement runs."""
    text = json.dumps(lease)
    try:
        with storage.engine.begin() as conn:
            if expected is None:
                conn.execute(sqlalchemy.insert(_ATTRS).values(study_id=study_id, key=LEASE_ATTR, value_json=text))
                return text
            done = conn.execute(sqlalchemy.update(_ATTRS).where(
                _ATTRS.c.study_id == study_id, _ATTRS.c.key == LEASE_ATTR, _ATTRS.c.value_json == expected)
                .values(value_json=text))
            return text if done.rowcount == 1 else None
    except sqlalchemy.exc.IntegrityError:
        return None


class Lease:
    """This coordinator's lease on one study: ``acquire`` it when the study is opened, ``check`` it before and
    after each measurement (it raises once another coordinator took the study over), ``release`` it at the end.
    ``me`` is this process ({host, pid, start}); ``token`` tells this Lease from another of the same process."""

    def __init__(self, study_name: str, me: dict[str, Any], token: str, log: Callable[[str], None]) -> None:
        self.study_name = study_name
        self.me = me
        self.token = token
        self.log = log
        self.lost: str | None = None  # the holder that took the lease over, written by the heartbeat thread
        self._stop: threading.Event | None = None  # the heartbeat's, while this Lease holds a study
        self._beat: threading.Thread | None = None  # the heartbeat thread, while this Lease holds a study
        self._held: tuple[optuna.storages.RDBStorage, int] | None = None  # the storage and id of the study asked for
        self._written: str | None = None  # the lease as this Lease last wrote it (the next swap expects it)

    @staticmethod
    def holder(lease: Any) -> str:
        age = time.time() - float(lease.get("heartbeat", 0))
        return f"pid {lease.get('pid')} on {lease.get('host')} (heartbeat {age:.0f} s ago)"

    def is_live(self, lease: Any) -> bool:
        """Whether another coordinator holds ``lease`` now: its heartbeat is fresh, and where it runs on this host,
        its process is alive."""
        if not isinstance(lease, dict) or lease.get("token") == self.token:
            return False
        if (lease.get("host"), lease.get("pid"), lease.get("start")) == (self.me["host"], self.me["pid"],
                                                                          self.me["start"]):
            return False  # this process, through another Tuner object
        if time.time() - float(lease.get("heartbeat", 0)) > LEASE_TTL_S:
            return False
        if lease.get("host") == self.me["host"] and isinstance(lease.get("pid"), int):
            return alive(lease["pid"], lease.get("start"))
        return True

    def acquire(self, storage: optuna.storages.RDBStorage) -> None:
        """Hold the study's coordinator lease (one coordinator per study, SQLite or PostgreSQL alike), or raise
        TuneError naming the live holder. A stale lease (its heartbeat older than LEASE_TTL_S, or its process gone
        from this host) is taken over. ``storage`` is the study's: the lease is swapped in its database."""
        study_id = storage.get_study_id_from_name(self.study_name)
        self._held = (storage, study_id)
        stored = read_lease(storage, study_id)
        old = json.loads(stored) if stored is not None else None
        if self.is_live(old):
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self.holder(old)}; "
                            f"start this one with --worker to add trials, or wait for it to finish")
        mine = {**{k: self.me[k] for k in ("host", "pid", "start")}, "token": self.token, "heartbeat": time.time()}
        written = swap_lease(storage, study_id, stored, mine)
        if written is None:
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self._stored_holder()}"
                            f" (both started at once); start this one with --worker to add trials")
        if isinstance(old, dict) and old.get("token") != self.token and \
                (old.get("host"), old.get("pid")) != (self.me["host"], self.me["pid"]):
            self.log(f"took over the coordinator lease of {self.holder(old)}: it is gone")
        self._written = written
        stop = self._stop = threading.Event()

        def beat() -> None:
            while not stop.wait(LEASE_HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a transient DB error: the next beat tries again
                    written = swap_lease(storage, study_id, self._written, {**mine, "heartbeat": time.time()})
                    if written is None:  # another coordinator swapped its own lease in: this one stops
                        self.lost = self._stored_holder()
                        return
                    self._written = written

        self._beat = threading.Thread(target=beat, name="coordinator-lease", daemon=True)
        self._beat.start()

    def _stored_holder(self) -> str:
        """:meth:`holder` of the lease stored now in the study this Lease asked for (null, released: no one)."""
        assert self._held is not None
        stored = read_lease(*self._held)
        return self.holder((json.loads(stored) if stored else None) or {})

    def release(self) -> None:
        """Give the lease back (nothing when this Lease holds none, or another took it over); the same command
        may resume at once."""
        if self._stop is None or self._held is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=30)  # its last write done: the lease below is the one stored
        with contextlib.suppress(Exception):
            swap_lease(*self._held, self._written, None)
        self._stop = None

    def check(self) -> None:
        """Raise TuneError once another coordinator took the study over: this one keeps nothing more."""
        if self.lost:
            raise TuneError(f"study {self.study_name!r}: another coordinator took the lease over "
                            f"({self.lost}); this one stops")
