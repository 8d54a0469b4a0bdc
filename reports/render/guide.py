"""Draws the "How to read this report" section: a few lines of text, no figure."""

from __future__ import annotations

from reports.render.figures import Figures
from reports.render.tables import esc, missing_note
from reports.sections.guide import Guide


def _n(v: int | None, unit: str, unknown: str) -> str:
    return f"{v} {unit}{'' if v == 1 else 's'}" if v is not None else unknown


def _absent(path: str, present: bool, storage: str | None) -> str:
    if present:
        return ""
    if path == "study.db" and storage and not storage.startswith("sqlite"):
        return f" (this study's is at {esc(storage)})"
    return " (not there yet)"


def render_guide(s: Guide, figs: Figures) -> str:
    if not s.base:
        base = ""
    elif s.base.endswith((".yaml", ".yml")) or "/" in s.base:
        base = f" (<code>{esc(s.base)}</code>)"
    else:
        base = f" ({esc(s.base)})"
    repeats = _n(s.baseline_repeats, "time", "several times")
    window = (f"{_n(s.warmup_steps, 'warm-up step', 'warm-up steps')}, then "
              f"{_n(s.windows, 'window', 'measured windows')} of {_n(s.window_steps, 'step', 'steps')}")
    rounds = _n(s.ab_rounds, "round", "several rounds")
    who = f"the {s.candidates} best trials" if s.candidates else "the best trials"
    conf = f"{s.confidence:.0%}" if s.confidence else "95%"
    method = f" ({esc(s.method)})" if s.method else ""
    phases = ", ".join(f"<code>{p}</code>" for p in s.phases)
    files = "".join(f"<li><code>{esc(r.path)}</code> — {esc(r.what)}{_absent(r.path, r.present, s.storage)}</li>"
                    for r in s.files.itertuples())
    return "\n".join([
        missing_note(s.message) if s.message else "",
        '<div class="guide">',
        f"<p><strong>Baseline</strong> is the study's base config{base}, run {repeats} before the search "
        "(<code>baseline/</code>). The spread of those runs is the noise floor (Environment): a difference "
        "smaller than it is not a win.</p>",
        f"<p><strong>Search-time throughputs are one run of each trial</strong> ({window}; a pruned trial "
        "stopped after a window). They steer the search and rank the trials, but each carries a single run's "
        f"noise. <strong>Only the A/B validation decides the winner</strong>: {who} re-run in {rounds}, each "
        "round running the baseline and the candidate back to back under the same conditions.</p>",
        "<p><strong>Speedup</strong> is the median over the rounds of candidate ÷ baseline. Its "
        f"{conf} interval{method} holds the speedups consistent with those rounds; <strong>significant</strong> "
        "means the whole interval is above 1.0×, a gain larger than the run-to-run noise. Without the "
        "validation, a speedup is a ratio of single runs and has no interval.</p>",
        f"<p><strong>Phases</strong> split each measured step: {phases}. <code>data_wait</code> is the step "
        "waiting for the loader, <code>grad_sync</code> the gradient communication not hidden under backward; "
        "together they add up to the step time.</p>",
        f"<p><strong>Raw files</strong>, in <code>{esc(s.study_dir)}</code>:</p>",
        f'<ul class="files">{files}</ul>',
        "</div>",
    ])
