"""`pingctl inspect` of what `pingctl sample` writes, on hand-made files (no model needed)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.artifacts.sample_output import write_predictions

runner = CliRunner()

COLUMNS = {"line": [2, 3, 5, 6], "src": ["1.2.3.4", "1.2.3.4", "5.6.7.8", "2001:db8::1"],
           "dst": ["8.8.8.8", "9.9.9.9", "8.8.8.8", "2001:db8::2"], "ip_version": [4, 4, 4, 6],
           "time": [None, 1704283200, None, None], "p_fail": [0.01, 0.02, 0.5, 0.03],
           "mean_ms": [20.0, 30.0, 40.0, 50.0], "trimmed_mean_ms": [19.0, 29.0, 39.0, 49.0],
           "p5_ms": [5.0, 6.0, 7.0, 8.0], "p25_ms": [10.0, 11.0, 12.0, 13.0], "p50_ms": [18.0, 28.0, 38.0, 48.0],
           "p75_ms": [25.0, 35.0, 45.0, 55.0], "p95_ms": [40.0, 50.0, 60.0, 70.0], "context_measurements": [0, 2, 4, 6]}
META = {"run": "runs/x", "step": 7, "steps": [7], "timestamps": True, "pairs": "p.csv", "exact": False}


def _inspect(path, *args):
    r = runner.invoke(app, ["inspect", str(path), "--json", *args])
    return r.exit_code, (json.loads(r.stdout) if r.exit_code == 0 else r.output)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_predictions_are_described_in_every_format(tmp_path, suffix):
    out = tmp_path / f"p{suffix}"
    write_predictions(COLUMNS, out, META)
    (tmp_path / "p.rejects.jsonl").write_text('{"line": 4}\n{"line": 7}\n')
    code, d = _inspect(out, "-n", "3")
    assert code == 0, d
    assert d["kind"] == "predictions" and (d["rows"], d["rows_set_aside"]) == (4, 2)
    assert (d["distinct_pairs"], d["sources"], d["destinations"], d["v4_rows"], d["v6_rows"]) == (4, 3, 3, 3, 1)
    assert d["rows_with_time"] == 1 and d["context_measurements_mean"] == 3.0
    assert d["p_fail"]["max"] == 0.5 and d["p50_ms"]["min"] == 18.0 and d["p50_ms"]["p50"] == 33.0
    assert len(d["sample"]) == 3
    # the run and step live in the file's metadata; CSV has none
    assert (d["run"], d["step"]) == ((None, None) if suffix == ".csv" else ("runs/x", 7))
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0 and "2 (read 6;" in r.output, r.output


def test_a_damaged_output_is_named_not_misread(tmp_path):
    bad = dict(COLUMNS, p_fail=[0.01, float("nan"), 0.5, 0.03])
    write_predictions(bad, tmp_path / "p.parquet", META)
    code, msg = _inspect(tmp_path / "p.parquet")
    assert code == 1 and "p.parquet: row 1 holds no valid prediction" in msg and "Traceback" not in msg
    (tmp_path / "s.csv").write_text("src,dst,p_fail,p50_ms\n1.2.3.4,8.8.8.8,abc,20\n")
    code, msg = _inspect(tmp_path / "s.csv")
    assert code == 1 and "s.csv: column p_fail holds string values, not numbers" in msg
    for text in ('{"predictions": [1]}', '{"code": [1], "rtt_ms": ["x"], "probability": [1.0]}'):
        (tmp_path / "j.json").write_text(text)
        code, msg = _inspect(tmp_path / "j.json")
        assert code == 1 and "j.json: " in msg and "internal error" not in msg, (text, msg)
    vals = np.linspace(1, 100, 50)
    probs = np.full(50, 0.03)  # sums to 1.5
    t = pa.table({"code": pa.array(np.arange(50), pa.uint16()), "rtt_ms": vals, "probability": probs})
    pq.write_table(t, tmp_path / "d.parquet")
    code, msg = _inspect(tmp_path / "d.parquet")
    assert code == 1 and "do not form a distribution (sum 1.5" in msg
    (tmp_path / "x.json").write_text("[1, 2]")
    code, msg = _inspect(tmp_path / "x.json")
    assert code == 1 and "not a Parquet file, a pingctl output directory or a `pingctl sample` output" in msg
    code, msg = _inspect(tmp_path / "d.parquet", "-n", "2")
    assert code == 2 and "--sample shows rows" in msg


def test_a_distribution_reads_back_its_quantiles(tmp_path):
    from pingctl.artifacts.sample_output import write_distribution
    from pingctl.infer.queries import RttDistribution

    rng = np.random.default_rng(1)
    vals = np.sort(rng.uniform(1, 300, 500))
    probs = rng.dirichlet(np.ones(500))
    d = RttDistribution(0.125, np.arange(500, dtype=np.uint16), vals, probs)
    for suffix in (".parquet", ".json"):
        out = tmp_path / f"d{suffix}"
        write_distribution(d, out, "1.2.3.4", "8.8.8.8")
        code, got = _inspect(out)
        assert code == 0, got
        assert got["kind"] == "distribution" and (got["src"], got["dst"], got["codes"]) == ("1.2.3.4", "8.8.8.8", 500)
        for k, v in d.summary().items():
            assert got[k] == pytest.approx(v, rel=1e-12), k


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_inspect_never_crashes_on_arbitrary_sample_outputs(tmp_path, suffix):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    cells = st.one_of(st.text(max_size=6), st.integers(-5, 5).map(str), st.sampled_from(["", "nan", "1e400", "-1"]))
    tables = st.lists(st.lists(cells, min_size=1, max_size=5), max_size=4).map(
        lambda rows: "src,dst,p_fail,p50_ms\n" + "\n".join(",".join(r) for r in rows))
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=4))
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                          max_leaves=8)
    keys = st.sampled_from(["predictions", "src", "dst", "p_fail", "p50_ms", "code", "rtt_ms", "probability", "run",
                            "step", "steps", "exact"])
    documents = st.one_of(
        st.dictionaries(keys, values, max_size=5),
        st.lists(st.fixed_dictionaries({}, optional={k: values for k in ("src", "dst", "p_fail", "p50_ms")}),
                 max_size=3).map(lambda rows: {"predictions": rows}),
        st.fixed_dictionaries({k: st.lists(scalars, min_size=1, max_size=3) for k in ("code", "rtt_ms", "probability")}),
    ).map(json.dumps)

    @settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.one_of(st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                     tables if suffix == ".csv" else documents))
    def check(text):
        f = tmp_path / f"fuzz{suffix}"
        f.write_text(text, encoding="utf-8", errors="surrogateescape")
        for args in (["--json"], []):  # the printed tables as well as the JSON
            r = runner.invoke(app, ["inspect", str(f), *args])
            assert r.exit_code in (0, 1, 2) and "Traceback" not in r.output and "internal error" not in r.output, (
                text, r.output)

    check()
