"""Tuner efficiency: how many trials the study's sampler needs to come within 2% of an exhaustive grid's best.

    python benchmarks/sampler_efficiency.py --grid runs/gr00t-n1.6-grid [--storage URL] [--study-name NAME]
        [--spec gr00t-n1.6-proxy] [--samplers tpe:4,gp:2,random] [--policies tuner,sampler] [--seeds 100]
        [--within 0.02] --out DIR
    python benchmarks/sampler_efficiency.py --grid-csv benchmarks/results/study.csv --study-name gr00t-n1.6-grid
        --source campaign_studies_h200_2026-11-30.csv ...

Input: a study run with the grid sampler (``studies/gr00t-n1.6-grid.yaml``): every configuration of a
reduced space measured once by the tuner's own trials, from its storage or from the committed results CSV.
Failed or infeasible configurations count as 0, as the tuner tells them.

Replay: each of ``--samplers`` (default: the sampler of ``--spec`` and random search; ``NAME:N`` sets its
random startup trials, else the spec's ``n_startup_trials``), built exactly as ``workbench.tune`` builds it
(TPE: multivariate, constant liar; GP: ``workbench.tune.samplers.OrdinalGPSampler``), runs ``--seeds`` times
against the measured values, with a budget of as many trials as the grid has configurations; a trial's value is
the grid's measurement of the configuration it asks for (constraints too). A repeated proposal is answered as
each of ``--policies`` says: ``tuner`` as ``workbench.tune`` does (the earlier result, no trial spent, an untried
config queued in its place), ``sampler`` with the same number at the cost of a trial (the tuner before it
avoided repeats). Per sampler, policy and seed: the first trial of the budget whose best so far is within
``--within`` of the grid's best.

This measures the samplers on real objective values without re-running the GPU for every seed; what it
leaves out is measurement noise between repeats of one configuration (the study's noise floor says how
large that is).

Output: ``DIR/sampler_efficiency.csv`` (long: sampler, policy, seed, trials_to_target, plus the grid's size and
best), ``DIR/grid.csv`` (the measured grid), and a summary printed last: median and p80 trials to target,
and the share of seeds that reach it within 25% of the grid's trials.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
import pandas as pd  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from workbench.errors import ConfigError  # noqa: E402
from workbench.tune.profiled import ProfileLed, walk_record  # noqa: E402
from workbench.tune.study import load_study_spec  # noqa: E402
from workbench.tune.samplers import asked_config, make_sampler, untried_config  # noqa: E402

SAMPLERS = ("tpe", "gp", "random")  # the replayable ones (single-objective)


def load_grid(storage: str, study_name: str) -> tuple[dict[str, optuna.distributions.BaseDistribution], pd.DataFrame]:
    """The grid study's distributions and one row per configuration: params..., value, constraints (list)."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not done:
        raise SystemExit(f"sampler_efficiency: study {study_name!r} in {storage} has no completed trial")
    dists: dict[str, optuna.distributions.BaseDistribution] = {}
    for t in done:
        dists.update(t.distributions)
    for name, d in dists.items():
        if not isinstance(d, optuna.distributions.CategoricalDistribution):
            raise SystemExit(f"sampler_efficiency: knob {name!r} is {type(d).__name__}; the replay needs a grid of "
                             "categorical choices (give the grid study's knobs as choices)")
    rows = []
    for t in done:
        if set(t.params) != set(dists):
            continue  # a trial of another space
        ok = t.user_attrs.get("status") == "ok" and all(v <= 0 for v in t.constraints.values())
        rows.append({**t.params, "value": float(t.value) if ok and t.value is not None else 0.0,
                     "feasible": ok, "trial": t.number, "constraints": dict(t.constraints)})
    return dists, _complete(pd.DataFrame(rows), dists, f"study {study_name!r} in {storage}")


