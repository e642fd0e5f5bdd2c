"""The FastAPI application of `pingctl serve` (docs/serve.md): `create_app(model, ...)`.

Routes (`routes.ROUTES`, module-level functions over one `routes.ServeState`): POST /rtt (one
pair or many), /complete, /search, /score; GET /health (and /healthz), /version, /metadata;
FastAPI's own /docs and /openapi.json, where every 200 and every error code is typed
(`responses`).

Errors are JSON, `{"error": {"kind", "message"}}`: a body that fails its checks is 422 naming
the field (`context[3].prb_id: ...`, with FastAPI's `detail` list beside it), a body that is
not JSON 422 saying where (line, column) and what, a question the run cannot answer 422
(`UsageError`) or 400 (`PingctlError`), a body past its bound 413, a full queue or a service
still warming up 503, anything else 500 — and the next request is answered as if nothing
happened: no exception leaves a request. One log line per request (`_Guard`).
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
from pingctl.serve import routes as RT
from pingctl.serve import schemas as S
from pingctl.serve import warmup as W
from pingctl.serve.responses import errors
from pingctl.serve.batcher import Batcher, Overloaded

log = logging.getLogger("pingctl.serve")

DESCRIPTION = """A trained pingctl run, answering over HTTP JSON: the RTT distribution of a pair
(or of many), completions of partial addresses, destinations at an RTT, scores of measurements.
The answers are those `pingctl sample` prints; docs/serve.md is the manual. Every error is
`{"error": {"kind", "message"}}`."""

BODY_KEY = "pingctl.body"  # where _Guard keeps the bytes of a body, for a JSON error's line and column


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
    position, turns an exception no handler took into a 500 JSON error instead of a dropped
    connection, and logs one line per request."""

    def __init__(self, app, max_body_bytes: int, log_requests: bool):
        self.app, self.max_body_bytes, self.log_requests = app, max_body_bytes, log_requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        state = {"status": None, "seen": 0, "note": ""}
        chunks: list[bytes] = []
        scope[BODY_KEY] = chunks
        too_large = _error("too_large", f"the request body is larger than {self.max_body_bytes:,} bytes "
                                        "(the service's bound: ask for fewer pairs or context rows per request)")

        async def sending(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
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


# ------------------------------------------------------------------ errors


def _validation_errors(errors) -> list[dict]:
    """FastAPI's error list, JSON-safe and short: where, what, which kind (no echo of the input)."""
    out = []
    for e in errors:
        msg = str(e.get("msg", ""))
        out.append({"loc": list(e.get("loc", ())), "msg": msg.removeprefix("Value error, "), "type": e.get("type")})
    return out


def _json_error(body: bytes) -> dict | None:
    """Where and what is wrong with a body that is not JSON: {loc, msg, type} (None if it parses)."""
    try:
        json.loads(body)
    except json.JSONDecodeError as e:
        return {"loc": ["body"], "msg": f"not valid JSON at line {e.lineno}, column {e.colno} (byte {e.pos}): {e.msg}",
                "type": "json_invalid", "line": e.lineno, "column": e.colno}
    except UnicodeDecodeError as e:
        return {"loc": ["body"], "msg": f"not UTF-8 text at byte {e.start}: {e.reason}", "type": "json_invalid"}
    except ValueError as e:
        return {"loc": ["body"], "msg": f"not valid JSON: {e}", "type": "json_invalid"}
    return None


async def on_invalid(request, exc):
    from fastapi.responses import JSONResponse

    detail = _validation_errors(exc.errors())
    if any(d["type"] == "json_invalid" for d in detail):
        found = _json_error(b"".join(request.scope.get(BODY_KEY) or []))
        detail = [found or {"loc": ["body"], "msg": "not valid JSON", "type": "json_invalid"}]
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
    return JSONResponse(_error("usage", f"{A.field_name(first['loc'])}: {first['msg']}{more}", detail=detail),
                        status_code=422)


async def on_refused(request, exc):
    from fastapi.responses import JSONResponse

    if isinstance(exc, A.FieldError):
        return JSONResponse(_error("usage", str(exc), detail=[{"loc": list(exc.loc), "msg": exc.msg,
                                                               "type": exc.type}]), status_code=422)
    if isinstance(exc, (Overloaded, RT.Warming)):
        return JSONResponse(_error(exc.kind, str(exc)), status_code=503, headers={"Retry-After": "1"})
    return JSONResponse(_error(exc.kind, str(exc)), status_code=422 if isinstance(exc, UsageError) else 400)


async def on_http_error(request, exc):
    from fastapi.responses import JSONResponse

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
               warmup: bool = True):
    """The application answering with `model` (a `pingctl.api.Model`, or the `LoadedModel` one
    holds). `calibration`: a loaded calibration map /rtt's distributions are recalibrated with
    (default: the Model's own). `max_batch`: RTT questions per gathered batch (default: the
    model's forward batch); `max_wait_ms`: how long the worker waits for more once it has one
    (None: by the traffic, 2-150 ms, `batcher.Batcher.wait_s`); `max_queued`: questions waiting
    past which requests get 503; `log_requests`: one log line per request (logger
    `pingctl.serve`); `warmup`: compile the batch shapes before /health says ready (False: ready at once, the first requests pay the compilations)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    if not isinstance(model, Model):
        model = Model(model, calibration)
    elif calibration is not None:
        model = Model(model.loaded, calibration)
    if (max_wait_ms is not None and max_wait_ms < 0) or max_body_bytes < 1:
        raise UsageError("max_wait_ms must be >= 0 (or None: automatic) and max_body_bytes >= 1")
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
        await asyncio.to_thread(batcher.close)

    app = FastAPI(title="pingctl serve", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  # FastAPI exports OpenTelemetry data where a provider is configured: a service
                  # that answers questions about networks reports nothing anywhere
                  telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                             "auto_configure": False})
    app.state.serve, app.state.model, app.state.batcher = st, model, batcher
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, log_requests=log_requests)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(PingctlError, on_refused)
    app.add_exception_handler(HTTPException, on_http_error)
    for path, method, fn, model_type, summary, codes in RT.ROUTES:
        app.add_api_route(path, fn, methods=[method], response_model=model_type, summary=summary,
                          responses=errors(*codes))
    return app
