"""Per-pair, per-probe and per-destination statistics of a canonical table (`inspect --by`),
computed by DuckDB over the checked view every step reads (rows it would reject left out)."""

from __future__ import annotations

from pathlib import Path

from pingctl.artifacts.table import resolve_inputs
from pingctl.atomic import atomic_file
from pingctl.errors import UsageError
from pingctl.schema.duck import canonical_query, connect, one

# the key columns of each grouping. A probe is its id; rows without one (a synth world, a
# table from elsewhere) are grouped by their source address instead
KEYS = {
    "pair": ("src_addr", "dst_addr"),
    "probe": ("prb_id", "CASE WHEN prb_id IS NULL THEN src_addr END AS src_addr"),
    "destination": ("dst_addr",),
}
# what each grouping also counts: how many distinct hosts are at the other end
OTHER_END = {"pair": None, "probe": ("destinations", "dst_addr"), "destination": ("sources", "src_addr")}
FORMATS = {".csv": "csv", ".parquet": "parquet"}


def _order(by: str) -> str:
    # ties in count broken by the keys: the same table lists the same groups in the same order
    return "ORDER BY count DESC, " + ", ".join(f"{k.rsplit(' AS ', 1)[-1]} NULLS LAST" for k in KEYS[by])


def _sql(by: str) -> str:
    keys = KEYS[by]
    other = OTHER_END[by]
    return f"""
        SELECT {", ".join(keys)},
               count(*) AS count,
               avg(CASE WHEN rtt = -1.0 THEN 1.0 ELSE 0.0 END) AS loss_share,
               quantile_cont(rtt, 0.05) FILTER (WHERE rtt >= 0) AS rtt_p5_ms,
               quantile_cont(rtt, 0.5) FILTER (WHERE rtt >= 0) AS rtt_p50_ms,
               quantile_cont(rtt, 0.95) FILTER (WHERE rtt >= 0) AS rtt_p95_ms,
               min(event_time) AS first_time, max(event_time) AS last_time
               {f", count(DISTINCT {other[1]}) AS {other[0]}" if other else ""}
        FROM canonical WHERE reject_reason IS NULL
        GROUP BY ALL"""


def check_output(out: Path | None) -> str | None:
    if out is None:
        return None
    fmt = FORMATS.get(Path(out).suffix.lower())
    if fmt is None:
        raise UsageError(f"-o {out}: give a .csv or .parquet file for the groups")
    return fmt


def group_stats(paths: list[Path], by: str, limit: int = 20, out: Path | None = None,
                memory_limit: str = "4GB") -> dict:
    """The `limit` largest groups (0: all) as dicts, with the number of groups and of rows left
    out as invalid; with `out`, every group is written there (CSV or Parquet, atomically)."""
    if by not in KEYS:
        raise UsageError(f"--by {by!r}: choose pair, probe or destination")
    if limit < 0:
        raise UsageError("--limit must be 0 (all groups) or more")
    fmt = check_output(out)
    files = resolve_inputs(paths)
    con = connect(memory_limit)
    try:
        canonical_query(con, files)
        con.execute(f"CREATE TEMP TABLE groups AS {_sql(by)}")
        n_groups = one(con, "SELECT count(*) FROM groups")[0]
        total, invalid = one(con, "SELECT count(*), count(*) FILTER (WHERE reject_reason IS NOT NULL) FROM canonical")
        rel = con.sql(f"SELECT * FROM groups {_order(by)}" + (f" LIMIT {int(limit)}" if limit else ""))
        cols, rows = rel.columns, rel.fetchall()
        if out is not None:
            with atomic_file(Path(out)) as tmp:
                con.execute(f"COPY (SELECT * FROM groups {_order(by)}) TO '{_sql_text(tmp)}' "
                            f"(FORMAT {fmt})")
    finally:
        con.close()
    return {"kind": "groups", "by": by, "path": ", ".join(map(str, paths)), "files": len(files), "rows": total,
            "invalid_rows": invalid, "groups": n_groups, "limit": limit, "shown": len(rows),
            "out": None if out is None else str(out), "columns": cols,
            "top": [dict(zip(cols, r)) for r in rows]}


def _sql_text(p: Path) -> str:
    return str(p).replace("'", "''")
