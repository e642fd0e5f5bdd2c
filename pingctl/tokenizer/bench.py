"""`pingctl bench tokenize`: throughput per core from strings and from parsed columns, and decode.

The input is built here: a few probes' histories (few sources, hundreds of destinations,
IPv4/IPv6 mix, some failures), time-ordered per source and cut into contexts of about one
packed sequence, which is how the loader will feed the encoder.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import random
import struct
import time

import numpy as np

from pingctl.errors import PingctlError, UsageError
from pingctl.tokenizer import decode, encode, Measurements
from pingctl.tokenizer.compact import time_kinds

SEED_MEASUREMENTS_PER_S = 14_000  # the seed prototype's per-measurement tokenizer, one core
CONTEXT_MEASUREMENTS = 50  # ~1024 tokens of compact v4/v6 mix


def _v4(rng: np.random.Generator, k: int) -> list[str]:
    first = rng.choice([o for o in range(1, 224) if o not in (10, 100, 127, 169, 172, 192, 198, 203)], k)
    rest = rng.integers(0, 256, (k, 3))
    return [f"{a}.{b}.{c}.{d}" for a, (b, c, d) in zip(first, rest)]


def _v6(rng: np.random.Generator, k: int) -> list[str]:
    prefixes = (0x2001, 0x2400, 0x2600, 0x2A00, 0x2A02, 0x2C0F)
    out = []
    for _ in range(k):
        groups = [int(rng.choice(prefixes)), *rng.integers(0, 1 << 16, 3).tolist(), 0, 0, 0, int(rng.integers(1, 256))]
        out.append(str(ipaddress.IPv6Address(int("".join(f"{g:04x}" for g in groups), 16))))
    return out


def synthetic_table(n: int, seed: int = 0, sources: int = 8, destinations: int = 400, v6_share: float = 0.3):
    """Canonical columns for `n` measurements of a few probes' histories (time-ordered per source)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    src4, src6 = _v4(rng, sources), _v6(rng, sources)
    dst4, dst6 = _v4(rng, destinations), _v6(rng, max(destinations // 3, 1))
    per_src = np.diff(np.linspace(0, n, sources + 1).astype(np.int64))
    probe = np.repeat(np.arange(sources), per_src)
    v6 = rng.random(n) < v6_share
    # Zipf-like popularity: a probe pings a few targets often and many rarely.
    w4 = 1.0 / np.arange(1, len(dst4) + 1)
    w6 = 1.0 / np.arange(1, len(dst6) + 1)
    d4 = rng.choice(len(dst4), n, p=w4 / w4.sum())
    d6 = rng.choice(len(dst6), n, p=w6 / w6.sum())
    src = np.where(v6, np.array(src6, object)[probe], np.array(src4, object)[probe])
    dst = np.where(v6, np.array(dst6, object)[d6], np.array(dst4, object)[d4])
    # Packets of one result share a second; rounds are seconds to minutes apart, sometimes hours.
    gap = np.where(rng.random(n) < 0.5, 0, rng.exponential(40, n).astype(np.int64))
    gap = np.where(rng.random(n) < 0.02, rng.integers(256, 86_400, n), gap)
    t0 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp())
    starts = np.concatenate([[0], np.cumsum(per_src)[:-1]])
    t = t0 + np.cumsum(gap)
    t -= np.repeat(t[starts] - t0, per_src)  # every probe's history starts at t0
    rtt = np.round(rng.lognormal(3.5, 0.9, n), 3)
    rtt[rng.random(n) < 0.03] = -1.0
    table = pa.table(
        {
            "msm_id": rng.integers(1_000_000, 1_000_050, n),
            "event_time": pa.array(t * 1_000_000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "src_addr": pa.array(src.tolist(), pa.string()),
            "dst_addr": pa.array(dst.tolist(), pa.string()),
            "ip_version": np.where(v6, 6, 4),
            "rtt": rtt,
            "size": np.full(n, 48, np.int64),
            "packet_error_count": (rng.random(n) < 0.01).astype(np.int64),
        }
    )
    return table


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def seed_style_tokenize(rows: list[dict], rng: random.Random) -> list[list[int]]:
    """A per-measurement Python tokenizer like the seed prototype (full scheme), for comparison."""
    out = []
    for r in rows:
        s, d = ipaddress.ip_address(r["src_addr"]), ipaddress.ip_address(r["dst_addr"])
        fam = 3 if s.version == 4 else 4
        blocks = [
            [1, fam, *(b + 10 for b in s.packed)],
            [2, fam, *(b + 10 for b in d.packed)],
            [5, *(b + 10 for b in struct.pack(">d", r["rtt"]))],
            [6, *(b + 10 for b in struct.pack(">H", min(r["size"], 65535)))],
            [7, *(b + 10 for b in struct.pack(">B", min(r["packet_error_count"], 255)))],
            [8, *(b + 10 for b in struct.pack(">q", int(r["event_time"].timestamp())))],
            [9, *(b + 10 for b in struct.pack(">q", r["msm_id"]))],
        ]
        rng.shuffle(blocks)
        out.append([0] + [t for b in blocks for t in b])
    return out


def bench_tokenize(n: int = 1_000_000, scheme: str = "both", repeats: int = 3) -> dict:
    import pyarrow as pa

    if n < 1000:
        raise UsageError("--n must be at least 1000")
    schemes = ["compact", "full"] if scheme == "both" else [scheme]
    if any(s not in ("compact", "full") for s in schemes):
        raise PingctlError(f"unknown scheme {scheme!r}: compact | full | both")
    table = synthetic_table(n)
    contexts = np.arange(0, n, CONTEXT_MEASUREMENTS)
    rows: list[dict] = []
    threads = pa.cpu_count()
    pa.set_cpu_count(1)  # figures are per core
    try:
        def row(case, sch, meas, tokens, secs):
            rows.append({
                "case": case, "scheme": sch, "meas": meas, "tokens": tokens, "seconds": round(secs, 3),
                "meas/s": round(meas / secs), "tokens/s": round(tokens / secs) if tokens else None,
                "x seed": round(meas / secs / SEED_MEASUREMENTS_PER_S),
            })

        secs, m = _best(lambda: Measurements.from_arrow(table), repeats)
        row("parse strings", "-", n, None, secs)
        no_time = Measurements(**{**m.__dict__, "has_time": np.zeros(n, bool)})
        for sch in schemes:
            def from_strings(sch=sch):
                parsed = Measurements.from_arrow(table)
                return encode(parsed, sch, rng=np.random.default_rng(0), context_starts=contexts)

            secs, enc = _best(from_strings, repeats)
            row("strings->tokens", sch, n, len(enc.tokens), secs)
            def from_parsed(sch=sch):
                return encode(m, sch, rng=np.random.default_rng(0), context_starts=contexts)

            secs, enc = _best(from_parsed, repeats)
            row("parsed->tokens", sch, n, len(enc.tokens), secs)
            if sch == "compact":
                secs, enc0 = _best(lambda: encode(no_time, sch, rng=np.random.default_rng(0)), repeats)
                row("parsed->tokens no ts", sch, n, len(enc0.tokens), secs)
            secs, dec = _best(lambda enc=enc, sch=sch: decode(enc.tokens, sch), repeats)
            if dec.errors or len(dec) != n:
                raise AssertionError(f"bench round trip failed: {dec.errors[:3]}")
            row("decode", sch, n, len(enc.tokens), secs)
        k = min(n, 20_000)
        sample = table.slice(0, k)
        secs, ref = _best(lambda: seed_style_tokenize(sample.to_pylist(), random.Random(0)), 1)
        row("per-row Python ref", "full", k, sum(map(len, ref)), secs)
    finally:
        pa.set_cpu_count(threads)

    kind, _ = time_kinds(m, contexts)
    share = [float((kind == k).sum() / max((kind > 0).sum(), 1)) for k in range(4)]
    notes = [
        f"input: {n:,} measurements, {float(m.src_v6.mean()):.0%} IPv6, {float((m.rtt_ms < 0).mean()):.0%} failed, "
        f"{len(table.column('src_addr').unique())} source and {len(table.column('dst_addr').unique())} destination "
        f"addresses; contexts of {CONTEXT_MEASUREMENTS} measurements",
        f"compact timestamps: abs {share[1]:.1%}, delta1 {share[2]:.1%}, delta4 {share[3]:.1%}",
        "one core: pyarrow cpu_count=1 while timing, NumPy kernels single-threaded; best of "
        f"{repeats} runs (the reference: one run on {min(n, 20_000):,} rows)",
        f"x seed = measurements/s over the seed prototype's ~{SEED_MEASUREMENTS_PER_S:,}/s per-measurement tokenizer "
        "(target >= 50x from strings)",
        "strings->tokens: canonical Arrow rows (string addresses) to tokens, including address parsing "
        "(each distinct string parsed once) and a fresh random field order per measurement",
        "parsed->tokens: from Measurements (what build-rows stores); no ts: has_time false; "
        "decode: tokens back to Measurements, errors checked",
    ]
    return {"name": "tokenize", "table": rows, "notes": notes}
