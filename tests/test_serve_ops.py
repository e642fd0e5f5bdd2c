"""`pingctl serve` as an operator runs it: the docs page without internet, documented examples
that are accepted, Prometheus metrics, tags and operationIds, the API key, CORS, the JSON
access log, /rtt's default answer being `pingctl sample`'s, and no server path in any answer.
Real uvicorn on 127.0.0.1 asked over real HTTP (tests/test_serve.py's `served`), and the CLI
as a real subprocess."""

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("fastapi_offline")

from tests.test_serve import At, call, first_call, served  # noqa: E402,F401 - the served fixture, one per module
from tests.test_serve_faults import _start  # noqa: E402

OPERATIONS = {("/rtt", "post"): "rtt", ("/complete", "post"): "complete", ("/search", "post"): "search",
              ("/score", "post"): "score", ("/health", "get"): "health", ("/healthz", "get"): "healthz",
              ("/version", "get"): "version", ("/metadata", "get"): "metadata", ("/metrics", "get"): "metrics"}
KEY = "s3cret-key-for-tests-0123456789"


def _models():
    from pydantic import TypeAdapter

    from pingctl.serve import responses as R

    return {"/rtt": TypeAdapter(R.RttAnswer), "/complete": TypeAdapter(R.CompleteAnswer),
            "/search": TypeAdapter(R.SearchAnswer), "/score": TypeAdapter(R.ScoreAnswer),
            "/health": TypeAdapter(R.Health), "/healthz": TypeAdapter(R.Health), "/version": TypeAdapter(R.Version),
            "/metadata": TypeAdapter(R.Metadata)}


def test_the_docs_page_loads_every_asset_from_the_service(served):
    """Swagger UI (and ReDoc) came from a CDN: a blank page without internet. Every script and
    stylesheet the pages name is now a path of the service itself, answered 200 with the file."""
    srv, _, _ = served
    for page in ("/docs", "/redoc"):
        status, html = call(srv, "GET", page)
        assert status == 200, html
        urls = re.findall(r'<script[^>]*src="([^"]+)"', html) + re.findall(r'<link[^>]*href="([^"]+)"', html)
        assert urls, html
        for u in urls:
            assert u.startswith("/") and not u.startswith("//"), (page, u)  # no other host
            status, body = _get_bytes(srv.port, u)
            assert status == 200 and len(body) > 1000, (u, status)
        assert "swagger-ui-bundle.js" in html or "redoc.standalone.js" in html


