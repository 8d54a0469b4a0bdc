"""The memory tool's analysis of an allocator snapshot: size histogram, peaks, fragmentation, retries and the
allocator settings they suggest (pure functions, testable on a CPU). docs/memory.md says what is derived and how;
``python -m workbench.memory analyze`` (``__main__``) takes the snapshot."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from workbench.config import AllocatorConfig
from workbench.train.allocator import set_options

__all__ = [
    "ALLOCATOR_OPTIONS",
    "FRAG_HIGH_PCT",
    "GC_THRESHOLD",
    "ROUND_WASTE_MAX",
    "SPLIT_BYTES_SHARE",
    "analyze_snapshot",
    "format_table",
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
        "allocator_in_effect": set_options(allocator),
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
