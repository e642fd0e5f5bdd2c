"""pingctl.eval baselines and report: hand-made medians, fallbacks and CRPS, the least-squares
embedding on a known world, the predictors that read the prompt (new hosts placed from it), and
a baseline table on a small synthetic world (time split). Vivaldi: tests/test_vivaldi.py."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pingctl.errors import PingctlError

from pingctl.eval.baselines import (
    GlobalMedian,
    Groups,
    PairMedian,
    PrefixMedian,
    SharedFits,
    prefix_of,
)

# ---------------------------------------------------------------- hand-made medians


def _split(rows):
    src, dst, rtt = zip(*rows)
    n = len(rows)
    return {
        "src": np.array(src, dtype=object),
        "dst": np.array(dst, dtype=object),
        "ip_version": np.array([6 if ":" in s else 4 for s in src], np.int64),
        "rtt": np.array(rtt, np.float64),
        "event_time": np.arange(n, dtype=np.int64) + 1_700_000_000,
    }


A, A2, A3 = "10.1.1.1", "10.1.1.2", "10.1.1.3"  # one /24
B, C, F, X = "10.2.2.1", "10.3.3.1", "10.4.4.1", "10.9.9.9"
V6S, V6S2, V6D = "2001:db8:1::1", "2001:db8:1::5", "2001:db8:2::1"

TRAIN = _split(
    [(A, B, 10.0), (A, B, 20.0), (A, B, 30.0), (A, B, -1.0), (A2, B, 40.0), (A, C, 100.0), (A, C, 110.0),
     (F, B, -1.0), (F, B, -1.0), (V6S, V6D, 5.0), (V6S, V6D, 7.0)]
)
# seen pair, unseen pair in a seen prefix pair, unseen everything, failed-only pair, v6 prefix
TEST = _split([(A, B, 20.0), (A3, B, 35.0), (X, B, 50.0), (F, B, 60.0), (V6S2, V6D, -1.0)])


def test_global_median_per_family():
    p = GlobalMedian().fit(TRAIN).predict(TEST)
    np.testing.assert_allclose(p.median, [35.0, 35.0, 35.0, 35.0, 6.0])  # v4: 10,20,30,40,100,110
    assert p.level_shares() == {"global": 1.0, "none": 0.0}
    # failure rate per family: v4 3 of 9 packets
    np.testing.assert_allclose(p.p_fail[:4], 3 / 9)


def test_pair_median_falls_back_prefix_then_global():
    p = PairMedian().fit(TRAIN).predict(TEST)
    np.testing.assert_allclose(p.median, [20.0, 25.0, 35.0, 35.0, 6.0])
    assert p.level.tolist() == [0, 1, 2, 2, 1]
    assert p.level_names == ("pair", "prefix", "global")
    assert p.level_shares() == pytest.approx({"pair": 0.2, "prefix": 0.4, "global": 0.4, "none": 0.0})
    # quantiles of the seen pair {10, 20, 30} (linear interpolation)
    assert [p.quantiles[q][0] for q in (0.05, 0.25, 0.5, 0.75, 0.95)] == pytest.approx([11, 15, 20, 25, 29])
    # PIT: 20 among {10, 20, 30} -> (1 + U*2)/4; failed packet -> NaN
    assert 0.25 <= p.pit[0] <= 0.75 and np.isnan(p.pit[4])
    # failure probability of the failed-only pair, shrunk pair -> prefix -> global (prior 10)
    g = 3 / 9
    pre = (2 + 10 * g) / (2 + 10)
    assert p.p_fail[3] == pytest.approx((2 + 10 * pre) / (2 + 10))
    assert p.p_fail[0] == pytest.approx((1 + 10 * ((1 + 10 * g) / (5 + 10))) / (4 + 10))
    # `median, = pred` works like the one-tuple of the interface
    (median,) = p
    assert median is p.median


def test_prefix_median_and_prefixes():
    assert prefix_of("10.1.1.77") == "10.1.1.0/24"
    assert prefix_of("2001:db8:1:ff::1") == "2001:db8:1::/48"
    assert prefix_of("10.1.1.77", 16, 32) == "10.1.0.0/16"
    assert prefix_of("not an address") is None
    p = PrefixMedian().fit(TRAIN).predict(TEST)
    np.testing.assert_allclose(p.median, [25.0, 25.0, 35.0, 35.0, 6.0])
    assert p.level.tolist() == [0, 0, 1, 1, 0]
    coarse = PrefixMedian(prefix_bits=(8, 16)).fit(TRAIN).predict(TEST)
    assert coarse.level.tolist() == [0, 0, 0, 0, 0]  # everything is in 10/8 -> 10/8


def test_arrow_and_list_inputs_agree():
    ref = PairMedian().fit(TRAIN).predict(TEST)
    as_arrow = {k: (pa.array(v.tolist()) if v.dtype == object else v) for k, v in TRAIN.items()}
    test_dict = {k: (pa.array(v.tolist()).dictionary_encode() if v.dtype == object else v) for k, v in TEST.items()}
    got = PairMedian().fit(as_arrow).predict(test_dict)
    np.testing.assert_array_equal(got.median, ref.median)
    aliased = {("src_addr" if k == "src" else "dst_addr" if k == "dst" else k): v for k, v in TEST.items()}
    np.testing.assert_array_equal(PairMedian().fit(TRAIN).predict(aliased).median, ref.median)


def test_group_quantiles_match_numpy_and_pit_is_uniform():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 50, 20_000)
    vals = np.round(rng.lognormal(3, 0.5, len(keys)), 3)
    vals[rng.random(len(keys)) < 0.02] = -1.0
    g = Groups(keys, vals, sketch=64)
    for k in (0, 17, 49):
        ok = (keys == k) & (vals >= 0)
        gi = g.lookup(np.array([k]))[0]
        for q in (0.05, 0.5, 0.95):
            assert g.q[q][gi] == pytest.approx(np.quantile(vals[ok], q))
        assert g.n_failed[gi] == int(((keys == k) & (vals < 0)).sum())
    # fresh draws from the same distributions: PIT ~ Uniform(0, 1), even with a 64-point sketch
    tk = rng.integers(0, 50, 20_000)
    tv = np.round(rng.lognormal(3, 0.5, len(tk)), 3)
    pit = g.pit(g.lookup(tk), tv, np.random.default_rng(0))
    from pingctl.eval.metrics import pit_histogram

    assert pit_histogram(pit)["ks"] < 0.03
    assert g.lookup(np.array([99, -1])).tolist() == [-1, -1]


@pytest.mark.parametrize("seed", range(6))
def test_groups_one_sort_is_the_lexsort_s(seed):
    """`Groups` sorts (key, RTT rank) packed in one uint64: the arrays of the lexsort of (key,
    RTT) to the bit, with failures, NaN, unknown keys (-1), ties, keys too wide to pack beside
    the ranks (coded first) and no success at all."""
    from pingctl.eval.baselines import _by_group, _by_group_lexsort, rtt_ranks

    rng = np.random.default_rng(seed)
    for n in (0, 1, 7, 3000):
        wide = seed % 2 == 1
        keys = rng.integers(-1, 40, n) * (2**56 if wide else 1)
        keys = np.where(keys < 0, -1, keys + (rng.integers(0, 3, n) if wide else 0))
        rtt = np.round(rng.gamma(2.0, 10.0, n), seed % 3)
        rtt[rng.random(n) < 0.2] = -1.0
        rtt[rng.random(n) < 0.05] = np.nan
        if seed == 4:
            rtt[:] = -1.0
        for ranked in (None, rtt_ranks(rtt)):
            for got, want in zip(_by_group(keys, rtt, ranked), _by_group_lexsort(keys, rtt)):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- CRPS of the medians


def test_pair_median_crps_is_its_samples():
    """A pair's CRPS is that of the empirical distribution of its training RTTs: by hand,
    E|X - y| - E|X - X'|/2 over its successful packets."""
    p = PairMedian().fit(TRAIN).predict(TEST)

    def by_hand(sample, y):
        x = np.asarray(sample, float)
        return np.mean(np.abs(x - y)) - 0.5 * np.mean(np.abs(x[:, None] - x[None, :]))

    assert p.crps[0] == pytest.approx(by_hand([10, 20, 30], 20.0))  # the seen pair
    assert p.crps[1] == pytest.approx(by_hand([10, 20, 30, 40], 35.0))  # its /24 pair
    assert p.crps[2] == pytest.approx(by_hand([10, 20, 30, 40, 100, 110], 50.0))  # the IPv4 family
    assert np.isnan(p.crps[4])  # a failed packet has no RTT to score


