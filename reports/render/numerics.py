"""Draws the Compile time and Numerics sections."""

from __future__ import annotations

from reports.render.figures import new_figure, Figures
from reports.render.tables import html_table, fmt
from reports.sections.numerics import CompileSection, NumericsSection
from workbench.tune.numerics import spread


def render_compile(s: CompileSection, figs: Figures) -> str:
    out = []
    cold, warm = s.cold_median_s, s.warm_median_s
    parts = []
    if cold == cold:
        parts.append(f"cold (something compiled from scratch): median {cold:.1f} s")
    if warm == warm:
        parts.append(f"warm (every graph from the study's shared cache): median {warm:.1f} s")
    out.append("<p>Compile seconds per trial, outside the measured windows. The trials of a study share one "
               "Inductor/AOTAutograd cache and one Triton cache (<code>compile-cache/</code> in the study "
               "directory)" + (": " + "; ".join(parts) if parts else "") + ".</p>")
    out.append(html_table(s.table, cls="compact", headers={"compile_s": "compile (s)", "fx_hits": "FX graph hits",
                                                        "fx_misses": "FX graph misses", "aot_hits": "AOT hits",
                                                        "aot_misses": "AOT misses"},
                          formats={c: (lambda v: fmt(v, 0) if v == v else "—") for c in
                               ("fx_hits", "fx_misses", "aot_hits", "aot_misses")}))
    return "\n".join(out)


def render_numerics(s: NumericsSection, figs: Figures) -> str:
    out = []
    if len(s.baseline_losses) > 1:
        out.append(f"<p>Run-to-run spread of the base config's median step loss over {len(s.baseline_losses)} "
                   f"baseline repeats (same seed and data): {spread(s.baseline_losses):.3%}.</p>")
    if len(s.checks):
        out.append("<p>A trial that sets a numerics knob (FP8) off its base value keeps its result only if its "
                   "measured steps' losses lie within the tolerance of the reference's on the same data, step by "
                   "step (the median over the steps of each step's distance to the nearest reference run): the "
                   "baseline repeats, or the trial's twin (the same config with the numerics knobs at their base "
                   "values). The median passes over a one-step loss spike, which early training has in any "
                   "precision; a check that fails against one reference run is made again after a second. The "
                   "tolerance is the protocol's, or twice the baseline repeats' spread where that is larger.</p>")
        out.append(html_table(s.checks, cls="compact", headers={"reference_loss": "reference loss",
                                                             "rel_diff": "difference", "tolerance": "tolerance",
                                                             "runs": "reference runs"},
                              formats={"rel_diff": lambda v: f"{v:.2%}", "tolerance": lambda v: f"{v:.2%}",
                                       "loss": lambda v: fmt(v, 5), "reference_loss": lambda v: fmt(v, 5),
                                       "runs": lambda v: fmt(v, 0) if v == v else "—"}))
    if s.reruns:
        out.append(f"<p>Trial(s) {', '.join(map(str, s.reruns))} failed against the reference's one run, which then "
                   "ran once more on the same data; the check was made again against the nearest of its runs, and "
                   "later checks on those data use both.</p>")
    if s.skipped:
        out.append(f"<p>Trial(s) {', '.join(map(str, s.skipped))} changed a numerics knob but ran no faster than "
                   "the baseline median: validation passes over them, so their loss was not checked and no twin "
                   "ran for them.</p>")
    if s.curves is not None and len(s.curves):
        curves = s.curves

        def draw():
            fig = new_figure(7.5, 2.8)
            ax = fig.add_subplot(1, 1, 1)
            for name, g in curves.groupby("variant", sort=False):
                ax.plot(g["step"], g["loss"], lw=1.0, label=str(name))
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("training loss")
            ax.legend(loc="upper right", fontsize=8, frameon=False)
            return fig

        out.append(figs.svg(draw, caption="Convergence check: the same model, seed and data with and without the "
                                          "numerics knob (convergence.csv in the study directory)."))
        if s.curve_tail is not None:
            out.append(html_table(s.curve_tail, cls="compact", headers={"mean_loss": "mean loss, last 50 steps",
                                                                      "rel_diff": "vs the first"},
                                  formats={"rel_diff": lambda v: f"{v:+.3%}", "mean_loss": lambda v: fmt(v, 5)}))
    return "\n".join(out)
