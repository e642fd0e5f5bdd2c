"""`pingctl build-rows`: one split of canonical Parquet -> probe-centric ArrayRecord rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, ForceOpt, JsonOpt, MemoryLimitOpt, SetOpt, emit, handle_errors, kv_table,
                                load, say, step_progress)


def build_rows(
    inputs: Annotated[list[Path], typer.Argument(help="Canonical Parquet of one split (file, dir or glob).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory for .arrayrecord files.")],
    max_row_mb: Annotated[float | None, typer.Option(help="Split longer probe histories into records of this size.")] = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Group measurements by probe into time-ordered, pre-parsed ArrayRecord rows for the loader.

    Example: pingctl build-rows runs/demo/splits/train -o runs/demo/rows/train
    """
    from pingctl.records.build import build_rows as run

    cfg = load(config, set_, **{"rows.max_row_mb": max_row_mb, "rows.memory_limit": memory_limit})
    with step_progress("build-rows") as report:
        result = run(
            inputs, out, cfg.rows.max_row_mb, cfg.rows.memory_limit, force=force, progress=report,
            config=cfg.rows.model_dump(),
        )
    rows = [
        ("records", result["records"]),
        ("probes", result["probes"]),
        ("measurements", result["measurements"]),
        ("rows rejected", result["rows_rejected"]),
        ("files", len(result["files"])),
        ("size MB", result["bytes"] / 1e6),
        ("time span (UTC)", f"{str(result['start'])[:16]} .. {str(result['end'])[:16]}"),
        ("layout version", result["layout_version"]),
        ("measurements/s", result["measurements_per_s"]),
        ("elapsed s", result["elapsed_s"]),
    ]
    emit(result, as_json, kv_table(f"build-rows -> {out}", rows))
    if result["rows_rejected"] and not as_json:
        say(f"rejected rows: {out / 'rejects.jsonl'}", "yellow")


def register(app) -> None:
    app.command("build-rows")(handle_errors(build_rows))
