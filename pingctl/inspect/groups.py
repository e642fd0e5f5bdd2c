"""Statistics per group of a canonical table (`inspect --by`), the figures ripe-atlas-tools' ping
report gives per probe and more, optionally per time bucket (`--every`), computed by DuckDB over
the checked view every step reads (rows it would reject left out)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pingctl.artifacts.table import resolve_inputs
from pingctl.atomic import atomic_file
from pingctl.errors import UsageError
from pingctl.schema.duck import canonical_query, connect, one
from pingctl.schema.spreadsheet import json_rows, json_text, write_csv
from pingctl.schema.times import parse_duration

# The key columns of each grouping, (name, SQL over the checked view `c`). A probe is its id;
# rows without one (a synth world, a table from elsewhere) are grouped by their source address
# instead. A pair is one probe's path in one measurement, as ripe-atlas-tools reports it.
KEYS = {
    "pair": (("src_addr", "c.src_addr"), ("dst_addr", "c.dst_addr"), ("prb_id", "c.prb_id"),
             ("msm_id", "c.msm_id"), ("ip_version", "c.ip_version")),
    "probe": (("prb_id", "c.prb_id"), ("src_addr", "CASE WHEN c.prb_id IS NULL THEN c.src_addr END")),
    "destination": (("dst_addr", "c.dst_addr"),),
    "msm": (("msm_id", "c.msm_id"),),
    "prefix": (("dst_prefix", "p.prefix"),),
}
PREFIX_BITS = {4: 24, 6: 48}  # --by prefix: the destination's network of this length
# what each grouping also counts: how many distinct hosts are at the other end (or in it)
_PROBE = "COALESCE('prb:' || c.prb_id::VARCHAR, 'src:' || c.src_addr)"
OTHER_END = {"pair": (), "probe": (("destinations", "c.dst_addr"),), "destination": (("sources", "c.src_addr"),),
             "msm": (("probes", _PROBE), ("destinations", "c.dst_addr")),
             "prefix": (("destinations", "c.dst_addr"), ("probes", _PROBE))}
FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json"}
# the packets of a result: every row of it shares these (packet_error_count counts its errors)
_RESULT = "c.msm_id, c.prb_id, c.src_addr, c.dst_addr, c.event_time"
# replies, not counting duplicates: what received, the RTT figures and the jitter are of
_REPLY = "NOT is_dup AND rtt >= 0"


def _names(by: str, every: int | None) -> list[str]:
    return [name for name, _ in KEYS[by]] + (["bucket_start"] if every else [])


def _sql(by: str, every: int | None) -> str:
    """One row per group (and time bucket): the keys, then the figures (docs/data.md)."""
    names = _names(by, every)
    keys = ", ".join(f"{sql} AS {name}" for name, sql in KEYS[by])
    bucket = f", make_timestamp((epoch_us(c.event_time) // {every}) * {every})::TIMESTAMPTZ AS bucket_start" \
        if every else ""
    prefix = "JOIN _prefix p ON p.addr = c.dst_addr" if by == "prefix" else ""
    others = "".join(f", {sql} AS _other_{name}" for name, sql in OTHER_END[by])
    part = ", ".join(names)
    return f"""
        WITH keyed AS (
          SELECT {keys}{bucket}, c.event_time, c.rtt, COALESCE(c.dup, false) AS is_dup, c._file, c._row,
                 -- each of a result's n rows carries its e errors: e / n per row sums to e
                 c.packet_error_count / count(*) OVER (PARTITION BY {_RESULT}) AS error_part{others}
          FROM canonical c {prefix} WHERE c.reject_reason IS NULL
        ), stepped AS (
          -- consecutive packets sent (duplicates apart), in time, then in the table's own order
          SELECT *, CASE WHEN {_REPLY} AND prev >= 0 THEN abs(rtt - prev) END AS step_ms
          FROM (SELECT *, lag(rtt) OVER (PARTITION BY {part}, is_dup ORDER BY event_time, _file, _row) AS prev
                FROM keyed)
        ), stats AS (
          SELECT {part},
                 count(*) AS count,
                 count(*) FILTER (WHERE NOT is_dup) AS sent,
                 count(*) FILTER (WHERE {_REPLY}) AS received,
                 min(rtt) FILTER (WHERE {_REPLY}) AS rtt_min_ms,
                 avg(rtt) FILTER (WHERE {_REPLY}) AS rtt_mean_ms,
                 max(rtt) FILTER (WHERE {_REPLY}) AS rtt_max_ms,
                 quantile_cont(rtt, 0.05) FILTER (WHERE {_REPLY}) AS rtt_p5_ms,
                 quantile_cont(rtt, 0.5) FILTER (WHERE {_REPLY}) AS rtt_p50_ms,
                 quantile_cont(rtt, 0.95) FILTER (WHERE {_REPLY}) AS rtt_p95_ms,
                 avg(step_ms) AS ipdv_ms,
                 sum(error_part) AS _errors,
                 count(*) FILTER (WHERE is_dup) AS duplicates,
                 min(event_time) AS first_time, max(event_time) AS last_time
                 {"".join(f", count(DISTINCT _other_{name}) AS {name}" for name, _ in OTHER_END[by])}
          FROM stepped GROUP BY {part}
        ), ranked AS (
          SELECT *, sum(count) OVER (PARTITION BY {", ".join(n for n in names if n != "bucket_start")}) AS _total
          FROM stats
        )
        SELECT *, 100.0 * (sent - received) / nullif(sent, 0) AS loss_pct,
               _errors / nullif(sent, 0) AS error_share, duplicates / count AS dup_share,
               -- largest groups first, ties broken by the keys: a table lists its groups in one order
               dense_rank() OVER (ORDER BY _total DESC, {_key_order(by)}) AS _rank
        FROM ranked"""


def _key_order(by: str) -> str:
    return ", ".join(f"{name} NULLS LAST" for name, _ in KEYS[by])


def _columns(by: str, every: int | None) -> list[str]:
    """The output's columns in reading order: keys, packets, RTTs, jitter, shares, times, counts."""
    return _names(by, every) + [
        "count", "sent", "received", "loss_pct", "rtt_min_ms", "rtt_mean_ms", "rtt_max_ms", "rtt_p5_ms",
        "rtt_p50_ms", "rtt_p95_ms", "ipdv_ms", "error_share", "duplicates", "dup_share", "first_time",
        "last_time", *(name for name, _ in OTHER_END[by])]


