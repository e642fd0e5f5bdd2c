"""Figures of `pingctl sample` answers (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file
from pingctl.errors import require_extra


# The x axis spans where the distribution's mass is: from the first to the last log-spaced bin
# (BINS_PER_DECADE) holding at least DENSE of the fullest bin's probability, widened by
# SPAN_MARGIN each side. The model gives every code some probability, so the codes' full range
# (0.01 ms to 1e10 ms) left the mass a sliver of the axis; and a thin floor over 30 octaves
# can hold a few percent, so percentiles alone (the 99.9th can lie at 1e5 ms) do not find it
BINS_PER_DECADE = 40
DENSE = 5e-3
SPAN_MARGIN = 1.6


def axis_span(values_ms: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """The x range `distribution_figure` draws (see DENSE); it always holds the 5th to 95th
    percentiles."""
    ok = (probs > 0) & (values_ms > 0)
    v, p = values_ms[ok], probs[ok]
    if not len(v):
        return 0.1, 1000.0
    order = np.argsort(v, kind="stable")
    v, p = v[order], p[order]
    logv = np.log10(v)
    first = np.floor(logv[0] * BINS_PER_DECADE)
    bins = (np.floor(logv * BINS_PER_DECADE) - first).astype(np.int64)
    mass = np.bincount(bins, weights=p)
    dense = np.flatnonzero(mass >= DENSE * mass.max())
    lo = 10 ** ((first + dense[0]) / BINS_PER_DECADE)
    hi = 10 ** ((first + dense[-1] + 1) / BINS_PER_DECADE)
    cdf = np.cumsum(p) / p.sum()
    q5, q95 = (v[min(int(np.searchsorted(cdf, q)), len(v) - 1)] for q in (0.05, 0.95))
    lo, hi = min(lo, q5) / SPAN_MARGIN, max(hi, q95) * SPAN_MARGIN
    if hi < lo * 4:  # a (near) point mass: still an axis with a few ticks
        mid = (lo * hi) ** 0.5
        lo, hi = mid / 2, mid * 2
    return float(lo), float(hi)


def distribution_figure(d, title: str):
    """An RTT distribution (`RttDistribution`) as a matplotlib Figure: a histogram on log-spaced
    bins over `axis_span`, the median and the central 90% marked, and the mass outside the axis
    written on it. Built without pyplot, so it neither switches a notebook's backend nor stays
    open in pyplot's figure list."""
    require_extra("a distribution's plot", "plot", ("matplotlib",))  # Rtt.plot: a message, not an ImportError
    from matplotlib.figure import Figure

    lo, hi = axis_span(d.values_ms, d.probs)
    fig = Figure(figsize=(7, 3.5), dpi=120)
    ax = fig.subplots()
    inside = (d.values_ms >= lo) & (d.values_ms <= hi) & (d.probs > 0)
    ax.hist(d.values_ms[inside], bins=np.geomspace(lo, hi, 81), weights=d.probs[inside], color="C0")
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    median = d.quantile(0.5)
    ax.axvline(median, color="crimson", lw=1.2, label=f"median {median:.1f} ms")
    for q in (0.05, 0.95):
        ax.axvline(d.quantile(q), color="crimson", lw=0.8, ls="--")
    ax.plot([], [], color="crimson", lw=0.8, ls="--", label="5th / 95th percentile")
    below, above = float(d.probs[d.values_ms < lo].sum()), float(d.probs[d.values_ms > hi].sum())
    if below + above > 0:
        ax.text(0.99, 0.97, f"off the axis: {below:.2%} below, {above:.2%} above", transform=ax.transAxes,
                ha="right", va="top", fontsize=7, color="dimgrey")
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("probability")
    # two lines: an IPv6 pair and the figures do not fit one line of a 7-inch figure
    ax.set_title(f"{title}\nP(fail)={d.p_fail:.1%}  median={median:.1f} ms", fontsize=10)
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> None:
    """A figure as a PNG at `path`; atomic."""
    with atomic_file(Path(path)) as tmp:
        fig.savefig(tmp, format="png")


def plot_distribution(d, path: Path, title: str) -> None:
    """An RTT distribution as a PNG histogram (`distribution_figure`); atomic."""
    save_figure(distribution_figure(d, title), path)
