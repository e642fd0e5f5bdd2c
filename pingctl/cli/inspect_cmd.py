"""`pingctl inspect`: describe any pingctl artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, JsonOpt, RevisionOpt, SetOpt, console, emit, fmt, grid_table, handle_errors,
                                kv_table, load, model_dir, progress, say)
from pingctl.schema.times import utc_text


def _table_rows(d: dict) -> list[tuple[str, object]]:
    rtt = d.get("rtt_ms", {})
    rows = [
        ("files", d["files"]),
        ("size MB", d["bytes"] / 1e6),
        ("rows", d["rows"]),
        ("invalid rows", d["invalid_rows"]),
        *[(f"  invalid: {k}", v) for k, v in d.get("invalid_by_reason", {}).items()],
        ("start (UTC)", str(d["start"])[:16]),
        ("end (UTC)", str(d["end"])[:16]),
        ("IPv4 rows", d["v4_rows"]),
        ("IPv6 rows", d["v6_rows"]),
        ("probes", d["probes"]),
        ("sources", d["src_addrs"]),
        ("destinations", d["dst_addrs"]),
        ("pairs", d["pairs"]),
        ("measurement ids", d["msm_ids"]),
        ("failure share", f"{(d['failure_share'] or 0):.2%}"),
        ("rows with errors", f"{(d['error_share'] or 0):.2%}"),
    ]
    rows += [(f"RTT {k} ms", rtt.get(k)) for k in ("p5", "p50", "p95", "p99")]
    return rows


def inspect(
    path: Annotated[Path, typer.Argument(
        help="A canonical Parquet file/dir, a `pingctl shard` output dir, probe rows, a `pingctl train` run, a `pingctl export` model (or its Hugging Face Hub repo id, owner/name), "
             "a `pingctl eval` output (its dir or report.json), or a `pingctl sample` output (--pairs "
             "predictions, a pair's RTT distribution).")],
    sample: Annotated[int, typer.Option("--sample", "-n", min=0, max=1_000_000_000,
                                        help="Also show N random rows (or decoded records).")] = 0,
    by: Annotated[str | None, typer.Option(
        "--by", help="Statistics per pair, probe, destination, msm or prefix (the destination's /24 or /48) of a "
                     "table: packets sent and received, loss %, RTT min/mean/max and p5/p50/p95, jitter (IPDV), "
                     "error and duplicate shares, first and last time.")] = None,
    every: Annotated[str | None, typer.Option(
        "--every", help="With --by: one row per group and time bucket of this length (15m, 1h, 1d; UTC, "
                        "counted from 1970-01-01).")] = None,
    limit: Annotated[int, typer.Option(min=0, help="With --by: show the N largest groups (0 = all).")] = 20,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="With --by: write every group to this .csv, .json or .parquet file.")] = None,
    revision: RevisionOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Describe a dataset (rows, time span, families, probes, pairs, RTT percentiles), probe rows, or a run.

    Example: pingctl inspect runs/demo/splits --sample 5

    Per group (pingctl inspect runs/ingest --by pair --limit 10, or -o pairs.csv for all groups;
    --every 1h for one row per hour): packets sent and received, loss %, RTT min/mean/max and
    p5/p50/p95, jitter (mean absolute IPDV), error and duplicate shares, largest groups first.

    A run directory (pingctl inspect runs/demo/train): model, data shaping, steps and tokens,
    losses, checkpoints; read from its files, so it also works on a run still training.
    An eval output (pingctl inspect runs/demo/eval): its table, intervals and verdict again,
    from report.json, without recomputing predictions.
    A sample output (pingctl inspect predictions.parquet): the run it came from, counts (and the
    rows set aside beside it), the spread of P(failure) and median RTT; or a pair's distribution.
    """
    from pingctl.inspect import describe

    cfg = load(config, set_)
    if by is not None or out is not None or every is not None:
        _groups(path, by, limit, out, sample, as_json, every)
        return
    result = describe(model_dir(path, revision), sample, cfg.tokenizer.scheme)
    failed = result["kind"] == "rows" and bool(result["errors"])
    if failed:
        result["exit_code"] = 1  # as ingest's summary: a result to read, and a failure to see
    if as_json:
        emit(result, True)
    else:
        _print_result(result, path)
    if failed:
        raise typer.Exit(1)  # the figures shown are of the readable records only