# ---------------------------------------------------------------- the least-squares embedding


def _world(n, seed, access=(1.0, 6.0)):
    """Hosts on a plane (ms) with access delays: RTT = distance + both heights + noise."""
    rng = np.random.default_rng(seed)
    pts = rng.uniform(0, 100, (n, 2))
    hgt = rng.uniform(*access, n)
    addrs = np.array([f"10.{k // 200}.{k % 200}.1" for k in range(n)], dtype=object)
    return rng, pts, hgt, addrs


def _measure(rng, pts, hgt, addrs, i, j, reps=2, noise=0.02):
    ii, jj = np.repeat(i, reps), np.repeat(j, reps)
    base = np.linalg.norm(pts[ii] - pts[jj], axis=1) + hgt[ii] + hgt[jj]
    rtt = base * np.exp(noise * rng.standard_normal(len(ii)))
    return {"src": addrs[ii], "dst": addrs[jj], "ip_version": np.full(len(ii), 4), "rtt": rtt,
            "event_time": np.arange(len(ii), dtype=np.int64)}


def test_embedding_predicts_held_out_pairs_of_a_height_world():
    from pingctl.eval.embedding import Embedding
    from pingctl.eval.vivaldi import Vivaldi

    rng, pts, hgt, addrs = _world(120, 4)
    i, j = np.triu_indices(120, 1)
    seen = rng.random(len(i)) < 0.3
    train = _measure(rng, pts, hgt, addrs, i[seen], j[seen])
    test = _measure(rng, pts, hgt, addrs, i[~seen], j[~seen], reps=1, noise=0.0)
    e = Embedding(seed=0).fit(train)
    p = e.predict(test)
    rel = np.abs(p.median - test["rtt"]) / test["rtt"]
    assert np.median(rel) < 0.05 and p.level_shares()["embedding"] == 1.0
    assert e.fit_info["train_median_rel_err"] < 0.03 and (e.h >= 0).all()
    np.testing.assert_allclose(p.crps, np.abs(p.median - test["rtt"]))  # a point forecast
    # in the plane's own dimension the access delays come out as the heights
    e2 = Embedding(dims=2, seed=0).fit(train)
    assert np.corrcoef(e2.h[e2.codes(addrs)], hgt)[0, 1] > 0.9
    # on this world the global fit beats serf's Vivaldi on pairs neither saw
    v = Vivaldi(cycles=300, seed=0).fit(train).predict(test)
    assert np.median(rel) < np.median(np.abs(v.median - test["rtt"]) / test["rtt"])
    again = Embedding(seed=0).fit(train)
    np.testing.assert_array_equal(again.x, e.x)  # deterministic
    # an address it never saw: the family's global median
    q = {k: v[:1] for k, v in test.items()}
    q["src"] = np.array(["10.250.0.1"], dtype=object)
    assert Embedding(seed=0, steps=50).fit(train).predict(q).level.tolist() == [1]


