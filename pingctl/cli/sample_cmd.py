"""`pingctl sample`: ask a trained model (RTT distribution, partial IPs, inverse search, streams)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, HardwareOpt, JsonOpt, SetOpt, StepOpt, console, emit, err_console, fmt, grid_table,
                                handle_errors, json_default, kv_table, load, option_time, read_valid_rows, say)
from pingctl.errors import PingctlError, UsageError
from pingctl.schema import utc_text


_K, _MEASUREMENTS = 10, 8  # defaults of -k and --measurements, applied once the mode is known
_MODE_NAMES = {"distribution": "an RTT distribution (--src IP --dst IP)", "complete": "a completion",
               "inverse": "inverse search", "generate": "generation"}


def _is_pattern(text: str | None) -> bool:
    return bool(text) and ("*" in text or "/" in text)


def _rtt_range(text: str) -> tuple[float, float]:
    import math

    from pingctl.tokenizer.rtt_codec import MAX_MS

    # the range's '-' is neither a leading sign nor an exponent's sign (1e-3 is one number)
    cut = next((i for i in range(1, len(text)) if text[i] == "-" and text[i - 1] not in "eE"), None)
    lo, hi = (text, text) if cut is None else (text[:cut], text[cut + 1 :])
    if cut is not None and not hi.strip():
        raise UsageError(f"--rtt {text!r}: a range needs both ends, like 10-30")
    try:
        lo_f, hi_f = float(lo), float(hi)
    except ValueError:
        raise UsageError(f"--rtt {text!r}: give milliseconds like 20 or a range like 10-30") from None
    # NaN compares false with everything, so it must be excluded explicitly
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)) or lo_f < 0 or hi_f < lo_f:
        raise UsageError(f"--rtt {text!r}: need finite 0 <= low <= high")
    if hi_f > MAX_MS:
        raise UsageError(f"--rtt {text!r}: the RTT code ends at {MAX_MS:,.0f} ms")
    return lo_f, hi_f


def sample(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory.")],
    src: Annotated[str | None, typer.Option(help="Source IP, or a pattern (8.8.*.* / CIDR).")] = None,
    dst: Annotated[str | None, typer.Option(help="Destination IP, or a pattern (8.8.*.* / CIDR).")] = None,
    rtt: Annotated[str | None, typer.Option(help="RTT in ms (20) or range (10-30): completion / inverse search.")] = None,
    time: Annotated[str | None, typer.Option(help="UTC time of the query (ISO 8601 or Unix seconds).")] = None,
    context: Annotated[Path | None, typer.Option(
        help="Parquet of the probe's preceding measurements (rows build-rows would reject are skipped, named).")] = None,
    context_per_pair: Annotated[int | None, typer.Option(
        help="At most this many measurements of one (src, dst) pair from --context, the most recent "
             "(default: as the run was trained, its loader.max_per_pair; 0 = no cap).")] = None,
    n: Annotated[int | None, typer.Option(
        "--n", min=1, help="Inverse search: samples; otherwise streams to generate (with --src: of that probe).")] = None,
    measurements: Annotated[int | None, typer.Option(
        min=1, help=f"Generation: measurements per stream [default: {_MEASUREMENTS}].")] = None,
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
        "-k", min=1, help=f"Completions / inverse-search destinations to show [default: {_K}].")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Generated streams, or a pair's exact RTT distribution (.parquet or .json), or the "
             "--pairs predictions (.parquet, .csv or .json).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Save the RTT distribution as a PNG.")] = None,
    pairs: Annotated[Path | None, typer.Option(
        help="CSV (with a header) or Parquet of pairs, columns src, dst [, time]: the RTT distribution of "
             "every row, one model load; rows that fail the --src/--dst/--time checks are set aside "
             "(-o P.parquet|.csv|.json writes the predictions and P.rejects.jsonl).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="RTT distributions (a pair, --pairs): recalibrate with the calibration.json that `pingctl eval` "
             "of this run and step wrote on val packets, so the quantiles cover as they did there.")] = None,
    exact: Annotated[bool, typer.Option(
        "--exact", help="--pairs: compute all 65,536 codes per pair, as a single query does (the means "
                        "exact too; ~5x slower without context). Default: exact at the printed quantiles.")] = False,
    step: StepOpt = None,
    hardware: HardwareOpt = None,
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
    """
    import numpy as np

    from pingctl.atomic import unwritable_reason
    from pingctl.infer import queries as Q
    from pingctl.infer.model import (LoadedModel, check_hardware, parse_steps, run_config, trained_with_timestamps,
                                     untimed_run)

    check_hardware(hardware)
    cfg = load(config, set_, **{"sample.seed": seed, "sample.temperature": temperature, "sample.top_p": top_p})
    rng = np.random.default_rng(cfg.sample.seed)
    # the prompt builder takes the bare address: strip here, and pass the stripped text on
    src, dst = (_address_option(v, name) for v, name in ((src, "--src"), (dst, "--dst")))
    if exact and pairs is None:
        raise UsageError("--exact is for --pairs; a single --src/--dst distribution is always computed for every code")
    cal = None
    if calibration is not None:
        from pingctl.infer import calibration as CAL

        cal = CAL.load(calibration)
        CAL.check_fits(cal, run, cal.meta.get("steps") or [])  # the run now; the checkpoint once it is loaded
        if why := CAL.prompt_mismatch(cal, context is not None):
            say(why, err=True, label="note: ")
    if pairs is not None:
        from pingctl.cli import sample_pairs

        given = [name for v, name in ((src, "--src"), (dst, "--dst"), (rtt, "--rtt"), (time, "--time"), (n, "--n"),
                                      (plot, "--plot"), (timestamps, "--timestamps/--no-timestamps"),
                                      (since, "--since"), (until, "--until"))
                 if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: --pairs answers the pairs (and times) of its file; "
                             "give either --pairs or a single query")
        # the distributions are computed, not sampled or ranked: these would change nothing
        unused = [name for v, name in ((k, "-k"), (measurements, "--measurements"), (seed, "--seed"),
                                       (temperature, "--temperature"), (top_p, "--top-p")) if v is not None]
        if unused:
            raise UsageError(f"{', '.join(unused)}: --pairs computes each pair's RTT distribution exactly "
                             "(no sampling, no ranking), so this would change nothing; drop it")
        _check_context_options(context, context_per_pair)
        sample_pairs.check_options(out)
        ctx, ctx_read, ctx_prb = _read_context(context) if context is not None else (None, None, None)
        sample_pairs.answer_pairs(run, pairs, ctx, ctx_read, context_per_pair, out, exact, parse_steps(step), as_json,
                                  ctx_prb, hardware, cal)
        return
    if src and dst and not _is_pattern(src) and not _is_pattern(dst) and rtt is None:
        mode = "distribution"
    elif _is_pattern(src) or _is_pattern(dst):
        mode = "complete"
    elif src and rtt and not dst:
        mode = "inverse"
    elif not dst and not rtt:
        mode = "generate"
    else:
        raise UsageError(
            "say what to ask: --src IP --dst IP (RTT distribution), a pattern in --src/--dst "
            "(completion), --src IP --rtt MS (inverse search) or --n N [--src IP] (generation)"
        )
    # everything the user typed is validated before the (slow) model load
    # (a completion, inverse search and generation build their prompts without a timestamp)
    for given, name, modes in ((n, "--n", ("inverse", "generate")), (out, "--out", ("generate", "distribution")),
                               (plot, "--plot", ("distribution",)), (time, "--time", ("distribution",)),
                               (timestamps, "--timestamps/--no-timestamps", ("generate",)),
                               (k, "-k", ("complete", "inverse")), (measurements, "--measurements", ("generate",)),
                               # a distribution and a completion are computed exactly; only these two sample
                               (seed, "--seed", ("inverse", "generate")),
                               (temperature, "--temperature", ("inverse", "generate")),
                               (top_p, "--top-p", ("generate",)),
                               (since, "--since", ("generate",)), (until, "--until", ("generate",)),
                               (calibration, "--calibration", ("distribution",))):
        if given is not None and mode not in modes:
            raise UsageError(f"{name} does not apply to {_MODE_NAMES[mode]}; it is for "
                               + " and ".join(_MODE_NAMES[m] for m in modes))
    fam_src, fam_dst = (p[0] if p else None for p in Q.parse_pair(src, dst))
    if mode == "complete":
        # the side not given is any address of the other side's family
        src = src or Q.any_address(fam_dst)
        dst = dst or Q.any_address(fam_src)
    t_query = option_time(time)
    period = _generation_period(since, until) if since is not None or until is not None else None
    _check_context_options(context, context_per_pair)
    k, measurements = k or _K, measurements or _MEASUREMENTS
    rtt_lo, rtt_hi = _rtt_range(rtt) if rtt is not None else (None, None)
    if mode == "complete" and rtt is not None and rtt_hi > rtt_lo:
        raise UsageError(f"--rtt {rtt}: a completion conditions on one RTT (e.g. --rtt 20); "
                           "ranges are for inverse search (--src IP --rtt 10-30)")
    if out is not None and out.suffix not in (".parquet", ".json"):
        raise UsageError(f"--out {out}: written as .parquet or .json")
    for name, path in (("--out", out), ("--plot", plot)):
        if path is not None and (reason := unwritable_reason(path)):
            raise PingctlError(f"{name} {path}: cannot be written ({reason})")
    steps = parse_steps(step)
    ctx, ctx_read, ctx_prb = _read_context(context) if context is not None else (None, None, None)
    if ctx is not None and src and not _is_pattern(src):
        ctx = _probe_context(ctx, ctx_read, context, src, t_query, ctx_prb)
    # the run's config.yaml (cheap, no JAX) says which questions it was trained to answer
    trained = (run_config(run).loader if t_query is not None or rtt is not None or timestamps or period
               else None)
    if t_query is not None and not trained_with_timestamps(trained.mode_weights):
        raise untimed_run("--time", run, "so it cannot condition on a time; ask without --time")
    if timestamps and not trained_with_timestamps(trained.mode_weights):
        raise untimed_run("--timestamps", run, "so it cannot generate them")
    if period and not trained_with_timestamps(trained.mode_weights):
        raise untimed_run("--since/--until", run, "so its streams have no times to bound")
    if rtt is not None and mode in ("complete", "inverse") and trained.result_last >= 1.0:
        # these prompts put the RTT before the addresses, an order such a run never saw
        raise UsageError(f"--rtt: {run} was trained with loader.result_last=1 (the RTT always after both "
                           "addresses), so it cannot answer from an RTT to addresses; ask a run trained with "
                           "result_last < 1, or ask this one for the RTT distribution of candidate pairs")
    with err_console.status(f"loading {run} ..."):
        model = LoadedModel.load(run, steps, hardware)
    if cal is not None:
        CAL.check_fits(cal, run, model.steps)
    result: dict = {"mode": mode, "run": str(run), "step": model.step, "steps": list(model.steps),
                    "timestamps": model.timestamps, "device": model.device}
    ctx_tokens, last_t = np.zeros(0, np.int32), None
    if ctx is not None:
        per_pair = model.max_per_pair if context_per_pair is None else context_per_pair
        ctx_tokens, last_t = Q.context_tokens(model, ctx, model.seq_len - 64, per_pair, timed=model.timestamps)
        result["context_per_pair"] = per_pair
        result["context_rows"] = ctx_read
    result["context_tokens"] = int(len(ctx_tokens))
    if mode == "distribution":
        d = Q.rtt_distribution(model, Q.query_prefix(src, dst, t_query, ctx_tokens, last_t))
        if cal is not None:
            d = cal.apply(d)
            result["calibration"] = {"path": cal.path, **{k: cal.meta.get(k) for k in ("fitted_on", "packets")}}
        result.update({"src": src, "dst": dst, "time": t_query, **d.summary()})
        if plot:
            _plot(d, plot, f"{src} -> {dst}")
            result["plot"] = str(plot)
        if out:
            _write_distribution(d, out, src, dst)
            result["out"] = str(out)
        if as_json:
            emit(result, True)
            return
        rows = [("P(failure)", f"{d.p_fail:.2%}"), ("mean ms", result["mean_ms"]),
                (f"mean ms, central {1 - 2 * Q.TRIM:.0%}", result["trimmed_mean_ms"])]
        rows += [(f"p{round(q * 100)} ms", result[f"p{round(q * 100)}_ms"]) for q in Q.QUANTILES]
        if cal is not None:
            from pingctl.cli.sample_pairs import calibration_label

            rows.append(("calibration", calibration_label(cal)))
        emit(result, False, kv_table(f"RTT {src} -> {dst} ({model.label})", rows))
        _histogram(d)
        for what, path in (("plot", plot), ("distribution", out)):
            if path:
                console.print(f"{what}: {path}")
        return
    if mode == "complete":
        found = Q.complete(model, src, dst, rtt_lo, k=k, context=ctx_tokens)
        result["completions"] = found
        _table(result, as_json, f"completions of {src} -> {dst}", found, ("src", "dst", "probability"))
        return
    if mode == "inverse":
        found = Q.inverse(model, src, rtt_lo, rtt_hi, n or 64, rng, cfg.sample.temperature, context=ctx_tokens)
        result["candidates"] = found[:k]
        _table(result, as_json, f"destinations {src} reaches in {rtt} ms", found[:k], ("dst", "probability", "samples"))
        return
    from pingctl.schema import generated_time_range

    timed = model.timestamps if timestamps is None else timestamps
    # every generated row passes shard's time check
    streams = Q.generate(model, n or 4, measurements, rng, cfg.sample.temperature, cfg.sample.top_p,
                         context=ctx_tokens, src=src, timestamps=timed,
                         time_range=(period or generated_time_range()) if model.scheme == "compact" else None)
    result["timestamped"] = timed
    if model.scheme == "compact":
        result["time_range"] = list(period or generated_time_range())
    rows = []
    for i, d in enumerate(streams):
        m = d.measurements
        times = m.time_s
        for j, (s_, d_, r_) in enumerate(zip(m.src_text(), m.dst_text(), m.rtt_ms)):
            rows.append({"stream": i, "src": s_, "dst": d_, "rtt_ms": float(r_),
                         "time": int(times[j]) if m.has_time[j] else None})
    result["measurements"] = rows
    result["errors"] = sum(len(d.errors) for d in streams)
    result["times_out_of_range"] = int(sum(d.measurements.unrepresentable_times().sum() for d in streams))
    if out:
        _write_generated(streams, out)
        result["out"] = str(out)
    _table(result, as_json, f"{len(streams)} generated streams", rows[:40], ("stream", "time", "src", "dst", "rtt_ms"))
    if result["times_out_of_range"] and not as_json:
        err_console.print(f"[yellow]{result['times_out_of_range']} generated time(s) lie beyond a timestamp's "
                          f"+-292,000 years{'; their event_time is null in ' + str(out) if out else ''}[/]")


