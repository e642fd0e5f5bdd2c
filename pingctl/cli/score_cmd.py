"""`pingctl score`: how surprising each measured result of a table is to a trained model."""

from __future__ import annotations

import time as _time
from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (AnswerOpt, CombinationOpt, EngineOpt, HardwareOpt, JsonOpt, RevisionOpt, StepOpt, emit, err_console, fmt, grid_table,
                                handle_errors, kv_table, model_dir, progress, say)

# pingctl.infer.score's bounds, for the options (the CLI imports nothing heavy at start-up;
# tests/test_score.py checks that the two agree)
MAX_ROWS = 1_000_000
MAX_CONTEXT = 10_000
BUCKET_ROWS = 500_000  # pingctl.infer.score_parts's (tests/test_score_parts.py checks it too)
TOP = 10  # flagged rows printed with --threshold; -o and --json hold them all


def score(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory, or a `pingctl export` model, or its Hugging Face Hub repo id (owner/name).")],
    table: Annotated[Path, typer.Argument(help="Canonical Parquet: a file, a directory or a glob.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the scored rows go: a .parquet, .csv or .json file, "
                                                           "or a directory (no suffix) for a table of any size, "
                                                           "written a bucket of probes at a time and resumable.")],
    threshold: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Flag rows whose tail probability is below P, and print the "
                               f"{TOP} most surprising.")] = None,
    context: Annotated[int, typer.Option(
        min=0, max=MAX_CONTEXT, help="Preceding measurements of the probe in each prompt.")] = 16,
    context_policy: Annotated[str, typer.Option(
        help="stream (default): each probe's rows of the table as one token stream, every row scored "
             "after the ones before it in its window (at least --context of them where half the model's "
             "context holds them), 7-10x faster than a prompt per row; probe: a prompt per row of the "
             "probe's --context preceding rows, capped per pair as in training; cold: probe without the "
             "scored pair's own rows; none: no context; both: the probe's rows to other destinations and "
             "the destination's rows from other sources, --context of each (a model trained with "
             "loader.triangulation_share) (docs/score.md).")] = "stream",
    limit: Annotated[int | None, typer.Option(
        min=1, max=MAX_ROWS, help=f"Score the first N rows (a table of more than {MAX_ROWS:,} rows needs it, or "
                                  "a directory -o).")] = None,
    bucket_rows: Annotated[int, typer.Option(
        min=1, max=MAX_ROWS, help="With a directory -o: valid rows per bucket (and part), on average; a probe's rows "
                                  "are never split.")] = BUCKET_ROWS,
    answer: AnswerOpt = None,
    combination: CombinationOpt = None,
    step: StepOpt = None,
    revision: RevisionOpt = None,
    hardware: HardwareOpt = None,
    engine: EngineOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Score every measurement of a table: the model's surprise (NLL), PIT and tail probability.

    Example: pingctl score runs/demo/train runs/demo/splits/test -o scores.parquet --threshold 0.001

    The prompts eval asks (slower, one prompt per row): pingctl score runs/demo/train day.parquet -o scores.csv --context-policy probe

    A table of any size, into a directory of Parquet parts (one per bucket of probes; `row` is each row's place in
    TABLE), resumed by the same command after an interruption:

    Example: pingctl score runs/demo/train day/ -o day-scores

    Rows build-rows would reject are set aside and counted by reason (read = scored + rejected).
    Columns written: the canonical ones, then nll (nats), pit, tail_p, p_fail, context_measurements
    (docs/score.md).
    """
    from pingctl.api import Model
    from pingctl.api import checks as C
    from pingctl.artifacts import score_output as SO
    from pingctl.artifacts.run import parse_steps, run_config

    C.check_hardware(hardware)
    C.check_engine(engine)
    bucketed = SO.is_directory(out)
    if bucketed:
        C.check_bucketed(context, context_policy, limit, bucket_rows)
    else:
        C.check_score_options(context, context_policy, limit)
    C.check_answer(answer)
    steps = parse_steps(step)
    SO.check_out(out, _inputs(table), within={"TABLE": table, "RUN": run})
    run = model_dir(run, revision)  # a Hub repo id: its snapshot
    run_config(run)  # a bad run directory is named before the table is read
    C.check_combination(run, answer, combination)
    got = _read(table, out if bucketed else None, limit, bucket_rows, as_json)
    with err_console.status(f"loading {run} ..."):
        model = Model.load(run, steps, hardware, calibration=False, engine=engine, answer=answer,
                           combination=combination)
    t0 = _time.perf_counter()
    if bucketed:
        meta, scored_now = _score_parts(model, got, out, context, context_policy)
        result = {**meta, **C.parts_summary(out, threshold)}
    else:
        with progress(transient=True) as bar:
            # the bar (and its time remaining) moves from the first chunk of rows on
            task = bar.add_task("scoring", total=got.table.num_rows)
            scored = model.score(got, context=context, context_policy=context_policy,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
        SO.write_scores(scored, out)
        scored_now = scored.num_rows
        result = {**C.score_meta(scored), **C.score_summary(scored, threshold)}
    elapsed = _time.perf_counter() - t0
    result.update(out=str(out), seconds=round(elapsed, 3), device=model.device, engine=model.loaded.engine,
                  rows_per_s=round(scored_now / elapsed, 1) if elapsed > 0 and scored_now else None)
    if as_json:
        emit(result, True)
        return
    tables = [kv_table(f"scores ({model.loaded.label})", _summary_rows(result))]
    if threshold is not None:
        tables.append(_top_table(result, threshold))
    emit(result, False, tables)


def _read(table: Path, directory: Path | None, limit: int | None, bucket_rows: int, as_json: bool):
    """TABLE read and checked before the model loads: into a directory's buckets, or whole."""
    from pingctl.api import checks as C
    from pingctl.schema.duck import rejected_lines

    if directory is not None:
        with err_console.status(f"reading {table} into buckets of probes under {directory} ..."):
            got = C.partition_scores(table, directory, limit=limit, bucket_rows=bucket_rows)
    else:
        got = C.read_scores(table, limit)
    if got.rejected and not as_json:
        say(f"{table}: set aside {got.rows_rejected:,} of {got.rows_read:,} rows, which build-rows would reject:",
            err=True, label="warning: ")
        for line in rejected_lines(got.rejected):
            say(line, err=True)
    return got


