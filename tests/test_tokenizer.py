"""Tokenizer: RTT codec, Measurements, encode/decode round trips, token counts, field orders."""

from __future__ import annotations

import ipaddress

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pingctl.errors import PingctlError
from pingctl.tokenizer import (
    COMPACT,
    FULL,
    C,
    F,
    GrammarState,
    Measurements,
    Tokenizer,
    blocks,
    decode,
    encode,
    measurement_lengths,
)
from pingctl.tokenizer.compact import ABS, DELTA1, DELTA4, NO_TIME, time_kinds
from pingctl.tokenizer.packing import pack_contexts
from pingctl.tokenizer.rtt_codec import (
    CEILING_CODE, CEILING_MS, MAX_CODE, MAX_MS, MAX_US, POSSIBLE_FIRST_BYTES, decode_rtt, encode_rtt, error_bound_ms,
    possible_first_bytes, token_codes,
)
from tests.conftest import make_table

SETTINGS = settings(max_examples=60)
I64 = np.iinfo(np.int64)

# ---------------------------------------------------------------- strategies


@st.composite
def measurements(draw, max_n: int = 12, extreme_times: bool = False) -> Measurements:
    n = draw(st.integers(0, max_n))
    v6 = draw(hnp.arrays(np.bool_, n))
    src = draw(hnp.arrays(np.uint8, (n, 16)))
    dst = draw(hnp.arrays(np.uint8, (n, 16)))
    src[~v6, 4:] = 0  # IPv4 rows carry only their first 4 bytes
    dst[~v6, 4:] = 0
    rtt = np.array(
        draw(st.lists(
            st.one_of(
                st.just(-1.0), st.just(0.0), st.just(MAX_MS),
                st.floats(0.0, 2.1, allow_nan=False),  # the integer-microsecond range
                st.floats(0.0, MAX_MS, allow_nan=False),
                st.integers(0, 10**7).map(lambda us: us / 1000.0),  # Atlas-like 1 us resolution
            ),
            min_size=n, max_size=n,
        )),
        np.float64,
    )
    if extreme_times:
        times = np.array(draw(st.lists(st.integers(I64.min, I64.max), min_size=n, max_size=n)), np.int64)
    else:
        base = draw(st.integers(-(2**40), 2**40))
        gaps = draw(st.lists(
            st.one_of(st.integers(0, 255), st.integers(256, 2**32 - 1), st.integers(-5000, -1),
                      st.integers(2**32, 2**36)),
            min_size=n, max_size=n,
        ))
        times = base + np.cumsum(np.array(gaps, np.int64))
    has_time = draw(hnp.arrays(np.bool_, n))
    return Measurements(
        src, v6, dst, v6.copy(), rtt, times, has_time,
        size=np.array(draw(st.lists(st.integers(0, 65535), min_size=n, max_size=n)), np.int64),
        errors=np.array(draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)), np.int64),
        msm_id=np.array(draw(st.lists(st.integers(I64.min, I64.max), min_size=n, max_size=n)), np.int64),
    )


def _ms(src, dst, rtt=10.0, times=None, **kw) -> Measurements:
    src, dst = list(src), list(dst)
    rtts = rtt if isinstance(rtt, list) else [rtt] * len(src)
    return Measurements.from_fields(src, dst, rtts, times, **kw)


