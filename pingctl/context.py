"""Choosing context measurements: which earlier measurements a prompt carries, for training
contexts (the loader), for answers (`sample`) and for scoring (`eval`) alike (docs/eval.md,
"Context policies"; docs/loader.md).

A measurement's probe key is its prb_id, else its source address's code; its context is the
probe's measurements strictly before it, the last `context` of them, at most `per_pair` of
each (src, dst) pair when asked, and for the `cold` policy none of its own pair.
"""

from __future__ import annotations

import numpy as np

from pingctl.errors import UsageError

POLICIES = ("probe", "cold", "none")


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


def codes_in(values, vocab, transform=None) -> np.ndarray:
    """int64 code of each value in `vocab` (an Arrow string array), -1 where absent.

    `transform` maps each *distinct* input string (e.g. to its prefix) before the lookup.
    """
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
        distinct = dict_encode(col).dictionary.to_pylist()
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


def context_pool(test: dict, train: dict | None, policy: str) -> dict:
    """The measurements contexts are drawn from: the test split, plus the train split for `cold`."""
    check_policy(policy)
    if policy != "cold" or train is None:
        return test
    keys = ("src", "dst", "rtt", "event_time", "prb_id", "ip_version")
    return {k: np.concatenate([np.asarray(train[k]), np.asarray(test[k])]) for k in keys}


def context_indices(pool: dict, test: dict, idx: np.ndarray, context: int, policy: str,
                    per_pair: int = 0) -> list[np.ndarray]:
    """Per query packet, indices into `pool` of its context measurements, oldest first: the
    probe's last `context` measurements strictly before the packet's time (for `cold`, those
    to other pairs only; with `per_pair`, at most that many of each pair)."""
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
