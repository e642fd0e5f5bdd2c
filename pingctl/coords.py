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


def fit_points(x, h, a, b, y, free, steps: int, lr: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Adam on the points `x` (n, d) and heights `h` (n,) of the `free` nodes, minimising the
    mean squared log error of ‖x_a − x_b‖ + h_a + h_b against `y` (log RTT, normalised units);
    the others stay as they are. Cosine-decayed learning rate. Returns x, h and the final loss.

    The points are held one dimension to a row, so that every per-edge array is contiguous: a
    row's gather reads one small array that stays in cache, and each node's gradient is two
    `bincount`s of a row (the edges at its a side minus those at its b side, in edge order)."""
    x, h = x.copy(), h.copy()
    if not len(a) or steps <= 0:
        return x, h, float("nan")
    n, dims = x.shape
    a, b = np.asarray(a, np.intp), np.asarray(b, np.intp)
    xt = np.ascontiguousarray(x.T)
    seen = np.zeros(n, bool)
    seen[a] = seen[b] = True
    nodes = np.flatnonzero(free & seen)
    delta, at_b = np.empty((dims, len(a))), np.empty(len(a))
    dist, pred = np.empty(len(a)), np.empty(len(a))
    mx, vx = np.zeros((dims, len(nodes))), np.zeros((dims, len(nodes)))
    mh, vh = np.zeros(len(nodes)), np.zeros(len(nodes))
    gx = np.empty((dims, len(nodes)))
    b1, b2, eps = 0.9, 0.999, 1e-8
    scale = 2.0 / len(a)
    loss = float("nan")
    for t in range(1, steps + 1):
        for k in range(dims):
            np.take(xt[k], a, out=delta[k], mode="clip")
            np.take(xt[k], b, out=at_b, mode="clip")
            delta[k] -= at_b
        np.multiply(delta[0], delta[0], out=dist)
        for k in range(1, dims):
            dist += delta[k] * delta[k]
        dist += _EPS * _EPS
        np.sqrt(dist, out=dist)
        np.add(dist, np.take(h, a, mode="clip"), out=pred)
        pred += np.take(h, b, mode="clip")
        r = np.log(pred) - y
        if t == steps:
            loss = float(np.mean(r * r))
        g = scale * r / pred
        delta *= g / dist  # the edges' gradient at a; at b it is the negative
        for k in range(dims):
            gx[k] = (np.bincount(a, delta[k], n) - np.bincount(b, delta[k], n))[nodes]
        gh = (np.bincount(a, g, n) + np.bincount(b, g, n))[nodes]
        step = lr * 0.5 * (1.0 + np.cos(np.pi * (t - 1) / steps)) + lr * 0.01
        mx = b1 * mx + (1 - b1) * gx
        vx = b2 * vx + (1 - b2) * gx * gx
        mh = b1 * mh + (1 - b1) * gh
        vh = b2 * vh + (1 - b2) * gh * gh
        c1, c2 = 1 - b1**t, 1 - b2**t
        xt[:, nodes] -= step * (mx / c1) / (np.sqrt(vx / c2) + eps)
        h[nodes] = np.maximum(h[nodes] - step * (mh / c1) / (np.sqrt(vh / c2) + eps), 0.0)
    return np.ascontiguousarray(xt.T), h, loss


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
