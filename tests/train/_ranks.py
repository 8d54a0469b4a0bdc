"""What the multi-process training tests share: waiting for their ranks with a deadline."""

from __future__ import annotations

import pytest


def join_or_fail(ctx, seconds: int, what: str) -> None:
    """Wait for the processes of ``ctx`` (torch.multiprocessing's context) for up to ``seconds``; past that, kill
    those still alive and fail the test, so a deadlock fails the run instead of hanging it."""
    for _ in range(seconds):
        if ctx.join(timeout=1):
            return
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    pytest.fail(f"{what} did not finish in {seconds} s")
