"""The speed paths of `pingctl ingest` give exactly what the reference paths give.

* indexed_bzip2 (bzip2 blocks decoded in parallel) vs the `bz2` module (libbzip2): same
  part bytes, rejects (line, reason, detail), counts and sha256, on multi-stream files,
  on damaged files (where the parallel attempt is thrown away and the file read again)
  and on the shared RIPE Atlas samples.
* msgspec's typed decoding (`parse_records(fast=True)`) vs orjson + the generic rules
  (`fast=False`): same rows, counts and rejects, on hand-written edge cases, on
  property-generated results and on every result of the shared samples.
"""

from __future__ import annotations

import bz2
import functools
import hashlib
import json
import math
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.ingest.core import ingest_bytes, ingest_file
from pingctl.ingest.parse import Options, reconcile
from tests.test_ingest import _DEL, VARIANTS, jl, res

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ripe-atlas"
SHARED_FILES = sorted(SHARED.glob("*.jsonl.bz2")) if SHARED.is_dir() else []


# ---------------------------------------------------------------- indexed_bzip2 vs bz2


def _varied(n: int, start: int = 0) -> bytes:
    # varied text: bzip2 packs repetitive lines into very few blocks
    return jl(*[res(prb_id=i, dst_name=hashlib.sha256(b"%d" % i).hexdigest() * 4) for i in range(start, start + n)])


def _ingest_one(path: Path, out: Path, bz2_threads: int):
    out.mkdir()
    r = ingest_file(0, str(path), str(out), Options(row_group_rows=4096), threaded=False, bz2_threads=bz2_threads)
    part = (out / r["part"]).read_bytes() if r["part"] else None
    return r, part, (out / ".rejects-00000.jsonl").read_bytes()


