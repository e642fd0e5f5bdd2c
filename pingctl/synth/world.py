"""Build the synthetic world: hosts in real cities, ASes with region-consistent prefixes,
measurement streams with their ground-truth parameters, route changes and outages.

Everything here is O(hosts + streams + events) and runs once; the per-packet work lives in
`pingctl.synth.generate`. Each component draws from its own seeded stream, so changing e.g.
`rows` changes only the time-dependent parts (route changes, outages), not the hosts.
"""

from __future__ import annotations

import csv
import datetime as dt
import ipaddress
import math
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from pingctl.errors import ConfigError, PingctlError
from pingctl.schema.times import generated_time_range, MIN_TIME, utc_text
from pingctl.synth import model as M

DAY = 86_400.0
MSM_ID_BASE = 1_000_001
MAX_HOSTS = 200_000

# Where probes / targets are (RIPE Atlas is Europe-heavy); within a region cities are drawn
# by population (probes) or population ** TARGET_POP_EXP (datacenters concentrate in hubs).
PROBE_REGION_SHARE = {"RIPE": 0.52, "ARIN": 0.20, "APNIC": 0.16, "LACNIC": 0.06, "AFRINIC": 0.06}
TARGET_REGION_SHARE = {"RIPE": 0.40, "ARIN": 0.30, "APNIC": 0.20, "LACNIC": 0.05, "AFRINIC": 0.05}
TARGET_POP_EXP = 1.3
PROBE_ACCESS_SHARE = {"home": 0.58, "datacenter": 0.22, "mobile": 0.12, "satellite": 0.08}
TARGET_ACCESS_SHARE = {"home": 0.08, "datacenter": 0.92, "mobile": 0.0, "satellite": 0.0}

# Per access type: access delay (ms, lognormal median/sigma; satellite uniform low..high),
# off-peak jitter scale (ms, lognormal), jitter gain at the diurnal peak, diurnal amplitude
# (ms, lognormal), local peak hour (normal mean/sd), per-packet loss (median, lognormal sd 0.7).
ACCESS_PARAMS = {
    "home": {"access": (6.0, 0.6), "jitter": (0.8, 0.5), "gain": 1.0, "amp": (4.0, 0.6), "peak": (21.0, 0.7),
             "loss": 0.003},
    "datacenter": {"access": (0.3, 0.5), "jitter": (0.08, 0.4), "gain": 0.0, "amp": (0.0, 0.0),
                   "peak": (14.0, 2.0), "loss": 0.0005},
    "mobile": {"access": (28.0, 0.3), "jitter": (5.0, 0.4), "gain": 1.5, "amp": (10.0, 0.5), "peak": (20.0, 1.0),
               "loss": 0.01},
    "satellite": {"access": (25.0, 50.0), "jitter": (6.0, 0.3), "gain": 0.8, "amp": (6.0, 0.5), "peak": (21.0, 0.7),
                  "loss": 0.015},
}

# Real-looking RIR resources: IPv4 /8s mostly administered by the RIR, its IPv6 /12, 32-bit ASN block.
V4_SLASH8 = {
    "RIPE": [2, 5, 31, 37, 46, 62, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
             109, 176, 178, 185, 188, 193, 194, 195, 212, 213, 217],
    "ARIN": [23, 24, 50, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 96, 97, 98, 99, 104, 107, 108,
             173, 174, 184, 199, 204, 205, 206, 207, 208, 209, 216],
    "APNIC": [1, 14, 27, 36, 39, 42, 43, 49, 58, 59, 60, 61, 101, 103, 106, 110, 111, 112, 113, 114, 115, 116,
              117, 118, 119, 120, 121, 122, 123, 124, 125, 175, 180, 182, 183, 202, 203, 210, 211, 218, 219, 220,
              221, 222, 223],
    "LACNIC": [177, 179, 181, 186, 187, 189, 190, 191, 200, 201],
    "AFRINIC": [41, 102, 105, 154, 196, 197],
}
V6_SLASH12 = {"RIPE": 0x2A00, "ARIN": 0x2600, "APNIC": 0x2400, "LACNIC": 0x2800, "AFRINIC": 0x2C00}
ASN_RANGE = {
    "RIPE": (196_608, 213_403),
    "ARIN": (393_216, 401_308),
    "APNIC": (131_072, 141_625),
    "LACNIC": (262_144, 273_820),
    "AFRINIC": (327_680, 329_727),
}

# Intra-region paths that detour through a hub ("tromboning"): probability per AS pair, hubs.
TROMBONE = {
    "AFRINIC": (0.45, ["Marseille", "London"]),
    "LACNIC": (0.30, ["Miami", "Sao Paulo"]),
    "APNIC": (0.15, ["Singapore", "Los Angeles", "Hong Kong"]),
    "RIPE": (0.08, ["Frankfurt", "Amsterdam"]),
    "ARIN": (0.05, ["Washington", "Chicago"]),
}
# median of (inflation - 1) per AS-pair relation, lognormal sigma
INFLATION = {"same_as": (0.20, 0.4), "same_country": (0.50, 0.5), "same_region": (0.45, 0.5),
             "inter_region": (0.30, 0.5)}
