"""Running the application: a bound socket, uvicorn in the foreground (`pingctl serve`) or in
a thread (`pingctl bench serve`, the tests), under connection limits.

The socket is bound before the model loads, so an address in use is a one-line error at
once, not after half a minute of loading; port 0 picks a free port (`ServerThread.port`).

uvicorn (h11) bounds a request head's size and an idle keep-alive connection's life, but not
the time a head or a body takes to arrive: a client that sends part of its headers and then
nothing held its connection for ever, and 200 such clients held 200 connections. `Limits`
adds those two deadlines (a protocol subclass of uvicorn's h11 one) and caps the connections;
docs/serve.md lists every figure.

Stopping (SIGTERM, Ctrl-C): uvicorn stops taking connections and waits for the requests in
flight; `Drain` gives that wait a deadline (`Limits.drain_s`): a request still running then is
answered 503 `shutting_down` (the JSON error shape) by the application, and the process exits
0; a second signal makes the deadline now. uvicorn's own cancellation (a plain-text 500 and a
CancelledError traceback) comes only `DRAIN_GRACE_S` later, for an application that does not
watch the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from pingctl.errors import PingctlError, UsageError

START_TIMEOUT_S = 60.0  # uvicorn's start-up (the lifespan, the listening socket): seconds here
# after the drain's deadline, for the 503s of the requests it cut to be written before uvicorn
# cancels whatever is left
DRAIN_GRACE_S = 2.0
logger = logging.getLogger("pingctl.serve")


@dataclass(frozen=True)
class Limits:
    """What one client may hold (docs/serve.md, "Limits")."""

    # a request head (request line and headers) completes within this many seconds of the
    # connection opening, or of the previous response on a keep-alive connection
    header_timeout_s: float = 10.0
    # a request body, once its head is in, arrives within this many seconds
    body_timeout_s: float = 30.0
    # an idle keep-alive connection is closed after this many seconds (uvicorn's timeout_keep_alive)
    keep_alive_s: int = 5
    # open connections; one past it is closed at once, and a request while this many
    # connections or requests are open is answered 503 (uvicorn's limit_concurrency)
    max_connections: int = 256
    # bytes of a request head (h11_max_incomplete_event_size); a larger one is a 400
    max_header_bytes: int = 16 * 1024
    # on SIGTERM or Ctrl-C, requests in flight are answered for this many seconds; those still
    # running then get 503 shutting_down, and the process exits
    drain_s: float = 10.0


class Drain:
    """The deadline of a stopping service: `begin(seconds)` when the server stops taking
    connections; every request running inside `cutting()` is cut (its `asyncio.timeout`
    expires) `seconds` later, and so is one that starts after `begin`."""

    def __init__(self):
        self.deadline: float | None = None  # the event loop's time
        self._running: set = set()
        self._loop = None
        self._now = False

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def begin(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + (0.0 if self._now else max(0.0, seconds))
        for timeout in list(self._running):
            timeout.reschedule(self.deadline)

    def now(self) -> None:
        """The deadline is now (a second signal); safe from a signal handler or another thread."""
        self._now = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.begin, 0.0)

    @contextlib.asynccontextmanager
    async def cutting(self):
        """`async with drain.cutting() as cut:` ... the body raises TimeoutError (and
        `cut.expired()` is true) when the drain's deadline passes."""
        async with asyncio.timeout(self.deadline) as cut:
            self._running.add(cut)
            try:
                yield cut
            finally:
                self._running.discard(cut)


