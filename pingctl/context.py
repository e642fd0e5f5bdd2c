"""Choosing context measurements: which earlier measurements a prompt carries, for training
contexts (the loader), for answers (`sample`) and for scoring (`eval`) alike (docs/eval.md,
"Context policies"; docs/loader.md).

A measurement's probe key is its prb_id, else its source address's code; its context is the
probe's measurements strictly before it, the last `context` of them, at most `per_pair` of
each (src, dst) pair when asked, and for the `cold` policy none of its own pair.

The `both` policy (a *triangulation* context) gives the model evidence about both ends of a
query (s, d): the source side is the probe's last `context` measurements to destinations other
than d, the destination side the last `context_dst` measurements of d from sources other than
s, both strictly before the query's time, at most `per_pair` of each pair; the two sides are
merged in time order. `recent_others` is that one rule on one time-ordered history; the
loader applies it to probe and destination records, eval/sample/score to tables.

The `pair` policy (a *pair-history* context) is the pair's own last `context` measurements
strictly before the query: the information the pair median reads, so `eval --regimes` gives it
to the time regime (prompt.FAIR_POLICIES); a per-pair cap does not apply (every one is of the pair).
"""

from __future__ import annotations

import numpy as np

from pingctl.histories import Addresses, History
from pingctl.prompt import Policy, parse_policy
from pingctl.schema.arrow_strings import codes_in, vocabulary


def first_k_per_key(key: np.ndarray, k: int) -> np.ndarray:
    """bool mask: the first `k` occurrences of each key value, in array order."""
    by_key = np.argsort(key, kind="stable")  # stable: array order within a key
    sk = key[by_key]
    first = np.concatenate([[True], sk[1:] != sk[:-1]])
    rank = np.arange(len(sk)) - np.maximum.accumulate(np.where(first, np.arange(len(sk)), 0))
    keep = np.zeros(len(key), bool)
    keep[by_key] = rank < k
    return keep


def last_k_per_key(key: np.ndarray, k: int) -> np.ndarray:
    """bool mask: the last `k` occurrences of each key value (the most recent, in time order)."""
    return first_k_per_key(key[::-1], k)[::-1]


def _probe_keys(d: dict, sources) -> np.ndarray:
    """int64 probe key: the prb_id, else -1 - the source's index in `sources` (a vocabulary)."""
    prb = np.asarray(d["prb_id"], np.int64)
    return np.where(prb >= 0, prb, -1 - codes_in(d["src"], sources))


def recent_others(time: np.ndarray, other: np.ndarray, t_query: int, exclude: int, k: int,
                  per_pair: int = 0, n_other: int | None = None) -> np.ndarray:
    """Positions of one side of a triangulation context in a time-ordered history: the last `k`
    measurements strictly before `t_query` whose other end (`other`: the destination of a
    probe's measurement, the source of a destination's) is not `exclude`, at most `per_pair`
    (0 = no cap) of each other end, the most recent; ascending.

    Only a suffix of the history is read, grown until it holds `k` (a position's rank within
    its key counts from the end, so a suffix keeps exactly the positions the whole history
    would), or, with `n_other` (how many distinct values `other` takes at most), until it holds
    every other end `per_pair` times: no longer suffix could add one."""
    hi = int(np.searchsorted(time, t_query, side="left"))
    if k <= 0 or hi == 0:
        return np.zeros(0, np.int64)
    most = k if not per_pair or n_other is None else min(k, per_pair * n_other)
    width = 4 * k * max(1, per_pair)
    while True:
        lo = max(0, hi - width)
        o = other[lo:hi]
        if per_pair == 1:  # the common cap, in fewer array calls: the last position of each value
            last = len(o) - 1 - np.unique(o[::-1], return_index=True)[1]
            pos = np.sort(last[o[last] != exclude]) + lo
        else:
            pos = np.flatnonzero(o != exclude) + lo
            if per_pair:
                pos = pos[last_k_per_key(np.asarray(other[pos], np.int64), per_pair)]
        if len(pos) >= most or lo == 0:
            return pos[-k:].astype(np.int64)
        width *= 4


def context_pool(test: dict, train: dict | None, policy: str) -> dict:
    """The measurements contexts are drawn from: the test split, plus the train split for `cold`,
    `both` and `pair` (whose history starts in train). For `both` the test split's own earlier packets are what a prompt knows of a
    host that training never saw (a new probe's measurements to other destinations, other
    sources' to a new destination): the context rules keep only packets before the query and
    never its own pair. Without `train` (`pingctl score` of one table), the test split alone."""
    if parse_policy(policy) not in (Policy.COLD, Policy.BOTH, Policy.PAIR) or train is None:
        return test
    keys = ("src", "dst", "rtt", "event_time", "prb_id", "ip_version")
    return {k: np.concatenate([np.asarray(train[k]), np.asarray(test[k])]) for k in keys}


