"""Fitting the combined answer on val (docs/eval.md, "The combined answer"), and scoring it.

Per regime, the model's CDF is pooled with a log-normal around the classical estimate an answer
can compute (`infer.combine.CLASSICAL_OF_REGIME`): w * F_model + (1 - w) * F_classical. Its
spread is a multiple of the robust spread of log(actual / estimate) on val and w > 0 only where
val vouches for it: the (spread, weight) whose CRPS gain over the classical pool has the highest
lower bound, bootstrapped over the units the regime generalises across, among the pools whose
median relative error on val is no worse than the classical answer's (`vouched`). The CRPS of
a pool is quadratic in w,
    CRPS(w) = w^2 A + 2 w (1 - w) B + (1 - w)^2 C,
with A and C the two CRPS and B their cross term, so three integrals per val packet price
every weight. Only val enters the fit; the test split is scored with the fitted weights.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from pingctl.artifacts.run import is_run_dir, latest_step
from pingctl.artifacts.table import take
from pingctl.atomic import unwritable_reason
from pingctl.eval.baselines import refit_prediction
from pingctl.eval.model import QS, _reads
from pingctl.eval.registry import REGISTRY, candidates
from pingctl.eval.report import add_predictor, compare
from pingctl.infer import calibration as CAL, combine as CB

COMBINED = "combined"  # its predictor name in a report
WEIGHTS = np.round(np.linspace(0.0, 1.0, 21), 2)
MAD_SCALE = 1.4826  # a normal's standard deviation from its median absolute deviation
# Spreads tried, as multiples of the MAD one: errors of a classical estimate have heavier tails
# than a log-normal of the MAD spread, and the pool is scored by CRPS, which weighs the tails.
SPREADS = (1.0, 1.5, 2.0, 3.0, 4.0)
MIN_PACKETS = 10  # successful val packets with an estimate below which the model is kept alone
# The unit a regime's test questions are new in: a weight must hold on units val never held, so
# its evidence is counted in them (a weight fitted on val packets of two destinations is a fit
# to those two). Time asks known pairs later, so its unit is the pair.
UNIT_OF_REGIME = {"time": "pair", "pair": "pair", "probe": "src", "target": "dst"}
MIN_UNITS = 5  # below this many units no bootstrap bound means anything: the classical pool answers
BOOTSTRAP = 2000
LOWER = 0.05  # the one-sided bound a weight's gain must clear: 95% over resampled units
# `pooled`: the held-out regimes' weight vouched for by their val sets together (`weight_group`)
WEIGHT_FITS = ("own", "pooled")
CHUNK = 32  # packets per vectorised CRPS pass: 3 arrays of CHUNK x 65536 float64


def spread(estimate, actual) -> float | None:
    """1.4826 * median |log(actual / estimate)| over successful packets with an estimate: the
    spread of a log-normal centred on the estimate (bias included, as an answer sees it)."""
    e, a = np.asarray(estimate, np.float64), np.asarray(actual, np.float64)
    ok = np.isfinite(e) & (e > 0) & np.isfinite(a) & (a > 0)
    if not ok.any():
        return None
    return float(MAD_SCALE * np.median(np.abs(np.log(a[ok] / e[ok]))))


def crps_terms(dists: list, estimate, log_sigma: float, actual) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per packet (A, B, C): the model's CRPS, the cross term and the classical CRPS (ms), exact
    for the step CDFs on the model's code grid (as `metrics.crps_distribution`). NaN for failed
    packets; B and C are A where there is no estimate (the answer is then the model's)."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(estimate, np.float64)
    n = len(dists)
    out = np.full((3, n), np.nan)
    if not n:
        return out[0], out[1], out[2]
    v = dists[0].values_ms
    for lo in range(0, n, CHUNK):
        ks = np.arange(lo, min(lo + CHUNK, n))
        ks = ks[np.isfinite(a[ks]) & (a[ks] >= 0)]
        if not len(ks):
            continue
        fm = np.minimum(np.stack([dists[k].cumulative for k in ks]), 1.0)
        has = np.isfinite(e[ks]) & (e[ks] > 0)
        fc = CB.classical_cdf(v[None, :], np.where(has, e[ks], 1.0)[:, None], log_sigma)
        fc[~has] = fm[~has]
        out[:, ks] = _integrals(v, fm, fc, a[ks])
    return out[0], out[1], out[2]


def _integrals(v: np.ndarray, fm: np.ndarray, fc: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∫(Fm-H)^2, ∫(Fm-H)(Fc-H), ∫(Fc-H)^2 with H the step at y: both CDFs are constant on
    [v_i, v_i+1), 0 below the grid and 1 above it, so each integral is a sum over the cells
    of the parts below and above y."""
    width = np.diff(v)[None, :]
    below = np.clip(y[:, None] - v[None, :-1], 0.0, width)
    above = width - below
    m, c = fm[:, :-1], fc[:, :-1]
    tails = np.maximum(v[0] - y, 0.0) + np.maximum(y - v[-1], 0.0)  # F=0 under H=1, F=1 under H=0
    return np.stack([(m * m * below + (1 - m) ** 2 * above).sum(1) + tails,
                     (m * c * below + (1 - m) * (1 - c) * above).sum(1) + tails,
                     (c * c * below + (1 - c) ** 2 * above).sum(1) + tails])


