"""The FastAPI application of `pingctl serve` (docs/serve.md): `create_app(model, ...)`.

Endpoints: POST /rtt (one pair or many), /complete, /search, /score; GET /healthz, /metadata;
FastAPI's own /docs and /openapi.json. Every model call goes through one `Batcher` (one
worker thread; concurrent /rtt questions share forward passes); the event loop validates,
queues and awaits. Prompts are built in the request's thread (NumPy only).

Errors are JSON, `{"error": {"kind", "message"}}`: a body that fails its checks is 422 naming
the field (`pairs[3].src: ...`, with FastAPI's `detail` list beside it), a question the run
cannot answer 422 (`UsageError`) or 400 (`PingctlError`), a body past its bound 413, a full
queue 503, anything else 500 — and the next request is
answered as if nothing happened: no exception leaves a request.
"""

import asyncio
import contextlib
import functools
import json
import logging
import time

from pingctl import __version__
from pingctl.errors import PingctlError, UsageError
from pingctl.serve import answers as A
from pingctl.serve import schemas as S
from pingctl.serve.batcher import Batcher, Overloaded

log = logging.getLogger("pingctl.serve")

DESCRIPTION = """A trained pingctl run, answering over HTTP JSON: the RTT distribution of a pair
(or of many), completions of partial addresses, destinations at an RTT, scores of measurements.
The answers are those `pingctl sample` prints; docs/serve.md is the manual."""


async def _send_json(send, status: int, content: dict, headers: list | None = None) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _error(kind: str, message: str, **extra) -> dict:
    return {"error": {"kind": kind, "message": message}, **extra}


