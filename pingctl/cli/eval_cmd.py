"""`pingctl eval`: honest numbers, the model against classical predictors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import (ConfigOpt, HardwareOpt, JsonOpt, RevisionOpt, SetOpt, StepOpt, console, emit, fmt, grid_table,
                                handle_errors, load, model_dir, say, step_progress)

# Upper bounds of eval's counts, checked before any split is read or the model loads (a usage
# error, exit 2, naming the option, or the config key where --set or --config gave it):
# - queries: each test packet is one prompt through the model (a few forward passes at the
#   quantiles) and a row of every baseline's arrays; 1,000,000 packets are hours on a GPU and
#   more on this 2-core machine, and the report's per-packet arrays stay a few hundred MB.
# - context: measurements of the probe in one prompt, which holds at most the run's seq_len
#   tokens (>= 12 a measurement): 10,000 needs a 120,000-token context, beyond any run here.
MAX_QUERIES = 1_000_000
MAX_CONTEXT = 10_000


# the held-out regimes' val sets each hold few of the hosts their regime holds out: both fits can pool them
RecalibrationOpt = Annotated[str | None, typer.Option(
    help="--regimes: the held-out regimes' recalibration map: pooled (one map fitted on their val sets "
         "together: a val set holds few of the hosts its regime holds out) or own (one per regime, on its "
         "own val set). \\[default: eval.recalibration, pooled]")]
WeightsOpt = Annotated[str | None, typer.Option(
    help="--regimes: the combined answer's weight for the held-out regimes: pooled (one weight, vouched for by "
         "their val sets together) or own (each regime's by its own val set). \\[default: eval.weights, own]")]


def evaluate(
    run: Annotated[Path, typer.Argument(help="A `pingctl train` run directory, or a `pingctl export` model, or its Hugging Face Hub repo id (owner/name).")],
    train: Annotated[Path | None, typer.Option(
        help="Train split (canonical Parquet): baselines are fitted on it. \\[required without --regimes]")] = None,
    test: Annotated[Path | None, typer.Option(help="Test split (canonical Parquet). \\[required without --regimes]")] = None,
    regimes: Annotated[Path | None, typer.Option(
        help="A `pingctl shard --strategy regimes` output: evaluate on each regime's test set (time, pair, "
             "probe, target) against the best classical predictor with the prompt's information, one table; "
             "baselines fitted on its train/, intervals recalibrated on its val/. Replaces --train/--test.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where report.json and the plots go.")] = Path("runs/eval"),
    predictions: Annotated[Path | None, typer.Option(
        "--predictions", help="Also write every packet's predictions here for a spreadsheet: .csv or .json "
                              "(OUT/predictions.parquet is always written).")] = None,
    truth: Annotated[Path | None, typer.Option(help="`pingctl synth` output: adds the noise floor.")] = None,
    queries: Annotated[int | None, typer.Option(
        min=1, max=MAX_QUERIES, help="Test packets evaluated (a seeded random subset). \\[default: eval.queries, 300]")] = None,
    context: Annotated[int | None, typer.Option(
        min=0, max=MAX_CONTEXT, help="Preceding measurements of the probe in the prompt. \\[default: eval.context, 16]")] = None,
    context_policy: Annotated[str | None, typer.Option(
        help="probe: the probe's preceding test packets, as in training (adds the context_median "
             "baseline); cold: the probe's preceding packets from train+test excluding the queried "
             "pair; none: no context; both: from the train split, the probe's measurements to other "
             "destinations (--context of them) and the destination's from other sources (--context-dst), as "
             "the loader's triangulation contexts; pair: the pair's own earlier packets (train+test); "
             "fair (--regimes only): pair for the time regime, both for the held-out ones. "
             "\\[default: eval.context_policy, probe; with --regimes and no --config, fair]")] = None,
    context_dst: Annotated[int | None, typer.Option(
        min=0, max=MAX_CONTEXT, help="--context-policy both: measurements of the destination side. "
                                     "\\[default: eval.context_dst, else --context]")] = None,
    context_per_pair: Annotated[int | None, typer.Option(
        help="At most this many measurements of one (src, dst) pair in the prompt, the most recent "
             "(default: as the run was trained, its loader.max_per_pair; 0 = no cap).")] = None,
    seed: Annotated[int | None, typer.Option(
        min=0, help="Seed of the packet subset and Vivaldi. \\[default: eval.seed, 0]")] = None,
    recalibration: RecalibrationOpt = None,
    weights: WeightsOpt = None,
    hints: Annotated[bool | None, typer.Option(
        "--hints/--no-hints",
        help="`both` prompts carry the least-squares embedding's RTT estimate for the pair (fitted on --train; "
             "an end it never saw placed from the prompt), as a run trained with loader.hints_file learned to read "
             "it. \\[default: as the run was trained]")] = None,
    calibration: Annotated[Path | None, typer.Option(
        help="A calibration.json that an eval of this run on other packets (the val split) wrote: adds "
             "model_calibrated, the model's distributions recalibrated so their quantiles cover as "
             "they did there.")] = None,
    step: StepOpt = None,
    revision: RevisionOpt = None,
    hardware: HardwareOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a trained model against global/pair/prefix medians and Vivaldi on a test split.

    Example: pingctl eval runs/demo/train --train runs/demo/splits/train --test runs/demo/splits/test --truth runs/demo/synth

    Held-out pairs without their own history: shard with --strategy pair and use --context-policy cold.

    Both ends in the prompt (rows built with --by both, trained with loader.triangulation_share):
    --context-policy both --context 16 --context-dst 16.

    Calibrated intervals: every eval writes OUT/calibration.json, fitted on its packets. Evaluate
    on val first, then on test with --calibration VAL_OUT/calibration.json.

    Every regime at once, each with the prompt its baseline's information calls for (fair):
    pingctl eval RUN --regimes runs/demo/regimes -o runs/demo/eval-regimes
    """
    from pingctl.artifacts.eval_output import check_copy
    from pingctl.artifacts.run import parse_steps
    from pingctl.errors import require_command

    require_command("eval")  # before anything is read or written
    check_copy(predictions)
    steps = parse_steps(step)
    cfg = _eval_config(config, set_, regimes, queries=queries, context=context, seed=seed,
                       context_policy=context_policy, context_per_pair=context_per_pair, context_dst=context_dst,
                       recalibration=recalibration, weights=weights)
    _check_inputs(cfg, regimes, train, test, calibration, recalibration is not None or weights is not None,
                  context_dst, hints)
    run = model_dir(run, revision)  # a Hub repo id: its snapshot, downloaded once the options are checked
    options = {"policy": cfg.context_policy, "per_pair": cfg.context_per_pair, "hardware": hardware,
               "context_dst": cfg.context_dst, "hints": hints}
    with step_progress("eval") as report_progress:
        def progress(s, done=0, total=None):
            report_progress(f"eval: {s}", done, total)

        if regimes is not None:
            from pingctl.eval.regimes import evaluate_regimes

            result = evaluate_regimes(run, regimes, out, truth, cfg.queries, cfg.context, cfg.seed, steps,
                                      recalibration=cfg.recalibration, weights=cfg.weights, progress=progress,
                                      **options)
        else:
            from pingctl.eval.run import evaluate as run_eval

            result = run_eval(run, train, test, out, truth, cfg.queries, cfg.context, cfg.seed, steps,
                              calibration=calibration, progress=progress, **options)
    _finish(result, out, predictions, as_json, print_regimes if regimes is not None else print_report)


