"""Grammar state machine, validator and the never-raising decoder (fuzzed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.tokenizer import (
    COMPACT,
    FULL,
    C,
    F,
    GrammarError,
    GrammarState,
    Measurements,
    allowed_next,
    decode,
    encode,
    validate,
)
from pingctl.tokenizer.decode import ERROR_KINDS
from pingctl.tokenizer.rtt_codec import POSSIBLE_FIRST_BYTES
from tests.test_tokenizer import measurements

SETTINGS = settings(max_examples=80)
VOCAB = {"compact": COMPACT, "full": FULL}


def grammar_accepts(tokens, scheme, prefix=False) -> bool:
    state = GrammarState(scheme)
    try:
        state.feed(tokens)
    except GrammarError:
        return False
    return prefix or state.can_end


def _stream(scheme, seed=0):
    m = Measurements.from_fields(
        ["193.0.14.129", "2001:db8::1", "193.0.14.129", "10.0.0.1"],
        ["8.8.8.8", "2001:4860::8888", "1.1.1.1", "9.9.9.9"],
        [12.3, 40.0, -1.0, 0.5],
        [1_704_067_200, 1_704_067_230, None, 1_704_070_000],
    )
    return m, encode(m, scheme, rng=np.random.default_rng(seed)).tokens.tolist()


# ---------------------------------------------------------------- grammar on valid streams


@settings(max_examples=40)
@given(measurements(max_n=8), st.sampled_from(["compact", "full"]), st.integers(0, 1000))
def test_grammar_accepts_every_encoded_stream_token_by_token(m, scheme, seed):
    tokens = encode(m, scheme, rng=np.random.default_rng(seed)).tokens.tolist()
    state = GrammarState(scheme)
    for i, t in enumerate(tokens):
        mask = state.mask()
        assert mask.shape == (VOCAB[scheme].size,)
        assert mask[t], f"token {VOCAB[scheme].name(t)} at {i} not in the allowed set"
        state.step(t)
    assert state.can_end
    assert validate(tokens, scheme) == []
    if tokens:
        k = len(tokens) // 2
        assert np.array_equal(allowed_next(tokens[:k], scheme), GrammarState(scheme).feed(tokens[:k]).mask())


def test_grammar_rules_compact():
    b = COMPACT.byte
    s = GrammarState("compact")
    assert s.can_end and s.allowed() == [C.MeasurementStart]
    s.step(C.MeasurementStart)
    allowed = set(s.allowed())
    # no delta before an absolute timestamp, never the reserved token, not complete yet
    assert C.TimestampAbs in allowed and C.TimestampDelta1 not in allowed and C.TimestampDelta4 not in allowed
    assert C.ThroughputStart not in allowed and C.MeasurementStart not in allowed and not s.can_end
    s.feed([C.SrcIPv4, b(1), b(2), b(3), b(4)])
    allowed = set(s.allowed())
    assert C.DstIPv4 in allowed and C.DstIPv6 not in allowed and C.SrcIPv4 not in allowed
    s.feed([C.DstIPv4, b(8), b(8), b(8), b(8), C.Failed])
    assert s.can_end and C.MeasurementStart in s.allowed() and C.RttStart not in s.allowed()
    s.feed([C.TimestampAbs] + [b(0)] * 8 + [C.MeasurementStart])
    assert C.TimestampDelta1 in s.allowed()  # a reference exists now
    r = s.copy().feed([C.RttStart])  # the RTT's first byte: only codes a token stream carries
    assert np.array_equal(r.mask()[COMPACT.byte_offset :], POSSIBLE_FIRST_BYTES)
    assert r.feed([b(0x87)]).mask()[COMPACT.byte_offset :].all()  # any second byte: 0x87FF is the ceiling
    with pytest.raises(GrammarError):
        s.step(b(0))
    assert s.position == 22  # a rejected step leaves the state unchanged
    mask = s.mask()
    with pytest.raises(ValueError):
        mask[0] = False  # cached masks are read-only


def test_grammar_rules_full():
    b = FULL.byte
    s = GrammarState("full").feed([F.MeasurementStart, F.DestIpStart])
    assert s.allowed() == [F.Ipv4Start, F.Ipv6Start]
    s.feed([F.Ipv6Start] + [b(0)] * 16 + [F.SrcIpStart])
    assert s.allowed() == [F.Ipv6Start]  # family must match
    s.feed([F.Ipv6Start] + [b(1)] * 16)
    assert not s.can_end and F.MeasurementStart not in s.allowed()
    for role, n in ((F.RttStart, 8), (F.SizeStart, 2), (F.ErrorCountStart, 1), (F.TimestampStart, 8)):
        s.feed([role] + [b(0)] * n)
    assert not s.can_end and set(s.allowed()) == {F.MsmIdStart}
    s.feed([F.MsmIdStart] + [b(0)] * 8)
    assert s.can_end and s.allowed() == [F.MeasurementStart]


def test_allowed_next_raises_on_illegal_prefix():
    with pytest.raises(GrammarError):
        allowed_next([C.SrcIPv4], "compact")
    with pytest.raises(GrammarError):
        allowed_next([0, 999], "compact")


# ---------------------------------------------------------------- decoder errors


@pytest.mark.parametrize(
    "tokens,kind",
    [
        ([C.SrcIPv4, 0], "stray_tokens"),
        ([0, 400], "invalid_token"),
        ([0, -3], "invalid_token"),
        ([0, C.ThroughputStart], "unexpected_token"),
        ([0, COMPACT.byte(7)], "unexpected_token"),
        ([0, C.SrcIPv4, 11, 11], "truncated"),
        ([0, C.SrcIPv4, 11, 11, C.RttStart, 11, 11], "non_byte_in_field"),
        ([0, C.RttStart, COMPACT.byte(0x88), COMPACT.byte(0)], "impossible_rtt"),  # above the ceiling
        ([0, C.RttStart, COMPACT.byte(0x08), C.SrcIPv4], "impossible_rtt"),  # e = 1, m < 1024: never emitted
        ([0, C.Failed, C.Failed], "duplicate_field"),
        ([0, C.Failed], "missing_field"),
        ([0, C.SrcIPv4, 11, 11, 11, 11, C.DstIPv6], "family_mismatch"),
        ([0, C.TimestampDelta1, 11], "delta_without_reference"),
    ],
)
def test_decoder_error_kinds(tokens, kind):
    dec = decode(tokens, "compact")
    assert [e.kind for e in dec.errors][:1] == [kind]
    assert kind in ERROR_KINDS
    assert not grammar_accepts(tokens, "compact")


def test_full_decoder_error_kinds():
    assert decode([0, F.SrcIpStart, F.RttStart], "full").errors[0].kind == "bad_family"
    assert decode([0, F.SrcIpStart], "full").errors[0].kind == "truncated"
    assert decode([0, F.Ipv4Start], "full").errors[0].kind == "unexpected_token"


def test_decoder_resynchronises_at_next_measurement():
    m, _ = _stream("compact")
    tokens = encode(m, "compact", order=["time", "src", "dst", "result"]).tokens.tolist()
    assert tokens[1] == C.TimestampAbs and tokens[10] == C.SrcIPv4
    bad = tokens[:12] + [C.RttStart] + tokens[12:]  # corrupt the first measurement's source
    dec = decode(bad, "compact")
    assert [(e.start, e.end, e.pos, e.kind) for e in dec.errors] == [(0, 24, 12, "non_byte_in_field")]
    assert dec.measurements.src_text() == m.src_text()[1:]
    # its absolute timestamp was read before the error, so it still anchors the delta after it
    assert dec.measurements.time_s.tolist() == [1_704_067_230, 0, 1_704_070_000]
    # a timestamp after the error is never read: later deltas have no reference
    bad = tokens[:2] + [C.RttStart] + tokens[2:]
    assert [e.kind for e in decode(bad, "compact").errors] == ["non_byte_in_field", "delta_without_reference",
                                                              "delta_without_reference"]


def test_validate_prefix_mode():
    _, tokens = _stream("compact")
    for k in range(len(tokens) + 1):
        assert validate(tokens[:k], "compact", prefix=True) == []
        assert (validate(tokens[:k], "compact") == []) == grammar_accepts(tokens[:k], "compact")


# ---------------------------------------------------------------- fuzzing


def _ids(scheme):
    v = VOCAB[scheme].size
    return st.one_of(
        st.integers(0, VOCAB[scheme].byte_offset - 1),  # role tokens, often
        st.integers(0, v - 1),
        st.integers(-3, v + 3),
        st.integers(-(2**70), 2**70),  # beyond int64
    )


@SETTINGS
@given(st.sampled_from(["compact", "full"]), st.data())
def test_decode_never_raises_on_random_streams(scheme, data):
    tokens = data.draw(st.lists(_ids(scheme), max_size=80))
    dec = decode(tokens, scheme)
    _check_decoded(dec, tokens, scheme)


@SETTINGS
@given(st.sampled_from(["compact", "full"]), st.integers(0, 50), st.data())
def test_decode_survives_mutations_of_valid_streams(scheme, seed, data):
    m, tokens = _stream(scheme, seed)
    ops = data.draw(st.lists(st.tuples(st.sampled_from(["del", "ins", "set", "cut"]), st.integers(0, 10**6),
                                       _ids(scheme)), min_size=1, max_size=4))
    for op, where, tok in ops:
        i = where % (len(tokens) + 1)
        if op == "del" and i < len(tokens):
            del tokens[i]
        elif op == "ins":
            tokens.insert(i, tok)
        elif op == "set" and i < len(tokens):
            tokens[i] = tok
        elif op == "cut":
            tokens = tokens[:i]
    _check_decoded(decode(tokens, scheme), tokens, scheme)


@SETTINGS
@given(st.sampled_from(["compact", "full"]), measurements(max_n=10), st.sampled_from(["del", "ins", "set"]),
       st.integers(0, 10**6), st.data())
def test_one_corrupted_token_costs_at_most_one_measurement(scheme, m, op, where, data):
    m.has_time[:] = False  # (a corrupted absolute timestamp legitimately orphans the deltas after it)
    tokens = encode(m, scheme, rng=np.random.default_rng(where)).tokens.tolist()
    candidates = [i for i, t in enumerate(tokens) if t != 0]
    if not candidates:
        return
    i = candidates[where % len(candidates)]
    tok = data.draw(_ids(scheme).filter(lambda t: t != 0))
    if op == "del":
        del tokens[i]
    elif op == "ins":
        tokens.insert(i, tok)
    else:
        tokens[i] = tok
    dec = decode(tokens, scheme)
    _check_decoded(dec, tokens, scheme)
    assert len(dec) >= len(m) - 1


def _check_decoded(dec, tokens, scheme):
    n = len(tokens)
    in_range = [isinstance(t, int) and 0 <= t < VOCAB[scheme].size for t in tokens]
    segments = sum(1 for t in tokens if t == 0)
    assert len(dec) + sum(e.kind != "stray_tokens" for e in dec.errors) == segments
    for e in dec.errors:
        assert 0 <= e.start < e.end <= n and e.start <= e.pos < e.end and e.kind in ERROR_KINDS and e.message
    for lo, hi in dec.spans.tolist():
        assert 0 <= lo < hi <= n and tokens[lo] == 0 and all(in_range[lo:hi])
    # the validator and the grammar agree on every stream, whole and as a prefix
    assert (validate(tokens, scheme) == []) == grammar_accepts(tokens, scheme)
    assert (validate(tokens, scheme, prefix=True) == []) == grammar_accepts(tokens, scheme, prefix=True)
    # whatever decodes cleanly re-encodes to a valid stream
    again = encode(dec.measurements, scheme).tokens
    assert validate(again, scheme) == []


def test_decode_accepts_odd_inputs():
    assert decode([], "compact").ok
    assert decode(np.array([], np.uint64), "full").ok
    dec = decode(np.array([2**64 - 1, 0], np.uint64), "compact")
    assert [e.kind for e in dec.errors] == ["stray_tokens", "missing_field"]
    dec = decode([0, 1.5, "x", None], "compact")
    assert dec.errors[0].kind == "invalid_token"
    with pytest.raises(ValueError):
        decode(np.zeros((2, 3), np.int32), "compact")


def _random_walk(scheme, seed, length):
    """A random legal stream: each token drawn uniformly from the grammar's mask."""
    rng = np.random.default_rng(seed)
    state, out = GrammarState(scheme), []
    for _ in range(length):
        t = int(rng.choice(np.flatnonzero(state.mask())))
        state.step(t)
        out.append(t)
    return out, state


@SETTINGS
@given(st.sampled_from(["compact", "full"]), st.integers(0, 2**32), st.integers(0, 150), st.data())
def test_grammar_walks_decode_cleanly_and_agree_with_validator(scheme, seed, length, data):
    tokens, state = _random_walk(scheme, seed, length)
    assert validate(tokens, scheme, prefix=True) == []
    dec = decode(tokens, scheme)
    assert (dec.errors == []) == state.can_end
    if state.can_end:
        assert len(dec) == tokens.count(0)
    # one foreign token anywhere: validator and grammar still agree
    i = data.draw(st.integers(0, len(tokens)))
    tokens.insert(i, data.draw(_ids(scheme)))
    _check_decoded(decode(tokens, scheme), tokens, scheme)