def _assert_roundtrip(m: Measurements, scheme: str, enc, dec) -> None:
    assert dec.errors == []
    assert len(dec) == len(m)
    got = dec.measurements
    if scheme == "compact":
        ok = m.rtt_ms >= 0
        assert np.array_equal(got.rtt_ms < 0, ~ok), "failures must round-trip exactly"
        x = np.minimum(m.rtt_ms[ok], CEILING_MS)  # token streams clamp at the ceiling
        assert np.all(np.abs(got.rtt_ms[ok] - x) <= error_bound_ms(x) * (1 + 1e-9))
        assert np.array_equal(got.has_time, m.has_time)
        assert got.differences(m, columns=["src", "src_v6", "dst", "dst_v6", "time_s"]) == []
    else:
        assert got.differences(m, columns=["src", "src_v6", "dst", "dst_v6", "size", "errors", "msm_id"]) == []
        assert np.array_equal(got.rtt_ms.view(np.int64), m.rtt_ms.view(np.int64)), "full RTT is bit-exact"
        assert np.array_equal(got.time_s, m.time_s) and got.has_time.all()
    assert np.array_equal(dec.spans[:, 1] - dec.spans[:, 0], enc.lengths)


# ---------------------------------------------------------------- RTT codec


def test_rtt_codec_worked_examples():
    cases = {
        0.0: (0, 0.0),
        0.001: (1, 0.001),
        0.0004: (0, 0.0),
        2.047: (2047, 2.047),
        12.3: (3 << 11 | 1538, 12.304),  # 12300 us = 1537.5 * 8: tie, rounds to even
        1000.0: (9 << 11 | 1953, 999.936),  # 1953.125 * 512
    }
    for ms, (code, back) in cases.items():
        assert int(encode_rtt([ms])[0]) == code, ms
        assert decode_rtt([code])[0] == pytest.approx(back, abs=1e-12), ms
    assert int(encode_rtt([MAX_MS])[0]) == MAX_CODE
    assert decode_rtt([MAX_CODE])[0] == MAX_US / 1000
    assert int(encode_rtt([MAX_MS * 10])[0]) == MAX_CODE  # clamped
    assert int(encode_rtt([np.inf])[0]) == MAX_CODE
    assert abs(MAX_US / 1e6 / 86400 - 50.9) < 0.05  # ~51 days


def test_rtt_codec_rounding_carries_into_next_exponent():
    # 4095.9 us rounds to mantissa 2048 at e=1 -> renormalised to 1024 at e=2 (4096 us)
    assert int(encode_rtt([4.0959])[0]) == (2 << 11) | 1024
    assert int(encode_rtt([2.0476])[0]) == (1 << 11) | 1024  # 2047.6 us -> 2048


def test_rtt_codec_every_code_decodes_and_canonical_codes_are_fixed_points():
    codes = np.arange(1 << 16)
    ms = decode_rtt(codes)
    assert np.all(np.isfinite(ms)) and np.all(ms >= 0)
    e, m = codes >> 11, codes & 0x7FF
    canonical = (e == 0) | (m >= 1024)
    assert np.array_equal(encode_rtt(ms[canonical]), codes[canonical])
    # encoding is monotone in the value
    assert np.all(np.diff(ms[canonical]) > 0)


@SETTINGS
@given(st.lists(st.floats(0.0, MAX_MS * 1.0001, allow_nan=False), max_size=50))
def test_rtt_codec_error_bound(values):
    x = np.array(values, np.float64)
    y = decode_rtt(encode_rtt(x))
    inside = x <= MAX_MS
    # max(0.5 us, x/2048), relative to float rounding of the ms<->us conversion
    assert np.all(np.abs(y[inside] - x[inside]) <= error_bound_ms(x[inside]) * (1 + 1e-9))
    big = x >= 1.024
    assert np.all(np.abs(y[big] - x[big]) / x[big] <= 1 / 2048 * (1 + 1e-9))
    assert np.all(y[~inside] == MAX_US / 1000)