def _eval_config(config, set_, regimes, **options):
    """The eval section of the config with the options given on the command line, checked
    against eval's bounds (a --set or --config value here; the options are bounded by Typer)."""
    from pingctl.errors import UsageError
    from pingctl.prompt import FAIR

    if regimes is not None and options["context_policy"] is None and config is None and not any(
            str(s).startswith("eval.context_policy") for s in set_ or []):
        options["context_policy"] = FAIR  # each regime the prompt with its baseline's information
    cfg = load(config, set_, **{f"eval.{k}": v for k, v in options.items()}).eval
    for key, value, most in (("queries", cfg.queries, MAX_QUERIES), ("context", cfg.context, MAX_CONTEXT)):
        if value > most:
            raise UsageError(f"eval.{key} {value:,} is beyond the bound of {most:,} (see --{key} in "
                             "`pingctl eval --help`)")
    return cfg


def _check_inputs(cfg, regimes, train, test, calibration, held_out_fits: bool, context_dst, hints) -> None:
    """The combinations of options eval refuses, before the model is downloaded or read."""
    from pingctl.errors import UsageError
    from pingctl.prompt import check_sides

    check_sides(cfg.context_policy, context_dst, hints)
    if held_out_fits and regimes is None:
        raise UsageError("--recalibration and --weights choose how the held-out regimes' maps and weights of "
                         "--regimes are fitted; without --regimes, fit a map with an eval on val and give it as "
                         "--calibration")
    if regimes is not None and (train is not None or test is not None or calibration is not None):
        raise UsageError("--regimes takes the train, val and test sets from the regimes split; "
                         "leave out --train, --test and --calibration")
    if regimes is None and (train is None or test is None):
        raise UsageError("give --train and --test (the splits to fit baselines on and to evaluate), or --regimes")


