"""Classical RTT predictors: the baselines the model is compared with in `pingctl eval`
(the medians here; Vivaldi in eval/vivaldi.py, the least-squares embedding in
eval/embedding.py; the predictors built from a prompt's own measurements at the end).

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
quantiles and PIT values come from one sort of (group, RTT rank). Python loops run only over
*distinct* addresses (for prefixes) and over distinct sample sizes (for CRPS). Baselines fitted
on one train split share the levels they have in common (`SharedFits`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from pingctl.schema.arrow_strings import codes_in, vocabulary
from pingctl.eval import metrics as M

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
_ALIASES = {"src": ("src", "src_addr"), "dst": ("dst", "dst_addr")}
_BLOCK = 1 << 22  # rows (or sketch places) a block of `Groups`' work reads at once
_US_BITS = 37  # the PIT compares RTTs in whole microseconds, clipped below 2**37 (~38 hours)
SKETCH = 1024  # order statistics a group's CDF sketch keeps (`Groups`)


# ---------------------------------------------------------------- the result


@dataclass
class Prediction:
    """Per-measurement predictions of one predictor.

    median     float64[n] predicted median RTT (ms); NaN where nothing could answer
    level      int8[n] index into `level_names` of the level that answered the median
               (e.g. pair / prefix / global); -1 where none did
    quantiles  {q: float64[n]} for q in QUANTILES, or None (a point predictor: Vivaldi)
    pit        float64[n] randomized PIT of the actual RTT under the predictive distribution
               (NaN for failed packets or no distribution), or None
    p_fail     float64[n] predicted probability that the packet fails, or None
    crps       float64[n] CRPS (ms) of the actual RTT under the predictive distribution (the
               absolute error for a point predictor; NaN for failed packets), or None
    """

    median: np.ndarray
    level: np.ndarray
    level_names: tuple[str, ...]
    quantiles: dict[float, np.ndarray] | None = None
    pit: np.ndarray | None = None
    p_fail: np.ndarray | None = None
    info: dict = field(default_factory=dict)
    crps: np.ndarray | None = None

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

    def __init__(self, keys: np.ndarray, rtt: np.ndarray, quantiles=QUANTILES, sketch: int = SKETCH,
                 ranked: tuple[np.ndarray, np.ndarray] | None = None):
        """`ranked`: `rtt_ranks(rtt)`, where several Groups of one `rtt` share it."""
        keys = np.asarray(keys, dtype=np.int64)
        rtt = np.asarray(rtt, dtype=np.float64)
        self.keys, self.n_total, self.n_failed, first, values = _sorted_groups(keys, rtt, ranked)
        self.count = self.n_total - self.n_failed
        self.q = {float(q): group_quantile(values, first, self.count, q) for q in quantiles}
        self._sketch(values, first, max(int(sketch), 2))

    def _sketch(self, values, first: np.ndarray, k: int) -> None:
        """The CDF sketch: all values of a group of at most `k`, else its `k` evenly spaced order
        statistics (ranks floor(j (c - 1) / (k - 1))). Made a block of groups at a time, the
        kept places counted first: a day's pair level keeps nearly every packet (1 GB), and
        row-sized temporaries beside it would be several times that."""
        g = len(self.count)
        m = np.minimum(self.count, k)  # candidate places per group
        ends = np.cumsum(m)
        # groups a..b-1 of a block hold about _BLOCK candidates (a group is never split)
        cuts = [0, *np.searchsorted(ends, np.arange(_BLOCK, int(ends[-1]) if g else 0, _BLOCK)).tolist(), g]
        blocks = [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
        self.sk_count = np.zeros(g, np.int64)
        for a, b in blocks:
            gi, _ = self._kept(a, b, m, k)
            self.sk_count[a:b] = np.bincount(gi - a, minlength=b - a)
        self.sk_start = np.cumsum(self.sk_count) - self.sk_count
        n = int(self.sk_count.sum())
        self.sk_val = np.empty(n, np.float64)
        for a, b in blocks:
            gi, rank = self._kept(a, b, m, k)
            self.sk_val[int(self.sk_start[a]):int(self.sk_start[a]) + len(gi)] = values[first[gi] + rank]

    def _kept(self, a: int, b: int, m: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(group, rank among its successes) of the sketch's values of groups a..b-1, in order.
        A kept rank r is floor(j (c - 1) / (k - 1)) for j = ceil(r (k - 1) / (c - 1)), so the
        candidates are those floors for j = 0..k-1, each checked by that same arithmetic."""
        mb = m[a:b]
        gi = np.repeat(np.arange(a, b, dtype=np.int64), mb)
        w = np.arange(len(gi), dtype=np.int64) - np.repeat(np.cumsum(mb) - mb, mb)
        c = self.count[gi]
        rank = np.where(c <= k, w, np.floor(w.astype(np.float64) * (c - 1) / (k - 1)).astype(np.int64))
        j = np.ceil(rank * (k - 1) / np.maximum(c - 1, 1))
        keep = (c <= k) | (np.floor(j * (c - 1) / (k - 1)) == rank)
        return gi[keep], rank[keep]

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
        ux = _us(x[ok])
        less, leq = self._below(g, ux, strict=True), self._below(g, ux, strict=False)
        u = rng.random(len(g))
        out[ok] = (less + u * (leq - less + 1)) / (self.sk_count[g] + 1)
        return out

    def _below(self, g: np.ndarray, ux: np.ndarray, strict: bool) -> np.ndarray:
        """How many of each group's sketch values are below (`strict`) or at most `ux`, both in
        whole microseconds (`_us`): a binary search inside each group's sorted span, all groups
        at once (a sketch sorted by value is sorted by its microseconds)."""
        lo = self.sk_start[g]
        hi = lo + self.sk_count[g]
        while (open_ := lo < hi).any():
            mid = (lo + hi) // 2
            v = _us(self.sk_val[np.where(open_, mid, 0)])
            right = open_ & ((v < ux) if strict else (v <= ux))
            lo = np.where(right, mid + 1, lo)
            hi = np.where(open_ & ~right, mid, hi)
        return lo - self.sk_start[g]

    def crps(self, gidx: np.ndarray, x: np.ndarray) -> np.ndarray:
        """CRPS (ms) of x under each group's empirical distribution (its sketch); NaN for
        gidx < 0 and failed packets."""
        g = np.maximum(gidx, 0)
        count = np.where(gidx >= 0, self.sk_count[g] if len(self.sk_count) else 0, 0)
        start = self.sk_start[g] if len(self.sk_start) else np.zeros(len(g), np.int64)
        return M.crps_samples(x, self.sk_val, start, count)


