"""What `pingctl sample` writes (docs/sample.md): a `--pairs` predictions file (Parquet,
CSV or JSON, with the rows set aside in `P.rejects.jsonl` beside it) and one pair's exact RTT
distribution (`--src --dst -o`), and generated streams (`--n N -o`). The Parquet files carry a `pingctl` schema-metadata key
(JSON), so `pingctl inspect` recognises them by their columns instead of refusing them as
measurement tables that lack canonical columns."""

from __future__ import annotations

import json
from pathlib import Path

from pingctl.atomic import atomic_file, json_default
from pingctl.errors import PingctlError
from pingctl.schema.parquet import WRITE_OPTIONS
from pingctl.schema.spreadsheet import UTC_SUFFIX, unix_seconds, write_csv

PREDICTION_COLUMNS = ("src", "dst", "p_fail", "p50_ms")
DISTRIBUTION_COLUMNS = ("code", "rtt_ms", "probability")
DISTRIBUTION_META = ("src", "dst", "p_fail")  # a CSV repeats them on every row: it has no metadata
SUFFIXES = (".parquet", ".json", ".csv")
PAIRS_SUFFIXES = (".parquet", ".csv", ".json")  # a --pairs predictions file
SINGLE_SUFFIXES = (".parquet", ".csv", ".json")  # a distribution or generated streams


def read(path: Path):
    """(kind, Arrow table, metadata dict) of a sample output, or None if `path` is not one."""
    import pyarrow as pa

    path = Path(path)
    if not path.is_file() or path.suffix not in SUFFIXES:
        return None
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
            if not _kind(schema.names):
                return None
            table = pq.read_table(path)
            meta = json.loads((schema.metadata or {}).get(b"pingctl", b"{}"))
        elif path.suffix == ".csv":
            import pyarrow.csv as pcsv

            reader = pcsv.open_csv(path)  # the header first: a large CSV of something else is not read whole
            if not _kind(reader.schema.names):
                return None
            table, meta = _from_csv(reader.read_all())
        else:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                return None
            if "predictions" in doc:
                rows = doc["predictions"]
                if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                    raise ValueError("`predictions` is not a list of rows")
                table = pa.Table.from_pylist(rows) if rows else pa.table(
                    {c: pa.array([], pa.string() if c in ("src", "dst") else pa.float64()) for c in PREDICTION_COLUMNS})
                meta = {k: v for k, v in doc.items() if k != "predictions"}
            elif all(c in doc for c in DISTRIBUTION_COLUMNS):
                if not all(isinstance(doc[c], list) for c in DISTRIBUTION_COLUMNS):
                    raise ValueError(f"{', '.join(DISTRIBUTION_COLUMNS)} are not lists")
                table = pa.table({c: doc[c] for c in DISTRIBUTION_COLUMNS})
                meta = {k: v for k, v in doc.items() if k not in DISTRIBUTION_COLUMNS}
            else:
                return None
    except (OSError, ValueError, TypeError, AttributeError, pa.ArrowException) as e:
        if path.suffix == ".parquet":
            return None  # not ours to judge: the table reader names what is wrong with it
        raise PingctlError(f"{path}: cannot be read ({e})") from None
    kind = _kind(table.column_names)
    return (kind, table, meta if isinstance(meta, dict) else {}) if kind else None


def _from_csv(table):
    """(table, metadata) of a CSV as `write_predictions`/`write_distribution` wrote it: the
    `time_utc` text back to Unix seconds (`time`, as the other formats hold it), and a
    distribution's src, dst and p_fail (its columns' first row) as metadata."""
    time = "time" + UTC_SUFFIX
    if time in table.column_names:
        seconds = unix_seconds(table.column(time))
        if seconds is not None:
            table = table.set_column(table.column_names.index(time), "time", seconds)
    meta = {}
    if _kind(table.column_names) == "distribution" and table.num_rows:
        meta = {k: table.column(k)[0].as_py() for k in DISTRIBUTION_META if k in table.column_names}
        table = table.select([c for c in DISTRIBUTION_COLUMNS])
    return table, meta


