"""Figures of `pingctl sample` answers (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file


def plot_distribution(d, path: Path, title: str) -> None:
    """An RTT distribution (`RttDistribution`) as a PNG histogram on log-spaced bins; atomic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keep = d.probs > 1e-7
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    bins = np.geomspace(max(d.values_ms[keep].min(), 0.01), max(d.values_ms[keep].max(), 1), 80)
    ax.hist(d.values_ms[keep], bins=bins, weights=d.probs[keep])
    ax.set_xscale("log")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("probability")
    ax.set_title(f"{title}  P(fail)={d.p_fail:.1%}  median={d.quantile(0.5):.1f} ms")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