def context_indices(pool: dict, test: dict, idx: np.ndarray, context: int, policy: str,
                    per_pair: int = 0, context_dst: int | None = None) -> list[np.ndarray]:
    """Per query packet, indices into `pool` of its context measurements, oldest first: the
    probe's last `context` measurements strictly before the packet's time (for `cold`, those
    to other pairs only; with `per_pair`, at most that many of each pair). For `both`, the
    triangulation context: `context` of the source side and `context_dst` (None: `context`)
    of the destination side, merged in time order (`recent_others`)."""
    policy = parse_policy(policy)
    if policy is Policy.BOTH:
        return triangulation_indices(pool, test, idx, context, context if context_dst is None else context_dst,
                                     per_pair)
    if policy is Policy.PAIR:
        return pair_history_indices(pool, test, idx, context)
    if policy is Policy.NONE or context <= 0:
        return [np.zeros(0, np.int64) for _ in idx]
    sources = vocabulary(pool["src"], test["src"])
    pk = _probe_keys(pool, sources)
    pair = None
    if per_pair:
        dsts = vocabulary(pool["dst"])
        pair = codes_in(pool["src"], sources) * len(dsts) + codes_in(pool["dst"], dsts)
    pt = np.asarray(pool["event_time"], np.int64)
    order = np.lexsort((pt, pk))
    sk, st = pk[order], pt[order]
    qk = _probe_keys(test, sources)
    qt = np.asarray(test["event_time"], np.int64)
    psrc, pdst = np.asarray(pool["src"]), np.asarray(pool["dst"])
    out = []
    for i in idx:
        lo = np.searchsorted(sk, qk[i], side="left")
        end = np.searchsorted(sk, qk[i], side="right")
        hi = lo + np.searchsorted(st[lo:end], qt[i], side="left")
        if policy is Policy.PROBE and pair is None:
            out.append(order[max(lo, hi - context) : hi])
            continue
        prev = order[lo:hi]
        if policy is Policy.COLD:
            prev = prev[(psrc[prev] != test["src"][i]) | (pdst[prev] != test["dst"][i])]
        if pair is not None:
            prev = prev[last_k_per_key(pair[prev], per_pair)]
        out.append(prev[-context:])
    return out


def triangulation_indices(pool: dict, test: dict, idx: np.ndarray, k_src: int, k_dst: int,
                          per_pair: int = 0) -> list[np.ndarray]:
    """The `both` policy: per query packet (s, d, t), indices into `pool` of the probe's last
    `k_src` measurements to destinations other than d and the last `k_dst` measurements of d
    from sources other than s, all strictly before t, at most `per_pair` of each pair; never
    the pair (s, d) itself. Merged and sorted by time (oldest first)."""
    parts, queries = _histories(pool, test)
    return part_contexts(parts, queries, idx, Policy.BOTH, k_src, k_dst, per_pair)


def pair_history_indices(pool: dict, test: dict, idx: np.ndarray, context: int) -> list[np.ndarray]:
    """The `pair` policy: per query packet (s, d, t), indices into `pool` of the last `context`
    measurements of (s, d) itself strictly before t, oldest first."""
    parts, queries = _histories(pool, test)
    return part_contexts(parts, queries, idx, Policy.PAIR, context)


def _histories(pool: dict, test: dict) -> tuple[list[History], History]:
    addresses = Addresses()
    history = History.of(pool, addresses)
    return [history], (history if test is pool else History.of(test, addresses))


def pool_and_contexts(test: dict, idx: np.ndarray, context: int, policy: str, per_pair: int = 0,
                      context_dst: int | None = None, train: dict | History | None = None) -> tuple[dict, list]:
    """(the measurements the prompts hold, per query packet the indices of its own into them):
    `context_indices` of `context_pool`. `train` may be its `History`, built once for several
    calls (eval asks eight sets of packets of one train split). For `both` and `pair` the pool
    is only the rows some prompt holds, in the order of the tables they come from (the test
    split after train), and neither table is copied."""
    pol = parse_policy(policy)
    if pol not in (Policy.BOTH, Policy.PAIR):
        pool = context_pool(test, train.table if isinstance(train, History) else train, policy)
        return pool, context_indices(pool, test, idx, context, policy, per_pair, context_dst)
    if train is None:
        parts, queries = _histories(test, test)
    else:
        history = train if isinstance(train, History) else History.of(train, Addresses())
        queries = History.of(test, history.addresses)
        parts = [history, queries]
    rows = part_contexts(parts, queries, idx, pol, context, context if context_dst is None else context_dst, per_pair)
    return gather(parts, rows)


