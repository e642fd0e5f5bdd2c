"""Context selection for `pingctl eval` prompts and the context-median baseline (no model needed)."""

import numpy as np
import pytest

from pingctl.errors import PingctlError
from pingctl.context import context_indices, context_pool
from pingctl.eval.model import context_median


def _split(rows):
    src, dst, rtt, t, prb = zip(*rows)
    return {
        "src": np.array(src, dtype=object), "dst": np.array(dst, dtype=object), "rtt": np.array(rtt, float),
        "event_time": np.array(t, np.int64), "prb_id": np.array(prb, np.int64),
        "ip_version": np.array([6 if ":" in s else 4 for s in src], np.int64),
    }


# probe 1 (10.0.0.1) measures A=1.1.1.1 and B=2.2.2.2; probe 2 measures A
TEST = _split([
    ("10.0.0.1", "1.1.1.1", 10.0, 100, 1),
    ("10.0.0.1", "1.1.1.1", 12.0, 200, 1),
    ("10.0.0.1", "1.1.1.1", -1.0, 300, 1),
    ("10.0.0.1", "1.1.1.1", 11.0, 400, 1),  # query
    ("10.0.0.2", "1.1.1.1", 50.0, 150, 2),
    ("10.0.0.1", "1.1.1.1", 99.0, 400, 1),  # same time as the query: not context
])
TRAIN = _split([
    ("10.0.0.1", "2.2.2.2", 30.0, 50, 1),
    ("10.0.0.1", "2.2.2.2", 31.0, 350, 1),
    ("10.0.0.1", "2.2.2.2", 32.0, 450, 1),  # after the query: not context
    ("10.0.0.2", "2.2.2.2", 70.0, 300, 2),  # another probe
])


def _rows(pool, idx):
    return [(pool["dst"][i], int(pool["event_time"][i])) for i in idx]


def test_probe_policy_takes_the_probes_earlier_test_packets():
    pool = context_pool(TEST, TRAIN, "probe")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 16, "probe")
    assert _rows(pool, ctx) == [("1.1.1.1", 100), ("1.1.1.1", 200), ("1.1.1.1", 300)]
    (last2,) = context_indices(pool, TEST, np.array([3]), 2, "probe")
    assert _rows(pool, last2) == [("1.1.1.1", 200), ("1.1.1.1", 300)]


def test_cold_policy_never_shows_the_queried_pair():
    pool = context_pool(TEST, TRAIN, "cold")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 16, "cold")
    assert _rows(pool, ctx) == [("2.2.2.2", 50), ("2.2.2.2", 350)]
    for i in ctx:
        assert (pool["src"][i], pool["dst"][i]) != ("10.0.0.1", "1.1.1.1")


def test_pair_policy_holds_only_the_pairs_own_earlier_packets_from_train_and_test():
    query_pair = TEST["src"][3], TEST["dst"][3]
    # the pair's history starts in train: give it a train packet too
    train = _split([*zip(TRAIN["src"], TRAIN["dst"], TRAIN["rtt"], TRAIN["event_time"], TRAIN["prb_id"]),
                    ("10.0.0.1", "1.1.1.1", 9.0, 60, 1)])
    pool = context_pool(TEST, train, "pair")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 16, "pair", per_pair=1)  # no per-pair cap: one pair
    assert _rows(pool, ctx) == [("1.1.1.1", 60), ("1.1.1.1", 100), ("1.1.1.1", 200), ("1.1.1.1", 300)]
    assert all((pool["src"][i], pool["dst"][i]) == query_pair for i in ctx)
    (last2,) = context_indices(pool, TEST, np.array([3]), 2, "pair")
    assert _rows(pool, last2) == [("1.1.1.1", 200), ("1.1.1.1", 300)]
    (first,) = context_indices(pool, TEST, np.array([4]), 16, "pair")  # probe 2's first packet of its pair
    assert len(first) == 0 and len(context_indices(pool, TEST, np.array([3]), 0, "pair")[0]) == 0


