"""Children that a test signals: SIGINT and SIGTERM back to their default actions.

A shell's background job (``cmd &``, ``nohup``, some CI runners) starts with SIGINT ignored, and an ignored
signal stays ignored across fork and exec: Python then installs no KeyboardInterrupt handler, and the SIGINT a
test sends does nothing (the child finishes with rc 0, not 130). Every ``Popen`` of a child the test signals
passes ``preexec_fn=default_signals``; ``tests/test_background_job.py`` runs such tests as a background job.
"""

from __future__ import annotations

import signal

__all__ = ["default_signals"]


def default_signals() -> None:
    """``preexec_fn``: SIGINT and SIGTERM to their default actions in the child, whatever the parent ignores."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
