"""The combined answer: the model's RTT distribution pooled with the best classical estimate an
answer can compute for its regime (docs/eval.md, "The combined answer").

A small model can be worse than a classical predictor on some questions and better on others;
a linear pool of the two CDFs, w * F_model + (1 - w) * F_classical, is never much worse than
the better of them once w is fitted on held-out questions (Ranjan & Gneiting 2010), and it
stays a distribution, so every read of one (quantiles, CDF, summary, recalibration) works on it
unchanged. The classical side is a log-normal around the estimate: RTT errors are
multiplicative, and its spread (`log_sigma`) is that of log(actual / estimate) on val.

`pingctl eval` fits one weight per regime on the val split (pingctl/eval/combine.py) and writes
`combination.json`; this module owns that file's layout and the pooling answers apply.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.atomic import write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.infer.calibration import GRID as RECAL_LEVELS
from pingctl.infer.queries import RttDistribution

COMBINATION = "combination.json"
KIND = "pingctl.rtt-combination"
REGIMES = ("time", "pair", "probe", "target")
# the classical estimate an answer can compute itself, per regime: the pair's own median where
# the prompt holds its packets (its training history where the run's hints keep it:
# `pair_estimate`), else the embedding's estimate the prompt's hint carries
CLASSICAL_OF_REGIME = {"time": "pair_median", "pair": "hint", "probe": "hint", "target": "hint"}
CLASSICALS = ("pair_median", "hint")
# a spread of zero (estimates exact on every val packet) would make the log-normal a step; a
# floor keeps its CDF a function of the estimate without changing any fitted spread in practice
MIN_LOG_SIGMA = 1e-3
# what a fit is specific to: the same keys a calibration is (pingctl/infer/calibration.py)
PROMPT_KEYS = ("context_policy", "context_measurements", "context_per_pair", "hint")


def regime_of(pair_packets: int, src_known: bool, dst_known: bool) -> str:
    """The regime a question is in: `time` where its prompt holds packets of the pair itself,
    else by which ends the hints know (`probe` where the source is new, both new included)."""
    if pair_packets >= 1:
        return "time"
    if src_known and dst_known:
        return "pair"
    return "target" if src_known else "probe"


@dataclass(frozen=True)
class RegimeFit:
    classical: str | None  # CLASSICAL_OF_REGIME's, or None: answers cannot combine in this regime
    weight: float  # on the model, in [0, 1]
    log_sigma: float  # spread of log(actual/estimate) on val
    n_val: int
    crps_val: dict  # {"model":..., "classical":..., "combined":...} in ms
    # The pool's own recalibration map H (knots at RECAL_LEVELS, as infer.calibration's): the
    # weight and spread are fitted by CRPS, which prefers sharp answers to calibrated ones, so
    # the pooled intervals are mended afterwards from the PITs of the pool on the same val packets.
    recal: tuple[float, ...] | None = None
    cov90_val: dict | None = None  # {"raw": ..., "recalibrated": ...} on val

    def to_json(self) -> dict:
        out = {"classical": self.classical, "weight": self.weight, "log_sigma": self.log_sigma,
               "n_val": self.n_val, "crps_val": self.crps_val}
        if self.recal is not None:
            out |= {"recal_levels": RECAL_LEVELS.tolist(), "recal_knots": list(self.recal)}
        if self.cov90_val is not None:
            out["cov90_val"] = self.cov90_val
        return out

    def classical_alone(self) -> "RegimeFit":
        """The classical answer alone: this pool at weight 0, without the pool's map (fitted
        for the pool, not for the log-normal by itself)."""
        return replace(self, weight=0.0, recal=None)

    def recalibrated(self, cdf: np.ndarray) -> np.ndarray:
        """H(F): the pooled CDF through the recalibration map (F itself where there is none)."""
        return cdf if self.recal is None else np.interp(cdf, self.recal, RECAL_LEVELS)


@dataclass(frozen=True)
class Combination:
    regimes: dict[str, RegimeFit]
    meta: dict = field(default_factory=dict)  # run, steps, PROMPT_KEYS, fitted_on
    path: str | None = None

    def for_regime(self, regime: str) -> RegimeFit | None:
        """The fit answers in `regime` pool with; None where there is none or it cannot combine."""
        fit = self.regimes.get(regime)
        return fit if fit is not None and fit.classical is not None else None

    def prompt_of(self, regime: str | None = None) -> dict:
        """The prompt shape (PROMPT_KEYS) `regime`'s fit was made with: meta["prompts"][regime]
        where eval recorded one per regime, else meta's own keys."""
        per = self.meta.get("prompts")
        if isinstance(per, dict) and isinstance(per.get(regime), dict):
            return per[regime]
        return {k: self.meta[k] for k in PROMPT_KEYS if k in self.meta}

    def to_json(self) -> dict:
        return {**self.meta, "kind": KIND, "regimes": {k: v.to_json() for k, v in self.regimes.items()}}

    def write(self, path: Path | str) -> Path:
        write_json(Path(path), self.to_json())
        return Path(path)

    @classmethod
    def load(cls, path: Path | str, option: str = "--combination") -> "Combination":
        """A combination.json that `pingctl eval` wrote; anything else is refused by name."""
        return load(path, option)