def test_per_pair_keeps_the_most_recent_packets_of_each_pair():
    pool = context_pool(TEST, TRAIN, "cold")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 16, "cold", per_pair=1)
    assert _rows(pool, ctx) == [("2.2.2.2", 350)]
    pool = context_pool(TEST, TRAIN, "probe")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 16, "probe", per_pair=2)
    assert _rows(pool, ctx) == [("1.1.1.1", 200), ("1.1.1.1", 300)]
    # the cap is applied before the last `context` are taken: probe 1's two pairs, one each
    both = _split([("10.0.0.1", "1.1.1.1", 9.0, 20, 1), ("10.0.0.1", "2.2.2.2", 30.0, 10, 1)])
    pool = context_pool(TEST, both, "cold")
    (ctx,) = context_indices(pool, TEST, np.array([3]), 2, "probe", per_pair=1)
    assert _rows(pool, ctx) == [("2.2.2.2", 10), ("1.1.1.1", 300)]


def test_none_policy_and_bad_policy():
    assert [len(c) for c in context_indices(TEST, TEST, np.array([0, 3]), 16, "none")] == [0, 0]
    with pytest.raises(PingctlError, match="context policy"):
        context_pool(TEST, TRAIN, "everything")


def test_context_median_uses_only_the_same_pair_in_the_prompt():
    pool = context_pool(TEST, TRAIN, "probe")
    idx = np.array([3, 0, 4])
    cm = context_median(pool, TEST, idx, context_indices(pool, TEST, idx, 16, "probe"))
    # query 3: same-pair context 10, 12 and a failure -> median 11, P(fail) 1/3
    assert cm["median"][0] == pytest.approx(11.0) and cm["p_fail"][0] == pytest.approx(1 / 3)
    # query 0 has no earlier packet; query 4 (probe 2) has none either
    assert np.isnan(cm["median"][1:]).all() and list(cm["used"]) == [True, False, False]


def test_field_bits_split_the_measurement_bits_by_block():
    from pingctl.eval.model import field_bits, nll_from_scores
    from pingctl.tokenizer import Measurements, encode

    m = Measurements.from_fields(["10.0.0.1", "2001:db8::1"], ["1.1.1.1", "2001:db8::2"], [12.5, -1.0], [100, 130])
    f = encode(m, "compact", order=("time", "src", "dst", "result")).tokens.astype(np.int32)
    start = int(np.flatnonzero(f == 0)[-1])
    rng = np.random.default_rng(0)
    s = -rng.uniform(0.1, 2.0, len(f) - 1)  # s[t - 1] scores token t
    bits = field_bits(f, s, start)
    # the query: delta-1 timestamp (2 tokens), IPv6 src and dst (17 each), failed (1)
    lens = {"time": 2, "src": 17, "dst": 17, "result": 1}
    pos = start + 1
    for k in ("time", "src", "dst", "result"):
        assert bits[k] == pytest.approx(-s[pos - 1 : pos - 1 + lens[k]].sum() / np.log(2))
        pos += lens[k]
    assert pos == len(f)
    n = nll_from_scores([f], [s], np.array([6]))
    assert sum(n["bits_per_field"].values()) == pytest.approx(n["bits_per_measurement"])


@pytest.mark.parametrize("timed", [True, False])
def test_prompts_are_timestamped_as_the_run_was_trained(timed):
    from types import SimpleNamespace

    from pingctl.eval.model import prompts
    from pingctl.tokenizer import C, decode

    model = SimpleNamespace(seq_len=256, timestamps=timed)
    pool = context_pool(TEST, TRAIN, "cold")
    idx = np.array([3])
    ctx = context_indices(pool, TEST, idx, 16, "cold")
    (prompt,), (full,) = prompts(model, TEST, idx, pool, ctx)
    time_tokens = {C.TimestampAbs, C.TimestampDelta1, C.TimestampDelta4}
    assert bool(time_tokens & set(prompt.tolist())) == timed
    # the full sequence is the prompt followed by the packet's own result block
    assert np.array_equal(full[: len(prompt)], prompt) and full[len(prompt)] == C.RttStart
    m = decode(full, "compact").measurements
    assert list(m.dst_text()) == ["2.2.2.2", "2.2.2.2", "1.1.1.1"]  # two cold-context packets, then the query
    assert m.rtt_ms.tolist() == pytest.approx([30.0, 31.0, 11.0], rel=2e-3)
    assert bool(m.has_time.all()) == timed and (timed or not m.has_time.any())
