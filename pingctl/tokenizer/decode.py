"""Decoding of arbitrary token streams: never raises, reports malformed spans, resynchronises.

The stream is cut at every `MeasurementStart`; all segments are parsed in lock-step, one
block per step for every segment at once (k + 1 steps for k block kinds), so the cost is a
handful of array passes over the stream however many measurements it holds.

A segment with any error is not decoded; its first error is reported with the segment's
token span. Timestamps: the delta reference is the last timestamp block the decoder *read*
(in stream order, including blocks read before the error of a rejected measurement), so
one bad measurement does not shift the times of the good ones after it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from pingctl.tokenizer import compact, full
from pingctl.tokenizer.layout import from_be_bytes
from pingctl.schema.columns import FAILED_RTT
from pingctl.tokenizer.measurements import Measurements
from pingctl.tokenizer.rtt_codec import POSSIBLE_FIRST_BYTES, decode_rtt
from pingctl.tokenizer.spec import IPV6, SchemeSpec, get_spec

ERROR_KINDS = {
    "stray_tokens": "tokens before the first MeasurementStart",
    "invalid_token": "an id outside the vocabulary",
    "unexpected_token": "a token that cannot start a field at this point",
    "bad_family": "SrcIpStart/DestIpStart not followed by Ipv4Start/Ipv6Start (full scheme)",
    "truncated": "a field cut short by the next MeasurementStart or the end of the stream",
    "non_byte_in_field": "a non-byte token where a field's byte was expected",
    "duplicate_field": "a field that already appeared in this measurement",
    "missing_field": "a required field is absent",
    "family_mismatch": "source and destination address families differ",
    "delta_without_reference": "a timestamp delta before any absolute timestamp in the context",
    "trailing_tokens": "tokens after the last field of a measurement",
    "impossible_rtt": "an RTT first byte no token stream carries (a code above the ceiling or not canonical)",
}
_KIND = list(ERROR_KINDS)
_CODE = {k: i + 1 for i, k in enumerate(_KIND)}  # 0 = no error


@dataclass
class DecodeError:
    start: int  # token span [start, end) of the rejected measurement (or stray run)
    end: int
    pos: int  # the offending token
    kind: str
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Decoded:
    scheme: str
    measurements: Measurements
    spans: np.ndarray  # int64[n, 2] token span of each decoded measurement
    time_kind: np.ndarray  # int8[n]: compact 0 none / 1 abs / 2 delta1 / 3 delta4; full always 1
    blocks: np.ndarray  # int64[n, k] position of each block's first token, -1 if absent
    errors: list[DecodeError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def __len__(self) -> int:
        return len(self.measurements)


def as_ids(tokens) -> np.ndarray:
    """int32/int64 ids; anything that is not an integer in int64 range becomes -1 (invalid)."""
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iub":
        if arr.dtype in (np.int32, np.int64):
            return arr  # the encoder's own dtype: no copy of a large stream
        if arr.dtype == np.uint64:
            return arr.astype(np.int64)  # values >= 2**63 wrap negative: invalid ids, as they should be
        return arr.astype(np.int64)
    if arr is not None and arr.ndim > 1:
        raise ValueError(f"decode takes one 1-D token stream, got shape {arr.shape}")
    out = []
    for t in tokens:
        ok = isinstance(t, (int, np.integer)) and not isinstance(t, bool) and -(2**63) <= int(t) < 2**63
        out.append(int(t) if ok else -1)
    return np.array(out, np.int64)


def _payload(u8: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """uint8[m, width] of the bytes at start..start+width (rows of a strided view: one copy)."""
    if len(u8) < width:
        return np.zeros((0, width), np.uint8)
    return np.lib.stride_tricks.sliding_window_view(u8, width)[start]


@dataclass
class _Stream:
    """The token stream as the parser reads it, and where its measurements start and end."""

    tok: np.ndarray  # the ids as given
    tc: np.ndarray  # int32 ids, V where the id is invalid
    valid: np.ndarray  # bool: inside the vocabulary
    nonbyte_cum: np.ndarray  # non-byte tokens before each position (for "a non-byte in this field?")
    u8: np.ndarray  # byte values wherever a byte token stands
    ms: np.ndarray  # positions of MeasurementStart
    seg_end: np.ndarray  # int64: where each measurement's segment ends


def _read_stream(tok: np.ndarray, spec: SchemeSpec) -> _Stream:
    V, off, L = spec.vocab.size, spec.vocab.byte_offset, len(tok)
    valid = tok.view(np.uint32 if tok.dtype == np.int32 else np.uint64) < V  # negatives wrap to huge values
    tc = np.where(valid, tok, V).astype(np.int32, copy=False)  # ids with V as the invalid sentinel
    # int32 throughout: these stream-wide arrays dominate the memory traffic.
    cum_t = np.int32 if L < 2**31 - 1 else np.int64
    nonbyte_cum = np.zeros(L + 1, cum_t)
    np.cumsum(((tc < off) | (tc == V)).astype(cum_t), out=nonbyte_cum[1:])
    u8 = (tc - off).astype(np.uint8)
    ms = np.flatnonzero(tok == 0)
    seg_end = np.append(ms[1:], L).astype(np.int64)
    return _Stream(tok, tc, valid, nonbyte_cum, u8, ms, seg_end)


@dataclass
class _Parse:
    """Every segment's parse so far: where it reads next, its first error, the blocks it read."""

    cur: np.ndarray  # next position to read
    err: np.ndarray  # int8 error code, 0 = none yet
    epos: np.ndarray
    eblock: np.ndarray
    bpos: np.ndarray  # int64[ns, k]: position of each block's first token, -1 if not read
    bvar: np.ndarray  # int8[ns, k]: the block's variant (address family, timestamp kind, ...)
    bhdr: np.ndarray  # int64[ns, k]: header tokens before the block's payload
    cut_hdr: np.ndarray  # a timestamp header whose field broke after it, -1 if none
    cut_var: np.ndarray

    @classmethod
    def start(cls, ms: np.ndarray, k: int) -> "_Parse":
        ns = ms.size
        return cls(ms + 1, np.zeros(ns, np.int8), np.zeros(ns, np.int64), np.zeros(ns, np.int64),
                   np.full((ns, k), -1, np.int64), np.zeros((ns, k), np.int8), np.ones((ns, k), np.int64),
                   np.full(ns, -1, np.int64), np.zeros(ns, np.int8))

    @property
    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Flat views: 1-D fancy indexing is much cheaper than (row, column) pairs.
        return self.bpos.reshape(-1), self.bvar.reshape(-1), self.bhdr.reshape(-1)


