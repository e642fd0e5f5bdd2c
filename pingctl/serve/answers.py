"""What the endpoints compute, without HTTP: prompts, the batched RTT answers, completions,
searches, scoring and the run's metadata. Everything that touches the model is called on the
batcher's worker thread; prompt building (NumPy, no JAX) runs in the request's thread.

An RTT answer is the one `pingctl sample` gives: prompts are built as a --pairs file's rows
are (`pingctl.infer.pairs`: each pair's context is its source's probe's measurements before
its time; equal questions in one request are asked once), and each distribution is exact at
P(failure) and the quantiles (`queries.rtt_distributions_at`, as --pairs and eval) or, with
`exact`, over all 65,536 codes (`queries.rtt_distributions`, as a single --src/--dst query).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from pingctl.api import Model
from pingctl.errors import UsageError
from pingctl.infer import pairs as P
from pingctl.infer import queries as Q
from pingctl.infer import questions as QS
from pingctl.infer.model import untimed_run
from pingctl.infer.score import score_meta, score_table
from pingctl.schema.columns import arrow_schema
from pingctl.serve import schemas as S
from pingctl.tokenizer import Measurements

class FieldError(UsageError):
    """A request value the model cannot take, found after the body's own checks (a time for a
    run trained without timestamps, a field the one-pair form lacks): 422 naming `loc`."""

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


def context_measurements(rows: list[S.ContextRow] | None) -> tuple[Measurements | None, np.ndarray | None]:
    """The body's context rows as Measurements and each row's prb_id (-1 where none)."""
    if not rows:
        return None, None
    m = Measurements.from_fields([r.src for r in rows], [r.dst for r in rows], [r.rtt for r in rows],
                                 [int(r.time) for r in rows])
    return m, np.array([-1 if r.prb_id is None else r.prb_id for r in rows], np.int64)


def per_pair(model, requested: int | None) -> int:
    return model.max_per_pair if requested is None else requested


# ----------------------------------------------------------------- RTT distributions


@dataclass
class RttWork:
    """One request's questions: the pairs, one prompt per distinct question, and per distinct
    question the context measurements its prompt holds."""

    pairs: P.Pairs
    prompts: list[np.ndarray]
    context_measurements: list[int]


def check_times(model, questions: list[S.Pair], many: bool) -> None:
    """A time asks a run trained without timestamps for a prompt it never saw: refused, as the
    CLI's --time is."""
    if model.timestamps:
        return
    for i, q in enumerate(questions):
        if q.time is not None:
            loc = ("body", "pairs", i, "time") if many else ("body", "time")
            e = untimed_run(field_name(loc), model.run, "so it cannot condition on a time; ask without one")
            raise FieldError(loc, str(e).split(": ", 1)[1])


def rtt_prompts(model, questions: list[S.Pair], context: list[S.ContextRow] | None, cap: int) -> RttWork:
    pairs = P.Pairs(file="request", unit="row", where=list(range(len(questions))),
                    src=[q.src for q in questions], dst=[q.dst for q in questions],
                    family=[S.family(q.src) for q in questions], time=[q.time for q in questions])
    ctx, prb = context_measurements(context)
    distinct = np.unique(pairs.slots, return_index=True)[1]
    budget, timed = model.seq_len - 64, model.timestamps
    prompts, n_ctx = [], []
    for c, i in zip(P.contexts(pairs, ctx, distinct, prb=prb), distinct):
        tokens, last_t = Q.context_tokens(model, c, budget, cap, timed=timed)
        n_ctx.append(int((tokens == 0).sum()))  # one MeasurementStart (id 0) per context measurement
        prompts.append(Q.query_prefix(pairs.src[i], pairs.dst[i], pairs.time[i] if timed else None, tokens, last_t))
    return RttWork(pairs, prompts, n_ctx)


def rtt_answers(model, prompts: list[np.ndarray], exact: bool, calibration=None) -> list[dict]:
    """The batch function: one summary per prompt (on the worker thread), read as `pingctl
    sample --pairs` reads them (`pairs.distributions`)."""
    return [d.summary() for d in P.distributions(model, prompts, exact, calibration)]


