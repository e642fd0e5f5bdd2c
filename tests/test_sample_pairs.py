"""`pingctl sample --pairs`: many pairs, one model load; every row answered or set aside."""

import csv
import io
import ipaddress
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError, UsageError
from pingctl.infer.pairs import REASONS, read_pairs

runner = CliRunner()

BAD_ROWS = """src,dst,time
78.143.22.26,194.255.199.229,2024-01-03T12:00:00Z
78.143.22.26,2a09:6189:5ce::5ad,
300.1.1.1,1.2.3.4,

78.143.22.26,8.8.*.*,
1.2.3.4
fe80::1%eth0,::1,
::ffff:1.2.3.4,::1,
,1.2.3.4,
1.2.3.4,5.6.7.8,2024-13-01
1.2.3.4,5.6.7.8,1e300
" 2001:DB8::1 ",2001:db8::2,1704283200
"""


def test_every_row_is_answered_or_set_aside_with_its_line_and_reason(tmp_path):
    f = tmp_path / "pairs.csv"
    f.write_text(BAD_ROWS)
    p = read_pairs(f)
    assert p.rows_read == 11 == len(p.src) + len(p.rejects)  # the blank line is not a row
    assert p.where == [2, 13] and p.src == ["78.143.22.26", "2001:db8::1"] and p.family == [4, 6]
    assert p.time == [1704283200, 1704283200]  # ISO and Unix seconds are the same instant
    got = {r["line"]: r["reason"] for r in p.rejects}
    assert got == {3: "mixed_family", 4: "bad_address", 6: "pattern", 7: "bad_record", 8: "zone_id",
                   9: "ipv4_mapped", 10: "missing_address", 11: "bad_time", 12: "bad_time"}
    assert all(r["reason"] in REASONS and r["detail"] and r["file"] == str(f) for r in p.rejects)
    summary = p.reject_summary()
    assert summary["bad_time"]["rows"] == 2 and summary["bad_time"]["first"] == {"file": str(f), "row": 11}
    assert sum(e["rows"] for e in summary.values()) == len(p.rejects)


def test_each_distinct_address_is_checked_once(tmp_path):
    """A table of packets repeats its addresses: checking each once keeps a 200k-row file at ~1 s
    (6.6 s when the cache was lost to a decorator moved by a refactor)."""
    from pingctl.infer.pairs import clean_address

    f = tmp_path / "rep.csv"
    f.write_text("src,dst\n" + "1.2.3.4,5.6.7.8\n" * 50)
    clean_address.cache_clear()
    assert len(read_pairs(f).src) == 50
    assert clean_address.cache_info().misses == 2 and clean_address.cache_info().hits == 98


def test_a_pairs_row_and_a_single_query_refuse_the_same_addresses_alike():
    """--src/--dst and --pairs share one check, so they cannot drift apart: the --src message is
    the --pairs row's detail after the option's name."""
    from pingctl.infer.pairs import AddressError, clean_address

    for text, reason, ask in (("fe80::1%eth0", "zone_id", "drop it"), ("::ffff:1.2.3.4", "ipv4_mapped", "ask for 1.2.3.4"),
                              ("::ffff:1.2.3.0/120", "ipv4_mapped", "ask for 1.2.3.0/24"), (" ", "missing_address", "")):
        with pytest.raises(AddressError) as e:
            clean_address(text)
        assert e.value.reason == reason and ask in str(e.value), text
        r = runner.invoke(app, ["sample", "no-run", "--src", text, "--dst", "::1"])
        assert r.exit_code == 2 and f"--src {e.value}" in " ".join(r.output.split()), (text, r.output)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_parquet_pairs_take_timestamps_of_any_unit_numbers_and_text(tmp_path, unit):
    t0 = 1_704_283_200
    scale = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    f = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({
        "src_addr": ["1.2.3.4", "1.2.3.4", "bad", "1.2.3.4"],
        "dst_addr": ["5.6.7.8", "5.6.7.8", "5.6.7.8", "::1"],
        "event_time": pa.array([t0 * scale + scale - 1, None, t0 * scale, t0 * scale], pa.timestamp(unit)),
    }), f)
    p = read_pairs(f)
    assert p.unit == "row" and p.where == [0, 1] and p.time == [t0, None]  # floored to whole seconds
    assert {r["row"]: r["reason"] for r in p.rejects} == {2: "bad_address", 3: "mixed_family"}
    g = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"src": ["1.2.3.4"] * 3, "dst": ["5.6.7.8"] * 3,
                             "time": pa.array([t0, None, float("nan")], pa.float64())}), g)
    q = read_pairs(g)
    assert q.time == [t0, None] and [r["reason"] for r in q.rejects] == ["bad_time"]


