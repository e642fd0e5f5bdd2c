"""Writing canonical Parquet the same way everywhere (types, compression, row groups)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

ROW_GROUP_ROWS = 262_144  # DuckDB parallelises per row group; 256k keeps 100M rows at ~400 groups
COMPRESSION = "zstd"


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

    rows = 0
    with pq.ParquetWriter(path, arrow_schema(), compression=COMPRESSION) as writer:
        for b in batches:
            t = to_canonical(b)
            if t.num_rows:
                writer.write_table(t, row_group_size=row_group_rows)
                rows += t.num_rows
    return rows