def _assert_same_as_bz2_module(path: Path, tmp_path: Path, threads: int = 2) -> str:
    """Ingest `path` with the bz2 module and with indexed_bzip2: identical results.
    Returns the decoder the parallel attempt ended up with."""
    pytest.importorskip("indexed_bzip2")
    ref, ref_part, ref_rej = _ingest_one(path, tmp_path / "ref", 0)
    got, part, rej = _ingest_one(path, tmp_path / f"par{threads}", threads)
    assert ref["decoder"] == "bz2"
    for key in ("bytes", "sha256", "codec", "counts"):
        assert got[key] == ref[key], key
    assert rej == ref_rej
    assert part == ref_part
    assert got["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    return got["decoder"]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_bz2_multistream_identical(tmp_path, threads):
    data = _varied(3000)
    cut = [0, 1000, 150_000, 150_000, 600_000, len(data)]  # includes an empty stream
    f = tmp_path / "multi.jsonl.bz2"
    f.write_bytes(b"".join(bz2.compress(data[a:b]) for a, b in zip(cut, cut[1:])))
    assert _assert_same_as_bz2_module(f, tmp_path, threads) == f"indexed_bzip2 x{threads}"


@functools.lru_cache(maxsize=1)
def _damaged() -> dict[str, bytes]:
    blob = bz2.compress(_varied(6000))
    multi = bz2.compress(_varied(500)) + blob
    mid = len(blob) // 2
    flipped = bytearray(blob)
    flipped[mid] ^= 0x10
    zeroed = bytearray(blob)
    zeroed[mid : mid + 512] = bytes(512)
    return {
        "cut-two-thirds": blob[: len(blob) * 2 // 3],
        "cut-last-byte": blob[:-1],
        "bit-flip": bytes(flipped),
        "zeroed-sector": bytes(zeroed),
        "trailing-garbage": blob + b"garbage after the stream",
        "trailing-header": blob + b"BZh9",
        "trailing-zeros": blob + bytes(8),
        "second-stream-cut": multi[: len(multi) - 1000],
        "not-bzip2": b"this is not compressed at all\n" * 100,
        "header-only": b"BZh9",
        "empty": b"",
    }


@pytest.mark.parametrize("kind", sorted(_damaged()))
def test_parallel_bz2_damaged_identical(tmp_path, kind):
    f = tmp_path / f"{kind}.jsonl.bz2"
    f.write_bytes(_damaged()[kind])
    _assert_same_as_bz2_module(f, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_FILES, reason=f"shared RIPE Atlas samples not found at {SHARED}")
@pytest.mark.parametrize("name", [f.name for f in SHARED_FILES])
def test_parallel_bz2_shared_samples_identical(tmp_path, name):
    assert _assert_same_as_bz2_module(SHARED / name, tmp_path).startswith("indexed_bzip2")


def test_bz2_layout_check():
    ib = pytest.importorskip("indexed_bzip2")
    import io

    from pingctl.ingest.reader import bz2_layout_ok

    data = bz2.compress(_varied(300)) + bz2.compress(b"") + bz2.compress(_varied(2000, 300))
    reader = ib.open(io.BytesIO(data), parallelization=1)
    assert reader.read() == _varied(2300)
    offsets = reader.block_offsets()
    reader.close()
    assert bz2_layout_ok(io.BytesIO(data), offsets, len(data))
    assert not bz2_layout_ok(io.BytesIO(data + b"x"), offsets, len(data) + 1)  # trailing byte
    blocks = sorted(offsets)[1:-3]  # block starts of the big stream, not its first
    assert blocks
    fewer = {k: v for k, v in offsets.items() if k != blocks[0]}
    assert not bz2_layout_ok(io.BytesIO(data), fewer, len(data))  # a block not decoded


# ---------------------------------------------------------------- msgspec vs orjson paths


def _both(data: bytes, **opts):
    """(table rows, counts, rejects) of the fast and the generic path: must be equal."""
    pytest.importorskip("msgspec")
    o = Options(**opts)
    t1, c1, r1 = ingest_bytes(data, o, fast=True)
    t2, c2, r2 = ingest_bytes(data, o, fast=False)
    assert reconcile(c1) == []
    assert c1 == c2
    assert r1 == r2
    rows1, rows2 = t1.to_pylist(), t2.to_pylist()
    assert rows1 == rows2
    # bit for bit, -0.0 included
    assert [math.copysign(1, x["rtt"]) for x in rows1] == [math.copysign(1, x["rtt"]) for x in rows2]
    return rows1, c1, r1


TRICKY = [
    res(),
    res(af=6, dst_addr="2001:0DB8::1", src_addr="2A02::5", **{"from": "2a02::6"}),
    res(type=None),
    res(type=_DEL, prb_id=None),
    res(type="traceroute"),
    res(timestamp=1_700_000_000.123456),
    res(timestamp=1_700_000_000.5e0, size=None),
    res(size=_DEL),
    res(result=[{"rtt": 3}, {"rtt": 0}, {"rtt": -0.0}, {"rtt": 1e-300}, {"rtt": 2**64}, {"rtt": 2**53 + 1}]),
    res(result=[{"rtt": 1.0, "dup": 0}, {"rtt": 1.0, "dup": "0"}, {"rtt": 1.0, "dup": ""}, {"rtt": 1.0, "dup": None}]),
    res(result=[{"rtt": 1.0, "dup": 1, "late": 3}, {"late": 2}, {}, {"x": None}, {"error": None}, {"error": "e", "x": "*"}]),
    res(result=[{"rtt": 1.0, "dup": [1]}]),
    res(result=[{"rtt": 1.0, "ttl": 54, "srcaddr": "1.2.3.4"}]),
    res(result=[{"rtt": None}]),
    res(result=[{"rtt": True}]),
    res(result=[{"rtt": -1.0}]),
    res(result=[5]),
    res(result=None),
    res(result={"rtt": 1.0}),
    res(result=_DEL),
    res(af="4"),
    res(af=None, pf=4),
    res(af=_DEL, mode="ICMP4"),
    res(af=4.0),
    res(msm_id=True),
    res(msm_id=(1 << 63) - 1, prb_id=(1 << 63) - 1, size=(1 << 63) - 1),
    res(msm_id=1 << 63),
    res(prb_id=-1),
    res(src_addr=None, srcaddr="81.1.1.1"),
    res(src_addr="", srcaddr="81.1.1.1", **{"from": ""}),
    res(src_addr=5, **{"from": "81.2.3.4"}),
    res(src_addr="192.168.1.10", **{"from": None}),
    res(src_addr="192.168.1.10", **{"from": "2a01::1"}),
    res(src_addr="10.0.0.1", **{"from": "10.0.0.2"}),
    res(dst_addr="", addr="9.9.9.9"),
    res(dst_addr=_DEL, dst_name="9.9.9.9"),
    res(dst_addr="nope"),
    res(dst_addr=None, addr="9.9.9.9"),
    res(timestamp=5),
    res(timestamp=True),
    res(timestamp=10**30),
    {"not": "a ping"},
]
RAW_TRICKY = [
    b'{"msm_id": 1, "msm_id": "x", "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": []}',
    b'{"msm_id": "x", "msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": []}',
    b'{"ms\\u006d_id": 1, "prb\\u005fid": 3, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.\\u0038", "from": "8.8.4.4", "result": [{"rtt": 1}]}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [{"rtt": 1, "rtt": null}]}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [{"rtt": 2.5E+1}, {"rtt": 25e-1}]}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [{"rtt": 1e999}]}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [], "name": "\xc3\xa9"}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [], "name": "\xff"}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "\\ud800", "result": []}',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": []} junk',
    b'{"msm_id": 1, "timestamp": 1700000000, "af": 4, "dst_addr": "8.8.8.8", "from": "8.8.4.4", "result": [],}',
    b"[" + orjson.dumps(res()) + b", " + orjson.dumps(res(msm_id=2)) + b"]",
    b"   ",
    b"7",
    b"null",
]


@pytest.mark.parametrize("opts", [{}, {"src_field": "from"}, {"src_field": "src_addr", "drop_dups": True}])
def test_fast_path_matches_generic_on_edge_cases(opts):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in TRICKY) + b"\n".join(RAW_TRICKY) + b"\n" + VARIANTS.read_bytes() + orjson.dumps(res())  # no final newline
    rows, c, rej = _both(data, **opts)
    assert c["results_written"] > 10 and len(rej) > 10


def test_fast_path_matches_generic_with_filters():
    data = [res(msm_id=m, prb_id=p, timestamp=1_700_000_000 + 60 * k, af=af, dst_addr=d, src_addr=s, **{"from": s})
            for m in (1, 2) for p in (7, 8) for k in range(5)
            for af, d, s in ((4, "8.8.8.8", "81.2.3.4"), (6, "2a00::1", "2a01::2"))]
    data += [res(timestamp=5), res(timestamp=4_000_000_000), res(msm_id=2, af=6)]
    for opts in (
        {"msm_ids": frozenset({2}), "probe_ids": frozenset({7})},
        {"af": 6, "since_us": 1_700_000_060 * 10**6, "until_us": 1_700_000_200 * 10**6},
        {"sample": 0.5},
    ):
        _, c, _ = _both(jl(*data), **opts)
        assert sum(c["filtered"].values()) > 0


_JUNK = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**62, 2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
    | st.sampled_from(["ping", "8.8.8.8", "2a00::1", "192.168.0.1", "", "ICMP4"])
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)
_PACKET = st.dictionaries(st.sampled_from(["rtt", "x", "error", "dup", "late", "ttl"]), _JUNK | st.floats(0, 1e4), max_size=3)


