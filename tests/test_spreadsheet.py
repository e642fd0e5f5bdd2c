"""Every CSV pingctl writes has one form (pingctl/schema/spreadsheet.py): times in ISO 8601 UTC
(`2024-01-01T00:01:00Z`) in columns named `..._utc`, RTTs and sizes named with their unit;
and every result a user may open in a spreadsheet comes as CSV and JSON."""

from __future__ import annotations

import csv
import datetime as dt
import json
import re

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.schema import spreadsheet as S
from tests.conftest import make_table

runner = CliRunner()
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")
# names a CSV of pingctl's no longer has: each became name_utc, rtt_ms or size_bytes
BARE = {"time", "event_time", "first_time", "last_time", "rtt", "size", "actual_rtt"}


def _csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _one_form(rows: list[dict]) -> None:
    assert rows
    names = set(rows[0])
    assert not names & BARE, names
    times = [k for k in names if k.endswith("_utc")]
    assert times, names
    for k in times:
        assert all(ISO.fullmatch(r[k]) or r[k] == "" for r in rows), (k, [r[k] for r in rows][:5])
        assert any(r[k] for r in rows), k


def test_times_of_every_kind_become_iso_8601_utc():
    t0 = dt.datetime(2024, 1, 1, 0, 0, 39, tzinfo=dt.timezone.utc)
    t = pa.table({
        "event_time": pa.array([t0, None], pa.timestamp("us", "UTC")),
        "naive": pa.array([t0.replace(tzinfo=None, microsecond=250_000), None], pa.timestamp("ns")),
        "time": pa.array([1704067239, None], pa.int64()),
        "rtt": [1.5, float("nan")], "size": pa.array([48, 48]), "p50_ms": [2.0, 3.0],
        "src": pa.array(["a", "b"]).dictionary_encode(),
    })
    got = S.spreadsheet_table(t, seconds=("time",)).to_pydict()
    assert got == {"event_time_utc": ["2024-01-01T00:00:39Z", None],
                   "naive_utc": ["2024-01-01T00:00:39.250000Z", None],  # a fraction of a second kept
                   "time_utc": ["2024-01-01T00:00:39Z", None],
                   "rtt_ms": [1.5, got["rtt_ms"][1]], "size_bytes": [48, 48], "p50_ms": [2.0, 3.0], "src": ["a", "b"]}
    assert np.isnan(got["rtt_ms"][1])
    assert S.json_rows(t, seconds=("time",))[1]["rtt_ms"] is None  # JSON has no NaN
    assert S.iso_utc(pa.array([0, -1]), seconds=True).to_pylist() == ["1970-01-01T00:00:00Z", "1969-12-31T23:59:59Z"]


def test_sample_writes_every_result_as_csv_in_the_one_form(tmp_path):
    from pingctl.artifacts import sample_output as SO
    from pingctl.infer.queries import RttDistribution

    SO.write_predictions({"line": [2, 3], "src": ["1.2.3.4", "1.2.3.4"], "dst": ["8.8.8.8", "9.9.9.9"],
                          "ip_version": [4, 4], "time": [None, 1704283200], "p_fail": [0.1, 0.2],
                          "p50_ms": [20.0, 30.0]}, tmp_path / "p.csv", {"run": "r"})
    rows = _csv(tmp_path / "p.csv")
    _one_form(rows)
    assert [r["time_utc"] for r in rows] == ["", "2024-01-03T12:00:00Z"]

    d = RttDistribution(0.125, np.arange(3, dtype=np.uint16), np.array([1.0, 2.0, 4.0]), np.array([0.5, 0.25, 0.25]))
    SO.write_distribution(d, tmp_path / "d.csv", "1.2.3.4", "8.8.8.8")
    rows = _csv(tmp_path / "d.csv")
    assert list(rows[0]) == ["code", "rtt_ms", "probability", "src", "dst", "p_fail"] and len(rows) == 3
    assert {(r["src"], r["dst"], float(r["p_fail"])) for r in rows} == {("1.2.3.4", "8.8.8.8", 0.125)}
    r = runner.invoke(app, ["inspect", str(tmp_path / "d.csv"), "--json"])  # read back as the other formats
    got = json.loads(r.stdout)
    assert (got["kind"], got["src"], got["p_fail"], got["codes"], got["p50_ms"]) == \
        ("distribution", "1.2.3.4", 0.125, 3, 1.0)

    table = make_table(n=6, probes=2, targets=1)
    SO.write_generated(table, np.array([0, 0, 0, 1, 1, 1]), tmp_path / "g.csv")
    rows = _csv(tmp_path / "g.csv")
    _one_form(rows)
    assert rows[1]["event_time_utc"] == "2024-01-01T00:01:00Z" and rows[5]["stream"] == "1"
    assert float(rows[0]["rtt_ms"]) == pytest.approx(table.column("rtt")[0].as_py())


