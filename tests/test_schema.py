import datetime as dt
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pingctl.errors import PingctlError
from pingctl.artifacts.table import resolve_inputs
from pingctl.schema.addresses import is_public, parse_address
from pingctl.schema.columns import SEED_COLUMNS, arrow_schema, check_rtt
from pingctl.schema.duck import canonical_query, connect
from tests.conftest import make_table


def test_schema_is_the_seed_schema_plus_the_optional_columns():
    s = arrow_schema()
    assert tuple(s.names) == SEED_COLUMNS + ("prb_id", "ttl", "dst_name", "dup")
    assert s.field("event_time").type == pa.timestamp("us", tz="UTC")
    assert s.field("rtt").type == pa.float64()
    assert all(s.field(c).type == pa.int64() for c in ("msm_id", "ip_version", "size", "packet_error_count", "ttl"))
    assert (s.field("dst_name").type, s.field("dup").type) == (pa.string(), pa.bool_())
    assert all(s.field(c).nullable for c in ("prb_id", "ttl", "dst_name", "dup"))
    assert s.metadata == {b"pingctl.schema_version": b"2"}


@given(st.ip_addresses())
def test_parse_address_canonicalises_any_ip(ip):
    if ip.version == 6 and ip.ipv4_mapped is not None:
        # no measurement records an IPv4-mapped address: refused in every spelling (docs/data.md)
        assert parse_address(ip.exploded) is None and parse_address(str(ip)) is None
        return
    canon, version = parse_address(ip.exploded)
    assert version == ip.version and canon == str(ip)


@pytest.mark.parametrize("bad", ["", "1.2.3", "256.1.1.1", "1.2.3.4.5", "::g", "01.2.3.4", "x" * 60, "1.2.3.4 "])
def test_parse_address_rejects(bad):
    assert parse_address(bad) is None


def test_public_and_rtt_rules():
    assert not is_public("192.168.1.1") and not is_public("fe80::1") and not is_public("100.64.0.1")
    assert is_public("193.0.14.129") and is_public("2001:7fd::1")
    assert check_rtt(0.0) and check_rtt(-1.0) and check_rtt(12.5)
    assert not check_rtt(-0.5) and not check_rtt(math.nan) and not check_rtt(math.inf)


def _write(tmp_path, table, name="t.parquet"):
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def _reasons(path):
    con = connect()
    canonical_query(con, [path])
    return dict(con.execute("SELECT _row, reject_reason FROM canonical ORDER BY _row").fetchall())


def test_validation_reasons_per_row(tmp_path):
    t = make_table(12, prb=False)
    src = t.column("src_addr").to_pylist()
    dst = t.column("dst_addr").to_pylist()
    rtt = t.column("rtt").to_pylist()
    ipv = t.column("ip_version").to_pylist()
    times = t.column("event_time").to_pylist()
    size = t.column("size").to_pylist()
    src[1] = "not-an-ip"
    dst[2] = "8.8.8"
    dst[3] = "2001:db8::1"  # v6 on a v4 row
    rtt[4] = math.nan
    rtt[5] = -3.0
    times[6] = dt.datetime(1999, 1, 1, tzinfo=dt.timezone.utc)
    times[7] = dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)
    ipv[8] = 5
    size[9] = -1
    src[10] = None
    t = t.set_column(2, "src_addr", pa.array(src)).set_column(3, "dst_addr", pa.array(dst))
    t = t.set_column(5, "rtt", pa.array(rtt)).set_column(4, "ip_version", pa.array(ipv, pa.int64()))
    t = t.set_column(1, "event_time", pa.array(times, pa.timestamp("us", tz="UTC")))
    t = t.set_column(6, "size", pa.array(size, pa.int64()))
    reasons = _reasons(_write(tmp_path, t))
    assert reasons == {
        0: None, 1: "bad_src_addr", 2: "bad_dst_addr", 3: "af_mismatch", 4: "bad_rtt", 5: "bad_rtt",
        6: "bad_time", 7: "bad_time", 8: "bad_ip_version", 9: "bad_size", 10: "null_field", 11: None,
    }


def test_any_parquet_with_the_seed_columns_is_accepted(tmp_path):
    # int32 columns, ns timestamps without zone, extra column, no prb_id: all fine.
    t = make_table(50, prb=False)
    t = t.set_column(4, "ip_version", t.column("ip_version").cast(pa.int32()))
    t = t.set_column(1, "event_time", t.column("event_time").cast(pa.timestamp("ns")))
    t = t.append_column("extra", pa.array(range(50)))
    path = _write(tmp_path, t)
    assert set(_reasons(path).values()) == {None}
    missing = _write(tmp_path, t.drop_columns(["rtt"]), "m.parquet")
    with pytest.raises(PingctlError, match="missing column.*rtt"):
        canonical_query(connect(), [missing])


