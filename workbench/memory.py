"""Memory domain: allocator settings, and ``python -m workbench.memory analyze``.

    python -m workbench.memory analyze --config config.yaml [--steps N] [--out DIR] [--synthetic]
    python -m workbench.memory analyze --preset gr00t-n1.6 --synthetic --set data.micro_batch_size=8

Allocator settings
    ``loongforge.memory_domain.allocator`` (expandable_segments,
    roundup_power2_divisions, max_split_size_mb, garbage_collection_threshold)
    goes into ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``
    (``workbench.config.apply_allocator_env``), which torch reads when CUDA
    initialises; ``apply_allocator_settings`` does that and then hands the same
    string to the installed torch's allocator-config parser
    (``torch._C._accelerator_setAllocatorSettings``, or the older
    ``_cuda_cudaCachingAllocator_set_allocator_settings``), so that an option
    this torch does not know, or a value it refuses, is a ``ConfigError`` naming
    the config key, before any CUDA work. The training loop calls it first
    thing. A CPU-only torch parses the values but registers no CUDA parser, so
    it cannot tell an unknown option from a known one; there the settings act
    on nothing anyway.

Pinned staging blocks
    ``loaders.pipeline`` allocates ``num_staging_blocks`` blocks once per
    pipeline (pinned on CUDA), sized ``pinned_block_kb`` KiB or, by default, the
    seed's ceil(bytes per sample x micro-batch / 4096) x 4096 bytes
    (``loaders.pipeline.default_block_bytes``); the loop passes the config's
    value.

``analyze`` (needs CUDA; on a CPU it says so and exits with 2)
    Runs the training loop (``workbench.loop.Trainer``) for ``--warmup`` steps,
    then records the allocator's history (``torch.cuda.memory.
    _record_memory_history``, no stack traces) over ``--steps`` steps, takes a
    snapshot (``torch.cuda.memory._snapshot``) and the allocator statistics,
    prints a table and writes ``memory_analysis.json`` (below), which the
    report's Memory section reads from the study directory, the best trial's
    directory or the first baseline run's directory.

What is derived from the snapshot (``analyze_snapshot``, pure, testable on a CPU)
    * allocation-size histogram: requested sizes of the trace's ``alloc``
      events in power-of-two bins (2^(k-1), 2^k], labelled by the upper edge;
    * peak allocated and peak reserved: the allocator's statistics (exact)
      when given, else the timeline's maxima;
    * the timeline of allocated and reserved bytes, rebuilt backwards from the
      snapshot's final state (sum of active blocks, sum of segments) through
      the trace (``alloc`` / ``free_requested`` change allocated by the
      request rounded as the allocator rounds it; ``segment_alloc`` /
      ``segment_free`` / ``segment_map`` / ``segment_unmap`` change reserved),
      so a trace whose oldest entries fell out of the ring buffer is still
      exact at its end. Approximate by the remainders the allocator leaves
      unsplit (< 512 B for small blocks, <= 1 MiB for large ones);
    * fragmentation: reserved - allocated. ``at_peak_allocated`` is taken at
      the moment the most memory is in use, where unused reserved memory is
      what stands between the run and an OOM; ``max`` is the largest value
      (usually at a step's end, when activations return to the cache);
    * allocator retries (``num_alloc_retries``: cudaMalloc failed, the cache
      was flushed and the malloc retried) and OOMs.

Suggestion rules (``suggest_allocator``; thresholds are the constants below)
    * roundup_power2_divisions: look at the requests above 1 MiB. If their
      sizes already repeat (at most 2 distinct sizes per occupied power-of-two
      range), rounding only wastes memory: none. Otherwise the smallest D of
      2, 4, 8, 16 (the fewest size classes, the most reuse of freed blocks)
      whose rounding adds at most ``ROUND_WASTE_MAX`` of the requested bytes
      (computed with the allocator's own rounding) and leaves fewer distinct
      sizes than before.
    * fragmentation counts as high when, at peak allocation, at least
      ``FRAG_HIGH_PCT`` % of the reserved memory is unused, or the allocator
      had to retry. Only then:
      - expandable_segments: true (segments grow in place instead of
        leaving differently sized segments behind);
      - max_split_size_mb: the power of two (MiB, at least torch's minimum
        of 20) at or above the 90th percentile of the large requests, if the
        requests above it hold at least ``SPLIT_BYTES_SHARE`` of the large
        bytes: those few big blocks then stay whole instead of being carved up
        by smaller requests, which leaves holes no large request can use;
      - garbage_collection_threshold: ``GC_THRESHOLD`` when the allocator
        retried (it reclaims cached blocks before a malloc fails, instead of
        flushing the whole cache after).
    Only settings that differ from the ones in effect are suggested.

``memory_analysis.json`` (schema_version 1)
    ``device``, ``steps``; ``allocations`` (alloc events recorded);
    ``allocation_size_histogram``: [{size_bytes (bin upper edge), count,
    total_bytes}]; ``distinct_large_sizes``; ``peak``: {allocated_bytes,
    reserved_bytes, source}; ``fragmentation``: {at_peak_allocated_bytes,
    at_peak_allocated_pct, max_bytes, final_bytes}; ``timeline``: up to 200
    points [{event, time_us, allocated_bytes, reserved_bytes}];
    ``alloc_retries``, ``ooms``; ``segments``: {count, reserved_bytes,
    allocated_bytes, largest_inactive_block_bytes}; ``suggestions``: [{key
    (dotted config key or null), value, text}]; ``suggested_allocator``: the
    settings to change ({option: value}); ``allocator_in_effect``; ``rules``:
    the thresholds; ``run`` (written by the CLI): model, micro-batch, steps,
    config hash, allocator environment, throughput, GPU, torch.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from workbench.config import AllocatorConfig, Config, ConfigError, apply_allocator_env

__all__ = [
    "ALLOCATOR_OPTIONS",
    "FRAG_HIGH_PCT",
    "GC_THRESHOLD",
    "ROUND_WASTE_MAX",
    "SPLIT_BYTES_SHARE",
    "analyze_snapshot",
    "apply_allocator_settings",
    "check_allocator_settings",
    "format_table",
    "main",
    "round_block_size",
    "suggest_allocator",
]

ALLOCATOR_OPTIONS = tuple(f.name for f in fields(AllocatorConfig))
"""The allocator options the config can set (``loongforge.memory_domain.allocator.*``)."""

FRAG_HIGH_PCT = 15.0
"""Unused share of reserved memory at peak allocation above which fragmentation is worth acting on. A judgement
call: a fixed-shape loop's caching overhead is a few percent; varied bucket lengths push it past 15%."""
ROUND_WASTE_MAX = 0.05
"""Most extra bytes (share of the requested large bytes) a roundup_power2_divisions suggestion may cost."""
SPLIT_BYTES_SHARE = 0.25
"""Share of the large bytes the requests above a max_split_size_mb suggestion must hold for it to matter."""
GC_THRESHOLD = 0.8
"""garbage_collection_threshold suggested when the allocator had to retry."""