def _print_result(result: dict, path: Path) -> None:
    printers = {"rows": _print_rows, "run": _print_run, "export": _print_export, "predictions": _print_predictions,
                "distribution": _print_distribution, "calibration": _print_calibration, "eval": _print_eval}
    printer = printers.get(result["kind"])
    if printer is None:
        _print_tables(result, path)
    else:
        printer(result)


def _print_eval(result: dict) -> None:
    from pingctl.cli.eval_cmd import print_report
    from pingctl.errors import PingctlError

    # printed only once whole: a hand-edited report must not leave half a table behind
    try:
        with console.capture() as captured:
            print_report(result, result["path"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise PingctlError(f"{result['path']}: a damaged eval report ({type(e).__name__}: {e}); "
                           "rerun `pingctl eval`") from None
    console.file.write(captured.get())


def _print_tables(result: dict, path: Path) -> None:
    """A table or a `pingctl shard` output: one column per split, their sample rows, and what
    each set aside as invalid."""
    # the title holds the whole path; a column header of it would be cut at 80 columns
    parts = result["splits"] if result["kind"] == "splits" else {Path(path).name or str(path): result}
    tables = _split_tables(parts, f"{result['kind']}: {path}")
    tables += [_sample_table(name, d) for name, d in parts.items() if d.get("sample")]
    emit(result, False, tables)
    for name, d in parts.items():
        if d["invalid_rows"]:
            from pingctl.schema.duck import rejected_lines

            say(f"{name}: {d['invalid_rows']:,} invalid rows, which shard and build-rows set aside:", "yellow")
            for line in rejected_lines(d["rejected"]):
                say(line, "yellow")
    if result.get("missing"):
        console.print(f"[yellow]no Parquet data in {', '.join(s + '/' for s in result['missing'])} "
                      "(an empty split, or one not written)[/]", highlight=False)


def _split_tables(parts: dict[str, dict], title: str) -> list:
    from rich.table import Table

    tables: list = []
    # three splits to a table fit 80 columns (a regimes split has six)
    names = list(parts)
    for k in range(0, len(names), 3):
        chunk = names[k:k + 3]
        t = Table(title=title if k == 0 else None, title_justify="left")
        t.add_column("", style="bold")
        for name in chunk:
            t.add_column(name, justify="right")
        labelled = [_table_rows(parts[name]) for name in chunk]
        for i, (label, _) in enumerate(labelled[0]):
            if label.startswith("  invalid:"):
                continue
            t.add_row(label, *(fmt(rows[i][1]) for rows in labelled))
        tables.append(t)
    return tables


def _sample_table(name: str, d: dict):
    st = grid_table(f"{name}: {len(d['sample'])} sample rows",
                    ["event_time (UTC)", "src_addr", "dst_addr", "rtt", "msm_id", "prb_id", "errors"],
                    left=("event_time (UTC)", "src_addr", "dst_addr"),
                    whole=("event_time (UTC)", "rtt", "msm_id", "prb_id", "errors"), listing=True)
    for r in d["sample"]:
        st.add_row(
            str(r["event_time"])[:19], r["src_addr"], r["dst_addr"], fmt(r["rtt"]),
            str(r["msm_id"]), str(r["prb_id"] if r["prb_id"] is not None else "-"), str(r["packet_error_count"]),
        )
    return st


def _groups(path: Path, by: str | None, limit: int, out: Path | None, sample: int, as_json: bool,
            every: str | None) -> None:
    from pingctl.errors import UsageError
    from pingctl.inspect import describe_groups

    if by is None:
        raise UsageError(f"{'-o' if out is not None else '--every'} goes with --by; add --by pair, probe, "
                         "destination, msm or prefix")
    if sample:
        raise UsageError("--sample shows rows of a table, not groups; drop it or --by")
    with progress(transient=True) as bar:
        bar.add_task(f"statistics by {by}", total=None)
        r = describe_groups(path, by, limit, out, every)
    if as_json:
        emit(r, True)
        return
    keys = {"pair": ["src_addr", "dst_addr", "prb_id", "msm_id"], "probe": ["prb_id"], "destination": ["dst_addr"],
            "msm": ["msm_id"], "prefix": ["dst_prefix"]}[by]
    if by == "probe" and any(g["src_addr"] is not None for g in r["top"]):
        keys.append("src_addr")
    keys += ["bucket_start"] * bool(every)
    heads = {"src_addr": "src", "dst_addr": "dst", "prb_id": "probe", "msm_id": "msm", "dst_prefix": "prefix",
             "bucket_start": "from\n(UTC)"}
    # two-line headers: the figures' width is their values', so the keys keep room at 80 columns
    cols = [heads.get(k, k) for k in keys] + ["sent", "rcvd", "loss", "min\nms", "p50\nms", "mean\nms", "max\nms",
                                             "ipdv\nms"]
    shown = f"the {r['shown']:,} largest of {r['groups']:,}" if r["shown"] < r["groups"] else f"{r['groups']:,}"
    t = grid_table(f"{shown} groups by {by}" + (f", every {every}" if every else ""), cols,
                   left=("src", "dst", "prefix", "from\n(UTC)"), whole=tuple(cols[len(keys) - bool(every):]),
                   listing=True)
    # whole days need no clock time: six characters fewer to fold at 80 columns
    day = bool(every) and r["every_s"] % 86_400 == 0
    for g in r["top"]:
        t.add_row(*(_group_key(k, g[k], day) for k in keys), fmt(g["sent"]), fmt(g["received"]),
                  "-" if g["loss_pct"] is None else f"{g['loss_pct']:.1f}%",
                  # a tenth of a ms on screen (the files keep every digit): 80 columns hold the row
                  *("-" if g[k] is None else f"{g[k]:,.1f}"
                    for k in ("rtt_min_ms", "rtt_p50_ms", "rtt_mean_ms", "rtt_max_ms", "ipdv_ms")))
    summary = [("table", str(path)), ("rows", r["rows"]), ("invalid rows (left out)", r["invalid_rows"]),
               ("groups", r["groups"])]
    if every:
        summary.append((f"rows of {every}", r["group_rows"]))
    if r["out"]:
        summary.append(("all groups written to", r["out"]))
    emit(r, False, [t, kv_table(f"inspect --by {by}", summary)])


def _group_key(name: str, value, day: bool = False) -> str:
    if name == "bucket_start":
        return str(value)[:10 if day else 16]
    if name in ("prb_id", "msm_id"):
        return "-" if value is None else str(value)  # ids, not quantities: no thousands separator
    return fmt(value)


def _print_run(r: dict) -> None:
    from pingctl.artifacts.run import stop_message

    def at(loss, step) -> str:
        return "-" if loss is None else f"{loss:.3f} (step {step})"

    stop = r["stopped_early"]
    state = "complete" if r["complete"] else f"--max-minutes: {stop_message(stop)}" if stop else "incomplete"
    ckpts = ", ".join(map(str, r["checkpoints"])) or "-"
    if r["uncommitted_checkpoints"]:
        ckpts += f"  (uncommitted, ignored: {', '.join(map(str, r['uncommitted_checkpoints']))})"
    rows = [
        ("preset / parameters", f"{r['preset']} / {r['parameters']:,}"),
        ("overrides", ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "-"),
        ("scheme / seq_len x batch", f"{r['scheme']} / {r['seq_len']} x {r['batch_size']}"),
        ("timestamps / result_last / max_per_pair", f"{fmt(r['timestamps'])} / {r['result_last']:g} / {r['max_per_pair']}"),
        ("train rows", r["train_rows"]),
        ("eval rows", r["eval_rows"]),
        ("triangulation share / hints", f"{r['triangulation_share']:g} / " + (
            f"{r['hint_share']:g} of the contexts, kept as {r['hints_kept'] or '- (missing: answers fail)'}"
            if r["hints_file"] else "-")),
        ("steps done / configured", f"{fmt(None if r['last_step'] is None else r['last_step'] + 1)} / {r['steps_configured']:,}"),
        ("state", state),
        ("tokens seen (packed)", r["tokens_seen"]),
        (f"train loss, last {r['train_loss_window']} steps", r["train_loss_last"]),
        ("eval loss, last", at(r["eval_loss_last"], r["eval_step_last"])),
        ("eval loss, best", at(r["eval_loss_best"], r["eval_step_best"])),
        ("eval - train loss (last eval)", r["generalization_gap"]),
        ("step time s", r["step_seconds"]),
        ("waiting for batches, ms a step", None if r["input_wait_s"] is None else 1e3 * r["input_wait_s"]),
        ("checkpoints", ckpts),
        ("temp checkpoint dirs", ", ".join(f"{t['name']} ({t['bytes'] / 1e6:,.1f} MB, a save in progress or cut short)" for t in r["temp_checkpoint_dirs"]) or "-"),
        ("loss curve", r["loss_png"]),
        ("TensorBoard", r["tensorboard"]),
    ]
    emit(r, False, kv_table(f"run: {r['path']}", rows))


def _print_export(r: dict) -> None:
    steps = r["steps"]
    rows = [
        ("from run", r["source_run"]),
        ("step", f"mean of steps {', '.join(map(str, steps))}" if len(steps) > 1 else steps[0]),
        ("preset / parameters", f"{r['preset']} / {r['parameters']:,}"),
        ("overrides", ", ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "-"),
        ("scheme / vocabulary / seq_len", f"{r['scheme']} / {r['vocab_size']:,} / {r['seq_len']}"),
        ("timestamps / result_last / max_per_pair", f"{fmt(r['timestamps'])} / {r['result_last']:g} / {r['max_per_pair']}"),
        ("tensors / elements", f"{r['tensors']:,} / {r['elements']:,}"),
        ("tensor dtypes", ", ".join(f"{k} x {v}" for k, v in r["tensor_dtypes"].items())),
        ("calibration", r["calibration"]),
        ("eval report in the card", r["eval_report"]),
        ("size MB", r["bytes"] / 1e6),
        ("exported by", f"pingctl {r['pingctl_version']} (format {r['format_version']}), {r['created']}"),
    ]
    emit(r, False, kv_table(f"export: {r['path']}", rows))


def _spread_text(d: dict, pct: bool = False) -> str:
    f = (lambda v: f"{v:.2%}") if pct else fmt
    return " / ".join(f(d[k]) for k in ("min", "p5", "p50", "p95", "max")) if d else "-"


def _ceiling() -> str:
    """The mean's ceiling as the tables name it (`queries.MEAN_CEILING_MS`)."""
    from pingctl.infer.queries import MEAN_CEILING_MS

    return f"{MEAN_CEILING_MS / 1000:g} s"


def _print_predictions(r: dict) -> None:
    answered = r["rows"]
    rows = [
        ("run / step", f"{r['run'] or '-'} / {fmt(r['step'])}" + (f" (mean of {r['steps']})"
                                                                 if r["steps"] and len(r["steps"]) > 1 else "")),
        ("distribution", "-" if r["exact"] is None else "exact, every code" if r["exact"] else "exact at the quantiles"),
        ("pairs file", r["pairs"] or "-"),
        ("rows (answered)", answered),
        ("rows set aside", "-" if r["rows_set_aside"] is None else
         f"{r['rows_set_aside']:,} (read {answered + r['rows_set_aside']:,}; {r['rejects_file']})"),
        ("distinct pairs", r["distinct_pairs"]),
        ("sources / destinations", f"{r['sources']:,} / {r['destinations']:,}"),
        ("IPv4 / IPv6 rows", f"{r['v4_rows']:,} / {r['v6_rows']:,}"),
        ("rows with a time", r["rows_with_time"]),
        ("P(failure) min/p5/p50/p95/max", _spread_text(r["p_fail"], pct=True)),
        ("median RTT ms min/p5/p50/p95/max", _spread_text(r["p50_ms"])),
        (f"P(RTT > {_ceiling()}) min/p5/p50/p95/max", _spread_text(r.get("p_over_ceiling"), pct=True)),
        ("context measurements, mean", r["context_measurements_mean"]),
    ]
    tables = [kv_table(f"predictions: {r['path']}", rows)]
    if r.get("sample"):
        cols = list(r["sample"][0])
        t = grid_table(f"{len(r['sample'])} sample rows", cols, left=("src", "dst", "time"), whole=("time",),
                       listing=True)
        for row in r["sample"]:
            t.add_row(*(utc_text(row[c]) if c == "time" else f"{row[c]:.2%}" if c == "p_fail" else fmt(row[c])
                        for c in cols))
        tables.append(t)
    emit(r, False, tables)


def _print_calibration(r: dict) -> None:
    cov = r["raw_coverage"]
    rows = [("run", r.get("run")), ("step(s)", r.get("steps")), ("fitted on", r.get("fitted_on_text")),
            ("successful packets", r.get("packets")), ("context policy", r.get("context_policy")),
            ("context measurements", r.get("context_measurements")), ("per pair", r.get("context_per_pair")),
            ("raw model: central 50% covered", f"{cov['cov50']:.1%}"),
            ("raw model: central 90% covered", f"{cov['cov90']:.1%}"),
            ("raw model: actual below its median", f"{cov['below_median']:.1%}")]
    rows += [(f"calibrated {k} = the model's quantile at", f"{v:.3f}") for k, v in r["read_at"].items()]
    emit(r, False, kv_table(f"calibration: {r['path']}", rows))


def _print_distribution(r: dict) -> None:
    rows = [("pair", f"{r['src'] or '?'} -> {r['dst'] or '?'}"),
            ("P(failure)", "-" if r["p_fail"] is None else f"{r['p_fail']:.2%}"),
            ("codes / probability sum", f"{r['codes']:,} / {r['probability_sum']:.6f}"),
            (f"mean ms, RTT <= {_ceiling()}", r["mean_ms"]),
            (f"P(RTT > {_ceiling()})", "-" if r.get("p_over_ceiling") is None else f"{r['p_over_ceiling']:.2%}"),
            ("mean ms, central 90%", r["trimmed_mean_ms"]),
            *[(f"{k.removesuffix('_ms')} ms", r[k]) for k in ("p5_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms")]]
    emit(r, False, kv_table(f"RTT distribution: {r['path']}", rows))


def _print_rows(r: dict) -> None:
    def dist(d: dict) -> str:
        # counts are whole numbers: show them without fmt's three float decimals
        return " / ".join(fmt(int(v)) if float(v).is_integer() else fmt(v)
                          for v in (d.get(k) for k in ("min", "p50", "mean", "max"))) if d else "-"

    rows = [
        ("files", r["files"]),
        ("records (readable)", r["records"]),
        ("probes", r["probes"]),
        ("measurements", r["measurements"]),
        ("layout version", r["layout_version"]),
        ("meas/record min/p50/mean/max", dist(r["measurements_per_record"])),
        ("bytes/record min/p50/mean/max", dist(r["record_bytes"])),
        ("span h min/p50/mean/max", dist(r["span_hours"])),
        ("IPv4 / IPv6 measurements", f"{r['v4_measurements']:,} / {r['v6_measurements']:,}"),
        ("failure share", f"{r['failure_share']:.2%}"),
        *[(f"RTT {k} ms", v) for k, v in r["rtt_ms"].items()],
    ]
    if r.get("tokens_per_record"):
        rows.append(("est. tokens/record min/p50/mean/max", dist(r["tokens_per_record"])))
    tables = [kv_table(f"rows: {r['path']}", rows)]
    from rich.table import Table

    h = Table(title="measurements per record", title_justify="left", box=None)
    h.add_column("measurements", justify="right")
    h.add_column("records", justify="right")
    h.add_column("")
    peak = max(r["measurements_per_record_hist"].values() or [1]) or 1
    for bucket, count in r["measurements_per_record_hist"].items():
        if count:
            h.add_row(bucket, fmt(count), "█" * max(1, round(30 * count / peak)))
    tables.append(h)
    for s in r["sample"]:
        t = grid_table(f"{s['file']} record {s['record']}: {s['probe']} part {s['part']}, {s['n']:,} measurements",
                       ["time (UTC)", "src", "dst", "rtt_ms", "msm_id"], left=("time (UTC)", "src", "dst"),
                       whole=("time (UTC)", "rtt_ms", "msm_id"), listing=True)
        for m in s["first"]:
            t.add_row(utc_text(m["time"]), m["src"], m["dst"], fmt(m["rtt_ms"]), str(m["msm_id"]))
        tables.append(t)
    emit(r, False, tables)
    for e in r["errors"]:
        say(f"{e['file']} record {e['record']}: {e['error']}", "red")
    if r["errors"]:
        console.print(f"[yellow]{r['records']:,} records readable; {len(r['errors'])} error(s)[/]")


def register(app) -> None:
    app.command("inspect")(handle_errors(inspect))