def _get_bytes(port: int, path: str) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_every_documented_example_is_accepted_and_answers_in_its_schema(served):
    """Each route's named request examples in /openapi.json (what "Try it out" sends) are
    answered 200, in the route's response model; each route's response examples fit it too."""
    srv, _, _ = served
    models = _models()
    _, spec = call(srv, "GET", "/openapi.json")
    sent = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            answers = op["responses"]["200"].get("content", {}).get("application/json", {}).get("examples", {})
            if path in models:
                assert answers, (path, "no response example")
                for name, ex in answers.items():
                    models[path].validate_python(ex["value"])
            if method != "post":
                continue
            examples = op["requestBody"]["content"]["application/json"]["examples"]
            assert len(examples) >= 2, (path, examples)
            for name, ex in examples.items():
                status, got = call(srv, "POST", path, ex["value"])
                assert status == 200, (path, name, got)
                models[path].validate_python(got)
                sent += 1
    rtt = spec["paths"]["/rtt"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    assert {"one_pair", "many_pairs", "with_context"} <= set(rtt)
    assert sent >= 12


def test_routes_have_tags_and_readable_operation_ids(served):
    srv, _, _ = served
    _, spec = call(srv, "GET", "/openapi.json")
    found = {(p, m): op["operationId"] for p, ops in spec["paths"].items() for m, op in ops.items()}
    assert {k: found.get(k) for k in OPERATIONS} == OPERATIONS
    tags = {op["operationId"]: op["tags"] for ops in spec["paths"].values() for op in ops.values()}
    assert all(tags[o] == ["questions"] for o in ("rtt", "complete", "search", "score")), tags
    assert all(tags[o] == ["service"] for o in ("health", "version", "metadata", "metrics")), tags
    assert {t["name"] for t in spec["tags"]} == {"questions", "service"}


def _samples(text: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _value(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_requests_latency_batches_and_the_queue(served, pair):
    srv, _, _ = served
    status, text = call(srv, "GET", "/metrics")
    assert status == 200, text
    before = _samples(text)
    for _ in range(3):
        assert call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1]})[0] == 200
    assert call(srv, "POST", "/rtt", {"src": pair[0]})[0] == 422
    assert call(srv, "GET", "/no/such/path/1234")[0] == 404
    status, text = call(srv, "GET", "/metrics")
    after = _samples(text)

    def grew(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("pingctl_serve_requests_total", route="/rtt", method="POST", status="200") == 3
    assert grew("pingctl_serve_requests_total", route="/rtt", method="POST", status="422") == 1
    # a made-up path is one series ("other"), not one per path
    assert grew("pingctl_serve_requests_total", route="other", status="404") == 1
    assert not [s for s in after if "1234" in json.dumps(s.labels)]
    assert grew("pingctl_serve_request_duration_seconds_count", route="/rtt", method="POST") == 4
    assert grew("pingctl_serve_batch_size_count") >= 1 and grew("pingctl_serve_batch_size_sum") >= 3
    assert [s for s in after if s.name == "pingctl_serve_queue_depth"][0].value == 0


def test_rtt_defaults_give_the_mean_pingctl_sample_prints(served, tiny_run, pair):
    """The same pair, under both defaults: `pingctl sample --src --dst --json` (every code) and
    POST /rtt (one pair: every code by default now; before, approximate means: 139.09 ms
    against 138.16). Float32 forward passes at other batch shapes: a relative 1e-5."""
    from pingctl.cli.app import app as cli_app

    srv, _, _ = served
    res = CliRunner().invoke(cli_app, ["sample", str(tiny_run), "--src", pair[0], "--dst", pair[1], "--json"])
    assert res.exit_code == 0, res.output
    want = json.loads(res.stdout)
    want = want.get("result", want)
    status, got = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1]})
    assert status == 200 and got["exact"] is True, got
    for k in ("mean_ms", "trimmed_mean_ms", "p_fail", "p50_ms", "p95_ms"):
        assert got[k] == pytest.approx(want[k], rel=1e-5), (k, got[k], want[k])
    status, many = call(srv, "POST", "/rtt", {"pairs": [{"src": pair[0], "dst": pair[1]}]})
    assert status == 200 and many["exact"] is False  # as `pingctl sample --pairs`


def test_no_answer_names_a_path_of_the_server(served, tiny_run, pair):
    """/metadata said `run: /abs/path/to/run`; /rtt, /complete, /search and /score did too. No
    answer of any route (examples, errors) holds the model's path, the temp dir or the home."""
    srv, model, _ = served
    secrets = {str(Path(tiny_run).resolve()), str(model.run), tempfile.gettempdir(), str(Path.home())}
    _, spec = call(srv, "GET", "/openapi.json")
    texts = []
    for path in ("/health", "/healthz", "/version", "/metadata", "/metrics", "/nope"):
        texts.append(call(srv, "GET", path))
    for path, ops in spec["paths"].items():
        for ex in ops.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json", {}) \
                .get("examples", {}).values():
            texts.append(call(srv, "POST", path, ex["value"]))
    texts.append(call(srv, "POST", "/rtt", {"src": pair[0], "dst": "nonsense"}))
    texts.append(call(srv, "POST", "/rtt", raw=b'{"src": '))
    _, meta = call(srv, "GET", "/metadata")
    assert meta["run"] == Path(tiny_run).name, meta["run"]
    for status, body in texts:
        text = body if isinstance(body, str) else json.dumps(body)
        for s in secrets:
            assert s not in text, (s, text[:500])


