"""`pingctl score -o DIR`: a table of any size scored a bucket of probes at a time, resumable
(docs/score.md, "A table of any size").

Under the policies `stream`, `probe`, `cold` and `none` a row's prompt holds only rows of its
own probe (prb_id, else the source address: the key of `_score_stream` and of
`context._probe_keys`), and a forward pass gives a sequence the same numbers whatever it is
batched with (`LoadedModel.shape_stable`). So a table split by a hash of the probe key into
buckets, each scored alone, gives every row the scores the whole table would, to the bit; only
the order of the rows changes (grouped by bucket, each in file order; `row` says where a row
was). `both` and `pair` read other probes' rows (the destination's measurements from other
sources; the pair's, whichever probe sent them): they are refused here.

1. `partition`: one reading of the table, checked row by row as a file output's
   (`schema.duck.checked_files`, the reading of `canonical_head`), writes the valid rows into
   bucket files in OUT/.staging/, each with its place in the input (`row`), and the counts of
   the rows set aside. The staging is built beside and renamed into place when complete
   (`atomic_dir`): a rerun reuses a finished one and redoes an interrupted one. DuckDB holds
   one input file's rows under its memory limit and spills the rest into the staging.
2. `score_parts`: each bucket scored by `score_rows` and written as OUT/part-NNNNN.parquet,
   atomically; a rerun skips the parts written (resume), after checking that it scores with
   the settings they were scored with (`.staging/settings.json`).
3. manifest.json last (`score_output.finish_directory`), then the staging removed.
   `summary` reads the parts a few columns at a time: the figures `score.summary` gives of
   one table, the NLL's median exact (`_kth`).
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.artifacts import score_output as SO
from pingctl.artifacts.table import resolve_inputs
from pingctl.atomic import atomic_dir, write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import score as S
from pingctl.prompt import SCORE_POLICIES, Policy, PromptSpec, parse_policy
from pingctl.schema.columns import COLUMNS
from pingctl.schema.duck import checked_files, connect

# A bucket is scored as one table: on average at most this many rows (half MAX_ROWS, so an
# unlucky hash or a busy probe still leaves room); a probe's rows are never split.
BUCKET_ROWS = 500_000
# Every bucket's file is open while the table is read: well below a process's usual 1,024 files
MAX_BUCKETS = 500
MEMORY_LIMIT = "4GB"  # DuckDB's, while it reads the table; it spills beyond it
BATCH_ROWS = 1_000_000  # rows handed from DuckDB to the bucket files at a time
PLAN, SETTINGS = "plan.json", "settings.json"
BUCKETED = (Policy.STREAM, Policy.PROBE, Policy.COLD, Policy.NONE)
# the probe key as `_score_stream` and `context._probe_keys` read it (valid rows have no
# negative prb_id); the hash only has to be the same within one run, which reads it once
KEY_SQL = "hash(COALESCE('p' || prb_id::VARCHAR, 's' || src_addr))"
COLLECT = 2_000_000  # values an order statistic gathers at once (`_kth`): 16 MB


def check_options(context: int = S.CONTEXT, context_policy: str = Policy.STREAM, limit: int | None = None,
                  bucket_rows: int = BUCKET_ROWS) -> None:
    """`score.check_options`, and a policy whose prompts stay within a probe's rows."""
    S.check_options(context, context_policy, limit)
    policy = parse_policy(context_policy, SCORE_POLICIES)
    if policy not in BUCKETED:
        reads = {Policy.BOTH: "the destination's measurements from other sources",
                 Policy.PAIR: "the pair's measurements, whichever probe sent them"}[policy]
        raise UsageError(f"--context-policy {policy} reads other probes' rows ({reads}), so a table cannot be scored "
                         "in buckets of probes: give -o a file (.parquet, .csv or .json) and, for a table of more "
                         f"than {S.MAX_ROWS:,} rows, --limit N for its first rows; or score with "
                         f"{', '.join(BUCKETED)}")
    if not isinstance(bucket_rows, int) or not 1 <= bucket_rows <= S.MAX_ROWS:
        raise UsageError(f"bucket rows {bucket_rows!r}: expected 1 to {S.MAX_ROWS:,} (--bucket-rows)")


# ----------------------------------------------------------------- the buckets


