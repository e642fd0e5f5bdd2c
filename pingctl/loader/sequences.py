"""Training contexts from one probe record, packed into full rows of `seq_len` tokens.

Per context: a multi-scale window (length log-uniform in [1, n]) at a random start; a
timestamp mode (full / partial / none); when the window holds more than the row's
remaining room, an even subsample in time; a fresh field order per measurement.
Contexts are appended until a row has less room than the shortest measurement, so
padding is a few tokens per row at most.

Cost model: a record is read and decoded once per process (`record_cache`) and yields
many rows. Choosing contexts is a short loop over contexts (never over measurements); most
take their lengths from the record's prefix sums (`RecordLengths`) with no array call beyond
their draws, the rest take the general path (`_fit`), which gives the same contexts from the
same draws. Then one encode covers every context of every row: a gather from the record's
`BlockTables` (the tokens of its address and result blocks, kept with it in the record
cache), `encode`'s tokens exactly; the encoder's offsets are checked against the lengths
used for packing, and each row is a slice of the token stream.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pingctl.context import first_k_per_key
from pingctl.records.layout import ProbeRecord, to_measurements
from pingctl.tokenizer import Encoded, Measurements, blocks, encode
from pingctl.tokenizer.compact import ABS, DELTA1, DELTA4, TIME_LEN
from pingctl.tokenizer.gather import BlockTables, block_tables, encode_gathered
from pingctl.tokenizer.layout import field_order, permutations

FULL, PARTIAL, NONE = 0, 1, 2
MODES = ("full", "partial", "none")
MAX_CONTEXTS_PER_ROW = 64
FILL_RETRIES = 4  # fresh windows tried when the next context's first measurement does not fit
# compact: MeasurementStart + Src(1+4|16) + Dst(1+4|16) + RttStart+2 | Failed
_FULL_V4, _FULL_V6 = 45, 69  # the full scheme always carries every block
RTT_BLOCK = {"compact": "result", "full": "rtt"}
_ABS_LEN, _DELTA1_LEN, _DELTA4_LEN = (int(TIME_LEN[k]) for k in (ABS, DELTA1, DELTA4))


@dataclass(frozen=True)
class Shaping:
    """Optional reshaping of contexts toward the held-out-pair question (docs/loader.md).

    result_last: share of measurements whose RTT-carrying block is placed last (the others
    keep a uniform order), so more RTT targets are predicted from both addresses.
    max_per_pair: at most this many measurements of one (src, dst) pair per context, the
    earliest in time (0 = no cap); fewer RTTs can be copied from the same pair's packets.
    pair_share, pair_k: the share of contexts that are instead one pair's history, its last
    `pair_k` measurements before a query of it and the query (the pair's own packets, which
    max_per_pair would otherwise keep from a context): what eval's `pair` prompts hold.
    """

    result_last: float = 0.0
    max_per_pair: int = 0
    pair_share: float = 0.0
    pair_k: int = 16


NO_SHAPING = Shaping()


@dataclass
class PackedSequences:
    tokens: np.ndarray  # int32[R, seq_len], 0-padded
    segment: np.ndarray  # int32[R, seq_len], 1..k per context, 0 = padding
    position: np.ndarray  # int32[R, seq_len], restarts at 0 per context
    modes: np.ndarray  # int32[R, 3]: contexts per timestamp mode in each row
    measurements: np.ndarray  # int32[R]


def min_measurement_tokens(scheme: str) -> int:
    """The shortest measurement (IPv4, failed, no timestamp): below this, a row is full."""
    return 12 if scheme == "compact" else _FULL_V4


def base_lengths(rec: ProbeRecord, scheme: str) -> np.ndarray:
    """Tokens per measurement without its timestamp block."""
    # per address-table entry, then one gather per measurement (the tables are short)
    if scheme == "full":
        return np.where(rec.src_v6, _FULL_V6, _FULL_V4).take(rec.src_idx)
    src = np.where(rec.src_v6, 18, 6)  # MeasurementStart + SrcIPv4|6 + 4|16 bytes
    return src.take(rec.src_idx) + np.where(rec.dst_v6, 17, 5).take(rec.dst_idx) + np.where(rec.rtt_ms < 0, 1, 3)


def time_lengths(t: np.ndarray, has_time: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
    """Compact timestamp tokens of contexts in their final order (the tokenizer's rule: a
    context's first timestamp absolute, later ones delta1/delta4 to the previous timestamped
    one, absolute again when the delta is negative or >= 2**32). `context`: the context of
    each measurement, grouped (None: one context)."""
    out = np.zeros(len(t), np.int64)
    idx = np.flatnonzero(has_time)
    if idx.size == 0:
        return out
    tt = t[idx]
    d = tt[1:] - tt[:-1]
    lens = np.empty(idx.size, np.int64)
    lens[0] = _ABS_LEN
    lens[1:] = np.where((d >= 0) & (d < 2**32), np.where(d <= 255, _DELTA1_LEN, _DELTA4_LEN), _ABS_LEN)
    if context is not None:
        c = context[idx]
        lens[1:][c[1:] != c[:-1]] = _ABS_LEN
    out[idx] = lens
    return out


def _window(n: int, rng: np.random.Generator, log_n1: float | None = None) -> tuple[int, int]:
    """A window's start and length (log-uniform in 1..n). `log_n1`: np.log(n + 1), when the
    caller keeps it; `log_n1 * rng.random()` is the draw `rng.uniform(0.0, log_n1)` makes
    (low + (high - low) * one double), without its argument handling."""
    if log_n1 is None:
        log_n1 = float(np.log(n + 1))
    length = int(np.exp(log_n1 * rng.random()))
    length = min(max(length, 1), n)
    return int(rng.integers(0, n - length + 1)), length


def _linspace(a, b, k: int) -> np.ndarray:
    """`np.linspace(a, b, k)` of two integers, k >= 2: the same arithmetic (float64 delta,
    step = delta / (k - 1), arange * step + a, the last set to b), without its generality."""
    delta = float(b) - float(a)
    y = np.arange(k, dtype=np.float64)
    step = delta / (k - 1)
    if step == 0:  # linspace's order of operations for a zero step
        y /= k - 1
        y *= delta
    else:
        y *= step
    y += float(a)
    y[-1] = float(b)
    return y


def _even_in_time(t: np.ndarray, k: int) -> np.ndarray:
    """k positions into sorted times `t`, spread evenly over the time span."""
    if k >= len(t):
        return np.arange(len(t))
    grid = _linspace(t[0], t[-1], k) if k >= 2 else np.linspace(t[0], t[-1], k)
    idx = np.minimum(np.searchsorted(t, grid, side="left"), len(t) - 1)  # >= 0 already: the clip's upper half
    idx = idx[np.concatenate([[True], idx[1:] != idx[:-1]])]  # sorted: unique without a sort
    if len(idx) < k:  # bursts at one timestamp collapse: top up evenly by rank
        free = np.ones(len(t), bool)
        free[idx] = False
        rest = np.flatnonzero(free)
        m = k - len(idx)
        at = (_linspace(0, len(rest) - 1, m) if m >= 2 else np.linspace(0, len(rest) - 1, m)).astype(np.int64)
        # m <= len(rest), so the steps are >= 1 and the picks distinct, and none is in idx: the
        # union is a sort
        idx = np.sort(np.concatenate([idx, rest[at]]))
    return idx


def arrange(idx: np.ndarray, mode: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Order and timestamp flags of a time-ordered context for its mode."""
    n = len(idx)
    if mode == FULL:
        return idx, np.ones(n, bool)
    if mode == NONE:
        return idx[rng.permutation(n)], np.zeros(n, bool)
    timed = rng.random(n) < rng.uniform(0.2, 0.8)
    if not timed.any():
        timed[rng.integers(n)] = True
    # Timed measurements keep temporal order; the others take random slots among them.
    slot_untimed = np.zeros(n, bool)
    slot_untimed[rng.choice(n, size=n - int(timed.sum()), replace=False)] = True
    order = np.empty(n, np.int64)
    order[~slot_untimed] = np.flatnonzero(timed)
    order[slot_untimed] = rng.permutation(np.flatnonzero(~timed))
    return idx[order], slot_untimed == False  # noqa: E712 - elementwise


