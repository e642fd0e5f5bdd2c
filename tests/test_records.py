import ipaddress
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError
from pingctl.records import build as build_mod
from pingctl.records.build import build_rows
from pingctl.inspect.records import iter_records
from pingctl.records.layout import ProbeRecord, RecordError, decode, encode
from tests.conftest import make_table

runner = CliRunner()


@pytest.fixture
def split_dir(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    t = make_table(3000, probes=12, targets=7, v6_every=5)
    pq.write_table(t.slice(0, 1700), d / "a.parquet")
    pq.write_table(t.slice(1700), d / "b.parquet")
    return d, t


def _all_records(out):
    errors = []
    recs = [decode(raw) for _, _, raw in iter_records(sorted(out.glob("*.arrayrecord")), errors)]
    assert errors == []
    return recs


def _ip(table, v6, i):
    b = bytes(table[i])
    return str(ipaddress.ip_address(b if v6[i] else b[:4]))


def test_records_reconstruct_the_input_exactly(split_dir, tmp_path):
    d, t = split_dir
    res = build_rows([d], tmp_path / "rows")
    recs = _all_records(tmp_path / "rows")
    assert res["measurements"] == 3000 == sum(r.n for r in recs)
    assert res["probes"] == 12 == len({r.probe for r in recs})
    got = []
    for r in recs:
        assert np.all(np.diff(r.time_s) >= 0), "time order within a record"
        for j in range(r.n):
            got.append((r.prb_id, int(r.time_s[j]), _ip(r.src_addr, r.src_v6, r.src_idx[j]),
                        _ip(r.dst_addr, r.dst_v6, r.dst_idx[j]), float(r.rtt_ms[j]), int(r.msm_id[j])))
    want = [
        (p, int(e.timestamp()), str(ipaddress.ip_address(s)), str(ipaddress.ip_address(dd)), rt, m)
        for p, e, s, dd, rt, m in zip(*(t.column(c).to_pylist() for c in
                                         ("prb_id", "event_time", "src_addr", "dst_addr", "rtt", "msm_id")))
    ]
    assert sorted(got) == sorted(want)
    manifest = json.loads((tmp_path / "rows" / "manifest.json").read_text())
    assert manifest["layout_version"] == 1 and manifest["records"] == len(recs)
    assert [len(s["sha256"]) for s in manifest["sources"]] == [64, 64]


def test_long_histories_split_into_consecutive_records(split_dir, tmp_path):
    d, _ = split_dir
    # 250 measurements per probe; cap records at ~100 measurements
    res = build_rows([d], tmp_path / "rows", max_row_mb=100 * 40 / 1e6)
    recs = _all_records(tmp_path / "rows")
    assert res["max_measurements_per_record"] == 100
    by_probe = {}
    for r in recs:
        assert r.n <= 100
        by_probe.setdefault(r.probe, []).append(r)
    for parts in by_probe.values():
        assert [p.part for p in parts] == list(range(len(parts))) == [0, 1, 2]
        for a, b in zip(parts, parts[1:]):
            assert a.time_s[-1] <= b.time_s[0]


def test_interrupted_run_leaves_nothing_and_rerun_completes(split_dir, tmp_path, monkeypatch):
    d, _ = split_dir
    calls = {"n": 0}
    real = build_mod.encode

    def flaky(rec):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(rec)

    monkeypatch.setattr(build_mod, "encode", flaky)
    with pytest.raises(KeyboardInterrupt):
        build_rows([d], tmp_path / "rows")
    assert list(tmp_path.glob("*rows*")) == []
    monkeypatch.setattr(build_mod, "encode", real)
    assert build_rows([d], tmp_path / "rows")["measurements"] == 3000


def test_layout_rejects_corruption_cleanly():
    n = 4
    rec = ProbeRecord(
        probe="prb:1", prb_id=1, time_s=np.arange(n), rtt_ms=np.ones(n), msm_id=np.ones(n, np.int64),
        src_idx=np.zeros(n, np.uint32), dst_idx=np.zeros(n, np.uint32), size=np.ones(n), errors=np.zeros(n),
        src_addr=np.zeros((1, 16), np.uint8), src_v6=np.zeros(1, bool), dst_addr=np.zeros((1, 16), np.uint8),
        dst_v6=np.zeros(1, bool),
    )
    blob = encode(rec)
    assert decode(blob).n == n
    rng = np.random.default_rng(0)
    for cut in range(0, len(blob)):
        with pytest.raises(RecordError):
            decode(blob[:cut])
    for _ in range(300):  # random byte flips: either decodes or raises RecordError, nothing else
        b = bytearray(blob)
        b[rng.integers(len(b))] = rng.integers(256)
        try:
            decode(bytes(b))
        except RecordError:
            pass


def test_cli_build_then_inspect(split_dir, tmp_path):
    d, _ = split_dir
    out = tmp_path / "rows"
    r = runner.invoke(app, ["build-rows", str(d), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["inspect", str(out), "--json", "--sample", "2"])
    assert r.exit_code == 0, r.output
    desc = json.loads(r.stdout)
    assert desc["kind"] == "rows" and desc["measurements"] == 3000 and desc["probes"] == 12
    assert desc["v6_measurements"] == 600 and len(desc["sample"]) == 2
    # a truncated file: clear error naming it, non-zero exit, no traceback
    f = next(out.glob("*.arrayrecord"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 1 and f.name in r.output and "Traceback" not in r.output


def test_empty_input_is_a_clear_error(tmp_path):
    with pytest.raises(PingctlError, match="input not found"):
        build_rows([tmp_path / "nothing"], tmp_path / "rows")


def test_inspect_rtt_percentiles_weigh_every_measurement_alike(tmp_path):
    """One long-history probe among many short ones: the rows' RTT percentiles are those of
    all measurements (at the RTT codec's resolution), not a per-record average."""
    import pyarrow as pa

    rng = np.random.default_rng(7)
    short = make_table(3000, probes=10, targets=3)
    short = short.set_column(short.schema.get_field_index("rtt"), "rtt", pa.array(rng.uniform(0.5, 1.5, 3000)))
    long = make_table(20_000, probes=1, targets=3, seed=1)
    long = long.set_column(long.schema.get_field_index("src_addr"), "src_addr", pa.array(["193.0.99.1"] * 20_000))
    long = long.set_column(long.schema.get_field_index("prb_id"), "prb_id", pa.array(np.full(20_000, 20_000)))
    d = tmp_path / "train"
    d.mkdir()
    pq.write_table(short, d / "short.parquet")
    pq.write_table(long, d / "long.parquet")
    build_rows([d], tmp_path / "rows")
    r = runner.invoke(app, ["inspect", str(tmp_path / "rows"), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["rtt_ms"]
    rtt = np.concatenate([short["rtt"].to_numpy(), long["rtt"].to_numpy()])
    rtt = rtt[rtt >= 0]
    for q in (5, 50, 95, 99):
        assert got[f"p{q}"] == pytest.approx(np.percentile(rtt, q), rel=1e-3), q


def test_manifest_record_sizes_are_json_integers(split_dir, tmp_path):
    d, _ = split_dir
    build_rows([d], tmp_path / "rows")
    sizes = json.loads((tmp_path / "rows" / "manifest.json").read_text())["record_measurements"]
    assert sizes and all(type(n) is int for per_file in sizes for n in per_file)


def test_inspect_reads_past_a_damaged_record_and_fails(split_dir, tmp_path):
    d, _ = split_dir
    out = tmp_path / "rows"
    build_rows([d], out)
    f = next(out.glob("*.arrayrecord"))
    want = sum(len(s) for s in json.loads((out / "manifest.json").read_text())["record_measurements"])
    good = f.read_bytes()
    for frac in np.arange(0.02, 0.5, 0.02):  # a spot inside one record's chunk (the file is padded)
        b = bytearray(good)
        mid = int(len(b) * frac)
        b[mid:mid + 64] = bytes(x ^ 0xFF for x in b[mid:mid + 64])
        f.write_bytes(bytes(b))
        errors = []
        list(iter_records([f], errors))
        if errors and errors[0]["record"] not in (None, want - 1):
            break
    else:
        pytest.skip("no offset damages a single inner record in this ArrayRecord layout")
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 1
    desc = json.loads(r.stdout)
    assert desc["exit_code"] == 1  # the failure is in the JSON too, not only in the exit status
    bad = [e["record"] for e in desc["errors"] if e["record"] is not None]
    assert bad and desc["records"] == want - len(bad)
    assert max(bad) < want - 1 and desc["records"] > min(bad)  # records after the damage were read


def test_outputs_never_replace_their_own_input_nor_read_a_whole_shard_output(tmp_path):
    """build-rows once deleted its input when -o was the input directory or a parent of it, and
    read a shard output's train, val and test as one split."""
    from pingctl.artifacts.table import load_split
    from pingctl.schema.parquet import write_canonical

    table = tmp_path / "table"
    table.mkdir()
    write_canonical([make_table(3000)], table / "part-0.parquet")
    sp = tmp_path / "sp"
    assert runner.invoke(app, ["shard", str(table), "-o", str(sp), "--strategy", "random"]).exit_code == 0
    before = sorted(p.name for p in sp.rglob("*.parquet"))
    for args in (["build-rows", str(table), "-o", str(table)], ["build-rows", str(sp / "train"), "-o", str(sp)],
                 ["build-rows", str(sp / "train"), "-o", str(tmp_path)], ["build-rows", str(sp / "train"), "-o", str(tmp_path),
                                                                           "--force"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "contains the input files" in r.output, (args, r.output)
    for args in (["build-rows", str(sp), "-o", str(tmp_path / "rows")], ["shard", str(sp), "-o", str(tmp_path / "sp2")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "give one split, e.g." in r.output and "sp/train" in r.output, (args, r.output)
        assert not (tmp_path / "rows").exists() and not (tmp_path / "sp2").exists()
    with pytest.raises(PingctlError, match="give one split, e.g. .*sp/test"):
        load_split(sp)  # eval --test: the split to suggest is test
    wrap = tmp_path / "wrap"  # a shard output inside the directory given is read whole too
    wrap.mkdir()
    sp.rename(wrap / "sp")
    for args in (["build-rows", str(wrap), "-o", str(tmp_path / "rows")], ["shard", str(wrap), "-o", str(tmp_path / "sp2")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "(inside" in r.output and "wrap/sp/train" in " ".join(r.output.split()), r.output
    (wrap / "sp").rename(sp)
    assert (table / "part-0.parquet").exists() and sorted(p.name for p in sp.rglob("*.parquet")) == before
    assert runner.invoke(app, ["build-rows", str(sp / "train"), "-o", str(tmp_path / "rows")]).exit_code == 0


def test_when_every_row_is_rejected_the_message_gives_each_reason_and_its_first_row(tmp_path):
    """There is no output to hold rejects.jsonl then; the message said only how many were read."""
    import pyarrow as pa

    t = make_table(50)
    i = t.schema.get_field_index("src_addr")
    t = t.set_column(i, "src_addr", pa.array(["nope"] * 40 + t.column("src_addr").to_pylist()[40:]))
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array([-5.0] * 50))
    pq.write_table(t, tmp_path / "a.parquet")
    for cmd in ("shard", "build-rows"):
        r = runner.invoke(app, [cmd, str(tmp_path / "a.parquet"), "-o", str(tmp_path / cmd)])
        assert r.exit_code == 1 and "all 50 rejected" in r.output, r.output
        text = " ".join(r.output.split())
        assert "bad_src_addr: 40 row(s) (src_addr is not an IP address); first: " in text and "a.parquet row 0" in text
        assert "bad_rtt: 10 row(s)" in text and "a.parquet row 40" in text
        assert not (tmp_path / cmd).exists()
    pq.write_table(t.slice(0, 0), tmp_path / "empty.parquet")
    for cmd in ("shard", "build-rows"):
        r = runner.invoke(app, [cmd, str(tmp_path / "empty.parquet"), "-o", str(tmp_path / cmd), "--json"])
        assert r.exit_code == 1 and json.loads(r.stdout)["error"]["message"] == "no rows in 1 input file(s)"


def test_inspect_of_rows_checks_the_manifest_as_the_loader_does(split_dir, tmp_path):
    """A cut, list-shaped or lying manifest.json was reported as clean (or an internal error)
    while training refused those rows."""
    import shutil

    out = tmp_path / "rows"
    build_rows([split_dir[0]], out)
    good = (out / "manifest.json").read_text()
    assert runner.invoke(app, ["inspect", str(out)]).exit_code == 0
    manifest = json.loads(good)
    for text, needle in ((good[:200], "no readable manifest.json"), ("[1, 2]", "malformed"),
                         (json.dumps({**manifest, "layout_version": 99}), "layout version 99"),
                         (json.dumps({**manifest, "files": manifest["files"] + ["rows-09999.arrayrecord"]}),
                          "lists rows-09999.arrayrecord, which is missing")):
        bad = tmp_path / "bad"
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(out, bad)
        (bad / "manifest.json").write_text(text)
        r = runner.invoke(app, ["inspect", str(bad), "--json"])
        desc = json.loads(r.stdout)
        assert r.exit_code == 1 and desc["exit_code"] == 1 and any(needle in e["error"] for e in desc["errors"]), r.output
