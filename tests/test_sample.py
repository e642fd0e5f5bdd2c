"""Answers from a trained model: exact distributions, constrained decoding, completions."""

import ipaddress
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.tokenizer import C, validate
from tests.tolerance import assert_probs_close, model_log_tol

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tiny_run):
    from pingctl.infer.model import LoadedModel

    return LoadedModel.load(tiny_run)


def test_rtt_distribution_is_exact_and_matches_sampling(model, pair):
    from pingctl.infer import queries as Q

    prefix = Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)
    d = Q.rtt_distribution(model, prefix)
    assert d.probs.sum() == pytest.approx(1.0, abs=1e-5) and 0.0 <= d.p_fail <= 1.0
    assert np.all(np.diff(d.values_ms) >= 0)
    qs = [d.quantile(q) for q in Q.QUANTILES]
    assert qs == sorted(qs)
    # Sampled first bytes follow the exact first-byte marginal.
    seqs = model.sample(np.concatenate([prefix, [C.RttStart]]).astype(np.int32), n=400, max_tokens=1,
                       rng=np.random.default_rng(0), whole_measurements=False)
    b1 = np.array([s[-1] - Q.BYTE0 for s in seqs])
    p1 = np.bincount((d.codes >> 8).astype(np.int64), weights=d.probs, minlength=256)
    emp = np.bincount(b1, minlength=256) / len(b1)
    assert 0.5 * np.abs(emp - p1).sum() < 0.15  # total variation, 400 samples


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), st.floats(0.0, 0.3))
def test_trimmed_mean_is_the_mean_of_the_central_mass(weights, trim):
    from pingctl.infer.queries import RttDistribution

    w = np.asarray(weights) + 1e-3
    values = np.cumsum(np.arange(1, len(w) + 1, dtype=float))  # increasing, unevenly spaced
    d = RttDistribution(0.0, np.arange(len(w), dtype=np.uint16), values, w / w.sum())
    m = d.trimmed_mean(trim)
    assert d.quantile(trim) - 1e-9 <= m <= d.quantile(1 - trim) + 1e-9
    # the same number from a fine sample of the quantile function
    u = (np.arange(200_000) + 0.5) / 200_000
    u = u[(u > trim) & (u < 1 - trim)]
    ref = values[np.minimum(np.searchsorted(np.cumsum(d.probs), u), len(w) - 1)].mean()
    assert m == pytest.approx(ref, rel=2e-3)
    if trim == 0.0:
        assert m == pytest.approx(d.mean)


def test_trimmed_mean_ignores_a_far_tail():
    from pingctl.infer.queries import RttDistribution

    d = RttDistribution(0.0, np.arange(3, dtype=np.uint16), np.array([10.0, 20.0, 60_000.0]),
                        np.array([0.5, 0.495, 0.005]))
    assert d.mean > 300 and d.trimmed_mean(0.01) == pytest.approx((0.49 * 10 + 0.49 * 20) / 0.98)


def test_distribution_read_at_quantiles_matches_the_exact_one(model, pair):
    from pingctl.infer import queries as Q

    prompts = [Q.query_prefix(*pair, None, np.zeros(0, np.int32), None),
               Q.query_prefix(*pair, 1_700_000_000, np.zeros(0, np.int32), None)]
    exact = Q.rtt_distributions(model, prompts)
    points = [exact[0].quantile(0.4), 3.0]
    calls = []
    real = model.next_log_probs
    model.next_log_probs = lambda seqs: calls.append(len(seqs)) or real(seqs)
    try:
        lazy = Q.rtt_distributions_at(model, prompts, points=points, eps=1e-5)
    finally:
        del model.next_log_probs
    assert sum(calls) < 0.25 * 2 * 256  # a handful of first bytes per prompt, not all 256
    for e, z, x in zip(exact, lazy, points):
        assert z.probs.sum() == pytest.approx(1.0) and z.p_fail == pytest.approx(e.p_fail)
        for q in Q.QUANTILES:
            # the lazy quantile is a point where the exact CDF crosses q
            v = z.quantile(q)
            assert e.cdf(v) >= q - 2e-5 and e.probs[e.values_ms < v].sum() <= q + 2e-5
        assert z.cdf(x) == pytest.approx(e.cdf(x), abs=2e-5)


def test_constrained_generation_is_grammatical(model):
    seqs = model.sample(np.zeros(0, np.int32), n=6, max_tokens=120, rng=np.random.default_rng(1))
    for s in seqs:
        assert validate(s, "compact") == []
        assert len(s) == 0 or s[0] == C.MeasurementStart