def test_a_byte_order_mark_does_not_hide_the_header(tmp_path):
    f = tmp_path / "excel.csv"
    f.write_bytes("\ufeffsrc,dst\r\n1.2.3.4,5.6.7.8\r\n".encode())
    assert read_pairs(f).src == ["1.2.3.4"]


def test_a_year_past_9999_is_a_time_not_a_crash(tmp_path):
    f = tmp_path / "far.parquet"
    far = 400_000_000_000  # year ~14,645: beyond datetime, within a seconds timestamp
    pq.write_table(pa.table({"src": ["1.2.3.4"], "dst": ["5.6.7.8"], "time": pa.array([far], pa.timestamp("s"))}), f)
    assert read_pairs(f).time == [far]


@pytest.mark.parametrize("name,text,error,message", [
    ("p.txt", "src,dst\n", UsageError, "expected a .csv"),
    ("p.csv", "", PingctlError, "the file is empty"),
    ("p.csv", "src,dst\n", PingctlError, "the file has no rows"),
    ("p.csv", "source,dst\n1.2.3.4,5.6.7.8\n", PingctlError, "no src or src_addr column (columns: source, dst)"),
    ("p.csv", "src,src_addr,dst\n1.2.3.4,1.2.3.4,5.6.7.8\n", PingctlError, "src and src_addr both name"),
    ("p.csv", "src,dst,src\n1.2.3.4,5.6.7.8,9.9.9.9\n", PingctlError, "column src appears 2 times (columns 1, 3)"),
    ("p.csv", "src,dst, dst ,time\n1.2.3.4,5.6.7.8,9.9.9.9,\n", PingctlError,
     "column dst appears 2 times (columns 2, 3)"),
    ("p.csv", b"src,dst\n1.2.3.4,\xff\n", PingctlError, "not UTF-8"),
    ("p.parquet", "not parquet", PingctlError, "cannot read it as Parquet"),
])
def test_unusable_files_are_named_errors(tmp_path, name, text, error, message):
    f = tmp_path / name
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        read_pairs(f)
    assert str(f) in str(e.value)


def test_a_parquet_file_with_two_columns_of_one_name_is_named(tmp_path):
    """Parquet allows one name twice: the field it names is refused as in a CSV header (it
    was "cannot read it as Parquet" with pyarrow's scanner message), and a repeated name no
    field reads is ignored like any other column."""
    f = tmp_path / "p.parquet"
    cols = [pa.array(["1.2.3.4"]), pa.array(["5.6.7.8"]), pa.array(["9.9.9.9"])]
    pq.write_table(pa.Table.from_arrays(cols, names=["src", "dst", "src"]), f)
    with pytest.raises(PingctlError, match=r"column src appears 2 times \(columns 1, 3\); keep one") as e:
        read_pairs(f)
    assert str(f) in str(e.value)
    pq.write_table(pa.Table.from_arrays(cols + [pa.array(["y"])], names=["src", "dst", "note", "note"]), f)
    assert read_pairs(f).dst == ["5.6.7.8"]


FIELDS = st.sampled_from(["1.2.3.4", "5.6.7.8", "2001:db8::1", "::1", "::ffff:1.2.3.4", "8.8.*.*", "10.0.0.0/8",
                          "", " ", "x", "1.2.3", "fe80::1%eth0", "1704283200", "2024-01-01T00:00:00Z", "-5",
                          "nan", "1e300", '"', ",", "\n", "ä"])


@settings(max_examples=150)
@given(st.lists(st.lists(FIELDS, min_size=0, max_size=5), max_size=12))
def test_fuzzed_pairs_files_reconcile_or_fail_with_a_named_error(tmp_path_factory, records):
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["src", "dst", "time"])
    for r in records:
        w.writerow(r)
    f = tmp_path_factory.mktemp("fuzz") / "p.csv"
    f.write_text(buf.getvalue())
    try:
        p = read_pairs(f)
    except PingctlError as e:
        assert str(f) in str(e)
        return
    lines = p.where + [r["line"] for r in p.rejects]
    assert len(lines) == len(set(lines)) == p.rows_read
    for s, d, fam in zip(p.src, p.dst, p.family):
        assert ipaddress.ip_address(s).version == ipaddress.ip_address(d).version == fam
    assert all(r["reason"] in REASONS for r in p.rejects)


