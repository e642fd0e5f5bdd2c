"""`pingctl synth`: determinism, schema, addresses, physics, prefixes, failures, diurnal load,
row count, bounded memory, and the ground-truth median."""

from __future__ import annotations

import ipaddress
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pingctl.config import SynthConfig
from pingctl.schema.addresses import is_public, parse_address
from pingctl.schema.columns import arrow_schema
from pingctl.synth.generate import ROW_GROUP_ROWS, generate

SMALL = dict(rows=300_000, probes=30, targets=12, targets_per_probe=6, step=600, seed=7)


def _read(out: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("part-*.parquet")))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "small"
    summary = generate(SynthConfig(**SMALL), out)
    return out, summary, _read(out)


@pytest.fixture(scope="module")
def hosts(small):
    return pq.read_table(small[0] / "truth" / "hosts.parquet").to_pylist()


def _addr_index(hosts):
    idx = {}
    for h in hosts:
        idx[h["ipv4"]] = h
        if h["ipv6"]:
            idx[h["ipv6"]] = h
    return idx


# ---------------------------------------------------------------- determinism and layout


def _bytes(out: Path) -> dict[str, bytes]:
    return {str(f.relative_to(out)): f.read_bytes() for f in sorted(out.rglob("*.parquet"))}


def test_same_seed_identical_bytes_different_seed_differs(tmp_path):
    cfg = dict(rows=40_000, probes=20, targets=8, targets_per_probe=4)
    generate(SynthConfig(**cfg, seed=3), tmp_path / "a")
    generate(SynthConfig(**cfg, seed=3), tmp_path / "b")
    generate(SynthConfig(**cfg, seed=4), tmp_path / "c")
    a, b, c = _bytes(tmp_path / "a"), _bytes(tmp_path / "b"), _bytes(tmp_path / "c")
    assert a == b
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert a["part-00000.parquet"] != c["part-00000.parquet"]
    assert a["truth/hosts.parquet"] != c["truth/hosts.parquet"]


def test_layout_and_manifest(small):
    out, summary, table = small
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == SMALL["seed"] and manifest["config"]["rows"] == SMALL["rows"]
    assert manifest["rows"] == table.num_rows == summary["rows"]
    assert manifest["data_files"] == [p.name for p in sorted(out.glob("part-*.parquet"))]
    for name in ("hosts", "ases", "pairs", "routes", "outages"):
        assert (out / "truth" / f"{name}.parquet").is_file()
    assert manifest["pingctl_version"] and manifest["start"] == "2024-01-01T00:00:00Z"
    assert not list(out.parent.glob(".small.tmp-*"))  # atomic: no temp left behind


def test_schema_is_exactly_canonical(small):
    out = small[0]
    for f in out.glob("part-*.parquet"):
        assert pq.read_schema(f).equals(arrow_schema(), check_metadata=False)
        meta = pq.ParquetFile(f).metadata
        assert all(meta.row_group(i).num_rows <= ROW_GROUP_ROWS for i in range(meta.num_row_groups))
        assert meta.row_group(0).column(0).compression == "ZSTD"
    assert small[2].schema.equals(arrow_schema(), check_metadata=False)


def test_rows_close_to_requested_and_results_well_formed(small):
    _, summary, t = small
    packets = SynthConfig().packets
    assert SMALL["rows"] <= t.num_rows < SMALL["rows"] + packets
    times = t.column("event_time").cast(pa.int64()).to_numpy()
    assert np.all(np.diff(times) >= 0)  # time-ordered output
    # every packet of a result shares event_time: groups of exactly `packets` rows
    g = t.group_by(["msm_id", "prb_id", "event_time"]).aggregate([("rtt", "count")])
    assert set(g.column("rtt_count").to_pylist()) == {packets}
    assert t.column("prb_id").null_count == 0
    assert pc.min(t.column("msm_id")).as_py() >= 1_000_001
    assert set(t.column("size").to_pylist()) <= {20, 32, 48, 64, 1000}
    span = (times[-1] - times[0]) / 1e6
    assert abs(span - summary["span_s"]) <= 1 and span > 2 * 86_400  # several days for the small world