def _generation_period(since: str | None, until: str | None) -> tuple[int, int]:
    """--since/--until as the (lo, hi) Unix seconds generated times are drawn in; inside the
    range a canonical row may hold, so every generated row stays one."""
    from pingctl.schema import generated_time_range

    lo_ok, hi_ok = generated_time_range()
    lo = option_time(since, "--since") if since is not None else lo_ok
    hi = option_time(until, "--until") if until is not None else hi_ok
    for name, v in (("--since", lo), ("--until", hi)):
        if not lo_ok <= v <= hi_ok:
            raise UsageError(f"{name} {utc_text(v)}: generated rows are canonical rows, whose times lie in "
                             f"{utc_text(lo_ok)} .. now ({utc_text(hi_ok)}); shard would set this one aside")
    if lo > hi:
        raise UsageError(f"--since {utc_text(lo)} is after --until {utc_text(hi)}")
    return lo, hi


def _check_context_options(context: Path | None, context_per_pair: int | None) -> None:
    from pingctl.infer import queries as Q

    Q.check_per_pair(context_per_pair)
    if context_per_pair is not None and context is None:
        raise UsageError("--context-per-pair caps measurements from --context; give --context too")


def _address_option(text: str | None, name: str) -> str | None:
    """The address or pattern of --src/--dst as the prompt builder takes it: no surrounding
    whitespace, and refused as a --pairs row is where no measurement could record it."""
    from pingctl.infer.pairs import AddressError, check_measurable

    if text is None:
        return None
    text = text.strip()
    try:
        check_measurable(text)
    except AddressError as e:
        raise UsageError(f"{name} {e}") from None
    return text


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


