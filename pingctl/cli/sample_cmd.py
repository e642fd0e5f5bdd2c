"""`pingctl sample`: ask a trained model (RTT distribution, partial IPs, inverse search, streams)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (AnswerOpt, CombinationOpt, ConfigOpt, EngineOpt, HardwareOpt, JsonOpt, RevisionOpt, SetOpt, StepOpt, console, emit, err_console, fmt, grid_table,
                                handle_errors, kv_table, load, model_dir, read_valid_rows, say)
from pingctl.errors import PingctlError
from pingctl.schema.times import utc_text


# the defaults of -k and --measurements, for the help text (pingctl.infer.questions.K and
# MEASUREMENTS apply them, and bound every size; the CLI imports nothing heavy at start-up)
_K, _MEASUREMENTS = 10, 8

_PolicyOpt = Annotated[str | None, typer.Option(
    help="probe: the --context rows of --src's probe (as plain training contexts); both: a triangulation "
         "context from --context, the probe's measurements to other destinations and --dst's from other "
         "sources (--context-k a side; an RTT distribution only). \\[default: probe]")]


def sample(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory, or a `pingctl export` model, or its Hugging Face Hub repo id (owner/name).")],
    src: Annotated[str | None, typer.Option(help="Source IP, or a pattern (8.8.*.* / CIDR).")] = None,
    dst: Annotated[str | None, typer.Option(help="Destination IP, or a pattern (8.8.*.* / CIDR).")] = None,
    rtt: Annotated[str | None, typer.Option(help="RTT in ms (20) or range (10-30): completion / inverse search.")] = None,
    time: Annotated[str | None, typer.Option(help="UTC time of the query (ISO 8601 or Unix seconds).")] = None,
    context: Annotated[Path | None, typer.Option(
        help="Parquet of the probe's preceding measurements (rows build-rows would reject are skipped, named).")] = None,
    context_per_pair: Annotated[int | None, typer.Option(
        help="At most this many measurements of one (src, dst) pair from --context, the most recent "
             "(default: as the run was trained, its loader.max_per_pair; 0 = no cap).")] = None,
    context_policy: _PolicyOpt = None,
    context_k: Annotated[int | None, typer.Option(
        min=1, help="--context-policy both: measurements of each side \\[default: 16].")] = None,
    n: Annotated[int | None, typer.Option(
        "--n", min=1, help="Inverse search: samples; otherwise streams to generate (with --src: of that probe).")] = None,
    measurements: Annotated[int | None, typer.Option(
        min=1, help=f"Generation: measurements per stream \\[default: {_MEASUREMENTS}].")] = None,
    timestamps: Annotated[bool | None, typer.Option(
        "--timestamps/--no-timestamps",
        help="Generation: every measurement opens with its timestamp, so each generated row has an event_time "
             "(default for a run trained with timestamps); --no-timestamps lets the model choose, as in its "
             "partial and none training modes.")] = None,
    since: Annotated[str | None, typer.Option(
        help="Generation: the earliest time a generated measurement may have (ISO 8601 or Unix seconds; "
             "default 2000-01-01).")] = None,
    until: Annotated[str | None, typer.Option(
        help="Generation: the latest time a generated measurement may have (default: now).")] = None,
    k: Annotated[int | None, typer.Option(
        "-k", min=1, help=f"Completions / inverse-search destinations to show \\[default: {_K}].")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Generated streams, or a pair's exact RTT distribution (.parquet, .csv or .json), or the "
             "--pairs predictions (.parquet, .csv or .json).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Save the RTT distribution as a PNG (needs the \\[plot] extra: matplotlib).")] = None,
    pairs: Annotated[Path | None, typer.Option(
        help="CSV (with a header) or Parquet of pairs, columns src, dst [, time]: the RTT distribution of "
             "every row, one model load; rows that fail the --src/--dst/--time checks are set aside "
             "(-o P.parquet|.csv|.json writes the predictions and P.rejects.jsonl).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="RTT distributions (a pair, --pairs): recalibrate with the calibration.json that `pingctl eval` "
             "of this run and step wrote on val packets, so the quantiles cover as they did there.")] = None,
    answer: AnswerOpt = None,
    combination: CombinationOpt = None,
    exact: Annotated[bool, typer.Option(
        "--exact", help="--pairs: compute all 65,536 codes per pair, as a single query does (the means "
                        "exact too; ~5x slower without context). Default: exact at the printed quantiles.")] = False,
    step: StepOpt = None,
    revision: RevisionOpt = None,
    hardware: HardwareOpt = None,
    engine: EngineOpt = None,
    seed: Annotated[int | None, typer.Option(min=0, help="Sampling seed (inverse search, generation).")] = None,
    temperature: Annotated[float | None, typer.Option(
        help="Sampling temperature (inverse search, generation).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass (generation).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the model: RTT distribution for a pair, partial-IP completion, inverse search, streams.

    Example: pingctl sample runs/demo/train --src 78.143.22.26 --dst 194.255.199.229 --plot rtt.png

    Many pairs at once: pingctl sample runs/demo/train --pairs pairs.csv -o predictions.parquet

    Streams of one day: pingctl sample runs/demo/train --n 4 --since 2021-06-01 --until 2021-06-02 -o streams.parquet

    Calibrated quantiles: pingctl sample runs/demo/train --src A --dst B --calibration runs/demo/eval-val/calibration.json

    Both ends in the prompt: pingctl sample RUN --src A --dst B --context runs/demo/splits/train --context-policy both
    """
    from pingctl.api import checks as QS
    from pingctl.artifacts.run import parse_steps
    from pingctl.cli.sample_options import question_from_options

    QS.check_hardware(hardware)
    QS.check_engine(engine)
    cfg = load(config, set_, **{"sample.seed": seed, "sample.temperature": temperature, "sample.top_p": top_p})
    # every option is checked, and every size bounded, before a file is read or the model loads
    q = question_from_options(
        src=src, dst=dst, rtt=rtt, time=time, context=context, context_per_pair=context_per_pair,
        context_policy=context_policy, context_k=context_k, n=n,
        measurements=measurements, timestamps=timestamps, since=since, until=until, k=k, out=out, plot=plot,
        pairs=pairs, calibration=calibration, exact=exact, seed=seed, temperature=temperature, top_p=top_p,
        sampling=cfg.sample, answer=answer, combination=combination)
    run = model_dir(run, revision)  # a Hub repo id: its snapshot, downloaded once the options are checked
    QS.check_combination(run, answer, combination)
    cal = _calibration(q, run) if calibration is not None else None
    steps = parse_steps(step)
    ctx, ctx_read, ctx_prb = _read_context(context) if context is not None else (None, None, None)
    if isinstance(q, QS.PairsQuestion):
        from pingctl.cli import sample_pairs

        sample_pairs.answer_pairs(run, q.pairs, ctx, ctx_read, q.context_per_pair, q.out, q.exact, steps, as_json,
                                  ctx_prb, hardware, cal, q.context_policy, q.context_k, engine,
                                  answering=(answer, combination))
        return
    _answer_one(q, run, (ctx, ctx_read, ctx_prb, context), cal, as_json, rtt,
                {"steps": steps, "hardware": hardware, "engine": engine, "answer": answer, "combination": combination})


