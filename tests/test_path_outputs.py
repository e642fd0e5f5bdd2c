"""`shard --strategy regimes` and `build-rows --by both` write the same rows as before they were
made to scale: digests of what they write on a small world shaped like `bench path`'s (many
pairs per probe, IPv4 and IPv6, failures, probes without an id, rejected rows), pinned from the
code as it was before (the shard built one sorted on-disk table of every row and verified with
a query per rule; build-rows sorted by the probe key's text). A digest covers every split
file's rows in order and every record's bytes in order, so any change of split membership,
shard, row order, record cut or record content changes it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pingctl.config import ShardConfig, SynthConfig
from pingctl.inspect.records import iter_records
from pingctl.records.build import build_rows
from pingctl.shard import shard
from pingctl.synth.generate import generate
from tests.conftest import make_table

# digests of the outputs of the code before the change (see the module docstring)
PINNED: dict = {
    "rows": {
        "destination": {
            "manifest": "8d16eff29fc97dea622e2fecea7efb59d83304684a53ced8fb65f3a584f78bff",
            "records": "727165dfb900d916f54851970df29f66bc7b4c039f01a301fd89bfc48593fdbb"
        },
        "source": {
            "manifest": "7b199878479fa5ef8ad31ba013b43758d12d7a4bafd0b92b58ef20565550fc38",
            "records": "c592ee488fe87172b36059441c6d6d2b5ad7a24f0c2b3a61e512978fd3f22475"
        }
    },
    "splits": {
        "files": {
            "test_pair/part-00000.parquet": "2b6678c28bb79735414026bcecc0e27d3c19a62b71338ab38b5f9c097810dfb7",
            "test_probe/part-00000.parquet": "f2083ccccb6315ea8a88d0541d7ab545b1f1fb16a1d9d639306d01102d4d613f",
            "test_target/part-00000.parquet": "3b009405a18c11c382748913c6e63651fccbfc75d9e98480cd153e3445bec054",
            "test_time/part-00000.parquet": "e809d8ba8cdd686fe353f52d1371cf7c09101f37cdb29d0e4d5d8982a0663e77",
            "train/part-00000.parquet": "6e2ec2383a65acfd809731e2a07854fa332b829d653bd647929ce436b41c4d98",
            "train/part-00001.parquet": "3d9eb3cd18cb3be8b63d5ef9462de4d1c3c1a662b63f24b5ebdceca40a20bf71",
            "train/part-00002.parquet": "1643102cd71035f870de9fa86de0b33f6528ebbf98b5d9a381809f152da64f87",
            "train/part-00003.parquet": "88cfff8eb02b9b7963d0d920edcc077478987dfb3978aa7b53cee01f65c95d05",
            "val/part-00000.parquet": "212795e99e15585e9956f91fd120920df5a0df8bb5d2d2a6fa9466749bcf9084",
            "val_pair/part-00000.parquet": "be63e4d6373bdcd85e2a8dd0b392a5d0a6559e205b7dc672be60147fa0548b64",
            "val_probe/part-00000.parquet": "5f7fcd57b9c645c5dbe614ad80b504c87c472ad898e76ac2215e70c5dc2f9f33",
            "val_target/part-00000.parquet": "361b3b46ef3300f10139bbfb83a1a4dbaf4995e3d190c77adb3b521ad1a7544d"
        },
        "manifest": "bd57b3365270d8c9882c9e9a9e21c325c6de87cd4e8c47510ba8f4b4d9c97204",
        "rejects": "a5f14d0fd2356d9791f461d80dd046e1ef063eb05b5bd400bb0f86ffc1da2059",
        "splits": "1269a2c833449463ea9572300abe3d8219a12e6af8aba7443c138b28ca302c9d"
    }
}


def world_dir(d: Path) -> list[Path]:
    """Synth's bench-path shape, plus a table whose every other probe has no id (its rows are
    keyed by source address) and with a few rejected rows: the inputs."""
    generate(SynthConfig(rows=30_000, probes=30, targets=40, targets_per_probe=25, seed=3), d / "gen")
    # Synth's RTTs come from sin, cos and exp, whose last bit differs between CPUs' SIMD paths;
    # rounded to 0.01 ms they are the same everywhere, so the pinned digests are too.
    syn = pa.concat_tables([pq.read_table(f) for f in sorted((d / "gen").glob("part-*.parquet"))])
    syn = syn.set_column(syn.schema.get_field_index("rtt"), "rtt",
                         pa.array(np.round(syn.column("rtt").to_numpy(zero_copy_only=False), 2)))
    (d / "synth").mkdir()
    pq.write_table(syn, d / "synth" / "part-0.parquet")
    t = make_table(1500, probes=6, targets=4, v6_every=3)
    prb = [None if p % 2 else p for p in t.column("prb_id").to_pylist()]
    rtt = t.column("rtt").to_pylist()
    for i in (7, 700):
        rtt[i] = -5.0  # a bad RTT: rejected
    t = t.set_column(t.schema.get_field_index("prb_id"), "prb_id", pa.array(prb, pa.int64()))
    t = t.set_column(t.schema.get_field_index("rtt"), "rtt", pa.array(rtt, pa.float64()))
    pq.write_table(t, d / "extra.parquet")
    return [d / "synth", d / "extra.parquet"]


def _sha(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()


def split_digests(out: Path) -> dict:
    """Per split file: the digest of its rows in order; and the manifest's counts and cuts."""
    man = json.loads((out / "manifest.json").read_text())
    files = {f: _sha(pq.read_table(out / f).to_pydict()) for fs in man["files"].values() for f in fs}
    keep = ("rows_read", "rows_written", "rows_rejected", "rejects_by_reason", "rows_dropped", "dropped_by_reason",
            "checks", "cuts")
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    rejects = [{**r, "file": Path(r["file"]).name} for r in rejects]  # the path is the test's own
    return {"files": files, "rejects": _sha(rejects),
            "manifest": _sha(json.dumps({k: man[k] for k in keep}, sort_keys=True, default=str)),
            "splits": _sha(json.dumps(man["splits"], sort_keys=True, default=str))}


