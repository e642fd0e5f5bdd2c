"""`pingctl score`: the model's surprise at each measured result, and the classical detector it
is compared with (pingctl/infer/score.py, pingctl/eval/anomaly.py)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError, UsageError

runner = CliRunner()

SHIFT_MS = 80.0
PLANTED = 8


# ----------------------------------------------------------------- the classical detector


def _one_pair(n=60, seed=0):
    rng = np.random.default_rng(seed)
    rtt = 20 + rng.normal(0, 0.5, n)
    return ["193.0.0.1"] * n, ["8.8.8.8"] * n, np.arange(n) * 600, rtt


def test_rolling_mad_flags_a_shifted_block_and_not_the_packets_before_it():
    from pingctl.eval.anomaly import MIN_HISTORY, rolling_mad

    src, dst, t, rtt = _one_pair()
    rtt[40:45] += SHIFT_MS
    r = rolling_mad(src, dst, t, rtt)
    assert (r["tail_p"][40:45] < 1e-6).all() and (np.abs(r["z"][40:45]) > 50).all()
    # the first packets have no history to be judged on; ordinary noise stays far from the block's scores
    assert (r["tail_p"][:MIN_HISTORY] == 1).all() and np.isnan(r["z"][:MIN_HISTORY]).all()
    assert r["tail_p"][MIN_HISTORY:40].min() > 1e-4
    assert list(r["history"][:3]) == [0, 1, 2] and r["history"].max() == 24


def test_rolling_mad_keeps_pairs_apart_and_ignores_row_order():
    from pingctl.eval.anomaly import rolling_mad

    s1, d1, t1, r1 = _one_pair(seed=1)
    s2, d2, t2, r2 = _one_pair(seed=2)
    r2 = r2 + 200  # another pair, ten times slower: no packet of it is an anomaly of the first
    src, dst = np.array(s1 + ["193.0.0.2"] * 60, object), np.array(d1 + d2, object)
    t, rtt = np.concatenate([t1, t2]), np.concatenate([r1, r2])
    base = rolling_mad(src, dst, t, rtt)
    alone = rolling_mad(s1, d1, t1, r1)
    np.testing.assert_allclose(base["tail_p"][:60], alone["tail_p"])  # the other pair changes nothing
    np.testing.assert_allclose(base["z"][:60], alone["z"])
    perm = np.random.default_rng(0).permutation(len(t))
    shuffled = rolling_mad(src[perm], dst[perm], t[perm], rtt[perm])
    np.testing.assert_allclose(shuffled["tail_p"], base["tail_p"][perm])


def test_rolling_mad_judges_a_failure_by_the_pair_s_recent_failures():
    from pingctl.eval.anomaly import PRIOR, rolling_mad

    src, dst, t, rtt = _one_pair(n=40)
    rtt[10] = -1.0  # a lone failure after ten successes
    rtt[30:34] = -1.0  # a run of them: each is less surprising than the one before
    r = rolling_mad(src, dst, t, rtt)
    rate = 5 / 40
    assert r["tail_p"][10] == pytest.approx(PRIOR * rate / (10 + PRIOR))
    assert np.all(np.diff(r["tail_p"][30:34]) > 0) and np.isnan(r["z"][10])


def test_detection_counts_precision_recall_and_auc():
    from pingctl.eval.anomaly import detection

    tail = np.array([0.001, 0.002, 0.5, 0.004, 0.9, 0.8])
    label = np.array([True, True, True, False, False, False])
    d = detection(tail, label, threshold=0.01)
    assert (d["flagged"], d["true_positives"], d["anomalous"]) == (3, 2, 3)
    assert d["precision"] == pytest.approx(2 / 3) and d["recall"] == pytest.approx(2 / 3)
    assert d["auc"] == pytest.approx(8 / 9)  # of the 9 (anomalous, normal) pairs, 8 are ranked right
    only_ok = detection(tail, label, 0.01, mask=np.array([1, 1, 1, 0, 0, 1], bool))
    assert only_ok["packets"] == 4 and only_ok["flagged"] == 2 and only_ok["precision"] == 1.0


def test_truth_labels_agree_with_the_world(synth_rows):
    """Every packet the truth puts in an outage failed (an outage fails every packet of its host
    and family); a packet is a route change's exactly when a later route segment of its pair,
    shifted differently from the one before, started less than two hours before it."""
    from pingctl.eval.anomaly import ROUTE_WINDOW_S, truth_labels

    t = pa.concat_tables([pq.read_table(f) for f in sorted((synth_rows / "synth").glob("part-*.parquet"))])
    secs = t.column("event_time").cast(pa.int64()).to_numpy() // 1_000_000
    rtt = t.column("rtt").to_numpy()
    src, dst = np.array(t.column("src_addr").to_pylist()), np.array(t.column("dst_addr").to_pylist())
    ipv = t.column("ip_version").to_numpy()
    lab = truth_labels(synth_rows / "synth", t.column("src_addr"), t.column("dst_addr"), ipv, secs)
    assert lab["outage"].any() and (rtt[lab["outage"]] == -1).all()
    assert lab["outage"].sum() < (rtt < 0).sum()  # random loss is no outage
    assert (lab["anomalous"] == (lab["route"] | lab["outage"])).all()
    # the route labels, found again one segment at a time
    routes = pq.read_table(synth_rows / "synth" / "truth" / "routes.parquet").to_pylist()
    expect = np.zeros(len(rtt), bool)
    for before, seg in zip(routes, routes[1:]):
        if seg["stream_id"] != before["stream_id"] or seg["shift_ms"] == before["shift_ms"]:
            continue
        start = int(seg["start"].timestamp())
        expect |= ((src == seg["src_addr"]) & (dst == seg["dst_addr"]) & (ipv == seg["ip_version"])
                   & (secs >= start) & (secs < start + ROUTE_WINDOW_S))
    assert expect.any() and (lab["route"] == expect).all()
    none = truth_labels(synth_rows / "synth", t.column("src_addr"), t.column("dst_addr"), ipv, secs,
                        min_shift_ms=1e9)
    assert not none["route"].any() and (none["outage"] == lab["outage"]).all()


# ----------------------------------------------------------------- the model's scores


@pytest.fixture(scope="module")
def planted(time_split, tmp_path_factory):
    """The test split's rows of a few probes, one IPv4 pair's PLANTED consecutive successful
    packets shifted by SHIFT_MS (a route change the model never saw), and two rows build-rows
    rejects first. Returns (path, planted row positions among the valid rows, rows written)."""
    t = pq.read_table(time_split / "test")
    t = t.sort_by([("event_time", "ascending")])
    probes = sorted(set(t.column("prb_id").to_pylist()))[:3]
    t = t.filter(pc.is_in(t.column("prb_id"), pa.array(probes, t.column("prb_id").type)))
    src, dst = t.column("src_addr").to_pylist(), t.column("dst_addr").to_pylist()
    rtt = t.column("rtt").to_numpy().copy()
    v4 = t.column("ip_version").to_numpy() == 4
    pairs = {}
    for i in np.flatnonzero(v4 & (rtt >= 0)):
        pairs.setdefault((src[i], dst[i]), []).append(i)
    # the slowest pair with a day of packets: the session's model (60 steps) has learned the RTT
    # distribution of the world but little of each pair's, measured: a 27 ms pair shifted to
    # 107 ms looked more typical to it (median rank 67%), a 178 ms one shifted to 258 ms ranked
    # in the top 2%. So this checks the scoring, not how well a short training learns pairs.
    rows = max((v for v in pairs.values() if len(v) >= 30), key=lambda v: np.median(rtt[v]))
    chosen = np.array(rows[len(rows) // 2 : len(rows) // 2 + PLANTED])
    assert len(chosen) == PLANTED
    rtt[chosen] += SHIFT_MS
    t = t.set_column(t.column_names.index("rtt"), "rtt", pa.array(rtt))
    bad = t.slice(0, 2).to_pylist()
    bad[0]["rtt"], bad[1]["src_addr"] = 1e300, "not-an-address"
    # first: a --limit reads them too
    whole = pa.concat_tables([pa.Table.from_pylist(bad, schema=t.schema), t])
    path = tmp_path_factory.mktemp("score") / "planted.parquet"
    pq.write_table(whole, path)
    return path, chosen, whole.num_rows


@pytest.fixture(scope="module")
def model(tiny_run):
    from pingctl.infer.model import LoadedModel

    return LoadedModel.load(tiny_run)


@pytest.fixture(scope="module")
def scored(model, planted):
    from pingctl.infer.score import score_table

    path, _, _ = planted
    return score_table(model, path, context=16, context_policy="probe")


def test_a_planted_route_change_ranks_above_ordinary_packets(scored, planted):
    _, chosen, _ = planted
    tail = scored.column("tail_p").to_numpy()
    nll = scored.column("nll").to_numpy()
    # rank 0 = most surprising; ties by NLL
    rank = np.empty(len(tail))
    rank[np.lexsort((-nll, tail))] = np.arange(len(tail))
    share = np.median(rank[chosen]) / len(tail)
    assert share < 0.10, f"planted packets' median rank at {share:.0%} of {len(tail)}"
    assert np.median(nll[chosen]) > np.quantile(np.delete(nll, chosen), 0.9)


def test_scores_are_probabilities_and_counts_reconcile(scored, planted):
    from pingctl.infer.score import SCORE_COLUMNS, score_meta
    from pingctl.schema.columns import COLUMNS

    _, _, written = planted
    assert scored.column_names == [*COLUMNS, *SCORE_COLUMNS]
    meta = score_meta(scored)
    assert meta["rows_read"] == written == meta["rows_scored"] + meta["rows_rejected"]
    assert meta["rows_rejected"] == 2 and set(meta["rejected"]) == {"bad_rtt", "bad_src_addr"}
    assert meta["nll_unit"] == "nats" and meta["context_policy"] == "probe"
    rtt = scored.column("rtt").to_numpy()
    tail, pit, pf = (scored.column(c).to_numpy() for c in ("tail_p", "pit", "p_fail"))
    nll = scored.column("nll").to_numpy()
    assert ((tail >= 0) & (tail <= 1)).all() and ((pf > 0) & (pf < 1)).all() and np.isfinite(nll).all()
    ok = rtt >= 0
    assert np.isnan(pit[~ok]).all() and ((pit[ok] >= 0) & (pit[ok] <= 1)).all()
    # a failure's tail is P(failure) and its NLL -ln of it; a success's tail is two-sided in its PIT
    np.testing.assert_allclose(tail[~ok], pf[~ok])
    np.testing.assert_allclose(nll[~ok], -np.log(pf[~ok]))
    # the observed code's own mass counts on both sides: never below the continuous two-sided tail
    assert (tail[ok] >= 2 * np.minimum(pit[ok], 1 - pit[ok]) - 1e-9).all() and (tail[ok] > 0).all()
    assert (scored.column("context_measurements").to_numpy() <= 16).all()


def test_an_arrow_table_scores_as_its_file_does_and_the_policies_differ(model, planted, scored):
    from pingctl.infer.score import score_meta, score_table

    path, _, _ = planted
    first = pq.read_table(path).slice(0, 40)
    a = score_table(model, first, context=16, limit=30)
    assert a.num_rows == 28 and score_meta(a)["rows_read"] == 30 and score_meta(a)["rows_rejected"] == 2
    # the first rows' contexts are the same in the whole table (rows are in time order)
    np.testing.assert_allclose(a.column("nll").to_numpy(), scored.column("nll").to_numpy()[:28], rtol=1e-4)
    cold = score_table(model, first, context_policy="none", limit=30)
    assert (cold.column("context_measurements").to_numpy() == 0).all()
    assert not np.allclose(cold.column("nll").to_numpy(), a.column("nll").to_numpy())


def test_sizes_past_their_bounds_are_refused_before_any_work(model, tmp_path, monkeypatch):
    from pingctl.cli import score_cmd
    from pingctl.infer import score as S

    assert (score_cmd.MAX_ROWS, score_cmd.MAX_CONTEXT) == (S.MAX_ROWS, S.MAX_CONTEXT)
    for kwargs in ({"limit": 0}, {"limit": S.MAX_ROWS + 1}, {"context": S.MAX_CONTEXT + 1}, {"context": -1},
                   {"context_policy": "nearest"}):
        with pytest.raises(UsageError):
            S.score_table(model, tmp_path / "absent.parquet", **kwargs)
    monkeypatch.setattr(S, "MAX_ROWS", 5)
    with pytest.raises(UsageError, match="beyond the bound of 5"):
        S.read_input(pa.Table.from_pylist([{"x": 1}] * 6))
    with pytest.raises(PingctlError, match="not found"):
        S.read_input(tmp_path / "absent.parquet")


# ----------------------------------------------------------------- the command


def test_cli_writes_the_scores_and_lists_the_flagged_rows(tiny_run, planted, tmp_path):
    from pingctl.artifacts.score_output import read_meta

    path, _, _ = planted
    out = tmp_path / "scores.parquet"
    r = runner.invoke(app, ["score", str(tiny_run), str(path), "-o", str(out), "--threshold", "0.2", "--limit", "200",
                            "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["rows_read"] == 200 == res["rows_scored"] + res["rows_rejected"]
    t = pq.read_table(out)
    assert t.num_rows == res["rows_scored"] and read_meta(out)["rows_rejected"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["scores.parquet"]  # no temp left beside it
    tail = t.column("tail_p").to_numpy()
    assert res["flagged"] == int((tail < 0.2).sum()) > 10 and len(res["top"]) == 10
    tops = [row["tail_p"] for row in res["top"]]
    assert tops == sorted(tops) and all(p < 0.2 for p in tops)
    assert tops[0] == tail.min()
    # the terminal: the summary, the reasons rows were set aside and the most surprising rows
    r = runner.invoke(app, ["score", str(tiny_run), str(path), "-o", str(out), "--threshold", "0.2",
                            "--limit", "40"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "most surprising rows" in r.output and "set aside" in r.output and "bad_rtt" in r.output
    assert pq.read_table(out).num_rows == 40 - 2


def test_a_failed_write_leaves_the_old_output_whole(tiny_run, planted, tmp_path, monkeypatch):
    import pyarrow.parquet as pq_mod

    path, _, _ = planted
    out = tmp_path / "scores.parquet"
    out.write_bytes(b"old scores")

    def broken(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1 half a file")
        raise OSError("disk went away")

    monkeypatch.setattr(pq_mod, "write_table", broken)
    r = runner.invoke(app, ["score", str(tiny_run), str(path), "-o", str(out), "--limit", "20"])
    assert r.exit_code != 0 and "disk went away" in r.output
    assert out.read_bytes() == b"old scores" and [p.name for p in tmp_path.iterdir()] == ["scores.parquet"]


@pytest.mark.parametrize("extra, message", [
    (["--limit", "0"], "--limit"),
    (["--limit", "1000001"], "--limit"),
    (["--context", "10001"], "--context"),
    (["--threshold", "1.5"], "--threshold"),
    (["--context-policy", "nearest"], "context policy"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_cli_bounds_are_usage_errors(tmp_path, extra, message):
    r = runner.invoke(app, ["score", "no-run", "t.parquet", "-o", str(tmp_path / "s.parquet"), *extra],
                      terminal_width=200)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_an_output_inside_an_input_is_refused_before_anything_is_written(tmp_path):
    """`score RUN SPLIT -o SPLIT/scores.parquet` made the scores part of the split: the next
    inspect or build-rows of it read them as measurements. -o inside a TABLE directory, inside
    RUN or inside any pingctl output (a glob or a file of a split gives the split) is a usage
    error before anything is read or written; beside them it is not refused."""
    import subprocess
    import sys

    from pingctl.config import ShardConfig
    from pingctl.shard import shard
    from tests.conftest import make_table

    (tmp_path / "t").mkdir()
    pq.write_table(make_table(600), tmp_path / "t" / "part.parquet")
    splits, run = tmp_path / "splits", tmp_path / "run"
    shard([tmp_path / "t"], splits, ShardConfig(strategy="time"))
    run.mkdir()

    def files():
        return sorted(p for p in tmp_path.rglob("*") if p.is_file())

    before = files()
    # the case as it was met: a real process, the split given whole
    proc = subprocess.run([sys.executable, "-m", "pingctl", "score", str(run), str(splits / "test"), "-o",
                           str(splits / "test" / "scores.parquet"), "--json"], capture_output=True, text=True)
    message = json.loads(proc.stdout)["error"]["message"]
    assert proc.returncode == 2 and f"inside TABLE {splits / 'test'}" in message, proc.stderr
    test_file = next((splits / "test").glob("*.parquet"))
    for table, out, says in (
        (tmp_path / "t", tmp_path / "t" / "sub" / "scores.csv", f"inside TABLE {tmp_path / 't'}"),
        (tmp_path / "t", run / "scores.parquet", f"inside RUN {run}"),
        (str(splits / "test" / "*.parquet"), splits / "test" / "s.parquet", f"inside the pingctl output {splits}"),
        (test_file, splits / "val" / "s.parquet", f"inside the pingctl output {splits}"),
    ):
        r = runner.invoke(app, ["score", str(run), str(table), "-o", str(out)], terminal_width=400)
        assert r.exit_code == 2 and says in " ".join(r.output.split()), (table, out, r.output)
    assert files() == before  # nothing written, in the split or anywhere
    # beside them -o is not refused: the command goes on to the run (an empty directory here)
    r = runner.invoke(app, ["score", str(run), str(splits / "test"), "-o", str(tmp_path / "scores.parquet")])
    assert r.exit_code == 1 and "not a `pingctl train` run directory" in r.output, r.output


def test_cli_refuses_a_non_parquet_output_and_the_input_itself(planted, tmp_path):
    path, _, _ = planted
    r = runner.invoke(app, ["score", "no-run", str(path), "-o", str(tmp_path / "s.txt"), "--json"])
    assert r.exit_code == 2 and ".parquet, .csv or .json" in json.loads(r.stdout)["error"]["message"]
    r = runner.invoke(app, ["score", "no-run", str(path), "-o", str(path)])
    assert r.exit_code == 2 and "being scored" in r.output


def test_the_point_reads_are_rtt_distributions_at_s(model, planted):
    """The PIT and tail read from P(first byte) and the refined second bytes (`_read`) against
    the distribution `rtt_distributions_at` builds from the same passes."""
    from pingctl.context import context_indices
    from pingctl.infer import queries as Q
    from pingctl.infer import score as S

    path, _, _ = planted
    got = S.read_input(path, 80)
    rows = S._arrays(got.table)
    idx = np.arange(got.table.num_rows)
    ps, fulls = S.prompts(model, rows, idx, rows, context_indices(rows, rows, idx, 8, "probe"))
    first, known, _ = S.teacher_forced(model, ps, fulls)
    actual = rows["rtt"]
    dists = Q.rtt_distributions_at(model, ps, quantiles=(), points=actual, first=first, known=known)
    scored = S.score_rows(model, got, context=8)
    pit = scored.column("pit").to_numpy()
    for k, d in enumerate(dists):
        if actual[k] >= 0:
            x = float(S._values().reshape(-1)[int(S.token_codes([actual[k]])[0])])
            want = min(float(d.probs[d.values_ms <= x].sum()), 1.0)
            assert pit[k] == pytest.approx(want, abs=1e-7)


def test_stream_scores_each_row_once_after_the_rows_before_it(model, tiny_run, planted, scored, tmp_path):
    """The stream policy: every valid row scored, in file order, its context the probe's rows
    before it in its window; the planted packets still rank first; CSV output."""
    from pingctl.infer.score import _stream_windows, score_meta, score_table

    windows = _stream_windows(np.full(100, 17), 248, 16)
    scored_rows = np.concatenate([np.arange(s, b) for _, s, b in windows])
    assert np.array_equal(scored_rows, np.arange(100))  # each once, in order
    assert all(s - a <= 16 and (b - a) * 17 + 8 <= 248 for a, s, b in windows)
    assert all(s - a >= 7 for a, s, _ in windows[1:])  # half the window holds 7 rows of 17 tokens

    path, chosen, _ = planted
    st = score_table(model, path, context=16, context_policy="stream")
    meta = score_meta(st)
    assert meta["context_policy"] == "stream" and st.num_rows == scored.num_rows
    assert st.column("src_addr").to_pylist() == scored.column("src_addr").to_pylist()
    ctx = st.column("context_measurements").to_numpy()
    assert ctx.min() == 0 and ctx.max() > 7
    rtt = st.column("rtt").to_numpy()
    tail, pf, nll = (st.column(c).to_numpy() for c in ("tail_p", "p_fail", "nll"))
    np.testing.assert_allclose(tail[rtt < 0], pf[rtt < 0])
    assert np.isfinite(nll).all() and ((tail >= 0) & (tail <= 1)).all()
    rank = np.empty(len(tail))
    rank[np.lexsort((-nll, tail))] = np.arange(len(tail))
    assert np.median(rank[chosen]) / len(tail) < 0.10
    # close to the probe policy's scores on the same rows (different contexts, same model)
    assert abs(np.median(nll) - np.median(scored.column("nll").to_numpy())) < 1.0

    import pyarrow.csv as pcsv

    out = tmp_path / "scores.csv"
    # stream is the command's default: no flag
    r = runner.invoke(app, ["score", str(tiny_run), str(path), "-o", str(out), "--limit", "300", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    back = pcsv.read_csv(out)
    from pingctl.schema.spreadsheet import spreadsheet_table

    # the CSV names its units and writes times as ISO 8601 UTC (docs/data.md, "CSV and JSON outputs")
    assert back.num_rows == res["rows_scored"] == 298
    # the command also says which predictor answered each row (docs/score.md)
    assert back.column_names == [*spreadsheet_table(st.slice(0, 1)).column_names, "answered_by", "regime"]
    assert set(back.column("answered_by").to_pylist()) == {"model"}  # the shared run holds no combination
    assert res["engine"] == "light" and res["rows_per_s"] > 0 and res["context_policy"] == "stream"
    # the first rows' windows are the same in the whole table's stream (rows are in time order)
    first = st.slice(0, 298).column("nll").to_numpy()
    assert np.abs(back.column("nll").to_numpy() - first).max() < 1e-3


def test_the_shares_below_and_at_a_value_match_the_full_comparison():
    """The PIT's per-first-byte counts by binary search equal the [n, 256, 256] comparison they
    replace, for values that are codes (ties) and values between codes."""
    from pingctl.infer.score import _counts_below_at, _values

    values = _values()
    rng = np.random.default_rng(3)
    x = np.concatenate([values.reshape(-1)[rng.integers(0, 65536, 200)], rng.uniform(0.001, 5e4, 100), [0.0, 1e12]])
    below, at = _counts_below_at(values, x)
    assert np.array_equal(below, (values[None] < x[:, None, None]).sum(axis=2) / 256.0)
    assert np.array_equal(at, (values[None] == x[:, None, None]).sum(axis=2) / 256.0)
    assert at[:200].sum(axis=1).min() >= 1 / 256  # every code is found where it lies