@dataclass
class Partition:
    """A table read into buckets of probes (OUT/.staging/), as `plan.json` there records it:
    the rows read, set aside (`rejected`) and in each bucket. Rows read = scored + rejected."""

    out: Path
    plan: dict

    @property
    def staging(self) -> Path:
        return self.out / SO.STAGING

    @property
    def rows_read(self) -> int:
        return self.plan["rows_read"]

    @property
    def rejected(self) -> dict:
        return self.plan["rejected"]

    @property
    def rows_rejected(self) -> int:
        return sum(e["rows"] for e in self.rejected.values())

    @property
    def rows_valid(self) -> int:
        return sum(b["rows"] for b in self.plan["buckets"])

    def counts(self) -> dict:
        return {"rows_read": self.rows_read, "rows_scored": self.rows_valid, "rows_rejected": self.rows_rejected,
                "rejected": self.rejected}


def partition(table, out: Path, *, limit: int | None = None, bucket_rows: int = BUCKET_ROWS,
              memory_limit: str = MEMORY_LIMIT) -> Partition:
    """The table (a Parquet file, directory or glob; its first `limit` rows) in buckets of about
    `bucket_rows` valid rows under OUT/.staging/: the staging of an interrupted run of the same
    table, limit and bucket size when there is one (another is refused, naming what differs),
    else made anew, after any finished output or parts of an earlier run are removed."""
    if not isinstance(table, (str, Path)):
        raise UsageError(f"table: expected a Parquet path, directory or glob, got {type(table).__name__} (a table in "
                         "memory is scored by Model.score)")
    S.check_options(limit=limit)
    out = Path(out)
    files = resolve_inputs([table])
    # the files themselves, not how TABLE was spelled (a relative path, a trailing slash)
    source = {"files": [_identity(f) for f in files], "limit": limit, "bucket_rows": bucket_rows}
    staging = out / SO.STAGING
    if (staging / PLAN).is_file():
        plan = json.loads((staging / PLAN).read_text())
        _check_same(out, {k: plan.get(k) for k in source}, source)
        return Partition(out, plan)
    made = not out.exists()
    try:
        SO.start_over(out)
        with atomic_dir(staging) as tmp:
            plan = {"table": str(table), **source, **_split(files, tmp, limit, bucket_rows, memory_limit, str(table)),
                    "token": uuid.uuid4().hex}
            write_json(tmp / PLAN, plan)
    except BaseException:
        if made:  # nothing of this run is left behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    return Partition(out, plan)


def _identity(f: Path) -> list:
    st = f.stat()
    return [str(f.resolve()), st.st_size, st.st_mtime_ns]


def _split(files: list[Path], tmp: Path, limit: int | None, bucket_rows: int, memory_limit: str,
           what: str) -> dict:
    """The valid rows of `files` into bucket files in `tmp`: {rows_read, rejected, buckets}."""
    total = S.parquet_rows(files)
    n = total if limit is None else min(total, limit)
    count = min(MAX_BUCKETS, max(1, math.ceil(n / bucket_rows)))
    con = connect(memory_limit, temp_dir=tmp / "spill")
    writers: dict[int, tuple] = {}
    rejected: dict = {}
    read = 0
    try:
        for first, rows in checked_files(con, files, limit, rejected):
            read += rows
            reader = con.sql(
                f"SELECT {', '.join(COLUMNS)}, {int(first)} + _row AS row, ({KEY_SQL} % {count})::BIGINT AS bucket "
                "FROM canonical WHERE reject_reason IS NULL").to_arrow_reader(batch_size=BATCH_ROWS)
            for batch in reader:
                _scatter(batch, writers, tmp)
    finally:
        for writer, _ in writers.values():
            writer.close()
        con.close()
    shutil.rmtree(tmp / "spill", ignore_errors=True)
    S.check_some_valid(what, read, sum(r[0] for _, r in writers.values()), rejected, limit)
    buckets = [{"file": _bucket_name(b), "rows": writers[b][1][0]} for b in sorted(writers)]
    return {"rows_read": read, "rejected": rejected, "buckets": buckets}


def _bucket_name(b: int) -> str:
    return f"bucket-{b:05d}.parquet"


def _scatter(batch, writers: dict, tmp: Path) -> None:
    """Each row of an Arrow batch to its bucket's file (opened on its first row)."""
    import pyarrow.parquet as pq

    from pingctl.schema.parquet import WRITE_OPTIONS

    bucket = batch.column(batch.num_columns - 1).to_numpy()
    order = np.argsort(bucket, kind="stable")
    rows = batch.drop_columns(["bucket"]).take(order)
    keys, starts = np.unique(bucket[order], return_index=True)
    for b, a, z in zip(keys.tolist(), starts, [*starts[1:], len(order)]):
        if b not in writers:
            writers[b] = (pq.ParquetWriter(tmp / _bucket_name(b), rows.schema, **WRITE_OPTIONS), [0])
        writer, counted = writers[b]
        writer.write_batch(rows.slice(a, z - a))
        counted[0] += int(z - a)


