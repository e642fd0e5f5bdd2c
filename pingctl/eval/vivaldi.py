"""Vivaldi network coordinates as production systems run them: hashicorp/serf's `coordinate`
package (used by Serf and Consul), in NumPy.

Serf's algorithm, per observation (node i pinged node j and saw `rtt`), in this order:

1. **Latency filter**: the RTT used is the median of the last `latency_filter_size` (3) raw
   RTTs i saw from j (the upper median while fewer are kept), so one slow ping never reaches
   the coordinates.
2. **Vivaldi** (Dabek et al. 2004) with serf's guards: `dist` = i's distance to j *with*
   adjustments; rtt >= 1e-6 s; `w = e_i / max(e_i + e_j, 1e-6)`;
   `e_i <- ce·w·|dist − rtt|/rtt + e_i·(1 − ce·w)`, capped at `vivaldi_error_max` (1.5, also
   every node's starting error); `force = cc·w·(rtt − dist)` applied along the unit vector from
   j to i (a random one when they coincide). The height moves by
   `force·(h_i + h_j)/‖v_i − v_j‖` and never goes below `height_min` (10 µs).
3. **Adjustment** (Lee et al. 2010): a window of the last `adjustment_window_size` (20)
   values of rtt − raw distance; the node's adjustment is their sum / (2·window). Distances
   add both ends' adjustments when that sum keeps them positive.
4. **Gravity**: a pull towards the origin of force −(‖x‖/`gravity_rho`)², ρ = 150 s, against
   drift of the whole system.
5. A coordinate that became NaN or infinite is reset to a fresh one (`stats["resets"]`).
   An observation from an invalid or incompatible coordinate, or with an RTT outside
   [0, 10 s], is refused (`Client.update` raises ValueError; `Swarm` drops and counts it).

Units are seconds, as in serf: `gravity_rho` and `height_min` are in seconds, so a unit change
would change what they do. Serf carries times as integer nanoseconds; floats are kept here (a
difference below 1e-9 s).

Two ways to run it:
- `Client` / `Coordinate`: serf's API, one observation at a time (tests/test_vivaldi.py ports
  serf's coordinate_test.go and client_test.go onto them).
- `Swarm`: many nodes' state as arrays. `update` applies the same steps to many observations
  at once, each reading its peer's coordinate as it was before the call; `update_sequence`
  gives the result of a sequence of observations applied one at a time, in order, as serf
  does, by applying at once only observations that do not touch each other's nodes (a few
  batches per round of the whole swarm). `Vivaldi` (the eval baseline) runs rounds in which
  every node observes one peer, in node order: serf's own `Simulate`. A test checks the
  batches against one-at-a-time updates; serf's performance_test.go runs on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from pingctl.schema.arrow_strings import codes_in
from pingctl.eval.baselines import GlobalMedian, Groups, SharedFits, column, point_prediction

ZERO_THRESHOLD = 1.0e-6  # serf: below this two positions coincide, an RTT is clamped up to it
MAX_RTT_S = 10.0  # serf refuses observations outside [0, 10 s]


@dataclass(frozen=True)
class Config:
    """serf's `coordinate.Config` and its `DefaultConfig()` values."""

    dimensionality: int = 8
    vivaldi_error_max: float = 1.5
    vivaldi_ce: float = 0.25
    vivaldi_cc: float = 0.25
    adjustment_window_size: int = 20
    height_min: float = 10.0e-6
    latency_filter_size: int = 3
    gravity_rho: float = 150.0


class DimensionalityConflictError(ValueError):
    """Two coordinates of different dimensionality met (serf panics with its namesake)."""

    def __init__(self):
        super().__init__("coordinate dimensionality does not match")


# ---------------------------------------------------------------- vectorised steps (k rows)


