"""What the routes compute, without HTTP, through the public `pingctl.api.Model` only: the
batched RTT answers (`Model.rtt_prompts`, `rtt_summaries`), completions, searches, scores and the run's metadata.
Everything that calls the model runs on the batcher's worker thread; building a request's
context (a canonical table checked as `pingctl sample --context` checks one) runs in the
request's thread.

An RTT answer is the one `pingctl sample --pairs` gives (`Model.rtt_many`: each pair's context
is its source's probe's measurements before its time; a repeated question is asked once), exact
at P(failure) and the quantiles, or with `exact` over all 65,536 codes. It is computed in
`rtt_many`'s three halves: the request's prompts in its own thread (`rtt_prompts`), the forward
passes on the worker with other requests' prompts (`rtt_summaries`), the rows from the two.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import numpy as np

from pingctl.api import Context, Model, RttPrompts
from pingctl.artifacts.export import shown_path
from pingctl.errors import UsageError
from pingctl.schema.parquet import to_canonical
from pingctl.serve import schemas as S
from pingctl.tokenizer import Measurements


class FieldError(UsageError):
    """A request value the model cannot take, found after the body's own checks (a time for a
    run trained without timestamps): 422 naming `loc`."""

    def __init__(self, loc: tuple, message: str, kind: str = "value_error"):
        super().__init__(f"{field_name(loc)}: {message}")
        self.loc, self.msg, self.type = loc, message, kind


def field_name(loc) -> str:
    """("body", "pairs", 3, "src") -> "pairs[3].src"."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def utc_iso(seconds: float | None) -> str | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def finite(value):
    """JSON has no NaN or infinity: such a float becomes null, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# ----------------------------------------------------------------- context


def canonical_table(src: list[str], dst: list[str], seconds: list[int], rtt: list[float], prb: list):
    """Measurements as a canonical table (pingctl.schema.columns): what `Model` reads as a
    context or scores."""
    import pyarrow as pa

    n = len(src)
    given = pa.table({
        "msm_id": [0] * n, "event_time": pa.array([int(t) * 1_000_000 for t in seconds], pa.timestamp("us", tz="UTC")),
        "src_addr": src, "dst_addr": dst, "ip_version": [S.family(a) for a in src], "rtt": [float(x) for x in rtt],
        "size": [0] * n, "packet_error_count": [0] * n, "prb_id": prb,
    })
    # an optional column a request has no field for (the schema may grow) is null, as a table
    # without it reads
    return to_canonical(given)


def rows_table(rows: list[S.ContextRow]):
    """Checked body rows as a canonical table."""
    return canonical_table([r.src for r in rows], [r.dst for r in rows], [r.time for r in rows],
                           [r.rtt for r in rows], [r.prb_id for r in rows])


def context(rows: list[S.ContextRow] | None) -> Context | None:
    """The body's context rows as a `pingctl.api.Context`, prb_id kept (-1 where none). The
    rows passed build-rows' checks in the body's schema, so the Context is built from them
    directly: `Context.load` of a table would check them again through a Parquet file and
    DuckDB, ~100 ms a request, which was most of a one-pair request's time with context."""
    if not rows:
        return None
    m = Measurements.from_fields([r.src for r in rows], [r.dst for r in rows], [r.rtt for r in rows],
                                 [int(r.time) for r in rows])
    prb = np.array([-1 if r.prb_id is None else r.prb_id for r in rows], np.int64)
    return Context(m, prb, {"rows_read": len(rows), "rows_rejected": 0, "rejected": {}}, "context")


# ----------------------------------------------------------------- RTT distributions


def check_times(model: Model, timed: bool, questions: list[tuple[int, S.Pair]], many: bool) -> list[dict]:
    """A time asks a run trained without timestamps (`timed` False) for a prompt it never saw:
    the one-pair form is refused (422), a batch's timed pairs are set aside."""
    if timed:
        return []
    out = []
    for i, q in questions:
        if q.time is None:
            continue
        loc = ("body", "pairs", i, "time") if many else ("body", "time")
        msg = f"{model.name} was trained without timestamps, so it cannot condition on a time; ask without one"
        if not many:
            raise FieldError(loc, msg)
        out.append({"index": i, "field": field_name(loc), "reason": "untimed_run",
                    "message": f"{field_name(loc)}: {msg}"})
    return out


def rtt_prompts(model: Model, items: list[dict], rows: list[S.ContextRow] | None,
                context_per_pair: int | None, answer: str | None = None, one: bool = False) -> RttPrompts:
    """A request's half of its answer, in its own thread: its pairs ({src, dst, time} each,
    checked by the body) and the prompt of each distinct one from its own context rows
    (`Model.rtt_prompts`), with the predictor answering it, so the model's worker only runs
    forward passes. The `one`-pair form asked for a predictor it cannot have is refused."""
    ctx = context(rows)
    asked = model.rtt_prompts(items, context=ctx, context_per_pair=context_per_pair if ctx is not None else None,
                              answer=answer)
    if one and answer is not None and asked.choices:
        model.predictor.asking(answer).require(asked.choices[0])
    return asked