def test_score_writes_csv_and_json_in_the_one_form(tmp_path):
    from pingctl.artifacts import score_output as SC

    t = make_table(n=5, probes=1, targets=1)
    for c in ("nll", "pit", "tail_p", "p_fail"):
        t = t.append_column(c, pa.array(np.linspace(0.1, 0.5, 5)))
    t = t.replace_schema_metadata({"pingctl": json.dumps({"kind": "scores", "nll_unit": "nats"})})
    SC.check_out(tmp_path / "s.json")
    for name in ("s.csv", "s.json"):
        SC.write_scores(t, tmp_path / name)
    rows = _csv(tmp_path / "s.csv")
    _one_form(rows)
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["kind"] == "scores" and doc["nll_unit"] == "nats"
    assert [{k: str(v) for k, v in r.items() if v is not None} for r in doc["scores"]] == \
        [{k: v for k, v in r.items() if v != ""} for r in rows]


def test_a_csv_pingctl_wrote_reads_back_as_pairs_with_its_times(tmp_path):
    """`sample --pairs` takes a CSV of pingctl's as it is: `time_utc` / `event_time_utc` are its
    time column (otherwise each row would be asked without its time, silently)."""
    from pingctl.artifacts import sample_output as SO
    from pingctl.infer.pairs import read_pairs

    SO.write_predictions({"line": [2, 3], "src": ["1.2.3.4"] * 2, "dst": ["8.8.8.8"] * 2, "ip_version": [4, 4],
                          "time": [1704283200, None], "p_fail": [0.1, 0.2], "p50_ms": [20.0, 30.0]},
                         tmp_path / "p.csv", {})
    assert read_pairs(tmp_path / "p.csv").time == [1704283200, None]
    SO.write_generated(make_table(n=2, probes=1, targets=1), np.array([0, 0]), tmp_path / "g.csv")
    assert read_pairs(tmp_path / "g.csv").time == [1704067200, 1704067260]


def test_inspect_by_writes_csv_in_the_one_form(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(make_table(n=40, probes=2, targets=2), tmp_path / "t.parquet")
    r = runner.invoke(app, ["inspect", str(tmp_path / "t.parquet"), "--by", "pair", "-o", str(tmp_path / "g.csv")])
    assert r.exit_code == 0, r.output
    rows = _csv(tmp_path / "g.csv")
    _one_form(rows)  # was DuckDB's "2024-01-01 00:00:00+00"
    assert {"first_time_utc", "last_time_utc", "rtt_p50_ms"} <= set(rows[0])


def test_eval_predictions_come_as_csv_and_json(tmp_path):
    from pingctl.artifacts import eval_output as EO
    from pingctl.errors import UsageError

    packets = {"src": ["1.2.3.4"] * 2, "dst": ["8.8.8.8"] * 2, "ip_version": [4, 4],
               "event_time": [1704067200, 1704067260], "pair": [0, 0], "actual_rtt": [20.0, -1.0]}
    EO.write_predictions(tmp_path, packets, {"model": {"median": [19.0, 21.0], "p_fail": [0.1, 0.9]}}, {"run": "r"})
    with pytest.raises(UsageError, match="written as .csv or .json"):
        EO.check_copy(tmp_path / "p.txt")
    EO.write_copy(tmp_path, tmp_path / "p.csv")
    rows = _csv(tmp_path / "p.csv")
    _one_form(rows)
    assert rows[0]["event_time_utc"] == "2024-01-01T00:00:00Z" and rows[1]["actual_rtt_ms"] == "-1"
    assert {"model_median_ms", "model_crps_ms", "model_p_fail", "model_pit"} <= set(rows[0])
    EO.write_copy(tmp_path, tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["kind"] == "eval-predictions" and doc["predictors"] == ["model"] and doc["run"] == "r"
    assert doc["predictions"][1]["event_time_utc"] == "2024-01-01T00:01:00Z"
    assert doc["predictions"][0]["model_crps_ms"] is None  # NaN: null in JSON


@pytest.mark.slow
def test_the_commands_write_csv_and_json(tiny_run, time_split, pair, synth_rows, tmp_path):
    """End to end: one pair's distribution and streams as CSV (refused before), scores as JSON
    (refused before), eval's predictions as CSV and JSON (no such option before)."""
    src, dst = pair
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "-o", str(tmp_path / "d.csv"), "--json"])
    assert r.exit_code == 0, r.output
    rows = _csv(tmp_path / "d.csv")
    assert len(rows) == 65536 and float(rows[0]["p_fail"]) == pytest.approx(json.loads(r.stdout)["p_fail"])
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--measurements", "3", "-o", str(tmp_path / "g.csv")])
    assert r.exit_code == 0, r.output
    _one_form(_csv(tmp_path / "g.csv"))
    r = runner.invoke(app, ["score", str(tiny_run), str(synth_rows / "synth"), "-o", str(tmp_path / "s.json"),
                            "--limit", "20", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "s.json").read_text())
    assert len(doc["scores"]) == json.loads(r.stdout)["rows_scored"] > 0
    assert ISO.fullmatch(doc["scores"][0]["event_time_utc"])
    for name in ("e.csv", "e.json"):
        r = runner.invoke(app, ["eval", str(tiny_run), "--train", str(time_split / "train"), "--test",
                                str(time_split / "test"), "-o", str(tmp_path / "ev"), "--queries", "10",
                                "--predictions", str(tmp_path / name), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["predictions_copy"] == str(tmp_path / name)
    rows = _csv(tmp_path / "e.csv")
    _one_form(rows)
    assert len(rows) == len(json.loads((tmp_path / "e.json").read_text())["predictions"]) == 10