def _answer_one(q, run: Path, ctx_read_prb_path: tuple, cal, as_json: bool, rtt: str | None, loading: dict) -> None:
    """A single question (not --pairs): its context picked from the --context file, the model
    loaded (`loading`: Model.load's options) and asked, the answer printed."""
    from pingctl.api import Model
    from pingctl.api import checks as QS

    ctx, ctx_read, ctx_prb, path = ctx_read_prb_path
    if ctx is not None:
        ctx = _probe_context(q, ctx, ctx_read, path, ctx_prb, run)
    QS.check_run(q, run)
    with err_console.status(f"loading {run} ..."):
        # the --calibration map was read and checked against the run; the model checks its step(s)
        model = Model.load(run, loading["steps"], loading["hardware"], calibration=cal if cal is not None else False,
                           engine=loading["engine"], answer=loading["answer"], combination=loading["combination"])
    a = model.answer(q, ctx, ctx_read, run)
    result = a.result
    if isinstance(q, QS.RttQuestion):
        _print_distribution(a, model.loaded.label, cal, as_json)
    elif isinstance(q, QS.CompleteQuestion):
        _table(result, as_json, f"completions of {q.src} -> {q.dst}", a.rows, ("src", "dst", "probability"))
    elif isinstance(q, QS.InverseQuestion):
        _table(result, as_json, f"destinations {q.src} reaches in {rtt} ms", a.rows, ("dst", "probability", "samples"))
    else:
        _table(result, as_json, f"{len(a.streams)} generated streams", a.rows[:40],
               ("stream", "time", "src", "dst", "rtt_ms"))
        if result["times_out_of_range"] and not as_json:
            err_console.print(f"[yellow]{result['times_out_of_range']} generated time(s) lie beyond a timestamp's "
                              f"+-292,000 years{'; their event_time is null in ' + str(q.out) if q.out else ''}[/]")


