"""`build-rows`: canonical Parquet (one split) -> probe-centric ArrayRecord records, and/or
destination-centric ones (`by`: source | destination | both; docs/rows.md).

DuckDB validates, maps every distinct address to an integer id and sorts by
(probe, time) — or (destination, time); Python only walks group boundaries (one step per
record, not per measurement) and serializes NumPy slices. Addresses are parsed once per
distinct string. `both` validates once and writes the destination records into
`OUT/by-destination/`, which the source manifest names, so the loader finds them from the
source rows (triangulation contexts, docs/loader.md).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pingctl import __version__
from pingctl.artifacts.table import resolve_inputs
from pingctl.artifacts.table import refuse_whole_shard_output
from pingctl.artifacts.records import BY, DESTINATION_DIR
from pingctl.atomic import MANIFEST, atomic_dir, check_replaceable, write_json
from pingctl.benchutil import run_measured
from pingctl.errors import PingctlError, UsageError
from pingctl.records.layout import BYTES_PER_MEASUREMENT, ProbeRecord, VERSION, encode
from pingctl.schema.duck import all_rejected, canonical_query, connect, one
from pingctl.tokenizer.measurements import parse_addresses

WRITER_OPTIONS = "group_size:1,zstd:1"  # group_size 1: Grain reads records at random
FILE_TARGET_BYTES = 256 << 20
BATCH_ROWS = 1 << 20
Progress = Callable[[str, int, int], None]


def _noop(_s: str, _d: int, _t: int) -> None:
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _address_tables(con) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Give every distinct valid address an id, in the addresses' text order, and every probe
    id a rank in its key's text order (`prb_ranks`); return (uint8[m,16], bool[m], text) by id.
    One read of the split: its distinct (probe id, source, destination) are few."""
    con.execute("""CREATE TEMP TABLE split_ends AS SELECT DISTINCT prb_id, src_addr, dst_addr FROM canonical
                   WHERE reject_reason IS NULL""")
    con.execute(
        """CREATE TEMP TABLE addr_ids AS
           SELECT a, (row_number() OVER (ORDER BY a) - 1)::UINTEGER AS id FROM (
             SELECT src_addr AS a FROM split_ends UNION SELECT dst_addr FROM split_ends)"""
    )
    con.execute("""CREATE TEMP TABLE prb_ranks AS SELECT prb_id, (row_number() OVER (ORDER BY 'prb:' || prb_id) - 1)
                   AS r FROM (SELECT DISTINCT prb_id FROM split_ends WHERE prb_id IS NOT NULL)""")
    names = con.sql("SELECT a FROM addr_ids ORDER BY id").to_arrow_table().column(0)
    addr, v6 = parse_addresses(names, "address")
    return addr, v6, names.to_pylist()


class _Writer:
    """Rolls ArrayRecord files at ~FILE_TARGET_BYTES."""

    def __init__(self, out: Path, prefix: str = "rows"):
        self.out = out
        self.prefix = prefix
        self.files: list[str] = []
        self.records = 0
        self.sizes: list[list[int]] = []  # measurements per record, per file
        self._w = None
        self._bytes = 0

    def write(self, blob: bytes, n: int) -> None:
        from array_record.python import array_record_module

        if self._w is None or self._bytes >= FILE_TARGET_BYTES:
            self.close()
            name = f"{self.prefix}-{len(self.files):05d}.arrayrecord"
            self._w = array_record_module.ArrayRecordWriter(str(self.out / name), WRITER_OPTIONS)
            self.files.append(name)
            self.sizes.append([])
            self._bytes = 0
        self._w.write(blob)
        self._bytes += len(blob)
        self.records += 1
        self.sizes[-1].append(int(n))  # a NumPy int would reach manifest.json as a string

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def _emit_probe(writer: _Writer, cols: dict, lo: int, hi: int, key: str, addr: np.ndarray, v6: np.ndarray,
                max_n: int) -> list[tuple[int, int]]:
    """Write rows [lo, hi) of one probe (or destination) `key` as one or more records of <= max_n
    measurements; returns (record id, first time) of each."""
    prb = cols["prb_id"][lo]
    parts = []
    for part, start in enumerate(range(lo, hi, max_n)):
        end = min(start + max_n, hi)
        src_u, src_idx = np.unique(cols["src_id"][start:end], return_inverse=True)
        dst_u, dst_idx = np.unique(cols["dst_id"][start:end], return_inverse=True)
        rec = ProbeRecord(
            probe=key,
            prb_id=None if prb < 0 else int(prb),
            part=part,
            time_s=cols["t"][start:end],
            rtt_ms=cols["rtt"][start:end],
            msm_id=cols["msm_id"][start:end],
            src_idx=src_idx.astype(np.uint32),
            dst_idx=dst_idx.astype(np.uint32),
            size=cols["size"][start:end],
            errors=cols["errors"][start:end],
            src_addr=addr[src_u],
            src_v6=v6[src_u],
            dst_addr=addr[dst_u],
            dst_v6=v6[dst_u],
        )
        parts.append((writer.records, int(cols["t"][start])))
        writer.write(encode(rec), end - start)
    return parts