def test_timestamped_generation_gives_every_measurement_a_time(model, pair, tmp_path):
    from pingctl.cli.common import read_valid_rows
    from pingctl.infer import queries as Q

    for src in (None, pair[0]):
        streams = Q.generate(model, 4, 5, np.random.default_rng(3), src=src, timestamps=True)
        ms = [d.measurements for d in streams]
        assert sum(len(m) for m in ms) > 0 and all(not d.errors for d in streams)
        assert all(m.has_time.all() for m in ms)
    # the CLI does it by default for a run trained with timestamps: every row is a canonical row
    out = tmp_path / "gen.parquet"
    r = runner.invoke(app, ["sample", str(model.run), "--n", "4", "--measurements", "5", "-o", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["timestamped"] is True, r.output
    table, read = read_valid_rows([out], None)
    assert read["rows_rejected"] == 0 and table.num_rows == read["rows_read"] > 0
    assert table.column("event_time").null_count == 0
    # --since/--until choose the period: every generated time lies in it, and the rows stay canonical
    lo, hi = 1_622_505_600, 1_622_592_000  # 2021-06-01 .. 2021-06-02
    r = runner.invoke(app, ["sample", str(model.run), "--n", "3", "--measurements", "4", "--since",
                            "2021-06-01T00:00:00Z", "--until", str(hi), "-o", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["time_range"] == [lo, hi], r.output
    table, read = read_valid_rows([out], None)
    secs = table.column("event_time").cast(pa.int64()).to_numpy() // 10**6
    assert read["rows_rejected"] == 0 and len(secs) > 0 and lo <= secs.min() and secs.max() <= hi


@pytest.mark.parametrize("which", ["v4", "v6"])
def test_generation_for_one_probe_pins_its_source(model, pair, which):
    from pingctl.infer import queries as Q

    src = pair[0] if which == "v4" else "2001:db8::7"  # v6: an address the model never saw
    streams = Q.generate(model, 3, 4, np.random.default_rng(2), src=src)
    seen = 0
    for d in streams:
        assert not d.errors
        m = d.measurements
        assert all(s == src for s in m.src_text())
        assert all(ipaddress.ip_address(x).version == ipaddress.ip_address(src).version for x in m.dst_text())
        seen += len(m)
    assert seen > 0


def test_completions_respect_fixed_bytes(model, pair):
    from pingctl.infer import queries as Q

    src, dst = pair
    a, b = dst.split(".")[:2]
    found = Q.complete(model, src, f"{a}.{b}.*.*", k=8)
    assert len(found) == 8
    assert all(f["src"] == src and f["dst"].startswith(f"{a}.{b}.") for f in found)
    probs = [f["probability"] for f in found]
    assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
    net = ipaddress.ip_network(f"{a}.{b}.16.0/20")
    for f in Q.complete(model, src, str(net), k=5):
        assert ipaddress.ip_address(f["dst"]) in net


def test_context_per_pair_keeps_the_most_recent_measurements_of_each_pair(model):
    from pingctl.infer import queries as Q
    from pingctl.tokenizer import Measurements

    # out of time order on purpose: the cap must pick by time, not by file position
    src = ["10.0.0.1"] * 6
    dst = ["10.0.1.1", "10.0.2.2", "10.0.1.1", "10.0.3.3", "10.0.1.1", "10.0.2.2"]
    rtt = [11.0, 22.0, 12.0, 33.0, 13.0, 23.0]
    t = [100, 200, 300, 400, 500, 150]
    ctx = Measurements.from_fields(src, dst, rtt, t)
    capped, last = Q.context_tokens(model, ctx, 400, per_pair=1)
    # the most recent of each pair: 10.0.1.1 at 500, 10.0.2.2 at 200, 10.0.3.3 at 400
    keep = [4, 1, 3]
    want, want_last = Q.context_tokens(model, Measurements.from_fields(
        [src[i] for i in keep], [dst[i] for i in keep], [rtt[i] for i in keep], [t[i] for i in keep]), 400)
    assert np.array_equal(capped, want) and last == want_last == 500
    full, _ = Q.context_tokens(model, ctx, 400)
    two, _ = Q.context_tokens(model, ctx, 400, per_pair=2)
    assert len(capped) < len(two) < len(full)


def test_untimed_context_has_no_timestamps_and_the_same_measurements():
    from pingctl.infer import queries as Q
    from pingctl.tokenizer import C, Measurements, decode

    ctx = Measurements.from_fields(["10.0.0.1"] * 4, ["10.0.1.1", "10.0.2.2", "10.0.3.3", "10.0.4.4"],
                                   [11.0, -1.0, 33.0, 44.0], [400, 100, 300, 200])
    timed, last = Q.context_tokens(None, ctx, 400)
    plain, none = Q.context_tokens(None, ctx, 400, timed=False)
    assert last == 400 and none is None and len(plain) < len(timed)
    assert not {C.TimestampAbs, C.TimestampDelta1, C.TimestampDelta4} & set(plain.tolist())
    a, b = decode(timed, "compact").measurements, decode(plain, "compact").measurements
    assert list(b.dst_text()) == list(a.dst_text()) == ["10.0.2.2", "10.0.4.4", "10.0.3.3", "10.0.1.1"]
    assert np.array_equal(a.rtt_ms, b.rtt_ms) and not b.has_time.any()
    # a tight budget keeps the most recent measurements in both forms
    short, _ = Q.context_tokens(None, ctx, 8 + 2 * 14, timed=False)
    assert list(decode(short, "compact").measurements.dst_text()) == ["10.0.3.3", "10.0.1.1"]


def test_run_trained_without_timestamps_is_asked_without_them(tiny_run, synth_rows, pair, tmp_path):
    import shutil

    from pingctl.infer.model import LoadedModel

    run = tmp_path / "untimed"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert LoadedModel.load(run).timestamps  # the fixture trained with the default mode mix
    cfg["loader"]["mode_weights"] = [0.0, 0.0, 1.0]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert not LoadedModel.load(run).timestamps
    src, dst = pair
    ctx = tmp_path / "ctx.parquet"
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet")
    pq.write_table(t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 5), ctx)
    args = ["sample", "--src", src, "--dst", dst, "--context", str(ctx), "--context-per-pair", "0", "--json"]
    r_timed = runner.invoke(app, [args[0], str(tiny_run), *args[1:]])
    r_plain = runner.invoke(app, [args[0], str(run), *args[1:]])
    assert r_timed.exit_code == 0 and r_plain.exit_code == 0, r_timed.output + r_plain.output
    timed, plain = json.loads(r_timed.stdout), json.loads(r_plain.stdout)
    assert timed["timestamps"] and not plain["timestamps"]
    assert plain["context_tokens"] < timed["context_tokens"]  # the same five measurements, no timestamps
    r = runner.invoke(app, ["sample", str(run), "--src", src, "--dst", dst, "--time", "2024-01-01T12:00:00Z"])
    assert r.exit_code != 0 and "trained without timestamps" in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(app, ["sample", str(run), "--n", "2", "--timestamps"])
    assert r.exit_code == 2 and "cannot generate them" in r.output, r.output
    r = runner.invoke(app, ["sample", str(run), "--n", "2", "--measurements", "2", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["timestamped"] is False, r.output
    r = runner.invoke(app, ["sample", str(run), "--n", "2", "--since", "2021-01-01"])
    assert r.exit_code == 2 and "--since/--until" in r.output and "no times to bound" in r.output, r.output


def test_run_trained_with_the_result_last_refuses_rtt_first_questions(tiny_run, pair, tmp_path):
    import shutil

    run = tmp_path / "result-last"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["loader"]["result_last"] = 1.0
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    src, dst = pair
    for args in (["--src", src, "--rtt", "10-30"], ["--src", src, "--dst", "8.8.*.*", "--rtt", "20"]):
        ok = runner.invoke(app, ["sample", str(tiny_run), *args, "--json"])
        assert ok.exit_code == 0, ok.output  # the fixture's run saw RTTs in every position
        r = runner.invoke(app, ["sample", str(run), *args])
        assert r.exit_code == 2 and "result_last=1" in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(app, ["sample", str(run), "--src", src, "--dst", dst, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["mode"] == "distribution", r.output


def test_cli_queries_and_validation(tiny_run, synth_rows, pair, tmp_path):
    src, dst = pair
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--json", "--plot", str(tmp_path / "d.png")])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["mode"] == "distribution" and res["p5_ms"] <= res["p50_ms"] <= res["p95_ms"]
    assert res["device"] == "cpu"  # the fixture trained for the CPU, and is asked there
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    # the exact distribution itself, for the user's own analysis
    for name in ("dist.parquet", "dist.json"):
        r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "-o", str(tmp_path / name), "--json"])
        assert r.exit_code == 0, r.output
        q = json.loads(r.stdout)
        if name.endswith(".json"):
            d = json.loads((tmp_path / name).read_text())
            p_fail, v, p = d["p_fail"], np.array(d["rtt_ms"]), np.array(d["probability"])
        else:
            t = pq.read_table(tmp_path / name)
            p_fail = json.loads(t.schema.metadata[b"pingctl"])["p_fail"]
            v, p = t.column("rtt_ms").to_numpy(), t.column("probability").to_numpy()
        assert len(v) == 65536 and abs(p.sum() - 1) < 1e-9 and p_fail == pytest.approx(q["p_fail"])
        assert v[np.searchsorted(np.cumsum(p), 0.5)] == pytest.approx(q["p50_ms"])
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--rtt", "10-40", "--n", "16", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["candidates"]
    out = tmp_path / "gen.parquet"
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--measurements", "3", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert pq.read_table(out).num_rows == len(json.loads(r.stdout)["measurements"]) > 0
    # times in JSON as ISO 8601 with a Z, as ingest writes them (was Python's "2024-01-02 07:01:43+00:00")
    out = tmp_path / "gen.json"
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--measurements", "3", "--out", str(out), "--json"])
    times = [x["event_time"] for x in json.loads(out.read_text())]
    assert r.exit_code == 0 and len(times) == len(json.loads(r.stdout)["measurements"]) > 0, r.output
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", t) for t in times if t is not None), times
    assert any(t is not None for t in times)
    # streams of one probe, after a context of its own measurements
    ctx = tmp_path / "ctx.parquet"
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet")
    pq.write_table(t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 5), ctx)
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--n", "2", "--measurements", "3",
                            "--context", str(ctx), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["mode"] == "generate" and res["context_tokens"] > 0 and res["measurements"]
    assert {m["src"] for m in res["measurements"]} == {src}
    trained = yaml.safe_load((tiny_run / "config.yaml").read_text())["loader"]["max_per_pair"]
    assert res["context_per_pair"] == trained  # the default: contexts shaped as in training
    r1 = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--context", str(ctx),
                             "--context-per-pair", "1", "--json"])
    r0 = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--context", str(ctx),
                             "--context-per-pair", "0", "--json"])
    assert r1.exit_code == 0 and r0.exit_code == 0, r1.output + r0.output
    n_pairs = len(set(t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 5).column("dst_addr").to_pylist()))
    assert n_pairs < 5  # a result's packets share their pair, so the five repeat one
    assert json.loads(r1.stdout)["context_tokens"] < json.loads(r0.stdout)["context_tokens"]
    # a context row build-rows would reject (1e300 ms) is skipped, named, and not in the prompt
    mine = t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 6)
    rtt = mine.column("rtt").to_pylist()
    rtt[2] = 1e300
    bad = tmp_path / "ctx_bad.parquet"
    pq.write_table(mine.set_column(mine.schema.get_field_index("rtt"), "rtt", pa.array(rtt, pa.float64())), bad)
    pq.write_table(pa.concat_tables([mine.slice(0, 2), mine.slice(3)]), tmp_path / "ctx_good.parquet")
    got = {}
    for name in ("ctx_bad", "ctx_good"):
        r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--context",
                                str(tmp_path / f"{name}.parquet"), "--context-per-pair", "0", "--json"])
        assert r.exit_code == 0, r.output
        got[name] = json.loads(r.stdout)
    assert got["ctx_bad"]["context_rows"]["rows_read"] == 6 and got["ctx_bad"]["context_rows"]["rows_rejected"] == 1
    assert got["ctx_bad"]["context_rows"]["rejected"]["bad_rtt"]["first"]["row"] == 2
    assert got["ctx_bad"]["context_tokens"] == got["ctx_good"]["context_tokens"] > 0
    assert got["ctx_bad"]["p50_ms"] == got["ctx_good"]["p50_ms"]
    nullrtt = t.slice(0, 3)
    pq.write_table(nullrtt.set_column(nullrtt.schema.get_field_index("rtt"), "rtt",
                                      pa.nulls(3, pa.float64())), tmp_path / "nullrtt.parquet")
    for args, msg in (
        (["--src", "300.1.1.1", "--dst", dst], "300.1.1.1"),
        (["--src", "1.2.3", "--dst", dst], "not an IP address"),
        (["--src", src, "--dst", "2001:db8::*/32"], "bad CIDR"),
        (["--src", src, "--dst", "2001:db8::/32"], "one family"),
        (["--src", src, "--dst", "2001:db8::1"], "--src is IPv4 but --dst is IPv6"),
        (["--src", src, "--rtt", "30-10"], "low <= high"),
        (["--dst", dst], "say what to ask"),
        (["--src", src, "--dst", dst, "--context-per-pair", "-1"], "--context-per-pair must be >= 0"),
        (["--src", src, "--dst", dst, "--context", str(tmp_path / "missing.parquet")], "missing.parquet"),
        (["--src", src, "--dst", dst, "--step", "99999"], "no checkpoint at step 99999 (checkpoints: 0"),
        (["--src", src, "--dst", dst, "--step", "0,99999"], "no checkpoint at step 99999 (checkpoints: 0"),
        (["--src", src, "--dst", dst, "--step", "0,last"], "steps separated by commas"),
        (["--src", src, "--dst", dst, "--step", "0,0"], "must be distinct"),
        (["--src", src, "--rtt", "nan"], "need finite"),
        (["--src", src, "--dst", dst, "--n", "3"], "--n does not apply to an RTT distribution"),
        (["--src", src, "--rtt", "20", "--plot", str(tmp_path / "p.png")], "--plot does not apply to inverse"),
        (["--src", src, "--dst", "8.8.*.*", "--out", str(tmp_path / "c.parquet")], "--out does not apply to a compl"),
        (["--src", src, "--dst", "8.8.*.*", "--rtt", "10-30"], "conditions on one RTT"),
        (["--src", src, "--rtt", "10-inf"], "need finite"),
        (["--src", src, "--dst", "8.8.*.*", "--rtt", "1e12"], "the RTT code ends at"),
        (["--n", "0"], "--n"),
        (["--n", "2", "--measurements", "0"], "--measurements"),
        (["--src", src, "--dst", "8.8.*.*", "-k", "-2"], "-k"),
        (["--n", "1", "--out", str(tmp_path / "gen.txt")], ".parquet, .csv or .json"),
        (["--src", src, "--dst", dst, "--time", "9" * 25], "not a valid time"),
        (["--src", src, "--dst", dst, "--context", str(tmp_path / "nullrtt.parquet")], "nullrtt.parquet: no valid rows"),
    ):
        r = runner.invoke(app, ["sample", str(tiny_run), *args])
        assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output, (args, r.output)