def _probe_context(ctx, read: dict, path: Path, src: str, t_query: int | None, prb):
    """The file's measurements of `src`'s probe (before --time), as `--pairs` picks a row's:
    training contexts hold one probe's past, so other probes' and later rows are left out, named."""
    import ipaddress

    from pingctl.infer.pairs import context_of

    picked = context_of(ctx, str(ipaddress.ip_address(src)), t_query, prb)
    read["rows_used"] = 0 if picked is None else len(picked)
    if read["rows_used"] < len(ctx):
        before = f" before --time {utc_text(t_query)}" if t_query is not None else ""
        # say(): a path is printed as given, never read as Rich markup
        say(f"--context {path}: {read['rows_used']:,} of its {len(ctx):,} valid rows are measurements of the "
            f"probe with source {src}{before}; the prompt holds only those (a probe's own past, as in training)",
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


def _plot(d, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from pingctl.atomic import atomic_file

    keep = d.probs > 1e-7
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    bins = np.geomspace(max(d.values_ms[keep].min(), 0.01), max(d.values_ms[keep].max(), 1), 80)
    ax.hist(d.values_ms[keep], bins=bins, weights=d.probs[keep])
    ax.set_xscale("log")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("probability")
    ax.set_title(f"{title}  P(fail)={d.p_fail:.1%}  median={d.quantile(0.5):.1f} ms")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def _write_distribution(d, out: Path, src: str, dst: str) -> None:
    """Every RTT code with its value and P(code | success); P(failure) beside them (Parquet:
    schema metadata), so users can compute what the printed summary leaves out."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pingctl.atomic import atomic_file
    from pingctl.parquet_io import WRITE_OPTIONS

    meta = {"src": src, "dst": dst, "p_fail": d.p_fail}
    with atomic_file(out) as tmp:
        if out.suffix == ".json":
            tmp.write_text(json.dumps({**meta, "code": d.codes.tolist(), "rtt_ms": d.values_ms.tolist(),
                                       "probability": d.probs.tolist()}))
        else:
            table = pa.table({"code": pa.array(d.codes, pa.uint16()), "rtt_ms": d.values_ms, "probability": d.probs})
            pq.write_table(table.replace_schema_metadata({"pingctl": json.dumps(meta)}), tmp, **WRITE_OPTIONS)


def _write_generated(streams, out: Path) -> None:
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pingctl.atomic import atomic_file
    from pingctl.parquet_io import WRITE_OPTIONS
    from pingctl.tokenizer import Measurements

    ms = [d.measurements for d in streams]
    table = Measurements.concat(ms).to_arrow() if ms else None
    stream_id = np.concatenate([np.full(len(m), i) for i, m in enumerate(ms)]) if ms else []
    with atomic_file(out) as tmp:
        if out.suffix == ".json":
            rows = table.to_pylist() if table is not None else []
            for r, s in zip(rows, stream_id):
                r["stream"] = int(s)
            tmp.write_text(json.dumps(rows, default=json_default, indent=1))
        else:
            pq.write_table(table.append_column("stream", pa.array(stream_id, pa.int64())), tmp, **WRITE_OPTIONS)


def register(app) -> None:
    app.command("sample")(handle_errors(sample))
