"""Writing canonical Parquet the same way everywhere (types, compression, row groups)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

ROW_GROUP_ROWS = 262_144  # DuckDB parallelises per row group; 256k keeps 100M rows at ~400 groups
COMPRESSION = "zstd"
# Every Parquet file pingctl writes carries a CRC per page: without one, a damaged value page
# of a numeric column decodes to other numbers and nothing can tell (`verify_pages` checks).
WRITE_OPTIONS = dict(compression=COMPRESSION, write_page_checksum=True)


def to_canonical(batch):
    """Cast an Arrow table/batch with the canonical columns to the exact canonical schema."""
    import pyarrow as pa

    from pingctl.schema import COLUMNS, arrow_schema

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    if "prb_id" not in table.column_names:
        table = table.append_column("prb_id", pa.nulls(table.num_rows, pa.int64()))
    return table.select(list(COLUMNS)).cast(arrow_schema())


def write_canonical(batches: Iterable, path: Path, row_group_rows: int = ROW_GROUP_ROWS) -> int:
    """Stream batches into one Parquet file; returns rows written. Caller handles atomicity."""
    import pyarrow.parquet as pq

    from pingctl.schema import arrow_schema

    import pyarrow as pa

    rows = 0
    pending: list = []  # batches smaller than a row group (DuckDB hands out 122,880 rows at a time)
    held = 0
    with pq.ParquetWriter(path, arrow_schema(), **WRITE_OPTIONS) as writer:
        for b in batches:
            t = to_canonical(b)
            if not t.num_rows:
                continue
            pending.append(t)
            held += t.num_rows
            rows += t.num_rows
            if held >= row_group_rows:
                whole = pa.concat_tables(pending)
                cut = held - held % row_group_rows
                writer.write_table(whole.slice(0, cut), row_group_size=row_group_rows)
                pending, held = ([whole.slice(cut)] if cut < held else []), held - cut
        if held:
            writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
    return rows


def read_table(path, **kwargs):
    """`pq.read_table` that checks each page's CRC where the file carries one (all of
    pingctl's do); a damaged or unreadable file is an error that names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pingctl.errors import PingctlError

    try:
        return pq.read_table(path, page_checksum_verification=True, **kwargs)
    except (OSError, pa.ArrowException) as e:
        raise PingctlError(f"{path}: damaged or unreadable Parquet ({e})") from None


def verify_head(path, rows: int | None, columns: list[str]) -> None:
    """Check the CRCs of the pages holding the first `rows` rows (None: all) of `columns`
    (DuckDB, which reads them next, ignores page CRCs); a damaged file is an error that names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pingctl.errors import PingctlError

    got = 0
    try:
        for b in pq.ParquetFile(path, page_checksum_verification=True).iter_batches(
            batch_size=min(rows or 65_536, 65_536), columns=columns
        ):
            got += b.num_rows
            if rows is not None and got >= rows:
                break
    except (OSError, pa.ArrowException) as e:
        raise PingctlError(f"{path}: damaged or unreadable Parquet ({e})") from None
