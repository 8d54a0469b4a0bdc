"""Re-measure a finished study's exported config against its baseline (``python -m workbench.tune verify``).

The exported config and the base config run interleaved, a fixed number of A/B pairs (no early stop, so the
estimate is not biased by stopping on a lucky pair), into ``runs/<study>/verify/<time>/``. The speedup holds
when the new median lies inside the interval the validation reported, and the new interval is no wider than
``stats.INCONCLUSIVE_WIDTH`` times the validated one: a wider one (a noisy machine) is "inconclusive", which
fails like "does not hold", since an interval that wide would hold any speedup. Each verification is appended to
``runs/<study>/verify.json``; tune.json's result is not changed by it.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.errors import TuneError
from workbench.train.fingerprint import source_commit
from workbench.tune.export import write_json
from workbench.tune.stats import INCONCLUSIVE_WIDTH, width_ratio
from workbench.tune.session import StudySession
from workbench.tune.validation import Runs, ab_pairs, interval_fields

__all__ = ["nothing_to_verify", "verifiable", "verify", "verify_lines", "verify_pairs"]


def verifiable(result: Mapping[str, Any] | None, study_name: str, study_dir: Path) -> Mapping[str, Any]:
    """A study's stored result (tune.json's, ``records.stored_result``), or TuneError: a study with no finished
    result has nothing to verify yet."""
    if result is None:
        raise TuneError(f"study {study_name!r} has no finished result in {study_dir / 'tune.json'}; "
                        f"finish it first with `python -m workbench.tune --study {study_name}`")
    return result


def verify_pairs(result: Mapping[str, Any], pairs: int | None) -> int | None:
    """The count of A/B pairs to verify ``result`` with (``--pairs``, else the validation's, at least 3); None when
    the base config was exported (nothing to re-measure); TuneError for fewer than 2."""
    if result["verdict"] != "winner":
        return None
    n = pairs if pairs is not None else max(3, int((result.get("best") or {}).get("pairs") or 0))
    if n < 2:
        raise TuneError(f"--pairs {n}: a speedup interval needs at least 2 A/B pairs")
    return n


def nothing_to_verify(result: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a study whose base config was exported (``holds`` None)."""
    return {"holds": None, "verdict": result["verdict"],
            "message": "the base config was exported: nothing to verify against it"}


def verify(session: StudySession, measurer: Runs, result: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Re-measure the exported config of ``result`` against the baseline by ``n`` A/B pairs (while the caller holds
    the coordinator lease: no other coordinator measures meanwhile); returns the record appended to verify.json."""
    spec = session.spec
    best = result.get("best") or {}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    trial = int(result["exported"]["trial"])
    session.log(f"verifying trial #{trial} ({', '.join(result['exported']['changed']) or 'no knob changed'}) "
                f"against the baseline: {n} interleaved A/B pairs")
    res = ab_pairs(session, measurer, spec.measured_base_config(),
                   {trial: spec.trial_config(result["exported"]["params"])}, session.study_dir / "verify" / stamp,
                   max_pairs=n, min_pairs=n, confidence=0.95, what="verifying", phase="verify")[trial]
    fields = interval_fields(res["runs"], res["baseline_runs"], 0.95)
    lo, hi = best.get("ci_low"), best.get("ci_high")
    median = fields["speedup_median"]
    inside = median is not None and lo is not None and hi is not None and lo <= median <= hi
    wider = width_ratio(fields["ci_low"], fields["ci_high"], lo, hi)
    # no interval (one pair, or every pair failed) is as inconclusive as a too wide one
    inconclusive = median is None or fields["ci_high"] is None or wider is None or wider > INCONCLUSIVE_WIDTH
    verdict = "inconclusive" if inconclusive else "holds" if inside else "does not hold"
    record = {
        "time": stamp, "trial": trial, "pairs": len(fields["ratios"]), "failures": res["failures"],
        **fields, "holds": verdict == "holds", "verdict": verdict, "inside": inside,
        "width_ratio": wider, "commit": source_commit(),
        "validated": {k: best.get(k) for k in ("speedup", "ci_low", "ci_high", "pairs")},
        "runs": res["runs"], "baseline_runs": res["baseline_runs"],
    }
    path = session.study_dir / "verify.json"
    try:
        history = json.loads(path.read_text())
    except (OSError, ValueError):
        history = []
    write_json(path, [*(history if isinstance(history, list) else []), record])
    return record


def verify_lines(record: Mapping[str, Any]) -> list[str]:
    """The terminal lines of one verification."""
    if record.get("holds") is None:
        return [f"nothing to verify: {record['message']}"]
    v = record["validated"]
    got = "n/a" if record["speedup_median"] is None else f"{record['speedup_median']:.3f}x"
    ci = ("[n/a]" if record["ci_low"] is None or record["ci_high"] is None
          else f"[{record['ci_low']:.3f}, {record['ci_high']:.3f}]")
    verdict = record.get("verdict") or ("holds" if record["holds"] else "does not hold")
    head = (f"verify trial #{record['trial']}: {got} {ci} over {record['pairs']} new A/B pairs; validated "
            f"{v['speedup']:.3f}x [{v['ci_low']:.3f}, {v['ci_high']:.3f}] over {v['pairs']} pairs: ")
    if verdict == "inconclusive":
        w = record.get("width_ratio")
        why = (f"its interval is {w:.1f}x as wide as the validated one (more than {INCONCLUSIVE_WIDTH:g}x)"
               if w is not None and w != float("inf") else "it has no interval to compare")
        return [head + f"inconclusive: {why}; the machine is too noisy to tell. Stop background jobs, or run "
                       "more pairs (--pairs N)"]
    return [head + f"the speedup {'holds' if verdict == 'holds' else 'does NOT hold'} (the new median "
                   f"{'is' if record.get('inside', record['holds']) else 'is not'} inside the validated interval)"]
