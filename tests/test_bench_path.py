"""`pingctl bench path`: the whole data path at a size, through the real CLI in child processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pingctl.benchpath import STAGES, _table, growth, world
from pingctl.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pingctl", "bench", "path", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def _stamps(work: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((work / "20k" / "stages").glob("*.json"))}


def test_every_stage_is_measured_its_rows_reconcile_and_a_kept_run_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "path.json"
    r = _bench("--size", "20k", "--keep", str(work), "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert json.loads(out.read_text())["table"] == got["table"]
    assert [row["stage"] for row in got["table"]] == list(STAGES)
    by = {s["stage"]: s for s in got["stages"]}
    # each stage read the whole of what the one before it wrote
    assert by["synth"]["rows_in"] == by["shard"]["rows_in"] >= 20_000
    assert by["build-rows"]["rows_in"] == by["hints"]["rows_in"] == by["shard"]["train_rows"] > 0
    assert by["synth"]["probes"] == world(20_000)["probes"] and by["synth"]["v6_rows"] > 0
    assert by["synth"]["failed_rows"] > 0
    for row in got["table"]:
        assert row["wall_s"] > 0 and row["peak_rss_mb"] > 0 and row["rows_per_s"] > 0
        assert row["growth"] is None and row["flag"] == ""  # one size: nothing to grow from
    assert (work / "20k" / "hints.npz").is_file() and (work / "20k" / "rows" / "by-destination").is_dir()

    # a second run finds every stage done: nothing is run again, the figures are the kept ones
    before = _stamps(work)
    again = _bench("--size", "20k", "--keep", str(work), "--json")
    assert again.returncode == 0, again.stderr
    kept = json.loads(again.stdout)
    assert [s["resumed"] for s in kept["stages"]] == [True] * len(STAGES)
    assert [row["wall_s"] for row in kept["table"]] == [row["wall_s"] for row in got["table"]]
    assert _stamps(work) == before

    # a stage that did not finish (its record gone) is run again, and only it
    (work / "20k" / "stages" / "hints.json").unlink()
    third = _bench("--size", "20k", "--keep", str(work), "--json")
    assert third.returncode == 0, third.stderr
    assert [s["resumed"] for s in json.loads(third.stdout)["stages"]] == [True] * 3 + [False]
    after = _stamps(work)
    assert {k: v for k, v in after.items() if k != "hints.json"} == {k: v for k, v in before.items() if k != "hints.json"}
    assert "hints.json" in after


@pytest.mark.parametrize("size, says", [
    ("5k", "between 10,000"),
    ("200M", "between 10,000"),
    ("1M,20k", "smallest first"),
    ("1M,1M", "smallest first"),
    ("lots", "is not a row count"),
    ("1.5k5", "is not a row count"),
    ("", "is not a row count"),
])
def test_a_bad_size_is_a_usage_error_before_any_work(tmp_path, size, says):
    r = _bench("--size", size, "--keep", str(tmp_path / "w"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in " ".join(r.stderr.split())
    assert not (tmp_path / "w").exists()


def test_keep_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = _bench("--size", "20k", "--keep", str(f))
    assert r.returncode == 2 and "not a directory" in r.stderr


def _record(size: int, stage: str, seconds: float, rows: int) -> dict:
    return {"size": size, "stage": stage, "seconds": seconds, "rows_in": rows, "peak_rss_mb": 100.0,
            "resumed": False}


def test_growth_is_the_exponent_of_time_in_rows_and_above_1_15_is_flagged():
    assert growth(1.0, 10.0, 1_000_000, 10_000_000) == pytest.approx(1.0)
    assert growth(2.0, 200.0, 1_000, 10_000) == pytest.approx(2.0)
    assert growth(0.0, 1.0, 1, 10) is None and growth(1.0, 2.0, 5, 5) is None
    rows = _table([_record(10**6, "shard", 2.0, 10**6), _record(10**6, "hints", 1.0, 6 * 10**5),
                   _record(10**7, "shard", 20.0, 10**7), _record(10**7, "hints", 14.2, 6 * 10**6)])
    assert [(r["case"], r["stage"], r["growth"], r["flag"]) for r in rows] == [
        ("1M", "shard", None, ""), ("1M", "hints", None, ""),
        ("10M", "shard", 1.0, ""), ("10M", "hints", 1.15, "worse than linear")]
    assert rows[-1]["rows_per_s"] == int(6 * 10**6 / 14.2)


def test_the_world_grows_probes_with_rows_up_to_ripe_atlas_s_size():
    assert [world(n)["probes"] for n in (20_000, 1_000_000, 10_000_000, 100_000_000)] == [10, 100, 1_000, 10_000]
    assert world(1_000_000)["targets_per_probe"] >= 10  # tens of built-in targets a probe


def test_parse_sizes_reads_suffixes():
    from pingctl.benchpath import label, parse_sizes

    assert parse_sizes("20k,1M,10M") == [20_000, 1_000_000, 10_000_000]
    assert parse_sizes("1.5M") == [1_500_000] and label(1_500_000) == "1500k"
    with pytest.raises(UsageError):
        parse_sizes("0")
    assert os.sep not in label(12_345)
