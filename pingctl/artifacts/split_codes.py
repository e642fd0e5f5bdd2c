"""A split's ends and RTTs as integer codes, read one batch of rows at a time: what `pingctl
hints` fits on (docs/loader.md, "Hints").

`load_split` gives eval every column as NumPy arrays, the addresses as Python strings: at a day's
size (64M train rows) those strings and the Arrow arrays built again from them to code them
are most of 10 GB. Here each batch's address columns stay Arrow dictionary codes, mapped through
their dictionaries (a few thousand strings) into one vocabulary, so a row costs its two int32
codes and its float64 RTT, nothing more, and the rows kept go straight into arrays sized from
the files' metadata. The split is refused where `load_split` refuses it, with the same
messages: nulls, a NaN RTT and an invalid address name the file and the row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.artifacts.table import _check_no_nulls, refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import inside_pingctl_output
from pingctl.errors import PingctlError
from pingctl.schema.arrow_strings import Vocabulary
from pingctl.schema.duck import refuse_rejects
from pingctl.schema.parquet import check_parquet_columns, read_table
from pingctl.tokenizer.measurements import parse_addresses

COLUMNS = ("src_addr", "dst_addr", "rtt")
BATCH_ROWS = 1 << 20  # rows decoded at once: a batch's arrays are ~30 MB, whatever the split's size

# what a `keep` callable is given per batch: source codes, destination codes (int32, into the
# vocabulary as it stands), RTTs (float64 ms, -1 = failed); it returns the rows to keep
Keep = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class SplitCodes:
    """The kept rows of a split: `a`, `b` int32 codes of their source and destination into
    `vocab` (an Arrow string array, sorted, every address of every row read, kept or not),
    `rtt` float64 ms; `rows` counts every row read."""

    vocab: object
    a: np.ndarray
    b: np.ndarray
    rtt: np.ndarray
    rows: int


def read_split_codes(path, keep: Keep | None = None, split_hint: str = "train") -> SplitCodes:
    """The (source, destination, RTT) rows of the canonical Parquet at `path` (a split directory,
    a file or a glob) that `keep` keeps (all without it), as codes (`SplitCodes`)."""
    refuse_whole_shard_output([path], split=split_hint)
    files = resolve_inputs([path])
    check_parquet_columns(files)
    total = sum(_num_rows(f) for f in files)
    a, b, rtt = np.empty(total, np.int32), np.empty(total, np.int32), np.empty(total, np.float64)
    vocab, kept, rows = Vocabulary(), 0, 0
    for f in files:
        for batch in _batches(f):
            ca, cb = vocab.codes(batch.column(0)), vocab.codes(batch.column(1))
            r = batch.column(2).to_numpy(zero_copy_only=False)
            if rows + len(r) > total:
                raise PingctlError(f"{f}: more rows than its Parquet metadata says; the file changed while read")
            rows += len(r)
            if keep is not None:
                mask = keep(ca, cb, r)
                ca, cb, r = ca[mask], cb[mask], r[mask]
            a[kept:kept + len(r)], b[kept:kept + len(r)], rtt[kept:kept + len(r)] = ca, cb, r
            kept += len(r)
    # a table pingctl did not write may hold rows its pipeline rejects: refused as load_split
    # refuses them, after the checks above, so a file's null or NaN is named as it names it
    if foreign := [f for f in files if not inside_pingctl_output(f)]:
        refuse_rejects(foreign, "eval scores canonical rows only: pass the table through `pingctl shard` "
                       "(which sets rejected rows aside in rejects.jsonl) and evaluate its splits")
    words, rank = vocab.sorted()
    # in place: a day's codes are the largest arrays this holds
    a, b = np.take(rank, a[:kept], out=a[:kept]), np.take(rank, b[:kept], out=b[:kept])
    return SplitCodes(words, a, b, rtt[:kept], rows)


def _num_rows(f: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f).metadata.num_rows
    except (OSError, pa.ArrowException) as e:
        raise PingctlError(f"{f}: damaged or unreadable Parquet ({e})") from None


def _batches(f: Path):
    """Record batches of (src_addr, dst_addr as dictionary codes, rtt as float64), each checked
    as `load_split` checks a file; a failed check is reported from the whole file, so its row
    is the file's row, in `load_split`'s words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(f, page_checksum_verification=True, read_dictionary=list(COLUMNS[:2]))
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=list(COLUMNS)):
            t = pa.Table.from_batches([batch]).select(list(COLUMNS))
            cols = [_dictionary(t, 0), _dictionary(t, 1), t.column(2).combine_chunks()]
            if not _clean(cols):
                _check_no_nulls(f, read_table(f, columns=list(COLUMNS)))
                # not reached where the whole-file check names the row; said here if it did not
                raise PingctlError(f"{f}: a null, a NaN rtt or an invalid address in src_addr, dst_addr or rtt")
            yield pa.RecordBatch.from_arrays([cols[0], cols[1], cols[2].cast(pa.float64())], names=list(COLUMNS))
    except (OSError, pa.ArrowException) as e:
        raise PingctlError(f"{f}: damaged or unreadable Parquet ({e})") from None


def _clean(cols) -> bool:
    """No null, no NaN RTT, every address in the dictionaries parses (each distinct string once,
    never a row's copy of its bytes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if any(c.null_count for c in cols) or any(c.indices.null_count for c in cols[:2]):
        return False
    if pa.types.is_floating(cols[2].type) and pc.any(pc.is_nan(cols[2])).as_py():
        return False
    try:
        for c in cols[:2]:
            parse_addresses(c.dictionary, "address")
    except PingctlError:
        return False
    return True


def _dictionary(t, i: int):
    """Column `i` of a one-batch table as one dictionary array (a file written without a
    dictionary for it reads as plain strings, encoded here)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = t.column(i).combine_chunks()
    return col if pa.types.is_dictionary(col.type) else pc.dictionary_encode(col.cast(pa.string()))
