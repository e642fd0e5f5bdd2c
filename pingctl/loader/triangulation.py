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

With hints (`Triangulation.hints`, `loader.hints_file`), a share of the contexts also hold the
embedding's estimate for (s, d) as a measurement of the pair, untimed, just before the query
(`pingctl.loader.hints`): the one measurement of the pair a triangulation context holds.

A destination's measurements come from its record that starts last before t (destination
histories are cut into records of `rows.dst_max_row_mb`); a query just after a cut sees only
that record's part of the history, a short side at a boundary of tens of thousands of
measurements.

Cost model: candidates are i.i.d. (a candidate does not depend on the room left, only its fit
does), so they are drawn and laid out in batches of array work: both sides of every candidate
of a batch in one `recent_many` call, one sort to merge them, the modes' orders for all at
once. Filling the rows is then a loop over candidates on plain integers; a candidate's sides
are only computed when the room could hold one of their measurements. Decoded destination
records are cached per process with their tables (`RecordLengths`), so an element's contexts
are encoded by one gather over the records they read, with its plain rows'.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pingctl.loader.sequences import (FILL_RETRIES, FULL, MAX_CONTEXTS_PER_ROW, PARTIAL, PackedSequences, Plan,
                                      RecordLengths, Shaping, block_orders, choose_contexts, encode_items,
                                      measurements_of, min_measurement_tokens, mode_cdf, orders_ending_in_rtt, pack,
                                      plan_inputs, time_lengths)
from pingctl.loader.hints import Hints
from pingctl.loader.record_cache import CACHE_MB, RecordCache, address_keys
from pingctl.records.layout import ProbeRecord, address_key
from pingctl.tokenizer import Measurements
from pingctl.tokenizer.compact import ABS, TIME_LEN
from pingctl.tokenizer.measurements import parse_addresses


@dataclass(frozen=True)
class Triangulation:
    """The loader's triangulation settings (`loader.triangulation_*`)."""

    share: float = 0.0
    k_src: int = 16
    k_dst: int = 16
    per_pair: int = 1
    hints: Hints | None = None  # the embedding's estimate as a hint before the query (loader.hints_file)
    relative_target: bool = False  # a hinted query's RTT relative to its hint (loader.relative_target)


NO_TRIANGULATION = Triangulation()


class DestinationIndex:
    """Destination address -> its records in time order (ids and first times), from the
    manifest's `index` of a destination output. Picklable (Grain hands it to workers)."""

    def __init__(self, index: dict[str, list[list[int]]]):
        import pyarrow as pa

        names = list(index)
        addr, v6 = parse_addresses(pa.array(names, pa.string()), "destination index")
        # plain lists: one query is a bisect on a few integers, cheaper than any array call
        self._map: dict[bytes, tuple[list[int], list[int]]] = {}
        for a, f, name in zip(addr, v6, names):
            parts = np.asarray(index[name], np.int64).reshape(-1, 2)
            self._map[address_key(a, f)] = (parts[:, 0].tolist(), parts[:, 1].tolist())

    def __len__(self) -> int:
        return len(self._map)

    def record_before(self, key: bytes, t: int) -> int | None:
        """The record of the destination with `address_key` `key` that holds its measurements just
        before `t` (the last one starting before `t`), or None (unknown destination, or nothing
        before `t`)."""
        got = self._map.get(key)
        if got is None:
            return None
        ids, t0 = got
        k = bisect_left(t0, t) - 1
        return ids[k] if k >= 0 else None


def _source_index(rec: ProbeRecord, lengths: RecordLengths) -> dict[bytes, int]:
    """`address_key` -> its first index in the record's source table, kept with the record."""
    got = lengths.memo.get("source_index")
    if got is None:
        got = lengths.memo["source_index"] = {}
        for i, key in enumerate(address_keys(rec, lengths, "src")):
            got.setdefault(key, i)
    return got


# A destination lookup: (`address_key` of the destination, query time) -> (its record holding the
# measurements just before that time, the record's RecordLengths), or None.
Lookup = Callable[[bytes, int], "tuple[ProbeRecord, RecordLengths] | None"]


