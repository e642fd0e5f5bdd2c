"""The combined answer (docs/eval.md, "The combined answer"): the model's distribution pooled with
a log-normal around the classical estimate, one weight per regime fitted on val by CRPS."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from statistics import NormalDist

import numpy as np
import pytest

from pingctl.errors import PingctlError, UsageError
from pingctl.eval import combine as CMB, metrics as M
from pingctl.infer import combine as CB
from pingctl.infer.queries import RttDistribution
from tests.test_eval_regimes import regimes_split  # noqa: F401 - the fixture of the eval test below

GRID = np.concatenate([[0.0], np.geomspace(0.1, 1e5, 3000)])  # sorted values, 0 first as the codec's
CODES = np.arange(len(GRID), dtype=np.uint16)


def lognormal(median: float, sigma: float, p_fail: float = 0.1) -> RttDistribution:
    """A model-like distribution on GRID: a discretised log-normal."""
    f = CB.classical_cdf(GRID, median, sigma)
    p = np.diff(f, prepend=0.0)
    return RttDistribution(p_fail, CODES, GRID, p / p.sum())


def fit(w: float, sigma: float = 0.3, classical: str | None = "hint") -> CB.RegimeFit:
    return CB.RegimeFit(classical, w, sigma, 100, {})


def test_regime_of():
    assert CB.regime_of(3, False, False) == "time"  # the pair's own packets decide, whatever the hints know
    assert CB.regime_of(0, True, True) == "pair"
    assert CB.regime_of(0, False, True) == "probe"
    assert CB.regime_of(0, True, False) == "target"
    assert CB.regime_of(0, False, False) == "probe"
    assert set(CB.CLASSICAL_OF_REGIME) == set(CB.REGIMES)
    assert CB.pair_median([10.0, -1.0, 30.0, 20.0]) == 20.0 and math.isnan(CB.pair_median([-1.0]))


@pytest.mark.parametrize("w", [0.0, 0.3, 0.75])
def test_pool_is_a_distribution_on_the_models_codes(w):
    d = lognormal(50.0, 0.1)
    p = CB.pool(d, 20.0, fit(w))
    assert p.codes is d.codes and p.values_ms is d.values_ms and p.p_fail == d.p_fail
    assert (p.probs >= 0).all() and p.probs.sum() == pytest.approx(1.0, abs=1e-12)
    c = p.cumulative
    assert (np.diff(c) >= -1e-15).all() and c[0] >= 0 and c[-1] == pytest.approx(1.0, abs=1e-12)
    # the CDF at every code is the linear pool of the two CDFs there
    expect = w * d.cumulative + (1 - w) * CB.classical_cdf(GRID, 20.0, 0.3)
    np.testing.assert_allclose(c, expect, atol=1e-12)
    p.summary()  # every read works on it


def test_weight_one_or_no_estimate_is_the_models_answer():
    d = lognormal(50.0, 0.1)
    assert CB.pool(d, 20.0, fit(1.0)) is d
    for bad in (float("nan"), 0.0, -3.0, None):
        assert CB.pool(d, bad, fit(0.4)) is d
        assert CB.classical(d, bad, fit(0.4)) is None
    assert CB.pool(d, 20.0, fit(0.4, classical=None)) is d  # a regime answers cannot combine in


def test_weight_zero_has_the_lognormals_quantiles():
    d = lognormal(50.0, 0.1)
    est, sigma = 20.0, 0.3
    c = CB.classical(d, est, fit(0.2, sigma))
    assert c.p_fail == d.p_fail
    ln = NormalDist()
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        got = c.quantile(q)
        # the smallest code whose CDF reaches q: the log-normal's CDF there is >= q, below it < q
        i = int(np.searchsorted(GRID, got))
        assert ln.cdf(math.log(got / est) / sigma) >= q - 1e-6
        assert ln.cdf(math.log(GRID[i - 1] / est) / sigma) < q + 1e-6
        assert got == pytest.approx(est * math.exp(sigma * ln.inv_cdf(q)), rel=GRID[2] / GRID[1] - 1)


def test_crps_terms_are_the_crps_of_the_pool():
    """A, C and the quadratic in w match metrics.crps_distribution of the pooled distributions."""
    pytest.importorskip("scoringrules")
    rng = np.random.default_rng(0)
    dists = [lognormal(m, s) for m, s in zip(rng.uniform(5, 200, 12), rng.uniform(0.05, 0.5, 12))]
    est = rng.uniform(5, 200, 12)
    est[3] = np.nan  # no estimate: the model's answer
    actual = rng.uniform(3, 250, 12)
    actual[5] = -1.0  # failed
    sigma = 0.25
    a, b, c = CMB.crps_terms(dists, est, sigma, actual)
    assert np.isnan(a[5]) and np.isnan(b[5]) and np.isnan(c[5])
    for w in (0.0, 0.4, 1.0):
        pooled = [CB.pool(d, e, fit(w, sigma)) for d, e in zip(dists, est)]
        want = M.crps_distribution(actual, GRID, [p.probs for p in pooled])
        got = w * w * a + 2 * w * (1 - w) * b + (1 - w) ** 2 * c
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def _val(model_off: float, classical_off: float, n: int = 60, seed: int = 1):
    """Val packets whose model answer is centred model_off times the actual RTT and whose
    estimate is classical_off times it, each with a little noise."""
    rng = np.random.default_rng(seed)
    actual = rng.uniform(10, 150, n)
    dists = [lognormal(a * model_off * math.exp(rng.normal(0, 0.02)), 0.03) for a in actual]
    est = actual * classical_off * np.exp(rng.normal(0, 0.02, n))
    return dists, est, actual


def test_fit_widens_the_spread_where_the_estimate_s_errors_have_heavy_tails():
    """Most estimates are close and a fifth are far off: the MAD spread fits the close ones and
    prices the far ones badly, so the fit picks a wider spread, with a lower CRPS on val."""
    dists, est, actual = _val(3.0, 1.0, n=80, seed=5)
    rng = np.random.default_rng(6)
    far = rng.random(80) < 0.2
    est = np.where(far, est * np.exp(rng.choice([-1.0, 1.0], 80) * rng.uniform(0.5, 1.0, 80)), est)
    mad = CMB.spread(est, actual)
    f = CMB.fit_regime(dists, est, actual, "hint")
    assert f.log_sigma > 1.2 * mad
    at_mad = CMB.pool_crps(*CMB.crps_terms(dists, est, mad, actual)).mean(axis=0)
    assert f.crps_val["combined"] < at_mad.min()


def test_fit_trusts_the_model_where_it_is_right_and_the_estimate_where_that_is():
    f = CMB.fit_regime(*_val(1.0, 2.5), "hint")
    assert f.weight >= 0.95 and f.crps_val["combined"] <= f.crps_val["model"] + 1e-9
    assert f.crps_val["classical"] > f.crps_val["model"]
    f = CMB.fit_regime(*_val(2.5, 1.0), "hint")
    assert f.weight <= 0.05 and f.crps_val["combined"] <= f.crps_val["classical"] + 1e-9
    assert f.log_sigma == pytest.approx(0.02 * 1.4826 * 0.6745, rel=0.5)  # the estimate's own noise
    assert f.n_val == 60 and f.classical == "hint"


def test_too_few_estimates_keep_the_model():
    dists, est, actual = _val(1.0, 2.5, n=20)
    est[CMB.MIN_PACKETS - 1:] = np.nan
    f = CMB.fit_regime(dists, est, actual, "hint")
    assert f.weight == 1.0 and f.crps_val["classical"] is None


def _two_kinds(good_units: int, bad_units: int, per_unit: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Pooled CRPS (packets x 1 spread x weights) of val packets in units where the model is far
    better than the estimate (A 1, C 10 ms) and units where it is a little worse (A 2.2, C 2),
    and each packet's unit."""
    good, bad = good_units * per_unit, bad_units * per_unit
    a = np.r_[np.full(good, 1.0), np.full(bad, 2.2)]
    b = np.r_[np.full(good, 3.0), np.full(bad, 2.0)]  # the cross term: at most sqrt(A C)
    c = np.r_[np.full(good, 10.0), np.full(bad, 2.0)]
    return CMB.pool_crps(a, b, c)[:, None, :], np.repeat(np.arange(good_units + bad_units), per_unit)


