"""Evaluation plots (matplotlib Agg; every file written atomically via pingctl.atomic).

Functions take plain arrays/dicts and return the written path; the format follows the
file suffix (png, svg, pdf).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file
from pingctl.eval.metrics import pit_histogram

_MIN_REL = 1e-4  # relative errors below this are drawn at this value (log axis)
_CDF_POINTS = 2000


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format=fmt)
    _plt().close(fig)
    return path


def plot_error_cdf(errors: dict[str, np.ndarray], path, title: str = "Relative error of the median prediction",
                   noise_floor: np.ndarray | None = None) -> Path:
    """Empirical CDF of |pred − actual| / actual for several named predictors (log x).

    `errors`: name -> per-packet relative errors (NaN ignored). `noise_floor`, if given, is
    drawn dashed in black as the error of the true conditional median.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    series = list(errors.items())
    if noise_floor is not None:
        series.append(("noise floor (truth)", noise_floor))
    grid = np.linspace(0.0, 1.0, _CDF_POINTS)
    for k, (name, e) in enumerate(series):
        e = np.asarray(e, dtype=np.float64)
        e = e[np.isfinite(e)]
        if not len(e):
            continue
        x = np.maximum(np.quantile(e, grid), _MIN_REL)
        style = {"color": "black", "ls": "--"} if name == "noise floor (truth)" else {"ls": ("-", "-.")[k % 2]}
        ax.plot(x, grid, lw=1.4, label=f"{name} (median {np.median(e):.3f})", **style)
    ax.set_xscale("log")
    ax.set_xlabel("relative error |pred − actual| / actual")
    ax.set_ylabel("share of packets ≤ x")
    ax.set_ylim(0, 1)
    ax.axhline(0.5, color="grey", lw=0.6, alpha=0.5)
    ax.axhline(0.9, color="grey", lw=0.6, alpha=0.5)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title)
    # no finite errors at all (e.g. a test split without successful packets): no lines to name,
    # and an empty legend only earns a matplotlib warning
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def plot_calibration(pit: dict[str, object], coverage: dict[str, dict] | None, path,
                     title: str = "Calibration") -> Path:
    """Left: PIT histograms (name -> PIT values, or a metrics.pit_histogram dict) against the
    flat line of a calibrated predictor. Right: coverage of the central 50% and 90% intervals
    (name -> metrics.coverage dict) against the nominal 0.5 and 0.9."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for name, v in pit.items():
        h = v if isinstance(v, dict) else pit_histogram(v)
        if not h.get("n"):
            continue
        edges = np.asarray(h["edges"])
        dens = np.asarray(h["density"], dtype=float)
        a1.stairs(dens, edges, lw=1.5, label=f"{name} (KS {h['ks']:.3f})")
    a1.axhline(1.0, color="black", ls="--", lw=0.8)
    a1.set_xlim(0, 1)
    a1.set_xlabel("PIT = predictive CDF at the actual RTT")
    a1.set_ylabel("density (1 = calibrated)")
    a1.set_title("PIT histogram")
    a1.grid(alpha=0.3)
    if a1.get_legend_handles_labels()[0]:
        a1.legend(fontsize=8)
    cov = {k: v for k, v in (coverage or {}).items() if v}
    names = list(cov)
    x = np.arange(len(names))
    w = 0.38
    c50 = [cov[n].get("cov50") or 0.0 for n in names]
    c90 = [cov[n].get("cov90") or 0.0 for n in names]
    a2.bar(x - w / 2, c50, w, label="50% interval")
    a2.bar(x + w / 2, c90, w, label="90% interval")
    a2.axhline(0.5, color="C0", ls="--", lw=0.8)
    a2.axhline(0.9, color="C1", ls="--", lw=0.8)
    a2.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    a2.set_ylim(0, 1)
    a2.set_ylabel("share of packets inside")
    a2.set_title("Interval coverage (dashed = nominal)")
    if a2.get_legend_handles_labels()[0]:
        a2.legend(fontsize=8, loc="lower right")
    a2.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_scatter(pred, actual, path, name: str = "model", max_points: int = 50_000, seed: int = 0) -> Path:
    """Predicted vs actual RTT (log-log) for successful packets, with the y = x diagonal;
    at most `max_points` packets (a seeded uniform sample)."""
    plt = _plt()
    p = np.asarray(pred, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(p) & (p > 0) & np.isfinite(a) & (a > 0))
    n_ok = len(ok)
    if n_ok > max_points:
        ok = np.sort(np.random.default_rng(seed).choice(ok, max_points, replace=False))
    fig, ax = plt.subplots(figsize=(5.5, 5.5), dpi=120)
    if len(ok):
        ax.scatter(a[ok], p[ok], s=2, alpha=0.15, lw=0, rasterized=True)
        lo = float(min(a[ok].min(), p[ok].min()))
        hi = float(max(a[ok].max(), p[ok].max()))
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--", label="y = x")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("actual RTT (ms)")
    ax.set_ylabel("predicted median RTT (ms)")
    ax.set_title(f"{name}: predicted vs actual ({len(ok):,} of {n_ok:,} packets)")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return _save(fig, path)
