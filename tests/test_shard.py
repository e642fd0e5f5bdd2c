import json
import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import ShardConfig
from pingctl.errors import PingctlError
from pingctl.schema.columns import arrow_schema
from pingctl.shard import shard
from tests.conftest import make_table

runner = CliRunner()


@pytest.fixture
def table_dir(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    t = make_table(6000, probes=40, targets=6, v6_every=7)
    pq.write_table(t.slice(0, 3000), d / "a.parquet")
    pq.write_table(t.slice(3000), d / "b.parquet")
    return d


def _read_split(out, split):
    return pq.read_table(out / split)


@pytest.mark.parametrize("strategy", ["time", "probe", "target", "pair", "random"])
def test_splits_are_disjoint_complete_and_canonical(table_dir, tmp_path, strategy):
    out = tmp_path / "out"
    cfg = ShardConfig(strategy=strategy, val_fraction=0.1, test_fraction=0.2, rows_per_shard=1000)
    res = shard([table_dir], out, cfg)
    tables = {s: _read_split(out, s) for s in ("train", "val", "test")}
    assert sum(t.num_rows for t in tables.values()) == 6000 == res["rows_written"]
    for t in tables.values():
        assert t.schema == arrow_schema()
    # every input row appears exactly once across the splits
    con = duckdb.connect()
    for s, t in tables.items():
        con.register(s, t)
    n_distinct = con.execute(
        "SELECT count(*) FROM (SELECT DISTINCT event_time, src_addr, dst_addr, rtt FROM "
        "(SELECT * FROM train UNION ALL SELECT * FROM val UNION ALL SELECT * FROM test))"
    ).fetchall()[0][0]
    assert n_distinct == 6000
    key = {"probe": "prb_id", "target": "dst_addr", "pair": "src_addr || dst_addr"}.get(strategy)
    if key:
        overlap = con.execute(
            f"SELECT count(*) FROM (SELECT {key} k FROM train INTERSECT SELECT {key} FROM test)"
        ).fetchall()[0][0]
        assert overlap == 0
    if strategy == "time":
        assert max(tables["train"]["event_time"].to_pylist()) < min(tables["val"]["event_time"].to_pylist())
        assert max(tables["val"]["event_time"].to_pylist()) < min(tables["test"]["event_time"].to_pylist())
        assert tables["test"].num_rows == pytest.approx(1200, abs=2)
    if strategy == "probe":
        assert res["cuts"]["groups"] == {"train": 28, "val": 4, "test": 8}  # exact group shares of 40 probes
    if strategy == "random":
        assert tables["test"].num_rows == pytest.approx(1200, rel=0.15)
    assert res["checks"]["disjoint"]
    # shards of similar size
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in sorted((out / "train").glob("*.parquet"))]
    assert len(sizes) >= 2 and max(sizes) - min(sizes) < 0.25 * max(sizes)


def test_deterministic_bytes_and_seed_matters(table_dir, tmp_path):
    cfg = ShardConfig(strategy="probe", seed=1)
    shard([table_dir], tmp_path / "a", cfg)
    shard([table_dir], tmp_path / "b", cfg)
    for f in (tmp_path / "a").rglob("*.parquet"):
        assert f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes()
    shard([table_dir], tmp_path / "c", ShardConfig(strategy="probe", seed=2))
    test_a = set(_read_split(tmp_path / "a", "test")["prb_id"].to_pylist())
    test_c = set(_read_split(tmp_path / "c", "test")["prb_id"].to_pylist())
    assert test_a != test_c


def test_rejects_reconcile_and_rerun_replaces(table_dir, tmp_path):
    t = make_table(100, prb=False)
    rtt = t.column("rtt").to_pylist()
    rtt[3] = float("inf")
    pq.write_table(t.set_column(5, "rtt", pa.array(rtt)), table_dir / "c.parquet")
    out = tmp_path / "out"
    res = shard([table_dir], out, ShardConfig())
    assert res["rows_read"] == 6100 == res["rows_written"] + res["rows_rejected"]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert rejects == [
        {"file": str(table_dir / "c.parquet"), "row": 3, "reason": "bad_rtt", "raw": rejects[0]["raw"]}
    ]
    assert rejects[0]["raw"]["rtt"] == "inf"
    res2 = shard([table_dir], out, ShardConfig())  # rerun: same output, no duplicates
    assert res2["rows_written"] == res["rows_written"]
    assert sum(pq.read_table(out / s).num_rows for s in ("train", "val", "test")) == res["rows_written"]


