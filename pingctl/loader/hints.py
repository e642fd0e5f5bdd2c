"""The classical estimate as evidence: a *hint* measurement in triangulation contexts (docs/loader.md,
"Hints").

A hint is the query pair (s, d) with the least-squares embedding's RTT estimate for it as its
result, no timestamp, placed just before the query. A triangulation context never holds the pair
itself, so the pair's one earlier measurement there is the estimate, which the model can learn to
refine instead of rediscovering it from the sides.

Training estimates are cross-fitted: the training pairs are cut into `folds` by a hash of the
pair (`fold_of`, the same for (s, d) and (d, s)), one embedding is fitted per fold on the other
folds' pairs, and a pair's estimate comes from the embedding that never saw it, so it is no better
on train than on a held-out pair. At answer time the embedding fitted on all of train gives the
estimate (eval: the `embedding` baseline, `embedding_refit` for an end train never saw).

The file (HINTS.npz, written by `pingctl.eval.hints.fit_hints`, read here): `keys` (n, 17) uint8,
each address's `records.layout.address_key`; `x` (folds + 1, n, dims) points; `h` (folds + 1, n) heights;
`trained` (folds + 1, n) bool (the node had a measured pair in that fit); `scale` (folds + 1,)
ms per unit. Fits 0..folds-1 are the folds'; the last is fitted on every pair, the estimate
`answer` gives (eval's `embedding` baseline is the same fit), with an end it never saw placed
from the prompt's measurements as `embedding_refit` places it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.coords import LR, MIN_RTT_MS, REFIT_STEPS, place_new
from pingctl.errors import PingctlError
from pingctl.loader.record_cache import address_keys, charge
from pingctl.loader.sequences import RecordLengths
from pingctl.records.layout import ProbeRecord, address_key
from pingctl.schema.addresses import packed_address

KEY_BYTES = 17  # `records.layout.address_key`: 16 address bytes and the family


def fold_of(a: np.ndarray, b: np.ndarray, folds: int) -> np.ndarray:
    """The fold of each pair of node codes, the same for (a, b) and (b, a): a splitmix64 hash of
    the unordered pair, so folds do not follow the vocabulary's (address) order."""
    lo = np.minimum(a, b).astype(np.uint64)
    hi = np.maximum(a, b).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = lo * np.uint64(0x9E3779B97F4A7C15) + hi + np.uint64(0x632BE59BD9B4E019)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(folds)).astype(np.int64)


