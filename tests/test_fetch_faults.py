"""`pingctl fetch` under a hostile API and a careless key: real `pingctl fetch` processes
against the test API of tests/test_fetch.py (a real HTTP server on 127.0.0.1), whose
`respond` hook sends what a hostile server would: trickled bytes, huge or damaged pages."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from pingctl.ingest import fetch as fetch_mod, fetch_http
from pingctl.ingest.fetch import MAX_WINDOWS, window_count, windows
from pingctl.ingest.fetch_meta import Measurement
from pingctl.ingest.fetch_page import PageError, page_lines
from pingctl.cli.app import app
from tests.test_fetch import KEY, RECORDED, SPANS, AtlasStub, no_key_of_this_machine, ping_like, runner  # noqa: F401

DAY1 = "2019-05-01 00:00 to 2019-05-02 00:00 UTC"  # 2013's first daily window, as messages name it
SECRET = "SECRET"  # in every secret below: no output may hold it, however escaped


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes: the process's own high-water mark, since it started pingctl


# `python -m pingctl ARGS` that writes its VmHWM on exit: per address space, so unlike
# getrusage's ru_maxrss it does not count the test process's memory the child had before exec
_RUN = """
import atexit, runpy, sys
def report(path=sys.argv[1]):
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(path, "w") as out:
        out.write(kb)