def test_averaged_checkpoints_hold_the_mean_of_their_weights(tiny_run, pair):
    import jax

    from pingctl.infer.model import LoadedModel
    from pingctl.artifacts.run import checkpoint_steps

    have = checkpoint_steps(tiny_run)
    first, last = have[0], have[-1]
    assert first < last
    a, b = LoadedModel.load(tiny_run, first), LoadedModel.load(tiny_run, last)
    m = LoadedModel.load(tiny_run, [last, first])
    assert (m.step, m.steps, b.steps) == (last, (first, last), (last,))
    floats = 0
    for x, y, z in zip(jax.tree.leaves(a.net.state), jax.tree.leaves(b.net.state), jax.tree.leaves(m.net.state), strict=True):
        if jax.numpy.issubdtype(x.dtype, jax.numpy.floating):  # not RNG keys
            x, y, z = np.asarray(x), np.asarray(y), np.asarray(z)
            floats += 1
            np.testing.assert_allclose(z, (x + y) / 2, rtol=1e-5, atol=1e-6)
    assert floats > 4
    # the forward pass runs on the averaged weights, not on either checkpoint's
    seq = [np.array([C.MeasurementStart, C.SrcIPv4, *range(11, 15)], dtype=np.int32)]
    la, lb, lm = (mdl.log_probs(seq)[0] for mdl in (a, b, m))
    assert not np.allclose(lm, la) and not np.allclose(lm, lb)


