"""The loader's array paths (docs/loader.md, "How contexts are chosen, fast"): each is checked
against the rule it replaces, on random records with bursts at one second and deltas of every
timestamp width."""

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pingctl.context import recent_others
from pingctl.loader.record_cache import RecordCache
from pingctl.loader.sequences import RecordLengths, choose_contexts, time_lengths
from pingctl.loader.triangulation import Triangulation, choose_triangulation, recent_many
from pingctl.records.layout import ProbeRecord, encode as encode_record, to_measurements
from pingctl.tokenizer import measurement_lengths
from tests.test_triangulation import _world


def _probe(seed: int, n: int) -> ProbeRecord:
    """A probe record with IPv4 and IPv6 sources and destinations, failures, repeated
    timestamps and gaps from 0 s to beyond 2**32 s (every compact timestamp width)."""
    rng = np.random.default_rng(seed)
    gaps = rng.choice([0, 0, 1, 30, 255, 256, 900, 70_000, 2**32 + 5], n)
    n_src, n_dst = 2, 7
    addr_v6 = np.array([False, True])
    src_v6 = addr_v6[rng.integers(0, 2, n)]
    dst_slot = rng.integers(0, 4, n)  # per family, four destinations
    return ProbeRecord(
        probe="prb:1", prb_id=1, time_s=1_600_000_000 + np.cumsum(gaps).astype(np.int64),
        rtt_ms=np.where(rng.random(n) < 0.1, -1.0, rng.uniform(0.1, 900, n)), msm_id=np.zeros(n, np.int64),
        src_idx=src_v6.astype(np.uint32), dst_idx=(dst_slot + 4 * src_v6).clip(0, n_dst).astype(np.uint32),
        size=np.full(n, 48, np.int32), errors=np.zeros(n, np.int32),
        src_addr=rng.integers(0, 256, (n_src, 16)).astype(np.uint8), src_v6=addr_v6,
        dst_addr=rng.integers(0, 256, (n_dst + 1, 16)).astype(np.uint8),
        dst_v6=np.array([False] * 4 + [True] * 4))


@given(st.integers(0, 2**31), st.integers(1, 300), st.sampled_from(["compact", "full"]),
       st.sampled_from([(0.4, 0.3, 0.3), (1, 0, 0), (0, 1, 0), (0, 0, 1)]), st.sampled_from([64, 256, 1024]),
       st.sampled_from([(0, 0.0), (1, 0.0), (2, 0.0), (0, 0.5), (1, 0.3)]))
@settings(max_examples=80, deadline=None)
def test_fast_paths_choose_the_general_paths_contexts(seed, n, scheme, weights, seq_len, shaping):
    """The prefix-sum and single-measurement paths give exactly the contexts the general path
    (arrange, exact lengths, longest prefix that fits) gives from the same draws."""
    rec = _probe(seed, n)
    mode_p = np.asarray(weights, float) / sum(weights)
    max_per_pair, pair_share = shaping
    plans = [choose_contexts(rec, np.random.default_rng(seed), 3, seq_len, mode_p, scheme, max_per_pair, pair_share,
                             4, fast=fast) for fast in (True, False)]
    fast, general = plans
    assert len(fast.idx) == len(general.idx)
    for a, b in zip(fast.idx + fast.has_time, general.idx + general.has_time):
        assert np.array_equal(a, b)
    assert fast.length == general.length and fast.row == general.row
    assert np.array_equal(fast.modes, general.modes)
    # and the lengths are the encoder's
    for idx, has_time, length in zip(fast.idx, fast.has_time, fast.length):
        assert int(measurement_lengths(to_measurements(rec, idx, has_time), scheme).sum()) == length


@given(st.integers(0, 2**31), st.integers(1, 200), st.integers(0, 400))
@settings(max_examples=60, deadline=None)
def test_record_lengths_give_a_full_window_and_its_longest_prefix_that_fits(seed, n, room):
    rec = _probe(seed, n)
    lengths = RecordLengths(rec, "compact")
    rng = np.random.default_rng(seed)
    for _ in range(5):
        start = int(rng.integers(0, n))
        length = int(rng.integers(1, n - start + 1))
        idx = np.arange(start, start + length)
        per = measurement_lengths(to_measurements(rec, idx, True), "compact")  # the encoder's truth, one context
        keep, tokens = lengths.full_prefix(start, length, room)
        assert keep == int((np.cumsum(per) <= room).sum())
        assert tokens == int(per[:keep].sum())
        assert lengths.window(start, length) == int(measurement_lengths(to_measurements(rec, idx, False)).sum())