def _norm(v: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", v, v))


def raw_distance(va, ha, vb, hb) -> np.ndarray:
    """‖va − vb‖ + ha + hb per row (seconds), adjustments left out."""
    return _norm(va - vb) + ha + hb


def distance(va, ha, aa, vb, hb, ab) -> np.ndarray:
    """serf's DistanceTo per row: the raw distance plus both adjustments, where that stays > 0."""
    raw = raw_distance(va, ha, vb, hb)
    adjusted = raw + aa + ab
    return np.where(adjusted > 0.0, adjusted, raw)


def unit_vector_at(v1: np.ndarray, v2: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the unit vector pointing from v2 to v1 and the distance between them; where
    they coincide (distance <= 1e-6), a random unit vector and distance 0 (serf draws each
    component uniformly in [-0.5, 0.5); if even that is ~0, the first axis)."""
    d = v1 - v2
    mag = _norm(d)
    far = mag > ZERO_THRESHOLD
    if far.all():
        return d / mag[:, None], mag
    unit = np.empty_like(d)
    unit[far] = d[far] / mag[far, None]
    near = np.flatnonzero(~far)
    if len(near):
        r = rng.random((len(near), d.shape[1])) - 0.5
        rm = _norm(r)
        ok = rm > ZERO_THRESHOLD
        r[ok] /= rm[ok, None]
        r[~ok] = 0.0
        r[~ok, 0] = 1.0
        unit[near] = r
    return unit, np.where(far, mag, 0.0)


def apply_force(config: Config, vec, height, force, other_vec, other_height, rng) -> tuple[np.ndarray, np.ndarray]:
    """serf's ApplyForce per row: move `force` seconds along the unit vector from the other
    coordinate; the height moves by force·(h + h_other)/distance, floored at height_min (not
    moved where the positions coincide)."""
    unit, mag = unit_vector_at(vec, other_vec, rng)
    new_vec = vec + unit * force[:, None]
    moved = mag > ZERO_THRESHOLD
    h = np.asarray(height, np.float64)
    if moved.all():
        return new_vec, np.maximum(h + force * (h + other_height) / mag, config.height_min)
    safe = np.where(moved, mag, 1.0)
    new_h = np.where(moved, np.maximum(h + force * (h + other_height) / safe, config.height_min), h)
    return new_vec, new_h


def is_valid(vec, error, adjustment, height) -> np.ndarray:
    """Per row: every component finite (serf's IsValid)."""
    return (np.isfinite(vec).all(axis=1) & np.isfinite(error) & np.isfinite(adjustment) & np.isfinite(height))


# ---------------------------------------------------------------- serf's API, one at a time


@dataclass
class Coordinate:
    """serf's Coordinate: Euclidean part `vec`, `error` (dimensionless), `adjustment` and
    `height` (seconds)."""

    vec: np.ndarray
    error: float
    adjustment: float = 0.0
    height: float = 0.0

    @classmethod
    def new(cls, config: Config) -> "Coordinate":
        """At the origin with the maximum error and the minimum height (serf's NewCoordinate)."""
        return cls(np.zeros(config.dimensionality), config.vivaldi_error_max, 0.0, config.height_min)

    def clone(self) -> "Coordinate":
        return replace(self, vec=np.array(self.vec, np.float64, copy=True))

    def is_valid(self) -> bool:
        return bool(is_valid(np.atleast_2d(self.vec), self.error, self.adjustment, self.height)[0])

    def is_compatible_with(self, other: "Coordinate") -> bool:
        return len(self.vec) == len(other.vec)

    def _check(self, other: "Coordinate") -> None:
        if not self.is_compatible_with(other):
            raise DimensionalityConflictError()

    def apply_force(self, config: Config, force: float, other: "Coordinate",
                    rng: np.random.Generator | None = None) -> "Coordinate":
        """A copy moved by `force` seconds away from `other` (towards it if negative)."""
        self._check(other)
        v, h = apply_force(config, np.atleast_2d(self.vec).astype(np.float64), np.array([self.height]),
                           np.array([float(force)]), np.atleast_2d(other.vec).astype(np.float64),
                           np.array([other.height]), rng or np.random.default_rng())
        return replace(self, vec=v[0], height=float(h[0]))

    def distance_to(self, other: "Coordinate") -> float:
        """Seconds, with adjustments where they keep it positive."""
        self._check(other)
        return float(distance(np.atleast_2d(self.vec), self.height, self.adjustment,
                              np.atleast_2d(other.vec), other.height, other.adjustment)[0])

    def raw_distance_to(self, other: "Coordinate") -> float:
        self._check(other)
        return float(raw_distance(np.atleast_2d(self.vec), self.height, np.atleast_2d(other.vec), other.height)[0])


class Client:
    """serf's coordinate.Client: one node's coordinate, latency filter and adjustment window,
    updated one observation at a time (`update(node, other, rtt_seconds)`). A one-node `Swarm`
    does the arithmetic, so this and the vectorised fit are the same code."""

    def __init__(self, config: Config | None = None, rng: np.random.Generator | None = None):
        config = config or Config()
        if not config.dimensionality > 0:
            raise ValueError("dimensionality must be >0")
        self.config = config
        self._swarm = Swarm(1, config, channels=0, rng=rng)
        self._channel: dict[str, int] = {}

    @property
    def stats(self) -> dict:
        return {"resets": self._swarm.resets}

    def get_coordinate(self) -> Coordinate:
        s = self._swarm
        return Coordinate(s.vec[0].copy(), float(s.error[0]), float(s.adjustment[0]), float(s.height[0]))

    def _check_coordinate(self, coord: Coordinate) -> None:
        if len(coord.vec) != self.config.dimensionality:
            raise ValueError("dimensions aren't compatible")
        if not coord.is_valid():
            raise ValueError("coordinate is invalid")

    def set_coordinate(self, coord: Coordinate) -> None:
        self._check_coordinate(coord)
        s = self._swarm
        s.vec[0], s.error[0], s.adjustment[0], s.height[0] = coord.vec, coord.error, coord.adjustment, coord.height

    def forget_node(self, node: str) -> None:
        """Drop the latency filter's samples of `node` (it left)."""
        ch = self._channel.pop(node, None)
        if ch is not None:
            self._swarm.forget_channels(np.array([ch]))

    def latency_filter(self, node: str, rtt_seconds: float) -> float:
        """Add a raw RTT from `node` and return the median of its last samples."""
        return float(self._swarm.latency_filter(np.array([self._channel_of(node)]), np.array([float(rtt_seconds)]))[0])

    def _channel_of(self, node: str) -> int:
        if node not in self._channel:
            self._channel[node] = self._swarm.add_channels(1)[0]
        return self._channel[node]

    def update(self, node: str, other: Coordinate, rtt_seconds: float) -> Coordinate:
        """Observe `rtt_seconds` to `node`, whose coordinate is `other`; the new coordinate."""
        self._check_coordinate(other)
        rtt = float(rtt_seconds)
        if not (0.0 <= rtt <= MAX_RTT_S):
            raise ValueError(f"round trip time not in valid range, duration {rtt} s is not a positive value "
                             f"less than {MAX_RTT_S:g} s")
        self._swarm.update(np.array([0]), np.atleast_2d(other.vec).astype(np.float64), np.array([other.error]),
                           np.array([other.adjustment]), np.array([other.height]), np.array([rtt]),
                           np.array([self._channel_of(node)]))
        return self.get_coordinate()

    def distance_to(self, other: Coordinate) -> float:
        """Estimated RTT to `other`, seconds."""
        return self.get_coordinate().distance_to(other)


# ---------------------------------------------------------------- many nodes as arrays


class Swarm:
    """The state of `n` serf clients as arrays: coordinates (`vec`, `error`, `adjustment`,
    `height`), each node's adjustment window, and latency filters by *channel* (one per
    (node, peer) a node hears from; `add_channels`)."""

    def __init__(self, n: int, config: Config | None = None, channels: int = 0,
                 rng: np.random.Generator | None = None):
        self.config = c = config or Config()
        if not c.dimensionality > 0:
            raise ValueError("dimensionality must be >0")
        self.rng = rng if rng is not None else np.random.default_rng()
        self.vec = np.zeros((n, c.dimensionality))
        self.error = np.full(n, float(c.vivaldi_error_max))
        self.adjustment = np.zeros(n)
        self.height = np.full(n, float(c.height_min))
        self.adj_samples = np.zeros((n, c.adjustment_window_size))
        self.adj_index = np.zeros(n, np.int64)
        self.filt = np.full((channels, max(c.latency_filter_size, 1)), np.nan)
        self.filt_count = np.zeros(channels, np.int64)
        self.resets = 0
        self.refused = 0

    def add_channels(self, k: int) -> np.ndarray:
        start = len(self.filt_count)
        self.filt = np.vstack([self.filt, np.full((k, self.filt.shape[1]), np.nan)])
        self.filt_count = np.concatenate([self.filt_count, np.zeros(k, np.int64)])
        return np.arange(start, start + k)

    def forget_channels(self, ch: np.ndarray) -> None:
        self.filt[ch] = np.nan
        self.filt_count[ch] = 0

    def latency_filter(self, ch: np.ndarray, rtt: np.ndarray) -> np.ndarray:
        """Add one raw RTT per channel (distinct channels) and return each channel's median of
        its last `latency_filter_size` samples (serf: sorted[len // 2])."""
        size = self.filt.shape[1]
        slot = self.filt_count[ch] % size
        self.filt[ch, slot] = rtt
        self.filt_count[ch] += 1
        kept = np.minimum(self.filt_count[ch], size)
        return np.sort(self.filt[ch], axis=1)[np.arange(len(ch)), kept // 2]  # NaNs (empty) sort last

    def update(self, i, other_vec, other_error, other_adjustment, other_height, rtt, channel,
               check: bool = True) -> np.ndarray:
        """serf's Client.Update for node i[k] observing a peer with the given coordinate at
        `rtt[k]` seconds through latency-filter channel `channel[k]`, all k at once (the i
        distinct). Observations serf would refuse are dropped and counted in `refused` (an RTT
        outside [0, 10 s]; an invalid or incompatible peer coordinate, not looked for with
        `check=False`: peers of this swarm are valid by construction); returns the mask of
        those used."""
        c = self.config
        i = np.asarray(i, np.int64)
        ov = np.asarray(other_vec, np.float64)
        oe, oa, oh = (np.asarray(x, np.float64) for x in (other_error, other_adjustment, other_height))
        rtt, channel = np.asarray(rtt, np.float64), np.asarray(channel, np.int64)
        ok = (rtt >= 0.0) & (rtt <= MAX_RTT_S)
        if check:
            ok &= (ov.shape[1] == c.dimensionality) & is_valid(ov, oe, oa, oh)
        if not ok.all():
            self.refused += int((~ok).sum())
            i, ov, oe, oa, oh, rtt, channel = (x[ok] for x in (i, ov, oe, oa, oh, rtt, channel))
        if not len(i):
            return ok
        rtt = np.maximum(self.latency_filter(channel, rtt), ZERO_THRESHOLD)
        vec, err, h = self.vec[i], self.error[i], self.height[i]
        # Vivaldi: the distance with adjustments, the error-weighted step
        dist = distance(vec, h, self.adjustment[i], ov, oh, oa)
        weight = err / np.maximum(err + oe, ZERO_THRESHOLD)
        cew = c.vivaldi_ce * weight
        err = np.minimum(cew * (np.abs(dist - rtt) / rtt) + err * (1.0 - cew), c.vivaldi_error_max)
        vec, h = apply_force(c, vec, h, c.vivaldi_cc * weight * (rtt - dist), ov, oh, self.rng)
        # adjustment window: rtt minus the raw distance from the moved coordinate
        if c.adjustment_window_size > 0:
            slot = self.adj_index[i]
            self.adj_samples[i, slot] = rtt - raw_distance(vec, h, ov, oh)
            self.adj_index[i] = (slot + 1) % c.adjustment_window_size
            adj = self.adj_samples[i].sum(axis=1) / (2.0 * c.adjustment_window_size)
        else:
            adj = self.adjustment[i]
        # gravity towards the origin (a fresh coordinate: zero vector, height_min, no adjustment)
        zero = np.zeros_like(vec)
        g = distance(zero, c.height_min, 0.0, vec, h, adj) / c.gravity_rho
        vec, h = apply_force(c, vec, h, -(g * g), zero, c.height_min, self.rng)
        bad = ~is_valid(vec, err, adj, h)
        if bad.any():
            self.resets += int(bad.sum())
            vec[bad], err[bad], adj[bad], h[bad] = 0.0, c.vivaldi_error_max, 0.0, c.height_min
        self.vec[i], self.error[i], self.adjustment[i], self.height[i] = vec, err, adj, h
        return ok

    def update_from(self, i, j, rtt, channel) -> np.ndarray:
        """`update` with the peers' coordinates taken from this swarm (as they were before)."""
        j = np.asarray(j, np.int64)
        return self.update(i, self.vec[j], self.error[j], self.adjustment[j], self.height[j], rtt, channel,
                           check=False)

    def update_sequence(self, i, j, rtt, channel) -> int:
        """Observations k = 0, 1, ... (node i[k] hears from node j[k] of this swarm), with the
        result of applying them one at a time in that order, as serf does, but batched: an
        observation reads its own node and its peer and writes only its own node, so two of
        them conflict only when one's node is the other's peer. Each gets a level one above
        every earlier observation it conflicts with; one level at a time, the observations of
        a level are applied at once (they commute). The i must be distinct (a gossip round:
        each node observes once). Returns the number of levels."""
        i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
        rtt, channel = np.asarray(rtt, np.float64), np.asarray(channel, np.int64)
        m = len(i)
        if not m:
            return 0
        pos = np.full(len(self.vec), -1, np.int64)
        pos[i] = np.arange(m)
        if (pos[i] != np.arange(m)).any():
            raise ValueError("update_sequence: a node observes at most once per call")
        w = pos[j]  # the observation that writes k's peer, if any
        k = np.arange(m)
        before, after = (w >= 0) & (w < k), w > k
        level = np.zeros(m, np.int64)
        while True:  # longest chain of conflicts ending at each observation (a few rounds)
            new = level.copy()
            new[before] = np.maximum(new[before], level[w[before]] + 1)
            np.maximum.at(new, w[after], level[after] + 1)
            if np.array_equal(new, level):
                break
            level = new
        for lv in range(int(level.max()) + 1):
            sel = level == lv
            self.update_from(i[sel], j[sel], rtt[sel], channel[sel])
        return int(level.max()) + 1

    def distance(self, i, j) -> np.ndarray:
        """Estimated RTT (seconds) between nodes i[k] and j[k]."""
        i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
        return distance(self.vec[i], self.height[i], self.adjustment[i], self.vec[j], self.height[j],
                        self.adjustment[j])


# ---------------------------------------------------------------- the eval baseline


@dataclass
class _Edges:
    """Directed observation channels: node[e] hears from peer[e]; its RTTs are
    rtt_s[off[e] : off[e] + cnt[e]] (time order), shared by the two directions of a pair, whose
    median RTT is median_s[e]."""

    node: np.ndarray
    peer: np.ndarray
    off: np.ndarray
    cnt: np.ndarray
    rtt_s: np.ndarray
    median_s: np.ndarray
    info: dict = field(default_factory=dict)


def edges(a, b, rtt_ms, order_key=None, samples: str = "packets") -> _Edges:
    """Observation channels from measurements between node codes a[k] and b[k] (both
    directions: a pair's RTT is a sample for both ends, as serf's nodes ping each other).
    `samples`: "packets" (every RTT, in `order_key` order, through the latency filter) or
    "median" (one RTT per pair: its median)."""
    # One int64 key per (lower, higher) code, ordered as the two: at a day's 64M rows every
    # row-sized array is 512 MB, so each is made once and dropped as soon as it is read.
    a, b = np.asarray(a), np.asarray(b)
    r_ms = np.asarray(rtt_ms, np.float64)
    ok = (a >= 0) & (b >= 0) & (a != b) & np.isfinite(r_ms) & (r_ms >= 0)
    n = int(max(a.max(initial=0), b.max(initial=0))) + 1
    key = np.minimum(a, b).astype(np.int64)
    key *= n
    key += np.maximum(a, b)
    key = key[ok]
    r = r_ms[ok] / 1000.0
    over = r > MAX_RTT_S
    n_over = int(over.sum())
    t = np.zeros(len(r)) if order_key is None else np.asarray(order_key)[ok]
    del ok
    if n_over:
        keep = ~over
        key, r, t = key[keep], r[keep], t[keep]
        del keep
    del over
    order = np.lexsort((t, key))
    del t
    key = key[order]
    r = r[order]
    del order
    first = np.ones(len(r), bool)
    first[1:] = key[1:] != key[:-1]
    start = np.flatnonzero(first)
    del first
    cnt = np.diff(np.append(start, len(r)))
    pa, pb = key[start] // n, key[start] % n
    del key
    med = Groups(np.repeat(np.arange(len(start)), cnt), r, quantiles=(0.5,), sketch=2).q[0.5]
    if samples == "median":
        r, start, cnt = med, np.arange(len(start)), np.ones(len(start), np.int64)
    elif samples != "packets":
        raise ValueError("samples must be 'packets' or 'median'")
    return _Edges(np.concatenate([pa, pb]), np.concatenate([pb, pa]), np.concatenate([start, start]),
                  np.concatenate([cnt, cnt]), r, np.concatenate([med, med]),
                  {"pairs": int(len(pa)), "observations": int(len(r)), "refused_over_10s": n_over})


def run_cycles(swarm: Swarm, e: _Edges, cycles: int, rng: np.random.Generator, channel0: int = 0) -> int:
    """`cycles` gossip rounds: in each, every node with channels, in node order, picks one
    uniformly at random, takes that channel's next RTT (cycling through them in order) and
    updates as serf does, one observation after the other (`Swarm.update_sequence`). Channel k
    of `e` is latency-filter channel channel0 + k of the swarm. Returns the most levels a
    round needed."""
    if not len(e.node) or cycles <= 0:
        return 0
    order = np.argsort(e.node, kind="stable")
    node_sorted = e.node[order]
    active, first, deg = np.unique(node_sorted, return_index=True, return_counts=True)
    cursor = np.zeros(len(e.node), np.int64)
    levels = 0
    for _ in range(cycles):
        ch = order[first + (rng.random(len(active)) * deg).astype(np.int64)]
        k = e.off[ch] + cursor[ch] % e.cnt[ch]
        cursor[ch] += 1
        levels = max(levels, swarm.update_sequence(active, e.peer[ch], e.rtt_s[k], channel0 + ch))
    return levels


class Vivaldi:
    """The eval baseline: serf's Vivaldi run over the training measurements (docs/eval.md).

    Every address is a node. Each cycle, every node with measurements picks one of its peers at
    random, takes that pair's next successful RTT (the pair's packets in time order, cycling:
    `samples="packets"`, the default, through serf's latency filter; `samples="median"`: the
    pair's median RTT) and updates as serf does (`Swarm.update`, one cycle at once).
    Prediction: serf's DistanceTo, in ms; an address without a coordinate gets the family's
    global median (level `global`). `refit` places new hosts with the others held still."""

    name = "vivaldi"
    levels = ("vivaldi", "global")
    fit_first = True  # its channels sort every row: `registry.fit_baselines` fits it before the levels

    def __init__(self, config: Config | None = None, cycles: int = 1000, samples: str = "packets", seed: int = 0,
                 refit_cycles: int = 300):
        if samples not in ("packets", "median"):
            raise ValueError("samples must be 'packets' or 'median'")
        self.config = config or Config()
        self.cycles, self.samples, self.seed, self.refit_cycles = cycles, samples, seed, refit_cycles
        self.vocab = None
        self.swarm: Swarm | None = None
        self.trained = None
        self.fit_info: dict = {}
        self._global = None

    def fit(self, train: dict, shared: SharedFits | None = None) -> "Vivaldi":
        """Run on `train`; `shared` (made for this `train`) shares its codes and global median
        with the other baselines fitted on it."""
        shared = SharedFits.of(train, shared)
        self._global = GlobalMedian().fit(train, shared)
        self.vocab, s, t = shared.codes()
        return self.fit_codes(s, t, shared.rtt(), len(self.vocab),
                              np.asarray(train.get("event_time", np.zeros(len(s)))))

    def fit_codes(self, a, b, rtt_ms, n_nodes: int, order_key=None) -> "Vivaldi":
        """Run on measurements between node codes a[k], b[k] (0..n_nodes-1) of rtt_ms[k]
        (negative = failed, skipped), in `order_key` order within a pair."""
        rng = np.random.default_rng(self.seed)
        e = edges(a, b, rtt_ms, order_key, self.samples)
        self.swarm = Swarm(n_nodes, self.config, channels=len(e.node), rng=rng)
        run_cycles(self.swarm, e, self.cycles, rng)
        self.trained = np.bincount(e.node, minlength=n_nodes) > 0 if n_nodes else np.zeros(0, bool)
        rel = np.abs(self.swarm.distance(e.node, e.peer) - e.median_s) / np.maximum(e.median_s, ZERO_THRESHOLD)
        self.fit_info = {"nodes": int(n_nodes), "nodes_with_samples": int(self.trained.sum()), **e.info,
                         "cycles": int(self.cycles), "dims": int(self.config.dimensionality),
                         "sample_kind": self.samples, "resets": int(self.swarm.resets),
                         "train_median_rel_err": float(np.median(rel)) if len(rel) else None,
                         "median_node_error": float(np.median(self.swarm.error[self.trained])) if self.trained.any() else None}
        return self

    def distance(self, i, j) -> np.ndarray:
        """Predicted RTT (ms) between node codes; NaN where either is < 0 or has no coordinate."""
        i, j = np.asarray(i, np.int64), np.asarray(j, np.int64)
        ok = (i >= 0) & (j >= 0)
        ii, jj = np.where(ok, i, 0), np.where(ok, j, 0)
        if not len(self.trained):
            return np.full(len(i), np.nan)
        ok &= self.trained[ii] & self.trained[jj]
        return np.where(ok, 1000.0 * self.swarm.distance(ii, jj), np.nan)

    def codes(self, addresses) -> np.ndarray:
        return codes_in(addresses, self.vocab)

    def predict(self, test: dict):
        if self.swarm is None:
            raise RuntimeError("Vivaldi.predict before fit")
        d = self.distance(self.codes(column(test, "src")), self.codes(column(test, "dst")))
        return point_prediction(d, self._global.predict(test, scores=False), self.levels, test)

    def refit(self, new, peer, rtt_ms, n_new: int, order_key=None) -> "NewHosts":
        """Coordinates for `n_new` new hosts from their measurements to known nodes (new[k]
        measured peer code peer[k] at rtt_ms[k]), the known ones held still: each new host is a
        fresh serf client that runs `refit_cycles` rounds over its own measurements, as a node
        joining a settled cluster does."""
        n = len(self.trained)
        new = np.asarray(new, np.int64)
        peer = np.asarray(peer, np.int64)
        known = (peer >= 0) & (peer < n)
        known[known] &= self.trained[peer[known]]
        e = edges(np.where(known, new + n, -1), np.where(known, peer, -1), rtt_ms, order_key, self.samples)
        mine = e.node >= n  # only the new hosts move
        e = _Edges(e.node[mine], e.peer[mine], e.off[mine], e.cnt[mine], e.rtt_s, e.median_s[mine], e.info)
        s = Swarm(n + n_new, self.config, channels=len(e.node), rng=np.random.default_rng(self.seed + 1))
        s.vec[:n], s.error[:n], s.adjustment[:n], s.height[:n] = (self.swarm.vec, self.swarm.error,
                                                                  self.swarm.adjustment, self.swarm.height)
        run_cycles(s, e, self.refit_cycles, s.rng)
        fitted = np.bincount(e.node - n, minlength=n_new) > 0 if n_new else np.zeros(0, bool)
        return NewHosts(lambda v, p: 1000.0 * s.distance(v + n, p), fitted, self)


@dataclass
class NewHosts:
    """New hosts placed among fixed known ones (`Vivaldi.refit`, `Embedding.refit`):
    `distance(v, peer)` in ms from new host v to known node code `peer`, NaN where v could not
    be placed (no measurement to a known node) or the peer has no coordinate."""

    _dist: object
    fitted: np.ndarray
    base: object

    def distance(self, v, peer) -> np.ndarray:
        v, peer = np.asarray(v, np.int64), np.asarray(peer, np.int64)
        n = len(self.base.trained)
        ok = (v >= 0) & (v < len(self.fitted)) & (peer >= 0) & (peer < n)
        vv, pp = np.where(ok, v, 0), np.where(ok, peer, 0)
        if not len(self.fitted) or not n:
            return np.full(len(v), np.nan)
        ok &= self.fitted[vv] & self.base.trained[pp]
        return np.where(ok, self._dist(vv, pp), np.nan)