def test_embedding_refit_places_new_hosts_and_keeps_the_known():
    from pingctl.eval.embedding import Embedding

    rng, pts, hgt, addrs = _world(60, 5)
    i, j = np.triu_indices(50, 1)  # hosts 50..59 are new
    e = Embedding(seed=0).fit(_measure(rng, pts, hgt, addrs, i, j))
    x0 = e.x.copy()
    new = np.repeat(np.arange(10), 12)  # each new host measured 12 random known ones
    peers = rng.integers(0, 50, len(new))
    obs = _measure(rng, pts, hgt, addrs, new + 50, peers, reps=1)
    hosts = e.refit(new, e.codes(addrs[peers]), obs["rtt"], 10)
    np.testing.assert_array_equal(e.x, x0)
    others = np.arange(50)
    vv, pp = np.repeat(np.arange(10), 50), np.tile(others, 10)
    got = hosts.distance(vv, e.codes(addrs[pp]))
    truth = np.linalg.norm(pts[vv + 50] - pts[pp], axis=1) + hgt[vv + 50] + hgt[pp]
    assert np.median(np.abs(got - truth) / truth) < 0.1
    assert hosts.fitted.all()


# ---------------------------------------------------------------- baselines that read the prompt


def test_prompt_median_levels_and_sample():
    from pingctl.eval.baselines import PromptMedian

    pool = _split([(A, B, 10.0), (A, B, 14.0), (A2, B, 40.0), (A2, B, -1.0), ("10.1.7.7", "10.2.9.9", 70.0),
                   (C, F, 5.0)])
    test = _split([(A, B, 12.0), (A3, B, 30.0), ("10.1.200.1", "10.2.200.2", 60.0), (X, C, 9.0), (A, B, -1.0)])
    contexts = [np.array([0, 1, 2, 4]), np.array([0, 2, 3]), np.array([4, 5]), np.array([5]), np.array([], np.int64)]
    glob = GlobalMedian().fit(TRAIN).predict(test)
    p = PromptMedian().predict(pool, test, contexts, glob)
    # the pair's own packets; else the same /24s; else the same /16s; else the global median
    np.testing.assert_allclose(p.median[:4], [12.0, 25.0, 70.0, glob.median[3]])
    assert p.level.tolist() == [0, 1, 2, 3, 3]
    assert p.quantiles[0.25][0] == pytest.approx(11.0)
    assert p.crps[0] == pytest.approx(np.mean([2.0, 2.0]) - 0.5 * 2.0)  # {10, 14} at 12
    assert p.crps[3] == pytest.approx(glob.crps[3])
    # P(failure) of the /24 level: 1 of 3 packets, shrunk towards the global rate (prior 10)
    assert p.p_fail[1] == pytest.approx((1 + 10 * glob.p_fail[1]) / (3 + 10))


