"""The study's one result: the validated winner (or why there is none), what it was measured against, how sure.

``build_result`` makes it from validation.json and the study's facts; the tuner writes it once, to tune.json's
``result``. The terminal summary (``result_lines``), the progress bar's last line and the report's headline
(``result_headline``) and the exported config's provenance (``provenance_fields``) are all read from it, so each
figure about the winner is one number everywhere. Figures from the search (one run of a trial) are named
``search_*``; every other throughput is a median of the A/B validation's interleaved runs.
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loaders.format import MANIFEST_NAME
from workbench.config import Config
from workbench.tune.stats import noise_floor, noise_warning, pairs_needed

__all__ = ["VERDICTS", "build_result", "data_source", "describe_data", "gpu_minutes_line", "provenance_fields",
           "reference_line", "result_headline", "result_lines"]

VERDICTS = ("winner", "no_significant_gain", "no_candidate")
"""``winner``: a candidate's interval lies above 1.0 and it is exported; ``no_significant_gain``: candidates were
validated, none significantly faster, the base config is exported; ``no_candidate``: nothing to validate."""


def _median(xs: Sequence[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def _changed(params: Mapping[str, Any], base_values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Knobs whose value differs from the base config's: {knob: {"base": b, "value": v}}."""
    return {k: {"base": base_values.get(k), "value": v} for k, v in params.items() if base_values.get(k) != v}


def _candidate(c: Mapping[str, Any], base_values: Mapping[str, Any], validation: Mapping[str, Any]) -> dict[str, Any]:
    pairs = len(c.get("ratios") or [])
    cap = validation.get("ab_rounds")
    lo, hi = c.get("ci_low"), c.get("ci_high")
    if c.get("stopped"):
        stopped = c["stopped"]
    elif pairs and cap is not None and pairs >= cap:
        stopped = "cap"
    else:
        stopped = "failed runs" if c.get("failures") else "cap"
    out = {
        "trial": c["trial"], "params": dict(c.get("params") or {}),
        "changed": _changed(c.get("params") or {}, base_values),
        "search_tokens_per_s": c.get("search_value"),
        "tokens_per_s": _median(c.get("runs")), "baseline_tokens_per_s": _median(c.get("baseline_runs")),
        "speedup": c.get("speedup_median"), "ci_low": lo, "ci_high": hi, "pairs": pairs,
        "significant": bool(c.get("significant")), "stopped": stopped, "numerics": c.get("numerics"),
        "failures": len(c.get("failures") or []),
    }
    if not out["significant"]:
        if not pairs:
            out["why_lost"] = "no A/B pair completed"
        elif pairs < 2:
            out["why_lost"] = "one A/B pair gives no interval"
        elif hi is not None and hi < 1.0:
            out["why_lost"] = f"slower than the base: its interval [{lo:.3f}, {hi:.3f}] lies below 1.0"
        else:
            ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
            out["why_lost"] = f"its interval {ci} includes 1.0 after {pairs} pairs"
            # at the cap with a gain the spread hides: how many pairs would show it, at the same spread
            need = pairs_needed(c.get("ratios") or [], validation.get("ab_min_rounds") or pairs) if stopped == "cap" \
                else None
            out["pairs_needed"] = need
            if stopped == "budget":
                out["why_lost"] += "; the GPU-minute budget held no more pairs (raise budget.gpu_minutes)"
            if need is not None:
                out["why_lost"] += (f"; at its spread about {need} pairs would tell (raise protocol.ab_rounds), or "
                                    "quieten the machine")
    return out