def part_contexts(parts: list[History], queries: History, idx: np.ndarray, policy: Policy, k_src: int,
                  k_dst: int = 0, per_pair: int = 0) -> list[np.ndarray]:
    """The `both` (`k_src`, `k_dst` a side) or `pair` (`k_src` of the pair) contexts of packets
    `idx` of `queries`, drawn from tables `parts` taken as one (the rows of the second after the
    first's: an index into them is the row's place in their concatenation); every table's
    codes from one `Addresses`."""
    if len(idx) == 0 or (k_src <= 0 and (policy is Policy.PAIR or k_dst <= 0)):
        return [np.zeros(0, np.int64) for _ in idx]
    offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
    if policy is Policy.PAIR:
        sides = [("pair", queries.pair_key(), None, k_src)]
    else:
        sides = [("probe", queries.probe, queries.dst, k_src), ("dst", queries.dst, queries.src, k_dst)]
    out = []
    for i in idx:
        t, rows, times = int(queries.time[i]), [], []
        for name, qkeys, exclude, k in sides:
            if k <= 0:
                continue
            spans = [(side, *side.span(int(qkeys[i])), int(off))
                     for side, off in zip((p.side(name) for p in parts), offsets)]
            r, tt = (_last_before(spans, t, k) if exclude is None
                     else _recent_others_parts(spans, t, int(exclude[i]), k, per_pair))
            rows.append(r)
            times.append(tt)
        rows_, times_ = np.concatenate(rows), np.concatenate(times)
        out.append(rows_[np.argsort(times_, kind="stable")])
    return out


def _suffixes(spans: list, t_query: int, width: int):
    """The last `width` rows strictly before `t_query` of the tables' key spans taken as one
    history (ties in time: the earlier table's first), as (rows, times, other, whole: no earlier
    row is left out)."""
    cut = []
    for side, lo, hi, off in spans:
        end = side.before(lo, hi, t_query)
        cut.append((side, max(lo, end - width), end, off, lo))
    rows = np.concatenate([side.order[a:b].astype(np.int64) + off for side, a, b, off, _ in cut])
    times = np.concatenate([side.times(a, b) for side, a, b, _, _ in cut])
    other = (None if cut[0][0].other_of is None
             else np.concatenate([side.other(a, b) for side, a, b, _, _ in cut]))
    # counted before the merge keeps `width` of them: rows it drops are left out too
    whole = all(a == lo for _, a, _, _, lo in cut) and len(rows) <= width
    if len(cut) > 1:  # one table's span is in order already
        o = np.argsort(times, kind="stable")[-width:]
        rows, times, other = rows[o], times[o], None if other is None else other[o]
    return rows, times, other, whole


def _last_before(spans: list, t_query: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    rows, times, _, _ = _suffixes(spans, t_query, k)
    return rows, times


def _recent_others_parts(spans: list, t_query: int, exclude: int, k: int, per_pair: int):
    """`recent_others` on the tables' spans taken as one history, read from its end: a suffix
    keeps exactly the positions the whole history would (`recent_others`), so it grows until
    the rule finds `k` in it or it is the whole history."""
    width = 4 * k * max(1, per_pair)
    while True:
        rows, times, other, whole = _suffixes(spans, t_query, width)
        pos = recent_others(times, other, t_query, exclude, k, per_pair)
        if len(pos) >= k or whole:
            return rows[pos], times[pos]
        width *= 4


def gather(parts: list[History], contexts: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """The rows `contexts` hold (indices into `parts` taken as one), as one table in that
    order, and the contexts as indices into it."""
    used = np.unique(np.concatenate([np.asarray(c, np.int64) for c in contexts] + [np.zeros(0, np.int64)]))
    keys = ["src", "dst"] + [k for k in parts[0].table if k not in ("src", "dst") and all(k in p.table for p in parts)]
    bounds = np.cumsum([0] + [len(p) for p in parts])
    pool = {}
    for key in keys:
        pieces = [p.column(key, used[(used >= a) & (used < b)] - a) for p, a, b in zip(parts, bounds[:-1], bounds[1:])]
        pool[key] = np.concatenate(pieces)
    return pool, [np.searchsorted(used, c).astype(np.int64) for c in contexts]
