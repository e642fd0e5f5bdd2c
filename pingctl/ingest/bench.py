"""`pingctl bench ingest`: results/s of `pingctl ingest` per worker count, pure decompression
time for reference, and the same results parsed by RIPE NCC's `ripe.atlas.sagan`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pingctl.benchutil import run_measured
from pingctl.errors import PingctlError, UsageError
from pingctl.ingest.core import resolve
from pingctl.ingest.parse import Batch, Options, parse_records, Rejects
from pingctl.ingest.reader import decoded_chunks, detect_codec, open_decoder, open_parallel_bz2, usable_cores

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "ripe-atlas"
REPEAT = 3  # every timing is the best of this many runs (the range goes into the notes)


def default_inputs() -> list[Path]:
    files = sorted(SHARED.glob("*.jsonl.bz2")) if SHARED.is_dir() else []
    if not files:
        raise PingctlError(
            f"no inputs given and no samples at {SHARED}; pass RIPE Atlas result files, "
            "e.g. pingctl bench ingest ping-2024-01-01T0000.bz2"
        )
    return files


def _decompress(files: list[Path]) -> tuple[float, int, int]:
    """Seconds to decompress every file in one thread with the standard library (the `bz2`
    module for .bz2, as sagan users do); decompressed bytes; lines."""
    t0 = time.perf_counter()
    nbytes = lines = 0
    for f in files:
        with open(f, "rb") as raw:
            try:
                for data in decoded_chunks(detect_codec(f, raw), raw):
                    nbytes += len(data)
                    lines += data.count(b"\n")
            except Exception:  # noqa: BLE001 - a corrupt file ends the reference timing
                pass
    return time.perf_counter() - t0, nbytes, lines


def _decompress_parallel(files: list[Path], threads: int) -> tuple[float, float, int] | None:
    """(seconds, CPU seconds, lines) to decompress the .bz2 files with indexed_bzip2 as
    `ingest` does (`threads` blocks at once), or None when it is not used for them."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    lines = 0
    for f in files:
        with open(f, "rb") as raw:
            reader = open_parallel_bz2(f, raw, threads) if detect_codec(f, raw) == "bz2" else None
            if reader is None:
                return None
            try:
                while data := reader.read(1 << 20):
                    lines += data.count(b"\n")
            except Exception:  # noqa: BLE001 - ingest would fall back to the bz2 module
                return None
            finally:
                reader.close()
    return time.perf_counter() - t0, time.process_time() - c0, lines


def _head_lines(f: Path, limit: int | None) -> list[bytes]:
    out: list[bytes] = []
    with open(f, "rb") as raw:
        stream = open_decoder(detect_codec(f, raw), raw)
        for line in stream:
            if line.strip():
                out.append(line.rstrip(b"\r\n"))
                if limit is not None and len(out) >= limit:
                    break
    return out


def _time_sagan(lines: list[bytes]) -> tuple[float, int, int]:
    try:
        from ripe.atlas.sagan import PingResult
    except ImportError:
        raise PingctlError("ripe.atlas.sagan is not installed (pip install -e '.[dev]'), or pass --no-sagan") from None
    t0 = time.perf_counter()
    packets = failed = 0
    for line in lines:
        try:
            r = PingResult(line.decode("utf-8"))
        except Exception:  # noqa: BLE001 - sagan raising on a bad result counts as handled
            failed += 1
            continue
        packets += len([p.rtt for p in r.packets])
    return time.perf_counter() - t0, packets, failed


def _time_parse(lines: list[bytes], fast: bool = True) -> tuple[float, int]:
    """pingctl's per-result rules + Arrow table building on the same in-memory lines
    (`fast=False`: orjson + the generic rules only, the path before msgspec)."""
    import gc

    opts = Options()
    batch = Batch()
    rows = 0

    def flush():
        nonlocal rows
        rows += batch.take_table().num_rows

    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        blocks = ((i + 1, lines[i : i + 2048], None) for i in range(0, len(lines), 2048))
        parse_records(blocks, opts, batch, Rejects("bench"), flush, fast=fast)
        return time.perf_counter() - t0, rows
    finally:
        if gc_was:
            gc.enable()


def _row(case, results, seconds, rows, in_bytes, json_bytes, rss) -> dict:
    s = max(seconds, 1e-9)
    return {
        "case": case,
        "results": results,
        "seconds": round(seconds, 3),
        "results/s": round(results / s),
        "rows/s": round(rows / s),
        "in MB/s": round(in_bytes / 1e6 / s, 2) if in_bytes is not None else None,
        "json MB/s": round(json_bytes / 1e6 / s, 2) if json_bytes is not None else None,
        "RSS MB": round(rss) if rss is not None else None,
    }


