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
    if (k_src <= 0 and k_dst <= 0) or len(idx) == 0:
        return [np.zeros(0, np.int64) for _ in idx]
    sources = vocabulary(pool["src"], test["src"])
    dsts = vocabulary(pool["dst"], test["dst"])
    p_src, p_dst = codes_in(pool["src"], sources), codes_in(pool["dst"], dsts)
    q_src, q_dst = codes_in(test["src"], sources), codes_in(test["dst"], dsts)
    pt = np.asarray(pool["event_time"], np.int64)
    qt = np.asarray(test["event_time"], np.int64)
    pk, qk = _probe_keys(pool, sources), _probe_keys(test, sources)
    by_probe = np.lexsort((pt, pk))
    by_dst = np.lexsort((pt, p_dst))
    sides = ((by_probe, pk[by_probe], pt[by_probe], qk, p_dst[by_probe], q_dst, k_src),
             (by_dst, p_dst[by_dst], pt[by_dst], q_dst, p_src[by_dst], q_src, k_dst))
    out = []
    for i in idx:
        parts = []
        for order, keys, times, qkeys, other, exclude, k in sides:
            if k <= 0:
                continue
            lo, hi = np.searchsorted(keys, qkeys[i], side="left"), np.searchsorted(keys, qkeys[i], side="right")
            pos = recent_others(times[lo:hi], other[lo:hi], int(qt[i]), int(exclude[i]), k, per_pair)
            parts.append(order[lo + pos])
        both = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        out.append(both[np.argsort(pt[both], kind="stable")])
    return out


def pair_history_indices(pool: dict, test: dict, idx: np.ndarray, context: int) -> list[np.ndarray]:
    """The `pair` policy: per query packet (s, d, t), indices into `pool` of the last `context`
    measurements of (s, d) itself strictly before t, oldest first."""
    if context <= 0 or len(idx) == 0:
        return [np.zeros(0, np.int64) for _ in idx]
    sources, dsts = vocabulary(pool["src"], test["src"]), vocabulary(pool["dst"], test["dst"])
    pk = codes_in(pool["src"], sources) * len(dsts) + codes_in(pool["dst"], dsts)
    qk = codes_in(test["src"], sources) * len(dsts) + codes_in(test["dst"], dsts)
    pt, qt = np.asarray(pool["event_time"], np.int64), np.asarray(test["event_time"], np.int64)
    order = np.lexsort((pt, pk))
    sk, st = pk[order], pt[order]
    out = []
    for i in idx:
        lo, end = np.searchsorted(sk, qk[i], side="left"), np.searchsorted(sk, qk[i], side="right")
        hi = lo + np.searchsorted(st[lo:end], qt[i], side="left")
        out.append(order[max(lo, hi - context) : hi])
    return out
