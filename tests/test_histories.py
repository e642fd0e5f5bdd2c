"""Contexts drawn from a train split indexed once (`histories.History`) and a test split indexed
on its own are the contexts of one table holding both (the rule `context.recent_others` read on
the concatenation), row for row, and the pool they come with holds exactly their rows."""

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pingctl.context import context_indices, context_pool, pool_and_contexts
from pingctl.histories import Addresses, History


def _table(n, rng, n_src, n_dst, times, prb_share):
    src = np.array([f"10.0.0.{i}" for i in rng.integers(0, n_src, n)], object)
    dst = np.array([f"20.0.0.{i}" for i in rng.integers(0, n_dst, n)], object)
    # some probes known by their prb_id, others only by their address (prb_id -1)
    prb = np.array([int(s.rsplit(".", 1)[1]) for s in src], np.int64)
    prb[rng.random(n) >= prb_share] = -1
    return {"src": src, "dst": dst, "event_time": rng.integers(0, times, n).astype(np.int64),
            "rtt": rng.uniform(1, 100, n), "prb_id": prb, "ip_version": np.full(n, 4, np.int64)}


def _measurements(pool, ctxs):
    return [[(pool["src"][i], pool["dst"][i], float(pool["rtt"][i]), int(pool["event_time"][i])) for i in c]
            for c in ctxs]


@given(st.integers(0, 2**31), st.integers(0, 20), st.integers(0, 20), st.integers(0, 3),
       st.sampled_from(["both", "pair"]), st.integers(20, 400), st.sampled_from([0.0, 0.5, 1.0]))
@settings(max_examples=80, deadline=None)
# both tables' spans whole yet more than the window between them: the merge drops the oldest,
# so the history is not whole and the window grows
@example(804324, 0, 10, 2, "both", 20, 0.0)
def test_train_indexed_once_gives_the_contexts_of_the_concatenated_pool(seed, k_src, k_dst, per_pair, policy,
                                                                         times, prb_share):
    rng = np.random.default_rng(seed)
    # few ends and many rows each (times tie often): a side's suffix has to grow, across both tables
    train = _table(600, rng, 4, 4, times, prb_share)
    test = _table(60, rng, 6, 5, times, prb_share)  # hosts train never saw, too
    idx = np.sort(rng.choice(60, 25, replace=False))
    pool = context_pool(test, train, policy)
    want = _measurements(pool, context_indices(pool, test, idx, k_src, policy, per_pair, k_dst))
    history = History.of(train, Addresses())
    # the same without train's address strings: its index's codes stand in for them
    slim = History.of(train, Addresses()).forget_strings()
    assert "src" not in slim.table and "src" in train
    for h in (history, history, slim):  # the index is reused: a second ask sees the same
        got_pool, got = pool_and_contexts(test, idx, k_src, policy, per_pair, k_dst, train=h)
        assert _measurements(got_pool, got) == want
        used = np.unique(np.concatenate(got + [np.zeros(0, np.int64)]))
        assert len(got_pool["rtt"]) == len(used) and (used == np.arange(len(used))).all()


def test_one_index_serves_test_splits_with_new_hosts_each():
    rng = np.random.default_rng(3)
    train = _table(300, rng, 3, 3, 100, 0.5)
    history = History.of(train, Addresses())
    for n_src in (5, 8):  # each brings addresses the one before did not have
        test = _table(40, rng, n_src, 6, 100, 0.5)
        idx = np.arange(40)
        pool = context_pool(test, train, "both")
        want = _measurements(pool, context_indices(pool, test, idx, 6, "both", 1, 6))
        got_pool, got = pool_and_contexts(test, idx, 6, "both", 1, 6, train=history)
        assert _measurements(got_pool, got) == want
    assert len(history.addresses) == len(set(history.addresses.vocabulary.values.to_pylist()))


@given(st.lists(st.sampled_from(["192.0.2.1", "192.0.2.2", "2001:db8::1", "10.0.0.1"]), max_size=90),
       st.lists(st.sampled_from(["192.0.2.1", "198.51.100.7", "2001:db8::2"]), max_size=90))
@settings(max_examples=100, deadline=None)
def test_codes_are_given_once_and_never_change(first, second):
    # a few strings take a dict, many an Arrow array: the codes are the same either way
    a = Addresses()
    c1 = a.codes(np.array(first, object))
    c2 = a.codes(pa.array(second, pa.string()))
    c1_again = a.codes(np.array(first, object))
    assert c1.tolist() == c1_again.tolist()
    seen = list(dict.fromkeys(first + second))
    assert c1.tolist() == [seen.index(v) for v in first] and c2.tolist() == [seen.index(v) for v in second]