def test_a_weight_won_on_a_few_units_goes_back_to_zero():
    """The model is far better on 2 of 20 units and worse on the rest: the mean over packets
    prefers it, but a draw of units without those 2 does not, so val cannot vouch for any weight
    above 0. The same packets counted one by one (500 units) do vouch for it."""
    crps, units = _two_kinds(2, 18)
    assert CMB.WEIGHTS[np.argmin(crps.mean(axis=0)[0])] > 0.3  # what the mean alone would pick
    s, w, evidence = CMB.vouched(crps, units)
    assert (s, w) == (0, 0) and evidence["units"] == 20 and evidence["gain_low"] == 0.0
    assert evidence["min_crps_weight"] > 0.3
    s, w, evidence = CMB.vouched(crps, np.arange(len(units)))
    assert w > 0 and evidence["gain_low"] > 0


def test_a_gain_that_holds_in_every_unit_keeps_the_weight():
    crps, units = _two_kinds(20, 0)
    s, w, evidence = CMB.vouched(crps, units)
    assert CMB.WEIGHTS[w] >= 0.8 and evidence["gain_low"] > 5.0


def test_too_few_units_answer_classically_whatever_the_gain():
    crps, units = _two_kinds(CMB.MIN_UNITS - 1, 0)
    assert CMB.vouched(crps, units)[1] == 0
    crps, units = _two_kinds(CMB.MIN_UNITS, 0)
    assert CMB.vouched(crps, units)[1] > 0


