"""Typed config of the workbench: the schema of ``config.yaml``, YAML load/dump, strict validation.

Every section is a ``@dataclass(kw_only=True)``; the one-line string under each
field is its documentation (it is also written as a comment by ``dump_config``).
Defaults run on a CPU with the ``tiny`` model preset.

Validation has one mechanism, used both when a file is loaded and when a
dataclass is constructed directly:

- the field's type hint (``int``, ``float``, ``bool``, ``str``, ``X | None``,
  ``Literal[...]``, ``list[X]``, ``dict[str, X]``, nested sections) is checked by
  ``_coerce`` (bool is not an int; an int is accepted for a float; nothing is
  parsed from strings);
- simple bounds live in the field's metadata (``ge``, ``gt``, ``le``, ``lt``,
  ``power_of_two``, ``multiple_of``; for lists and dicts they apply to every
  number inside) and are checked by ``_check_ranges``, which every
  ``__post_init__`` calls;
- rules between fields of one section are in that section's ``__post_init__``;
  rules between sections are in ``validate``, called by ``Config.__post_init__``.

Every failure raises ``ConfigError`` naming the key path (``data.micro_batch_size``),
the value and what is allowed.

Configs are plain (mutable) dataclasses; ``merge_overrides`` is the validated way to
change one, and ``validate(cfg)`` re-checks a config that was edited in place.
"""

from __future__ import annotations

from workbench.config.overrides import merge_overrides, parse_overrides, preset_config
from workbench.config.schema import (GRAPH_CAPTURING_COMPILE_MODES, MIB, AllocatorConfig, ComputeDomainConfig, Config,
                                     config_hash, CONFIG_VERSION, DataConfig, DEFAULT_PROMETHEUS_PORT, field_docs,
                                     HardwareConfig, HFConfig, IODomainConfig, LoongforgeConfig, MemoryDomainConfig,
                                     MetricsConfig, MODEL_PRESETS, ModelConfig, OpsConfig, OverlapConfig, Provenance,
                                     TrainingConfig, accumulation, bucket_bytes, graph_capture_on, validate)
from workbench.config.typecheck import from_dict, to_dict
from workbench.config.yaml_io import (check_yaml_text, dump_config, dumps_config, load_config, load_yaml, loads_config,
                                      read_yaml_text)
from workbench.errors import ConfigError

__all__ = [
    "GRAPH_CAPTURING_COMPILE_MODES",
    "MIB",
    "accumulation",
    "bucket_bytes",
    "graph_capture_on",
    "CONFIG_VERSION",
    "DEFAULT_PROMETHEUS_PORT",
    "MODEL_PRESETS",
    "AllocatorConfig",
    "ComputeDomainConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "HardwareConfig",
    "HFConfig",
    "IODomainConfig",
    "LoongforgeConfig",
    "MemoryDomainConfig",
    "MetricsConfig",
    "ModelConfig",
    "OpsConfig",
    "OverlapConfig",
    "Provenance",
    "TrainingConfig",
    "config_hash",
    "check_yaml_text",
    "dump_config",
    "dumps_config",
    "field_docs",
    "from_dict",
    "load_config",
    "load_yaml",
    "loads_config",
    "merge_overrides",
    "parse_overrides",
    "preset_config",
    "read_yaml_text",
    "to_dict",
    "validate",
]