def fit_regime(dists: list, estimate, actual, classical: str | None) -> CB.RegimeFit:
    """One regime's RegimeFit from its val packets' distributions and classical estimates."""
    return fit_terms(terms(dists, estimate, actual), classical)


def terms(dists: list, estimate, actual) -> dict:
    """What a fit needs of val packets with one kind of estimate, the distributions read once:
    the spreads tried (`SPREADS` times the MAD spread), the CRPS terms at each (`crps_terms`)
    and the packet counts."""
    est, act = np.asarray(estimate, np.float64), np.asarray(actual, np.float64)
    ok = np.isfinite(act) & (act >= 0)
    sigma = spread(est, act)
    usable = int((ok & np.isfinite(est) & (est > 0)).sum())
    if sigma is None or usable < MIN_PACKETS:
        est = np.full(len(act), np.nan)  # too few to fit on: the model alone
    sigmas = [max(sigma or 0.0, CB.MIN_LOG_SIGMA) * k for k in SPREADS]
    tried = [crps_terms(dists, est, sg, act) for sg in sigmas]
    return {"sigmas": sigmas, "usable": usable, "n_val": int(ok.sum()), "tried": tried,
            "rel_err": pool_rel_errs(dists, est, sigmas, act)}


def pool_rel_errs(dists: list, estimate, sigmas, actual) -> np.ndarray:
    """Each packet's relative error |median - actual| / actual under every pool (packets x
    spreads x weights; NaN for a failed packet), the median read as `RttDistribution.quantile`
    reads it: the first code whose pooled CDF reaches 0.5, found by bisection on the codes, so
    no pool's CDF is built. The model's median where there is no estimate."""
    a, e = np.asarray(actual, np.float64), np.asarray(estimate, np.float64)
    out = np.full((len(dists), len(sigmas), len(WEIGHTS)), np.nan)
    if not dists:
        return out
    v = dists[0].values_ms
    m = len(v)
    w = WEIGHTS[None, None, :]
    sg = np.asarray(sigmas, np.float64)[None, :, None]
    for lo_k in range(0, len(dists), CHUNK):
        ks = np.arange(lo_k, min(lo_k + CHUNK, len(dists)))
        fm = np.minimum(np.stack([dists[k].cumulative for k in ks]), 1.0)
        has = (np.isfinite(e[ks]) & (e[ks] > 0))[:, None, None]
        est = np.where(has, e[ks][:, None, None], 1.0)
        lo = np.zeros((len(ks), len(sigmas), len(WEIGHTS)), np.int64)
        hi = np.full_like(lo, m - 1)
        rows = np.arange(len(ks))[:, None, None]
        while (lo < hi).any():
            mid = (lo + hi) // 2
            f_m = fm[rows, mid]
            f_c = np.where(mid == m - 1, 1.0, CB.lognormal_cdf(v[mid], est, sg))
            f = np.where(has, w * f_m + (1 - w) * f_c, f_m)
            hi, lo = np.where(f >= 0.5, mid, hi), np.where(f >= 0.5, lo, mid + 1)
        y = a[ks][:, None, None]
        out[ks] = np.where((y > 0) & np.isfinite(y), np.abs(v[lo] - y) / np.where(y > 0, y, 1.0), np.nan)
    return out


