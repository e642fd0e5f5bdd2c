"""Split a canonical measurement table into train/val/test Parquet shards with DuckDB.

Strategies
- time:   rows ordered by event_time; the last `test_fraction` of rows is test, the
          `val_fraction` before it val. Cuts fall between distinct timestamps, so every
          test row is strictly later than every train row (temporal generalization).
- probe:  whole vantage points held out (probe = prb_id, else src_addr).
- pair:   whole (src_addr, dst_addr) pairs held out.
- random: each row independently.
For probe/pair the fractions are shares of *groups*, chosen exactly (groups ranked by an
md5 of key+seed), so row shares follow group sizes; the summary reports both.

Everything is computed in an on-disk DuckDB database under the output's temp directory,
with `memory_limit` in force, so inputs far larger than memory spill instead of failing.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

from pingctl import __version__
from pingctl.artifacts.table import SPLITS, refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import MANIFEST, atomic_dir, check_replaceable, write_json
from pingctl.benchutil import run_measured
from pingctl.config import ShardConfig
from pingctl.errors import ConfigError, PingctlError
from pingctl.schema.columns import COLUMNS
from pingctl.schema.duck import all_rejected, canonical_query, connect, one
from pingctl.schema.parquet import write_canonical

Progress = Callable[[str, int, int], None]

_GROUP_KEY = {
    "probe": "COALESCE('prb:' || prb_id::VARCHAR, 'src:' || src_addr)",
    "pair": "src_addr || '>' || dst_addr",
}


def _ts(value) -> str:
    return f"TIMESTAMPTZ '{value.isoformat()}'"


def _noop(_step: str, _done: int, _total: int) -> None:
    pass


def _assign_splits(con, cfg: ShardConfig) -> dict:
    """Create table `assigned` (canonical columns + split + shard). Returns cut details."""
    val_f, test_f = cfg.val_fraction, cfg.test_fraction
    if val_f + test_f >= 1.0:  # the config model refuses it; a library caller may pass a model_construct
        raise ConfigError(f"val_fraction + test_fraction must be < 1 (got {val_f} + {test_f})")
    details: dict = {}
    if cfg.strategy == "time":
        cuts = one(
            con,
            "SELECT quantile_disc(event_time, ?), quantile_disc(event_time, ?) "
            "FROM canonical WHERE reject_reason IS NULL",
            [1.0 - test_f - val_f, 1.0 - test_f],
        )
        val_start, test_start = cuts
        details = {"val_start": val_start, "test_start": test_start}
        # Rows at exactly the cut timestamp go to the later split; empty fractions mean no split.
        split_sql = (
            f"CASE WHEN {test_f} > 0 AND event_time >= {_ts(test_start)} THEN 'test' "
            f"WHEN {val_f} > 0 AND event_time >= {_ts(val_start)} THEN 'val' ELSE 'train' END"
        )
        source = "canonical"
    elif cfg.strategy in _GROUP_KEY:
        con.execute(
            f"""CREATE TEMP TABLE groups AS
            WITH k AS (SELECT DISTINCT {_GROUP_KEY[cfg.strategy]} AS gkey FROM canonical
                       WHERE reject_reason IS NULL),
                 r AS (SELECT gkey, row_number() OVER (ORDER BY md5(gkey || ':{int(cfg.seed)}'), gkey) - 1 AS rk,
                              count(*) OVER () AS n FROM k)
            SELECT gkey, CASE WHEN rk < round(n * {test_f}) THEN 'test'
                              WHEN rk < round(n * {test_f}) + round(n * {val_f}) THEN 'val'
                              ELSE 'train' END AS split
            FROM r"""
        )
        details = {
            "groups": dict(con.execute("SELECT split, count(*) FROM groups GROUP BY split").fetchall())
        }
        source = (
            f"(SELECT c.*, g.split AS gsplit FROM (SELECT *, {_GROUP_KEY[cfg.strategy]} AS gkey "
            "FROM canonical) c JOIN groups g USING (gkey))"
        )
        split_sql = "gsplit"
    else:  # random
        u = f"(hash(msm_id, event_time, src_addr, dst_addr, rtt, _row, {int(cfg.seed)}) % 1000000) / 1e6"
        split_sql = f"CASE WHEN {u} < {test_f} THEN 'test' WHEN {u} < {test_f + val_f} THEN 'val' ELSE 'train' END"
        source = "canonical"
    con.execute(
        f"CREATE TEMP VIEW labelled AS SELECT *, {split_sql} AS split FROM {source} WHERE reject_reason IS NULL"
    )
    counts = dict(con.execute("SELECT split, count(*) FROM labelled GROUP BY split").fetchall())
    shards = {s: max(1, math.ceil(counts.get(s, 0) / cfg.rows_per_shard)) for s in SPLITS}
    # Shard by a content hash: similar sizes, and the same row always lands in the same shard.
    shard_case = "CASE split " + " ".join(f"WHEN '{s}' THEN {n}" for s, n in shards.items()) + " END"
    cols = ", ".join(COLUMNS)
    con.execute(
        f"""CREATE TABLE assigned AS
        SELECT {cols}, split, (hash(src_addr, dst_addr, event_time, rtt, {int(cfg.seed)}) % ({shard_case}))::INT AS shard
        FROM labelled ORDER BY split, shard, event_time, src_addr, dst_addr, rtt"""
    )
    details["rows"] = {s: counts.get(s, 0) for s in SPLITS}
    details["shards"] = shards
    return details


def _verify(con, strategy: str) -> dict:
    """Check disjointness from the written data itself; raises if violated."""
    checks: dict = {}
    if strategy == "time":
        spans = {
            s: (lo, hi)
            for s, lo, hi in con.execute(
                "SELECT split, min(event_time), max(event_time) FROM assigned GROUP BY split"
            ).fetchall()
        }
        ordered = [spans[s] for s in SPLITS if s in spans]
        ok = all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))
        checks["time_ordered"] = ok
    if strategy in _GROUP_KEY:
        shared = one(
            con,
            f"SELECT count(*) FROM (SELECT {_GROUP_KEY[strategy]} AS g FROM assigned "
            "GROUP BY g HAVING count(DISTINCT split) > 1)",
        )[0]
        checks[f"{strategy}s_in_several_splits"] = shared
        ok = shared == 0
    else:
        ok = checks.get("time_ordered", True)
    checks["disjoint"] = bool(ok)
    if not ok:
        raise PingctlError(f"internal check failed: splits are not disjoint ({checks})")
    return checks


def _split_stats(con) -> list[dict]:
    rows = con.execute(
        """SELECT split, count(*) AS rows, count(DISTINCT COALESCE(prb_id::VARCHAR, src_addr)) AS probes,
                  count(DISTINCT (src_addr, dst_addr)) AS pairs, min(event_time) AS start, max(event_time) AS end,
                  sum(CASE WHEN ip_version = 6 THEN 1 ELSE 0 END) AS v6_rows,
                  avg(CASE WHEN rtt = -1.0 THEN 1.0 ELSE 0.0 END) AS failure_share
           FROM assigned GROUP BY split"""
    ).fetchall()
    names = ["split", "rows", "probes", "pairs", "start", "end", "v6_rows", "failure_share"]
    by = {r[0]: dict(zip(names, r)) for r in rows}
    return [by.get(s, {"split": s, "rows": 0}) for s in SPLITS]


def shard(
    inputs: list[str | Path],
    out: Path,
    cfg: ShardConfig,
    force: bool = False,
    progress: Progress = _noop,
) -> dict:
    """Split canonical Parquet `inputs` into `out/{train,val,test}/part-NNNNN.parquet`."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    out = Path(out)
    check_replaceable(out, force, inputs=files)
    total_steps = 4
    with atomic_dir(out) as tmp:
        work = tmp / ".work"
        work.mkdir()
        con = connect(cfg.memory_limit, cfg.threads, temp_dir=work / "spill", database=work / "shard.duckdb")
        progress("validate", 0, total_steps)
        canonical_query(con, files)
        read, rejected = one(
            con, "SELECT count(*), count(*) FILTER (WHERE reject_reason IS NOT NULL) FROM canonical"
        )
        by_reason = dict(
            con.execute(
                "SELECT reject_reason, count(*) FROM canonical WHERE reject_reason IS NOT NULL GROUP BY 1 ORDER BY 1"
            ).fetchall()
        )
        rejects_path = tmp / "rejects.jsonl"
        # `raw` carries the input's own values as text (NaN/inf stay readable JSON strings).
        raw_cols = ", ".join(f"{c} := r.{'_time_raw' if c == 'event_time' else c}::VARCHAR"
                             for c in COLUMNS if c != "prb_id")
        con.execute(
            f"""COPY (SELECT c._file AS file, c._row AS row, c.reject_reason AS reason,
                       struct_pack({raw_cols}) AS raw
                     FROM canonical c JOIN _raw r ON r.filename = c._file AND r.file_row_number = c._row
                     WHERE c.reject_reason IS NOT NULL ORDER BY c._file, c._row)
                TO '{rejects_path}' (FORMAT json)"""
        )
        if read - rejected == 0:
            raise all_rejected(con, files, read)
        progress("assign splits", 1, total_steps)
        con.execute("SET preserve_insertion_order=true")
        details = _assign_splits(con, cfg)
        progress("verify", 2, total_steps)
        checks = _verify(con, cfg.strategy)
        written = 0
        files_out: dict[str, list[str]] = {}
        n_files = sum(details["shards"].values())
        done = 0
        for split in SPLITS:
            (tmp / split).mkdir()
            files_out[split] = []
            for k in range(details["shards"][split]):
                path = tmp / split / f"part-{k:05d}.parquet"
                reader = con.sql(
                    f"SELECT {', '.join(COLUMNS)} FROM assigned WHERE split = '{split}' AND shard = {k} "
                    "ORDER BY event_time, src_addr, dst_addr, rtt"
                ).to_arrow_reader(batch_size=262_144)
                n = write_canonical(reader, path)
                reader.close()  # DuckDB 2 keeps the result open on the connection until closed
                written += n
                files_out[split].append(f"{split}/{path.name}")
                done += 1
                progress(f"write {split} shard {k}", 3 * n_files + done, 4 * n_files)
        stats = _split_stats(con)
        con.close()
        # Reconcile from what is on disk, not from what we meant to write.
        on_disk = sum(pq.ParquetFile(tmp / f).metadata.num_rows for fs in files_out.values() for f in fs)
        if on_disk != written or written + rejected != read:
            raise PingctlError(f"row counts do not reconcile: read {read}, written {on_disk}, rejected {rejected} "
                               "(nothing was written; the likeliest cause is a damaged input file, which DuckDB "
                               "can read differently from one query to the next)")
        import shutil

        shutil.rmtree(work)
        total_rows = max(written, 1)
        for s in stats:
            s["share"] = s["rows"] / total_rows
            s["files"] = len(files_out[s["split"]])
        result = {
            "command": "shard",
            "out": str(out),
            "strategy": cfg.strategy,
            "inputs": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
            "rows_read": read,
            "rows_written": written,
            "rows_rejected": rejected,
            "rejects_by_reason": by_reason,
            "splits": stats,
            "files": files_out,
            "checks": checks,
            "cuts": {k: v for k, v in details.items() if k not in ("rows", "shards")},
            "config": cfg.model_dump(),
            "pingctl_version": __version__,
        }
        write_json(tmp / MANIFEST, result)
    result["elapsed_s"] = time.perf_counter() - t0
    result["rows_per_s"] = read / result["elapsed_s"] if result["elapsed_s"] else 0.0
    progress("done", 1, 1)
    return result


def bench_shard(rows: int, strategies: list[str], memory_limit: str) -> dict:
    """Time `pingctl shard` per strategy on `rows` synthetic rows, each in a child process."""
    import tempfile

    valid = {"time", "probe", "pair", "random"}
    bad = [s for s in strategies if s not in valid]
    if bad:
        raise PingctlError(f"unknown strategy {bad}; choose from {sorted(valid)}")
    table = []
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-shard-") as d:
        data = Path(d) / "synth"
        run_measured(["synth", "-o", str(data), "--rows", str(rows)])
        for strategy in strategies:
            res, elapsed, peak = run_measured(
                ["shard", str(data), "-o", str(Path(d) / strategy), "--strategy", strategy,
                 "--memory-limit", memory_limit]
            )
            table.append(
                {
                    "case": strategy,
                    "rows": res["rows_read"],
                    "seconds": round(elapsed, 2),
                    "rows_per_s": int(res["rows_read"] / elapsed),
                    "peak_rss_mb": round(peak, 1),
                    "files": sum(len(v) for v in res["files"].values()),
                }
            )
    return {
        "name": "shard",
        "table": table,
        "memory_limit": memory_limit,
        "notes": ["seconds are wall time of the whole command (start-up, validation, sort, write)"],
    }