def test_small_memory_limit_spills_instead_of_failing(table_dir, tmp_path):
    res = shard([table_dir], tmp_path / "o", ShardConfig(memory_limit="64MB", threads=1))
    assert res["rows_written"] == 6000


def test_refuses_foreign_dir_and_leaves_nothing_on_failure(table_dir, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(PingctlError, match="did not write"):
        shard([table_dir], foreign, ShardConfig())
    assert (foreign / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="val_fraction"):  # the config model refuses it (exit 2 from the CLI)
        ShardConfig(val_fraction=0.6, test_fraction=0.5)
    with pytest.raises(PingctlError, match="val_fraction"):  # and shard does for a model built without checks
        shard([table_dir], tmp_path / "x", ShardConfig.model_construct(val_fraction=0.6, test_fraction=0.5))
    assert not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.tmp-")]


def test_cli_json_and_inspect(table_dir, tmp_path):
    out = tmp_path / "splits"
    r = runner.invoke(app, ["shard", str(table_dir), "-o", str(out), "--strategy", "pair", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["strategy"] == "pair" and res["rows_written"] == 6000
    r = runner.invoke(app, ["inspect", str(out), "--json", "--sample", "3"])
    assert r.exit_code == 0, r.output
    desc = json.loads(r.stdout)
    assert desc["kind"] == "splits"
    assert sum(d["rows"] for d in desc["splits"].values()) == 6000
    assert len(desc["splits"]["train"]["sample"]) == 3
    r = runner.invoke(app, ["shard", str(tmp_path / "missing"), "-o", str(tmp_path / "o2")])
    assert r.exit_code == 1 and "input not found" in r.output


def test_splits_table_reads_whole_at_80_columns():
    from rich.console import Console

    from pingctl.cli.shard_cmd import splits_table

    def split(name, rows):
        return {"split": name, "rows": rows, "share": rows / 111_111_111, "files": 1_234, "probes": 12_345,
                "pairs": 1_234_567, "v6_rows": 41_000_000, "failure_share": 0.147,
                "start": "2019-04-24 20:00:00+00:00", "end": "2023-02-18 20:56:33+00:00"}

    result = {"strategy": "time", "splits": [split("train", 100_000_000), split("val", 5_555_555), split("test", 5_555_556)]}
    con = Console(width=80, record=True, file=open("/dev/null", "w"))
    con.print(splits_table(result, "runs/atlas/splits"))
    text = con.export_text()
    assert "…" not in text
    for figure in ("100,000,000", "5,555,556", "90.0%", "1,234,567", "41,000,000", "14.7%", "2019-04-24 20:00",
                   "2023-02-18 20:56"):
        assert figure in text


def test_inspect_sample_rows_lose_no_characters_at_80_columns(tmp_path, monkeypatch):
    from pingctl.cli import common

    t = make_table(50, probes=5, targets=5)
    n = t.num_rows
    long_src = [f"2a00:11c0:14:aa3:{k % 5:x}:8bff:fe09:b908" for k in range(n)]
    long_dst = [f"2001:503:ba3e::2:{k % 5 + 1}0" for k in range(n)]
    for name, col in (("src_addr", long_src), ("dst_addr", long_dst), ("ip_version", [6] * n),
                      ("msm_id", [49_921_351] * n)):
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(col, t.schema.field(name).type))
    pq.write_table(t, tmp_path / "t.parquet")
    monkeypatch.setattr(common.console, "width", 80)
    r = runner.invoke(app, ["inspect", str(tmp_path / "t.parquet"), "--sample", "3"])
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    listing = r.output[r.output.index("sample rows"):]
    assert "49921351" in listing and "2024-01-01 00:" in listing  # whole ids, UTC times to the second
    lines = listing.splitlines()[1:5]
    head = lines[0]
    a, b = head.index("src_addr"), head.index("dst_addr")
    src = "".join(line[a:b].strip() for line in lines[1:])
    dst = "".join(line[b:].split()[0] for line in lines[1:] if line[b:b + 1].strip())  # left-aligned pieces
    assert any(src.startswith(x) for x in long_src) and any(dst.startswith(x) for x in long_dst)  # folded, not cut


def test_files_with_different_event_time_types_are_read_each_as_itself(tmp_path):
    """A timestamp file next to files of integer, float and string Unix seconds: every valid
    row is kept (union_by_name made all of them strings: the valid file was rejected whole,
    or DuckDB failed on BIGINT -> TIMESTAMP), and bad times are per-row rejects."""
    import datetime as dt
    import math

    t = make_table(400, probes=8, targets=4)
    secs = [int(x.timestamp()) for x in t.column("event_time").to_pylist()]
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(t.slice(0, 100), d / "a_ts.parquet")

    def with_time(part, values, typ, name):
        pq.write_table(part.set_column(part.schema.get_field_index("event_time"), "event_time",
                                       pa.array(values, typ)), d / name)

    with_time(t.slice(100, 100), secs[100:199] + [10**15], pa.int64(), "b_int.parquet")
    with_time(t.slice(200, 100), [float(x) for x in secs[200:298]] + [math.nan, math.inf], pa.float64(), "c_float.parquet")
    iso = [dt.datetime.fromtimestamp(x, dt.timezone.utc).isoformat() for x in secs[300:350]]
    with_time(t.slice(300, 100), iso + [str(x) for x in secs[350:399]] + ["not a time"], pa.string(), "d_str.parquet")
    out = tmp_path / "out"
    r = runner.invoke(app, ["shard", str(d), "-o", str(out), "--strategy", "random", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["rows_read"] == 400 and res["rows_written"] == 396 and res["rejects_by_reason"] == {"bad_time": 4}
    written = pa.concat_tables([_read_split(out, s) for s in ("train", "val", "test")])
    got = sorted(int(x.timestamp()) for x in written.column("event_time").to_pylist())
    assert got == sorted(secs[:199] + secs[200:298] + secs[300:399])
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(x["raw"]["event_time"] for x in rejects) == sorted(["1000000000000000", "nan", "inf", "not a time"])


def test_negative_ids_are_rejected_as_ingest_rejects_them(tmp_path):
    t = make_table(200, probes=4, targets=2)
    msm = t.column("msm_id").to_numpy().copy()
    prb = t.column("prb_id").to_numpy().copy()
    msm[:3] = -7
    prb[10:12] = -5
    t = t.set_column(t.schema.get_field_index("msm_id"), "msm_id", pa.array(msm))
    t = t.set_column(t.schema.get_field_index("prb_id"), "prb_id", pa.array(prb))
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(t, d / "t.parquet")
    r = runner.invoke(app, ["shard", str(d), "-o", str(tmp_path / "out"), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["rejects_by_reason"] == {"bad_msm_id": 3, "bad_prb_id": 2} and res["rows_written"] == 195


def test_a_file_damaged_inside_its_data_is_named_or_caught(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    pq.write_table(make_table(3000, probes=20, targets=5), d / "good.parquet")
    pq.write_table(make_table(50_000, probes=200, targets=9, seed=3), d / "bad.parquet", compression="zstd")
    good = (d / "bad.parquet").read_bytes()
    named = 0
    # spots past the middle only change values (Parquet pages carry no checksum); earlier ones
    # break a page (DuckDB fails mid-query) or make DuckDB read the file differently per query
    for frac in (0.1, 0.2, 0.3, 0.4):
        b = bytearray(good)
        at = int(len(b) * frac)
        b[at:at + 4000] = bytes(x ^ 0x5A for x in b[at:at + 4000])  # the footer stays intact
        (d / "bad.parquet").write_bytes(bytes(b))
        r = runner.invoke(app, ["shard", str(d), "-o", str(tmp_path / "out")])
        text = " ".join(r.output.split())
        assert r.exit_code in (0, 1) and "internal error" not in text, (frac, text)
        if r.exit_code == 1:
            assert not (tmp_path / "out").exists()
            assert "bad.parquet" in text or "do not reconcile" in text, (frac, text)
            named += "bad.parquet" in text
        else:
            shutil.rmtree(tmp_path / "out")
    if not named:
        pytest.skip("no damaged spot made a page unreadable in this layout")


def test_inspect_splits_names_a_missing_split_and_refuses_a_directory_without_any(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(make_table(3000, probes=20, targets=5), d / "a.parquet")
    out = tmp_path / "splits"
    shard([d], out, ShardConfig(strategy="time"))
    shutil.rmtree(out / "val")
    (out / "val").mkdir()
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["missing"] == ["val"]
    r = runner.invoke(app, ["inspect", str(out)])
    assert "no Parquet data in val/" in " ".join(r.output.split())
    empty = tmp_path / "nosplits"
    for s in ("train", "val", "test"):
        (empty / s).mkdir(parents=True)
    (empty / "train" / "manifest.json").write_text("{}")
    r = runner.invoke(app, ["inspect", str(empty)])
    assert r.exit_code == 1 and "no Parquet data in train/, val/ or test/" in " ".join(r.output.split())


def test_rejects_of_non_integral_ids_huge_rtts_and_uncastable_values_name_the_column(tmp_path):
    # the defects as a user met them: 1.5 rounded to 2, true read as 1, rtt=1e308 kept,
    # 'abc' in rtt reported as null_field
    t = make_table(200, probes=4, targets=2)
    n = t.num_rows
    msm = [float(v) for v in t.column("msm_id").to_pylist()]
    msm[0] = 1.5
    size = [True] * n  # Parquet booleans next to the int64 files of other tests
    rtt = [str(v) for v in t.column("rtt").to_pylist()]
    rtt[1] = "abc"
    rtt[2] = "1e308"
    rtt[3] = None
    t = t.set_column(t.schema.get_field_index("msm_id"), "msm_id", pa.array(msm))
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt))
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(t, d / "t.parquet")
    pq.write_table(t.set_column(t.schema.get_field_index("size"), "size", pa.array(size)).slice(10, 5), d / "b.parquet")
    out = tmp_path / "out"
    r = runner.invoke(app, ["shard", str(d), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["rejects_by_reason"] == {"bad_msm_id": 1, "bad_rtt": 2, "null_field": 1, "bad_size": 5}
    assert res["rows_written"] == 196
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    got = [(x["file"].rsplit("/", 1)[1], x["row"], x["reason"]) for x in rejects]
    assert got == [("b.parquet", i, "bad_size") for i in range(5)] + [
        ("t.parquet", 0, "bad_msm_id"), ("t.parquet", 1, "bad_rtt"), ("t.parquet", 2, "bad_rtt"),
        ("t.parquet", 3, "null_field"),
    ]  # row: 0-based file_row_number
    assert rejects[5]["raw"]["msm_id"] == "1.5" and rejects[6]["raw"]["rtt"] == "abc"
    written = pa.concat_tables(_read_split(out, s) for s in ("train", "val", "test")).to_pydict()
    assert len(written["msm_id"]) == 196 and 2 not in written["msm_id"] and max(written["rtt"]) < 1e6


def test_inspect_names_each_reject_reason_with_its_first_row(tmp_path):
    # was one line of a Python dict, {'bad_rtt': 2}: no meaning, no row to look at
    t = make_table(20)
    rtt = t.column("rtt").to_pylist()
    rtt[5] = rtt[9] = -7.0
    size = t.column("size").to_pylist()
    size[12] = -1
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt, pa.float64()))
    t = t.set_column(t.schema.get_field_index("size"), "size", pa.array(size, t.schema.field("size").type))
    pq.write_table(t, tmp_path / "t.parquet")
    r = runner.invoke(app, ["inspect", str(tmp_path / "t.parquet"), "--json"])
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["invalid_rows"] == 3 and d["invalid_by_reason"] == {"bad_rtt": 2, "bad_size": 1}
    assert {k: (v["rows"], v["first"]["row"]) for k, v in d["rejected"].items()} == {"bad_rtt": (2, 5),
                                                                                       "bad_size": (1, 12)}
    r = runner.invoke(app, ["inspect", str(tmp_path / "t.parquet")])
    text = " ".join(r.output.split())
    assert "bad_rtt: 2 row(s) (rtt is not a number" in text and "t.parquet row 5" in text, r.output
