"""`pingctl pull`: a run trained on Modal, brought home as a run directory (docs/train.md, "Modal"). The
logic: `pull_run` in pingctl/executor/modal/pull.py, beside the rest of the Modal engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import JsonOpt, emit, handle_errors, kv_table, step_progress


def pull(
    run: Annotated[Path, typer.Argument(help="The run directory the run was submitted from (holds remote.json).")],
    steps: Annotated[str | None, typer.Option(
        "--steps", help="Checkpoints to bring: latest (default), all, or steps separated by commas (1000,2000).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="The remote run's name, for a run directory without remote.json.")] = None,
    volume: Annotated[str | None, typer.Option(
        "--volume", help="The Modal volume (default: the one remote.json names, else train.modal.volume's default).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Bring a Modal run home: config, summary, metrics, loss plot, train.log, TensorBoard events, checkpoints.

    Example: pingctl pull runs/demo/train --steps latest

    Then: pingctl inspect runs/demo/train; pingctl sample runs/demo/train --src 78.143.22.26 --dst 194.255.199.229
    """
    from pingctl.errors import require_command

    require_command("pull")  # before anything is read or written
    from pingctl.artifacts.run import parse_steps
    from pingctl.executor.modal.pull import pull_run

    wanted = None if steps in (None, "", "latest") else "all" if steps == "all" else parse_steps(steps)
    with step_progress("pull") as report:
        result = pull_run(run, wanted, name=name, volume=volume, progress=lambda what: report(what, 0, None))
    rows = [("from", result["remote"]),
            ("checkpoints there", ", ".join(map(str, result["remote_checkpoints"])) or "none yet"),
            ("pulled now", ", ".join(map(str, result["pulled_checkpoints"])) or "-"),
            ("checkpoints here", ", ".join(map(str, result["checkpoints"])) or "-"),
            ("files / MB", f"{result['files']:,} / {result['bytes'] / 1e6:,.1f}"),
            ("summary.json", result["summary"]),
            ("run directory", result["run_dir"] if result["run_dir_ready"] else
             f"{result['run_dir']} (no config.yaml on the volume yet: training has not started)")]
    emit(result, as_json, kv_table("pull", rows))


def register(app) -> None:
    app.command("pull")(handle_errors(pull))