@dataclass
class Plan:
    """Which measurements form each context, and where each context goes."""

    idx: list[np.ndarray]  # record positions per context, in context order
    has_time: list[np.ndarray]
    length: list[int]  # tokens per context
    row: list[int]  # row of each context
    modes: np.ndarray  # int32[R, 3]


def pack_sequences(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    shaping: Shaping = NO_SHAPING, lengths: RecordLengths | None = None,
) -> PackedSequences:
    """`n_rows` rows of `seq_len` tokens, each packed with contexts from `rec` (`lengths`: its
    RecordLengths, when a cache holds them)."""
    if lengths is None:
        lengths = RecordLengths(rec, scheme)
    plan = choose_contexts(rec, rng, n_rows, seq_len, mode_p, scheme, shaping.max_per_pair, shaping.pair_share,
                           shaping.pair_k, lengths=lengths)
    return pack(plan, tokenize(rec, rng, plan, scheme, shaping.result_last, lengths), n_rows, seq_len)


def _first_per_pair(rec: ProbeRecord, idx: np.ndarray, k: int) -> np.ndarray:
    """The first `k` positions of each (src, dst) pair among time-ordered positions `idx`."""
    key = (rec.src_idx[idx].astype(np.int64) << 32) | rec.dst_idx[idx].astype(np.int64)
    return idx[first_k_per_key(key, k)]