def test_refit_prediction_uses_only_each_querys_prompt():
    from pingctl.eval.baselines import refit_prediction
    from pingctl.eval.embedding import Embedding

    rng, pts, hgt, addrs = _world(41, 6)
    i, j = np.triu_indices(40, 1)
    e = Embedding(seed=0).fit(_measure(rng, pts, hgt, addrs, i, j))
    new = addrs[40]
    peers = rng.choice(40, 10, replace=False)
    pool = _measure(rng, pts, hgt, addrs, np.full(10, 40), peers, reps=1)  # the new probe's measurements
    pool["src"][5:], pool["dst"][5:] = pool["dst"][5:].copy(), pool["src"][5:].copy()  # either direction counts
    targets = np.array([p for p in range(40) if p not in peers][:6])
    test = _measure(rng, pts, hgt, addrs, np.array([40, 40, 40, 0, 40, 40]), targets, reps=1, noise=0.0)
    test["dst"][3] = addrs[1]  # a query between two known hosts
    contexts = [np.arange(10)] * 3 + [np.arange(10), np.zeros(0, np.int64), np.arange(3)]
    glob = GlobalMedian().fit(_measure(rng, pts, hgt, addrs, i, j)).predict(test)
    p = refit_prediction(e, pool, test, contexts, glob)
    assert p.level.tolist() == [1, 1, 1, 0, 2, 1]  # refit, known pair, an empty prompt falls back
    assert p.median[3] == pytest.approx(e.distance(e.codes([addrs[0]]), e.codes([addrs[1]]))[0])
    assert p.median[4] == glob.median[4]
    rel = np.abs(p.median[:3] - test["rtt"][:3]) / test["rtt"][:3]
    assert np.median(rel) < 0.15
    # a prompt of three measurements places the host less surely than one of ten: another answer
    assert p.median[5] != p.median[0] or test["dst"][5] != test["dst"][0]
    assert new not in set(e.vocab.to_pylist())


# ---------------------------------------------------------------- report on a synthetic world


@pytest.fixture(scope="module")
def synth_split(tmp_path_factory):
    from pingctl.config import ShardConfig, SynthConfig
    from pingctl.artifacts.table import load_split
    from pingctl.shard import shard
    from pingctl.synth.generate import generate

    d = tmp_path_factory.mktemp("evalsynth")
    generate(SynthConfig(rows=150_000, probes=40, targets=15, targets_per_probe=6, step=600, seed=5), d / "synth")
    shard([d / "synth"], d / "shards",
          ShardConfig(strategy="time", val_fraction=0.0, test_fraction=0.2, memory_limit="1GB", threads=2))
    return d, load_split(d / "shards" / "train"), load_split(d / "shards" / "test")


