"""The FastAPI application of `pingctl serve` (docs/serve.md): `create_app(model, ...)`.

Routes (`routes.ROUTES`, module-level functions over one `routes.ServeState`): POST /rtt (one
pair or many), /complete, /search, /score; GET /health (and /healthz), /version, /metadata,
/metrics (Prometheus); /docs and /redoc with their files served locally (fastapi_offline: no
CDN), and /openapi.json, where every 200 and every error code is typed (`responses`), each
route tagged, named (operationId) and given examples (`examples`). Optional: an API key, CORS
origins, JSON access lines (`ops`).

Errors are JSON, `{"error": {"kind", "message"}}`: a body that fails its checks is 422 naming
the field (`context[3].prb_id: ...`, with FastAPI's `detail` list beside it), a body that is
not JSON (a syntax error, bytes that are not UTF-8, nesting past what the parser reads) 422
saying where (line, column) and what, a question the run cannot answer 422 (`UsageError`) or
400 (`PingctlError`), a body past its bound or a request past its work budget 413, a full
queue, a service still warming up or one stopping 503, anything else 500 — and the next
request is answered as if nothing happened: no exception leaves a request. One log line per
request and its metrics (`_Guard`, which also gives each answer its X-Request-ID and cuts a
request still running at the drain's deadline: 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from pingctl import __version__
from pingctl.api import Model
from pingctl.errors import PingctlError, UsageError
from pingctl.serve import answers as A
from pingctl.serve import ops
from pingctl.serve import routes as RT
from pingctl.serve import schemas as S
from pingctl.serve import warmup as W
from pingctl.serve.responses import errors
from pingctl.serve.batcher import Batcher, Overloaded, ShuttingDown
from pingctl.serve.ops import Metrics
from pingctl.serve.server import Drain

log = logging.getLogger("pingctl.serve")

DESCRIPTION = """A trained pingctl run, answering over HTTP JSON: the RTT distribution of a pair
(or of many), completions of partial addresses, destinations at an RTT, scores of measurements.
The answers are those `pingctl sample` prints; docs/serve.md is the manual. Every error is
`{"error": {"kind", "message"}}`."""

BODY_KEY = "pingctl.body"  # where _Guard keeps the bytes of a body, for a JSON error's line and column
# At shutdown, after the drain: the worker's current batch (a second or two) may finish; a longer
# job is left to end with the process rather than keep a stopped service waiting.
CLOSE_WAIT_S = 2.0


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
    Content-Length at once, or while it streams in), keeps the body's bytes for a JSON error's
    position, answers 503 for a request the drain cuts, turns an exception no handler took into
    a 500 JSON error instead of a dropped connection, and logs one line per request."""

    def __init__(self, app, max_body_bytes: int, access_log: str | None, drain: Drain, metrics: Metrics | None = None):
        self.app, self.max_body_bytes, self.access_log, self.drain = app, max_body_bytes, access_log, drain
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        state = {"status": None, "seen": 0, "note": ""}
        chunks: list[bytes] = []
        scope[BODY_KEY] = chunks
        rid = ops.request_id(dict(scope.get("headers") or []))
        too_large = _error("too_large", f"the request body is larger than {self.max_body_bytes:,} bytes "
                                        "(the service's bound: ask for fewer pairs or context rows per request)")

        async def sending(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        async def receiving():
            message = await receive()
            if message["type"] == "http.request":
                part = message.get("body", b"")
                state["seen"] += len(part)
                if state["seen"] > self.max_body_bytes:
                    # an HTTPException passes through FastAPI's body parsing to the 413 handler
                    from starlette.exceptions import HTTPException

                    raise HTTPException(413, too_large["error"]["message"])
                chunks.append(part)
            elif message["type"] == "http.disconnect":
                state["note"] = " (the client went away)"
            return message

        declared = dict(scope.get("headers") or []).get(b"content-length")
        cut = None
        try:
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                await _send_json(sending, 413, too_large)
            else:
                async with self.drain.cutting() as cut:
                    await self.app(scope, receiving, sending)
        except Exception as e:  # noqa: BLE001 - one request's failure never takes the service down
            state["note"] = await _failed(sending, e, cut is not None and cut.expired(), state["status"] is None)
        seconds = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.observe(scope, state["status"], seconds)
        if self.access_log == "json":
            log.info("access", extra={"access": ops.access_record(scope, state["status"], seconds, rid, state["note"])})
        elif self.access_log == "text":
            log.info("%s %s %s %.1f ms [%s]%s", scope.get("method"), scope.get("path"), state["status"],
                     1000 * seconds, rid, state["note"])


async def _failed(send, e: Exception, cut: bool, unanswered: bool) -> str:
    """Answer a request that raised `e` (if nothing was sent yet): 503 shutting_down where the
    drain cut it, else 500 internal. Its note for the log line."""
    if cut:
        if unanswered:
            message = ("the service is shutting down and this request did not finish within its drain deadline; "
                       "retry on another instance or after the restart")
            await _send_json(send, 503, _error("shutting_down", message), [(b"connection", b"close")])
        return " (cut by the shutdown's deadline)"
    if unanswered:
        await _send_json(send, 500, _error("internal", f"{type(e).__name__}: {e}"))
    return f" {type(e).__name__}: {str(e)[:300]}"


# ------------------------------------------------------------------ errors


def _validation_errors(errors) -> list[dict]:
    """FastAPI's error list, JSON-safe and short: where, what, which kind (no echo of the input)."""
    out = []
    for e in errors:
        msg = str(e.get("msg", ""))
        out.append({"loc": list(e.get("loc", ())), "msg": msg.removeprefix("Value error, "), "type": e.get("type")})
    return out


def _json_error(body: bytes) -> dict | None:
    """Where and what is wrong with a body that is not JSON: {loc, msg, type[, line, column]}
    (None if it parses)."""
    try:
        json.loads(body)
    except json.JSONDecodeError as e:
        return {"loc": ["body"], "msg": f"not valid JSON at line {e.lineno}, column {e.colno} (byte {e.pos}): {e.msg}",
                "type": "json_invalid", "line": e.lineno, "column": e.colno}
    except UnicodeDecodeError as e:
        line = body.count(b"\n", 0, e.start) + 1
        column = e.start - body.rfind(b"\n", 0, e.start)  # 1-based, in bytes
        return {"loc": ["body"], "msg": f"not UTF-8 text at line {line}, column {column} (byte {e.start}): {e.reason}",
                "type": "json_invalid", "line": line, "column": column}
    except RecursionError:
        return {"loc": ["body"], "msg": "not valid JSON for this service: nested deeper than its JSON parser reads",
                "type": "json_invalid"}
    except ValueError as e:
        return {"loc": ["body"], "msg": f"not valid JSON: {e}", "type": "json_invalid"}
    return None


def _not_json(request):
    """422 usage for a body that is not JSON, saying where and what."""
    found = _json_error(b"".join(request.scope.get(BODY_KEY) or []))
    return _usage([found or {"loc": ["body"], "msg": "not valid JSON", "type": "json_invalid"}])


def _usage(detail: list[dict]):
    from fastapi.responses import JSONResponse

    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
    return JSONResponse(_error("usage", f"{A.field_name(first['loc'])}: {first['msg']}{more}", detail=detail),
                        status_code=422)


async def on_invalid(request, exc):
    detail = _validation_errors(exc.errors())
    if any(d["type"] == "json_invalid" for d in detail):
        return _not_json(request)
    return _usage(detail)


async def on_refused(request, exc):
    from fastapi.responses import JSONResponse

    if isinstance(exc, A.FieldError):
        return JSONResponse(_error("usage", str(exc), detail=[{"loc": list(exc.loc), "msg": exc.msg,
                                                               "type": exc.type}]), status_code=422)
    if isinstance(exc, (Overloaded, RT.Warming)):
        return JSONResponse(_error(exc.kind, str(exc)), status_code=503, headers={"Retry-After": "1"})
    if isinstance(exc, ShuttingDown):
        return JSONResponse(_error(exc.kind, str(exc)), status_code=503, headers={"Connection": "close"})
    if isinstance(exc, S.OverBudget):
        return JSONResponse(_error(exc.kind, str(exc)), status_code=413)
    return JSONResponse(_error(exc.kind, str(exc)), status_code=422 if isinstance(exc, UsageError) else 400)


async def on_http_error(request, exc):
    from fastapi.responses import JSONResponse

    if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
        # FastAPI's "There was an error parsing the body" for what its JSON step does not call a
        # JSONDecodeError (bytes that are not UTF-8, nesting past the parser's depth): a body
        # that is not JSON, answered as every such body is
        return _not_json(request)
    kind = {413: "too_large", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return JSONResponse(_error(kind, str(exc.detail), detail=exc.detail), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


# ------------------------------------------------------------------ the application


def _warm_up(st: RT.ServeState, forward_batch: int) -> None:
    """On the worker thread, before any request's job: the warm-up, then ready (or failed:
    answering anyway, the first requests paying the compilations)."""
    try:
        done = W.warm(st.model, st.batcher.max_batch, st.meta["seq_len"], forward_batch, log=log.info)
        st.warmup.update(done, status="ready")
        log.info("ready: warm-up of %d calls in %.1f s", done["calls"], done["seconds"])
    except Exception as e:  # noqa: BLE001 - a failed warm-up is reported by /health, not fatal
        st.warmup.update(status="failed", error=f"{type(e).__name__}: {str(e)[:300]}")
        log.warning("warm-up failed (%s: %s); answering anyway", type(e).__name__, e)


def create_app(model, *, max_batch: int | None = None, max_wait_ms: float | None = None, max_queued: int = S.MAX_QUEUED,
               max_body_bytes: int = S.MAX_BODY_BYTES, log_requests: bool = False, calibration=None,
               warmup: bool = True, access_log: str | None = None, api_key: str | None = None,
               cors_origins: list[str] | tuple = ()):
    """The application answering with `model` (a `pingctl.api.Model`, or the `LoadedModel` one
    holds). `calibration`: a loaded calibration map /rtt's distributions are recalibrated with
    (default: the Model's own). `max_batch`: RTT questions per gathered batch (default: the
    model's forward batch); `max_wait_ms`: how long the worker waits for more once it has one
    (None: by the traffic, 2-150 ms, `batcher.Batcher.wait_s`); `max_queued`: questions waiting
    past which requests get 503; `access_log`: one log line per request (logger
    `pingctl.serve`), "text" or "json" (an access record in `extra`, for `ops.JsonLines`);
    `log_requests`: the same as access_log "text"; `warmup`: compile the batch shapes before
    /health says ready (False: ready at once, the first requests pay the compilations);
    `api_key`: every route but the probes and the docs needs it (`ops.KeyCheck`);
    `cors_origins`: the browser origins allowed to call it."""
    from fastapi.exceptions import RequestValidationError
    from fastapi_offline import FastAPIOffline
    from starlette.exceptions import HTTPException

    if not isinstance(model, Model):
        model = Model(model, calibration)
    elif calibration is not None:
        model = Model(model.loaded, calibration)
    if (max_wait_ms is not None and max_wait_ms < 0) or max_body_bytes < 1:
        raise UsageError("max_wait_ms must be >= 0 (or None: automatic) and max_body_bytes >= 1")
    access_log = access_log or ("text" if log_requests else None)
    if access_log not in (None, "text", "json"):
        raise UsageError(f"access_log {access_log!r}: text, json or None")
    # the forward batch is not part of Model's metadata: the loaded model's, where it says
    forward_batch = int(getattr(model.loaded, "batch", 32))
    batcher = Batcher(max_batch or forward_batch, None if max_wait_ms is None else max_wait_ms / 1000.0, max_queued)
    st = RT.ServeState(model, batcher, model.metadata(), max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if warmup:
            batcher.call(lambda: _warm_up(st, forward_batch))  # the worker's first job
        else:
            st.warmup.update(status="ready", calls=0, seconds=0.0)
        yield
        await asyncio.to_thread(batcher.close, CLOSE_WAIT_S)
        if batcher.busy:
            log.info("stopped with the model's worker still in a job (left to end with the process)")

    # FastAPIOffline: /docs and /redoc load Swagger UI's and ReDoc's files from the installed
    # package, not a CDN, so the page works on a network without internet access
    app = FastAPIOffline(title="pingctl serve", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                         openapi_tags=RT.TAGS,
                         # FastAPI exports OpenTelemetry data where a provider is configured: a service
                         # that answers questions about networks reports nothing anywhere
                         telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                                    "auto_configure": False})
    # the server stops by it (`server.Drain`): the requests it cut are answered 503 by _Guard
    app.state.serve, app.state.model, app.state.batcher, app.state.drain = st, model, batcher, Drain()
    app.state.metrics = Metrics(batcher)
    # the last added runs first: _Guard (bounds, logs and counts everything, 401s included),
    # then CORS (its headers on every answer, preflights answered without the key), then the key
    if api_key:
        app.add_middleware(ops.KeyCheck, key=api_key, send_json=_send_json)
        ops.secure_openapi(app)
    if cors_origins:
        ops.add_cors(app, list(cors_origins))
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, access_log=access_log, drain=app.state.drain,
                       metrics=app.state.metrics)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(PingctlError, on_refused)
    app.add_exception_handler(HTTPException, on_http_error)
    for r in RT.ROUTES:
        app.add_api_route(r.path, r.fn, methods=[r.method], response_model=r.model, summary=r.summary,
                          operation_id=r.operation_id, tags=[r.tag], responses=r.responses(),
                          response_class=r.response_class(), include_in_schema=True)
    return app
