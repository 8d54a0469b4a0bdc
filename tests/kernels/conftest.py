"""Fixtures of the kernel tests: a fresh launch configuration and a seeded generator per test.

Test modules here import their helpers from ``_kernel_testing`` (this folder is on sys.path under pytest's default
import mode). No ``__init__.py`` here: it would make this folder a package named ``kernels`` and shadow the real
one, so the test files' names must stay unique across tests/.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from _kernel_testing import DEVICE  # first: sets TRITON_INTERPRET before anything imports kernels

import kernels


@pytest.fixture(autouse=True)
def _fresh_launch_config():
    kernels.reset()
    yield
    kernels.reset()


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded by the test id: fresh inputs per test, the same on every run."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(request.node.nodeid.encode()))
