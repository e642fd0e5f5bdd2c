"""The compact encoder from per-record tables: the loader's path to `compact.encode`'s tokens.

A record (one probe's history, or one destination's) is encoded many times, in contexts of
a few hundred measurements each, with fresh block orders and timestamp modes every time. Of
a measurement's blocks only the time block depends on the context (which measurements are
timestamped, which comes before); the address blocks depend on an address-table entry and the
result block on the measurement alone. `BlockTables` holds those tokens once per record, so
encoding a batch of contexts is a gather: every measurement is five segments (its
MeasurementStart and its four blocks in its order) of one small source array, copied with a
single fancy index. Only the time blocks are computed per call.

`encode_gathered` gives exactly `compact.encode`'s tokens, offsets and orders for the same
measurements, orders and context starts (tested on random records); input `compact.encode`
refuses (a NaN RTT, families that differ within a measurement) marks the tables not `valid`,
and callers then encode through `compact.encode`, which says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pingctl.tokenizer.compact import ABS, DELTA1, DELTA4, TIME_LEN, TIME_ROLE, time_kinds_of
from pingctl.tokenizer.layout import TOKEN_DTYPE, Encoded
from pingctl.tokenizer.rtt_codec import token_codes
from pingctl.tokenizer.vocab import COMPACT, C

WIDTH = 17  # the longest address block: role + 16 bytes
_OFF = COMPACT.byte_offset
# A time block is read from a row of 9: its role, then the 8 big-endian bytes of an int64,
# of which a delta4 keeps the last 4 and a delta1 the last one. The role is written just
# before the bytes the kind keeps.
_ROLE_COL = np.zeros(4, np.int64)
_ROLE_COL[[ABS, DELTA1, DELTA4]] = [0, 7, 4]
_ROLE_TOKEN = np.zeros(4, TOKEN_DTYPE)
for _k, _role in TIME_ROLE.items():
    _ROLE_TOKEN[_k] = _role
_START = np.array([C.MeasurementStart], TOKEN_DTYPE)


@dataclass
class BlockTables:
    """The context-free compact blocks of one record's measurements, and the columns a context
    reads (views of the record's, not copies)."""

    addr: np.ndarray  # int32[n_src + n_dst, WIDTH]: source blocks, then destination blocks
    addr_len: np.ndarray  # int64[n_src + n_dst]: 5 (IPv4) or 17 (IPv6)
    n_src: int
    result: np.ndarray  # uint16[n, 3]: Failed, or RttStart and the two code bytes
    src_idx: np.ndarray
    dst_idx: np.ndarray
    time_s: np.ndarray
    valid: bool  # False: compact.encode refuses some measurement (NaN RTT, mixed families)

    @property
    def nbytes(self) -> int:
        return self.addr.nbytes + self.addr_len.nbytes + self.result.nbytes


def _address_blocks(addr: np.ndarray, v6: np.ndarray, role4: int, role6: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((len(addr), WIDTH), TOKEN_DTYPE)
    out[:, 0] = np.where(v6, role6, role4)
    out[:, 1:] = np.asarray(addr, np.uint8).astype(TOKEN_DTYPE) + _OFF  # an IPv4 block reads its first 4
    return out, np.where(v6, 17, 5).astype(np.int64)


def _one_family(src_v6: np.ndarray, dst_v6: np.ndarray, src_idx: np.ndarray, dst_idx: np.ndarray) -> bool:
    """Whether both addresses of every measurement are of one family (`compact.encode` refuses
    the others). Address tables of one family each (the usual record) answer without a pass
    over the measurements."""
    if len(src_idx) == 0:
        return True
    if src_v6.all() == src_v6.any() and dst_v6.all() == dst_v6.any():
        return bool(src_v6[0] == dst_v6[0])
    return bool(np.array_equal(src_v6[src_idx], dst_v6[dst_idx]))


def block_tables(src_addr: np.ndarray, src_v6: np.ndarray, dst_addr: np.ndarray, dst_v6: np.ndarray,
                 src_idx: np.ndarray, dst_idx: np.ndarray, rtt_ms: np.ndarray, time_s: np.ndarray) -> BlockTables:
    """Tables of a record given as its address tables (uint8[k, 16], v6 flags) and its
    per-measurement columns (indices into them, RTT in ms with -1 = failed, Unix seconds)."""
    src, src_len = _address_blocks(src_addr, src_v6, C.SrcIPv4, C.SrcIPv6)
    dst, dst_len = _address_blocks(dst_addr, dst_v6, C.DstIPv4, C.DstIPv6)
    rtt = np.asarray(rtt_ms, np.float64)
    result = np.empty((len(rtt), 3), np.uint16)
    result[:, 0] = np.where(rtt < 0, np.uint16(C.Failed), np.uint16(C.RttStart))
    codes = token_codes(rtt)  # the encoder's codes; a failed measurement's are never read
    result[:, 1] = (codes >> 8) + _OFF
    result[:, 2] = (codes & 0xFF) + _OFF
    valid = not np.isnan(rtt).any() and _one_family(np.asarray(src_v6, bool), np.asarray(dst_v6, bool), src_idx,
                                                    dst_idx)
    return BlockTables(np.concatenate([src, dst]), np.concatenate([src_len, dst_len]), len(src), result,
                       src_idx, dst_idx, time_s, valid)


def encode_gathered(tables: list[BlockTables], who: np.ndarray | None, where: np.ndarray, has_time: np.ndarray,
                    order: np.ndarray, context_starts) -> Encoded:
    """`compact.encode` of measurements gathered from records: measurement i is
    `tables[who[i]]`'s measurement `where[i]` (who None: all from `tables[0]`), timestamped
    where `has_time`, its blocks in `order[i]` (int8[n, 4], as `Encoded.order`), contexts
    starting at `context_starts` (as encode's)."""
    n = len(where)
    if who is None or len(tables) == 1:
        tab = tables[0]
        addr, addr_len = tab.addr, tab.addr_len
        src_row = tab.src_idx[where].astype(np.int64)
        dst_row = tab.dst_idx[where].astype(np.int64) + tab.n_src
        result = tab.result[where]
        t = tab.time_s[where]
    else:  # several records: their address tables stacked, each measurement's rows shifted
        # gathered record by record in `by` order (each record's measurements one slice), then
        # put back in stream order once per column, not once per record
        by = np.argsort(who, kind="stable")
        bounds = np.searchsorted(who[by], np.arange(len(tables) + 1)).tolist()
        pos = where[by]
        cols: list[list[np.ndarray]] = [[], [], [], []]
        base = 0
        for k, tab in enumerate(tables):
            p = pos[bounds[k] : bounds[k + 1]]
            cols[0].append(tab.src_idx[p] + base)
            cols[1].append(tab.dst_idx[p] + (base + tab.n_src))
            cols[2].append(tab.result[p])
            cols[3].append(tab.time_s[p])
            base += len(tab.addr)
        src_row, dst_row, t = (np.empty(n, np.int64) for _ in range(3))
        result = np.empty((n, 3), np.uint16)
        for out, col in zip((src_row, dst_row, result, t), cols):
            out[by] = np.concatenate(col)
        addr = np.concatenate([tab.addr for tab in tables])
        addr_len = np.concatenate([tab.addr_len for tab in tables])
    kind, delta = time_kinds_of(t, has_time, context_starts)
    # the source: address blocks | result blocks | time rows | MeasurementStart
    res_at = addr.size
    time_at = res_at + 3 * n
    times = np.empty((n, 9), TOKEN_DTYPE)
    times[:, 1:] = np.where(kind == ABS, t, delta).astype(">i8").view(np.uint8).reshape(n, 8)
    times[:, 1:] += _OFF
    col = _ROLE_COL[kind]
    times[np.arange(n), col] = _ROLE_TOKEN[kind]
    source = np.concatenate([addr.ravel(), result.ravel(), times.ravel(), _START])
    # per measurement, five segments: MeasurementStart, then its blocks in its order
    ii = np.arange(n)
    start = np.empty((n, 5), np.int64)
    length = np.empty((n, 5), np.int64)
    start[:, 0] = len(source) - 1
    length[:, 0] = 1
    by_block = np.stack([src_row * WIDTH, dst_row * WIDTH, res_at + 3 * ii, time_at + 9 * ii + col], axis=1)
    lens = np.stack([addr_len[src_row], addr_len[dst_row], 3 - 2 * (result[:, 0] == C.Failed), TIME_LEN[kind]],
                    axis=1)
    pick = order + 4 * ii[:, None]
    start[:, 1:] = by_block.ravel()[pick]
    length[:, 1:] = lens.ravel()[pick]
    seg_len = length.ravel()
    ends = np.cumsum(seg_len)
    # token j of a segment starting at s in the stream and at a in the source is source[a + j]
    shift = np.repeat(start.ravel() - (ends - seg_len), seg_len)
    tokens = source[np.arange(len(shift)) + shift]
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = ends[4::5]
    return Encoded("compact", tokens.astype(TOKEN_DTYPE, copy=False), offsets, order)