def build_result(
    validation: Mapping[str, Any],
    *,
    study: str,
    base_values: Mapping[str, Any],
    baseline_repeats: Sequence[float],
    searched: Sequence[str],
    budget: Mapping[str, Any],
    data: Mapping[str, Any],
    commit: str | None,
) -> dict[str, Any]:
    """The result of a study from its validation.json and its facts.

    ``base_values``: each knob's value in the base config (``StudySpec.base_knob_values``); ``baseline_repeats``:
    the throughputs of the baseline runs before the search (the noise floor); ``budget``: trials, trials_run,
    timeout_s, wall_s; ``data``: where the training data came from (``data_source``); ``commit``: the
    workbench's source revision.
    """
    cands = [_candidate(c, base_values, validation) for c in validation.get("candidates") or []]
    w = (validation.get("winner") or {}).get("trial")
    winner = next((c for c in cands if c["trial"] == w and c["significant"]), None)
    measured = [c for c in cands if c["speedup"] is not None]
    best = winner or max(measured, key=lambda c: c["speedup"], default=None)
    nf = noise_floor(baseline_repeats).to_dict() if baseline_repeats else None
    # every run of the base config in the study: the repeats and the base runs of the candidates' A/B pairs (a
    # duel's pairs run a candidate in its place, the reference's the plain loop: neither is the base)
    paired = [x for c in validation.get("candidates") or [] for x in c.get("baseline_runs") or []]
    base_runs = {**noise_floor([*baseline_repeats, *paired]).to_dict(), "repeats": len(baseline_repeats),
                 "paired": len(paired)} if paired else None
    if winner is not None:
        verdict = "winner"
    else:
        verdict = "no_significant_gain" if cands else "no_candidate"
    # the baseline's one figure: the runs the reported speedup was measured against, else the repeats
    baseline = {"tokens_per_s": best["baseline_tokens_per_s"], "runs": best["pairs"],
                "source": "the A/B pairs of the best candidate"} if best else \
        {"tokens_per_s": (nf or {}).get("median"), "runs": (nf or {}).get("n", 0), "source": "the baseline repeats"}
    return {
        "study": study,
        "verdict": verdict,
        "exported": {"trial": winner["trial"] if winner else None, "params": dict(winner["params"]) if winner else {},
                     "changed": dict(winner["changed"]) if winner else {},
                     "tokens_per_s": winner["tokens_per_s"] if winner else baseline["tokens_per_s"]},
        "best": best,
        "candidates": cands,
        "skipped": list(validation.get("skipped") or []),
        # why the exported one of several significant candidates (validation.pick_winner), and the head-to-head
        # A/B pairs measured between them
        "winner_rule": (validation.get("winner") or {}).get("decided_by") if winner else None,
        "head_to_head": [{k: d.get(k) for k in ("a", "b", "speedup_median", "ci_low", "ci_high", "pairs", "faster",
                                                "told_apart")} for d in (validation.get("winner") or {}).get("duels")
                         or []],
        "baseline": baseline,
        "noise": nf,
        "base_runs": base_runs,
        # one line when the base config's runs (else its repeats) spread above NOISY_SPREAD
        "noise_warning": noise_warning(base_runs, what="runs") if base_runs else noise_warning(nf),
        "protocol": {"method": validation.get("method"), "confidence": validation.get("confidence"),
                     "overall_confidence": validation.get("overall_confidence", validation.get("confidence")),
                     "looks": validation.get("looks", 1), "min_pairs": validation.get("ab_min_rounds"),
                     "max_pairs": validation.get("ab_rounds")},
        "searched": list(searched),
        "budget": dict(budget),
        "data": dict(data),
        "commit": commit,
        # the torch.profiler traces of the baseline and of the winner (validation.json's, Measurer.keep_traces)
        "traces": validation.get("traces"),
        # the winner beside the plain compiled loop (validation.json's, validation.against_plain)
        "reference": validation.get("reference"),
    }


def _speed(c: Mapping[str, Any]) -> str:
    lo, hi = c.get("ci_low"), c.get("ci_high")
    ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
    sp = f"{c['speedup']:.3f}x" if c.get("speedup") is not None else "n/a"
    return f"{sp} {ci} over {c.get('pairs', 0)} A/B pairs"


