"""Probe-row record layout, version 1 (documented in docs/rows.md).

One ArrayRecord record = one probe's measurements in time order, columnar, with
addresses already parsed to bytes, so the loader does no string parsing:

    b"PGR1" | u32 header_len | header JSON (utf-8), zero-padded to 8 bytes
    | time_s int64[n] | rtt_ms float64[n] | msm_id int64[n]
    | src_idx uint32[n] | dst_idx uint32[n] | size int32[n] | errors int32[n]
    | src_addr uint8[n_src,16] | src_v6 uint8[n_src] | pad to 8
    | dst_addr uint8[n_dst,16] | dst_v6 uint8[n_dst] | pad to 8

All little-endian (NumPy native on every platform we run on), every array 8-byte
aligned so decoding is zero-copy `np.frombuffer`. IPv4 addresses occupy the first 4
of their 16 bytes. The header holds n, n_src, n_dst, the probe key, prb_id and span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from pingctl.tokenizer import Measurements

MAGIC = b"PGR1"
VERSION = 1
BYTES_PER_MEASUREMENT = 8 + 8 + 8 + 4 + 4 + 4 + 4
_PER_ROW = (
    ("time_s", np.dtype("<i8")),
    ("rtt_ms", np.dtype("<f8")),
    ("msm_id", np.dtype("<i8")),
    ("src_idx", np.dtype("<u4")),
    ("dst_idx", np.dtype("<u4")),
    ("size", np.dtype("<i4")),
    ("errors", np.dtype("<i4")),
)


class RecordError(ValueError):
    """A record that is not a valid version-1 probe row."""


@dataclass
class ProbeRecord:
    probe: str  # "prb:<id>" or "src:<address>"
    prb_id: int | None
    time_s: np.ndarray
    rtt_ms: np.ndarray
    msm_id: np.ndarray
    src_idx: np.ndarray
    dst_idx: np.ndarray
    size: np.ndarray
    errors: np.ndarray
    src_addr: np.ndarray  # uint8[n_src, 16]
    src_v6: np.ndarray  # bool[n_src]
    dst_addr: np.ndarray  # uint8[n_dst, 16]
    dst_v6: np.ndarray  # bool[n_dst]
    part: int = 0  # index of this record within the probe's history (split by size)

    @property
    def n(self) -> int:
        return int(self.time_s.shape[0])


def address_key(addr, v6) -> bytes:
    """An address as a dict key: its 16 bytes (as the address tables hold them) and its family."""
    return bytes(np.asarray(addr, np.uint8)) + (b"\1" if v6 else b"\0")


def _pad8(n: int) -> int:
    return -n % 8


def encode(rec: ProbeRecord) -> bytes:
    n, n_src, n_dst = rec.n, len(rec.src_addr), len(rec.dst_addr)
    header = {
        "v": VERSION,
        "probe": rec.probe,
        "prb_id": rec.prb_id,
        "part": rec.part,
        "n": n,
        "n_src": n_src,
        "n_dst": n_dst,
        "t0": int(rec.time_s[0]) if n else None,
        "t1": int(rec.time_s[-1]) if n else None,
    }
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b"\0" * _pad8(8 + len(hb))
    parts = [MAGIC, np.uint32(len(hb)).tobytes(), hb]
    for name, dt in _PER_ROW:
        arr = np.ascontiguousarray(getattr(rec, name), dtype=dt)
        if arr.shape != (n,):
            raise RecordError(f"{name} has shape {arr.shape}, expected ({n},)")
        parts.append(arr.tobytes())
        parts.append(b"\0" * _pad8(arr.nbytes))
    for addr, v6, m in ((rec.src_addr, rec.src_v6, n_src), (rec.dst_addr, rec.dst_v6, n_dst)):
        a = np.ascontiguousarray(addr, dtype=np.uint8).reshape(m, 16)
        f = np.ascontiguousarray(v6, dtype=np.uint8)
        parts += [a.tobytes(), f.tobytes(), b"\0" * _pad8(m * 17)]
    return b"".join(parts)


def decode(buf: bytes) -> ProbeRecord:
    """Zero-copy view of a record; raises RecordError (never anything else) when malformed."""
    try:
        return _decode(memoryview(buf))
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here means a corrupt record
        raise RecordError(f"corrupt record: {type(e).__name__}: {e}") from None


def _decode(mv: memoryview) -> ProbeRecord:
    if len(mv) < 8 or bytes(mv[:4]) != MAGIC:
        raise RecordError("not a pingctl probe row (bad magic)")
    hlen = int(np.frombuffer(mv[4:8], "<u4")[0])
    if 8 + hlen > len(mv):
        raise RecordError("truncated header")
    header = json.loads(bytes(mv[8 : 8 + hlen]).rstrip(b"\0"))
    if header.get("v") != VERSION:
        raise RecordError(f"unsupported layout version {header.get('v')!r} (this pingctl reads {VERSION})")
    n, n_src, n_dst = int(header["n"]), int(header["n_src"]), int(header["n_dst"])
    pos = 8 + hlen
    cols = {}
    for name, dt in _PER_ROW:
        size = n * dt.itemsize
        if pos + size > len(mv):
            raise RecordError(f"truncated at column {name}")
        cols[name] = np.frombuffer(mv[pos : pos + size], dt)
        pos += size + _pad8(size)
    tables = []
    for m in (n_src, n_dst):
        end = pos + m * 17
        if end > len(mv):
            raise RecordError("truncated address table")
        addr = np.frombuffer(mv[pos : pos + m * 16], np.uint8).reshape(m, 16)
        v6 = np.frombuffer(mv[pos + m * 16 : end], np.uint8).astype(bool)
        tables.append((addr, v6))
        pos = end + _pad8(m * 17)
    if pos > len(mv):
        raise RecordError("truncated record")
    if pos < len(mv):
        raise RecordError(f"{len(mv) - pos} unexpected trailing bytes")
    if n and (cols["src_idx"].max() >= n_src or cols["dst_idx"].max() >= n_dst):
        raise RecordError("address index out of range")
    return ProbeRecord(
        probe=header["probe"],
        prb_id=header.get("prb_id"),
        part=int(header.get("part", 0)),
        src_addr=tables[0][0],
        src_v6=tables[0][1],
        dst_addr=tables[1][0],
        dst_v6=tables[1][1],
        **cols,
    )


def record_bytes(n: int, n_src: int, n_dst: int) -> int:
    """Approximate encoded size, used to cut long histories into records."""
    return 128 + n * BYTES_PER_MEASUREMENT + 17 * (n_src + n_dst) + 16


def to_measurements(rec: ProbeRecord, idx: np.ndarray | None = None, has_time: np.ndarray | bool = True):
    """The tokenizer's `Measurements` for rows `idx` of a record (all rows when None)."""
    sel = slice(None) if idx is None else idx
    src_i, dst_i = rec.src_idx[sel], rec.dst_idx[sel]
    n = len(src_i)
    return Measurements(
        src=rec.src_addr[src_i],
        src_v6=rec.src_v6[src_i],
        dst=rec.dst_addr[dst_i],
        dst_v6=rec.dst_v6[dst_i],
        rtt_ms=rec.rtt_ms[sel],
        time_s=rec.time_s[sel],
        has_time=np.broadcast_to(np.asarray(has_time, bool), (n,)).copy(),
        size=rec.size[sel].astype(np.int64),
        errors=rec.errors[sel].astype(np.int64),
        msm_id=rec.msm_id[sel],
    )