HOSTING_INFLATION_FACTOR = 0.7  # clouds peer widely: (inflation - 1) shrinks when an end is hosting

ROUTE_RATE_PER_DAY = 1.0 / 7.0
FLAPPY_SHARE, FLAPPY_RATE_PER_DAY = 0.10, 3.0
ROUTE_BACK_P = 0.35  # a change returns to the primary route (shift 0) with this probability

OUTAGE = {  # rate per day, flaky share, flaky rate, duration median s, sigma, unreachable share
    ("probe", 4): (0.25, 0.10, 1.5, 1200.0, 1.2, 0.10),
    ("probe", 6): (0.50, 0.10, 3.0, 1200.0, 1.2, 0.40),
    ("target", 4): (0.10, 0.0, 0.0, 600.0, 1.0, 0.0),
    ("target", 6): (0.10, 0.0, 0.0, 600.0, 1.0, 0.0),
}
SIZES = ([48, 64, 32, 1000], [0.85, 0.08, 0.05, 0.02])

COMPONENTS = ("cities", "hosts", "ases", "addresses", "paths", "streams", "routes", "outages", "ids")


def _rng(seed: int, component: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**64, COMPONENTS.index(component)])))


def load_cities() -> dict[str, np.ndarray]:
    rows = list(csv.DictReader(resources.files("pingctl").joinpath("data", "cities.csv").open(encoding="utf-8")))
    return {
        "name": np.array([r["name"] for r in rows], dtype=object),
        "country": np.array([r["country"] for r in rows], dtype=object),
        "lat": np.array([float(r["lat"]) for r in rows]),
        "lon": np.array([float(r["lon"]) for r in rows]),
        "population": np.array([int(r["population"]) for r in rows], dtype=np.int64),
        "region": np.array([r["region"] for r in rows], dtype=object),
    }


def parse_start(text: str) -> int:
    """Unix seconds of an ISO 8601 UTC time (naive = UTC)."""
    try:
        t = dt.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise PingctlError(f"data.synth.start: {text!r} is not an ISO 8601 time like 2024-01-01T00:00:00Z") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp())


def check_span(start_s: int, duration_s: int) -> None:
    """Generated times must be valid canonical times: from MIN_TIME up to now."""
    lo, now = generated_time_range()
    if start_s < lo or start_s + duration_s > now:
        raise ConfigError(
            f"generated times would span {utc_text(start_s, '%Y-%m-%d %H:%M')} .. "
            f"{utc_text(start_s + duration_s, '%Y-%m-%d %H:%M')} UTC "
            f"({duration_s / 86_400:,.1f} days); they must lie between {MIN_TIME:%Y-%m-%d} and now "
            "(change data.synth.start, rows or step)"
        )


@dataclass
class World:
    seed: int
    start_s: int  # Unix seconds of t = 0
    step: int
    packets: int
    results: int  # results to generate (rows = results * packets)
    rounds: int
    hosts: dict[str, np.ndarray]
    ases: dict[str, np.ndarray]
    streams: dict[str, np.ndarray]
    routes: dict[str, np.ndarray]
    outages: dict[str, np.ndarray]
    order: np.ndarray = field(repr=False)  # streams sorted by their offset in the step
    addresses: list[str] = field(repr=False)  # dictionary: host * 2 + (ip_version == 6)

    @property
    def n_streams(self) -> int:
        return len(self.streams["src"])

    @property
    def duration_s(self) -> int:
        return self.rounds * self.step


def _lognormal(rng, median, sigma, n):
    if median <= 0:
        return np.zeros(n)
    return median * np.exp(sigma * rng.standard_normal(n))


def _pick_cities(rng, cities, n, region_share, pop_exp):
    regions = list(region_share)
    reg = rng.choice(len(regions), size=n, p=np.array([region_share[r] for r in regions]))
    out = np.empty(n, dtype=np.int64)
    for ri, r in enumerate(regions):
        idx = np.flatnonzero(cities["region"] == r)
        w = cities["population"][idx].astype(np.float64) ** pop_exp
        m = reg == ri
        out[m] = rng.choice(idx, size=int(m.sum()), p=w / w.sum())
    return out


def _place(rng, cities, city, spread_km):
    """Host coordinates: uniform in a disc around the city centre (radius grows with population)."""
    n = len(city)
    radius = spread_km * np.sqrt(cities["population"][city] / 1e6).clip(0.3, 3.0)
    r = radius * np.sqrt(rng.random(n))
    a = rng.random(n) * 2 * np.pi
    lat = cities["lat"][city] + (r * np.cos(a)) / 111.2
    lon = cities["lon"][city] + (r * np.sin(a)) / (111.2 * np.cos(np.radians(cities["lat"][city])))
    return np.round(lat, 5), np.round((lon + 180.0) % 360.0 - 180.0, 5)


