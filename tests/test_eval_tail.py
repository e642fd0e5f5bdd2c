"""The RTT distribution's tail: an answer puts no mass where no ping reply lands (docs/eval.md,
"The tail"), and CRPS, the score that tail mass ruins, matches a hand computation."""

from __future__ import annotations

import numpy as np
import pytest

from pingctl.eval import metrics as M

# P(RTT > 10x the pair's largest RTT in train | success) that the trained fixture model may put
# on a packet. Measured (two fixture trainings): 0.5-0.8% per packet; its raw softmax puts
# 3.7-4.5% on impossible first bytes alone (all of it above the ceiling or on duplicate codes),
# so the unmasked read-out fails this bound.
TAIL_BOUND = 0.02


@pytest.mark.slow
def test_tail_beyond_ten_times_the_pairs_largest_rtt_is_small(tiny_run, time_split):
    from pingctl.context import context_indices, context_pool
    from pingctl.eval.model import prompts
    from pingctl.artifacts.table import load_split
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel
    from pingctl.tokenizer.rtt_codec import CEILING_MS, POSSIBLE_FIRST_BYTES

    model = LoadedModel.load(tiny_run)
    train, test = load_split(time_split / "train"), load_split(time_split / "test")
    largest: dict = {}
    for s, d, r in zip(train["src"], train["dst"], np.asarray(train["rtt"])):
        if r >= 0:
            largest[(s, d)] = max(r, largest.get((s, d), 0.0))
    rtt = np.asarray(test["rtt"])
    seen = np.array([(s, d) in largest for s, d in zip(test["src"], test["dst"])])
    pairs = np.array([f"{s} {d}" for s, d in zip(test["src"], test["dst"])])
    ok = np.flatnonzero((rtt > 0) & seen)
    idx = ok[np.unique(pairs[ok], return_index=True)[1]][:6]  # six different pairs
    assert len(idx) == 6
    pool = context_pool(test, None, "probe")
    ps, _ = prompts(model, test, idx, pool, context_indices(pool, test, idx, 4, "probe"))
    dists = Q.rtt_distributions(model, ps)  # exact: every code a token stream can carry
    cap = np.array([10 * largest[(test["src"][i], test["dst"][i])] for i in idx])
    tail = np.array([d.p_over(c) for d, c in zip(dists, cap)])
    assert (tail < TAIL_BOUND).all(), tail
    for d in dists:  # nothing past the ceiling, nothing on codes the encoder never emits
        assert d.p_over(CEILING_MS) == 0.0 and d.probs.sum() == pytest.approx(1.0)
        assert np.isfinite(d.truncated_mean(np.inf)) and d.truncated_mean(np.inf) < CEILING_MS
    # the cause: what the raw softmax puts on first bytes no stream carries, now renormalised away
    lps = model.log_probs([np.append(p, Q.C.RttStart).astype(np.int32) for p in ps], at=[np.array([len(p)]) for p in ps])
    raw = np.stack([Q.bytes_distribution(lp[0]) for lp in lps])
    impossible = raw[:, ~POSSIBLE_FIRST_BYTES].sum(axis=1)
    assert (impossible > tail).all()  # the read-out removed more than all the tail it leaves
    np.testing.assert_allclose(np.stack([Q.first_pass(model, [p])[1][0] for p in ps[:1]]),
                               raw[:1] * POSSIBLE_FIRST_BYTES / (1.0 - impossible[:1, None]), rtol=1e-5, atol=1e-9)


def test_crps_of_a_hand_made_distribution_matches_a_hand_computation():
    # P(10 ms) = 0.5, P(20 ms) = 0.3, P(1000 ms) = 0.2; actual 15 ms.
    # CRPS = integral (F(x) - 1{x >= 15})^2 dx:
    #   [10, 15): F = 0.5, (0.5 - 0)^2 * 5   = 1.25
    #   [15, 20): F = 0.5, (0.5 - 1)^2 * 5   = 1.25
    #   [20, 1000): F = 0.8, (0.8 - 1)^2 * 980 = 39.2
    # total 41.7 ms: the 20% at one second alone costs 39.2 of it.
    values = np.array([10.0, 20.0, 1000.0])
    got = M.crps_distribution([15.0], values, [np.array([0.5, 0.3, 0.2])])
    assert got[0] == pytest.approx(41.7)
    # same distribution without the far value (its mass on 20 ms): [20, ...) contributes 0
    assert M.crps_distribution([15.0], values, [np.array([0.5, 0.5, 0.0])])[0] == pytest.approx(2.5)
    # a point forecast's CRPS is its absolute error; a failed packet has none
    assert M.crps_distribution([12.0, -1.0], values, np.array([[1.0, 0, 0]] * 2)).tolist()[0] == pytest.approx(2.0)
    assert np.isnan(M.crps_distribution([-1.0], values, [np.array([1.0, 0, 0])])[0])
