"""Answers from a trained model: exact distributions, constrained decoding, completions."""

import ipaddress
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.tokenizer import C, validate

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tiny_run):
    from pingctl.infer.model import LoadedModel

    return LoadedModel.load(tiny_run)


@pytest.fixture(scope="module")
def pair(synth_rows):
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr", "ip_version"])
    row = t.filter(t.column("ip_version").to_numpy() == 4).slice(0, 1).to_pylist()[0]
    return row["src_addr"], row["dst_addr"]


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


def test_cli_queries_and_validation(tiny_run, pair, tmp_path):
    src, dst = pair
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--json", "--plot", str(tmp_path / "d.png")])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["mode"] == "distribution" and res["p5_ms"] <= res["p50_ms"] <= res["p95_ms"]
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--rtt", "10-40", "--n", "16", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["candidates"]
    out = tmp_path / "gen.parquet"
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--measurements", "3", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert pq.read_table(out).num_rows == len(json.loads(r.stdout)["measurements"]) > 0
    for args, msg in (
        (["--src", "300.1.1.1", "--dst", dst], "300.1.1.1"),
        (["--src", "1.2.3", "--dst", dst], "not an IP address"),
        (["--src", src, "--dst", "2001:db8::*/32"], "bad CIDR"),
        (["--src", src, "--dst", "2001:db8::/32"], "one family"),
        (["--src", src, "--rtt", "30-10"], "low <= high"),
        (["--dst", dst], "say what to ask"),
    ):
        r = runner.invoke(app, ["sample", str(tiny_run), *args])
        assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output, (args, r.output)