# The group key (its text names the record) and sort order of each layout. Sub-second
# precision is dropped: the measurement language counts whole seconds. The rows are sorted by
# `gk`, an integer in the key's text order (a probe id's rank, `prb_ranks`, before every
# address, and addresses by id, which is their text order), because a sort on the text itself
# costs several times more and grows worse than linearly with long shared prefixes.
_GROUPS = {
    "source": ("CASE WHEN c.prb_id IS NOT NULL THEN 'prb:' || c.prb_id ELSE 'src:' || c.src_addr END",
               "COALESCE(c.prb_id, -1)", "COALESCE(p.r, {n_prb} + s.id)", "gk, t, dst_id, rtt"),
    "destination": ("'dst:' || c.dst_addr", "-1", "d.id", "gk, t, src_id, rtt"),
}


def build_rows(
    inputs: list[str | Path],
    out: Path,
    max_row_mb: float = 8.0,
    memory_limit: str = "4GB",
    threads: int = 0,
    force: bool = False,
    progress: Progress = _noop,
    config: dict | None = None,
    by: str = "source",
    dst_max_row_mb: float | None = None,
) -> dict:
    """Rows of one split into `out`. `by`: `source` (probe records), `destination` (destination
    records, with an index from destination address to records in the manifest) or `both`
    (probe records in `out`, destination records in `out`/by-destination, named by the probe
    manifest). `dst_max_row_mb` cuts destination records (None: `max_row_mb`): the loader
    reads one per triangulation context, so smaller records cost less there."""
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    t0 = time.perf_counter()
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    out = Path(out)
    check_replaceable(out, force, inputs=files)
    max_n = max_measurements(max_row_mb)
    dst_max_n = max_measurements(max_row_mb if dst_max_row_mb is None else dst_max_row_mb)
    with atomic_dir(out) as tmp:
        stats, written = build_groups(files, tmp, by, max_n, dst_max_n, memory_limit, threads, progress)
        common = common_fields(stats, files, config)
        limits = {"source": (max_row_mb, max_n),
                  "destination": (max_row_mb if dst_max_row_mb is None else dst_max_row_mb, dst_max_n)}
        results = {group: group_manifest(out, by, group, w, *limits[group], common) for group, w in written.items()}
        write_manifests(tmp, by, results)
    result = dict(results["destination" if by == "destination" else "source"])
    if by == "both":
        d = results["destination"]
        result["destination"] = {k: d[k] for k in ("out", "records", "destinations", "measurements", "bytes")}
    result["elapsed_s"] = time.perf_counter() - t0
    result["measurements_per_s"] = result["measurements"] / result["elapsed_s"]
    return result