def bench_ingest(inputs: list[Path], workers: list[int], sagan: bool, limit: int | None) -> dict:
    files = resolve(inputs) if inputs else default_inputs()
    in_bytes = sum(f.stat().st_size for f in files)
    cores = usable_cores()
    table, runs, spread = _time_ingest(files, workers, in_bytes)
    dec_s, json_bytes, dec_lines = min(_decompress(files) for _ in range(REPEAT))
    for row in table:
        row["json MB/s"] = round(json_bytes / 1e6 / max(row["seconds"], 1e-9), 2)
    table.append(_row("decompress only", dec_lines, dec_s, 0, in_bytes, json_bytes, None))
    par: dict[int, tuple[float, float, int]] = {}
    for threads in sorted({1, cores}):
        timings = [_decompress_parallel(files, threads) for _ in range(REPEAT)]
        if all(t is not None for t in timings):
            par[threads] = min(timings)
            table.append(
                _row(f"decompress, indexed_bzip2 x{threads}", par[threads][2], par[threads][0], 0, in_bytes, json_bytes, None)
            )
    result = {
        "name": "ingest",
        "inputs": [str(f) for f in files],
        "input_bytes": in_bytes,
        "json_bytes": json_bytes,
        "cores": cores,
        "decompress_s": round(dec_s, 3),
        "decompress_indexed_bzip2_s": {str(k): round(v[0], 3) for k, v in par.items()},
        "runs": runs,
    }
    notes = [
        f"best of {REPEAT} runs each; {len(files)} file(s), {in_bytes / 1e6:.1f} MB compressed, {json_bytes / 1e6:.1f} MB JSON, "
        f"{runs[0]['records']:,} results, {runs[0]['rows']:,} rows; {cores} usable core(s)"
        if runs
        else f"{len(files)} file(s)"
    ]
    if spread:
        notes.append("ingest results/s over the runs: " + "; ".join(spread))
    notes.append(
        "ingest -j N: the whole command (decompress, parse, Parquet) with N workers, .bz2 decoded by indexed_bzip2 "
        "with cores/N blocks at once; decompress only: the standard library's decoder (bz2 module) in one thread; "
        "sagan parse: ripe.atlas.sagan PingResult(line) + packet RTTs; pingctl parse: pingctl's per-result rules + "
        "Arrow columns (msgspec path; 'orjson only': without it), on the same in-memory lines, one core"
    )
    notes.append(
        "ingest seconds exclude interpreter start-up and imports (wall incl. start-up: "
        + ", ".join(f"{r['workers']}w {r['wall_s']:.2f} s" for r in runs)
        + "); peak RSS is the ingest process with its workers"
    )
    per_dec_us = dec_s / max(dec_lines, 1) * 1e6
    notes.append(
        f"decompression alone: {dec_s:.2f} s in one thread with the bz2 module ({per_dec_us:.1f} us per result)"
        + "".join(
            f"; indexed_bzip2 x{k}: {v[0]:.2f} s ({v[1] / max(v[2], 1) * 1e6:.1f} us CPU per result)" for k, v in par.items()
        )
    )
    if sagan:
        result["sagan"], s_sec, p_sec = _compare_sagan(files, limit, table, notes)
        if runs:
            _sagan_end_to_end(result["sagan"], s_sec, p_sec, runs, par, dec_s / max(dec_lines, 1), cores, notes)
    result["table"] = table
    result["notes"] = notes
    return result


def _time_ingest(files: list[Path], workers: list[int], in_bytes: int) -> tuple[list[dict], list[dict], list[str]]:
    """`pingctl ingest` of `files` per worker count, each the best of REPEAT child processes:
    (table rows, the runs' summaries, the spread of results/s per worker count)."""
    table: list[dict] = []
    runs = []
    spread = []
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-ingest-") as tmp:
        for w in workers:
            if w < 1:
                raise UsageError(f"worker counts must be >= 1 (got {w})")
            out = Path(tmp) / f"w{w}"
            # a child process per run: its own peak RSS (workers included), a cold start;
            # best of REPEAT (the machine may be shared)
            got = [
                run_measured(["ingest", *map(str, files), "-o", str(out), "-j", str(w), "--force"])
                for _ in range(REPEAT)
            ]
            best = min(got, key=lambda g: g[0]["elapsed_s"])
            summary, wall, rss = best
            summary.pop("out", None)  # a temporary directory, deleted before the JSON is read
            summary["wall_s"] = round(wall, 3)
            summary["peak_rss_mb"] = round(rss, 1)
            summary["elapsed_all_s"] = [g[0]["elapsed_s"] for g in got]
            runs.append(summary)
            rates = [summary["records"] / max(g[0]["elapsed_s"], 1e-9) for g in got]
            spread.append(f"-j {w} {min(rates):,.0f}-{max(rates):,.0f}")
            table.append(
                _row(
                    f"ingest -j {w}" + ("" if summary["workers"] == w else f" (ran {summary['workers']})"),
                    summary["records"],
                    summary["elapsed_s"],
                    summary["rows"],
                    in_bytes,
                    None,
                    rss,
                )
            )
    return table, runs, spread