def _build_hosts(seed, cfg, cities):
    rng = _rng(seed, "hosts")
    P, T = cfg.probes, cfg.targets
    pc = _pick_cities(rng, cities, P, PROBE_REGION_SHARE, 1.0)
    tc = _pick_cities(rng, cities, T, TARGET_REGION_SHARE, TARGET_POP_EXP)
    city = np.concatenate([pc, tc])
    role = np.array(["probe"] * P + ["target"] * T, dtype=object)
    acc_names = list(M.ACCESS)
    pa = rng.choice(len(acc_names), size=P, p=[PROBE_ACCESS_SHARE[a] for a in acc_names])
    ta = rng.choice(len(acc_names), size=T, p=[TARGET_ACCESS_SHARE[a] for a in acc_names])
    access = np.array(acc_names, dtype=object)[np.concatenate([pa, ta])]
    n = P + T
    lat, lon = _place(rng, cities, city, 12.0)
    dc = access == "datacenter"
    lat_dc, lon_dc = _place(rng, cities, city, 3.0)  # datacenters sit in the metro core
    lat, lon = np.where(dc, lat_dc, lat), np.where(dc, lon_dc, lon)
    share = cfg.dual_stack_share
    dual = rng.random(n) < np.where(dc, math.sqrt(share), share)

    h = {
        "host_id": np.arange(n, dtype=np.int64),
        "role": role,
        "city": cities["name"][city],
        "country": cities["country"][city],
        "region": cities["region"][city],
        "lat": lat,
        "lon": lon,
        "access": access,
        "dual_stack": dual,
        "utc_offset_h": lon / 15.0,
    }
    for col in ("access_ms", "jitter_ms", "jitter_gain", "diurnal_amp_ms", "diurnal_peak_h", "loss_rate"):
        h[col] = np.zeros(n)
    for a, p in ACCESS_PARAMS.items():
        m = access == a
        k = int(m.sum())
        if a == "satellite":
            h["access_ms"][m] = rng.uniform(*p["access"], size=k)
        else:
            h["access_ms"][m] = np.clip(_lognormal(rng, *p["access"], k), 0.05, 90.0)
        h["jitter_ms"][m] = _lognormal(rng, *p["jitter"], k)
        h["jitter_gain"][m] = p["gain"]
        h["diurnal_amp_ms"][m] = _lognormal(rng, *p["amp"], k)
        h["diurnal_peak_h"][m] = p["peak"][0] + p["peak"][1] * rng.standard_normal(k)
        h["loss_rate"][m] = np.minimum(_lognormal(rng, p["loss"], 0.7, k), 0.2)
    h["_city_idx"] = city
    return h


