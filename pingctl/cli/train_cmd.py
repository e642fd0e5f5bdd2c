"""`pingctl train`: MaxText training on pingctl's loader, locally, on SLURM or on Modal."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, JsonOpt, SetOpt, console, emit, err_console, handle_errors, kv_table,
                                load, say)


def train(
    rows: Annotated[Path | None, typer.Argument(
        help="Training rows (`pingctl build-rows` output); with --status/--follow, the run directory.")] = None,
    eval_rows: Annotated[Path | None, typer.Option("--eval", help="Validation rows for eval loss.")] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", "-o", help="Run directory.")] = None,
    preset: Annotated[str | None, typer.Option(help="Model preset: tiny | mini | small | base.")] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps.")] = None,
    max_minutes: Annotated[float | None, typer.Option(
        "--max-minutes",
        help="Time bound: after this many minutes, save a checkpoint of the step in progress and stop.")] = None,
    target: Annotated[str | None, typer.Option(
        help="local | slurm | modal (any engine of pingctl.executor.registry).")] = None,
    hardware: Annotated[str | None, typer.Option(help="cpu | gpu | tpu.")] = None,
    processes: Annotated[int | None, typer.Option(
        "--processes", help="local CPU runs: N JAX processes on this machine, each reading 1/N of every batch "
        "(train.processes).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Delete the run directory and start over.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="slurm/modal: show what would run, submit nothing.")] = False,
    status: Annotated[bool, typer.Option(
        "--status", help="Report a run submitted with --target slurm|modal: job state, checkpoints, log.")] = False,
    follow: Annotated[bool, typer.Option(
        "--follow", help="Stream a submitted run's log until its job ends; exit 0 only if the job succeeded.")] = False,
    name: Annotated[str | None, typer.Option(
        "--name", help="modal: the remote run's name (default: the run directory's name + a hash of its path).")] = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="modal: submit and return; then --status/--follow and `pingctl pull RUN`.")] = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train the ping LLM with MaxText (resumes from the last checkpoint unless --fresh).

    Example: pingctl train runs/demo/rows/train --eval runs/demo/rows/val --preset tiny --steps 200

    Bounded time: --max-minutes 90 checkpoints the step in progress at 90 minutes and stops; the same command run again resumes there.

    Submitted runs: pingctl train runs/demo/run --status (or --follow), after pingctl train ROWS --run-dir runs/demo/run --target slurm
    """
    if status or follow:
        _submitted(rows, run_dir, status, follow, config, set_, as_json)
        return
    cfg = load(
        config,
        set_,
        **{
            "train.train_rows": str(rows) if rows else None,
            "train.eval_rows": str(eval_rows) if eval_rows else None,
            "train.run_dir": str(run_dir) if run_dir else None,
            "model.preset": preset,
            "train.steps": steps,
            "train.max_minutes": max_minutes,
            "train.target": target,
            "train.hardware": hardware,
            "train.processes": processes,
        },
    )
    from pingctl.errors import require_command
    from pingctl.executor import registry

    # before the run directory exists: without [train] the worker would crash beside it
    require_command("train --target modal" if cfg.train.target == "modal" else "train")
    executor = registry.create(cfg.train.target, "train")
    run = Path(cfg.train.run_dir)
    extra = {k: v for k, v in {"name": name, "detach": detach}.items() if v}
    if set(extra) - executor.submit_options:
        from pingctl.errors import UsageError

        raise UsageError(f"--name and --detach are for --target modal (this run's target: {cfg.train.target})")
    if executor.remote:
        _remote_report(executor.submit(cfg, run, fresh=fresh, dry_run=dry_run, **extra), as_json)
        return
    if as_json:
        summary = executor.submit(cfg, run, fresh=fresh)
    else:
        summary = _with_live_view(cfg, run, fresh, executor.submit)
    _report(summary, as_json)


def _with_live_view(cfg, run: Path, fresh: bool, train):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("[bold]train[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss [cyan]{task.fields[loss]}[/]  eval [magenta]{task.fields[eval]}[/]  {task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
    )
    state = {"eval": "-"}
    # the bar opens only once the pre-flight checks pass: a refused command prints its error alone
    with contextlib.ExitStack() as stack:
        def on_start(run: Path) -> None:
            stack.enter_context(bar)
            state["task"] = bar.add_task("train", total=cfg.train.steps, loss="-", eval="-", tps="-")
            bar.console.print(f"run dir {run} (raw MaxText log: {run / 'train.log'})", highlight=False)

        def on_record(rec: dict) -> None:
            if rec["kind"] == "eval":
                state["eval"] = f"{rec['eval_loss']:.3f}"
                bar.update(state["task"], eval=state["eval"])
                return
            bar.update(
                state["task"], completed=rec["step"] + 1, loss=f"{rec['loss']:.3f}",
                tps=f"{rec['tokens_per_s_per_device']:,.0f}",
            )

        return train(cfg, run, fresh=fresh, on_record=on_record, on_start=on_start)