def rtt_response(model, body: S.RttRequest, work: RttWork, summaries: list[dict], cap: int,
                 calibration=None) -> dict:
    pairs = work.pairs
    rows = [{"src": s, "dst": d, "time": t, **summaries[k], "context_measurements": work.context_measurements[k]}
            for s, d, t, k in zip(pairs.src, pairs.dst, pairs.time, pairs.slots)]
    head = {"run": str(model.run), "step": model.step, "steps": list(model.steps), "exact": body.exact,
            "calibration": calibration.path if calibration is not None else None}
    if body.context is not None:
        head.update(context_rows=len(body.context), context_per_pair=cap)
    if body.pairs is None:
        return finite({"mode": "distribution", **head, **rows[0]})
    return finite({"mode": "pairs", **head, "answered": len(rows), "distinct": len(work.prompts), "predictions": rows})


# ----------------------------------------------------------------- completion, search, scoring


def _picked_context(model, q: QS.Question, context: list[S.ContextRow] | None) -> tuple:
    """The context a single question is asked with (its source's probe's rows, as the CLI
    picks them from --context) and what became of the rows."""
    ctx, prb = context_measurements(context)
    if ctx is None:
        return None, None
    read = {"rows_read": len(ctx)}
    return QS.probe_context(q, ctx, read, prb), read


def complete_question(body: S.CompleteRequest) -> QS.CompleteQuestion:
    fam_src, fam_dst = (p[0] if p else None for p in Q.parse_pair(body.src, body.dst))
    return QS.CompleteQuestion(src=body.src or Q.any_address(fam_dst), dst=body.dst or Q.any_address(fam_src),
                               rtt=body.rtt, k=body.k, context_per_pair=body.context_per_pair)


def search_question(body: S.SearchRequest) -> QS.InverseQuestion:
    lo, hi = body.rtt_bounds()
    return QS.InverseQuestion(src=body.src, rtt_lo=lo, rtt_hi=hi, samples=body.n, k=body.k, seed=body.seed,
                              temperature=body.temperature, context_per_pair=body.context_per_pair)


def ask(model, q: QS.Question, context: list[S.ContextRow] | None) -> dict:
    """A completion or an inverse search, answered as `pingctl sample --json` prints it (on the
    worker thread)."""
    QS.check_run(q, model.run)
    ctx, read = _picked_context(model, q, context)
    return finite(QS.answer(model, q, model.run, ctx, read).result)


def score_rows(model, body: S.ScoreRequest) -> dict:
    """`pingctl.infer.score.score_table` of the body's rows, one result row each (worker thread)."""
    import pyarrow as pa

    rows = body.rows
    table = pa.table({
        "msm_id": [0] * len(rows),
        "event_time": pa.array([int(r.time) * 1_000_000 for r in rows], pa.timestamp("us", tz="UTC")),
        "src_addr": [r.src for r in rows], "dst_addr": [r.dst for r in rows],
        "ip_version": [S.family(r.src) for r in rows], "rtt": [float(r.rtt) for r in rows],
        "size": [0] * len(rows), "packet_error_count": [0] * len(rows), "prb_id": [r.prb_id for r in rows],
    }, schema=arrow_schema())
    out = score_table(model, table, context=body.context, context_policy=body.context_policy, limit=body.limit)
    rows = out.to_pylist()
    for r in rows:  # the times as they came in: Unix seconds
        if isinstance(r.get("event_time"), dt.datetime):
            r["event_time"] = int(r["event_time"].timestamp())
    return finite({"run": str(model.run), "step": model.step, "meta": score_meta(out), "rows": rows})


# ----------------------------------------------------------------- metadata


def metadata(model, started: float, calibration=None) -> dict:
    """What `pingctl.api.Model.metadata` says of the run (step, preset, scheme, seq_len, the
    checkpoint's time, training figures, the eval headline beside it, the calibration map
    /rtt applies), and since when it serves."""
    return finite({**Model(model, calibration).metadata(), "serving_since": utc_iso(started)})
