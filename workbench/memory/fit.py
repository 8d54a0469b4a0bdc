"""The largest micro-batch that fits, under the config's allocator settings and under the ones the memory analysis
suggests (``python -m workbench.memory fit``; docs/memory.md).

Each probe is a training run of its own process (``python -m workbench.train``, ``--steps`` steps at one
micro-batch, the global batch equal to it so nothing accumulates), so no probe inherits another's cached or
fragmented memory; it fits when it exits 0 and fails to fit when it exits with the ``oom`` code. Any other failure
stops the search: it says nothing about memory. The search doubles from the config's micro-batch until a probe
does not fit (or halves until one does), then bisects between the two on multiples of ``--multiple``.

With ``--suggest`` the search runs twice: under the config's settings, then ``workbench.memory analyze`` records
the allocator at the largest micro-batch found (where fragmentation decides what fits) and the second search runs
under its ``suggested_allocator``, starting from the first one's answer. ``fit.json`` holds every probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.files import write_json
from workbench.vocab import EXIT_CODES, MAX_ALLOCATED_GIB, MAX_RESERVED_GIB, REAL_TOKENS_PER_S, STEP_S

__all__ = ["ProbeError", "largest_fitting", "probe_command", "run_fit"]

_ALLOC_KEY = "loongforge.memory_domain.allocator"


class ProbeError(RuntimeError):
    """A probe failed for a reason other than memory (its log says which)."""


def largest_fitting(fits: Callable[[int], bool], *, start: int, multiple: int = 1, limit: int = 4096) -> int:
    """The largest multiple of ``multiple`` (at most ``limit``) for which ``fits`` holds, 0 when none does.

    ``fits`` must be monotone (true up to some size, false above it); it is called about 2 log2(answer/start)
    times, never twice for one size.
    """
    if start < 1 or multiple < 1:
        raise ValueError(f"start and multiple must be at least 1 (got start={start}, multiple={multiple})")
    known: dict[int, bool] = {}

    def test(m: int) -> bool:
        if m not in known:
            known[m] = fits(m)
        return known[m]

    lo, hi = 0, None  # lo fits (0: nothing known to fit), hi does not
    m = min(start, limit)
    if test(m):
        lo = m
        while hi is None:
            if lo >= limit:
                return lo
            m = min(2 * lo, limit)
            if test(m):
                lo = m
            else:
                hi = m
    else:
        hi = m
        while lo == 0 and hi > 1:
            m = hi // 2
            if test(m):
                lo = m
            else:
                hi = m
        if lo == 0:
            return 0
    # bisect on multiples of `multiple` in (lo, hi)
    while True:
        a = -(-(lo + 1) // multiple) * multiple  # the smallest multiple above lo
        b = ((hi - 1) // multiple) * multiple  # the largest multiple below hi
        if a > b:
            return lo
        m = ((a + b) // 2 // multiple) * multiple
        m = max(m, a)
        if test(m):
            lo = m
        else:
            hi = m


def probe_command(source: Sequence[str], micro_batch: int, *, steps: int, allocator: Mapping[str, Any],
                  sets: Sequence[str], out: Path) -> list[str]:
    """The ``workbench.train`` command of one probe: ``source`` is ``["--config", path]`` or
    ``["--preset", name]``; ``allocator`` maps option -> value on top of the config's."""
    cmd = [sys.executable, "-m", "workbench.train", *source, "--synthetic", "-q", "--no-prometheus",
           "--steps", str(steps), "--out", str(out), "--summary", str(out / "summary.json")]
    for s in [*sets, f"data.micro_batch_size={micro_batch}", f"training.global_batch_size={micro_batch}",
              "training.warmup_measure_steps=1", f"training.log_every={max(1, steps - 1)}",
              "metrics.profile_steps=0", "metrics.profile_after_measure=false", "training.checkpoint_every=0",
              *(f"{_ALLOC_KEY}.{k}={json.dumps(v)}" for k, v in allocator.items())]:
        cmd += ["--set", s]
    return cmd


