"""The sections of a study spec (``workbench.tune.study.StudySpec``): where a knob is searched (``KnobRange``),
the budget, the objective, the sampler, the pruner, the measurement protocol and a training loop of one's own
(``TrainerSpec``). Each rejects bad values in ``__post_init__`` with a ``ConfigError`` naming the key;
``workbench.tune.study`` reads them from the YAML file."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.config import ConfigError

__all__ = ["Budget", "KnobRange", "Objective", "PrunerSpec", "Protocol", "SamplerSpec", "TrainerSpec"]


@dataclass(kw_only=True)
class KnobRange:
    """Where one knob is searched: ``{low, high, step?, log?}`` or ``{choices: [...]}``."""

    low: int | float | None = None
    """Lowest value (int or float knobs)."""
    high: int | float | None = None
    """Highest value, inclusive."""
    step: int | float | None = None
    """Grid step between low and high; null = continuous (float) or 1 (int)."""
    log: bool = False
    """Sample on a log scale (low must be > 0; not with a step)."""
    choices: list[Any] | None = None
    """Explicit values (any knob kind); excludes low/high."""

    def __post_init__(self) -> None:
        if self.choices is not None:
            if any(v is not None for v in (self.low, self.high, self.step)) or self.log:
                raise ConfigError("give either choices or low/high(/step/log), not both", key="choices")
            if not self.choices:
                raise ConfigError("empty choices; list at least one value", key="choices")
            seen: list[Any] = []
            for i, v in enumerate(self.choices):
                if any(v == s and type(v) is type(s) for s in seen):
                    raise ConfigError(f"duplicate choice {v!r}", key=f"choices[{i}]")
                seen.append(v)
            return
        if self.low is None or self.high is None:
            raise ConfigError("needs both low and high, or choices", key="low" if self.low is None else "high")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ConfigError(f"low and high must be finite, got [{self.low}, {self.high}]", key="low")
        if self.low > self.high:
            raise ConfigError(f"empty range: low {self.low} > high {self.high}", key="low")
        if self.step is not None and not self.step > 0:
            raise ConfigError(f"got {self.step}; expected a step > 0", key="step")
        if self.log and self.low <= 0:
            raise ConfigError(f"log scale needs low > 0, got {self.low}", key="log")
        if self.log and self.step is not None:
            raise ConfigError("log scale cannot be combined with a step", key="log")

    def bounds(self) -> tuple[int | float, int | float]:
        """(low, high) of a range of values; a list of choices has none (``__post_init__`` holds one or the
        other)."""
        if self.low is None or self.high is None:
            raise ConfigError(f"{self.describe()} is a list of choices, not a range", key="choices")
        return self.low, self.high

    def grid(self, kind: str) -> list[Any]:
        """Every value of this range, for the grid sampler (a float range needs a step)."""
        if self.choices is not None:
            return list(self.choices)
        low, high = self.bounds()
        if kind == "int":
            return list(range(int(low), int(high) + 1, int(self.step or 1)))
        if self.step is None:
            raise ConfigError("the grid sampler needs choices or a step for a float range", key="step")
        n = int(math.floor((high - low) / self.step + 1e-9))
        return [low + i * self.step for i in range(n + 1)]

    def contains(self, value: Any, kind: str) -> bool:
        """Whether ``value`` is one of this range's values (a choice, or inside [low, high] on its step)."""
        if self.choices is not None:
            return any(value == c and type(value) is type(c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        low, high = self.bounds()
        if kind == "int" and not isinstance(value, int):
            return False
        if not low <= value <= high:
            return False
        step = self.step or (1 if kind == "int" else None)
        return step is None or abs((value - low) / step - round((value - low) / step)) < 1e-9

    def describe(self) -> str:
        """``choices [..]`` or ``[low, high]``, for messages."""
        return f"choices {self.choices}" if self.choices is not None else f"[{self.low}, {self.high}]"

    def values_to_check(self) -> list[Any]:
        """Values validated against the config at load: every choice, or both ends of the range."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]


@dataclass(kw_only=True)
class Budget:
    """When the search stops: after this many counted trials and/or this much wall time."""

    trials: int | None = 20
    """Trials that count (complete, pruned or failed-but-told: not infrastructure interruptions)."""
    timeout_s: float | None = None
    """Wall-clock limit of the search in each tuner process; null = none."""
    gpu_minutes: float | None = None
    """Device time of the whole study, every process it ran (baseline, search, numerics twins, validation)
    times its GPUs: the search stops before a trial once what was spent, plus what validation (its traced pairs
    included) may take at most, plus a trial (the median of those that ran), reaches it, and a trial runs on
    past a window only while it holds the trial's other windows; null = none."""

    def __post_init__(self) -> None:
        if self.trials is not None and self.trials < 1:
            raise ConfigError(f"got {self.trials}; expected an integer >= 1 or null", key="trials")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"got {self.timeout_s}; expected a number > 0 or null", key="timeout_s")
        if self.gpu_minutes is not None and not self.gpu_minutes > 0:
            raise ConfigError(f"got {self.gpu_minutes}; expected a number of minutes > 0 or null",
                              key="gpu_minutes")
        if self.trials is None and self.timeout_s is None and self.gpu_minutes is None:
            raise ConfigError("no budget: set trials, timeout_s, gpu_minutes or any of them", key="trials")


@dataclass(kw_only=True)
class Objective:
    """What is maximised, under which constraints."""

    multi_objective: bool = False
    """Also minimise peak memory (a Pareto front of throughput vs memory); disables pruning."""
    memory_share_limit: float = 0.9
    """Peak reserved memory must stay under this share of the device (CUDA only)."""

    def __post_init__(self) -> None:
        if not 0 < self.memory_share_limit <= 1:
            raise ConfigError(f"got {self.memory_share_limit}; expected a number in (0, 1]", key="memory_share_limit")


@dataclass(kw_only=True)
class SamplerSpec:
    """Optuna sampler."""

    name: Literal["tpe", "gp", "random", "nsga2", "grid"] = "tpe"
    """tpe, gp (Gaussian process that treats numeric choices as ordered: workbench.tune.samplers), random, nsga2
    (multi-objective) or grid (choices and stepped ranges only)."""
    seed: int | None = 0
    """Sampler seed; null = random."""
    n_startup_trials: int = 5
    """Random trials before TPE or the GP models the space (population size for nsga2)."""
    startup: Literal["walk", "random"] = "walk"
    """walk: the startup trials change one knob at a time from the best config so far, starting from the base
    config, for at least as many trials as the base config has neighbours (coordinate descent over the knobs
    with a list of choices; a warm-started study walks from its first trial instead; workbench.tune.profiled);
    random: the sampler's own random draws. Neither for grid or nsga2."""

    def __post_init__(self) -> None:
        if self.n_startup_trials < 0 or (self.name == "nsga2" and self.n_startup_trials < 2):
            raise ConfigError(f"got {self.n_startup_trials}; expected >= 0 (>= 2 for nsga2)", key="n_startup_trials")


@dataclass(kw_only=True)
class PrunerSpec:
    """Optuna pruner over the measured windows."""

    name: Literal["median", "successive_halving", "hyperband", "none"] = "median"
    """median: stop a trial whose window throughput is below the median of earlier trials at that window.
    successive_halving: screening; every trial is first a short run (the warm-up and one window), and only one
    in ``reduction_factor`` of those screened, the fastest, goes on to the next window count (1, eta, eta^2, ...
    windows, up to ``protocol.windows``); Optuna's SuccessiveHalvingPruner with the window as its resource.
    hyperband: Optuna's HyperbandPruner over the same resource (several such brackets, from 1 window)."""
    n_warmup_steps: int = 1
    """Windows reported before a trial may be pruned (median)."""
    n_startup_trials: int = 3
    """Finished trials before pruning starts (median)."""
    reduction_factor: int = 3
    """successive_halving and hyperband: one in this many screened trials is promoted."""

    def __post_init__(self) -> None:
        for key in ("n_warmup_steps", "n_startup_trials"):
            if getattr(self, key) < 0:
                raise ConfigError(f"got {getattr(self, key)}; expected an integer >= 0", key=key)
        if self.reduction_factor < 2:
            raise ConfigError(f"got {self.reduction_factor}; expected an integer >= 2", key="reduction_factor")

    @property
    def screens(self) -> bool:
        """Whether trials are screened: a short run first, the full protocol for the promoted ones."""
        return self.name in ("successive_halving", "hyperband")


@dataclass(kw_only=True)
class Protocol:
    """How a trial and the validation are measured."""

    warmup_steps: int = 4
    """Steps excluded from measurement (compile, graph capture, allocator settling)."""
    window_steps: int = 8
    """Steps per measured window (one intermediate value each)."""
    windows: int = 3
    """Measured windows per trial; the objective is their median throughput."""
    baseline_repeats: int = 3
    """Runs of the base config before the search: the noise floor."""
    top_k: int = 2
    """Best distinct feasible trials re-measured against the baseline."""
    ab_rounds: int = 3
    """Most interleaved baseline/candidate pairs per candidate (the sequential A/B's cap)."""
    ab_min_rounds: int | None = None
    """Pairs before the first look: from then on a candidate's A/B stops at the first pair after which its
    interval excludes 1.0 (the interval's confidence corrected for the looks); null = ab_rounds, one look."""
    trial_timeout_s: float = 600.0
    """Wall-clock limit of one trial process."""
    heartbeat_timeout_s: float = 120.0
    """A trial whose step counter does not move for this long (or has no first step by the time limit) is killed."""
    numerics_tolerance: float = 0.04
    """Numerics guard: a trial that sets a numerics knob (FP8) off its base value fails with kind ``numerics``
    when its measured steps' losses differ from the base config's, on the same seed and data, step by step (the
    median over the steps of each step's distance to the nearest reference run) by more than this share of the
    base's, or than twice the baseline repeats' spread where that is larger (workbench/tune/numerics.py: good FP8
    runs lay 1.2-2.8% off early in training, runs that did not train 7.2% and more)."""
    compile_ahead: bool | None = None
    """Compile the next search trial's config in a shallow twin while the current trial runs, so that its compiles
    read the cache (workbench/tune/ahead.py); null = on with CUDA and the built-in loop."""
    compile_ahead_depth: int | None = None
    """Search trials asked ahead under compile-ahead, their twins compiling side by side (memory permitting): a
    screen is often shorter than the next config's compile, so a second twin gives each compile a screen more
    of head start and the host's idle cores; null = 2 on a GPU, 1 on a CPU (whose cores run the trial) and for
    the VLA (its twins, capped, split one share of the device: workbench/tune/ahead.py)."""
    start_ahead: bool | None = None
    """Start the next run's process (a search trial's, a baseline repeat's, an A/B run's) while the current one
    runs, held before any device work (its interpreter, imports and config done; a loop of one's own: up to
    ``workbench.run()``) until its turn, so that the device does not wait for them (workbench/tune/ahead.py);
    null = on for the built-in loop (its search trials where compile-ahead asks them ahead anyway; true:
    always). A loop of one's own must touch no device before ``workbench.run()``; one that does is seen at its
    gate and start-ahead is off for the rest of the search."""
    profile_steps: int = 2
    """Steps of the torch.profiler traces the study keeps, of the baseline and of the validated winner, profiled
    after the measurement of runs made anyway (the last baseline repeat, each candidate's first A/B pair); 0 = no
    traces."""

    def __post_init__(self) -> None:
        for key, low in (("warmup_steps", 0), ("window_steps", 1), ("windows", 1), ("baseline_repeats", 1),
                         ("top_k", 0), ("ab_rounds", 1), ("profile_steps", 0)):
            if getattr(self, key) < low:
                raise ConfigError(f"got {getattr(self, key)}; expected an integer >= {low}", key=key)
        for key in ("trial_timeout_s", "heartbeat_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"got {getattr(self, key)}; expected a number of seconds > 0", key=key)
        depth = self.compile_ahead_depth
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 4):
            raise ConfigError(f"got {self.compile_ahead_depth!r}; expected null or an integer in [1, 4]",
                              key="compile_ahead_depth")
        if self.ab_min_rounds is not None and not 2 <= self.ab_min_rounds <= self.ab_rounds:
            raise ConfigError(f"got {self.ab_min_rounds}; expected null or an integer in [2, ab_rounds = "
                              f"{self.ab_rounds}]", key="ab_min_rounds")
        if not 0 < self.numerics_tolerance < 1:
            raise ConfigError(f"got {self.numerics_tolerance}; expected a share of the base loss in (0, 1)",
                              key="numerics_tolerance")

    @property
    def steps(self) -> int:
        """Steps of one trial: warm-up plus the measured windows."""
        return self.warmup_steps + self.window_steps * self.windows

    def config_overrides(self) -> dict[str, Any]:
        """The measurement keys every trial (and every validation run) gets."""
        return {
            "training.max_steps": self.steps,
            "training.log_every": self.window_steps,
            "training.warmup_measure_steps": self.warmup_steps,
        }

    def profile_after_overrides(self) -> dict[str, Any]:
        """The keys that give a measured run a trace: ``profile_steps`` more steps after its measurement, profiled
        and counted in none of its figures (``metrics.profile_after_measure``); none when ``profile_steps`` is 0."""
        if self.profile_steps <= 0:
            return {}
        return {"metrics.profile_steps": self.profile_steps, "metrics.profile_after_measure": True}


@dataclass(kw_only=True)
class TrainerSpec:
    """A training loop of one's own (docs/trial-contract.md): the command each trial runs instead of
    ``python -m workbench.train``. Only a study file the user wrote (or confirmed) sets it."""

    command: list[str]
    """Program and arguments, run without a shell; a relative program path is relative to cwd. The trial's config is
    in $WORKBENCH_CONFIG, its directory in $WORKBENCH_OUT."""
    cwd: str | None = None
    """Working directory of the command, relative to the spec file; null = the spec file's folder."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of the command."""
    safe_env: list[str] = field(default_factory=list)
    """Names in ``env`` whose values may be written down (tune.json, the exported config, the report); the others
    are recorded as ``<set>``, as they may be secrets."""

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ConfigError(f"got {self.command!r}; expected a non-empty list of non-empty strings (program, "
                              "arguments)", key="command")
        for k in self.env:
            if not k or "=" in k or k in ("WORKBENCH_CONFIG", "WORKBENCH_OUT", "WORKBENCH_HOLD"):
                raise ConfigError(f"got {k!r}; expected a variable name (WORKBENCH_CONFIG, WORKBENCH_OUT and "
                                  "WORKBENCH_HOLD are the tuner's)", key=f"env.{k}")
        for k in self.safe_env:
            if k not in self.env:
                raise ConfigError(f"got {k!r}; expected one of the names in env ({', '.join(self.env) or 'none'})",
                                  key="safe_env")

    def record(self) -> dict[str, Any]:
        """Plain data of the command to write down: an ``env`` value is ``<set>`` unless its name is in
        ``safe_env``."""
        d = dataclasses.asdict(self)
        d["env"] = {k: v if k in self.safe_env else "<set>" for k, v in self.env.items()}
        return d
