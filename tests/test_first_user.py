"""What a first user trips on: a mean that means something, shell completion, raw RIPE results
given where a canonical table belongs."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app

runner = CliRunner()
PINGCTL = Path(sys.executable).with_name("pingctl")
HEAVY = ("jax", "maxtext", "grain", "pyarrow", "duckdb", "numpy", "orjson")


# ---------------------------------------------------------------- the mean's ceiling


def test_mean_is_taken_below_the_ceiling_with_the_mass_above_beside_it():
    from pingctl.infer.queries import MEAN_CEILING_MS, RttDistribution
    from pingctl.tokenizer.rtt_codec import MAX_MS

    assert MEAN_CEILING_MS == 60_000.0
    # what an undertrained model does: a little mass at the codec's 50-day ceiling
    values = np.array([10.0, 20.0, 60_000.0, 60_000.5, MAX_MS])
    probs = np.array([0.5, 0.46, 0.02, 0.01, 0.01])
    d = RttDistribution(0.1, np.arange(5, dtype=np.uint16), values, probs)
    below = (0.5 * 10 + 0.46 * 20 + 0.02 * 60_000) / 0.98  # the ceiling itself is below
    s = d.summary()
    assert s["mean_ms"] == pytest.approx(below) == d.mean  # about 1,239 ms, not 44 million
    assert s["p_over_ceiling"] == pytest.approx(0.02) == d.p_over()
    assert d.truncated_mean(15.0) == 10.0 and d.p_over(15.0) == pytest.approx(0.5)
    # nothing at or below the ceiling: no mean, said as null rather than NaN in --json
    far = RttDistribution(0.0, np.arange(2, dtype=np.uint16), np.array([1e6, MAX_MS]), np.array([0.5, 0.5]))
    assert far.summary()["mean_ms"] is None and far.summary()["p_over_ceiling"] == 1.0
    json.dumps(far.summary(), allow_nan=False)


def test_sample_prints_the_mean_below_the_ceiling_and_the_mass_above(tiny_run, pair):
    src, dst = pair
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert 0.0 <= res["p_over_ceiling"] <= 1.0
    assert res["mean_ms"] is None or 0.0 <= res["mean_ms"] <= 60_000.0
    table = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst], terminal_width=160)
    assert table.exit_code == 0, table.output
    assert "mean ms, RTT <= 60 s" in table.output and "P(RTT > 60 s)" in table.output
    from pingctl.cli.common import fmt

    assert fmt(res["mean_ms"]) in table.output


# ---------------------------------------------------------------- shell completion


def test_shell_completion_script_names_pingctl():
    # Typer's explicit-shell form (shell detection off, as in a script or a container)
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    r = subprocess.run([str(PINGCTL), "--show-completion", "bash"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_PINGCTL_COMPLETE" in r.stdout and "complete " in r.stdout and "pingctl" in r.stdout
    r = runner.invoke(app, ["--help"], terminal_width=200)
    assert "--install-completion" in r.output and "--show-completion" in r.output


def test_completing_a_command_loads_nothing_heavy():
    # what the installed script runs on <TAB>: command names from the CLI modules alone
    code = ("import sys\nfrom pingctl.cli.app import app\ntry:\n    app(prog_name='pingctl')\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY=' + ','.join(m for m in %r if m in sys.modules))" % (HEAVY,))
    env = {**os.environ, "_PINGCTL_COMPLETE": "complete_bash", "COMP_WORDS": "pingctl bu", "COMP_CWORD": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert "build-rows" in lines and "HEAVY=" in lines and "ingest" not in lines


# ---------------------------------------------------------------- raw results where a table belongs


def _result(prb: int) -> bytes:
    return json.dumps({"fw": 5080, "af": 4, "dst_addr": "8.8.8.8", "src_addr": "10.0.0.1", "from": "81.2.3.4",
                       "result": [{"rtt": 10.5}], "msm_id": 1001, "prb_id": prb, "timestamp": 1_700_000_000,
                       "type": "ping"}).encode() + b"\n"


@pytest.fixture
def dumps(tmp_path) -> Path:
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "ping-2024-01-01T0000.bz2").write_bytes(bz2.compress(_result(1) + _result(2)))
    return d


@pytest.mark.parametrize("command", [["build-rows", "{in}", "-o", "{tmp}/rows"],
                                     ["shard", "{in}", "-o", "{tmp}/splits"],
                                     ["inspect", "{in}"]], ids=lambda c: c[0])
def test_raw_results_given_as_a_table_say_to_ingest_first(tmp_path, dumps, command):
    for given in (dumps, dumps / "ping-2024-01-01T0000.bz2"):
        args = [a.format(**{"in": given, "tmp": tmp_path}) for a in command]
        r = runner.invoke(app, args, terminal_width=300)
        text = " ".join(r.output.split())
        assert r.exit_code == 1, r.output
        assert "no input files found" not in text and "Traceback" not in text
        assert f"pingctl ingest {given} -o TABLE_DIR" in text and "ping-2024-01-01T0000.bz2" in text, text


def test_raw_results_hint_finds_dumps_by_content_and_only_them(tmp_path):
    from pingctl.artifacts.table import resolve_inputs
    from pingctl.errors import PingctlError

    plain = tmp_path / "plain"  # JSON lines and gzip dumps saved without a suffix
    (plain / "sub").mkdir(parents=True)
    (plain / "ping-a").write_bytes(_result(1))
    (plain / "sub" / "ping-b").write_bytes(gzip.compress(_result(2)))
    with pytest.raises(PingctlError, match=r"no Parquet files in .*plain; .*ping-a.*pingctl ingest"):
        resolve_inputs([plain])
    for f in (tmp_path / "x.jsonl", tmp_path / "x-noext"):
        f.write_bytes(_result(3))
        with pytest.raises(PingctlError, match="looks like raw RIPE Atlas results.*pingctl ingest"):
            resolve_inputs([f])
    # JSON that is not RIPE results (a run's metrics, a pingctl output's manifest) gets no hint
    other = tmp_path / "run"
    (other / "old-ingest").mkdir(parents=True)
    (other / "metrics.jsonl").write_text('{"step": 1, "loss": 3.2}\n')
    (other / "old-ingest" / "manifest.json").write_text(json.dumps({"pingctl_version": "0", "kind": "x"}))
    (other / "old-ingest" / "rejects.jsonl").write_bytes(_result(4))
    with pytest.raises(PingctlError, match="no input files found"):
        resolve_inputs([other])
    # ingest's own discovery (other suffixes) is not a table's: no hint there
    assert resolve_inputs([plain / "ping-a"], suffixes=(".jsonl",)) == [plain / "ping-a"]