def decode(tokens, scheme: str = "compact") -> Decoded:
    spec = get_spec(scheme)
    tok = as_ids(tokens)
    s = _read_stream(tok, spec)
    errors: list[DecodeError] = []
    first = int(s.ms[0]) if s.ms.size else len(tok)
    if first > 0:
        errors.append(DecodeError(0, first, 0, "stray_tokens", f"{first} token(s) before the first MeasurementStart"))
    k = len(spec.blocks)
    p = _Parse.start(s.ms, k)
    for _ in range(k + 1):
        if not _read_blocks(spec, s, p):
            break
    left = (p.err == 0) & (p.cur < s.seg_end)
    p.err[left], p.epos[left] = _CODE["trailing_tokens"], p.cur[left]
    time_s, has_time = _timestamps(spec, s, p)
    _check_required(spec, s, p)
    errors += _errors(spec, s, p)
    errors.sort(key=lambda e: e.start)
    good = np.flatnonzero(p.err == 0)
    m = _values(spec, s.u8, p.bpos[good], p.bvar[good], p.bhdr[good], time_s[good], has_time[good])
    tk = p.bvar[good, spec.time] if scheme == "compact" else np.ones(len(good), np.int8)
    tk = np.where(has_time[good], tk, 0).astype(np.int8)
    spans = np.stack([s.ms[good], s.seg_end[good]], axis=1) if good.size else np.zeros((0, 2), np.int64)
    return Decoded(scheme, m, spans.astype(np.int64), tk, p.bpos[good], errors)