def test_load_split(synth_split):
    d, train, test = synth_split
    t = pq.read_table(d / "shards" / "test")
    assert len(test["rtt"]) == t.num_rows
    assert set(test) == {"src", "dst", "ip_version", "rtt", "event_time", "msm_id", "size",
                         "packet_error_count", "prb_id"}
    assert test["event_time"].dtype == np.int64 and test["src"].dtype == object
    us = t.column("event_time").cast(pa.int64()).to_numpy()
    np.testing.assert_array_equal(test["event_time"], us // 1_000_000)
    assert test["src"].tolist() == t.column("src_addr").to_pylist()
    assert train["event_time"].max() < test["event_time"].min()


def test_load_split_integer_seconds_without_prb(tmp_path):
    from pingctl.artifacts.table import load_split
    from tests.conftest import make_table

    tab = make_table(50, prb=False)
    secs = tab.column("event_time").cast(pa.int64()).to_numpy() // 1_000_000
    tab = tab.set_column(1, "event_time", pa.array(secs))
    pq.write_table(tab, tmp_path / "x.parquet")
    got = load_split(tmp_path / "x.parquet")
    np.testing.assert_array_equal(got["event_time"], secs)
    assert (got["prb_id"] == -1).all() and len(got["dst"]) == 50
    # eval converts times as every canonical reader does: integer seconds beyond a float's 2**53
    # (Arrow refused that cast with a traceback) reach the row check, which names file and row
    pq.write_table(tab.set_column(1, "event_time", pa.array(secs + 2**58)), tmp_path / "big.parquet")
    with pytest.raises(PingctlError, match=r"bad_time: 50 row\(s\).*big.parquet row 0"):
        load_split(tmp_path / "big.parquet")
    pq.write_table(tab.set_column(1, "event_time", pa.array([True] * 50)), tmp_path / "bool.parquet")
    with pytest.raises(PingctlError, match=r"bool.parquet: event_time: column of type bool"):
        load_split(tmp_path / "bool.parquet")


def test_baseline_table_on_synth(synth_split, tmp_path):
    from pingctl.eval.presentation import summary_rows, write_plots
    from pingctl.eval.report import add_predictor, baseline_table

    d, train, test = synth_split
    report = baseline_table(train, test, truth=d / "synth", vivaldi_cycles=500)
    json.loads(json.dumps(report))  # plain JSON
    preds = report["predictors"]
    assert report["order"] == ["global_median", "prefix_median", "prefix16_median", "pair_median", "vivaldi",
                               "embedding"]
    med = {k: v["overall"]["median_rel_err"] for k, v in preds.items()}
    floor = report["noise_floor"]["overall"]["median_rel_err"]
    assert med["pair_median"] < med["vivaldi"] < med["global_median"]
    assert all(floor < m for m in med.values())
    assert report["noise_floor"]["n_unknown"] == 0
    assert preds["pair_median"]["overall"]["mae_ms"] < preds["global_median"]["overall"]["mae_ms"]
    for e in preds.values():
        assert sum(e["fallback"].values()) == pytest.approx(1.0)
    assert preds["pair_median"]["fallback"]["pair"] > 0.95  # time split: pairs were seen
    cov = preds["pair_median"]["calibration"]["coverage"]
    assert 0.2 < cov["cov50"] < cov["cov90"] <= 1.0
    assert 0.3 < preds["pair_median"]["failure"]["auc"] <= 1.0
    assert report["slices"]["all"]["n"] == len(test["rtt"])
    assert report["slices"]["v4"]["n"] + report["slices"]["v6"]["n"] == len(test["rtt"])
    # the model entry goes through the same scoring: an oracle that knows the true median
    tm = report.ctx["truth_median"]
    entry = add_predictor(report, "oracle", tm, quantiles={q: tm for q in (0.05, 0.25, 0.75, 0.95)},
                          p_fail=np.full(len(tm), 0.02))
    assert entry["overall"]["median_rel_err"] == pytest.approx(floor)
    rows = summary_rows(report)
    assert [r["predictor"] for r in rows] == report["order"] + ["noise_floor"]
    with pytest.raises(ValueError):
        add_predictor(report, "bad", tm[:-1])
    paths = write_plots(report, tmp_path / "plots", names=["pair_median", "vivaldi", "oracle"])
    assert {"error_cdf", "calibration", "scatter_oracle"} <= set(paths)
    assert all(p.stat().st_size > 1000 for p in paths.values())
    assert not [p for p in (tmp_path / "plots").iterdir() if p.name.startswith(".")]


def test_predictions_parquet_round_trip(tmp_path):
    """predictions.parquet: one row per packet, every predictor's figures under its name."""
    from pingctl.artifacts.eval_output import read_predictions, write_predictions
    from pingctl.eval.presentation import prediction_columns
    from pingctl.eval.report import baseline_table

    report = baseline_table(TRAIN, TEST, baselines={"pair_median": PairMedian(), "global_median": GlobalMedian()})
    packets, preds = prediction_columns(report)
    path = write_predictions(tmp_path, packets, preds, {"test": "fixture"})
    table, meta = read_predictions(tmp_path)
    assert path.name == "predictions.parquet" and meta["predictors"] == ["pair_median", "global_median"]
    d = table.to_pydict()
    assert d["src"] == TEST["src"].tolist() and d["actual_rtt"] == TEST["rtt"].tolist()
    ref = PairMedian().fit(TRAIN).predict(TEST)
    np.testing.assert_allclose(d["pair_median_median"], ref.median)
    np.testing.assert_allclose(d["pair_median_p25"], ref.quantiles[0.25])
    np.testing.assert_allclose(d["pair_median_crps"], ref.crps, equal_nan=True)
    assert len(set(d["pair"])) == len({(s, t) for s, t in zip(d["src"], d["dst"])})
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(PingctlError, match="not a `pingctl eval` predictions file"):
        read_predictions(tmp_path / "other.parquet")


def _assert_same_prediction(got, want, name):
    for field in ("median", "level", "pit", "p_fail", "crps"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), (name, field)
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=f"{name} {field}")
    assert (got.quantiles is None) == (want.quantiles is None)
    for q in got.quantiles or {}:
        np.testing.assert_array_equal(got.quantiles[q], want.quantiles[q], err_msg=f"{name} q{q}")
    for k in want.info:
        np.testing.assert_array_equal(got.info[k], want.info[k], err_msg=f"{name} {k}")


