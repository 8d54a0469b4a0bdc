"""The study's one result (workbench.tune.result): verdicts, the best candidate and why it lost, the baseline
figure the speedup was measured against, the provenance built from it, and where the data came from."""

from __future__ import annotations

import json

import pytest

from workbench.config import Config, Provenance, merge_overrides
from workbench.tune.result import build_result, data_source, provenance_fields, result_headline, result_lines
from workbench.tune.stats import sequential_confidence, speedup_interval

BASE = {"micro_batch_size": 4, "num_workers": 1, "bucket_width": 64}


def _cand(trial, params, runs, base_runs, **kw):
    ratios = [r / b for r, b in zip(runs, base_runs)]
    iv = speedup_interval(ratios, kw.pop("confidence", 0.95))
    return {"trial": trial, "params": params, "search_value": kw.pop("search", 999.0), "runs": runs,
            "baseline_runs": base_runs, "ratios": ratios, "speedup_median": iv.median, "ci_low": iv.low,
            "ci_high": iv.high, "significant": iv.significant, "failures": [], **kw}


def _result(cands, winner=None, **kw):
    validation = {"candidates": cands, "winner": {"trial": winner}, "ab_rounds": 6, "ab_min_rounds": 3,
                  "confidence": 0.99, "overall_confidence": 0.95, "looks": 4, "method": "t-interval on log ratios"}
    return build_result(validation, study="s", base_values=BASE, baseline_repeats=kw.pop("repeats", [100, 90, 110]),
                        searched=list(BASE), budget={"trials": 10, "trials_run": 10}, data={"source": "synthetic"},
                        commit="abc123")


def test_a_winner_and_its_figures():
    win = _cand(3, {"micro_batch_size": 8, "num_workers": 1}, [150, 152, 149], [100, 101, 99],
                stopped="interval excludes 1.0")
    lose = _cand(5, {"bucket_width": 32}, [101, 99, 102], [100, 100, 100])
    r = _result([win, lose], winner=3)
    assert r["verdict"] == "winner" and r["exported"]["trial"] == 3 and r["best"]["trial"] == 3
    assert r["exported"]["changed"] == {"micro_batch_size": {"base": 4, "value": 8}}  # num_workers unchanged
    assert r["exported"]["tokens_per_s"] == 150 and r["baseline"]["tokens_per_s"] == 100
    assert r["baseline"]["runs"] == 3 and r["best"]["stopped"] == "interval excludes 1.0"
    assert r["noise"]["median"] == 100 and r["noise"]["n"] == 3  # the repeats, kept apart from the baseline figure
    assert "why_lost" not in r["best"] and "includes 1.0" in r["candidates"][1]["why_lost"]
    prov = Provenance(**provenance_fields(r))
    assert (prov.trial, prov.speedup, prov.ab_pairs, prov.significant) == (3, r["best"]["speedup"], 3, True)
    assert prov.speedup_ci == [r["best"]["ci_low"], r["best"]["ci_high"]] and prov.best_candidate is None
    assert prov.searched_knobs == list(BASE) and prov.commit == "abc123" and prov.verdict == "winner"
    head = result_headline(r)
    assert head.startswith("winner: trial #3 at 1.5") and "micro_batch_size 4 -> 8" in head
    assert "over 3 A/B pairs" in head and result_lines(r)[0] == head


def test_no_significant_gain_keeps_the_best_candidate_and_why():
    near = _cand(6, {"bucket_width": 128}, [103, 95, 108], [100, 100, 100], search=1180.0)
    slow = _cand(8, {"num_workers": 0}, [80, 81, 79], [100, 100, 100])
    r = _result([near, slow])
    assert r["verdict"] == "no_significant_gain" and r["exported"]["trial"] is None
    assert r["best"]["trial"] == 6 and r["best"]["search_tokens_per_s"] == 1180.0  # labelled as a search figure
    assert "includes 1.0 after 3 pairs" in r["best"]["why_lost"]
    assert "below 1.0" in r["candidates"][1]["why_lost"]
    # the exported base is measured by the same runs as the baseline figure: one number, not three
    assert r["exported"]["tokens_per_s"] == r["baseline"]["tokens_per_s"] == 100
    prov = Provenance(**provenance_fields(r))
    assert prov.trial is None and prov.speedup == 1.0 and prov.speedup_ci is None and not prov.significant
    assert prov.best_candidate["trial"] == 6 and prov.best_candidate["speedup"] == r["best"]["speedup"]
    assert result_headline(r).startswith("no significant gain: the base config is exported; best candidate "
                                         "trial #6")