def load(path: Path | str, option: str = "--combination") -> Combination:
    path = Path(path)
    where = f"{option} {path}".strip()
    if not path.is_file():
        raise UsageError(f"{where}: no such file (`pingctl eval` on a val split writes {COMBINATION})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PingctlError(f"{where}: not readable as JSON ({e})") from None
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind != KIND:
        raise PingctlError(f"{where}: not a combination written by `pingctl eval` (field kind is {kind!r}, "
                           f"expected {KIND!r})")
    regimes = raw.get("regimes")
    if not isinstance(regimes, dict):
        raise PingctlError(f"{where}: field regimes missing or not an object")
    fits = {name: _regime_fit(where, name, r) for name, r in regimes.items()}
    meta = {k: v for k, v in raw.items() if k not in ("kind", "regimes")}
    return Combination(fits, meta, str(path))


def _regime_fit(where: str, name: str, r) -> RegimeFit:
    at = f"{where}: regimes.{name}"
    if name not in REGIMES:
        raise PingctlError(f"{at}: unknown regime (expected one of {', '.join(REGIMES)})")
    if not isinstance(r, dict):
        raise PingctlError(f"{at}: not an object")
    classical = r.get("classical")
    if classical is not None and classical not in CLASSICALS:
        raise PingctlError(f"{at}.classical is {classical!r}, expected one of {', '.join(CLASSICALS)} or null")

    def number(key: str, lo: float, hi: float) -> float:
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
            raise PingctlError(f"{at}.{key} is {v!r}, expected a number in [{lo}, {hi}]")
        return float(v)

    weight, sigma = number("weight", 0.0, 1.0), number("log_sigma", 0.0, 50.0)
    n_val = r.get("n_val")
    if isinstance(n_val, bool) or not isinstance(n_val, int) or n_val < 0:
        raise PingctlError(f"{at}.n_val is {n_val!r}, expected a count")
    crps = r.get("crps_val", {})
    if not isinstance(crps, dict):
        raise PingctlError(f"{at}.crps_val is not an object")
    cov = r.get("cov90_val")
    return RegimeFit(classical, weight, sigma, n_val, crps, _recal_knots(at, r), cov if isinstance(cov, dict) else None)


def _recal_knots(at: str, r: dict) -> tuple[float, ...] | None:
    """The recalibration map's knots: absent (no map), or one per RECAL_LEVELS, non-decreasing
    from 0 to 1; anything else is refused by field rather than applied."""
    knots = r.get("recal_knots")
    if knots is None:
        return None
    k = np.asarray(knots if isinstance(knots, list) else [], dtype=object)
    ok = (len(k) == len(RECAL_LEVELS) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in k))
    kf = k.astype(np.float64) if ok else np.zeros(0)
    if not ok or not np.isfinite(kf).all() or kf[0] != 0.0 or kf[-1] != 1.0 or (np.diff(kf) < 0).any():
        raise PingctlError(f"{at}.recal_knots: expected {len(RECAL_LEVELS)} numbers rising from 0 to 1")
    return tuple(float(x) for x in kf)


Z_EXACT = 9.0  # |z| beyond which Phi(z) is 0 or 1 within 1e-19


