"""The tests that signal their children pass when the suite runs as a background job (issue 40: ``bash
scripts/test.sh &`` and ``nohup`` gave 2 failures): pytest started with SIGINT and SIGTERM ignored, as a
non-interactive shell starts ``cmd &``, runs a fast test of each kind that sends them (``_signals``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` does in a non-interactive shell
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_signal_tests_pass_as_a_background_job(tmp_path):
    tests = ["tests/loaders/test_preprocess.py::test_interrupt_cleans_up",  # SIGINT -> 130 and SIGTERM -> 143
             "tests/train/test_train.py::test_signals_and_a_checkpoint_that_would_run_code"]  # SIGTERM -> 130
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300, preexec_fn=_ignored)
    assert p.returncode == 0 and "3 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
