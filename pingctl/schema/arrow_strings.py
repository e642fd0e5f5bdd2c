"""Arrow string coding: distinct strings as int64 codes into a sorted vocabulary, for the
address and key columns eval's baselines, the context rules and score read. A few Python
strings (a service request's rows) take a plain-Python path with the same answers."""

from __future__ import annotations

import numpy as np

SMALL = 64  # values (address strings, context keys) below which a Python loop beats building Arrow arrays


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