def lognormal_cdf(values_ms, estimate_ms, log_sigma) -> np.ndarray:
    """P(RTT <= values_ms) under a log-normal with median `estimate_ms` and spread `log_sigma`
    (broadcasting: estimates [n, 1] against a grid [1, m] give [n, m])."""
    v = np.asarray(values_ms, np.float64)
    sigma = np.maximum(np.asarray(log_sigma, np.float64), MIN_LOG_SIGMA)
    with np.errstate(divide="ignore"):
        z = (np.log(v) - np.log(np.asarray(estimate_ms, np.float64))) / sigma
    # Past |z| = 9 the CDF is 0 or 1 to double precision: only the band between needs erfc,
    # a few thousand of the 65,536 codes an answer reads.
    out = (z > 0).astype(np.float64)
    band = np.abs(z) < Z_EXACT
    out[band] = 0.5 * _erfc(-z[band] / math.sqrt(2.0))
    return out


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc to a relative error below 1.2e-7 everywhere (Numerical Recipes' Chebyshev fit), in
    NumPy: the answers' engine without JAX has no SciPy."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    with np.errstate(over="ignore", invalid="ignore"):
        r = t * np.exp(poly)
    r = np.where(np.isinf(z), 0.0, r)
    return np.where(x >= 0, r, 2.0 - r)


def classical_cdf(values_ms, estimate_ms, log_sigma) -> np.ndarray:
    """The classical answer's CDF at each code of a sorted grid, its last code taking what lies
    above the grid (so it ends at exactly 1, as a distribution on the codes must)."""
    f = lognormal_cdf(values_ms, estimate_ms, log_sigma)
    f[..., -1] = 1.0
    return f


def usable(estimate_ms) -> bool:
    return estimate_ms is not None and bool(np.isfinite(estimate_ms)) and float(estimate_ms) > 0


def pool(dist: RttDistribution, estimate_ms: float, fit: RegimeFit) -> RttDistribution:
    """H(w * F_model + (1 - w) * F_lognormal(estimate_ms, log_sigma)) on the model's own codes,
    H the fit's recalibration map (`RegimeFit.recal`, none: the identity); P(failure) stays the
    model's. The model's distribution itself where the fit cannot combine or there is no
    estimate (NaN, None or <= 0), and where w is 1 without a map."""
    w = float(fit.weight)
    if fit.classical is None or not usable(estimate_ms) or (w >= 1.0 and fit.recal is None):
        return dist
    probs = np.diff(fit.recalibrated(pooled_cdf(dist.cumulative, dist.values_ms, float(estimate_ms), fit)), prepend=0.0).clip(min=0.0)
    return RttDistribution(dist.p_fail, dist.codes, dist.values_ms, probs / probs.sum())


def pooled_cdf(f_model: np.ndarray, values_ms: np.ndarray, estimate_ms: float, fit: RegimeFit) -> np.ndarray:
    """w * F_model + (1 - w) * F_classical at each code of `values_ms`, before the map: `pool`'s
    CDF, and the one a caller that refines the grid reads (`predictor.Choice.read_cdf`)."""
    w = float(fit.weight)
    f = np.minimum(f_model, 1.0)
    if w >= 1.0:
        return f
    c = classical_cdf(values_ms, estimate_ms, fit.log_sigma)
    return c if w <= 0.0 else w * f + (1.0 - w) * c


def classical(dist: RttDistribution, estimate_ms: float, fit: RegimeFit) -> RttDistribution | None:
    """The classical answer alone on the model's codes (weight 0), P(failure) the model's; None
    without an estimate."""
    if not usable(estimate_ms):
        return None
    return pool(dist, estimate_ms, RegimeFit(fit.classical or CLASSICAL_OF_REGIME["pair"], 0.0, fit.log_sigma,
                                             fit.n_val, fit.crps_val))  # no map: it was fitted for the pool


def pair_median(rtt_ms) -> float:
    """The median of the pair's own successful packets in the prompt (NaN where there are
    none), as `pingctl eval` computes it."""
    r = np.asarray(rtt_ms, np.float64)
    r = r[np.isfinite(r) & (r >= 0)]  # a failed packet's RTT is negative
    return float(np.median(r)) if len(r) else float("nan")


def pair_estimate(history_ms, prompt_median_ms):
    """The `time` regime's classical estimate (`pair_median`): the pair's median over the run's
    training split where its hints file keeps it (`loader.hints.Hints.history`: every packet
    of the pair's history, where a prompt holds its last few), else the median of its packets
    in the prompt. Scalars or arrays, elementwise: eval and every answer take it here."""
    h = np.asarray(history_ms, np.float64)
    out = np.where(np.isfinite(h) & (h > 0), h, np.asarray(prompt_median_ms, np.float64))
    return float(out) if out.ndim == 0 else out


def mismatch(comb: Combination, run: Path | str, steps, prompt: dict | None = None,
             regime: str | None = None) -> str | None:
    """Why `comb` does not fit answers of this run, step(s) and prompt shape (None if it does):
    a weight fitted for another model or prompt weighs other errors. The prompt is compared
    with the one `regime` was fitted on where the fit records one per regime (`eval --regimes`)."""
    if not EX.fitted_for(str(comb.meta.get("run") or ""), Path(run)):
        return f"{comb.path} was fitted for run {comb.meta.get('run')}, not {run}"
    if list(comb.meta.get("steps") or []) != list(steps):
        return f"{comb.path} was fitted for step(s) {comb.meta.get('steps')}, this model is step(s) {list(steps)}"
    fitted = comb.prompt_of(regime)
    for k in (k for k in PROMPT_KEYS if k in (prompt or {})):
        if fitted.get(k) != prompt[k]:
            return f"{comb.path} was fitted with {k} {fitted.get(k)!r}, these answers use {prompt[k]!r}"
    return None
