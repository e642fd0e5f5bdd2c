"""Classical RTT predictors: the baselines the model is compared with in `pingctl eval`.

Common interface:

    pred = Predictor(...).fit(train).predict(test)      # -> Prediction

`train` and `test` are dicts of equal-length arrays with keys
    src, dst      address strings (NumPy object arrays, lists, or Arrow (dictionary) arrays;
                  `src_addr`/`dst_addr` are accepted as aliases)
    ip_version    4 or 6
    rtt           ms, -1.0 = failed (medians and coordinates use successful packets only;
                  failure rates use all packets)
    event_time    int64 Unix seconds (not used by these predictors)

Everything is vectorized NumPy/Arrow: addresses are dictionary-encoded once and mapped to
integer codes (`pyarrow.compute.index_in` against the training vocabulary); per-group medians,
quantiles and PIT values come from one lexsort of (group, rtt). Python loops run only over
*distinct* addresses (for prefixes) and over Vivaldi rounds.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from pingctl.context import codes_in, vocabulary

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
_ALIASES = {"src": ("src", "src_addr"), "dst": ("dst", "dst_addr")}
_US_BITS = 37  # rtt in microseconds below 2**37 (~38 hours) inside the (group, rtt) search key


# ---------------------------------------------------------------- the result


@dataclass
class Prediction:
    """Per-measurement predictions of one predictor.

    median     float64[n] predicted median RTT (ms); NaN where nothing could answer
    level      int8[n] index into `level_names` of the level that answered the median
               (e.g. pair / prefix / global); -1 where none did
    quantiles  {q: float64[n]} for q in QUANTILES, or None (Vivaldi has no distribution)
    pit        float64[n] randomized PIT of the actual RTT under the predictive distribution
               (NaN for failed packets or no distribution), or None
    p_fail     float64[n] predicted probability that the packet fails, or None
    """

    median: np.ndarray
    level: np.ndarray
    level_names: tuple[str, ...]
    quantiles: dict[float, np.ndarray] | None = None
    pit: np.ndarray | None = None
    p_fail: np.ndarray | None = None
    info: dict = field(default_factory=dict)

    def level_shares(self) -> dict[str, float]:
        """Share of measurements answered by each level (and 'none')."""
        n = max(len(self.level), 1)
        out = {name: float(np.count_nonzero(self.level == i)) / n for i, name in enumerate(self.level_names)}
        out["none"] = float(np.count_nonzero(self.level < 0)) / n
        return out

    def __iter__(self):  # `median, = pred` / `median, *rest = pred` work like a tuple
        yield self.median


# ---------------------------------------------------------------- columns and codes


def column(d: dict, name: str):
    for k in _ALIASES.get(name, (name,)):
        if k in d:
            return d[k]
    raise KeyError(f"input dict has no {name!r} column (keys: {sorted(d)})")


def _rtt(d: dict) -> np.ndarray:
    return np.asarray(column(d, "rtt"), dtype=np.float64)


def _ipv(d: dict) -> np.ndarray:
    return np.asarray(column(d, "ip_version"), dtype=np.int64)


@lru_cache(maxsize=1 << 20)
def prefix_of(addr: str, v4_bits: int = 24, v6_bits: int = 48) -> str | None:
    """The /24 (IPv4) or /48 (IPv6) network of an address, as text; None if not an address."""
    if not isinstance(addr, str):
        return None
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    return str(ipaddress.ip_network(f"{ip}/{v4_bits if ip.version == 4 else v6_bits}", strict=False))


# ---------------------------------------------------------------- grouped statistics


def group_quantile(values: np.ndarray, start: np.ndarray, count: np.ndarray, q: float) -> np.ndarray:
    """Linear-interpolated quantile (NumPy's default) of each group of sorted `values`."""
    out = np.full(len(start), np.nan)
    ok = count > 0
    if not ok.any():
        return out
    s, c = start[ok], count[ok]
    pos = q * (c - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, c - 1)
    frac = pos - lo
    out[ok] = values[s + lo] * (1.0 - frac) + values[s + hi] * frac
    return out


class Groups:
    """Per-key RTT statistics of the training packets: counts, failures, quantiles and a
    CDF sketch (at most `sketch` evenly spaced order statistics per key) for PIT values."""

    def __init__(self, keys: np.ndarray, rtt: np.ndarray, quantiles=QUANTILES, sketch: int = 1024):
        keys = np.asarray(keys, dtype=np.int64)
        rtt = np.asarray(rtt, dtype=np.float64)
        valid = keys >= 0
        keys, rtt = keys[valid], rtt[valid]
        self.keys, inv = np.unique(keys, return_inverse=True)
        inv = inv.astype(np.int64)
        g = len(self.keys)
        ok = rtt >= 0
        self.n_total = np.bincount(inv, minlength=g).astype(np.int64)
        self.n_failed = np.bincount(inv[~ok], minlength=g).astype(np.int64)
        gi, v = inv[ok], rtt[ok]
        order = np.lexsort((v, gi))
        gs, vs = gi[order], v[order]
        self.count = np.bincount(gs, minlength=g).astype(np.int64)
        start = np.cumsum(self.count) - self.count
        self.q = {float(q): group_quantile(vs, start, self.count, q) for q in quantiles}
        # CDF sketch: keep all values of small groups, K evenly spaced order statistics of large ones.
        c = self.count[gs]
        rank = np.arange(len(vs)) - start[gs]
        k = max(int(sketch), 2)
        j = np.ceil(rank * (k - 1) / np.maximum(c - 1, 1))
        keep = (c <= k) | (np.floor(j * (c - 1) / (k - 1)) == rank)
        sk_g, sk_v = gs[keep], vs[keep]
        self.sk_count = np.bincount(sk_g, minlength=g).astype(np.int64)
        self.sk_start = np.cumsum(self.sk_count) - self.sk_count
        self.sk_key = (sk_g << _US_BITS) | _us(sk_v)

    def lookup(self, keys: np.ndarray, min_count: int = 1) -> np.ndarray:
        """Group index per key, -1 where unknown or with fewer than `min_count` successes."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(self.keys) == 0:
            return np.full(len(keys), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = (keys >= 0) & (self.keys[pos] == keys)
        if min_count > 0:
            hit &= self.count[pos] >= min_count
        return np.where(hit, pos, -1)

    def fail_rate(self, gidx: np.ndarray) -> np.ndarray:
        g = np.maximum(gidx, 0)
        return np.where(gidx >= 0, self.n_failed[g] / np.maximum(self.n_total[g], 1), np.nan)

    def pit(self, gidx: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Randomized PIT of x under each group's empirical distribution (sketch of m values):
        (#less + U·(#equal + 1)) / (m + 1), exactly Uniform(0,1) when x is exchangeable with
        the group's samples. NaN for gidx < 0, failed or non-finite x."""
        x = np.asarray(x, dtype=np.float64)
        out = np.full(len(x), np.nan)
        ok = (gidx >= 0) & np.isfinite(x) & (x >= 0)
        if not ok.any():
            return out
        g = gidx[ok]
        key = (g << _US_BITS) | _us(x[ok])
        less = np.searchsorted(self.sk_key, key, side="left") - self.sk_start[g]
        leq = np.searchsorted(self.sk_key, key, side="right") - self.sk_start[g]
        u = rng.random(len(g))
        out[ok] = (less + u * (leq - less + 1)) / (self.sk_count[g] + 1)
        return out


def _us(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.asarray(v) * 1000.0), 0, (1 << _US_BITS) - 1).astype(np.int64)


