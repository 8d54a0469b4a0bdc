"""What the benchmark drivers share: each measured configuration runs in its own process, with the
repository importable, passive OpenMP waiting (the same for every variant), its output in a log file, and a
time limit that ends that process only, recorded as returncode 124, so one slow run never loses the others'
results."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """This process's environment, plus the repository on PYTHONPATH and OMP_WAIT_POLICY=PASSIVE unless set."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def run_logged(cmd: list[str], log_path: Path, *, env: dict[str, str], timeout: float, who: str) -> int:
    """Run ``cmd`` from the repository root, stdout and stderr to ``log_path``; its returncode, or 124 when it
    ran over ``timeout`` seconds and was killed (a line in the log, from ``who``, says so)."""
    with open(log_path, "w") as log:
        try:
            return subprocess.run(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\n{who}: killed after --timeout {timeout} s\n")
            return 124


def commit() -> str:
    """The checkout's short commit hash, for the results' ``commit`` column ("unknown" outside git), with
    ``+dirty`` when tracked files differ from it: the tree that ran is then not that commit."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