def test_damaged_run_is_a_clear_error(tiny_run, pair, tmp_path):
    """A truncated checkpoint or a mangled config.yaml: one message naming it, no traceback pages."""
    import shutil
    import subprocess
    import sys

    from pingctl.artifacts.run import checkpoint_steps

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    last = checkpoint_steps(run)[-1]
    for f in (run / "maxtext" / "checkpoints" / str(last) / "items" / "d").iterdir():
        f.write_bytes(f.read_bytes()[:100])
    src, dst = pair
    cmd = [sys.executable, "-m", "pingctl", "sample", str(run), "--src", src, "--dst", dst]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"checkpoints/{last}: cannot restore this checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr and "Task exception" not in proc.stderr, proc.stderr[-2000:]
    (run / "config.yaml").write_text("loader: [\n")
    r = runner.invoke(app, ["sample", str(run), "--src", src, "--dst", dst])
    assert r.exit_code == 1 and "config.yaml: not the config" in r.output, r.output


def test_stream_table_shows_utc_times_and_failures_in_words():
    from pingctl.cli.sample_cmd import _cell

    assert _cell("time", 1_676_064_641) == "2023-02-10 21:30:41"
    assert _cell("time", None) == "-"
    assert _cell("time", 139_127_374_000_000) == "139127374000000 (Unix s)"  # a model may generate any time
    assert _cell("rtt_ms", -1.0) == "failed" and _cell("rtt_ms", 12.5) == "12.500"
    assert _cell("probability", 0.12345) == "0.1235"