def _report(s: dict, as_json: bool) -> None:
    def f(v, spec=".4f"):
        return "-" if v is None else format(v, spec)

    rows = [
        ("run dir", s["run_dir"]),
        ("preset / parameters", f"{s['preset']} / {s['parameters']:,}"),
        ("steps this run", f"{s['first_step_this_run']} .. {s['last_step']} of {s['steps_total']}"),
        ("resumed from checkpoint", "-" if s["resumed_from_checkpoint"] is None else s["resumed_from_checkpoint"]),
        ("train loss (this run) first -> final", f"{f(s['first_loss'])} -> {f(s['final_loss'])}"),
        ("eval loss (this run) first -> final", f"{f(s['first_eval_loss'])} -> {f(s['final_eval_loss'])}"),
        ("eval - train loss (last eval)", f(s.get("generalization_gap"), ".3f")),
        ("tokens/s per device", f(s["tokens_per_s_per_device"], ",.0f")),
        ("step time s", f(s["step_seconds"])),
        ("waiting for batches", _input_wait(s)),
        ("checkpoints", ", ".join(map(str, s["checkpoints"])) or "-"),
        ("stopped early", _stopped(s.get("stopped_early"))),
        ("loss curve", s["loss_png"]),
        ("TensorBoard", s["tensorboard"]),
        ("elapsed s", f(s["elapsed_s"], ".1f")),
    ]
    emit(s, as_json, kv_table("train summary", rows))
    if not as_json:
        for w in s.get("warnings", []):
            say(w, "", err=True, label="warning: ")


def _input_wait(s: dict) -> str:
    wait, share = s.get("input_wait_s"), s.get("input_wait_share")
    if wait is None:
        return "-"
    return f"{wait * 1e3:.1f} ms a step" + (f" ({share:.1%} of the step)" if share is not None else "")


def _stopped(info: dict | None) -> str:
    if not info:
        return "no"
    from pingctl.artifacts.run import stop_message

    return f"{stop_message(info)}; rerun to continue"


def _submitted(arg: Path | None, run_dir: Path | None, status: bool, follow: bool, config, set_, as_json: bool) -> None:
    """--status / --follow: the run directory is --run-dir, else the argument, else train.run_dir;
    the engine is the one its remote.json names (pingctl.executor.registry): its `status(run)` and
    `follow(run)` (streams the log to sys.stdout, returns the final status); `ok` False in what
    follow returns makes the exit status 1."""
    from pingctl.artifacts.remote import read_remote
    from pingctl.errors import PingctlError, UsageError

    if status and follow:
        raise UsageError("--status and --follow: give one")
    # --run-dir first: the submitting command with --status added (ROWS --run-dir RUN) asks about RUN
    run = run_dir or arg or Path(load(config, set_).train.run_dir)
    if not run.is_dir():
        raise PingctlError(f"{run}: no such run directory")
    record = read_remote(run)
    if record is None:
        raise PingctlError(f"{run}: nothing was submitted from this run directory (no remote.json); --status and "
                           f"--follow are for runs trained with --target slurm or modal (a local run: `pingctl inspect {run}`)")
    from pingctl.executor import registry

    try:
        engine = registry.get(record["target"])()
    except UsageError:
        raise PingctlError(f"{run}/remote.json: unknown target {record['target']!r} "
                           f"({', '.join(registry.names())})") from None
    if status:
        result = engine.status(run)
        emit(result, as_json, kv_table(f"{run} ({record['target']})", _status_rows(result)))
        return
    result = engine.follow(run)  # with --json, what it prints goes to stderr (handle_errors)
    emit(result, as_json, kv_table(f"{run} ({record['target']})", _status_rows(result)))
    if result.get("ok") is False:
        if as_json:  # the status above is the answer; a second JSON object would break it
            raise typer.Exit(1)
        where = f"; see {result['log']}" if result.get("log") else ""
        raise PingctlError(f"job {result.get('job_id', '')} ended {result.get('state', 'unsuccessfully')}"
                           f"{' (exit code ' + result['exit_code'] + ')' if result.get('exit_code') else ''}{where}")


def _status_rows(s: dict) -> list[tuple[str, object]]:
    """The fields a status holds, in reading order (an engine's own extra fields last)."""
    order = ["job_id", "state", "reason", "exit_code", "restarts", "elapsed", "nodes", "submitted_at",
             "last_step", "steps_total", "last_checkpoint", "log", "summary"]
    skip = {"target", "run_dir", "checkpoints", "active", "ok", "source"}
    keys = [k for k in order if k in s] + [k for k in s if k not in order and k not in skip]
    return [(k.replace("_", " "), "-" if s[k] is None else s[k]) for k in keys]


def _remote_report(result: dict, as_json: bool) -> None:
    if as_json:
        emit(result, True)
        return
    for title, text in result.get("show", []):
        console.rule(title)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    emit(result, False, kv_table(f"train --target {result['target']}", list(result.get("summary", {}).items())))


def register(app) -> None:
    app.command("train")(handle_errors(train))