def _complete(grid: pd.DataFrame, dists: dict[str, Any], where: str) -> pd.DataFrame:
    """One row per configuration (one measured twice: the later run); every configuration of the space, else
    one error naming a missing one."""
    names = list(dists)
    grid = grid.drop_duplicates(subset=names, keep="last")
    size = math.prod(len(d.choices) for d in dists.values())
    if len(grid) < size:
        have = {tuple(r[n] for n in names) for _, r in grid.iterrows()}
        missing = [c for c in itertools.product(*(dists[n].choices for n in names)) if c not in have]
        raise SystemExit(f"sampler_efficiency: the grid is incomplete: {len(grid)} of {size} configurations "
                         f"measured in {where}; missing e.g. {dict(zip(names, missing[0]))} (resume the grid study)")
    return grid.reset_index(drop=True)


def load_grid_csv(path: Path, study_name: str, source: str | None) -> tuple[dict[str, Any], pd.DataFrame]:
    """The grid from a committed results CSV (``benchmarks/results/study.csv``): the search trials of
    ``study_name`` (of one ``source`` file where several runs share the name), the knobs and their choices, in the
    space's order, from its spec (``studies/<study_name>.yaml``). A row whose config has other knobs is another
    space's; a failed configuration is 0, as in the study."""
    spec = load_study_spec(study_name)
    dists: dict[str, Any] = {}
    for name, rng in spec.space.items():
        if rng.choices is None:
            raise SystemExit(f"sampler_efficiency: {spec.source}: space.{name} is a range; the replay needs choices")
        dists[name] = optuna.distributions.CategoricalDistribution(rng.choices)
    rows = pd.read_csv(path)
    rows = rows[(rows["study"] == spec.name) & (rows["phase"] == "search")
                & (rows["metric"] == "objective/tokens_per_s_per_gpu")]
    if source is not None:
        rows = rows[rows["source"] == source]
    if rows.empty:
        raise SystemExit(f"sampler_efficiency: {path} has no search trial of study {spec.name!r}"
                         + (f" from source {source!r}" if source else ""))
    out = []
    for _, r in rows.iterrows():
        given = dict(kv.split("=", 1) for kv in str(r["config"]).split())
        if set(given) != set(dists):
            continue
        params = {}
        for name, value in given.items():
            match = [c for c in dists[name].choices if str(c) == value]
            if not match:
                raise SystemExit(f"sampler_efficiency: {path}: trial {r['trial']:g} has {name}={value}, not one of "
                                 f"{list(dists[name].choices)} ({spec.source})")
            params[name] = match[0]
        value = float(r["value"])
        out.append({**params, "value": value, "feasible": value > 0, "trial": int(r["trial"]), "constraints": {}})
    return dists, _complete(pd.DataFrame(out), dists, f"{path} ({spec.name})")


POLICIES = ("tuner", "sampler")
"""How a repeated proposal is answered. ``tuner``: as ``workbench.tune`` does, from the earlier trial, at no cost
to the budget, with an untried config queued in its place (``workbench.tune.samplers.untried_config``);
``sampler``: the sampler alone, a repeat costing a trial (the tuner before issue 38)."""