def test_unix_seconds_event_time(tmp_path):
    t = make_table(5, prb=False)
    secs = pa.array([1_700_000_000 + i for i in range(5)], pa.int64())
    path = _write(tmp_path, t.set_column(1, "event_time", secs))
    con = connect()
    canonical_query(con, [path])
    first = con.execute("SELECT event_time FROM canonical ORDER BY _row LIMIT 1").fetchall()[0][0]
    assert first == dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)


def test_resolve_inputs_skips_hidden_temp_dirs(tmp_path):
    (tmp_path / "d" / ".d.tmp-x").mkdir(parents=True)
    pq.write_table(make_table(3), tmp_path / "d" / "a.parquet")
    pq.write_table(make_table(3), tmp_path / "d" / ".d.tmp-x" / "b.parquet")
    assert [p.name for p in resolve_inputs([tmp_path / "d"])] == ["a.parquet"]
    with pytest.raises(PingctlError, match="not found"):
        resolve_inputs([tmp_path / "nope*.parquet"])


def test_zone_ids_are_not_addresses():
    # ipaddress accepts "fe80::1%eth0"; it passed ingest and shard, then stopped build-rows
    from pingctl.schema.addresses import parse_address

    assert parse_address("2001:4860:4860::8888%eth0") is None and parse_address("fe80::1%1") is None
    assert parse_address("2001:4860:4860::8888") == ("2001:4860:4860::8888", 6)