def test_addresses_parse_match_version_and_are_public(small):
    t = small[2]
    for col in ("src_addr", "dst_addr"):
        pairs = t.group_by([col, "ip_version"]).aggregate([]).to_pylist()
        for row in pairs:
            parsed = parse_address(row[col])
            assert parsed is not None, row
            assert parsed[0] == row[col]  # already canonical
            assert parsed[1] == row["ip_version"]
            assert is_public(row[col]), row
    assert set(t.column("ip_version").unique().to_pylist()) == {4, 6}


# ---------------------------------------------------------------- physics and structure


def _haversine_km(lat1, lon1, lat2, lon2, r=6371.0):
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * r * math.asin(math.sqrt(min(1.0, a)))


def test_no_packet_faster_than_light_in_fibre(small, hosts):
    t = small[2].filter(pc.greater_equal(small[2].column("rtt"), 0))
    mins = t.group_by(["src_addr", "dst_addr"]).aggregate([("rtt", "min")]).to_pylist()
    by_addr = _addr_index(hosts)
    fibre_km_per_ms = 299_792.458 * 2 / 3 / 1000
    far = 0
    for row in mins:
        s, d = by_addr[row["src_addr"]], by_addr[row["dst_addr"]]
        dist = _haversine_km(s["lat"], s["lon"], d["lat"], d["lon"])
        bound = 2 * dist / fibre_km_per_ms
        assert row["rtt_min"] >= bound, (row, dist, bound)
        far += dist > 3000
    assert far > 0  # some long paths exist, so the bound is not trivially small
    assert pc.min(t.column("rtt")).as_py() > 0


def test_prefixes_follow_as_and_region(small, hosts):
    from pingctl.synth.world import V4_SLASH8, V6_SLASH12

    ases = {a["asn"]: a for a in pq.read_table(small[0] / "truth" / "ases.parquet").to_pylist()}
    assert len({a["region"] for a in ases.values()}) >= 3
    for h in hosts:
        a = ases[h["asn"]]
        assert a["region"] == h["region"]
        v4 = ipaddress.ip_address(h["ipv4"])
        assert v4 in ipaddress.ip_network(h["v4_prefix"]) and h["v4_prefix"].endswith("/24")
        assert ipaddress.ip_network(h["v4_prefix"]).subnet_of(ipaddress.ip_network(a["v4_prefix"]))
        assert int(h["ipv4"].split(".")[0]) in V4_SLASH8[h["region"]]
        if h["ipv6"]:
            v6 = ipaddress.ip_address(h["ipv6"])
            assert v6 in ipaddress.ip_network(h["v6_prefix"]) and h["v6_prefix"].endswith("/48")
            assert ipaddress.ip_network(h["v6_prefix"]).subnet_of(ipaddress.ip_network(a["v6_prefix"]))
            assert v6 in ipaddress.ip_network((V6_SLASH12[h["region"]] << 112, 12))
        else:
            assert not h["dual_stack"]
    # hosts of one AS share its prefix; different ASes never share a /16
    assert len({a["v4_prefix"] for a in ases.values()}) == len(ases)
    assert len({a["v6_prefix"] for a in ases.values()}) == len(ases)


def test_probe_ids_and_access_types(hosts):
    probes = [h for h in hosts if h["role"] == "probe"]
    targets = [h for h in hosts if h["role"] == "target"]
    assert len(probes) == SMALL["probes"] and len(targets) == SMALL["targets"]
    assert len({h["prb_id"] for h in probes}) == len(probes)
    assert all(h["prb_id"] is None for h in targets)
    assert {h["access"] for h in probes} >= {"home", "datacenter"}
    assert sum(h["access"] == "datacenter" for h in targets) >= len(targets) // 2
    sat = [h["access_ms"] for h in hosts if h["access"] == "satellite"]
    assert all(25 <= x <= 50 for x in sat)


def test_failure_share_and_errors(small):
    t = small[2]
    rtt = t.column("rtt").to_numpy()
    err = t.column("packet_error_count").to_numpy()
    failed = rtt == -1.0
    assert 0.003 < failed.mean() < 0.10
    assert np.all(failed[err > 0])  # errors are failures
    assert 0 < np.count_nonzero(err) < np.count_nonzero(failed)
    assert np.all((rtt > 0) | failed)


