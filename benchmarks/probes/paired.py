"""What the paired-round probes share: their CSV, and the table of each variant against torch.compile.

Each probe times every variant and torch.compile once per round, in interleaved rounds, and pairs the ratios per
round (compile ms / variant ms in the same round), so drift between rounds cancels. Factored out of the probes
after they ran; their printed tables are unchanged (checked against the logs of runs AI and AJ).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def paired_lines(rows: list[dict], width: int) -> list[str]:
    """One line per variant of ``rows`` (one case; keys variant, round, median_ms, pct_of_copy_ceiling): median
    ms, median % of copy, the per-round ratio to torch.compile (median, min-max) and the rounds it was faster in."""
    comp = {r["round"]: r["median_ms"] for r in rows if r["variant"] == "torch.compile"}
    out = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        v = [r for r in rows if r["variant"] == name]
        ratios = [comp[r["round"]] / r["median_ms"] for r in v]
        out.append(f"  {name:>{width}} {statistics.median(r['median_ms'] for r in v):8.4f} ms "
                   f"{statistics.median(r['pct_of_copy_ceiling'] for r in v):6.1f}% "
                   f"{statistics.median(ratios):7.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) "
                   f"faster in {sum(x > 1 for x in ratios)}/{len(ratios)}")
    return out
