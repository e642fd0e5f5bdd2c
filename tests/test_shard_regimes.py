"""`pingctl shard --strategy regimes` (and `--strategy target`): each regime's rule, checked
here from the written splits with code of its own (not the SQL of `shard._verify_regimes`),
on a synthetic world and on the shared real RIPE Atlas samples; determinism; counts that
reconcile (every valid row in exactly one output, or dropped with its reason); the layout
`regime_test_dirs` names and the commands that read the splits."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.artifacts.table import (
    REGIMES, is_splits_dir, regime_test_dirs, regime_val_dirs, resolve_inputs, split_dirs,
)
from pingctl.cli.app import app
from pingctl.config import RegimesConfig, ShardConfig, SynthConfig
from pingctl.errors import PingctlError
from pingctl.shard import DROP_REASONS, shard
from pingctl.synth.generate import generate
from tests.conftest import make_table

runner = CliRunner()
SPLITS = ("train", "val", "test_time", "test_pair", "test_probe", "test_target", "val_pair", "val_probe", "val_target")
TESTS = ("test_time", "test_pair", "test_probe", "test_target")
BIG = RegimesConfig(time=0.1, pair=0.1, probe=0.1, target=0.1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("regimes") / "synth"
    generate(SynthConfig(rows=60_000, probes=60, targets=20, targets_per_probe=6, step=600, seed=5), d)
    return d


def _rows(path) -> pa.Table:
    files = resolve_inputs([path])
    return pa.concat_tables(pq.read_table(f) for f in files) if files else None


def _probe_key(r: dict) -> str:
    return f"prb:{r['prb_id']}" if r["prb_id"] is not None else f"src:{r['src_addr']}"


def check_regimes(inputs, out, res) -> dict:
    """Every rule of docs/data.md, on the written splits; returns the row count of each split."""
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    inp_arrow = pa.concat_tables(pq.read_table(f) for f in resolve_inputs(inputs))  # noqa: F841 - read by DuckDB
    cols = ", ".join(inp_arrow.column_names)  # a table without prb_id is written with a null one
    con.execute("CREATE TABLE inp AS SELECT * FROM inp_arrow")
    for s in SPLITS:
        con.execute(f"CREATE TABLE {s} AS SELECT * FROM read_parquet('{out / s}/*.parquet')")

    def n(sql: str) -> int:
        return con.execute(f"SELECT count(*) FROM ({sql})").fetchall()[0][0]

    union = " UNION ALL ".join(f"SELECT {cols} FROM {s}" for s in SPLITS)
    # counts reconcile: |outputs| + |input - outputs| = |input| makes the outputs a
    # sub-multiset of the input (no row invented or doubled); the rest was dropped
    assert res["rows_rejected"] == 0  # the inputs here are valid: what is not written was dropped
    con.execute(f"CREATE TABLE dropped AS SELECT * FROM inp EXCEPT ALL ({union})")
    assert n(union) + n("SELECT * FROM dropped") == n("SELECT * FROM inp")
    assert n("SELECT * FROM dropped") == res["rows_dropped"] == sum(res["dropped_by_reason"].values())
    assert set(res["dropped_by_reason"]) <= set(DROP_REASONS)
    assert res["rows_read"] == res["rows_written"] + res["rows_rejected"] + res["rows_dropped"]
    counts = {s: n(f"SELECT * FROM {s}") for s in SPLITS}
    assert res["rows_written"] == sum(counts.values())

    probe = "COALESCE('prb:' || prb_id::VARCHAR, 'src:' || src_addr)"
    src = "SELECT src_addr FROM train"
    dst = "SELECT dst_addr FROM train"
    # time: pairs of train, every row later than every train row of its pair (val too)
    assert n("SELECT src_addr, dst_addr FROM test_time EXCEPT SELECT src_addr, dst_addr FROM train") == 0
    for s in ("test_time", "val"):
        assert n(f"SELECT 1 FROM {s} t JOIN (SELECT src_addr, dst_addr, max(event_time) AS hi FROM train "
                 "GROUP BY ALL) r USING (src_addr, dst_addr) WHERE t.event_time <= r.hi") == 0, s
    # each held-out regime's test set and its val set follow the same rule:
    for pair_s, probe_s, target_s in (("test_pair", "test_probe", "test_target"), ("val_pair", "val_probe", "val_target")):
        # pair: never in train, both ends in train (the source as a source, the destination as a destination)
        assert n(f"SELECT src_addr, dst_addr FROM {pair_s} INTERSECT SELECT src_addr, dst_addr FROM train") == 0
        assert n(f"SELECT src_addr FROM {pair_s} EXCEPT {src}") == 0
        assert n(f"SELECT dst_addr FROM {pair_s} EXCEPT {dst}") == 0
        # probe: the source (address and probe id) never a train source; its destinations train ones
        assert n(f"SELECT src_addr FROM {probe_s} INTERSECT {src}") == 0
        assert n(f"SELECT {probe} FROM {probe_s} INTERSECT SELECT {probe} FROM train") == 0
        assert n(f"SELECT dst_addr FROM {probe_s} EXCEPT {dst}") == 0
        # target: the destination never a train destination; its sources train ones
        assert n(f"SELECT dst_addr FROM {target_s} INTERSECT {dst}") == 0
        assert n(f"SELECT src_addr FROM {target_s} EXCEPT {src}") == 0
    # no pair in two regimes or sets (the time regime = train, val and test_time)
    con.execute("""CREATE TABLE regime_pairs AS SELECT DISTINCT src_addr, dst_addr, 'time' AS g FROM
                   (SELECT * FROM train UNION ALL SELECT * FROM val UNION ALL SELECT * FROM test_time)
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'pair' FROM test_pair
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'probe' FROM test_probe
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'target' FROM test_target
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'val_pair' FROM val_pair
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'val_probe' FROM val_probe
                   UNION ALL SELECT DISTINCT src_addr, dst_addr, 'val_target' FROM val_target""")
    assert n("SELECT src_addr, dst_addr FROM regime_pairs GROUP BY ALL HAVING count(*) > 1") == 0
    # every val set is disjoint from every test set: no packet, and no held-out group (a val
    # probe's source, a val target's destination, a val pair) appears in any test set
    tests = " UNION ALL ".join(f"SELECT * FROM {t}" for t in TESTS)
    for v in ("val", "val_pair", "val_probe", "val_target"):
        assert n(f"SELECT src_addr, dst_addr, event_time FROM {v} INTERSECT "
                 f"SELECT src_addr, dst_addr, event_time FROM ({tests})") == 0, v
    assert n(f"SELECT src_addr FROM val_probe INTERSECT SELECT src_addr FROM ({tests})") == 0
    assert n(f"SELECT {probe} FROM val_probe INTERSECT SELECT {probe} FROM ({tests})") == 0
    assert n(f"SELECT dst_addr FROM val_target INTERSECT SELECT dst_addr FROM ({tests})") == 0
    assert n(f"SELECT src_addr, dst_addr FROM val_pair INTERSECT SELECT src_addr, dst_addr FROM ({tests})") == 0
    # a dropped row fits no regime: an end train lacks, or a test_time row of a pair without train rows
    cut = res["cuts"]["test_time_start"]
    assert n(f"""SELECT * FROM dropped d WHERE d.src_addr IN ({src}) AND d.dst_addr IN ({dst})
                 AND ((d.src_addr, d.dst_addr) IN (SELECT (src_addr, dst_addr) FROM train)
                      OR d.event_time < TIMESTAMPTZ '{cut}')""") == 0
    assert res["strategy"] == "regimes" and res["checks"]["disjoint"]
    assert all(v == 0 for k, v in res["checks"].items() if k != "disjoint"), res["checks"]
    con.close()
    return counts


def test_every_regime_rule_holds_on_a_synth_world(world, tmp_path):
    out = tmp_path / "splits"
    res = shard([world], out, ShardConfig(strategy="regimes", regimes=BIG, rows_per_shard=5000))
    counts = check_regimes([world], out, res)
    assert all(counts.values()), counts
    rows = {s: pq.read_table(out / s).to_pylist() for s in SPLITS}
    # each regime holds out what it says: 10% of the 60 sources, of the destinations, of the pairs
    cuts = res["cuts"]
    assert cuts["sources"]["held_out"] == 6 and cuts["sources"]["groups"] == 60  # a probe's v4+v6 are one
    assert len({r["prb_id"] for r in rows["test_probe"]}) == 6
    assert cuts["destinations"]["held_out"] == round(cuts["destinations"]["groups"] * 0.1)
    assert len({r["dst_addr"] for r in rows["test_target"]}) == cuts["destinations"]["held_out"]
    held = cuts["pairs"]["held_out"] - cuts["pairs"]["returned_to_train"]
    assert len({(r["src_addr"], r["dst_addr"]) for r in rows["test_pair"]}) == held > 0
    # each held-out regime's val set: the next regimes.val (0.5) times as many groups in the same ranking
    assert cuts["sources"]["val"] == 3 and len({r["prb_id"] for r in rows["val_probe"]}) == 3
    assert cuts["destinations"]["val"] == max(1, round(cuts["destinations"]["groups"] * 0.05))
    assert len({r["dst_addr"] for r in rows["val_target"]}) == cuts["destinations"]["val"]
    val_held = cuts["pairs"]["val"] - cuts["pairs"]["val_returned_to_train"]
    assert len({(r["src_addr"], r["dst_addr"]) for r in rows["val_pair"]}) == val_held > 0
    assert regime_val_dirs(out) == {"time": out / "val", **{r: out / f"val_{r}" for r in REGIMES[1:]}}
    # test_time is the last ~10% of the time pairs' rows
    n_time = sum(counts[s] for s in ("train", "val", "test_time"))
    assert counts["test_time"] == pytest.approx(0.1 * n_time, rel=0.1)
    assert regime_test_dirs(out) == {r: out / f"test_{r}" for r in REGIMES}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["strategy"] == "regimes" and [s["split"] for s in manifest["splits"]] == list(SPLITS)
    assert set(manifest["files"]) == set(SPLITS) and len(manifest["files"]["train"]) >= 2


def test_every_regime_rule_holds_on_the_real_samples(ripe_table, tmp_path):
    out = tmp_path / "splits"
    res = shard([ripe_table], out, ShardConfig(strategy="regimes"))
    counts = check_regimes([ripe_table], out, res)
    assert all(counts.values()), counts
    # real probes share addresses (NAT, DHCP): whole components are held out, so no held-out
    # probe's address is a train source even where two probe ids meet on one address
    assert res["cuts"]["sources"]["components_of_several_probe_keys"] > 0


def test_deterministic_and_the_seed_matters(world, tmp_path):
    cfg = ShardConfig(strategy="regimes", regimes=BIG, seed=3)
    shard([world], tmp_path / "a", cfg)
    shard([world], tmp_path / "b", cfg)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert len(files) == len(SPLITS)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    shard([world], tmp_path / "c", cfg.model_copy(update={"seed": 4}))

    def held(d, split, col):
        return set(pq.read_table(d / split, columns=[col]).column(col).to_pylist())

    assert held(tmp_path / "a", "test_probe", "prb_id") != held(tmp_path / "c", "test_probe", "prb_id")
    assert held(tmp_path / "a", "test_target", "dst_addr") != held(tmp_path / "c", "test_target", "dst_addr")


def test_probes_sharing_an_address_are_held_out_together(tmp_path):
    # probes 10000 and 10001 report one (NAT) address: one source, in or out together
    t = make_table(4000, probes=20, targets=5)
    src = t.column("src_addr").to_pylist()
    prb = t.column("prb_id").to_pylist()
    src = [src[i - 1] if p == 10001 else a for i, (a, p) in enumerate(zip(src, prb))]
    src = ["193.0.0.1" if p == 10001 else a for a, p in zip(src, prb)]
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(t.set_column(t.schema.get_field_index("src_addr"), "src_addr", pa.array(src)), d / "t.parquet")
    seen = set()
    for seed in range(8):
        out = tmp_path / f"s{seed}"
        res = shard([d], out, ShardConfig(strategy="regimes", seed=seed, regimes=RegimesConfig(probe=0.3)))
        check_regimes([d], out, res)
        assert res["cuts"]["sources"]["groups"] == 19 and res["cuts"]["sources"]["components_of_several_probe_keys"] == 1
        probes = set(pq.read_table(out / "test_probe", columns=["prb_id"]).column("prb_id").to_pylist())
        seen.add(len({10000, 10001} & probes))
    assert seen == {0, 2}  # held out together in some seeds, kept together in others; never split


def test_pairs_first_measured_late_and_pairs_without_a_train_end(tmp_path):
    # the time regime drops test_time rows of a pair with no train row; a held-out pair whose
    # source has no other pair goes back to train (its source would be unseen)
    t = make_table(3000, probes=10, targets=3, prb=False)
    late = make_table(60, probes=1, targets=1, prb=False)
    t0 = t.column("event_time").to_pylist()[-1]
    import datetime as dt

    late = late.set_column(1, "event_time", pa.array([t0 - dt.timedelta(minutes=59 - i) for i in range(60)],
                                                      pa.timestamp("us", tz="UTC")))
    late = late.set_column(2, "src_addr", pa.array(["193.0.0.1"] * 60)).set_column(
        3, "dst_addr", pa.array(["8.8.99.8"] * 60))  # a known source, a destination first seen late
    lone = make_table(300, probes=1, targets=1, prb=False, seed=4)
    lone = lone.set_column(2, "src_addr", pa.array(["193.0.77.1"] * 300))  # one source, one pair
    d = tmp_path / "in"
    d.mkdir()
    for name, part in (("t", t), ("late", late), ("lone", lone)):
        pq.write_table(part, d / f"{name}.parquet")
    out = tmp_path / "o"
    res = shard([d], out, ShardConfig(strategy="regimes", val_fraction=0.0,
                                      regimes=RegimesConfig(time=0.1, pair=0.99, probe=0.0, target=0.0)))
    counts = check_regimes([d], out, res)
    rows = {s: pq.read_table(out / s).to_pylist() for s in SPLITS}
    assert res["dropped_by_reason"]["pair_not_in_train"] > 0
    assert all(r["dst_addr"] != "8.8.99.8" for s in SPLITS for r in rows[s] if s != "val")
    assert any(r["src_addr"] == "193.0.77.1" for r in rows["train"])  # returned, not held out
    assert res["cuts"]["pairs"]["returned_to_train"] > 0 and counts["test_probe"] == counts["test_target"] == 0


def test_spills_under_a_small_memory_limit(world, tmp_path):
    res = shard([world], tmp_path / "o", ShardConfig(strategy="regimes", memory_limit="64MB", threads=1))
    assert res["checks"]["disjoint"] and res["rows_written"] + res["rows_dropped"] == res["rows_read"]


def test_shards_are_the_same_whichever_way_they_are_written(world, tmp_path, monkeypatch):
    # one sort streamed to every shard at once, or sorted by shard first (too many shards to hold
    # open), and pairs found by hash or by text: the same rows in each file, in the same order
    import pingctl.shard as shard_module

    cfg = ShardConfig(strategy="regimes", regimes=BIG, rows_per_shard=5000)
    res = shard([world], tmp_path / "a", cfg)
    assert len(res["files"]["train"]) > 1
    monkeypatch.setattr(shard_module, "_OPEN_SHARDS", 0)
    shard([world], tmp_path / "b", cfg)
    monkeypatch.setattr(shard_module, "_pair_join", lambda con: "p.src_addr = c.src_addr AND p.dst_addr = c.dst_addr")
    shard([world], tmp_path / "c", cfg)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert len(files) == sum(len(v) for v in res["files"].values())
    key = ["event_time", "src_addr", "dst_addr", "rtt"]
    for f in files:
        a = pq.read_table(tmp_path / "a" / f)
        assert a.equals(pq.read_table(tmp_path / "b" / f)) and a.equals(pq.read_table(tmp_path / "c" / f)), f
        assert a.equals(a.sort_by([(k, "ascending") for k in key])), f  # each file sorted by time, then pair


def test_target_strategy_holds_out_destinations(world, tmp_path):
    out = tmp_path / "o"
    res = shard([world], out, ShardConfig(strategy="target", val_fraction=0.1, test_fraction=0.2))
    dst = {s: set(pq.read_table(out / s, columns=["dst_addr"]).column("dst_addr").to_pylist())
           for s in ("train", "val", "test")}
    assert not dst["train"] & dst["test"] and not dst["train"] & dst["val"] and not dst["val"] & dst["test"]
    n = res["cuts"]["groups"]
    assert n["test"] == round(sum(n.values()) * 0.2) and res["checks"]["targets_in_several_splits"] == 0


def test_cli_and_the_commands_that_read_the_splits(world, tmp_path):
    out = tmp_path / "splits"
    r = runner.invoke(app, ["shard", str(world), "-o", str(out), "--strategy", "regimes", "--regime", "probe=0.1",
                            "--regime", "time=0.2", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["config"]["regimes"]["probe"] == 0.1 and res["config"]["regimes"]["time"] == 0.2
    assert res["cuts"]["sources"]["held_out"] == 6
    assert is_splits_dir(out) and set(split_dirs(out)) == set(SPLITS)
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    desc = json.loads(r.stdout)
    assert set(desc["splits"]) == set(SPLITS) and desc["missing"] == []
    assert sum(d["rows"] for d in desc["splits"].values()) == res["rows_written"]
    r = runner.invoke(app, ["inspect", str(out)])  # six splits, three to a table
    assert r.exit_code == 0 and "test_target" in r.output and "…" not in r.output
    assert resolve_inputs([out / "test_pair"]) == sorted((out / "test_pair").glob("*.parquet"))
    r = runner.invoke(app, ["build-rows", str(out), "-o", str(tmp_path / "rows")])
    assert r.exit_code == 2 and "test_target" in r.output and str(out / "train") in " ".join(r.output.split())
    r = runner.invoke(app, ["build-rows", str(out / "train"), "-o", str(tmp_path / "rows"), "--json"])
    assert r.exit_code == 0, r.output
    for bad, needle in ((["--regime", "probes=0.1"], "NAME=FRACTION"), (["--regime", "probe=x"], "not a fraction"),
                        (["--test", "0.2"], "--regime time="), (["--regime", "probe=1.5"], "regimes.probe")):
        r = runner.invoke(app, ["shard", str(world), "-o", str(tmp_path / "x"), "--strategy", "regimes", *bad])
        assert r.exit_code == 2 and needle in " ".join(r.output.split()), (bad, r.output)
    r = runner.invoke(app, ["shard", str(world), "-o", str(tmp_path / "x"), "--regime", "probe=0.1"])
    assert r.exit_code == 2 and "--strategy regimes" in r.output


def test_regime_test_dirs_refuses_what_is_not_a_regimes_split(world, tmp_path):
    with pytest.raises(PingctlError, match="no `pingctl shard` manifest"):
        regime_test_dirs(world)
    with pytest.raises(PingctlError, match="not a directory"):
        regime_test_dirs(tmp_path / "missing")
    shard([world], tmp_path / "time", ShardConfig(strategy="time"))
    with pytest.raises(PingctlError, match="--strategy time` output, not a regimes split"):
        regime_test_dirs(tmp_path / "time")
    out = tmp_path / "rg"
    shard([world], out, ShardConfig(strategy="regimes"))
    import shutil

    shutil.rmtree(out / "test_pair")
    with pytest.raises(PingctlError, match="without test_pair/"):
        regime_test_dirs(out)
