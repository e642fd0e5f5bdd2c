"""Evaluation metrics for RTT predictors (definitions in docs/eval.md).

All functions take NumPy arrays (anything `np.asarray` accepts) and return floats or
JSON-able dicts (None where a value is undefined, e.g. on an empty slice). `actual` is the
measured RTT in ms with -1.0 (any negative value) meaning a failed packet; error and
calibration metrics use successful packets (actual > 0) only.
"""

from __future__ import annotations

import math

import numpy as np

RTT_BUCKETS = (10.0, 50.0, 150.0)  # ms: <10, 10-50, 50-150, >=150
CENTRAL = {"cov50": (0.25, 0.75), "cov90": (0.05, 0.95)}
QUANTILE_LEVELS = (0.05, 0.25, 0.75, 0.95)
LN2 = math.log(2.0)


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _num(x) -> float | None:
    """JSON-able float: None for NaN/inf."""
    x = float(x)
    return x if math.isfinite(x) else None


def _mask(n: int, mask) -> np.ndarray:
    return np.ones(n, bool) if mask is None else np.asarray(mask, dtype=bool)


# ---------------------------------------------------------------- point predictions


def successful(actual) -> np.ndarray:
    """Mask of packets whose relative error is defined (finite, > 0 ms)."""
    a = _f(actual)
    return np.isfinite(a) & (a > 0)


def relative_error(pred, actual) -> np.ndarray:
    """|pred − actual| / actual per packet; NaN for failed packets and missing predictions."""
    p, a = np.broadcast_arrays(_f(pred), _f(actual))
    out = np.full(a.shape, np.nan)
    ok = successful(a) & np.isfinite(p)
    out[ok] = np.abs(p[ok] - a[ok]) / a[ok]
    return out


def error_summary(pred, actual, mask=None) -> dict:
    """n (successful packets with a prediction), n_unpredicted (successful without one),
    median and p90 relative error, mean relative error, MAE (ms) and median absolute error (ms)."""
    p, a = _f(pred), _f(actual)
    m = _mask(len(a), mask) & successful(a)
    have = m & np.isfinite(p)
    out = {"n": int(have.sum()), "n_unpredicted": int((m & ~np.isfinite(p)).sum())}
    if not have.any():
        return out | {k: None for k in ("median_rel_err", "p90_rel_err", "mean_rel_err", "mae_ms", "median_abs_err_ms")}
    ae = np.abs(p[have] - a[have])
    rel = ae / a[have]
    return out | {
        "median_rel_err": _num(np.median(rel)),
        "p90_rel_err": _num(np.quantile(rel, 0.9)),
        "mean_rel_err": _num(rel.mean()),
        "mae_ms": _num(ae.mean()),
        "median_abs_err_ms": _num(np.median(ae)),
    }


def noise_floor(truth_median, actual, mask=None) -> dict:
    """error_summary of the true conditional median: what the best possible median predictor
    achieves (NaN truths, e.g. unknown streams, are counted in n_unpredicted)."""
    return error_summary(truth_median, actual, mask)


# ---------------------------------------------------------------- slices


def family_masks(ip_version) -> dict[str, np.ndarray]:
    v = np.asarray(ip_version)
    return {"v4": v == 4, "v6": v == 6}


def bucket_name(lo: float | None, hi: float | None) -> str:
    g = lambda x: f"{x:g}"  # noqa: E731
    if lo is None:
        return f"rtt<{g(hi)}"
    if hi is None:
        return f"rtt>={g(lo)}"
    return f"rtt{g(lo)}-{g(hi)}"


def rtt_bucket_masks(actual, edges=RTT_BUCKETS) -> dict[str, np.ndarray]:
    """Buckets of the *actual* RTT: [0, e0), [e0, e1), ..., [e_last, inf); failed packets in none."""
    a = _f(actual)
    ok = successful(a)
    bounds = [None, *edges, None]
    out = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m = ok.copy()
        if lo is not None:
            m &= a >= lo
        if hi is not None:
            m &= a < hi
        out[bucket_name(lo, hi)] = m
    return out


def standard_masks(ip_version, actual, extra: dict | None = None, edges=RTT_BUCKETS) -> dict[str, np.ndarray]:
    """'all', address family, RTT bucket, plus caller masks (e.g. seen_pair / unseen_probe)."""
    n = len(_f(actual))
    out = {"all": np.ones(n, bool)}
    out.update(family_masks(ip_version))
    out.update(rtt_bucket_masks(actual, edges))
    for k, v in (extra or {}).items():
        out[k] = np.asarray(v, dtype=bool)
    return out


