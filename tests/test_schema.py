import datetime as dt
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pingctl.errors import PingctlError
from pingctl.schema import (
    SEED_COLUMNS,
    arrow_schema,
    canonical_query,
    check_rtt,
    connect,
    is_public,
    parse_address,
    resolve_inputs,
)
from tests.conftest import make_table


def test_schema_is_the_seed_schema_plus_prb_id():
    s = arrow_schema()
    assert tuple(s.names) == SEED_COLUMNS + ("prb_id",)
    assert s.field("event_time").type == pa.timestamp("us", tz="UTC")
    assert s.field("rtt").type == pa.float64()
    assert all(s.field(c).type == pa.int64() for c in ("msm_id", "ip_version", "size", "packet_error_count"))
    assert s.field("prb_id").nullable


@given(st.ip_addresses())
def test_parse_address_canonicalises_any_ip(ip):
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
    from pingctl.schema import parse_address

    assert parse_address("2001:4860:4860::8888%eth0") is None and parse_address("fe80::1%1") is None
    assert parse_address("2001:4860:4860::8888") == ("2001:4860:4860::8888", 6)


@given(st.integers(-10**14, 10**14), st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)))
def test_one_time_parser_reads_seconds_and_iso_exactly(secs, when):
    from pingctl.schema import parse_when

    assert parse_when(str(secs), "--time") == secs * 1_000_000
    utc = when.replace(tzinfo=dt.timezone.utc)
    us = (utc - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
    assert parse_when(when.isoformat(), "--time") == us  # naive = UTC
    assert parse_when(when.isoformat() + "Z", "--time") == us


def test_time_options_refuse_what_is_not_ascii_seconds_or_iso_in_every_command():
    from typer.testing import CliRunner

    from pingctl.cli.app import app
    from pingctl.errors import UsageError
    from pingctl.schema import parse_when

    for bad in ("²", "١٢", "1e16", "nan", "12 s"):  # float() reads '١٢' as 12, isdigit() takes '²'
        with pytest.raises(UsageError, match="--time"):
            parse_when(bad, "--time", UsageError)
    # tokenize took '²' as digits and ended in an internal error
    r = CliRunner().invoke(app, ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", "--time", "²"])
    assert r.exit_code == 2 and "--time '²': expected ISO 8601" in r.output and "internal error" not in r.output