# ----------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def pairs_file(synth_rows, tmp_path_factory):
    """Three real pairs of the fixture's world (two of one probe) and one bad row."""
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr", "ip_version"])
    v4 = t.filter(pc.equal(t.column("ip_version"), 4))
    src = v4.column("src_addr")[0].as_py()
    dsts = sorted(set(v4.filter(pc.equal(v4.column("src_addr"), src)).column("dst_addr").to_pylist()))[:2]
    other = v4.filter(pc.not_equal(v4.column("src_addr"), src)).slice(0, 1).to_pylist()[0]
    f = tmp_path_factory.mktemp("pairs") / "pairs.csv"
    f.write_text("src,dst,time\n" + "".join(f"{src},{d},\n" for d in dsts)
                 + "300.1.1.1,1.2.3.4,\n" + f"{other['src_addr']},{other['dst_addr']},1704283200\n")
    return f, src, dsts


def _json(args):
    r = runner.invoke(app, ["sample", *map(str, args), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_pairs_give_the_single_query_answers_and_reconcile(tiny_run, pairs_file, tmp_path):
    f, src, dsts = pairs_file
    out = tmp_path / "preds.parquet"
    res = _json([tiny_run, "--pairs", f, "-o", out, "--exact"])
    assert (res["rows_read"], res["answered"], res["rows_rejected"]) == (4, 3, 1)
    assert res["rejected"]["bad_address"]["first"]["row"] == 4
    table = pq.read_table(out)
    assert table.num_rows == 3 and table.column("line").to_pylist() == [2, 3, 5]
    assert json.loads(table.schema.metadata[b"pingctl"])["exact"] is True
    rejects = [json.loads(x) for x in (tmp_path / "preds.rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(4, "bad_address")] == [
        (r["line"], r["reason"]) for r in res["rejects"]]
    assert res["rejects_file"] == str(tmp_path / "preds.rejects.jsonl")
    # inspect recognises the file: its run, the rows answered and set aside beside it
    seen = runner.invoke(app, ["inspect", str(out), "--json", "-n", "2"])
    assert seen.exit_code == 0, seen.output
    seen = json.loads(seen.stdout)
    assert seen["kind"] == "predictions" and seen["run"] == str(tiny_run) and seen["exact"] is True
    assert (seen["rows"], seen["rows_set_aside"], seen["distinct_pairs"], seen["sources"]) == (3, 1, 3, 2)
    assert seen["p50_ms"]["max"] == max(p["p50_ms"] for p in res["predictions"]) and len(seen["sample"]) == 2
    # --exact computes what a single --src/--dst query computes, every number
    dist = tmp_path / "one.parquet"
    one = _json([tiny_run, "--src", src, "--dst", dsts[1], "-o", dist])
    row = res["predictions"][1]
    for k in ("p_fail", "mean_ms", "p_over_ceiling", "trimmed_mean_ms", "p5_ms", "p25_ms", "p50_ms", "p75_ms",
              "p95_ms"):
        assert row[k] == pytest.approx(one[k], rel=1e-6), k
    # and the distribution file it wrote reads back, in inspect, as the figures it printed
    back = json.loads(runner.invoke(app, ["inspect", str(dist), "--json"]).stdout)
    assert back["kind"] == "distribution" and back["codes"] == 65536 and (back["src"], back["dst"]) == (src, dsts[1])
    for k in ("p_fail", "mean_ms", "p_over_ceiling", "trimmed_mean_ms", "p5_ms", "p25_ms", "p50_ms", "p75_ms",
              "p95_ms"):
        assert back[k] == pytest.approx(one[k], rel=1e-9), k
    # the default reads the distribution exactly at its quantiles: the same quantiles
    fast = _json([tiny_run, "--pairs", f])
    assert fast["exact"] is False and "out" not in fast
    for a, b in zip(fast["predictions"], res["predictions"]):
        assert a["p_fail"] == pytest.approx(b["p_fail"], rel=1e-6)
        # each within 1e-3 of probability of the exact quantile: a neighbouring code at most here
        for q in (5, 25, 50, 75, 95):
            assert a[f"p{q}_ms"] == pytest.approx(b[f"p{q}_ms"], rel=0.01), q
        assert a["trimmed_mean_ms"] == pytest.approx(b["trimmed_mean_ms"], rel=0.05)
        # the ceiling is read exactly too, so the mass above it is the exact one within 1e-3
        assert a["p_over_ceiling"] == pytest.approx(b["p_over_ceiling"], abs=1e-3)
        assert a["mean_ms"] is None or a["mean_ms"] <= 60_000.0
    for suffix in (".csv", ".json"):
        r = runner.invoke(app, ["sample", str(tiny_run), "--pairs", str(f), "-o", str(tmp_path / f"p{suffix}")])
        assert r.exit_code == 0 and "set aside 1 of 4 rows" in r.output, r.output
    assert (tmp_path / "p.csv").read_text().splitlines()[0].startswith('"line","src","dst"')
    assert len(json.loads((tmp_path / "p.json").read_text())["predictions"]) == 3


def test_each_pair_gets_its_own_source_context_before_its_time(tiny_run, synth_rows, pairs_file, tmp_path):
    f, src, dsts = pairs_file
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet")
    mine = t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 20)
    ctx = tmp_path / "ctx.parquet"
    pq.write_table(mine, ctx)
    times = mine.column("event_time").cast(pa.int64()).to_numpy() // 10**6
    cut = int(np.unique(times)[1])  # the packets of the earliest result lie strictly before it
    before = int((times < cut).sum())
    g = tmp_path / "timed.csv"
    g.write_text(f"src,dst,time\n{src},{dsts[0]},\n{src},{dsts[0]},{cut}\n{src},{dsts[0]},{int(times.min())}\n"
                 "10.9.9.9,10.8.8.8,\n")
    res = _json([tiny_run, "--pairs", g, "--context", ctx, "--context-per-pair", "0"])
    n = [p["context_measurements"] for p in res["predictions"]]
    # no time: the latest that fit the prompt; a time: only rows before it; another source: none
    assert n[0] > before > 0 and n[1] == before and n[2] == 0 and n[3] == 0, (n, before)
    assert res["context_rows"]["rows_read"] == 20 and res["context_per_pair"] == 0


def test_a_single_query_picks_its_context_as_a_pairs_row_does(tiny_run, synth_rows, pairs_file, tmp_path):
    """Given a file mixing sources and times, --src/--dst/--time reads only the source's rows
    before the time, so it answers exactly what the same --pairs row answers."""
    f, src, dsts = pairs_file
    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet")
    mine = t.filter(pc.equal(t.column("src_addr"), src)).slice(0, 20)
    others = t.filter(pc.not_equal(t.column("src_addr"), src)).slice(0, 20)
    mixed, own = tmp_path / "mixed.parquet", tmp_path / "own.parquet"
    pq.write_table(pa.concat_tables([others, mine]), mixed)
    times = mine.column("event_time").cast(pa.int64()).to_numpy() // 10**6
    cut = int(np.unique(times)[2])
    pq.write_table(mine.filter(pa.array(times < cut)), own)
    ask = [tiny_run, "--src", src, "--dst", dsts[0], "--time", cut, "--context-per-pair", "0", "--context"]
    a, b = _json([*ask, mixed]), _json([*ask, own])
    assert a["context_rows"]["rows_used"] == b["context_rows"]["rows_used"] == int((times < cut).sum()) > 0
    assert a["context_tokens"] == b["context_tokens"] > 0
    for k in ("p_fail", "p50_ms", "mean_ms"):
        assert a[k] == b[k], k
    g = tmp_path / "one.csv"
    g.write_text(f"src,dst,time\n{src},{dsts[0]},{cut}\n")
    row = _json([tiny_run, "--pairs", g, "--context", mixed, "--context-per-pair", "0", "--exact"])["predictions"][0]
    for k in ("p_fail", "p50_ms", "mean_ms"):
        assert row[k] == pytest.approx(a[k], rel=1e-6), k
    # another source's history alone is no context for this one: the same answer as none, with a note
    pq.write_table(others, tmp_path / "o[red]x.parquet")  # the note prints the path as given, not as markup
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dsts[0], "--context",
                            str(tmp_path / "o[red]x.parquet")])
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "o[red]x.parquet: 0 of its 20 valid rows are measurements of the probe with source " \
        f"{src}" in said, r.output
    pq.write_table(others, tmp_path / "others.parquet")
    plain = _json([tiny_run, "--src", src, "--dst", dsts[0]])
    alone = _json([tiny_run, "--src", src, "--dst", dsts[0], "--context", tmp_path / "others.parquet"])
    assert alone["context_tokens"] == 0 and alone["p_fail"] == plain["p_fail"]