@dataclass
class Hints:
    """Cross-fitted embedding estimates for training queries (module docstring). Picklable:
    Grain hands it to its workers."""

    keys: np.ndarray
    x: np.ndarray
    h: np.ndarray
    trained: np.ndarray
    scale: np.ndarray
    share: float = 1.0  # of triangulation contexts whose query has an estimate

    def __post_init__(self):
        self._code = {bytes(k): i for i, k in enumerate(np.asarray(self.keys, np.uint8))}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_code"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def folds(self) -> int:
        return int(self.x.shape[0]) - 1

    @classmethod
    def load(cls, path: Path | str, share: float = 1.0) -> "Hints":
        path = Path(path)
        if not path.is_file():
            raise PingctlError(f"{path}: no hints file there; write one with `pingctl hints SPLIT -o {path}`")
        try:
            with np.load(path) as z:
                got = {k: z[k] for k in ("keys", "x", "h", "trained", "scale")}
        except (OSError, ValueError, KeyError) as e:
            raise PingctlError(f"{path}: not a hints file ({e}); write one with `pingctl hints SPLIT -o {path}`") from None
        if got["keys"].ndim != 2 or got["keys"].shape[1] != KEY_BYTES or got["x"].ndim != 3 or len(got["x"]) < 3:
            raise PingctlError(f"{path}: not a hints file (keys {got['keys'].shape}, points {got['x'].shape})")
        return cls(**got, share=share)

    def codes(self, addr: np.ndarray, v6: np.ndarray) -> np.ndarray:
        """Node code of each address of an address table (-1: not in the fit)."""
        return self.key_codes([address_key(a, f) for a, f in zip(addr, v6)])

    def key_codes(self, keys: list[bytes]) -> np.ndarray:
        """Node code of each `address_key` (-1: not in the fit)."""
        return np.array([self._code.get(k, -1) for k in keys], np.int64)

    def estimate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Cross-fitted RTT estimate (ms) for node-code pairs: from the fold that never saw the
        pair; NaN where an end is unknown or unplaced in that fold."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        out = np.full(len(a), np.nan)
        ok = (a >= 0) & (b >= 0) & (a != b)
        f = fold_of(np.maximum(a, 0), np.maximum(b, 0), self.folds)
        aa, bb, ff = a[ok], b[ok], f[ok]
        placed = self.trained[ff, aa] & self.trained[ff, bb]
        d = np.linalg.norm(self.x[ff, aa] - self.x[ff, bb], axis=1) + self.h[ff, aa] + self.h[ff, bb]
        out[np.flatnonzero(ok)] = np.where(placed, self.scale[ff] * d, np.nan)
        return out

    def key_code(self, address: str) -> int:
        """Node code of one address string (-1: not in the fit, or not an address)."""
        packed = packed_address(address)
        return -1 if packed is None else self._code.get(address_key(np.frombuffer(packed[0], np.uint8), packed[1]), -1)

    def answer(self, src: str, dst: str, peers: list[tuple[str, str, float]] = ()) -> float:
        """The estimate (ms) an answer's prompt carries for src -> dst: the every-pair fit's
        distance; where one end has no point there, that end placed from `peers` (the prompt's
        measurements: src, dst, RTT ms; those between the new end and placed nodes), the known
        points held still; NaN where neither works."""
        full = self.folds
        x, h, placed, scale = self.x[full], self.h[full], self.trained[full], float(self.scale[full])
        a, b = self.key_code(src), self.key_code(dst)
        known = [c >= 0 and bool(placed[c]) for c in (a, b)]
        if all(known):
            return float(scale * (np.linalg.norm(x[a] - x[b]) + h[a] + h[b])) if a != b else float("nan")
        if not any(known):
            return float("nan")
        new, peer_of = (dst, a) if known[0] else (src, b)
        by_peer: dict[int, list[float]] = {}
        for s, d, r in peers:
            if r is None or not np.isfinite(r) or r < 0 or (s == new) == (d == new):
                continue
            c = self.key_code(d if s == new else s)
            if c >= 0 and placed[c]:
                by_peer.setdefault(c, []).append(float(r))
        if not by_peer:
            return float("nan")
        n = len(x)
        vb = np.array(list(by_peer), np.int64)
        med = np.array([np.median(v) for v in by_peer.values()])
        y = np.log(np.maximum(med, MIN_RTT_MS) / scale)
        # seed 1: `Embedding.refit`'s (its seed + 1) with the fit's seed 0
        xn, hn = place_new(x, h, np.full(len(vb), n), vb, y, 1, REFIT_STEPS, LR, seed=1)
        return float(scale * (np.linalg.norm(xn[n] - xn[peer_of]) + hn[n] + hn[peer_of]))

    def twin(self, rec: ProbeRecord, lengths: RecordLengths, scheme: str) -> tuple[ProbeRecord, RecordLengths] | None:
        """The record's hint twin, kept with the record (`lengths.memo`): the same measurements,
        each with its pair's estimate as a successful result, so the hint of query q is the
        twin's measurement q; None when no measurement of the record has an estimate. Where a
        pair has none its `rtt_ms` is a placeholder, never drawn (`memo["has_hint"]`)."""
        got = lengths.memo.get("hint_twin", False)
        if got is not False:
            return got
        src = self.key_codes(address_keys(rec, lengths, "src"))[rec.src_idx]
        dst = self.key_codes(address_keys(rec, lengths, "dst"))[rec.dst_idx]
        est = self.estimate(src, dst)
        have = np.isfinite(est)
        got = None
        if have.any():
            twin = ProbeRecord(rec.probe, rec.prb_id, rec.time_s, np.where(have, est, 1.0), rec.msm_id, rec.src_idx,
                               rec.dst_idx, rec.size, np.zeros_like(rec.errors), rec.src_addr, rec.src_v6,
                               rec.dst_addr, rec.dst_v6, rec.part)
            got = (twin, RecordLengths(twin, scheme, prefix=False))
            got[1].memo["has_hint"] = have
            # the arrays the twin does not share with the record
            charge(lengths, twin.rtt_ms.nbytes + twin.errors.nbytes + have.nbytes + got[1].nbytes)
        lengths.memo["hint_twin"] = got
        return got
