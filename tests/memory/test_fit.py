"""``python -m workbench.memory fit`` (workbench/memory/fit.py): the search for the largest micro-batch that fits,
the probe runs it makes, and how it stops on a failure that is not memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.memory.fit import ProbeError, largest_fitting, probe_command, run_fit
from workbench.vocab import REAL_TOKENS_PER_S


@pytest.mark.parametrize("cap,start,multiple,limit,expect", [
    (200, 16, 8, 4096, 200),    # doubles 16..256, then bisects to 200
    (203, 16, 8, 4096, 200),    # the largest multiple of 8 below the cap
    (12, 16, 4, 4096, 12),      # halves below the start first
    (5, 64, 1, 4096, 5),
    (0, 8, 1, 4096, 0),         # nothing fits
    (10_000, 16, 8, 1000, 1000),  # stops at the limit even when it fits
    (16, 16, 8, 4096, 16),
])
def test_largest_fitting_finds_the_cap_without_repeating_a_probe(cap, start, multiple, limit, expect):
    seen: list[int] = []

    def fits(m: int) -> bool:
        assert m not in seen, f"probed {m} twice"
        seen.append(m)
        return m <= cap

    assert largest_fitting(fits, start=start, multiple=multiple, limit=limit) == expect
    assert len(seen) <= 2 * 10 + 2  # logarithmic, not a scan
    assert all(m <= limit for m in seen)


def test_largest_fitting_refuses_a_zero_start():
    with pytest.raises(ValueError, match="start"):
        largest_fitting(lambda m: True, start=0)


def test_a_probe_runs_one_micro_batch_without_accumulation_under_the_given_allocator(tmp_path):
    cmd = probe_command(["--preset", "tiny"], 48, steps=3, allocator={"expandable_segments": True},
                        sets=["training.dtype=fp32"], out=tmp_path)
    sets = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--set"]
    assert cmd[1:3] == ["-m", "workbench.train"] and cmd[cmd.index("--steps") + 1] == "3"
    assert "training.dtype=fp32" in sets
    assert {"data.micro_batch_size=48", "training.global_batch_size=48", "metrics.profile_steps=0",
            "metrics.profile_after_measure=false",  # (a config that profiles after its measurement is valid still)
            "loongforge.memory_domain.allocator.expandable_segments=true"} <= set(sets)


SMALL = ["data.seq_len=128", "hardware.device=cpu", "training.dtype=fp32", "data.num_workers=0"]


def test_fit_on_the_cpu_probes_real_runs_up_to_the_limit(tmp_path, subprocess_env):
    """A CPU never runs out of memory: every probe fits, so the search stops at --limit, each probe a real run."""
    env = {**subprocess_env, "LOONGFORGE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "workbench.memory", "fit", "--preset", "tiny", "--start", "2",
                        "--limit", "4", "--multiple", "2", "--steps", "2", "--out", str(tmp_path / "fit"),
                        *(x for s in SMALL for x in ("--set", s))],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert doc["config"]["largest_micro_batch"] == 4 and doc["complete"] is True
    probes = doc["config"]["probes"]
    assert [p["micro_batch"] for p in probes] == [2, 4] and all(p["returncode"] == 0 for p in probes)
    assert all(p[REAL_TOKENS_PER_S] > 0 for p in probes)
    assert "largest micro-batch that fits: 4" in r.stdout


def test_a_probe_that_fails_for_another_reason_stops_the_search(tmp_path, subprocess_env):
    with pytest.raises(ProbeError, match=r"micro-batch 2 failed with exit code 2 \(not out of memory\)"):
        run_fit(["--preset", "tiny"], start=2, limit=4, multiple=2, steps=2, out=tmp_path,
                sets=[*SMALL, "training.learning_rate=-1"], env=subprocess_env)
    assert "learning_rate" in (tmp_path / "config-mb2" / "log.txt").read_text()
    doc = json.loads((tmp_path / "fit.json").read_text())  # the probes so far are kept
    assert doc["complete"] is False and doc["config"]["probes"][0]["returncode"] == 2
