"""`pingctl inspect`: describe any pingctl artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import JsonOpt, console, emit, fmt, handle_errors, kv_table


def _table_rows(d: dict) -> list[tuple[str, object]]:
    rtt = d.get("rtt_ms", {})
    rows = [
        ("files", d["files"]),
        ("size MB", d["bytes"] / 1e6),
        ("rows", d["rows"]),
        ("invalid rows", d["invalid_rows"]),
        *[(f"  invalid: {k}", v) for k, v in d.get("invalid_by_reason", {}).items()],
        ("start (UTC)", str(d["start"])[:16]),
        ("end (UTC)", str(d["end"])[:16]),
        ("IPv4 rows", d["v4_rows"]),
        ("IPv6 rows", d["v6_rows"]),
        ("probes", d["probes"]),
        ("sources", d["src_addrs"]),
        ("destinations", d["dst_addrs"]),
        ("pairs", d["pairs"]),
        ("measurement ids", d["msm_ids"]),
        ("failure share", f"{(d['failure_share'] or 0):.2%}"),
        ("rows with errors", f"{(d['error_share'] or 0):.2%}"),
    ]
    rows += [(f"RTT {k} ms", rtt.get(k)) for k in ("p5", "p50", "p95", "p99")]
    return rows


def inspect(
    path: Annotated[Path, typer.Argument(help="A canonical Parquet file/dir, or a `pingctl shard` output dir.")],
    sample: Annotated[int, typer.Option("--sample", "-n", help="Also show N random rows.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Describe a dataset: rows, time span, address families, probes, pairs, RTT percentiles.

    Example: pingctl inspect runs/demo/splits --sample 5
    """
    from pingctl.inspect_table import describe

    result = describe(path, sample)
    if as_json:
        emit(result, True)
        return
    from rich.table import Table

    parts = result["splits"] if result["kind"] == "splits" else {str(path): result}
    tables: list = []
    if parts:
        t = Table(title=f"{result['kind']}: {path}", title_justify="left")
        t.add_column("", style="bold")
        for name in parts:
            t.add_column(name, justify="right")
        labelled = [_table_rows(d) for d in parts.values()]
        for i, (label, _) in enumerate(labelled[0]):
            if label.startswith("  invalid:"):
                continue
            t.add_row(label, *(fmt(rows[i][1]) for rows in labelled))
        tables.append(t)
    for name, d in parts.items():
        if d.get("sample"):
            st = Table(title=f"{name}: {len(d['sample'])} sample rows", title_justify="left", box=None)
            for c in ("event_time", "src_addr", "dst_addr", "rtt", "msm_id", "prb_id", "errors"):
                st.add_column(c, no_wrap=True, justify="right" if c in ("rtt", "msm_id", "prb_id", "errors") else "left")
            for r in d["sample"]:
                st.add_row(
                    str(r["event_time"])[:19], r["src_addr"], r["dst_addr"], fmt(r["rtt"]),
                    str(r["msm_id"]), str(r["prb_id"] if r["prb_id"] is not None else "-"), str(r["packet_error_count"]),
                )
            tables.append(st)
    emit(result, False, tables)
    for name, d in parts.items():
        if d["invalid_rows"]:
            console.print(f"[yellow]{name}: {d['invalid_rows']:,} invalid rows: {d['invalid_by_reason']}[/]")
    if not parts:
        console.print("[yellow]no Parquet data found[/]")


def register(app) -> None:
    app.command("inspect")(handle_errors(inspect))