def max_measurements(max_row_mb: float) -> int:
    return max(1, int(max_row_mb * 1e6 // BYTES_PER_MEASUREMENT))


def common_fields(stats: dict, files: list[Path], config: dict | None) -> dict:
    """The manifest fields of the split, the same in each layout's manifest."""
    return {
        "layout_version": VERSION,
        **stats,
        "writer_options": WRITER_OPTIONS,
        "sources": [{"path": str(f), "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files],
        "config": config or {},
        "pingctl_version": __version__,
    }


def group_manifest(out: Path, by: str, group: str, written: dict, max_row_mb: float, max_n: int, common: dict) -> dict:
    """The manifest of one layout's records, from what `build_groups` wrote."""
    fields = {k: v for k, v in written.items() if k != "bytes"}
    return {"command": "build-rows", "by": group,
            "out": str(out if group == "source" or by == "destination" else Path(out) / DESTINATION_DIR),
            **fields, "max_row_mb": max_row_mb, "max_measurements_per_record": max_n, **common,
            "bytes": written["bytes"]}


def group_dirs(tmp: Path, by: str) -> dict[str, Path]:
    """Where each layout of `by` writes its records inside the output `tmp`."""
    dirs = {}
    if by in ("source", "both"):
        dirs["source"] = tmp
    if by in ("destination", "both"):
        dirs["destination"] = tmp / DESTINATION_DIR if by == "both" else tmp
    return dirs


def write_manifests(tmp: Path, by: str, results: dict[str, dict]) -> None:
    """The manifest of each layout (`both`: the probe manifest names the destination records)."""
    if by == "both":
        results["source"]["destination_rows"] = DESTINATION_DIR
    for group, where in group_dirs(tmp, by).items():
        write_json(where / MANIFEST, results[group])


def build_groups(files: list[Path], tmp: Path, by: str, max_n: int, dst_max_n: int, memory_limit: str = "4GB",
                 threads: int = 0, progress: Progress = _noop, partition: tuple[int, int] | None = None,
                 prefix: str = "rows", rejects: bool = True) -> tuple[dict, dict[str, dict]]:
    """Validate the split `files` and write the records of each layout of `by` into `tmp`
    (destination records of `both` in `tmp`/by-destination), with `tmp`/rejects.jsonl when
    `rejects`. `partition` (i, n): only the probes (and destinations) whose key's md5 is i
    modulo n, files named PREFIX-NNNNN.arrayrecord (a fanned-out build's task). Returns the
    split's counts and, per layout, the manifest fields of its records (and their bytes)."""
    import shutil

    work = tmp / ".work"
    work.mkdir()
    con = connect(memory_limit, threads, temp_dir=work / "spill")
    canonical_query(con, files)
    progress("validate and index addresses", 0, 1)
    # one read of the split for its counts and time span (each read checks every row again)
    counts = con.execute("SELECT reject_reason, count(*), min(event_time), max(event_time) FROM canonical "
                         "GROUP BY 1 ORDER BY 1").fetchall()
    by_reason = {reason: n for reason, n, _, _ in counts if reason is not None}
    read, rejected = sum(n for _, n, _, _ in counts), sum(by_reason.values())
    if read == rejected:
        raise all_rejected(con, files, read)
    valid, span = next((n, (lo, hi)) for reason, n, lo, hi in counts if reason is None)
    if rejected and rejects:
        con.execute(
            f"""COPY (SELECT _file AS file, _row AS row, reject_reason AS reason FROM canonical
                WHERE reject_reason IS NOT NULL ORDER BY _file, _row) TO '{tmp / 'rejects.jsonl'}' (FORMAT json)"""
        )
    addr, v6, names = _address_tables(con)
    stats = {"rows_read": read, "rows_rejected": rejected, "rejects_by_reason": by_reason, "start": span[0],
             "end": span[1]}
    results = {}
    for group, where in group_dirs(tmp, by).items():
        where.mkdir(exist_ok=True)
        key = _GROUPS[group][0]
        only = "" if partition is None else f" AND md5_number({key}) % {int(partition[1])} = {int(partition[0])}"
        expected = valid if partition is None else one(
            con, f"SELECT count(*) FROM canonical c WHERE c.reject_reason IS NULL{only}")[0]
        written = _write_group(con, group, where, (addr, v6, names), max_n if group == "source" else dst_max_n,
                               expected, progress, only, prefix)
        written["bytes"] = sum((where / f).stat().st_size for f in written["files"])
        results[group] = written
    con.close()
    shutil.rmtree(work)
    return stats, results


def _key_text(group: str, cols: dict, lo: int, names: list[str]) -> str:
    """The key of the group starting at row `lo`, as `_GROUPS` writes it in SQL."""
    if group == "destination":
        return f"dst:{names[cols['dst_id'][lo]]}"
    prb = int(cols["prb_id"][lo])
    return f"prb:{prb}" if prb >= 0 else f"src:{names[cols['src_id'][lo]]}"


def _write_group(con, group: str, where: Path, addresses: tuple[np.ndarray, np.ndarray, list[str]], max_n: int,
                 total_valid: int, progress: Progress, only: str = "", prefix: str = "rows") -> dict:
    """One layout's records into `where`: the manifest fields that describe them. `addresses`:
    `_address_tables`' bytes, families and text by id."""
    addr, v6, names = addresses
    _, prb, gk, order = _GROUPS[group]
    n_prb = one(con, "SELECT count(*) FROM prb_ranks")[0]
    reader = con.sql(
        f"""SELECT {gk.format(n_prb=int(n_prb))} AS gk, {prb} AS prb_id, epoch(c.event_time)::BIGINT AS t, c.rtt,
                  c.msm_id, s.id AS src_id, d.id AS dst_id, c.size::INTEGER AS size,
                  c.packet_error_count::INTEGER AS errors
           FROM canonical c JOIN addr_ids s ON s.a = c.src_addr JOIN addr_ids d ON d.a = c.dst_addr
             LEFT JOIN prb_ranks p ON p.prb_id = c.prb_id
           WHERE c.reject_reason IS NULL{only}
           ORDER BY {order}"""
    ).to_arrow_reader(batch_size=BATCH_ROWS)
    writer = _Writer(where, prefix)
    groups = measurements = 0
    index: dict[str, list[list[int]]] = {}
    carry = None
    step = "write records" if group == "source" else "write destination records"

    def emit(cols, lo, hi) -> None:
        key = _key_text(group, cols, lo, names)
        parts = _emit_probe(writer, cols, lo, hi, key, addr, v6, max_n)
        if group == "destination":
            index[key[4:]] = [[rid, t] for rid, t in parts]

    try:
        for batch in reader:
            cols = _columns(batch)
            if carry is not None:
                cols = {k: np.concatenate([carry[k], v]) for k, v in cols.items()}
            keys = cols["gk"]
            starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            bounds = np.r_[starts, len(keys)]
            # The last group may continue in the next batch: keep it back.
            for lo, hi in zip(bounds[:-2], bounds[1:-1]):
                emit(cols, lo, hi)
                groups += 1
                measurements += int(hi - lo)
            last = bounds[-2]
            carry = {k: v[last:] for k, v in cols.items()}
            progress(step, measurements, total_valid)
        if carry is not None and len(carry["t"]):
            emit(carry, 0, len(carry["t"]))
            groups += 1
            measurements += len(carry["t"])
    finally:
        writer.close()
        reader.close()
    if measurements != total_valid:
        raise PingctlError(f"internal: wrote {measurements:,} measurements, expected {total_valid:,}")
    out = {"records": writer.records, "measurements": measurements, "files": writer.files,
           "record_measurements": writer.sizes}
    if group == "source":
        out["probes"] = groups
    else:
        out["destinations"] = groups
        out["index"] = index
    return out


def _columns(batch) -> dict:
    return {n: batch.column(i).to_numpy(zero_copy_only=False) for i, n in enumerate(batch.schema.names)}


def bench_build_rows(rows: int, memory_limit: str, max_row_mb: float) -> dict:
    """Measurements/s and peak RSS of `pingctl build-rows` on `rows` synthetic rows."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pingctl-bench-rows-") as d:
        data = Path(d) / "synth"
        run_measured(["synth", "-o", str(data), "--rows", str(rows)])
        res, elapsed, peak = run_measured(
            ["build-rows", str(data), "-o", str(Path(d) / "rows"), "--memory-limit", memory_limit,
             "--max-row-mb", str(max_row_mb)]
        )
    return {
        "name": "build-rows",
        "table": [
            {
                "case": f"{rows:,} rows",
                "measurements": res["measurements"],
                "records": res["records"],
                "seconds": round(elapsed, 2),
                "meas_per_s": int(res["measurements"] / elapsed),
                "peak_rss_mb": round(peak, 1),
                "mb_out": round(res["bytes"] / 1e6, 1),
            }
        ],
        "memory_limit": memory_limit,
        "notes": [
            "seconds are wall time of the whole command (start-up, validation, sort, serialize, write)",
            "seed anchor: its best streaming script did 108k measurements/s",
        ],
    }
