"""`pingctl build-rows`: one split of canonical Parquet -> probe-centric ArrayRecord rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (print_engine_plan, AccountOpt, MaxParallelOpt, ModalCpuOpt, PartitionOpt, QosOpt, SetupOpt, TimeLimitOpt, MODAL_PANEL, SLURM_PANEL, ConfigOpt, ForceOpt, JsonOpt, MemoryLimitOpt, SetOpt, console, emit, err_console,
                                grid_table, handle_errors, kv_table, load, say, step_progress)


def _plan_report(r: dict, as_json: bool) -> None:
    """--dry-run: the tasks, their partitions, what would run (and the SLURM script / Modal app)."""
    if as_json:
        emit(r, True)
        return
    t = grid_table(f"build-rows --target {r['target']} --dry-run: plan", ["task", "probes", "state"],
                   left=("probes", "state"))
    for row in r["plan"]:
        t.add_row(str(row["task"]), row["partition"], row["state"])
    console.print(t)
    print_engine_plan(r)
    rows: list[tuple[str, object]] = [("output", r["out"]), ("by", r["by"]), ("files", r["files"]),
                                      ("input MB", r["input_bytes"] / 1e6), ("tasks", r["tasks"])]
    if r["target"] != "local":
        rows += [("  to run", r["tasks_run"]), ("  kept from an earlier run", r["tasks_reused"]),
                 ("work directory", r["work"])]
    rows.append(("written", r["files_written"]))
    emit(r, False, kv_table(f"build-rows --target {r['target']} --dry-run", rows))


def _engine_rows(r: dict, target: str) -> list[tuple[str, object]]:
    if target == "local":
        return []
    rows: list[tuple[str, object]] = [("target", target), ("tasks", r["tasks"]), ("  run now", r["tasks_run"]),
                                      ("  kept from an earlier run", r["tasks_reused"])]
    if r["jobs"]:
        rows.append(("SLURM job(s)", ", ".join(r["jobs"])))
    return rows


def build_rows(
    inputs: Annotated[list[Path], typer.Argument(help="Canonical Parquet of one split (file, dir or glob).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory for .arrayrecord files.")],
    max_row_mb: Annotated[float | None, typer.Option(help="Split longer probe histories into records of this size.")] = None,
    by: Annotated[str, typer.Option(
        help="source: probe-centric records (one probe's history each); destination: destination-centric ones "
             "(one destination's measurements from every source, with an address index in the manifest); both: "
             "probe records in OUT and destination records in OUT/by-destination, which the loader's "
             "triangulation contexts read (loader.triangulation_share).")] = "source",
    dst_max_row_mb: Annotated[float | None, typer.Option(
        help="Split longer destination histories into records of this size. \\[default: rows.dst_max_row_mb, 1]")] = None,
    memory_limit: MemoryLimitOpt = None,
    target: Annotated[str, typer.Option(
        "--target", help="local: here; slurm: a job array, one task per hash partition of the probes; modal: Modal "
        "function calls, one per partition (any engine of pingctl.executor.registry). A rerun of a fanned-out "
        "build-rows redoes only the tasks not done.")] = "local",
    tasks: Annotated[int, typer.Option(help="Tasks of --target slurm|modal: the probes (and destinations) are "
                                            "split among them by the md5 of their key.")] = 8,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan (tasks; the SLURM script or the Modal "
                                          "app) and run nothing.")] = False,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    cpus_per_task: Annotated[int, typer.Option(help="CPUs per task (DuckDB threads).", rich_help_panel=SLURM_PANEL)] = 2,
    mem: Annotated[str, typer.Option(help="Memory per task (above --memory-limit).", rich_help_panel=SLURM_PANEL)] = "6G",
    time_limit: TimeLimitOpt = "02:00:00",
    max_parallel: MaxParallelOpt = 0,
    setup: SetupOpt = "",
    volume: Annotated[str, typer.Option(help="Modal Volume holding the split and the tasks' records.",
                                        rich_help_panel=MODAL_PANEL)] = "pingctl-data",
    modal_cpu: ModalCpuOpt = 2.0,
    force: ForceOpt = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Group measurements by probe (or destination) into time-ordered, pre-parsed ArrayRecord rows for the loader.

    Example: pingctl build-rows runs/demo/splits/train -o runs/demo/rows/train

    For triangulation contexts: pingctl build-rows runs/demo/splits/train -o runs/demo/rows/train --by both

    Fanned out: pingctl build-rows splits/train -o rows/train --target slurm --tasks 16 --dry-run (then without --dry-run)
    """
    from pingctl.errors import UsageError, require_command
    from pingctl.executor import registry

    require_command("build-rows")  # before anything is read or written
    if by not in ("source", "destination", "both"):
        raise UsageError(f"--by {by!r}: expected source, destination or both")
    executor = registry.create(target, "build-rows", {
        "partition": partition, "account": account, "qos": qos, "cpus_per_task": cpus_per_task, "mem": mem,
        "time": time_limit, "max_parallel": max_parallel, "setup": setup, "volume": volume, "modal_cpu": modal_cpu})
    cfg = load(config, set_, **{"rows.max_row_mb": max_row_mb, "rows.memory_limit": memory_limit,
                                "rows.dst_max_row_mb": dst_max_row_mb})
    if executor.remote:
        from pingctl.executor.fanout import run
        from pingctl.records.fanout.step import BuildRowsFanout

        step = BuildRowsFanout.plan(inputs, out, tasks=tasks, by=by, max_row_mb=cfg.rows.max_row_mb,
                                    dst_max_row_mb=cfg.rows.dst_max_row_mb, memory_limit=cfg.rows.memory_limit,
                                    config=cfg.rows.model_dump(), force=force)
        if dry_run:
            _plan_report(run(step, executor, dry_run=True), as_json)
            return
        with step_progress(f"build-rows --target {target}"):
            result = run(step, executor, on_event=lambda msg: err_console.print(msg, markup=False, highlight=False))
    elif dry_run:
        from pingctl.records.fanout.step import local_dry_run

        _plan_report(local_dry_run(inputs, out, by, force), as_json)
        return
    else:
        from pingctl.records.build import build_rows as run

        with step_progress("build-rows") as report:
            result = run(
                inputs, out, cfg.rows.max_row_mb, cfg.rows.memory_limit, force=force, progress=report,
                config=cfg.rows.model_dump(), by=by, dst_max_row_mb=cfg.rows.dst_max_row_mb,
            )
    groups = ("destinations", result["destinations"]) if by == "destination" else ("probes", result["probes"])
    rows = [
        ("records", result["records"]),
        groups,
        ("measurements", result["measurements"]),
        ("rows rejected", result["rows_rejected"]),
        ("files", len(result["files"])),
        ("size MB", result["bytes"] / 1e6),
        ("time span (UTC)", f"{str(result['start'])[:16]} .. {str(result['end'])[:16]}"),
        ("layout version", result["layout_version"]),
        *((("destination records", f"{result['destination']['records']:,} of "
                                     f"{result['destination']['destinations']:,} destinations in "
                                     f"{result['destination']['out']}"),) if "destination" in result else ()),
        *_engine_rows(result, target),
        ("measurements/s", result["measurements_per_s"]),
        ("elapsed s", result["elapsed_s"]),
    ]
    emit(result, as_json, kv_table(f"build-rows -> {out}", rows))
    if result["rows_rejected"] and not as_json:
        say(f"rejected rows: {out / 'rejects.jsonl'}", "yellow")


def register(app) -> None:
    app.command("build-rows")(handle_errors(build_rows))
