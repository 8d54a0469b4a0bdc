"""The report's compile-time and numerics sections: cold and warm trials told apart by the cache counters, the
guard's checks and the baseline's run-to-run spread, and a convergence.csv in the study directory plotted."""

from __future__ import annotations

import optuna
import pytest
import pandas as pd
from optuna.distributions import CategoricalDistribution

from reports._load import StudyData
from reports.render import render_html
from reports.sections import compute_report
from reports.sections.numerics import compile_section, numerics_section


def _trial(number, *, compile_s, fx_hit, fx_miss, numerics=None, status="ok"):
    attrs = {"status": status, "summary": {"time/compile_s": compile_s, "compile/fx_graph_cache_hit": fx_hit,
                                           "compile/fx_graph_cache_miss": fx_miss,
                                           "compile/aot_autograd_cache_hit": fx_hit,
                                           "compile/aot_autograd_cache_miss": fx_miss,
                                           "throughput/real_tokens_per_s_per_gpu": 1000.0 + number}}
    if numerics is not None:
        attrs["numerics"] = numerics
    t = optuna.trial.create_trial(params={"fp8": "tensorwise" if numerics else "none"},
                                  distributions={"fp8": CategoricalDistribution(["none", "tensorwise"])},
                                  values=[1000.0 + number], user_attrs=attrs)
    t.number = number
    return t


def _data(tmp_path):
    check = {"passed": False, "loss": 9.3, "reference_loss": 9.0, "rel_diff": 1 / 30, "tolerance": 0.02,
             "reference": "baseline", "reference_runs": 2}
    trials = [_trial(0, compile_s=20.0, fx_hit=0, fx_miss=6), _trial(1, compile_s=3.0, fx_hit=6, fx_miss=0),
              _trial(2, compile_s=5.0, fx_hit=6, fx_miss=0, numerics=check, status="numerics")]
    return StudyData(study_dir=tmp_path, storage_url="sqlite:///none", study_name="n", trials=trials,
                     directions=["maximize"], metric_names=["throughput/real_tokens_per_s_per_gpu"],
                     study_user_attrs={"baseline_losses": [9.0, 9.009]})


def test_compile_section_tells_cold_from_warm(tmp_path):
    s = compile_section(_data(tmp_path))
    assert s.table["cache"].tolist() == ["cold", "warm", "warm"]
    assert s.cold_median_s == 20.0 and s.warm_median_s == 4.0 and s.message is None


def test_numerics_section_and_the_convergence_plot(tmp_path):
    data = _data(tmp_path)
    s = numerics_section(data)
    assert s.curves is None and s.checks["trial"].tolist() == [2] and s.checks["passed"].tolist() == [False]
    assert s.baseline_losses == [9.0, 9.009]
    steps = range(1, 101)
    pd.DataFrame({"benchmark": "convergence", "variant": ["bf16"] * 100 + ["fp8_tensorwise"] * 100,
                  "step": [*steps, *steps], "loss": [10 - i / 20 for i in steps] + [10.1 - i / 20 for i in steps]}
                 ).to_csv(tmp_path / "convergence.csv", index=False)
    s = numerics_section(data)
    assert s.curve_tail["variant"].tolist() == ["bf16", "fp8_tensorwise"]
    # the last 50 steps' means: 10 - 75.5/20 and 0.1 above it
    assert s.curve_tail["mean_loss"].tolist() == pytest.approx([10 - 75.5 / 20, 10.1 - 75.5 / 20])
    page = render_html(compute_report(data))
    numerics = page.split('<section id="numerics">', 1)[1].split("</section>", 1)[0]
    assert "<svg" in numerics and "Convergence check" in numerics
    assert "3.33%" in numerics and "2.00%" in numerics  # the failed check's difference and tolerance
    assert "(same seed and data): 0.100%" in numerics  # the baseline's run-to-run spread
    compile_html = page.split('<section id="compile">', 1)[1].split("</section>", 1)[0]
    assert "cold (something compiled from scratch): median 20.0 s" in compile_html


def test_a_check_made_again_after_a_rerun_of_the_reference_says_so(tmp_path):
    """The guard reruns the reference where a check fails against its one run: the table gives the runs each check
    was made against, and the section names the trials that ran the rerun."""
    data = _data(tmp_path)
    data.trials[2].user_attrs["rerun_wall_s"] = 25.0
    s = numerics_section(data)
    assert s.reruns == [2] and s.checks["runs"].tolist() == [2]
    numerics = render_html(compute_report(data)).split('<section id="numerics">', 1)[1].split("</section>", 1)[0]
    assert "reference runs" in numerics
    assert "Trial(s) 2 failed against the reference's one run, which then ran once more" in numerics
    del data.trials[2].user_attrs["rerun_wall_s"]
    assert numerics_section(data).reruns == []
    assert "ran once more" not in render_html(compute_report(data))


def test_fp8_trials_not_above_the_baseline_are_named_as_unchecked(tmp_path):
    """The guard runs no twin for an FP8 trial that validation would pass over; the section says which trials
    went unchecked, beside the checks or in place of the 'no numerics knob changed' note."""
    data = _data(tmp_path)
    slow = _trial(3, compile_s=4.0, fx_hit=6, fx_miss=0)
    slow.user_attrs["numerics_skipped"] = "its 1,003 tok/s/gpu is not above the baseline median 1,100"
    data.trials.append(slow)
    s = numerics_section(data)
    assert s.skipped == [3] and s.checks["trial"].tolist() == [2] and s.message is None
    numerics = render_html(compute_report(data)).split('<section id="numerics">', 1)[1].split("</section>", 1)[0]
    assert "Trial(s) 3 changed a numerics knob but ran no faster than the baseline median" in numerics
    alone = StudyData(study_dir=tmp_path, storage_url="sqlite:///none", study_name="n", trials=[slow],
                      directions=["maximize"], metric_names=["throughput/real_tokens_per_s_per_gpu"],
                      study_user_attrs={})
    s = numerics_section(alone)
    assert len(s.checks) == 0 and s.skipped == [3] and s.message is None
    assert numerics_section(StudyData(study_dir=tmp_path, storage_url="sqlite:///none", study_name="n", trials=[],
                                      directions=["maximize"], metric_names=[], study_user_attrs={})
                            ).message.startswith("No trial changed a numerics knob")
