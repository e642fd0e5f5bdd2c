"""DuckDB over canonical Parquet: the checked view every pipeline step reads
(`canonical_query`), reject counting and refusal, and connection set-up."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pingctl.errors import PingctlError, duckdb_interrupted, duckdb_out_of_memory
from pingctl.schema.addresses import address_map
from pingctl.schema.columns import COLUMNS, MAX_RTT_MS, MAX_TTL, REJECT_REASONS, SEED_COLUMNS
from pingctl.schema.parquet import check_parquet_columns, verify_head
from pingctl.schema.times import MIN_TIME, max_time

# Unix seconds -> TIMESTAMPTZ, NULL (a bad_time reject) where to_timestamp would raise
_X = "TRY_CAST(event_time AS DOUBLE)"
_SECONDS = f"CASE WHEN isfinite({_X}) AND abs({_X}) < 1e11 THEN to_timestamp({_X}) END"
_TIME_SQL = {
    "timestamp": "TRY_CAST(event_time AS TIMESTAMPTZ)",
    "integer": _SECONDS,  # its own group, apart from floats: the raw text of a reject stays exact
    "number": _SECONDS,
    "text": f"COALESCE(TRY_CAST(event_time AS TIMESTAMPTZ), {_SECONDS})",
}


def _time_kind(schema) -> str:
    import pyarrow as pa

    t = schema.field("event_time").type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    return "text"


def _bigint_sql(col: str, duck_type: str) -> str:
    """SQL for column `col` (of DuckDB type `duck_type` in `_raw`) as BIGINT, NULL where the
    value is not an integer: a plain cast would round 1.5 (or '1.5') to 2 and take true as 1.
    Integral floats (4.0) are fine; booleans are refused, as `ingest` refuses JSON booleans.
    Chosen per type once, so an integer column (the usual case) costs one cast, as before."""
    t = duck_type.upper()
    x = f"r.{col}"
    if t == "BOOLEAN":
        return "NULL::BIGINT"
    if t in ("FLOAT", "DOUBLE", "REAL") or t.startswith("DECIMAL"):
        # NaN = NaN is true in DuckDB, but NaN/inf do not cast: NULL either way
        return f"CASE WHEN {x} = trunc({x}) THEN TRY_CAST({x} AS BIGINT) END"
    if t == "VARCHAR":
        d = f"TRY_CAST({x} AS DOUBLE)"
        return f"CASE WHEN {d} = trunc({d}) THEN TRY_CAST({x} AS BIGINT) END"
    return f"TRY_CAST({x} AS BIGINT)"


def _double_sql(col: str, duck_type: str) -> str:
    """`col` as DOUBLE, NULL where it is not a number (booleans included, as in `ingest`)."""
    return "NULL::DOUBLE" if duck_type.upper() == "BOOLEAN" else f"TRY_CAST(r.{col} AS DOUBLE)"


def _dup_sql(duck_type: str) -> str:
    """`dup` as BOOLEAN, NULL where it is not one: true/false, or 1/0 as numbers or text (a
    cast alone would take any non-zero number as true, and 2 duplicates is no flag)."""
    if duck_type.upper() == "BOOLEAN":
        return "r.dup"
    return ("CASE lower(trim(r.dup::VARCHAR)) WHEN 'true' THEN true WHEN '1' THEN true "
            "WHEN 'false' THEN false WHEN '0' THEN false END")


# Schema version 2's columns (pingctl.schema.columns), with their type where a file lacks them:
# every `_raw` view has them, so a reader (shard's rejects) can name them whatever the input's
# version; a version-1 table reads as all null.
_V2_COLUMNS = {"ttl": "BIGINT", "dst_name": "VARCHAR", "dup": "BOOLEAN"}
_NUMERIC_COLUMNS = ("msm_id", "ip_version", "rtt", "size", "packet_error_count", "prb_id", "ttl")


def _bool_columns(schema) -> tuple[str, ...]:
    import pyarrow as pa

    return tuple(c for c in _NUMERIC_COLUMNS if c in schema.names and pa.types.is_boolean(schema.field(c).type))


def _sql_list(files: list[Path]) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def _first_unreadable(files: list[Path]) -> str | None:
    """The file (and why) behind a DuckDB read error, which names none: the error path only, so
    reading every row group again costs nothing on good input."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pf = pq.ParquetFile(f)
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
        except Exception as e:  # noqa: BLE001 - pyarrow raises OSError/ArrowInvalid/...
            return f"{f}: {e}"
    return None


