"""Checks before a study's first run: what a coordinator needs from the disk and the machine, each a one-line
``ConfigError`` (the CLI's exit 2), so a wrong path fails before baseline 0 rather than as a failed baseline with
its log (issue 40). Each check is the one the run itself would make, earlier."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loaders.format import ShardFormatError, ShardSet
from workbench.errors import ConfigError
from workbench.tune.study import StudySpec

__all__ = ["preflight"]


def preflight(spec: StudySpec) -> None:
    """The data folder, the model config and the trainer command, in that order (the output folder is made, and
    its error said, by ``Tuner.run``)."""
    src = spec.source
    cfg = spec.base_config()
    if spec.trainer is None and cfg.data.loongbin_dir:
        try:  # the reader's own check: a directory, a complete manifest, an index that matches its checksum
            with ShardSet(cfg.data.loongbin_dir):
                pass
        except (ShardFormatError, OSError) as e:
            raise ConfigError(f"{e}", key="base.data.loongbin_dir", source=src) from None
    path = cfg.model.config_path
    if spec.trainer is None and path and not Path(path).is_file():
        raise ConfigError(f"{path}: no such file (expected an HF-format config.json)", key="model",
                          source=src)
    if spec.trainer is not None:
        prog, cwd = spec.trainer.command[0], Path(spec.trainer.cwd or ".")
        if not cwd.is_dir():
            raise ConfigError(f"{cwd}: not a directory", key="trainer.cwd", source=src)
        # a program with a slash is a path (relative to cwd); a bare name is looked up on PATH, as exec does
        found = (cwd / prog).is_file() and os.access(cwd / prog, os.X_OK) if "/" in prog else shutil.which(prog)
        if not found:
            raise ConfigError(f"{prog}: not found{' in ' + str(cwd) if '/' in prog else ' on PATH'} or not "
                              "executable", key="trainer.command", source=src)
    # the output folder is checked next, where Tuner.run makes the study folder (its OSError is one line, exit 2)
