"""Canonical schema version 2 (ttl, dst_name, dup): what writes it, how the Parquet check reads the
new columns, and version-1 tables (the seed columns and prb_id, no version recorded) still going
through inspect, shard, eval's reader and build-rows, alone or beside version-2 files."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.artifacts.table import load_split
from pingctl.cli.app import app
from pingctl.schema.columns import COLUMNS, SCHEMA_VERSION, arrow_schema
from pingctl.schema.duck import canonical_query, connect
from pingctl.schema.parquet import schema_version, to_canonical, write_canonical
from tests.conftest import make_table

runner = CliRunner()


def _v2(n: int, seed: int):
    """A version-2 table: make_table's rows with a TTL on replies, a name and some duplicates."""
    t = to_canonical(make_table(n, probes=5, targets=3, seed=seed))
    replies = [r >= 0 for r in t.column("rtt").to_pylist()]
    t = t.set_column(t.schema.get_field_index("ttl"), "ttl",
                     pa.array([50 + i % 9 if ok else None for i, ok in enumerate(replies)], pa.int64()))
    names = pa.array([f"t{i % 3}.example" for i in range(n)])
    t = t.set_column(t.schema.get_field_index("dst_name"), "dst_name", names)
    return t.set_column(t.schema.get_field_index("dup"), "dup", pa.array([i % 10 == 0 for i in range(n)]))


def test_writers_record_the_version_and_readers_default_to_one(tmp_path):
    assert SCHEMA_VERSION == 2 and arrow_schema().metadata == {b"pingctl.schema_version": b"2"}
    write_canonical([make_table(10)], tmp_path / "w.parquet")  # a version-1 table goes in...
    s = pq.read_schema(tmp_path / "w.parquet")
    assert schema_version(s) == 2 and s.names == list(COLUMNS)  # ...version 2 comes out
    assert pq.read_table(tmp_path / "w.parquet", columns=["ttl", "dst_name", "dup"]).to_pylist()[0] == \
        {"ttl": None, "dst_name": None, "dup": None}
    pq.write_table(make_table(10), tmp_path / "old.parquet")
    assert schema_version(pq.read_schema(tmp_path / "old.parquet")) == 1


def test_the_check_takes_present_values_and_rejects_wrong_ones(tmp_path):
    t = make_table(8)
    t = t.append_column("ttl", pa.array([64, None, 0, 255, 256, -1, 1.5, 7], pa.float64()))
    t = t.append_column("dup", pa.array(["true", "0", None, "1", "false", "no", "FALSE", "2"]))
    t = t.append_column("dst_name", pa.array([1, 2, 3, 4, 5, 6, 7, 8]))
    pq.write_table(t, tmp_path / "t.parquet")
    con = connect()
    canonical_query(con, [tmp_path / "t.parquet"])
    got = con.execute("SELECT ttl, dup, dst_name, reject_reason FROM canonical ORDER BY _row").fetchall()
    assert got == [(64, True, "1", None), (None, False, "2", None), (0, None, "3", None), (255, True, "4", None),
                   (256, False, "5", "bad_ttl"), (-1, None, "6", "bad_ttl"), (None, False, "7", "bad_ttl"),
                   (7, None, "8", "bad_dup")]


@pytest.fixture
def mixed(tmp_path):
    """A directory with a version-1 file and a version-2 file."""
    d = tmp_path / "table"
    d.mkdir()
    pq.write_table(make_table(300, probes=5, targets=3, seed=1), d / "a-old.parquet")
    assert "ttl" not in pq.read_schema(d / "a-old.parquet").names
    pq.write_table(_v2(300, seed=2), d / "b-new.parquet")
    return d


def test_old_and_new_files_go_through_inspect(mixed):
    r = runner.invoke(app, ["inspect", str(mixed), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == 600
    r = runner.invoke(app, ["inspect", str(mixed / "a-old.parquet"), "--by", "pair", "--every", "1h", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # no dup column: every row a packet sent, none a duplicate
    assert sum(g["sent"] for g in d["top"]) == sum(g["count"] for g in d["top"]) == 300
    assert {g["duplicates"] for g in d["top"]} == {0}


def test_old_and_new_files_go_through_shard_and_build_rows(mixed, tmp_path):
    out = tmp_path / "splits"
    r = runner.invoke(app, ["shard", str(mixed), "-o", str(out), "--strategy", "random", "--json"])
    assert r.exit_code == 0, r.output
    parts = sorted(out.glob("*/part-*.parquet"))
    assert parts and all(schema_version(pq.read_schema(p)) == 2 for p in parts)
    rows = pa.concat_tables([pq.read_table(p) for p in parts]).to_pylist()
    assert len(rows) == 600
    # the new file's facts kept, the old file's rows null in the columns it lacks
    new = [r for r in rows if r["dst_name"] is not None]
    assert len(new) == 300 and sum(r["dup"] for r in new) == 30 and all(r["ttl"] is None for r in rows if r["rtt"] < 0)
    assert all((r["ttl"], r["dup"]) == (None, None) for r in rows if r["dst_name"] is None)
    # eval's reader takes the columns it computes with, whatever else a split holds
    arrays = load_split(out / "test")
    assert set(arrays) == {"src", "dst", "event_time", "ip_version", "rtt", "size", "packet_error_count", "msm_id",
                           "prb_id"}
    assert len(arrays["rtt"]) == sum(pq.read_metadata(p).num_rows for p in (out / "test").glob("*.parquet"))
    r = runner.invoke(app, ["build-rows", str(out / "train"), "-o", str(tmp_path / "rows"), "--json"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "rows" / "manifest.json").read_text())
    assert manifest["measurements"] == sum(pq.read_metadata(p).num_rows for p in (out / "train").glob("*.parquet"))