@dataclass
class Chosen:
    """The contexts of an element: the plan (lengths, rows, modes, has_time) and where each
    measurement comes from, in context order: `records[who[i]]` at position `where[i]`
    (records[0] is the element's probe record; every context ends with its query; `lengths`:
    each record's RecordLengths)."""

    plan: Plan
    records: list
    lengths: list
    who: np.ndarray
    where: np.ndarray
    has_time: np.ndarray

    def measurements(self) -> Measurements:
        """One gather per record, not per context."""
        return measurements_of(self.records, self.who, self.where, self.has_time)


def recent_many(times: list, others: list, which: np.ndarray, t_query: np.ndarray, exclude: np.ndarray,
                k: np.ndarray, per_pair: int = 0, n_other: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`pingctl.context.recent_others` for many queries at once, query j on the time-ordered
    history `times[which[j]]`, `others[which[j]]` (`which` ascending): (the positions of every
    query's side, ascending per query, queries in order; how many each has). `exclude`, `k`
    and `n_other` are per query.

    The same suffix argument as recent_others: ranks within an other end count from the end,
    so a suffix of a history keeps exactly the positions the whole history would; every query
    reads the same width, widened for the queries it did not yet settle. Only the reads are
    per history; the rule runs once over all queries."""
    m = len(t_query)
    bounds = np.searchsorted(which, np.arange(len(times) + 1)).tolist()
    hi = np.zeros(m, np.int64)
    for h, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if a < b:
            hi[a:b] = times[h].searchsorted(t_query[a:b], side="left")
    most = k if not per_pair or n_other is None else np.minimum(k, per_pair * n_other)
    rows, cols = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    todo = np.flatnonzero((k > 0) & (hi > 0))
    width = 4 * max(1, int(k.max()) if m else 1) * max(1, per_pair)
    while len(todo):
        pos = hi[todo, None] - width + np.arange(width)  # [queries, width], the suffix before each query
        o = np.empty(pos.shape, np.int64)
        at = np.searchsorted(which[todo], np.arange(len(times) + 1)).tolist()
        for h, (a, b) in enumerate(zip(at[:-1], at[1:])):
            if a < b:
                o[a:b] = others[h][np.maximum(pos[a:b], 0)]
        keep = (pos >= 0) & (o != exclude[todo, None])
        if per_pair == 1:  # the common cap, without a sort: the last column of each (query, other end)
            n_val = int(o.max(initial=0)) + 1
            key = np.arange(len(todo))[:, None] * n_val + np.maximum(o, 0)
            last = np.full(len(todo) * n_val, -1)
            np.maximum.at(last, key[keep], np.broadcast_to(np.arange(width), keep.shape)[keep])
            keep &= last[key] == np.arange(width)
        elif per_pair:  # the last `per_pair` of each other end: rank from the end within (query, other end)
            r, c = np.nonzero(keep)
            v = o[r, c]
            by = np.lexsort((-c, v, r))
            key = r[by] * (int(v.max(initial=0)) + 2) + v[by]
            first = np.concatenate([[True], key[1:] != key[:-1]])
            i = np.arange(len(key))
            keep[r[by], c[by]] = i - np.maximum.accumulate(np.where(first, i, 0)) < per_pair
        settled = (keep.sum(axis=1) >= most[todo]) | (hi[todo] <= width)
        # the last k of each settled query: its kept positions counted from the end
        from_end = np.cumsum(keep[:, ::-1], axis=1)[:, ::-1]
        r, c = np.nonzero(keep & (from_end <= k[todo, None]) & settled[:, None])
        rows.append(todo[r])
        cols.append(pos[r, c])
        todo = todo[~settled]
        width *= 4
    q, p = np.concatenate(rows), np.concatenate(cols)
    by = np.lexsort((p, q))
    return p[by], np.bincount(q, minlength=m)


def _side_counts(k: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Per candidate: k half of the time, else uniform in 0..k-1."""
    if k <= 0:
        return np.zeros(m, np.int64)
    return np.where(rng.random(m) < 0.5, k, rng.integers(0, k, m))


@dataclass
class _Queries:
    """The queries of a batch of candidate contexts, drawn i.i.d. before the rows are filled (a
    candidate does not depend on the room left, only its fit does), with what decides a fit in
    a tight room: below `small[c]` tokens no measurement of a side can be kept (the shortest
    measurement and the query's own tokens do not fit), so the candidate is its query alone or
    nothing whatever its sides, and they are never computed. `sides[c]`: (its `_Candidates`,
    its index there) once computed."""

    mode: np.ndarray
    q: np.ndarray
    k_src: np.ndarray
    k_dst: np.ndarray
    q_timed: np.ndarray
    alone: list  # tokens of the query alone
    small: list
    sides: dict

    @property
    def who(self) -> np.ndarray:  # the query alone, as a context's items (`_chosen`)
        return np.zeros(len(self.q), np.int64)

    @property
    def where(self) -> np.ndarray:
        return self.q

    @property
    def has_time(self) -> np.ndarray:
        return self.q_timed


def _queries(rec: ProbeRecord, base: np.ndarray, rng: np.random.Generator, m: int, cdf: np.ndarray, scheme: str,
             tri: Triangulation) -> _Queries:
    mode = np.searchsorted(cdf, rng.random(m), side="right")
    q = rng.integers(0, rec.n, m)
    k_src, k_dst = _side_counts(tri.k_src, m, rng), _side_counts(tri.k_dst, m, rng)
    q_timed = (mode == FULL) | ((mode == PARTIAL) & (rng.random(m) < 0.5))
    abs_len = int(TIME_LEN[ABS]) if scheme == "compact" else 0
    alone = base[q] + abs_len * q_timed
    return _Queries(mode, q, k_src, k_dst, q_timed, alone.tolist(), (min_measurement_tokens(scheme) + base[q]).tolist(),
                    {})


@dataclass
class _Candidates:
    """Candidate contexts with their sides, each laid out in context order with its query last:
    item i of candidate c sits at start[c] <= i < start[c + 1]."""

    start: list
    total: list  # tokens of the whole candidate
    suffix: list  # per item: tokens from it to its candidate's end
    fix: list  # per item: tokens the first timestamped item at or after it gains when it opens the context
    who: np.ndarray  # per item: index into the element's records
    where: np.ndarray
    has_time: np.ndarray

    def fit(self, c: int, room: int) -> tuple[int, int] | None:
        """(first item kept, tokens) of candidate c in `room` tokens, or None. A candidate too
        long loses its oldest measurements: the first suffix that fits with its first
        timestamp made absolute (7 tokens more at most), never the query."""
        total = self.total[c]
        if total <= room:
            return self.start[c], total
        end = self.start[c + 1]
        j = next((i for i in range(self.start[c], end) if self.suffix[i] + 7 <= room), end - 1)
        length = self.suffix[j] + self.fix[j]
        return (j, length) if length <= room else None


class _Records:
    """The records an element's candidates read, each with its RecordLengths: the probe's first,
    then destination records as candidates find them."""

    def __init__(self, rec: ProbeRecord, lengths: RecordLengths):
        self.items: list[tuple[ProbeRecord, RecordLengths]] = [(rec, lengths)]
        self._at: dict[int, int] = {}
        self.hint_at = self.relative_at = -1  # the hint twin's index and the relative twin's, once added

    def add(self, got: tuple[ProbeRecord, RecordLengths]) -> int:
        if id(got[0]) not in self._at:
            self._at[id(got[0])] = len(self.items)
            self.items.append(got)
        return self._at[id(got[0])]

    def source(self, r: int, key: bytes) -> int:
        """Index of the address with `address_key` `key` in record r's source table (-1: absent)."""
        return _source_index(*self.items[r]).get(key, -1)


def _draw(rec: ProbeRecord, rng: np.random.Generator, qs: _Queries, sel: np.ndarray, scheme: str,
          tri: Triangulation, destination: Lookup, records: _Records) -> _Candidates:
    """The sides of candidates `sel` of `qs`, and each laid out."""
    base = records.items[0][1].base
    m = len(sel)
    q = qs.q[sel]
    t_q, src_i, dst_i = rec.time_s[q], rec.src_idx[q], rec.dst_idx[q]
    k_src, k_dst = qs.k_src[sel], qs.k_dst[sel]
    # per candidate with a destination side: its destination record (joining `records`)
    drec_of = np.zeros(m, np.int64)
    dst_keys = address_keys(rec, records.items[0][1], "dst")
    wanted = np.flatnonzero(k_dst)
    for c, j, t in zip(wanted.tolist(), dst_i[wanted].tolist(), t_q[wanted].tolist()):
        got = destination(dst_keys[j], t)
        if got is not None:
            drec_of[c] = records.add(got)
    # both sides in one pass: the source side on the probe's history, the destination side on
    # its record's (other ends: destinations, sources); n_other: the address tables bound how
    # many other ends a side can find
    d = np.flatnonzero(drec_of)
    d = d[np.argsort(drec_of[d], kind="stable")]
    src_keys = address_keys(rec, records.items[0][1], "src")
    other = np.array([records.source(r, src_keys[s]) for r, s in zip(drec_of[d].tolist(), src_i[d].tolist())],
                     np.int64)
    which = np.concatenate([np.zeros(m, np.int64), drec_of[d]])
    recs = [r for r, _ in records.items]
    pos, count = recent_many(
        [r.time_s for r in recs], [rec.dst_idx] + [r.src_idx for r in recs[1:]], which,
        np.concatenate([t_q, t_q[d]]), np.concatenate([dst_i, other]), np.concatenate([k_src, k_dst[d]]),
        tri.per_pair, np.concatenate([np.full(m, len(rec.dst_addr) - 1),
                                      [len(recs[r].src_addr) for r in drec_of[d].tolist()] - (other >= 0)]))
    who = np.repeat(which, count)
    t, b = np.empty(len(pos), np.int64), np.empty(len(pos), np.int64)
    at = np.searchsorted(who, np.arange(len(recs) + 1)).tolist()
    for r, (lo, hi) in enumerate(zip(at[:-1], at[1:])):
        if lo < hi:
            t[lo:hi] = recs[r].time_s[pos[lo:hi]]
            b[lo:hi] = records.items[r][1].base[pos[lo:hi]]
    parts = [(np.repeat(np.concatenate([np.arange(m), d]), count), who, pos, t, b)]
    hint_who = -1
    q_who = np.zeros(m, np.int64)  # the record each query is read from: the probe's, or its relative twin
    if tri.hints is not None and (twin := tri.hints.twin(rec, records.items[0][1], scheme)) is not None:
        # a hint shares its query's time, so the stable merge below puts it after the sides
        hc = np.flatnonzero(twin[1].memo["has_hint"][q] & (rng.random(m) < tri.hints.share))
        if len(hc):
            hint_who = records.hint_at = records.add(twin)
            parts.append((hc, np.full(len(hc), hint_who), q[hc], t_q[hc], twin[1].base[q[hc]]))
            rel = tri.hints.relative_twin(rec, records.items[0][1], scheme) if tri.relative_target else None
            if rel is not None:  # the same lengths: a failure stays a failure
                q_who[hc] = records.relative_at = records.add(rel)
    parts.append((np.arange(m), q_who, q, t_q, base[q]))  # the queries, after every side
    cand, who, where, t, b = (np.concatenate(col) for col in zip(*parts))
    return _arrange(rng, qs.mode[sel], qs.q_timed[sel], cand, who, where, t, b, scheme, hint_who)


def _arrange(rng: np.random.Generator, mode: np.ndarray, q_timed: np.ndarray, cand, who, where, t, b,
             scheme: str, hint_who: int = -1) -> _Candidates:
    """Every candidate in context order for its mode (`sequences.arrange`, over all candidates
    at once): both sides merged in time order, the query last; *none* shuffles the sides,
    *partial* timestamps a random subset (at least one) in time order at random slots. A hint
    (items of record `hint_who`) is never timestamped and always just before its query."""
    m = len(mode)
    by = np.lexsort((t, cand))  # stable: at one time the source side first, as merged
    cand, who, where, t, b = cand[by], who[by], where[by], t[by], b[by]
    n = len(cand)
    start = np.concatenate([[0], np.cumsum(np.bincount(cand, minlength=m))])
    is_q = np.zeros(n, bool)
    is_q[start[1:] - 1] = True
    is_hint = who == hint_who
    item_mode = mode[cand]
    timed = (item_mode == FULL) & ~is_q & ~is_hint
    partial = (item_mode == PARTIAL) & ~is_q & ~is_hint
    timed[partial] = rng.random(int(partial.sum())) < rng.uniform(0.2, 0.8, m)[cand[partial]]
    sides = start[1:] - start[:-1] - 1 - np.bincount(cand[is_hint], minlength=m)
    lone = np.flatnonzero((mode == PARTIAL) & (sides > 0) & (np.bincount(cand[timed], minlength=m) == 0))
    timed[start[lone] + rng.integers(0, sides[lone])] = True  # at least one timestamp
    # a random slot order (none, partial), then partial's timed slots refilled in time order
    key = np.where(is_q, 2.0, np.where(is_hint, 1.5, np.where(item_mode == FULL, 0.0, rng.random(n))))
    order = np.lexsort((key, cand))
    slot_timed = timed[order]
    order[slot_timed] = np.flatnonzero(timed)
    has_time = timed[order] | (is_q & q_timed[cand])
    t, b = t[order], b[order]
    tl = time_lengths(t, has_time, cand) if scheme == "compact" else np.zeros(n, np.int64)
    lens = b + tl
    csum = np.cumsum(lens)
    ends = start[1:]
    suffix = csum[ends[cand] - 1] - csum + lens
    # the next timestamped item at or after each one, within its candidate
    nxt = np.minimum.accumulate(np.where(has_time, np.arange(n), n)[::-1])[::-1]
    ok = nxt < ends[cand]
    abs_len = int(TIME_LEN[ABS]) if scheme == "compact" else 0
    fix = np.where(ok, abs_len - tl[np.minimum(nxt, n - 1)], 0)
    total = csum[ends - 1] - np.concatenate([[0], csum[ends[:-1] - 1]])
    return _Candidates(start.tolist(), total.tolist(), suffix.tolist(), fix.tolist(), who[order], where[order],
                       has_time)


HEAD_PER_ROW = 6  # candidates laid out up front for each row: a row holds ~3 whole contexts of k = 16 a side


def choose_triangulation(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    tri: Triangulation, destination: Lookup, lengths: RecordLengths | None = None,
) -> Chosen:
    """Triangulation contexts for `n_rows` rows of `seq_len` tokens, queries drawn from `rec`
    (`lengths`: its RecordLengths, when a cache holds them). Filling the rows is a loop over
    candidates on plain integers; the array work comes in batches: every row starts with
    candidates of its own, laid out together, and goes on with a shared stream whose sides
    are computed when a room needs them. Candidates are i.i.d., so which row draws which
    changes no row's law."""
    floor = min_measurement_tokens(scheme)
    records = _Records(rec, RecordLengths(rec, scheme, prefix=False) if lengths is None else lengths)
    cdf = mode_cdf(mode_p)
    plan = Plan([], [], [], [], np.zeros((n_rows, 3), np.int32))
    kept: list[tuple] = []  # (_Candidates or _Queries, first item, end item) per context
    k = HEAD_PER_ROW
    head = _queries(rec, records.items[0][1].base, rng, k * n_rows, cdf, scheme, tri)
    cands = _draw(rec, rng, head, np.arange(k * n_rows), scheme, tri, destination, records)
    head.sides.update((i, (cands, i)) for i in range(k * n_rows))
    tail, c = None, 0
    for r in range(n_rows):
        room = seq_len
        misses = 0
        for i in range(MAX_CONTEXTS_PER_ROW + FILL_RETRIES):
            if room < floor or misses > FILL_RETRIES:
                break
            if i < k:
                qs, j = head, r * k + i
            else:
                if tail is None or c == len(tail.q):
                    tail, c = _queries(rec, records.items[0][1].base, rng, 8 * (n_rows - r), cdf, scheme, tri), 0
                qs, j = tail, c
                c += 1
            got = _fit(rec, rng, qs, j, room, scheme, tri, destination, records)
            if got is None:
                misses += 1
                continue
            kept.append(got[:3])
            plan.length.append(got[3])
            plan.row.append(r)
            plan.modes[r, int(qs.mode[j])] += 1
            room -= got[3]
            misses = 0
    return _chosen(plan, kept, records)


def _fit(rec: ProbeRecord, rng: np.random.Generator, qs: _Queries, c: int, room: int, scheme: str,
         tri: Triangulation, destination: Lookup, records: _Records) -> tuple | None:
    """Candidate c of `qs` fitted to `room`: (where its items are laid out, first, end, tokens),
    or None. Its sides are computed only when the room could hold one of their measurements."""
    if room < qs.small[c]:  # the query alone or nothing, whatever its sides
        return (qs, c, c + 1, qs.alone[c]) if qs.alone[c] <= room else None
    if c not in qs.sides:  # with the next two: a room this large likely takes more than one
        sel = np.arange(c, min(len(qs.q), c + 3))
        cands = _draw(rec, rng, qs, sel, scheme, tri, destination, records)
        qs.sides.update((int(i), (cands, n)) for n, i in enumerate(sel))
    cands, n = qs.sides[c]
    got = cands.fit(n, room)
    return None if got is None else (cands, got[0], cands.start[n + 1], got[1])


def _chosen(plan: Plan, kept: list, records: _Records) -> Chosen:
    """The kept contexts' items, gathered from where they were laid out, and the records they use."""
    if not kept:
        return Chosen(plan, [records.items[0][0]], [records.items[0][1]],
                      *(np.zeros(0, dt) for dt in (np.int64, np.int64, bool)))
    who, where, has_time = (np.concatenate([getattr(src, col)[a:e] for src, a, e in kept])
                            for col in ("who", "where", "has_time"))
    ends = np.cumsum([e - a for _, a, e in kept])
    if records.relative_at >= 0:
        _absolute_without_hint(who, ends, records)
    # the records used, renumbered in order (np.unique's answer; record ids are few and small):
    # records[0], the probe's, stays first (a plain row beside these reads it as record 0)
    present = np.bincount(who, minlength=len(records.items)) > 0
    present[0] = True
    used, who = np.flatnonzero(present), (np.cumsum(present) - 1)[who]
    starts = np.concatenate([[0], ends[:-1]])
    plan.idx.extend(where[a:e] for a, e in zip(starts, ends))
    plan.has_time.extend(has_time[a:e] for a, e in zip(starts, ends))
    used = used.tolist()
    return Chosen(plan, [records.items[u][0] for u in used], [records.items[u][1] for u in used], who, where,
                  has_time)


def _absolute_without_hint(who: np.ndarray, ends: np.ndarray, records: _Records) -> None:
    """A relative query whose hint a tight room cut off (a context loses its oldest measurements,
    the hint just before the query last of them) is read from the probe's record again: a
    relative RTT needs its scale in the prompt."""
    last = ends - 1  # every context ends with its query, its hint (if kept) just before it
    before = np.maximum(last - 1, 0)
    kept_hint = (last > np.concatenate([[0], ends[:-1]])) & (who[before] == records.hint_at)
    who[last[(who[last] == records.relative_at) & ~kept_hint]] = 0


def pack_triangulation(
    rec: ProbeRecord, rng: np.random.Generator, n_rows: int, seq_len: int, mode_p: np.ndarray, scheme: str,
    tri: Triangulation, destination: Lookup, result_last: float = 0.0, lengths: RecordLengths | None = None,
) -> PackedSequences:
    """`n_rows` rows of `seq_len` tokens packed with triangulation contexts of queries from `rec`."""
    chosen = choose_triangulation(rec, rng, n_rows, seq_len, mode_p, scheme, tri, destination, lengths)
    if not chosen.plan.idx:
        return pack(chosen.plan, None, n_rows, seq_len)
    order, starts = triangulation_inputs(chosen, rng, scheme, result_last)
    enc = encode_items(chosen.records, chosen.lengths, chosen.who, chosen.where, chosen.has_time, order, starts,
                       scheme)
    return pack(chosen.plan, enc, n_rows, seq_len)


def triangulation_inputs(chosen: Chosen, rng: np.random.Generator, scheme: str, result_last: float = 0.0):
    """What one encode takes for the (non-empty) contexts besides their measurements: (block
    orders with every query's RTT block last, context starts)."""
    sizes = np.array([len(i) for i in chosen.plan.idx])
    order = block_orders(int(sizes.sum()), scheme, rng, result_last)
    ending = orders_ending_in_rtt(scheme)
    last = np.cumsum(sizes) - 1  # every query is the last measurement of its context
    order[last] = ending[rng.integers(0, len(ending), len(last))]
    return order, np.concatenate([[0], last[:-1] + 1])


def triangulation_rows(rng: np.random.Generator, n_rows: int, share: float) -> int:
    """How many of an element's `n_rows` rows are triangulation rows: all of them with
    probability `share`, else none. The share of rows is `share` as with a draw per row, and the
    window shuffle mixes elements' rows into batches as before, but an element pays the fixed
    cost of triangulation (choosing and laying out candidates, reading destination records:
    more than a plain row's work) for all its rows at once, not for the one or two a draw per
    row gave it (docs/loader.md). Nothing is drawn at share 0, so those rows are bit for bit
    the plain rows."""
    if share <= 0:
        return 0
    return n_rows if rng.random() < share else 0


def pack_element(
    rec: ProbeRecord, rng: np.random.Generator, n_plain: int, n_tri: int, seq_len: int, mode_p: np.ndarray,
    scheme: str, shaping: Shaping, tri: Triangulation, destination: Lookup, lengths: RecordLengths,
) -> PackedSequences:
    """An element's rows, `n_plain` plain ones then `n_tri` triangulation ones, with one `encode`
    for all their contexts (an encode call costs about as much as choosing a row's contexts):
    the same draws in the same order, so the same rows, as `pack_sequences` then
    `pack_triangulation`."""
    plan = choose_contexts(rec, rng, n_plain, seq_len, mode_p, scheme, shaping.max_per_pair, shaping.pair_share,
                           shaping.pair_k, lengths=lengths)
    plain = plan_inputs(rng, plan, scheme, shaping.result_last) if plan.idx else None
    chosen = choose_triangulation(rec, rng, n_tri, seq_len, mode_p, scheme, tri, destination, lengths)
    if plain is None and not chosen.plan.idx:
        return concat_rows(pack(plan, None, n_plain, seq_len), pack(chosen.plan, None, n_tri, seq_len))
    # the plain rows' measurements first in the stream, all of the probe's record (chosen.records[0])
    where, has_time, order, starts = plain or (np.zeros(0, np.int64), np.zeros(0, bool), None, np.zeros(0, np.int64))
    n = len(where)
    if chosen.plan.idx:
        tri_order, tri_starts = triangulation_inputs(chosen, rng, scheme, shaping.result_last)
        who = np.concatenate([np.zeros(n, np.int64), chosen.who])
        where, has_time = np.concatenate([where, chosen.where]), np.concatenate([has_time, chosen.has_time])
        order = tri_order if order is None else np.concatenate([order, tri_order])
        starts = np.concatenate([starts, tri_starts + n])
        enc = encode_items(chosen.records, chosen.lengths, who, where, has_time, order, starts, scheme)
    else:
        enc = encode_items([rec], [lengths], None, where, has_time, order, starts, scheme)
    # one plan for all the rows, the triangulation rows after the plain ones: one pack
    rows = Plan(plan.idx + chosen.plan.idx, plan.has_time + chosen.plan.has_time, plan.length + chosen.plan.length,
                plan.row + [r + n_plain for r in chosen.plan.row], np.concatenate([plan.modes, chosen.plan.modes]))
    return pack(rows, enc, n_plain + n_tri, seq_len)


def concat_rows(a: PackedSequences, b: PackedSequences) -> PackedSequences:
    """The rows of `a` then those of `b`."""
    return PackedSequences(*(np.concatenate([getattr(a, f), getattr(b, f)])
                             for f in ("tokens", "segment", "position", "modes", "measurements")))


class DestinationReader:
    """Random access to destination records from inside the Grain pipeline: the index and the
    file names travel to the workers, where ArrayRecord readers open lazily; decoded records
    are kept in a per-process `RecordCache` (a destination is the other end of many probes'
    queries)."""

    def __init__(self, index: DestinationIndex, reader, scheme: str = "compact", cache_mb: float = CACHE_MB):
        self.index = index
        self.records = RecordCache(reader, scheme, cache_mb, prefix=False)

    def lookup(self) -> Lookup:
        """destination(address key, t): its record holding the measurements just before t."""

        def destination(key: bytes, t: int):
            rid = self.index.record_before(key, t)
            return None if rid is None else self.records.get(rid)

        return destination
