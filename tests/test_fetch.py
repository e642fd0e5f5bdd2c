"""`pingctl fetch` against a real HTTP server on 127.0.0.1 that answers as the RIPE Atlas API
does, from recorded results and metadata (tests/fixtures/ripe_api; the results cut from
../shared/data/ripe-atlas)."""

from __future__ import annotations

import gzip
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.ingest.fetch import windows

FIXTURES = Path(__file__).parent / "fixtures" / "ripe_api"
RECORDED = {int(f.name.split(".")[0]): json.loads(gzip.decompress(f.read_bytes()))
            for f in FIXTURES.glob("[0-9]*.json.gz")}
# /api/v2/measurements/ID/ and /api/v2/probes/ objects (tests/fixtures/ripe_api/make.py)
MEASUREMENTS = {int(k): v for k, v in json.loads((FIXTURES / "measurements.json").read_text()).items()}
PROBES = json.loads(gzip.decompress((FIXTURES / "probes.json.gz").read_bytes()))
PUBLIC = "https://atlas.ripe.net"  # the host the API writes in its links, whoever asked
KEY = "k3y-5ecret-0f-the-te5t"  # what the test server accepts
# the recorded windows (tests/fixtures/ripe_api/make.py)
SPANS = {2013: ("2019-05-01T00:00:00Z", "2019-05-03T00:00:00Z"), 49921351: ("1676246400", "1676332800")}

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_key_of_this_machine(tmp_path, monkeypatch):
    """No API key from the environment or a ripe-atlas-tools rc file of whoever runs the tests:
    each test gives its own (subprocesses inherit this environment)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("XDG_CONFIG_HOME", "RIPE_ATLAS_KEY", "ATLAS_FETCH_KEY", "PINGCTL_ATLAS_API"):
        monkeypatch.delenv(var, raising=False)


def _in(value: str, want) -> bool:
    return want in {x.strip() for x in value.split(",")}


# /api/v2/probes/ filters as the API reads them: the probe object's field against the value
PROBE_FILTERS = {
    **{f"asn_v{af}": (lambda p, v, af=af: p[f"asn_v{af}"] == int(v)) for af in (4, 6)},
    **{f"asn_v{af}__in": (lambda p, v, af=af: _in(v, str(p[f"asn_v{af}"]))) for af in (4, 6)},
    "country_code": lambda p, v: p["country_code"] == v.upper(),
    "country_code__in": lambda p, v: _in(v.upper(), p["country_code"]),
    **{f"prefix_v{af}": (lambda p, v, af=af: p[f"address_v{af}"] is not None
                         and ipaddress.ip_address(p[f"address_v{af}"]) in ipaddress.ip_network(v)) for af in (4, 6)},
}


class AtlasStub:
    """The API's routes: GET /api/v2/measurements/ID/results?start=&stop=&probe_ids= (start and
    stop inclusive), /api/v2/measurements/ID/ (`measurements`) and /api/v2/probes/ (its filters,
    `page_size` up to `probe_page`, pages linked by `next` on the public host), each with
    `Authorization: Key ...` checked. `requests` lists every request, `results` the results
    ones. On the results route only: `faults` are statuses to answer before the next good
    answers, `fail_after` answers 500 once that many were answered, `hang_after` answers nothing
    (until shut down) once that many were answered, and `respond(handler)`, when set, answers
    each request itself (raw bytes, at its own pace) and returns whether it did. `meta_faults`
    are statuses to answer metadata requests with first."""

    def __init__(self, key: str | None = KEY):
        self.key, self.faults, self.meta_faults, self.fail_after = key, [], [], None
        self.requests, self.results = [], []
        self.measurements = dict(MEASUREMENTS)
        self.probe_page = 500
        self.respond = None
        self.hang_after = None
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                auth = self.headers.get("Authorization")
                stub.requests.append((self.path, auth))
                results = urlsplit(self.path).path.endswith("/results")
                if results:
                    stub.results.append((self.path, auth))
                    if stub.respond is not None and stub.respond(self):
                        return
                status, body, headers = stub.answer(self.path, auth) if results else stub.metadata(self.path, auth)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def refuse(self, auth: str | None, faults: list):
        if faults:
            status = faults.pop(0)
            return status, {"error": {"status": status, "detail": "try later"}}, {"Retry-After": "0"}
        if self.key and auth != f"Key {self.key}":
            return 403, {"error": {"status": 403, "detail": "Invalid API key."}}, {}
        return None

    def answer(self, path: str, auth: str | None):
        if self.hang_after is not None and len(self.results) > self.hang_after:
            self.stop.wait(30)
        if self.fail_after is not None and not self.faults and len(self.results) > self.fail_after:
            return 500, {"error": {"status": 500, "detail": "server error"}}, {}
        refused = self.refuse(auth, self.faults)
        if refused:
            return refused
        url = urlsplit(path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 5 or parts[:3] != ["api", "v2", "measurements"] or int(parts[3]) not in RECORDED:
            return 404, {"error": {"status": 404, "detail": "Not found."}}, {}
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        probes = {int(p) for p in q["probe_ids"].split(",")} if "probe_ids" in q else None
        rows = [r for r in RECORDED[int(parts[3])]
                if int(q.get("start", 0)) <= r["timestamp"] <= int(q.get("stop", 2**40))
                and (probes is None or r["prb_id"] in probes)]
        return 200, rows, {}

    def metadata(self, path: str, auth: str | None):
        refused = self.refuse(auth, self.meta_faults)
        if refused:
            return refused
        url = urlsplit(path)
        parts = url.path.split("/")
        if len(parts) == 6 and parts[1:4] == ["api", "v2", "measurements"] and parts[5] == "" \
                and parts[4].isdigit() and int(parts[4]) in self.measurements:
            return 200, self.measurements[int(parts[4])], {}
        if url.path == "/api/v2/probes/":
            return self.probes(parse_qs(url.query))
        return 404, {"error": {"status": 404, "detail": "Not found."}}, {}

    def probes(self, query: dict):
        q = {k: v[0] for k, v in query.items()}
        page, size = int(q.pop("page", 1)), min(int(q.pop("page_size", 50)), self.probe_page)
        unknown = set(q) - set(PROBE_FILTERS)
        if unknown:  # the real API ignores them; here a filter fetch does not mean to send fails
            return 400, {"error": {"status": 400, "detail": f"unknown filter {sorted(unknown)}"}}, {}
        found = [p for p in PROBES if all(PROBE_FILTERS[k](p, v) for k, v in q.items())]

        def link(n):
            return f"{PUBLIC}/api/v2/probes/?{urlencode({**q, 'page': n, 'page_size': size})}"

        last = (len(found) + size - 1) // size
        return 200, {"count": len(found), "next": link(page + 1) if page < last else None,
                     "previous": link(page - 1) if page > 1 else None,
                     "results": found[(page - 1) * size:page * size]}, {}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def ping_like(msm_id: int) -> dict:
    """The description of a ping measurement `msm_id` (2013's, under that id)."""
    return {**MEASUREMENTS[2013], "id": msm_id, "result": f"{PUBLIC}/api/v2/measurements/{msm_id}/results/"}


def _fetch(stub: AtlasStub, out: Path, msm: int, *extra: str, key: str | None = KEY):
    start, stop = SPANS[msm]
    env = {"RIPE_ATLAS_KEY": key} if key else {"RIPE_ATLAS_KEY": ""}
    return runner.invoke(app, ["fetch", str(msm), "-o", str(out), "--start", start, "--stop", stop, "--api", stub.url,
                               "--retry-wait", "0", *extra], env=env)


def _ingest(inputs: list[Path], out: Path):
    r = runner.invoke(app, ["ingest", *map(str, inputs), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rows = [r for f in sorted(out.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda d: json.dumps(d, sort_keys=True, default=str)), json.loads(r.stdout)


def _no_key_anywhere(tmp_path: Path, *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


@pytest.mark.slow  # two ingests
def test_two_measurements_one_resumed_equal_the_recorded_pages(tmp_path):
    out = tmp_path / "fetch"
    with AtlasStub() as stub:
        # 2013 in 6-hour windows; the API fails for good after its third answer
        stub.fail_after = 3
        r1 = _fetch(stub, out, 2013, "--window", "6h", "--retries", "2")
        assert r1.exit_code == 1, r1.output
        assert "run the same command again to resume" in r1.output
        progress = json.loads((out / "2013" / ".progress.json").read_text())
        assert len(progress["done"]) == 3
        assert not [f for f in (out / "2013").iterdir() if ".tmp-" in f.name]
        # healed: the rerun asks only for the 8 - 3 windows not done
        stub.fail_after, stub.results = None, []
        r2 = _fetch(stub, out, 2013, "--window", "6h", "--json")
        assert r2.exit_code == 0, r2.output
        s2 = json.loads(r2.stdout)
        assert (s2["windows_fetched"], s2["windows_kept"]) == (5, 3)
        assert len(stub.results) == 5
        assert all(auth == f"Key {KEY}" for _, auth in stub.requests)  # the key goes in the header only
        assert all(KEY not in path for path, _ in stub.requests)
        r3 = _fetch(stub, out, 49921351, "--json")
        assert r3.exit_code == 0, r3.output
        assert json.loads(r3.stdout)["results_fetched"] == len(RECORDED[49921351])
    assert sum(m["results_in_range"] for m in s2["measurements"]) == len(RECORDED[2013])

    recorded = tmp_path / "recorded"
    recorded.mkdir()
    for msm, rows in RECORDED.items():
        (recorded / f"{msm}.json").write_text(json.dumps(rows))
    (fetched, s_fetched), (expected, s_expected) = (_ingest([out], tmp_path / "ing_fetched"),
                                                    _ingest([recorded], tmp_path / "ing_recorded"))
    assert len(fetched) > 1000
    assert fetched == expected
    assert (s_fetched["records"], s_fetched["rejected_total"]) == (s_expected["records"], s_expected["rejected_total"])
    _no_key_anywhere(tmp_path, r1.output, r2.output, r3.output)


def test_a_killed_fetch_resumes_where_it_stopped(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "f"
    start, stop = SPANS[49921351]
    with AtlasStub() as stub:
        stub.hang_after = 2  # the third window's request never gets its answer
        env = {**os.environ, "RIPE_ATLAS_KEY": KEY}
        cmd = [sys.executable, "-m", "pingctl", "fetch", "49921351", "-o", str(out), "--start", start, "--stop", stop,
               "--api", stub.url, "--window", "6h"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(stub.results) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        first = proc.communicate(timeout=30)
        assert len(stub.results) == 3
        assert len(json.loads((out / "49921351" / ".progress.json").read_text())["done"]) == 2
        stub.hang_after, stub.results = None, []
        r = _fetch(stub, out, 49921351, "--window", "6h", "--json")
    assert r.exit_code == 0, r.output
    assert (json.loads(r.stdout)["windows_kept"], len(stub.results)) == (2, 2)
    got = [json.loads(line) for f in sorted((out / "49921351").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert got == RECORDED[49921351]  # every result once, in order
    _no_key_anywhere(tmp_path, r.output, *(b.decode() for b in first))


def test_429_and_5xx_are_retried(tmp_path):
    with AtlasStub() as stub:
        stub.faults = [429, 503, 502]
        r = _fetch(stub, tmp_path / "f", 2013, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["results_fetched"] == len(RECORDED[2013])
    assert "HTTP 429; retry 1 of 5" in r.stderr and "HTTP 502; retry 3 of 5" in r.stderr
    assert len(stub.results) == 3 + 2  # three refused tries, then the two daily windows


def test_retries_are_bounded(tmp_path):
    with AtlasStub() as stub:
        stub.faults = [503] * 10
        r = _fetch(stub, tmp_path / "f", 2013, "--retries", "3")
    assert r.exit_code == 1
    assert "measurement 2013" in r.output and "HTTP 503 after 3 tries" in r.output
    assert len(stub.results) == 3


def test_unknown_measurement_and_bad_key_are_named(tmp_path):
    with AtlasStub() as stub:
        start, stop = SPANS[2013]
        r = runner.invoke(app, ["fetch", "2013", "777", "-o", str(tmp_path / "f"), "--start", start, "--stop", stop,
                                "--api", stub.url, "--json"], env={"RIPE_ATLAS_KEY": KEY})
        assert r.exit_code == 1
        assert "measurement 777: HTTP 404" in r.stderr and "no such measurement" in r.stderr
        s = json.loads(r.stdout)
        assert [f["msm_id"] for f in s["failed"]] == [777]
        assert not (tmp_path / "f" / "777").exists()
        assert s["measurements"][0]["results_fetched"] == len(RECORDED[2013])  # the good one still fetched

        bad = "not-" + KEY
        r = _fetch(stub, tmp_path / "g", 2013, key=bad)
        assert r.exit_code == 1
        assert "measurement 2013: HTTP 403" in r.output and "RIPE_ATLAS_KEY" in r.output
        assert bad not in r.output
        assert not any(bad.encode() in f.read_bytes() for f in tmp_path.rglob("*") if f.is_file())


def test_probe_filter_and_refetch_guard(tmp_path):
    probe = RECORDED[2013][0]["prb_id"]
    with AtlasStub() as stub:
        r = _fetch(stub, tmp_path / "f", 2013, "--probe", str(probe), "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["results_fetched"] == sum(x["prb_id"] == probe for x in RECORDED[2013])
        assert f"probe_ids={probe}" in stub.results[0][0]
        # the same directory for all probes would mix two selections
        r = _fetch(stub, tmp_path / "f", 2013)
        assert r.exit_code == 2 and "--force" in r.output


def test_a_chunk_the_progress_does_not_list_is_fetched_again(tmp_path):
    out = tmp_path / "f"
    with AtlasStub() as stub:
        assert _fetch(stub, out, 2013).exit_code == 0
        d = out / "2013"
        p = json.loads((d / ".progress.json").read_text())
        # killed between the chunk's rename and the progress update: the chunk is there, unlisted
        p["done"] = p["done"][:1]
        (d / ".progress.json").write_text(json.dumps(p))
        stub.results = []
        r = _fetch(stub, out, 2013, "--json")
    assert r.exit_code == 0, r.output
    assert len(stub.results) == 1
    lines = sum(len(f.read_text().splitlines()) for f in d.glob("*.jsonl"))
    assert lines == len(RECORDED[2013])


def test_windows_cut_at_boundaries_and_skip_done():
    assert windows(10, 35, 10) == [(10, 20), (20, 30), (30, 35)]
    assert windows(5, 35, 10, [(10, 20)]) == [(5, 10), (20, 30), (30, 35)]
    assert windows(0, 20, 10, [(0, 20)]) == []
