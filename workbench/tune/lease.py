"""One coordinator per study: a lease in the study's user attrs (host, pid, process start, a token, a heartbeat
rewritten every LEASE_HEARTBEAT_S). A second coordinator refuses while the lease is live; a lease whose heartbeat
is older than LEASE_TTL_S, or whose process is gone from this host, is taken over. Optuna's storage has no
compare-and-set, so a coordinator writes its lease, waits LEASE_SETTLE_S and reads it back."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna

from workbench.errors import TuneError
from workbench.tune.storage import alive

__all__ = ["LEASE_ATTR", "LEASE_HEARTBEAT_S", "LEASE_SETTLE_S", "LEASE_TTL_S", "Lease"]

LEASE_ATTR = "coordinator_lease"
"""Study user attr: the coordinator holding the study {host, pid, start, token, heartbeat (unix time)}."""
LEASE_HEARTBEAT_S = 10
"""The holder rewrites its lease's heartbeat this often."""
LEASE_TTL_S = 60
"""A lease whose heartbeat is older than this is stale: another coordinator may take it over."""
LEASE_SETTLE_S = 1.0
"""After writing its lease a coordinator waits this long and reads it back: of two that wrote at once, only
the one whose lease is still there holds the study (Optuna's storage has no compare-and-set)."""


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
        self._study: optuna.Study | None = None  # the study held, while this Lease holds one

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

    def acquire(self, study: optuna.Study, storage: Any) -> None:
        """Hold the study's coordinator lease (one coordinator per study, SQLite or PostgreSQL alike), or raise
        TuneError naming the live holder. A stale lease (its heartbeat older than LEASE_TTL_S, or its process gone
        from this host) is taken over. ``storage`` is the study's, read back after LEASE_SETTLE_S."""
        old = study.user_attrs.get(LEASE_ATTR)
        if self.is_live(old):
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self.holder(old)}; "
                            f"start this one with --worker to add trials, or wait for it to finish")
        mine = {**{k: self.me[k] for k in ("host", "pid", "start")}, "token": self.token, "heartbeat": time.time()}
        study.set_user_attr(LEASE_ATTR, mine)
        time.sleep(LEASE_SETTLE_S)
        now = optuna.load_study(study_name=self.study_name, storage=storage).user_attrs.get(LEASE_ATTR)
        if not isinstance(now, dict) or now.get("token") != self.token:
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self.holder(now or {})}"
                            f" (both started at once); start this one with --worker to add trials")
        if isinstance(old, dict) and old.get("token") != self.token and \
                (old.get("host"), old.get("pid")) != (self.me["host"], self.me["pid"]):
            self.log(f"took over the coordinator lease of {self.holder(old)}: it is gone")
        self._study = study
        stop = self._stop = threading.Event()

        def beat() -> None:
            while not stop.wait(LEASE_HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a transient DB error: the next beat tries again
                    held = study.user_attrs.get(LEASE_ATTR)
                    if isinstance(held, dict) and held.get("token") != self.token:
                        self.lost = self.holder(held)
                        return
                    study.set_user_attr(LEASE_ATTR, {**mine, "heartbeat": time.time()})

        threading.Thread(target=beat, name="coordinator-lease", daemon=True).start()

    def release(self) -> None:
        """Give the lease back (nothing when this Lease holds none); the same command may resume at once."""
        if self._stop is None or self._study is None:
            return
        self._stop.set()
        with contextlib.suppress(Exception):
            held = self._study.user_attrs.get(LEASE_ATTR)
            if isinstance(held, dict) and held.get("token") == self.token:
                self._study.set_user_attr(LEASE_ATTR, None)
        self._stop = None

    def check(self) -> None:
        """Raise TuneError once another coordinator took the study over: this one keeps nothing more."""
        if self.lost:
            raise TuneError(f"study {self.study_name!r}: another coordinator took the lease over "
                            f"({self.lost}); this one stops")