def check_output(out: Path | None) -> str | None:
    if out is None:
        return None
    fmt = FORMATS.get(Path(out).suffix.lower())
    if fmt is None:
        raise UsageError(f"-o {out}: give a .csv, .json or .parquet file for the groups")
    return fmt


def _register_prefixes(con) -> None:
    """Table `_prefix` (addr, prefix): each valid destination's /24 (IPv4) or /48 (IPv6), parsed
    once per distinct address as the checked view parses them."""
    import pyarrow as pa

    addrs = [a for (a,) in con.execute("SELECT DISTINCT dst_addr FROM canonical WHERE reject_reason IS NULL")
             .fetchall()]
    nets = []
    for a in addrs:
        ip = ipaddress.ip_address(a)
        nets.append(str(ipaddress.ip_network((ip, PREFIX_BITS[ip.version]), strict=False)))
    con.register("_prefix", pa.table({"addr": pa.array(addrs, pa.string()), "prefix": pa.array(nets, pa.string())}))


def group_stats(paths: list[Path], by: str, limit: int = 20, out: Path | None = None,
                memory_limit: str = "4GB", every: str | None = None) -> dict:
    """The `limit` largest groups (0: all) as dicts, with the number of groups and of rows left
    out as invalid; with `every` (a duration, `1h`), one row per group and time bucket, the
    `limit` largest groups with all their buckets. With `out`, every group is written there
    (CSV, JSON or Parquet, atomically)."""
    if by not in KEYS:
        raise UsageError(f"--by {by!r}: choose {', '.join(KEYS)}")
    if limit < 0:
        raise UsageError("--limit must be 0 (all groups) or more")
    every_s = None if every is None else parse_duration(every, "--every", UsageError)
    fmt = check_output(out)
    files = resolve_inputs(paths)
    every_us = None if every_s is None else every_s * 1_000_000
    con = connect(memory_limit)
    try:
        canonical_query(con, files)
        if by == "prefix":
            _register_prefixes(con)
        con.execute(f"CREATE TEMP TABLE groups AS {_sql(by, every_us)}")
        n_groups, n_rows = one(con, "SELECT count(DISTINCT _rank), count(*) FROM groups")
        total, invalid = one(con, "SELECT count(*), count(*) FILTER (WHERE reject_reason IS NOT NULL) FROM canonical")
        cols = _columns(by, every_us)
        ordered = f"SELECT {', '.join(cols)} FROM groups {{}} ORDER BY _rank" + (", bucket_start" if every else "")
        rel = con.sql(ordered.format(f"WHERE _rank <= {int(limit)}" if limit else ""))
        rows = rel.fetchall()
        if out is not None:
            meta = {"by": by, "every": every, "path": ", ".join(map(str, paths))}
            _write(con, ordered.format(""), Path(out), fmt, meta)
    finally:
        con.close()
    top = [dict(zip(cols, r)) for r in rows]
    shown = len({tuple(g[k] for k, _ in KEYS[by]) for g in top})
    return {"kind": "groups", "by": by, "every": every, "every_s": every_s, "path": ", ".join(map(str, paths)),
            "files": len(files), "rows": total, "invalid_rows": invalid, "groups": n_groups, "group_rows": n_rows,
            "limit": limit, "shown": shown, "out": None if out is None else str(out), "columns": cols, "top": top}


def _write(con, sql: str, out: Path, fmt: str, meta: dict) -> None:
    with atomic_file(out) as tmp:
        if fmt == "parquet":
            con.execute(f"COPY ({sql}) TO '{_sql_text(tmp)}' (FORMAT parquet)")
            return
        table = con.sql(sql).to_arrow_table()
        if fmt == "csv":  # the one CSV form (first_time_utc in ISO 8601), not DuckDB's "+00"
            write_csv(table, tmp)
        else:
            tmp.write_text(json_text({"kind": "pingctl-inspect-groups", **meta, "groups": json_rows(table)}))


def _sql_text(p: Path) -> str:
    return str(p).replace("'", "''")
