"""pingctl.eval baselines and report: hand-made medians and fallbacks, Vivaldi on a known
embedding, and a baseline table on a small synthetic world (time split)."""

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
    Vivaldi,
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


# ---------------------------------------------------------------- Vivaldi


def test_vivaldi_recovers_a_2d_embedding():
    rng = np.random.default_rng(11)
    n = 60
    pts = rng.uniform(0, 100, (n, 2))
    i, j = np.triu_indices(n, 1)
    measured = rng.random(len(i)) < 0.5
    i, j = i[measured], j[measured]
    true_d = np.linalg.norm(pts[i] - pts[j], axis=1)
    rtt = true_d * (1 + 0.01 * rng.standard_normal(len(i)))  # 1% noise
    v = Vivaldi(rounds=600, seed=5).fit_edges(i, j, rtt, n)
    I, J = np.triu_indices(n, 1)  # every pair, measured or not
    pred = v.distance(I, J)
    truth = np.linalg.norm(pts[I] - pts[J], axis=1)
    assert np.median(np.abs(pred - truth) / truth) < 0.05
    assert np.corrcoef(pred, truth)[0, 1] > 0.99
    # same geometry up to rotation/reflection/translation: orthogonal Procrustes residual
    a = v.pos - v.pos.mean(0)
    b = pts - pts.mean(0)
    u, _, vt = np.linalg.svd(a.T @ b)
    resid = np.linalg.norm(a @ (u @ vt) - b, axis=1)
    assert np.median(resid) < 0.03 * np.median(truth)
    assert np.median(v.h) < 0.02 * np.median(truth)  # a flat world needs (almost) no heights
    assert v.fit_info["train_median_rel_err"] < 0.05
    again = Vivaldi(rounds=600, seed=5).fit_edges(i, j, rtt, n)
    np.testing.assert_array_equal(again.pos, v.pos)  # deterministic


def test_vivaldi_dict_interface_and_fallback():
    rng = np.random.default_rng(2)
    n = 25
    pts = rng.uniform(0, 80, (n, 2))
    addrs = np.array([f"10.0.{k}.1" for k in range(n)], dtype=object)
    i, j = np.triu_indices(n, 1)
    rep = 4
    ii, jj = np.repeat(i, rep), np.repeat(j, rep)
    rtt = np.linalg.norm(pts[ii] - pts[jj], axis=1) + 5.0 + rng.exponential(0.5, len(ii))  # 2 x 2.5 ms access
    rtt[rng.random(len(ii)) < 0.05] = -1.0
    train = {"src": addrs[ii], "dst": addrs[jj], "ip_version": np.full(len(ii), 4), "rtt": rtt,
             "event_time": np.zeros(len(ii), np.int64)}
    v = Vivaldi(rounds=800, seed=0).fit(train)
    test = {"src": np.array([addrs[0], addrs[3], "10.99.0.1"], dtype=object),
            "dst": np.array([addrs[1], addrs[7], addrs[2]], dtype=object),
            "ip_version": np.array([4, 4, 4]), "rtt": np.array([1.0, 1.0, 1.0]),
            "event_time": np.zeros(3, np.int64)}
    p = v.predict(test)
    true = np.linalg.norm(pts[[0, 3]] - pts[[1, 7]], axis=1) + 5.0 + 0.5 * np.log(2)
    np.testing.assert_allclose(p.median[:2], true, rtol=0.15)
    assert np.isnan(p.info["raw_median"][2]) and p.level.tolist() == [0, 0, 1]
    assert p.median[2] == pytest.approx(np.median(rtt[rtt >= 0]))  # global median fallback
    assert p.level_shares()["global"] == pytest.approx(1 / 3)
    assert np.median(v.h[v.trained]) > 1.0  # the access delay shows up as height
    pv = Vivaldi(rounds=300, seed=0, samples="packets").fit(train).predict(test)
    np.testing.assert_allclose(pv.median[:2], true, rtol=0.25)


# ---------------------------------------------------------------- report on a synthetic world


@pytest.fixture(scope="module")
def synth_split(tmp_path_factory):
    from pingctl.config import ShardConfig, SynthConfig
    from pingctl.eval.report import load_split
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
    from pingctl.eval.report import load_split
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
    from pingctl.eval.report import add_predictor, baseline_table, summary_rows, write_plots

    d, train, test = synth_split
    report = baseline_table(train, test, truth=d / "synth", vivaldi_rounds=1000)
    json.loads(json.dumps(report))  # plain JSON
    preds = report["predictors"]
    assert report["order"] == ["global_median", "prefix_median", "pair_median", "vivaldi"]
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
