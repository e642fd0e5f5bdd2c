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


def _plain_log_ticks(*axes) -> None:
    """Plain-text tick labels ("1e−03", "20") on log axes: matplotlib's default log formatter
    writes every label as mathtext ($10^{-3}$), and parsing those cost more CPU than the rest of
    an eval's plots together."""
    from matplotlib.ticker import LogFormatter

    for axis in axes:
        axis.set_major_formatter(LogFormatter())
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def _save(fig, path) -> Path:
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with atomic_file(path) as tmp:
        # "tight": a legend placed beside the axes is part of the picture
        fig.savefig(tmp, format=fmt, bbox_inches="tight")
    _plt().close(fig)
    return path


# Predictors' curves often lie on top of each other: each gets its own colour, line style and
# markers (offset along the curve so that two curves' markers do not coincide), so a hidden
# curve still shows through
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (3, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_MARKS_PER_CURVE = 9


def error_cdf_figure(errors: dict[str, np.ndarray], title: str = "Relative error of the median prediction",
                     noise_floor: np.ndarray | None = None):
    """The figure `plot_error_cdf` saves (a pyplot Figure; the caller closes it)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 4.8), dpi=120)
    series = list(errors.items())
    if noise_floor is not None:
        series.append(("noise floor (truth)", noise_floor))
    grid = np.linspace(0.0, 1.0, _CDF_POINTS)
    step = _CDF_POINTS // _MARKS_PER_CURVE
    span: list[float] = []
    for k, (name, e) in enumerate(series):
        e = np.asarray(e, dtype=np.float64)
        e = e[np.isfinite(e)]
        if not len(e):
            continue
        x = np.maximum(np.quantile(e, grid), _MIN_REL)
        span += [x[int(0.005 * (_CDF_POINTS - 1))], x[int(0.995 * (_CDF_POINTS - 1))]]
        if name == "noise floor (truth)":
            style = {"color": "black", "ls": "--", "lw": 1.2}
        else:
            # the first predictor (the model) drawn thickest and on top
            style = {"color": f"C{k % 10}", "ls": _LINESTYLES[k % len(_LINESTYLES)], "lw": 2.2 if k == 0 else 1.4,
                     "marker": _MARKERS[k % len(_MARKERS)], "ms": 4.5, "zorder": 3 if k == 0 else 2,
                     "markevery": (step // 2 + (k * step) // max(len(series), 1), step)}
        ax.plot(x, grid, label=f"{name} (median {np.median(e):.3f})", **style)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    if span:  # where the curves rise: their 0.5th to 99.5th percentiles, not the flat tails
        ax.set_xlim(max(min(span) / 2, _MIN_REL / 2), max(span) * 2)
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
        # beside the axes, never over the curves
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.tight_layout()
    return fig


def plot_error_cdf(errors: dict[str, np.ndarray], path, title: str = "Relative error of the median prediction",
                   noise_floor: np.ndarray | None = None) -> Path:
    """Empirical CDF of |pred − actual| / actual for several named predictors (log x).

    `errors`: name -> per-packet relative errors (NaN ignored). `noise_floor`, if given, is
    drawn dashed in black as the error of the true conditional median.
    """
    return _save(error_cdf_figure(errors, title, noise_floor), path)


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


# Up to this many packets are drawn as points; more become a log-binned hexbin, where a point
# cloud of 50k small dots is either invisible (faint) or one blot (opaque)
SCATTER_MAX_POINTS = 3000


def scatter_figure(pred, actual, name: str = "model", max_points: int = 50_000, seed: int = 0):
    """The figure `plot_scatter` saves (a pyplot Figure; the caller closes it)."""
    plt = _plt()
    p = np.asarray(pred, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(p) & (p > 0) & np.isfinite(a) & (a > 0))
    n_ok = len(ok)
    if n_ok > max_points:
        ok = np.sort(np.random.default_rng(seed).choice(ok, max_points, replace=False))
    fig, ax = plt.subplots(figsize=(6.4, 5.5), dpi=120)
    if len(ok):
        x, y = a[ok], p[ok]
        if len(ok) > SCATTER_MAX_POINTS:
            hb = ax.hexbin(x, y, xscale="log", yscale="log", gridsize=70, bins="log", mincnt=1, cmap="viridis",
                           linewidths=0.2)
            cb = fig.colorbar(hb, ax=ax, label="packets per cell (log scale)")
            _plain_log_ticks(cb.ax.yaxis)
        else:
            ax.scatter(x, y, s=12, alpha=0.5, edgecolors="none", color="C0", rasterized=True)
        # both axes over the same span, so the diagonal is the diagonal
        lo = float(min(x.min(), y.min())) / 1.2
        hi = float(max(x.max(), y.max())) * 1.2
        ax.plot([lo, hi], [lo, hi], color="crimson", lw=1.0, ls="--", label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, ax.yaxis)
    ax.set_xlabel("actual RTT (ms)")
    ax.set_ylabel("predicted median RTT (ms)")
    ax.set_title(f"{name}: predicted vs actual ({len(ok):,} of {n_ok:,} packets)")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def plot_scatter(pred, actual, path, name: str = "model", max_points: int = 50_000, seed: int = 0) -> Path:
    """Predicted vs actual RTT (log-log) for successful packets, with the y = x diagonal;
    at most `max_points` packets (a seeded uniform sample): points up to SCATTER_MAX_POINTS,
    a hexbin of packet counts above."""
    return _save(scatter_figure(pred, actual, name, max_points, seed), path)
