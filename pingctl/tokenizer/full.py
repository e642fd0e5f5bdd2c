"""The `full` scheme (the first seed design): 266 tokens, every seed column, all blocks required.

Lossless for addresses, RTT (IEEE float64 of the ms value), timestamp (int64 seconds) and
msm_id; size saturates to 0..65535 (uint16) and packet_error_count to 0..255 (uint8), the
widths of the seed design. Ignores has_time: a full measurement always has its timestamp.
"""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import layout
from pingctl.tokenizer.measurements import MeasurementError, Measurements
from pingctl.tokenizer.vocab import FULL, F

BLOCKS = ("src", "dst", "rtt", "size", "errors", "time", "msm_id")
SRC, DST, RTT, SIZE, ERRORS, TIME, MSM_ID = range(7)
REQUIRED = tuple(range(7))
SIZE_MAX = 0xFFFF
ERRORS_MAX = 0xFF
FIXED_LEN = {RTT: 9, SIZE: 3, ERRORS: 2, TIME: 9, MSM_ID: 9}


def measurement_lengths(m: Measurements, context_starts=None) -> np.ndarray:
    return 1 + np.where(m.src_v6, 18, 6) + np.where(m.dst_v6, 18, 6) + sum(FIXED_LEN.values())


def clamped(m: Measurements) -> dict[str, int]:
    """How many values the encoder saturates (size > 65535 or < 0, errors > 255 or < 0)."""
    return {
        "size": int(((m.size > SIZE_MAX) | (m.size < 0)).sum()),
        "errors": int(((m.errors > ERRORS_MAX) | (m.errors < 0)).sum()),
    }


def encode(m: Measurements, rng=None, order=None, context_starts=None) -> layout.Encoded:
    if (m.src_v6 != m.dst_v6).any():
        i = int(np.flatnonzero(m.src_v6 != m.dst_v6)[0])
        raise MeasurementError(f"measurement {i}: source and destination address families differ")
    n = len(m)
    lengths = np.empty((n, 7), np.int64)
    lengths[:, SRC] = np.where(m.src_v6, 18, 6)
    lengths[:, DST] = np.where(m.dst_v6, 18, 6)
    for b, k in FIXED_LEN.items():
        lengths[:, b] = k
    order_arr = layout.field_order(n, BLOCKS, rng, order)
    tokens, offsets, starts = layout.place(lengths, order_arr, F.MeasurementStart)
    off = FULL.byte_offset
    w = layout.write

    for col, addr, v6, role in ((SRC, m.src, m.src_v6, F.SrcIpStart), (DST, m.dst, m.dst_v6, F.DestIpStart)):
        w(tokens, starts[~v6, col], [role, F.Ipv4Start], addr[~v6, :4], off)
        w(tokens, starts[v6, col], [role, F.Ipv6Start], addr[v6], off)
    w(tokens, starts[:, RTT], [F.RttStart], layout.be_bytes(m.rtt_ms, ">f8"), off)
    w(tokens, starts[:, SIZE], [F.SizeStart], layout.be_bytes(np.clip(m.size, 0, SIZE_MAX), ">u2"), off)
    w(tokens, starts[:, ERRORS], [F.ErrorCountStart], layout.be_bytes(np.clip(m.errors, 0, ERRORS_MAX), ">u1"), off)
    w(tokens, starts[:, TIME], [F.TimestampStart], layout.be_bytes(m.time_s, ">i8"), off)
    w(tokens, starts[:, MSM_ID], [F.MsmIdStart], layout.be_bytes(m.msm_id, ">i8"), off)
    return layout.Encoded("full", tokens, offsets, order_arr)
