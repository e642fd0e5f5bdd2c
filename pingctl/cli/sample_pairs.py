"""`pingctl sample RUN --pairs FILE`: the RTT distributions of many pairs, one model load."""

from __future__ import annotations

import time as _time
from pathlib import Path

from pingctl.cli.common import emit, err_console, fmt, grid_table, kv_table, progress, say
from pingctl.schema.times import utc_text

SHOWN = 20  # pairs printed in the terminal table; -o / --json hold them all
TIMES_HINT = 1000  # distinct timed questions from which a note says that each time is its own question


def calibration_label(cal) -> str:
    """Which map recalibrated the quantiles: its file, and the packets and prompt it was fitted on."""
    m = cal.meta
    return (f"{cal.path} (fitted on {m.get('packets')} packets of {cal.fitted_on_text()}, "
            f"context policy {m.get('context_policy')})")


def answered_by_label(by: dict) -> str:
    """Which predictor answered, in which regime, and why: one line of a summary table."""
    regime = f" ({by['regime']} regime)" if by.get("regime") else ""
    return f"{by['predictor']}{regime}: {by['why']}"


def answered_by_counts(cols: dict) -> str:
    """How many rows each predictor answered, e.g. "combined 12, model 3"."""
    counts: dict = {}
    for p in cols.get("answered_by", []):
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{p} {n:,}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "model"


def answer_pairs(run: Path, pairs_path: Path, ctx, ctx_read: dict | None, context_per_pair: int | None,
                 out: Path | None, exact: bool, steps, as_json: bool, ctx_prb=None,
                 hardware: str | None = None, calibration=None, context_policy: str = "probe",
                 context_k: int | None = None, engine: str | None = None, answering=(None, None)) -> None:
    """`Model.rtt_many` of the file, its pairs read and checked before the model loads."""
    from pingctl.api import Context, Model
    from pingctl.api import checks as C
    from pingctl.api.model import check_pairs, reason_lines
    from pingctl.artifacts import sample_output as SO
    from pingctl.artifacts.run import run_config
    from pingctl.prompt import Policy

    pairs = C.read_pairs(pairs_path)
    check_pairs(pairs, f"--pairs {pairs_path}", run, C.trained_with_timestamps(run_config(run).loader.mode_weights),
                "the file's")
    summary = pairs.reject_summary()
    n_pairs = len(set(zip(pairs.src, pairs.dst)))
    if pairs.distinct >= max(TIMES_HINT, 2 * n_pairs) and not as_json:
        # a measurement table with its times is one question per packet: say so before the long part
        say(f"--pairs {pairs_path}: {pairs.distinct:,} distinct (src, dst, time) questions of {n_pairs:,} pairs; "
            "each time is its own question (the prompt's context and timestamp depend on it). To ask once "
            "per pair, drop the time column or leave it empty.", err=True, label="note: ")
    with err_console.status(f"loading {run} ..."):
        # the --calibration map was read and checked against the run; the model checks its step(s)
        model = Model.load(run, steps, hardware, calibration=calibration if calibration is not None else False,
                           engine=engine, answer=answering[0], combination=answering[1])
    loaded = model.loaded
    t0 = _time.perf_counter()
    with progress(transient=True) as bar:
        task = bar.add_task("pairs", total=len(pairs.src))
        got = model.rtt_many(pairs, Context(ctx, ctx_prb, ctx_read, "--context") if ctx is not None else None,
                             context_per_pair, exact=exact, context_policy=context_policy, context_k=context_k,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    elapsed = _time.perf_counter() - t0
    cols, per_pair, k = got.columns, got.context_per_pair, C.CONTEXT_K if context_k is None else context_k
    meta = {"run": str(run), "step": loaded.step, "steps": list(loaded.steps), "timestamps": loaded.timestamps,
            "pairs": str(pairs_path), "exact": exact, "calibration": calibration.path if calibration else None,
            "combination": model.predictor.path}
    result = {"mode": "pairs", **meta, "rows_read": pairs.rows_read, "answered": len(pairs.src),
              "rows_rejected": len(pairs.rejects), "rejected": summary, "seconds": round(elapsed, 3),
              "distinct": pairs.distinct, "distinct_pairs": n_pairs, "device": loaded.device,
              "engine": loaded.engine}
    if ctx is not None:
        result["context_per_pair"] = per_pair
        result["context_rows"] = ctx_read
        result["context_policy"] = context_policy
        if context_policy == Policy.BOTH:
            result["context_k"] = k
    if out is not None:
        SO.write_predictions(cols, out, meta)
        SO.write_rejects(pairs.rejects, SO.rejects_path(out))
        result.update(out=str(out), rejects_file=str(SO.rejects_path(out)))
    if summary and not as_json:
        say(f"--pairs {pairs_path}: set aside {len(pairs.rejects):,} of {pairs.rows_read:,} rows"
            + (f" (each in {SO.rejects_path(out)})" if out is not None else ":"), err=True, label="warning: ")
        for line in reason_lines(summary, pairs.unit):
            say(line, err=True)
        if out is None:
            for r in pairs.rejects[:10]:
                say(f"  {pairs.unit} {r[pairs.unit]}: {r['reason']}: {r['detail']}", err=True)
    if as_json:
        keys = list(cols)
        emit({**result, "predictions": [dict(zip(keys, v)) for v in zip(*cols.values())],
              "rejects": pairs.rejects}, True)
        return
    emit(result, False, [_table(cols, pairs.unit, loaded.label), kv_table("pairs summary", [
        ("pairs read", pairs.rows_read), ("answered", len(pairs.src)), ("set aside", len(pairs.rejects)),
        ("distinct (src, dst, time) asked", result["distinct"]),
        ("distribution", "exact (every code)" if exact else "exact at the quantiles (--exact: every code)"),
        *([("calibration", calibration_label(calibration))] if calibration is not None else []),
        ("answered by", answered_by_counts(cols)
         + (f" ({model.predictor.unused})" if model.predictor.unused and model.predictor.asked != "model" else "")),
        ("context measurements, mean", sum(cols["context_measurements"]) / len(pairs.src)),
        ("device", f"{loaded.device} ({loaded.engine} engine)"), ("seconds", elapsed), ("distinct pairs/s", result["distinct"] / elapsed if elapsed > 0 else float("nan")),
        ("predictions", str(out) if out else f"first {min(SHOWN, len(pairs.src))} above; -o FILE for all"),
        *([("rejects", str(SO.rejects_path(out)))] if out is not None else []),
    ])])


def _table(cols: dict, unit: str, label: str):
    n = len(cols["src"])
    timed = any(t is not None for t in cols["time"])
    by = "answered_by" in cols
    names = [unit, "src", "dst", *(["time (UTC)"] if timed else []), "P(fail)", "p5", "p50", "p95", "mean90",
             *(["answered by"] if by else [])]
    t = grid_table(f"RTT distributions, ms ({label}; mean90: mean of the central 90%)"
                   f"{'' if n <= SHOWN else f', first {SHOWN} of {n:,}'}",
                   names, left=("src", "dst", "time (UTC)", "answered by"), whole=(unit, "time (UTC)", "P(fail)"),
                   listing=True)
    for i in range(min(n, SHOWN)):
        t.add_row(fmt(cols[unit][i]), cols["src"][i], cols["dst"][i],
                  *([utc_text(cols["time"][i])] if timed else []), f"{cols['p_fail'][i]:.2%}",
                  *(f"{cols[k][i]:,.1f}" for k in ("p5_ms", "p50_ms", "p95_ms", "trimmed_mean_ms")),
                  *([cols["answered_by"][i]] if by else []))
    return t
