"""`pingctl serve`: a real uvicorn server on 127.0.0.1 (a free port) answering with the session's
tiny model, asked over real HTTP connections (http.client)."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app as cli_app

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

SUMMARY = ("p_fail", "mean_ms", "trimmed_mean_ms", "p5_ms", "p25_ms", "p50_ms", "p75_ms", "p95_ms")


@pytest.fixture(scope="module")
def served(tiny_run):
    from pingctl.infer.model import LoadedModel
    from pingctl.serve.app import create_app
    from pingctl.serve.server import ServerThread

    model = LoadedModel.load(tiny_run)
    # a wait long enough that requests sent together on a loaded CI machine meet in one batch
    # no warm-up: ready at once (the warm-up is tested on a fresh model in test_serve_contract)
    app = create_app(model, max_wait_ms=50, warmup=False)
    with ServerThread(app) as srv:
        yield srv, model, app


def call(srv, method: str, path: str, body=None, raw: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, data, {"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode()
        return r.status, (json.loads(text) if r.getheader("content-type", "").startswith("application/json") else text)
    finally:
        conn.close()


class At:
    """Where a `pingctl serve` process listens, in the shape `call` takes."""

    def __init__(self, port: int):
        self.port = port


def start_serve(run, *options, timeout_s: float = 180) -> tuple[subprocess.Popen, dict]:
    """A real `pingctl serve RUN --port 0 --json` process and the JSON it printed on start."""
    proc = subprocess.Popen([sys.executable, "-m", "pingctl", "serve", str(run), "--port", "0", "--json",
                             "--no-warmup", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("}"):
            break
    return proc, json.loads("".join(lines))


def first_call(srv, method: str, path: str, body=None, headers: dict | None = None, timeout_s: float = 30):
    """`call`, retried while uvicorn is not yet listening: it starts a moment after the line is printed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(srv, method, path, body, headers=headers)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def ips(synth_rows, n: int):
    """n distinct IPv4 (src, dst) pairs of the synthetic world the model was trained on."""
    import pyarrow.parquet as pq

    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr", "ip_version"])
    rows = t.filter(t.column("ip_version").to_numpy() == 4).to_pylist()
    out = list(dict.fromkeys((r["src_addr"], r["dst_addr"]) for r in rows))
    return out[:n]


def same(got: dict, want: dict, rel: float = 1e-5):
    for k in SUMMARY:
        assert got[k] == pytest.approx(want[k], rel=rel, abs=1e-9), (k, got[k], want[k])


def test_health_metadata_and_docs(served, tiny_run):
    srv, model, _ = served
    for path in ("/health", "/healthz"):
        status, h = call(srv, "GET", path)
        assert status == 200 and h["status"] == "ready" and h["step"] == model.step
    status, v = call(srv, "GET", "/version")
    assert status == 200 and v["step"] == model.step and v["pingctl"]
    status, m = call(srv, "GET", "/metadata")
    assert status == 200
    assert m["run"] == tiny_run.name and m["step"] == model.step and m["preset"] == "tiny"  # a name, no path
    assert m["scheme"] == "compact" and m["seq_len"] == 256 and m["serve"]["max_batch"] == model.batch
    assert m["serving_since"].endswith("+00:00") or m["serving_since"].endswith("Z")
    status, page = call(srv, "GET", "/docs")
    assert status == 200 and "swagger" in page.lower()
    status, spec = call(srv, "GET", "/openapi.json")
    assert {"/rtt", "/complete", "/search", "/score", "/health", "/healthz", "/version", "/metadata"} <= set(spec["paths"])


def test_one_pair_is_the_cli_answer(served, pair):
    """The numbers `pingctl sample --src --dst --json` prints (questions.answer is what it runs
    once the model is loaded), and exact=False those of `pingctl sample --pairs`."""
    from pingctl.infer import pairs as P
    from pingctl.infer import questions as QS

    srv, model, _ = served
    status, got = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1], "exact": True})
    assert status == 200, got
    want = QS.answer(model, QS.RttQuestion(src=pair[0], dst=pair[1])).result
    assert got["src"] == pair[0] and got["dst"] == pair[1] and got["step"] == model.step and got["exact"]
    same(got, want, rel=1e-9)

    status, lazy = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1], "time": "2024-01-02T03:04:05Z",
                                              "exact": False})
    assert status == 200 and lazy["time"] == 1704164645, lazy
    one = P.Pairs("", "row", [0], [pair[0]], [pair[1]], [4], [1704164645])
    cols = P.answer(model, one)
    same(lazy, {k: cols[k][0] for k in SUMMARY}, rel=1e-9)