def rtt_items(asked: RttPrompts) -> list[tuple]:
    """The batch items of a request: (prompt, its predictor's choice) each."""
    return list(zip(asked.prompts, asked.choices or [None] * len(asked.prompts)))


def rtt_summaries(model: Model, items: list[tuple], exact: bool) -> list[dict]:
    """The batch function (the model's worker): (prompt, choice) items of any requests, one summary each."""
    choices = [c for _, c in items]
    return model.rtt_summaries([p for p, _ in items], exact, None if any(c is None for c in choices) else choices)


def rtt_rows(asked: RttPrompts, summaries: list[dict], n: int) -> list[dict]:
    """One result per question asked (`n`, in order): its summary and context_measurements, or
    {"rejected": reason} where the pair checks set the row aside."""
    out: list[dict] = [{"rejected": "set aside by the model's checks"} for _ in range(n)]
    pairs = asked.pairs
    for r in pairs.rejects:
        out[r["row"]] = {"rejected": f"{r.get('reason')}: {r.get('detail')}"}
    choices = asked.choices
    for where, q in zip(pairs.where, pairs.slots):
        out[where] = {**{k: None if v is None else float(v) for k, v in summaries[q].items()},
                      "context_measurements": asked.built.context_measurements[q],
                      **({"answered_by": choices[q].answered_by()} if choices else {})}
    return out


def rtt_response(model: Model, body: S.RttRequest, questions: list[tuple[int, S.Pair]], rejected: list[dict],
                 results: list[dict], cap: int | None) -> dict:
    head = {"run": model.name, "step": model.step, "steps": list(model.steps), "exact": body.exact,
            "calibration": shown(model.calibration.path) if model.calibration is not None else None,
            "combination": shown(model.predictor.path)}
    if body.context is not None:
        head.update(context_rows=len(body.context), context_per_pair=cap)
    rows, bad = [], list(rejected)
    for (i, q), r in zip(questions, results):
        if "rejected" in r:
            bad.append({"index": i, "field": f"pairs[{i}]", "reason": "rejected", "message": f"pairs[{i}]: {r['rejected']}"})
            continue
        rows.append({"index": i, "src": q.src, "dst": q.dst, "time": q.time, **r})
    if body.pairs is None:
        if bad:
            raise UsageError(bad[0]["message"])
        one = rows[0]
        one.pop("index")
        return finite({"mode": "distribution", **head, **one})
    bad.sort(key=lambda b: b["index"])
    distinct = len({(q.src, q.dst, q.time) for _, q in questions})
    return finite({"mode": "pairs", **head, "asked": len(body.pairs), "answered": len(rows), "distinct": distinct,
                   "predictions": rows, "rejected": bad})


# ----------------------------------------------------------------- completion, search, scoring


def complete(model: Model, body: S.CompleteRequest, ctx: Context | None) -> dict:
    rows = model.complete(body.src, body.dst, rtt=body.rtt, k=body.k, context=ctx,
                          context_per_pair=body.context_per_pair if ctx is not None else None)
    return finite({"mode": "complete", "run": model.name, "step": model.step, "completions": rows})


def search(model: Model, body: S.SearchRequest, ctx: Context | None) -> dict:
    rows = model.search(body.src, body.rtt, n=body.n, k=body.k, seed=body.seed,
                        temperature=body.temperature, context=ctx,
                        context_per_pair=body.context_per_pair if ctx is not None else None)
    return finite({"mode": "inverse", "run": model.name, "step": model.step, "candidates": rows})


def score(model: Model, body: S.ScoreRequest) -> dict:
    """`Model.score` of the body's rows, one result row each (worker thread)."""
    out = model.score(rows_table(body.rows), context=body.context, context_policy=body.context_policy,
                      limit=body.limit)
    raw = (out.schema.metadata or {}).get(b"pingctl")
    meta = json.loads(raw) if raw else {}
    if isinstance(meta.get("run"), str):
        meta["run"] = model.name  # a client is told the run's name, not where the server keeps it
    rows = out.to_pylist()
    for r in rows:  # the times as they came in: Unix seconds
        if isinstance(r.get("event_time"), dt.datetime):
            r["event_time"] = int(r["event_time"].timestamp())
    return finite({"run": model.name, "step": model.step, "meta": meta, "rows": rows})


# ----------------------------------------------------------------- metadata


def shown(path) -> str | None:
    """A file as the service names it, as an export does (`shown_path`: its last two parts), never
    the path that would tell a client where the server keeps its files (or whose home it is)."""
    return None if path is None else shown_path(path)


def metadata(model: Model, started: float) -> dict:
    """What `Model.metadata` says of the run, with names where it has paths, and since when it serves."""
    out = {**model.metadata(), "run": model.name, "serving_since": utc_iso(started)}
    if isinstance(out.get("eval"), dict):
        out["eval"] = {**out["eval"], "report": shown(out["eval"].get("report"))}
    cal = out.get("calibration")
    if isinstance(cal, dict):
        # the map's own metadata names the run it was fitted for by the path it was given
        out["calibration"] = {**cal, "path": shown(cal.get("path")),
                              **({"run": Path(cal["run"]).name} if isinstance(cal.get("run"), str) else {})}
    return finite(out)