def sliced_summary(pred, actual, masks: dict) -> dict[str, dict]:
    return {name: error_summary(pred, actual, m) for name, m in masks.items()}


# ---------------------------------------------------------------- calibration


def pit_histogram(pit, bins: int = 10, mask=None) -> dict:
    """Histogram of PIT values (the predictive CDF at the actual value) on [0, 1].

    A calibrated predictor gives a flat histogram. Scores: `ks`, the Kolmogorov-Smirnov
    distance sup|F_PIT(u) − u| (0 = uniform), and `tv`, the total-variation distance of the
    bin shares from 1/bins (0 = flat, → 1 when all mass is in one bin). `density` = share × bins.
    What `ks` means depends on n: a calibrated predictor's n PITs, were the packets independent,
    are `ks_95` or less from uniform 95% of the time, and at least `ks` with chance `ks_p` (the
    Kolmogorov distribution of n; packets that share a host share its errors, so the true
    spread is wider and these are bounds from below).
    """
    u = _f(pit)
    u = u[_mask(len(u), mask) & np.isfinite(u)]
    edges = np.linspace(0.0, 1.0, bins + 1)
    n = len(u)
    if n == 0:
        return {"n": 0, "bins": bins, "edges": edges.tolist(), "counts": [0] * bins, "density": [None] * bins,
                "ks": None, "ks_p": None, "ks_95": None, "tv": None}
    u = np.clip(u, 0.0, 1.0)
    counts = np.histogram(u, bins=edges)[0]
    share = counts / n
    s = np.sort(u)
    k = np.arange(1, n + 1)
    ks = max(np.max(k / n - s), np.max(s - (k - 1) / n))
    from scipy.stats import kstwo

    return {
        "n": int(n),
        "bins": int(bins),
        "edges": edges.tolist(),
        "counts": counts.astype(int).tolist(),
        "density": (share * bins).tolist(),
        "ks": _num(ks),
        "ks_p": _num(kstwo.sf(ks, n)),
        "ks_95": _num(kstwo.ppf(0.95, n)),
        "tv": _num(0.5 * np.abs(share - 1.0 / bins).sum()),
    }


def quantile_columns(quantiles, levels) -> dict[float, np.ndarray]:
    if isinstance(quantiles, dict):
        return {float(k): _f(v) for k, v in quantiles.items()}
    q = _f(quantiles)
    if q.ndim != 2 or q.shape[1] != len(levels):
        raise ValueError(f"quantiles must be a dict or an (n, {len(levels)}) array for levels {levels}")
    return {float(lv): q[:, i] for i, lv in enumerate(levels)}


def coverage(actual, quantiles, levels=QUANTILE_LEVELS, mask=None) -> dict:
    """Share of successful packets inside the central 50% [p25, p75] and 90% [p5, p95]
    predictive intervals (inclusive), and the median interval widths (ms).

    `quantiles`: {0.05: arr, 0.25: arr, 0.75: arr, 0.95: arr} (extra keys ignored), or an
    (n, 4) array with columns in `levels` order.
    """
    a = _f(actual)
    cols = quantile_columns(quantiles, levels)
    base = _mask(len(a), mask) & successful(a)
    out: dict = {}
    n_all = None
    for name, (lo_q, hi_q) in CENTRAL.items():
        if lo_q not in cols or hi_q not in cols:
            out[name] = None
            continue
        lo, hi = cols[lo_q], cols[hi_q]
        m = base & np.isfinite(lo) & np.isfinite(hi)
        n = int(m.sum())
        n_all = n if n_all is None else max(n_all, n)
        inside = (a[m] >= lo[m]) & (a[m] <= hi[m])
        out[name] = _num(inside.mean()) if n else None
        out[name.replace("cov", "width") + "_ms"] = _num(np.median(hi[m] - lo[m])) if n else None
    out["n"] = int(n_all or 0)
    return out


# ---------------------------------------------------------------- CRPS


def crps_point(pred, actual) -> np.ndarray:
    """CRPS of a point forecast (all mass on `pred`): its absolute error, ms; NaN for failed
    packets and missing predictions."""
    p, a = np.broadcast_arrays(_f(pred), _f(actual))
    out = np.full(a.shape, np.nan)
    ok = successful(a) & np.isfinite(p)
    out[ok] = np.abs(p[ok] - a[ok])
    return out


_CHUNK = 1 << 22  # ensemble values handed to scoringrules at once (32 MB of float64)