class _Guard:
    """Around the whole application: refuses a body past `max_body_bytes` (by its
    Content-Length at once, or while it streams in), turns an exception no handler took into a
    500 JSON error instead of a dropped connection, and logs one line per request."""

    def __init__(self, app, max_body_bytes: int, log_requests: bool):
        self.app, self.max_body_bytes, self.log_requests = app, max_body_bytes, log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        state = {"status": None, "seen": 0, "note": ""}
        too_large = _error("too_large", f"the request body is larger than {self.max_body_bytes:,} bytes "
                                        "(the service's bound: ask for fewer pairs or context rows per request)")

        async def sending(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            await send(message)

        async def receiving():
            message = await receive()
            if message["type"] == "http.request":
                state["seen"] += len(message.get("body", b""))
                if state["seen"] > self.max_body_bytes:
                    # an HTTPException passes through FastAPI's body parsing to the 413 handler
                    from starlette.exceptions import HTTPException

                    raise HTTPException(413, too_large["error"]["message"])
            return message

        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                await _send_json(sending, 413, too_large)
            else:
                await self.app(scope, receiving, sending)
        except Exception as e:  # noqa: BLE001 - one request's failure never takes the service down
            state["note"] = f" {type(e).__name__}: {str(e)[:300]}"
            if state["status"] is None:
                await _send_json(sending, 500, _error("internal", f"{type(e).__name__}: {e}"))
        if self.log_requests:
            log.info("%s %s %s %.1f ms%s", scope.get("method"), scope.get("path"), state["status"],
                     1000 * (time.perf_counter() - t0), state["note"])


def _validation_errors(errors) -> list[dict]:
    """FastAPI's error list, JSON-safe and short: where, what, which kind (no echo of the input)."""
    out = []
    for e in errors:
        msg = str(e.get("msg", ""))
        out.append({"loc": list(e.get("loc", ())), "msg": msg.removeprefix("Value error, "), "type": e.get("type")})
    return out


def create_app(model, *, max_batch: int | None = None, max_wait_ms: float = 5.0, max_queued: int = S.MAX_QUEUED,
               max_body_bytes: int = S.MAX_BODY_BYTES, log_requests: bool = False, calibration=None):
    """The application answering with `model` (a `pingctl.api.Model` or the `LoadedModel` it
    holds). `calibration`: a loaded calibration map that /rtt's distributions are recalibrated
    with (default: the Model's own, if it was given one). `max_batch`: RTT questions per gathered batch (default: the model's batch);
    `max_wait_ms`: how long the worker waits for more once it has one; `max_queued`: questions
    waiting past which requests get 503; `log_requests`: one log line per request
    (logger `pingctl.serve`)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    if calibration is None:
        calibration = getattr(model, "calibration", None)
    model = getattr(model, "loaded", model)
    if max_wait_ms < 0 or max_body_bytes < 1:
        raise UsageError("max_wait_ms must be >= 0 and max_body_bytes >= 1")
    batcher = Batcher(max_batch or model.batch, max_wait_ms / 1000.0, max_queued)
    started = time.time()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(batcher.close)

    app = FastAPI(title="pingctl serve", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  # FastAPI exports OpenTelemetry data where a provider is configured: a service
                  # that answers questions about networks reports nothing anywhere
                  telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                             "auto_configure": False})
    app.state.model, app.state.batcher = model, batcher
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, log_requests=log_requests)

    # ------------------------------------------------------------------ errors

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        detail = _validation_errors(exc.errors())
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
        return JSONResponse(_error("usage", f"{A.field_name(first['loc'])}: {first['msg']}{more}", detail=detail),
                            status_code=422)

    @app.exception_handler(PingctlError)
    async def refused(request, exc):
        if isinstance(exc, A.FieldError):
            return JSONResponse(_error("usage", str(exc), detail=[{"loc": list(exc.loc), "msg": exc.msg,
                                                                   "type": exc.type}]), status_code=422)
        if isinstance(exc, Overloaded):
            return JSONResponse(_error(exc.kind, str(exc)), status_code=503, headers={"Retry-After": "1"})
        return JSONResponse(_error(exc.kind, str(exc)), status_code=422 if isinstance(exc, UsageError) else 400)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        kind = {413: "too_large", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        return JSONResponse(_error(kind, str(exc.detail), detail=exc.detail), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def on_worker(fn):
        """`fn()` on the model's worker thread, awaited."""
        return await asyncio.wrap_future(batcher.call(fn))

    # ------------------------------------------------------------------ endpoints

    @app.get("/healthz", summary="Liveness and the batcher's figures")
    async def healthz() -> dict:
        return {"status": "ok", "run": str(model.run), "step": model.step, "queued": batcher.queued,
                "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000, "batcher": dict(batcher.stats),
                "uptime_s": round(time.time() - started, 3)}

    @app.get("/metadata", summary="The run: step, preset, scheme, seq_len, times, eval headline")
    async def metadata() -> dict:
        out = await run_in_threadpool(A.metadata, model, started, calibration)
        return {**out, "serve": {"max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000,
                                 "bounds": {"pairs": S.MAX_PAIRS, "context_rows": S.MAX_CONTEXT_ROWS,
                                            "search_samples": S.MAX_SEARCH_SAMPLES, "score_rows": S.MAX_SCORE_ROWS,
                                            "body_bytes": max_body_bytes, "queued": batcher.max_queued}}}

    @app.post("/rtt", summary="RTT distribution of one pair or many (pingctl sample --src/--dst, --pairs)")
    async def rtt(body: S.RttRequest) -> dict:
        if missing := body.missing():
            raise RequestValidationError([{"loc": ("body", name), "msg": "Field required (give src and dst, or pairs)",
                                           "type": "missing"} for name in missing])
        questions = body.questions()
        A.check_times(model, questions, body.pairs is not None)
        cap = A.per_pair(model, body.context_per_pair)
        work = await run_in_threadpool(A.rtt_prompts, model, questions, body.context, cap)
        fn = functools.partial(A.rtt_answers, model, exact=body.exact, calibration=calibration)
        summaries = await asyncio.wrap_future(batcher.submit(("rtt", body.exact), fn, work.prompts))
        return A.rtt_response(model, body, work, summaries, cap, calibration)

    @app.post("/complete", summary="Most probable completions of partial addresses (pingctl sample --src 8.8.*.*)")
    async def complete(body: S.CompleteRequest) -> dict:
        q = A.complete_question(body)
        return await on_worker(functools.partial(A.ask, model, q, body.context))

    @app.post("/search", summary="Destinations a source reaches at an RTT (pingctl sample --src IP --rtt 10-30)")
    async def search(body: S.SearchRequest) -> dict:
        q = A.search_question(body)
        return await on_worker(functools.partial(A.ask, model, q, body.context))

    @app.post("/score", summary="Scores of measurements under the model (pingctl.infer.score.score_table)")
    async def score(body: S.ScoreRequest) -> dict:
        return await on_worker(functools.partial(A.score_rows, model, body))

    return app