def _finish(result: dict, out: Path, predictions: Path | None, as_json: bool, show) -> None:
    """The result as JSON on stdout, or printed by `show`; with --predictions, the predictions
    eval wrote again as CSV or JSON first (its path in the result)."""
    from pingctl.artifacts.eval_output import write_copy

    result = dict(result)
    if predictions is not None:
        result["predictions_copy"] = str(write_copy(out, predictions))
    if reused := (result.get("resumed") or {}).get("packets"):
        # on stderr under --json, whose stdout is the JSON alone
        say(f"resumed: reused {reused} packets' model passes from an interrupted eval", "dim", err=as_json)
    if as_json:
        emit(result, True)
        return
    show(result, out / "report.json")
    if predictions is not None:
        say(f"predictions also in {predictions}", "dim")


def print_report(report: dict, path) -> None:
    """The eval table, the model-minus-baseline intervals, the verdict and the NLL; also what
    `pingctl inspect EVAL_DIR` prints from a saved report.json."""
    if report.get("mode") == "regimes":
        print_regimes(report, path)
        return
    info = report["predictors"]["model"]["info"]
    emit(dict(report), False, [results_table(report, report["inputs"]["test"], info.get("context_policy", "?")),
                               *([t] if (t := scores_table(report)) is not None else [])])
    # report.json is written with sorted keys: restore the table's order; model_calibrated
    # (eval --calibration) is judged against the baselines like the model
    def in_order(keys):
        return sorted(keys, key=lambda k: _rank(report.get("order", []), k))

    for who in in_order(report["comparisons"]):
        comp = report["comparisons"][who]
        _print_comparisons({k: comp[k] for k in in_order(comp)}, who)
    n = report["nll"]
    console.print(f"model NLL {n['nats_per_token']:.3f} nats/token = {n['bits_per_token']:.3f} bits/token; "
                  f"{n['bits_per_measurement']:.1f} bits per measurement", highlight=False)
    if n.get("bits_per_field"):
        fields = sorted(n["bits_per_field"].items(), key=lambda kv: _rank(["time", "src", "dst", "result"], kv[0]))
        console.print("  of which " + ", ".join(f"{k} {v:.1f}" for k, v in fields),
                      highlight=False)
    cal = report.get("calibration") or {}
    if cal.get("fitted"):
        console.print(f"calibration fitted on these {cal['packets']} packets: {cal['fitted']} "
                      "(for --calibration on other packets)", highlight=False)
    elif cal.get("reason"):
        console.print(f"no calibration written: {cal['reason']}", highlight=False)
    console.print(f"report: {path}   plots: {', '.join(report.get('plots', {}).values())}", highlight=False)


def _rank(order: list, key) -> tuple:
    return (order.index(key), "") if key in order else (len(order), str(key))


def results_table(report: dict, test, context_policy: str):
    from pingctl.infer.model import steps_label

    t = grid_table(f"eval on {report['queries']} held-out packets ({test}), context policy {context_policy}, "
                   f"model: {steps_label(report['predictors']['model']['info']['steps'])}",
                   ["predictor", "median\nrel err", "p90\nrel err", "CRPS ms", "cov50", "cov90", "fail\nAUC",
                    "fall-\nback"], left=("predictor",))
    for r in report["rows"]:
        # CRPS, not MAE: for a point predictor the two are equal, and CRPS also scores a distribution
        crps = r.get("crps_ms", r.get("mae_ms"))  # a report written before CRPS: its MAE
        t.add_row(r["predictor"], _pct(r.get("median_rel_err")), _pct(r.get("p90_rel_err")), _ms(crps),
                  _pct(r.get("cov50")), _pct(r.get("cov90")), fmt(r.get("auc")), _pct(r.get("fallback_share")))
    return t


