"""Triangulation contexts: evidence about both ends of a query measurement (docs/loader.md).

For a query measurement (s, d, t) drawn from a probe record, a context holds up to `k_src`
measurements of the probe to destinations other than d (from the same record) and up to
`k_dst` measurements of d from sources other than s (from d's destination record, read at
random from `build-rows --by both` output), all strictly before t, at most `per_pair` of each
pair per side (`pingctl.context.recent_others`, the rule eval's `both` policy applies too),
merged in time order, then the query last with its RTT block last. The pair (s, d) itself is
never in its context.

Timestamp modes are the loader's: *full* keeps time order with every measurement timestamped,
*partial* timestamps a random subset (the query too, half of the time), *none* shuffles the
context and timestamps nothing; the query stays last in every mode. Each side's size is its
`k` half of the time and uniform in 0..k-1 otherwise, so prompts with a thin or empty side
(a probe or a destination with little history) are trained too. A context longer than the
row's room loses its oldest measurements (never the query).

A destination's measurements come from its record that starts last before t (destination
histories are cut into records of `rows.dst_max_row_mb`); a query just after a cut sees only
that record's part of the history, a short side at a boundary of tens of thousands of
measurements.

Cost model: as for the plain contexts, choosing is a loop over contexts (never measurements),
each on positions and lengths only; decoded destination records are cached per process; the
measurements are gathered once per record and encoded once per element.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pingctl.context import recent_others
from pingctl.loader.sequences import (FILL_RETRIES, FULL, MAX_CONTEXTS_PER_ROW, PARTIAL, PackedSequences, Plan,
                                      RTT_BLOCK, arrange, base_lengths, orders_result_last, time_lengths,
                                      min_measurement_tokens, pack)
from pingctl.records.layout import ProbeRecord, decode
from pingctl.tokenizer import Measurements, blocks, encode
from pingctl.tokenizer.layout import field_order, permutations
from pingctl.tokenizer.measurements import parse_addresses


@dataclass(frozen=True)
class Triangulation:
    """The loader's triangulation settings (`loader.triangulation_*`)."""

    share: float = 0.0
    k_src: int = 16
    k_dst: int = 16
    per_pair: int = 1


NO_TRIANGULATION = Triangulation()


class DestinationIndex:
    """Destination address -> its records in time order (ids and first times), from the
    manifest's `index` of a destination output. Picklable (Grain hands it to workers)."""

    def __init__(self, index: dict[str, list[list[int]]]):
        import pyarrow as pa

        names = list(index)
        addr, v6 = parse_addresses(pa.array(names, pa.string()), "destination index")
        self._map: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        for a, f, name in zip(addr, v6, names):
            parts = np.asarray(index[name], np.int64).reshape(-1, 2)
            self._map[_key(a, f)] = (parts[:, 0], parts[:, 1])

    def __len__(self) -> int:
        return len(self._map)

    def record_before(self, addr: np.ndarray, v6: bool, t: int) -> int | None:
        """The record of this destination that holds its measurements just before `t` (the last
        one starting before `t`), or None (unknown destination, or nothing before `t`)."""
        got = self._map.get(_key(addr, v6))
        if got is None:
            return None
        ids, t0 = got
        k = int(np.searchsorted(t0, t, side="left")) - 1
        return int(ids[k]) if k >= 0 else None


def _key(addr: np.ndarray, v6) -> bytes:
    return bytes(np.asarray(addr, np.uint8)) + (b"\1" if v6 else b"\0")


def _side_count(k: int, rng: np.random.Generator) -> int:
    if k <= 0:
        return 0
    return k if rng.random() < 0.5 else int(rng.integers(0, k))


def _source_of(drec: ProbeRecord, addr: np.ndarray, v6: bool) -> int:
    """Index of address (addr, v6) in a record's source table, -1 when absent."""
    hit = np.flatnonzero((drec.src_v6 == v6) & (drec.src_addr == addr).all(axis=1))
    return int(hit[0]) if len(hit) else -1


# A destination lookup: (address, v6, query time) -> (its record holding the measurements just
# before that time, the record's tokens per measurement without timestamps), or None.
Lookup = Callable[[np.ndarray, bool, int], "tuple[ProbeRecord, np.ndarray] | None"]


