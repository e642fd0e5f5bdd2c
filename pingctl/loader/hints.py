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
from the prompt's measurements as `embedding_refit` places it. Optionally (files written since
2026-11-29) the pairs that fit was fitted on: `pair_a`, `pair_b` (pairs,) int32 node codes and
`pair_median` (pairs,) float64 ms, each measured pair's median RTT over the training split,
ordered by pair_a * nodes + pair_b: what `history` answers, the `time` regime's classical
estimate of an answer (`infer.combine`). Optionally (files written since 2026-11-29, with the
pairs) what the fits were fitted on (`PROVENANCE`): `fit_seed` () int64, the embeddings' seed;
`fit_rows` () int64, the training split's rows read (every row, failed ones too); `fit_settings`
(3,) float64, the embedding's steps, learning rate and least RTT (ms). With them, and with the
pairs, eval knows the last fit for its own `embedding` baseline's on the same train split and
takes it from the file instead of fitting it again (`eval.hints.embedding_with_hints`).
"""

from __future__ import annotations

import ipaddress
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.coords import LR, MIN_RTT_MS, REFIT_STEPS, place_new
from pingctl.errors import PingctlError
from pingctl.loader.record_cache import address_keys, charge
from pingctl.loader.sequences import RecordLengths
from pingctl.records.layout import ProbeRecord, address_key
from pingctl.schema.addresses import packed_address
from pingctl.schema.columns import MAX_RTT_MS
from pingctl.tokenizer.relative import scale_of_hint, to_relative

KEY_BYTES = 17  # `records.layout.address_key`: 16 address bytes and the family
# The arrays of a hints file: dtype kind, dimensions, and how `check_arrays` names them
FIELDS = {"keys": ("u", 2, "uint8 (nodes, 17)"), "x": ("f", 3, "float (fits, nodes, dims)"),
          "h": ("f", 2, "float (fits, nodes)"), "trained": ("b", 2, "bool (fits, nodes)"),
          "scale": ("f", 1, "float (fits,)")}
# The training pairs' medians: all three or none (a file written before them answers no history)
HISTORY = {"pair_a": ("i", 1, "int32 (pairs,)"), "pair_b": ("i", 1, "int32 (pairs,)"),
           "pair_median": ("f", 1, "float (pairs,)")}
# What the fits were fitted on: all three or none (a file written before them is not reused by eval)
PROVENANCE = {"fit_seed": ("i", 0, "int64 ()"), "fit_rows": ("i", 0, "int64 ()"),
              "fit_settings": ("f", 1, "float64 (3,): steps, learning rate, least RTT ms")}
# An archive cut short or overwritten fails in zipfile or zlib, a member that is no plain array
# (pickled objects, a bad header) in NumPy's reader, an empty file with EOFError
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
_ZIP = b"PK\x03\x04"  # what an .npz (a zip archive) starts with


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
    pair_a: np.ndarray | None = None  # HISTORY (module docstring); None: the file holds none
    pair_b: np.ndarray | None = None
    pair_median: np.ndarray | None = None
    fit_seed: np.ndarray | None = None  # PROVENANCE (module docstring); None: the file holds none
    fit_rows: np.ndarray | None = None
    fit_settings: np.ndarray | None = None
    path: str | None = None  # the file it was read from (`load`)

    def __post_init__(self):
        self._code = {bytes(k): i for i, k in enumerate(np.asarray(self.keys, np.uint8))}
        self._pair_key = (None if self.pair_a is None else
                          np.asarray(self.pair_a, np.int64) * len(self.keys) + np.asarray(self.pair_b, np.int64))

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_code", "_pair_key")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def folds(self) -> int:
        return int(self.x.shape[0]) - 1

    @classmethod
    def load(cls, path: Path | str, share: float = 1.0) -> "Hints":
        """Read and check a hints file: a damaged one (cut short, empty, not an archive, arrays
        missing, of the wrong type or of disagreeing sizes, values no fit writes) is a
        PingctlError naming the file and the array, never an IndexError or an estimate nobody
        could measure (`check_arrays`)."""
        path = Path(path)
        if not path.is_file():
            raise PingctlError(f"{path}: no hints file there; write one with `pingctl hints SPLIT -o {path}`")
        got = _read(path)
        check_arrays(path, got)
        return cls(**got, share=share, path=str(path))

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

    def histories(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The training split's median RTT (ms) of each node-code pair (a -> b); NaN where the
        pair was not measured there or the file keeps no pairs."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        out = np.full(len(a), np.nan)
        if self._pair_key is None or not len(self._pair_key):
            return out
        ok = (a >= 0) & (b >= 0)
        key = np.where(ok, a * len(self.keys) + b, -1)
        at = np.minimum(np.searchsorted(self._pair_key, key), len(self._pair_key) - 1)
        found = ok & (self._pair_key[at] == key)
        out[found] = self.pair_median[at[found]]
        return out

    def history(self, src: str, dst: str) -> float:
        """`histories` of one pair of address strings."""
        return float(self.histories(np.array([self.key_code(src)]), np.array([self.key_code(dst)]))[0])

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

    def relative_twin(self, rec: ProbeRecord, lengths: RecordLengths, scheme: str
                      ) -> tuple[ProbeRecord, RecordLengths] | None:
        """The record's relative twin, kept with the record (`lengths.memo`): the same
        measurements, each successful RTT divided by its pair's hint as the hint shows it
        (`tokenizer.relative`), so a hinted query is the twin's measurement q
        (`loader.relative_target`); failures stay failures, a pair without a hint keeps its RTT
        (never drawn as a hinted query). None where the record has no hint twin."""
        got = lengths.memo.get("relative_twin", False)
        if got is not False:
            return got
        hinted = self.twin(rec, lengths, scheme)
        got = None
        if hinted is not None:
            twin, tl = hinted
            scale = np.where(tl.memo["has_hint"], scale_of_hint(twin.rtt_ms), np.nan)
            rel = ProbeRecord(rec.probe, rec.prb_id, rec.time_s, to_relative(rec.rtt_ms, scale), rec.msm_id,
                              rec.src_idx, rec.dst_idx, rec.size, rec.errors, rec.src_addr, rec.src_v6, rec.dst_addr,
                              rec.dst_v6, rec.part)
            got = (rel, RecordLengths(rel, scheme, prefix=False))
            charge(lengths, rel.rtt_ms.nbytes + got[1].nbytes)
        lengths.memo["relative_twin"] = got
        return got


def _again(path: Path) -> str:
    return f"write it again with `pingctl hints SPLIT -o {path}`"


def _read(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a hints file, each read whole, so a member cut short fails here and not in
    an answer."""
    with open(path, "rb") as f:
        head = f.read(len(_ZIP))
    if head != _ZIP:  # NumPy would try the rest as a pickle and say so, which helps nobody here
        what = "empty" if not head else f"starts with {head!r}"
        raise PingctlError(f"{path}: not a hints file (not a NumPy .npz archive: {what}); {_again(path)}")
    try:
        z = np.load(path, allow_pickle=False)
    except _UNREADABLE as e:
        raise PingctlError(f"{path}: not a hints file (a damaged .npz archive: {e}); {_again(path)}") from None
    with z:
        missing = [k for k in FIELDS if k not in z.files]
        if missing:
            held = ", ".join(z.files[:10]) + (", ..." if len(z.files) > 10 else "")
            raise PingctlError(f"{path}: not a hints file (no array {', '.join(missing)}; it holds "
                               f"{held or 'none'}); {_again(path)}")
        got, optional = {}, []
        for group in (HISTORY, PROVENANCE):
            held = [k for k in group if k in z.files]
            if held and len(held) != len(group):
                raise PingctlError(f"{path}: not a hints file (it holds {', '.join(held)} without "
                                   f"{', '.join(k for k in group if k not in held)}); {_again(path)}")
            optional += held
        for k in [*FIELDS, *optional]:
            try:
                got[k] = z[k]
            except _UNREADABLE as e:
                raise PingctlError(f"{path}: array {k} cannot be read, the file is damaged ({e}); "
                                   f"{_again(path)}") from None
    return got