def test_many_pairs_with_context_are_the_pairs_answer(served, synth_rows):
    from pingctl.infer import pairs as P
    from pingctl.tokenizer import Measurements

    srv, model, _ = served
    ps = ips(synth_rows, 4)
    times = [1704067200 + 3600 * i for i in range(4)]
    pairs = [{"src": s, "dst": d, "time": t} for (s, d), t in zip(ps, times)]
    pairs.append(dict(pairs[1]))  # a repeated question is asked once, answered twice
    src0 = ps[0][0]
    context = [{"src": src0, "dst": ps[k % 4][1], "time": 1704060000 + 60 * k, "rtt": 10.0 + k, "prb_id": 7}
               for k in range(12)]
    status, got = call(srv, "POST", "/rtt", {"pairs": pairs, "context": context})
    assert status == 200, got
    assert got["answered"] == 5 and got["distinct"] == 4 and len(got["predictions"]) == 5
    assert {**got["predictions"][4], "index": 1} == got["predictions"][1]

    rows = P.Pairs("", "row", list(range(5)), [p["src"] for p in pairs], [p["dst"] for p in pairs], [4] * 5,
                   [p["time"] for p in pairs])
    ctx = Measurements.from_fields([c["src"] for c in context], [c["dst"] for c in context],
                                   [c["rtt"] for c in context], [c["time"] for c in context])
    cols = P.answer(model, rows, ctx, model.max_per_pair, prb=np.full(12, 7))
    assert [p["context_measurements"] for p in got["predictions"]] == cols["context_measurements"]
    assert got["predictions"][0]["context_measurements"] > 0  # the first source's probe has a past
    for i, p in enumerate(got["predictions"]):
        same(p, {k: cols[k][i] for k in SUMMARY}, rel=1e-6)


def test_complete_and_search(served, pair):
    from pingctl.infer import questions as QS

    srv, model, _ = served
    pattern = ".".join(pair[1].split(".")[:2]) + ".*.*"
    status, got = call(srv, "POST", "/complete", {"src": pair[0], "dst": pattern, "k": 3})
    assert status == 200, got
    want = QS.answer(model, QS.CompleteQuestion(src=pair[0], dst=pattern, k=3)).result["completions"]
    assert [(c["src"], c["dst"]) for c in got["completions"]] == [(c["src"], c["dst"]) for c in want]
    assert all(c["dst"].startswith(pattern[:-3]) for c in got["completions"])
    status, found = call(srv, "POST", "/search", {"src": pair[0], "rtt": "5-50", "n": 16, "k": 3, "seed": 1})
    assert status == 200 and 1 <= len(found["candidates"]) <= 3, found
    assert call(srv, "POST", "/search", {"src": pair[0], "rtt": "5-50", "n": 16, "k": 3, "seed": 1})[1] == found


@pytest.mark.parametrize("body, status, field, words", [
    ({"src": "1.2.3", "dst": "8.8.8.8"}, 422, "src", "not an IP address"),
    ({"src": "::ffff:1.2.3.4", "dst": "::1"}, 422, "src", "IPv4-mapped"),
    ({"src": "193.0.0.1"}, 422, "dst", "Field required"),
    ({"pairs": [{"src": "193.0.0.1", "dst": "8.8.*.*"}]}, 422, "pairs[0]", "pattern"),
    ({"pairs": [{"src": "193.0.0.1"}]}, 422, "pairs[0]", "Field required"),
    ({"src": "193.0.0.1", "dst": "2001:db8::1"}, 422, "body", "one family"),
    ({"src": "193.0.0.1", "dst": "8.8.8.8", "time": "yesterday"}, 422, "time", "ISO 8601"),
    ({"src": "193.0.0.1", "dst": "8.8.8.8", "tiem": 3}, 422, "tiem", "Extra inputs"),
    ({"src": "193.0.0.1", "dst": "8.8.8.8", "pairs": [{"src": "193.0.0.1", "dst": "8.8.8.8"}]}, 422, "body",
     "not both"),
    ({"src": "193.0.0.1", "dst": "8.8.8.8", "context": [{"src": "193.0.0.1", "dst": "8.8.8.8", "time": 1704067200,
                                                          "rtt": -3}]}, 422, "context[0].rtt", "-1 for a failed"),
    ({"pairs": [{"src": "193.0.0.1", "dst": "8.8.8.8"}] * 1025}, 422, "pairs", "at most 1024"),
], ids=["bad-address", "ipv4-mapped", "missing-dst", "only-pair-a-pattern", "only-pair-missing", "mixed-family",
        "bad-time", "unknown-field", "both-forms", "bad-context-rtt", "too-many-pairs"])