def _check_same(out: Path, saved: dict, now: dict) -> None:
    differ = [f"{k}: {_shown(k, saved.get(k))} there, {_shown(k, v)} now" for k, v in now.items() if saved.get(k) != v]
    if differ:
        raise UsageError(f"-o {out} holds an unfinished score with other settings ({'; '.join(differ)}): rerun "
                         "with its settings to finish it, or remove the directory (or give another -o) to start over")


def _shown(key: str, value) -> str:
    if key == "files" and isinstance(value, list) and value:  # path, size, mtime of each: too long to print
        import datetime as dt

        last = dt.datetime.fromtimestamp(max(f[2] for f in value) / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{len(value):,} file(s) of {sum(f[1] for f in value):,} bytes, the last modified {last}"
    return repr(value)


# ----------------------------------------------------------------- scoring the buckets


def score_parts(model, part: Partition, *, context: int = S.CONTEXT, context_policy: str = Policy.STREAM,
                per_pair: int | None = None, progress=None, predictor=None) -> dict:
    """Each bucket of `part` not yet scored, scored by `score.score_rows` and written as a part;
    then manifest.json, and the staging removed. `progress(done, total)` over all valid rows,
    its first call counting the rows of parts an earlier run wrote. Returns the manifest, with
    `parts_resumed` and `rows_resumed`: the parts (and their rows) found already written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_options(context, context_policy)
    progress = progress or (lambda done, total: None)
    spec = PromptSpec.for_model(model.run, policy=context_policy, context=context, per_pair=per_pair, hints=False,
                                allowed=SCORE_POLICIES)
    settings = {"run": str(model.run), "steps": list(model.steps or (model.step,)), "context": context,
                "context_policy": str(spec.policy), "context_per_pair": spec.cap,
                "answer": None if predictor is None else predictor.asked,
                "combination": None if predictor is None else predictor.path}
    _settle(part, settings)
    buckets, token, total = part.plan["buckets"], part.plan["token"], part.rows_valid
    written = [_written(part, i, b, token) for i, b in enumerate(buckets)]
    done = sum(b["rows"] for b, w in zip(buckets, written) if w is not None)
    why: dict = {}
    for w in written:
        _add(why, (w or {}).get("answered_why"))
    progress(done, total)
    for i, b in enumerate(buckets):
        if written[i] is not None:
            continue
        rows = pq.read_table(part.staging / b["file"]).sort_by("row")
        got = S.ScoreInput(rows.drop_columns(["row"]), rows.num_rows, {}, part.plan["table"])
        scored = S.score_rows(model, got, context=context, context_policy=context_policy, per_pair=per_pair,
                              progress=lambda d, _n, base=done: progress(base + d, total), predictor=predictor)
        meta = S.score_meta(scored)
        _add(why, meta.get("answered_why"))
        meta = {k: v for k, v in meta.items() if k not in ("rows_read", "rows_scored", "rows_rejected", "rejected")}
        scored = scored.append_column("row", rows.column("row").cast(pa.int64()))
        meta.update(kind="scores-part", part=i, parts=len(buckets), rows=rows.num_rows, token=token)
        SO.write_scores(scored.replace_schema_metadata({"pingctl": json.dumps(meta)}), SO.part_path(part.out, i))
        done += rows.num_rows
    first = SO.part_meta(SO.part_path(part.out, 0)) or {}
    meta = {k: v for k, v in first.items() if k not in ("kind", "part", "parts", "rows", "token", "answered_why")}
    meta.update(source=part.plan["table"], bucket_rows=part.plan["bucket_rows"], **part.counts())
    if why and predictor is not None:
        meta["answered_why"] = why
    manifest = SO.finish_directory(part.out, meta, len(buckets))
    resumed = [b["rows"] for b, w in zip(buckets, written) if w is not None]
    return {**manifest, "parts_resumed": len(resumed), "rows_resumed": sum(resumed)}


def _settle(part: Partition, settings: dict) -> None:
    """The settings of the parts: those of the first run that scored this staging, kept there;
    another run's must be the same (`_check_same`)."""
    f = part.staging / SETTINGS
    if f.is_file():
        _check_same(part.out, json.loads(f.read_text()), settings)
    else:
        write_json(f, settings)


def _written(part: Partition, index: int, bucket: dict, token: str) -> dict | None:
    """The metadata of part `index` where a run scored it from this staging (None: to score)."""
    meta = SO.part_meta(SO.part_path(part.out, index))
    if meta is None or meta.get("token") != token or meta.get("rows") != bucket["rows"]:
        return None
    return meta


def _add(into: dict, counts: dict | None) -> None:
    for k, v in (counts or {}).items():
        into[k] = into.get(k, 0) + v


# ----------------------------------------------------------------- the summary of the parts


def summary(out: Path, threshold: float | None = None, top: int = 10) -> dict:
    """`score.summary` of a finished score directory, read part by part: the same figures (the
    NLL's mean summed part by part, its median exact), the `top` flagged rows merged as they
    come (ties in tail_p and NLL: the earlier row of the input first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = SO.part_files(out)
    n = failed = below_01 = below_001 = flagged = 0
    nll_sum = context_sum = 0.0
    best = None
    for f in files:
        t = pq.read_table(f, columns=["nll", "tail_p", "rtt", "context_measurements"])
        nll, tail = t.column("nll").to_numpy(), t.column("tail_p").to_numpy()
        n += len(nll)
        failed += int((t.column("rtt").to_numpy() < 0).sum())
        nll_sum += float(nll.sum())
        context_sum += float(t.column("context_measurements").to_numpy().sum())
        below_01, below_001 = below_01 + int((tail < 0.01).sum()), below_001 + int((tail < 0.001).sum())
        if threshold is not None and (tail < threshold).any():
            flagged += int((tail < threshold).sum())
            rows = pq.read_table(f, columns=[*S.TOP_COLUMNS, "row"]).filter(pa.array(tail < threshold))
            best = _most_surprising(rows if best is None else pa.concat_tables([best, rows]), top)
    out_ = {"failed": failed, "context_measurements_mean": context_sum / n if n else 0.0,
            "nll_mean": nll_sum / n if n else None, "nll_median": _median(files, n),
            "below_0.01": below_01, "below_0.001": below_001, "threshold": threshold}
    if threshold is None:
        return out_
    return out_ | {"flagged": flagged, "top": [] if best is None else S.top_rows(best)}


def _most_surprising(rows, top: int):
    nll, tail, row = (rows.column(c).to_numpy() for c in ("nll", "tail_p", "row"))
    return rows.take(np.lexsort((row, -nll, tail))[:top])


def _median(files: list[Path], n: int) -> float | None:
    """np.median of the parts' NLLs taken as one column, without holding them all."""
    if not n:
        return None
    lo, hi = _kth(files, (n - 1) // 2), _kth(files, n // 2)
    return float(lo) if lo == hi else float(np.mean([lo, hi]))


def _keys(values: np.ndarray) -> np.ndarray:
    """float64 -> uint64 in the same order (negative numbers' bits reversed)."""
    u = np.ascontiguousarray(values, np.float64).view(np.uint64)
    return np.where(u >> np.uint64(63), ~u, u | np.uint64(1 << 63))


def _kth(files: list[Path], k: int) -> float:
    """The k-th smallest NLL (0-based) of the parts: 16 bits of its sortable key found per
    reading of the column, until few enough values share the bits found to sort them."""
    import pyarrow.parquet as pq

    def keys():
        for f in files:
            yield _keys(pq.read_table(f, columns=["nll"]).column("nll").to_numpy())

    prefix, bits, count = np.uint64(0), 0, None
    while count is None or (count > COLLECT and bits < 64):
        hist = np.zeros(1 << 16, np.int64)
        shift = np.uint64(64 - bits - 16)
        for key in keys():
            if bits:
                key = key[(key >> np.uint64(64 - bits)) == prefix]
            hist += np.bincount(((key >> shift) & np.uint64(0xFFFF)).astype(np.int64), minlength=1 << 16)
        cum = np.cumsum(hist)
        b = int(np.searchsorted(cum, k, side="right"))
        k -= int(cum[b - 1]) if b else 0
        prefix, bits, count = (prefix << np.uint64(16)) | np.uint64(b), bits + 16, int(hist[b])
    if bits == 64:  # more than COLLECT values equal to it
        key = prefix
    else:
        key = np.sort(np.concatenate([key[(key >> np.uint64(64 - bits)) == prefix] for key in keys()]))[k]
    u = np.where(key >> np.uint64(63), key & ~np.uint64(1 << 63), ~key)
    return float(np.asarray(u, np.uint64).view(np.float64))