def test_diurnal_evening_slower_than_morning_for_home_probes(small, hosts):
    t = small[2].filter(pc.greater(small[2].column("rtt"), 0))
    by_addr = _addr_index(hosts)
    src = t.column("src_addr").to_pylist()
    home = np.array([by_addr[s]["access"] == "home" for s in src])
    lon = np.array([by_addr[s]["lon"] for s in src])
    secs = t.column("event_time").cast(pa.int64()).to_numpy() / 1e6
    local_h = ((secs / 3600.0) + lon / 15.0) % 24
    rtt = t.column("rtt").to_numpy()
    # remove each stream's level so the comparison is within streams
    keys = pc.binary_join_element_wise(t.column("src_addr"), t.column("dst_addr"), ">").to_numpy(zero_copy_only=False)
    _, inv = np.unique(keys, return_inverse=True)
    med = np.array([np.median(rtt[inv == k]) for k in range(inv.max() + 1)])
    resid = rtt - med[inv]
    evening = home & (local_h >= 19) & (local_h < 23)
    morning = home & (local_h >= 3) & (local_h < 7)
    assert evening.sum() > 1000 and morning.sum() > 1000
    assert resid[evening].mean() > resid[morning].mean() + 1.0  # ms


# ---------------------------------------------------------------- ground truth


def test_jitter_median_constant_matches_model():
    from pingctl.synth import model as M

    assert abs(M._solve_jitter_median() - M.JITTER_MEDIAN) < 1e-9
    rng = np.random.default_rng(0)
    z = M.JITTER_W * rng.standard_exponential(400_000) + (1 - M.JITTER_W) * M.jitter_packet(rng.random(400_000))
    assert abs(np.mean(z <= M.JITTER_MEDIAN) - 0.5) < 0.003


