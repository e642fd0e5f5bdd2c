"""`pingctl eval RUN --regimes SPLITDIR`: one model on the four test sets of a
`pingctl shard --strategy regimes` split, each against the strongest classical predictor that
has the same information as the model's prompt (docs/eval.md, "The regimes table").

The baselines are fitted once on SPLITDIR/train; on each regime's test set every one of them
predicts the same seeded subset of packets the model answers, beside the predictors that read
the model's own prompts (`prompt_median`, `vivaldi_refit`, `embedding_refit`:
report.add_prompt_baselines). The model's distributions are recalibrated with a map fitted on
SPLITDIR/val (`model_calibrated`). Which baseline a regime is judged against is fixed before
any test packet is looked at (BEST; the pair regime's between Vivaldi and the embedding by
their error on val).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pingctl.artifacts.eval_output import REGIMES_MODE, report_path, write_predictions
from pingctl.artifacts.run import run_config
from pingctl.artifacts.table import REGIMES, regime_test_dirs
from pingctl.atomic import write_json
from pingctl.errors import PingctlError
from pingctl.eval import metrics as M
from pingctl.eval.model import predict
from pingctl.eval.report import (add_predictor, add_prompt_baselines, baseline_table, compare, default_baselines,
                                 load_split, prediction_columns, summary_rows, take)
from pingctl.eval.run import check_options, check_out_dir, fit_calibration
from pingctl.infer import calibration as CAL
from pingctl.infer.model import LoadedModel
from pingctl.synth.truth import load_truth

# The classical predictor each regime is judged against, fixed before any test packet is seen:
# the candidates, in order; the first is taken unless val can choose (`choose_on_val`).
BEST = {
    "time": ("pair_median",),  # the pair's own history
    "pair": ("embedding", "vivaldi"),  # both ends known, the pair never seen: coordinates
    "probe": ("embedding_refit",),  # the new source placed from its prompt measurements
    "target": ("embedding_refit",),  # the new destination likewise
}
CHOSEN_ON_VAL = ("pair",)
# Under the `probe` policy a prompt holds the queried pair's own earlier packets (drawn from the
# test set itself), which no coordinate system can match: outside the time regime the baseline
# with that information is the prompt's median of them.
BEST_PROBE_POLICY = {"pair": ("prompt_median",), "probe": ("prompt_median",), "target": ("prompt_median",)}


def best_candidates(regime: str, policy: str) -> tuple[str, ...]:
    return (BEST_PROBE_POLICY if policy == "probe" else {}).get(regime, BEST[regime])


def _sample(n: int, queries: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(queries, n), replace=False))


def _quantile_dict(q: np.ndarray) -> dict:
    return {0.05: q[:, 0], 0.25: q[:, 1], 0.75: q[:, 2], 0.95: q[:, 3]}


def choose_on_val(fitted: dict, val: dict | None, queries: int, seed: int, policy: str = "cold") -> dict:
    """For each regime in CHOSEN_ON_VAL with more than one candidate (`best_candidates`), the
    one with the lowest median relative error on a seeded subset of val packets (the baselines
    fitted on train); otherwise, or without val packets, the first. Returns {regime: {"best",
    "chosen_on", "val_median_rel_err"}}."""
    out = {}
    for regime in BEST:
        cands = best_candidates(regime, policy)
        if regime not in CHOSEN_ON_VAL or len(cands) < 2 or val is None or not len(val["rtt"]):
            out[regime] = {"best": cands[0], "chosen_on": "a priori", "val_median_rel_err": None}
            continue
        sub = take(val, _sample(len(val["rtt"]), queries, seed))
        err = {c: M.error_summary(fitted[c].predict(sub).median, sub["rtt"])["median_rel_err"] for c in cands}
        scored = {c: e for c, e in err.items() if e is not None}
        best = min(scored, key=scored.get) if scored else cands[0]
        out[regime] = {"best": best, "chosen_on": "val" if scored else "a priori", "val_median_rel_err": err}
    return out


def regime_row(regime: str, report: dict, best: str, seed: int = 0) -> dict:
    """The regimes table's row: the model against `best` on one regime's packets."""
    ctx = report.ctx
    p = report["predictors"]
    comp = M.median_difference(M.relative_error(ctx["predictions"]["model"]["median"], ctx["actual"]),
                               M.relative_error(ctx["predictions"][best]["median"], ctx["actual"]), ctx["pair"],
                               seed=seed)

    def fig(name, key):
        e = p.get(name) or {}
        if key == "crps":
            return ((e.get("crps") or {}).get("all") or {}).get("mean_crps_ms")
        if key in ("cov50", "cov90"):
            return (((e.get("calibration") or {}).get("coverage")) or {}).get(key)
        if key == "auc":
            return (e.get("failure") or {}).get("auc")
        return e["slices"]["all"].get(key) if e else None

    m, b = fig("model", "median_rel_err"), fig(best, "median_rel_err")
    baselines = [n for n in report["order"] if not n.startswith("model")]
    errs = {n: fig(n, "median_rel_err") for n in baselines}
    best_on_test = min((n for n in baselines if errs[n] is not None), key=errs.get, default=None)
    if best_on_test is not None and b is not None and not errs[best_on_test] < b:
        best_on_test = best  # no other baseline did strictly better
    return {
        "regime": regime, "packets": report["queries"], "pairs": comp["groups"], "compared": comp["n"],
        "model_median_rel_err": m, "model_p90_rel_err": fig("model", "p90_rel_err"), "model_crps_ms": fig("model", "crps"),
        "best": best, "best_median_rel_err": b, "best_p90_rel_err": fig(best, "p90_rel_err"),
        "best_crps_ms": fig(best, "crps"),
        "ratio": (m / b) if m is not None and b else None,
        "diff": comp["diff"], "ci_low": comp["ci_low"], "ci_high": comp["ci_high"], "level": comp["level"],
        "verdict": comp["verdict"],
        "crps_below_every_baseline": _crps_below_all(report, baselines),
        "cov50": fig("model", "cov50"), "cov90": fig("model", "cov90"),
        "cov50_calibrated": fig("model_calibrated", "cov50"), "cov90_calibrated": fig("model_calibrated", "cov90"),
        "model_fail_auc": fig("model", "auc"),
        "best_on_test": best_on_test, "best_on_test_median_rel_err": errs.get(best_on_test),
        "best_fallback": (p.get(best) or {}).get("fallback"),
    }


def _crps_below_all(report: dict, baselines: list[str]) -> bool | None:
    p = report["predictors"]

    def crps(n):
        return ((p[n].get("crps") or {}).get("all") or {}).get("mean_crps_ms")

    m = crps("model")
    others = [crps(n) for n in baselines if crps(n) is not None]
    return None if m is None or not others else bool(m < min(others))


def evaluate_regimes(run: Path, split_dir: Path, out: Path, truth: Path | None = None, queries: int = 300,
                     context: int = 16, seed: int = 0, step: int | list[int] | None = None,
                     vivaldi_cycles: int = 1000, policy: str = "probe", per_pair: int | None = None,
                     hardware: str | None = None, context_dst: int | None = None,
                     progress=lambda _step, _done=0, _total=None: None) -> dict:
    """The model and every baseline on `queries` packets of each regime's test set of
    `split_dir`; writes OUT/report.json (mode "regimes": the table and one full report per
    regime), OUT/predictions.parquet (every packet of every regime) and OUT/calibration.json
    (the map fitted on val). Options as `eval.run.evaluate`."""
    check_options(policy, hardware, per_pair, queries, context, context_dst, seed)
    out, split_dir = Path(out), Path(split_dir)
    tests = regime_test_dirs(split_dir)
    train_path, val_path = split_dir / "train", split_dir / "val"
    check_out_dir(out)
    trained = run_config(run)
    if truth is not None:
        load_truth(truth)
    t0 = time.perf_counter()
    progress("loading the train split")
    train = load_split(train_path, split_hint="train")
    if not len(train["rtt"]):
        raise PingctlError(f"{train_path}: no train rows (the baselines are fitted on them)")
    progress("fitting baselines on train")
    fitted, fit_s = {}, {}
    for name, b in default_baselines(seed=seed, vivaldi_cycles=vivaldi_cycles).items():
        t = time.perf_counter()
        fitted[name] = b.fit(train)
        fit_s[name] = round(time.perf_counter() - t, 3)
    progress(f"loading the model from {run}")
    model = LoadedModel.load(run, step, hardware)
    if per_pair is None:  # as the run's training contexts were shaped
        per_pair = trained.loader.triangulation_per_pair if policy == "both" else model.max_per_pair
    prompt = {"context_policy": policy, "context_measurements": context, "context_per_pair": per_pair}
    if policy == "both":
        prompt["context_dst"] = context if context_dst is None else context_dst

    def ask(split: dict, idx: np.ndarray, cal, what: str) -> dict:
        progress(f"model predictions ({what})", 0, len(idx))
        return predict(model, split, idx, context=context, train=train, policy=policy, per_pair=per_pair,
                       calibration=cal, context_dst=prompt.get("context_dst"),
                       progress=lambda done, total: progress(f"model predictions ({what})", done, total))

    # val: the recalibration map and the pair regime's choice of baseline
    val = load_split(val_path) if (val_path.is_dir() and any(val_path.glob("*.parquet"))) else None
    cal, calibration = None, {"fitted": None, "reason": f"no val split in {split_dir}"}
    out.mkdir(parents=True, exist_ok=True)
    if val is not None and len(val["rtt"]):
        vidx = _sample(len(val["rtt"]), queries, seed)
        vpred = ask(val, vidx, None, "val")
        calibration = fit_calibration(vpred["pit"], out, {
            "run": str(Path(run).resolve()), "steps": list(model.steps), "fitted_on": str(val_path.resolve()),
            "seed": seed, **prompt})
        if calibration.get("fitted"):
            cal = CAL.load(Path(calibration["fitted"]))
    choice = choose_on_val(fitted, val, queries, seed, policy)
    regimes, table, packets, preds = {}, [], [], []
    for regime in REGIMES:
        path = tests[regime]
        test = load_split(path)
        if not len(test["rtt"]):
            table.append({"regime": regime, "packets": 0, "best": choice[regime]["best"], "verdict": None,
                          "note": f"{path}: no test rows"})
            continue
        idx = _sample(len(test["rtt"]), queries, seed)
        sub = take(test, idx)
        progress(f"{regime}: baselines")
        report = baseline_table(train, sub, truth=str(truth) if truth else None, baselines=dict(fitted), fitted=True,
                                seed=seed)
        t1 = time.perf_counter()
        pred = ask(test, idx, cal, regime)
        add_predictor(report, "model", pred["median"], quantiles=_quantile_dict(pred["quantiles"]), pit=pred["pit"],
                      p_fail=pred["p_fail"], crps=pred["crps"],
                      info={"run": str(run), "steps": list(model.steps), **prompt, "device": model.device,
                            "context_sizes": pred["context_sizes"], "seconds": round(time.perf_counter() - t1, 2)})
        if cal is not None:
            c = pred["calibrated"]
            add_predictor(report, "model_calibrated", c["median"], quantiles=_quantile_dict(c["quantiles"]),
                          pit=c["pit"], p_fail=c["p_fail"], crps=c["crps"], info={"calibration": cal.path})
        progress(f"{regime}: baselines that read the prompt")
        add_prompt_baselines(report, pred["pool"], pred["contexts"], seed=seed, refit=True)
        first = ["model", "model_calibrated"]
        report["order"] = [n for n in first if n in report["order"]] + [n for n in report["order"] if n not in first]
        report["comparisons"] = {"model": compare(report, "model", seed=seed)}
        report["nll"] = pred["nll"]
        report["queries"] = int(len(idx))
        report["inputs"] = {"test": str(path)}
        report["rows"] = summary_rows(report)
        best = choice[regime]["best"]
        report["best"] = {"name": best, **choice[regime]}
        table.append(regime_row(regime, report, best, seed))
        regimes[regime] = dict(report)
        pk, pr = prediction_columns(report)
        packets.append({**pk, "regime": np.full(len(idx), regime, dtype=object)})
        preds.append(pr)
    result = {
        "mode": REGIMES_MODE, "table": table, "regimes": regimes, "choice": choice, "calibration": calibration,
        "inputs": {"run": str(run), "splits": str(split_dir), "train": str(train_path),
                   "val": str(val_path) if val is not None else None, "truth": str(truth) if truth else None},
        "prompt": prompt, "queries": queries, "seed": seed, "fit_s": fit_s,
        "baselines_info": {n: getattr(b, "fit_info", None) for n, b in fitted.items() if getattr(b, "fit_info", None)},
    }
    if packets:
        names = list(dict.fromkeys(n for pr in preds for n in pr))
        cols = {k: np.concatenate([p[k] for p in packets]) for k in packets[0]}
        merged = {n: {f: _concat([pr.get(n, {}).get(f) for pr in preds], [len(p["actual_rtt"]) for p in packets])
                      for f in ("median", "p05", "p25", "p75", "p95", "p_fail", "pit", "crps")} for n in names}
        result["predictions"] = str(write_predictions(out, cols, merged, {"run": str(run), "splits": str(split_dir),
                                                                          **prompt}))
    result["elapsed_s"] = time.perf_counter() - t0
    write_json(report_path(out), result)
    return result


def _concat(parts: list, sizes: list[int]) -> np.ndarray | None:
    if all(p is None for p in parts):
        return None
    return np.concatenate([np.full(n, np.nan) if p is None else np.asarray(p, np.float64) for p, n in zip(parts, sizes)])