def _score_parts(model, got, out: Path, context: int, context_policy: str) -> tuple[dict, int]:
    """The buckets scored into `out`, one bar over all rows (parts written by an earlier run
    counted from the start, not as speed); (the manifest without its file list, rows scored now)."""
    from pingctl.errors import Interrupted

    with progress(transient=True) as bar:
        task = bar.add_task("scoring", total=got.rows_valid)
        started = []

        def moved(done: int, total: int) -> None:
            if not started:  # the rows of resumed parts: where the bar starts, not how fast it moves
                started.append(done)
                bar.reset(task, total=total, completed=done)
            else:
                bar.update(task, completed=done, total=total)

        try:
            meta = model.score_to(got, out, context=context, context_policy=context_policy, progress=moved)
        except KeyboardInterrupt:
            raise Interrupted(f"{out} keeps the parts written so far; the same command resumes from them") from None
    meta.pop("data_files", None)
    return meta, meta["rows_scored"] - meta["rows_resumed"]


def _inputs(table: Path) -> list[Path]:
    """The files of TABLE, for -o's check; an unreadable TABLE is named when it is read."""
    from pingctl.artifacts.table import resolve_inputs
    from pingctl.errors import PingctlError

    try:
        return resolve_inputs([table])
    except PingctlError:
        return []


def _summary_rows(r: dict) -> list[tuple]:
    rows = [("rows read", r["rows_read"]), ("scored", r["rows_scored"]), ("set aside", r["rows_rejected"]),
            ("failed packets", r["failed"]), ("context policy", r["context_policy"]),
            ("context measurements, mean", r["context_measurements_mean"]),
            ("NLL per packet, mean (nats)", r["nll_mean"]), ("NLL per packet, median (nats)", r["nll_median"]),
            ("tail_p < 0.01", r["below_0.01"]), ("tail_p < 0.001", r["below_0.001"])]
    for why, n in (r.get("answered_why") or {}).items():
        rows.append(("answered by", f"{n:,} rows: {why}"))
    if r.get("threshold") is not None:
        rows.append((f"flagged (tail_p < {r['threshold']:g})", r["flagged"]))
    if r.get("parts") is not None:
        resumed = f" ({r['parts_resumed']:,} written before, resumed)" if r.get("parts_resumed") else ""
        rows.append(("parts (buckets of probes)", f"{r['parts']:,}{resumed}"))
    return rows + [("device", f"{r['device']} ({r['engine']} engine)"), ("seconds", r["seconds"]),
                   ("rows/s", r["rows_per_s"]), ("scores", r["out"])]


def _top_table(r: dict, threshold: float):
    from pingctl.schema.times import utc_text

    top = r["top"]
    t = grid_table(f"most surprising rows (tail_p < {threshold:g}: {r['flagged']:,} flagged"
                   f"{'' if r['flagged'] <= len(top) else f', first {len(top)}'})",
                   ["time (UTC)", "src", "dst", "RTT ms", "P(fail)", "PIT", "tail_p", "NLL"],
                   left=("src", "dst", "time (UTC)"), whole=("time (UTC)",), listing=True)
    for row in top:
        t.add_row(utc_text(row["time"]), row["src_addr"], row["dst_addr"],
                  "failed" if row["rtt"] < 0 else f"{row['rtt']:,.1f}", f"{row['p_fail']:.2%}",
                  fmt(row["pit"]) if row["pit"] is not None else "-", f"{row['tail_p']:.2g}", f"{row['nll']:.1f}")
    if not top:
        t.add_row("-", "none flagged", "", "", "", "", "", "")
    return t


def register(app) -> None:
    app.command("score")(handle_errors(score))