def check_arrays(path: Path | str, a: dict[str, np.ndarray]) -> None:
    """Refuse (PingctlError naming the file and the array) what `fit_hints` never writes: a
    dtype or shape of `FIELDS`, arrays that disagree on the fits (folds + 1, at least 3) or the
    nodes, non-finite points, heights or scales, a negative height, a scale <= 0, an address
    twice, or a fit whose estimates could pass MAX_RTT_MS, the largest RTT a measurement holds.
    Every estimate is scale * (distance + two heights), so a fit's largest is at most
    scale * 2 * (the farthest placed point from their centre + the largest placed height): one
    pass over the points bounds what every pair (n^2 of them) would."""
    def bad(name: str, why: str) -> PingctlError:
        return PingctlError(f"{path}: array {name} {why}; {_again(path)}")

    for name, (kind, ndim, want) in FIELDS.items():
        arr = a[name]
        if arr.dtype.kind != kind or (kind == "u" and arr.dtype != np.uint8) or arr.ndim != ndim:
            raise bad(name, f"is {arr.dtype} of shape {arr.shape}, where a hints file has {want}")
    keys, x, h, trained, scale = (a[k] for k in FIELDS)
    fits, n = len(x), len(keys)
    if keys.shape[1] != KEY_BYTES:
        raise bad("keys", f"has rows of {keys.shape[1]} bytes, where an address key has {KEY_BYTES}")
    if fits < 3:
        raise bad("x", f"holds {fits} fit(s), where a hints file has folds + 1, at least 3")
    shapes = {"x": (fits, n, x.shape[2]), "h": (fits, n), "trained": (fits, n), "scale": (fits,)}
    for name, want in shapes.items():
        if a[name].shape != want:
            raise bad(name, f"has shape {a[name].shape}, where {n:,} keys and {fits} fits make it {want}")
    for name in ("x", "h", "scale"):
        off = ~np.isfinite(a[name])
        if off.any():
            first = tuple(int(i) for i in np.unravel_index(np.argmax(off), off.shape))
            raise bad(name, f"holds {int(off.sum()):,} non-finite values (NaN or infinity) of {off.size:,}, the "
                            f"first at {first}")
    for name, arr, low, what, why in (
            ("h", h, h < 0, "below 0", "a height adds to every estimate of its node"),
            ("scale", scale, scale <= 0, "at or below 0", "a fit's ms per unit is positive")):
        if low.any():
            first = tuple(int(i) for i in np.unravel_index(np.argmax(low), low.shape))
            raise bad(name, f"holds {int(low.sum()):,} value(s) {what}, the first {arr[first]:g} at {first}: {why}, "
                            "and no RTT is negative")
    _check_reach(bad, x, h, trained, scale)
    _check_unique(bad, keys)
    if "pair_a" in a:
        _check_history(bad, a, n)
    if "fit_seed" in a:
        _check_provenance(bad, a)


