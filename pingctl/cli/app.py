"""The `pingctl` Typer app. Command modules import only typer/rich at module level, so
`pingctl --help` stays fast; each command imports its library code when it runs."""

from __future__ import annotations

import typer

from pingctl import __version__


def _extras_help() -> str:
    """Which commands need which extra, from the table their checks read (errors.COMMAND_NEEDS).
    Brackets escaped: Typer reads help as Rich markup, where "[data]" is a style tag and vanishes."""
    from pingctl.errors import COMMAND_NEEDS

    by_extra: dict[str, list[str]] = {}
    for command, (extra, _) in COMMAND_NEEDS.items():
        listed = by_extra.setdefault(extra, [])
        if command.split()[0] not in listed:  # "train --target modal" is still train's [train]
            listed.append(command)
    need = "; ".join(f"{', '.join(cs)}: \\[{extra}]" for extra, cs in by_extra.items())
    return ("Installs: the base install answers questions (sample, score, serve, export) and runs every command "
            f"not named here; the others need an extra: {need}. \\[train] holds everything. A command run "
            "without its extra says so, and prints the pip command that adds it, before it writes anything.")


app = typer.Typer(
    name="pingctl",
    help="Train a generative Transformer on internet latency measurements and ask it questions.\n\n"
    "Data flows one way: ingest/synth -> shard -> build-rows -> train -> sample/eval.\n\n" + _extras_help(),
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
    _note_extras()
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


def _note_extras() -> None:
    """Each command that needs an extra says so at the end of its own --help."""
    import inspect

    from pingctl.errors import COMMAND_NEEDS, package_names

    for info in app.registered_commands:
        if info.name in COMMAND_NEEDS:
            extra, modules = COMMAND_NEEDS[info.name]
            doc = info.help if info.help is not None else inspect.getdoc(info.callback) or ""
            info.help = f"{doc}\n\nNeeds the \\[{extra}] extra ({', '.join(package_names(modules))})."


_register()


def main() -> None:
    app()
