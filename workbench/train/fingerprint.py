"""Environment fingerprint: what a measured throughput depends on besides the config.

``fingerprint()`` returns a flat ``{name: str}`` (the type of the exported
config's ``provenance.fingerprint``): GPU name and count, NVIDIA driver, CUDA,
cuDNN, NCCL, torch, Triton, Python, platform, CPU model, core count, hostname.
A key whose source is missing (no GPU, no Triton) is left out rather than
guessed. Nothing here initialises CUDA beyond what ``torch.cuda.get_device_name``
needs. ``versions()`` is the part a benchmark's results CSV carries in its columns.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys

__all__ = ["fingerprint", "source_commit", "versions"]


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[0] if lines else None


_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def source_commit(root: str = _SOURCE_ROOT) -> str | None:
    """The git revision of the workbench's source tree (short hash, ``-dirty`` with uncommitted changes to
    tracked files); None outside a git checkout or without git."""
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        rev = subprocess.run([exe, "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             timeout=20, check=True).stdout.strip()
        dirty = subprocess.run([exe, "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}-dirty" if dirty else rev or None


def fingerprint() -> dict[str, str]:
    """The environment of this process, as strings (see the module docstring)."""
    fp: dict[str, str] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": str(os.cpu_count() or 0),
    }
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        fp["cpu_affinity_count"] = str(len(affinity(0)))
    cpu = _cpu_model()
    if cpu:
        fp["cpu_model"] = cpu
    commit = source_commit()
    if commit:
        fp["workbench_commit"] = commit
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if torch is not None:
        fp["torch"] = torch.__version__
        fp["torch_num_threads"] = str(torch.get_num_threads())
        if torch.version.cuda:
            fp["cuda"] = str(torch.version.cuda)
        if getattr(torch.version, "hip", None):
            fp["hip"] = str(torch.version.hip)
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            fp["gpu_count"] = str(n)
            fp["gpu"] = torch.cuda.get_device_name(0)
            try:
                fp["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            except Exception:  # noqa: BLE001 - a build without NCCL
                pass
            if torch.backends.cudnn.is_available():
                fp["cudnn"] = str(torch.backends.cudnn.version())
    driver = _nvidia_driver()
    if driver:
        fp["nvidia_driver"] = driver
    try:
        import triton  # type: ignore[import-not-found]

        fp["triton"] = str(triton.__version__)
    except Exception:  # noqa: BLE001 - not installed, or broken on this platform
        pass
    for mod in ("optuna", "numpy"):
        m = sys.modules.get(mod)
        if m is None:
            try:
                m = __import__(mod)
            except ImportError:
                continue
        fp[mod] = str(getattr(m, "__version__", "?"))
    return fp


def versions(keys: tuple[str, ...] = ("gpu", "torch", "triton", "cuda")) -> dict[str, str]:
    """The fingerprint's ``keys`` for the columns of a benchmark's results CSV: ``gpu`` is "cpu" without a
    GPU, a missing version is ""."""
    fp = fingerprint()
    fp.setdefault("gpu", "cpu")
    return {k: fp.get(k, "") for k in keys}