def rtt_ranks(rtt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct successful RTTs, sorted; each packet's place among them), what `Groups`
    sorts by in place of the RTT itself."""
    values = np.unique(rtt[rtt >= 0])
    rank = np.searchsorted(values, rtt)
    # held beside the train split while its levels are fitted: half the size where it fits
    return values, rank.astype(np.int32) if len(values) < 2**31 - 1 else rank


class _PackedValues:
    """The successful RTT at each place of a sorted array of (key, RTT rank + 1) packed in one
    uint64: read where asked, so no row-sized array of values is made."""

    def __init__(self, packed: np.ndarray, values: np.ndarray, bits: int):
        self.packed, self.values, self.mask = packed, values, np.uint64((1 << bits) - 1)

    def __getitem__(self, places) -> np.ndarray:
        return self.values[(self.packed[places] & self.mask).astype(np.int64) - 1]


def _sorted_groups(keys: np.ndarray, rtt: np.ndarray, ranked=None):
    """Of the packets with a key >= 0: the distinct keys (sorted), packets and failures per key,
    each key's first place holding a success, and `values`, whose places first..first + count - 1
    hold the key's successful RTTs in order (as a lexsort of (key, RTT) orders them). Here one
    `np.sort` of a uint64 per packet, the key above the RTT's rank (0 for a failure, so a
    key's failures come first): many times faster than the lexsort (two stable argsorts and
    their gathers), which is kept where the two do not fit 63 bits. The packed array is filled
    and read a block at a time: at a day's 64M rows each row-sized temporary is 512 MB."""
    values, rank = ranked if ranked is not None else rtt_ranks(rtt)
    valid = keys >= 0
    every = bool(valid.all())
    kv = keys if every else keys[valid]
    vbits = max(len(values).bit_length(), 1)  # a bit even with no success: a key's first success is found by it
    distinct = None
    if len(kv) and int(kv.max()).bit_length() + vbits > 63:
        distinct, kv = np.unique(kv, return_inverse=True)
        if (len(distinct) - 1).bit_length() + vbits > 63:
            found, n_total, n_failed, _, vs = _by_group_lexsort(keys, rtt)
            count = n_total - n_failed
            return found, n_total, n_failed, np.cumsum(count) - count, vs
    if not len(kv):
        none = np.zeros(0, np.int64)
        return none, none, none, none, np.zeros(0, np.float64)
    shift = np.uint64(vbits)
    rank_v, rtt_v = (rank, rtt) if every else (rank[valid], rtt[valid])
    packed = np.empty(len(kv), np.uint64)
    for a in range(0, len(kv), _BLOCK):
        r = rank_v[a:a + _BLOCK].astype(np.uint64)
        r += np.uint64(1)
        r[~(rtt_v[a:a + _BLOCK] >= 0)] = 0
        p = kv[a:a + _BLOCK].astype(np.uint64)
        p <<= shift
        p |= r
        packed[a:a + _BLOCK] = p
    del rank_v, rtt_v, r, p
    packed.sort()
    starts, prev = [], None
    for a in range(0, len(packed), _BLOCK):
        g = packed[a:a + _BLOCK] >> shift
        first = np.empty(len(g), bool)
        first[0] = prev is None or g[0] != prev
        np.not_equal(g[1:], g[:-1], out=first[1:])
        starts.append(np.flatnonzero(first) + a)
        prev = g[-1]
    starts = np.concatenate(starts)
    found = (packed[starts] >> shift).astype(np.int64)
    n_total = np.diff(np.append(starts, len(packed)))
    first_ok = np.searchsorted(packed, (found.astype(np.uint64) << shift) | np.uint64(1)).astype(np.int64)
    return ((found if distinct is None else distinct[found]), n_total, first_ok - starts, first_ok,
            _PackedValues(packed, values, vbits))


