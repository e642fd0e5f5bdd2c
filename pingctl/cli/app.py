"""The `pingctl` Typer app. Command modules import only typer/rich at module level, so
`pingctl --help` stays fast; each command imports its library code when it runs."""

from __future__ import annotations

import typer

from pingctl import __version__

app = typer.Typer(
    name="pingctl",
    help="Train a generative Transformer on internet latency measurements and ask it questions.\n\n"
    "Data flows one way: ingest/synth -> shard -> build-rows -> train -> sample/eval.",
    no_args_is_help=True,
    # Typer's --install-completion / --show-completion; completing imports only the CLI modules
    add_completion=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pingctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    pass


def _register() -> None:
    from pingctl.cli import bench_cmd, build_rows_cmd, config_cmd, eval_cmd, export_cmd, fetch_cmd, hints_cmd, pull_cmd, sample_cmd, score_cmd, serve_cmd, ingest_cmd, inspect_cmd, shard_cmd, synth_cmd, tokenize_cmd, train_cmd

    for mod in (fetch_cmd, ingest_cmd, synth_cmd, shard_cmd, tokenize_cmd, build_rows_cmd, hints_cmd, train_cmd, pull_cmd, sample_cmd, score_cmd, eval_cmd, export_cmd, serve_cmd, inspect_cmd):
        mod.register(app)
    app.add_typer(
        config_cmd.app,
        name="config",
        help="Write, show and check the shared YAML config.\n\nExample: pingctl config init my.yaml && pingctl config check -c my.yaml",
    )
    app.add_typer(
        bench_cmd.app,
        name="bench",
        help="Performance figures: prints a table and writes JSON.\n\nExample: pingctl bench train --presets tiny --steps 20",
    )


_register()


def main() -> None:
    app()
