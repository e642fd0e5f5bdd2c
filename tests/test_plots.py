"""The eval and sample figures are readable: the distribution plot's axis spans where the mass
is, scatter points can be seen (or become a hexbin), and the error CDF's curves are told apart
with the legend beside them, not over them."""

from __future__ import annotations

import numpy as np
import pytest

from pingctl.eval import plots
from pingctl.infer.plots import axis_span, distribution_figure
from pingctl.infer.queries import RttDistribution
from pingctl.tokenizer.rtt_codec import decode_rtt


def _distribution(floor: float) -> RttDistribution:
    """Every RTT code (0.001 ms to 5e9 ms) with a lognormal around 40 ms, plus `floor` of the
    probability spread evenly over all codes, as a model spreads some mass everywhere."""
    codes = np.arange(0, 0xFFFF, dtype=np.uint16)
    values = decode_rtt(codes).astype(np.float64)
    order = np.argsort(values, kind="stable")
    codes, values = codes[order], values[order]
    logv = np.log(np.maximum(values, 1e-6))
    mass = np.exp(-0.5 * ((logv - np.log(40.0)) / 0.3) ** 2)
    probs = (1 - floor) * mass / mass.sum() + floor / len(values)
    return RttDistribution(p_fail=0.01, codes=codes, values_ms=values, probs=probs / probs.sum())


def _quantile(d: RttDistribution, q: float) -> float:
    return d.quantile(q)


@pytest.mark.parametrize("floor", [0.0, 0.02])
def test_distribution_axis_spans_the_mass_not_every_code(floor):
    d = _distribution(floor)
    assert d.values_ms.max() > 1e9  # the codes themselves reach far
    fig = distribution_figure(d, "a -> b")
    lo, hi = fig.axes[0].get_xlim()
    assert (lo, hi) == pytest.approx(axis_span(d.values_ms, d.probs))
    assert lo <= _quantile(d, 0.05) and hi >= _quantile(d, 0.95)
    assert 5 < lo and hi < 500  # the lognormal's mass lies within 15 to 110 ms
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    if floor:
        assert "off the axis" in texts  # the floor's mass is said, not hidden
    else:
        # nothing is cut: the axis holds the 0.1th to 99.9th percentiles
        assert lo <= _quantile(d, 0.001) and hi >= _quantile(d, 0.999)


def test_distribution_of_a_point_mass_still_has_an_axis():
    d = _distribution(0.0)
    probs = np.zeros_like(d.probs)
    probs[np.searchsorted(d.values_ms, 25.0)] = 1.0
    lo, hi = axis_span(d.values_ms, probs)
    assert lo < 25.0 < hi and hi / lo >= 4


def _points(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    actual = np.exp(rng.normal(np.log(50), 1.0, n))
    return actual * np.exp(rng.normal(0, 0.3, n)), actual


def test_few_points_are_drawn_large_and_half_opaque():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection

    pred, actual = _points(500)
    fig = plots.scatter_figure(pred, actual)
    (pts,) = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert pts.get_offsets().shape[0] == 500
    assert float(np.min(pts.get_sizes())) >= 8 and pts.get_alpha() >= 0.4
    plt.close(fig)


def test_many_points_become_a_hexbin_counting_every_packet():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    pred, actual = _points(20_000)
    pred[:10] = np.nan  # not drawn, not counted
    fig = plots.scatter_figure(pred, actual)
    hexes = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(hexes) == 1
    assert float(np.sum(hexes[0].get_array())) == 20_000 - 10
    assert len(fig.axes) == 2  # and a colour bar that says what a colour counts
    lo, hi = fig.axes[0].get_xlim()
    assert fig.axes[0].get_ylim() == (lo, hi)
    plt.close(fig)


def test_error_cdf_curves_differ_and_the_legend_is_beside_the_axes(tmp_path):
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(1)
    errors = {name: np.abs(rng.normal(0, s, 5000)) for name, s in
              (("model", 0.2), ("pair median", 0.21), ("global median", 0.6), ("vivaldi", 0.2), ("embedding", 0.22))}
    fig = plots.error_cdf_figure(errors, noise_floor=np.abs(rng.normal(0, 0.1, 5000)))
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if "median" in ln.get_label()]
    assert len(lines) == 6
    looks = {(ln.get_linestyle(), ln.get_marker(), ln.get_color()) for ln in lines}
    assert len(looks) == len(lines)  # no two predictors drawn alike
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # entirely right of the curves
    plt.close(fig)
    # and saved with it (bbox "tight"): the picture is wider than the axes' figure
    out = plots.plot_error_cdf(errors, tmp_path / "cdf.png")
    width = plt.imread(out).shape[1]
    assert width > 0.8 * 9.5 * 120


@pytest.mark.parametrize("figure", ["error_cdf", "scatter", "hexbin"])
def test_eval_figures_label_their_log_axes_without_mathtext(figure, monkeypatch):
    """Mathtext tick labels ($10^{-3}$) cost more CPU than the rest of an eval's plots: every
    label is plain text, and the log axes are still labelled."""
    import matplotlib.pyplot as plt
    from matplotlib import mathtext
    from matplotlib.text import Text

    parsed = []
    real = mathtext.MathTextParser.parse
    monkeypatch.setattr(mathtext.MathTextParser, "parse", lambda self, s, *a, **k: parsed.append(s) or real(self, s, *a, **k))
    if figure == "error_cdf":
        rng = np.random.default_rng(2)
        fig = plots.error_cdf_figure({"model": np.abs(rng.normal(0, 0.2, 3000))})
    else:
        fig = plots.scatter_figure(*_points(500 if figure == "scatter" else 20_000))
    fig.canvas.draw()
    texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    assert not [t for t in texts if "$" in t] and not parsed
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert ticks and all(any(c.isdigit() for c in t) for t in ticks)
    plt.close(fig)
