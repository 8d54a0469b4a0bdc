"""Study specs: what one tuning study searches, for how long, and how it measures.

A study spec is one YAML file (``studies/<name>.yaml``), loaded into ``StudySpec`` and the
dataclasses of its sections (``workbench.tune.spec_sections``) with the strictness of
``config.yaml``: unknown keys, unknown knobs, empty ranges and values of the wrong type are
rejected with a ``ConfigError`` (a ValueError) that names the file and the key path
(``studies/x.yaml: space.bucket_width.low: ...``).

    name: tiny-cpu
    model: tiny                      # a preset name, or a path to an HF config.json
    gpus: 1
    base:                            # config overrides (config.yaml sections), fixed for every trial
      training: {global_batch_size: 8}
    space:                           # knob -> range or choices (knob names: workbench/tune/knobs.py),
                                     # or `auto`: the workload's default space (workbench/tune/spaces.py)
      bucket_width: {choices: [32, 64, 128, 256]}
      num_workers: {low: 0, high: 2}
    budget: {trials: 10, timeout_s: null}
    objective: {multi_objective: false, memory_share_limit: 0.9}
    sampler: {name: tpe, seed: 0, n_startup_trials: 5}
    pruner: {name: median, n_warmup_steps: 1}
    protocol: {warmup_steps: 4, window_steps: 8, windows: 3, baseline_repeats: 3,
               top_k: 2, ab_rounds: 3, trial_timeout_s: 120, heartbeat_timeout_s: 30}
    seed_trials:                     # knob values run first (Optuna's enqueue_trial)
      - {micro_batch_size: 8}

Each trial's config is ``base`` + the protocol's measurement keys
(``training.max_steps``, ``log_every``, ``warmup_measure_steps``) + the sampled
knob values (``StudySpec.trial_config``); the exported config is ``base`` + the
winner's values, without the protocol's keys (``StudySpec.export_config``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from workbench.config import (MODEL_PRESETS, Config, ConfigError, from_dict, load_yaml, merge_overrides,
                              preset_config, read_yaml_text, to_dict)
from workbench.files import check_name
from workbench.tune.knobs import Knob, get_knob, is_user_knob, knob_names, user_knob
from workbench.tune.spec_sections import (Budget, KnobRange, Objective, PrunerSpec, Protocol, SamplerSpec,
                                          TrainerSpec)

__all__ = [
    "Budget",
    "KnobRange",
    "Objective",
    "PrunerSpec",
    "Protocol",
    "SamplerSpec",
    "StudySpec",
    "TrainerSpec",
    "builtin_studies",
    "find_study",
    "load_study_spec",
    "loads_study_spec",
]

DEFAULT_STUDY = "tiny-cpu"
"""The study run when none is named."""

@dataclass(kw_only=True)
class StudySpec:
    """One tuning study (see the module docstring for the YAML form)."""

    name: str
    """Study name: the directory under runs/ and the default Optuna study name."""
    model: str = "tiny"
    """Model preset name, or a path to an HF-format config.json (relative to the spec file)."""
    gpus: int = 1
    """Processes (GPUs) per trial; more than one launches torchrun."""
    base: dict[str, Any] = field(default_factory=dict)
    """Config overrides (sections of config.yaml) applied to every trial and to the baseline."""
    space: dict[str, KnobRange] = field(default_factory=dict)
    """Knob name -> range or choices."""
    budget: Budget = field(default_factory=Budget)
    """Trials and/or wall time."""
    objective: Objective = field(default_factory=Objective)
    """Objective and constraints."""
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    """Optuna sampler."""
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    """Optuna pruner."""
    protocol: Protocol = field(default_factory=Protocol)
    """Measurement protocol."""
    seed_trials: list[dict[str, Any]] = field(default_factory=list)
    """Knob values run first, in order (Optuna's enqueue_trial), counted against the budget; a knob a seed leaves
    out takes the base config's value."""
    trainer: TrainerSpec | None = None
    """A training loop of one's own, run once per trial instead of the built-in one; null = the built-in loop."""
    source: str | None = None
    """File the spec was loaded from (set by the loader; not part of the YAML)."""

    def __post_init__(self) -> None:
        check_name(self.name, "study name", key="name")
        if self.gpus < 1:
            raise ConfigError(f"got {self.gpus}; expected an integer >= 1", key="gpus")
        known = knob_names()
        if not self.space:
            raise ConfigError(f"empty search space; add at least one knob of: {', '.join(known)}", key="space")
        for name, rng in self.space.items():
            if is_user_knob(name):
                if self.trainer is None:
                    raise ConfigError("a user.* knob needs a loop of one's own to read it: set trainer.command "
                                      "(the built-in loop reads no user knob)", key=f"space.{name}")
                try:
                    self.knob(name)
                except ValueError as e:
                    raise ConfigError(str(e), key=f"space.{name}") from None
            elif name not in known:
                import difflib

                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown knob{hint} Known knobs: {', '.join(known)}", key=f"space.{name}")
            self._check_range(name, rng)
        self._check_base()
        self._check_seeds()

    # ------------------------------------------------------------------ knobs
    def knob(self, name: str) -> Knob:
        """The knob ``name`` of this study: the registry's, or a ``user.*`` knob whose kind its range gives (all
        bools: bool; integer ends or choices: int; numbers: float; else categorical)."""
        if not is_user_knob(name):
            return get_knob(name)
        rng = self.space[name]
        values = rng.choices if rng.choices is not None else [rng.low, rng.high, *([rng.step] if rng.step else [])]
        if all(isinstance(v, bool) for v in values):
            kind = "bool"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            kind = "int"
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            kind = "float"
        else:
            kind = "categorical"
        return user_knob(name, kind)

    def searched_params(self, values: Mapping[str, Any], names: Collection[str]) -> dict[str, Any]:
        """The params a trial asks for to run ``values`` (knob -> value): each of ``names`` that ``values`` holds,
        in knob order, where it is active given the values before it (the base config's for a knob not set), as
        the search samples them."""
        current, out = self.base_knob_values(), {}
        for name in self.knob_order():
            if name in names and name in values and self.knob(name).active(current):
                out[name] = current[name] = values[name]
        return out

    def knob_order(self) -> list[str]:
        """The space's knobs in the order they are sampled: the registry's order (conditions read the knobs before
        them), then the user knobs as the spec lists them."""
        return [n for n in knob_names() if n in self.space] + [n for n in self.space if is_user_knob(n)]

    # ------------------------------------------------------------------ validation
    def _check_range(self, name: str, rng: KnobRange) -> None:
        knob = self.knob(name)
        where = f"space.{name}"
        if rng.choices is not None:
            for i, v in enumerate(rng.choices):
                if not knob.accepts(v):
                    raise ConfigError(
                        f"got {v!r} ({type(v).__name__}); knob {name!r} takes {knob.kind} values",
                        key=f"{where}.choices[{i}]")
            return
        if knob.kind not in ("int", "float"):
            raise ConfigError(f"knob {name!r} is {knob.kind}: give choices, not low/high", key=where)
        if knob.kind == "int":
            for key in ("low", "high", "step"):
                v = getattr(rng, key)
                if v is not None and not (isinstance(v, int) and not isinstance(v, bool)):
                    raise ConfigError(f"got {v!r} ({type(v).__name__}); knob {name!r} takes integers",
                                      key=f"{where}.{key}")

    def _check_base(self) -> None:
        hw = self.base.get("hardware") if isinstance(self.base, Mapping) else None
        if isinstance(hw, Mapping) and "gpus" in hw and hw["gpus"] != self.gpus:
            raise ConfigError(f"got {hw['gpus']!r}, but the study's gpus is {self.gpus}; set gpus at the top "
                              "level only", key="base.hardware.gpus")
        if "provenance" in self.base:
            raise ConfigError("a study's base config cannot set provenance", key="base.provenance")
        cfg = self.base_config()
        for name, rng in self.space.items():
            knob = self.knob(name)
            for i, v in enumerate(rng.values_to_check()):
                try:
                    merge_overrides(cfg, {knob.key: v})
                except ConfigError as e:
                    key = f"space.{name}.choices[{i}]" if rng.choices is not None else \
                        f"space.{name}.{('low', 'high')[i]}"
                    raise ConfigError(f"{v!r} is rejected by the base config ({e})", key=key) from None

    def _check_seeds(self) -> None:
        for i, seed in enumerate(self.seed_trials):
            where = f"seed_trials[{i}]"
            if not isinstance(seed, Mapping):
                raise ConfigError(f"got {seed!r}; expected a mapping of knob -> value", key=where)
            for name, value in seed.items():
                if name not in self.space:
                    raise ConfigError(f"knob {name!r} is not in the study's space ({', '.join(self.space)})",
                                      key=f"{where}.{name}")
                if not self.space[name].contains(value, self.knob(name).kind):
                    raise ConfigError(f"got {value!r}, outside the space of {name!r} ({self.space[name].describe()})",
                                      key=f"{where}.{name}")
            try:
                self.trial_config(self.seed_params(i))
            except ConfigError as e:
                raise ConfigError(f"rejected by the base config ({e})", key=where) from None

    def seed_params(self, i: int) -> dict[str, Any]:
        """Knob values of seed trial ``i``: the seed's own, and for every other knob of the space the base config's
        value where the space holds it (a value outside the space is left to the sampler)."""
        out = dict(self.seed_trials[i])
        base = self.base_knob_values()
        for name, rng in self.space.items():
            if name not in out and base.get(name) is not None and rng.contains(base[name], self.knob(name).kind):
                out[name] = base[name]
        return out

    # ------------------------------------------------------------------ configs
    def model_overrides(self) -> dict[str, Any]:
        """The model section for ``model`` (a preset, or a config.json path)."""
        return _model_overrides(self.model)

    def base_config(self) -> Config:
        """Model + ``base`` + ``gpus``: the baseline, and what the export starts from (a copy of its own)."""
        key = self._base_key()
        if key not in _BASE_CONFIGS:
            _BASE_CONFIGS[key] = _base_config(self.model, self.base, self.gpus)
        return copy.deepcopy(_BASE_CONFIGS[key])

    def _base_key(self) -> tuple[str, str, int]:
        """What the base config is made of, as a key of _BASE_CONFIGS (``base`` as canonical JSON)."""
        return self.model, json.dumps(self.base, sort_keys=True, default=repr), self.gpus

    def measured_base_config(self) -> Config:
        """The baseline as measured: ``base_config`` + the protocol's measurement keys."""
        return merge_overrides(self.base_config(), self.protocol.config_overrides())

    def knob_overrides(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Dotted config overrides for knob values ``params`` (inactive conditional knobs get their off value)."""
        out: dict[str, Any] = {}
        for name, value in params.items():
            out[self.knob(name).key] = value
        values = dict(self.base_knob_values())
        values.update(params)
        for name in self.space:
            knob = self.knob(name)
            if name not in params and knob.inactive is not None and not knob.active(values):
                out[knob.key] = knob.inactive
        return out

    def trial_config(self, params: Mapping[str, Any]) -> Config:
        """Config of one trial: the measured baseline with knob values ``params``; raises ConfigError."""
        return merge_overrides(self.measured_base_config(), self.knob_overrides(params))

    def export_config(self, params: Mapping[str, Any]) -> Config:
        """Config to export for knob values ``params`` (no measurement keys); raises ConfigError."""
        return merge_overrides(self.base_config(), self.knob_overrides(params))

    def base_knob_values(self) -> dict[str, Any]:
        """Each registered knob's value in the base config (what a condition sees for an unsearched knob)."""
        data = to_dict(self.base_config())
        out: dict[str, Any] = {}
        for name in [*knob_names(), *(n for n in self.space if is_user_knob(n))]:
            node: Any = data
            for part in self.knob(name).key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            out[name] = node
        return out

    def to_record(self) -> dict[str, Any]:
        """:meth:`to_dict` to write into the study's files: trainer.env values as ``<set>`` (TrainerSpec.record)."""
        d = self.to_dict()
        if self.trainer is not None:
            d["trainer"] = self.trainer.record()
        return d

    def to_dict(self) -> dict[str, Any]:
        """Plain data of the spec (YAML form; ``source`` left out), secrets included: for the storage only."""
        d = dataclasses.asdict(self)
        d.pop("source", None)
        d["space"] = {k: {kk: vv for kk, vv in v.items() if vv is not None and not (kk == "log" and vv is False)}
                      for k, v in d["space"].items()}
        return d


# --------------------------------------------------------------------------- loading


def _model_overrides(model: str) -> dict[str, Any]:
    if model in MODEL_PRESETS:
        return {"model.name": model, "model.config_path": None}
    return {"model.name": "custom", "model.config_path": model}


_BASE_CONFIGS: dict[tuple[str, str, int], Config] = {}
"""StudySpec.base_config's configs by what they are made of: every trial config, the budget's estimates and the
sampler's conditions start from it, and validating a Config costs milliseconds (a copy, a tenth of one)."""


def _base_config(model: str, base: Mapping[str, Any], gpus: int) -> Config:
    cfg = preset_config("tiny")
    try:
        cfg = merge_overrides(cfg, _model_overrides(model))
    except ConfigError as e:
        raise ConfigError(f"model {model!r}: {e}", key="model") from None
    try:
        cfg = merge_overrides(cfg, dict(base))
    except ConfigError as e:
        raise e.with_prefix("base") from None
    try:
        return merge_overrides(cfg, {"hardware.gpus": gpus})
    except ConfigError as e:
        raise ConfigError(str(e), key="gpus") from None


def _auto_space(data: Mapping[str, Any]) -> dict[str, Any]:
    """``space: auto``: the default space of the workload that ``model``, ``base`` and ``gpus`` of ``data`` build."""
    from workbench.tune.spaces import auto_space

    if data.get("trainer") is not None:
        raise ConfigError("got 'auto', which is the built-in loop's space; a loop of one's own lists its user.* "
                          "knobs", key="space")
    model, base, gpus = data.get("model", "tiny"), data.get("base") or {}, data.get("gpus", 1)
    if not isinstance(model, str) or not isinstance(base, Mapping) or not isinstance(gpus, int):
        return {}  # the spec's own checks name the bad key
    return auto_space(_base_config(model, base, gpus))

def spec_from_dict(data: Mapping[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> StudySpec:
    """Build and validate a StudySpec from plain data; errors name ``source`` and the key path."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"top level is {type(data).__name__}; expected a mapping", source=source)
    data = dict(data)
    data.pop("source", None)
    model = data.get("model")
    if isinstance(model, str) and model not in MODEL_PRESETS and base_dir is not None:
        if model.endswith(".json") or "/" in model:
            path = Path(model).expanduser()
            data["model"] = str(path if path.is_absolute() else (base_dir / path).resolve())
    trainer = data.get("trainer")
    if isinstance(trainer, Mapping) and base_dir is not None:  # the command's folder: relative to the spec file
        cwd = Path(str(trainer.get("cwd") or ".")).expanduser()
        data["trainer"] = {**trainer, "cwd": str(cwd if cwd.is_absolute() else (base_dir / cwd).resolve())}
    try:
        if isinstance(data.get("space"), str) and data["space"].strip() == "auto":
            data["space"] = _auto_space(data)
        spec = from_dict(StudySpec, data)
    except ConfigError as e:
        raise e.with_source(source) from None
    spec.source = source
    return spec


def loads_study_spec(text: str, source: str = "<string>", base_dir: Path | None = None) -> StudySpec:
    """Parse and validate a study spec from YAML text."""
    data = load_yaml(text, source, "study spec")
    return spec_from_dict(data if data is not None else {}, source=source, base_dir=base_dir)


def builtin_studies() -> list[str]:
    """Names of the study specs shipped in the ``studies`` package."""
    root = importlib.resources.files("studies")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def find_study(name_or_path: str) -> tuple[str, str, Path | None]:
    """(YAML text, source label, base dir) of a built-in study name or a spec file path."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists() or "/" in name_or_path:
        return read_yaml_text(path, "study spec"), str(path), path.parent.resolve()
    res = importlib.resources.files("studies") / f"{name_or_path}.yaml"
    if not res.is_file():
        raise ConfigError(f"unknown study {name_or_path!r}; built-in studies: {', '.join(builtin_studies())}, "
                          "or give the path of a spec file", key="--study")
    return res.read_text(encoding="utf-8"), f"studies/{name_or_path}.yaml", Path(str(res)).parent


def load_study_spec(name_or_path: str = DEFAULT_STUDY) -> StudySpec:
    """Load a built-in study by name (``tiny-cpu``) or a spec file by path."""
    text, source, base_dir = find_study(name_or_path)
    return loads_study_spec(text, source=source, base_dir=base_dir)