def test_each_regime_counts_its_own_units():
    """One val record, its packets from 40 pairs but 2 destinations: the pair regime vouches for
    the model's weight, the destination regime (new destinations) cannot."""
    dists, hint, actual = _val(1.0, 2.5, n=80)
    rec = _record(dists, actual, hint=hint)
    rec["units"] = {"pair": np.arange(80) // 2, "src": np.arange(80) // 2, "dst": np.arange(80) % 2}
    fits = CMB.fit_val({"pair": rec, "target": rec}, {"pair": {"best": "embedding"}, "target": {"best": "embedding"}})
    assert fits["pair"][1].weight >= 0.9 and fits["pair"][1].crps_val["units"] == 40
    assert fits["target"][1].weight == 0.0 and fits["target"][1].crps_val["units"] == 2


def _held_out_records(n: int = 80):
    """Three held-out regimes' val records where the model is right and the estimate 2.5x off:
    40 pairs, 40 sources and 2 destinations."""
    dists, hint, actual = _val(1.0, 2.5, n=n)
    rec = _record(dists, actual, hint=hint)
    rec["units"] = {"pair": np.arange(n) // 2, "src": np.arange(n) // 2, "dst": np.arange(n) % 2}
    return {r: rec for r in ("pair", "probe", "target")}, {r: {"best": "embedding"} for r in ("pair", "probe", "target")}


def test_held_out_regimes_vouch_together_where_one_cannot_alone():
    """Each regime alone: new destinations (2 in val) cannot vouch for the model; together the
    three regimes' units (40 pairs + 40 sources + 2 destinations) do, one weight and spread
    multiple for all, each regime's units counted apart."""
    records, choice = _held_out_records()
    alone = CMB.fit_val(records, choice)
    assert alone["target"][1].weight == 0.0 and alone["pair"][1].weight >= 0.9
    together = CMB.fit_val(records, choice, together=("pair", "probe", "target"))
    weights = {r: f.weight for r, (_, f) in together.items()}
    assert set(weights.values()) == {weights["pair"]} and weights["pair"] >= 0.9
    ev = together["target"][1].crps_val
    assert ev["units"] == 82 and ev["unit"] == "dst" and ev["vouched_with"] == ["pair", "probe", "target"]
    assert ev["gain_low"] > 0


def test_a_pooled_weight_is_taken_only_where_the_pool_holds_it():
    """Where the estimate is right and the model 2.5x off in every regime, the weight fitted
    together stays 0, as each regime's alone."""
    dists, hint, actual = _val(2.5, 1.0, n=80)
    rec = _record(dists, actual, hint=hint)
    rec["units"] = {"pair": np.arange(80) // 2, "src": np.arange(80) // 2, "dst": np.arange(80) % 8}
    records = {r: rec for r in ("pair", "probe", "target")}
    choice = {r: {"best": "embedding"} for r in records}
    together = CMB.fit_val(records, choice, together=tuple(records))
    assert all(f.weight == 0.0 for _, f in together.values())


def test_weight_group_pools_the_held_out_regimes_asked_alike():
    vals = {"time": "val", "pair": "val_pair", "probe": "val_probe", "target": "val_target"}
    both = {"context_policy": "both", "context": 16}
    prompts = {"time": {"context_policy": "pair"}, "pair": both, "probe": both, "target": both}
    assert CMB.weight_group(vals, prompts, "pooled") == ("pair", "probe", "target")
    assert CMB.weight_group(vals, prompts, "own") == ()
    assert CMB.weight_group({r: "val" for r in vals}, prompts, "pooled") == ()  # no val sets of their own
    assert CMB.weight_group(vals, {**prompts, "probe": {"context_policy": "cold"}}, "pooled") == ()
    with pytest.raises(ValueError):
        CMB.weight_group(vals, prompts, "mean")


def test_pool_rel_errs_read_the_pools_median():
    """The bisection's median is the pooled distribution's own (`RttDistribution.quantile`), at
    every spread and weight; a packet without an estimate has the model's."""
    rng = np.random.default_rng(3)
    dists = [lognormal(m, s) for m, s in zip(rng.uniform(5, 200, 9), rng.uniform(0.05, 0.8, 9))]
    est, actual = rng.uniform(5, 200, 9), rng.uniform(3, 250, 9)
    est[2], actual[4] = np.nan, -1.0
    sigmas = [0.1, 0.6]
    got = CMB.pool_rel_errs(dists, est, sigmas, actual)
    assert got.shape == (9, 2, len(CMB.WEIGHTS)) and np.isnan(got[4]).all()
    for k in (0, 2, 7):
        for j, sg in enumerate(sigmas):
            for i, w in enumerate(CMB.WEIGHTS):
                med = CB.pool(dists[k], est[k], fit(float(w), sg)).quantile(0.5)
                assert got[k, j, i] == pytest.approx(abs(med - actual[k]) / actual[k], rel=1e-12)


def test_a_crps_gain_with_a_worse_median_is_not_taken():
    """A broad model around a biased centre beside a sharp, unbiased estimate: the pool gains CRPS
    from the estimate's misses, but its median drifts toward the model's, so the median check
    keeps the weight where the median is no worse."""
    crps, units = _two_kinds(20, 0)
    rel = np.tile(np.linspace(0.10, 0.30, len(CMB.WEIGHTS)), (1, 1))  # worse with every step of weight
    assert CMB.vouched(crps, units, rel_err=rel)[1] == 0
    rel[0, :5] = 0.10  # weights up to 0.2 leave the median where it was
    assert CMB.WEIGHTS[CMB.vouched(crps, units, rel_err=rel)[1]] == pytest.approx(0.2)


def _record(dists, actual, **estimates) -> dict:
    """A val record as `eval.combine.val_record` keeps it: each estimate's CRPS terms, the
    estimates and what the pool's PIT needs of the distributions."""
    return {"terms": {k: CMB.terms(dists, e, actual) for k, e in estimates.items()}, "estimates": estimates,
            "at_actual": CMB.at_actual(dists, actual)}


def test_fit_reads_val_only(tmp_path):
    """fit_and_write sees only the val records: wild test packets cannot move the file."""
    dists, hint, actual = _val(2.0, 1.0)
    rec = _record(dists, actual, pair_median=actual * 1.3, hint=hint)
    run = tmp_path / "run"
    keys = {r: tmp_path / "val" for r in CB.REGIMES}
    prompts = {r: {"context_policy": "both"} for r in CB.REGIMES}
    choice = {r: {"best": "embedding"} for r in CB.REGIMES}
    fits, info = CMB.fit_and_write({(keys["time"], "both"): rec}, keys, prompts, choice, tmp_path / "a", run, [60], 0)
    comb = CB.Combination.load(info["fitted"])
    assert comb.for_regime("time").classical == "pair_median" and comb.for_regime("pair").classical == "hint"
    assert comb.regimes["pair"].weight <= 0.05 and comb.meta["steps"] == [60]
    assert info["run_copy"]["written"] is None  # not a run directory: nothing written there
    # the same val with a test split of wild RTTs beside it: the same file
    d9, e9, a9 = _val(1.0, 40.0, seed=9)
    wild = _record(d9, a9, pair_median=e9)
    _, info2 = CMB.fit_and_write({(keys["time"], "both"): rec, (tmp_path / "test", "both"): wild}, keys, prompts,
                                 choice, tmp_path / "b", run, [60], 0)
    assert json.loads(open(info2["fitted"]).read()) == json.loads(open(info["fitted"]).read())


def test_no_hints_pools_with_the_best_in_eval_only(tmp_path):
    dists, emb, actual = _val(2.0, 1.0)
    rec = _record(dists, actual, pair_median=actual * 1.3, embedding=emb)
    keys = {r: tmp_path / "val" for r in CB.REGIMES}
    fits, info = CMB.fit_and_write({(keys["time"], "cold"): rec}, keys, {r: {"context_policy": "cold"} for r in keys},
                                   {r: {"best": "embedding"} for r in keys}, tmp_path, tmp_path, [1], 0)
    assert fits["pair"][0] == "embedding" and fits["pair"][1].weight <= 0.05
    comb = CB.Combination.load(info["fitted"])
    assert comb.regimes["pair"].classical is None and comb.for_regime("pair") is None
    assert "pair" in info["note"] and "time" not in info["note"]


def test_round_trip_and_refusals(tmp_path):
    comb = CB.Combination({"time": CB.RegimeFit("pair_median", 0.35, 0.2, 80, {"model": 3.0}),
                           "pair": CB.RegimeFit(None, 1.0, 0.0, 0, {})},
                          {"run": str(tmp_path), "steps": [5], "prompts": {"pair": {"hint": "embedding"}}})
    path = comb.write(tmp_path / CB.COMBINATION)
    back = CB.Combination.load(path)
    assert back.regimes == comb.regimes and back.meta == comb.meta and back.path == str(path)
    assert CB.mismatch(back, tmp_path, [5], {"hint": "embedding"}, "pair") is None
    assert "step(s)" in CB.mismatch(back, tmp_path, [6])
    assert "hint" in CB.mismatch(back, tmp_path, [5], {"hint": None}, "pair")
    with pytest.raises(UsageError, match="no such file"):
        CB.Combination.load(tmp_path / "missing.json")
    good = json.loads(path.read_text())
    cases = [("{not json", "not readable as JSON"), (json.dumps({**good, "kind": "other"}), "field kind"),
             (json.dumps({**good, "regimes": []}), "field regimes"),
             (json.dumps({**good, "regimes": {"pair": {**good["regimes"]["pair"], "weight": 1.5}}}),
              r"regimes\.pair\.weight"),
             (json.dumps({**good, "regimes": {"space": good["regimes"]["pair"]}}), "unknown regime"),
             (json.dumps({**good, "regimes": {"time": {**good["regimes"]["time"], "classical": "oracle"}}}),
              r"regimes\.time\.classical"),
             (json.dumps({**good, "regimes": {"time": {**good["regimes"]["time"], "n_val": "many"}}}), "n_val")]
    for i, (text, why) in enumerate(cases):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(text)
        with pytest.raises(PingctlError, match=why) as e:
            CB.Combination.load(bad)
        assert str(bad) in str(e.value)


@pytest.mark.slow
def test_eval_regimes_adds_the_combined_row(tiny_run, regimes_split, tmp_path):
    """A real `pingctl eval --regimes`: the combined row in every regime's report and the table,
    OUT/combination.json fitted on val, and the run's copy that answers read."""
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # eval records the fit in the run: not in the shared fixture
    out = tmp_path / "ev"
    r = CliRunner().invoke(app, ["eval", str(run), "--regimes", str(regimes_split), "--queries", "30",
                                 "--context", "4", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    comb = CB.Combination.load(out / CB.COMBINATION)
    assert set(comb.regimes) == set(CB.REGIMES) and comb.regimes["time"].classical == "pair_median"
    assert rep["combination"]["run_copy"]["written"] == str(run / CB.COMBINATION)
    assert CB.Combination.load(run / CB.COMBINATION).regimes == comb.regimes
    for row in rep["table"]:
        report = rep["regimes"][row["regime"]]
        assert report["order"].index("combined") == report["order"].index("model") + 2  # after model_calibrated
        e = report["predictors"]["combined"]
        assert e["info"]["weight"] == comb.regimes[row["regime"]].weight
        assert e["info"]["recalibrated"] == (comb.regimes[row["regime"]].recal is not None)
        assert row["combined_cov90_raw"] == e["info"]["cov90_before_recalibration"]
        assert row["combined_median_rel_err"] == e["slices"]["all"]["median_rel_err"]
        assert row["combined_verdict"] in ("better", "worse", "tie")
        assert "combined" in report["comparisons"] and "combined" not in (row["best_on_test"] or "")
        assert any(x["predictor"] == "combined" for x in report["rows"])
        if comb.regimes[row["regime"]].weight == 1.0 and not e["info"]["recalibrated"]:  # the model's own answer
            assert e["slices"]["all"]["median_rel_err"] == report["predictors"]["model"]["slices"]["all"][
                "median_rel_err"]


def _heavy(n: int, seed: int):
    """Packets whose estimate is close for most and far off for a fifth (heavy tails), and a
    model centred twice too high: the CRPS fit pools (almost) only the estimate, sharply."""
    rng = np.random.default_rng(seed)
    actual = rng.uniform(10, 150, n)
    far = rng.random(n) < 0.2
    est = actual * np.exp(rng.normal(0, 0.05, n) + far * rng.choice([-1.0, 1.0], n) * rng.uniform(0.3, 1.0, n))
    dists = [lognormal(a * 2.0, 0.05) for a in actual]
    return dists, est, actual


def test_pooled_pit_is_the_pools_cdf_at_the_actual_rtt():
    """The PIT the map is fitted on is what `pool(...).cdf(actual)` reads, packet by packet."""
    dists, est, actual = _heavy(40, 3)
    est[2], actual[4] = np.nan, -1.0
    actual[6] = 2e5  # above the grid: the last code
    at = CMB.at_actual(dists, actual)
    for w in (0.0, 0.3, 1.0):
        f = fit(w, 0.2)
        want = [CB.pool(d, e, f).cdf(a) if a >= 0 and e > 0 else np.nan for d, e, a in zip(dists, est, actual)]
        np.testing.assert_allclose(CMB.pooled_pit(at, est, f), want, atol=1e-9)


def test_recalibration_mends_a_too_narrow_pool_on_new_packets():
    """A pool with the estimate's robust (MAD) spread, which CRPS fits often choose, holds too
    few actual RTTs in its 90% intervals where the estimate's errors have heavy tails; the map
    fitted on val brings them near 90% on packets it never saw."""
    dists, est, actual = _heavy(400, 11)
    rec = _record(dists, actual, hint=est)
    raw = fit(0.0, CMB.spread(est, actual))
    mended = CMB.with_recalibration(raw, rec, "hint")
    assert mended.recal is not None and mended.weight == raw.weight and mended.log_sigma > raw.log_sigma
    assert mended.cov90_val["raw"] < 0.86 and mended.cov90_val["recalibrated"] == pytest.approx(0.9, abs=0.02)

    def cov90(f: CB.RegimeFit, d, e, a) -> float:
        q = np.array([CB.pool(x, y, f).quantile_values([0.05, 0.95]) for x, y in zip(d, e)])
        return float(((a >= q[:, 0]) & (a <= q[:, 1])).mean())

    d2, e2, a2 = _heavy(400, 12)
    before, after = cov90(raw, d2, e2, a2), cov90(mended, d2, e2, a2)
    assert before < 0.86 and 0.85 <= after <= 0.95


def test_recalibration_keeps_the_median_val_vouched_for():
    """Val's actual RTTs all above the estimate (a few hosts' bias): the map widens the pool's
    intervals but leaves its median at the estimate, as `vouched` checked it; a map free to
    move it (`CAL.fit` alone) would put the median at val's median PIT."""
    from pingctl.infer import calibration as CAL

    dists, est, actual = _heavy(400, 13)
    est = est / 1.3  # every estimate 30% low
    rec = _record(dists, actual, hint=est)
    raw = fit(0.0, CMB.spread(est, actual))
    mended = CMB.with_recalibration(raw, rec, "hint")
    assert mended.recal is not None
    for e in (12.0, 40.0, 300.0):
        d = lognormal(e * 2.0, 0.05)
        assert CB.pool(d, e, mended).quantile(0.5) == pytest.approx(e, rel=5e-3)  # GRID: 0.46% a code
        assert CB.pool(d, e, mended).quantile(0.95) > CB.pool(d, e, raw).quantile(0.95)
    free = CAL.fit(CMB.pooled_pit(rec["at_actual"], est, dataclasses.replace(mended, recal=None)), {})
    assert abs(free.knots[50] - 0.5) > 0.05  # the fitted map would have moved the median
    kept = CMB.median_kept(free.knots)
    assert kept[50] == 0.5 and (np.diff(kept) > 0).all() and kept[0] == 0.0 and kept[-1] == 1.0


def test_recalibrated_pool_reads_the_map():
    """The pooled-and-mapped CDF is H of the pooled one at every code, weight 1 included (the
    map was fitted on those packets' PITs); without an estimate the model answers, unmapped."""
    d = lognormal(50.0, 0.1)
    knots = CMB.CAL.fit(np.random.default_rng(0).beta(2, 2, 500), {}).knots
    for w in (0.0, 0.4, 1.0):
        raw = CB.pool(d, 20.0, fit(w))
        mapped = CB.pool(d, 20.0, dataclasses.replace(fit(w), recal=tuple(knots)))
        np.testing.assert_allclose(mapped.cumulative, np.interp(np.minimum(raw.cumulative, 1.0), knots,
                                                                CB.RECAL_LEVELS), atol=1e-12)
        assert not np.allclose(mapped.cumulative, raw.cumulative, atol=1e-3)
    assert CB.pool(d, float("nan"), dataclasses.replace(fit(0.4), recal=tuple(knots))) is d
    assert CB.pool(d, 20.0, dataclasses.replace(fit(0.4, classical=None), recal=tuple(knots))) is d


def test_recalibration_round_trips_and_bad_knots_are_refused(tmp_path):
    knots = tuple(float(x) for x in np.linspace(0, 1, len(CB.RECAL_LEVELS)) ** 1.5)
    f = CB.RegimeFit("hint", 0.1, 0.2, 50, {}, knots, {"raw": 0.7, "recalibrated": 0.9})
    path = CB.Combination({"pair": f}, {"run": "r", "steps": [1]}).write(tmp_path / "c.json")
    assert CB.Combination.load(path).regimes["pair"] == f
    good = json.loads(path.read_text())
    falls = list(knots)
    falls[40], falls[41] = falls[41], falls[40]
    for bad in ([0.5] * len(knots), list(knots[:-1]), falls, [*knots[:-1], float("nan")], "x"):
        raw = {**good, "regimes": {"pair": {**good["regimes"]["pair"], "recal_knots": bad}}}
        (tmp_path / "bad.json").write_text(json.dumps(raw))
        with pytest.raises(PingctlError, match=r"regimes\.pair\.recal_knots"):
            CB.Combination.load(tmp_path / "bad.json")


def test_the_printed_line_says_what_val_could_not_vouch_for():
    from pingctl.eval.presentation import combined_line

    row = {"regime": "target", "combined_median_rel_err": 0.36, "combined_crps_ms": 132.2, "combined_cov90": 0.91,
           "combined_cov90_raw": 0.89, "combined_weight": 0.0, "combined_estimate": "hint", "best": "embedding_refit",
           "combined_diff": 0.018, "combined_ci_low": -0.003, "combined_ci_high": 0.058, "combined_verdict": "tie",
           "combined_min_crps_weight": 0.55, "combined_units": 2, "combined_unit": "dst"}
    assert "val's mean alone: 0.55, not vouched for over 2 dsts" in combined_line([row])
    assert "val's mean alone" in combined_line([{**row, "combined_weight": 0.2, "combined_min_crps_weight": 0.7}])
    assert "val's mean" not in combined_line([{**row, "combined_min_crps_weight": 0.0}])


def test_eval_s_time_estimate_is_the_answer_s_for_each_packet(tmp_path):
    """The `time` regime's estimate eval fits and scores the pool with (`pair_estimate_of` of a
    val or test packet) is the one an answer computes (`classical_estimate`), packet for packet:
    the pair's train history where the run's hints keep it, else its packets in the prompt."""
    from pingctl.eval.hints import fit_hints
    from pingctl.infer.predictor import classical_estimate
    from pingctl.loader.hints import Hints

    rng = np.random.default_rng(4)
    addr = np.array([f"10.0.0.{i}" for i in range(12)], object)
    s, d = rng.integers(0, 6, 600), rng.integers(6, 12, 600)
    train = {"src": addr[s], "dst": addr[d], "rtt": rng.uniform(5, 90, 600)}
    fit_hints(train, tmp_path / "h.npz", folds=2)
    hints = Hints.load(tmp_path / "h.npz")
    # asked packets: pairs train measured, one the other way round, one with a new source
    split = {"src": np.array([*addr[s[:5]], addr[d[0]], "10.9.9.9"], object),
             "dst": np.array([*addr[d[:5]], addr[s[0]], addr[7]], object)}
    idx = np.arange(7)
    prompts = [rng.uniform(5, 90, 3) for _ in idx]
    pred = {"context_median": {"median": np.array([np.median(p) for p in prompts])},
            "pair_history": CMB.history_of(hints, split, idx)}
    got = CMB.pair_estimate_of(pred)
    want = [classical_estimate("time", p, hints, split["src"][i], split["dst"][i]) for i, p in zip(idx, prompts)]
    assert got.tolist() == want
    assert np.isfinite(pred["pair_history"][:5]).all() and np.isnan(pred["pair_history"][5:]).all()
    assert got[5] == np.median(prompts[5]) and got[0] != np.median(prompts[0])
    # a run without hints: the prompt's packets alone, in eval as in answers
    bare = CMB.pair_estimate_of({"context_median": pred["context_median"], "pair_history": CMB.history_of(None, split, idx)})
    assert bare.tolist() == [classical_estimate("time", p, None, "a", "b") for p in prompts]
