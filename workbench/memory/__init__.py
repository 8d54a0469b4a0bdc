"""The memory tool: ``python -m workbench.memory analyze|lifetimes|fit`` (``__main__``), the analysis of an allocator
snapshot (``analysis``), the gradient lifetimes of a model's backward (``lifetimes``) and the largest micro-batch
that fits (``fit``); the last two are imported as ``workbench.memory.lifetimes`` and ``workbench.memory.fit``."""

from __future__ import annotations

from workbench.memory.analysis import (FRAG_HIGH_PCT, GC_THRESHOLD, ROUND_WASTE_MAX, SPLIT_BYTES_SHARE,
                                       analyze_snapshot, format_table, round_block_size, suggest_allocator)

__all__ = ["FRAG_HIGH_PCT", "GC_THRESHOLD", "ROUND_WASTE_MAX", "SPLIT_BYTES_SHARE", "analyze_snapshot",
           "format_table", "round_block_size", "suggest_allocator"]