def all_rejected(con, files: list[Path], read: int) -> PingctlError:
    """The error when no row of `files` is valid: there is no output to hold a rejects file,
    so the message itself gives the count and first row of each reason, with its meaning."""
    if not read:
        return PingctlError(f"no rows in {len(files)} input file(s)")
    return PingctlError("\n".join([f"no valid rows in {len(files)} input file(s): all {read:,} rejected",
                                   *_reject_lines(con)]))


def reject_counts(con) -> dict:
    """View `canonical`'s rejected rows by reason, most first: reason -> {rows, meaning, first: {file, row}}."""
    rows = con.execute(
        "SELECT reject_reason, count(*), min(struct_pack(f := _file, r := _row)) "
        "FROM canonical WHERE reject_reason IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1"
    ).fetchall()
    return {reason: {"rows": n, "meaning": REJECT_REASONS.get(reason, reason), "first": {"file": first["f"],
                                                                                         "row": first["r"]}}
            for reason, n, first in rows}


def _reject_lines(con) -> list[str]:
    return rejected_lines(reject_counts(con))


def refuse_rejects(files: list[Path], advice: str, memory_limit: str = "4GB") -> None:
    """Raise, naming each reason's count and first file/row, when any row of `files` is one
    the pipeline would reject. For commands that read a table as given (eval's splits), where
    dropping rows silently would change the numbers and keeping them would corrupt them."""
    con = connect(memory_limit)
    try:
        canonical_query(con, files)
        bad = one(con, "SELECT count(*) FROM canonical WHERE reject_reason IS NOT NULL")[0]
        if bad:
            raise PingctlError("\n".join([f"{len(files)} input file(s) hold {bad:,} row(s) pingctl would reject; "
                                           + advice, *_reject_lines(con)]))
    finally:
        con.close()


def _raw_view(con, files: list[Path], schemas: dict, head: int | None):
    """View `_raw`: every file's rows as read, with this version's optional columns (null where no
    file has them). Returns (the distinct address texts, `_raw`'s column types)."""
    # Files are read in groups of one event_time type, each group's time made TIMESTAMPTZ
    # before the union: DuckDB's union_by_name would otherwise unify a timestamp column with
    # another file's string or integer seconds (every valid row rejected, or a crash).
    # Likewise by which numeric columns are boolean: those are read as text ('true'), which no
    # numeric check accepts, as union_by_name would make true a BIGINT 1 beside an int file.
    groups: dict[tuple[str, tuple[str, ...]], list[Path]] = {}
    for f in files:
        groups.setdefault((_time_kind(schemas[f]), _bool_columns(schemas[f])), []).append(f)
    parts = [
        f"SELECT * REPLACE ({_TIME_SQL[kind]} AS event_time"
        + "".join(f", {c}::VARCHAR AS {c}" for c in bools)
        + "), event_time IS NULL AS _time_missing, event_time::VARCHAR AS _time_raw "
        f"FROM read_parquet({_sql_list(group)}, filename=true, file_row_number=true, union_by_name=true)"
        + (f" LIMIT {int(head)}" if head is not None else "")
        for (kind, bools), group in groups.items()
    ]
    try:
        con.execute("CREATE OR REPLACE TEMP VIEW _raw_files AS " + " UNION ALL BY NAME ".join(parts))
        present = {name for name, *_ in con.execute("DESCRIBE _raw_files").fetchall()}
        fill = "".join(f", NULL::{t} AS {c}" for c, t in _V2_COLUMNS.items() if c not in present)
        con.execute(f"CREATE OR REPLACE TEMP VIEW _raw AS SELECT *{fill} FROM _raw_files")
        distinct = con.sql(
            "SELECT DISTINCT a FROM (SELECT src_addr::VARCHAR AS a FROM _raw UNION ALL "
            "SELECT dst_addr::VARCHAR FROM _raw)"
        ).to_arrow_table()
        raw_types = {name: typ for name, typ, *_ in con.execute("DESCRIBE _raw").fetchall()}
    except Exception as e:  # noqa: BLE001 - duckdb raises many types for unreadable data
        if duckdb_interrupted(e) or duckdb_out_of_memory(e):
            raise  # not the input's fault: the CLI names these
        raise PingctlError(f"cannot read input Parquet: {_first_unreadable(files) or e}") from None
    return distinct, raw_types