def test_fit_baselines_shares_levels_and_predicts_as_each_baseline_fitted_alone(synth_split):
    """`fit_baselines` fits each level once for every baseline on the train split (`SharedFits`),
    from `load_split`'s coded columns: the predictions are those of each baseline fitted on its
    own on plain object arrays, to the bit."""
    from pingctl.eval.registry import default_baselines, fit_baselines
    from pingctl.schema.arrow_strings import CodedStrings

    _, train, test = synth_split
    assert isinstance(train["src"], CodedStrings) and train["src"].coding is not None
    fitted, fit_s = fit_baselines(train, seed=3, vivaldi_cycles=50)
    plain = dict(train, src=np.array(train["src"], object), dst=np.array(train["dst"], object))
    assert getattr(plain["src"], "coding", None) is None
    alone = {name: b.fit(plain) for name, b in default_baselines(3, 50).items()}
    assert set(fitted) == set(alone) == set(fit_s)
    for name in fitted:
        _assert_same_prediction(fitted[name].predict(test), alone[name].predict(test), name)
    # shared, not merely equal: each level is fitted once
    pair, prefix, glob = (fitted[n]._groups for n in ("pair_median", "prefix_median", "global_median"))
    assert pair[1] is prefix[0] and pair[2] is prefix[1] is glob[0] is fitted["embedding"]._global._groups[0]
    assert fitted["vivaldi"]._global._groups[0] is glob[0]
    assert fitted["prefix16_median"]._groups[0] is not prefix[0]
    assert alone["pair_median"]._groups[2] is not alone["global_median"]._groups[0]


