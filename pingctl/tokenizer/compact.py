"""The `compact` scheme (default): 267 tokens, 16-bit RTT float, delta timestamps.

Blocks (canonical order): src, dst, result, time. A measurement without a timestamp simply
has an empty time block.
"""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import layout
from pingctl.tokenizer.measurements import MeasurementError, Measurements
from pingctl.tokenizer.rtt_codec import token_codes
from pingctl.tokenizer.vocab import COMPACT, C

BLOCKS = ("src", "dst", "result", "time")
SRC, DST, RESULT, TIME = range(4)
REQUIRED = (SRC, DST, RESULT)

# time kinds (also reported by the decoder)
NO_TIME, ABS, DELTA1, DELTA4 = 0, 1, 2, 3
TIME_KIND_NAMES = ("none", "abs", "delta1", "delta4")
TIME_LEN = np.array([0, 9, 2, 5])
TIME_ROLE = {ABS: C.TimestampAbs, DELTA1: C.TimestampDelta1, DELTA4: C.TimestampDelta4}


def time_kinds(m: Measurements, context_starts=None) -> tuple[np.ndarray, np.ndarray]:
    """(kind int8[n], delta int64[n]) for each measurement.

    The first timestamped measurement of each context is absolute; a later one carries its
    delta to the previous timestamped measurement of the same context: 1 byte up to 255 s,
    4 bytes below 2**32 s. A negative delta or one >= 2**32 s falls back to absolute
    (which also restarts the delta chain), so any input order encodes losslessly.
    """
    return time_kinds_of(m.time_s, m.has_time, context_starts)


def time_kinds_of(time_s: np.ndarray, has_time: np.ndarray, context_starts=None) -> tuple[np.ndarray, np.ndarray]:
    """`time_kinds` of the columns themselves (what `gather.encode_gathered` has, no `Measurements`)."""
    n = len(time_s)
    kind = np.zeros(n, np.int8)
    delta = np.zeros(n, np.int64)
    idx = np.flatnonzero(has_time)
    if idx.size == 0:
        return kind, delta
    t = time_s[idx]
    first = np.ones(idx.size, bool)
    ctx = layout.context_ids(n, context_starts)
    if ctx is not None:
        c = ctx[idx]
        first[1:] = c[1:] != c[:-1]
    else:
        first[1:] = False
    # Unsigned difference is the true difference whenever t1 >= t0 (no int64 overflow).
    du = t[1:].view(np.uint64) - t[:-1].view(np.uint64)
    ok = (t[1:] >= t[:-1]) & (du < 2**32)
    k = np.full(idx.size, ABS, np.int8)
    d = np.zeros(idx.size, np.int64)
    use = np.concatenate([[False], ok & ~first[1:]])
    d[use] = du[use[1:]].astype(np.int64)
    k[use] = np.where(d[use] <= 255, DELTA1, DELTA4)
    kind[idx] = k
    delta[idx] = d
    return kind, delta


def result_lengths(m: Measurements) -> np.ndarray:
    """Tokens of each measurement's result block: Failed, or RttStart and two code bytes."""
    return np.where(m.rtt_ms < 0, 1, 3)


def block_lengths(m: Measurements, kind: np.ndarray) -> np.ndarray:
    lengths = np.empty((len(m), 4), np.int64)
    lengths[:, SRC] = np.where(m.src_v6, 17, 5)
    lengths[:, DST] = np.where(m.dst_v6, 17, 5)
    lengths[:, RESULT] = result_lengths(m)
    lengths[:, TIME] = TIME_LEN[kind]
    return lengths


def measurement_lengths(m: Measurements, context_starts=None) -> np.ndarray:
    kind, _ = time_kinds(m, context_starts)
    return 1 + block_lengths(m, kind).sum(axis=1)


def encode(m: Measurements, rng=None, order=None, context_starts=None) -> layout.Encoded:
    if np.isnan(m.rtt_ms).any():
        raise MeasurementError("rtt_ms contains NaN; use -1.0 for a failed measurement")
    if (m.src_v6 != m.dst_v6).any():
        i = int(np.flatnonzero(m.src_v6 != m.dst_v6)[0])
        raise MeasurementError(f"measurement {i}: source and destination address families differ")
    kind, delta = time_kinds(m, context_starts)
    lengths = block_lengths(m, kind)
    n = len(m)
    order_arr = layout.field_order(n, BLOCKS, rng, order)
    tokens, offsets, starts = layout.place(lengths, order_arr, C.MeasurementStart)
    off = COMPACT.byte_offset
    w = layout.write

    for col, addr, v6, r4, r6 in (
        (SRC, m.src, m.src_v6, C.SrcIPv4, C.SrcIPv6),
        (DST, m.dst, m.dst_v6, C.DstIPv4, C.DstIPv6),
    ):
        w(tokens, starts[~v6, col], [r4], addr[~v6, :4], off)
        w(tokens, starts[v6, col], [r6], addr[v6], off)

    failed = m.rtt_ms < 0
    w(tokens, starts[failed, RESULT], [C.Failed])
    ok = ~failed
    codes = token_codes(m.rtt_ms[ok])  # clamped at the ceiling the grammar and the read-out share
    w(tokens, starts[ok, RESULT], [C.RttStart], layout.be_bytes(codes, ">u2"), off)

    for k, dtype in ((ABS, ">i8"), (DELTA1, ">u1"), (DELTA4, ">u4")):
        sel = kind == k
        values = m.time_s[sel] if k == ABS else delta[sel]
        w(tokens, starts[sel, TIME], [TIME_ROLE[k]], layout.be_bytes(values, dtype), off)
    return layout.Encoded("compact", tokens, offsets, order_arr)