def _search(source: Sequence[str], *, start: int, multiple: int, limit: int, steps: int, timeout: float,
            allocator: Mapping[str, Any], sets: Sequence[str], out: Path, label: str,
            env: Mapping[str, str], record: dict[str, Any], save: Callable[[], None]) -> dict[str, Any]:
    """Fills ``record`` (allocator, probes, then largest_micro_batch) and calls ``save`` after every probe."""
    probes: list[dict[str, Any]] = []
    record.update({"allocator": dict(allocator), "largest_micro_batch": None, "probes": probes})

    def fits(m: int) -> bool:
        d = out / f"{label}-mb{m}"
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(d / "log.txt", "w") as log:
            try:
                rc = subprocess.run(probe_command(source, m, steps=steps, allocator=allocator, sets=sets, out=d),
                                    env=dict(env), stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = None
        row: dict[str, Any] = {"micro_batch": m, "returncode": rc, "wall_s": round(time.monotonic() - t0, 1)}
        if rc == 0:
            s = json.loads((d / "summary.json").read_text())
            row.update({k: s.get(k) for k in (MAX_ALLOCATED_GIB, MAX_RESERVED_GIB,
                                              REAL_TOKENS_PER_S,
                                              "throughput/samples_per_s_per_gpu", STEP_S)})
        probes.append(row)
        save()
        print(f"  {label}: micro-batch {m}: "
              + ("fits" if rc == 0 else "out of memory" if rc == EXIT_CODES["oom"] else f"failed ({rc})"),
              flush=True)
        if rc not in (0, EXIT_CODES["oom"]):
            raise ProbeError(f"the probe at micro-batch {m} failed with exit code {rc} (not out of memory): "
                             f"see {d / 'log.txt'}")
        return rc == 0

    record["largest_micro_batch"] = largest_fitting(fits, start=start, multiple=multiple, limit=limit)
    save()
    return record


def run_fit(source: Sequence[str], *, start: int, multiple: int = 8, limit: int = 4096, steps: int = 3,
            timeout: float = 600, sets: Sequence[str] = (), suggest: bool = False, out: Path,
            env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The search (and with ``suggest`` the analysis and the second search); returns ``fit.json``, which is
    rewritten after every probe (a search cut short keeps its probes; ``complete`` says whether it ended)."""
    env = dict(os.environ if env is None else env)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"source": list(source), "sets": list(sets), "steps": steps, "multiple": multiple,
                           "limit": limit, "complete": False}

    def save() -> None:
        write_json(out / "fit.json", doc, indent=1)

    doc["config"] = base = {}
    _search(source, start=start, multiple=multiple, limit=limit, steps=steps, timeout=timeout, allocator={},
            sets=sets, out=out, label="config", env=env, record=base, save=save)
    if suggest and base["largest_micro_batch"]:
        m0 = base["largest_micro_batch"]
        a_dir = out / f"analyze-mb{m0}"
        cmd = [sys.executable, "-m", "workbench.memory", "analyze", *source, "--synthetic", "--steps", "2",
               "--warmup", "1", "--out", str(a_dir),
               *(x for s in [*sets, f"data.micro_batch_size={m0}", f"training.global_batch_size={m0}"]
                 for x in ("--set", s))]
        with open(out / f"analyze-mb{m0}.log", "w") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        if rc != 0:
            raise ProbeError(f"workbench.memory analyze at micro-batch {m0} failed with exit code {rc}: "
                             f"see {out / f'analyze-mb{m0}.log'}")
        analysis = json.loads((a_dir / "memory_analysis.json").read_text())
        settings = analysis.get("suggested_allocator") or {}
        doc["analysis"] = {"micro_batch": m0, "path": str(a_dir / "memory_analysis.json"),
                           "suggestions": [s["text"] for s in analysis.get("suggestions", [])],
                           "suggested_allocator": settings}
        save()
        if settings:
            doc["suggested"] = tuned = {}
            _search(source, start=m0, multiple=multiple, limit=limit, steps=steps, timeout=timeout,
                    allocator=settings, sets=sets, out=out, label="suggested", env=env, record=tuned, save=save)
            doc["ratio"] = tuned["largest_micro_batch"] / m0
    doc["complete"] = True
    save()
    return doc