def test_no_candidate():
    r = _result([])
    assert r["verdict"] == "no_candidate" and r["best"] is None
    assert r["baseline"] == {"tokens_per_s": 100, "runs": 3, "source": "the baseline repeats"}
    assert Provenance(**provenance_fields(r)).tokens_per_s_per_gpu == 100
    assert "no candidate" in result_headline(r)


def test_the_sequential_interval_is_corrected_for_its_looks():
    assert sequential_confidence(4, 4) == (0.95, 1)
    conf, looks = sequential_confidence(3, 8)
    assert looks == 6 and conf == pytest.approx(1 - 0.05 / 6)
    ratios = [1.04, 1.01, 1.06, 1.02]
    plain, corrected = speedup_interval(ratios), speedup_interval(ratios, conf)
    assert corrected.low < plain.low and corrected.high > plain.high  # wider: each look pays for the others
    with pytest.raises(ValueError):
        sequential_confidence(5, 4)


def test_data_source_names_the_shards_and_their_tokenizer(tmp_path):
    assert data_source(Config()) == {"source": "synthetic"}
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "real_tokens": 1234}))
    cfg = merge_overrides(Config(), {"data.loongbin_dir": str(tmp_path)})
    assert data_source(cfg) == {"source": "shards", "path": str(tmp_path.resolve()), "tokenizer": "gpt2",
                                "real_tokens": 1234}


def _duel(ratios):
    """A head-to-head that measured b over a at these pair ratios (``pick_winner``'s ``duel``)."""
    from workbench.tune.validation import interval_fields

    def duel(a, b):
        f = interval_fields(ratios, [1.0] * len(ratios), 0.95)
        return {**f, "pairs": len(ratios)}
    return duel


def test_the_winner_is_the_faster_candidate_not_the_surer():
    """Issue 40's Quickstart on a quiet 2-core machine: micro-batch 8 without checkpointing (#2, 2.256x
    [1.206, 4.074]) and with it (#1, 1.940x [1.479, 2.437]); the tighter interval's config was exported. Their
    intervals overlap, so the two are measured against each other and the faster one is exported."""
    from workbench.tune.validation import pick_winner

    fast = _cand(2, {"activation_checkpointing": "none"}, [2256, 1450, 3100, 2500], [1000, 1000, 1000, 1000])
    sure = _cand(1, {"activation_checkpointing": "full"}, [1940, 1750, 2150], [1000, 1000, 1000])
    assert fast["speedup_median"] > sure["speedup_median"] and sure["ci_low"] > fast["ci_low"] > 1.0
    calls = []

    def duel(a, b):
        calls.append((a["trial"], b["trial"]))
        return _duel([0.74, 0.70, 0.77])(a, b)  # #1 runs at ~0.74x of #2, interleaved

    w = pick_winner([sure, fast], duel)
    assert calls == [(2, 1)] and w["trial"] == 2 and w["speedup_median"] == fast["speedup_median"]
    assert w["duels"][0]["faster"] == 2 and w["duels"][0]["told_apart"] and "head-to-head" in w["decided_by"]
    # the runner-up that drew the higher median from its own pairs, but is slower head-to-head, does not win
    assert pick_winner([sure, fast], _duel([1.30, 1.36, 1.28]))["trial"] == 1
    # cannot be told apart within the cap: the faster median, and it says so
    w = pick_winner([sure, fast], _duel([1.10, 0.93, 1.04, 0.99]))
    assert w["trial"] == 1 and not w["duels"][0]["told_apart"] and "could not be told apart" in w["decided_by"]
    assert pick_winner([sure, fast], _duel([0.96, 1.05, 0.97, 0.99]))["trial"] == 2
    assert pick_winner([_cand(5, {}, [101, 99, 102], [100, 100, 100])])["trial"] is None


def test_disjoint_intervals_need_no_head_to_head():
    from workbench.tune.validation import pick_winner

    slow = _cand(1, {}, [120, 121, 119], [100, 100, 100])
    quick = _cand(2, {}, [200, 202, 199], [100, 100, 100])

    def no_duel(a, b):
        raise AssertionError("intervals apart need no head-to-head")
    w = pick_winner([slow, quick], no_duel)
    assert w["trial"] == 2 and w["duels"] == [] and w["decided_by"] == "its interval lies above the others'"
    assert pick_winner([quick], no_duel)["decided_by"] == "the only significant candidate"


