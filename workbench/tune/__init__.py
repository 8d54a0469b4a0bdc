"""The tuner: a study spec (``study``), its knobs (``knobs``), trials run one process each (``trial``), the
samplers, statistics, numerics guard and export, the Optuna storage, the study session (``session``, opened by
``opening``), the coordinator's lease, measurement, the search, validation and the ``Tuner`` that drives them.
``python -m workbench.tune`` is the CLI (``__main__``); docs/tuner.md says how one run goes.

The names below load on first use (PEP 562): the report reads the knob registry without importing the Tuner and
torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LEASE_ATTR", "TuneError", "Tuner", "default_storage_url", "make_storage", "normalize_storage_url",
           "sessions_wall_s", "winner_launch_record"]

_WHERE = {"LEASE_ATTR": "workbench.tune.lease", "TuneError": "workbench.errors", "Tuner": "workbench.tune.tuner",
          "default_storage_url": "workbench.tune.storage", "make_storage": "workbench.tune.storage",
          "normalize_storage_url": "workbench.tune.storage", "sessions_wall_s": "workbench.tune.records",
          "winner_launch_record": "workbench.tune.export"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'workbench.tune' has no attribute {name!r}")