def _check_history(bad, a: dict[str, np.ndarray], n: int) -> None:
    """The training pairs' medians as `fit_hints` writes them: as many of each, codes of two
    different known nodes, strictly ordered by pair_a * n + pair_b, medians RTTs can be."""
    for name, (kind, ndim, want) in HISTORY.items():
        arr = a[name]
        if arr.dtype.kind != kind or arr.ndim != ndim:
            raise bad(name, f"is {arr.dtype} of shape {arr.shape}, where a hints file has {want}")
    pa_, pb_, med = (a[k] for k in HISTORY)
    if not len(pa_) == len(pb_) == len(med):
        raise bad("pair_median", f"holds {len(med):,} medians for {len(pa_):,} pair_a and {len(pb_):,} pair_b codes")
    for name, c in (("pair_a", pa_), ("pair_b", pb_)):
        off = (c < 0) | (c >= n)
        if off.any():
            i = int(np.argmax(off))
            raise bad(name, f"holds code {int(c[i])} at {i}, where the file has {n:,} nodes")
    same = pa_ == pb_
    if same.any():
        raise bad("pair_b", f"names node {int(pb_[np.argmax(same)])} as both ends of pair {int(np.argmax(same))}")
    key = pa_.astype(np.int64) * n + pb_
    down = np.flatnonzero(key[1:] <= key[:-1])
    if len(down):
        raise bad("pair_a", f"is not in strictly increasing pair order at {int(down[0]) + 1} (a pair twice, or unsorted)")
    off = ~((med >= 0) & (med <= MAX_RTT_MS))
    if off.any():
        i = int(np.argmax(off))
        raise bad("pair_median", f"holds {float(med[i])!r} at {i}, where a median RTT is between 0 and {MAX_RTT_MS:,.0f} ms")