_KEY = "loongforge.memory_domain.allocator"
_MIB = 1024 ** 2
_GIB = 1024 ** 3
_MIN_BLOCK = 512  # the caching allocator's smallest block and rounding step
_LARGE = 1 * _MIB  # requests above this come from the large pool (where rounding and splitting settings act)
_MIN_SPLIT_MB = 20  # torch's minimum max_split_size_mb
_TIMELINE_POINTS = 200


# --------------------------------------------------------------------------- allocator settings


def apply_allocator_settings(cfg: Config, environ: MutableMapping[str, str] | None = None) -> str:
    """Put the config's allocator settings into the environment and check them with the installed torch.

    Returns the settings string written ("" when the config sets none). The
    check (``check_allocator_settings``) runs only for this process's own
    environment (``environ`` None); call this before CUDA initialises.
    """
    text = apply_allocator_env(cfg, environ)
    if text and environ is None:
        check_allocator_settings(text, config_options=_set_options(cfg.loongforge.memory_domain.allocator))
    return text


def _set_options(alloc: AllocatorConfig) -> dict[str, Any]:
    return {f.name: getattr(alloc, f.name) for f in fields(alloc) if getattr(alloc, f.name) is not None}


def _allocator_setter() -> Callable[[str], Any] | None:
    import torch

    for name in ("_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings"):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            return fn
    return None


