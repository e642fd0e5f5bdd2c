"""`pingctl config init|show|check`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import ConfigOpt, JsonOpt, SetOpt, console, emit, handle_errors, load

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("init")
@handle_errors
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the YAML file.")] = Path("pingctl.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a commented default config file.

    Example: pingctl config init my.yaml && pingctl synth --config my.yaml
    """
    from pingctl.atomic import atomic_file
    from pingctl.config import commented_yaml
    from pingctl.errors import PingctlError

    if path.exists() and not force:
        raise PingctlError(f"{path} already exists (use --force to overwrite)")
    with atomic_file(path) as tmp:
        tmp.write_text(commented_yaml())
    if as_json:
        emit({"path": str(path), "bytes": path.stat().st_size}, True)
    else:
        console.print(f"wrote {path}")


@app.command("show")
@handle_errors
def show(config: ConfigOpt = None, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Print the resolved config (defaults < --config file < --set overrides).

    Example: pingctl config show -c my.yaml --set data.shard.strategy=probe --json
    """
    from pingctl.config import commented_yaml

    cfg = load(config, set_)
    if as_json:
        emit(cfg.model_dump(mode="json"), True)
    else:
        from rich.syntax import Syntax

        console.print(Syntax(commented_yaml(cfg), "yaml", theme="ansi_dark", background_color="default"))


@app.command("check")
@handle_errors
def check(config: ConfigOpt = None, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Validate a config file; exit 0 when valid, 2 with the bad fields when not.

    Example: pingctl config check -c my.yaml
    """
    load(config, set_)
    emit({"valid": True, "config": str(config) if config else None, "set": list(set_ or [])}, as_json)
    if not as_json:
        console.print(f"[green]valid[/] {config or '(defaults)'}" + "".join(f" + {kv}" for kv in set_ or []))
