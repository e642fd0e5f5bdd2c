"""What a report shows once scored: one row per predictor (`summary_rows`), the advice in
sentences (`advice`), the plots (`write_plots`, drawn by `eval.plots`) and the per-packet
columns of predictions.parquet (`prediction_columns`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.eval import metrics as M, plots
from pingctl.eval.baselines import column
from pingctl.eval.report import Report

NOISE_FLOOR = "noise_floor"
QUANTILE_COLUMNS = {0.05: "p05", 0.25: "p25", 0.75: "p75", 0.95: "p95"}


def summary_rows(report: dict, slice: str = "all") -> list[dict]:
    """One flat row per predictor (report order) and the noise floor, for a table."""
    rows = []
    for name in report.get("order", []):
        e = report["predictors"][name]
        s = e["slices"].get(slice) or {}
        cal = e.get("calibration") or {}
        cov = cal.get("coverage") or {}
        crps = (e.get("crps") or {}).get(slice) or {}
        pit = cal.get("pit") or {}
        fail = e.get("failure") or {}
        fb = e.get("fallback") or {}
        rows.append({
            "predictor": name,
            "n": s.get("n"),
            "median_rel_err": s.get("median_rel_err"),
            "p90_rel_err": s.get("p90_rel_err"),
            "mae_ms": s.get("mae_ms"),
            "crps_ms": crps.get("mean_crps_ms"),
            "median_crps_ms": crps.get("median_crps_ms"),
            "cov50": cov.get("cov50"),
            "cov90": cov.get("cov90"),
            "pit_ks": pit.get("ks"),
            "brier": fail.get("brier"),
            "log_score": fail.get("log_score"),
            "auc": fail.get("auc"),
            "fallback_share": (1.0 - next(iter(fb.values()))) if fb else None,
        })
    nf = report.get("noise_floor")
    if nf:
        s = nf["slices"].get(slice) or {}
        rows.append({"predictor": NOISE_FLOOR, "n": s.get("n"), "median_rel_err": s.get("median_rel_err"),
                     "p90_rel_err": s.get("p90_rel_err"), "mae_ms": s.get("mae_ms"), "crps_ms": None,
                     "median_crps_ms": None, "cov50": None, "cov90": None,
                     "pit_ks": None, "brier": None, "log_score": None, "auc": None, "fallback_share": None})
    return rows


def advice(report: dict) -> list[str]:
    """What a user should ask for these packets, in sentences: the predictor with the lowest
    median relative error and the model against it (its interval), the sharpest distribution
    (median CRPS) and the best P(failure) (Brier score). From a report's `rows` and the model's
    comparisons; [] for a report without a model."""
    rows = {r["predictor"]: r for r in report.get("rows") or [] if r["predictor"] != NOISE_FLOOR}
    model = rows.get("model")
    if model is None or model.get("median_rel_err") is None:
        return []

    def best(key: str) -> str | None:
        have = {n: r[key] for n, r in rows.items() if r.get(key) is not None}
        return min(have, key=have.get) if have else None

    steps = ((report.get("predictors") or {}).get("model", {}).get("info") or {}).get("steps") or []
    who = f"the model (step {max(steps)})" if steps else "the model"
    out = []
    point = best("median_rel_err")
    if point == "model":
        out.append(f"RTT: ask {who}: the lowest median error here ({100 * model['median_rel_err']:.1f}%).")
    elif point is not None:
        c = ((report.get("comparisons") or {}).get("model") or {}).get(point) or {}
        how = {"worse": "behind it", "tie": "tied with it", "better": "ahead of it"}.get(c.get("verdict"), "")
        ci = (f" [{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}] points" if c.get("ci_low") is not None else "")
        out.append(f"RTT: use {point} ({100 * rows[point]['median_rel_err']:.1f}% median error); {who} has "
                   f"{100 * model['median_rel_err']:.1f}%, {how}{ci}"
                   + ("; a longer run or a larger preset is what closes that (docs/experiments-measures.md, "
                      "\"What a CPU budget buys\")."
                      if c.get("verdict") == "worse" else "."))
    dist = best("median_crps_ms")
    if dist is not None:
        out.append(f"Distribution: {dist} is sharpest where it is right (median CRPS "
                   f"{rows[dist]['median_crps_ms']:.1f} ms; the model's {model.get('median_crps_ms') or float('nan'):.1f} ms).")
    fail = best("brier")
    if fail is not None:
        out.append(f"Failure: {fail} gives the best P(failure) (Brier {rows[fail]['brier']:.4f}, log score "
                   f"{rows[fail]['log_score']:.4f} nats)" + ("." if fail == "model" or model.get("brier") is None else
                                                             f"; the model's Brier {model['brier']:.4f}."))
    return out


def is_plot_name(name: str, fmt: str = "png") -> bool:
    """A file name write_plots writes (with any predictor's scatter)."""
    return name in (f"error_cdf.{fmt}", f"calibration.{fmt}") or (name.startswith("scatter_") and name.endswith(f".{fmt}"))


def write_plots(report: Report, out_dir, names: list[str] | None = None, fmt: str = "png") -> dict[str, Path]:
    """error_cdf, calibration and scatter_<name> plots from the report's per-packet context."""
    ctx = getattr(report, "ctx", None)
    if not ctx:
        raise ValueError("write_plots needs a report returned by baseline_table (with .ctx)")
    out_dir = Path(out_dir)
    actual = ctx["actual"]
    preds = ctx["predictions"]
    names = [n for n in (names or report["order"]) if n in preds]
    paths: dict[str, Path] = {}
    errors = {n: M.relative_error(preds[n]["median"], actual) for n in names}
    tm = ctx.get("truth_median")
    nf = M.relative_error(tm, actual) if tm is not None else None
    paths["error_cdf"] = plots.plot_error_cdf(errors, out_dir / f"error_cdf.{fmt}", noise_floor=nf)
    pit = {n: preds[n]["pit"] for n in names if preds[n]["pit"] is not None}
    cov = {n: report["predictors"][n]["calibration"]["coverage"] for n in names
           if report["predictors"][n].get("calibration") and report["predictors"][n]["calibration"].get("coverage")}
    if pit or cov:
        paths["calibration"] = plots.plot_calibration(pit, cov, out_dir / f"calibration.{fmt}")
    for n in names:
        paths[f"scatter_{n}"] = plots.plot_scatter(preds[n]["median"], actual, out_dir / f"scatter_{n}.{fmt}", name=n)
    return paths


def prediction_columns(report: Report) -> tuple[dict, dict]:
    """(packet columns, {predictor: {field: float[n]}}) of a report's packets for
    `artifacts.eval_output.write_predictions`, predictors in report order."""
    ctx = report.ctx
    test = ctx["test"]
    packets = {"src": np.asarray(column(test, "src"), dtype=object), "dst": np.asarray(column(test, "dst"), dtype=object),
               "ip_version": ctx["ip_version"], "event_time": np.asarray(column(test, "event_time"), np.int64),
               "pair": ctx["pair"], "actual_rtt": ctx["actual"]}
    preds = {}
    for name in report["order"]:
        a = ctx["predictions"][name]
        q = a["quantiles"]
        if q is not None and not isinstance(q, dict):
            q = M.quantile_columns(q, M.QUANTILE_LEVELS)
        fields = {"median": a["median"], "p_fail": a["p_fail"], "pit": a["pit"], "crps": a["crps"]}
        for lv, col in QUANTILE_COLUMNS.items():
            fields[col] = None if q is None else q.get(lv)
        preds[name] = fields
    return packets, preds


def combined_line(table: list[dict]) -> str | None:
    """The regimes table's line on the combined answer (the model pooled with the regime's
    classical estimate, weight fitted on val: eval.combine): per regime its median relative
    error and CRPS, the weight on the model and its interval against the best classical."""
    rows = [r for r in table if r.get("combined_median_rel_err") is not None]
    if not rows:
        return None

    def one(r: dict) -> str:
        ci = ("" if r.get("combined_diff") is None else
              f", − {r['best']} {100 * r['combined_diff']:+.1f} [{100 * r['combined_ci_low']:+.1f}, "
              f"{100 * r['combined_ci_high']:+.1f}] {r.get('combined_verdict') or ''}".rstrip())
        crps = "-" if r.get("combined_crps_ms") is None else f"{r['combined_crps_ms']:,.1f}"
        cov = "" if r.get("combined_cov90") is None else f" cov90 {_pct(r.get('combined_cov90_raw'))} -> {_pct(r['combined_cov90'])}"
        return (f"{r['regime']} {100 * r['combined_median_rel_err']:.1f}% CRPS {crps} ms{cov} "
                f"(w {r['combined_weight']:.2f} on the model{_vouch(r)}, with {r['combined_estimate']}{ci})")

    return "combined answer (fitted and recalibrated on val): " + "; ".join(one(r) for r in rows)


def _vouch(r: dict) -> str:
    """Where val's mean preferred a weight the units could not vouch for, say so."""
    w, units = r.get("combined_min_crps_weight"), r.get("combined_units")
    if w is None or units is None or w == r["combined_weight"]:
        return ""
    if r["combined_weight"] == 0:
        return f"; val's mean alone: {w:.2f}, not vouched for over {units} {r.get('combined_unit') or 'unit'}s"
    return f"; val's mean alone: {w:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"
