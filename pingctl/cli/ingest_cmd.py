"""`pingctl ingest`: RIPE Atlas ping results -> canonical Parquet (parses and prints only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import ConfigOpt, JsonOpt, SetOpt, emit, handle_errors, kv_table, load, progress, say


def _rows(s: dict) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = [
        ("output", s["out"]),
        ("files", s["files"]),
        ("input MB", s["input_bytes"] / 1e6),
        ("results read", s["records"]),
        ("results written", s["results_written"]),
        ("  of which without packets", s["empty_results"]),
        ("rows written", s["rows"]),
        ("  IPv4 rows", s["rows_v4"]),
        ("  IPv6 rows", s["rows_v6"]),
        ("replies", s["replies"]),
        ("timeouts", s["timeouts"]),
        ("errors", s["errors"]),
        ("duplicates" + (" (dropped)" if s["dups_dropped"] else " (kept)"), s["dups"]),
        ("late replies", s["late"]),
        ("other packets (no rtt)", s["other_packets"]),
        ("summary-only results", s["summary_only"]),
        ("source taken from `from`", s["src_from"]),
        ("private source kept", s["src_private"]),
        ("filtered", s["filtered_total"]),
        *[(f"  filtered: {k}", v) for k, v in s["filtered"].items() if v],
        ("rejected", s["rejected_total"]),
        *[(f"  rejected: {k}", v) for k, v in s["rejected"].items()],
        ("first result (UTC)", s["first_time"]),
        ("last result (UTC)", s["last_time"]),
        ("workers", s["workers"]),
        ("results/s", s["results_per_s"]),
        ("elapsed s", s["elapsed_s"]),
    ]
    return rows


def ingest(
    inputs: Annotated[
        list[str],
        typer.Argument(help="RIPE Atlas ping result files, directories or globs (JSON lines or arrays; .bz2/.gz/.zst/.xz).", show_default=False),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (Parquet parts, rejects.jsonl, manifest.json).")],
    src_field: Annotated[
        str | None,
        typer.Option("--src-field", help="Source address: auto (public `from` if src_addr is private/missing), from, src_addr."),
    ] = None,
    af: Annotated[int | None, typer.Option("--af", help="Keep only this address family: 4 or 6 (0 = both).")] = None,
    msm: Annotated[list[int] | None, typer.Option("--msm", help="Keep only this measurement id (repeatable).")] = None,
    probe: Annotated[list[int] | None, typer.Option("--probe", help="Keep only this probe id (repeatable).")] = None,
    since: Annotated[str | None, typer.Option(help="Keep results at/after this UTC time (ISO 8601 or Unix seconds).")] = None,
    until: Annotated[str | None, typer.Option(help="Keep results before this UTC time (ISO 8601 or Unix seconds).")] = None,
    sample: Annotated[float | None, typer.Option(help="Keep this deterministic fraction of results (0 < f <= 1).")] = None,
    drop_dups: Annotated[
        bool | None, typer.Option("--drop-dups/--keep-dups", help="Drop duplicate replies (\"dup\": 1) or keep them.")
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Parallel file workers (0 = one per core).")] = None,
    row_group_rows: Annotated[int | None, typer.Option(help="Parquet row-group size.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 if any record was rejected.")] = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn RIPE Atlas ping results into the canonical Parquet table (one row per packet).

    Streams JSON lines or JSON arrays (plain, .bz2, .gz, .zst, .xz), one process per file; bad records go to OUT/rejects.jsonl with file, line and reason. See docs/ingest.md.

    Example: pingctl ingest ../shared/data/ripe-atlas/*.jsonl.bz2 -o runs/ingest --af 6 --msm 2001
    """
    cfg = load(
        config,
        set_,
        **{
            "data.ingest.src_field": src_field,
            "data.ingest.af": af,
            "data.ingest.msm_ids": msm or None,
            "data.ingest.probe_ids": probe or None,
            "data.ingest.since": since,
            "data.ingest.until": until,
            "data.ingest.sample": sample,
            "data.ingest.drop_dups": drop_dups,
            "data.ingest.workers": workers,
            "data.ingest.row_group_rows": row_group_rows,
        },
    ).data.ingest

    from pingctl.ingest.core import exit_status
    from pingctl.ingest.core import ingest as run

    with progress(transient=True) as bar:
        task = bar.add_task("ingest", total=None)

        def on_start(total_bytes: int, n_files: int) -> None:
            bar.update(task, total=total_bytes, description=f"ingest {n_files} file(s), bytes")

        summary = run(inputs, out, cfg, force=force, on_start=on_start, on_bytes=lambda n: bar.advance(task, n))
    code, message = exit_status(summary, strict)
    summary["exit_code"] = code
    emit(summary, as_json, kv_table(f"ingest -> {out}", _rows(summary)))
    if message:
        say(message, err=True, label="error: ")
        raise typer.Exit(code)


def register(app) -> None:
    app.command("ingest")(handle_errors(ingest))