def test_token_codes_are_exactly_the_canonical_codes_up_to_the_ceiling():
    codes = np.arange(65536)
    canonical = encode_rtt(decode_rtt(codes)) == codes  # the codes the encoder emits
    possible = POSSIBLE_FIRST_BYTES[codes >> 8]
    assert np.array_equal(possible, canonical & (codes <= CEILING_CODE))
    assert POSSIBLE_FIRST_BYTES.sum() == 72 and CEILING_CODE == 0x87FF
    assert decode_rtt([CEILING_CODE])[0] == CEILING_MS == 2047 * 2**16 / 1000  # 134.15 s: above every reply here
    x = np.array([0.0, 12.3, 90_500.0, CEILING_MS, CEILING_MS * 1.01, 86_400_000.0, MAX_MS * 10, np.inf, np.nan])
    got = token_codes(x)
    assert got.tolist()[:4] == encode_rtt(x[:4]).tolist()  # unchanged below the ceiling
    assert set(got[3:].tolist()) == {CEILING_CODE}  # clamped above it (NaN too)
    assert POSSIBLE_FIRST_BYTES[token_codes(np.logspace(-4, 10, 5000)) >> 8].all()


def test_possible_first_bytes_renormalises_over_the_possible_bytes():
    p = np.full(256, 1.0 / 256)
    q = possible_first_bytes(p)
    assert q[~POSSIBLE_FIRST_BYTES].sum() == 0 and q.sum() == pytest.approx(1.0)
    assert np.allclose(q[POSSIBLE_FIRST_BYTES], 1.0 / 72)
    only_impossible = np.where(POSSIBLE_FIRST_BYTES, 0.0, 1.0)
    assert np.allclose(possible_first_bytes(only_impossible)[POSSIBLE_FIRST_BYTES], 1.0 / 72)  # no NaN


def test_rtt_codec_is_exact_for_integer_microseconds_below_2048():
    us = np.arange(0, 2048)
    assert np.array_equal(encode_rtt(us / 1000.0), us)


# ---------------------------------------------------------------- Measurements


def test_from_arrow_parses_canonical_table_and_to_arrow_round_trips():
    t = make_table(500, probes=7, targets=4, v6_every=3)
    m = Measurements.from_arrow(t)
    assert len(m) == 500
    canon = {col: [str(ipaddress.ip_address(a)) for a in t.column(col).to_pylist()] for col in ("src_addr", "dst_addr")}
    assert m.src_text() == canon["src_addr"]  # canonical text, e.g. 2a00:0::1 -> 2a00::1
    assert m.dst_text() == canon["dst_addr"]
    assert np.array_equal(m.src_v6, np.array(t.column("ip_version").to_pylist()) == 6)
    assert np.array_equal(m.rtt_ms, t.column("rtt").to_numpy())
    assert m.has_time.all()
    assert np.array_equal(m.time_s, t.column("event_time").cast(pa.int64()).to_numpy() // 1_000_000)
    back = m.to_arrow()
    for col in ("msm_id", "event_time", "ip_version", "rtt", "size", "packet_error_count"):
        assert back.column(col).to_pylist() == t.column(col).to_pylist(), col
    for col in ("src_addr", "dst_addr"):
        assert back.column(col).to_pylist() == canon[col]
    parsed = m.to_arrow(parsed=True)
    assert Measurements.from_arrow(parsed).differences(m) == []
    assert Measurements.from_arrow(parsed.slice(100, 50)).differences(m[100:150]) == []


@SETTINGS
@given(st.lists(st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: a.exploded),
    st.text("0123456789.:abcdef", max_size=20),
), min_size=1, max_size=30))
def test_address_parsing_agrees_with_ipaddress(texts):
    def ref(s):
        try:
            ip = ipaddress.ip_address(s)
        except ValueError:
            return None
        # IPv4-mapped IPv6 is refused by the one address rule (docs/data.md): no measurement holds one
        return None if ip.version == 6 and ip.ipv4_mapped is not None else ip

    parsed = [ref(s) for s in texts]
    if any(p is None for p in parsed):
        with pytest.raises(PingctlError, match="invalid IP address"):
            Measurements.from_fields(texts, texts, [1.0] * len(texts))
        return
    m = Measurements.from_fields(texts, texts, [1.0] * len(texts))
    assert m.src_text() == [str(p) for p in parsed]
    assert m.src_v6.tolist() == [p.version == 6 for p in parsed]


