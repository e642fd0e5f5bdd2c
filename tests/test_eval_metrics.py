"""pingctl.eval.metrics: hand-computed values on small fixtures, and a few properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pingctl.eval import metrics as M

NAN = float("nan")


def test_relative_error_and_summary_by_hand():
    pred = np.array([10.0, 12.0, 30.0, NAN, 5.0])
    actual = np.array([10.0, 10.0, 20.0, 10.0, -1.0])
    rel = M.relative_error(pred, actual)
    np.testing.assert_allclose(rel[:3], [0.0, 0.2, 0.5])
    assert np.isnan(rel[3]) and np.isnan(rel[4])  # no prediction; failed packet
    s = M.error_summary(pred, actual)
    assert s["n"] == 3 and s["n_unpredicted"] == 1
    assert s["median_rel_err"] == pytest.approx(0.2)
    assert s["p90_rel_err"] == pytest.approx(0.2 + 0.8 * 0.3)  # linear interpolation at rank 1.8
    assert s["mean_rel_err"] == pytest.approx(0.7 / 3)
    assert s["mae_ms"] == pytest.approx((0 + 2 + 10) / 3)
    assert s["median_abs_err_ms"] == pytest.approx(2.0)
    empty = M.error_summary(pred, actual, np.zeros(5, bool))
    assert empty["n"] == 0 and empty["median_rel_err"] is None


def test_noise_floor_is_the_error_of_the_truth():
    actual = np.array([10.0, 20.0, 40.0, -1.0])
    truth = np.array([11.0, 20.0, NAN, 30.0])
    nf = M.noise_floor(truth, actual)
    assert nf["n"] == 2 and nf["n_unpredicted"] == 1
    assert nf["median_rel_err"] == pytest.approx(0.05)


def test_slices():
    actual = np.array([5.0, 10.0, 49.9, 50.0, 150.0, 300.0, -1.0])
    b = M.rtt_bucket_masks(actual)
    assert list(b) == ["rtt<10", "rtt10-50", "rtt50-150", "rtt>=150"]
    assert [int(m.sum()) for m in b.values()] == [1, 2, 1, 2]
    ipv = np.array([4, 4, 6, 6, 4, 6, 4])
    masks = M.standard_masks(ipv, actual, {"seen_pair": [1, 0, 1, 0, 1, 0, 1]})
    assert int(masks["all"].sum()) == 7 and int(masks["v6"].sum()) == 3 and int(masks["seen_pair"].sum()) == 4
    out = M.sliced_summary(actual * 1.1, actual, masks)
    assert out["v4"]["n"] == 3 and out["rtt>=150"]["median_rel_err"] == pytest.approx(0.1)


def test_brier_and_auc_by_hand():
    p = np.array([0.1, 0.8, 0.5, 0.3])
    y = np.array([0, 1, 1, 0], bool)
    assert M.brier(p, y) == pytest.approx((0.01 + 0.04 + 0.25 + 0.09) / 4)
    # ties: positives {0.4, 0.8, 0.4}, negatives {0.1, 0.4}: 5 wins of 6 pairs (two half-ties)
    s = np.array([0.1, 0.4, 0.4, 0.8, 0.4])
    lab = np.array([0, 0, 1, 1, 1], bool)
    assert M.roc_auc(s, lab) == pytest.approx(5 / 6)
    assert M.roc_auc(np.ones(5), lab) == pytest.approx(0.5)  # all tied
    assert M.roc_auc(s, np.ones(5, bool)) is None  # one class only
    f = M.failure_summary(p, y)
    assert f["base_rate"] == 0.5 and f["brier_base"] == pytest.approx(0.25)
    assert f["brier_skill"] == pytest.approx(1 - 0.0975 / 0.25) and f["auc"] == 1.0


def test_log_score_by_hand_and_beside_the_brier_score():
    # p = 0.1, 0.8, 0.5, 0.3 for outcomes fail? no, yes, yes, no:
    # −(ln 0.9 + ln 0.8 + ln 0.5 + ln 0.7) / 4 = (0.10536 + 0.22314 + 0.69315 + 0.35667) / 4 = 0.34458
    p = np.array([0.1, 0.8, 0.5, 0.3])
    y = np.array([0, 1, 1, 0], bool)
    assert M.log_score(p, y) == pytest.approx(0.344581, abs=1e-6)
    f = M.failure_summary(p, y)
    assert f["log_score"] == pytest.approx(0.344581, abs=1e-6)
    assert f["log_score_base"] == pytest.approx(np.log(2))  # base rate 0.5: ln 2 whatever happens
    # a certain, wrong forecast costs −ln(1e-6) = 13.8 nats, not infinity; a certain right one ~0
    assert M.log_score([1.0, 0.0], [False, True]) == pytest.approx(-np.log(M.LOG_SCORE_FLOOR))
    assert M.log_score([1.0, 0.0], [True, False]) == pytest.approx(0.0, abs=1e-5)
    assert M.log_score([NAN], [True]) is None and M.log_score(p, y, mask=[1, 0, 0, 0]) == pytest.approx(-np.log(0.9))
    # proper: the true rate scores best in expectation
    rate = 0.2
    exp_score = {q: rate * -np.log(q) + (1 - rate) * -np.log(1 - q) for q in (0.1, 0.2, 0.3)}
    assert min(exp_score, key=exp_score.get) == rate
    empty = M.failure_summary([NAN], [True])
    assert empty["log_score"] is None and empty["log_score_base"] is None


def test_summary_rows_carry_median_and_mean_crps_and_both_failure_scores():
    from pingctl.eval.presentation import summary_rows

    report = {"order": ["a"], "predictors": {"a": {
        "slices": {"all": {"n": 3, "median_rel_err": 0.1}},
        "crps": {"all": M.crps_summary([1.0, 2.0, 30.0], [10.0, 10.0, 10.0])},
        "failure": M.failure_summary([0.1, 0.8, 0.5, 0.3], [0, 1, 1, 0]),
    }}}
    row = summary_rows(report)[0]
    assert row["median_crps_ms"] == 2.0 and row["crps_ms"] == pytest.approx(11.0)  # one far miss moves only the mean
    assert row["brier"] == pytest.approx(0.0975) and row["log_score"] == pytest.approx(0.344581, abs=1e-6)


def test_auc_matches_pairwise_count():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 40))
        s = rng.integers(0, 5, n).astype(float)  # many ties
        y = rng.random(n) < 0.4
        if y.all() or not y.any():
            continue
        sp, sn = s[y][:, None], s[~y][None, :]
        brute = ((sp > sn).sum() + 0.5 * (sp == sn).sum()) / (y.sum() * (~y).sum())
        assert M.roc_auc(s, y) == pytest.approx(brute)


def test_average_ranks():
    np.testing.assert_allclose(M.average_ranks([3.0, 1.0, 3.0, 2.0, 3.0]), [4.0, 1.0, 4.0, 2.0, 4.0])


def test_pit_histogram_by_hand():
    h = M.pit_histogram([0.05, 0.15, 0.15, 0.95, 1.0, NAN])
    assert h["n"] == 5
    assert h["counts"] == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]  # 1.0 lands in the last bin
    np.testing.assert_allclose(h["density"], np.array(h["counts"]) / 5 * 10)
    assert h["ks"] == pytest.approx(0.45)
    assert h["tv"] == pytest.approx(0.7)
    assert M.pit_histogram([])["ks"] is None


def test_pit_of_a_calibrated_forecast_is_uniform():
    rng = np.random.default_rng(1)
    x = rng.exponential(3.0, 20_000)
    h = M.pit_histogram(1 - np.exp(-x / 3.0))
    assert h["ks"] < 0.02 and h["tv"] < 0.03
    assert M.pit_histogram(1 - np.exp(-x / 6.0))["ks"] > 0.1  # too wide a forecast


def test_pit_ks_against_what_a_calibrated_model_shows_with_as_many_packets():
    # one packet: D = max(u, 1 - u), so P(D <= d) = 2d - 1 on [0.5, 1]
    h = M.pit_histogram([0.2])
    assert h["ks"] == pytest.approx(0.8) and h["ks_p"] == pytest.approx(0.4) and h["ks_95"] == pytest.approx(0.975)
    rng = np.random.default_rng(4)
    runs = [M.pit_histogram(rng.random(200)) for _ in range(400)]  # calibrated: uniform PITs
    inside = np.mean([r["ks"] <= r["ks_95"] for r in runs])
    assert 0.91 < inside < 0.99
    assert 0.42 < np.mean([r["ks_p"] for r in runs]) < 0.58  # p of a calibrated model: uniform
    wide = M.pit_histogram(0.5 + 0.5 * (rng.random(200) - 0.5))  # too wide a forecast, PITs bunched
    assert wide["ks"] > wide["ks_95"] and wide["ks_p"] < 1e-6
    assert M.pit_histogram([])["ks_p"] is None


def test_coverage_by_hand_dict_and_array():
    actual = np.array([10.0, 20.0, 30.0, 40.0, -1.0])
    q = {
        0.05: np.array([5.0, 5, 5, 5, 5]),
        0.25: np.array([8.0, 21, 25, 30, 8]),
        0.5: np.array([10.0, 23, 30, 35, 10]),  # ignored
        0.75: np.array([12.0, 25, 35, 39, 12]),
        0.95: np.array([15.0, 30, 35, 50, 15]),
    }
    c = M.coverage(actual, q)
    assert c["n"] == 4 and c["cov50"] == 0.5 and c["cov90"] == 1.0
    assert c["width50_ms"] == pytest.approx(np.median([4.0, 4, 10, 9]))
    arr = np.stack([q[0.05], q[0.25], q[0.75], q[0.95]], axis=1)
    assert M.coverage(actual, arr) == c
    with pytest.raises(ValueError):
        M.coverage(actual, arr[:, :3])


def test_nll_conversions():
    assert M.bits_per_token(math.log(2)) == pytest.approx(1.0)
    s = M.nll_summary(math.log(2), np.array([10, 20, 30]))
    assert s["measurements"] == 3 and s["tokens_per_measurement"] == 20
    assert s["bits_per_token"] == pytest.approx(1.0) and s["bits_per_measurement"] == pytest.approx(20.0)
    s2 = M.nll_summary(2 * math.log(2), 600, measurements=30)
    assert s2["bits_per_measurement"] == pytest.approx(40.0)
    with pytest.raises(ValueError):
        M.nll_summary(1.0, 100)


@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.integers(0, 4)), min_size=1, max_size=12))
def test_weighted_median_is_the_lower_median_of_the_repeated_values(vw):
    v = np.array([x for x, _ in vw])
    w = np.array([[k for _, k in vw], [1] * len(vw)])
    if w[0].sum() == 0:
        w[0, 0] = 1
    for row, got in zip(w, M.weighted_medians(v, w)):
        rep = np.sort(np.repeat(v, row))
        assert got == rep[(len(rep) - 1) // 2]


def test_median_difference_by_hand_and_its_interval_resamples_pairs():
    b = np.array([0.1, 0.2, 0.3, 0.4, 0.5, NAN])
    d = M.median_difference(b - 0.05, b, groups=np.arange(6), n_boot=200)
    assert d["n"] == 5 and d["groups"] == 5  # the NaN packet is left out
    assert d["diff"] == pytest.approx(-0.05) and d["ci_low"] == pytest.approx(-0.05) == d["ci_high"]
    assert d["share_a_better"] == 1.0 and d["verdict"] == "better"
    assert M.median_difference(b + 0.05, b, groups=np.arange(6), n_boot=200)["verdict"] == "worse"
    # Ten pairs with errors spread over 0..0.4, 30 packets each: packets of one pair are not
    # independent evidence, so the interval is that of resampling ten values, not 300.
    rng = np.random.default_rng(0)
    a = np.repeat(np.linspace(0.0, 0.4, 10), 30) + rng.normal(0, 0.001, 300)
    base = np.full(300, 0.2)
    by_pair = M.median_difference(a, base, np.repeat(np.arange(10), 30), n_boot=500)
    by_packet = M.median_difference(a, base, np.arange(300), n_boot=500)
    assert by_pair["ci_low"] < -0.08 and by_pair["ci_high"] > 0.08 and by_pair["verdict"] == "tie"
    assert -0.04 < by_packet["ci_low"] < 0 < by_packet["ci_high"] < 0.04
    assert M.median_difference([NAN], [0.1], [0])["diff"] is None


def test_crps_by_hand():
    """CRPS = ∫ (F(x) − 1{x ≥ y})² dx worked out on paper for a point, two samples and a
    discrete distribution, against metrics' scoringrules-backed functions."""
    # point forecasts: the absolute error; a failed packet or no forecast: NaN
    c = M.crps_point([5.0, 7.0, NAN], [8.0, -1.0, 3.0])
    assert c[0] == pytest.approx(3.0) and np.isnan(c[1]) and np.isnan(c[2])
    # samples {1, 3} at 2: F = 1/2 on [1, 3): 1·(1/2)² + 1·(1/2)² = 0.5
    # samples {10, 20, 40} at 25: 10·(1/3)² + 5·(2/3)² + 15·(1/3)² = 45/9 = 5
    values = np.array([1.0, 3.0, 10.0, 20.0, 40.0])
    c = M.crps_samples([2.0, 25.0, 25.0, 25.0], values, start=[0, 2, 2, 0], count=[2, 3, 0, 2])
    assert c[0] == pytest.approx(0.5) and c[1] == pytest.approx(5.0)
    assert np.isnan(c[2])  # an empty sample
    assert c[3] == pytest.approx(22.0 + 1.0 - 0.5 * 1.0)  # {1, 3} at 25: E|X−y| − E|X−X'|/2
    # P(0) = 0.2, P(10) = 0.5, P(20) = 0.3 at 12: 10·0.2² + 2·0.7² + 8·0.3² = 0.4 + 0.98 + 0.72
    probs = np.array([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]])
    c = M.crps_distribution([12.0, -1.0], [0.0, 10.0, 20.0], probs)
    assert c[0] == pytest.approx(2.1) and np.isnan(c[1])
    assert M.crps_distribution([12.0], [0.0, 10.0, 20.0], [probs[0]])[0] == pytest.approx(2.1)  # rows as a list
    s = M.crps_summary([3.0, 5.0, NAN, 1.0], [6.0, 10.0, 4.0, -1.0])
    assert s == {"n": 2, "mean_crps_ms": 4.0, "median_crps_ms": 4.0, "mean_rel_crps": 0.5}
    assert M.crps_summary([NAN], [1.0])["mean_crps_ms"] is None


