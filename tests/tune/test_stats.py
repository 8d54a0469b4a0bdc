"""Noise floor and A/B speedup intervals on known numbers."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from workbench.tune.stats import bootstrap_interval, noise_floor, pair_ratios, speedup_interval, t_ppf


def test_noise_floor_known_numbers():
    nf = noise_floor([90.0, 100.0, 110.0])
    assert (nf.n, nf.median, nf.min, nf.max) == (3, 100.0, 90.0, 110.0)
    assert nf.rel_spread == pytest.approx(0.2) and nf.runs == (90.0, 100.0, 110.0)
    assert nf.cv == pytest.approx(0.1)  # stdev 10 / mean 100
    one = noise_floor([42.0])
    assert one.rel_spread == 0.0 and one.cv == 0.0
    assert noise_floor([1.0, 3.0]).to_dict() == {"n": 2, "median": 2.0, "min": 1.0, "max": 3.0, "rel_spread": 1.0,
                                                 "cv": pytest.approx(0.7071068), "runs": [1.0, 3.0]}
    with pytest.raises(ValueError):
        noise_floor([])
    with pytest.raises(ValueError):
        noise_floor([1.0, float("nan")])


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139),
                                              (30, 2.042272)])
def test_t_quantiles_match_the_tables(df, expected):
    assert t_ppf(0.975, df) == pytest.approx(expected, abs=1e-6)
    assert t_ppf(0.025, df) == pytest.approx(-expected, abs=1e-6)


def test_interval_known_inputs():
    iv = speedup_interval([1.1, 1.2, 1.3])
    logs = [math.log(r) for r in (1.1, 1.2, 1.3)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert iv.median == pytest.approx(1.2)
    assert iv.low == pytest.approx(math.exp(mean - half), rel=1e-6)
    assert iv.high == pytest.approx(math.exp(mean + half), rel=1e-6)
    # three pairs of +10..30% spread widely: the interval reaches below 1, so not significant
    assert iv.low < 1.0 < iv.high and not iv.significant


def test_significant_and_not_significant_decisions():
    assert speedup_interval([1.30, 1.32, 1.29, 1.31]).significant  # tight, clearly above 1
    assert not speedup_interval([0.98, 1.03, 1.01, 0.99]).significant  # straddles 1
    assert not speedup_interval([0.80, 0.82, 0.81]).significant  # a slowdown
    one = speedup_interval([1.5])
    assert one.low == 0.0 and math.isinf(one.high) and not one.significant
    same = speedup_interval([1.2, 1.2, 1.2])
    assert same.low == pytest.approx(1.2) and same.high == pytest.approx(1.2) and same.significant


def test_interval_covers_the_true_ratio():
    """Simulated A/B pairs with a true 1.15x speedup and 5% log-normal noise: ~95% coverage."""
    rng = random.Random(0)
    true, trials, hits = 1.15, 400, 0
    for _ in range(trials):
        ratios = [true * math.exp(rng.gauss(0, 0.05)) for _ in range(4)]
        iv = speedup_interval(ratios)
        hits += iv.low <= true <= iv.high
    # binomial(400, 0.95): 3 sd = 13 trials
    assert 0.95 * trials - 14 <= hits <= trials


def test_pair_ratios_and_bootstrap():
    assert pair_ratios([110.0, 120.0], [100.0, 100.0]) == pytest.approx([1.1, 1.2])
    with pytest.raises(ValueError, match="unpaired"):
        pair_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        pair_ratios([0.0], [1.0])
    b = bootstrap_interval([1.1, 1.2, 1.3, 1.25, 1.15])
    assert b.low <= 1.2 <= b.high and b.method == "bootstrap-percentile"
    assert bootstrap_interval([1.1, 1.2, 1.3]) == bootstrap_interval([1.1, 1.2, 1.3])  # fixed seed


def test_noise_is_flagged_above_the_threshold_with_what_to_do():
    from workbench.tune.stats import NOISY_SPREAD, noise_warning

    assert NOISY_SPREAD == 0.10
    assert noise_warning(noise_floor([100.0, 105.0, 108.0])) is None  # 8%: an idle 2-core machine
    w = noise_warning(noise_floor([100.0, 195.0, 228.0]))  # issue 40, under load: 95%-166%
    assert w.startswith("noisy machine: the base config's 3 repeats spread 66% (above 10%)")
    assert "background jobs" in w and "protocol.window_steps" in w and "protocol.baseline_repeats" in w
    assert noise_warning(noise_floor([100.0])) is None and noise_warning(None) is None


def test_pairs_needed_at_the_observed_spread():
    from workbench.tune.stats import pairs_needed, sequential_confidence

    # issue 40: ratios 4.81, 3.08 and 2.28 gave "no significant gain" at a cap of 3 pairs, looking from 2 on
    ratios = [4.81, 3.08, 2.28]
    conf, _ = sequential_confidence(2, 3)
    assert not speedup_interval(ratios, conf).significant
    n = pairs_needed(ratios, 2)
    assert n == 4
    # at that count, with the same mean and spread of the logs, the interval would exclude 1.0
    logs = [math.log(r) for r in ratios]
    m, sd = statistics.fmean(logs), statistics.stdev(logs)
    c4, _ = sequential_confidence(2, 4)
    assert t_ppf(0.5 + c4 / 2, 3) * sd / math.sqrt(4) < m
    assert pairs_needed([1.05, 0.98, 1.03], 3) == 41  # a small gain in much noise needs many
    assert pairs_needed([0.9, 0.8, 0.95], 3) is None  # no gain to show
    assert pairs_needed([1.1, 1.1], 2) is None  # no spread to scale


def test_width_ratio_in_log_terms():
    from workbench.tune.stats import width_ratio

    assert width_ratio(1.2, 2.4, 1.5, 3.0) == pytest.approx(1.0)
    assert width_ratio(0.117, 21.264, 1.2, 2.4) == pytest.approx(math.log(21.264 / 0.117) / math.log(2))
    assert width_ratio(1.0, 2.0, 1.5, 1.5) == math.inf and width_ratio(None, 2.0, 1.0, 2.0) is None
