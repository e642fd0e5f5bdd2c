"""The clients of `pingctl bench serve`, run as `python -m pingctl.serve.load` in a child
process: a JSON spec on stdin, the measurements as JSON on stdout. Standard library only, so
the child starts in a fraction of a second and shares nothing with the server it measures."""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import urllib.parse


def drive(url: str, payloads: list[bytes], clients: int, count: int, seconds: float, warmup: int) -> dict:
    """POST /rtt `count` times (cycling through `payloads`) from `clients` threads, each on its
    own keep-alive connection, stopping at `seconds`; first `warmup` requests untimed."""
    u = urllib.parse.urlsplit(url)

    def phase(n: int, limit_s: float) -> dict:
        lock = threading.Lock()
        state = {"next": 0, "lat": [], "errors": 0, "status": {}}
        deadline = time.perf_counter() + limit_s

        def client():
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
            while True:
                with lock:
                    i = state["next"]
                    if i >= n or time.perf_counter() > deadline:
                        break
                    state["next"] += 1
                t = time.perf_counter()
                try:
                    conn.request("POST", "/rtt", payloads[i % len(payloads)], {"content-type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    code = resp.status
                except OSError:
                    code = 0
                    conn.close()
                    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
                dt = time.perf_counter() - t
                with lock:
                    state["status"][code] = state["status"].get(code, 0) + 1
                    if code == 200:
                        state["lat"].append(dt)
                    else:
                        state["errors"] += 1
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return {"wall_s": time.perf_counter() - t0, "latencies": state["lat"], "errors": state["errors"],
                "status": {str(k): v for k, v in state["status"].items()}}

    phase(warmup, seconds)
    return phase(count, seconds)


def _child() -> None:
    spec = json.loads(sys.stdin.read())
    payloads = [p.encode() for p in spec.pop("payloads")]
    json.dump(drive(spec["url"], payloads, spec["clients"], spec["count"], spec["seconds"], spec["warmup"]),
              sys.stdout)


if __name__ == "__main__":
    _child()
