"""`pingctl eval`: the model and every baseline on the same held-out packets."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pingctl.artifacts.eval_output import report_path, write_predictions
from pingctl.artifacts.run import run_config
from pingctl.artifacts.table import load_split, take
from pingctl.atomic import unwritable_reason, write_json
from pingctl.context import FAIR, check_policy
from pingctl.errors import PingctlError, UsageError
from pingctl.eval.hints import hinted, prompt_hints
from pingctl.eval.model import predict
from pingctl.eval.presentation import is_plot_name, prediction_columns, summary_rows, write_plots
from pingctl.eval.report import add_predictor, add_prompt_baselines, baseline_table, compare
from pingctl.infer import calibration as CAL
from pingctl.infer.model import LoadedModel
from pingctl.infer.runtime import check_hardware
from pingctl.infer.queries import check_per_pair
from pingctl.synth.truth import load_truth


def check_options(policy: str, hardware: str | None, per_pair: int | None, queries: int, context: int,
                  context_dst: int | None, seed: int) -> None:
    """The options every eval checks before it reads a split or loads the model."""
    if policy == FAIR:
        raise UsageError(f"--context-policy {FAIR} gives each regime its own prompt: it goes with --regimes")
    check_policy(policy)
    check_hardware(hardware)
    check_per_pair(per_pair)
    if queries < 1 or context < 0:
        raise UsageError(f"need queries >= 1 and context >= 0 (got {queries}, {context})")
    if context_dst is not None and context_dst < 0:
        raise UsageError(f"--context-dst {context_dst}: a count >= 0 of the destination side (--context-policy both)")
    if seed < 0:
        raise UsageError(f"seed must be >= 0 (got {seed})")


def evaluate(run: Path, train_path: Path, test_path: Path, out: Path, truth: Path | None = None,
             queries: int = 300, context: int = 16, seed: int = 0, step: int | list[int] | None = None,
             vivaldi_cycles: int = 1000, policy: str = "probe", per_pair: int | None = None,
             hardware: str | None = None, calibration: Path | None = None, context_dst: int | None = None,
             hints: bool | None = None, progress=lambda _step, _done=0, _total=None: None) -> dict:
    """Model and baselines on the same `queries` test packets; writes report.json, plots and
    predictions.parquet (one row per packet, every predictor's figures: artifacts.eval_output).

    `policy` picks the prompt's context (see pingctl/eval/model.py): probe | cold | none | both
    (`context` of the source side, `context_dst` of the destination side, from `train_path`);
    `per_pair` caps measurements per (src, dst) pair in it (None: as the run was trained);
    `hardware` (cpu | gpu) runs the model there (None: as the run was trained).
    `calibration`: a calibration.json fitted by an eval of the same run on other packets (val);
    adds the predictor model_calibrated. Every eval writes the map fitted on its own packets to
    `out`/calibration.json (pingctl/infer/calibration.py).
    `hints`: `both` prompts carry the embedding's estimate (None: as the run was trained,
    `eval.hints.hinted`).
    `progress(step, done, total)` is called per phase and per chunk of model predictions."""
    # before the splits and the model are loaded
    check_options(policy, hardware, per_pair, queries, context, context_dst, seed)
    # fail on an unusable --out now, not after minutes of predictions
    out = Path(out)
    check_out_dir(out)
    # the cheap checks of the run and the truth before minutes of splits, baselines and model
    trained = run_config(run)
    if truth is not None:
        load_truth(truth)
    cal = CAL.load(calibration) if calibration is not None else None
    if cal is not None:  # the cheap part of its check; the checkpoint's is after the load
        CAL.check_fits(cal, run, cal.meta.get("steps") or [],
                       {"context_policy": policy, "context_measurements": context}, scored=test_path)
    t0 = time.perf_counter()
    progress("loading splits")
    train = load_split(train_path, split_hint="train")
    test = load_split(test_path)
    if len(test["rtt"]) == 0:
        raise PingctlError(f"{test_path}: no test rows")
    if len(train["rtt"]) == 0:
        raise PingctlError(f"{train_path}: no train rows (the baselines are fitted on them)")
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(test["rtt"]), size=min(queries, len(test["rtt"])), replace=False))
    sub = take(test, idx)
    progress("fitting baselines")
    report = baseline_table(train, sub, truth=str(truth) if truth else None, vivaldi_cycles=vivaldi_cycles, seed=seed)
    progress(f"loading the model from {run}")
    model = LoadedModel.load(run, step, hardware)
    progress(f"model predictions for {len(idx)} packets")
    t1 = time.perf_counter()
    if per_pair is None:  # as the run's training contexts were shaped
        per_pair = trained.loader.triangulation_per_pair if policy == "both" else model.max_per_pair
    prompt = {"context_policy": policy, "context_measurements": context, "context_per_pair": per_pair}
    if policy == "both":
        prompt["context_dst"] = context if context_dst is None else context_dst
    if hinted(trained, policy, hints):
        prompt["hint"] = "embedding"
    if cal is not None:
        CAL.check_fits(cal, run, model.steps, prompt)
    pred = predict(model, test, idx, context=context, train=train, policy=policy, per_pair=per_pair,
                   calibration=cal, context_dst=prompt.get("context_dst"),
                   hints=prompt_hints(trained, report.ctx.get("fitted") or {}, policy, hints),
                   progress=lambda done, total: progress("model predictions", done, total))
    model_s = time.perf_counter() - t1
    q = pred["quantiles"]
    add_predictor(report, "model", pred["median"], quantiles={0.05: q[:, 0], 0.25: q[:, 1], 0.75: q[:, 2], 0.95: q[:, 3]},
                  pit=pred["pit"], p_fail=pred["p_fail"], crps=pred["crps"],
                  info={"run": str(run), "step": model.step, "steps": list(model.steps), "context_measurements": context,
                        "context_policy": policy, "context_per_pair": per_pair, "timestamps": model.timestamps, "device": model.device, "context_sizes": pred["context_sizes"], "seconds": round(model_s, 2),
                        "context_dst": prompt.get("context_dst"), "context_examples": pred["context_examples"]})
    if cal is not None:
        c = pred["calibrated"]
        cq = c["quantiles"]
        add_predictor(report, "model_calibrated", c["median"],
                      quantiles={0.05: cq[:, 0], 0.25: cq[:, 1], 0.75: cq[:, 2], 0.95: cq[:, 3]},
                      pit=c["pit"], p_fail=c["p_fail"], crps=c["crps"],
                      info={"calibration": cal.path, "fitted_on": cal.meta.get("fitted_on"),
                            "packets": cal.meta.get("packets")})
    if policy == "probe":
        _add_context_median(report, pred["context_median"])
    if policy != "none":  # what the prompts hold, read by classical predictors
        add_prompt_baselines(report, pred["pool"], pred["contexts"], seed=seed)
    # show the model first
    first = ["model", "model_calibrated"]
    report["order"] = [n for n in first if n in report["order"]] + [n for n in report["order"] if n not in first]
    report["comparisons"] = {"model": compare(report, "model", seed=seed)}
    if cal is not None:
        # each against the baselines, not against the other: one model read two ways is not a rival
        report["comparisons"]["model"].pop("model_calibrated")
        report["comparisons"]["model_calibrated"] = compare(report, "model_calibrated", seed=seed)
        report["comparisons"]["model_calibrated"].pop("model")
    report["nll"] = pred["nll"]
    report["queries"] = int(len(idx))
    report["inputs"] = {"run": str(run), "train": str(train_path), "test": str(test_path), "truth": str(truth) if truth else None}
    out.mkdir(parents=True, exist_ok=True)
    report["calibration"] = fit_calibration(pred["pit"], out, {
        "run": str(Path(run).resolve()), "steps": list(model.steps), "fitted_on": str(Path(test_path).resolve()),
        "seed": seed, **prompt}) | {"applied": cal.path if cal is not None else None}
    progress("writing plots")
    plots = write_plots(report, out)
    _drop_stale_plots(out, plots.values())
    report["plots"] = {k: str(v) for k, v in plots.items()}
    report["rows"] = summary_rows(report)
    packets, columns = prediction_columns(report)
    report["predictions"] = str(write_predictions(out, packets, columns, {"run": str(run), "test": str(test_path),
                                                                          **prompt}))
    report["elapsed_s"] = time.perf_counter() - t0
    write_json(report_path(out), dict(report))
    return report


def fit_calibration(pit, out: Path, meta: dict, name: str = "calibration.json") -> dict:
    """The recalibration map of these packets into out/`name`, for use on others;
    too few successful packets: no map (and none left from an earlier eval here)."""
    path = out / name
    try:
        cal = CAL.fit(pit, meta)
    except UsageError as e:
        path.unlink(missing_ok=True)
        return {"fitted": None, "reason": str(e)}
    CAL.save(cal, path)
    return {"fitted": str(path), "packets": cal.meta["packets"]}


def _drop_stale_plots(out: Path, written) -> None:
    """An eval rerun into the same directory: plots of an earlier one that this one did not draw
    (another policy, another predictor set) must not sit beside the new report as if its own.
    Only names eval itself writes are touched; anything else in the directory stays."""
    keep = {Path(p).name for p in written}
    for p in out.iterdir():
        if is_plot_name(p.name) and p.name not in keep and p.is_file():
            p.unlink()


def check_out_dir(out: Path) -> None:
    """The report directory can be created (without creating it: a failed run leaves nothing)."""
    if reason := unwritable_reason(report_path(out)):
        raise PingctlError(f"--out {out}: cannot create the report directory ({reason})")


def _add_context_median(report, cm: dict) -> None:
    """The pair's history median from the prompt itself, else the global median (per family)."""
    glob = report.ctx["predictions"]["global_median"]
    used = cm["used"]
    median = np.where(used, cm["median"], glob["median"])
    p_fail = cm["p_fail"]
    if glob["p_fail"] is not None:
        p_fail = np.where(np.isfinite(p_fail), p_fail, glob["p_fail"])
    entry = add_predictor(report, "context_median", median, p_fail=p_fail if np.isfinite(p_fail).all() else None)
    share = float(used.mean()) if len(used) else 0.0
    entry["fallback"] = {"context": share, "global": 1.0 - share}
