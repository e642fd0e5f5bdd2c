"""The canonical measurement table: the one place that defines and validates it.

Columns are exactly the seeds' eight (`SEED_COLUMNS`) plus an optional nullable
`prb_id`. Any Parquet file that has the eight seed columns is accepted as input;
`canonical_query` turns it into the canonical form and says why each bad row is bad.
"""

from __future__ import annotations

import datetime as dt
import glob
import ipaddress
import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from pingctl.errors import PingctlError, duckdb_interrupted, duckdb_out_of_memory

SEED_COLUMNS = (
    "msm_id",
    "event_time",
    "src_addr",
    "dst_addr",
    "ip_version",
    "rtt",
    "size",
    "packet_error_count",
)
OPTIONAL_COLUMNS = ("prb_id",)
COLUMNS = SEED_COLUMNS + OPTIONAL_COLUMNS
FAILED_RTT = -1.0

# RIPE Atlas started in 2010; anything before 2000 or in the future is a unit or clock bug.
MIN_TIME = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
FUTURE_SLACK = dt.timedelta(days=1)


def utc_text(seconds: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Unix seconds as UTC text for people; seconds as such where datetime cannot hold them
    (a generated or mistyped time past year 9999)."""
    if seconds is None:
        return "-"
    try:
        return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime(fmt)
    except (ValueError, OverflowError, OSError):
        return f"{seconds} (Unix s)"

# |timestamp| in seconds at or past this is far outside any valid time, and ts * 1e6 could
# overflow to inf (round() then raises): such floats are rejected before they are scaled.
TS_ABS_MAX_S = 1e15
# ASCII only: float() and int() also take other scripts' digits ('١٢' is 12) and isdigit() '²'
_UNIX_SECONDS_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NON_FINITE_RE = re.compile(r"[+-]?(nan|inf|infinity)", re.I)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def parse_when(value: Any, what: str, error: type[PingctlError] = PingctlError) -> int | None:
    """A time as users give it (ISO 8601, naive = UTC; or Unix seconds) -> Unix microseconds.
    The one parser behind ingest's --since/--until and the --time of tokenize and sample."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return (when - _EPOCH) // dt.timedelta(microseconds=1)
    text = str(value).strip()
    if _UNIX_SECONDS_RE.fullmatch(text) or _NON_FINITE_RE.fullmatch(text):
        secs = float(text)
        if not -TS_ABS_MAX_S < secs < TS_ABS_MAX_S:  # also NaN
            raise error(f"{what} {value!r}: not a valid time (Unix seconds must be finite and within "
                        f"+-{TS_ABS_MAX_S:.0e})")
        return int(text) * 1_000_000 if text.lstrip("+-").isdigit() else round(secs * 1_000_000)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise error(f"{what} {value!r}: expected ISO 8601 (e.g. 2024-01-31T12:00:00Z) or Unix seconds") from None
    return parse_when(when, what, error)


# The largest valid RTT: the RTT codec's largest code (pingctl.tokenizer.rtt_codec.MAX_MS,
# 2047 * 2**31 us, about 50.9 days; kept equal by a test, not imported, so that importing
# this module does not import numpy). Far above any real ping; larger values are unit or
# generator bugs (1e308 ms) that would saturate the codec and wreck percentiles.
MAX_RTT_MS = 2047 * 2**31 / 1000.0

# A value that is present but does not fit its column (text that is not a number, a
# non-integral float in an integer column, a boolean, out of int64 range) gets its
# column's own reason, never `null_field`, so every reason names the column.
REJECT_REASONS = {
    "null_field": "a required column is null",
    "bad_src_addr": "src_addr is not an IP address",
    "bad_dst_addr": "dst_addr is not an IP address",
    "bad_ip_version": "ip_version is not 4 or 6 (or not an integer)",
    "af_mismatch": "address family of src_addr/dst_addr differs from ip_version",
    "bad_rtt": f"rtt is not a number, not finite, above {MAX_RTT_MS:.3f} ms (the RTT codec's MAX_MS), "
    "or negative other than -1.0 (failed)",
    "bad_time": "event_time before 2000-01-01, in the future, or not a time",
    "bad_size": "size is negative or not an integer",
    "bad_error_count": "packet_error_count is negative or not an integer",
    "bad_msm_id": "msm_id is negative or not an integer",
    "bad_prb_id": "prb_id is present but negative or not an integer",
}


def arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("msm_id", pa.int64(), nullable=False),
            pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
            pa.field("src_addr", pa.string(), nullable=False),
            pa.field("dst_addr", pa.string(), nullable=False),
            pa.field("ip_version", pa.int64(), nullable=False),
            pa.field("rtt", pa.float64(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("packet_error_count", pa.int64(), nullable=False),
            pa.field("prb_id", pa.int64(), nullable=True),
        ]
    )


def max_time() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + FUTURE_SLACK


def generated_time_range() -> tuple[int, int]:
    """Unix seconds a generator (synth, `sample --n`) may emit: MIN_TIME to now. The day of
    clock slack a measured row is allowed past now (FUTURE_SLACK) is not for generators."""
    import time

    return int(MIN_TIME.timestamp()), int(time.time())


# ---------------------------------------------------------------- addresses


@lru_cache(maxsize=1 << 20)
def parse_address(text: str) -> tuple[str, int] | None:
    """(canonical text, version) or None. Canonical = `ipaddress`'s compressed lower-case form."""
    if not isinstance(text, str) or not text or len(text) > 45:
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if getattr(ip, "scope_id", None) is not None:
        return None  # fe80::1%eth0: a zone names an interface of one host, not an address
    return str(ip), ip.version


@lru_cache(maxsize=1 << 16)
def is_public(text: str) -> bool:
    """False for private, link-local, loopback, unspecified, ULA, CGN, documentation ... ranges."""
    try:
        return ipaddress.ip_address(text).is_global
    except ValueError:
        return False


def address_map(values: Iterable[str | None]):
    """Arrow table (addr, canon, version) for distinct address strings; invalid -> nulls."""
    import pyarrow as pa

    addrs, canons, versions = [], [], []
    for v in values:
        if v is None:
            continue
        parsed = parse_address(v)
        addrs.append(v)
        canons.append(parsed[0] if parsed else None)
        versions.append(parsed[1] if parsed else None)
    return pa.table(
        {
            "addr": pa.array(addrs, pa.string()),
            "canon": pa.array(canons, pa.string()),
            "version": pa.array(versions, pa.int64()),
        }
    )


def check_rtt(value) -> bool:
    """The canonical table's rtt rule for one value (bad_rtt in `canonical_query` otherwise)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and ((0 <= value <= MAX_RTT_MS) or value == FAILED_RTT)
    )


# ---------------------------------------------------------------- Parquet inputs


def resolve_inputs(items: Iterable[str | Path], suffixes: tuple[str, ...] = (".parquet",)) -> list[Path]:
    """Expand files, directories (recursively) and globs; sorted, de-duplicated."""
    found: list[Path] = []
    for item in items:
        p = Path(item)
        listed = _manifest_files(p) if p.is_dir() else None
        if listed is not None:
            found.extend(listed)
        elif p.is_dir():
            found.extend(
                f for f in sorted(p.rglob("*")) if f.is_file() and f.name.endswith(suffixes) and not _hidden(f, p)
            )
        elif p.is_file():
            found.append(p)
        else:
            matches = sorted(glob.glob(str(item), recursive=True))
            if not matches:
                raise PingctlError(f"input not found: {item}")
            found.extend(Path(m) for m in matches if Path(m).is_file())
    out, seen = [], set()
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise PingctlError("no input files found in " + ", ".join(map(str, items)))
    return out


def _manifest_files(d: Path) -> list[Path] | None:
    """A pingctl output that lists its data files (synth has truth/ tables beside them)."""
    try:
        files = json.loads((d / "manifest.json").read_text()).get("data_files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, list) or not files:
        return None
    # names inside the directory only: a damaged or foreign manifest must not point elsewhere
    if not all(isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts for f in files):
        raise PingctlError(f"{d / 'manifest.json'}: data_files must be file names inside {d}; got {files!r:.200}")
    return [d / f for f in files]


def _hidden(f: Path, root: Path) -> bool:
    # Temp outputs of interrupted runs (".x.tmp-*") must never be read as data.
    return any(part.startswith(".") for part in f.relative_to(root).parts)


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


_NUMERIC_COLUMNS = ("msm_id", "ip_version", "rtt", "size", "packet_error_count", "prb_id")


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
        con.execute("CREATE OR REPLACE TEMP VIEW _raw AS " + " UNION ALL BY NAME ".join(parts))
        distinct = con.sql(
            "SELECT DISTINCT a FROM (SELECT src_addr::VARCHAR AS a FROM _raw UNION ALL "
            "SELECT dst_addr::VARCHAR FROM _raw)"
        ).to_arrow_table()
        raw_types = {name: typ for name, typ, *_ in con.execute("DESCRIBE _raw").fetchall()}
    except Exception as e:  # noqa: BLE001 - duckdb raises many types for unreadable data
        if duckdb_interrupted(e) or duckdb_out_of_memory(e):
            raise  # not the input's fault: the CLI names these
        raise PingctlError(f"cannot read input Parquet: {_first_unreadable(files) or e}") from None
    con.register("_addr_map", address_map(distinct.column(0).to_pylist()))
    prb = _bigint_sql("prb_id", raw_types["prb_id"]) if has_prb else "NULL::BIGINT"
    prb_present = "r.prb_id IS NOT NULL" if has_prb else "false"
    i64 = {c: _bigint_sql(c, raw_types[c]) for c in ("msm_id", "ip_version", "size", "packet_error_count")}
    rtt = _double_sql("rtt", raw_types["rtt"])
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
          t.packet_error_count, t.prb_id, t._file, t._row,
          CASE
            WHEN t._null_field THEN 'null_field'
            WHEN s.canon IS NULL THEN 'bad_src_addr'
            WHEN d.canon IS NULL THEN 'bad_dst_addr'
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
          END AS reject_reason
        FROM typed t
        LEFT JOIN _addr_map s ON s.addr = t.raw_src
        LEFT JOIN _addr_map d ON d.addr = t.raw_dst
        """
    )