def test_cli_refuses_bad_options_before_the_model_loads(tmp_path):
    """Each of these is refused by the CLI itself: the run does not even exist, so an error
    raised after the model load would read 'not a `pingctl train` run directory'."""
    run = str(tmp_path / "no-run")
    (tmp_path / "afile").write_text("x")
    v4, v4b = "78.143.22.26", "194.255.199.229"
    for args, msg, code in (
        (["--n", "2", "--seed", "-1"], "--seed", 2),
        (["--n", "2", "--set", "sample.seed=-1"], "sample.seed = -1", 2),
        (["--src", v4, "--dst", v4b, "--time", "²"], "--time '²': expected ISO 8601", 2),
        (["--src", v4, "--rtt", "10-"], "a range needs both ends", 2),
        (["--src", "fe80::1%eth0", "--dst", "::1"], "--src 'fe80::1%eth0': an IPv6 zone id", 2),
        (["--src", "::1", "--dst", "fe80::1%eth0"], "--dst 'fe80::1%eth0': an IPv6 zone id", 2),
        (["--src", "::ffff:78.143.22.26", "--dst", v4b], "IPv4-mapped IPv6 address; measurements record the IPv4 "
         "address itself: ask for 78.143.22.26", 2),
        (["--src", v4, "--dst", "::ffff:808:0/112"], "ask for 8.8.0.0/16", 2),
        (["--src", v4, "--dst", "8.8.*.*", "--time", "5"], "--time does not apply to a completion", 2),
        (["--src", v4, "--rtt", "20", "--time", "5"], "--time does not apply to inverse search", 2),
        (["--n", "2", "--time", "5"], "--time does not apply to generation", 2),
        (["--n", "2", "--context-per-pair", "3"], "--context-per-pair caps measurements from --context", 2),
        (["--src", v4, "--dst", v4b, "--timestamps"], "--timestamps/--no-timestamps does not apply to an RTT", 2),
        (["--src", v4, "--rtt", "20", "--no-timestamps"], "--timestamps/--no-timestamps does not apply to inverse", 2),
        (["--src", v4, "--dst", v4b, "--plot", str(tmp_path / "afile" / "d.png")], "--plot", 1),
        (["--src", v4, "--dst", v4b, "-o", str(tmp_path / "afile" / "d.json")], "--out", 1),
        (["--dst", "2001:db8::/32", "--src", "10.0.0.0/8"], "--src is IPv4 but --dst is IPv6", 2),
        # options a mode would silently ignore are refused, as --n/--out/--plot/--time are
        (["--src", v4, "--dst", v4b, "-k", "3"], "-k does not apply to an RTT distribution", 2),
        (["--n", "2", "-k", "3"], "-k does not apply to generation", 2),
        (["--src", v4, "--rtt", "20", "--measurements", "3"], "--measurements does not apply to inverse", 2),
        (["--src", v4, "--dst", v4b, "--seed", "3"], "--seed does not apply to an RTT distribution", 2),
        (["--src", v4, "--dst", "8.8.*.*", "--temperature", "0.5"], "--temperature does not apply to a compl", 2),
        (["--src", v4, "--rtt", "20", "--top-p", "0.9"], "--top-p does not apply to inverse search", 2),
        (["--src", v4, "--dst", v4b, "--since", "2021-01-01"], "--since does not apply to an RTT distribution", 2),
        (["--n", "2", "--since", "2021-01-02", "--until", "2021-01-01"], "is after --until", 2),
        (["--n", "2", "--until", "1999-12-31"], "--until 1999-12-31 00:00:00: generated rows are canonical", 2),
        (["--n", "2", "--since", "2999-01-01"], "shard would set this one aside", 2),
        (["--n", "2", "--since", "soon"], "--since 'soon'", 2),
        (["--src", v4, "--dst", v4b, "--hardware", "tpu"], "--hardware 'tpu': expected one of cpu, gpu", 2),
        (["--pairs", str(tmp_path / "afile"), "--hardware", "cuda"], "--hardware 'cuda'", 2),
    ):
        r = runner.invoke(app, ["sample", run, *args])
        assert r.exit_code == code and msg in r.output and "Traceback" not in r.output, (args, r.output)
        assert "not a `pingctl train` run" not in r.output, (args, r.output)
    # these pass every early check, so the first error is the missing run
    for args in (["--dst", "2a09:6189::/32", "-k", "2"], ["--src", "2a09:6189::/32"], ["--dst", "8.8.*.*"],
                 ["--src", " 78.143.22.26", "--dst", v4b], ["--src", v4, "--dst", v4b, "--time", "-5"],
                 ["--src", v4, "--rtt", "20", "-k", "3", "--seed", "1", "--temperature", "0.5"],
                 ["--n", "2", "--measurements", "3", "--seed", "1", "--temperature", "0.5", "--top-p", "0.9"],
                 ["--src", v4, "--dst", v4b, "--plot", str(tmp_path / "new" / "d.png")]):
        r = runner.invoke(app, ["sample", run, *args])
        assert r.exit_code == 1 and "not a `pingctl train` run" in r.output, (args, r.output)