def test_time_lengths_restart_per_context():
    t = np.array([100, 110, 400, 400, 10, 20])
    has = np.array([True, True, True, False, True, True])
    assert time_lengths(t, has).tolist() == [9, 2, 5, 0, 9, 2]  # one context: 400 -> 10 goes back, absolute
    assert time_lengths(t, has, np.array([0, 0, 1, 1, 1, 2])).tolist() == [9, 2, 9, 0, 9, 9]


@given(st.lists(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=120), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 65), st.integers(-1, 6), st.integers(0, 12)), max_size=30),
       st.integers(0, 3), st.booleans())
@settings(max_examples=200, deadline=None)
def test_recent_many_is_recent_others_for_every_query(histories, queries, per_pair, bounded):
    times = [np.array(sorted(t for t, _ in h), np.int64) for h in histories]
    others = [np.array([o for _, o in sorted(h)], np.int64) for h in histories]
    queries = sorted((h % len(histories), t, x, k) for h, t, x, k in queries)
    which = np.array([q[0] for q in queries], np.int64)
    t_q, exclude, k = (np.array([q[i] for q in queries], np.int64) for i in (1, 2, 3))
    n_other = np.array([len(set(others[h].tolist()) - {x}) for h, _, x, _ in queries], np.int64) if bounded else None
    pos, count = recent_many(times, others, which, t_q, exclude, k, per_pair, n_other)
    assert count.sum() == len(pos)
    got = np.split(pos, np.cumsum(count)[:-1]) if len(queries) else []
    for (h, t, x, kk), side in zip(queries, got):
        want = recent_others(times[h], others[h], t, x, kk, per_pair)
        assert side.tolist() == want.tolist()


def _sides(chosen, ctx):
    """(source side, destination side) record positions of one context, its query last."""
    who, where = chosen.who[ctx][:-1], chosen.where[ctx][:-1]
    return where[who == 0], where[who > 0]


@given(st.integers(0, 2**31), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2))
@settings(max_examples=30, deadline=None)
def test_each_side_is_the_most_recent_of_its_rule_and_full_sized_half_of_the_time(seed, k_src, k_dst, per_pair):
    probes, lookup = _world(seed)
    rng = np.random.default_rng(seed)
    tri = Triangulation(1.0, k_src, k_dst, per_pair)
    full_src = full_dst = n_ctx = 0
    for rec in probes.values():
        # rows long enough that nearly every context is whole (a trimmed one only loses its oldest)
        chosen = choose_triangulation(rec, rng, 2, 8192, np.array([1.0, 0, 0]), "compact", tri, lookup)
        ends = np.cumsum([len(i) for i in chosen.plan.idx])
        for a, b in zip(np.r_[0, ends[:-1]], ends):
            q = int(chosen.where[b - 1])
            src, dst = _sides(chosen, slice(a, b))
            t, d = int(rec.time_s[q]), int(rec.dst_idx[q])
            every = recent_others(rec.time_s, rec.dst_idx, t, d, k_src, per_pair)
            assert np.array_equal(src, every[len(every) - len(src):])  # the most recent of the rule
            full_src += len(src) == len(every)
            if len(dst):
                drec = chosen.records[int(chosen.who[a:b - 1][chosen.who[a:b - 1] > 0][0])]
                other = np.flatnonzero((drec.src_addr == rec.src_addr[rec.src_idx[q]]).all(axis=1))
                every = recent_others(drec.time_s, drec.src_idx, t, int(other[0]) if len(other) else -1, k_dst,
                                      per_pair)
                assert np.array_equal(np.sort(dst), every[len(every) - len(dst):])
                full_dst += len(dst) == len(every)
            n_ctx += 1
    # a side is k (or all the rule has) half of the time, and uniform below k otherwise
    assert n_ctx > 20
    assert full_src / n_ctx > 0.4 and full_dst / n_ctx > 0.25


def test_partial_triangulation_contexts_keep_timestamps_in_time_order_at_random_slots():
    probes, lookup = _world(11, n=2000)
    rng = np.random.default_rng(3)
    timed = slots = first_untimed = 0
    for rec in probes.values():
        chosen = choose_triangulation(rec, rng, 3, 2048, np.array([0, 1.0, 0]), "compact", Triangulation(1.0, 8, 8, 1),
                                      lookup)
        m = chosen.measurements()
        ends = np.cumsum([len(i) for i in chosen.plan.idx])
        for a, b in zip(np.r_[0, ends[:-1]], ends):
            t, has = m.time_s[a:b], m.has_time[a:b]
            assert (np.diff(t[has]) >= 0).all()  # timed ones in time order, wherever they sit
            assert (t[:-1] < t[-1]).all()
            timed += int(has[:-1].sum())
            slots += b - a - 1
            first_untimed += int(b - a > 2 and not has[0])
    # a uniform share in 0.2-0.8 of the sides timed (at least one): about half
    assert 0.4 < timed / slots < 0.65
    assert first_untimed > 0  # untimed ones take random slots, the first too