def test_the_result_says_how_the_winner_was_chosen():
    from workbench.tune.validation import pick_winner

    fast = _cand(2, {"micro_batch_size": 8}, [2256, 1450, 3100, 2500], [1000, 1000, 1000, 1000])
    sure = _cand(1, {"micro_batch_size": 2}, [1940, 1750, 2150], [1000, 1000, 1000])
    winner = pick_winner([sure, fast], _duel([0.74, 0.70, 0.77]))
    validation = {"candidates": [sure, fast], "winner": winner, "ab_rounds": 6, "ab_min_rounds": 3}
    r = build_result(validation, study="s", base_values=BASE, baseline_repeats=[100, 90, 110], searched=list(BASE),
                     budget={"trials": 10, "trials_run": 10}, data={"source": "synthetic"}, commit="abc")
    assert r["exported"]["trial"] == 2 and r["head_to_head"][0]["faster"] == 2
    assert r["head_to_head"][0]["pairs"] == 3 and r["head_to_head"][0]["speedup_median"] == pytest.approx(0.74)
    assert any(line.startswith("  chosen: faster than #1 head-to-head") for line in result_lines(r))


def test_noise_and_pairs_needed_are_said_in_the_result():
    """Issue 40: a base spread of 95% still printed a plain headline, and A/B ratios of 4.81, 3.08 and 2.28 gave
    "no significant gain" with no hint of what to do."""
    lost = _cand(4, {"micro_batch_size": 8}, [481, 308, 228], [100, 100, 100], confidence=0.975, stopped="cap")
    validation = {"candidates": [lost], "winner": {"trial": None}, "ab_rounds": 3, "ab_min_rounds": 2}
    r = build_result(validation, study="s", base_values=BASE, baseline_repeats=[100, 195, 150], searched=list(BASE),
                     budget={"trials": 4, "trials_run": 4}, data={"source": "synthetic"}, commit="abc")
    # the repeats and the pairs' base runs: 6 runs of the base config
    assert r["noise_warning"].startswith("noisy machine: the base config's 6 runs spread 95%")
    assert r["best"]["pairs_needed"] == 4
    assert r["best"]["why_lost"].endswith("at its spread about 4 pairs would tell (raise protocol.ab_rounds), "
                                          "or quieten the machine")
    lines = result_lines(r)
    assert any(line.strip() == r["noise_warning"] for line in lines)
    assert "about 4 pairs would tell" in result_headline(r)
    quiet = _result([lost], repeats=[100, 104, 98])
    assert quiet["noise_warning"] is None and not any("noisy" in line for line in result_lines(quiet))


def test_a_candidate_the_budget_stopped_says_so():
    """A validation pair past protocol.ab_min_rounds runs only where the GPU-minute budget holds it: a candidate
    stopped there says which key makes room, not that more pairs under ab_rounds would tell."""
    lost = _cand(4, {"micro_batch_size": 8}, [130, 80], [100, 100], stopped="budget")
    validation = {"candidates": [lost], "winner": {"trial": None}, "ab_rounds": 3, "ab_min_rounds": 2}
    r = build_result(validation, study="s", base_values=BASE, baseline_repeats=[100, 101], searched=list(BASE),
                     budget={"trials": 4, "trials_run": 4}, data={"source": "synthetic"}, commit="abc")
    assert r["best"]["stopped"] == "budget" and r["best"]["pairs_needed"] is None
    assert r["best"]["why_lost"].endswith("includes 1.0 after 2 pairs; the GPU-minute budget held no more pairs "
                                          "(raise budget.gpu_minutes)")


def test_every_run_of_the_base_config_says_how_noisy_it_is():
    """gr00t-n1.6-vla-w8 on one H100: one baseline run (39,975 tok/s), whose noise floor read "spread 0.0%", and
    the eager base's runs in the A/B pairs at 33,767 and 40,125: the base config spread 16% in the study, which the
    result says, with the warning of a noisy machine."""
    cand = _cand(12, {"micro_batch_size": 64}, [90267.7, 90023.0], [33767.2, 40124.7], confidence=0.975)
    r = _result([cand], repeats=[39974.8])
    assert r["noise"]["n"] == 1 and r["noise"]["rel_spread"] == 0.0  # the repeats alone
    br = r["base_runs"]
    assert (br["n"], br["repeats"], br["paired"]) == (3, 1, 2)
    assert br["rel_spread"] == pytest.approx((40124.7 - 33767.2) / 39974.8)
    assert r["noise_warning"].startswith("noisy machine: the base config's 3 runs spread 16% (above 10%)")
    lines = result_lines(r)
    assert "  noise floor: 1 baseline run, 39,975 tok/s/gpu (one run has no spread)" in lines
    assert "  the base config in the study: 3 runs (1 before the search, 2 in A/B pairs), 33,767 to 40,125 " \
        "tok/s/gpu, spread 15.9%" in lines
    # quiet repeats and pairs: no warning, and without candidates the repeats alone
    quiet = _result([_cand(3, {"micro_batch_size": 8}, [150, 151], [100, 101])], repeats=[100, 99, 101])
    assert quiet["base_runs"]["n"] == 5 and quiet["noise_warning"] is None
    assert _result([])["base_runs"] is None