def test_bad_rtt_requests_name_the_field(served, body, status, field, words):
    srv, *_ = served
    got_status, got = call(srv, "POST", "/rtt", body)
    assert got_status == status, got
    message = got["error"]["message"]
    assert got["error"]["kind"] == "usage" and message.startswith(f"{field}:") and words in message, message


def test_other_bad_requests(served, pair):
    from pingctl.serve import schemas as S

    srv, *_ = served
    status, got = call(srv, "POST", "/complete", {"src": pair[0], "dst": "8.8.*.*", "k": 0})
    assert status == 422 and got["error"]["message"].startswith("k:"), got
    status, got = call(srv, "POST", "/complete", {"k": 3})
    assert status == 422 and "give src, dst or both" in got["error"]["message"], got
    status, got = call(srv, "POST", "/search", {"src": pair[0], "rtt": "10-", "n": 4})
    assert status == 422 and got["error"]["message"].startswith("rtt:") and "both ends" in got["error"]["message"]
    status, got = call(srv, "POST", "/search", {"src": pair[0], "rtt": 20, "n": S.MAX_SEARCH_SAMPLES + 1})
    assert status == 422 and got["error"]["message"].startswith("n:"), got
    status, got = call(srv, "POST", "/rtt", raw=b'{"src": "193.0.0.1",\n "dst": }')
    assert status == 422 and got["error"]["kind"] == "usage", got
    # where and what, not FastAPI's "[23]: JSON decode error"
    assert "line 2, column 9" in got["error"]["message"] and "Expecting value" in got["error"]["message"], got
    # a body past the bound: refused by its length before it is parsed
    status, got = call(srv, "POST", "/rtt", raw=b" " * (S.MAX_BODY_BYTES + 1))
    assert status == 413 and got["error"]["kind"] == "too_large", got
    # and one sent without a length (chunked): refused once what arrived passes the bound
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        chunks = iter([b'{"pairs": [' + b" " * (64 * 1024)] * (S.MAX_BODY_BYTES // (64 * 1024) + 2))
        conn.request("POST", "/rtt", chunks, {"content-type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 413 and json.loads(r.read())["error"]["kind"] == "too_large"
    finally:
        conn.close()
    status, got = call(srv, "GET", "/nowhere")
    assert status == 404 and "error" in got


def test_an_internal_failure_is_a_500_and_the_next_request_is_answered(served, pair):
    srv, model, _ = served
    body = {"src": pair[0], "dst": pair[1]}
    status, before = call(srv, "POST", "/rtt", body)
    assert status == 200
    real, calls = model.log_probs, []

    def broken_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    model.log_probs = broken_once
    try:
        status, got = call(srv, "POST", "/rtt", body)
        assert status == 500 and got["error"]["kind"] == "internal" and "injected failure" in got["error"]["message"]
        status, after = call(srv, "POST", "/rtt", body)
        assert status == 200 and len(calls) > 1
    finally:
        del model.log_probs
    same(after, before, rel=1e-9)
    assert call(srv, "GET", "/healthz")[0] == 200


def test_concurrent_requests_share_forward_passes(served, synth_rows):
    from pingctl.infer import pairs as P

    srv, model, app = served
    ps = ips(synth_rows, 12)
    real, calls = model.log_probs, []
    lock = threading.Lock()

    def counted(*args, **kwargs):
        with lock:
            calls.append(1)
        return real(*args, **kwargs)

    stats0 = dict(app.state.batcher.stats)
    results: dict[int, tuple] = {}
    start = threading.Barrier(len(ps))

    def ask(i: int) -> None:
        start.wait(30)
        # exact false: the answer `pingctl sample --pairs` gives (one pair's default is exact)
        results[i] = call(srv, "POST", "/rtt", {"src": ps[i][0], "dst": ps[i][1], "exact": False})

    model.log_probs = counted
    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(ps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        del model.log_probs
    assert sorted(results) == list(range(len(ps))) and all(s == 200 for s, _ in results.values()), results
    # alone, each request costs at least two forward calls (P(first byte), then second bytes)
    assert len(calls) < len(ps), len(calls)
    stats = app.state.batcher.stats
    assert stats["largest_batch"] > 1 and stats["items"] - stats0["items"] == len(ps)
    cols = P.answer(model, P.Pairs("", "row", list(range(len(ps))), [s for s, _ in ps], [d for _, d in ps],
                                   [4] * len(ps), [None] * len(ps)))
    for i in range(len(ps)):  # batched with others or alone, the same numbers (to float rounding)
        same(results[i][1], {k: cols[k][i] for k in SUMMARY}, rel=1e-4)


def test_score_answers(served, pair):
    srv, *_ = served
    rows = [{"src": pair[0], "dst": pair[1], "time": 1704067200 + 60 * k, "rtt": 20.0 + k} for k in range(3)]
    status, got = call(srv, "POST", "/score", {"rows": rows, "context": 2})
    assert status == 200, got
    assert len(got["rows"]) == 3 and all(r["nll"] is not None and r["nll"] >= 0 for r in got["rows"])
    assert [r["event_time"] for r in got["rows"]] == [r["time"] for r in rows]


def test_bench_serve_measures_every_case(served):
    from pingctl.serve.bench import bench_serve

    _, model, _ = served
    res = bench_serve(model, requests=4, clients=2, seconds=10, contexts=(3,), max_batch=4)
    assert [r["case"] for r in res["table"]] == ["one at a time, ctx 3", "unbatched, 2 clients, ctx 3",
                                                  "micro-batched, 2 clients, ctx 3", "4 pairs per request, ctx 3"]
    for r in res["table"]:
        assert r["errors"] == 0 and r["requests"] == 4 and r["pairs_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"], r
        assert r["context"] == 3  # the body's context reached every prompt
    assert [r["pairs_per_request"] for r in res["table"]] == [1, 1, 1, 4]
    assert any("micro-batched answers" in n for n in res["notes"])


def test_bench_serve_puts_each_engine_in_one_table(tiny_run):
    """`bench serve --engine ...`: every case once per engine, in turn, each engine's model its
    own (loaded by the engine named), with each engine's micro-batching note."""
    from pingctl.infer.model import LoadedModel
    from pingctl.serve.bench import bench_serve_engines

    loaded = []

    def load(engine):
        loaded.append(LoadedModel.load(tiny_run, engine=engine))
        return loaded[-1]

    res = bench_serve_engines(load, ["light", "numpy"], requests=2, clients=2, seconds=10, contexts=(0,), max_batch=2)
    assert [m.engine for m in loaded] == ["light", "numpy"]
    assert [r["engine"] for r in res["table"]] == ["light"] * 4 + ["numpy"] * 4
    assert [r["case"] for r in res["table"]][:4] == [r["case"] for r in res["table"]][4:]
    assert all(r["errors"] == 0 and r["requests"] == 2 and r["pairs_per_s"] > 0 for r in res["table"])
    assert [n.split(":")[0] for n in res["notes"] if "micro-batched answers" in n] == ["light", "numpy"]


def test_bench_serve_engine_choice_is_checked(tiny_run):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    got = CliRunner().invoke(app, ["bench", "serve", str(tiny_run), "--engine", "jax"])
    assert got.exit_code == 2 and "--engine 'jax'" in got.output


def test_cli_serves_until_interrupted(tiny_run, pair):
    """`pingctl serve RUN --port 0 --json` prints where it listens, answers, and stops on Ctrl-C
    with exit 0."""
    proc, info = start_serve(tiny_run, timeout_s=120)
    try:
        assert info["url"].startswith("http://127.0.0.1:") and info["max_batch"] == 32
        assert info["limits"]["header_timeout_s"] > 0 and not info["warmup"]
        srv = At(int(info["url"].rsplit(":", 1)[1]))
        status, got = first_call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1]})
        assert status == 200 and 0 <= got["p_fail"] <= 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        err = proc.stderr.read()
        assert err.count("POST /rtt 200") == 1 and "Traceback" not in err, err  # one line per request
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_an_address_in_use_before_loading(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = CliRunner().invoke(cli_app, ["serve", str(tmp_path), "--port", str(port), "--json"])
    assert r.exit_code == 1, r.output
    assert "cannot listen on 127.0.0.1" in json.loads(r.stdout)["error"]["message"]
    assert os.environ.get("PINGCTL_DEBUG") or "Traceback" not in r.output


def test_a_calibrated_service_answers_with_the_map(served, tiny_run, pair, tmp_path):
    """`serve --calibration` (create_app's `calibration`): /rtt's distributions are the map
    applied to the raw ones, as `sample --calibration` answers; /metadata says which map."""
    from pingctl.infer import calibration as CAL
    from pingctl.infer import questions as QS
    from pingctl.serve.app import create_app
    from pingctl.serve.server import ServerThread

    _, model, _ = served
    cal = CAL.load(CAL.save(CAL.fit(np.random.default_rng(0).uniform(size=300) ** 2,
                                    {"run": str(tiny_run), "steps": list(model.steps), "context_policy": "none"}),
                            tmp_path / "calibration.json"))
    with ServerThread(create_app(model, calibration=cal, warmup=False)) as srv:
        status, got = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1], "exact": True})
        shown = f"{tmp_path.name}/calibration.json"  # the map's directory and name: no path of the server
        assert status == 200 and got["calibration"] == shown, got
        want = QS.answer(model, QS.RttQuestion(src=pair[0], dst=pair[1]), calibration=cal).result
        same(got, want, rel=1e-9)
        raw = QS.answer(model, QS.RttQuestion(src=pair[0], dst=pair[1])).result
        assert got["p50_ms"] != pytest.approx(raw["p50_ms"])
        status, lazy = call(srv, "POST", "/rtt", {"src": pair[0], "dst": pair[1], "exact": False})
        assert status == 200 and lazy["p50_ms"] == pytest.approx(want["p50_ms"], rel=1e-3)
        status, meta = call(srv, "GET", "/metadata")
        assert status == 200 and meta["calibration"]["path"] == shown
        assert meta["calibration"]["run"] == tiny_run.name, meta
        assert str(tmp_path) not in json.dumps(meta) and str(tiny_run) not in json.dumps(meta), meta