@pytest.mark.parametrize("bad", ["01.2.3.4", "256.1.1.1", "1.2.3", "1.2.3.4.5", "", " 1.2.3.4", "fe80::1%eth0", "::g"])
def test_bad_addresses_are_rejected(bad):
    with pytest.raises(PingctlError, match="invalid IP address"):
        Measurements.from_fields([bad], ["8.8.8.8"], [1.0])


def test_from_arrow_accepts_dictionary_columns_and_missing_optional_columns():
    t = pa.table({
        "src_addr": pa.array(["1.2.3.4", "2001:db8::1"]).dictionary_encode(),
        "dst_addr": ["8.8.8.8", "2001:4860::8888"],
        "rtt": [1.5, -1.0],
        "event_time": pa.array([1_700_000_000, None], pa.int64()),
    })
    m = Measurements.from_arrow(t)
    assert m.src_text() == ["1.2.3.4", "2001:db8::1"]
    assert m.has_time.tolist() == [True, False]
    assert m.size.tolist() == [0, 0]
    with pytest.raises(PingctlError, match="lacks column"):
        Measurements.from_arrow(t.drop_columns(["rtt"]))


# ---------------------------------------------------------------- round trips


@SETTINGS
@given(measurements(), st.sampled_from(["compact", "full"]), st.integers(0, 2**32 - 1))
def test_decode_encode_round_trip(m, scheme, seed):
    enc = encode(m, scheme, rng=np.random.default_rng(seed))
    assert enc.tokens.dtype == np.int32
    assert enc.tokens.size == 0 or (enc.tokens.min() >= 0 and enc.tokens.max() < Tokenizer(scheme).vocab_size)
    assert np.array_equal(enc.lengths, measurement_lengths(m, scheme))
    _assert_roundtrip(m, scheme, enc, decode(enc.tokens, scheme))


@SETTINGS
@given(measurements(extreme_times=True), st.sampled_from(["compact", "full"]))
def test_round_trip_with_extreme_timestamps(m, scheme):
    enc = encode(m, scheme, rng=np.random.default_rng(0))
    _assert_roundtrip(m, scheme, enc, decode(enc.tokens, scheme))


