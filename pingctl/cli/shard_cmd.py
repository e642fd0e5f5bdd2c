"""`pingctl shard`: canonical table -> train/val/test Parquet shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, ForceOpt, JsonOpt, MemoryLimitOpt, SetOpt, emit, fmt, handle_errors,
                                kv_table, load, say, step_progress)


def shard(
    inputs: Annotated[list[Path], typer.Argument(help="Canonical Parquet files, directories or globs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (gets train/ val/ test/).")],
    strategy: Annotated[
        str | None, typer.Option(help="time | probe | pair | random (config data.shard.strategy)")
    ] = None,
    val: Annotated[float | None, typer.Option("--val", help="Validation fraction.")] = None,
    test: Annotated[float | None, typer.Option("--test", help="Test fraction.")] = None,
    seed: Annotated[int | None, typer.Option(help="Assignment seed.")] = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Split a measurement table into train/val/test shards (DuckDB; by time, probe, pair or row).

    Example: pingctl shard runs/demo/synth -o runs/demo/splits --strategy time --test 0.1
    """
    from pingctl.shard import shard as run

    cfg = load(
        config,
        set_,
        **{
            "data.shard.strategy": strategy,
            "data.shard.val_fraction": val,
            "data.shard.test_fraction": test,
            "data.shard.seed": seed,
            "data.shard.memory_limit": memory_limit,
        },
    )
    with step_progress("shard") as report:
        result = run(inputs, out, cfg.data.shard, force=force, progress=report)
    if as_json:
        emit(result, True)
        return
    t = splits_table(result, out)
    summary = kv_table(
        "shard summary",
        [
            ("input files", len(result["inputs"])),
            ("rows read", result["rows_read"]),
            ("rows written", result["rows_written"]),
            ("rows rejected", result["rows_rejected"]),
            *[(f"  rejected: {k}", v) for k, v in result["rejects_by_reason"].items()],
            ("splits disjoint", result["checks"]["disjoint"]),
            ("rows/s", result["rows_per_s"]),
            ("elapsed s", result["elapsed_s"]),
        ],
    )
    emit(result, False, [t, summary])
    if result["rows_rejected"]:
        say(f"rejected rows and reasons: {out / 'rejects.jsonl'}", "yellow")


def splits_table(result: dict, out):
    # splits as columns, as `inspect` shows them: nine figures per split fit 80 columns this way
    from rich.table import Table

    t = Table(title=f"splits ({result['strategy']}) -> {out}", title_justify="left")
    t.add_column("", style="bold")
    for s in result["splits"]:
        t.add_column(s["split"], justify="right")
    for label, cell in (
        ("rows", lambda s: fmt(s["rows"])),
        ("share", lambda s: f"{s.get('share', 0):.1%}"),
        ("files", lambda s: fmt(s.get("files", 0))),
        ("probes", lambda s: fmt(s.get("probes"))),
        ("pairs", lambda s: fmt(s.get("pairs"))),
        ("IPv6 rows", lambda s: fmt(s.get("v6_rows"))),
        ("failure share", lambda s: f"{s.get('failure_share') or 0:.1%}"),
        ("first (UTC)", lambda s: str(s.get("start"))[:16] if s["rows"] else "-"),
        ("last (UTC)", lambda s: str(s.get("end"))[:16] if s["rows"] else "-"),
    ):
        t.add_row(label, *(cell(s) for s in result["splits"]))
    return t


def register(app) -> None:
    app.command("shard")(handle_errors(shard))