@settings(max_examples=200)
@given(st.data())
def test_fast_path_matches_generic_property(data):
    lines = []
    for _ in range(data.draw(st.integers(1, 4))):
        r = res()
        for _ in range(data.draw(st.integers(0, 3))):
            key = data.draw(st.sampled_from(sorted(r) + ["addr", "name", "srcaddr", "pf", "mode"]))
            r[key] = data.draw(_JUNK) if data.draw(st.booleans()) else _DEL
        r = {k: v for k, v in r.items() if v is not _DEL}
        if data.draw(st.booleans()):
            r["result"] = data.draw(st.lists(_PACKET | _JUNK, max_size=4))
        lines.append(json.dumps(r).encode())  # json: integers beyond 64 bits too
    opts = {
        "src_field": data.draw(st.sampled_from(["auto", "from", "src_addr"])),
        "drop_dups": data.draw(st.booleans()),
        "af": data.draw(st.sampled_from([0, 4, 6])),
    }
    _both(b"\n".join(lines) + b"\n", **opts)


@settings(max_examples=300)
@given(st.one_of(
    st.floats(0, 1e6, allow_nan=False).map(repr),
    st.integers(0, 2**70).map(str),
    st.tuples(st.integers(0, 10**9), st.integers(0, 10**12), st.integers(-30, 30)).map(lambda t: f"{t[0]}.{t[1]}e{t[2]}"),
))
def test_fast_path_rtt_numbers_bit_identical(text):
    line = orjson.dumps(res(result=[{"rtt": 0}])).replace(b'{"rtt":0}', b'{"rtt":' + text.encode() + b"}")
    _both(line + b"\n")


