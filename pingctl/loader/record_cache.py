"""Decoded records by id, kept per process: a record is read and decoded once, not once per
element (docs/loader.md, "Record cache").

An element of the plan packs a few rows from one record (`loader.rows_per_element`, 4: more
would mix batches badly), so reading the record (ArrayRecord), decoding it and its token
arithmetic (`RecordLengths`) cost more than choosing and tokenizing the element's contexts.
Every epoch visits each record many times, a destination record serves the queries of many
probes, and records are read-only: a least-recently-used cache of decoded records changes
which reads happen, never a row.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

from pingctl.loader.sequences import RecordLengths
from pingctl.records.layout import ProbeRecord, address_key, decode

CACHE_MB = 256.0  # per process and kind of record (probe, destination)
CHARGE = "cache_charge"  # RecordLengths.memo key: charge(nbytes) to the record's cache entry


class RecordCache:
    """`get(id)` -> (decoded record, its RecordLengths) through `reader.get(id) -> bytes`,
    least recently used out past `cache_mb`. Picklable: Grain hands it to its workers, each
    of which starts with an empty cache (and opens its own reader lazily)."""

    def __init__(self, reader, scheme: str = "compact", cache_mb: float = CACHE_MB, prefix: bool = True):
        self.reader = reader
        self.scheme = scheme
        self.prefix = prefix  # RecordLengths' prefix sums: what windows of plain contexts read
        self.cache_bytes = int(cache_mb * 1e6)
        self._cache: OrderedDict[int, list] = OrderedDict()  # id -> [record, RecordLengths, bytes held]
        self._held = 0
        self.reads = 0

    def __getstate__(self):
        return {**self.__dict__, "_cache": OrderedDict(), "_held": 0, "reads": 0}

    def get(self, rid: int) -> tuple[ProbeRecord, RecordLengths]:
        got = self._cache.get(rid)
        if got is not None:
            self._cache.move_to_end(rid)
            return got[0], got[1]
        raw = self.reader.get(rid)
        self.reads += 1
        rec = decode(raw)
        lengths = RecordLengths(rec, self.scheme, self.prefix)
        size = len(raw) + lengths.nbytes
        # what other modules later derive from the record and keep with it (a hints twin) is
        # charged to its entry through the memo, so the cache stays within its bytes
        lengths.memo[CHARGE] = functools.partial(self._charge, rid)
        self._cache[rid] = [rec, lengths, size]
        self._held += size
        self._evict()
        return rec, lengths

    def _charge(self, rid: int, nbytes: int) -> None:
        got = self._cache.get(rid)
        if got is not None:
            got[2] += nbytes
            self._held += nbytes
            self._evict()

    def _evict(self) -> None:
        """Least recently used out past the budget; the newest entry stays whatever its size."""
        while self._held > self.cache_bytes and len(self._cache) > 1:
            self._held -= self._cache.popitem(last=False)[1][2]

    @property
    def held_bytes(self) -> int:
        return self._held


def charge(lengths: RecordLengths, nbytes: int) -> None:
    """Count `nbytes` derived from a record (kept in `lengths.memo`) against the cache holding it,
    if one does."""
    got = lengths.memo.get(CHARGE)
    if got is not None:
        got(nbytes)


def address_keys(rec: ProbeRecord, lengths: RecordLengths, table: str) -> list[bytes]:
    """`address_key` of every entry of a record's source or destination table, kept with the
    record (`RecordLengths.memo`): triangulation asks for them once per candidate, hints once
    per record."""
    got = lengths.memo.get(table)
    if got is None:
        addr, v6 = (rec.src_addr, rec.src_v6) if table == "src" else (rec.dst_addr, rec.dst_v6)
        got = lengths.memo[table] = [address_key(a, f) for a, f in zip(addr, v6)]
    return got
