"""Describe canonical measurement tables (a Parquet file/dir, or a shard output's splits)."""

from __future__ import annotations

from pathlib import Path

from pingctl.errors import PingctlError, UsageError
from pingctl.schema import canonical_query, connect, one, reject_counts, resolve_inputs

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def detect(path: Path) -> str:
    """The kind of artifact at `path`: 'run', 'eval', 'splits', 'rows' or 'table'."""
    from pingctl.train.describe import is_run_dir

    path = Path(path)
    if not path.exists():
        raise PingctlError(f"{path}: no such file or directory")
    if is_run_dir(path):
        return "run"
    if path.name == "report.json" or (path.is_dir() and (path / "report.json").is_file()):
        return "eval"
    if path.suffix == ".arrayrecord" or (path.is_dir() and any(path.glob("*.arrayrecord"))):
        return "rows"
    if path.is_dir() and any((path / s).is_dir() for s in ("train", "val", "test")):
        return "splits"
    if path.is_file() and path.suffix != ".parquet":
        raise PingctlError(f"{path}: not a Parquet file, a pingctl output directory or a `pingctl sample` output")
    return "table"


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


def describe(path: Path, sample: int = 0, scheme: str = "compact") -> dict:
    from pingctl import inspect_outputs

    if Path(path).name != "report.json" and (found := inspect_outputs.read(path)):
        kind, table, meta = found
        if kind == "distribution":
            if sample:
                raise UsageError(f"{path}: --sample shows rows of a table, probe rows or predictions, "
                                 "not of one pair's RTT distribution")
            return inspect_outputs.describe_distribution(Path(path), table, meta)
        return inspect_outputs.describe_predictions(Path(path), table, meta, sample)
    from pingctl.infer import calibration as CAL

    if CAL.is_calibration_file(path):
        if sample:
            raise UsageError(f"{path}: --sample shows rows of a table, probe rows or predictions, not of a calibration")
        return CAL.describe(CAL.load(path, option=""))
    kind = detect(path)
    if kind == "run":
        from pingctl.train.describe import describe_run

        if sample:
            raise UsageError(f"{path}: --sample shows rows of a table or probe rows, not of a run directory")
        return describe_run(path)
    if kind == "eval":
        if sample:
            raise UsageError(f"{path}: --sample shows rows of a table or probe rows, not of an eval report")
        return read_eval_report(path)
    if kind == "rows":
        from pingctl.rows.inspect import describe_rows
        from pingctl.rows.layout import to_measurements
        from pingctl.tokenizer import measurement_lengths

        def tokens(rec) -> int:
            # one context per record, every measurement timestamped: the `full` loader mode
            return int(measurement_lengths(to_measurements(rec), scheme).sum())

        return describe_rows(path, sample, tokens)
    if kind == "splits":
        splits = {}
        for s in ("train", "val", "test"):
            d = Path(path) / s
            if d.is_dir() and any(d.glob("*.parquet")):
                splits[s] = describe_table([d], sample)
        if not splits:
            rows = [s for s in ("train", "val", "test") if (Path(path) / s / "manifest.json").exists()]
            hint = f" (these are probe rows: inspect {Path(path) / rows[0]})" if rows else ""
            raise PingctlError(f"{path}: no Parquet data in train/, val/ or test/{hint}")
        missing = [s for s in ("train", "val", "test") if s not in splits]
        return {"kind": "splits", "path": str(path), "splits": splits, "missing": missing}
    return {"kind": "table", "path": str(path), **describe_table([path], sample)}


def read_eval_report(path: Path) -> dict:
    """A `pingctl eval` output (its directory or report.json), checked enough to print its table."""
    import json

    f = Path(path) if Path(path).name == "report.json" else Path(path) / "report.json"
    try:
        report = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise PingctlError(f"{f}: not a readable eval report ({e})") from None
    keys = ("rows", "comparisons", "nll", "queries", "predictors", "inputs")
    missing = [k for k in keys if k not in report] if isinstance(report, dict) else list(keys)
    if missing:
        raise PingctlError(f"{f}: not a `pingctl eval` report (missing {', '.join(missing) or 'everything'})")
    return {"kind": "eval", "path": str(f), **report}