def test_the_automatic_wait_follows_the_traffic():
    from pingctl.serve.batcher import AUTO_MAX_S, AUTO_MIN_S, AUTO_SHARE, Batcher

    b = Batcher(max_batch=32)  # max_wait_s None: automatic
    try:
        gate = threading.Event()

        def slow(items):
            time.sleep(0.2)
            return items

        held = b.call(lambda: gate.wait(10))  # the worker busy while four clients queue
        jobs = [b.submit("k", slow, [i]) for i in range(4)]
        gate.set()
        assert held.result(10) is True and [j.result(10) for j in jobs] == [[0], [1], [2], [3]]
        assert b.stats["largest_batch"] == 4
        # several clients shared the batch: hold the next open for a share of its time
        assert AUTO_SHARE * 0.2 <= b.wait_s("k") <= AUTO_MAX_S
        assert b.wait_s("other") == AUTO_MIN_S  # a key never seen: no wait to speak of
        assert b.submit("k", slow, [9]).result(10) == [9]
        # one job, nothing behind it: one client asking in turn does not wait for company
        assert b.wait_s("k") == AUTO_MIN_S
    finally:
        b.close()
    fixed = Batcher(max_wait_s=0.004)
    try:
        assert fixed.wait_s("k") == 0.004
    finally:
        fixed.close()
