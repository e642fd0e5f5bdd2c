"""`pingctl inspect TABLE --by pair|probe|destination|msm|prefix [--every 1h]`: statistics per
group, checked against the same figures computed from the table's rows in plain Python/NumPy,
and end to end through real `pingctl ingest` and `pingctl inspect` processes."""

from __future__ import annotations

import csv
import datetime as dt
import ipaddress
import json
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.schema.columns import arrow_schema
from tests.conftest import make_table

runner = CliRunner()
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
PROBES = [(10_001, "193.0.1.1"), (10_002, "193.0.2.1"), (10_003, "2a00:3::1"), (None, "193.0.4.1")]
TARGETS = {4: ["8.8.8.8", "8.8.8.9", "8.8.4.4"], 6: ["2600::8", "2600:0:0:1::8", "2600:0:1::8"]}
FIGURES = ("count", "sent", "received", "loss_pct", "rtt_min_ms", "rtt_mean_ms", "rtt_max_ms", "rtt_p5_ms",
           "rtt_p50_ms", "rtt_p95_ms", "ipdv_ms", "error_share", "duplicates", "dup_share")


def _results_table(seed: int = 3) -> pa.Table:
    """Ping results as ingest writes them: three packets each, some lost, some failed with an
    error, some with a duplicate reply; a pair measured by two measurements, a probe without an
    id; results in shuffled order, so that time and not file order decides what is consecutive."""
    rng = np.random.default_rng(seed)
    results = []
    for prb, src in PROBES:
        v = ipaddress.ip_address(src).version
        for ti, dst in enumerate(TARGETS[v]):
            for k in range(int(rng.integers(6, 30))):
                t = T0 + dt.timedelta(minutes=7 * k + ti, seconds=int(rng.integers(0, 60)))
                msm = 2000 if (prb == 10_001 and ti == 0 and k % 2) else 1000 + ti
                packets = [float(rng.uniform(5, 90)) if rng.random() < 0.85 else -1.0 for _ in range(3)]
                errors = int(rng.random() < 0.15)
                if errors:
                    packets[int(rng.integers(0, 3))] = -1.0
                dups = [False] * 3
                if rng.random() < 0.2 and packets[0] >= 0:
                    packets.insert(1, packets[0] + 40.0)
                    dups.insert(1, True)
                results.append([dict(msm_id=msm, event_time=t, src_addr=src, dst_addr=dst, ip_version=v, rtt=r,
                                     size=48, packet_error_count=errors, prb_id=prb, ttl=None if r < 0 else 57,
                                     dst_name=f"n{ti}", dup=d) for r, d in zip(packets, dups)])
    rng.shuffle(results)
    rows = [r for res in results for r in res]
    rows[5] = {**rows[5], "rtt": -5.0}  # a row build-rows would reject: left out of every group
    return pa.Table.from_pylist(rows, schema=arrow_schema())


def _key(r: dict, by: str, every: int | None) -> tuple:
    key = {"pair": lambda: (r["src_addr"], r["dst_addr"], r["prb_id"], r["msm_id"], r["ip_version"]),
           "probe": lambda: (r["prb_id"], None if r["prb_id"] is not None else r["src_addr"]),
           "destination": lambda: (r["dst_addr"],),
           "msm": lambda: (r["msm_id"],),
           "prefix": lambda: (str(ipaddress.ip_network((r["dst_addr"], 24 if r["ip_version"] == 4 else 48),
                                                       strict=False)),)}[by]()
    if every:
        s = int(r["event_time"].timestamp())
        key += (dt.datetime.fromtimestamp(s - s % every, dt.timezone.utc),)
    return key


