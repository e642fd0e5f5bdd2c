"""The least-squares coordinates' fit is fast and gives, to the bit, what its plain form gives:
`fit_points` against the textbook gradient step below, and the hints' folds against a fit on
each fold's own measurements."""

import numpy as np
import pytest

from pingctl.coords import fit_points
from pingctl.eval.embedding import Embedding
from pingctl.eval.hints import fit_hints
from pingctl.loader.hints import fold_of
from pingctl.schema.arrow_strings import codes_in, vocabulary


def _plain_fit(x, h, a, b, y, free, steps, lr):
    """Adam on ‖x_a − x_b‖ + h_a + h_b against y, written as plainly as it reads: fresh arrays
    every step, the squared distance summed one dimension after another, per-node sums by
    `np.add.at` over the edges in order (the a side, less the b side)."""
    x, h = x.copy(), h.copy()
    n, dims = x.shape
    moved = np.flatnonzero(free & np.isin(np.arange(n), np.concatenate([a, b])))
    mx, vx = np.zeros((len(moved), dims)), np.zeros((len(moved), dims))
    mh, vh = np.zeros(len(moved)), np.zeros(len(moved))
    loss = np.nan
    for t in range(1, steps + 1):
        delta = x[a] - x[b]
        sq = delta[:, 0] * delta[:, 0]
        for k in range(1, dims):
            sq = sq + delta[:, k] * delta[:, k]
        dist = np.sqrt(sq + 1e-6 * 1e-6)
        pred = dist + h[a] + h[b]
        r = np.log(pred) - y
        loss = float(np.mean(r * r))
        g = 2.0 / len(a) * r / pred
        gd = (g / dist)[:, None] * delta
        at_a, at_b, ha, hb = np.zeros((n, dims)), np.zeros((n, dims)), np.zeros(n), np.zeros(n)
        np.add.at(at_a, a, gd)
        np.add.at(at_b, b, gd)
        np.add.at(ha, a, g)
        np.add.at(hb, b, g)
        gx, gh = (at_a - at_b)[moved], (ha + hb)[moved]
        step = lr * 0.5 * (1.0 + np.cos(np.pi * (t - 1) / steps)) + lr * 0.01
        mx, vx = 0.9 * mx + (1 - 0.9) * gx, 0.999 * vx + (1 - 0.999) * gx * gx
        mh, vh = 0.9 * mh + (1 - 0.9) * gh, 0.999 * vh + (1 - 0.999) * gh * gh
        c1, c2 = 1 - 0.9**t, 1 - 0.999**t
        x[moved] -= step * (mx / c1) / (np.sqrt(vx / c2) + 1e-8)
        h[moved] = np.maximum(h[moved] - step * (mh / c1) / (np.sqrt(vh / c2) + 1e-8), 0.0)
    return x, h, loss


@pytest.mark.parametrize("probes, targets", [(6, 3), (300, 20)])
def test_fit_points_is_the_plain_adam_step_to_the_bit(probes, targets):
    """Nodes with one edge and with hundreds, some held still, one node with no edge at all."""
    rng = np.random.default_rng(probes)
    n = probes + targets + 1
    a = np.repeat(np.arange(probes), 3)
    b = probes + rng.integers(0, targets, len(a))
    y = rng.normal(0.0, 0.5, len(a))
    x, h = rng.normal(0.0, 0.2, (n, 8)), np.full(n, 0.25)
    free = rng.random(n) < 0.9
    got = fit_points(x, h, a, b, y, free, 60, 0.05)
    want = _plain_fit(x, h, a, b, y, free, 60, 0.05)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]
    assert not np.array_equal(got[0], x)  # it moved


def test_the_hints_folds_are_fits_on_each_fold_s_own_measurements(tmp_path):
    """The folds' fits take their pairs' medians from one pass over the measurements: each is the
    embedding fitted on the measurements outside its fold, to the bit."""
    rng = np.random.default_rng(5)
    n = 4000
    addr = np.array([f"10.0.{i // 256}.{i % 256}" for i in range(30)], object)
    s, d = rng.integers(0, 18, n), rng.integers(18, 30, n)
    rtt = np.where(rng.random(n) < 0.05, -1.0, rng.uniform(5, 200, n))
    table = {"src": addr[s], "dst": addr[d], "rtt": rtt}
    fit_hints(table, tmp_path / "h.npz", folds=3, seed=2)
    got = np.load(tmp_path / "h.npz")
    vocab = vocabulary(table["src"], table["dst"])
    a, b = codes_in(table["src"], vocab), codes_in(table["dst"], vocab)
    fold = fold_of(a, b, 3)
    for k in range(3):
        e = Embedding(seed=2).fit_codes(a[fold != k], b[fold != k], rtt[fold != k], len(vocab))
        assert np.array_equal(got["x"][k], e.x) and np.array_equal(got["h"][k], e.h)
        assert got["scale"][k] == e.scale
    every = Embedding(seed=2).fit_codes(a, b, rtt, len(vocab))
    assert np.array_equal(got["x"][3], every.x)
