"""A least-squares network embedding with heights, fitted on log RTT (docs/eval.md).

Every address is a point x_i in R^d with a height h_i >= 0 (its access link, paid on every
path); the predicted RTT of a pair is ‖x_i − x_j‖ + h_i + h_j. The points and heights
minimise the mean over measured (src, dst) pairs of

    (log(‖x_i − x_j‖ + h_i + h_j) − log m_ij)²

with m_ij the pair's median successful RTT: a relative-error fit, so a 300 ms path weighs no
more than a 3 ms one, and the median keeps single slow pings out. Unlike Vivaldi, which follows
one sample at a time, this is a global fit of every pair at once (the classical GNP/Lighthouse
idea, with Vivaldi's height model). It is fitted with full-batch Adam in NumPy (gradients
summed per node with one sort-and-`reduceat`), the heights projected onto h >= 0 after each
step, in units of the median pair RTT so that one learning rate suits any network.

`refit` places new hosts with the known ones held still: each new host's point and height fit
its own measurements to known hosts by the same loss, all new hosts at once.
"""

from __future__ import annotations

import numpy as np

from pingctl.schema.arrow_strings import codes_in
from pingctl.coords import DIMS, LR, MIN_RTT_MS, REFIT_STEPS, STEPS, fit_points, place_new
from pingctl.eval.baselines import GlobalMedian, SharedFits, column, group_quantile, point_prediction
from pingctl.eval.vivaldi import NewHosts

_KEY_CHUNK = 1 << 22  # rows turned into sort keys at once: their temporaries stay ~100 MB


def measured(a, b, rtt) -> np.ndarray:
    """The rows a pair's median is taken over: two known, different ends and a successful RTT."""
    return (a >= 0) & (b >= 0) & (a != b) & np.isfinite(rtt) & (rtt >= 0)


def pair_medians(a, b, rtt_ms, n_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, median RTT) per directed pair of node codes with a successful measurement, ordered
    by a * n_nodes + b; the median is `Groups`' own (`group_quantile`)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    r = np.asarray(rtt_ms, np.float64)
    ok = measured(a, b, r)
    return measured_pair_medians(a[ok], b[ok], r[ok], n_nodes)