def crps_samples(actual, values, start, count) -> np.ndarray:
    """CRPS (ms) of each packet's empirical distribution, the sorted sample
    values[start[k] : start[k] + count[k]], at its actual RTT (scoringrules' `crps_ensemble`,
    the quantile-decomposition estimator: the exact CRPS of the empirical CDF). NaN for failed
    packets and empty samples. Rows are batched by sample size, so no padding is scored."""
    import scoringrules as sr

    a = _f(actual)
    v = _f(values)
    start, count = np.asarray(start, np.int64), np.asarray(count, np.int64)
    out = np.full(len(a), np.nan)
    ok = np.flatnonzero(successful(a) & (count > 0))
    if not len(ok):
        return out
    for m in np.unique(count[ok]):
        rows = ok[count[ok] == m]
        step = max(1, _CHUNK // int(m))
        for c in range(0, len(rows), step):
            r = rows[c : c + step]
            ens = v[start[r, None] + np.arange(m)]
            out[r] = sr.crps_ensemble(a[r], ens, estimator="qd", sorted_ensemble=True, backend="numpy")
    return out


def crps_distribution(actual, values, probs) -> np.ndarray:
    """CRPS (ms) of discrete distributions at the actual RTTs: packet k's distribution puts
    probs[k][j] on values[j], values ascending and shared by all packets (`probs`: a 2-D array
    or a sequence of 1-D arrays, stacked a chunk at a time); scoringrules' weighted
    `crps_ensemble`, exact for a discrete distribution. NaN for failed packets."""
    import scoringrules as sr

    a = _f(actual)
    v = _f(values)
    out = np.full(len(a), np.nan)
    ok = np.flatnonzero(successful(a))
    step = max(1, _CHUNK // max(len(v), 1))
    for c in range(0, len(ok), step):
        r = ok[c : c + step]
        p = np.stack([_f(probs[k]) for k in r])
        out[r] = sr.crps_ensemble(a[r], np.broadcast_to(v, p.shape), ens_w=p, estimator="qd", sorted_ensemble=True,
                                  backend="numpy")
    return out


def crps_summary(crps, actual, mask=None) -> dict:
    """n (successful packets with a CRPS), mean and median CRPS (ms), and the mean of
    CRPS / actual (a scale-free figure: for a point forecast it is the mean relative error)."""
    c, a = _f(crps), _f(actual)
    m = _mask(len(a), mask) & successful(a) & np.isfinite(c)
    if not m.any():
        return {"n": 0, "mean_crps_ms": None, "median_crps_ms": None, "mean_rel_crps": None}
    return {"n": int(m.sum()), "mean_crps_ms": _num(c[m].mean()), "median_crps_ms": _num(np.median(c[m])),
            "mean_rel_crps": _num((c[m] / a[m]).mean())}


# ---------------------------------------------------------------- comparing two predictors


def weighted_medians(values, weights) -> np.ndarray:
    """Lower weighted median of `values` (n) under each row of `weights` (B, n) of counts >= 0:
    the median of `values` with each repeated its weight's times (np.repeat), B at once."""
    v = _f(values)
    order = np.argsort(v, kind="stable")
    c = np.cumsum(np.asarray(weights, dtype=np.float64)[:, order], axis=1)
    # lower median of N repeated values: the (N - 1) // 2-th in sorted order (0-based)
    k = np.floor((c[:, -1:] - 1) / 2)
    idx = (c <= k).sum(axis=1)
    return v[order][np.minimum(idx, len(v) - 1)]


def median_difference(err_a, err_b, groups, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """median(err_a) - median(err_b) over the packets both predict, with a bootstrap interval.

    The bootstrap resamples `groups` (e.g. (src, dst) pairs), not packets: packets of one pair
    share its RTT and errors, so resampling packets would make the interval too narrow.
    `share_a_better` is the share of resamples in which a's median is below b's. `verdict`:
    "better" (a lower, the whole interval below 0), "worse" (above 0) or "tie" (it holds 0).
    """
    a, b = _f(err_a), _f(err_b)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b, g = a[ok], b[ok], np.asarray(groups)[ok]
    out = {"n": int(len(a)), "groups": 0, "median_a": None, "median_b": None, "diff": None, "ci_low": None,
           "ci_high": None, "level": level, "share_a_better": None, "n_boot": n_boot, "verdict": None}
    if not len(a):
        return out
    _, gi = np.unique(g, return_inverse=True)
    n_groups = int(gi.max()) + 1
    counts = np.random.default_rng(seed).multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot)
    w = counts[:, gi]
    d = weighted_medians(a, w) - weighted_medians(b, w)
    lo, hi = np.quantile(d, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return out | {"groups": n_groups, "median_a": _num(np.median(a)), "median_b": _num(np.median(b)),
                  "diff": _num(np.median(a) - np.median(b)), "ci_low": _num(lo), "ci_high": _num(hi),
                  "share_a_better": _num((d < 0).mean()),
                  "verdict": "better" if hi < 0 else "worse" if lo > 0 else "tie"}


# ---------------------------------------------------------------- failure prediction


def brier(p_fail, failed, mask=None) -> float | None:
    """Mean squared difference between predicted failure probability and the 0/1 outcome."""
    p, y = _f(p_fail), np.asarray(failed, dtype=bool)
    m = _mask(len(p), mask) & np.isfinite(p)
    return _num(np.mean((p[m] - y[m]) ** 2)) if m.any() else None


LOG_SCORE_FLOOR = 1e-6  # P(outcome) is clipped here, so one confident miss costs 13.8 nats, not infinity


def log_score(p_fail, failed, mask=None) -> float | None:
    """Mean negative log-likelihood (nats) of the observed outcome under P(failure): −ln p for a
    failed packet, −ln(1 − p) for a reply, with p clipped to [LOG_SCORE_FLOOR, 1 −
    LOG_SCORE_FLOOR]. Proper, like the Brier score, but it punishes a confident miss without
    bound where the Brier score caps it at 1."""
    p, y = _f(p_fail), np.asarray(failed, dtype=bool)
    m = _mask(len(p), mask) & np.isfinite(p)
    if not m.any():
        return None
    q = np.clip(p[m], LOG_SCORE_FLOOR, 1.0 - LOG_SCORE_FLOOR)
    return _num(-np.mean(np.where(y[m], np.log(q), np.log1p(-q))))


def average_ranks(x) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (vectorized)."""
    x = _f(x)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    n = len(x)
    new = np.ones(n, bool)
    new[1:] = xs[1:] != xs[:-1]
    grp = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    avg = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(n)
    ranks[order] = avg[grp]
    return ranks


def roc_auc(score, label, mask=None) -> float | None:
    """ROC AUC from ranks (Mann-Whitney U / (n_pos·n_neg)); ties count one half.
    None when one class is absent."""
    s, y = _f(score), np.asarray(label, dtype=bool)
    m = _mask(len(s), mask) & np.isfinite(s)
    s, y = s[m], y[m]
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    r = average_ranks(s)
    return _num((r[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def failure_summary(p_fail, failed, mask=None) -> dict:
    """Brier score, the Brier score of always predicting the slice's base rate, the skill
    1 − brier/brier_base, the log score (nats) and the base rate's (its binary entropy: what
    knowing only the rate scores, in hindsight), and ROC AUC. The two scores are proper: they
    judge the probability itself, where the AUC only judges its ranking."""
    p, y = _f(p_fail), np.asarray(failed, dtype=bool)
    m = _mask(len(p), mask) & np.isfinite(p)
    n = int(m.sum())
    if n == 0:
        return {"n": 0, "base_rate": None, "brier": None, "brier_base": None, "brier_skill": None,
                "log_score": None, "log_score_base": None, "auc": None}
    base = float(y[m].mean())
    b = brier(p, y, m)
    b0 = base * (1 - base)
    return {
        "n": n,
        "base_rate": base,
        "brier": b,
        "brier_base": b0,
        "brier_skill": _num(1.0 - b / b0) if b0 > 0 and b is not None else None,
        "log_score": log_score(p, y, m),
        "log_score_base": log_score(np.full(len(p), base), y, m),
        "auc": roc_auc(p, y, m),
    }


# ---------------------------------------------------------------- likelihood


def bits_per_token(nats_per_token: float) -> float:
    return float(nats_per_token) / LN2


def nll_summary(nats_per_token: float, tokens, measurements: int | None = None) -> dict:
    """Convert a mean cross-entropy (nats per scored token) to bits per token and bits per
    measurement. `tokens` is the total number of scored tokens with `measurements` the number
    of measurements they encode, or an array of per-measurement token counts."""
    t = np.asarray(tokens, dtype=np.float64)
    if t.ndim:
        measurements = len(t) if measurements is None else measurements
        total = float(t.sum())
    else:
        total = float(t)
    if not measurements:
        raise ValueError("measurements is required when tokens is a total")
    bpt = bits_per_token(nats_per_token)
    return {
        "nats_per_token": float(nats_per_token),
        "bits_per_token": bpt,
        "tokens": total,
        "measurements": int(measurements),
        "tokens_per_measurement": total / measurements,
        "bits_per_measurement": bpt * total / measurements,
    }