def _by_group(keys: np.ndarray, rtt: np.ndarray, ranked=None):
    """`_sorted_groups` with each successful packet's key index and RTT spelled out in (key, RTT)
    order: the lexsort's arrays (`_by_group_lexsort`)."""
    found, n_total, n_failed, first, values = _sorted_groups(keys, rtt, ranked)
    count = n_total - n_failed
    gs = np.repeat(np.arange(len(found), dtype=np.int64), count)
    places = np.arange(len(gs), dtype=np.int64) - (np.cumsum(count) - count)[gs] + first[gs]
    return found, n_total, n_failed, gs, values[places]


def _by_group_lexsort(keys: np.ndarray, rtt: np.ndarray):
    valid = keys >= 0
    keys, rtt = keys[valid], rtt[valid]
    found, inv = np.unique(keys, return_inverse=True)
    inv = inv.astype(np.int64)
    g = len(found)
    ok = rtt >= 0
    n_total = np.bincount(inv, minlength=g).astype(np.int64)
    n_failed = np.bincount(inv[~ok], minlength=g).astype(np.int64)
    gi, v = inv[ok], rtt[ok]
    order = np.lexsort((v, gi))
    return found, n_total, n_failed, gi[order], v[order]


def _us(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.asarray(v) * 1000.0), 0, (1 << _US_BITS) - 1).astype(np.int64)


# ---------------------------------------------------------------- hierarchical medians


def _transform(bits: tuple[int, int] | None):
    return None if bits is None else (lambda a: prefix_of(a, *bits))


