"""`pingctl fetch` as ripe-atlas-tools users work: their key sources, their probe lists and
filters, times defaulting to the measurement's own and written relative to now, a measurement
refused by its type. Real `pingctl fetch` processes against the test API of tests/test_fetch.py
(a real HTTP server on 127.0.0.1 answering from recorded results, measurement descriptions and
probe lists)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError
from pingctl.ingest import fetch_http
from tests.test_fetch import KEY, PROBES, RECORDED, SPANS, AtlasStub, no_key_of_this_machine, ping_like  # noqa: F401
from tests.test_fetch_faults import _pingctl

LIFE = {49921351: (1676152800, 1676757600)}  # its start_time and stop_time (tests/fixtures/ripe_api)
OTHER = "0ther-" + KEY  # a key the test API refuses


def _args(stub: AtlasStub, out: Path, *extra: str, msm: int = 49921351, span: bool = True) -> list[str]:
    when = ["--start", SPANS[msm][0], "--stop", SPANS[msm][1]] if span else []
    return ["fetch", str(msm), "-o", str(out), "--api", stub.url, "--retry-wait", "0", "--json", *when, *extra]


def _rows(out: Path, msm: int) -> list[dict]:
    return [json.loads(line) for f in sorted((out / str(msm)).glob("*.jsonl")) for line in f.read_text().splitlines()]


def _query(path: str) -> dict:
    return {k: v[0] for k, v in parse_qs(urlsplit(path).query).items()}


def _unshown(secret: str, *texts: str, under: Path | None = None) -> None:
    for text in texts:
        assert secret not in text
    for f in under.rglob("*") if under else ():
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def _rc(home: Path, key: str, xdg: Path | None = None) -> Path:
    rc = (xdg or home / ".config") / "ripe-atlas-tools" / "rc"
    rc.parent.mkdir(parents=True)
    rc.write_text(f"# Authorisation\nauthorisation:\n  create: ''\n  fetch: {key}\n  fetch_aliases: {{}}\n")
    return rc


# -- the key ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["ATLAS_FETCH_KEY", "rc", "rc-xdg", "RIPE_ATLAS_KEY-first", "ATLAS_FETCH_KEY-first"])
def test_the_key_is_read_where_ripe_atlas_tools_users_keep_it_and_its_source_named(tmp_path, where):
    home, env = tmp_path / "home", {"RIPE_ATLAS_KEY": ""}
    if where == "ATLAS_FETCH_KEY":
        env["ATLAS_FETCH_KEY"], source = KEY, "$ATLAS_FETCH_KEY"
    elif where == "rc":
        source = f"authorisation.fetch in {_rc(home, KEY)}"
    elif where == "rc-xdg":  # ripe-atlas-tools reads $XDG_CONFIG_HOME/ripe-atlas-tools/rc when it is set
        _rc(home, OTHER)
        env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
        source = f"authorisation.fetch in {_rc(home, KEY, tmp_path / 'xdg')}"
    elif where == "RIPE_ATLAS_KEY-first":
        env.update(RIPE_ATLAS_KEY=KEY, ATLAS_FETCH_KEY=OTHER)
        _rc(home, OTHER)
        source = "$RIPE_ATLAS_KEY"
    else:
        env["ATLAS_FETCH_KEY"], source = KEY, "$ATLAS_FETCH_KEY"
        _rc(home, OTHER)
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f"), env=env)
    assert r.code == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["key"], s["key_source"]) == (True, source)
    assert s["results_fetched"] == len(RECORDED[49921351])
    assert {auth for _, auth in stub.requests} == {f"Key {KEY}"}
    _unshown(KEY, r.stdout, r.stderr, under=tmp_path / "f")


@pytest.mark.parametrize("where", ["--key-env", "ATLAS_FETCH_KEY", "rc"])
def test_a_refused_key_names_the_source_it_came_from_never_the_key(tmp_path, where):
    env, extra = {"RIPE_ATLAS_KEY": ""}, ()
    if where == "--key-env":
        env["MY_ATLAS_KEY"], extra, source = OTHER, ("--key-env", "MY_ATLAS_KEY"), "$MY_ATLAS_KEY"
    elif where == "ATLAS_FETCH_KEY":
        env["ATLAS_FETCH_KEY"], source = OTHER, "$ATLAS_FETCH_KEY"
    else:
        source = f"authorisation.fetch in {_rc(tmp_path / 'home', OTHER)}"
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", *extra), env=env)
    assert r.code == 1, r.stderr
    [failed] = json.loads(r.stdout)["failed"]
    assert "measurement 49921351: HTTP 403" in failed["error"]
    assert f"the key from {source} is not valid" in failed["error"]
    if where != "rc":
        assert "RIPE_ATLAS_KEY" not in r.stderr
    _unshown(OTHER, r.stdout, r.stderr, under=tmp_path / "f")


def test_an_rc_file_that_is_not_yaml_is_named_by_its_line_never_shown(tmp_path):
    rc = tmp_path / "home" / ".config" / "ripe-atlas-tools" / "rc"
    rc.parent.mkdir(parents=True)
    rc.write_text(f"authorisation:\n  fetch: {KEY}\n  create: [SECRET\n")  # the list is never closed
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f"), env={"RIPE_ATLAS_KEY": ""})
    assert r.code == 1, r.stderr
    assert f"{rc}: not valid YAML at line" in r.stderr
    _unshown(KEY, r.stdout, r.stderr)
    _unshown("SECRET", r.stdout, r.stderr)
    assert stub.requests == []


def test_an_explicit_key_env_that_is_unset_is_refused(tmp_path):
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", "--key-env", "MY_ATLAS_KEY"), env={"RIPE_ATLAS_KEY": KEY})
    assert r.code == 2, r.stderr
    assert "$MY_ATLAS_KEY is unset or empty" in r.stderr
    assert stub.requests == []
    _unshown(KEY, r.stdout, r.stderr)


# -- probes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["comma-list", "repeated", "file", "stdin"])
def test_probes_as_a_comma_list_a_file_or_standard_input(tmp_path, how):
    ids = [6090, 33194]
    stdin = None
    if how == "comma-list":
        extra = ("--probe", "6090,33194")
    elif how == "repeated":
        extra = ("--probe", "33194", "--probes", "6090")
    elif how == "file":
        (tmp_path / "probes.txt").write_text("# the two probes\n6090\n\n33194  # and this one\n")
        extra = ("--probe", str(tmp_path / "probes.txt"))
    else:
        extra, stdin = ("--probe", "-"), b"6090\n33194\n"
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", *extra, msm=2013), stdin=stdin)
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["probe_ids"] == ids
    assert {_query(p)["probe_ids"] for p, _ in stub.results} == {"6090,33194"}
    want = [x for x in RECORDED[2013] if x["prb_id"] in ids]
    assert want and _rows(tmp_path / "f", 2013) == want


def test_a_probe_file_with_something_else_is_refused_naming_its_line(tmp_path):
    (tmp_path / "probes.txt").write_text("6090\n33194 x17\n")
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", "--probe", str(tmp_path / "probes.txt")))
    assert r.code == 2, r.stderr
    assert f"--probe {tmp_path / 'probes.txt'} line 2: 'x17' is not a probe id" in r.stderr
    assert stub.requests == []


@pytest.mark.parametrize("msm, options, selects", [
    # 2013 is IPv6: the AS that announces the probe's IPv6 address
    (2013, ("--probe-asn", "3320"), lambda p: p["asn_v6"] == 3320),
    (2013, ("--probe-asn", "AS3320,1136", "--probe-country", "de"),
     lambda p: p["asn_v6"] in (3320, 1136) and p["country_code"] == "DE"),
    (49921351, ("--probe-country", "NL,GB"), lambda p: p["country_code"] in ("NL", "GB")),
    (49921351, ("--probe-prefix", "83.5.171.244/16"),
     lambda p: (p["address_v4"] or "").startswith("83.5.")),
], ids=["asn-v6", "asns-and-country", "countries", "prefix"])
def test_probe_filters_are_resolved_from_the_probe_list_the_api_serves(tmp_path, msm, options, selects):
    chosen = sorted(p["id"] for p in PROBES if selects(p))
    with AtlasStub() as stub:
        stub.probe_page = 4  # the listing comes in pages, linked by `next` on the public host
        r = _pingctl(_args(stub, tmp_path / "f", *options, msm=msm))
    assert r.code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["measurements"][0]["probes"] == len(chosen) > 0
    listed = [p for p, _ in stub.requests if urlsplit(p).path == "/api/v2/probes/"]
    assert len(listed) == -(-len(chosen) // 4)  # every page, each asked of --api
    assert {_query(p)["probe_ids"] for p, _ in stub.results} == {",".join(map(str, chosen))}
    want = [x for x in RECORDED[msm] if x["prb_id"] in chosen]
    assert want and _rows(tmp_path / "f", msm) == want


def test_a_filter_that_selects_no_probe_fails_its_measurement(tmp_path):
    with AtlasStub() as stub:
        r = CliRunner().invoke(app, _args(stub, tmp_path / "f", "--probe-asn", "64512", msm=2013),
                               env={"RIPE_ATLAS_KEY": KEY})
    assert r.exit_code == 1, r.output
    assert "measurement 2013: no probe of AS 64512 (IPv6)" in r.stderr
    assert stub.results == [] and not (tmp_path / "f" / "2013").exists()


def test_more_probe_ids_than_one_request_carries_are_asked_in_chunks_into_one_window_file(tmp_path):
    ids = sorted({x["prb_id"] for x in RECORDED[2013]} | set(range(100_000, 101_100)))
    (tmp_path / "probes.txt").write_text(",".join(map(str, ids)))
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", "--probe", str(tmp_path / "probes.txt"), msm=2013))
    assert r.code == 0, r.stderr
    asked = [_query(p)["probe_ids"].split(",") for p, _ in stub.results]
    assert len(asked) == 2 * 3 and max(map(len, asked)) == fetch_http.PROBE_CHUNK  # two days, three requests each
    assert sorted(int(i) for a in asked[:3] for i in a) == ids
    assert len(list((tmp_path / "f" / "2013").glob("*.jsonl"))) == 1  # the second day has no results
    assert sorted(_rows(tmp_path / "f", 2013), key=json.dumps) == sorted(RECORDED[2013], key=json.dumps)


# -- times --------------------------------------------------------------------------------------


def test_without_start_and_stop_the_measurements_own_life_is_fetched(tmp_path):
    with AtlasStub() as stub:
        r = _pingctl(_args(stub, tmp_path / "f", span=False))
    assert r.code == 0, r.stderr
    s = json.loads(r.stdout)
    [m] = s["measurements"]
    assert (m["start"], m["stop"]) == ("2023-02-11T22:00:00Z", "2023-02-18T22:00:01Z")  # stop_time is inclusive
    assert m["measurement"]["status"] == "Stopped"
    asked = [(int(_query(p)["start"]), int(_query(p)["stop"])) for p, _ in stub.results]
    assert (asked[0][0], asked[-1][1]) == LIFE[49921351]
    assert s["results_fetched"] == len(RECORDED[49921351]) and not s["warnings"]


def test_times_relative_to_now(tmp_path):
    with AtlasStub() as stub:
        # from long before the measurement to now: its whole life, no request past its stop
        r = _pingctl(_args(stub, tmp_path / "f", "--start", "5000 days ago", "--stop", "now", span=False))
        assert r.code == 0, r.stderr
        [m] = json.loads(r.stdout)["measurements"]
        assert (m["start"], m["stop"], m["results_fetched"]) == ("2023-02-11T22:00:00Z", "2023-02-18T22:00:01Z",
                                                                  len(RECORDED[49921351]))
        stub.results = []
        # the last week: after the measurement stopped, so nothing is asked and the warning says why
        r = _pingctl(_args(stub, tmp_path / "g", "--lookback", "7d", span=False))
    assert r.code == 0, r.stderr
    assert stub.results == []
    assert "warning: measurement 49921351 ran from 2023-02-11 22:00 UTC to 2023-02-18 22:00 UTC; your window" \
           in " ".join(r.stderr.split())
    assert "outside its life: nothing was asked" in r.stderr


def test_a_window_without_results_warns_with_the_measurements_life(tmp_path):
    with AtlasStub() as stub:
        r = _pingctl(["fetch", "2013", "-o", str(tmp_path / "f"), "--api", stub.url, "--start", "2019-05-10",
                      "--stop", "2019-05-11", "--json"])
    assert r.code == 0, r.stderr
    want = ("measurement 2013 ran from 2012-01-01 00:00 UTC to now (Ongoing); your window 2019-05-10 00:00 to "
            "2019-05-11 00:00 UTC has no results")
    assert json.loads(r.stdout)["warnings"] == [want]
    assert want in " ".join(r.stderr.split())
    assert len(stub.results) == 1


def test_a_measurement_that_is_not_a_ping_is_refused_by_its_type(tmp_path):
    with AtlasStub() as stub:
        r = _pingctl(["fetch", "2013", "5001", "-o", str(tmp_path / "f"), "--api", stub.url, "--json"])
    assert r.code == 2, r.stderr
    assert "measurement 5001 is a traceroute measurement: pingctl fetch reads ping measurements only" in r.stderr
    assert stub.results == [] and not (tmp_path / "f").exists()


@pytest.mark.parametrize("text, why", [("yesterday", "or now, or a time ago"), ("7 fortnights ago", "7d, 6h"),
                                       ("", "is empty")])
def test_a_time_that_is_neither_is_refused(tmp_path, text, why):
    r = CliRunner().invoke(app, ["fetch", "2013", "-o", str(tmp_path / "f"), "--start", text])
    assert r.exit_code == 2, r.output
    assert why in r.stderr


def test_a_measurement_description_not_as_the_api_writes_it_fails_its_measurement(tmp_path):
    with AtlasStub() as stub:
        stub.measurements[777] = {**ping_like(777), "start_time": "2012-01-01T00:00:00Z"}
        stub.meta_faults = [503]  # retried, as a window is
        args = _args(stub, tmp_path / "f", msm=2013)
        r = CliRunner().invoke(app, [*args[:2], "777", *args[2:]], env={"RIPE_ATLAS_KEY": KEY})
    assert r.exit_code == 1, r.output
    [failed] = json.loads(r.stdout)["failed"]
    assert failed["msm_id"] == 777 and "its start_time is not what the RIPE Atlas API sends" in failed["error"]
    assert "HTTP 503; retry 1 of 5" in r.stderr
    assert json.loads(r.stdout)["measurements"][0]["results_fetched"] == len(RECORDED[2013])


# -- ripe-atlas-cousteau ------------------------------------------------------------------------


def test_cousteau_is_pinned_to_the_range_fetch_was_tested_with():
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    pins = [Requirement(r) for reqs in extras.values() for r in reqs if r.startswith("ripe-atlas-cousteau")]
    assert pins and all(str(p.specifier) == str(Requirement("x" + fetch_http.COUSTEAU_RANGE).specifier)
                        for p in pins)
    assert any(s.operator == "<" for s in pins[0].specifier)  # an upper bound: a new release is tried first
    assert pins[0].specifier.contains(version("ripe-atlas-cousteau"))


def test_cousteau_builds_the_requests_fetch_sends():
    api = fetch_http.Api(base="http://127.0.0.1:8000/proxy", key=KEY)
    url, args = fetch_http.cousteau_request(api, msm_id=2013, start=fetch_http.utc(1556668800),
                                            stop=fetch_http.utc(1556755199), probe_ids=[6090, 33194])
    assert url == "http://127.0.0.1:8000/proxy/api/v2/measurements/2013/results"
    assert args["params"] == {"start": 1556668800, "stop": 1556755199, "probe_ids": "6090,33194"}
    assert args["headers"]["Authorization"] == f"Key {KEY}"
    url, args = fetch_http.cousteau_request(api, url_path="/api/v2/probes/", params={"asn_v4": 3320})
    assert (url, args["params"]) == ("http://127.0.0.1:8000/proxy/api/v2/probes/", {"asn_v4": 3320})
    assert args["headers"]["Authorization"] == f"Key {KEY}"


def test_a_cousteau_that_builds_its_requests_otherwise_is_named_not_a_crash(monkeypatch):
    from ripe.atlas import cousteau

    class Changed:  # a release whose request objects keep their arguments elsewhere
        def __init__(self, **kw):
            self.url_path = "/api/v2/measurements/2013/results"

    monkeypatch.setattr(cousteau, "AtlasResultsRequest", Changed)
    with pytest.raises(PingctlError) as e:
        fetch_http.cousteau_request(fetch_http.Api(key=KEY), msm_id=2013)
    assert f"tested with ripe-atlas-cousteau{fetch_http.COUSTEAU_RANGE}" in str(e.value)
    assert "http_method_args" in str(e.value) and KEY not in str(e.value)


def test_a_retried_request_of_a_window_leaves_only_its_good_answer(tmp_path):
    path = tmp_path / "w.jsonl"
    with fetch_http._Sink(path) as sink:
        sink.write(b"1\n")
        mark = sink.mark()
        sink.write(b"2\n")  # a try that then failed
        sink.rollback(mark)
        sink.write(b"3\n")
    assert (path.read_bytes(), sink.n) == (b"1\n3\n", 2)
    with fetch_http._Sink(tmp_path / "none.jsonl") as sink:
        sink.write(b"1\n")
        sink.rollback((0, 0))
    assert list(tmp_path.iterdir()) == [path]  # no file, and no temp file, for a window without results
