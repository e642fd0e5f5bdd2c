"""`pingctl shard`: canonical table -> train/val/test Parquet shards (or, for `--strategy
regimes`, train/val and one test set per regime)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, ForceOpt, JsonOpt, MemoryLimitOpt, SetOpt, emit, fmt, handle_errors,
                                kv_table, load, say, step_progress)


def shard(
    inputs: Annotated[list[Path], typer.Argument(help="Canonical Parquet files, directories or globs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (gets train/ val/ test/, or for "
                                      "regimes train/ val/ test_time/ test_pair/ test_probe/ test_target/).")],
    strategy: Annotated[
        str | None, typer.Option(help="time | probe | target | pair | random | regimes (config data.shard.strategy)")
    ] = None,
    val: Annotated[float | None, typer.Option("--val", help="Validation fraction.")] = None,
    test: Annotated[float | None, typer.Option("--test", help="Test fraction (not for regimes: see --regime).")] = None,
    regime: Annotated[list[str] | None, typer.Option(
        "--regime", help="NAME=FRACTION for --strategy regimes, repeatable: time (last share of rows), pair "
        "(share of pairs), probe (share of sources), target (share of destinations), val (val_pair/val_probe/"
        "val_target groups per test group); defaults time=0.1 pair=0.05 probe=0.05 target=0.05 val=0.5 "
        "(config data.shard.regimes.NAME)",
    )] = None,
    seed: Annotated[int | None, typer.Option(help="Assignment seed.")] = None,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Split a measurement table into train/val/test shards (DuckDB; by time, probe, target, pair or
    row), or with --strategy regimes into train/val and a test set per regime (time, pair, probe, target).

    Example: pingctl shard runs/demo/synth -o runs/demo/splits --strategy time --test 0.1

    Example: pingctl shard runs/demo/synth -o runs/demo/regimes --strategy regimes --regime probe=0.1
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
            **_regime_values(regime),
        },
    )
    if cfg.data.shard.strategy == "regimes" and test is not None:
        from pingctl.errors import UsageError

        raise UsageError("--test is the test share of one test split; --strategy regimes has one per regime: "
                         "give e.g. --regime time=0.1 --regime pair=0.05")
    if regime and cfg.data.shard.strategy != "regimes":
        from pingctl.errors import UsageError

        raise UsageError(f"--regime applies to --strategy regimes, not {cfg.data.shard.strategy}")
    with step_progress("shard") as report:
        result = run(inputs, out, cfg.data.shard, force=force, progress=report)
    if as_json:
        emit(result, True)
        return
    t = splits_tables(result, out)
    summary = kv_table(
        "shard summary",
        [
            ("input files", len(result["inputs"])),
            ("rows read", result["rows_read"]),
            ("rows written", result["rows_written"]),
            ("rows rejected", result["rows_rejected"]),
            *[(f"  rejected: {k}", v) for k, v in result["rejects_by_reason"].items()],
            *([("rows dropped (no regime)", result["rows_dropped"])] if result.get("rows_dropped") else []),
            *[(f"  dropped: {k}", v) for k, v in result.get("dropped_by_reason", {}).items()],
            ("splits disjoint", result["checks"]["disjoint"]),
            ("rows/s", result["rows_per_s"]),
            ("elapsed s", result["elapsed_s"]),
        ],
    )
    emit(result, False, [*t, summary])
    if result["rows_rejected"]:
        say(f"rejected rows and reasons: {out / 'rejects.jsonl'}", "yellow")


def _regime_values(items: list[str] | None) -> dict:
    """--regime NAME=FRACTION options as config keys; a malformed one is a usage error (exit 2)."""
    from pingctl.artifacts.table import REGIMES
    from pingctl.errors import UsageError

    values: dict = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or name not in (*REGIMES, "val"):
            raise UsageError(f"--regime {item!r}: expected NAME=FRACTION with NAME one of {', '.join(REGIMES)}, val")
        try:
            values[f"data.shard.regimes.{name}"] = float(text)
        except ValueError:
            raise UsageError(f"--regime {item!r}: {text!r} is not a fraction like 0.05") from None
    return values


def splits_tables(result: dict, out) -> list:
    """Three splits to a table: a regimes split's six as two tables that each fit 80 columns."""
    splits = result["splits"]
    if len(splits) <= 3:
        return [splits_table(result, out)]
    return [splits_table(result, out, splits[:3]), splits_table(result, out, splits[3:], title=False)]


def splits_table(result: dict, out, splits: list[dict] | None = None, title: bool = True):
    # splits as columns, as `inspect` shows them: ten figures per split fit 80 columns this way
    from rich.table import Table

    splits = result["splits"] if splits is None else splits
    t = Table(title=f"splits ({result['strategy']}) -> {out}" if title else None, title_justify="left")
    t.add_column("", style="bold")
    for s in splits:
        t.add_column(s["split"], justify="right")
    for label, cell in (
        ("rows", lambda s: fmt(s["rows"])),
        ("share", lambda s: f"{s.get('share', 0):.1%}"),
        ("files", lambda s: fmt(s.get("files", 0))),
        ("probes", lambda s: fmt(s.get("probes"))),
        ("destinations", lambda s: fmt(s.get("destinations"))),
        ("pairs", lambda s: fmt(s.get("pairs"))),
        ("IPv6 rows", lambda s: fmt(s.get("v6_rows"))),
        ("failure share", lambda s: f"{s.get('failure_share') or 0:.1%}"),
        ("first (UTC)", lambda s: str(s.get("start"))[:16] if s["rows"] else "-"),
        ("last (UTC)", lambda s: str(s.get("end"))[:16] if s["rows"] else "-"),
    ):
        t.add_row(label, *(cell(s) for s in splits))
    return t


def register(app) -> None:
    app.command("shard")(handle_errors(shard))