def canonical_query(con, files: list[Path], view: str = "canonical", head: int | None = None) -> None:
    """Create DuckDB view `view`: canonical columns + `reject_reason` (NULL = valid) + provenance.

    `head` reads only the first `head` rows of each group of files (in file order when the
    connection preserves insertion order), so a look at a few rows does not scan a 100M-row table.

    Addresses are validated by parsing each *distinct* string once in Python (DuckDB's inet
    extension would need a download); the result is joined back, so 100M rows cost one
    parse per unique address.
    """
    schemas: dict = {}
    has_prb = check_parquet_columns(files, schemas)
    distinct, raw_types = _raw_view(con, files, schemas, head)
    con.register("_addr_map", address_map(distinct.column(0).to_pylist()))
    prb = _bigint_sql("prb_id", raw_types["prb_id"]) if has_prb else "NULL::BIGINT"
    prb_present = "r.prb_id IS NOT NULL" if has_prb else "false"
    i64 = {c: _bigint_sql(c, raw_types[c]) for c in ("msm_id", "ip_version", "size", "packet_error_count")}
    rtt = _double_sql("rtt", raw_types["rtt"])
    ttl, dup = _bigint_sql("ttl", raw_types["ttl"]), _dup_sql(raw_types["dup"])
    lo = MIN_TIME.strftime("%Y-%m-%d %H:%M:%S+00")
    hi = max_time().strftime("%Y-%m-%d %H:%M:%S+00")
    # event_time may be a timestamp of any unit/zone, or integer Unix seconds.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW {view} AS
        WITH typed AS (
          SELECT
            {i64["msm_id"]} AS msm_id,
            r.event_time, r._time_missing,
            r.src_addr::VARCHAR AS raw_src, r.dst_addr::VARCHAR AS raw_dst,
            {i64["ip_version"]} AS ip_version,
            {rtt} AS rtt,
            {i64["size"]} AS size,
            {i64["packet_error_count"]} AS packet_error_count,
            {prb} AS prb_id,
            {ttl} AS ttl, r.dst_name::VARCHAR AS dst_name, {dup} AS dup,
            r.ttl IS NOT NULL AS _ttl_present, r.dup IS NOT NULL AS _dup_present,
            -- nulls in the input itself; a typed NULL beside a present value is a bad value
            (r.msm_id IS NULL OR r._time_missing OR r.src_addr IS NULL OR r.dst_addr IS NULL
              OR r.ip_version IS NULL OR r.rtt IS NULL OR r.size IS NULL
              OR r.packet_error_count IS NULL) AS _null_field,
            {prb_present} AS _prb_present,
            r.filename AS _file, r.file_row_number AS _row
          FROM _raw r
        )
        SELECT
          t.msm_id, t.event_time, COALESCE(s.canon, t.raw_src) AS src_addr,
          COALESCE(d.canon, t.raw_dst) AS dst_addr, t.ip_version, t.rtt, t.size,
          t.packet_error_count, t.prb_id, t.ttl, t.dst_name, t.dup, t._file, t._row,
          CASE
            WHEN t._null_field THEN 'null_field'
            WHEN s.canon IS NULL THEN CASE WHEN s.mapped THEN 'ipv4_mapped' ELSE 'bad_src_addr' END
            WHEN d.canon IS NULL THEN CASE WHEN d.mapped THEN 'ipv4_mapped' ELSE 'bad_dst_addr' END
            -- below, a NULL typed value is a present value that is not of the column's type
            WHEN t.ip_version IS NULL OR t.ip_version NOT IN (4, 6) THEN 'bad_ip_version'
            WHEN s.version <> t.ip_version OR d.version <> t.ip_version THEN 'af_mismatch'
            -- isfinite, not isnan: DuckDB 2.0 folds isnan() to false from Parquet statistics.
            WHEN t.rtt IS NULL OR NOT isfinite(t.rtt) OR (t.rtt < 0 AND t.rtt <> -1.0)
              OR t.rtt > {MAX_RTT_MS!r}::DOUBLE THEN 'bad_rtt'
            WHEN t.event_time IS NULL OR t.event_time < TIMESTAMPTZ '{lo}' OR t.event_time > TIMESTAMPTZ '{hi}'
              THEN 'bad_time'
            WHEN t.size IS NULL OR t.size < 0 THEN 'bad_size'
            WHEN t.packet_error_count IS NULL OR t.packet_error_count < 0 THEN 'bad_error_count'
            -- ingest refuses negative ids; a table from elsewhere must not bring them in
            WHEN t.msm_id IS NULL OR t.msm_id < 0 THEN 'bad_msm_id'
            WHEN (t._prb_present AND t.prb_id IS NULL) OR t.prb_id < 0 THEN 'bad_prb_id'
            WHEN (t._ttl_present AND t.ttl IS NULL) OR t.ttl < 0 OR t.ttl > {MAX_TTL} THEN 'bad_ttl'
            WHEN t._dup_present AND t.dup IS NULL THEN 'bad_dup'
          END AS reject_reason
        FROM typed t
        LEFT JOIN _addr_map s ON s.addr = t.raw_src
        LEFT JOIN _addr_map d ON d.addr = t.raw_dst
        """
    )



def canonical_head(files: list[Path], limit: int | None, memory_limit: str = "4GB"):
    """The first `limit` rows (None: all) of `files` in file order, checked as every pipeline
    step checks them. A command that only shows or prompts with rows (tokenize, sample
    --context) must not take as valid what build-rows would reject.

    Returns (valid rows as an Arrow table of the canonical columns and types, the
    rejected rows as `reject_counts` gives them, rows read).
    """
    import pyarrow as pa

    con = connect(memory_limit)
    tables, rejected, read = [], {}, 0
    try:
        for _, rows in checked_files(con, files, limit, rejected):
            read += rows
            # prb_id too (null where a file has none): a question's probe is found through it
            tables.append(con.sql(f"SELECT {', '.join(COLUMNS)} FROM canonical WHERE reject_reason IS NULL "
                                  "ORDER BY _row").to_arrow_table())
    finally:
        con.close()
    return pa.concat_tables(tables), rejected, read


def checked_files(con, files: list[Path], limit: int | None, rejected: dict) -> Iterator[tuple[int, int]]:
    """`canonical_head`'s reading, one file at a time: for each file, table `canonical` holds
    its first rows (up to `limit` in all; None: every row) as `canonical_query` checks them,
    their reject counts are added to `rejected` (`reject_counts`; an earlier file's first row
    stays first), and (rows of the files before it, its rows) is yielded, so that the first +
    `_row` is a row's place among all the rows read. One reading for the rows a command shows
    and the table `pingctl score` scores in buckets, so both set aside the same rows."""
    con.execute("SET preserve_insertion_order=true")  # "first rows" in file order
    check_parquet_columns(files)  # a missing column is named as such, not as an unreadable page
    read = 0
    for f in files:
        left = None if limit is None else limit - read
        verify_head(f, left, list(SEED_COLUMNS))
        canonical_query(con, [f], view="_checked", head=left)
        # materialised once: the valid rows and the reject counts are both read from it
        con.execute("CREATE OR REPLACE TEMP TABLE canonical AS SELECT * FROM _checked")
        rows = one(con, "SELECT count(*) FROM canonical")[0]
        for reason, e in reject_counts(con).items():
            rejected.setdefault(reason, {**e, "rows": 0})["rows"] += e["rows"]
        yield read, rows
        read += rows
        if limit is not None and read >= limit:
            break


def valid_head(files: list[Path], limit: int | None, label: str):
    """`canonical_head` for an input that must hold valid rows (a prompt's context, rows to
    show): (Arrow table, {"rows_read", "rows_rejected", "rejected"}); an input with no rows, or
    no valid one, is an error naming `label`. Telling the user about the rows skipped is the
    caller's (a CLI warning, a Python warning)."""
    table, rejected, read = canonical_head(files, limit)
    if not read:
        raise PingctlError(f"{label}: the input has no rows")
    first = "" if limit is None else "the first "
    if not table.num_rows:
        raise PingctlError(f"{label}: no valid rows among {first}{read:,}\n" + "\n".join(rejected_lines(rejected)))
    return table, {"rows_read": read, "rows_rejected": sum(e["rows"] for e in rejected.values()), "rejected": rejected}