def _read_blocks(spec: SchemeSpec, s: _Stream, p: _Parse) -> bool:
    """Read the next block of every segment still being read, all at once: record it, or the
    segment's first error. False when no segment is left to read."""
    a = np.flatnonzero((p.err == 0) & (p.cur < s.seg_end))
    if a.size == 0:
        return False
    bpos_f, bvar_f, bhdr_f = p.flat
    c, end = p.cur[a], s.seg_end[a]
    t = s.tc[c]
    blk = spec.role_block[t]
    plen = spec.role_payload[t]
    var = spec.role_variant[t]
    hdr = np.ones(a.size, np.int64)
    code = np.zeros(a.size, np.int8)
    code[blk < 0] = np.where(s.valid[c[blk < 0]], _CODE["unexpected_token"], _CODE["invalid_token"])
    pos = c.copy()
    # Checks run in token order, so each segment's error is where the grammar rejects it.
    row = a * len(spec.blocks)
    slot = row + np.maximum(blk, 0)
    code[(code == 0) & (bpos_f[slot] >= 0)] = _CODE["duplicate_field"]
    fam = (code == 0) & (plen == -2)
    if fam.any():
        plen, var = _read_family(spec, s, c, end, fam, code, pos, hdr, plen, var)
    is_ip = (blk == spec.src) | (blk == spec.dst)
    other = row + np.where(blk == spec.src, spec.dst, spec.src)
    clash = (code == 0) & is_ip & (bpos_f[other] >= 0) & (bvar_f[other] != var)
    code[clash] = _CODE["family_mismatch"]
    pos[clash] = c[clash] + hdr[clash] - 1
    pstart = c + hdr
    bend = pstart + np.maximum(plen, 0)
    _check_payload(spec, s, blk, plen, pstart, bend, end, code, pos)
    live = code == 0
    if live.all():
        bpos_f[slot], bvar_f[slot], bhdr_f[slot], p.cur[a] = c, var, hdr, bend
        return True
    sl = slot[live]
    bpos_f[sl], bvar_f[sl], bhdr_f[sl] = c[live], var[live], hdr[live]
    p.cur[a[live]] = bend[live]
    b = a[~live]
    p.err[b], p.epos[b], p.eblock[b] = code[~live], pos[~live], np.maximum(blk[~live], 0)
    # A timestamp block broken after its header: the grammar judges the header (delta
    # without reference?) before the bytes, so keep it for that check.
    cut_time = ~live & (blk == spec.time) & np.isin(code, (_CODE["truncated"], _CODE["non_byte_in_field"]))
    p.cut_hdr[a[cut_time]], p.cut_var[a[cut_time]] = c[cut_time], var[cut_time]
    return True


def _read_family(spec: SchemeSpec, s: _Stream, c, end, fam, code, pos, hdr, plen, var):
    """The full scheme's address fields: the family token after SrcIpStart/DestIpStart sets the
    payload's width and variant. Returns new (plen, var); marks errors in code/pos."""
    V, L = spec.vocab.size, len(s.tc)
    c2 = c[fam] + 1
    inside = c2 < end[fam]
    ft = np.where(inside, s.tc[np.minimum(c2, L - 1)], V)
    fp = spec.family_payload[ft]
    code[fam] = np.where(~inside, _CODE["truncated"], np.where(fp < 0, _CODE["bad_family"], 0))
    pos[fam] = np.where(inside & (fp < 0), c2, c[fam])
    plen = plen.copy()
    var = var.copy()
    plen[fam] = fp
    var[fam] = spec.family_variant[ft]
    hdr[fam] = 2
    return plen, var