def replay(dists: dict[str, Any], grid: pd.DataFrame, sampler: str, seed: int, n_startup: int,
           within: float, n_trials: int | None = None, policy: str = "tuner",
           base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One seeded run of ``sampler`` against the measured grid; the first trial of the budget (a repeat answered at
    no cost does not count) whose best so far is within ``within`` of the grid's best. With ``base`` (the grid
    study's base config, one of the grid's, its knobs in walk order), the startup walks from it as
    ``workbench.tune`` does by default
    (``sampler.startup: walk``), knowing its value as a study knows its baseline's, which costs no trial here
    (every study measures its baseline, whatever its sampler) and does not count as found."""
    names = list(dists)
    table = {tuple(r[n] for n in names): (r["value"], r["constraints"]) for _, r in grid.iterrows()}
    configs = [dict(zip(names, c)) for c in itertools.product(*(dists[n].choices for n in names))]
    best = grid["value"].max()
    target = best * (1 - within)
    n_trials = n_trials or len(grid)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = make_sampler(sampler, seed, n_startup)
    study = optuna.create_study(direction="maximize",
                                sampler=ProfileLed(chosen, n_startup) if base is not None else chosen)
    if base is not None:
        study.set_user_attr("walk", walk_record(list(base), {n: list(dists[n].choices) for n in names}, base, base,
                                                table[tuple(base[n] for n in names)][0]))
    best_so_far, hit, distinct, spent, free = -math.inf, None, set(), 0, 0
    while spent < n_trials:
        trial = study.ask(dists)
        key = tuple(trial.params[n] for n in names)
        value, constraints = table[key]
        repeat = key in distinct
        distinct.add(key)
        for k, v in constraints.items():
            trial.set_constraint(k, v)
        trial.set_user_attr("status", "ok" if value > 0 else "crash")  # (the walk's incumbent is a feasible trial)
        study.tell(trial, value)
        if repeat and policy == "tuner":
            asked = [asked_config(t) for t in study.get_trials(deepcopy=False)]
            pick = untried_config(configs, asked, seed, trial.number)
            if pick is not None:
                study.enqueue_trial(pick)
                free += 1
                continue
        spent += 1
        best_so_far = max(best_so_far, value)
        if hit is None and best_so_far >= target:
            hit = spent
    return {"sampler": sampler, "policy": policy, "startup": "walk" if base is not None else "random", "seed": seed,
            "trials_to_target": hit, "reached": hit is not None,
            "distinct_configs_asked": len(distinct), "free_repeats": free, "best_found": best_so_far}


def grid_base(study_name: str, dists: dict[str, Any]) -> dict[str, Any]:
    """The grid study's base config as the grid's knob values (``studies/<study_name>.yaml``), in the tuner's knob
    order (a walk's order where the base run has no profile); an error where the base sets a knob to a value
    outside the grid."""
    try:
        spec = load_study_spec(study_name)
    except (ConfigError, OSError) as e:  # (a grid read from a storage whose study has no spec in studies/)
        raise SystemExit(f"sampler_efficiency: --startups walk needs the grid study's spec: {e}") from None
    values = spec.base_knob_values()
    base = {n: values.get(n) for n in spec.knob_order() if n in dists}
    for n, v in base.items():
        if not any(v == c and type(v) is type(c) for c in dists[n].choices):
            raise SystemExit(f"sampler_efficiency: the grid study's base sets {n}={v!r}, not one of "
                             f"{list(dists[n].choices)}: the walk starts from a measured config")
    return base


def parse_samplers(arg: str | None, spec_sampler: str, spec_startup: int, spec_name: str) -> dict[str, tuple[str, int]]:
    """``"tpe:4,gp:2,random"`` -> {label: (sampler, startup trials)}; a name without ``:N`` takes the spec's
    startup trials; no argument: the spec's sampler and random search."""
    items = arg.split(",") if arg else [spec_sampler, "random"]
    out: dict[str, tuple[str, int]] = {}
    for item in items:
        name, _, n = item.strip().partition(":")
        if name not in SAMPLERS or (n and not n.isdigit()):
            raise SystemExit(f"sampler_efficiency: --samplers: {item!r} is not NAME or NAME:STARTUP_TRIALS with NAME "
                             f"in {', '.join(SAMPLERS)} (the spec {spec_name} uses {spec_sampler})")
        if name == "random":
            out[name] = (name, 0)  # no model: every trial is a startup trial
        else:
            startup = int(n) if n else spec_startup
            out[f"{name}:{startup}"] = (name, startup)
    return out


def summarize(res: pd.DataFrame, grid_size: int) -> pd.DataFrame:
    budget = grid_size * 0.25
    out = []
    for (sampler, policy, startup), g in res.groupby(["sampler", "policy", "startup"], sort=False):
        t = g["trials_to_target"].fillna(grid_size + 1)  # not reached within the grid's size: counted as more
        out.append({"sampler": sampler, "policy": policy, "startup": startup, "seeds": len(g),
                    "median_trials": float(t.median()),
                    "p80_trials": float(t.quantile(0.8)), "mean_trials": float(t.mean()),
                    "share_within_25pct_of_grid": float((t <= budget).mean()),
                    "median_share_of_grid": float(t.median() / grid_size)})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--grid", help="the grid study's directory (runs/<study>)")
    where.add_argument("--grid-csv", type=Path, help="a results CSV holding the grid's search trials "
                       "(benchmarks/results/study.csv); with --study-name, the grid study's spec")
    p.add_argument("--storage", help="its Optuna storage (default sqlite:///<grid>/study.db)")
    p.add_argument("--study-name", help="its study name (default: the directory's name; with --grid-csv: required)")
    p.add_argument("--source", help="with --grid-csv: only the rows of this source file")
    p.add_argument("--spec", default="gr00t-n1.6-proxy", help="study whose sampler is replayed (its n_startup_trials)")
    p.add_argument("--samplers", help=f"comma-separated NAME or NAME:STARTUP_TRIALS, NAME from {', '.join(SAMPLERS)} "
                   "(default: the spec's sampler and random)")
    p.add_argument("--policies", default="tuner", help=f"comma-separated, from {', '.join(POLICIES)}: how a repeated "
                   "proposal is answered (tuner: at no cost, an untried config in its place; sampler: a trial spent)")
    p.add_argument("--startups", default="random", help="comma-separated, from walk, random: how the startup trials "
                   "are chosen (walk: one knob at a time from the grid study's base config, the tuner's default; "
                   "random: the sampler's draws)")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--within", type=float, default=0.02, help="target: within this fraction of the grid's best")
    p.add_argument("--out", default="benchmarks/out/sampler_efficiency")
    a = p.parse_args(argv)
    policies = a.policies.split(",")
    if not set(policies) <= set(POLICIES):
        p.error(f"--policies: {a.policies!r}; expected a comma-separated list from {', '.join(POLICIES)}")
    startups = a.startups.split(",")
    if not set(startups) <= {"walk", "random"}:
        p.error(f"--startups: {a.startups!r}; expected a comma-separated list from walk, random")
    if a.grid_csv is not None:
        if not a.study_name:
            p.error("--grid-csv needs --study-name (the grid study, whose spec gives the knobs' choices)")
        dists, grid = load_grid_csv(a.grid_csv, a.study_name, a.source)
        name = load_study_spec(a.study_name).name
    else:
        grid_dir = Path(a.grid)
        storage = a.storage or f"sqlite:///{(grid_dir / 'study.db').resolve()}"
        name = a.study_name or grid_dir.name
        dists, grid = load_grid(storage, name)
    spec = load_study_spec(a.spec)
    samplers = parse_samplers(a.samplers, spec.sampler.name, spec.sampler.n_startup_trials, a.spec)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    grid.drop(columns=["constraints"]).to_csv(out / "grid.csv", index=False)
    base = grid_base(a.study_name or name, dists) if "walk" in startups else None
    rows = [{**replay(dists, grid, s, seed, n, a.within, policy=policy,
                      base=base if startup == "walk" and s != "random" else None),
             "sampler": label, "n_startup_trials": n}
            for label, (s, n) in samplers.items() for policy in policies for startup in startups
            for seed in range(a.seeds) if not (startup == "walk" and s == "random")]
    res = pd.DataFrame(rows)
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    res = res.assign(grid_size=len(grid), grid_best=float(grid["value"].max()), within=a.within,
                     grid_study=name, timestamp=stamp)
    res.to_csv(out / "sampler_efficiency.csv", index=False)
    summary = summarize(res, len(grid))
    summary.to_csv(out / "summary.csv", index=False)
    best_row = grid.loc[grid["value"].idxmax()]
    print(f"grid {name}: {len(grid)} configurations, best {best_row['value']:,.0f} "
          f"({', '.join(f'{n}={best_row[n]}' for n in dists)}); target: within {a.within:.0%}")
    with pd.option_context("display.width", 200, "display.float_format", "{:,.3g}".format):
        print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
