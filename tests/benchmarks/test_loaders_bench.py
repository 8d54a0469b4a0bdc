"""benchmarks/loaders_bench.py runs end to end on a small corpus: every reader delivers the same real tokens (the
same records through io_uring, the thread pool and a plain memmap), each at a positive rate. It had stopped
importing once (a helper of loaders renamed under it), which only a run of the script finds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_each_reader_delivers_the_same_tokens(tmp_path):
    r = subprocess.run([sys.executable, "benchmarks/loaders_bench.py", "--tokens", "200000", "--micro-batch", "4",
                        "--seq-len", "256", "--depths", "8", "--threads", "2", "--workers", "1", "--repeats", "1",
                        "--cache-dir", str(tmp_path), "--json"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    variants = json.loads(r.stdout)["variants"]
    assert {"threadpool t2", "memmap"} <= set(variants)
    assert len({v["real_tokens"] for v in variants.values()}) == 1
    assert all(v["tokens_per_s"] > 0 and v["batches"] > 0 for v in variants.values())
