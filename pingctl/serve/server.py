"""Running the application: a bound socket, uvicorn in the foreground (`pingctl serve`) or in
a thread (`pingctl bench serve`, the tests).

The socket is bound before the model loads, so an address in use is a one-line error at
once, not after half a minute of loading; port 0 picks a free port (`ServerThread.port`).
"""

from __future__ import annotations

import socket
import threading
import time

from pingctl.errors import PingctlError, UsageError

START_TIMEOUT_S = 60.0  # uvicorn's start-up (the lifespan, the listening socket): seconds here


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


def _server(app, log: bool):
    import uvicorn

    # access_log off: the application logs its own one line per request (create_app(log_requests=))
    config = uvicorn.Config(app, log_level="info" if log else "warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=10)
    return uvicorn.Server(config)


def serve_forever(app, sock: socket.socket, log: bool = True) -> None:
    """uvicorn on `sock` until Ctrl-C or SIGTERM (it finishes the requests in flight)."""
    _server(app, log).run(sockets=[sock])


class ServerThread:
    """`with ServerThread(app) as s: ... s.url ...`: the application served on 127.0.0.1 (a
    free port unless one is given) in a daemon thread, stopped and joined on exit."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log: bool = False):
        self.app, self.host, self.port_asked, self.log = app, host, port, log
        self.sock = self.server = self.thread = None
        self.port = None

    @property
    def url(self) -> str:
        return url(self.sock)

    def __enter__(self) -> ServerThread:
        self.sock = bind(self.host, self.port_asked)
        self.port = self.sock.getsockname()[1]
        self.server = _server(self.app, self.log)
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

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
        if self.sock is not None:
            self.sock.close()