def test_truth_median_matches_empirical_medians(small):
    from pingctl.synth.truth import load_truth, truth_median_ms

    out, _, t = small
    ok = t.filter(pc.greater(t.column("rtt"), 0))
    truth = load_truth(out)
    med = truth_median_ms(truth, ok.column("src_addr"), ok.column("dst_addr"), ok.column("ip_version"),
                          ok.column("event_time"))
    rtt = ok.column("rtt").to_numpy()
    assert not np.isnan(med).any()
    assert abs(np.mean(rtt < med) - 0.5) < 0.01  # it is the median, overall
    # per stream and 12-hour window: empirical median of the packets vs mean true median
    sid = truth.stream_index(ok.column("src_addr"), ok.column("dst_addr"), ok.column("ip_version"))
    win = (ok.column("event_time").cast(pa.int64()).to_numpy() // 1_000_000 - truth.start_s) // 43_200
    key = sid * 1000 + win
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    rel = []
    for g in np.split(order, bounds):
        if len(g) >= 150:
            rel.append(abs(np.median(rtt[g]) / np.median(med[g]) - 1))
    assert len(rel) > 100
    assert np.median(rel) < 0.02 and np.percentile(rel, 90) < 0.08
    # the truth is sharper than the data: predicting packets by it beats a per-stream constant
    per_stream = np.array([np.median(rtt[sid == s]) for s in np.unique(sid)])
    const = per_stream[np.searchsorted(np.unique(sid), sid)]
    assert np.mean(np.abs(rtt - med)) < np.mean(np.abs(rtt - const))
    # accepts plain Python inputs and flags unknown pairs
    row = ok.slice(0, 1).to_pylist()[0]
    got = truth_median_ms(out, [row["src_addr"], "192.0.2.1"], [row["dst_addr"], row["dst_addr"]],
                          [row["ip_version"], 4], np.array([row["event_time"].timestamp()] * 2))
    assert got[0] == pytest.approx(med[0]) and np.isnan(got[1])


def test_route_changes_and_outages_recorded(small):
    out = small[0]
    routes = pq.read_table(out / "truth" / "routes.parquet")
    pairs = pq.read_table(out / "truth" / "pairs.parquet")
    assert routes.num_rows > pairs.num_rows  # some streams change route
    assert pc.min(routes.column("shift_ms")).as_py() >= 0
    assert pc.all(pc.less(routes.column("start"), routes.column("end"))).as_py()
    assert pc.all(pc.greater_equal(pairs.column("inflation"), 1.0)).as_py()
    outages = pq.read_table(out / "truth" / "outages.parquet")
    assert outages.num_rows > 0
    assert set(outages.column("kind").to_pylist()) <= {"timeout", "unreachable"}


# ---------------------------------------------------------------- memory, CLI, bench


_RSS = (
    "import sys, tempfile, pathlib; from pingctl.config import SynthConfig; from pingctl.synth.generate import generate;"
    "from pingctl.benchutil import peak_rss_mb;"
    "d = tempfile.mkdtemp(); generate(SynthConfig(rows=int(sys.argv[1])), pathlib.Path(d) / 'o');"
    "import shutil; shutil.rmtree(d); print(peak_rss_mb())"
)


def _peak(rows: int) -> float:
    res = subprocess.run([sys.executable, "-c", _RSS, str(rows)], capture_output=True, text=True, check=True)
    return float(res.stdout.strip())


def test_memory_is_bounded_by_the_chunk_not_the_dataset():
    small, big = _peak(300_000), _peak(3_000_000)
    assert big - small < 60, (small, big)


def test_cli_json_and_refuses_foreign_dir(tmp_path):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    runner = CliRunner()
    out = tmp_path / "o"
    res = runner.invoke(app, ["synth", "-o", str(out), "--rows", "3000", "--probes", "10", "--targets", "4",
                              "--set", "data.synth.seed=5", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["rows"] == 3000 and summary["probes"] == 10
    assert json.loads((out / "manifest.json").read_text())["config"]["seed"] == 5
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("mine")
    res = runner.invoke(app, ["synth", "-o", str(foreign), "--rows", "100"])
    assert res.exit_code != 0 and (foreign / "x.txt").exists()
    res = runner.invoke(app, ["synth", "-o", str(tmp_path / "bad"), "--start", "yesterday"])
    assert res.exit_code == 2 and "ISO 8601" in res.output  # a config value error, before any work


def test_bench_synth_small():
    from pingctl.synth.bench import bench_synth

    r = bench_synth(20_000, 1)
    assert r["name"] == "synth" and r["table"][0]["rows"] >= 20_000
    assert {"rows_per_s", "mb_written", "peak_rss_mb"} <= set(r["table"][0])


def test_city_table():
    from pingctl.synth.world import load_cities

    c = load_cities()
    assert len(c["name"]) >= 150
    assert set(c["region"]) == {"RIPE", "ARIN", "APNIC", "LACNIC", "AFRINIC"}
    assert np.all(np.abs(c["lat"]) <= 90) and np.all(np.abs(c["lon"]) <= 180)
    assert len(set(zip(c["name"], c["country"]))) == len(c["name"])


@pytest.mark.parametrize("args", [
    ["--rows", "100", "--step", "999999999999"],       # MemoryError (110 GiB) before any range check
    ["--rows", "100", "--start", "9999-12-31T23:59:59"],  # "year 10000 is out of range"
    ["--rows", "100", "--start", "1999-12-31T00:00:00Z"],
])
def test_time_span_outside_valid_times_is_refused_before_any_work(tmp_path, args):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    r = CliRunner().invoke(app, ["synth", "-o", str(tmp_path / "s"), *args])
    assert r.exit_code == 2 and "generated times would span" in r.output and "internal error" not in r.output
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------- random addresses

RANDOM_WORLD = dict(rows=30_000, probes=2500, targets=250, targets_per_probe=3, step=600, dual_stack_share=0.5,
                    seed=11)


@pytest.fixture(scope="module")
def both_plans(tmp_path_factory):
    """One world, generated with structured and with random addresses."""
    d = tmp_path_factory.mktemp("plans")
    for plan in ("structured", "random"):
        generate(SynthConfig(**RANDOM_WORLD, addresses=plan), d / plan)
    return d / "structured", d / "random"


def test_random_addresses_are_public_unique_and_own_their_prefixes(both_plans):
    _, rnd = both_plans
    hosts = pq.read_table(rnd / "truth" / "hosts.parquet").to_pylist()
    v4 = [h["ipv4"] for h in hosts]
    v6 = [h["ipv6"] for h in hosts if h["ipv6"]]
    assert len(v4) == 2750 and len(v6) > 1000
    for a, version in [(a, 4) for a in v4] + [(a, 6) for a in v6]:
        assert parse_address(a) == (a, version) and is_public(a), a  # what every reader of a table accepts
        assert not ipaddress.ip_address(a).is_multicast
    assert len(set(v4)) == len(v4) and len(set(v6)) == len(v6)
    # A /24 or /48 per host: a prefix names at most one host, so a prefix median is the host's own.
    # (By chance alone 2,750 hosts would share a /24 with probability ~0.3; none may.)
    assert len({ipaddress.ip_network(f"{a}/24", strict=False) for a in v4}) == len(v4)
    assert len({ipaddress.ip_network(f"{a}/48", strict=False) for a in v6}) == len(v6)
    for h in hosts:  # the truth's prefixes are the host's own /24 and /48
        assert ipaddress.ip_address(h["ipv4"]) in ipaddress.ip_network(h["v4_prefix"])
        if h["ipv6"]:
            assert ipaddress.ip_address(h["ipv6"]) in ipaddress.ip_network(h["v6_prefix"])
    ases = pq.read_table(rnd / "truth" / "ases.parquet")
    assert ases.column("v4_prefix").null_count == ases.num_rows  # ASes own no address space


def test_random_addresses_carry_no_place_or_as(both_plans):
    from pingctl.synth.world import V4_SLASH8

    def stats(out):
        hosts = pq.read_table(out / "truth" / "hosts.parquet").to_pylist()
        own8 = np.mean([int(h["ipv4"].split(".")[0]) in V4_SLASH8[h["region"]] for h in hosts])
        by_as: dict = {}
        for h in hosts:
            by_as.setdefault(h["asn"], []).append(int(ipaddress.IPv4Address(h["ipv4"])) >> 16)
        # per AS of several hosts: the share of its hosts in distinct /16s
        distinct16 = [(len(set(v)) - 1) / (len(v) - 1) for v in by_as.values() if len(v) >= 5]
        return own8, float(np.mean(distinct16))

    own8_s, distinct16_s = stats(both_plans[0])
    own8_r, distinct16_r = stats(both_plans[1])
    assert own8_s == 1.0 and distinct16_s == 0.0  # structured: the region's /8s, one /16 per AS
    # random: the region's /8s only as often as they are a share of the address space (RIPE's
    # 36 /8s are the largest list: 16%), and an AS's hosts in as many /16s as hosts
    assert own8_r < 0.25 and distinct16_r > 0.95


def test_random_addresses_change_nothing_but_the_addresses(both_plans):
    from pingctl.synth.truth import truth_median_ms

    st, rnd = both_plans
    hs = pq.read_table(st / "truth" / "hosts.parquet")
    hr = pq.read_table(rnd / "truth" / "hosts.parquet")
    addr = {"ipv4", "ipv6", "v4_prefix", "v6_prefix"}
    for c in hs.column_names:
        if c not in addr:
            assert hs.column(c).equals(hr.column(c)), c
    for name in ("pairs", "routes", "outages"):
        a, b = pq.read_table(st / "truth" / f"{name}.parquet"), pq.read_table(rnd / "truth" / f"{name}.parquet")
        for c in a.column_names:
            if c not in ("src_addr", "dst_addr", "addr"):
                assert a.column(c).equals(b.column(c)), (name, c)
    ts, tr = _read(st), _read(rnd)
    assert ts.num_rows == tr.num_rows
    for c in ts.column_names:
        if c not in ("src_addr", "dst_addr"):
            assert ts.column(c).equals(tr.column(c)), c
    # the same host in both: each structured address maps to one random address, row by row
    rename = {}
    for s, r in zip(hs.to_pylist(), hr.to_pylist()):
        rename[s["ipv4"]] = r["ipv4"]
        if s["ipv6"]:
            rename[s["ipv6"]] = r["ipv6"]
    for c in ("src_addr", "dst_addr"):
        assert [rename[a] for a in ts.column(c).to_pylist()] == tr.column(c).to_pylist()
    ms = truth_median_ms(st, ts["src_addr"], ts["dst_addr"], ts["ip_version"], ts["event_time"])
    mr = truth_median_ms(rnd, tr["src_addr"], tr["dst_addr"], tr["ip_version"], tr["event_time"])
    assert np.isfinite(mr).all() and np.array_equal(ms, mr)


def test_random_addresses_are_deterministic_and_follow_the_seed(tmp_path):
    cfg = dict(rows=5_000, probes=40, targets=10, targets_per_probe=4, addresses="random")
    generate(SynthConfig(**cfg, seed=3), tmp_path / "a")
    generate(SynthConfig(**cfg, seed=3), tmp_path / "b")
    generate(SynthConfig(**cfg, seed=4), tmp_path / "c")
    a, b, c = _bytes(tmp_path / "a"), _bytes(tmp_path / "b"), _bytes(tmp_path / "c")
    assert a == b and a["truth/hosts.parquet"] != c["truth/hosts.parquet"]
    ha = pq.read_table(tmp_path / "a" / "truth" / "hosts.parquet").column("ipv4").to_pylist()
    hc = pq.read_table(tmp_path / "c" / "truth" / "hosts.parquet").column("ipv4").to_pylist()
    assert not set(ha) & set(hc)


def test_cli_addresses_option(tmp_path):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    runner = CliRunner()
    out = tmp_path / "o"
    res = runner.invoke(app, ["synth", "-o", str(out), "--rows", "3000", "--probes", "10", "--targets", "4",
                              "--addresses", "random", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["addresses"] == "random"
    assert json.loads((out / "manifest.json").read_text())["config"]["addresses"] == "random"
    res = runner.invoke(app, ["synth", "-o", str(tmp_path / "x"), "--addresses", "scrambled"])
    assert res.exit_code == 2 and "structured" in res.output


def test_synth_refuses_to_replace_another_world_without_force(tmp_path):
    """`synth -o DIR` onto a world once replaced its 50k rows with 1k, leaving the splits built
    from it stale. Another world (or another pingctl output) needs --force; the same world
    again (same config: the same bytes) is rewritten, so a script that regenerates reruns."""
    from typer.testing import CliRunner

    from pingctl.cli.app import app
    from pingctl.errors import UsageError

    runner = CliRunner()
    world = dict(rows=3000, probes=8, targets=4, targets_per_probe=2, seed=5)
    out = tmp_path / "world"
    generate(SynthConfig(**world), out)
    before = _bytes(out)
    args = ["synth", "-o", str(out), "--probes", "8", "--targets", "4", "--targets-per-probe", "2", "--seed", "5"]
    r = runner.invoke(app, [*args, "--rows", "1000", "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 2 and err["kind"] == "usage", r.output
    assert "holds another synth world" in err["message"] and "rows 3000 -> 1000" in err["message"]
    assert "--force" in err["message"] and _bytes(out) == before
    with pytest.raises(UsageError, match="seed 5 -> 6"):
        generate(SynthConfig(**dict(world, seed=6)), out)
    r = runner.invoke(app, [*args, "--rows", "3000"])  # the same world: rewritten, same bytes
    assert r.exit_code == 0, r.output
    assert _bytes(out) == before
    r = runner.invoke(app, [*args, "--rows", "1000", "--force", "--json"])
    assert r.exit_code == 0 and json.loads((out / "manifest.json").read_text())["config"]["rows"] == 1000
    # a pingctl output that is no world (here: build-rows') is not replaced by one either
    from pingctl.records.build import build_rows

    build_rows([out], tmp_path / "rows")
    with pytest.raises(UsageError, match="not a synth world"):
        generate(SynthConfig(**world), tmp_path / "rows")
    assert (tmp_path / "rows" / "manifest.json").is_file()
