"""Tables as a spreadsheet reads them: the one form of every CSV pingctl writes, and of the JSON
rows written beside such a CSV (docs/data.md, "CSV and JSON outputs").

A time is ISO 8601 in UTC, `2024-01-31T12:00:00Z`, whatever the column held: an Arrow
timestamp (the canonical `event_time`) or Unix seconds (the `seconds` a writer names, as a
`--pairs` row's `time`). A column with sub-second values keeps them (`...T12:00:00.250000Z`);
nothing pingctl writes has any today. A column whose values have a unit says it in its name:
times end in `_utc`, RTTs in `_ms`, sizes in `_bytes`. Without one form, a spreadsheet saw
three: pyarrow's `2024-01-31 12:00:00.000000Z`, DuckDB's `2024-01-31 12:00:00+00` and bare
Unix seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path

UTC_SUFFIX = "_utc"
# the canonical table's columns with a unit (pingctl.schema.columns), as a CSV names them
UNITS = {"rtt": "rtt_ms", "size": "size_bytes"}


def _is_time(name: str, column, seconds) -> bool:
    import pyarrow as pa

    return name in seconds or pa.types.is_timestamp(column.type)


def csv_name(name: str, column, seconds=(), units: dict | None = None) -> str:
    """The name column `name` has in a CSV."""
    if _is_time(name, column, seconds):
        return name if name.endswith(UTC_SUFFIX) else name + UTC_SUFFIX
    return {**UNITS, **(units or {})}.get(name, name)


def iso_utc(column, seconds: bool = False):
    """An Arrow timestamp column, or one of Unix seconds (`seconds`), as ISO 8601 UTC text
    (null stays null), computed with NumPy over the whole column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    missing = column.is_null().to_numpy(zero_copy_only=False)
    if seconds:
        secs = np.asarray(pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False), np.float64)
        missing = missing | ~np.isfinite(secs)
        secs = np.where(missing, 0.0, secs)
        whole = bool(np.all(secs == np.floor(secs)))
        # whole seconds as datetime64[s]: no microsecond overflow however far a time lies
        stamps = secs.astype("datetime64[s]") if whole else np.round(secs * 1e6).astype("datetime64[us]")
    else:
        tz = column.type.tz
        us = pc.fill_null(column.cast(pa.timestamp("us", tz), safe=False).cast(pa.int64()), 0)
        us = np.asarray(us.to_numpy(zero_copy_only=False), np.int64)
        whole = bool(np.all(us % 1_000_000 == 0))
        stamps = (us // 1_000_000).astype("datetime64[s]") if whole else us.astype("datetime64[us]")
    text = np.char.add(np.datetime_as_string(stamps, unit="s" if whole else "us"), "Z")
    return pa.array(text, pa.string(), mask=missing)


def spreadsheet_table(table, seconds=(), units: dict | None = None):
    """`table` as a CSV holds it: times as ISO 8601 UTC text, names with units (`csv_name`),
    dictionary columns decoded, schema metadata dropped (a CSV has no place for it)."""
    import pyarrow as pa

    names, columns = [], []
    for name, column in zip(table.column_names, table.columns):
        if _is_time(name, column, seconds):
            out = iso_utc(column, seconds=name in seconds)
        elif pa.types.is_dictionary(column.type):
            out = column.cast(column.type.value_type)
        else:
            out = column
        names.append(csv_name(name, column, seconds, units))
        columns.append(out)
    return pa.table(columns, names=names)


def write_csv(table, path: Path, seconds=(), units: dict | None = None) -> None:
    """`table` as CSV with a header at `path` (the caller's temp file: outputs are atomic)."""
    import pyarrow.csv as pcsv

    pcsv.write_csv(spreadsheet_table(table, seconds, units), path)


def json_rows(table, seconds=(), units: dict | None = None) -> list[dict]:
    """The rows of `table` as the CSV holds them, for a JSON document: the same names and
    times, and null for NaN (which JSON has no word for)."""
    rows = spreadsheet_table(table, seconds, units).to_pylist()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = None
    return rows


def json_text(doc) -> str:
    """A document holding `json_rows`, as strict JSON."""
    return json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n"


def unix_seconds(column):
    """A `_utc` column read back from such a CSV (ISO 8601 text) as Unix seconds (int64; null
    where empty), for readers that compute with times; None if it holds anything else."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        us = pc.cast(column, pa.timestamp("us", "UTC")).cast(pa.int64())
        return pc.divide(us, 1_000_000)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
