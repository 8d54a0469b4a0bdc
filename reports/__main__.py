"""``python -m reports STUDY_DIR [--storage URL] [--study-name NAME]``: write STUDY_DIR/report.html."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reports._build import build_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reports", description=__doc__)
    p.add_argument("study_dir", type=Path, help="the study's directory (runs/<study>/)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL (default: sqlite:///STUDY_DIR/study.db, "
                        "else tune.json's storage_url)")
    p.add_argument("--study-name", default=None, help="study name (default: tune.json's study_name)")
    args = p.parse_args(argv)
    if not args.study_dir.is_dir():
        p.error(f"{args.study_dir} is not a directory")
    out = build_report(args.study_dir, args.storage, args.study_name)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
