"""`pingctl ingest` keeps each reply's TTL, each result's destination name and each packet's
duplicate flag (schema version 2): the same on the msgspec and the generic path, across
batches, and with a result rejected midway leaving nothing of itself behind."""

from __future__ import annotations

import pytest

from pingctl.ingest.core import ingest_bytes
from pingctl.ingest.parse import Options, reconcile
from tests.test_ingest import _DEL, jl, res


def _run(*results, fast: bool = True, chunk: int = 1 << 20, **opts):
    table, counts, rejects = ingest_bytes(jl(*results), Options(**opts), chunk=chunk, fast=fast)
    assert reconcile(counts) == []
    return table, counts, rejects


def _facts(table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in ("rtt", "ttl", "dst_name", "dup"))))


# a reply's own ttl wins; others take the result's (RIPE Atlas writes a packet's ttl only where it
# differs from the first reply's); a timeout or an error has none; dup marks a duplicate reply
MIXED = res(ttl=117, dst_name="dns.google",
            result=[{"rtt": 10.0}, {"x": "*"}, {"rtt": 12.0, "ttl": 116}, {"rtt": 30.0, "dup": 1},
                    {"error": "sendto failed"}])
MIXED_ROWS = [(10.0, 117, "dns.google", False), (-1.0, None, "dns.google", False),
              (12.0, 116, "dns.google", False), (30.0, 117, "dns.google", True),
              (-1.0, None, "dns.google", False)]


@pytest.mark.parametrize("fast", [True, False])
def test_ttl_dst_name_and_dup_per_row(fast):
    no_ttl = res(ttl=_DEL, dst_name=_DEL, result=[{"rtt": 5.0}, {"rtt": 6.0, "ttl": 60}])
    table, c, rej = _run(MIXED, no_ttl, fast=fast)
    assert rej == [] and c["dups"] == 1
    assert _facts(table) == MIXED_ROWS + [(5.0, None, None, False), (6.0, 60, None, False)]
    # --drop-dups drops the duplicate row, and with it the only true flag
    table, c, _ = _run(MIXED, fast=fast, drop_dups=True)
    assert _facts(table) == [r for r in MIXED_ROWS if not r[3]]


def test_old_firmware_name_is_the_destination_name():
    # fw < 4460 wrote addr/name for dst_addr/dst_name (only the generic path reads that layout)
    old = res(dst_addr=_DEL, dst_name=_DEL, addr="8.8.8.8", name="google-public-dns-a.google.com",
              result=[{"rtt": 3.0}])
    table, _, rej = _run(old)
    assert rej == [] and table.column("dst_name").to_pylist() == ["google-public-dns-a.google.com"]
    # a dst_name that is not text is no name (it is not a field pingctl checks)
    table, _, rej = _run(res(dst_name=5, result=[{"rtt": 3.0}]))
    assert rej == [] and table.column("dst_name").to_pylist() == [None]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("change", [
    {"ttl": 256}, {"ttl": -1}, {"ttl": "58"}, {"ttl": 58.0}, {"ttl": True},
    {"result": [{"rtt": 1.0}, {"rtt": 2.0, "ttl": 300}]},
    {"result": [{"rtt": 1.0}, {"rtt": 2.0, "ttl": "x"}]},
])
def test_a_ttl_that_is_no_ttl_rejects_the_result(change, fast):
    table, c, rej = _run(res(), res(**change), res(), fast=fast)
    assert [(x["line"], x["reason"]) for x in rej] == [(2, "bad_ttl")]
    assert table.num_rows == 6 and c["results_written"] == 2


@pytest.mark.parametrize("fast", [True, False])
def test_a_null_ttl_is_no_ttl(fast):
    table, _, rej = _run(res(ttl=None, result=[{"rtt": 1.0, "ttl": None}, {"rtt": 2.0}]), fast=fast)
    assert rej == [] and table.column("ttl").to_pylist() == [None, None]


@pytest.mark.parametrize("fast", [True, False])
def test_a_result_rejected_midway_leaves_no_ttl_or_dup_behind(fast):
    # the dup and the ttl of the first packets are noted before the bad RTT is reached: the
    # rows that come next must not inherit them
    bad = res(result=[{"rtt": 1.0, "dup": 1, "ttl": 50}, {"rtt": 2.0, "ttl": 51}, {"rtt": -5.0}])
    good = res(ttl=64, result=[{"rtt": 7.0}, {"rtt": 8.0}, {"rtt": 9.0}])
    table, c, rej = _run(bad, good, fast=fast)
    assert [x["reason"] for x in rej] == ["bad_rtt"] and c["dups"] == 0
    assert _facts(table) == [(7.0, 64, "8.8.8.8", False), (8.0, 64, "8.8.8.8", False), (9.0, 64, "8.8.8.8", False)]
    bad_ttl = res(result=[{"rtt": 1.0, "dup": 1}, {"rtt": 2.0, "dup": 1, "ttl": 999}])
    table, c, rej = _run(bad_ttl, good, fast=fast)
    assert [x["reason"] for x in rej] == ["bad_ttl"] and c["dups"] == 0 and not any(table.column("dup").to_pylist())


def test_rows_across_many_batches_keep_their_own_facts():
    # small chunks and row groups: a flush after nearly every result, so each note's row number
    # must be counted within its own batch
    results = [res(timestamp=1_700_000_000 + i, ttl=100 + i % 7, dst_name=f"h{i % 3}",
                   result=[{"rtt": float(i)}, {"rtt": i + 0.5, "dup": 1} if i % 4 == 0 else {"x": "*"},
                           {"rtt": i + 0.25, "ttl": 200 + i % 5} if i % 3 == 0 else {"rtt": i + 0.75}])
               for i in range(40)]
    whole, _, _ = _run(*results)
    pieces, _, _ = _run(*results, chunk=97, row_group_rows=5)
    assert _facts(pieces) == _facts(whole)
    assert sum(r[3] for r in _facts(whole)) == 10
    assert _facts(whole)[:3] == [(0.0, 100, "h0", False), (0.5, 100, "h0", True), (0.25, 200, "h0", False)]