def scores_table(report: dict):
    """Proper scores of each predictor that gives a distribution or P(failure): CRPS median and
    mean, and for P(failure) the Brier and log scores beside the AUC (None: no such predictor)."""
    rows = [r for r in report["rows"] if r.get("median_crps_ms") is not None or r.get("brier") is not None]
    if not rows:
        return None
    t = grid_table("proper scores (lower is better): CRPS of the RTT given success; Brier and log score (nats) "
                   "of P(failure)", ["predictor", "CRPS ms\nmedian", "CRPS ms\nmean", "fail\nBrier",
                                     "fail log\nscore", "fail\nAUC"], left=("predictor",))
    for r in rows:
        t.add_row(r["predictor"], _ms(r.get("median_crps_ms")), _ms(r.get("crps_ms")), _score(r.get("brier")),
                  _score(r.get("log_score")), fmt(r.get("auc")))
    return t


def _ks(ks, p) -> str:
    if ks is None:
        return "-"
    return f"{ks:.3f}" + ("" if p is None else f" (p {p:.2f})" if p >= 0.01 else " (p < 0.01)")


def _score(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _print_comparisons(comp: dict, who: str = "model") -> None:
    if not comp:
        return
    if all(c.get("verdict") is None for c in comp.values()):
        # relative error needs an RTT: with no successful packet among the queries there is
        # nothing to compare, which "beats none" would misreport as a loss
        console.print("verdict: no comparison possible (no successful packet among the evaluated test packets, "
                      "so no relative error)", highlight=False, soft_wrap=True)
        return
    any_c = next(c for c in comp.values() if c.get("verdict") is not None)
    console.print(f"{who} minus each predictor, median rel err in points, {any_c['level']:.0%} interval from "
                  f"{any_c['n_boot']} resamples of the {any_c['groups']} (src, dst) pairs:", highlight=False)
    for name, c in comp.items():
        if c["diff"] is None:
            continue
        console.print(f"  {name:<16} {100 * c['diff']:+6.1f} [{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]"
                      f"  better in {c['share_a_better']:.0%} of resamples", highlight=False)
    by = {v: [n for n, c in comp.items() if c.get("verdict") == v] for v in ("better", "tie", "worse")}
    parts = [f"beats {', '.join(by['better'])}" if by["better"] else "beats none",
             *([f"ties {', '.join(by['tie'])} (the interval holds 0)"] if by["tie"] else []),
             *([f"loses to {', '.join(by['worse'])}"] if by["worse"] else []),
             *([f"not compared with {', '.join(n for n, c in comp.items() if c.get('verdict') is None)}"]
               if any(c.get("verdict") is None for c in comp.values()) else [])]
    console.print(f"verdict: the {who} " + "; ".join(parts), highlight=False, soft_wrap=True)


def _ms(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def register(app) -> None:
    app.command("eval")(handle_errors(evaluate))


def print_regimes(result: dict, path) -> None:
    """`eval --regimes`: one row per regime, the model against the best classical predictor with
    the same information; also what `pingctl inspect` prints from its report.json."""
    from pingctl.eval.presentation import combined_line

    p = result.get("prompt") or {}
    t = grid_table(f"eval by regime ({result['inputs']['splits']}), context policy {p.get('context_policy', '?')}, "
                   f"{p.get('context_measurements', '?')} context measurements",
                   ["regime\nprompt", "model\nrel err", "model\nCRPS ms", "best classical", "its\nrel err",
                    "its\nCRPS ms", "ratio", "model − it\n95% interval", "verdict"],
                   left=("regime\nprompt", "best classical"),
                   whole=("regime\nprompt", "model\nrel err", "model\nCRPS ms", "best classical", "its\nrel err",
                          "its\nCRPS ms", "ratio", "verdict"), listing=True)
    for r in result["table"]:
        # each row's prompt under its regime: the policy and sizes it was asked with
        who = r["regime"] + ("" if not r.get("prompt") else "\n" + _prompt(r["prompt"]))
        if not r.get("packets"):
            t.add_row(who, "-", "-", r.get("best", "-"), "-", "-", "-", r.get("note") or "no packets", "-")
            continue
        ci = ("-" if r.get("diff") is None else
              f"{100 * r['diff']:+.1f} [{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}]")
        t.add_row(who, _pct(r.get("model_median_rel_err")), _crps(r.get("model_crps_ms")), r["best"],
                  _pct(r.get("best_median_rel_err")), _crps(r.get("best_crps_ms")),
                  "-" if r.get("ratio") is None else f"{r['ratio']:.2f}", ci, r.get("verdict") or "-")
    emit(dict(result), False, t)
    done = [r for r in result["table"] if r.get("packets")]
    cal = result.get("calibration") or {}

    def each(f):
        return ", ".join(f"{r['regime']} {f(r)}" for r in done)

    console.print("packets (pairs): " + each(lambda r: f"{r['packets']} ({r['pairs']})"), highlight=False, soft_wrap=True)
    console.print("model's 90% interval covers, raw → recalibrated (the map's val sets): "
                  + each(lambda r: f"{_pct(r.get('cov90'))} → {_pct(r.get('cov90_calibrated'))}"
                                   + (f" ({r['calibrated_on']})" if r.get("calibrated_on") else ""))
                  + ("" if cal.get("fitted") else f" (no map: {cal.get('reason')})"), highlight=False, soft_wrap=True)
    console.print("model's PIT KS, raw → recalibrated (p: chance of a KS this far for a calibrated model with "
                  "as many independent packets): "
                  + each(lambda r: f"{_ks(r.get('pit_ks'), r.get('pit_ks_p'))} → "
                                   f"{_ks(r.get('pit_ks_calibrated'), r.get('pit_ks_p_calibrated'))}"),
                  highlight=False, soft_wrap=True)
    for regime, info in (result.get("calibrations") or {}).items():
        if info.get("warning"):
            console.print(f"{regime}: recalibration: {info['warning']}", style="yellow", highlight=False,
                          soft_wrap=True)
    console.print("model's CRPS below every baseline's: " + each(lambda r: fmt(r.get("crps_below_every_baseline"))),
                  highlight=False, soft_wrap=True)
    console.print("median CRPS ms, model vs best classical: "
                  + each(lambda r: f"{_crps(r.get('model_median_crps_ms'))} vs {_crps(r.get('best_median_crps_ms'))}"),
                  highlight=False, soft_wrap=True)
    for r in done:
        fails = r.get("failure") or {}
        if fails:
            console.print(f"{r['regime']}: P(failure) Brier / log score (nats) / AUC: " + "; ".join(
                f"{n} {_score(f.get('brier'))} / {_score(f.get('log_score'))} / {fmt(f.get('auc'))}"
                for n, f in fails.items()), highlight=False, soft_wrap=True)
    for r in done:
        if r.get("best_on_test") not in (None, r["best"]):
            console.print(f"{r['regime']}: on these test packets {r['best_on_test']} did better than {r['best']} "
                          f"({_pct(r.get('best_on_test_median_rel_err'))}); the comparison stays with the one chosen "
                          "before testing", highlight=False, soft_wrap=True)
    if line := combined_line(result["table"]):
        console.print(line, highlight=False, soft_wrap=True)
    console.print("ratio: model rel err / the baseline's; model − it: in points, interval over (src, dst) pairs",
                  highlight=False, soft_wrap=True)
    console.print(f"report: {path}   predictions: {result.get('predictions', '-')}", highlight=False)


def _prompt(p: dict | None) -> str:
    """A row's prompt in a few characters: its policy and sizes (a report before per-regime
    prompts has none: '-')."""
    if not p:
        return "-"
    pol, k = p.get("context_policy", "?"), p.get("context_measurements", "?")
    hint = " +hint" if p.get("hint") else ""
    # only a two-sided prompt records a destination side
    return f"{pol} {k}+{p['context_dst']}{hint}" if p.get("context_dst") is not None else f"{pol} {k}{hint}"


def _crps(v) -> str:
    return "-" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"