def _check_provenance(bad, a: dict[str, np.ndarray]) -> None:
    """What the fits were fitted on as `fit_hints` writes it: a seed and a row count of at least
    0, three finite settings."""
    for name, (kind, ndim, want) in PROVENANCE.items():
        arr = a[name]
        if arr.dtype.kind != kind or arr.ndim != ndim or (ndim and arr.shape != (3,)):
            raise bad(name, f"is {arr.dtype} of shape {arr.shape}, where a hints file has {want}")
    for name in ("fit_seed", "fit_rows"):
        if int(a[name]) < 0:
            raise bad(name, f"is {int(a[name])}, where a hints file has a count or seed of at least 0")
    if not np.isfinite(a["fit_settings"]).all():
        raise bad("fit_settings", f"holds {a['fit_settings'].tolist()}, where a hints file has finite settings")


def _check_reach(bad, x: np.ndarray, h: np.ndarray, trained: np.ndarray, scale: np.ndarray) -> None:
    with np.errstate(over="ignore", invalid="ignore"):  # a huge point's norm is inf, and refused
        placed = trained[..., None]
        centre = (x * placed).sum(axis=1) / np.maximum(trained.sum(axis=1), 1)[:, None]
        radius = np.where(trained, np.linalg.norm(x - centre[:, None, :], axis=2), 0.0).max(axis=1, initial=0.0)
        height = np.where(trained, h, 0.0).max(axis=1, initial=0.0)
        reach = 2.0 * scale * (radius + height)
    over = ~(reach <= MAX_RTT_MS)
    if over.any():
        f = int(np.argmax(over))
        name = "scale" if scale[f] > MAX_RTT_MS else "x" if radius[f] >= height[f] else "h"
        raise bad(name, f"puts fit {f}'s estimates up to {reach[f]:.4g} ms (scale {scale[f]:.4g} ms x 2 x (point "
                        f"{radius[f]:.4g} from the centre + height {height[f]:.4g})), above {MAX_RTT_MS:,.0f} ms "
                        "(50.9 days), the largest RTT a measurement may hold")


def _check_unique(bad, keys: np.ndarray) -> None:
    if len(keys) < 2:
        return
    rows = np.ascontiguousarray(keys).view(f"V{KEY_BYTES}").ravel()
    order = np.argsort(rows, kind="stable")
    same = np.flatnonzero(rows[order][1:] == rows[order][:-1])
    if len(same):
        i, j = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        k = keys[i]
        text = ipaddress.ip_address(bytes(k[:16]) if k[16] else bytes(k[:4]))
        raise bad("keys", f"holds address {text} twice (rows {i} and {j}), so one of its points would never be read")
