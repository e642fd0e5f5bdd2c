"""Tables indexed for the context rules (pingctl.context): each row's source, destination and
probe key as integer codes, and per side of a prompt (the probe's history, the destination's,
the pair's) the rows in (key, time) order.

Eval asks several sets of packets against one train split; at a day's size (64M rows) building
that order is most of an ask's cost, so a train split's `History` is built once and its sides
on first use, and each ask indexes only its own (small) test split. The codes of every table
asked together come from one `Addresses`, which only grows: a code once given never changes,
so an index built on train stays valid as test splits bring new hosts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from pingctl.schema.arrow_strings import Vocabulary, dict_encode, few_strings


class Addresses:
    """One code space for the addresses of several tables: codes in the order first seen."""

    def __init__(self):
        self.vocabulary: Vocabulary | None = None  # made on first use of the Arrow path
        self.index: dict[str, int] | None = {}  # the same as a dict while only few were coded

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else len(self.vocabulary.values)

    def codes(self, column) -> np.ndarray:
        """The code of each value of `column` (strings, no nulls; new ones are added): int32, or
        int64 for a few."""
        if self.index is not None and (few := few_strings(column)) is not None:
            # a service request's few rows: a dict beats building Arrow arrays
            return np.array([self.index.setdefault(v, len(self.index)) for v in few], np.int64)
        if self.vocabulary is None:
            import pyarrow as pa

            self.vocabulary = Vocabulary()
            self.vocabulary.values = pa.array(list(self.index), pa.string())
            self.index = None
        return self.vocabulary.codes(dict_encode(column))

    def strings(self, codes) -> np.ndarray:
        """The address of each code (an object array of str)."""
        codes = np.asarray(codes, np.int64)
        if self.index is not None:
            return np.array(list(self.index), object)[codes] if len(codes) else np.empty(0, object)
        import pyarrow as pa

        return self.vocabulary.values.take(pa.array(codes)).to_numpy(zero_copy_only=False)


class _TimeAt:
    """The times of a side's places, read one at a time (what `bisect` asks of a sequence)."""

    __slots__ = ("order", "time")

    def __init__(self, order: np.ndarray, time: np.ndarray):
        self.order, self.time = order, time

    def __getitem__(self, place: int) -> int:
        return int(self.time[self.order[place]])


@dataclass
class Side:
    """One side's rows in (key, time) order: `order` (row of each place), the distinct `keys`
    with each one's first place (`starts`, and the end). A place's time and other end (a
    probe's destination, a destination's source; None for the pair) are read through `order`
    from the table's own arrays (`time`, `other_of`), not kept in place order: at a day's size
    each such copy is 256-512 MB a side, and a prompt reads a few dozen places."""

    order: np.ndarray
    keys: np.ndarray
    starts: np.ndarray
    time: np.ndarray
    other_of: np.ndarray | None

    def span(self, key: int) -> tuple[int, int]:
        """The places holding `key` ((0, 0) where none do)."""
        k = int(np.searchsorted(self.keys, key))
        if k == len(self.keys) or self.keys[k] != key:
            return 0, 0
        return int(self.starts[k]), int(self.starts[k + 1])

    def before(self, lo: int, hi: int, t: int) -> int:
        """The first place of `lo`..`hi` (one key's span, in time order) at or after time `t`."""
        return bisect.bisect_left(_TimeAt(self.order, self.time), t, lo, hi)

    def times(self, a: int, b: int) -> np.ndarray:
        return self.time[self.order[a:b]]

    def other(self, a: int, b: int) -> np.ndarray | None:
        return None if self.other_of is None else self.other_of[self.order[a:b]]


@dataclass
class History:
    """A table (a split's dict of arrays, `pingctl.artifacts.table.load_split`) with its rows'
    codes in `addresses`: `src`, `dst` int32 address codes (a day's 64M rows: 256 MB each) and
    `time` int64 seconds (the table's own array where it is one). `probe` (the int64 probe key:
    the prb_id, else -1 - the source's code) and `pair_key` are computed when asked, not kept.
    `side(name)` is built on first use."""

    table: dict
    addresses: Addresses
    src: np.ndarray
    dst: np.ndarray
    time: np.ndarray
    sides: dict = field(default_factory=dict)

    @classmethod
    def of(cls, table: dict, addresses: Addresses) -> "History":
        src = addresses.codes(table["src"]).astype(np.int32, copy=False)
        dst = addresses.codes(table["dst"]).astype(np.int32, copy=False)
        return cls(table, addresses, src, dst, np.asarray(table["event_time"], np.int64))

    def __len__(self) -> int:
        return len(self.time)

    @property
    def probe(self) -> np.ndarray:
        prb = np.asarray(self.table["prb_id"], np.int64)
        return np.where(prb >= 0, prb, -1 - self.src.astype(np.int64))

    def column(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of the table's column `key`, the addresses read from their codes."""
        if key in ("src", "dst"):
            return self.addresses.strings(getattr(self, key)[rows])
        return np.asarray(self.table[key])[rows]

    def forget_strings(self) -> "History":
        """Drop the table's address columns, their codes standing in for them (`column`): a
        day's train split holds 1.5 GB in them (an object array and its coding each)."""
        self.table = {k: v for k, v in self.table.items() if k not in ("src", "dst")}
        return self

    def pair_key(self, rows=slice(None)) -> np.ndarray:
        """(source, destination) as one int64."""
        return (self.src[rows].astype(np.int64) << 32) | self.dst[rows]

    def side(self, name: str) -> Side:
        if name not in self.sides:
            key = {"probe": lambda: self.probe, "dst": lambda: self.dst, "pair": self.pair_key}[name]()
            # stable: rows of one key and time keep their table order, as one sort of the
            # concatenated tables would
            order = np.lexsort((self.time, key))
            order = order.astype(np.int32) if len(order) < 2**31 else order
            sk = key[order]
            del key
            first = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]])) if len(sk) else np.zeros(0, np.int64)
            other = None if name == "pair" else (self.dst if name == "probe" else self.src)
            self.sides[name] = Side(order, sk[first], np.append(first, len(sk)), self.time, other)
        return self.sides[name]
