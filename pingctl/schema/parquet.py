"""Canonical Parquet on disk: the column check of an input file, and writing and reading
it the same way everywhere (types, compression, row groups, page checksums)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from pingctl.errors import PingctlError
from pingctl.schema.columns import COLUMNS, OPTIONAL_COLUMNS, SCHEMA_KEY, SEED_COLUMNS, arrow_schema

ROW_GROUP_ROWS = 262_144  # DuckDB parallelises per row group; 256k keeps 100M rows at ~400 groups
COMPRESSION = "zstd"
# Every Parquet file pingctl writes carries a CRC per page: without one, a damaged value page
# of a numeric column decodes to other numbers and nothing can tell (`read_table` and `verify_head` check them).
WRITE_OPTIONS = dict(compression=COMPRESSION, write_page_checksum=True)


def to_canonical(batch):
    """Cast an Arrow table/batch with the seed columns to the exact canonical schema (this
    version's: an optional column it lacks, as in a version-1 table, is added as nulls)."""
    import pyarrow as pa

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    schema = arrow_schema()
    for name in OPTIONAL_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    return table.select(list(COLUMNS)).cast(schema)


def schema_version(schema) -> int:
    """The canonical schema version an Arrow/Parquet schema records (1 where it records none:
    version-1 tables and tables from elsewhere)."""
    raw = (schema.metadata or {}).get(SCHEMA_KEY.encode())
    try:
        return int(raw) if raw is not None else 1
    except ValueError:
        return 1


class PartWriter:
    """Parquet file with row groups of exactly `rows` rows (the last one may be shorter),
    however the batches come (DuckDB hands out 122,880 rows at a time, ingest a block's
    worth). Without `schema` the file is created with the first non-empty table's schema."""

    def __init__(self, path: Path, rows: int, schema=None):
        import pyarrow.parquet as pq

        self.path = path
        self.rows = rows
        self.pending: list = []
        self.pending_rows = 0
        self.writer = None if schema is None else pq.ParquetWriter(path, schema, **WRITE_OPTIONS)
        self.written = 0

    def write(self, table) -> None:
        if table.num_rows == 0:
            return
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= self.rows:
            import pyarrow as pa

            t = pa.concat_tables(self.pending)
            full = (t.num_rows // self.rows) * self.rows
            self._write(t.slice(0, full))
            rest = t.slice(full)
            self.pending = [rest] if rest.num_rows else []
            self.pending_rows = rest.num_rows

    def _write(self, table) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, **WRITE_OPTIONS)
        self.writer.write_table(table, row_group_size=self.rows)
        self.written += table.num_rows

    def close(self) -> bool:
        """Flush and close; returns whether a file was written."""
        if self.pending_rows:
            import pyarrow as pa

            self._write(pa.concat_tables(self.pending))
        self.pending, self.pending_rows = [], 0
        if self.writer is not None:
            self.writer.close()
            return True
        return False

    def abort(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                pass


class PartWriters:
    """`PartWriter`s for many files at once, fed by the caller's thread and written by `threads`
    others, each file always by the same one (its row groups keep their order). Parquet's
    encoding and compression release the GIL, so files are written beside each other and beside
    the caller's reading. Each thread's queue holds at most `queued` tables (memory)."""

    def __init__(self, paths: list[Path], rows: int, schema, threads: int = 2, queued: int = 4):
        import queue
        import threading

        self.paths, self.rows, self.schema = list(paths), rows, schema
        self.open: dict[int, PartWriter] = {}
        self.made: list[PartWriter] = []
        self.closing: set[int] = set()
        self.written: dict[int, int] = {}
        self.failed: list[BaseException] = []
        self.queues = [queue.Queue(maxsize=queued) for _ in range(max(1, threads))]
        self.threads = [threading.Thread(target=self._work, args=(q,), daemon=True) for q in self.queues]
        for t in self.threads:
            t.start()

    def _work(self, q) -> None:
        while (task := q.get()) is not None:
            if not self.failed:  # after a failure, only drain
                try:
                    task()
                except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                    self.failed.append(e)

    def _queue(self, i: int, task) -> None:
        if self.failed:
            raise self.failed[0]
        self.queues[i % len(self.queues)].put(task)

    def _writer(self, i: int) -> PartWriter:
        w = self.open.get(i)
        if w is None:
            w = self.open[i] = PartWriter(self.paths[i], self.rows, schema=self.schema)
            self.made.append(w)
        return w

    def write(self, i: int, table) -> None:
        """Append `table` to file `i`."""
        w = self._writer(i)
        self._queue(i, lambda: w.write(table))

    def close(self, i: int) -> None:
        """Close file `i` (no more rows for it); one that got none is written empty."""
        w = self._writer(i)
        del self.open[i]
        self.closing.add(i)

        def done() -> None:
            w.close()
            self.written[i] = w.written

        self._queue(i, done)

    def finish(self) -> int:
        """Close every file and wait for the threads; returns the rows written."""
        for i in range(len(self.paths)):
            if i not in self.closing:
                self.close(i)
        self._stop()
        if self.failed:
            raise self.failed[0]
        return sum(self.written.values())

    def abort(self) -> None:
        self.failed.append(PingctlError("aborted"))
        self._stop()
        for w in self.made:
            w.abort()

    def _stop(self) -> None:
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            t.join()


def write_canonical(batches: Iterable, path: Path, row_group_rows: int = ROW_GROUP_ROWS) -> int:
    """Stream batches into one Parquet file in whole row groups; returns rows written. Caller
    handles atomicity."""
    writer = PartWriter(path, row_group_rows, schema=arrow_schema())
    try:
        for b in batches:
            writer.write(to_canonical(b))
    except BaseException:
        writer.abort()
        raise
    writer.close()
    return writer.written


def read_table(path, **kwargs):
    """`pq.read_table` that checks each page's CRC where the file carries one (all of
    pingctl's do); a damaged or unreadable file is an error that names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, page_checksum_verification=True, **kwargs)
    except (OSError, pa.ArrowException) as e:
        raise PingctlError(f"{path}: damaged or unreadable Parquet ({e})") from None


def verify_head(path, rows: int | None, columns: list[str]) -> None:
    """Check the CRCs of the pages holding the first `rows` rows (None: all) of `columns`
    (DuckDB, which reads them next, ignores page CRCs); a damaged file is an error that names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

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


def check_parquet_columns(files: list[Path], schemas: dict | None = None) -> bool:
    """Raise unless every file has the eight seed columns; return whether all have prb_id.
    `schemas` receives each file's Arrow schema, for callers that need more of it."""
    import pyarrow.parquet as pq

    all_prb = True
    for f in files:
        try:
            schema = pq.read_schema(f)
        except Exception as e:  # noqa: BLE001 - any pyarrow failure means unreadable
            raise PingctlError(f"{f}: not a readable Parquet file ({e})") from None
        if schemas is not None:
            schemas[f] = schema
        names = set(schema.names)
        missing = [c for c in SEED_COLUMNS if c not in names]
        if missing:
            raise PingctlError(
                f"{f}: missing column(s) {', '.join(missing)}; a measurement table needs "
                + ", ".join(SEED_COLUMNS)
            )
        all_prb &= "prb_id" in names
    return all_prb