def check_allocator_settings(text: str, *, config_options: Mapping[str, Any] | None = None,
                             setter: Callable[[str], Any] | None = None) -> None:
    """Parse ``text`` (``option:value,...``) with the installed torch's allocator-config parser.

    Raises ``ConfigError`` naming ``loongforge.memory_domain.allocator.<option>``
    when torch rejects an option the config set (``config_options``), or naming
    the environment variable when the option came from there. The parser also
    applies the settings to this process's allocator config: the same values
    the environment gives it when CUDA initialises. No-op when this torch has
    no parser to call.
    """
    import torch

    setter = setter or _allocator_setter()
    if setter is None or not text:
        return
    try:
        setter(text)
    except (RuntimeError, ValueError) as e:
        msg = " ".join(str(e).split("\n")[0].split())
        option = _offending_option(msg, text)
        ours = dict(config_options or {})
        where = f"torch {torch.__version__} rejects the allocator setting"
        if option in ours:
            raise ConfigError(f"{where} {option}:{ours[option]}: {msg}", key=f"{_KEY}.{option}") from None
        if option is not None:
            raise ConfigError(f"{where} {option!r} from the environment (PYTORCH_CUDA_ALLOC_CONF / "
                              f"PYTORCH_ALLOC_CONF = {text!r}): {msg}", key="PYTORCH_CUDA_ALLOC_CONF") from None
        raise ConfigError(f"{where}s {text!r}: {msg}", key=_KEY) from None


def _tokens(text: str) -> list[str]:
    """Tokens as torch's ConfigTokenizer makes them: words and the separators , : [ ]."""
    return [t for t in re.split(r"([,:\[\]])", text.replace(" ", "")) if t]


def _offending_option(message: str, text: str) -> str | None:
    """The option a torch allocator-config error is about (its name, a token index, or a mention)."""
    m = re.search(r"Unrecognized key '([^']+)'|Unrecognized CachingAllocator option: ?(\w+)", message)
    if m:
        return m.group(1) or m.group(2)
    tokens = _tokens(text)
    keys: list[str | None] = []
    current, depth = None, 0
    for i, t in enumerate(tokens):
        depth += (t == "[") - (t == "]")
        if depth == 0 and i + 1 < len(tokens) and tokens[i + 1] == ":" and (i == 0 or tokens[i - 1] == ","):
            current = t
        keys.append(current)
    m = re.search(r"at index (\d+)", message)
    if m and int(m.group(1)) < len(keys):
        return keys[int(m.group(1))]
    present = [k for k in dict.fromkeys(k for k in keys if k)]
    aliases = {"garbage_collect": "garbage_collection_threshold", "roundup": "roundup_power2_divisions",
               "max_split_size": "max_split_size_mb", "expandable": "expandable_segments"}
    for word, option in aliases.items():
        if word in message and option in present:
            return option
    for option in present:
        if option in message:
            return option
    return None


# --------------------------------------------------------------------------- the analysis (pure)