CANONICAL_SELECT = ", ".join(COLUMNS)


def canonical_head(files: list[Path], limit: int | None, memory_limit: str = "4GB"):
    """The first `limit` rows (None: all) of `files` in file order, checked as every pipeline
    step checks them. A command that only shows or prompts with rows (tokenize, sample
    --context) must not take as valid what build-rows would reject.

    Returns (valid rows as an Arrow table of the canonical columns and types, the
    rejected rows as `reject_counts` gives them, rows read).
    """
    import pyarrow as pa

    from pingctl.parquet_io import verify_head

    con = connect(memory_limit)
    con.execute("SET preserve_insertion_order=true")  # "first rows" in file order
    tables, rejected, read = [], {}, 0
    check_parquet_columns(files)  # a missing column is named as such, not as an unreadable page
    try:
        for f in files:
            left = None if limit is None else limit - read
            verify_head(f, left, list(SEED_COLUMNS))
            canonical_query(con, [f], view="_checked", head=left)
            # materialised once: the valid rows and the reject counts are both read from it
            con.execute("CREATE OR REPLACE TEMP TABLE canonical AS SELECT * FROM _checked")
            read += one(con, "SELECT count(*) FROM canonical")[0]
            # prb_id too (null where a file has none): a question's probe is found through it
            tables.append(con.sql(f"SELECT {', '.join(COLUMNS)} FROM canonical WHERE reject_reason IS NULL "
                                  "ORDER BY _row").to_arrow_table())
            for reason, e in reject_counts(con).items():  # an earlier file's first row stays first
                rejected.setdefault(reason, {**e, "rows": 0})["rows"] += e["rows"]
            if limit is not None and read >= limit:
                break
    finally:
        con.close()
    return pa.concat_tables(tables), rejected, read


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