def _compare_sagan(files: list[Path], limit: int | None, table: list[dict],
                   notes: list[str]) -> tuple[dict, float, float]:
    """Parse only, one core: ripe.atlas.sagan and pingctl on the same in-memory lines (the first
    `limit` results of each file). Appends their rows and a note; returns the figures and the
    unrounded seconds of sagan and of pingctl."""
    lines: list[bytes] = []
    for f in files:
        lines.extend(_head_lines(f, limit))
    sz = sum(len(x) for x in lines)
    _time_sagan(lines[:500])  # warm up imports on both sides
    _time_parse(lines[:500])
    _time_parse(lines[:500], fast=False)
    s_sec, s_packets, s_failed = min(_time_sagan(lines) for _ in range(REPEAT))
    p_sec, p_rows = min(_time_parse(lines) for _ in range(REPEAT))
    g_sec, _ = min(_time_parse(lines, fast=False) for _ in range(REPEAT))
    table.append(_row("sagan parse", len(lines), s_sec, s_packets, None, sz, None))
    table.append(_row("pingctl parse", len(lines), p_sec, p_rows, None, sz, None))
    table.append(_row("pingctl parse, orjson only", len(lines), g_sec, p_rows, None, sz, None))
    n = max(len(lines), 1)
    ratio = s_sec / max(p_sec, 1e-9)
    notes.append(
        f"parse only, one core, first {limit if limit else 'all'} results per file ({len(lines):,}): "
        f"pingctl is {ratio:.1f}x ripe.atlas.sagan ({n / max(p_sec, 1e-9):,.0f} vs {n / max(s_sec, 1e-9):,.0f} "
        f"results/s; {p_sec / n * 1e6:.1f} vs {s_sec / n * 1e6:.1f} us per result; orjson only {g_sec / n * 1e6:.1f} us)"
    )
    figures = {
        "results": len(lines),
        "sagan_s": round(s_sec, 3),
        "pingctl_parse_s": round(p_sec, 3),
        "pingctl_parse_orjson_s": round(g_sec, 3),
        "speedup_parse": round(ratio, 2),
        "sagan_failed": s_failed,
    }
    return figures, s_sec, p_sec


def _sagan_end_to_end(figures: dict, s_sec: float, p_sec: float, runs: list[dict], par: dict,
                      dec_s_per_result: float, cores: int, notes: list[str]) -> None:
    """Whole `ingest` runs against sagan's parse plus the same decompression (into `figures`
    and `notes`), and what 10x sagan's parse would take in cores."""
    n = max(figures["results"], 1)
    s_us, p_us = s_sec / n * 1e6, p_sec / n * 1e6
    sagan_rate = n / max(s_sec, 1e-9)
    sagan_e2e = 1.0 / (s_sec / n + dec_s_per_result)
    one = next((r for r in runs if r["workers"] == 1), runs[0])
    top = max(runs, key=lambda r: r["results_per_s"])
    figures["speedup_end_to_end"] = round(one["results_per_s"] / sagan_e2e, 2)
    figures["speedup_vs_sagan_parse"] = round(top["results_per_s"] / sagan_rate, 2)
    notes.append(
        f"end to end with decompression and Parquet, {one['workers']} worker(s): {one['results_per_s']:,.0f} results/s "
        f"vs {sagan_e2e:,.0f} for sagan + the same decompression (bz2 module) = {one['results_per_s'] / sagan_e2e:.1f}x; "
        f"best ingest ({top['workers']} worker(s), {top['results_per_s']:,.0f} results/s) vs sagan's parse alone = "
        f"{top['results_per_s'] / sagan_rate:.1f}x"
    )
    if par:
        k1 = par.get(1) or next(iter(par.values()))
        dec_cpu_us = k1[1] / max(k1[2], 1) * 1e6
        need = dec_cpu_us / (s_us / 10)
        notes.append(
            f"10x sagan's parse is {10 * sagan_rate:,.0f} results/s = {s_us / 10:.1f} us per result; "
            f"bzip2 decoding alone costs {dec_cpu_us:.1f} us of CPU per result (indexed_bzip2, 1 thread), "
            f"so it needs >= {need:.1f} cores for decompression alone, plus {p_us:.1f} us per result "
            f"of parsing ({cores} core(s) here)"
        )
