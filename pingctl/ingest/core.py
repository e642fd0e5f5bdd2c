"""`pingctl ingest`: RIPE Atlas ping results (JSON lines/arrays, any compression) -> Parquet.

Layout of the output directory (written atomically: a hidden temp sibling renamed into
place only when everything succeeded):

    part-00000.parquet   rows of input #0 (inputs sorted by path), zstd, row groups of
    part-00001.parquet   `row_group_rows`; an input without rows has no part file
    rejects.jsonl        {"file", "line", "reason", "raw"[, "detail"]} per rejected record
    manifest.json        inputs (size, sha256, part, counts), totals, config, version

Files are processed in parallel (one process per file, largest first; all in this
process when an input is a pipe, which only this process can read); each worker streams
its file and writes its own part, so memory is bounded by a few row groups per worker
whatever the input size, and the output does not depend on the worker count.
`--target slurm|modal` runs the same per-file task (`ingest_file`) elsewhere, one task per
file, and finishes the output the same way (`write_output`): pingctl.ingest.fanout.
Within a `.bz2` file, blocks are decoded in parallel by indexed_bzip2 on cores // workers
threads (so one big dump uses every core); the output does not depend on that either.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from pingctl import __version__
from pingctl.artifacts.table import resolve_inputs
from pingctl.atomic import atomic_dir, check_replaceable, is_pingctl_output, MANIFEST, write_json
from pingctl.processes import die_with_parent
from pingctl.errors import PingctlError, UsageError
from pingctl.ingest.batch import Batch
from pingctl.ingest.counts import merge_counts, new_counts, reconcile, Rejects
from pingctl.ingest.parse import EPOCH, Options, parse_records
from pingctl.ingest.reader import (
    INPUT_SUFFIXES,
    HashingReader,
    ParallelBz2Failed,
    ThreadedChunks,
    decoded_chunks,
    detect_codec,
    iter_records,
    looks_like_results,
    open_parallel_bz2,
    parallel_bz2_chunks,
    usable_cores,
)
from pingctl.schema.columns import arrow_schema, COLUMNS, SCHEMA_VERSION
from pingctl.schema.parquet import PartWriter

REJECTS = "rejects.jsonl"
PARALLEL_BZ2_DEPTH = 16  # decompressed MiB queued ahead of the parser (indexed_bzip2 path)


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def resolve(inputs: Iterable[str | Path], out: Path | None = None) -> list[Path]:
    """Files, directories (recursive, known suffixes) and globs -> sorted unique files.

    A path that exists and is not a directory is one input whatever it is: a regular file,
    or a stream (a pipe as /dev/stdin or bash's `<(...)`, a named FIFO, a device). With
    `out`, an input inside the output is refused (replacing the output would delete it),
    except what a directory walk or a glob finds there: the previous output, never read.
    """
    items = [str(i) for i in inputs]
    if not items:
        raise PingctlError("no inputs given: pass RIPE Atlas result files, directories or globs")
    o = Path(out).resolve() if out is not None else None
    found: list[Path] = []
    for item in items:
        found.extend(_expand(item, out, o))
    seen: set[Path] = set()
    files = []
    for f in sorted(found, key=str):
        key = f.resolve()  # /dev/stdin and /dev/fd/0 are the same pipe
        if key not in seen:
            seen.add(key)
            files.append(f)
    if not files:
        raise PingctlError("no input files found in " + ", ".join(items))
    return files


def _expand(item: str, out: Path | None, o: Path | None) -> list[Path]:
    """One command-line input -> its files (`o`: the resolved output directory or None)."""
    p = Path(item)
    if p.is_dir():
        if _inside(p, o):
            raise _contains_input(out, p)
        if is_pingctl_output(p):  # e.g. `ingest runs/ingest`: its parts are not RIPE results
            raise PingctlError(f"{p} is a pingctl output (it has {MANIFEST}), not RIPE Atlas results; "
                               "pass the files it was made from")
        return list(_walk(p, o))
    if p.exists():
        if _inside(p, o):
            raise _contains_input(out, p)
        return [p]
    matches = resolve_inputs([item], suffixes=INPUT_SUFFIXES)  # a glob: as a walk, except the output
    kept = [f for f in matches if not _inside(f, o)]
    if not kept:
        raise _contains_input(out, matches[0])
    # `data/**/*.jsonl` is a walk by another name: an earlier output's rejects.jsonl must not
    # come back as RIPE records, so matches inside a pingctl output are skipped as a walk skips them
    owned = {d: is_pingctl_output(d) for d in {a for f in kept for a in f.parents}}
    inside = {f for f in kept if any(owned[a] for a in f.parents)}
    if inside and len(inside) == len(kept):
        first = min(inside)
        owner = next(a for a in first.parents if owned[a])
        raise PingctlError(f"every match of {item} is inside the pingctl output {owner} (it has {MANIFEST}), "
                           f"e.g. {first}; name a file itself to read it as given")
    return [f for f in kept if f not in inside]


def _walk(root: Path, o: Path | None) -> Iterator[Path]:
    """Data files under `root`: regular files only (a FIFO found there would block the run)
    with a known suffix, or with another name (a dump saved without its suffix) whose content
    `looks_like_results`; hidden entries are skipped (`.NAME.tmp-*` / `.NAME.old-*` siblings
    of interrupted runs), and so are pingctl outputs and the output `o` (their manifest
    and rejects.jsonl would be read as RIPE records). Symlinked directories are not
    followed (as `Path.rglob`)."""
    for d, dirs, names in os.walk(root):
        here = Path(d)
        dirs[:] = [x for x in dirs if not _skip_dir(here / x, o)]
        for name in names:
            f = here / name
            if not name.startswith(".") and f.is_file() and (name.endswith(INPUT_SUFFIXES) or looks_like_results(f)):
                yield f


def _skip_dir(d: Path, o: Path | None) -> bool:
    return d.name.startswith(".") or (o is not None and d.resolve() == o) or is_pingctl_output(d)


def _inside(p: Path, o: Path | None) -> bool:
    if o is None:
        return False
    r = p.resolve()
    return r == o or o in r.parents


def _contains_input(out: Path, p: Path) -> UsageError:
    full = str(Path(out).resolve())
    where = str(out) if str(out) == full else f"{out} ({full})"  # `-o .` / `-o ''` say where
    return UsageError(f"output {where} contains the input {p}; choose another output directory "
                      "(ingest replaces the output as a whole)")


def is_stream(f: Path) -> bool:
    """A pipe, FIFO or device: readable once, front to back, by this process only (a spawned
    worker has no /dev/stdin or `<(...)` descriptor), and with no size to show progress."""
    return not f.is_file()


def ingest_file(
    index: int,
    path: str,
    tmpdir: str | None,
    opts: Options,
    on_bytes: Callable[[int], None] | None = None,
    threaded: bool = True,
    bz2_threads: int = 0,
    label: str | None = None,
) -> dict:
    """Ingest one input file into `tmpdir/part-INDEX.parquet` (+ a hidden rejects piece).

    This is the per-file task of every target: the local process pool and each task of a
    fanned-out run (pingctl.ingest.fanout) call it. `label`: the name the manifest and the
    rejects give the file (default `path`), for a copy read elsewhere (a Modal volume).

    With `tmpdir=None` nothing is written (rows are counted, rejects kept in memory).
    `threaded`: decompress in a second thread (worth it when a core is spare).
    `bz2_threads`: a `.bz2` file (seekable) is decoded by indexed_bzip2 with this many
    blocks in parallel (0: always the `bz2` module). If indexed_bzip2 fails or decoded
    something other than what libbzip2 would (a damaged file), what it produced is
    discarded and the file is read again with the `bz2` module: the rows and rejects of
    a file never depend on the decoder.
    """
    p = Path(path)
    name = path if label is None else label
    try:
        raw = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise PingctlError(f"cannot read {p}: {e.strerror or e}") from None
    hr = HashingReader(raw, on_bytes)
    codec = detect_codec(p, raw)
    parse = functools.partial(_parse_file, index, name, None if tmpdir is None else Path(tmpdir), opts)
    gc_was = gc.isenabled()
    gc.disable()  # no reference cycles are made; the collector only costs time here
    try:
        done = None
        decoder = codec
        if codec == "bz2" and bz2_threads > 0:
            done, hr = _parse_parallel_bz2(parse, p, raw, hr, on_bytes, bz2_threads)
            if done is not None:
                decoder = f"indexed_bzip2 x{bz2_threads}"
        if done is None:
            done = _parse_stream(parse, codec, hr, threaded)
        counts, wrote, kept = done
        hr.drain()
    finally:
        raw.close()
        if gc_was:
            gc.enable()
    return {
        "index": index,
        "path": str(name),
        "bytes": hr.nbytes,
        "sha256": hr.sha.hexdigest(),
        "codec": codec,
        "decoder": decoder,  # what decompressed it (not in the manifest: it never changes the output)
        "part": part_name(index) if wrote else None,
        "counts": counts,
        "rejects": kept,
    }


def _parse_parallel_bz2(parse, p: Path, raw, hr: HashingReader, on_bytes, threads: int):
    """Parse a .bz2 file decoded by indexed_bzip2 with `threads` blocks at once. Returns (what
    `parse` returned, the reader hashing the file), or (None, a fresh reader on the rewound
    file) when indexed_bzip2 is not usable here or failed, for the `bz2` module to start over."""
    reader = open_parallel_bz2(p, raw, threads)
    if reader is None:
        return None, hr

    def behind(pos: int) -> None:  # hash (and report) what the decoder has read
        if pos > hr.nbytes:
            hr.read(pos - hr.nbytes)

    par = parallel_bz2_chunks(reader, p, os.fstat(raw.fileno()).st_size, behind)
    chunks = None
    if threads > 1:
        # a thread that keeps asking for the next chunks while this one parses, so
        # the decoder threads always have blocks to work on (indexed_bzip2 only
        # prefetches a little past the last read; this measured ~10 % faster)
        chunks = ThreadedChunks(par, depth=PARALLEL_BZ2_DEPTH)
        read_chunk = chunks.read
    else:
        read_chunk = functools.partial(next, par, b"")
    try:
        return parse(read_chunk), hr
    except ParallelBz2Failed:
        if chunks is not None:
            chunks.close()
            chunks = None
        par.close()
        raw.seek(0)  # start over with the bz2 module; progress already shown stays
        return None, HashingReader(raw, on_bytes, quiet=hr.nbytes)
    finally:
        if chunks is not None:
            chunks.close()  # the reader thread hashes the raw file: stop it before drain()


def _parse_stream(parse, codec: str, hr: HashingReader, threaded: bool):
    """Parse a file read start to end through `hr`, decompressed by the standard library."""
    if codec == "plain":
        return parse(lambda: hr.read(1 << 20))
    if not threaded:
        return parse(functools.partial(next, decoded_chunks(codec, hr), b""))
    # The decoder thread re-takes the GIL several times per chunk (libbzip2's output buffer
    # grows in steps); a short switch interval keeps it from waiting the default 5 ms each
    # time while this thread parses.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    chunks = ThreadedChunks(decoded_chunks(codec, hr))
    try:
        return parse(chunks.read)
    finally:
        chunks.close()  # stop the decoder thread before reading the raw file here
        sys.setswitchinterval(switch)


def _parse_file(index: int, path: str, out: Path | None, opts: Options, read_chunk) -> tuple[dict, bool, list | None]:
    """Parse one file's stream into its part and rejects piece: (counts, part written, rejects
    kept in memory or None). On any exception nothing of this attempt is left behind."""
    writer = None
    rej_fh = None
    try:
        if out is not None:
            writer = PartWriter(out / part_name(index), opts.row_group_rows)
            rej_fh = open(out / rejects_piece(index), "wb")  # noqa: SIM115
        rejects = Rejects(str(path), rej_fh)
        batch = Batch()

        def flush():
            table = batch.take_table()
            if writer is not None:
                writer.write(table)

        counts = parse_records(iter_records(read_chunk), opts, batch, rejects, flush)
        wrote = writer.close() if writer is not None else False
    except BaseException:
        if writer is not None:
            writer.abort()
            writer.path.unlink(missing_ok=True)
        raise
    finally:
        if rej_fh is not None:
            rej_fh.close()
    return counts, wrote, rejects.kept if rej_fh is None else None


def ingest_bytes(
    data: bytes, opts: Options | None = None, label: str = "<bytes>", chunk: int = 1 << 20, fast: bool = True
):
    """Ingest an in-memory (decompressed) JSON-lines/array text: (table, counts, rejects).

    The same code path as a file, without files: for tests and quick experiments.
    `fast=False`: generic (orjson) path only, the reference the msgspec path must match.
    """
    import pyarrow as pa

    opts = opts or Options()
    pos = 0

    def read_chunk() -> bytes:
        nonlocal pos
        piece = data[pos : pos + chunk]
        pos += len(piece)
        return piece

    batch = Batch()
    tables = []
    rejects = Rejects(label)
    counts = parse_records(
        iter_records(read_chunk), opts, batch, rejects, lambda: tables.append(batch.take_table()), fast=fast
    )
    table = pa.concat_tables(tables) if tables else arrow_schema().empty_table()
    return table, counts, rejects.kept


def _ingest_task(args) -> dict:
    return ingest_file(*args)


def run_files(
    files: list[Path],
    tmpdir: Path | None,
    opts: Options,
    workers: int,
    on_bytes: Callable[[int], None] | None = None,
) -> list[dict]:
    """Ingest every file (in this process when workers == 1); results in input order."""
    cores = usable_cores()
    # A decoder thread per worker pays off only when there are cores to spare for it;
    # .bz2 files are decoded by indexed_bzip2 with the cores shared out between workers.
    threaded = workers < cores
    bz2_threads = max(1, cores // max(1, workers))
    if workers <= 1 or len(files) <= 1:
        return [
            ingest_file(i, str(f), str(tmpdir) if tmpdir else None, opts, on_bytes, threaded, bz2_threads)
            for i, f in enumerate(files)
        ]
    import multiprocessing as mp
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    sizes = {i: _size(f) for i, f in enumerate(files)}
    order = sorted(sizes, key=lambda i: (-sizes[i], i))  # largest first: better balance
    results: dict[int, dict] = {}
    # Workers die with this process, kill -9 included (a worker left behind keeps its file's
    # decoding, ~180 MB, and the pool's resource tracker alive for nothing); the tracker ends
    # by itself once the last holder of its pipe, this process or a worker, is gone.
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        futs = {
            pool.submit(
                _ingest_task, (i, str(files[i]), str(tmpdir) if tmpdir else None, opts, None, threaded, bz2_threads)
            ): i
            for i in order
        }
        try:
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in done:
                    res = fut.result()  # re-raises a worker's error
                    results[futs[fut]] = res
                    if on_bytes is not None:
                        on_bytes(sizes[futs[fut]])
        except BaseException:
            for fut in futs:
                fut.cancel()
            raise
    return [results[i] for i in range(len(files))]


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def ingest(
    inputs: Iterable[str | Path],
    out: Path,
    cfg,
    *,
    force: bool = False,
    on_start: Callable[[int, int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> dict:
    """Run `pingctl ingest`; returns the summary (also the basis of manifest.json).

    `cfg` is the IngestConfig section. `on_start(total_bytes, n_files)` and
    `on_bytes(n)` drive a progress bar (`total_bytes` is None when an input is a pipe).
    """
    out = Path(out)
    files = resolve(inputs, out)
    check_replaceable(out, force)
    opts = Options.from_config(cfg)
    streams = any(is_stream(f) for f in files)
    # A stream can be read only here, once: every input is then read in this process
    # (a .bz2 file still gets every core for its blocks).
    workers = 1 if streams else min(cfg.workers or usable_cores(), len(files))
    if on_start is not None:
        on_start(None if streams else sum(_size(f) for f in files), len(files))
    _preload()
    t0 = time.perf_counter()
    with atomic_dir(out) as tmp:
        results = run_files(files, tmp, opts, workers, on_bytes)
        manifest, totals = write_output(tmp, results, cfg)
    return summarize(manifest, totals, results, out, workers, time.perf_counter() - t0)


def rejects_piece(index: int) -> str:
    """The rejects of input `index`, as `ingest_file` writes them beside its part."""
    return f".rejects-{index:05d}.jsonl"


def write_output(tmp: Path, results: list[dict], cfg) -> tuple[dict, dict]:
    """Finish an output in `tmp` that holds each result's part and rejects piece: the pieces
    joined into rejects.jsonl in input order, the counts summed and reconciled, manifest.json
    written. The one way an ingest output is finished, by a local run and by the merge of a
    fanned-out one (pingctl.ingest.fanout). Returns (manifest, summed counts)."""
    with open(tmp / REJECTS, "wb") as dst:
        for r in results:
            piece = tmp / rejects_piece(r["index"])
            with open(piece, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            piece.unlink()
    totals = new_counts()
    for r in results:
        merge_counts(totals, r["counts"])
    config = cfg.model_dump(mode="json")
    config.pop("workers", None)  # does not change the output
    manifest = {
        "kind": "pingctl-ingest",
        "pingctl_version": __version__,
        "columns": list(COLUMNS),
        "schema_version": SCHEMA_VERSION,
        "config": config,
        "inputs": [
            {
                "path": r["path"],
                "bytes": r["bytes"],
                "sha256": r["sha256"],
                "codec": r["codec"],
                "part": r["part"],
                "records": r["counts"]["records"],
                "rows": r["counts"]["rows"],
                "rejected": sum(r["counts"]["rejected"].values()),
            }
            for r in results
        ],
        "data_files": [r["part"] for r in results if r["part"]],  # what downstream commands read
        "rejects": REJECTS,
        "counts": _public_counts(totals),
    }
    problems = reconcile(totals)
    if problems:  # a bug, never the input's fault: refuse to publish
        raise RuntimeError("ingest counts do not reconcile: " + "; ".join(problems))
    write_json(tmp / MANIFEST, manifest)
    return manifest, totals


def summarize(manifest: dict, totals: dict, results: list[dict], out: Path, workers: int, elapsed: float) -> dict:
    """The command's summary: the manifest's counts, with where, how many and how fast."""
    summary = dict(manifest["counts"])
    summary.update(
        out=str(out),
        files=len(results),
        workers=workers,
        elapsed_s=round(elapsed, 3),
        results_per_s=round(totals["records"] / elapsed, 1) if elapsed > 0 else None,
        rows_per_s=round(totals["rows"] / elapsed, 1) if elapsed > 0 else None,
        mb_per_s=round(sum(r["bytes"] for r in results) / 1e6 / elapsed, 2) if elapsed > 0 else None,
        input_bytes=sum(r["bytes"] for r in results),
    )
    return summary


def _preload() -> None:
    """Import what the first batch needs (numpy, Arrow, Parquet: ~0.25 s cold) before the
    clock starts, so `elapsed_s` / results/s measure the work, not the imports."""
    import numpy  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    import datetime as dt

    return (EPOCH + dt.timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")


def _public_counts(c: dict) -> dict:
    out = {k: v for k, v in c.items() if k not in ("first_us", "last_us")}
    out["filtered"] = dict(c["filtered"])
    out["rejected"] = dict(sorted(c["rejected"].items()))
    out["filtered_total"] = sum(c["filtered"].values())
    out["rejected_total"] = sum(c["rejected"].values())
    out["first_time"] = _iso(c["first_us"])
    out["last_time"] = _iso(c["last_us"])
    return out


def exit_status(summary: dict, strict: bool) -> tuple[int, str | None]:
    """(exit code, message): 1 when no valid result was written, or --strict and rejects."""
    if summary["results_written"] == 0:
        why = (
            f"{summary['records']} record(s) read: {summary['rejected_total']} rejected, "
            f"{summary['filtered_total']} filtered, {summary['summary_only']} summary-only"
        )
        return 1, f"no valid ping result with a packet list was written ({why}); see {summary['out']}/{REJECTS}"
    if strict and summary["rejected_total"]:
        return 1, f"--strict: {summary['rejected_total']} record(s) rejected; see {summary['out']}/{REJECTS}"
    return 0, None