@pytest.mark.parametrize("seed", range(8))
def test_groups_made_a_block_at_a_time_are_the_row_formula(seed, monkeypatch):
    """`Groups` builds its quantiles and CDF sketch from the packed sort a block at a time and
    enumerates the sketch's kept ranks per group: the same arrays, to the bit, as the formula
    over every successful packet (kept where rank = floor(ceil(rank (k-1)/(c-1)) (c-1)/(k-1)))."""
    from pingctl.eval import baselines as B

    rng = np.random.default_rng(seed)
    monkeypatch.setattr(B, "_BLOCK", int(rng.choice([3, 7, 1 << 22])))
    n, k = 4000, int(rng.choice([2, 3, 17, 101]))
    keys = rng.integers(-1, int(rng.integers(1, 30)), n)
    rtt = np.round(rng.gamma(2.0, 10.0, n), seed % 3)
    rtt[rng.random(n) < 0.2] = -1.0
    g = B.Groups(keys, rtt, quantiles=(0.25, 0.5), sketch=k)
    found, _, _, gs, vs = B._by_group_lexsort(keys, rtt)
    count = np.bincount(gs, minlength=len(found))
    start = np.cumsum(count) - count
    for q in (0.25, 0.5):
        np.testing.assert_array_equal(g.q[q], B.group_quantile(vs, start, count, q))
    c, rank = count[gs], np.arange(len(vs)) - start[gs]
    j = np.ceil(rank * (k - 1) / np.maximum(c - 1, 1))
    keep = (c <= k) | (np.floor(j * (c - 1) / (k - 1)) == rank)
    np.testing.assert_array_equal(g.sk_val, vs[keep])
    np.testing.assert_array_equal(g.sk_count, np.bincount(gs[keep], minlength=len(found)))
    # the PIT counts a group's sketch values below and at x in microseconds: as a search of the
    # sketch packed with its groups
    packed = (gs[keep] << B._US_BITS) | B._us(vs[keep])
    gidx = rng.integers(-1, len(found), 500)
    x = np.round(rng.gamma(2.0, 12.0, 500), 3)
    x[:5] = [-1.0, np.nan, 0.0, 1e9, vs[0] if len(vs) else 1.0]
    ok = (gidx >= 0) & np.isfinite(x) & (x >= 0)
    key = (gidx[ok] << B._US_BITS) | B._us(x[ok])
    less = np.searchsorted(packed, key, side="left") - g.sk_start[gidx[ok]]
    leq = np.searchsorted(packed, key, side="right") - g.sk_start[gidx[ok]]
    u = np.random.default_rng(1).random(int(ok.sum()))
    want = np.full(500, np.nan)
    want[ok] = (less + u * (leq - less + 1)) / (g.sk_count[gidx[ok]] + 1)
    np.testing.assert_array_equal(g.pit(gidx, x, np.random.default_rng(1)), want)


@pytest.mark.parametrize("seed", range(4))
def test_seen_slices_by_marking_are_those_by_membership(seed, monkeypatch):
    """`Seen` finds train's distinct pairs, sources and probes by marking them (or by a sort
    where the codes are too many to mark), from the baselines' shared codes or its own: each
    test packet's seen/unseen pair and probe as read off train directly."""
    from pingctl.eval import report as R

    rng = np.random.default_rng(seed)
    monkeypatch.setattr(R, "_BLOCK", 5)
    if seed % 2:
        monkeypatch.setattr(R, "_BITMAP", 4)  # the sorted path
    hosts = [f"10.0.{i // 200}.{i % 200}" for i in range(12)] + ["2001:db8::1", "2001:db8::2"]

    def table(n, hosts_):
        src, dst = rng.choice(hosts_, n), rng.choice(hosts_, n)
        prb = rng.integers(-1, 6, n)
        return {"src": np.array(src, object), "dst": np.array(dst, object), "prb_id": prb,
                "ip_version": np.array([6 if ":" in s else 4 for s in src]), "rtt": rng.uniform(1, 50, n),
                "event_time": np.arange(n, dtype=np.int64)}

    train, test = table(60, hosts[:10]), table(80, hosts)
    pairs = set(zip(train["src"], train["dst"]))
    probes = {p for p in train["prb_id"] if p >= 0}
    sources = set(train["src"])
    want_pair = np.array([(s, d) in pairs for s, d in zip(test["src"], test["dst"])])
    want_probe = np.array([p in probes if p >= 0 else s in sources for s, p in zip(test["src"], test["prb_id"])])
    for seen in (R.Seen.of(train), R.Seen.of(train, SharedFits(train))):
        m = seen.masks(test)
        assert (m["seen_pair"] == want_pair).all() and (m["unseen_pair"] == ~want_pair).all()
        assert (m["seen_probe"] == want_probe).all()
