"""`pingctl tokenize`: fields, Parquet rows, --decode, --stats, errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from tests.conftest import make_table

runner = CliRunner()
FIELDS = ["--src", "193.0.14.129", "--dst", "8.8.8.8", "--rtt", "12.3", "--time", "2024-01-01T00:00:00Z"]


def run(*args, input=None):
    return runner.invoke(app, ["tokenize", *args], input=input)


@pytest.fixture
def table_file(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    t = make_table(400, probes=4, targets=3, v6_every=5)
    pq.write_table(t.slice(0, 200), d / "a.parquet")
    pq.write_table(t.slice(200), d / "b.parquet")
    return d


def test_help_lists_summary_and_example():
    res = runner.invoke(app, ["--help"])
    assert "tokenize" in res.output and "Show how measurements become tokens" in res.output
    res = run("--help")
    assert res.exit_code == 0 and "Example:" in res.output


def test_fields_text_and_json():
    res = run(*FIELDS)
    assert res.exit_code == 0, res.output
    assert "SrcIPv4" in res.output and "193.0.14.129" in res.output and "TimestampAbs" in res.output
    assert "ids: 0 1 204 11 25 140 3 19 19 19 19 8 41 13 5 11 11 11 11 112 157 11 139" in res.output
    res = run(*FIELDS, "--json")
    d = json.loads(res.stdout)
    (meas,) = d["measurements"]
    assert d["scheme"] == "compact" and d["vocab_size"] == 267 and meas["n_tokens"] == 23
    assert [b["field"] for b in meas["blocks"]] == ["start", "src", "dst", "result", "time"]
    assert meas["blocks"][1]["ids"] == [1, 204, 11, 25, 140]


def test_fields_full_scheme_failed_and_seed():
    res = run("--src", "2001:db8::1", "--dst", "2001:4860::8888", "--failed", "--scheme", "full", "--seed", "3",
              "--size", "64", "--msm-id", "5001", "--json")
    assert res.exit_code == 0, res.output
    (meas,) = json.loads(res.stdout)["measurements"]
    assert meas["n_tokens"] == 69 and meas["rtt_ms"] == -1.0
    fields = sorted(b["field"] for b in meas["blocks"][1:])
    assert fields == sorted(["src", "dst", "rtt", "size", "errors", "time", "msm_id"])
    # the config key works too, and --scheme wins over it
    res = run(*FIELDS, "--set", "tokenizer.scheme=full", "--json")
    assert json.loads(res.stdout)["scheme"] == "full"
    res = run(*FIELDS, "--set", "tokenizer.scheme=full", "--scheme", "compact", "--json")
    assert json.loads(res.stdout)["scheme"] == "compact"


def test_parquet_rows_file_and_directory(table_file):
    res = run(str(table_file / "a.parquet"), "--n", "3")
    assert res.exit_code == 0, res.output
    assert res.output.count("ids:") == 3
    res = run(str(table_file), "--n", "250", "--json")
    d = json.loads(res.stdout)
    assert len(d["measurements"]) == 250  # spans both files
    assert {m["timestamp"] for m in d["measurements"]} >= {"abs", "delta1"}


def test_decode_valid_and_malformed():
    enc = json.loads(run(*FIELDS, "--json").stdout)["measurements"][0]["ids"]
    res = run("--decode", " ".join(map(str, enc)), "--json")
    assert res.exit_code == 0
    d = json.loads(res.stdout)
    assert d["valid"] and d["measurements"][0]["src"] == "193.0.14.129"
    assert d["measurements"][0]["time"] == "2024-01-01T00:00:00Z"
    res = run("--decode", "[" + ", ".join(map(str, enc[:-3] + [0, 6, 71])) + "]")
    assert res.exit_code == 1
    assert "truncated" in res.output and "malformed" in res.output
    res = run("--decode", "-", "--json", input=" ".join(map(str, enc)))
    assert json.loads(res.stdout)["valid"]


def test_decode_from_file(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("0 1 12 12 12 12\n3 19 19 19 19 10\n")
    res = run("--decode", f"@{f}", "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["measurements"][0]["rtt_ms"] == -1.0


def test_bad_ids_typed_in_are_a_usage_error_and_in_a_file_a_data_error(tmp_path):
    assert run("--decode", "0 1 x").exit_code == 2
    assert run("--decode", "0 1 999").exit_code == 2
    f = tmp_path / "ids.txt"
    f.write_text("0 1 x\n")
    res = run("--decode", f"@{f}")
    assert res.exit_code == 1 and "not an integer token id" in res.output
    assert run("--decode", "-", input="0 1 999").exit_code == 1


def test_stats(table_file):
    res = run(str(table_file), "--stats", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["rows"] == 400 and d["sources"] == 8
    fams = {(r["scheme"], r["family"]): r for r in d["per_measurement"]}
    assert fams[("full", "IPv4")]["mean"] == 45 and fams[("full", "IPv6")]["mean"] == 69
    assert sum(d["compact_timestamps"].values()) == pytest.approx(1.0)
    assert d["vocab_usage"]["compact"]["size"] == 267
    res = run(str(table_file), "--stats")
    assert res.exit_code == 0 and "tokens per measurement" in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--src", "1.2.3.400", "--dst", "8.8.8.8", "--rtt", "1"], "--src '1.2.3.400' is not an IPv4 or IPv6"),
        (["--src", "1.2.3.4", "--dst", "2001:db8::1", "--rtt", "1"], "different address families"),
        (["--src", "1.2.3.4", "--dst", "8.8.8.8"], "give --rtt"),
        (["--src", "1.2.3.4", "--dst", "8.8.8.8", "--rtt", "1", "--failed"], "not both"),
        (["--src", "1.2.3.4", "--dst", "8.8.8.8", "--rtt", "1", "--time", "yesterday"], "ISO 8601"),
        (["--decode", "0 1 x"], "not an integer token id"),
        (["--decode", "0 1 267"], "outside the compact vocabulary (0..266)"),
        (["--decode", "0 -1"], "outside the compact vocabulary"),
        (["--decode", " "], "no token ids"),
        (["--decode", "0", "--src", "1.2.3.4"], "give exactly one of"),
        ([], "give exactly one of"),
        (["--src", "1.2.3.4", "--dst", "8.8.8.8", "--rtt", "1", "--scheme", "bpe"], "tokenizer.scheme"),
        (["no/such/file.parquet"], "input not found"),
    ],
)
def test_bad_input_is_one_clear_error(args, message):
    res = run(*args)
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_file_problems_name_the_files_and_rtt_beyond_the_code_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import make_table

    t = make_table(20, probes=2, targets=2)
    pq.write_table(t, tmp_path / "ts.parquet")
    secs = [int(x.timestamp()) for x in t.column("event_time").to_pylist()]
    pq.write_table(t.set_column(1, "event_time", pa.array(secs, pa.int64())), tmp_path / "int.parquet")
    bad = t.set_column(2, "src_addr", pa.array(["2001:db8::1%eth0"] + t.column("src_addr").to_pylist()[1:]))
    pq.write_table(bad, tmp_path / "bad.parquet")
    # timestamp and integer-seconds files are read as one table, as build-rows reads them
    r = runner.invoke(app, ["tokenize", str(tmp_path / "ts.parquet"), str(tmp_path / "int.parquet"), "--stats",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows_read"] == 40 and json.loads(r.stdout)["rows"] == 40
    r = runner.invoke(app, ["tokenize", str(tmp_path / "bad.parquet")])
    assert r.exit_code == 0 and "bad.parquet row 0" in r.output and "bad_src_addr" in r.output
    for rtt in ("inf", "1e300"):  # saturated silently to the largest code before
        r = runner.invoke(app, ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", rtt])
        assert r.exit_code == 2 and "beyond the RTT code" in r.output


def test_rows_build_rows_would_reject_are_skipped_and_named(tmp_path):
    """Shown as tokens, a row build-rows rejects would teach an encoding training never sees:
    a 1e300 ms RTT (saturated), a negative size (encoded as 0), an IPv4 pair labelled 6."""
    import pyarrow as pa

    t = make_table(6, probes=1, targets=2)
    rtt = t.column("rtt").to_pylist()
    rtt[1] = 1e300
    size = t.column("size").to_pylist()
    size[3] = -3
    ipv = t.column("ip_version").to_pylist()
    ipv[4] = 6
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt, pa.float64()))
    t = t.set_column(t.schema.get_field_index("size"), "size", pa.array(size, t.schema.field("size").type))
    t = t.set_column(t.schema.get_field_index("ip_version"), "ip_version",
                     pa.array(ipv, t.schema.field("ip_version").type))
    f = tmp_path / "mixed.parquet"
    pq.write_table(t, f)
    r = run(str(f), "-n", "6", "--scheme", "full", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rows_read"] == 6 and out["rows_rejected"] == 3 and len(out["measurements"]) == 3
    assert {k: (v["rows"], v["first"]["row"]) for k, v in out["rejected"].items()} == {
        "bad_rtt": (1, 1), "bad_size": (1, 3), "af_mismatch": (1, 4)}
    assert all(m["rtt_ms"] < 1e6 for m in out["measurements"])
    assert "mixed.parquet row 1" in r.stderr and "bad_rtt" in r.stderr
    r = run(str(f), "--stats", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["rows"] == 3, r.output
    # only invalid rows among those read: an error naming each reason, not an empty table
    r = run(str(f), "-n", "2")
    assert r.exit_code == 0  # row 0 is valid
    pq.write_table(t.slice(1, 1), tmp_path / "one.parquet")
    r = run(str(tmp_path / "one.parquet"))
    assert r.exit_code == 1 and "no valid rows" in r.output and "bad_rtt" in r.output and "row 0" in r.output