def _calibration(q, run: Path):
    """The --calibration map, checked against the run now (its checkpoint once loaded); a
    prompt shape other than the one it was fitted on is said, not refused."""
    from pingctl.api import checks as C

    cal = C.load_calibration(q.calibration)
    C.check_fits(cal, run, cal.meta.get("steps") or [])
    if why := C.prompt_mismatch(cal, q.context is not None):
        say(why, err=True, label="note: ")
    return cal


def _print_distribution(a, label: str, cal, as_json: bool) -> None:
    from pingctl.api import checks as Q

    q, d, result = a.question, a.distribution, a.result
    if as_json:
        emit(result, True)
        return
    ceiling = f"{Q.MEAN_CEILING_MS / 1000:g} s"
    # the mean is over RTT <= the ceiling; the mass above it, beside it, says what it leaves out
    rows = [("P(failure)", f"{d.p_fail:.2%}"), (f"mean ms, RTT <= {ceiling}", result["mean_ms"]),
            (f"P(RTT > {ceiling})", _share(result["p_over_ceiling"])),
            (f"mean ms, central {1 - 2 * Q.TRIM:.0%}", result["trimmed_mean_ms"])]
    rows += [(f"p{round(p * 100)} ms", result[f"p{round(p * 100)}_ms"]) for p in Q.QUANTILES]
    if cal is not None:
        from pingctl.cli.sample_pairs import calibration_label

        rows.append(("calibration", calibration_label(cal)))
    if by := result.get("answered_by"):
        from pingctl.cli.sample_pairs import answered_by_label

        rows.append(("answered by", answered_by_label(by)))
    emit(result, False, kv_table(f"RTT {q.src} -> {q.dst} ({label})", rows))
    if q.two_sided:
        _print_triangulation(result)
    _histogram(d)
    for what, path in (("plot", q.plot), ("distribution", q.out)):
        if path:
            console.print(f"{what}: {path}")


def _print_triangulation(result: dict) -> None:
    """What a `both` prompt holds: its measurements, oldest first, marked by side, and the hint
    just before the query where the run was trained with them (`hint_ms`)."""
    dst = result["dst"]
    rows = result["context"]
    hinted = result.get("hint_ms") is not None  # the prompt's last measurement is the hint
    sides = rows[:-1] if hinted else rows
    n_src = sum(r["dst"] != dst for r in sides)
    console.print(f"prompt context (both, --context-k {result['context_k']}): {n_src} measurement(s) of the probe to "
                  f"other destinations, {len(sides) - n_src} of {dst} from other sources"
                  + (f", then the embedding's estimate for the pair, {result['hint_ms']:.1f} ms:" if hinted else ":"),
                  highlight=False)
    t = grid_table("", ["side", "time", "src", "dst", "rtt_ms"], left=("side", "src", "dst", "time"),
                   whole=("time", "rtt_ms"), listing=True)
    for i, r in enumerate(rows):
        side = "hint" if hinted and i == len(rows) - 1 else "destination" if r["dst"] == dst else "source"
        t.add_row(side, *(_cell(c, r.get(c)) for c in ("time", "src", "dst", "rtt_ms")))
    console.print(t)