@SETTINGS
@given(measurements(max_n=20), st.lists(st.integers(0, 19), max_size=4))
def test_context_starts_restart_the_timestamp_chain(m, starts):
    starts = sorted({s for s in starts if s < len(m)})
    enc = encode(m, "compact", context_starts=starts)
    kind, _ = time_kinds(m, starts)
    assert np.array_equal(enc.lengths, measurement_lengths(m, "compact", starts))
    bounds = [0, *starts, len(m)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ctx = enc.tokens[enc.offsets[lo] : enc.offsets[hi]]
        dec = decode(ctx, "compact")  # every context decodes on its own
        _assert_roundtrip(m[lo:hi], "compact", encode(m[lo:hi], "compact"), dec)
        timed = np.flatnonzero(m.has_time[lo:hi])
        if timed.size:
            assert kind[lo + timed[0]] == ABS


def test_time_kinds_thresholds_and_fallbacks():
    t = [100, 100, 355, 356, 100, 100 + 2**32, 100 + 2**32 + 2**32 - 1, None, 5]
    m = _ms(["1.1.1.1"] * len(t), ["8.8.8.8"] * len(t), times=t)
    kind, delta = time_kinds(m)
    assert kind.tolist() == [ABS, DELTA1, DELTA1, DELTA1, ABS, ABS, DELTA4, NO_TIME, ABS]
    assert delta.tolist() == [0, 0, 255, 1, 0, 0, 2**32 - 1, 0, 0]
    # 255 s is the last 1-byte delta, 256 s the first 4-byte one
    kind, _ = time_kinds(_ms(["1.1.1.1"] * 3, ["8.8.8.8"] * 3, times=[0, 255, 511]))
    assert kind.tolist() == [ABS, DELTA1, DELTA4]
    enc = encode(m, "compact")
    dec = decode(enc.tokens, "compact")
    assert dec.time_kind.tolist() == kind_list(m)
    assert dec.measurements.time_s[m.has_time].tolist() == [x for x in t if x is not None]


def kind_list(m):
    return time_kinds(m)[0].tolist()


# ---------------------------------------------------------------- token counts


@pytest.mark.parametrize(
    "src,dst,rtt,times,expected",
    [
        ("193.0.14.129", "8.8.8.8", 10.0, None, [14]),
        ("193.0.14.129", "8.8.8.8", 10.0, [0, 60], [23, 16]),  # abs, delta1
        ("193.0.14.129", "8.8.8.8", 10.0, [0, 3600], [23, 19]),  # abs, delta4
        ("193.0.14.129", "8.8.8.8", -1.0, [0, 60], [21, 14]),  # failed: 2 fewer
        ("2001:db8::1", "2001:4860::8888", 10.0, None, [38]),
        ("2001:db8::1", "2001:4860::8888", 10.0, [0, 60], [47, 40]),
        ("2001:db8::1", "2001:4860::8888", 10.0, [0, 3600], [47, 43]),
    ],
)
def test_compact_token_counts(src, dst, rtt, times, expected):
    k = len(expected)
    m = _ms([src] * k, [dst] * k, rtt, times)
    assert encode(m, "compact").lengths.tolist() == expected


def test_full_token_counts_and_exact_layout():
    m = _ms(["193.0.14.129", "2001:db8::1"], ["8.8.8.8", "2001:4860::8888"], [12.3, -1.0], [1_704_067_200, 0],
            size=[48, 70_000], errors=[1, 300], msm_id=[1001, 7])
    enc = encode(m, "full")
    assert enc.lengths.tolist() == [45, 69]
    b = FULL.byte
    first = enc.measurement(0).tolist()
    assert first[:13] == [F.MeasurementStart, F.SrcIpStart, F.Ipv4Start, b(193), b(0), b(14), b(129),
                          F.DestIpStart, F.Ipv4Start, b(8), b(8), b(8), b(8)]
    assert first[13] == F.RttStart and first[14:22] == [b(x) for x in np.array(12.3, ">f8").tobytes()]
    dec = decode(enc.tokens, "full").measurements
    assert dec.size.tolist() == [48, 65535] and dec.errors.tolist() == [1, 255]  # saturated
    assert dec.rtt_ms.tolist() == [12.3, -1.0]


def test_compact_exact_layout():
    m = _ms(["193.0.14.129"] * 2, ["8.8.8.8"] * 2, [12.3, -1.0], [1_704_067_200, 1_704_067_260])
    enc = encode(m, "compact")
    b = COMPACT.byte
    assert enc.measurement(0).tolist() == [
        C.MeasurementStart, C.SrcIPv4, b(193), b(0), b(14), b(129), C.DstIPv4, b(8), b(8), b(8), b(8),
        C.RttStart, b(0x1E), b(0x02), C.TimestampAbs, *[b(x) for x in (1_704_067_200).to_bytes(8, "big")],
    ]
    assert enc.measurement(1).tolist()[-3:] == [C.Failed, C.TimestampDelta1, b(60)]


def test_vocab_tables():
    assert COMPACT.size == 267 and FULL.size == 266
    assert COMPACT.byte(0) == 11 and COMPACT.byte(255) == 266 and FULL.byte(0) == 10
    assert COMPACT.names[:11] == ("MeasurementStart", "SrcIPv4", "SrcIPv6", "DstIPv4", "DstIPv6", "TimestampAbs",
                                  "TimestampDelta1", "TimestampDelta4", "RttStart", "ThroughputStart", "Failed")
    assert COMPACT.name(11) == "Byte0" and COMPACT.id("Byte255") == 266
    assert FULL.roles == ("MeasurementStart", "SrcIpStart", "DestIpStart", "Ipv4Start", "Ipv6Start", "RttStart",
                          "SizeStart", "ErrorCountStart", "TimestampStart", "MsmIdStart")


# ---------------------------------------------------------------- field order


def _ipv4_batch(n=300):
    rng = np.random.default_rng(5)
    src = [f"10.{a}.{b}.1" for a, b in rng.integers(0, 255, (n, 2))]
    return _ms(src, ["8.8.8.8"] * n, list(rng.uniform(1, 100, n)), list(range(0, 60 * n, 60)))


@pytest.mark.parametrize("scheme", ["compact", "full"])
def test_orders_vary_with_rng_and_reproduce_with_seed(scheme):
    m = _ipv4_batch()
    a = encode(m, scheme, rng=np.random.default_rng(1))
    b = encode(m, scheme, rng=np.random.default_rng(1))
    c = encode(m, scheme, rng=np.random.default_rng(2))
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    assert len({tuple(o) for o in a.order.tolist()}) > 20  # many distinct orders in one batch
    # Encoded.order reproduces the stream exactly; rng=None is canonical
    assert np.array_equal(encode(m, scheme, order=a.order).tokens, a.tokens)
    canon = encode(m, scheme)
    assert (canon.order == np.arange(len(blocks(scheme)))).all()
    assert np.array_equal(encode(m, scheme, order=list(blocks(scheme))).tokens, canon.tokens)
    for enc in (a, c, canon):
        _assert_roundtrip(m, scheme, enc, decode(enc.tokens, scheme))


def test_order_is_uniform_over_permutations():
    m = _ipv4_batch(24 * 200)
    enc = encode(m, "compact", rng=np.random.default_rng(3))
    _, counts = np.unique(enc.order, axis=0, return_counts=True)
    assert len(counts) == 24
    assert counts.min() > 200 * 0.6 and counts.max() < 200 * 1.4


def test_fixed_order_by_names_and_bad_orders():
    m = _ipv4_batch(3)
    enc = encode(m, "compact", order=["time", "result", "dst", "src"])
    assert enc.measurement(0)[1] == C.TimestampAbs
    with pytest.raises(ValueError):
        encode(m, "compact", order=[0, 0, 1, 2])
    with pytest.raises(ValueError):
        encode(m, "compact", order=[0, 1, 2])


def test_encoder_rejects_mixed_families_and_nan():
    m = _ms(["1.2.3.4"], ["8.8.8.8"])
    m.dst_v6[:] = True
    with pytest.raises(ValueError, match="families"):
        encode(m, "compact")
    m = _ms(["1.2.3.4"], ["8.8.8.8"], [float("nan")])
    with pytest.raises(ValueError, match="NaN"):
        encode(m, "compact")


def test_tokenizer_from_config():
    from pingctl.config import load_config

    tok = Tokenizer.from_config(load_config(overrides=["tokenizer.scheme=full"]))
    assert tok.scheme == "full" and tok.vocab_size == 266 and tok.blocks[0] == "src"
    assert isinstance(tok.grammar(), GrammarState)
    with pytest.raises(ValueError, match="unknown tokenizer scheme"):
        Tokenizer("bpe")


# ---------------------------------------------------------------- packing


@SETTINGS
@given(measurements(max_n=60), st.integers(60, 200), st.lists(st.integers(1, 59), max_size=3))
def test_pack_contexts_fits_and_is_greedy(m, seq_len, groups):
    groups = sorted({g for g in groups if g < len(m)})
    starts = pack_contexts(m, "compact", seq_len, groups)
    if len(m) == 0:
        assert starts.size == 0
        return
    assert starts[0] == 0 and set(groups) <= set(starts.tolist())
    enc = encode(m, "compact", context_starts=starts)
    bounds = [*starts.tolist(), len(m)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        size = int(enc.offsets[hi] - enc.offsets[lo])
        assert size <= seq_len or hi == lo + 1
        if hi < len(m) and hi not in groups:  # greedy: one more measurement would not fit
            longer = measurement_lengths(m[lo : hi + 1], "compact").sum()
            assert longer > seq_len


# ---------------------------------------------------------------- bench


def test_bench_tokenize_small():
    from pingctl.tokenizer.bench import bench_tokenize

    res = bench_tokenize(2000, "both", repeats=1)
    assert res["name"] == "tokenize"
    keys = {tuple(r) for r in res["table"]}
    assert len(keys) == 1
    cases = {(r["case"], r["scheme"]) for r in res["table"]}
    assert ("strings->tokens", "compact") in cases and ("decode", "full") in cases
    assert all(r["meas/s"] > 0 for r in res["table"])


def test_times_beyond_a_microsecond_timestamp_become_null_not_another_date():
    """A decoded TimestampAbs may be any int64 of seconds; canonical event_time is int64 us."""
    import pyarrow as pa

    from pingctl.tokenizer.measurements import MAX_EVENT_TIME_S, Measurements

    t = pa.table({"src_addr": ["193.0.0.1"] * 4, "dst_addr": ["8.8.8.8"] * 4, "rtt": [1.0, 2.0, 3.0, 4.0],
                  "event_time": pa.array([1_676_064_641, 139_127_374_000_000, -(2**63), MAX_EVENT_TIME_S],
                                         pa.int64())})
    m = Measurements.from_arrow(t)
    assert m.unrepresentable_times().tolist() == [False, True, True, False]
    ts = m.to_arrow().column("event_time")
    assert ts.null_count == 2 and not ts[1].is_valid and not ts[2].is_valid
    assert ts[0].value == 1_676_064_641 * 1_000_000 and ts[3].value == MAX_EVENT_TIME_S * 1_000_000


def test_unix_second_columns_are_read_exactly_or_refused():
    import pyarrow as pa

    from pingctl.tokenizer.measurements import MeasurementError, Measurements

    def table(col):
        return pa.table({"src_addr": ["193.0.0.1"] * 2, "dst_addr": ["8.8.8.8"] * 2, "rtt": [1.0, 2.0],
                         "event_time": col})

    big = 2**53 + 1  # not a float64: the old float detour read it as 2**53
    assert Measurements.from_arrow(table(pa.array([big, 5], pa.int64()))).time_s.tolist() == [big, 5]
    with pytest.raises(MeasurementError, match="int64 range"):
        Measurements.from_arrow(table(pa.array([2**64 - 1, 5], pa.uint64())))
    with pytest.raises(MeasurementError, match="not finite"):
        Measurements.from_arrow(table(pa.array([float("nan"), 5.0])))
    assert Measurements.from_arrow(table(pa.array([None, 5.5]))).has_time.tolist() == [False, True]


_ADDRESS_TEXT = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: a.exploded.upper()),
    st.sampled_from(["1.2.3.04", "256.1.1.1", "::ffff:1.2.3.4", "fe80::1%eth0", "", " 1.2.3.4", "x", "8.8.*.*"]),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ADDRESS_TEXT, min_size=1, max_size=8))
def test_a_few_addresses_parse_as_the_arrow_column_path_parses_them(values):
    # the small-input path of Measurements.from_fields must agree with the vectorised one,
    # bytes, families and refusals alike (its message too)
    from pingctl.tokenizer.measurements import parse_address_list, parse_addresses

    def outcome(f):
        try:
            a, v6 = f()
            return a.tolist(), v6.tolist()
        except PingctlError as e:
            return str(e)

    assert outcome(lambda: parse_address_list(values, "src")) == outcome(
        lambda: parse_addresses(pa.array(values, pa.string()), "src"))