def _protocol(limits: Limits):
    """uvicorn's h11 protocol with a deadline on each request head and body."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Bounded(H11Protocol):
        _deadline = None
        _waiting_for: str | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                logger.warning("closed a connection: %d open (bound %d)", len(self.connections), limits.max_connections)
                self.transport.close()
                return
            self._watch()

        def connection_lost(self, exc) -> None:
            self._arm(None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def _watch(self) -> None:
            """Arm the deadline of what the connection waits for from the client: a head
            (h11 IDLE), a body (SEND_BODY); none while the application answers. An armed
            deadline is not moved by more bytes of the same head or body."""
            state = self.conn.their_state
            want = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
            if want != self._waiting_for:
                self._arm(want)

        def _arm(self, want: str | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._waiting_for = None, want
            if want is not None:
                seconds = limits.header_timeout_s if want == "head" else limits.body_timeout_s
                self._deadline = self.loop.call_later(seconds, self._expired, want, seconds)

        def _expired(self, want: str, seconds: float) -> None:
            self._deadline = None
            if self.transport is not None and not self.transport.is_closing():
                if want == "body" or self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
                    logger.info("closed a connection: its request %s did not arrive within %g s", want, seconds)
                self.transport.close()

    return Bounded


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); a PingctlError naming both when that fails."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 0 (any free one) to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host {host!r}: not an address this machine can listen on ({e})") from None
    fam, kind, proto, _, addr = infos[0]
    sock = socket.socket(fam, kind, proto)
    try:
        # a restarted service may listen again at once beside the previous one's TIME_WAIT connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(256)
    except OSError as e:
        sock.close()
        raise PingctlError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port "
                           "(0: any free one) or stop what listens there") from None
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app, log: bool, limits: Limits):
    """uvicorn's server for `app`, stopping by its `Drain` (`app.state.drain`, where it has one)."""
    import uvicorn

    drain = getattr(getattr(app, "state", None), "drain", None)

    class Draining(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            if drain is not None:
                drain.begin(limits.drain_s)
            logger.info("stopping: requests in flight have %g s to finish", limits.drain_s)
            await super().shutdown(sockets)

        def handle_exit(self, sig, frame) -> None:
            if self.should_exit and drain is not None:
                # a second signal cuts the requests in flight now (503): uvicorn's own force-quit
                # cancelled them into plain-text 500s and CancelledError tracebacks
                drain.now()
                return
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own capture re-raises the signal once it has shut down, so a drained service
            # then died by SIGTERM; stopping on a signal is the service's normal end (exit 0)
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    # access_log off: the application logs its own one line per request (create_app(log_requests=))
    config = uvicorn.Config(app, log_level="info" if log else "warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=limits.drain_s + DRAIN_GRACE_S, http=_protocol(limits),
                            timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.max_connections,
                            h11_max_incomplete_event_size=limits.max_header_bytes)
    return Draining(config)


def serve_forever(app, sock: socket.socket, log: bool = True, limits: Limits = Limits()) -> None:
    """uvicorn on `sock` until Ctrl-C or SIGTERM: then requests in flight have `limits.drain_s`
    seconds to finish (503 shutting_down past it), and it returns."""
    _server(app, log, limits).run(sockets=[sock])


def leave(app) -> None:
    """After a foreground `serve_forever` returned: a process whose model worker is still in a
    model call (a job that outlasted the close's wait, a large /score) exits here, 0, its output
    flushed. Python's own exit would tear that thread down mid-call, and XLA then aborts the
    process (SIGABRT, "FATAL: exception not rethrown")."""
    batcher = getattr(getattr(app, "state", None), "batcher", None)
    if batcher is not None and batcher.busy:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class ServerThread:
    """`with ServerThread(app) as s: ... s.url ...`: the application served on 127.0.0.1 (a
    free port unless one is given) in a daemon thread, stopped and joined on exit."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log: bool = False, limits: Limits = Limits()):
        self.app, self.host, self.port_asked, self.log, self.limits = app, host, port, log, limits
        self.sock = self.server = self.thread = None
        self.port = None

    @property
    def url(self) -> str:
        return url(self.sock)

    def __enter__(self) -> ServerThread:
        self.sock = bind(self.host, self.port_asked)
        self.port = self.sock.getsockname()[1]
        self.server = _server(self.app, self.log, self.limits)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="pingctl-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise PingctlError(f"the service on {self.host}:{self.port} did not start within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        return self

    def wait_ready(self, timeout: float = 600.0) -> dict:
        """Poll GET /health until it says ready (or failed); its answer."""
        import http.client
        import json

        deadline = time.monotonic() + timeout
        while True:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                conn.request("GET", "/health")
                health = json.loads(conn.getresponse().read())
            finally:
                conn.close()
            if health.get("status") != "warming":
                return health
            if time.monotonic() > deadline:
                raise PingctlError(f"the service on {self.host}:{self.port} was still warming up after {timeout:.0f} s")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
        if self.sock is not None:
            self.sock.close()