def _check_payload(spec: SchemeSpec, s: _Stream, blk, plen, pstart, bend, end, code, pos) -> None:
    """A field's payload: an RTT's first byte the codec can produce (compact), bytes only, and
    not cut short by the segment's end."""
    V, off, L = spec.vocab.size, spec.vocab.byte_offset, len(s.tc)
    if spec.scheme == "compact":
        # the grammar judges the RTT's first byte before any later byte of the field
        rb = (code == 0) & (blk == compact.RESULT) & (plen == 2) & (pstart < end)
        t1 = s.tc[np.minimum(pstart, L - 1)]
        bad = rb & (t1 >= off) & (t1 < V) & ~POSSIBLE_FIRST_BYTES[np.clip(t1 - off, 0, 255)]
        code[bad], pos[bad] = _CODE["impossible_rtt"], pstart[bad]
    nonbyte_cum = s.nonbyte_cum
    nb = (code == 0) & (nonbyte_cum[np.minimum(bend, end)] > nonbyte_cum[np.minimum(pstart, end)])
    if nb.any():
        code[nb] = _CODE["non_byte_in_field"]
        pos[nb] = np.searchsorted(nonbyte_cum, nonbyte_cum[pstart[nb]] + 1) - 1
    code[(code == 0) & (bend > end)] = _CODE["truncated"]


