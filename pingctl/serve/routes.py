"""The routes of `pingctl serve`: module-level functions over one `ServeState`
(`request.app.state.serve`), so each can be read and tested alone; `app.create_app` registers
them with their response models and error codes (`ROUTES`).

Every model call goes through the state's `Batcher` (one worker thread; concurrent /rtt
questions share `Model.rtt_summaries` calls over prompts their requests' threads built); the
event loop validates, queues and awaits. Until the warm-up has run, the routes that ask the model answer 503 `warming` at once
rather than keep a client waiting on a compilation.

Starlette is imported at the top (FastAPI reads the route signatures' annotations): only
`create_app` imports this module, inside a function, so the CLI starts without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Body
from starlette.requests import Request
from starlette.responses import Response

from pingctl import __version__
from pingctl.api import Model
from pingctl.errors import PingctlError
from pingctl.serve import answers as A
from pingctl.serve import examples as X
from pingctl.serve import responses as R
from pingctl.serve import schemas as S
from pingctl.serve.batcher import Batcher


class Warming(PingctlError):
    """The warm-up has not finished: 503 with Retry-After."""

    kind = "warming"


@dataclass
class ServeState:
    """What the routes share: the model (`pingctl.api.Model`), its worker, what the model said
    of itself at start (`meta`: seq_len, timestamps, max_per_pair, ...), the bounds, the warm-up."""

    model: Model
    batcher: Batcher
    meta: dict
    max_body_bytes: int
    started: float = field(default_factory=time.time)
    warmup: dict = field(default_factory=lambda: {"status": "warming"})

    @property
    def status(self) -> str:
        return self.warmup["status"]


def state(request) -> ServeState:
    return request.app.state.serve


def _ready(st: ServeState) -> None:
    if st.status == "warming":
        raise Warming("the service is warming up (compiling the shapes its batches use); retry in a few seconds "
                      "(GET /health says ready when it is)")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


async def _on_worker(st: ServeState, fn):
    return await asyncio.wrap_future(st.batcher.call(fn))


async def _in_thread(fn, *args):
    """`fn(*args)` in a thread of its own, awaited. A daemon thread, unlike Starlette's pool:
    when the drain cuts a request whose prompts are still being built (seconds for 1,024
    pairs), the stopping process does not wait for work whose request is already answered."""
    future: cf.Future = cf.Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the request's to raise, on the event loop
                future.set_exception(e)

    threading.Thread(target=run, name="pingctl-request", daemon=True).start()
    return await asyncio.wrap_future(future)


# ------------------------------------------------------------------ liveness, readiness, identity


async def health(request: Request, response: Response) -> dict:
    """200 with status ready (or failed: the warm-up failed, answering anyway); 503 while warming."""
    st = state(request)
    b = st.batcher
    if st.status == "warming":
        response.status_code = 503
        response.headers["Retry-After"] = "1"
    return {"status": st.status, "run": st.model.name, "step": st.model.step, "queued": b.queued,
            "max_batch": b.max_batch, "max_wait_ms": _ms(b.max_wait_s), "batcher": dict(b.stats),
            "warmup": {k: v for k, v in st.warmup.items() if k != "status"},
            "uptime_s": round(time.time() - st.started, 3)}


async def version(request: Request) -> dict:
    st = state(request)
    m = st.model
    return {"pingctl": __version__, "run": m.name, "step": m.step, "steps": list(m.steps), "device": m.device}


async def metadata(request: Request) -> dict:
    st = state(request)
    out = await _in_thread(A.metadata, st.model, st.started)
    b = st.batcher
    return {**out, "serve": {"max_batch": b.max_batch, "max_wait_ms": _ms(b.max_wait_s),
                             "bounds": {"pairs": S.MAX_PAIRS, "context_rows": S.MAX_CONTEXT_ROWS,
                                        "search_samples": S.MAX_SEARCH_SAMPLES, "score_rows": S.MAX_SCORE_ROWS,
                                        "body_bytes": st.max_body_bytes, "queued": b.max_queued,
                                        "work": S.MAX_WORK}}}


# ------------------------------------------------------------------ questions


async def rtt(body: Annotated[S.RttRequest, Body(openapi_examples=X.RTT)], request: Request) -> dict:
    """One pair (src, dst, time) or many (pairs): a bad pair of many is set aside with its reason."""
    from fastapi.exceptions import RequestValidationError

    st = state(request)
    if missing := body.missing():
        raise RequestValidationError([{"loc": ("body", name), "msg": "Field required (give src and dst, or pairs)",
                                       "type": "missing"} for name in missing])
    S.check_work(body, st.meta["seq_len"])  # 413 before any work
    _ready(st)
    questions, rejected = body.questions()
    many = body.pairs is not None
    untimed = A.check_times(st.model, st.meta["timestamps"], questions, many)
    if untimed:
        gone = {r["index"] for r in untimed}
        questions, rejected = [q for q in questions if q[0] not in gone], rejected + untimed
    if not questions:
        first = min(rejected, key=lambda r: r["index"])
        raise A.FieldError(("body", "pairs", first["index"]),
                           f"no pair passes its checks ({len(rejected):,} set aside); first: {first['message']}")
    items = [{"src": q.src, "dst": q.dst, "time": q.time} for _, q in questions]
    # the prompts here, in a request thread; only the forward passes on the model's worker,
    # batched with other requests' prompts of the same kind (long prompts apart from short)
    asked = await _in_thread(A.rtt_prompts, st.model, items, body.context, body.context_per_pair, body.answer,
                             not many)
    fn = functools.partial(A.rtt_summaries, st.model, exact=body.exact)
    summaries = await asyncio.wrap_future(st.batcher.submit(("rtt", body.exact, bool(body.context)), fn,
                                                            A.rtt_items(asked)))
    results = A.rtt_rows(asked, summaries, len(items))
    # the cap the prompts were built under (`prompt.per_pair_cap`)
    return A.rtt_response(st.model, body, questions, rejected, results, asked.context_per_pair)


async def complete(body: Annotated[S.CompleteRequest, Body(openapi_examples=X.COMPLETE)], request: Request) -> dict:
    st = state(request)
    _ready(st)
    ctx = await _in_thread(A.context, body.context)
    return await _on_worker(st, functools.partial(A.complete, st.model, body, ctx))


async def search(body: Annotated[S.SearchRequest, Body(openapi_examples=X.SEARCH)], request: Request) -> dict:
    st = state(request)
    _ready(st)
    ctx = await _in_thread(A.context, body.context)
    return await _on_worker(st, functools.partial(A.search, st.model, body, ctx))


async def score(body: Annotated[S.ScoreRequest, Body(openapi_examples=X.SCORE)], request: Request) -> dict:
    st = state(request)
    _ready(st)
    return await _on_worker(st, functools.partial(A.score, st.model, body))


async def metrics(request: Request) -> Response:
    """Prometheus text format: requests by route and status, latency, batch sizes, queue depth."""
    body, kind = request.app.state.metrics.text()
    return Response(body, media_type=kind)


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    fn: object
    model: object  # the 200's response model (None: /metrics' text)
    summary: str
    operation_id: str
    tag: str
    codes: tuple = ()
    answers: dict | None = None  # named examples of the 200's body

    def responses(self) -> dict:
        out = R.errors(*self.codes)
        if self.answers:
            out[200] = {"content": {"application/json": {"examples": self.answers}}}
        if self.model is None:
            out[200] = {"content": {"text/plain": {"schema": {"type": "string"}}},
                        "description": "Prometheus text exposition format"}
        return out

    def response_class(self):
        from fastapi.responses import JSONResponse, PlainTextResponse

        return PlainTextResponse if self.model is None else JSONResponse


TAGS = [{"name": "questions", "description": "What the model answers: RTT distributions, completions, "
                                             "destinations at an RTT, scores"},
        {"name": "service", "description": "Readiness, identity, the run's metadata, Prometheus metrics"}]
_BODY = (400, 401, 413, 422, 500, 503)
ROUTES = [
    Route("/health", "GET", health, R.Health, "Readiness: warming (503) until the batch shapes are compiled, then ready",
          "health", "service", (503,), X.HEALTH_ANSWERS),
    Route("/healthz", "GET", health, R.Health, "The same as /health (kept for existing probes)", "healthz", "service",
          (503,), X.HEALTH_ANSWERS),
    Route("/version", "GET", version, R.Version, "The pingctl version and the run serving", "version", "service",
          (401,), X.VERSION_ANSWERS),
    Route("/metadata", "GET", metadata, R.Metadata, "The run: step, preset, scheme, seq_len, times, eval headline",
          "metadata", "service", (401, 500), X.METADATA_ANSWERS),
    Route("/metrics", "GET", metrics, None, "Prometheus metrics: requests, latency, batch sizes, queue depth",
          "metrics", "service", (401,)),
    Route("/rtt", "POST", rtt, R.RttAnswer, "RTT distribution of one pair or many (pingctl sample --src/--dst, --pairs)",
          "rtt", "questions", _BODY, X.RTT_ANSWERS),
    Route("/complete", "POST", complete, R.CompleteAnswer,
          "Most probable completions of partial addresses (pingctl sample --src 8.8.*.*)", "complete", "questions",
          _BODY, X.COMPLETE_ANSWERS),
    Route("/search", "POST", search, R.SearchAnswer,
          "Destinations a source reaches at an RTT (pingctl sample --src IP --rtt 10-30)", "search", "questions",
          _BODY, X.SEARCH_ANSWERS),
    Route("/score", "POST", score, R.ScoreAnswer, "Scores of measurements under the model (pingctl score)", "score",
          "questions", _BODY, X.SCORE_ANSWERS),
]