def test_a_dual_stack_probe_is_asked_with_both_families_of_its_past(tiny_run, synth_rows, tmp_path):
    """Training rows are per probe (prb_id) and hold both families of a dual-stack probe, so a
    question from one of its addresses gets the probe's whole past, as `pingctl eval` gives it."""
    import duckdb

    from pingctl.infer.pairs import probe_of

    f = synth_rows / "synth" / "part-00000.parquet"
    prb, v4, v6 = duckdb.sql(
        f"SELECT prb_id, min(src_addr) FILTER (WHERE ip_version = 4), min(src_addr) FILTER (WHERE ip_version = 6) "
        f"FROM '{f}' GROUP BY prb_id HAVING count(DISTINCT ip_version) = 2 ORDER BY prb_id LIMIT 1").fetchall()[0]
    t = pq.read_table(f)
    mine = t.filter(pc.equal(t.column("prb_id"), prb)).slice(0, 30)
    others = t.filter(pc.not_equal(t.column("prb_id"), prb)).slice(0, 30)
    fams = mine.column("ip_version").to_pylist()
    assert 4 in fams and 6 in fams
    ctx = tmp_path / "ctx.parquet"
    pq.write_table(pa.concat_tables([others, mine]), ctx)
    dst = mine.filter(pc.equal(mine.column("ip_version"), 4)).column("dst_addr")[0].as_py()
    ask = [tiny_run, "--src", v4, "--dst", dst, "--context-per-pair", "0", "--context"]
    both = _json([*ask, ctx])
    assert both["context_rows"]["rows_used"] == 30  # its IPv6 rows too
    g = tmp_path / "one.csv"
    g.write_text(f"src,dst\n{v4},{dst}\n{v6},{dst}\n")  # (the second is a mixed-family row, set aside)
    res = _json([tiny_run, "--pairs", g, "--context", ctx, "--context-per-pair", "0", "--exact"])
    assert res["predictions"][0]["p_fail"] == pytest.approx(both["p_fail"], rel=1e-6)
    # without prb_id in the file the address is all there is: its IPv4 rows only
    pq.write_table(pa.concat_tables([others, mine]).drop_columns(["prb_id"]), tmp_path / "anon.parquet")
    anon = _json([*ask, tmp_path / "anon.parquet"])
    assert anon["context_rows"]["rows_used"] == fams.count(4) < 30
    # an address two probes share names neither: matched by address
    pool_src = np.array([v4, v4, v6, "9.9.9.9"], object)
    assert probe_of(pool_src, np.array([1, 2, 1, -1]), [v4, v6, "9.9.9.9", "8.8.8.8"]).tolist() == [-1, 1, -1, -1]