def test_option_parsers_take_what_the_prompt_builder_takes():
    from pingctl.cli.common import option_time as _parse_time
    from pingctl.infer.questions import address_option as _address_option, rtt_range as _rtt_range
    from pingctl.errors import PingctlError
    from pingctl.infer import queries as Q

    assert _address_option(" 78.143.22.26\t", "--src") == "78.143.22.26" and _address_option(None, "--src") is None
    Q.query_prefix(_address_option(" 78.143.22.26", "--src"), "1.2.3.4", None,
                   np.zeros(0, np.int32), None)
    assert _parse_time("-5") == -5 and _parse_time("1700000000") == 1_700_000_000
    for bad in ("²", "١٢", "9" * 25, "-" + "9" * 25):
        with pytest.raises(PingctlError, match="--time"):
            _parse_time(bad)
    assert _rtt_range("1e-3") == (0.001, 0.001) and _rtt_range("1e-3-2E-2") == (0.001, 0.02)
    assert _rtt_range("10-30") == (10.0, 30.0) and _rtt_range("20") == (20.0, 20.0)
    for bad, msg in (("10-", "both ends"), ("-5", "0 <= low"), ("1e-", "milliseconds like 20")):
        with pytest.raises(PingctlError, match=msg):
            _rtt_range(bad)
    # the side of a completion left out is any address of the other side's family
    assert Q.parse_pair(Q.any_address(6), "2a09:6189::/32")[0][0] == 6
    assert Q.parse_pair("8.8.*.*", Q.any_address(4))[1][0] == 4


def test_tiny_probabilities_stay_distinguishable():
    from pingctl.cli.sample_cmd import _cell

    assert _cell("probability", 0.5) == "0.5000"
    small = [_cell("probability", p) for p in (6.468e-08, 6.166e-08, 5e-5)]
    assert len(set(small)) == 3 and all(float(s) > 0 for s in small)