def pair_history(rec: ProbeRecord, rng: np.random.Generator, k: int) -> np.ndarray:
    """Time-ordered record positions of one pair-history context: a random query's pair, its last
    `k` measurements before the query, then the query."""
    q = int(rng.integers(rec.n))
    same = np.flatnonzero((rec.src_idx[: q + 1] == rec.src_idx[q]) & (rec.dst_idx[: q + 1] == rec.dst_idx[q]))
    return same[-(k + 1):]


class RecordLengths:
    """Token arithmetic of one record, computed once per record (`record_cache` keeps it with
    the record): tokens per measurement without timestamps, and prefix sums from which any
    contiguous window's length, and the longest prefix of it that fits, come in O(1) instead
    of a pass over the window; and (compact) the record's `BlockTables`, the tokens of the
    blocks no context changes, from which its contexts are encoded by a gather.

    `h[i]` = tokens of the first i measurements without timestamps + the delta timestamp tokens
    between consecutive ones among them (what the *full* mode adds after the first, absolute
    timestamp), so a full-mode window [s, s + j) takes h[s + j] - h[s] - into(s) + abs_len."""

    def __init__(self, rec: ProbeRecord, scheme: str, prefix: bool = True):
        self.base = base_lengths(rec, scheme)
        self.compact = scheme == "compact"
        self.memo: dict = {}  # what other modules derive once per record (triangulation's address keys)
        self.tables: BlockTables | None = block_tables(
            rec.src_addr, rec.src_v6, rec.dst_addr, rec.dst_v6, rec.src_idx, rec.dst_idx, rec.rtt_ms,
            rec.time_s) if self.compact else None
        self.abs_len = int(TIME_LEN[ABS]) if self.compact else 0
        if not prefix:  # a destination record: its contexts are not windows, `base` is all they read
            self.cum = self.deltas = self.h = np.zeros(0, np.int64)
            return
        self.cum = np.concatenate([[0], np.cumsum(self.base)])
        deltas = np.zeros(len(self.cum), np.int64)
        if self.compact and rec.n > 1:
            d = np.diff(rec.time_s)
            lens = np.where((d >= 0) & (d < 2**32), np.where(d <= 255, TIME_LEN[DELTA1], TIME_LEN[DELTA4]),
                            TIME_LEN[ABS])
            np.cumsum(lens, out=deltas[2:])
        self.deltas = deltas  # deltas[i]: delta tokens among the first i measurements
        self.h = self.cum + deltas

    @property
    def nbytes(self) -> int:
        tables = 0 if self.tables is None else self.tables.nbytes
        return self.base.nbytes + self.cum.nbytes + self.deltas.nbytes + self.h.nbytes + tables

    def window(self, start: int, length: int) -> int:
        """Tokens of positions [start, start + length) without timestamps."""
        return int(self.cum[start + length] - self.cum[start])

    def full_prefix(self, start: int, length: int, room: int) -> tuple[int, int]:
        """(measurements, tokens) of the longest prefix of the full-mode window that fits `room`."""
        into = int(self.deltas[start + 1] - self.deltas[start])  # the delta into `start`, not in the window
        off = int(self.h[start]) + into - self.abs_len
        keep = int(np.searchsorted(self.h[start + 1 : start + length + 1], room + off, side="right"))
        return keep, (int(self.h[start + keep]) - off if keep else 0)


