"""`pingctl inspect TABLE --by pair|probe|destination`: statistics per group, checked against the
same figures computed from the table's rows in NumPy."""

from __future__ import annotations

import csv
import ipaddress
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from tests.conftest import make_table

runner = CliRunner()
KEYS = {"pair": ("src_addr", "dst_addr"), "probe": ("prb_id",), "destination": ("dst_addr",)}


@pytest.fixture
def table(tmp_path):
    # uneven groups (n not a multiple of probes x targets) and a few IPv6 rows
    t = make_table(n=1237, probes=7, targets=4, seed=3, v6_every=11)
    # one row build-rows would reject (an RTT of -5): left out of every group
    rtt = t.column("rtt").to_numpy().copy()
    rtt[0] = -5.0
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt))
    pq.write_table(t, tmp_path / "t.parquet")
    return tmp_path / "t.parquet", t.slice(1)


def _expected(t: pa.Table, by: str) -> dict:
    rows = t.to_pylist()
    groups: dict = {}
    for r in rows:
        # the table's addresses as pingctl reads them: canonical text ('2600:0::8' is '2600::8')
        key = tuple(r[k] if k == "prb_id" else str(ipaddress.ip_address(r[k])) for k in KEYS[by])
        groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        rtt = np.array([r["rtt"] for r in rs])
        ok = rtt[rtt >= 0]
        times = [r["event_time"] for r in rs]
        out[key] = {"count": len(rs), "loss_share": float(np.mean(rtt == -1.0)),
                    "rtt_p5_ms": float(np.percentile(ok, 5)), "rtt_p50_ms": float(np.percentile(ok, 50)),
                    "rtt_p95_ms": float(np.percentile(ok, 95)), "first_time": min(times), "last_time": max(times)}
    return out


@pytest.mark.parametrize("by", ["pair", "probe", "destination"])
def test_groups_equal_numpy_over_the_rows(table, by):
    path, valid = table
    r = runner.invoke(app, ["inspect", str(path), "--by", by, "--limit", "0", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    expected = _expected(valid, by)
    assert (d["groups"], d["shown"], d["rows"], d["invalid_rows"]) == (len(expected), len(expected), 1237, 1)
    counts = [g["count"] for g in d["top"]]
    assert counts == sorted(counts, reverse=True)
    for g in d["top"]:
        e = expected[tuple(g[k] for k in KEYS[by])]
        assert g["count"] == e["count"]
        for k in ("loss_share", "rtt_p5_ms", "rtt_p50_ms", "rtt_p95_ms"):
            assert g[k] == pytest.approx(e[k], rel=1e-9), k
        assert (g["first_time"], g["last_time"]) == (e["first_time"].isoformat().replace("+00:00", "Z"),
                                                     e["last_time"].isoformat().replace("+00:00", "Z"))


def test_limit_shows_the_largest_and_the_file_has_every_group(table, tmp_path):
    path, valid = table
    expected = _expected(valid, "pair")
    r = runner.invoke(app, ["inspect", str(path), "--by", "pair", "--limit", "3", "-o", str(tmp_path / "g.csv"),
                            "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["shown"] == 3 and d["groups"] == len(expected)
    assert [g["count"] for g in d["top"]] == sorted((e["count"] for e in expected.values()), reverse=True)[:3]
    with open(tmp_path / "g.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(expected)
    assert {(x["src_addr"], x["dst_addr"]): int(x["count"]) for x in rows} == \
        {k: e["count"] for k, e in expected.items()}

    r = runner.invoke(app, ["inspect", str(path), "--by", "destination", "-o", str(tmp_path / "g.parquet")])
    assert r.exit_code == 0, r.output
    p = pq.read_table(tmp_path / "g.parquet")
    assert p.num_rows == len(_expected(valid, "destination"))
    assert {"dst_addr", "count", "loss_share", "rtt_p50_ms", "first_time", "sources"} <= set(p.column_names)
    assert "largest of" not in r.output and "groups by destination" in r.output and "written to" in r.output


def test_table_output_names_the_top_groups(table):
    path, valid = table
    expected = _expected(valid, "probe")
    top = max(expected, key=lambda k: (expected[k]["count"], -k[0]))
    r = runner.invoke(app, ["inspect", str(path), "--by", "probe", "--limit", "2"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert f"the 2 largest of {len(expected)} groups by probe" in r.output
    assert str(top[0]) in r.output


def test_bad_use_is_a_usage_error(table, tmp_path):
    path, _ = table
    for args, words in ((["--by", "pair", "-o", str(tmp_path / "g.txt")], ".csv or .parquet"),
                        (["--by", "city"], "choose pair, probe or destination"),
                        (["-o", str(tmp_path / "g.csv")], "add --by"),
                        (["--by", "pair", "--sample", "3"], "--sample")):
        r = runner.invoke(app, ["inspect", str(path), *args])
        assert r.exit_code == 2, (args, r.output)
        assert words in r.output
    assert not (tmp_path / "g.csv").exists()