class _Reader:
    """Records by id, counting the reads."""

    def __init__(self, raw: list[bytes]):
        self.raw = raw
        self.calls: list[int] = []

    def get(self, rid):
        self.calls.append(rid)
        return self.raw[rid]


def test_record_cache_reads_a_record_once_and_keeps_it_within_its_budget():
    recs = [_probe(s, 400) for s in range(4)]
    raw = [encode_record(r) for r in recs]
    reader = _Reader(raw)
    cache = RecordCache(reader, "compact", cache_mb=1.0)
    for rid in (0, 1, 0, 1, 2):
        rec, lengths = cache.get(rid)
        assert np.array_equal(rec.time_s, recs[rid].time_s)
        assert np.array_equal(lengths.base, RecordLengths(recs[rid], "compact").base)
    assert reader.calls == [0, 1, 2]
    per_record = len(raw[0]) + RecordLengths(recs[0], "compact").nbytes
    small = RecordCache(reader, "compact", cache_mb=2.5 * per_record / 1e6)  # room for two
    for rid in (0, 1, 2, 0):
        small.get(rid)
    assert reader.calls[3:] == [0, 1, 2, 0]  # 0 was the least recently used when 2 came
    fresh = pickle.loads(pickle.dumps(small))  # a worker's copy starts empty
    fresh.get(1)
    assert fresh.reads == 1


def test_one_encode_per_element_gives_the_rows_of_two():
    """The pipeline encodes an element's plain and triangulation contexts in one call: the same
    draws in the same order, so the same rows as packing each kind on its own."""
    from pingctl.loader.sequences import Shaping, pack_sequences
    from pingctl.loader.triangulation import concat_rows, pack_element, pack_triangulation

    probes, lookup = _world(4, n=1500)
    tri = Triangulation(0.5, 6, 6, 1)
    mode_p = np.array([0.4, 0.3, 0.3])
    for shaping in (Shaping(), Shaping(result_last=0.5, max_per_pair=1)):
        for s, rec in probes.items():
            lengths = RecordLengths(rec, "compact")
            for n_plain, n_tri in ((3, 1), (0, 2), (2, 0)):
                rng = np.random.default_rng(s)
                want = concat_rows(pack_sequences(rec, rng, n_plain, 256, mode_p, "compact", shaping, lengths),
                                   pack_triangulation(rec, rng, n_tri, 256, mode_p, "compact", tri, lookup,
                                                      shaping.result_last, lengths))
                got = pack_element(rec, np.random.default_rng(s), n_plain, n_tri, 256, mode_p, "compact", shaping, tri,
                                   lookup, lengths)
                for field in ("tokens", "segment", "position", "modes", "measurements"):
                    assert np.array_equal(getattr(got, field), getattr(want, field))
                assert (got.segment > 0).sum() > 0


def _even_in_time_reference(t: np.ndarray, k: int) -> np.ndarray:
    """`_even_in_time` as first written: np.linspace, clip and union1d."""
    if k >= len(t):
        return np.arange(len(t))
    idx = np.searchsorted(t, np.linspace(t[0], t[-1], k), side="left").clip(0, len(t) - 1)
    idx = idx[np.concatenate([[True], idx[1:] != idx[:-1]])]
    if len(idx) < k:
        free = np.ones(len(t), bool)
        free[idx] = False
        rest = np.flatnonzero(free)
        idx = np.union1d(idx, rest[np.linspace(0, len(rest) - 1, k - len(idx)).astype(np.int64)])
    return idx


@given(st.integers(0, 2**31), st.integers(1, 400), st.integers(1, 400))
@settings(max_examples=300, deadline=None)
def test_even_in_time_is_its_reference(seed, n, k):
    """The even subsample (its own linspace, a sort for the union) picks exactly what np.linspace
    and np.union1d pick, bursts at one second included."""
    from pingctl.loader.sequences import _even_in_time

    rng = np.random.default_rng(seed)
    t = 1_600_000_000 + np.cumsum(rng.choice([0, 0, 0, 1, 7, 900, 2**33], n))
    assert np.array_equal(_even_in_time(t, k), _even_in_time_reference(t, k))