def rows_digests(out: Path) -> dict:
    """Per layout: the digest of every record's bytes, file by file, and of the manifest's fields
    that describe the records (the destination index included)."""
    got = {}
    for name, d in (("source", out), ("destination", out / "by-destination")):
        man = json.loads((d / "manifest.json").read_text())
        errors: list = []
        recs = [raw for _, _, raw in iter_records([d / f for f in man["files"]], errors)]
        assert errors == []
        keep = {k: man.get(k) for k in ("records", "measurements", "files", "record_measurements", "probes",
                                        "destinations", "index", "rows_read", "rows_rejected", "start", "end")}
        got[name] = {"records": _sha([hashlib.sha256(bytes(r)).hexdigest() for r in recs]),
                     "manifest": _sha(json.dumps(keep, sort_keys=True))}
    return got


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("path-outputs")
    res = shard(world_dir(d), d / "splits", ShardConfig(strategy="regimes", rows_per_shard=5000))
    rows = build_rows([d / "splits" / "train"], d / "rows", by="both", max_row_mb=0.02, dst_max_row_mb=0.01)
    return d, res, rows


def test_regimes_splits_are_the_rows_they_were(outputs):
    d, res, _ = outputs
    assert res["rows_dropped"] > 0 and res["rows_rejected"] == 2  # the world reaches those paths
    assert split_digests(d / "splits") == PINNED["splits"]


def test_rows_by_both_are_the_records_they_were(outputs):
    d, _, rows = outputs
    assert rows["records"] > rows["probes"]  # records are cut: the cuts are pinned too
    assert rows_digests(d / "rows") == PINNED["rows"]


@pytest.mark.parametrize("train_last, several, not_after", [
    (2, 0, 0),  # train's span ends before test_time's packet at 3: spans apart, no packet grouped
    (3, 1, 1),  # the packet at 3 is in train and in test_time
    (4, 0, 1),  # the spans overlap but share no packet: grouped packet by packet, none found
])
def test_the_regimes_checks_read_per_pair_spans_and_still_find_a_packet_in_two_splits(train_last, several, not_after):
    import duckdb

    from pingctl import shard as shard_mod

    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    con.execute("CREATE TABLE assigned (split VARCHAR, prb_id BIGINT, src_addr VARCHAR, dst_addr VARCHAR, "
                "event_time TIMESTAMPTZ, ip_version BIGINT, rtt DOUBLE)")
    t = "TIMESTAMPTZ '2024-01-01 00:00:0{}+00'"
    con.execute(f"""INSERT INTO assigned VALUES
        ('train', 1, '10.0.0.1', '10.0.0.9', {t.format(1)}, 4, 5.0),
        ('train', 1, '10.0.0.1', '10.0.0.9', {t.format(train_last)}, 4, 5.0),
        ('test_time', 1, '10.0.0.1', '10.0.0.9', {t.format(3)}, 4, 6.0),
        ('test_pair', 1, '10.0.0.1', '10.0.0.8', {t.format(5)}, 4, -1.0)""")
    shard_mod._split_groups(con, "assigned")
    checks = shard_mod._verify_regimes(con)
    assert checks["packets_in_several_splits"] == several
    assert checks["time_rows_not_after_train"] == not_after
    assert checks["pair_destinations_not_in_train"] == 1  # 10.0.0.8 is no train destination
    stats = {s["split"]: s for s in shard_mod._split_stats(con, ("train", "test_pair"))}
    assert stats["test_pair"]["failure_share"] == 1.0 and stats["train"]["rows"] == 2