def mode_cdf(mode_p: np.ndarray) -> np.ndarray:
    """Cumulative mode weights, normalised as `Generator.choice` normalises them."""
    cdf = np.cumsum(mode_p)
    return cdf / cdf[-1]


def draw_mode(cdf: list[float], rng: np.random.Generator) -> int:
    """`rng.choice(3, p=mode_p)` with the same draw (one uniform), at a fraction of its cost
    (`cdf`: `mode_cdf` as a list; bisect_right is searchsorted's side="right")."""
    return bisect_right(cdf, rng.random())


def choose_contexts(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    max_per_pair: int = 0, pair_share: float = 0.0, pair_k: int = 16, *, fast: bool = True,
    lengths: RecordLengths | None = None,
) -> Plan:
    """The contexts of `n_rows` rows. `fast=False` sends every context through the general
    path (`_fit`); the fast paths give the same contexts from the same draws (tested)."""
    if lengths is None:
        lengths = RecordLengths(rec, scheme)
    cdf = mode_cdf(mode_p).tolist()
    floor = min_measurement_tokens(scheme)
    plan = Plan([], [], [], [], np.zeros((n_rows, 3), np.int32))
    log_n1 = float(np.log(rec.n + 1))
    for r in range(n_rows):
        room = seq_len
        misses = 0
        mode = draw_mode(cdf, rng)
        for _ in range(MAX_CONTEXTS_PER_ROW + FILL_RETRIES):
            if room < floor or misses > FILL_RETRIES:
                break
            # A miss re-draws only the window: re-drawing the mode too would favour the
            # timestamp-free mode in the last, tight slot of every row.
            got = _context(rec, lengths, rng, mode, room, max_per_pair, pair_share, pair_k, fast, log_n1)
            if got is None:
                misses += 1
                continue
            idx, has_time, length = got
            plan.idx.append(idx)
            plan.has_time.append(has_time)
            plan.length.append(length)
            plan.row.append(r)
            plan.modes[r, mode] += 1
            room -= length
            misses = 0
            mode = draw_mode(cdf, rng)
    return plan


def _context(rec: ProbeRecord, lengths: RecordLengths, rng: np.random.Generator, mode: int, room: int,
             max_per_pair: int, pair_share: float, pair_k: int, fast: bool, log_n1: float | None = None):
    """One context fitted to `room` tokens: (record positions in context order, has_time,
    tokens), or None when not even its first measurement fits.

    Most contexts need no pass over their measurements: a whole window in the full or none
    mode takes its length from the record's prefix sums, and a context subsampled down to one
    measurement (the usual last, tight slot of a row) is that window's first. The others (a
    window subsampled to fit, the partial mode, shaped windows) take `_fit`."""
    start, idx = None, None
    if pair_share > 0 and rng.random() < pair_share:
        idx = pair_history(rec, rng, pair_k)
    else:
        start, n = _window(rec.n, rng, log_n1)
        if max_per_pair:
            idx, start = _first_per_pair(rec, np.arange(start, start + n), max_per_pair), None
    if idx is not None:
        n, est = len(idx), int(lengths.base[idx].sum())
    else:
        est = lengths.window(start, n)
    # Cheap upper-ish estimate (timestamps as delta1) decides whether to subsample.
    if lengths.compact and mode != NONE:
        est += 7 + 2 * n * (1 if mode == FULL else 0.5)
    k = max(1, int(n * room / est)) if est > room else n
    if fast and k == 1:  # an even subsample of one is the window's first measurement
        return _single(start if idx is None else int(idx[0]), mode, rng, lengths, room)
    if fast and k == n and start is not None and mode != PARTIAL:
        if mode == NONE:  # est is exact here and fits
            return start + rng.permutation(n), np.zeros(n, bool), est
        keep, length = lengths.full_prefix(start, n, room)
        return (np.arange(start, start + keep), np.ones(keep, bool), length) if keep else None
    if k < n:  # a contiguous window subsamples its slice of times (no gather of the window)
        idx = start + _even_in_time(rec.time_s[start : start + n], k) if idx is None else \
            idx[_even_in_time(rec.time_s[idx], k)]
    elif idx is None:
        idx = np.arange(start, start + n)
    return _fit(rec, lengths, idx, mode, room, rng)