@given(st.integers(-10**14, 10**14), st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)))
def test_one_time_parser_reads_seconds_and_iso_exactly(secs, when):
    from pingctl.schema.times import parse_when

    assert parse_when(str(secs), "--time") == secs * 1_000_000
    utc = when.replace(tzinfo=dt.timezone.utc)
    us = (utc - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
    assert parse_when(when.isoformat(), "--time") == us  # naive = UTC
    assert parse_when(when.isoformat() + "Z", "--time") == us


def test_time_options_refuse_what_is_not_ascii_seconds_or_iso_in_every_command():
    from typer.testing import CliRunner

    from pingctl.cli.app import app
    from pingctl.errors import UsageError
    from pingctl.schema.times import parse_when

    for bad in ("²", "١٢", "1e16", "nan", "12 s", "+-nan", "--inf"):  # float() reads '١٢' as 12, isdigit() '²'
        with pytest.raises(UsageError, match="--time"):
            parse_when(bad, "--time", UsageError)
    for empty in ("", " "):  # "" is "no time" to parse_when (an unset config key), not to an option
        r = CliRunner().invoke(app, ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", f"--time={empty}"])
        assert r.exit_code == 2 and "--time is empty" in r.output, r.output
    # tokenize took '²' as digits and ended in an internal error
    r = CliRunner().invoke(app, ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", "--time", "²"])
    assert r.exit_code == 2 and "--time '²': expected ISO 8601" in r.output and "internal error" not in r.output


def _cols(tmp_path, name, n=None, **cols):
    """A valid table with some columns replaced (as given: any Arrow type)."""
    n = n or len(next(iter(cols.values())))
    t = make_table(n)
    for c, values in cols.items():
        t = t.set_column(t.schema.get_field_index(c), c, values if isinstance(values, pa.Array) else pa.array(values))
    return _write(tmp_path, t, name)


def test_integer_columns_given_as_floats_must_be_integral_and_not_booleans(tmp_path):
    # a plain cast would round 1.5 to 2 and read true as 1; ingest rejects both
    path = _cols(
        tmp_path, "f.parquet",
        msm_id=[1.5, 2.0, 3.0, 4.0, 5.0, math.nan],
        ip_version=[4.0, 4.0, 4.5, 4.0, 4.0, 4.0],
        size=pa.array(["48", "48.0", "48", "48.5", "48", "48"]),
        prb_id=[7.0, None, 7.0, 7.0, 7.25, 7.0],
    )
    assert _reasons(path) == {
        0: "bad_msm_id", 1: None, 2: "bad_ip_version", 3: "bad_size", 4: "bad_prb_id", 5: "bad_msm_id",
    }
    con = connect()
    canonical_query(con, [path])
    assert con.execute("SELECT msm_id, ip_version, size, prb_id FROM canonical WHERE _row = 1").fetchall() == [
        (2, 4, 48, None)
    ]
    assert _reasons(_cols(tmp_path, "b.parquet", size=[True, False])) == {0: "bad_size", 1: "bad_size"}
    assert _reasons(_cols(tmp_path, "r.parquet", rtt=[True, False])) == {0: "bad_rtt", 1: "bad_rtt"}
    # next to a file with int64 ids, union_by_name must not turn true into 1
    ints = _write(tmp_path, make_table(2), "i.parquet")
    bools = _cols(tmp_path, "m.parquet", msm_id=[True, False])
    con = connect()
    canonical_query(con, [ints, bools])
    got = con.execute("SELECT _file, _row, msm_id, reject_reason FROM canonical ORDER BY _file, _row").fetchall()
    assert [(r[2], r[3]) for r in got if r[0] == str(bools)] == [(None, "bad_msm_id")] * 2
    assert [r[3] for r in got if r[0] == str(ints)] == [None, None]


def test_rtt_above_the_codecs_largest_value_is_bad_rtt(tmp_path):
    from pingctl.schema.columns import MAX_RTT_MS
    from pingctl.tokenizer.rtt_codec import MAX_MS

    assert MAX_RTT_MS == MAX_MS
    big = [1e308, MAX_MS, math.nextafter(MAX_MS, math.inf), 1e12, -1.0, 0.0]
    assert _reasons(_cols(tmp_path, "r.parquet", rtt=big)) == {
        0: "bad_rtt", 1: None, 2: "bad_rtt", 3: "bad_rtt", 4: None, 5: None,
    }
    assert check_rtt(MAX_MS) and not check_rtt(1e308) and not check_rtt(True)


def test_rtt_codec_saturates_huge_values_without_overflow_warnings():
    import warnings

    import numpy as np

    from pingctl.tokenizer.rtt_codec import MAX_CODE, MAX_MS, encode_rtt

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        codes = encode_rtt([1e308, -1e308, np.inf, -np.inf, np.nan, MAX_MS * 10, MAX_MS, 0.0, -1.0, 1.5])
    assert codes.tolist() == [MAX_CODE, 0, MAX_CODE, 0, MAX_CODE, MAX_CODE, MAX_CODE, 0, 0, 1500]


def test_a_present_value_that_does_not_cast_names_its_column(tmp_path):
    # 'abc' in rtt is a bad rtt, not a null; null_field stays for real nulls
    path = _cols(tmp_path, "s.parquet", rtt=["1.5", "abc", "2.5", "", None])
    assert _reasons(path) == {0: None, 1: "bad_rtt", 2: None, 3: "bad_rtt", 4: "null_field"}
    path = _cols(
        tmp_path, "i.parquet",
        msm_id=["1", "x", "3", "4", "5"],
        packet_error_count=["0", "0", "-", "0", "0"],
        ip_version=["4", "4", "4", "four", "4"],
        prb_id=["7", "7", "7", "7", "p7"],
    )
    assert _reasons(path) == {0: None, 1: "bad_msm_id", 2: "bad_error_count", 3: "bad_ip_version", 4: "bad_prb_id"}
    # an unsigned id beyond int64 is present, so not null either
    path = _cols(tmp_path, "u.parquet", prb_id=pa.array([2**64 - 1, 5, None], pa.uint64()))
    assert _reasons(path) == {0: "bad_prb_id", 1: None, 2: None}


def test_a_manifest_may_only_name_files_inside_its_directory_and_sample_is_capped(tmp_path):
    import json

    from typer.testing import CliRunner

    from pingctl.cli.app import app

    runner = CliRunner()
    d = tmp_path / "table"
    d.mkdir()
    pq.write_table(make_table(3), d / "a.parquet")
    pq.write_table(make_table(3), tmp_path / "outside.parquet")
    for files in ([5], ["../outside.parquet"], [str(tmp_path / "outside.parquet")]):
        (d / "manifest.json").write_text(json.dumps({"data_files": files}))
        r = runner.invoke(app, ["inspect", str(d)])  # [5] was a TypeError (exit 70); ../ read outside
        assert r.exit_code == 1 and "data_files must be file names inside" in r.output, r.output
    (d / "manifest.json").write_text(json.dumps({"data_files": ["a.parquet"]}))
    r = runner.invoke(app, ["inspect", str(d), "--sample", "50000000", "--json"])  # ran out of memory
    assert r.exit_code == 0 and len(json.loads(r.stdout)["sample"]) == 3, r.output