def round_block_size(size: int, divisions: int = 0) -> int:
    """The block size the caching allocator carves for a request of ``size`` bytes.

    Rounds up to a multiple of 512 B; with ``roundup_power2_divisions`` D > 1
    (and size > 512 x D), up to the next of D equal steps between two powers of
    two, as torch's ``round_size`` / ``roundup_power2_next_division`` do.
    """
    if size < _MIN_BLOCK:
        return _MIN_BLOCK
    if divisions > 1 and size > _MIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return _MIN_BLOCK * ((size + _MIN_BLOCK - 1) // _MIN_BLOCK)


def _bin_edge(size: int) -> int:
    """Upper edge of the power-of-two bin (2^(k-1), 2^k] holding ``size``."""
    return 1 << max(0, (size - 1).bit_length())


def _histogram(sizes: Sequence[int]) -> list[dict[str, int]]:
    count: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for s in sizes:
        edge = _bin_edge(s)
        count[edge] += 1
        total[edge] += s
    return [{"size_bytes": e, "count": count[e], "total_bytes": total[e]} for e in sorted(count)]


def _device_trace(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    traces = snapshot.get("device_traces") or []
    if device < len(traces) and traces[device]:
        return list(traces[device])
    return []


def _timeline(trace: Sequence[Mapping[str, Any]], final_alloc: int, final_reserved: int,
              divisions: int) -> tuple[list[int], list[int]]:
    """Allocated and reserved bytes after each trace event, rebuilt backwards from the final state."""
    n = len(trace)
    alloc, res = [0] * n, [0] * n
    a, r = final_alloc, final_reserved
    for i in range(n - 1, -1, -1):
        alloc[i], res[i] = a, r  # the state after event i
        e = trace[i]
        action, size = e.get("action"), int(e.get("size", 0) or 0)
        if action == "alloc":
            a -= round_block_size(size, divisions)
        elif action == "free_requested":
            a += round_block_size(size, divisions)
        elif action in ("segment_alloc", "segment_map"):
            r -= size
        elif action in ("segment_free", "segment_unmap"):
            r += size
    return alloc, res


def _pick(n: int, keep: Sequence[int], points: int) -> list[int]:
    if n <= points:
        return list(range(n))
    idx = {round(i * (n - 1) / (points - 1)) for i in range(points)} | {k for k in keep if 0 <= k < n}
    return sorted(idx)


def analyze_snapshot(snapshot: Mapping[str, Any], *, device: int = 0, stats: Mapping[str, Any] | None = None,
                     allocator: AllocatorConfig | None = None, steps: int | None = None,
                     points: int = _TIMELINE_POINTS) -> dict[str, Any]:
    """The ``memory_analysis.json`` document for a ``torch.cuda.memory._snapshot()`` (see the module docstring).

    ``stats`` is ``torch.cuda.memory_stats(device)`` taken with the snapshot
    (exact peaks and retry counts); ``allocator`` the settings in effect (their
    rounding is used for the timeline, and settings already in effect are not
    suggested).
    """
    allocator = allocator or AllocatorConfig()
    divisions = allocator.roundup_power2_divisions or 0
    segments = [s for s in snapshot.get("segments") or [] if int(s.get("device", device)) == device]
    final_reserved = sum(int(s.get("total_size", 0)) for s in segments)
    final_alloc = sum(int(b.get("size", 0)) for s in segments for b in s.get("blocks") or []
                      if b.get("state") == "active_allocated")
    inactive = [int(b.get("size", 0)) for s in segments for b in s.get("blocks") or [] if b.get("state") == "inactive"]

    trace = _device_trace(snapshot, device)
    sizes = [int(e.get("size", 0)) for e in trace if e.get("action") == "alloc"]
    if not sizes:  # no history recorded: the live allocations are all there is
        sizes = [int(b.get("requested_size", b.get("size", 0))) for s in segments for b in s.get("blocks") or []
                 if b.get("state") == "active_allocated"]
    alloc_t, res_t = _timeline(trace, final_alloc, final_reserved, divisions)
    if not trace:
        alloc_t, res_t = [final_alloc], [final_reserved]
    alloc_t, res_t = [max(0, a) for a in alloc_t], [max(0, r) for r in res_t]  # rounding approximations
    frag_t = [max(0, r - a) for a, r in zip(alloc_t, res_t)]
    i_peak = max(range(len(alloc_t)), key=alloc_t.__getitem__)
    frag_peak = frag_t[i_peak]
    stats = stats or {}
    if "allocated_bytes.all.peak" in stats:
        peak = {"allocated_bytes": int(stats["allocated_bytes.all.peak"]),
                "reserved_bytes": int(stats.get("reserved_bytes.all.peak", max(res_t))), "source": "memory_stats"}
    else:
        peak = {"allocated_bytes": max(alloc_t), "reserved_bytes": max(res_t), "source": "trace"}
    retries = stats.get("num_alloc_retries")
    ooms = stats.get("num_ooms", sum(1 for e in trace if e.get("action") == "oom") if trace else None)
    large = [s for s in sizes if s > _LARGE]
    idx = _pick(len(alloc_t), [i_peak, max(range(len(frag_t)), key=frag_t.__getitem__)], points)
    doc: dict[str, Any] = {
        "schema_version": 1,
        "device": f"cuda:{device}",
        "steps": steps,
        "allocations": len(sizes),
        "allocation_size_histogram": _histogram(sizes),
        "distinct_large_sizes": len({round_block_size(s) for s in large}),
        "peak": peak,
        "fragmentation": {
            "at_peak_allocated_bytes": frag_peak,
            "at_peak_allocated_pct": 100 * frag_peak / res_t[i_peak] if res_t[i_peak] > 0 else 0.0,
            "max_bytes": max(frag_t),
            "final_bytes": max(0, final_reserved - final_alloc),
        },
        "timeline": [{"event": i, "time_us": trace[i].get("time_us") if trace else None,
                      "allocated_bytes": alloc_t[i], "reserved_bytes": res_t[i]} for i in idx],
        "alloc_retries": None if retries is None else int(retries),
        "ooms": None if ooms is None else int(ooms),
        "segments": {"count": len(segments), "reserved_bytes": final_reserved, "allocated_bytes": final_alloc,
                     "largest_inactive_block_bytes": max(inactive, default=0)},
        "allocator_in_effect": _set_options(allocator),
        "rules": {"frag_high_pct": FRAG_HIGH_PCT, "round_waste_max": ROUND_WASTE_MAX,
                  "split_bytes_share": SPLIT_BYTES_SHARE, "gc_threshold": GC_THRESHOLD, "large_bytes": _LARGE},
    }
    suggestions, settings = suggest_allocator(doc, sizes, allocator)
    doc["suggestions"] = suggestions
    doc["suggested_allocator"] = settings
    return doc


def suggest_allocator(doc: Mapping[str, Any], sizes: Sequence[int], allocator: AllocatorConfig | None = None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Suggestions (key, value, text) and the settings to change, by the rules of the module docstring."""
    allocator = allocator or AllocatorConfig()
    out: list[dict[str, Any]] = []
    settings: dict[str, Any] = {}

    def add(option: str | None, value: Any, text: str) -> None:
        if option is not None and getattr(allocator, option) == value:
            return  # already in effect
        out.append({"key": f"{_KEY}.{option}" if option else None, "value": value, "text": text})
        if option is not None:
            settings[option] = value

    large = sorted(s for s in sizes if s > _LARGE)
    # roundup_power2_divisions: fewer distinct block sizes -> freed blocks are reused, within a waste budget
    if large:
        distinct = len({round_block_size(s) for s in large})
        ranges = len({s.bit_length() for s in large})
        if distinct <= 2 * ranges:
            add(None, None, f"Large allocations already repeat ({distinct} distinct sizes above 1 MiB in {ranges} "
                            "power-of-two ranges): rounding them would only waste memory; leave "
                            "roundup_power2_divisions unset.")
        else:
            requested = sum(large)
            for d in (2, 4, 8, 16):
                rounded = [round_block_size(s, d) for s in large]
                waste = (sum(rounded) - requested) / requested
                classes = len(set(rounded))
                if waste <= ROUND_WASTE_MAX and classes < distinct:
                    add("roundup_power2_divisions", d,
                        f"roundup_power2_divisions: {d}: the {len(large):,} allocations above 1 MiB come in "
                        f"{distinct} distinct sizes; rounding to {d} steps per power of two leaves {classes} "
                        f"(freed blocks fit more later requests) for {100 * waste:.1f}% extra bytes.")
                    break
    frag = doc["fragmentation"]
    retries = doc.get("alloc_retries") or 0
    high = frag["at_peak_allocated_pct"] >= FRAG_HIGH_PCT or retries > 0
    why = (f"{frag['at_peak_allocated_bytes'] / _GIB:.2f} GiB ({frag['at_peak_allocated_pct']:.0f}%) of reserved "
           f"memory unused at peak allocation" + (f", {retries} allocator retries" if retries else ""))
    if not high:
        add(None, None, f"Fragmentation is low: {why} (acting above {FRAG_HIGH_PCT:.0f}%); the default block "
                        "splitting is fine.")
        return out, settings
    add("expandable_segments", True,
        f"expandable_segments: true: {why}; segments that grow in place leave no differently sized segments behind.")
    if large:
        p90 = large[min(len(large) - 1, math.ceil(0.9 * len(large)) - 1)]
        split_mb = max(_MIN_SPLIT_MB, 1 << max(0, math.ceil(math.log2(p90 / _MIB))))
        above = large[bisect.bisect_right(large, split_mb * _MIB):]
        share = sum(above) / sum(large)
        if above and share >= SPLIT_BYTES_SHARE:
            add("max_split_size_mb", split_mb,
                f"max_split_size_mb: {split_mb}: 90% of the allocations above 1 MiB are at most "
                f"{p90 / _MIB:.1f} MiB; the {len(above):,} larger ones ({100 * share:.0f}% of those bytes) then keep "
                "whole cached blocks instead of being carved up by smaller requests.")
    if retries > 0:
        add("garbage_collection_threshold", GC_THRESHOLD,
            f"garbage_collection_threshold: {GC_THRESHOLD}: the allocator retried {retries} times (a failed "
            "cudaMalloc, a full cache flush, a retry); reclaiming cached blocks earlier avoids the flushes.")
    return out, settings


def format_table(doc: Mapping[str, Any]) -> str:
    """The analysis as a plain-text table."""
    def gib(v: Any) -> str:
        return "n/a" if v is None else f"{v / _GIB:,.2f} GiB"

    fr, pk = doc["fragmentation"], doc["peak"]
    lines = [f"memory analysis: {doc['device']}, {doc.get('steps') or '?'} steps, {doc['allocations']:,} allocations",
             f"  {'peak allocated':<34}{gib(pk['allocated_bytes'])}",
             f"  {'peak reserved':<34}{gib(pk['reserved_bytes'])}",
             f"  {'unused reserved at peak allocated':<34}{gib(fr['at_peak_allocated_bytes'])} "
             f"({fr['at_peak_allocated_pct']:.1f}%)",
             f"  {'max reserved - allocated':<34}{gib(fr['max_bytes'])}",
             f"  {'allocator retries / OOMs':<34}{doc.get('alloc_retries')} / {doc.get('ooms')}",
             "  allocation sizes (bin upper edge): count, bytes"]
    for row in doc["allocation_size_histogram"]:
        lines.append(f"    <= {_size(row['size_bytes']):>10} {row['count']:>10,} {_size(row['total_bytes']):>12}")
    lines.append("  suggestions:")
    for s in doc["suggestions"]:
        lines.append(f"    - {s['text']}")
    if doc["suggested_allocator"]:
        lines.append("  suggested settings: " + ", ".join(f"{k}: {v}" for k, v in doc["suggested_allocator"].items()))
    return "\n".join(lines)


def _size(v: float) -> str:
    for unit, size in (("GiB", _GIB), ("MiB", _MIB), ("KiB", 1024)):
        if v >= size:
            return f"{v / size:,.1f} {unit}"
    return f"{int(v)} B"


# --------------------------------------------------------------------------- CLI


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.memory", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="record the allocator over N training steps and suggest settings")
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="config.yaml")
    src.add_argument("--preset", help="a model preset's default config (tiny, gr00t-n1.6)")
    a.add_argument("--steps", type=int, default=5, help="recorded steps (default 5)")
    a.add_argument("--warmup", type=int, default=None,
                   help="steps before recording (default training.warmup_measure_steps)")
    a.add_argument("--out", default=".", help="directory for memory_analysis.json and the run's metrics")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    a.add_argument("--synthetic", action="store_true", help="generate a synthetic corpus when data.loongbin_dir "
                                                            "is not set")
    a.add_argument("--max-entries", type=int, default=500_000, help="allocator history ring size")
    a.add_argument("--snapshot", action="store_true",
                   help="also write memory_snapshot.pickle (for https://pytorch.org/memory_viz)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch

    if not torch.cuda.is_available():  # note: does not initialise the caching allocator
        print("workbench.memory analyze needs CUDA: torch.cuda.is_available() is False on this machine",
              file=sys.stderr)
        return 2
    from workbench.train import load_run_config, synthetic_data_dir

    try:
        cfg = load_run_config(argparse.Namespace(config=args.config, preset=args.preset, set=args.set, steps=None))
        warmup = cfg.training.warmup_measure_steps if args.warmup is None else args.warmup
        from workbench.config import config_hash, merge_overrides

        cfg = merge_overrides(cfg, {"training.max_steps": warmup + args.steps, "training.warmup_measure_steps": warmup,
                                    "training.log_every": args.steps, "hardware.device": "cuda"})
        env = apply_allocator_settings(cfg)  # before CUDA initialises
    except ConfigError as e:
        print(f"error (invalid_config): {e}", file=sys.stderr)
        return 2
    from workbench.loop import Trainer, build_model_args

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = None
    if not cfg.data.loongbin_dir:
        if not args.synthetic:
            print("data.loongbin_dir is not set: pass --synthetic", file=sys.stderr)
            return 2
        margs = build_model_args(cfg)
        data_dir = synthetic_data_dir(vocab_size=min(margs.vocab_size, 65535), seq_len=cfg.data.seq_len,
                                      min_len=cfg.data.min_len, seed=cfg.data.seed)
    trainer = Trainer(cfg, out_dir=out / "run", data_dir=data_dir)
    dev = trainer.device
    try:
        if warmup:
            trainer.run(warmup)  # allocator settling, optimizer state, first bucket shapes
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        # no stack traces: the sizes and actions are what the analysis needs, and they cost ~2 us per event
        torch.cuda.memory._record_memory_history("all", context=None, max_entries=args.max_entries)
        summary = trainer.run(warmup + args.steps)
        torch.cuda.synchronize(dev)  # note: sync before reading the allocator state
        snapshot = torch.cuda.memory._snapshot()
        stats = torch.cuda.memory_stats(dev)
        torch.cuda.memory._record_memory_history(None)
    finally:
        trainer.close()
    if args.snapshot:
        import pickle

        with open(out / "memory_snapshot.pickle", "wb") as f:
            pickle.dump(snapshot, f)
    doc = analyze_snapshot(snapshot, device=dev.index or 0, stats=stats,
                           allocator=cfg.loongforge.memory_domain.allocator, steps=args.steps)
    doc["run"] = {
        "model": cfg.model.name, "micro_batch_size": cfg.data.micro_batch_size, "seq_len": cfg.data.seq_len,
        "grad_accum_steps": summary.get("grad_accum_steps"), "warmup_steps": warmup, "config_hash": config_hash(cfg),
        "allocator_env": env or os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "throughput/real_tokens_per_s_per_gpu": summary.get("throughput/real_tokens_per_s_per_gpu"),
        "time/step_s": summary.get("time/step_s"), "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "recording": "allocator history on during the measured steps (no stacks)",
    }
    tmp = out / "memory_analysis.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / "memory_analysis.json")
    print(format_table(doc))
    print(f"wrote {out / 'memory_analysis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