def _single(pos: int, mode: int, rng: np.random.Generator, lengths: RecordLengths, room: int):
    """The context of measurement `pos` alone, as `arrange` and `_fit` would give it."""
    if mode == PARTIAL:  # arrange's draws for one measurement, which it always timestamps
        rng.random()
        rng.uniform(0.2, 0.8)
    length = int(lengths.base[pos]) + (lengths.abs_len if mode != NONE else 0)
    return (np.array([pos]), np.array([mode != NONE]), length) if length <= room else None


def _fit(rec: ProbeRecord, lengths: RecordLengths, idx: np.ndarray, mode: int, room: int,
         rng: np.random.Generator):
    """The general path: arrange time-ordered positions `idx` for the mode, then keep the
    longest prefix that fits (exact lengths, timestamps included)."""
    idx, has_time = arrange(idx, mode, rng)
    lens = lengths.base[idx]
    if lengths.compact:
        lens = lens + time_lengths(rec.time_s[idx], has_time)
    cs = np.cumsum(lens)
    keep = int(np.searchsorted(cs, room, side="right"))  # a prefix keeps its lengths
    return (idx[:keep], has_time[:keep], int(cs[keep - 1])) if keep else None


def tokenize(rec: ProbeRecord, rng: np.random.Generator, plan: Plan, scheme: str, result_last: float = 0.0,
             lengths: RecordLengths | None = None):
    """One encode for every context of the plan (None when empty); `lengths`: the record's
    RecordLengths, whose tables make the encode a gather."""
    if not plan.idx:
        return None
    where, has_time, order, starts = plan_inputs(rng, plan, scheme, result_last)
    return encode_items([rec], [lengths], None, where, has_time, order, starts, scheme)


def plan_inputs(rng: np.random.Generator, plan: Plan, scheme: str, result_last: float = 0.0):
    """What one encode takes for the plan's (non-empty) contexts: (record positions, has_time,
    block orders, context starts)."""
    sizes = np.array([len(i) for i in plan.idx])
    where = np.concatenate(plan.idx)
    order = block_orders(len(where), scheme, rng, result_last)
    return where, np.concatenate(plan.has_time), order, np.concatenate([[0], np.cumsum(sizes)[:-1]])


def encode_items(recs: list, lengths: list, who: np.ndarray | None, where: np.ndarray, has_time: np.ndarray,
                 order: np.ndarray, starts: np.ndarray, scheme: str) -> Encoded:
    """The tokens of measurements `recs[who[i]]` at `where[i]` (who None: all of `recs[0]`), as
    `encode` gives them: gathered from the records' `BlockTables` (compact), else through a
    `Measurements` batch (the full scheme; input the encoder refuses, which it then names)."""
    tables = [None if ln is None else ln.tables for ln in lengths]
    if all(t is not None and t.valid for t in tables):
        return encode_gathered(tables, who, where, has_time, order, starts)
    return encode(measurements_of(recs, who, where, has_time), scheme, order=order, context_starts=starts)


