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
    r = runner.invoke(app, ["tokenize", str(tmp_path / "ts.parquet"), str(tmp_path / "int.parquet"), "--stats"])
    assert r.exit_code == 1 and "do not combine" in r.output and "internal error" not in r.output
    r = runner.invoke(app, ["tokenize", str(tmp_path / "bad.parquet")])
    assert r.exit_code == 1 and "bad.parquet" in r.output and "%eth0" in r.output
    for rtt in ("inf", "1e300"):  # saturated silently to the largest code before
        r = runner.invoke(app, ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", rtt])
        assert r.exit_code == 2 and "beyond the RTT code" in r.output
