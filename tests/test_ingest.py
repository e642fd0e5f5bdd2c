"""`pingctl ingest`: per-result rules, inputs, filters, rejects, atomic output, CLI."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import math
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import IngestConfig
from pingctl.errors import PingctlError
from pingctl.ingest.core import ingest, ingest_bytes, resolve
from pingctl.ingest.parse import Options, parse_when, reconcile, sample_keep
from pingctl.ingest.reader import iter_records
from pingctl.schema.columns import arrow_schema

FIXTURES = Path(__file__).parent / "fixtures" / "ingest"
VARIANTS = FIXTURES / "firmware-variants.jsonl"
T0 = 1_700_000_000


def res(**kw) -> dict:
    """A modern (fw 5080) IPv4 ping result; keyword arguments replace/add fields."""
    d = {
        "fw": 5080,
        "af": 4,
        "dst_addr": "8.8.8.8",
        "dst_name": "8.8.8.8",
        "src_addr": "192.168.1.10",
        "from": "81.2.3.4",
        "proto": "ICMP",
        "size": 48,
        "result": [{"rtt": 10.5}, {"rtt": 11.25}, {"rtt": 12.0}],
        "dup": 0,
        "rcvd": 3,
        "sent": 3,
        "min": 10.5,
        "max": 12.0,
        "avg": 11.25,
        "msm_id": 1001,
        "prb_id": 7,
        "timestamp": T0,
        "type": "ping",
    }
    for k, v in kw.items():
        if v is _DEL:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DEL = object()


def jl(*results) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in results)


def run(*results, **opts):
    table, counts, rejects = ingest_bytes(jl(*results), Options(**opts))
    assert reconcile(counts) == []
    return table, counts, rejects


def rows(table) -> list[dict]:
    return table.to_pylist()


def cfg(**kw) -> IngestConfig:
    kw.setdefault("workers", 1)
    return IngestConfig(**kw)


def read_out(out: Path):
    import pyarrow as pa

    parts = sorted(out.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts]) if parts else arrow_schema().empty_table()


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- per-result rules


def test_modern_result_columns():
    table, c, rej = run(res())
    assert table.schema == arrow_schema()
    r = rows(table)
    assert [x["rtt"] for x in r] == [10.5, 11.25, 12.0]
    first = r[0]
    assert first["msm_id"] == 1001 and first["prb_id"] == 7 and first["ip_version"] == 4
    assert first["event_time"].timestamp() == T0
    assert first["src_addr"] == "81.2.3.4"  # private src_addr -> public `from` (auto)
    assert first["dst_addr"] == "8.8.8.8" and first["size"] == 48 and first["packet_error_count"] == 0
    assert c["results_written"] == 1 and c["rows"] == 3 and c["replies"] == 3 and c["src_from"] == 1
    assert rej == []


def test_fixture_firmware_variants():
    table, c, rej = ingest_bytes(VARIANTS.read_bytes(), Options(), label=str(VARIANTS))
    assert reconcile(c) == []
    r = rows(table)
    by_msm: dict[int, list] = {}
    for x in r:
        by_msm.setdefault(x["msm_id"], []).append(x)
    # modern, private src -> from
    assert [x["rtt"] for x in by_msm[49921351][:3]] == [20.666405, 21.615603, 20.915031]
    assert by_msm[49921351][0]["src_addr"] == "83.5.171.244"
    # IPv6, destination canonicalised, public src_addr kept
    v6 = by_msm[2001]
    assert [x["rtt"] for x in v6] == [-1.0, 4.315385, 4.784135]
    assert {x["dst_addr"] for x in v6} == {"2001:7fd::1"} and {x["ip_version"] for x in v6} == {6}
    assert v6[0]["src_addr"] == "2a02:2b58:1:2:a2f3:c1ff:fec4:41b2"
    # fw 4430: addr/name/srcaddr/mode, no `type`
    old = by_msm[1001]
    assert [x["rtt"] for x in old] == [10.5, 11.0, -1.0]
    assert old[0]["dst_addr"] == "193.0.14.129" and old[0]["src_addr"] == "81.10.20.30"
    assert old[0]["ip_version"] == 4 and old[0]["size"] == 56
    # error result: no src_addr -> from, size 0, one row with rtt -1 and 1 error
    err = by_msm[49921351][3]
    assert err["rtt"] == -1.0 and err["packet_error_count"] == 1 and err["size"] == 0
    assert err["src_addr"] == "213.49.39.36"
    # dup kept
    assert [x["rtt"] for x in by_msm[49921488]] == [54.669097, 1563.797486, 837.758407]
    # dst from an IP-literal dst_name; late with rtt = reply, late without rtt = other
    late = by_msm[3001]
    assert late[0]["dst_addr"] == "9.9.9.9"
    assert [x["rtt"] for x in late] == [5.25, -1.0, -1.0, -1.0]
    assert {x["packet_error_count"] for x in late} == {1}
    assert c["records"] == 9
    assert c["results_written"] == 6 and c["summary_only"] == 1
    assert c["rows"] == 17 and c["rows_v6"] == 3
    assert (c["replies"], c["dups"], c["timeouts"], c["errors"], c["other_packets"], c["late"]) == (10, 1, 3, 2, 1, 2)
    assert c["src_from"] == 4
    assert c["rejected"] == {"no_dst_addr": 1, "not_ping": 1}
    assert [(x["line"], x["reason"]) for x in rej] == [(8, "no_dst_addr"), (9, "not_ping")]
    assert all(x["file"] == str(VARIANTS) and x["raw"].startswith("{") for x in rej)


def test_timeouts_and_errors():
    r = res(result=[{"x": "*"}, {"error": "sendto failed"}, {"rtt": 3.0}, {"error": "again"}])
    table, c, _ = run(r)
    assert [x["rtt"] for x in rows(table)] == [-1.0, -1.0, 3.0, -1.0]
    assert {x["packet_error_count"] for x in rows(table)} == {2}
    assert (c["timeouts"], c["errors"], c["replies"]) == (1, 2, 1)


def test_dups_kept_and_dropped():
    r = res(result=[{"rtt": 1.0}, {"rtt": 2.0, "dup": 1}, {"rtt": 3.0, "dup": 1, "ttl": 50}])
    table, c, _ = run(r)
    assert [x["rtt"] for x in rows(table)] == [1.0, 2.0, 3.0]
    assert c["dups"] == 2 and c["dups_dropped"] == 0 and c["replies"] == 1
    table, c, _ = run(r, drop_dups=True)
    assert [x["rtt"] for x in rows(table)] == [1.0]
    assert c["dups"] == 2 and c["dups_dropped"] == 2 and c["rows"] == 1


def test_summary_only_and_empty_and_no_result():
    summary = res(result=_DEL, fw=1)
    empty = res(result=[])
    neither = {k: v for k, v in res(result=_DEL).items() if k not in ("avg", "min", "max")}
    table, c, rej = run(summary, empty, neither)
    assert table.num_rows == 0
    assert c["summary_only"] == 1 and c["results_written"] == 1 and c["empty_results"] == 1
    assert [x["reason"] for x in rej] == ["no_result"]



def test_a_result_that_is_not_a_list_is_a_reject_not_summary_only():
    # with avg/min/max present these counted as old-firmware summaries: data damage hidden
    table, c, rej = run(res(result="abc"), res(result={}), res(result=None))
    assert c["summary_only"] == 0 and [x["reason"] for x in rej] == ["no_result"] * 3


@pytest.mark.parametrize(
    "src,frm,mode,want,reason",
    [
        ("192.168.1.10", "81.2.3.4", "auto", "81.2.3.4", None),
        ("81.2.3.9", "81.2.3.4", "auto", "81.2.3.9", None),  # public src_addr wins
        ("", "81.2.3.4", "auto", "81.2.3.4", None),
        (_DEL, "81.2.3.4", "auto", "81.2.3.4", None),
        ("169.254.3.3", "81.2.3.4", "auto", "81.2.3.4", None),  # link-local
        ("192.168.1.10", "", "auto", "192.168.1.10", None),  # nothing public: keep private
        ("", "", "auto", None, "no_src_addr"),
        ("garbage", "also garbage", "auto", None, "bad_src_addr"),
        ("2a02::1", "2a02::2", "auto", None, "af_mismatch"),
        ("192.168.1.10", "81.2.3.4", "src_addr", "192.168.1.10", None),
        ("192.168.1.10", "81.2.3.4", "from", "81.2.3.4", None),
        ("192.168.1.10", "", "from", None, "no_src_addr"),
        ("", "81.2.3.4", "src_addr", None, "no_src_addr"),
        ("nope", "81.2.3.4", "src_addr", None, "bad_src_addr"),
        ("192.168.1.10", "2a02::2", "from", None, "af_mismatch"),
    ],
)
def test_source_address_rule(src, frm, mode, want, reason):
    table, c, rej = run(res(src_addr=src, **{"from": frm}), src_field=mode)
    if reason is None:
        assert {x["src_addr"] for x in rows(table)} == {want}
    else:
        assert table.num_rows == 0 and [x["reason"] for x in rej] == [reason]


def test_old_srcaddr_and_pf():
    r = res(src_addr=_DEL, srcaddr="82.1.1.1", af=_DEL, pf=4, dst_addr=_DEL, addr="9.9.9.9", type=_DEL)
    table, _, rej = run(r, src_field="src_addr")
    assert rej == []
    assert {(x["src_addr"], x["dst_addr"], x["ip_version"]) for x in rows(table)} == {("82.1.1.1", "9.9.9.9", 4)}


def test_ipv6_canonical_and_af_checks():
    r = res(af=6, dst_addr="2001:0DB8:0000::0001", src_addr="2A02:2B58::5", **{"from": "2a02:2b58::5"})
    table, _, _ = run(r)
    assert {(x["dst_addr"], x["src_addr"], x["ip_version"]) for x in rows(table)} == {("2001:db8::1", "2a02:2b58::5", 6)}
    _, _, rej = run(res(af=6))  # IPv4 addresses in an af=6 result
    assert [x["reason"] for x in rej] == ["af_mismatch"]
    _, _, rej = run(res(af=5), res(af="4"), res(dst_addr="not-an-ip"), res(dst_addr=_DEL, dst_name="host.example"))
    assert [x["reason"] for x in rej] == ["bad_af", "bad_af", "bad_dst_addr", "no_dst_addr"]


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"type": "traceroute"}, "not_ping"),
        ({"msm_id": "1001"}, "bad_msm_id"),
        ({"msm_id": _DEL}, "bad_msm_id"),
        ({"prb_id": "x"}, "bad_prb_id"),
        ({"timestamp": _DEL}, "bad_time"),
        ({"timestamp": 5}, "bad_time"),
        ({"timestamp": T0 * 1000}, "bad_time"),  # milliseconds: far future
        ({"timestamp": "1700000000"}, "bad_time"),
        ({"timestamp": 1.8e302}, "bad_time"),  # * 1e6 overflows to inf (found by the fuzz test below)
        ({"timestamp": -1e300}, "bad_time"),
        ({"timestamp": 1.8e302, "af": False}, "bad_time"),  # the same on the generic path
        ({"result": [{"rtt": -2.0}]}, "bad_rtt"),
        ({"result": [{"rtt": "1.5"}]}, "bad_rtt"),
        ({"result": [{"rtt": None}]}, "bad_rtt"),
        ({"result": [{"rtt": True}]}, "bad_rtt"),
        ({"result": [{"rtt": 1e308}]}, "bad_rtt"),  # beyond the RTT code (shard refuses it too)
        ({"result": [{"rtt": 5_000_000_000}]}, "bad_rtt"),
        ({"result": [{"rtt": 1.0}, "junk"]}, "bad_packet"),
        ({"result": [{"rtt": 1.0}, 5]}, "bad_packet"),
        ({"result": [[{"rtt": 1.0}]]}, "bad_packet"),
        ({"msm_id": 1 << 63}, "bad_msm_id"),
        ({"msm_id": -5}, "bad_msm_id"),
        ({"prb_id": (1 << 64) - 1}, "bad_prb_id"),
        ({"size": 1 << 63}, "bad_size"),
        ({"size": -1}, "bad_size"),
        ({"size": "48"}, "bad_size"),
    ],
)
def test_reject_reasons(change, reason):
    table, c, rej = run(res(), res(**change), res())
    assert table.num_rows == 6 and c["results_written"] == 2
    assert [(x["line"], x["reason"]) for x in rej] == [(2, reason)]


def test_bad_packet_after_dups_takes_counts_back():
    bad = res(result=[{"rtt": 1.0, "dup": 1, "late": 1}, {"late": 2}, {"rtt": -5.0}])
    table, c, rej = run(bad, res(), drop_dups=True)
    assert table.num_rows == 3 and [x["reason"] for x in rej] == ["bad_rtt"]
    assert (c["dups"], c["dups_dropped"], c["late"], c["other_packets"]) == (0, 0, 0, 0)


def test_size_missing_or_null_is_zero_and_int_rtt():
    table, _, rej = run(res(size=_DEL, result=[{"rtt": 3}]), res(size=None))
    assert rej == [] and [x["size"] for x in rows(table)] == [0, 0, 0, 0]
    assert rows(table)[0]["rtt"] == 3.0


def test_float_timestamp_and_missing_prb():
    table, _, _ = run(res(timestamp=T0 + 0.25, prb_id=_DEL))
    r = rows(table)[0]
    assert r["event_time"].timestamp() == T0 + 0.25 and r["prb_id"] is None


def test_array_on_one_line_and_scalars():
    # JSON lines whose lines may be arrays (API pages); a file that *starts* with '['
    # is read as a stream of top-level arrays instead (see test_json_array_layouts).
    data = jl(res()) + orjson.dumps([res(), 5, res(msm_id=2)]) + b"\n" + b"7\n" + b"\n   \n"
    table, c, rej = ingest_bytes(data)
    assert reconcile(c) == []
    assert table.num_rows == 9 and c["records"] == 5
    assert [(x["line"], x["reason"], x["raw"]) for x in rej] == [(2, "not_an_object", "5"), (3, "not_an_object", "7")]


# ---------------------------------------------------------------- filters


def test_filters_counted_not_rejected():
    data = [
        res(msm_id=1),
        res(msm_id=2),
        res(msm_id=2, prb_id=9),
        res(msm_id=2, af=6, dst_addr="2a00::1", src_addr="2a01::2", **{"from": "2a01::2"}),
        res(msm_id=2, timestamp=T0 - 100),
        res(msm_id=2, timestamp=T0 + 100),
        res(msm_id=3, src_addr="bad", **{"from": "bad"}),  # filtered before its source is checked
    ]
    table, c, rej = run(*data, msm_ids=frozenset({2}), probe_ids=frozenset({7}), af=4, since_us=(T0 - 10) * 10**6, until_us=(T0 + 10) * 10**6)
    assert table.num_rows == 3 and rej == []
    assert c["filtered"] == {"msm": 2, "probe": 1, "time": 2, "sample": 0, "af": 1}


def test_since_until_parsing():
    assert parse_when("2023-11-14T22:13:20Z", "since") == T0 * 10**6
    assert parse_when("2023-11-14T22:13:20", "since") == T0 * 10**6  # naive = UTC
    assert parse_when("2023-11-14T23:13:20+01:00", "since") == T0 * 10**6
    assert parse_when(str(T0), "since") == T0 * 10**6
    assert parse_when(None, "since") is None
    with pytest.raises(PingctlError, match="ISO 8601"):
        parse_when("yesterday", "since")
    for huge in ("1e305", "-1e305", "nan", "inf"):
        with pytest.raises(PingctlError, match="not a valid time"):
            parse_when(huge, "until")
    for since, until in (("2024-01-02", "2024-01-01"), ("2024-01-01", "2024-01-01")):
        with pytest.raises(ValueError, match="must be before until"):  # the config model: exit 2
            IngestConfig(since=since, until=until)
        with pytest.raises(PingctlError, match="before"):  # and a model built without checks
            Options.from_config(IngestConfig.model_construct(since=since, until=until))


def test_sample_deterministic_and_fraction():
    data = [res(prb_id=p, timestamp=T0 + 240 * k) for p in range(40) for k in range(50)]
    keep1 = {(x["prb_id"], x["event_time"]) for x in rows(run(*data, sample=0.25)[0])}
    keep2 = {(x["prb_id"], x["event_time"]) for x in rows(run(*reversed(data), sample=0.25)[0])}
    assert keep1 == keep2  # independent of order (and therefore of files/workers)
    assert 0.2 < len(keep1) / len(data) < 0.3
    assert sample_keep(1, 2, 3, 1 << 64) and not sample_keep(1, 2, 3, 0)


# ---------------------------------------------------------------- inputs


def _write(path: Path, payload: bytes) -> Path:
    opener = {".bz2": bz2.compress, ".gz": gzip.compress, ".xz": lzma.compress, ".zst": zstandard.compress}
    path.write_bytes(opener.get(path.suffix, lambda b: b)(payload))
    return path


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.bz2", "a.jsonl.gz", "a.jsonl.zst", "a.jsonl.xz", "a.json"])
def test_compressions(tmp_path, name):
    results = [res(prb_id=i) for i in range(5)]
    payload = jl(*results) if name != "a.json" else json.dumps(results, indent=2).encode()
    f = _write(tmp_path / name, payload)
    s = ingest([f], tmp_path / "out", cfg())
    assert s["rows"] == 15 and s["rejected_total"] == 0
    assert read_out(tmp_path / "out").column("prb_id").to_pylist() == [i for i in range(5) for _ in range(3)]


def test_magic_sniffing_without_suffix(tmp_path):
    f = tmp_path / "ping-2024-01-01T0000"
    f.write_bytes(bz2.compress(jl(res())))
    assert ingest([f], tmp_path / "out", cfg())["rows"] == 3


def test_multistream_bz2(tmp_path):
    f = tmp_path / "multi.bz2"
    f.write_bytes(bz2.compress(jl(res(prb_id=1))) + bz2.compress(jl(res(prb_id=2))))
    assert ingest([f], tmp_path / "out", cfg())["results_written"] == 2


def _elements(data: bytes, chunk: int) -> list:
    pos = 0

    def read():
        nonlocal pos
        piece = data[pos : pos + chunk]
        pos += len(piece)
        return piece

    out = []
    for line0, raws, bad in iter_records(read):
        assert bad is None, (line0, raws, bad)
        out.extend((line0 + j, orjson.loads(r)) for j, r in enumerate(raws) if r.strip())
    return out


def test_json_array_layouts():
    tricky = [res(dst_name='a "quoted" ] } { [ name \\', msm_id=i) for i in range(4)] + [res(dst_name="é ✓ \n")]
    one_line = json.dumps(tricky).encode()
    pretty = json.dumps(tricky, indent=2, ensure_ascii=False).encode()
    pages = (json.dumps(tricky[:2]) + "\n" + json.dumps(tricky[2:]) + "\n").encode()
    for data in (one_line, pretty, pages, b"\xef\xbb\xbf" + one_line):
        for chunk in (1, 7, 64, 1 << 20):
            assert [e for _, e in _elements(data, chunk)] == tricky
    lines = [line for line, _ in _elements(pretty, 13)]
    assert lines[0] == 2 and lines == sorted(lines)


@settings(max_examples=60)
@given(
    values=st.lists(
        st.dictionaries(
            st.text(max_size=5),
            st.recursive(
                st.none() | st.booleans() | st.integers(-10, 10) | st.text(alphabet='ab"\\{}[],: \n\té', max_size=8),
                lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                max_leaves=8,
            ),
            max_size=4,
        ),
        max_size=6,
    ),
    indent=st.sampled_from([None, 1, 4]),
    chunk=st.integers(1, 50),
)
def test_array_splitter_property(values, indent, chunk):
    data = json.dumps(values, indent=indent, ensure_ascii=False).encode()
    assert [e for _, e in _elements(data, chunk)] == values


def test_directory_and_glob_inputs(tmp_path):
    d = tmp_path / "dumps"
    (d / "sub").mkdir(parents=True)
    _write(d / "b.jsonl.bz2", jl(res(prb_id=2)))
    _write(d / "sub" / "a.jsonl.gz", jl(res(prb_id=1)))
    (d / "notes.md").write_text("not data")
    (d / ".hidden.jsonl").write_bytes(jl(res(prb_id=99)))
    files = resolve([d])
    assert [f.name for f in files] == ["b.jsonl.bz2", "a.jsonl.gz"]  # sorted by path
    assert [f.name for f in resolve([str(d / "**" / "*.gz"), str(d / "*.bz2")])] == ["b.jsonl.bz2", "a.jsonl.gz"]
    s = ingest([d], d / "out", cfg())  # output inside an input directory is never read back
    assert s["files"] == 2 and s["results_written"] == 2
    s = ingest([d], d / "out", cfg(), force=True)
    assert s["files"] == 2
    with pytest.raises(PingctlError, match="input not found"):
        resolve([tmp_path / "missing*.bz2"])
    with pytest.raises(PingctlError, match="no input"):
        resolve([])


def test_directory_walk_skips_older_pingctl_outputs_and_temp_siblings(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    _write(d / "a.jsonl", jl(res(prb_id=1), res(prb_id=2)))
    ingest([d], d / "out", cfg())  # mixed/out: an older output of ours
    ingest([d], d / "sub" / "deeper", cfg())
    tmp = d / ".run.tmp-x1y2"  # what an interrupted run leaves
    tmp.mkdir()
    (tmp / "rejects.jsonl").write_text('{"file": "x", "line": 1}\n')
    assert resolve([d], tmp_path / "o") == [d / "a.jsonl"]
    s = ingest([d], tmp_path / "o", cfg())  # was: out/manifest.json, out/rejects.jsonl read as RIPE data
    assert s["files"] == 1 and s["records"] == 2 and s["rejected_total"] == 0
    # named on the command line, a file inside an output is read as given
    assert resolve([d / "out" / "rejects.jsonl"], tmp_path / "o2") == [d / "out" / "rejects.jsonl"]
    with pytest.raises(PingctlError, match="is a pingctl output"):  # its parts are not RIPE results
        resolve([d / "out"], tmp_path / "o3")
    # a glob is a walk by another name: `**` must not bring back an older output's rejects.jsonl
    assert resolve([str(d / "**" / "*.jsonl")], tmp_path / "o4") == [d / "a.jsonl"]
    with pytest.raises(PingctlError, match=r"inside the pingctl output .*out.*name a file itself"):
        resolve([str(d / "out" / "*.jsonl")], tmp_path / "o5")


def test_directory_of_dumps_saved_without_suffixes_is_read_by_content(tmp_path):
    # RIPE's daily dumps are often saved as `ping-2024-01-01T0000`: a walk used to find nothing
    d = tmp_path / "dumps"
    (d / "sub").mkdir(parents=True)
    variants = VARIANTS.read_bytes()
    (d / "ping-2024-01-01T0000").write_bytes(bz2.compress(variants))
    (d / "sub" / "ping-2024-01-01T0100").write_bytes(gzip.compress(jl(*(res(prb_id=i) for i in range(4)))))
    (d / "ping-2024-01-01T0200").write_bytes(b"\n" + jl(res(prb_id=9), res(prb_id=10)))  # plain JSON lines
    (d / "array-dump").write_bytes(b"\xef\xbb\xbf" + json.dumps([res(prb_id=11)], indent=1).encode())
    # not results: left out of the walk, as before
    (d / "README").write_text("daily dumps from data-store.ripe.net\n")
    (d / "LICENSE").write_bytes(gzip.compress(b"MIT License\n" * 100))
    (d / "notebook.ipynb").write_text(json.dumps({"cells": [], "metadata": {}}))
    (d / "random").write_bytes(bytes(range(256)) * 8)
    (d / "cut").write_bytes(bz2.compress(jl(res()))[:20])  # damaged before any line: not judged RIPE
    (d / ".ping-hidden").write_bytes(jl(res(prb_id=99)))
    ingest([d / "ping-2024-01-01T0200"], d / "older-out", cfg())  # an older output of ours, inside
    names = [f.name for f in resolve([d], tmp_path / "out")]
    assert names == ["array-dump", "ping-2024-01-01T0000", "ping-2024-01-01T0200", "ping-2024-01-01T0100"]
    s = ingest([d], tmp_path / "out", cfg())
    # each dump ingests as it does named on the command line: codec sniffed, every count kept
    one = [ingest([f], tmp_path / f"one-{i}", cfg()) for i, f in enumerate(resolve([d]))]
    for k in ("records", "rows", "results_written", "rejected_total"):
        assert s[k] == sum(o[k] for o in one), k
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["codec"] for i in manifest["inputs"]] == ["plain", "bz2", "plain", "gzip"]
    assert s["files"] == 4 and s["results_written"] == 1 + 2 + 4 + one[1]["results_written"]
    assert sum(i["records"] for i in manifest["inputs"]) == s["records"]
    assert s["records"] == s["results_written"] + s["summary_only"] + sum(s["filtered"].values()) + s["rejected_total"]
    assert read_out(tmp_path / "out").num_rows == s["rows"]
    assert len(read_rejects(tmp_path / "out")) == s["rejected_total"] > 0  # the fixture's own rejects


def _fifo_writer(fifo: Path, payload: bytes):
    import threading

    def write():
        try:
            with open(fifo, "wb") as fh:
                fh.write(payload)
        except OSError:  # the reader went away
            pass

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def _unblock(fifo: Path, t) -> None:
    import os

    if t.is_alive():  # nobody opened the FIFO: let the writer's open() return
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        t.join(5)
        os.close(fd)


def test_pipes_and_fifos_are_read_as_one_stream(tmp_path):
    import hashlib
    import os
    import subprocess
    import sys

    data = jl(*[res(prb_id=i, timestamp=T0 + i) for i in range(300)]) + b"{broken\n"
    packed = bz2.compress(data)
    fifo = tmp_path / "feed"  # no suffix: bzip2 found by its magic bytes, decoded by the bz2 module
    os.mkfifo(fifo)
    plain = _write(tmp_path / "b.jsonl", jl(res(msm_id=5)))
    t = _fifo_writer(fifo, packed)
    totals = []
    try:
        s = ingest([fifo, plain], tmp_path / "o", cfg(workers=2), on_start=lambda b, n: totals.append((b, n)))
    finally:
        _unblock(fifo, t)
    assert totals == [(None, 2)]  # a pipe has no size: progress without a total
    assert s["workers"] == 1  # only this process can read the stream
    assert s["files"] == 2 and s["records"] == 302 and s["rows"] == 903 and s["rejected"] == {"bad_json": 1}
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    feed = m["inputs"][1]
    assert feed["path"] == str(fifo) and feed["codec"] == "bz2" and feed["records"] == 301
    assert feed["bytes"] == len(packed) and feed["sha256"] == hashlib.sha256(packed).hexdigest()
    # /dev/stdin as a real pipe (CliRunner's stdin is not a file descriptor)
    cmd = [sys.executable, "-m", "pingctl", "ingest", "/dev/stdin", "-o", str(tmp_path / "p"), "--json"]
    proc = subprocess.run(cmd, input=data, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["files"] == 1 and s["records"] == 301 and s["rows"] == 900 and s["rejected_total"] == 1


# ---------------------------------------------------------------- broken inputs


def test_truncated_bz2_one_reject_with_line(tmp_path):
    import hashlib

    # varied text: bzip2 packs repetitive lines into a single 900 kB block
    big = jl(*[res(prb_id=i, dst_name=hashlib.sha256(b"%d" % i).hexdigest() * 4) for i in range(6000)])
    blob = bz2.compress(big)
    f = tmp_path / "cut.jsonl.bz2"
    f.write_bytes(blob[: len(blob) * 2 // 3])
    s = ingest([f], tmp_path / "out", cfg())
    rej = read_rejects(tmp_path / "out")
    assert [x["reason"] for x in rej] == ["truncated"]
    assert rej[0]["file"] == str(f) and rej[0]["line"] == s["results_written"] + 1
    assert "detail" in rej[0] and s["records"] == s["results_written"] + 1
    assert 0 < s["results_written"] < 6000


def test_zstd_cut_inside_a_later_frame_is_a_reject_not_a_quiet_end(tmp_path):
    # zstd's stream reader returned a normal end of file here: 100 results lost, no reject
    a = zstandard.compress(jl(*[res(prb_id=i) for i in range(100)]))
    b = zstandard.compress(jl(*[res(prb_id=i) for i in range(100, 200)]))
    f = tmp_path / "two.jsonl.zst"
    f.write_bytes(a + b[: len(b) // 2])
    s = ingest([f], tmp_path / "out", cfg())
    assert s["results_written"] == 100 and s["rejected"] == {"truncated": 1}
    assert "zstd frame" in read_rejects(tmp_path / "out")[0]["detail"]


@pytest.mark.parametrize("codec", [".gz", ".zst"])
def test_lines_before_damage_are_kept(tmp_path, codec):
    # GzipFile and zstd's reader dropped the last ~1 MiB decoded before the error
    good = jl(*[res(prb_id=i) for i in range(200)])
    f = tmp_path / f"trail.jsonl{codec}"
    f.write_bytes(_write(tmp_path / f"x{codec}", good).read_bytes() + b"JUNK")
    s = ingest([f], tmp_path / "out", cfg())
    assert s["results_written"] == 200 and s["rejected"] == {"truncated": 1}


def test_json_lines_whose_first_line_is_an_array(tmp_path):
    # the layout was taken from the first byte ('['), and the object lines after it were
    # skipped as one "unexpected data after the JSON array" reject
    arr = lambda *rs: json.dumps([r for r in rs]).encode() + b"\n"  # noqa: E731
    body = (arr(res(prb_id=1), res(prb_id=2)) + jl(res(prb_id=3), res(prb_id=4), res(prb_id=5))
            + b"{not json\n" + arr(res(prb_id=6), res(prb_id=7)))
    f = tmp_path / "mixed.jsonl"
    f.write_bytes(body)
    s = ingest([f], tmp_path / "out", cfg())
    assert s["results_written"] == 7 and s["rejected"] == {"bad_json": 1}
    assert read_rejects(tmp_path / "out")[0]["line"] == 5
    assert sorted(set(read_out(tmp_path / "out").column("prb_id").to_pylist())) == [1, 2, 3, 4, 5, 6, 7]


def test_gzip_members_and_zero_padding(tmp_path):
    f = tmp_path / "pad.jsonl.gz"
    f.write_bytes(gzip.compress(jl(res(prb_id=1))) + gzip.compress(jl(res(prb_id=2))) + b"\0" * 100)
    s = ingest([f], tmp_path / "out", cfg())
    assert s["results_written"] == 2 and s["rejected_total"] == 0


@pytest.mark.parametrize("name", ["garbage.jsonl.bz2", "garbage.jsonl.gz", "garbage.jsonl.zst", "garbage.jsonl.xz"])
def test_garbage_compressed_file(tmp_path, name):
    f = tmp_path / name
    f.write_bytes(b"this is not compressed at all\n" * 100)
    s = ingest([f], tmp_path / "out", cfg())
    assert s["rejected"] == {"truncated": 1} and s["rows"] == 0
    assert read_rejects(tmp_path / "out")[0]["line"] == 1


def test_truncated_plain_and_array(tmp_path):
    good = jl(res(), res())
    _, c, rej = ingest_bytes(good + orjson.dumps(res())[:50])
    assert c["results_written"] == 2 and [(x["line"], x["reason"]) for x in rej] == [(3, "truncated")]
    arr = json.dumps([res(), res(), res()], indent=1).encode()
    _, c, rej = ingest_bytes(arr[: len(arr) - 40])
    assert c["results_written"] == 2 and [x["reason"] for x in rej] == ["truncated"]
    # after a complete array the rest is read as JSON lines: a last line without a newline
    # that does not parse reads as a cut-off file, as in any JSON-lines file
    _, c, rej = ingest_bytes(json.dumps([res()]).encode() + b" trailing junk")
    assert c["results_written"] == 1 and [x["reason"] for x in rej] == ["truncated"]
    _, c, rej = ingest_bytes(json.dumps([res()]).encode() + b" trailing junk\n")
    assert c["results_written"] == 1 and [x["reason"] for x in rej] == ["bad_json"]
    _, c, rej = ingest_bytes(b'[{"a": 1} {"b": 2}]')
    assert [x["reason"] for x in rej] == ["bad_msm_id", "bad_json"]


def test_oversized_line_is_skipped():
    from pingctl.ingest import reader

    data = jl(res()) + b"x" * 5000 + b"\n" + jl(res())
    pos = 0

    def read():
        nonlocal pos
        piece = data[pos : pos + 100]
        pos += len(piece)
        return piece

    blocks = list(reader.iter_records(read, max_record=1000))
    assert [b[2][0] for b in blocks if b[2]] == ["too_large"]
    from pingctl.ingest.parse import Batch, Rejects, parse_records

    rej = Rejects("x")
    c = parse_records(iter(blocks), Options(), Batch(), rej)
    assert c["results_written"] == 2 and [(x["line"], x["reason"]) for x in rej.kept] == [(2, "too_large")]


@settings(max_examples=150)
@given(st.binary(max_size=3000), st.integers(1, 300))
def test_random_bytes_never_raise(data, chunk):
    _, c, rej = ingest_bytes(data, chunk=chunk)
    assert reconcile(c) == []
    assert len(rej) == sum(c["rejected"].values())


_VALID = jl(res(), res(af=6, dst_addr="2a00::1", src_addr="2a01::2", **{"from": "2a01::3"}), res(result=[{"x": "*"}, {"rtt": 1.0, "dup": 1}, {"error": "e"}]))


@settings(max_examples=200)
@given(st.data())
def test_mutated_results_never_raise(data):
    buf = bytearray(_VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["flip", "delete", "insert", "swap"]))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[i] = data.draw(st.integers(0, 255))
        elif kind == "delete":
            del buf[i : i + data.draw(st.integers(1, 20))]
        elif kind == "insert":
            buf[i:i] = data.draw(st.sampled_from([b'"', b"{", b"}", b"[", b"]", b",", b"\n", b"null", b"-1", b"1e999", b'"x"', b"\\"]))
        else:
            j = data.draw(st.integers(0, max(len(buf) - 1, 0)))
            buf[i], buf[j] = buf[j], buf[i]
    _, c, _ = ingest_bytes(bytes(buf), chunk=data.draw(st.integers(1, 400)))
    assert reconcile(c) == []


@settings(max_examples=150)
@given(st.data())
def test_field_type_swaps_never_raise(data):
    junk = st.none() | st.booleans() | st.integers() | st.integers(2**62, 2**64) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6) | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    r = res()
    for _ in range(data.draw(st.integers(1, 4))):
        key = data.draw(st.sampled_from(sorted(r) + ["addr", "name", "srcaddr", "pf", "mode"]))
        r[key] = data.draw(junk)
    if data.draw(st.booleans()):
        r["result"] = data.draw(st.lists(st.dictionaries(st.sampled_from(["rtt", "x", "error", "dup", "late", "ttl"]), junk, max_size=3) | junk, max_size=4))
    for mode in ("auto", "from", "src_addr"):
        line = json.dumps(r).encode() + b"\n"  # json: integers beyond 64 bits too
        table, c, rej = ingest_bytes(line, Options(src_field=mode, drop_dups=data.draw(st.booleans())))
        assert reconcile(c) == []
        assert c["records"] == 1
        for x in rows(table):
            assert x["rtt"] == -1.0 or (x["rtt"] >= 0 and math.isfinite(x["rtt"]))


# ---------------------------------------------------------------- output


def test_output_layout_rerun_identical_and_workers_independent(tmp_path):
    a = _write(tmp_path / "in" / "a.jsonl.bz2", jl(*[res(prb_id=i % 7, timestamp=T0 + i) for i in range(700)])) if (tmp_path / "in").mkdir() is None else None
    b = _write(tmp_path / "in" / "b.jsonl", jl(res(msm_id=5)) + b"{broken\n")
    c = _write(tmp_path / "in" / "c.jsonl.gz", b"")  # no rows -> no part file
    s1 = ingest([b, a, c], tmp_path / "o1", cfg(row_group_rows=1024))
    assert s1["rows"] == 2103
    names = sorted(p.name for p in (tmp_path / "o1").iterdir())
    assert names == ["manifest.json", "part-00000.parquet", "part-00001.parquet", "rejects.jsonl"]
    meta = pq.ParquetFile(tmp_path / "o1" / "part-00000.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [1024, 1024, 52]
    assert pq.read_schema(tmp_path / "o1" / "part-00000.parquet") == arrow_schema()
    m = json.loads((tmp_path / "o1" / "manifest.json").read_text())
    assert [i["part"] for i in m["inputs"]] == ["part-00000.parquet", "part-00001.parquet", None]
    assert m["counts"]["rows"] == 2103 and m["inputs"][0]["sha256"] and m["pingctl_version"]
    assert read_rejects(tmp_path / "o1") == [
        {"file": str(b), "line": 2, "reason": "bad_json", "raw": "{broken", "detail": read_rejects(tmp_path / "o1")[0]["detail"]}
    ]
    s2 = ingest([a, b, c], tmp_path / "o2", cfg(row_group_rows=1024, workers=2))
    assert s2["workers"] == 2
    for name in names:
        assert (tmp_path / "o1" / name).read_bytes() == (tmp_path / "o2" / name).read_bytes(), name
    ingest([a, b, c], tmp_path / "o1", cfg(row_group_rows=1024), force=True)
    for name in names:
        assert (tmp_path / "o1" / name).read_bytes() == (tmp_path / "o2" / name).read_bytes(), name


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    from pingctl.ingest import core

    f = _write(tmp_path / "a.jsonl", jl(*[res(prb_id=i) for i in range(2000)]))
    calls = {"n": 0}
    real = core.PartWriter._write

    def boom(self, table):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("disk full")
        real(self, table)

    monkeypatch.setattr(core.PartWriter, "_write", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        ingest([f], tmp_path / "out", cfg(row_group_rows=1024))
    assert calls["n"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]


def test_refuses_foreign_directory(tmp_path):
    f = _write(tmp_path / "a.jsonl", jl(res()))
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("x")
    with pytest.raises(PingctlError, match="did not write"):
        ingest([f], out, cfg())
    ingest([f], out, cfg(), force=True)
    assert not (out / "precious.txt").exists()


def test_output_containing_the_input_is_a_usage_error(tmp_path, monkeypatch):
    from pingctl.errors import UsageError

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "small.jsonl", jl(res()))
    for out in (".", ""):  # Typer makes '' the path '.'
        r = runner.invoke(app, ["ingest", "small.jsonl", "-o", out])
        assert r.exit_code == 2, r.output
        assert "contains the input small.jsonl" in r.output and str(tmp_path) in r.output
    d = tmp_path / "d"
    d.mkdir()
    _write(d / "x.jsonl", jl(res()))
    for inputs in ([d / "x.jsonl"], [d], [str(d / "*.jsonl")]):
        with pytest.raises(UsageError, match="contains the input"):
            ingest(inputs, d, cfg(), force=True)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    r = runner.invoke(app, ["ingest", str(tmp_path / "small.jsonl"), "-o", "."])  # was an internal error
    assert r.exit_code == 2 and "not a valid output" in r.output, r.output
    assert list((tmp_path / "empty").iterdir()) == []  # and no temp sibling left behind
    assert sorted(p.name for p in d.iterdir()) == ["x.jsonl"]


# ---------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_json_and_options(tmp_path):
    f = _write(tmp_path / "a.jsonl.bz2", jl(res(prb_id=1), res(prb_id=2), res(prb_id=2, af=6, dst_addr="2a00::1", src_addr="2a01::2", **{"from": "2a01::2"})))
    conf = tmp_path / "c.yaml"
    conf.write_text("data:\n  ingest:\n    af: 6\n    probe_ids: [1, 2]\n")
    r = runner.invoke(app, ["ingest", str(f), "-o", str(tmp_path / "out"), "--json", "-c", str(conf), "--af", "4", "--probe", "2", "-j", "1"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["results_written"] == 1 and s["filtered"]["probe"] == 1 and s["filtered"]["af"] == 1
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["config"]["af"] == 4 and m["config"]["probe_ids"] == [2]
    r = runner.invoke(app, ["ingest", str(f), "-o", str(tmp_path / "out2"), "-c", str(conf), "--set", "data.ingest.sample=0.5"])
    assert r.exit_code == 0, r.output
    assert "rows written" in r.stdout
    assert json.loads((tmp_path / "out2" / "manifest.json").read_text())["config"]["sample"] == 0.5


def test_cli_exit_codes(tmp_path):
    bad = _write(tmp_path / "bad.jsonl", b"nope\n{}\n")
    good = _write(tmp_path / "good.jsonl", jl(res()) + b"nope\n")
    r = runner.invoke(app, ["ingest", str(bad), "-o", str(tmp_path / "o1"), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["exit_code"] == 1
    assert (tmp_path / "o1" / "rejects.jsonl").exists()  # written anyway, to see why
    r = runner.invoke(app, ["ingest", str(good), "-o", str(tmp_path / "o2")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["ingest", str(good), "-o", str(tmp_path / "o3"), "--strict"])
    assert r.exit_code == 1
    r = runner.invoke(app, ["ingest", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o4")])
    assert r.exit_code == 1 and "input not found" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["ingest", str(good), "-o", str(tmp_path / "o5"), "--since", "tomorrow-ish"])
    assert r.exit_code == 2 and "ISO 8601" in r.output  # a config value error, before any file is read
    r = runner.invoke(app, ["ingest", str(good), "-o", str(tmp_path / "o6"), "--src-field", "nope"])
    assert r.exit_code == 2 and "src_field" in r.output
    assert not (tmp_path / "o4").exists() and not (tmp_path / "o5").exists()


@pytest.mark.slow
def test_bench_ingest_small(tmp_path, monkeypatch):
    from pingctl.ingest import bench

    f = _write(tmp_path / "a.jsonl.gz", jl(*[res(prb_id=i) for i in range(50)]))
    r = bench.bench_ingest([f], [1], sagan=True, limit=20)
    assert r["name"] == "ingest" and len({tuple(row) for row in r["table"]}) == 1
    assert [row["results"] for row in r["table"]] == [50, 50, 20, 20, 20]
    cases = [row["case"] for row in r["table"]]
    assert cases == ["ingest -j 1", "decompress only", "sagan parse", "pingctl parse", "pingctl parse, orjson only"]
    assert r["sagan"]["results"] == 20 and r["sagan"]["speedup_parse"] > 0 and r["notes"]
    # no path in the report may name the deleted temporary output
    assert "pingctl-bench-ingest-" not in json.dumps(r, default=str)
    monkeypatch.setattr(bench, "SHARED", tmp_path / "nowhere")
    with pytest.raises(PingctlError, match="pass RIPE Atlas result files"):
        bench.bench_ingest([], [1], sagan=False, limit=None)