@dataclass
class Chosen:
    """The contexts of an element: the plan (lengths, rows, modes, has_time) and where each
    measurement comes from, in context order: `records[who[i]]` at position `where[i]`
    (records[0] is the element's probe record; every context ends with its query)."""

    plan: Plan
    records: list
    who: np.ndarray
    where: np.ndarray
    has_time: np.ndarray

    def measurements(self) -> Measurements:
        """One gather per record, not per context."""
        n = len(self.who)
        cols = {"src": np.zeros((n, 16), np.uint8), "src_v6": np.zeros(n, bool),
                "dst": np.zeros((n, 16), np.uint8), "dst_v6": np.zeros(n, bool), "rtt_ms": np.zeros(n),
                "time_s": np.zeros(n, np.int64), "size": np.zeros(n, np.int64), "errors": np.zeros(n, np.int64),
                "msm_id": np.zeros(n, np.int64)}
        for k, rec in enumerate(self.records):
            at = np.flatnonzero(self.who == k)
            pos = self.where[at]
            s, d = rec.src_idx[pos], rec.dst_idx[pos]
            cols["src"][at], cols["src_v6"][at] = rec.src_addr[s], rec.src_v6[s]
            cols["dst"][at], cols["dst_v6"][at] = rec.dst_addr[d], rec.dst_v6[d]
            for name in ("rtt_ms", "time_s", "size", "errors", "msm_id"):
                cols[name][at] = getattr(rec, name)[pos]
        return Measurements(has_time=self.has_time, **cols)


def choose_triangulation(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    tri: Triangulation, destination: Lookup,
) -> Chosen:
    """Triangulation contexts for `n_rows` rows of `seq_len` tokens, queries drawn from `rec`."""
    floor = min_measurement_tokens(scheme)
    base = base_lengths(rec, scheme)
    records: list = [rec]
    known: dict[int, int] = {}  # id(destination record) -> its index in `records`
    who: list[np.ndarray] = []
    where: list[np.ndarray] = []
    plan = Plan([], [], [], [], np.zeros((n_rows, 3), np.int32))
    for r in range(n_rows):
        room = seq_len
        misses = 0
        for _ in range(MAX_CONTEXTS_PER_ROW + FILL_RETRIES):
            if room < floor or misses > FILL_RETRIES:
                break
            mode = int(rng.choice(3, p=mode_p))
            got = _one_context(rec, base, rng, mode, room, scheme, tri, destination)
            if got is None:
                misses += 1
                continue
            drec, w, pos, has_time, length = got
            if drec is not None:
                w = np.where(w > 0, known.setdefault(id(drec), len(records)), 0)
                if known[id(drec)] == len(records):
                    records.append(drec)
            who.append(w)
            where.append(pos)
            plan.idx.append(pos)
            plan.has_time.append(has_time)
            plan.length.append(length)
            plan.row.append(r)
            plan.modes[r, mode] += 1
            room -= length
            misses = 0
    return Chosen(plan, records, _cat(who, np.int64), _cat(where, np.int64), _cat(plan.has_time, bool))


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _one_context(rec, base, rng, mode, room, scheme, tri, destination):
    """One triangulation context fitted to `room` tokens: (destination record or None, which
    record each measurement is from (0: `rec`, 1: the destination record), its position there,
    has_time, tokens) in context order, the query last; None when not even the query fits."""
    q = int(rng.integers(rec.n))
    t_q = int(rec.time_s[q])
    src_i, dst_i = int(rec.src_idx[q]), int(rec.dst_idx[q])
    # n_other: the record's address tables bound how many other ends a side can find
    pos_s = recent_others(rec.time_s, rec.dst_idx, t_q, dst_i, _side_count(tri.k_src, rng), tri.per_pair,
                          len(rec.dst_addr) - 1)
    k_dst = _side_count(tri.k_dst, rng)
    drec = None
    if k_dst:
        got = destination(rec.dst_addr[dst_i], bool(rec.dst_v6[dst_i]), t_q)
        if got is not None:
            drec, dbase = got
            other = _source_of(drec, rec.src_addr[src_i], bool(rec.src_v6[src_i]))
            pos_d = recent_others(drec.time_s, drec.src_idx, t_q, other, k_dst, tri.per_pair,
                                  len(drec.src_addr) - (other >= 0))
    if drec is None or not len(pos_d):
        drec, pos_d, dbase = None, pos_s[:0], base[:0]
    # every candidate with its record, position, time and length; the query last
    pos = np.concatenate([pos_s, pos_d, [q]])
    w = np.concatenate([np.zeros(len(pos_s), np.int64), np.ones(len(pos_d), np.int64), [0]])
    t = np.concatenate([rec.time_s[pos_s], drec.time_s[pos_d] if drec is not None else pos_d, [t_q]])
    b = np.concatenate([base[pos_s], dbase[pos_d], base[q : q + 1]])
    n = len(pos) - 1
    if n:
        order, has_time = arrange(np.argsort(t[:n], kind="stable"), mode, rng)
        seq = np.append(order, n)
    else:
        has_time, seq = np.zeros(0, bool), np.array([0])
    has_time = np.append(has_time, mode == FULL or (mode == PARTIAL and rng.random() < 0.5))
    while True:
        lens = b[seq] + (time_lengths(t[seq], has_time) if scheme == "compact" else 0)
        total = int(lens.sum())
        if total <= room:
            return drec, w[seq], pos[seq], has_time, total
        if len(seq) == 1:
            return None
        # drop the oldest measurements: the suffix that fits with its first timestamp made
        # absolute (+7 at most), then exact again
        fits = np.cumsum(lens[::-1])[::-1] + 7 <= room
        drop = int(np.argmax(fits)) if fits.any() else len(seq) - 1  # fits[0] is False: total > room
        seq, has_time = seq[drop:], has_time[drop:]