def _share(p: float) -> str:
    """A probability as a percentage that never reads 0.00% for a small but real mass."""
    return f"{p:.2%}" if p == 0 or p >= 1e-4 else f"{p:.1e}"


def _read_context(path: Path):
    """The context's measurements, checked as build-rows checks rows (a row it would reject is
    skipped with a warning), what became of the rest (for --json), and each row's prb_id (-1
    where null: the probe a question's source address belongs to)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pingctl.tokenizer import Measurements

    try:
        table, read = read_valid_rows([path], None, "--context")
        prb = (pc.fill_null(table.column("prb_id").cast(pa.int64()), -1).to_numpy(zero_copy_only=False)
               if "prb_id" in table.column_names else None)
        return Measurements.from_arrow(table), read, prb
    except PingctlError as e:
        raise PingctlError(e if str(e).startswith("--context") else f"--context {path}: {e}") from None


def _probe_context(q, ctx, read: dict, path: Path, prb, run: Path):
    """The file's measurements of the question's source's probe (before --time), named when
    that leaves rows out."""
    from pingctl.api.checks import probe_context

    picked = probe_context(q, ctx, read, prb, run)
    if q.two_sided:
        return picked
    if "rows_used" in read and read["rows_used"] < len(ctx):
        t_query = getattr(q, "time", None)
        before = f" before --time {utc_text(t_query)}" if t_query is not None else ""
        # say(): a path is printed as given, never read as Rich markup
        say(f"--context {path}: {read['rows_used']:,} of its {len(ctx):,} valid rows are measurements of the "
            f"probe with source {q.src}{before}; the prompt holds only those (a probe's own past, as in training)",
            "yellow", err=True)
    return picked


def _table(result: dict, as_json: bool, title: str, rows: list[dict], cols: tuple[str, ...]) -> None:
    t = grid_table(title, list(cols), left=("src", "dst", "time"),
                   whole=("stream", "time", "rtt_ms", "probability", "samples"), listing="time" in cols)
    for r in rows:
        t.add_row(*(_cell(c, r.get(c)) for c in cols))
    emit(result, as_json, t)


def _cell(column: str, v) -> str:
    """Table text only; --json keeps Unix seconds and the canonical -1 for a failed packet."""
    if column == "probability":
        # IPv6 completions are often far below 1e-4; fixed 4 decimals would print them all as 0.0000
        return f"{v:.4f}" if v >= 1e-4 else f"{v:.3e}"
    if column == "time":
        return utc_text(v)
    if column == "rtt_ms" and v is not None and v < 0:
        return "failed"
    return fmt(v)


def _histogram(d) -> None:
    import numpy as np

    edges = np.array([0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, np.inf])
    mass = np.array([d.probs[(d.values_ms >= a) & (d.values_ms < b)].sum() for a, b in zip(edges[:-1], edges[1:])])
    peak = mass.max() or 1
    console.print("RTT distribution (given success):")
    for a, b, p in zip(edges[:-1], edges[1:], mass):
        if p >= 0.001:
            label = f"{a:g}-{b:g} ms" if np.isfinite(b) else f">= {a:g} ms"
            console.print(f"  {label:>14} {'█' * max(1, round(40 * p / peak)):<40} {p:6.1%}", highlight=False)


def register(app) -> None:
    app.command("sample")(handle_errors(sample))