def fit_terms(t: dict, classical: str | None, units=None, unit: str = "packet", seed: int = 0) -> CB.RegimeFit:
    """The spread and weight val vouches for (`vouched`; `units`: each val packet's `unit`, None:
    each packet its own), and the mean CRPS on val (ms) of the model, of the classical pool at
    its best spread and of the pool chosen, with the evidence for its weight."""
    if t["usable"] < MIN_PACKETS:
        return _model_alone(t, classical)
    crps, u, rel_err = _val_pools(t, units)
    rel = _median_over_packets(rel_err)
    s, w, evidence = vouched(crps, u, seed, rel)
    return _regime_fit(t, classical, crps, rel, s, w, {"unit": unit, **evidence})


def fit_terms_together(ts: dict, classical: dict, units: dict, unit: dict, seed: int = 0) -> dict[str, CB.RegimeFit]:
    """One spread multiple and one weight for several regimes (`ts`: regime -> its `terms`),
    vouched for by their val packets together, each regime's units kept apart: a held-out
    regime's val set holds few of the hosts it holds out (one destination, two probes), too few
    to vouch for a weight alone, while what the held-out regimes share, an end the model never
    saw, is what the weight is for. Each regime keeps its own estimate's spread; a regime with
    too few usable packets answers with the model alone, as `fit_terms`."""
    out = {r: _model_alone(t, classical[r]) for r, t in ts.items() if t["usable"] < MIN_PACKETS}
    parts = {r: _val_pools(t, units.get(r)) for r, t in ts.items() if r not in out}
    if not parts:
        return out
    offset, crps, us, rels = 0, [], [], []
    for c, u, rel_err in parts.values():
        _, inv = np.unique(u, return_inverse=True)
        crps.append(c), us.append(inv + offset), rels.append(rel_err)
        offset += int(inv.max()) + 1 if len(inv) else 0
    pooled_rel = _median_over_packets(np.concatenate(rels))
    s, w, evidence = vouched(np.concatenate(crps), np.concatenate(us), seed, pooled_rel)
    for r, (c, _, rel_err) in parts.items():
        out[r] = _regime_fit(ts[r], classical[r], c, _median_over_packets(rel_err), s, w,
                             {"unit": unit[r], **evidence, "spread0": int(np.argmin(c.mean(axis=0)[:, 0])),
                              "vouched_with": sorted(parts)})
    return out


def _model_alone(t: dict, classical: str | None) -> CB.RegimeFit:
    a = t["tried"][0][0]
    m = float(np.nanmean(a)) if np.isfinite(a).any() else None
    return CB.RegimeFit(classical, 1.0, t["sigmas"][0], t["n_val"], {"model": m, "classical": None, "combined": m})


def _val_pools(t: dict, units) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packets x spreads x weights CRPS, each packet's unit, its pools' relative errors) of the
    val packets every pool scores."""
    crps = np.stack([pool_crps(*abc) for abc in t["tried"]], axis=1)  # packets x spreads x weights
    ok = np.isfinite(crps).all(axis=(1, 2))
    u = np.arange(len(crps)) if units is None else np.asarray(units)
    return crps[ok], u[ok], t["rel_err"][ok]


def _regime_fit(t: dict, classical: str | None, crps: np.ndarray, rel: np.ndarray, s: int, w: int,
                evidence: dict) -> CB.RegimeFit:
    """`crps`: the packets `_val_pools` kept; at w = 1 every pool is the model's own CRPS."""
    mean = crps.mean(axis=0)
    s0 = evidence.pop("spread0")
    return CB.RegimeFit(classical, float(WEIGHTS[w]), t["sigmas"][s], t["n_val"],
                        {"model": float(crps[:, 0, -1].mean()), "classical": float(mean[s0, 0]), "combined": float(mean[s, w]),
                         **evidence, "median_rel_err": {"classical": _num(rel[s0, 0]), "combined": _num(rel[s, w])}})


