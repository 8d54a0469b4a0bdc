"""Draws the Environment section."""

from __future__ import annotations

from reports.render.figures import Figures
from reports.render.tables import missing_note, fmt_pct, html_table, fmt
from reports.sections.environment import Environment


def render_environment(s: Environment, figs: Figures) -> str:
    out = []
    if s.noise is not None:
        n = s.noise
        out.append(f'<p class="headline">Noise floor: the baseline measured {len(n.runs) or "several"} times gave '
                   f"{fmt(n.median)} real tokens/s/GPU (min {fmt(n.min)}, max {fmt(n.max)}; spread "
                   f"{fmt_pct(n.rel_spread)}, CV {fmt_pct(n.cv)}). A difference smaller than this is not a win.</p>")
    else:
        out.append(missing_note("No noise floor recorded (the baseline repeats have not run)."))
    out.append('<div class="cols"><div>')
    out.append("<h3>Study</h3>" + html_table(s.study, cls="kv left"))
    out.append("<h3>Knobs dropped for this hardware</h3>")
    out.append(html_table(s.dropped, cls="compact") if len(s.dropped) else
               missing_note("None: every knob of the space can act on this hardware."))
    out.append("</div><div>")
    out.append("<h3>Fingerprint and versions</h3>")
    out.append(html_table(s.fingerprint, cls="kv left") if len(s.fingerprint) else
               missing_note("No environment fingerprint recorded (no environment.json)."))
    if len(s.patches):
        out.append('<h3 id="model-patches">Model patches (run.prepare)</h3>')
        out.append(html_table(s.patches, cls="kv left"))
    out.append("<h3>Hardware</h3>")
    out.append(html_table(s.hardware, cls="kv left") if len(s.hardware) else missing_note("No hardware recorded."))
    out.append("</div></div>")
    return "\n".join(out)