atexit.register(report)
sys.argv = ["pingctl", *sys.argv[2:]]
runpy.run_module("pingctl", run_name="__main__", alter_sys=True)
"""


def _pingctl(args: list[str], env: dict | None = None, timeout: float = 60, stdin: bytes | None = None) -> Ran:
    """`pingctl ARGS` in a process of its own (`stdin` its standard input), with its peak
    memory; past `timeout` seconds it is killed, which fails the test."""
    full = {**os.environ, "RIPE_ATLAS_KEY": KEY, "PINGCTL_ATLAS_API": "", **(env or {})}
    with tempfile.NamedTemporaryFile("r") as hwm:
        try:
            done = subprocess.run([sys.executable, "-c", _RUN, hwm.name, *args], env=full, capture_output=True,
                                  timeout=timeout, input=stdin if stdin is not None else b"")
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-2000:].decode(errors="replace")
            raise AssertionError(f"pingctl {' '.join(args)} still running after {timeout} s: {tail}") from None
        peak = int(hwm.read() or 0) * 1024
    return Ran(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"), peak)


def _fetch_args(api: str, out: Path, *msm: int, extra: tuple[str, ...] = ()) -> list[str]:
    start, stop = SPANS[2013]
    return ["fetch", *map(str, msm or (2013,)), "-o", str(out), "--start", start, "--stop", stop, "--api", api,
            "--retry-wait", "0", *extra]


def _send(handler, body: bytes, status: int = 200) -> bool:
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up on it, as it may
        pass
    return True


def _written(out: Path) -> list[str]:
    """Every file under `out` but the progress files (chunks, temp files)."""
    return sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file() and f.name != ".progress.json")


def _nowhere(text: str, tmp_path: Path, ran: Ran) -> None:
    assert text not in ran.stdout and text not in ran.stderr
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert text.encode() not in f.read_bytes(), f


# -- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret, key_env", [
    ("MYSECRETKEY\n", "RIPE_ATLAS_KEY"),  # `echo KEY > file`
    ("abc\u2019SECRET", "RIPE_ATLAS_KEY"),  # not Latin-1: an HTTP header cannot carry it
    (b" MYSECRET\xffKEY", "MY_ATLAS_KEY"),  # not even UTF-8, in a variable of the user's choosing
], ids=["trailing-newline", "non-latin1", "bytes"])
def test_a_key_no_header_carries_as_it_is_is_refused_naming_the_variable_only(tmp_path, secret, key_env):
    # an API that never answers, so every retry message would quote the key
    r = _pingctl(_fetch_args("http://127.0.0.1:1", tmp_path / "f", extra=("--retries", "1", "--json",
                                                                            "--key-env", key_env)),
                 env={key_env: secret})
    assert r.code == 2, r.stderr
    assert json.loads(r.stdout)["error"]["kind"] == "usage"
    assert f"${key_env}" in r.stderr and "not shown" in r.stderr
    _nowhere(SECRET, tmp_path, r)
    assert not (tmp_path / "f").exists()  # refused before anything was written


@pytest.mark.parametrize("via", ["--api", "PINGCTL_ATLAS_API"])
def test_credentials_in_the_api_url_are_refused_never_shown(tmp_path, via):
    with AtlasStub() as stub:
        api = stub.url.replace("http://", "http://user:PASSWORD@")
        args = _fetch_args(api, tmp_path / "f", extra=("--json",))
        env = {"RIPE_ATLAS_KEY": KEY}
        if via != "--api":
            i = args.index("--api")
            del args[i:i + 2]
            env[via] = api
        r = _pingctl(args, env=env)
    assert r.code == 2, r.stderr
    assert "PASSWORD" not in r.stdout + r.stderr
    assert "$RIPE_ATLAS_KEY" in r.stderr and "http://***@127.0.0.1" in r.stderr
    assert stub.requests == []  # Basic auth in place of the key was never sent
    _nowhere(KEY, tmp_path, r)


# -- bounded in time and memory -----------------------------------------------------------------


@pytest.mark.parametrize("headers_first", [False, True], ids=["trickled-status-line", "trickled-body"])
def test_timeout_bounds_one_whole_answer_not_each_read(tmp_path, headers_first):
    body = b"[" + b" " * 10_000 + b"]"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    starts = []

    def trickle(handler):  # one byte every 0.2 s: each socket read succeeds, the answer takes 30 min
        starts.append(time.monotonic())
        data = head + body
        try:
            if headers_first:
                handler.wfile.write(head)
                data = body
            for i in range(len(data)):
                if stub.stop.wait(0.2):
                    break
                handler.wfile.write(data[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            pass
        return True

    with AtlasStub() as stub:
        stub.respond = trickle
        r = _pingctl(_fetch_args(stub.url, tmp_path / "f", extra=("--timeout", "1", "--retries", "2", "--json")))
    assert r.code == 1, r.stderr
    assert "no complete answer within --timeout 1 s after 2 tries" in r.stderr
    assert len(starts) == 2
    # the second try started when the first one's second was up, give or take a loaded machine
    assert 0.9 <= starts[1] - starts[0] < 6.0
    assert _written(tmp_path / "f") == []


def _page(n_bytes: int) -> bytes:
    rows = RECORDED[2013]
    one = len(json.dumps(rows))
    return json.dumps(rows * max(1, n_bytes // one)).encode()


def test_a_page_past_max_page_mb_fails_its_measurement_with_nothing_written(tmp_path):
    page = _page(3_000_000)
    with AtlasStub() as stub:
        stub.respond = lambda handler: _send(handler, page)
        r = _pingctl(_fetch_args(stub.url, tmp_path / "f", extra=("--max-page-mb", "1", "--json")))
    assert r.code == 1, r.stderr
    [failed] = json.loads(r.stdout)["failed"]
    assert f"measurement 2013, {DAY1}: damaged page" in failed["error"]
    assert "larger than 1 MB (--max-page-mb)" in failed["error"] and "--window" in failed["error"]
    assert len(stub.results) == 1  # a retry would get the same page
    assert not (tmp_path / "f" / "2013").exists()


@pytest.mark.slow  # two fetch processes and a 32 MB page, twice
def test_a_large_page_is_read_in_memory_that_does_not_grow_with_it(tmp_path):
    small, big = _page(1_000_000), _page(32_000_000)
    peaks = []
    for i, page in enumerate((small, big)):
        with AtlasStub() as stub:
            stub.respond = lambda handler, page=page: _send(handler, page)
            r = _pingctl(_fetch_args(stub.url, tmp_path / f"f{i}", extra=("--json",)), timeout=300)
        assert r.code == 0, r.stderr
        s = json.loads(r.stdout)
        assert s["results_fetched"] == len(json.loads(page)) * s["windows_fetched"] == len(json.loads(page)) * 2
        peaks.append(r.peak_rss)
    # the page whole in memory (and again decoded, and again as Python objects) grows the peak
    # by several times its size; read as it arrives, by one result and one network read
    assert peaks[1] - peaks[0] < len(big) / 4, (peaks, len(big))


def test_an_absurd_window_plan_is_refused_before_any_request(tmp_path):
    with AtlasStub() as stub:
        r = _pingctl(["fetch", "2013", "-o", str(tmp_path / "f"), "--start", "2000-01-01", "--stop", "2030-01-01",
                      "--window", "1s", "--api", stub.url, "--json"], timeout=60)
    assert r.code == 2, r.stderr
    assert "946,771,200 windows" in r.stderr and "--window" in r.stderr
    assert stub.requests == [] and not (tmp_path / "f").exists()
    assert r.peak_rss < 1 << 30


def test_window_count_is_the_number_of_windows_cut():
    rng = random.Random(7)
    for _ in range(300):
        start = rng.randrange(0, 10**6)
        stop, w = start + rng.randrange(1, 10**4), rng.choice([1, 7, 60, 3600, 86_400])
        assert window_count(start, stop, w) == len(windows(start, stop, w))
    assert MAX_WINDOWS >= 366 * 24  # a year of hourly windows is a plan fetch takes


# -- hostile pages ------------------------------------------------------------------------------

# measurement id -> (its page, what the failure names)
HOSTILE = {
    101: (b'[{"fw": 18446744073709551617}]', "result 1 holds what RIPE Atlas never sends (Integer exceeds 64-bit"),
    102: (b"[" * 400 + b"]" * 400, "result 1 is an array, not an object"),
    103: (b'[{"result": ' + b"[" * 400 + b"]" * 400 + b"}]", "result 1 holds what RIPE Atlas never sends (Recursion"),
    104: (b"[" * 100_000 + b"]" * 100_000, "result 1 is nested too deep"),
    105: (b'[{"prb_id": 1}, 7]', "result 2 is a number, not an object"),
    106: (b'[{"rtt": NaN}]', "NaN is not JSON"),
    107: (b'[{"from": "\xff"}]', "not UTF-8 text (byte 11)"),
    108: (b'[{"prb_id": 1}', "the end of the page after result 1"),
    109: (b'{"results": []}', "a JSON object, not a list of results"),
}


def test_hostile_pages_fail_their_measurement_naming_the_window_with_nothing_written(tmp_path):
    def hostile(handler):
        url = urlsplit(handler.path)
        msm = int(url.path.split("/")[4])
        if msm in HOSTILE:
            return _send(handler, HOSTILE[msm][0])
        if int(parse_qs(url.query)["start"][0]) >= 1556755200:  # 2013's second day: a number past 64 bits
            return _send(handler, b'[{"msm_id": 2013, "prb_id": ' + b"9" * 30 + b"}]")
        return False  # the recorded results

    out = tmp_path / "f"
    with AtlasStub() as stub:
        stub.measurements.update({m: ping_like(m) for m in HOSTILE})
        stub.respond = hostile
        # the hostile ones first: the good measurement after them is still fetched
        r = _pingctl(_fetch_args(stub.url, out, *HOSTILE, 2013, extra=("--json",)), env={"RIPE_ATLAS_KEY": KEY})
    assert r.code == 1, r.stderr
    s = json.loads(r.stdout)
    errors = {f["msm_id"]: f["error"] for f in s["failed"]}
    assert set(errors) == {*HOSTILE, 2013}
    for msm, (_, why) in HOSTILE.items():
        assert f"measurement {msm}, {DAY1}: damaged page from {stub.url}" in errors[msm], errors[msm]
        assert why in errors[msm], errors[msm]
        assert not (out / str(msm)).exists()
    assert "measurement 2013, 2019-05-02 00:00 to 2019-05-03 00:00 UTC: damaged page" in errors[2013]
    # the first day kept and recorded, nothing of the second
    day1 = [x for x in RECORDED[2013] if x["timestamp"] < 1556755200]
    assert _written(out) == ["2013/1556668800-1556755200.jsonl"]
    lines = (out / "2013" / "1556668800-1556755200.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == day1
    assert len(json.loads((out / "2013" / ".progress.json").read_text())["done"]) == 1
    assert len(stub.results) == len(HOSTILE) + 2  # a damaged page is not asked for again


# -- damaged progress ---------------------------------------------------------------------------


@pytest.mark.parametrize("progress, why", [
    ({"done": [{"start": 1556668800}]}, "done[0]: start and stop"),
    ({"done": [{"start": 1556755200, "stop": 1556668800, "results": 0, "file": None}]}, "done[0]: start and stop"),
    ({"done": [{"start": "1556668800", "stop": 1556755200, "results": 0, "file": None}]}, "done[0]: start and stop"),
    ({"done": [{"start": 1556668800, "stop": 1556755200, "results": -1, "file": None}]}, "done[0]: results"),
    ({"done": [{"start": 1556668800, "stop": 1556755200, "results": 3, "file": "../../x"}]}, "done[0]: file"),
    ({"done": [{"start": 1556668800, "stop": 1556755200, "results": 3}]}, "done[0]: file"),
    ({"done": [7]}, "done[0] is not an object"),
    ({"done": [], "probe_ids": "all"}, "probe_ids"),
    ("[" * 100_000, "nested too deep"),
], ids=["no-stop", "stop-before-start", "string-time", "negative-count", "foreign-file", "no-file", "not-object",
        "probe-ids", "deep"])
def test_a_damaged_progress_file_is_refused_with_the_force_advice(tmp_path, progress, why):
    d = tmp_path / "f" / "2013"
    d.mkdir(parents=True)
    (d / ".progress.json").write_text(progress if isinstance(progress, str) else json.dumps(progress))
    start, stop = SPANS[2013]
    with AtlasStub() as stub:
        r = runner.invoke(app, ["fetch", "2013", "-o", str(tmp_path / "f"), "--start", start, "--stop", stop,
                                        "--api", stub.url, "--json"], env={"RIPE_ATLAS_KEY": KEY})
        assert r.exit_code == 1, r.output
        message = json.loads(r.stdout)["error"]["message"]
        assert "damaged fetch progress" in message and why in message and "--force" in message
        assert stub.requests == []
        # the advice works
        r = runner.invoke(app, ["fetch", "2013", "-o", str(tmp_path / "f"), "--start", start, "--stop", stop,
                                        "--api", stub.url, "--force", "--json"], env={"RIPE_ATLAS_KEY": KEY})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["results_fetched"] == len(RECORDED[2013])


# -- the pieces -----------------------------------------------------------------------------------


def test_a_page_cut_anywhere_reads_as_the_whole():
    text = json.dumps([{"a": 123, "b": [1.5, -2e-3, True, None], "c": "x\u2019\\\"y"}, {"d": 45678}], indent=1)
    whole = [orjson.dumps(r) + b"\n" for r in json.loads(text)]
    for cut in range(len(text) + 1):
        assert list(page_lines([text[:cut], text[cut:]])) == whole, cut
    assert list(page_lines(text)) == whole  # a character at a time
    assert list(page_lines([" [ ] \n"])) == []


def test_the_deadline_interrupts_a_blocked_read_and_restores_what_it_replaced():
    seen = []
    previous = signal.signal(signal.SIGALRM, lambda *a: seen.append("outer"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        t0 = time.monotonic()
        with pytest.raises(fetch_http._Expired):
            with fetch_http._deadline(0.2):
                time.sleep(10)
        assert time.monotonic() - t0 < 5
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left <= 30  # the outer alarm, put back
        assert seen == []
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.5)
        assert seen == ["outer"]  # and its handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_error_that_quotes_the_key_leaves_fetch_without_it(tmp_path, monkeypatch):
    def quoting(*args, **kw):
        raise ValueError(f"Invalid header value b'Key {KEY}'")

    monkeypatch.setattr(fetch_mod, "measurement_info",
                        lambda api, m, *a: Measurement(m, "ping", 6, 1325376000, None, "Ongoing"))
    monkeypatch.setattr(fetch_mod, "get_window", quoting)
    api = fetch_http.Api(base="http://127.0.0.1:1", key=KEY)
    with pytest.raises(RuntimeError) as e:
        fetch_mod.fetch([2013], tmp_path / "f", 1556668800, 1556755200, api=api)
    assert KEY not in str(e.value) and "ValueError: Invalid header value b'Key ***'" in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__


# -- the page parser, fuzzed ----------------------------------------------------------------------

_LEAVES = ["0", "-0", "1.5", "-2e-3", "1e400", "true", "false", "null", '"x"', '"\\u2019"', '"\\ud800"', '"\\n"',
           str(2**63 - 1), str(2**63), str(2**64 - 1), str(2**64), str(-2**63), str(-2**63 - 1), "9" * 5000,
           "NaN", "Infinity", "-Infinity", '"\u00e9\u2019"']
_DEPTHS = [0, 1, 3, 254, 255, 256, 400, 1000, 1500, 5000, 100_000]


def _value(rng: random.Random, depth: int) -> str:
    r = rng.random()
    if depth > 2 or r < 0.5:
        return rng.choice(_LEAVES)
    if r < 0.6:
        n = rng.choice(_DEPTHS)
        inner = _value(rng, depth + 1)
        return ("[" * n + inner + "]" * n) if rng.random() < 0.5 else ('{"k":' * n + inner + "}" * n)
    if r < 0.8:
        return "[" + ",".join(_value(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    return "{" + ",".join(f'"k{i}":{_value(rng, depth + 1)}' for i in range(rng.randrange(4))) + "}"


def _hostile(rng: random.Random) -> str:
    items = [_value(rng, 1) if rng.random() < 0.15 else
             "{" + ",".join(f'"f{i}": {_value(rng, 1)}' for i in range(rng.randrange(5))) + "}"
             for _ in range(rng.randrange(6))]
    ws = rng.choice(["", " ", "\n  ", "\t"])
    text = "[" + ws + ("," + ws).join(items) + ws + "]"
    if rng.random() < 0.1:
        text = _value(rng, 0)  # not an array at all
    r = rng.random()
    if r < 0.15:
        text = text[:rng.randrange(len(text) + 1)]
    elif r < 0.3:
        i = rng.randrange(len(text) + 1)
        text = text[:i] + rng.choice('[]{},:"\\ x\x00') + text[i:]
    return text


def _expected(text: str) -> list[bytes] | None:
    """What page_lines must yield, by the standard library and orjson; None: a PageError."""
    def refuse(name):
        raise ValueError(name)

    try:
        page = json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return None
    if not isinstance(page, list) or not all(isinstance(r, dict) for r in page):
        return None
    try:
        return [orjson.dumps(r) + b"\n" for r in page]
    except orjson.JSONEncodeError:
        return None


def _cut(rng: random.Random, text: str) -> list[str]:
    size = rng.choice([1, 2, 3, 7, 64, 4096, len(text) + 1])
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.slow  # a few seconds
def test_page_parser_fuzzed_accepts_exactly_what_json_lines_can_carry():
    rng = random.Random(20190501)
    t0, outcomes = time.monotonic(), {"ok": 0, "refused": 0}
    for case in range(600):
        text = _hostile(rng)
        want = _expected(text)
        pieces = _cut(rng, text)
        if want is None:
            with pytest.raises(PageError):
                list(page_lines(pieces))
            outcomes["refused"] += 1
        else:
            assert list(page_lines(pieces)) == want, (case, text[:200])
            outcomes["ok"] += 1
    assert min(outcomes.values()) > 60, outcomes  # both sides of the line were exercised
    assert time.monotonic() - t0 < 60