def _expected(t: pa.Table, by: str, every: int | None = None) -> dict:
    rows = [{**r, "i": i} for i, r in enumerate(t.to_pylist()) if r["rtt"] >= 0 or r["rtt"] == -1.0]
    per_result = Counter((r["msm_id"], r["prb_id"], r["src_addr"], r["dst_addr"], r["event_time"]) for r in rows)
    groups = defaultdict(list)
    for r in rows:
        groups[_key(r, by, every)].append(r)
    out = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: (r["event_time"], r["i"]))
        sent = [r for r in rs if not r["dup"]]
        ok = np.array([r["rtt"] for r in sent if r["rtt"] >= 0])
        steps = [abs(b["rtt"] - a["rtt"]) for a, b in zip(sent, sent[1:]) if a["rtt"] >= 0 and b["rtt"] >= 0]
        errors = sum(r["packet_error_count"] / per_result[(r["msm_id"], r["prb_id"], r["src_addr"], r["dst_addr"],
                                                           r["event_time"])] for r in rs)
        dups = len(rs) - len(sent)
        out[key] = {"count": len(rs), "sent": len(sent), "received": len(ok),
                    "loss_pct": 100 * (len(sent) - len(ok)) / len(sent),
                    "rtt_min_ms": ok.min() if len(ok) else None, "rtt_mean_ms": ok.mean() if len(ok) else None,
                    "rtt_max_ms": ok.max() if len(ok) else None,
                    **{f"rtt_p{q}_ms": np.percentile(ok, q) if len(ok) else None for q in (5, 50, 95)},
                    "ipdv_ms": np.mean(steps) if steps else None, "error_share": errors / len(sent),
                    "duplicates": dups, "dup_share": dups / len(rs),
                    "first_time": min(r["event_time"] for r in rs), "last_time": max(r["event_time"] for r in rs)}
    return out


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _check(g: dict, e: dict) -> None:
    for k in FIGURES:
        if e[k] is None:
            assert g[k] is None, k
        else:  # float64 sums in another order: far inside float64's precision
            assert g[k] == pytest.approx(float(e[k]), rel=1e-9, abs=1e-12), k
    assert (g["first_time"], g["last_time"]) == (_iso(e["first_time"]), _iso(e["last_time"]))


@pytest.fixture
def table(tmp_path):
    t = _results_table()
    pq.write_table(t, tmp_path / "t.parquet")
    return tmp_path / "t.parquet", t


KEYS = {"pair": ("src_addr", "dst_addr", "prb_id", "msm_id", "ip_version"), "probe": ("prb_id", "src_addr"),
        "destination": ("dst_addr",), "msm": ("msm_id",), "prefix": ("dst_prefix",)}


@pytest.mark.parametrize("every", [None, "1h"])
@pytest.mark.parametrize("by", ["pair", "probe", "destination", "msm", "prefix"])
def test_groups_equal_python_over_the_rows(table, by, every):
    path, t = table
    args = ["--every", every] if every else []
    r = runner.invoke(app, ["inspect", str(path), "--by", by, "--limit", "0", "--json", *args])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    expected = _expected(t, by, 3600 if every else None)
    n_groups = len({k[:len(KEYS[by])] for k in expected})
    assert (d["groups"], d["shown"], d["group_rows"], d["rows"], d["invalid_rows"]) == \
        (n_groups, n_groups, len(expected), t.num_rows, 1)
    got = {tuple(g[k] for k in KEYS[by]) + ((dt.datetime.fromisoformat(g["bucket_start"]),) if every else ()): g
           for g in d["top"]}
    assert got.keys() == expected.keys()
    for key, e in expected.items():
        _check(got[key], e)
    # largest groups first, each group's buckets together and in time order
    totals = Counter()
    for g in d["top"]:
        totals[tuple(g[k] for k in KEYS[by])] += g["count"]
    order = list(dict.fromkeys(tuple(g[k] for k in KEYS[by]) for g in d["top"]))
    assert [totals[k] for k in order] == sorted(totals.values(), reverse=True)
    if every:
        starts = [(tuple(g[k] for k in KEYS[by]), g["bucket_start"]) for g in d["top"]]
        assert starts == sorted(starts, key=lambda s: (order.index(s[0]), s[1]))


def test_a_pair_in_two_measurements_is_two_groups(table):
    path, t = table
    r = runner.invoke(app, ["inspect", str(path), "--by", "pair", "--limit", "0", "--json"])
    pairs = Counter((g["src_addr"], g["dst_addr"]) for g in json.loads(r.stdout)["top"])
    assert pairs[("193.0.1.1", "8.8.8.8")] == 2 and set(pairs.values()) == {1, 2}


