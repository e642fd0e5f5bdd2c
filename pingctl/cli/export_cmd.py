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
    combination: Annotated[Path | None, typer.Option(
        help="A combination.json `pingctl eval RUN --regimes` fitted for this run and step(s), copied into the "
             "export, whose answers are then combined by default (default: RUN/combination.json where it fits "
             "this step).")] = None,
    eval_report: Annotated[Path | None, typer.Option(
        help="A `pingctl eval` output whose table goes into the model card (default: the newest eval "
             "output beside the run of this run and step(s), if any).")] = None,
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", metavar="REPO",
        help="Then upload the export to this Hugging Face Hub model repo (owner/name; created if new), with "
             "the token of HF_TOKEN (or `hf auth login`). Needs the \\[hub] extra (huggingface_hub).")] = None,
    private: Annotated[bool, typer.Option(
        "--private", help="--push-to-hub: create the repo private (an existing repo keeps its visibility).")] = False,
    revision: Annotated[str | None, typer.Option(
        help="--push-to-hub: the branch to commit to (created from main if new; default: main).")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a model directory that loads without the run: config.json, model.safetensors, a model card.

    Example: pingctl export runs/demo/train -o models/demo --calibration runs/demo/eval-val/calibration.json

    Then: pingctl sample models/demo --src 78.143.22.26 --dst 194.255.199.229

    Shared on the Hugging Face Hub: pingctl export runs/demo/train -o models/demo --push-to-hub acme/pingctl-demo,
    then anywhere: pingctl sample acme/pingctl-demo --src 78.143.22.26 --dst 194.255.199.229
    """
    from pingctl.artifacts import hub
    from pingctl.artifacts.run import parse_steps
    from pingctl.errors import UsageError
    from pingctl.infer.export import export_model

    steps = parse_steps(step)
    if push_to_hub is None and (private or revision is not None):
        raise UsageError("--private and --revision are options of --push-to-hub")
    if push_to_hub is not None:  # before the export is written: a push that cannot happen is said first
        if not hub.REPO_ID.fullmatch(push_to_hub):
            raise UsageError(f"--push-to-hub {push_to_hub}: not a Hugging Face Hub repo id (owner/name)")
        hub.check_push()
    with step_progress("export") as report:
        result = export_model(run, out, steps, calibration, eval_report, force,
                              progress=lambda what: report(what, 0, None), repo_id=push_to_hub,
                              combination=combination)
        if push_to_hub is not None:
            report(f"pushing to {push_to_hub}", 0, None)
            result["hub"] = hub.push(out, push_to_hub, revision, private)
    rows = [("from", f"{result['run']} ({_steps(result['steps'])})"),
            ("preset / parameters", f"{result['preset']} / {result['parameters']:,}"),
            ("tensors / dtypes", f"{result['tensors']:,} / {', '.join(result['dtypes'])}"),
            *[(f["name"], _size(f["bytes"])) for f in result["files"]],
            ("eval report in the card", result["eval_report"] or "-"),
            ("combination", result["combination"] or result["combination_note"] or "-"),
            *([("pushed to", f"{result['hub']['repo']} ({result['hub']['revision']}): {result['hub']['url']}")]
              if "hub" in result else []),
            ("seconds", result["seconds"])]
    emit(result, as_json, kv_table(f"export: {result['out']}", rows))


def _size(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} KB"


def _steps(steps: list[int]) -> str:
    return f"mean of steps {', '.join(map(str, steps))}" if len(steps) > 1 else f"step {steps[0]}"


def register(app) -> None:
    app.command("export")(handle_errors(export))