def test_one_sided_ipv6_completion_and_padded_address_are_answered(tiny_run, pair):
    src, dst = pair
    r = runner.invoke(app, ["sample", str(tiny_run), "--dst", "2001:db8::/32", "-k", "2", "--json"])
    assert r.exit_code == 0, r.output
    found = json.loads(r.stdout)["completions"]
    assert len(found) == 2 and all(ipaddress.ip_address(f["src"]).version == 6 for f in found)
    assert all(ipaddress.ip_address(f["dst"]) in ipaddress.ip_network("2001:db8::/32") for f in found)
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", f" {src} ", "--dst", dst, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["src"] == src, r.output


@pytest.mark.parametrize("context_time", [None, 1_700_000_000, 4_000_000_000])
def test_generated_times_stay_in_the_range_asked(model, pair, context_time):
    """Absolute times by their bytes, deltas by how far they move the clock: every generated
    time lands in [lo, hi], whatever the (60-step, undertrained) model prefers; a context whose
    clock is already past hi (4e9: year 2096) can only be followed by an absolute time."""
    from pingctl.infer import queries as Q
    from pingctl.tokenizer import Measurements

    lo, hi = 1_600_000_000, 1_700_100_000
    ctx = np.zeros(0, np.int32)
    if context_time is not None:
        ctx, _ = Q.context_tokens(model, Measurements.from_fields([pair[0]], [pair[1]], [20.0], [context_time]), 200)
    streams = Q.generate(model, 6, 6, np.random.default_rng(5), context=ctx, timestamps=True, time_range=(lo, hi))
    times = np.concatenate([d.measurements.time_s[d.measurements.has_time] for d in streams])
    assert len(times) == sum(len(d.measurements) for d in streams) > 0
    assert times.min() >= lo and times.max() <= hi, (times.min(), times.max())


