"""`pingctl eval`: the model and every baseline on the same held-out packets."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pingctl.artifacts.eval_output import Resume, report_path, write_predictions
from pingctl.artifacts.run import run_config
from pingctl.artifacts.table import load_split, take
from pingctl.atomic import unwritable_reason, write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.eval.combine import NOT_FITTED_PLAIN
from pingctl.eval.hints import prompt_hints
from pingctl.eval.model import predict
from pingctl.eval.presentation import is_plot_name, prediction_columns, summary_rows, write_plots
from pingctl.eval.report import add_model, add_predictor, add_prompt_baselines, baseline_table, compare, model_first
from pingctl.infer import calibration as CAL
from pingctl.infer.model import LoadedModel
from pingctl.infer.queries import check_per_pair
from pingctl.infer.runtime import check_hardware
from pingctl.prompt import PromptSpec, parse_policy
from pingctl.synth.truth import load_truth


def check_options(policy: str, hardware: str | None, per_pair: int | None, queries: int, context: int,
                  context_dst: int | None, seed: int) -> None:
    """The options every eval checks before it reads a split or loads the model."""
    parse_policy(policy)  # `fair` too is refused here: it goes with --regimes
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
    (`context` of the source side, `context_dst` of the destination side, from `train_path`) | pair;
    `per_pair` caps measurements per (src, dst) pair in it (None: as the run was trained);
    `hardware` (cpu | gpu) runs the model there (None: as the run was trained).
    `calibration`: a calibration.json fitted by an eval of the same run on other packets (val);
    adds the predictor model_calibrated. Every eval writes the map fitted on its own packets to
    `out`/calibration.json (pingctl/infer/calibration.py).
    `hints`: `both` prompts carry the embedding's estimate (None: as the run was trained,
    `prompt.carries_hint`).
    `progress(step, done, total)` is called per phase and per chunk of model predictions. The
    model's passes are kept in `out`/.resume as they finish, and reused by a rerun after an
    interruption (report "resumed"); a finished eval removes it (artifacts.eval_output.Resume)."""
    # before the splits and the model are loaded
    check_options(policy, hardware, per_pair, queries, context, context_dst, seed)
    # fail on an unusable --out now, not after minutes of predictions
    out = Path(out)
    check_out_dir(out)
    # the cheap checks of the run, the prompt and the truth before minutes of splits, baselines and model
    spec = PromptSpec.from_run(run_config(run), policy=policy, context=context, context_dst=context_dst,
                               per_pair=per_pair, hints=hints)
    if truth is not None:
        load_truth(truth)
    cal = CAL.load(calibration) if calibration is not None else None
    if cal is not None:  # the cheap part of its check; the checkpoint's is after the load
        CAL.check_fits(cal, run, cal.meta.get("steps") or [], spec.describe(), scored=test_path)
    t0 = time.perf_counter()
    train, test, idx = _load_splits(train_path, test_path, queries, seed, progress)
    progress("fitting baselines")
    report = baseline_table(train, take(test, idx), truth=str(truth) if truth else None,
                            vivaldi_cycles=vivaldi_cycles, seed=seed)
    progress(f"loading the model from {run}")
    model = LoadedModel.load(run, step, hardware)
    if cal is not None:
        CAL.check_fits(cal, run, model.steps, spec.describe())
    progress(f"model predictions for {len(idx)} packets")
    t1 = time.perf_counter()
    resume = Resume(out)
    pred = predict(model, test, idx, context=context, train=train, policy=spec.policy, per_pair=spec.cap,
                   calibration=cal, context_dst=spec.context_dst,
                   hints=prompt_hints(spec, report.ctx.get("fitted") or {}), resume=resume,
                   progress=lambda done, total: progress("model predictions", done, total))
    info = {"run": str(run), "step": model.step, "steps": list(model.steps), "context_measurements": context,
            "context_policy": str(spec.policy), "context_per_pair": spec.cap, "timestamps": model.timestamps,
            "device": model.device, "context_sizes": pred["context_sizes"],
            "seconds": round(time.perf_counter() - t1, 2), "context_dst": spec.context_dst,
            "context_examples": pred["context_examples"]}
    add_model(report, pred, info, None if cal is None else {"calibration": cal.path, "fitted_on": cal.meta.get(
        "fitted_on"), "packets": cal.meta.get("packets")})
    _add_prompt_readers(report, pred, spec, seed)
    model_first(report)
    _compare_model(report, cal is not None, seed)
    report["nll"] = pred["nll"]
    report["queries"] = int(len(idx))
    report["resumed"] = {"asks": int(bool(pred["resumed"])), "packets": pred["resumed"]}
    report["inputs"] = {"run": str(run), "train": str(train_path), "test": str(test_path), "truth": str(truth) if truth else None}
    out.mkdir(parents=True, exist_ok=True)
    report["combination"] = dict(NOT_FITTED_PLAIN)
    report["calibration"] = fit_calibration(pred["pit"], out, {
        "run": str(Path(run).resolve()), "steps": list(model.steps), "fitted_on": str(Path(test_path).resolve()),
        "seed": seed, **spec.describe()}) | {"applied": cal.path if cal is not None else None}
    _write_outputs(report, out, {"run": str(run), "test": str(test_path), **spec.describe()}, progress)
    report["elapsed_s"] = time.perf_counter() - t0
    write_json(report_path(out), dict(report))
    resume.finish()
    return report


def _load_splits(train_path: Path, test_path: Path, queries: int, seed: int, progress) -> tuple[dict, dict, np.ndarray]:
    """The train and test splits, and the seeded sorted sample of `queries` test packets asked."""
    progress("loading splits")
    train = load_split(train_path, split_hint="train")
    test = load_split(test_path)
    if len(test["rtt"]) == 0:
        raise PingctlError(f"{test_path}: no test rows")
    if len(train["rtt"]) == 0:
        raise PingctlError(f"{train_path}: no train rows (the baselines are fitted on them)")
    rng = np.random.default_rng(seed)
    return train, test, np.sort(rng.choice(len(test["rtt"]), size=min(queries, len(test["rtt"])), replace=False))


def _add_prompt_readers(report, pred: dict, spec: PromptSpec, seed: int) -> None:
    """The classical predictors that read what the prompts hold: the pair's history median where
    the prompts are the probe's own history, the registry's prompt baselines wherever they hold any."""
    if spec.probe_history:
        _add_context_median(report, pred["context_median"])
    if spec.has_context:
        add_prompt_baselines(report, pred["pool"], pred["contexts"], seed=seed)


def _compare_model(report, calibrated: bool, seed: int) -> None:
    report["comparisons"] = {"model": compare(report, "model", seed=seed)}
    if calibrated:
        # each against the baselines, not against the other: one model read two ways is not a rival
        report["comparisons"]["model"].pop("model_calibrated")
        report["comparisons"]["model_calibrated"] = compare(report, "model_calibrated", seed=seed)
        report["comparisons"]["model_calibrated"].pop("model")


def _write_outputs(report, out: Path, meta: dict, progress) -> None:
    """The plots (an earlier eval's that this one did not draw removed), the summary rows and
    predictions.parquet (`meta`: what its metadata records)."""
    progress("writing plots")
    plots = write_plots(report, out)
    _drop_stale_plots(out, plots.values())
    report["plots"] = {k: str(v) for k, v in plots.items()}
    report["rows"] = summary_rows(report)
    packets, columns = prediction_columns(report)
    report["predictions"] = str(write_predictions(out, packets, columns, meta))


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
    """The report directory can be created (without creating it: a run refused or failed before the
    model's passes leaves nothing; after them, OUT/.resume keeps them for the rerun)."""
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
