"""`pingctl export`: a trained run's model as a self-contained directory (docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import ForceOpt, JsonOpt, StepOpt, emit, handle_errors, kv_table, step_progress


def export(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The model directory to write (replaced if an export).")],
    step: StepOpt = None,
    calibration: Annotated[Path | None, typer.Option(
        help="A calibration.json `pingctl eval` fitted for this run and step(s), copied into the export "
             "(default: none).")] = None,
    eval_report: Annotated[Path | None, typer.Option(
        help="A `pingctl eval` output whose table goes into the model card (default: the newest eval "
             "output beside the run of this run and step(s), if any).")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a model directory that loads without the run: config.json, model.safetensors, a model card.

    Example: pingctl export runs/demo/train -o models/demo --calibration runs/demo/eval-val/calibration.json

    Then: pingctl sample models/demo --src 78.143.22.26 --dst 194.255.199.229
    """
    from pingctl.artifacts.run import parse_steps
    from pingctl.infer.export import export_model

    steps = parse_steps(step)
    with step_progress("export") as report:
        result = export_model(run, out, steps, calibration, eval_report, force,
                              progress=lambda what: report(what, 0, None))
    rows = [("from", f"{result['run']} ({_steps(result['steps'])})"),
            ("preset / parameters", f"{result['preset']} / {result['parameters']:,}"),
            ("tensors / dtypes", f"{result['tensors']:,} / {', '.join(result['dtypes'])}"),
            *[(f["name"], _size(f["bytes"])) for f in result["files"]],
            ("eval report in the card", result["eval_report"] or "-"),
            ("seconds", result["seconds"])]
    emit(result, as_json, kv_table(f"export: {result['out']}", rows))


def _size(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} KB"


def _steps(steps: list[int]) -> str:
    return f"mean of steps {', '.join(map(str, steps))}" if len(steps) > 1 else f"step {steps[0]}"


def register(app) -> None:
    app.command("export")(handle_errors(export))