def _kind(names) -> str | None:
    if all(c in names for c in PREDICTION_COLUMNS):
        return "predictions"
    if all(c in names for c in DISTRIBUTION_COLUMNS):
        return "distribution"
    return None


def predictions_table(columns: dict, meta: dict | None = None):
    """The Arrow table of `--pairs` predictions (column arrays, `pingctl.infer.pairs.answer`), as
    every format holds it; `meta` (run, step, ...) in its schema metadata, key `pingctl`."""
    import pyarrow as pa

    table = pa.table({k: pa.array(v, pa.int64() if k in ("line", "row", "ip_version", "time", "context_measurements")
                                  else None) for k, v in columns.items()})
    return table if meta is None else table.replace_schema_metadata({"pingctl": json.dumps(meta)})


def write_predictions(columns: dict, out: Path, meta: dict) -> None:
    """Parquet (run/step in the schema metadata, key `pingctl`), CSV (`time` as `time_utc`,
    ISO 8601: pingctl.schema.spreadsheet) or JSON by suffix; atomic."""
    table = predictions_table(columns)
    with atomic_file(out) as tmp:
        if out.suffix == ".json":
            tmp.write_text(json.dumps({**meta, "predictions": table.to_pylist()}, indent=1))
        elif out.suffix == ".csv":
            write_csv(table, tmp, seconds=("time",))
        else:
            import pyarrow.parquet as pq

            pq.write_table(table.replace_schema_metadata({"pingctl": json.dumps(meta)}), tmp, **WRITE_OPTIONS)


def rejects_path(out: Path) -> Path:
    """preds.parquet -> preds.rejects.jsonl, beside it."""
    return out.with_name(out.stem + ".rejects.jsonl")


def write_rejects(rejects: list[dict], path: Path) -> None:
    """One JSON object per rejected row, as ingest's rejects.jsonl; atomic."""
    with atomic_file(path) as tmp:
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rejects))


def write_distribution(d, out: Path, src: str, dst: str) -> None:
    """Every RTT code of `d` (an RttDistribution: codes, values_ms, probs, p_fail) with its value
    and P(code | success); P(failure) beside them (Parquet: schema metadata; CSV: src, dst and
    p_fail columns, the same on every row), so users can compute what the printed summary
    leaves out. JSON, CSV or Parquet by suffix; atomic."""
    import pyarrow as pa

    meta = {"src": src, "dst": dst, "p_fail": d.p_fail}
    with atomic_file(out) as tmp:
        if out.suffix == ".json":
            tmp.write_text(json.dumps({**meta, "code": d.codes.tolist(), "rtt_ms": d.values_ms.tolist(),
                                       "probability": d.probs.tolist()}))
            return
        table = pa.table({"code": pa.array(d.codes, pa.uint16()), "rtt_ms": d.values_ms, "probability": d.probs})
        if out.suffix == ".csv":
            n = table.num_rows
            write_csv(table.append_column("src", pa.array([src] * n, pa.string()))
                      .append_column("dst", pa.array([dst] * n, pa.string()))
                      .append_column("p_fail", pa.array([float(d.p_fail)] * n, pa.float64())), tmp)
        else:
            import pyarrow.parquet as pq

            pq.write_table(table.replace_schema_metadata({"pingctl": json.dumps(meta)}), tmp, **WRITE_OPTIONS)


def write_generated(table, stream_id, out: Path) -> None:
    """Generated streams: `table` (canonical Arrow rows, None for none) with each row's stream
    number `stream_id` as a `stream` column (Parquet, CSV) or key (JSON rows); atomic."""
    with atomic_file(out) as tmp:
        if out.suffix == ".json":
            rows = table.to_pylist() if table is not None else []
            for r, s in zip(rows, stream_id):
                r["stream"] = int(s)
            tmp.write_text(json.dumps(rows, default=json_default, indent=1))
        elif out.suffix == ".csv":
            write_csv(_with_stream(table, stream_id), tmp)
        else:
            import pyarrow.parquet as pq

            pq.write_table(_with_stream(table, stream_id), tmp, **WRITE_OPTIONS)


def _with_stream(table, stream_id):
    import pyarrow as pa

    return table.append_column("stream", pa.array(stream_id, pa.int64()))