def test_repeated_pairs_are_asked_once(tiny_run, tmp_path):
    from pingctl.infer import pairs as P
    from pingctl.infer.model import LoadedModel

    f = tmp_path / "rep.csv"
    f.write_text("src,dst,time\n1.2.3.4,5.6.7.8,\n1.2.3.4,5.6.7.8,100\n1.2.3.4,5.6.7.8,\n9.9.9.9,5.6.7.8,\n"
                 "1.2.3.4,5.6.7.8,1970-01-01T00:01:40Z\n")
    pairs = read_pairs(f)
    model = LoadedModel.load(tiny_run)
    firsts = []
    real = model.log_probs
    model.log_probs = lambda seqs, at=None: (firsts.append(len(seqs)) if at is not None else None) or real(seqs, at)
    cols = P.answer(model, pairs, exact=True)
    assert firsts[0] == 3  # (a, b, none), (a, b, 100), (c, b, none): the first pass asks each once
    assert cols["line"] == [2, 3, 4, 5, 6] and cols["time"] == [None, 100, None, None, 100]
    for k in ("p_fail", "p50_ms", "mean_ms", "context_measurements"):
        v = cols[k]
        assert v[0] == v[2] and v[1] == v[4], (k, v)  # copies of the one answer
    assert cols["p_fail"][0] != cols["p_fail"][1]  # a time changes the prompt, so it is its own question


