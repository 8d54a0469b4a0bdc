"""One coordinator per study: a lease in the study's user attrs (host, pid, process start, a token, a heartbeat
rewritten every LEASE_HEARTBEAT_S). A second coordinator refuses while the lease is live; a lease whose heartbeat
is older than LEASE_TTL_S, or whose process is gone from this host, is taken over. Optuna's storage has no
compare-and-set, so a coordinator writes its lease, waits LEASE_SETTLE_S and reads it back."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import optuna

from workbench.errors import TuneError
from workbench.tune.storage import alive

__all__ = ["LEASE_ATTR", "LEASE_HEARTBEAT_S", "LEASE_SETTLE_S", "LEASE_TTL_S", "CoordinatorLease"]

LEASE_ATTR = "coordinator_lease"
"""Study user attr: the coordinator holding the study {host, pid, start, token, heartbeat (unix time)}."""
LEASE_HEARTBEAT_S = 10
"""The holder rewrites its lease's heartbeat this often."""
LEASE_TTL_S = 60
"""A lease whose heartbeat is older than this is stale: another coordinator may take it over."""
LEASE_SETTLE_S = 1.0
"""After writing its lease a coordinator waits this long and reads it back: of two that wrote at once, only
the one whose lease is still there holds the study (Optuna's storage has no compare-and-set)."""


class CoordinatorLease:
    """The Tuner's lease methods. The Tuner sets ``study_name``, ``storage``, ``me`` ({host, pid, start}),
    ``_lease_token``, ``_lease_stop``, ``_lease_study``, ``_lease_lost`` and ``_log``."""

    study_name: str
    storage: Any
    me: dict[str, Any]
    _lease_token: str
    _lease_stop: threading.Event | None
    _lease_study: optuna.Study | None
    _lease_lost: str | None

    def _log(self, text: str) -> None:
        raise NotImplementedError

    def _lease_holder(self, lease: Any) -> str:
        age = time.time() - float(lease.get("heartbeat", 0))
        return f"pid {lease.get('pid')} on {lease.get('host')} (heartbeat {age:.0f} s ago)"

    def _lease_is_live(self, lease: Any) -> bool:
        """Whether another coordinator holds ``lease`` now: its heartbeat is fresh, and where it runs on this host,
        its process is alive."""
        if not isinstance(lease, dict) or lease.get("token") == self._lease_token:
            return False
        if (lease.get("host"), lease.get("pid"), lease.get("start")) == (self.me["host"], self.me["pid"],
                                                                          self.me["start"]):
            return False  # this process, through another Tuner object
        if time.time() - float(lease.get("heartbeat", 0)) > LEASE_TTL_S:
            return False
        if lease.get("host") == self.me["host"] and isinstance(lease.get("pid"), int):
            return alive(lease["pid"], lease.get("start"))
        return True

    def _acquire_lease(self, study: optuna.Study) -> None:
        """Hold the study's coordinator lease (one coordinator per study, SQLite or PostgreSQL alike), or raise
        TuneError naming the live holder. A stale lease (its heartbeat older than LEASE_TTL_S, or its process gone
        from this host) is taken over."""
        old = study.user_attrs.get(LEASE_ATTR)
        if self._lease_is_live(old):
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self._lease_holder(old)}; "
                            f"start this one with --worker to add trials, or wait for it to finish")
        mine = {**{k: self.me[k] for k in ("host", "pid", "start")}, "token": self._lease_token,
                "heartbeat": time.time()}
        study.set_user_attr(LEASE_ATTR, mine)
        time.sleep(LEASE_SETTLE_S)
        now = optuna.load_study(study_name=self.study_name, storage=self.storage).user_attrs.get(LEASE_ATTR)
        if not isinstance(now, dict) or now.get("token") != self._lease_token:
            raise TuneError(f"study {self.study_name!r} already has a coordinator: {self._lease_holder(now or {})}"
                            f" (both started at once); start this one with --worker to add trials")
        if isinstance(old, dict) and old.get("token") != self._lease_token and \
                (old.get("host"), old.get("pid")) != (self.me["host"], self.me["pid"]):
            self._log(f"took over the coordinator lease of {self._lease_holder(old)}: it is gone")
        self._lease_study = study
        stop = self._lease_stop = threading.Event()

        def beat() -> None:
            while not stop.wait(LEASE_HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a transient DB error: the next beat tries again
                    held = study.user_attrs.get(LEASE_ATTR)
                    if isinstance(held, dict) and held.get("token") != self._lease_token:
                        self._lease_lost = self._lease_holder(held)
                        return
                    study.set_user_attr(LEASE_ATTR, {**mine, "heartbeat": time.time()})

        threading.Thread(target=beat, name="coordinator-lease", daemon=True).start()

    def _release_lease(self) -> None:
        if self._lease_stop is None or self._lease_study is None:
            return
        self._lease_stop.set()
        with contextlib.suppress(Exception):
            held = self._lease_study.user_attrs.get(LEASE_ATTR)
            if isinstance(held, dict) and held.get("token") == self._lease_token:
                self._lease_study.set_user_attr(LEASE_ATTR, None)
        self._lease_stop = None

    def _check_lease(self) -> None:
        if self._lease_lost:
            raise TuneError(f"study {self.study_name!r}: another coordinator took the lease over "
                            f"({self._lease_lost}); this one stops")
