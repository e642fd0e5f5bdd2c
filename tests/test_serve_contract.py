"""`pingctl serve`'s contract under hostile clients: the typed OpenAPI schema, bounded integers,
strict booleans, JSON errors that say where, batches that answer their good pairs, the warm-up
before ready, and the connection limits — against a real uvicorn server on 127.0.0.1."""

import http.client
import socket
import statistics
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.test_serve import call, ips, served  # noqa: E402,F401 - the served fixture, one per module

ERROR_CODES = {"400", "413", "422", "500", "503"}


def test_openapi_types_every_route_and_error(served):
    srv, *_ = served
    status, spec = call(srv, "GET", "/openapi.json")
    assert status == 200
    schemas = spec["components"]["schemas"]
    want = {"/rtt", "/complete", "/search", "/score", "/health", "/healthz", "/version", "/metadata"}
    assert want <= set(spec["paths"])

    def resolved(schema: dict) -> dict:
        ref = schema.get("$ref")
        return schemas[ref.rsplit("/", 1)[1]] if ref else schema

    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            if path == "/metrics":  # Prometheus' text format, not JSON
                assert set(responses["200"]["content"]) == {"text/plain"}, responses
                continue
            ok = resolved(responses["200"]["content"]["application/json"]["schema"])
            # a typed answer: named properties, or a discriminated choice of typed ones
            assert ok.get("properties") or ok.get("oneOf") or ok.get("anyOf"), (path, ok)
            declared = set(responses) - {"200"}
            if method == "post":
                assert ERROR_CODES <= declared, (path, declared)
            for code in declared:
                err = resolved(responses[code]["content"]["application/json"]["schema"])
                assert "error" in err["properties"], (path, code, err)
    assert set(schemas["ErrorInfo"]["properties"]) == {"kind", "message"}
    # every field of every request and answer says what it is
    ours = {"RttRequest", "PairIn", "ContextRow", "CompleteRequest", "SearchRequest", "ScoreRequest", "RttOne",
            "RttMany", "Prediction", "Rejected", "CompleteAnswer", "Completion", "SearchAnswer", "Candidate",
            "ScoreAnswer", "ScoredRow", "Health", "Version", "Metadata", "ErrorBody", "ErrorInfo"}
    assert ours <= set(schemas), ours - set(schemas)
    for name in ours:
        for field, prop in schemas[name]["properties"].items():
            assert prop.get("description"), (name, field)
    for field in ("src", "dst", "k", "n", "seed"):
        assert schemas["SearchRequest" if field in ("n", "seed") else "CompleteRequest"]["properties"][field]["description"]


@pytest.mark.parametrize("path, body, field", [
    ("/rtt", {"src": "193.0.0.1", "dst": "8.8.8.8",
              "context": [{"src": "193.0.0.1", "dst": "8.8.8.8", "time": 1704067200, "rtt": 5.0, "prb_id": 2**70}]},
     "context[0].prb_id"),
    ("/score", {"rows": [{"src": "193.0.0.1", "dst": "8.8.8.8", "time": 1704067200, "rtt": 5.0, "prb_id": 2**63}]},
     "rows[0].prb_id"),
    ("/search", {"src": "193.0.0.1", "rtt": 20, "seed": 2**64}, "seed"),
    ("/search", {"src": "193.0.0.1", "rtt": 20, "n": "16"}, "n"),
    ("/complete", {"src": "193.0.0.1", "dst": "8.8.*.*", "k": 2.5}, "k"),
    ("/rtt", {"src": "193.0.0.1", "dst": "8.8.8.8", "exact": "yes"}, "exact"),
    ("/rtt", {"src": "193.0.0.1", "dst": "8.8.8.8", "exact": 1}, "exact"),
    ("/rtt", {"src": "193.0.0.1", "dst": "8.8.8.8", "time": 2**70}, "time"),
], ids=["rtt-context-prb-2**70", "score-prb-2**63", "seed-2**64", "n-as-text", "k-fraction", "exact-yes", "exact-1",
        "time-2**70"])
def test_hostile_values_are_a_422_naming_the_field(served, path, body, field):
    srv, *_ = served
    status, got = call(srv, "POST", path, body)
    assert status == 422, got
    assert got["error"]["kind"] == "usage" and got["error"]["message"].startswith(f"{field}:"), got