def rejected_lines(summary: dict) -> list[str]:
    return [f"  {reason}: {e['rows']:,} row(s) ({e['meaning']}); first: {e['first']['file']} row {e['first']['row']}"
            for reason, e in sorted(summary.items(), key=lambda kv: -kv[1]["rows"])]


def one(con, sql: str, params=None) -> tuple:
    """First row of a query, with the result drained: DuckDB 2 refuses new work on a
    connection while a partly fetched (fetchone) result is still open."""
    rows = con.execute(sql, params).fetchall() if params else con.execute(sql).fetchall()
    return rows[0]


def connect(
    memory_limit: str = "8GB", threads: int = 0, temp_dir: Path | None = None, database: Path | None = None
):
    """A DuckDB connection set up for UTC, bounded memory and spilling."""
    import duckdb

    con = duckdb.connect(str(database) if database else ":memory:")
    con.execute("SET TimeZone='UTC'")
    try:
        con.execute(f"SET memory_limit='{memory_limit}'")
    except duckdb.Error as e:
        raise PingctlError(f"bad memory limit {memory_limit!r}: {e}") from None
    if threads:
        con.execute(f"SET threads={int(threads)}")
    if temp_dir is not None:
        con.execute(f"SET temp_directory='{temp_dir}'")
    con.execute("SET preserve_insertion_order=false")
    return con
