"""Least-squares network coordinates: points with heights fitted to log RTTs (the eval's
`embedding` baseline, docs/eval.md, and the hints the loader puts in triangulation contexts,
docs/loader.md). Plain NumPy, below every layer that fits or reads them.

The predicted RTT of a pair is ‖x_i − x_j‖ + h_i + h_j in units of a scale (ms); the fit
minimises the mean squared log error against each measured pair's median RTT.
"""

from __future__ import annotations

import numpy as np

# the fit's settings, shared by the eval baseline (`eval.embedding.Embedding`) and the hints
# an answer carries (`loader.hints.Hints.answer`), so both place a new end alike
DIMS, STEPS, LR, REFIT_STEPS, MIN_RTT_MS = 8, 2000, 0.05, 500, 0.01

_EPS = 1e-6  # smooths ‖x_i − x_j‖ at 0 (normalised units), where its gradient has no direction


class _Grad:
    """Per-node sums of per-edge terms for edges (a, b): sort once, `reduceat` every step. The
    (2 * edges, dims) terms live in buffers allocated once: a fresh array of that size every
    step pays its page faults again, which cost more than the arithmetic at 10^5 edges."""

    def __init__(self, a: np.ndarray, b: np.ndarray, dims: int):
        ends = np.concatenate([a, b])
        self.perm = np.argsort(ends, kind="stable")
        s = ends[self.perm]
        first = np.ones(len(s), bool)
        first[1:] = s[1:] != s[:-1]
        self.nodes, self.starts = s[first], np.flatnonzero(first)
        self.terms = np.empty((len(ends), dims))  # the terms at a (first len(a) rows), then at b
        self._sorted = np.empty_like(self.terms)
        self._columns = np.empty((dims, len(ends)))

    def sum(self, at_a: np.ndarray, at_b: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.concatenate([at_a, at_b])[self.perm], self.starts, axis=0)

    def sum_terms(self) -> np.ndarray:
        """`sum` of the rows of `terms`, to the bit: reduceat along rows of 8 makes one call of
        its inner loop per row; along the contiguous axis, one per node and dimension."""
        np.take(self.terms, self.perm, axis=0, out=self._sorted, mode="clip")
        np.copyto(self._columns, self._sorted.T)
        return np.add.reduceat(self._columns, self.starts, axis=1).T


def fit_points(x, h, a, b, y, free, steps: int, lr: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Adam on the points `x` (n, d) and heights `h` (n,) of the `free` nodes, minimising the
    mean squared log error of ‖x_a − x_b‖ + h_a + h_b against `y` (log RTT, normalised units);
    the others stay as they are. Cosine-decayed learning rate. Returns x, h and the final loss."""
    x, h = x.copy(), h.copy()
    if not len(a) or steps <= 0:
        return x, h, float("nan")
    p, dims = len(a), x.shape[1]
    grad = _Grad(a, b, dims)
    at_a, at_b = np.empty((p, dims)), np.empty((p, dims))
    delta = grad.terms[:p]
    upd = free[grad.nodes]
    nodes = grad.nodes[upd]
    mx, vx = np.zeros((len(nodes), dims)), np.zeros((len(nodes), dims))
    mh, vh = np.zeros(len(nodes)), np.zeros(len(nodes))
    b1, b2, eps = 0.9, 0.999, 1e-8
    scale = 2.0 / len(a)
    loss = float("nan")
    for t in range(1, steps + 1):
        np.take(x, a, axis=0, out=at_a, mode="clip")
        np.take(x, b, axis=0, out=at_b, mode="clip")
        np.subtract(at_a, at_b, out=delta)
        dist = np.sqrt(np.einsum("ij,ij->i", delta, delta) + _EPS * _EPS)
        pred = dist + h[a] + h[b]
        r = np.log(pred) - y
        if t == steps:
            loss = float(np.mean(r * r))
        g = scale * r / pred
        np.multiply((g / dist)[:, None], delta, out=delta)  # the edges' gradient at a
        np.negative(delta, out=grad.terms[p:])
        gx = grad.sum_terms()[upd]
        gh = grad.sum(g, g)[upd]
        step = lr * 0.5 * (1.0 + np.cos(np.pi * (t - 1) / steps)) + lr * 0.01
        mx = b1 * mx + (1 - b1) * gx
        vx = b2 * vx + (1 - b2) * gx * gx
        mh = b1 * mh + (1 - b1) * gh
        vh = b2 * vh + (1 - b2) * gh * gh
        c1, c2 = 1 - b1**t, 1 - b2**t
        x[nodes] -= step * (mx / c1) / (np.sqrt(vx / c2) + eps)
        h[nodes] = np.maximum(h[nodes] - step * (mh / c1) / (np.sqrt(vh / c2) + eps), 0.0)
    return x, h, loss


def place_new(x: np.ndarray, h: np.ndarray, va: np.ndarray, vb: np.ndarray, y: np.ndarray, n_new: int, steps: int,
              lr: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points for `n_new` new hosts (codes n..n+n_new-1, n = len(x)) from their pairs' median log
    RTTs `y` (normalised units) to known nodes (new va[k], known vb[k]), the known points held
    still. Each starts beside its nearest measured peer (a small random offset) with the height
    that makes that distance right, then fits all its pairs. Returns the extended x and h."""
    n, dims = x.shape
    rng = np.random.default_rng(seed)
    x = np.vstack([x, np.zeros((n_new, dims))])
    h = np.concatenate([h, np.zeros(n_new)])
    if len(va):
        near = np.lexsort((y, va))  # per new host, its smallest RTT first
        first = near[np.r_[True, va[near][1:] != va[near][:-1]]]
        v, p = va[first], vb[first]
        x[v] = x[p] + rng.normal(0.0, 0.01, (len(v), dims))
        h[v] = np.maximum(np.exp(y[first]) - h[p], 0.0)
    free = np.zeros(n + n_new, bool)
    free[n:] = True
    x, h, _ = fit_points(x, h, va, vb, y, free, steps, lr)
    return x, h