def measured_pair_medians(a, b, rtt, n_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`pair_medians` of rows `measured` keeps, in a
    fraction of the memory of a sort of (pair, RTT): each row one uint64 sort key, the pair's
    code above the rank of its RTT among the distinct RTTs, sorted in place (a day's 64M rows:
    0.5 GB of keys, where the lexsort of (pair, RTT) holds eight arrays that size). Where the
    two do not fit in 64 bits (millions of addresses), the lexsort."""
    n = max(int(n_nodes), 1)
    if not len(rtt):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    values = np.unique(rtt)
    vbits, pbits = (len(values) - 1).bit_length(), (n * n - 1).bit_length()
    if vbits + pbits > 63:
        pair = np.asarray(a, np.int64) * n + np.asarray(b, np.int64)
        order = np.lexsort((rtt, pair))
        return _group_medians(pair[order], rtt[order], n)
    key = np.empty(len(rtt), np.uint64)
    shift, un = np.uint64(vbits), np.uint64(n)
    for s in range(0, len(rtt), _KEY_CHUNK):
        e = s + _KEY_CHUNK
        pair = np.asarray(a[s:e], np.uint64) * un + np.asarray(b[s:e], np.uint64)
        key[s:e] = (pair << shift) | np.searchsorted(values, rtt[s:e]).astype(np.uint64)
    key.sort()
    return _group_medians(key >> shift, _Ranked(values, key, (1 << vbits) - 1), n)


class _Ranked:
    """The sorted RTTs, read from the sorted keys only where a median takes them."""

    def __init__(self, values: np.ndarray, key: np.ndarray, mask: int):
        self.values, self.key, self.mask = values, key, np.uint64(mask)

    def __getitem__(self, i):
        return self.values[(self.key[i] & self.mask).astype(np.int64)]


def _group_medians(pair: np.ndarray, sorted_rtt, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, median) per run of equal `pair` codes (sorted, with their RTTs sorted within),
    by `Groups`' own quantile (`group_quantile`)."""
    first = np.empty(len(pair), bool)
    first[0] = True
    np.not_equal(pair[1:], pair[:-1], out=first[1:])
    start = np.flatnonzero(first)
    count = np.diff(np.append(start, len(pair)))
    keys = pair[start].astype(np.int64)
    return keys // n, keys % n, group_quantile(sorted_rtt, start, count, 0.5)


class Embedding:
    """The eval baseline: points and heights fitted to the log of every training pair's
    median RTT (module docstring). Prediction: ‖x_src − x_dst‖ + h_src + h_dst in ms; an
    address without a point gets the family's global median (level `global`)."""

    name = "embedding"
    levels = ("embedding", "global")

    def __init__(self, dims: int = DIMS, steps: int = STEPS, lr: float = LR, seed: int = 0,
                 refit_steps: int = REFIT_STEPS, min_rtt_ms: float = MIN_RTT_MS):
        self.dims, self.steps, self.lr, self.seed = dims, steps, lr, seed
        self.refit_steps, self.min_rtt_ms = refit_steps, min_rtt_ms
        self.vocab = None
        self.x = self.h = self.trained = None
        self.scale = 1.0
        self.fit_info: dict = {}
        self._global = None

    def fit(self, train: dict, shared: SharedFits | None = None) -> "Embedding":
        """Fit on `train`; `shared` (made for this `train`) shares its codes and global median
        with the other baselines fitted on it."""
        shared = SharedFits.of(train, shared)
        self._global = GlobalMedian().fit(train, shared)
        self.vocab, src, dst = shared.codes()
        return self.fit_codes(src, dst, shared.rtt(), len(self.vocab))

    def _y(self, med: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(med, self.min_rtt_ms) / self.scale)

    def fit_codes(self, a, b, rtt_ms, n_nodes: int) -> "Embedding":
        """Fit on measurements between node codes a[k], b[k] (0..n_nodes-1); negative RTTs
        (failed) are skipped."""
        return self.fit_pairs(*pair_medians(a, b, rtt_ms, n_nodes), n_nodes)

    def fit_pairs(self, pa, pb, med, n_nodes: int) -> "Embedding":
        """Fit on pairs' median RTTs as `pair_medians` gives them (ordered by a * n_nodes + b): a
        subset of its pairs fits as their measurements alone would, without a second pass over them."""
        rng = np.random.default_rng(self.seed)
        self.scale = float(np.median(med)) if len(med) else 1.0
        self.scale = max(self.scale, self.min_rtt_ms)
        # start: random points about half the median RTT apart, heights a quarter of it each
        x = rng.normal(0.0, 0.5 / np.sqrt(2.0 * self.dims), (n_nodes, self.dims))
        h = np.full(n_nodes, 0.25)
        self.trained = np.zeros(n_nodes, bool)
        self.trained[pa], self.trained[pb] = True, True
        self.x, self.h, loss = fit_points(x, h, pa, pb, self._y(med), self.trained, self.steps, self.lr)
        self.fit_info = self._info(pa, pb, med, n_nodes, loss)
        return self

    def use_fit(self, train: dict, shared: SharedFits | None, x, h, trained, scale: float, pairs,
                source: dict) -> "Embedding":
        """This baseline fitted on `train` as `fit` would, its points, heights, placed nodes and
        scale computed elsewhere (`eval.hints.embedding_with_hints`, which proves they are
        `fit`'s), in the codes of train's sorted vocabulary; `pairs`: the (a, b, median) the fit
        was fitted on. `fit_info` is `fit`'s but for the final loss, which only the fit knew,
        and says where the fit came from (`source`)."""
        shared = SharedFits.of(train, shared)
        self._global = GlobalMedian().fit(train, shared)
        self.vocab = shared.codes()[0]
        self.x, self.h, self.trained, self.scale = x, h, trained, float(scale)
        self.fit_info = {**self._info(*pairs, len(self.vocab), None), **source}
        return self

    def _info(self, pa, pb, med, n_nodes: int, loss) -> dict:
        pred = self.distance(pa, pb)
        rel = np.abs(pred - med) / np.maximum(med, self.min_rtt_ms)
        return {"nodes": int(n_nodes), "nodes_with_samples": int(self.trained.sum()), "pairs": int(len(med)),
                "dims": int(self.dims), "steps": int(self.steps), "lr": self.lr, "scale_ms": self.scale,
                "final_loss": loss, "train_median_rel_err": float(np.median(rel)) if len(rel) else None,
                "median_height_ms": float(np.median(self.h[self.trained]) * self.scale) if self.trained.any() else None}

    def codes(self, addresses) -> np.ndarray:
        return codes_in(addresses, self.vocab)

    def distance(self, i, j) -> np.ndarray:
        """Predicted RTT (ms) between node codes; NaN where either is < 0 or has no point."""
        i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
        ok = (i >= 0) & (j >= 0)
        if not len(self.trained):
            return np.full(len(i), np.nan)
        ii, jj = np.where(ok, i, 0), np.where(ok, j, 0)
        ok &= self.trained[ii] & self.trained[jj]
        d = np.linalg.norm(self.x[ii] - self.x[jj], axis=1) + self.h[ii] + self.h[jj]
        return np.where(ok, self.scale * d, np.nan)

    def predict(self, test: dict):
        if self.x is None:
            raise RuntimeError("Embedding.predict before fit")
        d = self.distance(self.codes(column(test, "src")), self.codes(column(test, "dst")))
        return point_prediction(d, self._global.predict(test, scores=False), self.levels, test)

    def refit(self, new, peer, rtt_ms, n_new: int, order_key=None) -> NewHosts:
        """Points for `n_new` new hosts from their measurements to known nodes (new[k] measured
        known node code peer[k] at rtt_ms[k]), the known points held still. Each starts beside
        its nearest measured peer (a small random offset) with the height that makes that
        distance right, then fits all its pairs' medians."""
        n = len(self.trained)
        new, peer = np.asarray(new, np.int64), np.asarray(peer, np.int64)
        ok = (new >= 0) & (new < n_new) & (peer >= 0) & (peer < n)
        ok[ok] &= self.trained[peer[ok]]
        va, vb, med = pair_medians(np.where(ok, new + n, -1), np.where(ok, peer, -1), rtt_ms, n + n_new)
        keep = (va >= n) & (vb < n)
        va, vb, med = va[keep], vb[keep], med[keep]
        x, h = place_new(self.x, self.h, va, vb, self._y(med), n_new, self.refit_steps, self.lr, self.seed + 1)
        fitted = np.bincount(va - n, minlength=n_new) > 0 if n_new else np.zeros(0, bool)
        scale = self.scale
        return NewHosts(lambda v, p: scale * (np.linalg.norm(x[v + n] - x[p], axis=1) + h[v + n] + h[p]), fitted, self)