def _knobs(changed: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(f"{k} {v['base']} -> {v['value']}" for k, v in changed.items()) or "no knob changed"


def result_headline(result: Mapping[str, Any]) -> str:
    """One line: the verdict, the winner's speedup with its interval, or the best candidate and why it lost."""
    best = result.get("best")
    if result["verdict"] == "winner":
        return f"winner: trial #{best['trial']} at {_speed(best)} ({_knobs(best['changed'])})"
    if best is not None:
        return (f"no significant gain: the base config is exported; best candidate trial #{best['trial']} at "
                f"{_speed(best)}: {best.get('why_lost', 'not significant')}")
    return "no candidate beat the baseline in the search: the base config is exported"


def _tps(x: float | None) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "n/a"


def result_lines(result: Mapping[str, Any]) -> list[str]:
    """The terminal summary of a finished study."""
    lines = [result_headline(result)]
    best, base, nf = result.get("best"), result["baseline"], result.get("noise")
    if best is not None:
        lines.append(f"  validated: {_tps(best['tokens_per_s'])} vs baseline {_tps(base['tokens_per_s'])} real "
                     f"tok/s/gpu (medians of the interleaved runs); search run {_tps(best['search_tokens_per_s'])}")
    if result.get("head_to_head"):
        lines.append(f"  chosen: {result['winner_rule']}")
    if nf and nf["n"] > 1:
        lines.append(f"  noise floor: {nf['n']} baseline repeats, median {_tps(nf['median'])} tok/s/gpu, spread "
                     f"{nf['rel_spread']:.1%} (cv {nf['cv']:.1%})")
    elif nf:
        lines.append(f"  noise floor: 1 baseline run, {_tps(nf['median'])} tok/s/gpu (one run has no spread)")
    if (br := result.get("base_runs")) and br["n"] > 1:
        lines.append(f"  the base config in the study: {br['n']} runs ({br['repeats']} before the search, "
                     f"{br['paired']} in A/B pairs), {_tps(br['min'])} to {_tps(br['max'])} tok/s/gpu, spread "
                     f"{br['rel_spread']:.1%}")
    if result.get("noise_warning"):
        lines.append(f"  {result['noise_warning']}")
    b = result["budget"]
    lines.append(f"  searched {', '.join(result['searched']) or 'nothing'}; {b.get('trials_run', 0)} of "
                 f"{b.get('trials') if b.get('trials') is not None else 'unlimited'} trials; data: "
                 f"{describe_data(result['data'])}")
    if (g := b.get("gpu_minutes")) and (line := gpu_minutes_line(g, b.get("screening"))):
        lines.append(f"  {line}")
    if (ref := result.get("reference")) and ref.get("ran"):
        lines.append(f"  {reference_line(ref)}")
    return lines


def reference_line(ref: Mapping[str, Any]) -> str:
    """One line: the exported config against the plain compiled loop, with its interval, or why it was not
    measured."""
    what = f"against {ref.get('reference') or 'the plain compiled loop'}"
    if not ref.get("ran"):
        return f"{what}: not measured, {ref.get('reason')}"
    med, lo, hi = ref.get("speedup_median"), ref.get("ci_low"), ref.get("ci_high")
    if med is None:
        return f"{what}: no A/B pair completed"
    ci = f"[{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "[n/a]"
    how = ("A/B pairs of the validation (the study's base is that loop)" if ref.get("same_as_base")
           else "interleaved A/B pairs")
    return f"{what}: {med:.3f}x {ci} over {ref.get('pairs', 0)} {how}"


def gpu_minutes_line(gpu: Mapping[str, Any], screening: Mapping[str, Any] | None = None) -> str:
    """One line: the GPU-minutes (CPU-minutes on a CPU) the study spent, of its budget, by phase, and what each
    screening stage saw."""
    phases = ", ".join(f"{k} {v:.1f}" for k, v in (gpu.get("by_phase") or {}).items() if v)
    unit = "CPU-minutes" if gpu.get("device") == "cpu" else "GPU-minutes"
    text = (f"{unit}: {gpu.get('total', 0):.1f}" + (f" of {gpu['budget']:g}" if gpu.get("budget") else "")
            + (f" ({phases})" if phases else "")
            + (f"; the budget held no search trial (raise it to {need:g})"
               if (need := (gpu.get("no_room") or {}).get("minutes", {}).get("needed")) else ""))
    if screening and screening.get("stages"):
        stages = ", ".join(f"{s['trials']} at {s['windows']} window{'s' if s['windows'] != 1 else ''}"
                           for s in screening["stages"])
        rate = screening.get("configs_per_gpu_minute")
        text += (f"; trials measured: {stages}"
                 + (f"; {screening['stopped_for_budget']} stopped early for the budget"
                    if screening.get("stopped_for_budget") else "")
                 + (f"; {screening['refused_without_run']} refused without a run"
                    if screening.get("refused_without_run") else "")
                 + (f"; {rate:.2f} configs a {unit.removesuffix('s')}" if rate else ""))
        if sec := screening.get("screen_seconds"):
            compiling = f" ({sec['compile']:.0f} of them compiling)" if sec.get("compile") is not None else ""
            text += (f"; a search trial's median seconds: {sec['before_first_step']:.0f} before its first step"
                     f"{compiling}, "
                     f"{sec['stepping']:.0f} stepping, {sec['after_last_window']:.0f} after its last window "
                     f"({sec['total']:.0f} in all, {sec['trials']} trials)")
        ahead = screening.get("compile_ahead")
        if ahead and ahead.get("twins"):
            after, without = ahead.get("median_compile_s_after_twin"), ahead.get("median_compile_s_without")
            deep = f" ({ahead['depth']} trials ahead)" if (ahead.get("depth") or 1) > 1 else ""
            kinds = ahead.get("failed_kinds") or {}
            failed = (f", {ahead['failed']} failed ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})"
                      if ahead.get("failed") and kinds else "")
            text += (f"; compile-ahead{deep}: {ahead['finished']} of {ahead['twins']} twins finished before their trial"
                     + (f" (median compile {after:.0f} s after a twin" + (f", {without:.0f} s without" if without
                                                                         is not None else "") + ")"
                        if after is not None else "") + failed + f", {ahead.get('waited_s', 0):.0f} s waited"
                     + (f", {ahead['paused_s']:.0f} s stopped through measured windows" if ahead.get("paused_s")
                        else ""))
        held = screening.get("start_ahead")
        if held and held.get("held"):
            ready = held.get("median_ready_s")
            text += (f"; start-ahead: {held['ready_at_gate']} of {held['held']} trials' processes were ready when "
                     "they started" + (f" (median {ready:.1f} s of start-up off the device's clock)"
                                       if ready is not None else ""))
    return text


def data_source(cfg: Config, trainer: Any = None) -> dict[str, Any]:
    """Where a config's training data comes from: a loop of one's own (``trainer``, a study's TrainerSpec) reads its
    own, named by its command; else ``{"source": "synthetic"}`` without ``data.loongbin_dir``, else the shard
    directory with the tokenizer and token count its manifest records (None where it records none)."""
    if trainer is not None:
        return {"source": "trainer", "command": list(trainer.command), "cwd": trainer.cwd}
    if not cfg.data.loongbin_dir:
        return {"source": "synthetic"}
    path = Path(cfg.data.loongbin_dir).resolve()
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        manifest = {}
    return {"source": "shards", "path": str(path), "tokenizer": manifest.get("tokenizer"),
            "real_tokens": manifest.get("real_tokens")}


def describe_data(data: Mapping[str, Any]) -> str:
    """'synthetic corpus (...)' or the shard directory with its tokenizer."""
    if data.get("source") == "synthetic":
        return "synthetic corpus (no data.loongbin_dir set)"
    if data.get("source") == "trainer":
        return f"its own loop's data: {shlex.join(data.get('command') or [])}"
    tok = data.get("tokenizer")
    return f"shards {data.get('path')}" + (f" (tokenizer {tok})" if tok else " (tokenizer not recorded)")


def provenance_fields(result: Mapping[str, Any]) -> dict[str, Any]:
    """The exported config's provenance, from the result: the exported trial's validated figures, the verdict,
    the best candidate when the base config is exported, and what the study searched, with what, on what."""
    best = result.get("best")
    won = result["verdict"] == "winner"
    exported = result["exported"]
    fields: dict[str, Any] = {
        "study": result["study"],
        "trial": exported["trial"],
        "tokens_per_s_per_gpu": exported["tokens_per_s"],
        "baseline_tokens_per_s_per_gpu": result["baseline"]["tokens_per_s"],
        "speedup": best["speedup"] if won else 1.0,
        "speedup_ci": [best["ci_low"], best["ci_high"]] if won else None,
        "ab_pairs": best["pairs"] if won else None,
        "significant": won,
        "verdict": result["verdict"],
        "numerics": best.get("numerics") if won else None,
        "searched_knobs": list(result["searched"]),
        "changed_knobs": dict(exported["changed"]),
        "budget": dict(result["budget"]),
        "commit": result.get("commit"),
        "data": dict(result["data"]),
    }
    if not won and best is not None:
        fields["best_candidate"] = {k: best[k] for k in ("trial", "params", "speedup", "ci_low", "ci_high", "pairs",
                                                          "why_lost")}
    return fields