# ---------------------------------------------------------------- hierarchical medians


class _Keyer:
    """Maps measurements to integer keys of one level: 'pair', 'prefix' or 'global'."""

    def __init__(self, level: str, prefix_bits: tuple[int, int] = (24, 48)):
        self.level = level
        self.vocab = None
        v4, v6 = prefix_bits
        self.transform = (lambda a: prefix_of(a, v4, v6)) if level == "prefix" else None

    def fit(self, d: dict) -> np.ndarray:
        if self.level == "global":
            return _ipv(d)
        self.vocab = vocabulary(column(d, "src"), column(d, "dst"), transform=self.transform)
        return self.keys(d)

    def keys(self, d: dict) -> np.ndarray:
        if self.level == "global":
            return _ipv(d)
        tf = self.transform
        s = codes_in(column(d, "src"), self.vocab, tf)
        t = codes_in(column(d, "dst"), self.vocab, tf)
        n = max(len(self.vocab), 1)
        return np.where((s >= 0) & (t >= 0), s * n + t, -1)


class Hierarchical:
    """Median (and empirical distribution) of the first level, finest to coarsest, that has
    at least `min_count` successful training packets for the measurement.

    Failure probability: each level's failure rate shrunk towards the next coarser one with
    `prior` pseudo-packets, p = (failed + prior·p_coarser) / (total + prior).
    The prefix level groups by (source, destination) networks of `prefix_bits` = (IPv4 bits,
    IPv6 bits), default (24, 48).
    """

    levels: tuple[str, ...] = ("global",)
    name = "hierarchical"

    def __init__(self, min_count: int = 1, prior: float = 10.0, sketch: int = 1024, seed: int = 0,
                 prefix_bits: tuple[int, int] = (24, 48)):
        self.min_count = min_count
        self.prefix_bits = tuple(prefix_bits)
        self.prior = prior
        self.sketch = sketch
        self.seed = seed
        self._keyers: list[_Keyer] = []
        self._groups: list[Groups] = []

    def fit(self, train: dict) -> "Hierarchical":
        rtt = _rtt(train)
        self._keyers, self._groups = [], []
        for level in self.levels:
            k = _Keyer(level, self.prefix_bits)
            keys = k.fit(train)
            self._keyers.append(k)
            self._groups.append(Groups(keys, rtt, sketch=self.sketch))
        return self

    def predict(self, test: dict) -> Prediction:
        if not self._groups:
            raise RuntimeError(f"{type(self).__name__}.predict before fit")
        n = len(_rtt(test))
        actual = _rtt(test)
        keys = [k.keys(test) for k in self._keyers]
        level = np.full(n, -1, np.int8)
        gidx = np.full(n, -1, np.int64)
        for li, (g, kk) in enumerate(zip(self._groups, keys)):
            gi = g.lookup(kk, self.min_count)
            take = (level < 0) & (gi >= 0)
            level[take] = li
            gidx[take] = gi[take]
        median = np.full(n, np.nan)
        quant = {q: np.full(n, np.nan) for q in QUANTILES}
        pit = np.full(n, np.nan)
        rng = np.random.default_rng(self.seed)
        for li, g in enumerate(self._groups):
            sel = level == li
            if not sel.any():
                continue
            gi = gidx[sel]
            for q in QUANTILES:
                quant[q][sel] = g.q[q][gi]
            pit[sel] = g.pit(gi, actual[sel], rng)
        median[:] = quant[0.5]
        # failure probability, coarsest level first, each finer level shrunk towards it
        p_fail = np.full(n, np.nan)
        for g, kk in zip(reversed(self._groups), reversed(keys)):
            gi = g.lookup(kk, min_count=0)
            have = gi >= 0
            gsafe = np.maximum(gi, 0)
            parent = np.where(np.isnan(p_fail), g.fail_rate(gi), p_fail)
            shrunk = (g.n_failed[gsafe] + self.prior * parent) / (g.n_total[gsafe] + self.prior)
            p_fail = np.where(have, shrunk, p_fail)
        return Prediction(median, level, tuple(self.levels), quant, pit, p_fail)


