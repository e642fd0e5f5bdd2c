"""Training contexts from one probe record, packed into full rows of `seq_len` tokens.

Per context: a multi-scale window (length log-uniform in [1, n]) at a random start; a
timestamp mode (full / partial / none); when the window holds more than the row's
remaining room, an even subsample in time; a fresh field order per measurement.
Contexts are appended until a row has less room than the shortest measurement, so
padding is a few tokens per row at most.

Cost model: a record is read and decoded once per call and yields many rows. Choosing
contexts is a short loop over contexts (never over measurements) using per-record
length arithmetic; then one gather and one `encode` call cover every context of every
row, and the encoder's own offsets are checked against the lengths used for packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pingctl.context import first_k_per_key
from pingctl.records.layout import ProbeRecord, to_measurements
from pingctl.tokenizer import blocks, encode
from pingctl.tokenizer.compact import ABS, DELTA1, DELTA4, TIME_LEN
from pingctl.tokenizer.layout import field_order, permutations

FULL, PARTIAL, NONE = 0, 1, 2
MODES = ("full", "partial", "none")
MAX_CONTEXTS_PER_ROW = 64
FILL_RETRIES = 4  # fresh windows tried when the next context's first measurement does not fit
# compact: MeasurementStart + Src(1+4|16) + Dst(1+4|16) + RttStart+2 | Failed
_FULL_V4, _FULL_V6 = 45, 69  # the full scheme always carries every block
RTT_BLOCK = {"compact": "result", "full": "rtt"}


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
    v6 = rec.src_v6[rec.src_idx]
    if scheme == "full":
        return np.where(v6, _FULL_V6, _FULL_V4).astype(np.int64)
    dv6 = rec.dst_v6[rec.dst_idx]
    return 1 + np.where(v6, 17, 5) + np.where(dv6, 17, 5) + np.where(rec.rtt_ms < 0, 1, 3)


def time_lengths(t: np.ndarray, has_time: np.ndarray) -> np.ndarray:
    """Compact timestamp tokens of a context in its final order (the tokenizer's rule:
    first timestamp absolute, later ones delta1/delta4 to the previous timestamped one,
    absolute again when the delta is negative or >= 2**32)."""
    out = np.zeros(len(t), np.int64)
    idx = np.flatnonzero(has_time)
    if idx.size == 0:
        return out
    tt = t[idx]
    d = np.diff(tt)
    lens = np.empty(idx.size, np.int64)
    lens[0] = TIME_LEN[ABS]
    lens[1:] = np.where((d >= 0) & (d < 2**32), np.where(d <= 255, TIME_LEN[DELTA1], TIME_LEN[DELTA4]), TIME_LEN[ABS])
    out[idx] = lens
    return out


def _window(n: int, rng: np.random.Generator) -> tuple[int, int]:
    length = int(np.exp(rng.uniform(0.0, np.log(n + 1))))
    length = min(max(length, 1), n)
    return int(rng.integers(0, n - length + 1)), length


def _even_in_time(t: np.ndarray, k: int) -> np.ndarray:
    """k positions into sorted times `t`, spread evenly over the time span."""
    if k >= len(t):
        return np.arange(len(t))
    idx = np.unique(np.searchsorted(t, np.linspace(t[0], t[-1], k), side="left").clip(0, len(t) - 1))
    if len(idx) < k:  # bursts at one timestamp collapse: top up evenly by rank
        rest = np.setdiff1d(np.arange(len(t)), idx, assume_unique=True)
        idx = np.union1d(idx, rest[np.linspace(0, len(rest) - 1, k - len(idx)).astype(np.int64)])
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
    shaping: Shaping = NO_SHAPING,
) -> PackedSequences:
    """`n_rows` rows of `seq_len` tokens, each packed with contexts from `rec`."""
    plan = choose_contexts(rec, rng, n_rows, seq_len, mode_p, scheme, shaping.max_per_pair, shaping.pair_share,
                           shaping.pair_k)
    return pack(plan, tokenize(rec, rng, plan, scheme, shaping.result_last), n_rows, seq_len)


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


def choose_contexts(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    max_per_pair: int = 0, pair_share: float = 0.0, pair_k: int = 16,
) -> Plan:
    base = base_lengths(rec, scheme)
    cum = np.concatenate([[0], np.cumsum(base)])
    t = rec.time_s
    floor = min_measurement_tokens(scheme)
    ctx_idx: list[np.ndarray] = []
    ctx_time: list[np.ndarray] = []
    ctx_len: list[int] = []
    ctx_row: list[int] = []
    modes = np.zeros((n_rows, 3), np.int32)
    for r in range(n_rows):
        room = seq_len
        misses = 0
        mode = int(rng.choice(3, p=mode_p))
        for _ in range(MAX_CONTEXTS_PER_ROW + FILL_RETRIES):
            if room < floor or misses > FILL_RETRIES:
                break
            # A miss re-draws only the window: re-drawing the mode too would favour the
            # timestamp-free mode in the last, tight slot of every row.
            if pair_share > 0 and rng.random() < pair_share:
                idx = pair_history(rec, rng, pair_k)
                est = int(base[idx].sum())
            else:
                start, length = _window(rec.n, rng)
                idx = np.arange(start, start + length)
                if max_per_pair:
                    idx = _first_per_pair(rec, idx, max_per_pair)
                    est = int(base[idx].sum())
                else:
                    est = int(cum[start + length] - cum[start])
            # Cheap upper-ish estimate (timestamps as delta1) decides whether to subsample.
            if scheme == "compact" and mode != NONE:
                est += 7 + 2 * len(idx) * (1 if mode == FULL else 0.5)
            if est > room:
                idx = idx[_even_in_time(t[idx], max(1, int(len(idx) * room / est)))]
            idx, has_time = arrange(idx, mode, rng)
            lens = base[idx]
            if scheme == "compact":
                lens = lens + time_lengths(t[idx], has_time)
            cs = np.cumsum(lens)
            keep = int(np.searchsorted(cs, room, side="right"))  # a prefix keeps its lengths
            if keep == 0:
                misses += 1
                continue
            ctx_idx.append(idx[:keep])
            ctx_time.append(has_time[:keep])
            ctx_len.append(int(cs[keep - 1]))
            ctx_row.append(r)
            modes[r, mode] += 1
            room -= ctx_len[-1]
            misses = 0
            mode = int(rng.choice(3, p=mode_p))
    return Plan(ctx_idx, ctx_time, ctx_len, ctx_row, modes)


def tokenize(rec: ProbeRecord, rng: np.random.Generator, plan: Plan, scheme: str, result_last: float = 0.0):
    """One gather and one encode for every context of the plan (None when empty)."""
    if not plan.idx:
        return None
    sizes = np.array([len(i) for i in plan.idx])
    m = to_measurements(rec, np.concatenate(plan.idx), np.concatenate(plan.has_time))
    # Without result_last the encoder draws the orders itself (the rows stay as they were).
    order = orders_result_last(int(sizes.sum()), scheme, rng, result_last) if result_last > 0 else None
    return encode(m, scheme, rng=rng, order=order, context_starts=np.concatenate([[0], np.cumsum(sizes)[:-1]]))


def orders_result_last(n: int, scheme: str, rng: np.random.Generator, share: float) -> np.ndarray:
    """int8[n, k] uniform block orders, a `share` of them redrawn among those ending in the RTT block."""
    names = blocks(scheme)
    order = field_order(n, names, rng)
    perms = permutations(len(names))
    ending = perms[perms[:, -1] == names.index(RTT_BLOCK[scheme])]
    move = rng.random(n) < share
    order[move] = ending[rng.integers(0, len(ending), int(move.sum()))]
    return order


def pack(plan: Plan, enc, n_rows: int, seq_len: int) -> PackedSequences:
    """Scatter the encoded contexts into rows, with segment ids and positions."""
    tokens = np.zeros((n_rows, seq_len), np.int32)
    segment = np.zeros((n_rows, seq_len), np.int32)
    position = np.zeros((n_rows, seq_len), np.int32)
    n_meas = np.zeros(n_rows, np.int32)
    if enc is None:
        return PackedSequences(tokens, segment, position, plan.modes, n_meas)
    sizes = np.array([len(i) for i in plan.idx])
    lens = np.asarray(plan.length, np.int64)
    bounds = enc.offsets[np.concatenate([[0], np.cumsum(sizes)])]
    if not np.array_equal(np.diff(bounds), lens):
        raise AssertionError("packing lengths disagree with the encoder")  # a tokenizer rule changed
    rows = np.asarray(plan.row)
    # Position of each context inside its row: running sum of lengths, restarting per row.
    first_in_row = np.concatenate([[True], rows[1:] != rows[:-1]])
    run = np.cumsum(lens) - lens
    row_base = np.maximum.accumulate(np.where(first_in_row, run, 0))
    col0 = run - row_base
    # Segment ids count contexts within the row from 1.
    ctx_no = np.arange(len(lens))
    seg_id = ctx_no - np.maximum.accumulate(np.where(first_in_row, ctx_no, 0)) + 1
    tok_ctx = np.repeat(ctx_no, lens)
    tok_pos = np.arange(len(enc.tokens)) - np.repeat(bounds[:-1], lens)
    flat_r = rows[tok_ctx]
    flat_c = col0[tok_ctx] + tok_pos
    tokens[flat_r, flat_c] = enc.tokens
    segment[flat_r, flat_c] = seg_id[tok_ctx]
    position[flat_r, flat_c] = tok_pos
    np.add.at(n_meas, rows, sizes.astype(np.int32))
    return PackedSequences(tokens, segment, position, plan.modes, n_meas)
