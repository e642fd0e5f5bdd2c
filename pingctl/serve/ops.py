"""What an operator of `pingctl serve` needs beside the answers (docs/serve.md, "Operating"):
Prometheus metrics (`Metrics`, GET /metrics), the optional API key (`KeyCheck`), CORS origins
(`check_origins`), request ids and the JSON access log (`request_id`, `access_record`,
`JsonLines`).

prometheus_client is imported inside `Metrics`: the CLI imports this module's users lazily,
and each application keeps a registry of its own, so two services in one process (the tests,
`bench serve`) never count into each other's figures.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid

from pingctl.errors import UsageError

# Paths answered without the API key: the probes an orchestrator sends without credentials and
# the documentation (the page itself carries no data; its Authorize button takes the key).
OPEN_PATHS = frozenset({"/health", "/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
DOCS_ASSETS = "/static-offline-docs"  # where fastapi_offline mounts Swagger UI's and ReDoc's files
# Latency buckets, seconds: a one-pair answer takes milliseconds, a 1,024-pair one tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# A client's X-Request-ID is kept when it is a plain token (it lands in logs); otherwise one is made.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_ORIGIN = re.compile(r"^https?://[^/\s?#]+$")


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(DOCS_ASSETS + "/")


def request_id(headers: dict) -> str:
    """The client's X-Request-ID where it is a plain token, else a fresh one."""
    given = headers.get(b"x-request-id", b"").decode("latin-1")
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex


def route_label(scope) -> str:
    """The route's path template (a bounded set of labels), or "other" for a path no route has:
    a scanner's thousand made-up paths are one series, not a thousand."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if path is None:
        return DOCS_ASSETS if scope.get("path", "").startswith(DOCS_ASSETS + "/") else "other"
    return path


class Metrics:
    """One application's Prometheus figures: requests by route, method and status; their
    latency; the sizes of the model's RTT batches; the questions waiting for the model."""

    def __init__(self, batcher):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("pingctl_serve_requests", "HTTP requests answered, by route, method and status",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("pingctl_serve_request_duration_seconds",
                                 "Time from a request's arrival to its answer, by route", ["route", "method"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch = Histogram("pingctl_serve_batch_size", "Items (RTT prompts) per model call of the worker",
                               buckets=BATCH_BUCKETS, registry=self.registry)
        queued = Gauge("pingctl_serve_queue_depth", "RTT questions waiting for the model's worker",
                       registry=self.registry)
        queued.set_function(lambda: batcher.queued)
        busy = Gauge("pingctl_serve_worker_busy", "1 while the model's worker is in a job", registry=self.registry)
        busy.set_function(lambda: float(batcher.busy))
        batcher.on_batch = self.batch.observe

    def observe(self, scope, status: int | None, seconds: float) -> None:
        route, method = route_label(scope), scope.get("method", "")
        self.requests.labels(route, method, str(status or 0)).inc()
        self.latency.labels(route, method).observe(seconds)

    def text(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# ------------------------------------------------------------------ the API key


def read_key(variable: str, environ) -> str:
    """The API key from the environment variable named `variable` (never from the command line,
    where `ps` shows it); a UsageError naming the variable, never its value."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable or ""):
        raise UsageError(f"--api-key-env {variable!r}: the name of an environment variable (letters, digits, _)")
    key = environ.get(variable, "")
    if not key.strip():
        raise UsageError(f"--api-key-env {variable}: that environment variable is not set or empty; "
                         f"export {variable}=... (the key) before starting the service")
    if key != key.strip() or not key.isprintable():
        raise UsageError(f"--api-key-env {variable}: the key holds blanks or control characters at its ends "
                         "or inside; a header cannot carry it")
    return key


def presented_key(headers: dict) -> bytes | None:
    """The key a request carries: `Authorization: Bearer KEY` or `X-API-Key: KEY`."""
    auth = headers.get(b"authorization", b"")
    if auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    return headers.get(b"x-api-key")


class KeyCheck:
    """ASGI middleware: every request outside `OPEN_PATHS` (and CORS preflights, which carry no
    credentials by the browser's rules) presents the key, or is answered 401 in the service's
    error shape. Compared in constant time."""

    def __init__(self, app, key: str, send_json):
        self.app, self.key, self.send_json = app, key.encode(), send_json

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or is_open(scope.get("path", "")) or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        got = presented_key(dict(scope.get("headers") or []))
        if got is not None and hmac.compare_digest(got, self.key):
            return await self.app(scope, receive, send)
        why = "no API key was presented" if got is None else "the API key presented is not this service's"
        message = f"{why}: send `Authorization: Bearer KEY` or `X-API-Key: KEY`"
        await self.send_json(send, 401, {"error": {"kind": "unauthorized", "message": message}},
                             [(b"www-authenticate", b'Bearer realm="pingctl serve"')])


def secure_openapi(app) -> None:
    """/openapi.json names the key's two headers, so Swagger UI's Authorize button sends it on
    the routes that need it."""
    make = app.openapi

    def openapi():
        if app.openapi_schema is None:
            spec = make()
            spec.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}
            for path, ops in spec.get("paths", {}).items():
                for op in ops.values():
                    if not is_open(path):
                        op["security"] = [{"bearer": []}, {"apiKey": []}]
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi


# ------------------------------------------------------------------ CORS


def check_origins(origins: list[str]) -> list[str]:
    """`--cors-origin` values: "*" or scheme://host[:port], no path; a UsageError naming a bad one."""
    out = []
    for o in origins:
        o = o.strip().rstrip("/")
        if o != "*" and not _ORIGIN.match(o):
            raise UsageError(f"--cors-origin {o!r}: an origin is * or scheme://host[:port] "
                             "(e.g. https://dash.example.org), without a path")
        out.append(o)
    return out


def add_cors(app, origins: list[str]) -> None:
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=check_origins(origins), allow_methods=["GET", "POST"],
                       allow_headers=["Authorization", "Content-Type", "X-API-Key", "X-Request-ID"],
                       expose_headers=["X-Request-ID", "Retry-After"], max_age=600)


# ------------------------------------------------------------------ the access log


def access_record(scope, status: int | None, seconds: float, rid: str, note: str) -> dict:
    """One request as the JSON access log writes it: no header (so never the API key), the path
    without its query string."""
    client = scope.get("client")
    out = {"method": scope.get("method"), "path": scope.get("path"), "status": status,
           "duration_ms": round(1000 * seconds, 3), "request_id": rid,
           "client": f"{client[0]}:{client[1]}" if client else None}
    if note:
        out["note"] = note.strip(" ()")
    return out


class JsonLines(logging.Formatter):
    """One JSON object per log line: an access record (`extra={"access": {...}}`) with its time
    and kind, or any other message of the service as {time, level, message}."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        access = getattr(record, "access", None)
        if access is not None:
            return json.dumps({"time": stamp, "kind": "access", **access})
        return json.dumps({"time": stamp, "kind": "log", "level": record.levelname.lower(),
                           "message": record.getMessage()})