class GlobalMedian(Hierarchical):
    """Median RTT of the training split per address family."""

    levels = ("global",)
    name = "global_median"


class PrefixMedian(Hierarchical):
    """Median per (source /24|/48, destination /24|/48); falls back to the family median."""

    levels = ("prefix", "global")
    name = "prefix_median"


class PairMedian(Hierarchical):
    """Median per (src, dst) pair; unseen pairs fall back to PrefixMedian, then GlobalMedian."""

    levels = ("pair", "prefix", "global")
    name = "pair_median"


# ---------------------------------------------------------------- Vivaldi


class Vivaldi:
    """Vivaldi network coordinates (Dabek, Cox, Kaashoek, Morris, SIGCOMM 2004).

    Each address is a node with a `dims`-D Euclidean position v, a height h ≥ 0 (the
    height-vector model: ‖(v_i,h_i) − (v_j,h_j)‖ = ‖v_i − v_j‖ + h_i + h_j) and an error
    estimate e (starts at 1). One sample (rtt to node j) updates node i as in the paper's
    adaptive-timestep algorithm:

        w     = e_i / (e_i + e_j)
        e_s   = | dist − rtt | / rtt
        e_i  <- e_s · ce · w + e_i · (1 − ce · w)
        δ     = cc · w
        x_i  <- x_i + δ · (rtt − dist) · u(x_i − x_j)
                u = (v_i − v_j, h_i + h_j) / dist,  h_i clamped at ≥ min_height

    Deviation from the paper (documented in docs/eval.md): rounds are *synchronous*. In each
    round every node with measurements draws one of its samples uniformly (seeded) and all
    nodes update at once from the round-start coordinates (a Jacobi sweep, vectorized over
    nodes), instead of asynchronous per-sample updates. A measured pair is a sample for both
    of its ends. Samples are the per-pair median RTTs of the training split
    (`samples="median"`, default) or the individual successful packets (`samples="packets"`).

    Prediction: ‖v_src − v_dst‖ + h_src + h_dst; measurements with an address that had no
    successful training packet fall back to the family's global median (level 'global').
    """

    name = "vivaldi"
    levels = ("vivaldi", "global")

    def __init__(
        self,
        dims: int = 2,
        rounds: int = 2000,
        cc: float = 0.25,
        ce: float = 0.25,
        height: bool = True,
        samples: str = "median",
        seed: int = 0,
        init_error: float = 1.0,
        min_rtt: float = 1e-3,
        min_height: float = 0.01,
    ):
        if samples not in ("median", "packets"):
            raise ValueError("samples must be 'median' or 'packets'")
        self.dims, self.rounds, self.cc, self.ce = dims, rounds, cc, ce
        self.height, self.samples, self.seed = height, samples, seed
        self.init_error, self.min_rtt, self.min_height = init_error, min_rtt, min_height
        self.vocab = None
        self.pos = self.h = self.err = None
        self.trained = None
        self.fit_info: dict = {}
        self._global = GlobalMedian()

    # -- fitting

    def fit(self, train: dict) -> "Vivaldi":
        rtt = _rtt(train)
        self._global.fit(train)
        self.vocab = vocabulary(column(train, "src"), column(train, "dst"))
        s = codes_in(column(train, "src"), self.vocab)
        t = codes_in(column(train, "dst"), self.vocab)
        ok = (rtt >= 0) & (s >= 0) & (t >= 0) & (s != t)
        s, t, r = s[ok], t[ok], rtt[ok]
        n_nodes = len(self.vocab)
        if self.samples == "median":
            key = s * max(n_nodes, 1) + t
            g = Groups(key, r, quantiles=(0.5,), sketch=2)
            s, t, r = g.keys // max(n_nodes, 1), g.keys % max(n_nodes, 1), g.q[0.5]
        return self.fit_edges(s, t, r, n_nodes)

    def fit_edges(self, src: np.ndarray, dst: np.ndarray, rtt: np.ndarray, n_nodes: int) -> "Vivaldi":
        """Run Vivaldi on samples (src[k], dst[k], rtt[k]) between nodes 0..n_nodes-1."""
        rng = np.random.default_rng(self.seed)
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        rtt = np.maximum(np.asarray(rtt, np.float64), self.min_rtt)
        # each sample serves both ends: CSR adjacency of the directed samples by node
        a = np.concatenate([src, dst])
        b = np.concatenate([dst, src])
        w = np.concatenate([rtt, rtt])
        order = np.argsort(a, kind="stable")
        a, b, w = a[order], b[order], w[order]
        deg = np.bincount(a, minlength=n_nodes).astype(np.int64)
        off = np.cumsum(deg) - deg
        active = np.flatnonzero(deg > 0)
        scale = float(np.median(rtt)) if len(rtt) else 1.0
        pos = rng.normal(0.0, 1e-3 * scale, size=(n_nodes, self.dims))
        # Heights start at (and never go below) min_height: the update moves h_i in proportion
        # to h_i + h_j, so heights that start at 0 would stay 0 (Serf's HeightMin does the same).
        h0 = self.min_height if self.height else 0.0
        h = np.full(n_nodes, h0)
        err = np.full(n_nodes, float(self.init_error))
        cc, ce = self.cc, self.ce
        tiny = 1e-9 * max(scale, 1e-9)
        for _ in range(self.rounds if len(active) else 0):
            e = off[active] + (rng.random(len(active)) * deg[active]).astype(np.int64)
            i, j, r = active, b[e], w[e]
            dv = pos[i] - pos[j]
            nv = np.sqrt(np.einsum("ij,ij->i", dv, dv))
            small = nv < tiny
            if small.any():  # coincident positions: a random direction
                rnd = rng.normal(size=(int(small.sum()), self.dims))
                rnd /= np.linalg.norm(rnd, axis=1, keepdims=True)
                dv[small] = rnd * tiny
                nv[small] = tiny
            hsum = h[i] + h[j]
            dist = nv + hsum
            wgt = err[i] / np.maximum(err[i] + err[j], 1e-12)
            es = np.abs(dist - r) / r
            err[i] = es * ce * wgt + err[i] * (1.0 - ce * wgt)
            step = cc * wgt * (r - dist) / dist
            pos[i] += step[:, None] * dv
            if self.height:
                h[i] = np.maximum(h[i] + step * hsum, h0)
        self.pos, self.h, self.err = pos, h, err
        self.trained = deg > 0
        pred = self.distance(src, dst)
        rel = np.abs(pred - rtt) / rtt
        self.fit_info = {
            "nodes": int(n_nodes),
            "nodes_with_samples": int(len(active)),
            "samples": int(len(rtt)),
            "rounds": int(self.rounds),
            "dims": int(self.dims),
            "height": bool(self.height),
            "cc": cc,
            "ce": ce,
            "sample_kind": self.samples,
            "train_median_rel_err": float(np.median(rel)) if len(rel) else None,
            "median_node_error": float(np.median(err[active])) if len(active) else None,
        }
        return self

    # -- prediction

    def distance(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Predicted RTT between node indices (NaN where either is < 0 or untrained)."""
        i = np.asarray(i, np.int64)
        j = np.asarray(j, np.int64)
        ok = (i >= 0) & (j >= 0)
        ii, jj = np.where(ok, i, 0), np.where(ok, j, 0)
        ok &= self.trained[ii] & self.trained[jj]
        d = np.linalg.norm(self.pos[ii] - self.pos[jj], axis=1) + self.h[ii] + self.h[jj]
        return np.where(ok, d, np.nan)

    def predict(self, test: dict) -> Prediction:
        if self.pos is None:
            raise RuntimeError("Vivaldi.predict before fit")
        s = codes_in(column(test, "src"), self.vocab)
        t = codes_in(column(test, "dst"), self.vocab)
        d = self.distance(s, t)
        g = self._global.predict(test)
        have = np.isfinite(d)
        level = np.where(have, 0, np.where(g.level >= 0, 1, -1)).astype(np.int8)
        median = np.where(have, d, g.median)
        return Prediction(median, level, self.levels, info={"raw_median": d})


# ---------------------------------------------------------------- registry


def default_baselines(seed: int = 0, vivaldi_rounds: int = 2000) -> dict[str, object]:
    """The baselines of `baseline_table`, by report name."""
    return {
        "global_median": GlobalMedian(seed=seed),
        "prefix_median": PrefixMedian(seed=seed),
        "pair_median": PairMedian(seed=seed),
        "vivaldi": Vivaldi(rounds=vivaldi_rounds, seed=seed),
    }


__all__ = [
    "QUANTILES",
    "Prediction",
    "Groups",
    "GlobalMedian",
    "PrefixMedian",
    "PairMedian",
    "Vivaldi",
    "default_baselines",
    "column",
    "prefix_of",
    "group_quantile",
]
