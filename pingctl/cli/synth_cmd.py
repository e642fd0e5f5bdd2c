"""`pingctl synth`: a synthetic world of pings with ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import ConfigOpt, JsonOpt, SetOpt, emit, handle_errors, kv_table, load, progress


def synth(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory (Parquet parts + truth/ + manifest.json).")],
    rows: Annotated[int | None, typer.Option(help="Approximate number of rows (packets).  \\[config: data.synth.rows]")] = None,
    probes: Annotated[int | None, typer.Option(help="Vantage points.  \\[config: data.synth.probes]")] = None,
    targets: Annotated[int | None, typer.Option(help="Destinations.  \\[config: data.synth.targets]")] = None,
    targets_per_probe: Annotated[
        int | None, typer.Option(help="Destinations each probe pings.  \\[config: data.synth.targets_per_probe]")
    ] = None,
    step: Annotated[int | None, typer.Option(help="Seconds between rounds.  \\[config: data.synth.step]")] = None,
    packets: Annotated[int | None, typer.Option(help="Packets per result.  \\[config: data.synth.packets]")] = None,
    dual_stack_share: Annotated[
        float | None, typer.Option(help="Share of dual-stack hosts.  \\[config: data.synth.dual_stack_share]")
    ] = None,
    start: Annotated[str | None, typer.Option(help="UTC start, ISO 8601.  \\[config: data.synth.start]")] = None,
    seed: Annotated[int | None, typer.Option(help="World and noise seed.  \\[config: data.synth.seed]")] = None,
    addresses: Annotated[str | None, typer.Option(
        help="structured (prefixes follow region, AS and city) or random (no relation to place, AS or prefix: "
        "only measurements tell where a host is).  \\[config: data.synth.addresses]")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output: another synth world (the same "
                                        "world is always rewritten), or a directory pingctl did not write.")] = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Generate a realistic synthetic ping dataset with ground truth (cities, ASes, routes, diurnal load).

    Example: pingctl synth -o runs/demo/synth --rows 1000000 --seed 1

    Example: pingctl synth -o runs/demo/synth-random --addresses random
    """
    from pingctl.synth.generate import generate

    cfg = load(
        config,
        set_,
        **{
            "data.synth.rows": rows,
            "data.synth.probes": probes,
            "data.synth.targets": targets,
            "data.synth.targets_per_probe": targets_per_probe,
            "data.synth.step": step,
            "data.synth.packets": packets,
            "data.synth.dual_stack_share": dual_stack_share,
            "data.synth.start": start,
            "data.synth.seed": seed,
            "data.synth.addresses": addresses,
        },
    )
    with progress(transient=True) as bar:
        task = bar.add_task("synth chunks", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = generate(cfg.data.synth, out, force=force, progress=report)
    if as_json:
        emit(result, True)
        return

    def ms(v):
        return None if v is None else round(v, 2)

    rows_ = result["rows"] or 1
    emit(
        result,
        False,
        kv_table(
            f"synth -> {out}",
            [
                ("rows", result["rows"]),
                ("  IPv4 rows", result["v4_rows"]),
                ("  IPv6 rows", result["v6_rows"]),
                ("failure share", f"{result['failure_share']:.2%}"),
                ("  with packet errors", f"{result['error_rows'] / rows_:.2%}"),
                ("probes", result["probes"]),
                ("targets", result["targets"]),
                ("pairs (probe, target)", result["pairs"]),
                ("streams (pair, ip_version)", result["streams"]),
                ("ASes", result["ases"]),
                ("addresses", result["addresses"]),
                ("start", result["start"]),
                ("end", result["end"]),
                ("span", f"{result['span_s'] / 3600:.1f} h"),
                ("RTT p5 / p50 / p95 ms", f"{ms(result['rtt_p5_ms'])} / {ms(result['rtt_p50_ms'])} / "
                 f"{ms(result['rtt_p95_ms'])}"),
                ("route segments", result["route_segments"]),
                ("outages", result["outages"]),
                ("files", len(result["data_files"])),
                ("MB written", f"{result['bytes'] / 1e6:,.1f}"),
                ("rows/s", result["rows_per_s"]),
                ("elapsed s", result["elapsed_s"]),
            ],
        ),
    )


def register(app) -> None:
    app.command("synth")(handle_errors(synth))