def _build_ases(seed, hosts):
    """ASes: per country eyeball (home) and mobile ISPs; per region hosting and satellite ASes."""
    rng = _rng(seed, "ases")
    ases = {"asn": [], "name": [], "region": [], "country": [], "kind": []}
    host_as = np.full(len(hosts["host_id"]), -1, dtype=np.int64)
    kind_of = {"home": "eyeball", "mobile": "mobile", "datacenter": "hosting", "satellite": "satellite"}
    used_asn: set[int] = set()

    def new_as(region, country, kind, k):
        lo, hi = ASN_RANGE[region]
        while True:
            asn = int(rng.integers(lo, hi + 1))
            if asn not in used_asn:
                break
        used_asn.add(asn)
        scope = country or region
        label = {"eyeball": "BROADBAND", "mobile": "MOBILE", "hosting": "CLOUD", "satellite": "LEO"}[kind]
        ases["asn"].append(asn)
        ases["name"].append(f"{scope}-{label}-{k + 1}")
        ases["region"].append(region)
        ases["country"].append(country)
        ases["kind"].append(kind)
        return len(ases["asn"]) - 1

    access, country, region = hosts["access"], hosts["country"], hosts["region"]
    groups: dict[tuple, list[int]] = {}
    for i in range(len(access)):
        kind = kind_of[access[i]]
        scope = (region[i], country[i] if kind in ("eyeball", "mobile") else "", kind)
        groups.setdefault(scope, []).append(i)
    for (reg, ctry, kind), members in sorted(groups.items()):
        n = len(members)
        count = {"eyeball": min(4, 1 + n // 8), "mobile": min(2, 1 + n // 15), "hosting": min(6, 2 + n // 10),
                 "satellite": 1}[kind]
        ids = [new_as(reg, ctry, kind, k) for k in range(count)]
        w = 1.0 / np.arange(1, count + 1)  # Zipf market shares
        host_as[members] = np.array(ids)[rng.choice(count, size=n, p=w / w.sum())]
    out = {k: np.array(v, dtype=object if k in ("name", "region", "country", "kind") else np.int64)
           for k, v in ases.items()}
    return out, host_as


def _assign_addresses(seed, hosts, ases, host_as):
    """Prefixes: region block -> AS (/16, /32) -> city slot (/20, /40) -> host (/24, /48)."""
    rng = _rng(seed, "addresses")
    n_as = len(ases["asn"])
    used16: set[int] = set()
    used32: set[int] = set()
    as16 = np.zeros(n_as, dtype=np.int64)
    as32 = np.zeros(n_as, dtype=np.int64)
    for a in range(n_as):
        reg = ases["region"][a]
        while True:
            p16 = (int(rng.choice(V4_SLASH8[reg])) << 8) | int(rng.integers(0, 256))
            net = ipaddress.IPv4Network(((p16 << 16), 16))
            if p16 not in used16 and net.is_global and not _overlaps_special(net):
                break
        used16.add(p16)
        while True:
            p32 = ((V6_SLASH12[reg] | int(rng.integers(0, 16))) << 16) | int(rng.integers(0, 65536))
            if p32 not in used32:
                break
        used32.add(p32)
        as16[a], as32[a] = p16, p32
    ases["v4_prefix"] = np.array([f"{ipaddress.IPv4Address(int(p) << 16)}/16" for p in as16], dtype=object)
    ases["v6_prefix"] = np.array([f"{ipaddress.IPv6Address(int(p) << 96)}/32" for p in as32], dtype=object)

    n = len(host_as)
    city_slot: dict[tuple[int, str], int] = {}
    slots_used = np.zeros(n_as, dtype=np.int64)
    seen: set[str] = set()
    v4, v6, p24, p48 = [], [], [], []
    for i in range(n):
        a = int(host_as[i])
        key = (a, hosts["city"][i])
        if key not in city_slot:
            city_slot[key] = int(slots_used[a])
            slots_used[a] += 1
        slot = city_slot[key]
        dc = hosts["access"][i] == "datacenter"
        while True:
            third = ((slot % 16) << 4) | int(rng.integers(0, 16))
            ip4 = ipaddress.IPv4Address((int(as16[a]) << 16) | (third << 8) | int(rng.integers(1, 255)))
            if ip4.is_global and str(ip4) not in seen:
                break
        seen.add(str(ip4))
        v4.append(str(ip4))
        p24.append(f"{ipaddress.IPv4Address(int(ip4) & 0xFFFFFF00)}/24")
        if not hosts["dual_stack"][i]:
            v6.append(None)
            p48.append(None)
            continue
        while True:
            h3 = ((slot % 256) << 8) | int(rng.integers(0, 256))
            net48 = (int(as32[a]) << 96) | (h3 << 80)
            if dc:  # servers: static, short interface ids
                iid = int(rng.integers(1, 0x1000))
            else:  # home/mobile/satellite: SLAAC-style random interface id in some /64
                subnet = int(rng.integers(0, 0x100))
                iid = (subnet << 64) | (int(rng.integers(0, 2**32)) << 32) | int(rng.integers(1, 2**32))
            ip6 = ipaddress.IPv6Address(net48 | iid)
            if ip6.is_global and str(ip6) not in seen:
                break
        seen.add(str(ip6))
        v6.append(str(ip6))
        p48.append(f"{ipaddress.IPv6Address(net48)}/48")
    hosts["asn"] = ases["asn"][host_as]
    hosts["ipv4"] = np.array(v4, dtype=object)
    hosts["ipv6"] = np.array(v6, dtype=object)
    hosts["v4_prefix"] = np.array(p24, dtype=object)
    hosts["v6_prefix"] = np.array(p48, dtype=object)
    hosts["_as_idx"] = host_as


# Not public unicast, by IANA's special-purpose registries (what `ipaddress.is_global` refuses,
# plus multicast): random addresses are drawn outside them.
_V4_EXCLUDED = [ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24",
    "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
    "224.0.0.0/4", "240.0.0.0/4")]
# Inside 2000::/3 (global unicast): IETF protocol assignments (Teredo, ORCHID, benchmarking),
# documentation, 6to4 (an IPv4 address inside) and the newer documentation block.
_V6_EXCLUDED = [ipaddress.IPv6Network(n) for n in ("2001::/23", "2001:db8::/32", "2002::/16", "3fff::/20")]


def _draw_unique(rng, n: int, draw, excluded, prefix_bits: int, top_bits: int) -> np.ndarray:
    """n distinct prefixes (as ints of `prefix_bits` bits) from `draw(k)`, outside the
    `excluded` networks, in draw order: deterministic in the generator's state."""
    out = np.empty(0, dtype=np.int64)
    while len(out) < n:
        cand = draw(2 * (n - len(out)) + 16)
        ok = np.ones(len(cand), dtype=bool)
        for net in excluded:
            shift = prefix_bits - min(net.prefixlen, prefix_bits)
            ok &= (cand >> shift) != (int(net.network_address) >> (top_bits - prefix_bits + shift))
        cand = np.concatenate([out, cand[ok]])
        _, first = np.unique(cand, return_index=True)
        out = cand[np.sort(first)][:n]
    return out


