"""Describe canonical measurement tables (a Parquet file/dir, or a shard output's splits)."""

from __future__ import annotations

from pathlib import Path

from pingctl.artifacts.table import SPLITS, expected_splits, resolve_inputs, split_dirs
from pingctl.errors import PingctlError
from pingctl.schema.duck import canonical_query, connect, one, reject_counts

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def describe_table(paths: list[Path], sample: int = 0, memory_limit: str = "4GB") -> dict:
    files = resolve_inputs(paths)
    con = connect(memory_limit)
    canonical_query(con, files)
    qs = ", ".join(f"quantile_cont(rtt, {q}) FILTER (WHERE rtt >= 0)" for q in QUANTILES)
    total, invalid = one(con, "SELECT count(*), count(*) FILTER (WHERE reject_reason IS NOT NULL) FROM canonical")
    row = one(
        con,
        f"""SELECT min(event_time), max(event_time),
               count(*) FILTER (WHERE ip_version = 4), count(*) FILTER (WHERE ip_version = 6),
               count(DISTINCT COALESCE('prb:' || prb_id::VARCHAR, 'src:' || src_addr)),
               count(DISTINCT src_addr), count(DISTINCT dst_addr), count(DISTINCT (src_addr, dst_addr)),
               count(DISTINCT msm_id),
               avg(CASE WHEN rtt = -1.0 THEN 1.0 ELSE 0.0 END),
               avg(CASE WHEN packet_error_count > 0 THEN 1.0 ELSE 0.0 END),
               count(*) FILTER (WHERE prb_id IS NOT NULL), {qs}
            FROM canonical WHERE reject_reason IS NULL""",
    )
    names = [
        "start", "end", "v4_rows", "v6_rows", "probes", "src_addrs", "dst_addrs",
        "pairs", "msm_ids", "failure_share", "error_share", "rows_with_prb_id",
    ]
    out = {"rows": total, "invalid_rows": invalid, **dict(zip(names, row[: len(names)]))}
    out["rtt_ms"] = {f"p{round(q * 100)}": v for q, v in zip(QUANTILES, row[len(names):])}
    out["files"] = len(files)
    out["bytes"] = sum(f.stat().st_size for f in files)
    first = reject_counts(con)
    out["invalid_by_reason"] = {reason: e["rows"] for reason, e in sorted(first.items())}
    out["rejected"] = first  # as tokenize and sample report theirs: rows, meaning, first file/row
    if sample:
        rel = con.sql(
            "SELECT msm_id, event_time, src_addr, dst_addr, ip_version, rtt, size, packet_error_count, prb_id "
            # capped at the table: DuckDB sizes the reservoir by N (--sample 50000000 ran out of memory on 3 rows)
            f"FROM canonical USING SAMPLE reservoir({min(int(sample), total)} ROWS) REPEATABLE (0) ORDER BY event_time"
        )
        out["sample"] = [dict(zip(rel.columns, r)) for r in rel.fetchall()]
    con.close()
    return out


def describe_splits(path: Path, sample: int = 0) -> dict:
    splits = {s: describe_table([d], sample) for s, d in split_dirs(path).items()}
    if not splits:
        rows = [s for s in SPLITS if (Path(path) / s / "manifest.json").exists()]
        hint = f" (these are probe rows: inspect {Path(path) / rows[0]})" if rows else ""
        raise PingctlError(f"{path}: no Parquet data in train/, val/ or test/{hint}")
    missing = [s for s in expected_splits(path) if s not in splits]
    return {"kind": "splits", "path": str(path), "splits": splits, "missing": missing}