def test_malformed_json_says_where_and_what(served):
    srv, *_ = served
    status, got = call(srv, "POST", "/rtt", raw=b'{"src": "193.0.0.1", "dst": "8.8.8.8",\n  "exact": tru}')
    assert status == 422, got
    message = got["error"]["message"]
    assert message.startswith("body: not valid JSON at line 2, column 12") and "Expecting value" in message, message
    assert got["detail"][0]["line"] == 2 and got["detail"][0]["column"] == 12


def test_a_batch_answers_its_good_pairs_and_lists_the_bad_ones(served, synth_rows):
    srv, model, _ = served
    (s0, d0), (s1, d1) = ips(synth_rows, 2)
    pairs = [{"src": s0, "dst": d0}, {"src": s0, "dst": "8.8.*.*"}, {"src": s1, "dst": d1},
             {"src": s1}, {"src": s0, "dst": "2001:db8::1"}, {"src": s0, "dst": d0, "time": "yesterday"}]
    status, got = call(srv, "POST", "/rtt", {"pairs": pairs})
    assert status == 200, got
    assert got["asked"] == 6 and got["answered"] == 2 and got["distinct"] == 2
    assert [p["index"] for p in got["predictions"]] == [0, 2]
    assert [(p["src"], p["dst"]) for p in got["predictions"]] == [(s0, d0), (s1, d1)]
    bad = {r["index"]: r for r in got["rejected"]}
    assert sorted(bad) == [1, 3, 4, 5]
    assert bad[1]["field"] == "pairs[1].dst" and "pattern" in bad[1]["message"]
    assert bad[3]["field"] == "pairs[3].dst" and bad[3]["reason"] == "missing"
    assert "one family" in bad[4]["message"] and bad[5]["field"] == "pairs[5].time"
    # the good pairs' numbers are those of the pairs asked alone
    alone = call(srv, "POST", "/rtt", {"pairs": [pairs[0], pairs[2]]})[1]
    for a, b in zip(got["predictions"], alone["predictions"]):
        assert a["p50_ms"] == pytest.approx(b["p50_ms"], rel=1e-5) and a["p_fail"] == pytest.approx(b["p_fail"], rel=1e-5)


def test_routes_are_functions_over_one_state(served):
    """A route can be called without HTTP: a request is anything whose app.state.serve is the state."""
    import asyncio

    from pingctl.serve import routes as RT

    _, model, app = served

    class Request:
        pass

    req = Request()
    req.app = app
    v = asyncio.run(RT.version(req))
    assert v["step"] == model.step and v["run"] == model.run.name  # a name: no path of the serving machine
    assert isinstance(app.state.serve, RT.ServeState) and app.state.serve.status == "ready"


# ----------------------------------------------------------------- connection limits