def _random_addresses(seed, hosts, ases, host_as):
    """Addresses unrelated to place, AS or prefix: each host gets a uniformly random public
    IPv4 address in a /24 of its own (and, if dual-stack, a random global IPv6 address in a
    /48 of its own, with a random interface id), so an address says nothing a model or a
    baseline could use but the host's identity; only measurements tell where it is.
    ASes keep their role in the RTT model but own no prefixes."""
    rng = _rng(seed, "addresses")
    n = len(host_as)
    # /24s: 24-bit ints; the host octet 1..254 (never a network or broadcast-looking .0/.255)
    p24 = _draw_unique(rng, n, lambda k: rng.integers(0, 1 << 24, size=k, dtype=np.int64), _V4_EXCLUDED, 24, 32)
    ip4 = (p24 << 8) | rng.integers(1, 255, size=n, dtype=np.int64)
    dual = np.flatnonzero(hosts["dual_stack"])
    # /48s inside 2000::/3: 48-bit ints whose top 3 bits are 001
    p48 = _draw_unique(rng, len(dual), lambda k: (1 << 45) | rng.integers(0, 1 << 45, size=k, dtype=np.int64),
                       _V6_EXCLUDED, 48, 128)
    subnet = rng.integers(0, 1 << 16, size=len(dual), dtype=np.int64)
    iid_hi = rng.integers(0, 1 << 32, size=len(dual), dtype=np.int64)
    iid_lo = rng.integers(1, 1 << 32, size=len(dual), dtype=np.int64)
    v4 = [str(ipaddress.IPv4Address(int(a))) for a in ip4]
    v6: list = [None] * n
    pre6: list = [None] * n
    for j, i in enumerate(dual):
        net = int(p48[j]) << 80
        v6[i] = str(ipaddress.IPv6Address(net | (int(subnet[j]) << 64) | (int(iid_hi[j]) << 32) | int(iid_lo[j])))
        pre6[i] = f"{ipaddress.IPv6Address(net)}/48"
    bad = [a for a in v4 + [x for x in v6 if x] if not ipaddress.ip_address(a).is_global
           or ipaddress.ip_address(a).is_multicast]
    if bad:  # the exclusion lists above are the contract; this says if they ever fall behind
        raise PingctlError(f"internal error: random synth addresses {bad[:3]} are not public unicast")
    hosts["asn"] = ases["asn"][host_as]
    hosts["ipv4"] = np.array(v4, dtype=object)
    hosts["ipv6"] = np.array(v6, dtype=object)
    hosts["v4_prefix"] = np.array([f"{ipaddress.IPv4Address(int(p) << 8)}/24" for p in p24], dtype=object)
    hosts["v6_prefix"] = np.array(pre6, dtype=object)
    hosts["_as_idx"] = host_as
    ases["v4_prefix"] = np.full(len(ases["asn"]), None, dtype=object)
    ases["v6_prefix"] = np.full(len(ases["asn"]), None, dtype=object)


_SPECIAL = [ipaddress.ip_network(n) for n in ("192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
                                              "203.0.113.0/24", "192.88.99.0/24", "100.64.0.0/10")]


def _overlaps_special(net) -> bool:
    return any(net.overlaps(s) for s in _SPECIAL)


def _probe_ids(rng, n):
    """RIPE-like probe ids: ~80% hardware probes (10..65000), ~20% software probes (1,000,001+)."""
    n_sw = int(round(0.2 * n))
    hw_pool = max(65_000, 2 * n)
    hw = rng.choice(np.arange(10, 10 + hw_pool), size=n - n_sw, replace=False)
    sw = 1_000_001 + rng.choice(np.arange(max(8_000, 2 * n_sw)), size=n_sw, replace=False)
    ids = np.concatenate([hw, sw]).astype(np.int64)
    rng.shuffle(ids)
    return ids


