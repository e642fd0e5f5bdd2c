"""`pingctl ingest`: RIPE Atlas ping results -> canonical Parquet (parses and prints only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (print_engine_plan, AccountOpt, MaxParallelOpt, ModalCpuOpt, PartitionOpt, QosOpt, SetupOpt, TimeLimitOpt, MODAL_PANEL, SLURM_PANEL, ConfigOpt, JsonOpt, SetOpt, console, emit, err_console, grid_table, handle_errors,
                                kv_table, load, progress, say)


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
        *_engine_rows(s),
        ("results/s", s["results_per_s"]),
        ("elapsed s", s["elapsed_s"]),
    ]
    return rows


def _engine_rows(s: dict) -> list[tuple[str, object]]:
    if s.get("target", "local") == "local":
        return [("workers", s["workers"])]
    rows: list[tuple[str, object]] = [("target", s["target"]), ("tasks", s["tasks"]),
                                      ("  run now", s["tasks_run"]), ("  kept from an earlier run", s["tasks_reused"])]
    if s.get("jobs"):
        rows.append(("SLURM job(s)", ", ".join(s["jobs"])))
    return rows


def _plan_report(r: dict, as_json: bool) -> None:
    """--dry-run: the tasks, what they read, what would run (and the SLURM script / Modal app)."""
    if as_json:
        emit(r, True)
        return
    t = grid_table(f"ingest --target {r['target']} --dry-run: plan", ["task", "input", "bytes", "state"],
                   left=("input", "state"))
    for row in r["plan"]:
        t.add_row(str(row["task"]), row["path"], "-" if row["bytes"] is None else f"{row['bytes']:,}", row["state"])
    console.print(t)
    print_engine_plan(r)
    rows: list[tuple[str, object]] = [("output", r["out"]), ("files", r["files"]),
                                      ("input MB", None if r["input_bytes"] is None else r["input_bytes"] / 1e6)]
    if r["target"] == "local":
        rows.append(("workers", r["workers"]))
    else:
        rows += [("tasks", r["tasks"]), ("  to run", r["tasks_run"]), ("  MB to read", r["bytes_to_run"] / 1e6),
                 ("  kept from an earlier run", r["tasks_reused"]), ("work directory", r["work"])]
    rows.append(("written", r["files_written"]))
    emit(r, False, kv_table(f"ingest --target {r['target']} --dry-run", rows))


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
    target: Annotated[str, typer.Option(
        "--target", help="local: worker processes here; slurm: a job array, one task per file; modal: Modal "
        "function calls, one per file (any engine of pingctl.executor.registry). A rerun of a fanned-out "
        "ingest redoes only the tasks not done.")] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan (tasks, files, bytes; the SLURM script "
                                          "or the Modal app) and run nothing.")] = False,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    cpus_per_task: Annotated[int, typer.Option(help="CPUs per task (one file; .bz2 blocks decode in parallel).",
                                               rich_help_panel=SLURM_PANEL)] = 2,
    mem: Annotated[str, typer.Option(help="Memory per task.", rich_help_panel=SLURM_PANEL)] = "4G",
    time_limit: TimeLimitOpt = "02:00:00",
    max_parallel: MaxParallelOpt = 0,
    setup: SetupOpt = "",
    volume: Annotated[str, typer.Option(help="Modal Volume holding the inputs and the tasks' parts.",
                                        rich_help_panel=MODAL_PANEL)] = "pingctl-data",
    modal_cpu: ModalCpuOpt = 2.0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn RIPE Atlas ping results into the canonical Parquet table (one row per packet).

    Streams JSON lines or JSON arrays (plain, .bz2, .gz, .zst, .xz), one process per file; bad records go to OUT/rejects.jsonl with file, line and reason. See docs/ingest.md.

    Example: pingctl ingest ../shared/data/ripe-atlas/*.jsonl.bz2 -o runs/ingest --af 6 --msm 2001

    Fanned out: pingctl ingest dumps/ -o runs/month --target slurm --partition cpu --dry-run (then without --dry-run)
    """
    from pingctl.errors import require_command

    require_command("ingest")  # before anything is read or written
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

    from pingctl.executor import registry

    executor = registry.create(target, "ingest", {
        "partition": partition, "account": account, "qos": qos, "cpus_per_task": cpus_per_task, "mem": mem,
        "time": time_limit, "max_parallel": max_parallel, "setup": setup, "volume": volume, "modal_cpu": modal_cpu})
    if executor.remote:
        summary = _fanout(inputs, out, cfg, executor, force, dry_run, as_json)
        if summary is None:
            return
    elif dry_run:
        from pingctl.ingest.fanout.step import local_dry_run

        _plan_report(local_dry_run(inputs, out, cfg, force), as_json)
        return
    else:
        summary = _local(inputs, out, cfg, force)
    code, message = exit_status(summary, strict)
    summary["exit_code"] = code
    emit(summary, as_json, kv_table(f"ingest -> {out}", _rows(summary)))
    if message:
        say(message, err=True, label="error: ")
        raise typer.Exit(code)


def _local(inputs, out, cfg, force) -> dict:
    from pingctl.ingest.core import ingest as run

    with progress(transient=True) as bar:
        task = bar.add_task("ingest", total=None)

        def on_start(total_bytes: int, n_files: int) -> None:
            bar.update(task, total=total_bytes, description=f"ingest {n_files} file(s), bytes")

        return run(inputs, out, cfg, force=force, on_start=on_start, on_bytes=lambda n: bar.advance(task, n))


def _fanout(inputs, out, cfg, executor, force, dry_run, as_json) -> dict | None:
    from pingctl.executor.fanout import run
    from pingctl.ingest.fanout.step import IngestFanout

    target = executor.name
    step = IngestFanout.plan(inputs, out, cfg, force, engine=target)
    if dry_run:
        _plan_report(run(step, executor, dry_run=True), as_json)
        return None
    with progress(transient=True) as bar:
        task = bar.add_task(f"ingest --target {target}", total=None)

        def on_start(n: int) -> None:
            bar.update(task, total=n, description=f"ingest --target {target}, tasks")

        return run(step, executor, on_event=lambda msg: err_console.print(msg, markup=False, highlight=False),
                   on_start=on_start, on_progress=lambda k: bar.update(task, completed=k))


def register(app) -> None:
    app.command("ingest")(handle_errors(ingest))