def test_a_timed_table_is_told_that_each_time_is_a_question(tiny_run, pairs_file, tmp_path, monkeypatch):
    from pingctl.cli import sample_pairs

    f, src, dsts = pairs_file
    g = tmp_path / "timed.csv"
    g.write_text("src,dst,time\n" + "".join(f"{src},{dsts[0]},{1704283200 + i}\n" for i in range(4))
                 + f"{src},{dsts[1]},\n")
    monkeypatch.setattr(sample_pairs, "TIMES_HINT", 4)
    r = runner.invoke(app, ["sample", str(tiny_run), "--pairs", str(g)])
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "5 distinct (src, dst, time) questions of 2 pairs" in said, r.output
    res = _json([tiny_run, "--pairs", g])
    assert (res["distinct"], res["distinct_pairs"]) == (5, 2)
    monkeypatch.setattr(sample_pairs, "TIMES_HINT", 6)  # below the threshold: no note
    r = runner.invoke(app, ["sample", str(tiny_run), "--pairs", str(g)])
    assert r.exit_code == 0 and "each time is its own question" not in " ".join(r.output.split())


def test_pairs_refusals(tiny_run, pairs_file, tmp_path):
    f, src, dsts = pairs_file
    bad = tmp_path / "bad.csv"
    bad.write_text("src,dst\n300.1.1.1,1.2.3.4\n1.2.3.4,::1\n")
    twice = tmp_path / "twice.csv"  # was answered with the first src column, exit 0
    twice.write_text(f"src,dst,src\n{src},{dsts[0]},9.9.9.9\n")
    for args, code, msg in (
        (["--pairs", f, "--src", src], 2, "--src: --pairs answers the pairs"),
        (["--pairs", f, "--time", "5", "--n", "3"], 2, "--time, --n: --pairs answers"),
        (["--pairs", f, "--since", "2021-01-01"], 2, "--since: --pairs answers"),
        (["--src", src, "--dst", dsts[0], "--exact"], 2, "--exact is for --pairs"),
        (["--pairs", f, "-k", "3", "--seed", "1"], 2, "-k, --seed: --pairs computes each pair's RTT distribution"),
        (["--pairs", f, "--measurements", "3", "--temperature", "0.5", "--top-p", "0.9"], 2,
         "--measurements, --temperature, --top-p: --pairs computes"),
        (["--pairs", tmp_path / "p.txt"], 2, "expected a .csv"),
        (["--pairs", f, "-o", tmp_path / "p.txt"], 2, "--pairs writes .parquet, .csv or .json"),
        (["--pairs", f, "--context-per-pair", "1"], 2, "give --context too"),
        (["--pairs", tmp_path / "missing.csv"], 1, "no such file"),
        (["--pairs", bad], 1, "no valid pair among 2 rows"),
        (["--pairs", twice], 1, f"--pairs {twice}: column src appears 2 times (columns 1, 3)"),
    ):
        r = runner.invoke(app, ["sample", str(tiny_run), *map(str, args)])
        assert r.exit_code == code and msg in r.output and "Traceback" not in r.output, (args, r.output)
    r = runner.invoke(app, ["sample", str(tiny_run), "--pairs", str(bad)])
    assert "bad_address: 1" in r.output and "mixed_family: 1" in r.output
    assert not (tmp_path / "p.rejects.jsonl").exists()


def test_a_run_without_timestamps_refuses_timed_pairs(tiny_run, pairs_file, tmp_path):
    f, src, dsts = pairs_file
    run = tmp_path / "untimed"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["loader"]["mode_weights"] = [0.0, 0.0, 1.0]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = runner.invoke(app, ["sample", str(run), "--pairs", str(f)])
    assert r.exit_code == 2 and "trained without timestamps" in r.output, r.output
    untimed = tmp_path / "untimed.csv"
    untimed.write_text(f"src,dst\n{src},{dsts[0]}\n")
    assert _json([run, "--pairs", untimed])["timestamps"] is False