def _median_over_packets(rel: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.nanmedian(rel, axis=0) if len(rel) and np.isfinite(rel).any() else np.full(rel.shape[1:], np.nan)


def _num(x) -> float | None:
    return float(x) if np.isfinite(x) else None


def pool_crps(a, b, c) -> np.ndarray:
    """Each packet's CRPS (ms) under every WEIGHTS pool: packets x weights."""
    w = WEIGHTS[None, :]
    a, b, c = (np.asarray(x, np.float64)[:, None] for x in (a, b, c))
    return w ** 2 * a + 2 * w * (1 - w) * b + (1 - w) ** 2 * c


def vouched(crps: np.ndarray, units: np.ndarray, seed: int = 0, rel_err: np.ndarray | None = None
            ) -> tuple[int, int, dict]:
    """(spread index, weight index, the evidence) from val packets' pooled CRPS (packets x
    spreads x weights): against the classical pool at its best spread, each (spread, weight)'s
    mean gain is bootstrapped over `units` (resampled whole, `BOOTSTRAP` times) and the one with
    the highest `LOWER` bound is taken, where that bound is above 0; else the classical pool
    (w = 0). A weight the mean alone prefers, won on a few units, so goes back to 0, and one
    that holds across units keeps most of its gain. Fewer than `MIN_UNITS` units: w = 0.
    `rel_err` (spreads x weights, the pools' median relative errors on the same packets): a
    pool whose median answer is further off than the classical one's is not taken, whatever its
    CRPS (a linear pool of a sharp estimate and a broad model can gain CRPS from its tails while
    its median drifts toward the model's)."""
    n, spreads, weights = crps.shape
    mean = crps.mean(axis=0)
    s0 = int(np.argmin(mean[:, 0]))
    _, unit = np.unique(units, return_inverse=True)
    k = int(unit.max()) + 1 if n else 0
    evidence = {"spread0": s0, "units": k, "gain_low": 0.0,
                "min_crps_weight": float(WEIGHTS[np.unravel_index(np.argmin(mean), mean.shape)[1]]) if n else None}
    if k < MIN_UNITS:
        return s0, 0, evidence
    gain = (crps[:, s0, 0][:, None, None] - crps).reshape(n, -1)
    per_unit = np.zeros((k, gain.shape[1]))
    np.add.at(per_unit, unit, gain)
    counts = np.bincount(unit, minlength=k).astype(np.float64)
    draws = np.random.default_rng(seed).multinomial(k, np.full(k, 1.0 / k), size=BOOTSTRAP).astype(np.float64)
    low = np.quantile((draws @ per_unit) / (draws @ counts)[:, None], LOWER, axis=0).reshape(spreads, weights)
    low[:, 0] = -np.inf  # w = 0 at another spread is not a gain the model brings
    if rel_err is not None:
        low[~(rel_err <= rel_err[s0, 0])] = -np.inf
    s, w = np.unravel_index(int(np.argmax(low)), low.shape)
    if not low[s, w] > 0:
        return s0, 0, evidence
    return int(s), int(w), {**evidence, "gain_low": float(low[s, w])}


def val_record(pred: dict, split: dict, idx: np.ndarray, fitted: dict, policies: dict, seed: int) -> dict:
    """What the fit keeps of one val set asked as `pred` (`eval.model.predict`, with its
    "dists"): `terms` for every estimate (`val_estimates`; the baselines: `every_candidate` of
    the regimes' `policies`), so the distributions can go."""
    actual = np.asarray(split["rtt"], np.float64)[idx]
    ests = val_estimates(pred, split, idx, fitted, every_candidate(policies), seed)
    return {"terms": {name: terms(pred["dists"], e, actual) for name, e in ests.items()},
            "estimates": ests, "at_actual": at_actual(pred["dists"], actual), "units": units_of(split, idx)}


def units_of(split: dict, idx: np.ndarray) -> dict:
    """Each packet's source, destination and pair as small integers (`UNIT_OF_REGIME`'s units)."""
    src, dst = np.asarray(split["src"], object)[idx], np.asarray(split["dst"], object)[idx]
    s, d = np.unique(src.astype(str), return_inverse=True)[1], np.unique(dst.astype(str), return_inverse=True)[1]
    return {"src": s, "dst": d, "pair": s * (int(d.max()) + 1 if len(d) else 1) + d}


def at_actual(dists: list, actual) -> dict:
    """What a pool's PIT needs of each packet's model distribution, so the distributions can go:
    the model's CDF at the actual RTT (`RttDistribution.cdf`, NaN for a failed packet), the
    code the CDF is read at (its value; NaN below the grid) and whether that is the last code."""
    a = np.asarray(actual, np.float64)
    n = len(dists)
    out = {"model": np.full(n, np.nan), "code_ms": np.full(n, np.nan), "last": np.zeros(n, bool)}
    for k, d in enumerate(dists):
        if not (np.isfinite(a[k]) and a[k] >= 0):
            continue
        i = int(np.searchsorted(d.values_ms, a[k], side="right")) - 1
        out["model"][k] = float(np.minimum(d.cumulative[i], 1.0)) if i >= 0 else 0.0
        out["code_ms"][k] = d.values_ms[i] if i >= 0 else np.nan
        out["last"][k] = i == len(d.values_ms) - 1
    return out


def pooled_pit(at: dict, estimate, fit: CB.RegimeFit) -> np.ndarray:
    """The PIT of each packet under `CB.pool(dist, estimate, fit)` without the map, read as
    `RttDistribution.cdf` reads it: the pooled CDF at the code at or below the actual RTT. NaN
    where there is no estimate (the model answers there, unmapped) or the packet failed."""
    e = np.asarray(estimate, np.float64)
    use = np.isfinite(e) & (e > 0)
    code = np.where(np.isfinite(at["code_ms"]), at["code_ms"], 1.0)
    fc = CB.lognormal_cdf(code, np.where(use, e, 1.0), fit.log_sigma)
    fc = np.where(at["last"], 1.0, np.where(np.isfinite(at["code_ms"]), fc, 0.0))
    w = min(float(fit.weight), 1.0)
    return np.where(use, w * at["model"] + (1.0 - w) * fc, np.nan)


def with_recalibration(fit: CB.RegimeFit, rec: dict, name: str) -> CB.RegimeFit:
    """`fit` recalibrated on the same val packets, in two moves: the classical spread widened
    to the least of `WIDEN` that holds 90% of them in the pool's central 90% (a PIT map alone
    cannot mend a pool so sharp that far misses read 0 or 1 to double precision: their PITs tie),
    then the map H from the pool's PITs (`infer.calibration.fit`) for what is left, skew and
    bias included. The weight stays the CRPS fit's. The fit unchanged where val has too few packets."""
    at, est = rec["at_actual"], rec["estimates"][name]
    pit = pooled_pit(at, est, fit)
    if int(np.isfinite(pit).sum()) < CAL.MIN_PACKETS:
        return fit
    raw = cov90_of_pit(pit)
    widened, factor = fit, 1.0
    if fit.weight < 1.0:
        for factor in WIDEN:
            widened = dataclasses.replace(fit, log_sigma=fit.log_sigma * factor)
            pit = pooled_pit(at, est, widened)
            if cov90_of_pit(pit) >= 0.9:
                break
    cal = CAL.Calibration(median_kept(CAL.fit(pit, {}).knots), {})
    cov = {"raw": raw, "spread_factor": float(factor), "recalibrated": cov90_of_pit(cal.level(pit))}
    return dataclasses.replace(widened, recal=tuple(float(x) for x in cal.knots), cov90_val=cov)


def median_kept(knots: np.ndarray) -> np.ndarray:
    """The map's knots with its middle one moved to 0.5 (each half scaled to keep its shape), so
    the recalibrated pool's median is the pool's: the map mends the intervals, not the answer's
    median. A map fitted on val moves the median to val's median PIT, which where val holds a
    few hosts is their bias, not the next questions'; and the median is what `vouched` checked."""
    k = np.asarray(knots, np.float64).copy()
    mid = int(np.flatnonzero(np.isclose(CAL.GRID, 0.5))[0])
    m = k[mid]
    if not 0.0 < m < 1.0:
        return k
    k[:mid] *= 0.5 / m
    k[mid + 1:] = 0.5 + (k[mid + 1:] - m) * (0.5 / (1.0 - m))
    k[mid] = 0.5
    return k


WIDEN = np.geomspace(1.0, 16.0, 49)  # spread factors tried by recalibration, ~6% apart


def cov90_of_pit(pit) -> float | None:
    """The share of successful packets whose PIT lies in the central 90% [0.05, 0.95]."""
    u = np.asarray(pit, np.float64)
    u = u[np.isfinite(u)]
    return float(((u >= 0.05) & (u <= 0.95)).mean()) if len(u) else None


def val_estimates(pred: dict, split: dict, idx: np.ndarray, fitted: dict, names, seed: int) -> dict:
    """The classical estimates of val packets `idx` (asked as `pred`, `eval.model.predict`):
    `pair_median` (`pair_estimate_of`), `hint` (the prompt's hint, where it carries one) and
    each baseline of `names` (for a run without hints: the regime's best)."""
    out = {"pair_median": pair_estimate_of(pred)}
    if pred.get("hints") is not None:
        out["hint"] = np.asarray(pred["hints"], np.float64)
    sub = take(split, idx)
    glob = fitted["global_median"].predict(sub)
    for name in names:
        if name in out:
            continue
        spec = REGISTRY.get(name)
        if name in fitted:
            out[name] = fitted[name].predict(sub).median
        elif spec is not None and spec.factory is not None and spec.reads_prompt:
            out[name] = spec.factory(seed, 0).predict(pred["pool"], sub, pred["contexts"], glob).median
        elif spec is not None and spec.refit_of in fitted:
            out[name] = refit_prediction(fitted[spec.refit_of], pred["pool"], sub, pred["contexts"], glob).median
    return out


def pair_estimate_of(pred: dict) -> np.ndarray:
    """The answer's `pair_median` of each packet asked as `pred`: its pair's training history
    where the run's hints keep it (`pred["pair_history"]`, `history_of`), else the median of
    its packets in the prompt (`infer.combine.pair_estimate`, as every answer takes it)."""
    prompt = np.asarray(pred["context_median"]["median"], np.float64)
    return CB.pair_estimate(pred.get("pair_history", np.full(len(prompt), np.nan)), prompt)


def history_of(hints, split: dict, idx: np.ndarray) -> np.ndarray:
    """Each packet's pair median over the run's training split, from the run's hints file
    (`loader.hints.Hints.histories`); NaN without hints or where the pair is not there."""
    if hints is None:
        return np.full(len(idx), np.nan)
    src, dst = np.asarray(split["src"], object)[idx], np.asarray(split["dst"], object)[idx]
    uniq, inv = np.unique(np.concatenate([src, dst]).astype(str), return_inverse=True)
    codes = np.array([hints.key_code(a) for a in uniq], np.int64)[inv]
    return hints.histories(codes[:len(idx)], codes[len(idx):])


def estimate_name(regime: str, estimates: dict, best: str) -> tuple[str, str | None]:
    """(the estimate eval pools with, the classical an answer pools with or None): the answer's
    own where the prompts give it, else the regime's best classical (eval only)."""
    own = CB.CLASSICAL_OF_REGIME[regime]
    return (own, own) if own in estimates else (best, None)


def fit_val(records: dict, choice: dict, together: tuple = ()) -> dict[str, tuple[str, CB.RegimeFit]]:
    """Per regime with val packets, (the estimate eval pools with, its RegimeFit, classical the
    estimate's name). `records[regime]`: its val set's `val_record`; `together`: regimes whose
    spread multiple and weight are vouched for by their val sets together (`fit_terms_together`)."""
    found = {}
    for regime, rec in records.items():
        name, _ = estimate_name(regime, rec["terms"], choice[regime]["best"])
        if name in rec["terms"]:
            unit = UNIT_OF_REGIME[regime]
            units = (rec.get("units") or {}).get(unit)
            found[regime] = (name, rec["terms"][name], units, unit if units is not None else "packet")
    pooled = [r for r in together if r in found]
    fits = {r: fit_terms(t, name, units, unit) for r, (name, t, units, unit) in found.items()
            if len(pooled) < 2 or r not in pooled}
    if len(pooled) > 1:
        fits |= fit_terms_together({r: found[r][1] for r in pooled}, {r: found[r][0] for r in pooled},
                                   {r: found[r][2] for r in pooled}, {r: found[r][3] for r in pooled})
    return {r: (found[r][0], with_recalibration(fits[r], records[r], found[r][0])) for r in found}


def weight_group(val_dirs: dict, prompts: dict, weights: str) -> tuple[str, ...]:
    """The held-out regimes whose weight `pooled` fits together: those asked on val sets of
    their own (not the time regime's) with the same prompts, as `regimes.map_groups` pools
    their recalibration map; `own`: none."""
    if weights not in WEIGHT_FITS:
        raise ValueError(f"weights {weights!r}: expected one of {', '.join(WEIGHT_FITS)}")
    own = [r for r in ("pair", "probe", "target") if r in val_dirs and val_dirs[r] != val_dirs.get("time")]
    if weights == "own" or len(own) < 2 or any(prompts[r] != prompts[own[0]] for r in own):
        return ()
    return tuple(own)


def to_combination(fits: dict, meta: dict) -> CB.Combination:
    """The file answers read: regimes whose estimate no answer can compute get classical None."""
    regimes = {r: dataclasses.replace(f, classical=name if name in CB.CLASSICALS else None)
               for r, (name, f) in fits.items()}
    return CB.Combination(regimes, meta)


def combined_reads(dists: list, estimate, fit: CB.RegimeFit, actual) -> dict:
    """The reads the report takes from the pooled distributions (`eval.model._reads`)."""
    est = np.asarray(estimate, np.float64)
    parts = [_reads([CB.pool(d, est[k], fit) for k, d in zip(range(lo, lo + CHUNK), dists[lo : lo + CHUNK])],
                    np.asarray(actual, np.float64)[lo : lo + CHUNK]) for lo in range(0, len(dists), CHUNK)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else _reads([], np.zeros(0))


def record_in_run(comb: CB.Combination, run: Path, steps) -> dict:
    """Write RUN/combination.json where answers look for it by default: only for a run directory
    evaluated at its latest checkpoint alone (what an answer loads unless told a step), so an
    eval of an older step never replaces the latest's fit. Returns what happened."""
    run = Path(run)
    if not is_run_dir(run):
        return {"written": None, "reason": f"{run} is not a run directory"}
    if list(steps) != [latest_step(run)]:
        return {"written": None, "reason": f"steps {list(steps)} are not the run's latest checkpoint alone"}
    path = run / CB.COMBINATION
    if (why := unwritable_reason(path)) is not None:
        return {"written": None, "reason": why}
    return {"written": str(comb.write(path))}


def write_fits(fits: dict, out: Path, run: Path, steps, meta: dict) -> dict:
    """OUT/combination.json, and RUN/combination.json for the answers (`record_in_run`); returns
    what the report says of it. `meta`: fitted_on, prompts, seed (run and steps are added)."""
    if not fits:
        return {"fitted": None, "reason": "no val packets to fit it on"}
    comb = to_combination(fits, {"run": str(Path(run).resolve()), "steps": list(steps), **meta})
    info = {"fitted": str(comb.write(Path(out) / CB.COMBINATION)), "run_copy": record_in_run(comb, run, steps),
            "regimes": {r: {"estimate": name, **comb.regimes[r].to_json()} for r, (name, _) in fits.items()}}
    eval_only = sorted(r for r, f in comb.regimes.items() if f.classical is None)
    if eval_only:
        info["note"] = (f"{', '.join(eval_only)}: pooled here with the regime's best classical predictor; answers "
                        "cannot compute that estimate (the run has no hints), so they answer with the model alone")
    return info


def test_estimate(name: str, pred: dict, report) -> np.ndarray:
    """The estimate `name` on the test packets: as the prompts give it (pair median, hint), else
    the baseline's median in the report."""
    if name == "pair_median":
        return pair_estimate_of(pred)
    if name == "hint":
        return np.asarray(pred["hints"], np.float64)
    return np.asarray(report.ctx["predictions"][name]["median"], np.float64)


def add_combined(report, pred: dict, entry: tuple | None, seed: int = 0) -> None:
    """The predictor `combined` (the val-fitted pool, read from `pred`'s distributions), after the
    model's entries in the report order, and its comparisons with every other predictor."""
    if entry is None or not pred.get("dists"):
        return
    name, fit = entry
    est = test_estimate(name, pred, report)
    reads = combined_reads(pred["dists"], est, fit, report.ctx["actual"])
    # before recalibration: the spread the CRPS fit chose, unwidened, and no map
    factor = (fit.cov90_val or {}).get("spread_factor") or 1.0
    raw = cov90_of_pit(pooled_pit(at_actual(pred["dists"], report.ctx["actual"]), est,
                                  dataclasses.replace(fit, log_sigma=fit.log_sigma / factor)))
    add_predictor(report, COMBINED, reads["median"], quantiles=dict(zip(QS, reads["quantiles"].T)), pit=reads["pit"],
                  p_fail=reads["p_fail"], crps=reads["crps"],
                  info={"estimate": name, "weight": fit.weight, "log_sigma": fit.log_sigma, "fitted_on": "val",
                        "answers_combine": name in CB.CLASSICALS, "recalibrated": fit.recal is not None,
                        "cov90_before_recalibration": raw, "cov90_val": fit.cov90_val, "crps_val": fit.crps_val})
    order = [n for n in report["order"] if n != COMBINED]
    at = max(i for i, n in enumerate(order) if n.startswith("model")) + 1 if "model" in order else len(order)
    report["order"] = order[:at] + [COMBINED] + order[at:]


def compare_combined(report, seed: int = 0) -> None:
    if COMBINED in report.get("order", []):
        report.setdefault("comparisons", {})[COMBINED] = compare(report, COMBINED, seed=seed)


def row_fields(report, best: str) -> dict:
    """The regimes table's columns of the combined answer (None where it was not fitted)."""
    e = (report.get("predictors") or {}).get(COMBINED)
    if not e:
        return {"combined_median_rel_err": None}
    c = ((report.get("comparisons") or {}).get(COMBINED) or {}).get(best) or {}
    vouch = e["info"].get("crps_val") or {}
    return {"combined_median_rel_err": e["slices"]["all"].get("median_rel_err"),
            **{f"combined_{k}": vouch.get(k) for k in ("unit", "units", "gain_low", "min_crps_weight")},
            "combined_crps_ms": ((e.get("crps") or {}).get("all") or {}).get("mean_crps_ms"),
            "combined_cov90": ((e.get("calibration") or {}).get("coverage") or {}).get("cov90"),
            "combined_cov90_raw": e["info"].get("cov90_before_recalibration"),
            "combined_weight": e["info"]["weight"], "combined_estimate": e["info"]["estimate"],
            **{f"combined_{k}": c.get(k) for k in ("diff", "ci_low", "ci_high", "verdict")}}


def every_candidate(policies: dict) -> set[str]:
    """Every baseline some regime may be judged against under its policy (`registry.candidates`):
    the estimates a run without hints pools with, once val has chosen."""
    return {c for regime, policy in policies.items() for c in candidates(regime, policy)}


def fit_and_write(records: dict, val_dirs: dict, prompts: dict, choice: dict, out: Path, run: Path, steps,
                  seed: int, weights: str = "own") -> tuple[dict, dict]:
    """`eval --regimes`: each regime's fit on the val set it was asked on (`records`, keyed by
    (val path, context policy)), the held-out regimes' weight fitted together where `weights` is
    pooled (`weight_group`), written (`write_fits`); returns (fits, the report's entry)."""
    keys = {r: (val_dirs[r], prompts[r]["context_policy"]) for r in val_dirs}
    together = weight_group(val_dirs, prompts, weights)
    fits = fit_val({r: records[k] for r, k in keys.items() if k in records}, choice, together)
    meta = {"fitted_on": {r: str(Path(keys[r][0]).resolve()) for r in fits}, "prompts": prompts, "seed": seed,
            "weights": weights, "weight_fitted_together": list(together)}
    return fits, write_fits(fits, out, run, steps, meta)


# plain `pingctl eval` reads a train and a test split and no val split: nothing to fit on
NOT_FITTED_PLAIN = {"fitted": None, "reason": "plain eval reads no val split: `pingctl eval RUN --regimes SPLITS` "
                    "fits the combined answer on the val sets and scores it on every regime"}