def test_bench_sample_times_every_case_it_names(tiny_run, tmp_path):
    """Both engines by default (MaxText is installed here), each with its load, its first
    answer and the same steady cases."""
    from pingctl.infer.model import LoadedModel

    out = tmp_path / "bench.json"
    r = runner.invoke(app, ["bench", "sample", str(tiny_run), "--queries", "3", "--context", "0,4",
                            "--exact-queries", "1", "--streams", "2", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res == json.loads(r.stdout) and res["step"] == LoadedModel.load(tiny_run).step
    assert res["engines"] == ["light", "maxtext"]
    for engine in res["engines"]:
        table = [row for row in res["table"] if row["engine"] == engine]
        cases = [row["case"] for row in table]
        # the fixture's seq_len is 256
        assert cases[:4] == ["load", "first answer", "forward 32x64", "forward 32x256"], cases
        lazy = [row for row in table if row["case"].startswith("lazy")]
        exact = [row for row in table if row["case"].startswith("exact")]
        assert [row["questions"] for row in lazy] == [3, 3] and [row["questions"] for row in exact] == [1, 1]
        # a context lengthens the prompt by its measurements' tokens
        assert lazy[0]["case"] == "lazy, ctx 0" and lazy[1]["case"] == "lazy, ctx 4"
        assert lazy[1]["prompt_tokens"] > lazy[0]["prompt_tokens"] + 4 * 10
        for row in table:
            assert row["seconds"] > 0
            if row["per_s"] is not None:  # not for the one-off load and first answer
                # the report rounds seconds to the ms and per_s to the hundredth: per_s lies within
                # both roundings of the rate the rounded seconds allow
                q, sec = row["questions"], row["seconds"]
                assert q / (sec + 5e-4) - 5e-3 <= row["per_s"] <= q / max(sec - 5e-4, 1e-9) + 5e-3
        gen = table[-1]
        assert gen["case"] == "generate 2x4" and gen["tokens_per_s"] > 0


def test_shared_kv_cache_gives_the_whole_sequence_numbers(tiny_run, pair, monkeypatch):
    """The MaxText engine's second-byte passes from one prefilled cache per prompt (MaxEngine)
    against whole sequences: the same distributions, to float32 noise (the light engine's
    cache: tests/test_light_engine.py)."""
    from pingctl.infer.engines.maxtext import kv as MKV
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel
    from pingctl.tokenizer import Measurements

    plain = LoadedModel.load(tiny_run, engine="maxtext")
    ctx, last = Q.context_tokens(plain, Measurements.from_fields(
        [pair[0]] * 3, [pair[1]] * 3, [20.0, 21.0, -1.0], [1_700_000_000, 1_700_000_060, 1_700_000_120]), 200)
    # prompts of different lengths (one with a context) share the decode slots of one step
    prompts = [Q.query_prefix(*pair, None, np.zeros(0, np.int32), None), Q.query_prefix(*pair, 1_700_000_200, ctx, last),
               Q.query_prefix(pair[1], pair[0], None, ctx, last)]
    monkeypatch.setenv("PINGCTL_KV_CACHE", "0")
    want = Q.rtt_distributions(plain, prompts)
    want_at = Q.rtt_distributions_at(plain, prompts, eps=1e-4)
    assert plain._kv is None  # the switch kept it off
    monkeypatch.delenv("PINGCTL_KV_CACHE")
    monkeypatch.setattr(MKV, "MIN_TOKENS", 0)
    monkeypatch.setattr(MKV, "MIN_PROMPT", 0)
    cached = LoadedModel.load(tiny_run, engine="maxtext")
    got = Q.rtt_distributions(cached, prompts)
    assert isinstance(cached._kv, MKV.SecondBytes)  # the cache answered
    got_at = Q.rtt_distributions_at(cached, prompts, eps=1e-4)
    # each code's probability: two log-probabilities, the second byte's from the cache or a whole pass
    tol = 2 * model_log_tol(plain, [np.append(p, C.RttStart).astype(np.int32) for p in prompts], tiny_run)
    for w, g in zip(want, got):
        assert_probs_close([g.p_fail], [w.p_fail], tol, "p_fail")
        assert_probs_close(g.probs, w.probs, tol, "cached against whole")
        assert g.probs.sum() == pytest.approx(1.0)
        assert [g.quantile(q) for q in Q.QUANTILES] == [w.quantile(q) for q in Q.QUANTILES]
    for w, g in zip(want_at, got_at):
        assert [g.quantile(q) for q in Q.QUANTILES] == [w.quantile(q) for q in Q.QUANTILES]
    # a cache that fails mid-way (device memory, say) leaves the whole-sequence path, same numbers
    monkeypatch.setattr(MKV.SecondBytes, "log_probs", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("oom")))
    # the rule is per call: prompts shorter than MIN_PROMPT never reach the built cache
    monkeypatch.setattr(MKV, "MIN_PROMPT", len(prompts[0]) + 2)
    short = Q.rtt_distributions(cached, prompts[:1])[0]
    assert isinstance(cached._kv, MKV.SecondBytes)
    assert_probs_close(short.probs, want[0].probs, tol, "short prompt")
    monkeypatch.setattr(MKV, "MIN_PROMPT", 0)
    again = Q.rtt_distributions(cached, prompts[:1])[0]
    assert cached._kv is False
    assert_probs_close(again.probs, want[0].probs, tol, "after the cache failed")
    # averaged weights have no single checkpoint for the engine: whole sequences, same numbers
    avg = LoadedModel.load(tiny_run, [cached.step, cached.step], engine="maxtext")
    assert avg.net.items is None and Q.rtt_distributions(avg, prompts[:1])[0].quantile(0.5) == want[0].quantile(0.5)


def test_a_run_trained_with_gpu_flash_attention_is_asked_on_this_cpu(model, tiny_run, pair, tmp_path):
    # `train.attention: auto` trains one GPU with MaxText's flash kernel, which on a CPU names TPU
    # kernels; the weights are the same whatever the kernel, so inference always uses dot_product.
    import shutil

    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    run = tmp_path / "gpu-flash"
    shutil.copytree(tiny_run, run)
    yml = (run / "maxtext.yml").read_text()
    assert 'attention: "dot_product"' in yml
    (run / "maxtext.yml").write_text(yml.replace('attention: "dot_product"', 'attention: "flash"'))
    prefix = Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)
    want, got = Q.rtt_distribution(model, prefix), Q.rtt_distribution(LoadedModel.load(run), prefix)
    assert got.p_fail == pytest.approx(want.p_fail, abs=1e-6)
    np.testing.assert_allclose(got.probs, want.probs, atol=1e-6)


def test_hardware_option_picks_where_the_model_runs(model, tiny_run, pair, tmp_path):
    """A run trained for a GPU is asked on this CPU by default (JAX finds no GPU), and with
    --hardware cpu MaxText is told so; an explicit --hardware gpu here is refused, named,
    rather than run quietly on the CPU."""
    import shutil

    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    run = tmp_path / "gpu-run"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"]["hardware"] = "gpu"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    prefix = Q.query_prefix(*pair, None, np.zeros(0, np.int32), None)
    want = Q.rtt_distribution(model, prefix)
    default, cpu = LoadedModel.load(run), LoadedModel.load(run, hardware="cpu")
    assert (default.net.source.hardware, default.device) == ("gpu", "cpu")
    assert (cpu.net.source.hardware, cpu.device) == ("cpu", "cpu")
    for m in (default, cpu):
        np.testing.assert_allclose(Q.rtt_distribution(m, prefix).probs, want.probs, atol=1e-6)
    r = runner.invoke(app, ["sample", str(run), "--src", pair[0], "--dst", pair[1], "--hardware", "gpu"])
    assert r.exit_code == 1 and "--hardware gpu: JAX finds no GPU on this machine (devices: cpu)" in r.output, r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["bench", "sample", str(run), "--hardware", "gpu", "--queries", "1"])
    assert r.exit_code == 1 and "JAX finds no GPU" in r.output, r.output