def test_api_key_cors_and_the_json_access_log(tiny_run, pair):
    from pingctl.infer.model import LoadedModel
    from pingctl.serve.app import create_app
    from pingctl.serve.ops import JsonLines
    from pingctl.serve.server import ServerThread

    lines: list[str] = []
    handler = logging.Handler()
    handler.setFormatter(JsonLines())
    handler.emit = lambda record: lines.append(handler.format(record))
    log = logging.getLogger("pingctl.serve")
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    app = create_app(LoadedModel.load(tiny_run), warmup=False, access_log="json", api_key=KEY,
                     cors_origins=["https://dash.example.org"])
    body = {"src": pair[0], "dst": pair[1]}
    try:
        with ServerThread(app) as srv:
            for path, method in (("/rtt", "POST"), ("/metrics", "GET"), ("/version", "GET"), ("/metadata", "GET")):
                status, got = call(srv, method, path, body if method == "POST" else None)
                assert status == 401 and got["error"]["kind"] == "unauthorized", (path, got)
            assert call(srv, "POST", "/rtt", body, headers={"X-API-Key": "wrong"})[0] == 401
            assert call(srv, "POST", "/rtt", body, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
            assert call(srv, "GET", "/metrics", headers={"X-API-Key": KEY})[0] == 200
            for path in ("/health", "/docs", "/openapi.json"):
                assert call(srv, "GET", path)[0] == 200, path
            _, spec = call(srv, "GET", "/openapi.json")
            assert spec["paths"]["/rtt"]["post"]["security"] and "security" not in spec["paths"]["/health"]["get"]
            allowed = _preflight(srv.port, "https://dash.example.org")
            assert allowed.status == 200 and allowed.getheader("access-control-allow-origin") == "https://dash.example.org"
            assert _preflight(srv.port, "https://evil.example.com").getheader("access-control-allow-origin") is None
            status, _ = call(srv, "GET", "/health", headers={"X-Request-ID": "trace-42"})
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    records = [json.loads(x) for x in lines]
    access = [r for r in records if r["kind"] == "access"]
    assert len(access) >= 10
    assert {"method", "path", "status", "duration_ms", "request_id", "time"} <= set(access[0])
    assert any(r["request_id"] == "trace-42" and r["path"] == "/health" for r in access)
    assert any(r["status"] == 401 and r["path"] == "/rtt" for r in access)
    assert not [x for x in lines if KEY in x]


def _preflight(port: int, origin: str):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("OPTIONS", "/rtt", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                              "Access-Control-Request-Headers": "authorization,content-type"})
    r = conn.getresponse()
    r.read()
    conn.close()
    return r


def test_cli_reads_the_key_from_the_environment_and_logs_json(tiny_run, pair, monkeypatch):
    """`pingctl serve --api-key-env VAR --access-log json`: a real process; its output never
    shows the key; a variable that is not set is a usage error (exit 2) before any load."""
    missing = subprocess.run([sys.executable, "-m", "pingctl", "serve", str(tiny_run), "--port", "0",
                              "--api-key-env", "PINGCTL_NO_SUCH_VAR"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "PINGCTL_NO_SUCH_VAR" in missing.stderr, missing.stderr
    monkeypatch.setenv("PINGCTL_TEST_KEY", KEY)  # _start's process inherits it
    proc, port = _start(tiny_run, "--api-key-env", "PINGCTL_TEST_KEY", "--access-log", "json",
                        "--cors-origin", "https://dash.example.org")
    try:
        srv = At(port)
        status, _ = first_call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1]})
        assert status == 401
        status, _ = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1]}, headers={"Authorization": f"Bearer {KEY}"})
        assert status == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert KEY not in out + err
    access = [json.loads(x) for x in err.splitlines() if x.startswith("{") and '"access"' in x]
    assert [(a["path"], a["status"]) for a in access] == [("/rtt", 401), ("/rtt", 200)], err[-2000:]