def measurements_of(recs: list, who: np.ndarray | None, where: np.ndarray, has_time: np.ndarray) -> Measurements:
    """The `Measurements` of `recs[who[i]]` at `where[i]`: one gather per record, not per context."""
    if who is None or len(recs) == 1:
        return to_measurements(recs[0], where, has_time)
    n = len(where)
    cols = {"src": np.zeros((n, 16), np.uint8), "src_v6": np.zeros(n, bool),
            "dst": np.zeros((n, 16), np.uint8), "dst_v6": np.zeros(n, bool), "rtt_ms": np.zeros(n),
            "time_s": np.zeros(n, np.int64), "size": np.zeros(n, np.int64), "errors": np.zeros(n, np.int64),
            "msm_id": np.zeros(n, np.int64)}
    for k, rec in enumerate(recs):
        at = np.flatnonzero(who == k)
        pos = where[at]
        s, d = rec.src_idx[pos], rec.dst_idx[pos]
        cols["src"][at], cols["src_v6"][at] = rec.src_addr[s], rec.src_v6[s]
        cols["dst"][at], cols["dst_v6"][at] = rec.dst_addr[d], rec.dst_v6[d]
        for name in ("rtt_ms", "time_s", "size", "errors", "msm_id"):
            cols[name][at] = getattr(rec, name)[pos]
    return Measurements(has_time=has_time, **cols)


def block_orders(n: int, scheme: str, rng: np.random.Generator, result_last: float = 0.0) -> np.ndarray:
    """int8[n, k] block orders, uniform (the draw `encode` makes with an rng), a `result_last`
    share of them with the RTT block last."""
    return orders_result_last(n, scheme, rng, result_last) if result_last > 0 else field_order(n, blocks(scheme), rng)


def orders_result_last(n: int, scheme: str, rng: np.random.Generator, share: float) -> np.ndarray:
    """int8[n, k] uniform block orders, a `share` of them redrawn among those ending in the RTT block."""
    order = field_order(n, blocks(scheme), rng)
    ending = orders_ending_in_rtt(scheme)
    move = rng.random(n) < share
    order[move] = ending[rng.integers(0, len(ending), int(move.sum()))]
    return order


@lru_cache(maxsize=None)
def orders_ending_in_rtt(scheme: str) -> np.ndarray:
    """int8[k, blocks]: the block orders that put the RTT-carrying block last, in `permutations` order."""
    names = blocks(scheme)
    perms = permutations(len(names))
    ending = perms[perms[:, -1] == names.index(RTT_BLOCK[scheme])]
    ending.flags.writeable = False  # shared by every call
    return ending


def pack(plan: Plan, enc, n_rows: int, seq_len: int) -> PackedSequences:
    """Lay the encoded contexts into rows, with segment ids and positions."""
    tokens = np.zeros((n_rows, seq_len), np.int32)
    segment = np.zeros((n_rows, seq_len), np.int32)
    position = np.zeros((n_rows, seq_len), np.int32)
    if enc is None:
        return PackedSequences(tokens, segment, position, plan.modes, np.zeros(n_rows, np.int32))
    sizes = np.array([len(i) for i in plan.idx])
    lens = np.asarray(plan.length, np.int64)
    bounds = enc.offsets[np.concatenate([[0], np.cumsum(sizes)])]
    if not np.array_equal(np.diff(bounds), lens):
        raise AssertionError("packing lengths disagree with the encoder")  # a tokenizer rule changed
    rows = np.asarray(plan.row)
    # Segment ids count contexts within the row from 1; positions restart at 0 per context.
    ctx_no = np.arange(len(lens))
    first_in_row = np.concatenate([[True], rows[1:] != rows[:-1]])
    seg_id = ctx_no - np.maximum.accumulate(np.where(first_in_row, ctx_no, 0)) + 1
    seg = np.repeat(seg_id.astype(np.int32), lens)
    pos = (np.arange(bounds[-1]) - np.repeat(bounds[:-1], lens)).astype(np.int32)
    # A row's contexts are consecutive in the plan and fill it from column 0, so each row is
    # one slice of the token stream: slice copies instead of a scatter of every token.
    row_at = bounds[np.searchsorted(rows, np.arange(n_rows + 1), side="left")]
    for r in range(n_rows):
        a, b = int(row_at[r]), int(row_at[r + 1])
        tokens[r, : b - a] = enc.tokens[a:b]
        segment[r, : b - a] = seg[a:b]
        position[r, : b - a] = pos[a:b]
    n_meas = np.bincount(rows, weights=sizes, minlength=n_rows).astype(np.int32)
    return PackedSequences(tokens, segment, position, plan.modes, n_meas)
