"""Quantile recalibration (pingctl/infer/calibration.py): the map, its file, and its use in
`pingctl eval` and `pingctl sample`."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import calibration as CAL
from pingctl.infer.queries import RttDistribution, _code_table

runner = CliRunner()


def lognormal(median_ms: float, sigma: float, p_fail: float = 0.1) -> RttDistribution:
    """A model's answer on the RTT codes: lognormal mass per code (by its value's density)."""
    codes, values, _, _ = _code_table()
    v = np.maximum(values, 1e-3)
    dens = np.exp(-0.5 * ((np.log(v) - np.log(median_ms)) / sigma) ** 2)
    widths = np.gradient(v)  # codes are log-spaced: weigh each by the span it covers
    p = dens * np.abs(widths)
    return RttDistribution(p_fail, codes, values, p / p.sum())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=CAL.MIN_PACKETS, max_size=400))
def test_fitted_map_is_a_monotone_bijection_of_levels(pits):
    cal = CAL.fit(pits, {})
    assert cal.knots[0] == 0.0 and cal.knots[-1] == 1.0 and (np.diff(cal.knots) > 0).all()
    q = np.linspace(0, 1, 57)
    assert np.allclose(cal.level(cal.raw_level(q)), q, atol=1e-9)
    assert (np.diff(cal.level(q)) >= 0).all()
    assert cal.meta["packets"] == len(pits)


def test_too_few_packets_make_no_map():
    with pytest.raises(UsageError, match=f"at least {CAL.MIN_PACKETS}"):
        CAL.fit([0.5] * (CAL.MIN_PACKETS - 1) + [np.nan] * 100, {})


def test_uniform_pits_leave_the_distribution_as_it_is():
    cal = CAL.fit(np.linspace(0, 1, 1001), {})
    d = lognormal(40.0, 0.2)
    c = cal.apply(d)
    assert c.p_fail == d.p_fail and c.codes is d.codes
    assert c.probs.sum() == pytest.approx(1.0)
    for q in (0.05, 0.25, 0.5, 0.75, 0.95):
        assert c.quantile(q) == pytest.approx(d.quantile(q), rel=0.01)


def test_recalibration_restores_the_coverage_of_an_overconfident_model():
    """The model says lognormal(50 ms, 0.1); the truth is twice as wide. Fitted on one sample of
    packets, the map gives central intervals that cover as they should on a fresh sample."""
    rng = np.random.default_rng(0)
    model = lognormal(50.0, 0.1)
    fit_rtts = np.exp(rng.normal(np.log(50.0), 0.2, 3000))
    cal = CAL.fit([model.cdf(a) for a in fit_rtts], {})
    fresh = np.exp(rng.normal(np.log(50.0), 0.2, 3000))
    calibrated = cal.apply(model)

    def coverage(d, lo, hi):
        return float(((fresh >= d.quantile(lo)) & (fresh <= d.quantile(hi))).mean())

    assert coverage(model, 0.25, 0.75) < 0.32 and coverage(model, 0.05, 0.95) < 0.62
    assert coverage(calibrated, 0.25, 0.75) == pytest.approx(0.50, abs=0.03)
    assert coverage(calibrated, 0.05, 0.95) == pytest.approx(0.90, abs=0.02)
    # symmetric errors: the median stays at the truth's (50 ms; the fitting sample's within ~1%)
    assert calibrated.quantile(0.5) == pytest.approx(50.0, rel=0.02)
    assert calibrated.probs.sum() == pytest.approx(1.0) and calibrated.p_fail == model.p_fail


def test_calibration_file_round_trips_and_bad_files_are_named(tmp_path):
    cal = CAL.fit(np.random.default_rng(1).beta(2, 2, 200), {"run": "r", "steps": [5]})
    path = CAL.save(cal, tmp_path / "calibration.json")
    back = CAL.load(path)
    assert np.array_equal(back.knots, cal.knots) and back.meta == cal.meta and back.path == str(path)
    with pytest.raises(UsageError, match="no such file"):
        CAL.load(tmp_path / "missing.json")
    raw = json.loads(path.read_text())
    for name, change, field in (("kind", {"kind": "report"}, "kind"),
                                ("knots", {"knots": raw["knots"][::-1]}, "knots"),
                                ("short", {"knots": raw["knots"][:10]}, "knots"),
                                ("levels", {"levels": [0, 1]}, "levels")):
        bad = tmp_path / f"{name}.json"
        bad.write_text(json.dumps({**raw, **change}))
        with pytest.raises(PingctlError, match=f"{bad}.*field {field}"):
            CAL.load(bad)
    r = runner.invoke(app, ["inspect", str(tmp_path / "knots.json")])
    assert r.exit_code != 0 and "knots.json: field knots" in r.output and "Traceback" not in r.output
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(PingctlError, match="text.json: not readable as JSON"):
        CAL.load(tmp_path / "text.json")


def test_a_map_is_refused_for_another_run_step_prompt_or_its_own_packets(tmp_path):
    meta = {"run": str(tmp_path / "run"), "steps": [59], "fitted_on": str(tmp_path / "val"),
            "context_policy": "cold", "context_measurements": 16, "context_per_pair": 1}
    cal = CAL.fit(np.linspace(0, 1, 50), meta)
    CAL.check_fits(cal, tmp_path / "run", [59], {"context_policy": "cold", "context_measurements": 16,
                                                  "context_per_pair": 1}, scored=tmp_path / "test")
    with pytest.raises(UsageError, match="fitted for run"):
        CAL.check_fits(cal, tmp_path / "other", [59])
    with pytest.raises(UsageError, match=r"step\(s\) \[59\].*step\(s\) \[40\]"):
        CAL.check_fits(cal, tmp_path / "run", [40])
    with pytest.raises(UsageError, match="context_policy 'cold'.*'probe'"):
        CAL.check_fits(cal, tmp_path / "run", [59], {"context_policy": "probe"})
    with pytest.raises(UsageError, match="the split being evaluated"):
        CAL.check_fits(cal, tmp_path / "run", [59], scored=tmp_path / "val")
    # a map pooled over several val sets (eval --regimes) is refused on any of them
    pooled = CAL.fit(np.linspace(0, 1, 50), {**meta, "fitted_on": [str(tmp_path / "val_pair"),
                                                                   str(tmp_path / "val_probe")]})
    assert CAL.fitted_on(pooled) == [str(tmp_path / "val_pair"), str(tmp_path / "val_probe")]
    CAL.check_fits(pooled, tmp_path / "run", [59], scored=tmp_path / "test_probe")
    with pytest.raises(UsageError, match="the split being evaluated"):
        CAL.check_fits(pooled, tmp_path / "run", [59], scored=tmp_path / "val_probe")
    # ... and says which splits it was fitted on, in `inspect` and in `sample --pairs`' label
    from pingctl.cli.sample_pairs import calibration_label

    CAL.save(pooled, tmp_path / "pooled.json")
    shown = runner.invoke(app, ["inspect", str(tmp_path / "pooled.json"), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["fitted_on"] == CAL.fitted_on(pooled)
    assert runner.invoke(app, ["inspect", str(tmp_path / "pooled.json")]).exit_code == 0
    assert f"packets of {tmp_path / 'val_pair'} + {tmp_path / 'val_probe'}," in calibration_label(
        CAL.load(tmp_path / "pooled.json"))
    assert CAL.prompt_mismatch(cal, has_context=True) is None
    assert "has no --context" in CAL.prompt_mismatch(cal, has_context=False)
    bare = CAL.fit(np.linspace(0, 1, 50), {**meta, "context_policy": "none"})
    assert CAL.prompt_mismatch(bare, has_context=False) is None
    assert "without context" in CAL.prompt_mismatch(bare, has_context=True)


def test_eval_fits_on_val_and_applies_on_test_and_sample_uses_it(tiny_run, time_split, pair, tmp_path):
    common = ["--train", str(time_split / "train"), "--context", "4", "--json"]
    val_out, test_out = tmp_path / "val", tmp_path / "test"
    r = runner.invoke(app, ["eval", str(tiny_run), *common, "--test", str(time_split / "val"), "--queries", "60",
                            "-o", str(val_out)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    cal_path = val_out / "calibration.json"
    assert rep["calibration"]["fitted"] == str(cal_path) and rep["calibration"]["applied"] is None
    cal = CAL.load(cal_path)
    assert cal.meta["packets"] == rep["predictors"]["model"]["slices"]["all"]["n"]  # its successful packets
    assert cal.meta["steps"] == rep["predictors"]["model"]["info"]["steps"]
    assert cal.meta["context_policy"] == "probe" and cal.meta["context_measurements"] == 4
    # inspect: how the raw model covered those packets, from the map alone
    shown = json.loads(runner.invoke(app, ["inspect", str(cal_path), "--json"]).stdout)
    assert shown["kind"] == "calibration" and shown["packets"] == cal.meta["packets"]
    cov = rep["predictors"]["model"]["calibration"]["coverage"]
    assert shown["raw_coverage"]["cov50"] == pytest.approx(cov["cov50"], abs=0.05)
    assert shown["raw_coverage"]["cov90"] == pytest.approx(cov["cov90"], abs=0.05)
    text = runner.invoke(app, ["inspect", str(cal_path)])
    assert text.exit_code == 0 and "central 50% covered" in text.output

    r = runner.invoke(app, ["eval", str(tiny_run), *common, "--test", str(time_split / "test"), "--queries", "40",
                            "-o", str(test_out), "--calibration", str(cal_path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["order"][:2] == ["model", "model_calibrated"]
    mc = rep["predictors"]["model_calibrated"]
    assert mc["info"]["calibration"] == str(cal_path) and mc["info"]["packets"] == cal.meta["packets"]
    assert mc["calibration"]["coverage"]["cov50"] is not None
    assert set(rep["comparisons"]["model_calibrated"]) == set(rep["comparisons"]["model"]) == \
        set(rep["order"]) - {"model", "model_calibrated"}
    assert rep["calibration"]["applied"] == str(cal_path)
    # the table's verdicts: each reading of the model against the baselines, neither against the other
    shown = runner.invoke(app, ["inspect", str(test_out)]).output
    assert "model minus each predictor" in shown and "verdict: the model beats" in shown
    assert "model_calibrated minus each predictor" in shown and "verdict: the model_calibrated beats" in shown
    # the same packets: the raw model's numbers do not depend on the map
    plain = runner.invoke(app, ["eval", str(tiny_run), *common, "--test", str(time_split / "test"), "--queries",
                                "40", "-o", str(tmp_path / "plain")])
    assert json.loads(plain.stdout)["predictors"]["model"]["slices"] == rep["predictors"]["model"]["slices"]

    # refused: on its own packets, under another prompt shape
    r = runner.invoke(app, ["eval", str(tiny_run), *common, "--test", str(time_split / "val"), "--queries", "40",
                            "-o", str(tmp_path / "x"), "--calibration", str(cal_path)])
    assert r.exit_code != 0 and "the split being evaluated" in r.output
    r = runner.invoke(app, ["eval", str(tiny_run), *common, "--test", str(time_split / "test"),
                            "--context-policy", "none", "-o", str(tmp_path / "y"), "--calibration", str(cal_path)])
    assert r.exit_code != 0 and "context_policy 'probe'" in r.output

    src, dst = pair
    raw = json.loads(runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--json"]).stdout)
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--json",
                            "--calibration", str(cal_path)])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["calibration"]["path"] == str(cal_path) and got["p_fail"] == raw["p_fail"]
    qs = [got[f"p{q}_ms"] for q in (5, 25, 50, 75, 95)]
    assert qs == sorted(qs)
    # the calibrated quantiles are the raw distribution's at the map's levels
    for q in (5, 25, 50, 75, 95):
        assert got[f"p{q}_ms"] == pytest.approx(_raw_quantile(tiny_run, src, dst, float(cal.raw_level(q / 100))),
                                                 rel=1e-6)
    # --pairs: the same map on every row, read exactly where the recalibrated quantiles fall
    (tmp_path / "pairs.csv").write_text(f"src,dst\n{src},{dst}\n")
    r = runner.invoke(app, ["sample", str(tiny_run), "--pairs", str(tmp_path / "pairs.csv"), "--json",
                            "--calibration", str(cal_path)])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows["calibration"] == str(cal_path)
    for q in (5, 25, 50, 75, 95):
        assert rows["predictions"][0][f"p{q}_ms"] == pytest.approx(got[f"p{q}_ms"], rel=1e-3)
    r = runner.invoke(app, ["sample", str(tiny_run), "--src", src, "--dst", dst, "--calibration", str(cal_path)])
    assert r.exit_code == 0 and "calibration" in r.output and "fitted on" in r.output
    # fitted on prompts with 4 context measurements, asked with none: said, not refused
    assert "note: " in r.output and "this question has no --context" in r.output
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--calibration", str(cal_path)])
    assert r.exit_code != 0 and "--calibration does not apply to generation" in r.output


def _raw_quantile(run, src, dst, level):
    from pingctl.infer import queries as Q
    from pingctl.infer.model import LoadedModel

    model = LoadedModel.load(run)
    return Q.rtt_distribution(model, Q.query_prefix(src, dst, None, np.zeros(0, np.int32), None)).quantile(level)