@given(st.lists(st.floats(0.1, 500.0), min_size=1, max_size=12), st.floats(0.1, 600.0))
def test_crps_of_a_sample_is_its_equal_weight_distribution(xs, y):
    x = np.sort(np.array(xs))
    by_hand = np.mean(np.abs(x - y)) - 0.5 * np.mean(np.abs(x[:, None] - x[None, :]))
    assert M.crps_samples([y], x, [0], [len(x)])[0] == pytest.approx(by_hand, rel=1e-9, abs=1e-9)
    w = np.full((1, len(x)), 1.0 / len(x))
    assert M.crps_distribution([y], x, w)[0] == pytest.approx(by_hand, rel=1e-9, abs=1e-9)


def test_advice_names_what_to_ask_for_each_answer():
    from pingctl.eval.presentation import advice

    def row(name, err, crps=None, brier=None, log=None):
        return {"predictor": name, "median_rel_err": err, "median_crps_ms": crps, "brier": brier, "log_score": log}

    report = {"rows": [row("model", 0.3, 20.0, 0.005, 0.03), row("pair_median", 0.02, 0.9, 0.009, 0.04),
                       row("vivaldi", 0.05), {"predictor": "noise_floor", "median_rel_err": 0.001}],
              "predictors": {"model": {"info": {"steps": [299]}}},
              "comparisons": {"model": {"pair_median": {"verdict": "worse", "ci_low": 0.2, "ci_high": 0.35}}}}
    rtt, dist, fail = advice(report)
    assert rtt.startswith("RTT: use pair_median (2.0% median error); the model (step 299) has 30.0%, behind it "
                          "[+20.0, +35.0] points")
    assert "pair_median is sharpest" in dist and "0.9 ms" in dist and "20.0 ms" in dist
    assert fail.startswith("Failure: model gives the best P(failure) (Brier 0.0050")
    report["rows"][0]["median_rel_err"] = 0.01  # the model best: ask it (never the noise floor)
    assert advice(report)[0] == "RTT: ask the model (step 299): the lowest median error here (1.0%)."
    assert advice({"rows": [row("pair_median", 0.02)]}) == []