def _echo_app():
    """A minimal ASGI application that reads the whole body: the limits are the server's."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False) and message["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes `sock` (reads give b""), None if still open after `seconds`."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


def _slow_head(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /rtt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app")  # and then nothing
    return s


def test_a_slow_body_and_too_many_connections_are_closed():
    from pingctl.serve.server import Limits, ServerThread

    limits = Limits(header_timeout_s=1.0, body_timeout_s=1.5, max_connections=4)
    with ServerThread(_echo_app(), limits=limits) as srv:
        body = socket.create_connection(("127.0.0.1", srv.port))
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")  # 10 of 100 bytes
        assert (took := _closed_within(body, 10)) is not None and took < 1.5 + 1.0, took
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
        extra = socket.create_connection(("127.0.0.1", srv.port))
        assert _closed_within(extra, 1.0) is not None  # the 5th connection: closed at once
        heads = [_closed_within(s, 5) for s in held]  # sending nothing: closed at the head's deadline
        assert all(t is not None and t < 1.0 + 1.0 for t in heads), heads
        # and a well-behaved client is answered
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.request("POST", "/", b"x" * 10)
        assert conn.getresponse().read() == b"ok"
        conn.close()
        for s in [body, extra, *held]:
            s.close()


@pytest.mark.slow
def test_a_fresh_service_warms_up_then_answers_a_burst_with_context_evenly(tiny_run, synth_rows):
    """A fresh model (nothing compiled): /health says warming (and /rtt 503) until the warm-up
    has run; then 32 concurrent clients, each with 24 context measurements, are all answered
    within 3x the median latency; a client that sends half a request head meanwhile is closed
    within the documented header timeout."""
    from pingctl.api import Model
    from pingctl.serve.app import create_app
    from pingctl.serve.server import Limits, ServerThread

    model = Model.load(tiny_run)
    limits = Limits()
    with ServerThread(create_app(model), limits=limits) as srv:
        status, h = call(srv, "GET", "/health")
        assert status == 503 and h["status"] == "warming", h
        status, got = call(srv, "POST", "/rtt", {"src": "193.0.0.1", "dst": "8.8.8.8"})
        assert status == 503 and got["error"]["kind"] == "warming", got
        assert srv.wait_ready()["status"] == "ready"

        slow = [_slow_head(srv.port) for _ in range(3)]
        t_slow = time.monotonic()
        ps = ips(synth_rows, 32)
        t0 = 1_704_000_000
        bodies = [{"src": s, "dst": d, "context": [
            {"src": s, "dst": ps[(i + k) % 32][1], "time": t0 + 600 * k, "rtt": 10.0 + k, "prb_id": 1000 + i}
            for k in range(24)]} for i, (s, d) in enumerate(ps)]
        lat: dict[int, float] = {}
        codes: dict[int, int] = {}
        start = threading.Barrier(len(bodies))

        def ask(i: int) -> None:
            start.wait(60)
            t = time.perf_counter()
            codes[i], got = call(srv, "POST", "/rtt", bodies[i])
            lat[i] = time.perf_counter() - t
            assert codes[i] != 200 or got["context_measurements"] > 0

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert sorted(codes) == list(range(32)) and set(codes.values()) == {200}, codes
        median = statistics.median(lat.values())
        assert max(lat.values()) <= 3 * median, sorted(lat.values())

        closed = [_closed_within(s, max(0.0, limits.header_timeout_s + 2 - (time.monotonic() - t_slow)))
                  for s in slow]
        assert all(c is not None for c in closed), closed
        for s in slow:
            s.close()


def _ask_together(srv, bodies: list[dict]) -> list[dict]:
    out: dict[int, tuple] = {}
    start = threading.Barrier(len(bodies))

    def ask(i: int) -> None:
        start.wait(60)
        out[i] = call(srv, "POST", "/rtt", bodies[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(out) == list(range(len(bodies))) and all(s == 200 for s, _ in out.values()), out
    return [out[i][1] for i in range(len(bodies))]


def test_requests_with_context_share_calls_but_never_each_others_context(served, synth_rows):
    """Concurrent requests with context whose sources and probes differ are answered in shared
    Model.rtt_many calls, each as it is answered alone; two requests asking the same pair with
    different contexts are not merged (each prompt holds its own request's rows only)."""
    srv, _, app = served
    by_src = dict(ips(synth_rows, 200))
    ps = list(by_src.items())[:6]
    assert len(ps) == 6
    t0 = 1_704_000_000

    def body(i: int, s: str, d: str, rtt: float, rows: int = 6) -> dict:
        return {"src": s, "dst": d, "time": t0 + 86_400, "context_per_pair": 0, "context": [
            {"src": s, "dst": d, "time": t0 + 600 * k, "rtt": rtt + k, "prb_id": 900 + i} for k in range(rows)]}

    bodies = [body(i, s, d, 10.0 + 40 * i) for i, (s, d) in enumerate(ps)]
    s0, d0 = ps[0]
    bodies += [body(0, s0, d0, 2_000.0, rows=3)]  # the first pair again, with another (shorter) context
    alone = [call(srv, "POST", "/rtt", b)[1] for b in bodies]
    stats0 = dict(app.state.batcher.stats)
    together = _ask_together(srv, bodies)
    stats = app.state.batcher.stats
    assert stats["jobs"] - stats0["jobs"] == len(bodies)
    assert stats["batches"] - stats0["batches"] < len(bodies), (stats0, stats)  # some shared a call
    for a, b in zip(together, alone):
        assert a["context_measurements"] == b["context_measurements"] > 0
        for k in ("p_fail", "p50_ms", "p95_ms"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-9), (k, a, b)
    # merged, the first pair and its repeat would both have held 6 + 3 measurements
    assert (together[0]["context_measurements"], together[-1]["context_measurements"]) == (6, 3)