def test_limit_shows_the_largest_and_each_file_has_every_group(table, tmp_path):
    path, t = table
    expected = _expected(t, "destination", 3600)
    r = runner.invoke(app, ["inspect", str(path), "--by", "destination", "--every", "1h", "--limit", "2",
                            "-o", str(tmp_path / "g.csv"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["shown"] == 2 and d["groups"] == 6 and len({g["dst_addr"] for g in d["top"]}) == 2
    assert len(d["top"]) == sum(1 for k in expected if k[0] in {g["dst_addr"] for g in d["top"]})
    with open(tmp_path / "g.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(expected)
    # ISO 8601 UTC times in `_utc` columns, units in the names
    assert {"bucket_start_utc", "first_time_utc", "last_time_utc", "rtt_min_ms", "rtt_mean_ms", "ipdv_ms",
            "loss_pct"} <= set(rows[0])
    for x in rows:
        e = expected[(x["dst_addr"], dt.datetime.fromisoformat(x["bucket_start_utc"]))]
        assert x["bucket_start_utc"].endswith(":00:00Z") and x["first_time_utc"] == _iso(e["first_time"])
        assert (int(x["sent"]), float(x["rtt_max_ms"])) == (e["sent"], pytest.approx(e["rtt_max_ms"]))

    r = runner.invoke(app, ["inspect", str(path), "--by", "prefix", "-o", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["by"] == "prefix" and {g["dst_prefix"] for g in doc["groups"]} == \
        {"8.8.8.0/24", "8.8.4.0/24", "2600::/48", "2600:0:1::/48"}
    assert all(g["first_time_utc"].endswith("Z") for g in doc["groups"])

    r = runner.invoke(app, ["inspect", str(path), "--by", "msm", "-o", str(tmp_path / "g.parquet")])
    assert r.exit_code == 0, r.output
    p = pq.read_table(tmp_path / "g.parquet")
    assert p.num_rows == len(_expected(t, "msm"))
    assert {"msm_id", "sent", "loss_pct", "ipdv_ms", "probes", "destinations"} <= set(p.column_names)
    assert "largest of" not in r.output and "groups by msm" in r.output and "written to" in r.output


def test_a_table_without_the_new_columns_groups_as_before(tmp_path):
    # a version-1 table: no dup column (no duplicates), RTT figures over every reply
    t = make_table(n=600, probes=7, targets=4, seed=3, v6_every=11)
    pq.write_table(t, tmp_path / "t.parquet")
    r = runner.invoke(app, ["inspect", str(tmp_path / "t.parquet"), "--by", "probe", "--limit", "0", "--json"])
    assert r.exit_code == 0, r.output
    for g in json.loads(r.stdout)["top"]:
        rtt = np.array([x for x, p in zip(t.column("rtt").to_pylist(), t.column("prb_id").to_pylist())
                        if p == g["prb_id"]])
        assert (g["count"], g["sent"], g["received"], g["duplicates"]) == (len(rtt), len(rtt), (rtt >= 0).sum(), 0)
        assert g["rtt_p50_ms"] == pytest.approx(np.percentile(rtt[rtt >= 0], 50), rel=1e-9)


def test_table_output_names_the_top_groups(table):
    path, t = table
    r = runner.invoke(app, ["inspect", str(path), "--by", "probe", "--limit", "2"], env={"COLUMNS": "150"})
    assert r.exit_code == 0, r.output
    assert "the 2 largest of 4 groups by probe" in r.output
    top = Counter(x["prb_id"] for x in t.to_pylist()).most_common(1)[0][0]
    assert str(top) in r.output and "ipdv" in r.output and "loss" in r.output


def test_bad_use_is_a_usage_error(table, tmp_path):
    path, _ = table
    for args, words in ((["--by", "pair", "-o", str(tmp_path / "g.txt")], ".csv, .json or .parquet"),
                        (["--by", "city"], "choose pair, probe, destination, msm, prefix"),
                        (["-o", str(tmp_path / "g.csv")], "add --by"),
                        (["--every", "1h"], "--every goes with --by"),
                        (["--by", "pair", "--every", "1.5h"], "expected a duration such as 15m"),
                        (["--by", "pair", "--every", "0m"], "expected a duration"),
                        (["--by", "pair", "--sample", "3"], "--sample")):
        r = runner.invoke(app, ["inspect", str(path), *args])
        assert r.exit_code == 2, (args, r.output)
        assert words in r.output
    assert not (tmp_path / "g.csv").exists()


def _ripe(ts: int, result: list, **kw) -> dict:
    return {"fw": 5080, "af": 4, "dst_addr": "8.8.8.8", "dst_name": "dns.google", "src_addr": "192.168.1.10",
            "from": "81.2.3.4", "proto": "ICMP", "ttl": 117, "size": 48, "result": result, "msm_id": 1001,
            "prb_id": 7, "timestamp": ts, "type": "ping", **kw}


def test_ingest_then_inspect_end_to_end(tmp_path):
    """Real `pingctl ingest` and `pingctl inspect` processes on RIPE Atlas results whose figures
    are worked out by hand: a duplicate, an error, a timeout and a reply with its own TTL."""
    t0 = 1_704_067_800  # 2024-01-01T00:10:00Z
    results = [_ripe(t0, [{"rtt": 10.0}, {"rtt": 12.0}, {"x": "*"}]),
               _ripe(t0 + 60, [{"rtt": 11.0}, {"rtt": 30.0, "dup": 1}, {"rtt": 13.0, "ttl": 116},
                               {"error": "sendto failed"}]),
               _ripe(t0 + 3600, [{"rtt": 20.0}, {"rtt": 22.0}, {"rtt": 21.0}])]
    (tmp_path / "dump.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    pingctl = [sys.executable, "-m", "pingctl"]
    ing = subprocess.run([*pingctl, "ingest", str(tmp_path / "dump.jsonl"), "-o", str(tmp_path / "t"), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert ing.returncode == 0, ing.stderr
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["schema_version"] == 2
    rows = pq.read_table(tmp_path / "t" / "part-00000.parquet").select(["rtt", "ttl", "dst_name", "dup"]).to_pylist()
    assert [(x["rtt"], x["ttl"], x["dup"]) for x in rows] == [
        (10.0, 117, False), (12.0, 117, False), (-1.0, None, False), (11.0, 117, False), (30.0, 117, True),
        (13.0, 116, False), (-1.0, None, False), (20.0, 117, False), (22.0, 117, False), (21.0, 117, False)]
    assert {x["dst_name"] for x in rows} == {"dns.google"}

    out = subprocess.run([*pingctl, "inspect", str(tmp_path / "t"), "--by", "pair", "--every", "1h",
                          "-o", str(tmp_path / "g.csv"), "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, second = json.loads(out.stdout)["top"]
    assert (first["src_addr"], first["dst_addr"], first["prb_id"], first["msm_id"], first["ip_version"]) == \
        ("81.2.3.4", "8.8.8.8", 7, 1001, 4)
    # 00:00: 7 rows, 6 sent (one duplicate), 4 replies; sent packets in order 10 12 * 11 13 !
    assert {k: first[k] for k in FIGURES} == pytest.approx(
        {"count": 7, "sent": 6, "received": 4, "loss_pct": 100 / 3, "rtt_min_ms": 10.0, "rtt_mean_ms": 11.5,
         "rtt_max_ms": 13.0, "rtt_p5_ms": 10.15, "rtt_p50_ms": 11.5, "rtt_p95_ms": 12.85, "ipdv_ms": 2.0,
         "error_share": 1 / 6, "duplicates": 1, "dup_share": 1 / 7})
    assert (first["bucket_start"], first["first_time"], first["last_time"]) == \
        ("2024-01-01T00:00:00Z", "2024-01-01T00:10:00Z", "2024-01-01T00:11:00Z")
    assert (second["bucket_start"], second["sent"], second["loss_pct"], second["ipdv_ms"]) == \
        ("2024-01-01T01:00:00Z", 3, 0.0, 1.5)
    with open(tmp_path / "g.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(x["bucket_start_utc"], x["sent"], x["rtt_mean_ms"], x["first_time_utc"]) for x in rows] == [
        ("2024-01-01T00:00:00Z", "6", "11.5", "2024-01-01T00:10:00Z"),
        ("2024-01-01T01:00:00Z", "3", "21", "2024-01-01T01:10:00Z")]
