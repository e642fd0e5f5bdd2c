"""Figures of `pingctl sample` answers (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file


def distribution_figure(d, title: str):
    """An RTT distribution (`RttDistribution`) as a matplotlib Figure: a histogram on log-spaced
    bins. Built without pyplot, so it neither switches a notebook's backend nor stays open in
    pyplot's figure list."""
    from matplotlib.figure import Figure

    keep = d.probs > 1e-7
    fig = Figure(figsize=(7, 3.5), dpi=120)
    ax = fig.subplots()
    bins = np.geomspace(max(d.values_ms[keep].min(), 0.01), max(d.values_ms[keep].max(), 1), 80)
    ax.hist(d.values_ms[keep], bins=bins, weights=d.probs[keep])
    ax.set_xscale("log")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("probability")
    ax.set_title(f"{title}  P(fail)={d.p_fail:.1%}  median={d.quantile(0.5):.1f} ms")
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> None:
    """A figure as a PNG at `path`; atomic."""
    with atomic_file(Path(path)) as tmp:
        fig.savefig(tmp, format="png")


def plot_distribution(d, path: Path, title: str) -> None:
    """An RTT distribution as a PNG histogram (`distribution_figure`); atomic."""
    save_figure(distribution_figure(d, title), path)
