"""Arrow string coding: distinct strings as int64 codes into a sorted vocabulary, for the
address and key columns eval's baselines, the context rules and score read. A few Python
strings (a service request's rows) take a plain-Python path with the same answers.
`CodedStrings`: an address column `load_split` returns, which keeps the Arrow coding it was
read in, so these read its dictionary instead of every row's Python string."""

from __future__ import annotations

import numpy as np

SMALL = 64  # values (address strings, context keys) below which a Python loop beats building Arrow arrays


class CodedStrings(np.ndarray):
    """An object array of str that keeps the Arrow dictionary coding it was made from
    (`coding`: a string dictionary of exactly the distinct values it holds, and int32 indices
    into it), so `dict_encode`, `codes_in` and `vocabulary` read a few thousand dictionary
    strings instead of hashing every row's Python string again (at a day's 64M rows, most of
    what fitting the baselines cost). Otherwise it is the object array of str it equals: it
    compares, indexes and converts as one, and a ufunc's result is a plain array.

    Only the constructor gives an array a coding: anything derived from one (a slice, a take,
    a view, a copy, a concatenation, an unpickled copy) has none, and the array is read-only, so
    a coding never describes values the array does not hold. Equal strings share one object."""

    def __new__(cls, dictionary, indices):
        import pyarrow as pa

        if not pa.types.is_string(dictionary.type):
            dictionary = dictionary.cast(pa.string())
        if dictionary.null_count:
            raise ValueError("a CodedStrings dictionary holds strings, not nulls")
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.dtype.kind not in "iu" and len(indices)):
            raise TypeError(f"CodedStrings indices are one-dimensional integers, not {indices.dtype} {indices.shape}")
        if len(indices) and (indices.min() < 0 or indices.max() >= len(dictionary)):
            raise ValueError(f"CodedStrings indices must lie in 0..{len(dictionary) - 1}")
        # a copy of its own: the caller's array may change after, the coding must not
        indices = np.array(indices, np.int32)
        # the values present only: `vocabulary` reads the dictionary as the column's distinct values
        used = np.bincount(indices, minlength=len(dictionary)) > 0
        if not used.all():
            indices = (np.cumsum(used, dtype=np.int64) - 1).astype(np.int32)[indices]
            dictionary = dictionary.filter(pa.array(used))
        indices.flags.writeable = False
        values = np.array(dictionary.to_pylist(), dtype=object)[indices] if len(dictionary) else np.empty(
            len(indices), object)
        values.flags.writeable = False  # the base too, so no view can be made writeable
        out = values.view(cls)
        out._coding = (dictionary, indices)
        return out

    def __array_finalize__(self, obj):
        self._coding = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        def plain(v):
            return v.view(np.ndarray) if isinstance(v, CodedStrings) else v

        if "out" in kwargs:
            kwargs["out"] = tuple(plain(o) for o in kwargs["out"])
        return getattr(ufunc, method)(*map(plain, inputs), **kwargs)

    @property
    def coding(self):
        """(Arrow string dictionary, int32 indices) of this array's values; None for an array
        derived from one."""
        return getattr(self, "_coding", None)


def dict_encode(values):
    """Arrow DictionaryArray of strings for NumPy/list/Arrow input (no copy when already encoded)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, CodedStrings) and values.coding is not None:
        dictionary, indices = values.coding
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)
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


def few_strings(values) -> list | None:
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
    few = few_strings(values)
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
    if not enc.indices.null_count:  # Arrow's indices as they are: a day's column is 64M of them
        return lut[enc.indices.to_numpy(zero_copy_only=False)]
    lut = np.append(lut, -1)
    idx = enc.indices.fill_null(len(lut) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return lut[idx]


def vocabulary(*columns, transform=None):
    """Sorted Arrow string array of the distinct (transformed) values of the given columns."""
    import pyarrow as pa

    values: set = set()
    for col in columns:
        few = few_strings(col)
        distinct = list(dict.fromkeys(few)) if few is not None else dict_encode(col).dictionary.to_pylist()
        distinct = [v for v in distinct if v is not None]
        values.update(map(transform, distinct) if transform else distinct)
    values.discard(None)
    return pa.array(sorted(values), pa.string())


class Vocabulary:
    """Distinct strings in the order first seen, grown column by column through each column's
    dictionary: Arrow hashes the dictionary's strings, never a row's. One vocabulary codes
    several files' (or batches') dictionary-encoded columns into one code space."""

    def __init__(self):
        import pyarrow as pa

        self.values = pa.array([], pa.string())

    def codes(self, column) -> np.ndarray:
        """int32 code of each row of a dictionary-encoded column (nulls refused before)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        dictionary = column.dictionary
        if not pa.types.is_string(dictionary.type):
            dictionary = dictionary.cast(pa.string())
        lut = pc.index_in(dictionary, value_set=self.values)
        if lut.null_count:
            new = pc.unique(dictionary.filter(pc.is_null(lut)))
            self.values = pa.concat_arrays([self.values, new])
            lut = pc.index_in(dictionary, value_set=self.values)
        lut = lut.to_numpy(zero_copy_only=False).astype(np.int32)
        return lut[column.indices.to_numpy(zero_copy_only=False)]

    def sorted(self) -> tuple[object, np.ndarray]:
        """The vocabulary in string order and each first-seen code's place in it."""
        import pyarrow.compute as pc

        order = pc.sort_indices(self.values).to_numpy()
        rank = np.empty(len(order), np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        return self.values.take(order), rank