def pack_triangulation(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    tri: Triangulation, destination: Lookup, result_last: float = 0.0,
) -> PackedSequences:
    """`n_rows` rows of `seq_len` tokens packed with triangulation contexts of queries from `rec`."""
    chosen = choose_triangulation(rec, rng, n_rows, seq_len, mode_p, scheme, tri, destination)
    plan = chosen.plan
    if not plan.idx:
        return pack(plan, None, n_rows, seq_len)
    sizes = np.array([len(i) for i in plan.idx])
    n = int(sizes.sum())
    names = blocks(scheme)
    order = orders_result_last(n, scheme, rng, result_last) if result_last > 0 else field_order(n, names, rng)
    # every query (the last measurement of its context) has its RTT block last
    perms = permutations(len(names))
    ending = perms[perms[:, -1] == names.index(RTT_BLOCK[scheme])]
    last = np.cumsum(sizes) - 1
    order[last] = ending[rng.integers(0, len(ending), len(last))]
    enc = encode(chosen.measurements(), scheme, order=order, context_starts=np.concatenate([[0], last[:-1] + 1]))
    return pack(plan, enc, n_rows, seq_len)


def concat_rows(a: PackedSequences, b: PackedSequences) -> PackedSequences:
    """The rows of `a` then those of `b`."""
    return PackedSequences(*(np.concatenate([getattr(a, f), getattr(b, f)])
                             for f in ("tokens", "segment", "position", "modes", "measurements")))


class DestinationReader:
    """Random access to destination records from inside the Grain pipeline: the index and the
    file names travel to the workers, where ArrayRecord readers open lazily. Decoded records
    are kept in a least-recently-used cache of `cache_mb` per process: the records are
    read-only, so the cache changes no row, only how often one is read (a destination is the
    other end of many probes' queries)."""

    def __init__(self, index: DestinationIndex, reader, scheme: str = "compact", cache_mb: float = 256.0):
        self.index = index
        self.reader = reader  # .get(record id) -> bytes, lazily opened in each worker
        self.scheme = scheme
        self.cache_bytes = int(cache_mb * 1e6)
        self._cache: OrderedDict[int, tuple[ProbeRecord, np.ndarray, int]] = OrderedDict()
        self._held = 0

    def __getstate__(self):
        return {**self.__dict__, "_cache": OrderedDict(), "_held": 0}

    def record(self, rid: int) -> tuple[ProbeRecord, np.ndarray]:
        """Record `rid` and its tokens per measurement without timestamps."""
        got = self._cache.get(rid)
        if got is not None:
            self._cache.move_to_end(rid)
            return got[0], got[1]
        raw = self.reader.get(rid)
        rec = decode(raw)
        base = base_lengths(rec, self.scheme)
        size = len(raw) + base.nbytes
        self._cache[rid] = (rec, base, size)
        self._held += size
        while self._held > self.cache_bytes and len(self._cache) > 1:
            self._held -= self._cache.popitem(last=False)[1][2]
        return rec, base

    def lookup(self) -> Lookup:
        """destination(address, v6, t): its record holding the measurements just before t."""

        def destination(addr: np.ndarray, v6: bool, t: int):
            rid = self.index.record_before(addr, v6, t)
            return None if rid is None else self.record(rid)

        return destination
