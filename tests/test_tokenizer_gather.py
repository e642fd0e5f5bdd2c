"""The loader's encoder path (`pingctl.tokenizer.gather`, docs/loader.md "Encoding by a gather"):
tokens gathered from per-record tables are exactly `encode`'s, on random records."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.loader.sequences import RecordLengths, Shaping, encode_items, measurements_of, pack_sequences
from pingctl.loader.triangulation import Triangulation, pack_element
from pingctl.records.layout import ProbeRecord
from pingctl.tokenizer import MeasurementError, blocks, encode
from pingctl.tokenizer.gather import block_tables, encode_gathered
from pingctl.tokenizer.layout import field_order
from tests.test_loader_fast import _probe
from tests.test_triangulation import _world


def _tables(rec: ProbeRecord):
    return block_tables(rec.src_addr, rec.src_v6, rec.dst_addr, rec.dst_v6, rec.src_idx, rec.dst_idx, rec.rtt_ms,
                        rec.time_s)


@given(st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 400), st.floats(0.0, 1.0), st.integers(0, 6))
@settings(max_examples=120, deadline=None)
def test_gathered_tokens_are_encodes(seed, n_records, n, timed_share, n_starts):
    """Measurements from several records (IPv4 and IPv6, failures, timestamps of every width,
    repeated positions), random block orders and context starts: the same tokens, offsets and
    orders as `encode` of the same measurements."""
    rng = np.random.default_rng(seed)
    recs = [_probe(seed + j, int(rng.integers(1, 300))) for j in range(n_records)]
    who = rng.integers(0, n_records, n)
    where = np.array([rng.integers(0, recs[w].n) for w in who])
    has_time = rng.random(n) < timed_share
    order = field_order(n, blocks("compact"), rng)
    starts = np.unique(np.r_[0, rng.integers(0, n, n_starts)])
    want = encode(measurements_of(recs, who, where, has_time), "compact", order=order, context_starts=starts)
    got = encode_gathered([_tables(r) for r in recs], who if n_records > 1 else None, where, has_time, order, starts)
    assert got.tokens.dtype == want.tokens.dtype
    assert np.array_equal(got.tokens, want.tokens)
    assert np.array_equal(got.offsets, want.offsets)
    assert np.array_equal(got.order, want.order)


def _no_tables(rec: ProbeRecord, **kw) -> RecordLengths:
    """RecordLengths without tables: the loader then encodes through `Measurements` (the full scheme's path)."""
    lengths = RecordLengths(rec, "compact", **kw)
    lengths.tables = None
    return lengths


@given(st.integers(0, 2**31), st.sampled_from([Shaping(), Shaping(result_last=0.5, max_per_pair=1)]),
       st.sampled_from([(0.4, 0.3, 0.3), (0, 1, 0)]))
@settings(max_examples=25, deadline=None)
def test_the_loader_packs_the_same_rows_through_either_encoder(seed, shaping, weights):
    """Plain and triangulation rows from the tables are those of the `Measurements` path."""
    probes, lookup = _world(seed % 1000, n=600)
    mode_p = np.asarray(weights, float) / sum(weights)
    tri = Triangulation(0.5, 6, 6, 1)

    def no_tables(key, t):
        got = lookup(key, t)
        return None if got is None else (got[0], _no_tables(got[0], prefix=False))

    for rec in probes.values():
        plain = [pack_sequences(rec, np.random.default_rng(seed), 3, 256, mode_p, "compact", shaping, lengths)
                 for lengths in (RecordLengths(rec, "compact"), _no_tables(rec))]
        both = [pack_element(rec, np.random.default_rng(seed), 2, 2, 256, mode_p, "compact", shaping, tri, how,
                             lengths) for how, lengths in ((lookup, RecordLengths(rec, "compact")),
                                                           (no_tables, _no_tables(rec)))]
        for a, b in (plain, both):
            for field in ("tokens", "segment", "position", "modes", "measurements"):
                assert np.array_equal(getattr(a, field), getattr(b, field))
        assert (plain[0].segment > 0).any()


def test_input_the_encoder_refuses_is_refused_with_its_message():
    """A NaN RTT or a measurement whose addresses differ in family marks the tables not valid;
    the loader then encodes through `encode`, which names the problem."""
    rec = _probe(1, 50)
    assert _tables(rec).valid
    nan = ProbeRecord(**{**rec.__dict__, "rtt_ms": np.where(np.arange(rec.n) == 3, np.nan, rec.rtt_ms)})
    mixed = ProbeRecord(**{**rec.__dict__, "dst_idx": np.where(rec.src_v6[rec.src_idx], 0, 4).astype(np.uint32)})
    for bad, message in ((nan, "NaN"), (mixed, "families differ")):
        lengths = RecordLengths(bad, "compact")
        assert not lengths.tables.valid
        where = np.arange(bad.n)
        with pytest.raises(MeasurementError, match=message):
            encode_items([bad], [lengths], None, where, np.ones(bad.n, bool),
                         field_order(bad.n, blocks("compact"), np.random.default_rng(0)), np.array([0]), "compact")