def _choose_targets(rng, hosts, P, T, k):
    """Per probe: ceil(k/2) targets drawn preferring nearby ones (weight exp(-d/1500 km)), the rest
    uniformly among the remaining targets (Gumbel top-k, vectorized over blocks of probes)."""
    k = min(k, T)
    near = (k + 1) // 2
    out = np.empty((P, k), dtype=np.int64)
    block = max(1, 2_000_000 // T)
    lat_t, lon_t = hosts["lat"][None, P:], hosts["lon"][None, P:]
    for b0 in range(0, P, block):
        b1 = min(P, b0 + block)
        d = M.haversine_km(hosts["lat"][b0:b1, None], hosts["lon"][b0:b1, None], lat_t, lon_t)
        g1 = d / 1500.0 - rng.gumbel(size=d.shape)  # smaller = preferred
        first = np.argpartition(g1, near - 1, axis=1)[:, :near] if near < T else np.argsort(g1, axis=1)
        chosen = first
        if k > near:
            g2 = -rng.gumbel(size=d.shape)
            np.put_along_axis(g2, first, np.inf, axis=1)
            rest = np.argpartition(g2, k - near - 1, axis=1)[:, : k - near]
            chosen = np.concatenate([first, rest], axis=1)
        out[b0:b1] = np.sort(chosen, axis=1)
    return out  # (P, k) target indices 0..T-1


def _as_pair_params(rng, ases, cities):
    """Symmetric per-AS-pair inflation, peering delay and hub detours, for IPv4 and IPv6."""
    A = len(ases["asn"])
    reg = ases["region"]
    ctry = ases["country"]
    kind = ases["kind"]
    same_region = reg[:, None] == reg[None, :]
    same_country = same_region & (ctry[:, None] == ctry[None, :]) & (ctry[:, None] != "")
    med = np.full((A, A), INFLATION["inter_region"][0])
    sig = np.full((A, A), INFLATION["inter_region"][1])
    for mask, key in ((same_region, "same_region"), (same_country, "same_country"), (np.eye(A, dtype=bool), "same_as")):
        med[mask], sig[mask] = INFLATION[key]
    hosting = (kind == "hosting")
    med = med * np.where(hosting[:, None] | hosting[None, :], HOSTING_INFLATION_FACTOR, 1.0)

    def sym(x):
        u = np.triu(x)
        return u + np.triu(u, 1).T

    infl4 = 1.0 + sym(med * np.exp(sig * rng.standard_normal((A, A))))
    m6 = np.exp(0.1 + 0.3 * rng.standard_normal((A, A)))
    detour6 = np.where(rng.random((A, A)) < 0.10, 1.0 + rng.exponential(0.25, (A, A)), 1.0)
    infl6 = 1.0 + sym((infl4 - 1.0) * m6 * detour6 + (detour6 - 1.0))
    peer4 = sym(rng.exponential(1.0, (A, A)))
    peer6 = sym(peer4 * np.exp(0.2 * rng.standard_normal((A, A))))
    np.fill_diagonal(peer4, 0.0)
    np.fill_diagonal(peer6, 0.0)

    # hub detours for intra-region pairs of different ASes
    city_idx = {n: i for i, n in enumerate(cities["name"])}
    regions = list(TROMBONE)
    hub_of = np.full((A, A), -1, dtype=np.int64)
    hub6_of = np.full((A, A), -1, dtype=np.int64)
    u4, u6, pick = rng.random((A, A)), rng.random((A, A)), rng.random((A, A))
    for r in regions:
        p, hubs = TROMBONE[r]
        hub_ids = np.array([city_idx[h] for h in hubs])
        m = same_region & (reg[:, None] == r) & ~np.eye(A, dtype=bool)
        choice = hub_ids[(pick * len(hubs)).astype(int) % len(hubs)]
        t4 = m & (u4 < p)
        t6 = m & np.where(t4, u6 < 0.8, u6 < 0.5 * p)
        hub_of[t4] = choice[t4]
        hub6_of[t6] = choice[t6]
    hub_of = np.where(np.triu(np.ones((A, A), dtype=bool)), hub_of, hub_of.T)
    hub6_of = np.where(np.triu(np.ones((A, A), dtype=bool)), hub6_of, hub6_of.T)
    return {4: (infl4, peer4, hub_of), 6: (infl6, peer6, hub6_of)}


def build_world(cfg, seed: int | None = None) -> World:
    """The whole world for a SynthConfig; deterministic in (seed, config)."""
    seed = cfg.seed if seed is None else seed
    P, T = cfg.probes, cfg.targets
    if P + T > MAX_HOSTS:
        raise PingctlError(f"data.synth.probes + targets = {P + T:,} exceeds the supported {MAX_HOSTS:,}")
    cities = load_cities()
    hosts = _build_hosts(seed, cfg, cities)
    ases, host_as = _build_ases(seed, hosts)
    if cfg.addresses == "random":
        _random_addresses(seed, hosts, ases, host_as)
    else:
        _assign_addresses(seed, hosts, ases, host_as)
    rng_ids = _rng(seed, "ids")
    prb = np.zeros(P + T, dtype=np.int64)
    prb[:P] = _probe_ids(rng_ids, P)
    hosts["prb_id"] = prb
    msm, sizes = _measurement_ids(rng_ids, hosts["dual_stack"][P:])

    rng_s = _rng(seed, "streams")
    st = _streams(rng_s, cfg, hosts, prb, msm, sizes)
    _add_paths(st, hosts, cities, host_as, _as_pair_params(_rng(seed, "paths"), ases, cities))
    _add_host_params(st, hosts)
    st["route_changes_per_day"] = np.where(rng_s.random(len(st["src"])) < FLAPPY_SHARE, FLAPPY_RATE_PER_DAY,
                                           ROUTE_RATE_PER_DAY)
    results, rounds, order = _schedule(st, cfg)

    start_s = parse_start(cfg.start)
    duration = rounds * cfg.step
    check_span(start_s, duration)  # before anything is sized by the duration
    routes = _route_segments(_rng(seed, "routes"), st, duration)
    outages = _outages(_rng(seed, "outages"), hosts, P, duration)

    addresses: list[str] = []
    for i in range(P + T):
        addresses += [hosts["ipv4"][i], hosts["ipv6"][i] or ""]
    return World(
        seed=seed, start_s=start_s, step=cfg.step, packets=cfg.packets, results=results, rounds=rounds,
        hosts=hosts, ases=ases, streams=st, routes=routes, outages=outages, order=order, addresses=addresses,
    )


def _measurement_ids(rng, target_dual: np.ndarray) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """One measurement per target and address family (RIPE-like ids, increasing with gaps; -1
    for the IPv6 one of a target without IPv6), and each one's packet size."""
    T = len(target_dual)
    gaps = rng.integers(1, 40, size=2 * T)
    msm4 = np.zeros(T, dtype=np.int64)
    msm6 = np.full(T, -1, dtype=np.int64)
    nxt = MSM_ID_BASE
    for t in range(T):
        msm4[t] = nxt
        nxt += int(gaps[2 * t])
        if target_dual[t]:
            msm6[t] = nxt
            nxt += int(gaps[2 * t + 1])
    size4 = rng.choice(SIZES[0], size=T, p=SIZES[1])
    size6 = rng.choice(SIZES[0], size=T, p=SIZES[1])
    return {4: msm4, 6: msm6}, {4: size4, 6: size6}


def _streams(rng, cfg, hosts, prb, msm, sizes) -> dict[str, np.ndarray]:
    """The measurement streams (probe, target, address family), a probe's grouped together:
    who measures whom, with which measurement id and packet size, at which offset in the step."""
    P, T = cfg.probes, cfg.targets
    chosen = _choose_targets(rng, hosts, P, T, cfg.targets_per_probe)
    k = chosen.shape[1]
    p_idx = np.repeat(np.arange(P), k)
    t_idx = chosen.reshape(-1)
    dual = hosts["dual_stack"]
    v6 = dual[p_idx] & dual[P + t_idx]
    src = np.concatenate([p_idx, p_idx[v6]])
    tgt = np.concatenate([t_idx, t_idx[v6]])
    af = np.concatenate([np.full(len(p_idx), 4), np.full(int(v6.sum()), 6)]).astype(np.int64)
    o = np.lexsort((af, tgt, src))
    src, tgt, af = src[o], tgt[o], af[o]
    S = len(src)
    st: dict[str, np.ndarray] = {"stream_id": np.arange(S, dtype=np.int64), "src": src, "dst": P + tgt,
                                 "ip_version": af}
    st["msm_id"] = np.where(af == 4, msm[4][tgt], msm[6][tgt])
    st["size"] = np.where(af == 4, sizes[4][tgt], sizes[6][tgt]).astype(np.int64)
    st["prb_id"] = prb[src]
    st["offset_s"] = rng.integers(0, cfg.step, size=S).astype(np.int64)
    return st


def _add_paths(st, hosts, cities, host_as, pair) -> None:
    """Each stream's path: great-circle distance, propagation, the AS pair's inflation and
    peering delay, and the detour through a hub where the AS pair trombones."""
    src, dst, af = st["src"], st["dst"], st["ip_version"]
    S = len(src)
    lat, lon = hosts["lat"], hosts["lon"]
    dist = M.haversine_km(lat[src], lon[src], lat[dst], lon[dst])
    prop = M.propagation_ms(dist)
    a_s, a_d = host_as[src], host_as[dst]
    infl_as = np.empty(S)
    peer = np.empty(S)
    hub = np.empty(S, dtype=np.int64)
    for v in (4, 6):
        m = af == v
        infl_m, peer_m, hub_m = pair[v]
        infl_as[m] = infl_m[a_s[m], a_d[m]]
        peer[m] = peer_m[a_s[m], a_d[m]]
        hub[m] = hub_m[a_s[m], a_d[m]]
    via = hub >= 0
    path_km = dist * infl_as
    if via.any():
        hc = hub[via]
        leg = M.haversine_km(lat[src[via]], lon[src[via]], cities["lat"][hc], cities["lon"][hc]) + M.haversine_km(
            cities["lat"][hc], cities["lon"][hc], lat[dst[via]], lon[dst[via]]
        )
        path_km[via] = np.maximum(leg * (1.0 + 0.3 * (infl_as[via] - 1.0)), dist[via])
    inflation = np.where(dist > 0, path_km / np.maximum(dist, 1e-9), 1.0)
    st["distance_km"] = dist
    st["propagation_ms"] = prop
    st["inflation"] = np.maximum(inflation, 1.0)
    st["via_hub"] = np.where(via, cities["name"][np.maximum(hub, 0)], None).astype(object)
    st["path_ms"] = prop * st["inflation"]
    st["peering_ms"] = peer


def _add_host_params(st, hosts) -> None:
    """What each end adds to a stream: access delay, jitter, diurnal load, loss."""
    src, dst = st["src"], st["dst"]
    st["access_src_ms"] = hosts["access_ms"][src]
    st["access_dst_ms"] = hosts["access_ms"][dst]
    st["base_rtt_ms"] = st["path_ms"] + st["peering_ms"] + st["access_src_ms"] + st["access_dst_ms"]
    st["jitter_ms"] = hosts["jitter_ms"][src] + hosts["jitter_ms"][dst]
    st["jitter_gain_src"] = hosts["jitter_gain"][src]
    st["jitter_gain_dst"] = hosts["jitter_gain"][dst]
    st["diurnal_amp_src_ms"] = hosts["diurnal_amp_ms"][src]
    st["diurnal_amp_dst_ms"] = hosts["diurnal_amp_ms"][dst]
    st["utc_offset_src_h"] = hosts["utc_offset_h"][src]
    st["utc_offset_dst_h"] = hosts["utc_offset_h"][dst]
    st["diurnal_peak_src_h"] = hosts["diurnal_peak_h"][src]
    st["diurnal_peak_dst_h"] = hosts["diurnal_peak_h"][dst]
    path_loss = 0.0003 + 0.0007 * np.minimum(st["distance_km"] / 10_000.0, 2.0)
    st["loss_rate"] = 1.0 - (1.0 - hosts["loss_rate"][src]) * (1.0 - hosts["loss_rate"][dst]) * (1.0 - path_loss)


def _schedule(st, cfg) -> tuple[int, int, np.ndarray]:
    """Results are emitted round by round, streams in offset order within a round: how many
    results and rounds, that order, and each stream's result count (into `st`)."""
    S = len(st["src"])
    results = -(-cfg.rows // cfg.packets)
    rounds = -(-results // S)
    order = np.lexsort((st["stream_id"], st["offset_s"]))
    full, part = divmod(results, S)
    n_res = np.full(S, full, dtype=np.int64)
    n_res[order[:part]] += 1
    st["results"] = n_res
    return results, rounds, order


def _route_segments(rng, st, duration):
    """Piecewise-constant base-RTT shifts: a Poisson number of change times per stream; each new
    segment returns to the primary route (shift 0) or takes a detour (exponential, scale grows
    with the path)."""
    S = len(st["stream_id"])
    counts = rng.poisson(st["route_changes_per_day"] * duration / DAY)
    n_ch = int(counts.sum())
    sid_ch = np.repeat(np.arange(S), counts)
    t_ch = rng.integers(1, max(duration, 2), size=n_ch).astype(np.int64)
    o = np.lexsort((t_ch, sid_ch))
    sid_ch, t_ch = sid_ch[o], t_ch[o]
    scale = 0.15 * (st["path_ms"] + st["peering_ms"]) + 1.5
    shift_ch = np.where(rng.random(n_ch) < ROUTE_BACK_P, 0.0, rng.exponential(1.0, n_ch) * scale[sid_ch])
    sid = np.concatenate([np.arange(S), sid_ch])
    start = np.concatenate([np.zeros(S, dtype=np.int64), t_ch.astype(np.int64)])
    shift = np.concatenate([np.zeros(S), shift_ch])
    o = np.lexsort((start, sid))
    sid, start, shift = sid[o], start[o], shift[o]
    end = np.empty_like(start)
    end[:-1] = start[1:]
    last = np.ones(len(sid), dtype=bool)
    last[:-1] = sid[1:] != sid[:-1]
    end[last] = duration
    keep = end > start  # drop zero-length segments (two changes in the same second)
    return {"stream_id": sid[keep], "start_s": start[keep], "end_s": end[keep], "shift_ms": shift[keep]}


def _outages(rng, hosts, P, duration):
    """Per (host, address family) outage intervals: during an outage every packet of that host in
    that family fails; 'unreachable' outages carry packet errors (no route), 'timeout' ones not."""
    owners, starts, ends, kinds = [], [], [], []
    n = len(hosts["host_id"])
    for host_role, v in sorted(OUTAGE):
        rate, flaky_share, flaky_rate, med, sigma, unreach = OUTAGE[(host_role, v)]
        ids = np.arange(P) if host_role == "probe" else np.arange(P, n)
        if v == 6:
            ids = ids[hosts["dual_stack"][ids]]
        r = np.where(rng.random(len(ids)) < flaky_share, flaky_rate, rate)
        cnt = rng.poisson(r * duration / DAY)
        own = np.repeat(ids * 2 + (v == 6), cnt)
        st = rng.integers(0, max(duration, 1), size=int(cnt.sum()))
        du = np.clip(med * np.exp(sigma * rng.standard_normal(len(st))), 120.0, 3 * DAY).astype(np.int64)
        kd = np.where(rng.random(len(st)) < unreach, "unreachable", "timeout")
        owners.append(own)
        starts.append(st)
        ends.append(st + du)
        kinds.append(kd)
    own = np.concatenate(owners).astype(np.int64)
    st = np.concatenate(starts).astype(np.int64)
    en = np.concatenate(ends).astype(np.int64)
    kd = np.concatenate(kinds).astype(object)
    o = np.lexsort((st, own))
    own, st, en, kd = own[o], st[o], en[o], kd[o]
    # no overlaps within an owner: clip each end to the next start of the same owner
    same_next = np.zeros(len(own), dtype=bool)
    same_next[:-1] = own[1:] == own[:-1]
    en[:-1] = np.where(same_next[:-1], np.minimum(en[:-1], st[1:]), en[:-1])
    keep = en > st
    own, st, en, kd = own[keep], st[keep], en[keep], kd[keep]
    return {"host_id": own // 2, "ip_version": np.where(own % 2 == 1, 6, 4).astype(np.int64), "owner": own,
            "start_s": st, "end_s": en, "kind": kd}