def _timestamps(spec: SchemeSpec, s: _Stream, p: _Parse) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's time in seconds and whether it has one; compact deltas count from the
    last timestamp read (rejecting a delta with none before it)."""
    time_s = np.zeros(s.ms.size, np.int64)
    tpos, tvar = p.bpos[:, spec.time], p.bvar[:, spec.time]
    has_time = tpos >= 0
    if spec.scheme == "compact":
        _time_chain(s.u8, tpos, tvar, time_s, p.err, p.epos, p.eblock)
        _orphan_headers(tpos, tvar, p.cut_hdr, p.cut_var, p.err, p.epos, p.eblock)
    else:
        time_s[has_time] = from_be_bytes(_payload(s.u8, tpos[has_time] + 1, 8), ">i8")
    return time_s, has_time


def _check_required(spec: SchemeSpec, s: _Stream, p: _Parse) -> None:
    req = np.array(spec.required)
    missing = (p.err == 0) & (p.bpos[:, req] < 0).any(axis=1)
    if missing.any():
        p.err[missing] = _CODE["missing_field"]
        p.epos[missing] = s.seg_end[missing] - 1
        p.eblock[missing] = req[np.argmax(p.bpos[missing][:, req] < 0, axis=1)]


def _errors(spec: SchemeSpec, s: _Stream, p: _Parse) -> list[DecodeError]:
    out = []
    for i in np.flatnonzero(p.err != 0):
        kind = _KIND[p.err[i] - 1]
        out.append(DecodeError(int(s.ms[i]), int(s.seg_end[i]), int(p.epos[i]), kind,
                               _message(spec, s.tok, kind, int(p.epos[i]), int(p.eblock[i]))))
    return out


def _time_chain(u8, tpos, tvar, time_s, err, epos, eblock) -> None:
    ev = np.flatnonzero(tpos >= 0)
    if ev.size == 0:
        return
    kind = tvar[ev]
    p = tpos[ev] + 1
    value = np.zeros(ev.size, np.int64)
    for kk, width, dtype in ((compact.ABS, 8, ">i8"), (compact.DELTA1, 1, ">u1"), (compact.DELTA4, 4, ">u4")):
        sel = kind == kk
        if sel.any():
            value[sel] = from_be_bytes(_payload(u8, p[sel], width), dtype).astype(np.int64)
    is_abs = kind == compact.ABS
    grp = np.cumsum(is_abs)
    no_ref = ~is_abs & (grp == 0)
    # The timestamp block was read, so any error already recorded lies after it: the orphan
    # delta is the segment's first error (where the grammar would have stopped).
    orphan = ev[no_ref]
    err[orphan] = _CODE["delta_without_reference"]
    epos[orphan] = tpos[orphan]
    eblock[orphan] = compact.TIME
    step = np.where(is_abs, 0, value)
    cs = np.cumsum(step)
    anchors = np.flatnonzero(is_abs)
    has_ref = grp > 0
    a = anchors[grp[has_ref] - 1]
    # Deliberately wrapping int64 arithmetic: garbage streams must not raise.
    with np.errstate(over="ignore"):
        time_s[ev[has_ref]] = value[a] + (cs[has_ref] - cs[a])


def _orphan_headers(tpos, tvar, cut_hdr, cut_var, err, epos, eblock) -> None:
    """Delta headers of broken timestamp fields with no absolute timestamp read before them."""
    broken = np.flatnonzero((cut_hdr >= 0) & (cut_var != compact.ABS))
    if broken.size == 0:
        return
    abs_before = np.cumsum((tpos >= 0) & (tvar == compact.ABS)) - ((tpos >= 0) & (tvar == compact.ABS))
    orphan = broken[abs_before[broken] == 0]
    err[orphan] = _CODE["delta_without_reference"]
    epos[orphan] = cut_hdr[orphan]
    eblock[orphan] = compact.TIME


def _values(spec: SchemeSpec, u8, bpos, bvar, bhdr, time_s, has_time) -> Measurements:
    n = len(bpos)
    m = Measurements.empty(n)
    for col, addr, v6 in ((spec.src, m.src, m.src_v6), (spec.dst, m.dst, m.dst_v6)):
        is6 = bvar[:, col] == IPV6
        v6[:] = is6
        start = bpos[:, col] + bhdr[:, col]
        addr[~is6, :4] = _payload(u8, start[~is6], 4)
        addr[is6] = _payload(u8, start[is6], 16)
    m.time_s = np.where(has_time, time_s, 0)
    m.has_time = has_time.copy()
    if spec.scheme == "compact":
        r = bpos[:, compact.RESULT]
        ok = bvar[:, compact.RESULT] == 0
        m.rtt_ms[:] = FAILED_RTT
        m.rtt_ms[ok] = decode_rtt(from_be_bytes(_payload(u8, r[ok] + 1, 2), ">u2"))
        return m
    for col, width, dtype, name in (
        (full.RTT, 8, ">f8", "rtt_ms"), (full.SIZE, 2, ">u2", "size"), (full.ERRORS, 1, ">u1", "errors"),
        (full.MSM_ID, 8, ">i8", "msm_id"),
    ):
        vals = from_be_bytes(_payload(u8, bpos[:, col] + 1, width), dtype)
        setattr(m, name, vals.astype(getattr(m, name).dtype))
    return m


def _message(spec: SchemeSpec, tok, kind: str, pos: int, block: int) -> str:
    v = spec.vocab
    name = v.name(int(tok[pos])) if 0 <= pos < len(tok) else "end of stream"
    field_name = spec.blocks[block]
    if kind == "invalid_token":
        return f"id {int(tok[pos])} at {pos} is outside the {spec.scheme} vocabulary (0..{v.size - 1})"
    if kind == "unexpected_token":
        return f"{name} at {pos} cannot start a field"
    if kind == "bad_family":
        return f"{name} at {pos}: an address field needs Ipv4Start or Ipv6Start here"
    if kind == "truncated":
        return f"{field_name} field starting at {pos} ({name}) is cut short"
    if kind == "non_byte_in_field":
        return f"{name} at {pos} inside a field where a byte was expected"
    if kind == "duplicate_field":
        return f"second {field_name} field at {pos} ({name})"
    if kind == "missing_field":
        return f"measurement has no {field_name} field"
    if kind == "family_mismatch":
        return f"source and destination address families differ (at {pos})"
    if kind == "impossible_rtt":
        return f"{name} at {pos}: no RTT code up to the ceiling starts with this byte"
    if kind == "delta_without_reference":
        return f"{name} at {pos} has no earlier absolute timestamp to count from"
    return f"{ERROR_KINDS.get(kind, kind)} (at {pos})"