def test_fast_path_tolerates_what_it_does_not_read():
    """Documented difference: numbers beyond the float range in a field pingctl never reads
    do not make the fast path reject the result (orjson refuses the whole line)."""
    pytest.importorskip("msgspec")
    line = orjson.dumps(res()).replace(b'"avg":11.25', b'"avg":1e999') + b"\n"
    _, c, _ = ingest_bytes(line, fast=True)
    assert c["results_written"] == 1
    _, c, _ = ingest_bytes(line, fast=False)
    assert c["rejected"] == {"bad_json": 1}


def test_fast_path_off_for_files_of_other_shapes():
    # old firmware (addr/srcaddr/pf, no type): every line misses the struct; still equal
    old = [res(prb_id=i, dst_addr=_DEL, addr="9.9.9.9", src_addr=_DEL, srcaddr="82.1.1.1", af=_DEL, pf=4, type=_DEL) for i in range(300)]
    _, c, rej = _both(jl(*old, res(), *old))
    assert c["results_written"] == 601 and rej == []


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_FILES, reason=f"shared RIPE Atlas samples not found at {SHARED}")
def test_fast_path_matches_generic_on_shared_samples():
    for f in SHARED_FILES:
        with bz2.open(f, "rb") as fh:
            data = fh.read()
        rows, c, rej = _both(data)
        assert c["results_written"] > 30_000 and all(x["reason"] == "no_src_addr" for x in rej)


@pytest.mark.slow
def test_bench_reports_parallel_bz2(tmp_path):
    pytest.importorskip("indexed_bzip2")
    from pingctl.ingest import bench

    f = tmp_path / "a.jsonl.bz2"
    f.write_bytes(bz2.compress(_varied(60)))
    r = bench.bench_ingest([f], [1], sagan=False, limit=None)
    cases = [row["case"] for row in r["table"]]
    assert cases[:3] == ["ingest -j 1", "decompress only", "decompress, indexed_bzip2 x1"]
    assert all(row["results"] == 60 for row in r["table"])
    assert "1" in r["decompress_indexed_bzip2_s"] and r["runs"][0]["records"] == 60


def test_parallel_bz2_not_for_pipes_or_other_data(tmp_path):
    pytest.importorskip("indexed_bzip2")
    import os
    import threading

    from pingctl.ingest.reader import open_parallel_bz2

    r, w = os.pipe()
    blob = bz2.compress(_varied(5))
    writer = threading.Thread(target=lambda: (os.write(w, blob), os.close(w)))
    writer.start()
    with os.fdopen(r, "rb") as pipe:
        assert open_parallel_bz2(Path("stdin.bz2"), pipe, 2) is None  # not seekable: bz2 module
        assert bz2.decompress(pipe.read()) == _varied(5)
    writer.join()
    for name, data in (("empty.bz2", b""), ("text.bz2", b"not bzip2 at all\n"), ("ok.bz2", blob)):
        f = tmp_path / name
        f.write_bytes(data)
        with open(f, "rb") as raw:
            reader = open_parallel_bz2(f, raw, 2)
            assert (reader is not None) == (name == "ok.bz2")
            if reader is not None:
                reader.close()
