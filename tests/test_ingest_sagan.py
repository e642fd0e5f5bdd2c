"""Differential test: on every result of the shared RIPE Atlas samples, the per-packet RTTs
`pingctl ingest` writes equal what RIPE NCC's own parser, ripe.atlas.sagan, reports.

Deliberate differences (see docs/ingest.md):
  * sagan rounds RTTs to 3 decimals; pingctl keeps the full value (compared rounded here);
  * sagan reports timeouts and error entries as rtt None; pingctl writes -1.0 for both and
    counts the error entries in `packet_error_count`;
  * sagan gives a reply with an RTT of exactly 0 no TTL; pingctl gives it its TTL as any other;
  * a result with no usable source address at all (src_addr and from both empty) cannot
    be a row of the canonical table (src_addr is required): pingctl rejects it as
    `no_src_addr`; this test checks each such reject against sagan and the raw JSON.
"""

from __future__ import annotations

import bz2
import json
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ripe-atlas"
FILES = sorted(SHARED.glob("*.jsonl.bz2")) if SHARED.is_dir() else []

pytestmark = pytest.mark.skipif(not FILES, reason=f"shared RIPE Atlas samples not found at {SHARED}")


def test_rtts_equal_sagan_on_every_result(tmp_path):
    sagan = pytest.importorskip("ripe.atlas.sagan")
    from pingctl.config import IngestConfig
    from pingctl.ingest.core import ingest
    from pingctl.schema.addresses import is_public, parse_address

    t0 = time.perf_counter()
    out = tmp_path / "out"
    summary = ingest(FILES, out, IngestConfig(workers=2))
    t_ingest = time.perf_counter() - t0
    manifest = json.loads((out / "manifest.json").read_text())
    rejects: dict[tuple[str, int], str] = {}
    for line in (out / "rejects.jsonl").read_text().splitlines():
        r = json.loads(line)
        rejects[(r["file"], r["line"])] = r["reason"]

    checked = rows_checked = rejected_checked = sagan_dups = 0
    t_sagan = 0.0
    for entry in manifest["inputs"]:
        path = entry["path"]
        table = pq.read_table(out / entry["part"]) if entry["part"] else None
        got = {c: table.column(c).to_pylist() for c in table.column_names}
        got["event_time"] = table.column("event_time").cast("int64").to_pylist()
        got["rtt"] = [x if x == -1.0 else round(x, 3) for x in got["rtt"]]
        want: dict[str, list] = {c: [] for c in got}
        where: list[tuple[str, int]] = []  # (file, line) of every expected row
        with bz2.open(path, "rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                t = time.perf_counter()
                result = sagan.PingResult(raw.decode("utf-8"))
                t_sagan += time.perf_counter() - t
                d = orjson.loads(raw)
                checked += 1
                reason = rejects.pop((path, line_no), None)
                if reason is not None:
                    # the only reject on real data: no source address at all
                    assert reason == "no_src_addr", (path, line_no, reason)
                    assert not result.origin and not d.get("src_addr"), (path, line_no)
                    rejected_checked += 1
                    continue
                n = len(result.packets)
                want["rtt"].extend(-1.0 if p.rtt is None else p.rtt for p in result.packets)
                # sagan gives a reply of RTT 0 no TTL (`if self.rtt`); pingctl gives it its own
                # or its result's, as sagan does for every other reply
                want["ttl"].extend(p.ttl if p.rtt or p.rtt is None else e.get("ttl", d.get("ttl"))
                                   for p, e in zip(result.packets, d["result"]))
                want["dup"].extend(p.dup for p in result.packets)
                sagan_dups += sum(p.dup for p in result.packets)
                # auto source rule: public src_addr, else public `from`, else what is valid
                src, frm = d.get("src_addr") or "", result.origin or ""
                ok = [a for a in (src, frm) if a and parse_address(a) and parse_address(a)[1] == result.af]
                public = [a for a in ok if is_public(a)]
                per_result = {
                    "msm_id": result.measurement_id,
                    "prb_id": result.probe_id,
                    "event_time": int(result.created.timestamp()) * 1_000_000,
                    "ip_version": result.af,
                    "dst_addr": parse_address(result.destination_address)[0],
                    "src_addr": parse_address((public or ok)[0])[0],
                    "size": d["size"],
                    "packet_error_count": sum(1 for e in d["result"] if "error" in e),
                    "dst_name": result.destination_name,
                }
                for c, v in per_result.items():
                    want[c].extend([v] * n)
                where.extend([(path, line_no)] * n)
                rows_checked += n
        for c in got:
            if got[c] != want[c]:
                i = next((i for i, (a, b) in enumerate(zip(got[c], want[c])) if a != b), min(len(got[c]), len(want[c])))
                at = where[i] if i < len(where) else "end"
                pytest.fail(f"{c} differs at row {i} ({at}): pingctl {got[c][i:i + 3]} vs sagan {want[c][i:i + 3]}")
    assert not rejects, f"rejects that match no line: {list(rejects)[:5]}"
    assert checked == summary["records"] == 94_848 + 38_733
    assert rows_checked == summary["rows"]
    assert sagan_dups == summary["dups"]
    assert rejected_checked == summary["rejected_total"]
    print(
        f"\n{checked:,} results / {rows_checked:,} rows compared with sagan; {rejected_checked} no_src_addr rejects "
        f"checked; ingest {t_ingest:.1f} s, sagan {t_sagan:.1f} s"
    )
