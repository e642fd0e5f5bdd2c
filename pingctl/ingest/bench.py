"""`pingctl bench ingest`: results/s of `pingctl ingest` per worker count, pure decompression
time for reference, and the same results parsed by RIPE NCC's `ripe.atlas.sagan`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pingctl.errors import PingctlError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "ripe-atlas"
REPEAT = 2  # every timing is the best of this many runs


def default_inputs() -> list[Path]:
    files = sorted(SHARED.glob("*.jsonl.bz2")) if SHARED.is_dir() else []
    if not files:
        raise PingctlError(
            f"no inputs given and no samples at {SHARED}; pass RIPE Atlas result files, "
            "e.g. pingctl bench ingest ping-2024-01-01T0000.bz2"
        )
    return files


def _decompress(files: list[Path]) -> tuple[float, int, int]:
    """Seconds to decompress every file in one thread; decompressed bytes; lines."""
    from pingctl.ingest.reader import decoded_chunks, detect_codec

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


def _head_lines(f: Path, limit: int | None) -> list[bytes]:
    from pingctl.ingest.reader import detect_codec, open_decoder

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


def _time_parse(lines: list[bytes]) -> tuple[float, int]:
    """pingctl's per-result rules + Arrow table building on the same in-memory lines."""
    import gc

    from pingctl.ingest.parse import Batch, Options, Rejects, parse_records

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
        parse_records(blocks, opts, batch, Rejects("bench"), flush)
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
    from pingctl.benchutil import run_measured
    from pingctl.ingest.core import resolve

    files = resolve(inputs) if inputs else default_inputs()
    in_bytes = sum(f.stat().st_size for f in files)
    table: list[dict] = []
    notes: list[str] = []
    runs = []
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-ingest-") as tmp:
        for w in workers:
            if w < 1:
                raise PingctlError(f"worker counts must be >= 1 (got {w})")
            out = Path(tmp) / f"w{w}"
            # a child process per run: its own peak RSS (workers included), a cold start;
            # best of REPEAT (the machine may be shared)
            best = None
            for _ in range(REPEAT):
                got = run_measured(["ingest", *map(str, files), "-o", str(out), "-j", str(w), "--force"])
                if best is None or got[0]["elapsed_s"] < best[0]["elapsed_s"]:
                    best = got
            summary, wall, rss = best
            summary["wall_s"] = round(wall, 3)
            summary["peak_rss_mb"] = round(rss, 1)
            runs.append(summary)
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
    dec_s, json_bytes, dec_lines = min(_decompress(files) for _ in range(REPEAT))
    for row in table:
        row["json MB/s"] = round(json_bytes / 1e6 / max(row["seconds"], 1e-9), 2)
    table.append(_row("decompress only", dec_lines, dec_s, 0, in_bytes, json_bytes, None))
    result = {
        "name": "ingest",
        "inputs": [str(f) for f in files],
        "input_bytes": in_bytes,
        "json_bytes": json_bytes,
        "decompress_s": round(dec_s, 3),
        "runs": runs,
    }
    notes.append(
        f"best of {REPEAT} runs each; {len(files)} file(s), {in_bytes / 1e6:.1f} MB compressed, {json_bytes / 1e6:.1f} MB JSON, "
        f"{runs[0]['records']:,} results, {runs[0]['rows']:,} rows" if runs else f"{len(files)} file(s)"
    )
    notes.append(
        "ingest -j N: the whole command (decompress, parse, Parquet) with N workers; decompress only: "
        "the inputs' decompression in one thread; sagan parse: ripe.atlas.sagan PingResult(line) + packet "
        "RTTs; pingctl parse: pingctl's per-result rules + Arrow columns, on the same in-memory lines, one core"
    )
    notes.append(
        "ingest seconds exclude interpreter start-up and imports (wall incl. start-up: "
        + ", ".join(f"{r['workers']}w {r['wall_s']:.2f} s" for r in runs)
        + "); peak RSS is the ingest process with its workers"
    )
    notes.append(
        f"decompression alone takes {dec_s:.2f} s in one thread ({json_bytes / 1e6 / max(dec_s, 1e-9):.0f} MB/s of JSON); "
        "ingest overlaps it with parsing in a second thread when a core is spare"
    )
    if sagan:
        lines: list[bytes] = []
        for f in files:
            lines.extend(_head_lines(f, limit))
        sz = sum(len(x) for x in lines)
        _time_sagan(lines[:500])  # warm up imports on both sides
        _time_parse(lines[:500])
        s_sec, s_packets, s_failed = min(_time_sagan(lines) for _ in range(REPEAT))
        p_sec, p_rows = min(_time_parse(lines) for _ in range(REPEAT))
        table.append(_row("sagan parse", len(lines), s_sec, s_packets, None, sz, None))
        table.append(_row("pingctl parse", len(lines), p_sec, p_rows, None, sz, None))
        ratio = s_sec / max(p_sec, 1e-9)
        result["sagan"] = {
            "results": len(lines),
            "sagan_s": round(s_sec, 3),
            "pingctl_parse_s": round(p_sec, 3),
            "speedup_parse": round(ratio, 2),
            "sagan_failed": s_failed,
        }
        per_result_dec = dec_s / max(dec_lines, 1)
        sagan_e2e = 1.0 / (s_sec / max(len(lines), 1) + per_result_dec)
        notes.append(
            f"parse only, one core, first {limit if limit else 'all'} results per file ({len(lines):,}): "
            f"pingctl is {ratio:.1f}x ripe.atlas.sagan ({len(lines) / max(p_sec, 1e-9):,.0f} vs "
            f"{len(lines) / max(s_sec, 1e-9):,.0f} results/s)"
        )
        if runs:
            one = next((r for r in runs if r["workers"] == 1), runs[0])
            result["sagan"]["speedup_end_to_end"] = round(one["results_per_s"] / sagan_e2e, 2)
            notes.append(
                f"end to end with decompression and Parquet, {one['workers']} worker(s): {one['results_per_s']:,.0f} results/s "
                f"vs {sagan_e2e:,.0f} for sagan + the same decompression = {one['results_per_s'] / sagan_e2e:.1f}x"
            )
    result["table"] = table
    result["notes"] = notes
    return result
