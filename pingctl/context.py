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
to the time regime (FAIR_POLICIES); a per-pair cap does not apply (every one is of the pair).
"""

from __future__ import annotations

import numpy as np

from pingctl.errors import UsageError
from pingctl.tokenizer.measurements import SMALL  # below it, Python beats building Arrow arrays

POLICIES = ("probe", "cold", "none", "both", "pair")
# `eval --regimes --context-policy fair`: each regime's prompt carries what the classical
# predictor it is judged against reads: the pair's history for the time regime (the pair
# median), both ends' other measurements where the pair is unseen (the coordinate systems).
FAIR = "fair"
FAIR_POLICIES = {"time": "pair", "pair": "both", "probe": "both", "target": "both"}


def dict_encode(values):
    """Arrow DictionaryArray of strings for NumPy/list/Arrow input (no copy when already encoded)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        if pa.types.is_dictionary(values.type):
            values = values.unify_dictionaries()
            if values.num_chunks == 0:
                return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
            dictionary = values.chunk(0).dictionary
            indices = pa.concat_arrays([c.indices for c in values.chunks])
            return pa.DictionaryArray.from_arrays(indices, dictionary)
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if pa.types.is_dictionary(values.type):
            return values
        return pc.dictionary_encode(values.cast(pa.string()))
    arr = np.asarray(values, dtype=object)
    return pc.dictionary_encode(pa.array(arr, type=pa.string(), from_pandas=True))


def _few_strings(values) -> list | None:
    """`values` as a list where it is a few Python strings (None = null), else None: the
    Arrow path's per-call cost is most of a small request's."""
    if len(values) >= SMALL or type(values).__module__.startswith("pyarrow"):
        return None
    out = values.tolist() if isinstance(values, np.ndarray) else list(values)
    return out if all(v is None or type(v) is str for v in out) else None


def codes_in(values, vocab, transform=None) -> np.ndarray:
    """int64 code of each value in `vocab` (an Arrow string array), -1 where absent.

    `transform` maps each *distinct* input string (e.g. to its prefix) before the lookup.
    """
    few = _few_strings(values)
    if few is not None:
        lut = {v: i for i, v in enumerate(vocab.to_pylist())}
        seen: dict = {}
        for v in few:
            if v not in seen:
                seen[v] = -1 if v is None else lut.get(transform(v) if transform else v, -1)
        return np.array([seen[v] for v in few], np.int64)
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = dict_encode(values)
    dictionary = enc.dictionary
    if transform is not None:
        dictionary = pa.array([transform(s) for s in dictionary.to_pylist()], pa.string())
    lut = pc.index_in(dictionary, value_set=vocab).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    lut = np.append(lut, -1)
    idx = enc.indices.fill_null(len(lut) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return lut[idx]


def vocabulary(*columns, transform=None):
    """Sorted Arrow string array of the distinct (transformed) values of the given columns."""
    import pyarrow as pa

    values: set = set()
    for col in columns:
        few = _few_strings(col)
        distinct = list(dict.fromkeys(few)) if few is not None else dict_encode(col).dictionary.to_pylist()
        distinct = [v for v in distinct if v is not None]
        values.update(map(transform, distinct) if transform else distinct)
    values.discard(None)
    return pa.array(sorted(values), pa.string())


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


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise UsageError(f"context policy {policy!r} (--context-policy): expected one of {', '.join(POLICIES)}")


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
    check_policy(policy)
    if policy not in ("cold", "both", "pair") or train is None:
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
    if policy == "both":
        return triangulation_indices(pool, test, idx, context, context if context_dst is None else context_dst,
                                     per_pair)
    if policy == "pair":
        return pair_history_indices(pool, test, idx, context)
    if policy == "none" or context <= 0:
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
        if policy == "probe" and pair is None:
            out.append(order[max(lo, hi - context) : hi])
            continue
        prev = order[lo:hi]
        if policy == "cold":
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
