"""Draws the Kernels section."""

from __future__ import annotations

from reports.render.figures import new_figure, Figures
from reports.render.tables import esc, missing_note, html_table
from reports.sections.kernels import Kernels, sweep_by_config


def render_kernels(s: Kernels, figs: Figures) -> str:
    out = []
    if s.message:
        out.append(missing_note(s.message))
    if len(s.launch):
        out.append(html_table(s.launch, cls="compact",
                              headers={"measured_ms": "measured (ms)", "best_in_sweep_ms": "fastest in sweep (ms)"}))
        if s.sweep_source:
            out.append(f'<p class="note">Times from <code>{esc(s.sweep_source)}</code> '
                       f"({len(s.sweep)} rows).</p>")
    sweep = sweep_by_config(s)
    if sweep is not None:
        kernels = list(dict.fromkeys(sweep["kernel"]))

        def draw():
            fig = new_figure(min(3.0 * len(kernels), 12.0), 2.8)
            for i, kernel in enumerate(kernels):
                ax = fig.add_subplot(1, len(kernels), i + 1)
                ks = sweep[sweep["kernel"] == kernel].sort_values("ms").reset_index(drop=True)
                colors = ["#f28e2b" if c else "#4e79a7" for c in ks["chosen"]]
                ax.scatter(range(len(ks)), ks["ms"], s=16, color=colors, zorder=3)
                ax.set_title(kernel, fontsize=9)
                ax.set_xlabel("configuration (fastest first)", fontsize=8)
                if i == 0:
                    ax.set_ylabel("median time (ms)")
                ax.set_ylim(bottom=0)
            fig.suptitle("Launch-parameter sweep per kernel (orange: the chosen configuration)", fontsize=9)
            return fig

        out.append(figs.svg(draw))
        top = (sweep.sort_values(["kernel", "ms"]).groupby("kernel", sort=False).head(3)
               .loc[:, ["kernel", "launch", "ms", "chosen"]])
        out.append(html_table(top, cls="compact", headers={"ms": "median (ms)", "launch": "launch configuration (3 "
                                                       "fastest per kernel)"}))
    return "\n".join(out)
