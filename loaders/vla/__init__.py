"""The vision-language-action workload's data: its records in the shard format (``writer``), the preprocessor of
npz/npy episodes (``preprocess``), the synthetic tabletop corpus (``synth``) and the loader of fixed-shape batches
(``pipeline``: :class:`VLAPipeline`, with ``staging`` and ``augment``). docs/loaders.md, "VLA records".

The pipeline's names are imported at their first use (PEP 562), so that ``loaders.format`` can import the writer
from this package without importing the pipeline, which imports ``loaders.format``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["VLAPipeline", "VLABatch", "VLALayout", "AugmentSettings", "augment_image", "sample_rng",
           "sample_keys", "VLA_CONFIG_FIELDS"]

_FROM = {"VLAPipeline": "pipeline", "VLA_CONFIG_FIELDS": "pipeline", "VLABatch": "staging", "VLALayout": "staging",
         "AugmentSettings": "augment", "augment_image": "augment", "sample_rng": "augment",
         "sample_keys": "augment"}


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module 'loaders.vla' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"loaders.vla.{_FROM[name]}"), name)
    globals()[name] = value
    return value