class _Keyer:
    """Maps measurements to integer keys of one level: 'pair', 'prefix' or 'global'."""

    def __init__(self, level: str, prefix_bits: tuple[int, int] = (24, 48)):
        self.level = level
        self.vocab = None
        self.bits = tuple(prefix_bits) if level == "prefix" else None
        self.transform = _transform(self.bits)

    def fit(self, d: dict, shared: "SharedFits | None" = None) -> np.ndarray:
        if self.level == "global":
            return _ipv(d)
        self.vocab, s, t = SharedFits.of(d, shared).codes(self.bits)
        return self._join(s, t)

    def keys(self, d: dict) -> np.ndarray:
        if self.level == "global":
            return _ipv(d)
        tf = self.transform
        return self._join(codes_in(column(d, "src"), self.vocab, tf), codes_in(column(d, "dst"), self.vocab, tf))

    def _join(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        n = max(len(self.vocab), 1)
        return np.where((s >= 0) & (t >= 0), s.astype(np.int64) * n + t, -1)


class SharedFits:
    """What baselines fitted on one train split compute alike, computed once for them all: each
    level's keyer and `Groups` (a PairMedian's prefix and global levels are a PrefixMedian's and
    a GlobalMedian's, the embedding's fallback is the GlobalMedian), the RTTs' ranks the Groups
    sort by, and the address codes the pair level and the embedding both read. It holds its
    train dict and answers for that dict only (`of`); what it hands out is read, never changed,
    by the baselines sharing it."""

    def __init__(self, train: dict):
        self.train = train
        self._codes: dict = {}
        self._levels: dict = {}
        self._rtt = self._ranked = None

    @classmethod
    def of(cls, train: dict, shared: "SharedFits | None") -> "SharedFits":
        """`shared` where it was made for this very `train`, else a fresh one (nothing shared)."""
        return shared if shared is not None and shared.train is train else cls(train)

    def rtt(self) -> np.ndarray:
        if self._rtt is None:
            self._rtt = _rtt(self.train)
        return self._rtt

    def codes(self, bits: tuple[int, int] | None = None):
        """(sorted vocabulary, source codes, destination codes) of the addresses, or of their
        networks of `bits` = (IPv4 bits, IPv6 bits)."""
        if bits in self._codes:
            return self._codes[bits]
        tf = _transform(bits)
        src, dst = column(self.train, "src"), column(self.train, "dst")
        vocab = vocabulary(src, dst, transform=tf)
        # int32 where they fit: held beside train while every level is fitted (a day: 0.5 GB, not 1)
        small = np.int32 if len(vocab) < 2**31 - 1 else np.int64
        got = (vocab, codes_in(src, vocab, tf).astype(small, copy=False), codes_in(dst, vocab, tf).astype(small, copy=False))
        if bits is None:  # kept for the embedding; a prefix's are read once, by its level's keyer
            self._codes[bits] = got
        return got

    def level(self, level: str, prefix_bits: tuple[int, int], sketch: int) -> tuple[_Keyer, "Groups"]:
        """The fitted keyer of `level` and its `Groups` of the train packets."""
        key = (level, tuple(prefix_bits) if level == "prefix" else None, int(sketch))
        if key not in self._levels:
            k = _Keyer(level, prefix_bits)
            if self._ranked is None:
                self._ranked = rtt_ranks(self.rtt())
            self._levels[key] = (k, Groups(k.fit(self.train, self), self.rtt(), sketch=sketch, ranked=self._ranked))
        return self._levels[key]


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

    def __init__(self, min_count: int = 1, prior: float = 10.0, sketch: int = SKETCH, seed: int = 0,
                 prefix_bits: tuple[int, int] = (24, 48)):
        self.min_count = min_count
        self.prefix_bits = tuple(prefix_bits)
        self.prior = prior
        self.sketch = sketch
        self.seed = seed
        self._keyers: list[_Keyer] = []
        self._groups: list[Groups] = []

    def fit(self, train: dict, shared: SharedFits | None = None) -> "Hierarchical":
        """Fit on `train`; `shared` (made for this `train`) shares the levels another baseline
        fitted on it."""
        shared = SharedFits.of(train, shared)
        fitted = [shared.level(level, self.prefix_bits, self.sketch) for level in self.levels]
        self._keyers, self._groups = [k for k, _ in fitted], [g for _, g in fitted]
        return self

    def predict(self, test: dict, scores: bool = True) -> Prediction:
        """Medians, quantiles and P(failure); with `scores`, also the PIT and the CRPS of the
        actual RTTs (a fallback that only needs the medians skips them)."""
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
        crps = np.full(n, np.nan)
        rng = np.random.default_rng(self.seed)
        for li, g in enumerate(self._groups):
            sel = level == li
            if not sel.any():
                continue
            gi = gidx[sel]
            for q in QUANTILES:
                quant[q][sel] = g.q[q][gi]
            if scores:
                pit[sel] = g.pit(gi, actual[sel], rng)
                crps[sel] = g.crps(gi, actual[sel])
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
        return Prediction(median, level, tuple(self.levels), quant, pit if scores else None, p_fail,
                          crps=crps if scores else None)


class GlobalMedian(Hierarchical):
    """Median RTT of the training split per address family."""

    levels = ("global",)
    name = "global_median"


class PrefixMedian(Hierarchical):
    """Median per (source /24|/48, destination /24|/48); falls back to the family median."""

    levels = ("prefix", "global")
    name = "prefix_median"


class Prefix16Median(Hierarchical):
    """PrefixMedian on wider networks: (source /16|/32, destination /16|/32), then the family."""

    levels = ("prefix", "global")
    name = "prefix16_median"

    def __init__(self, min_count: int = 1, prior: float = 10.0, sketch: int = SKETCH, seed: int = 0,
                 prefix_bits: tuple[int, int] = (16, 32)):
        super().__init__(min_count, prior, sketch, seed, prefix_bits)


class PairMedian(Hierarchical):
    """Median per (src, dst) pair; unseen pairs fall back to PrefixMedian, then GlobalMedian."""

    levels = ("pair", "prefix", "global")
    name = "pair_median"




# ---------------------------------------------------------------- point predictors


def point_prediction(raw: np.ndarray, fallback: Prediction, levels: tuple[str, ...], test: dict) -> Prediction:
    """A point predictor's Prediction: `raw` (ms) where finite (level 0), else the fallback's
    median (the last level). Its CRPS is its absolute error (all mass on one value)."""
    raw = np.asarray(raw, np.float64)
    have = np.isfinite(raw)
    level = np.where(have, 0, np.where(fallback.level >= 0, len(levels) - 1, -1)).astype(np.int8)
    median = np.where(have, raw, fallback.median)
    return Prediction(median, level, tuple(levels), info={"raw_median": raw}, crps=M.crps_point(median, _rtt(test)))


# ---------------------------------------------------------------- predictors that read the prompt
#
# `pool` is the table the prompts were drawn from and `contexts[k]` the pool rows in query k's
# prompt (pingctl/eval/model.py returns both), so these predictors see exactly what the model
# sees about each query, nothing more.


def flat_contexts(contexts) -> tuple[np.ndarray, np.ndarray]:
    """(query index, pool row) of every context measurement."""
    lens = np.array([len(c) for c in contexts], np.int64)
    if not lens.sum():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.repeat(np.arange(len(contexts)), lens), np.concatenate(contexts).astype(np.int64)


def _objects(values) -> np.ndarray:
    return np.asarray(values, dtype=object)


class PromptMedian:
    """The median of the prompt's measurements that match the query: those of the same
    (src, dst) pair, else of the same (/24, /24) networks (/48 for IPv6), else of the same
    (/16, /16) (/32); where none match, the fallback (the family's global median). Quantiles,
    PIT and CRPS come from that sample; P(failure) is its failure share shrunk towards the
    next coarser level's with `prior` pseudo-packets, as `Hierarchical`."""

    name = "prompt_median"
    levels = ("pair", "prefix", "prefix16", "global")
    _bits = (None, (24, 48), (16, 32))

    def __init__(self, prior: float = 10.0, seed: int = 0):
        self.prior, self.seed = prior, seed

    def predict(self, pool: dict, test: dict, contexts, fallback: Prediction) -> Prediction:
        n = len(_rtt(test))
        actual = _rtt(test)
        q, rows = flat_contexts(contexts)
        psrc, pdst = _objects(column(pool, "src"))[rows], _objects(column(pool, "dst"))[rows]
        qsrc, qdst = _objects(column(test, "src")), _objects(column(test, "dst"))
        rtt = np.asarray(column(pool, "rtt"), np.float64)[rows]
        groups, gidx = [], []
        for bits in self._bits:
            tf = None if bits is None else (lambda a, b=bits: prefix_of(a, *b))
            vocab = vocabulary(psrc, pdst, qsrc, qdst, transform=tf)
            cs, cd = codes_in(psrc, vocab, tf), codes_in(pdst, vocab, tf)
            match = (cs >= 0) & (cd >= 0) & (cs == codes_in(qsrc, vocab, tf)[q]) & (cd == codes_in(qdst, vocab, tf)[q])
            g = Groups(np.where(match, q, -1), rtt)
            groups.append(g)
            gidx.append(g.lookup(np.arange(n), min_count=0))
        level = np.full(n, len(self._bits), np.int8)  # the fallback's level unless a prompt level answers
        answer = np.full(n, -1, np.int64)
        for li in reversed(range(len(self._bits))):
            gi = groups[li].lookup(np.arange(n), min_count=1)
            level[gi >= 0] = li
            answer[gi >= 0] = gi[gi >= 0]
        median = fallback.median.copy()
        quant = {k: (fallback.quantiles or {}).get(k, np.full(n, np.nan)).copy() for k in QUANTILES}
        pit = fallback.pit.copy() if fallback.pit is not None else np.full(n, np.nan)
        crps = fallback.crps.copy() if fallback.crps is not None else M.crps_point(median, actual)
        rng = np.random.default_rng(self.seed)
        for li, g in enumerate(groups):
            sel = level == li
            if not sel.any():
                continue
            gi = answer[sel]
            for k in QUANTILES:
                quant[k][sel] = g.q[k][gi]
            median[sel] = g.q[0.5][gi]
            pit[sel] = g.pit(gi, actual[sel], rng)
            crps[sel] = g.crps(gi, actual[sel])
        p_fail = fallback.p_fail.copy() if fallback.p_fail is not None else np.full(n, np.nan)
        for g, gi in zip(reversed(groups), reversed(gidx)):
            have = gi >= 0
            gs = np.maximum(gi, 0)
            parent = np.where(np.isfinite(p_fail), p_fail, 0.0)
            if len(g.keys):
                shrunk = (g.n_failed[gs] + self.prior * parent) / (g.n_total[gs] + self.prior)
                p_fail = np.where(have, shrunk, p_fail)
        lv = np.where(level == len(self._bits), np.where(fallback.level >= 0, level, -1), level).astype(np.int8)
        return Prediction(median, lv, self.levels, quant, pit, p_fail, crps=crps)


def refit_prediction(base, pool: dict, test: dict, contexts, fallback: Prediction) -> Prediction:
    """A coordinate predictor (`base`: a fitted Vivaldi or Embedding) that also places hosts it
    has never seen, from the prompt. Per query: both ends known, `base` answers (level
    `known`); one end new, that end is placed from the prompt's measurements between it and
    known hosts, the known ones held still (`base.refit`: one new host per query, from that
    query's prompt only), and measured to the known end (level `refit`); otherwise, or where
    the prompt holds no such measurement, the fallback's median (level `global`). A point
    predictor: its CRPS is its absolute error."""
    levels = ("known", "refit", "global")
    n = len(_rtt(test))
    qsrc, qdst = _objects(column(test, "src")), _objects(column(test, "dst"))
    qs, qd = base.codes(qsrc), base.codes(qdst)
    tr = base.trained

    def known(c):
        return (c >= 0) & (tr[np.maximum(c, 0)] if len(tr) else False)

    ks, kd = known(qs), known(qd)
    raw = np.full(n, np.nan)
    both = ks & kd
    raw[both] = base.distance(qs[both], qd[both])
    one = ks ^ kd
    if one.any():
        vid = np.cumsum(one) - 1  # the new host of query k is new host vid[k]
        new_addr = np.where(ks, qdst, qsrc)
        q, rows = flat_contexts(contexts)
        keep = one[q]
        q, rows = q[keep], rows[keep]
        psrc, pdst = _objects(column(pool, "src"))[rows], _objects(column(pool, "dst"))[rows]
        na = new_addr[q]
        as_src, as_dst = psrc == na, pdst == na
        use = as_src ^ as_dst
        peer = base.codes(np.where(as_src, pdst, psrc)[use])
        prtt = np.asarray(column(pool, "rtt"), np.float64)[rows][use]
        ptime = np.asarray(pool["event_time"])[rows][use] if "event_time" in pool else None
        hosts = base.refit(vid[q[use]], peer, prtt, int(one.sum()), ptime)
        raw[one] = hosts.distance(vid[one], np.where(ks, qs, qd)[one])
    have = np.isfinite(raw)
    level = np.where(both & have, 0, np.where(one & have, 1, np.where(fallback.level >= 0, 2, -1))).astype(np.int8)
    median = np.where(have, raw, fallback.median)
    return Prediction(median, level, levels, info={"raw_median": raw}, crps=M.crps_point(median, _rtt(test)))
