"""`pingctl eval RUN --regimes SPLITDIR`: one model on the four test sets of a
`pingctl shard --strategy regimes` split, each against the strongest classical predictor that
has the same information as the model's prompt (docs/eval.md, "The regimes table").

The baselines are fitted once on SPLITDIR/train; on each regime's test set every one of them
predicts the same seeded subset of packets the model answers, beside the predictors that read
the model's own prompts (`prompt_median`, `vivaldi_refit`, `embedding_refit`:
report.add_prompt_baselines). The model's distributions are recalibrated (`model_calibrated`)
with a map fitted on val packets asked with the regime's own prompts: SPLITDIR/val for the time
regime; for the held-out ones, where the split has val_<regime> sets, all of them together
(`pooled`, the default) or each its own (`own`): map_groups. Which
baseline a regime is judged against is fixed before any test packet is looked at (eval.registry; the
pair regime's between Vivaldi and the embedding by their error on its val set). Under the
`fair` context policy each regime gets the prompt with its baseline's information
(prompt.FAIR_POLICIES).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pingctl.artifacts.eval_output import REGIMES_MODE, Resume, report_path, write_predictions
from pingctl.artifacts.run import run_config
from pingctl.artifacts.table import REGIMES, has_split, load_split, load_split_if_any, regime_test_dirs, regime_val_dirs, take
from pingctl.atomic import write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.eval import combine as CMB, metrics as M
from pingctl.eval.baselines import SharedFits
from pingctl.eval.combine import COMBINED
from pingctl.eval.hints import prompt_hints
from pingctl.eval.model import predict
from pingctl.eval.presentation import prediction_columns, summary_rows
from pingctl.eval.registry import candidates, fit_baselines
from pingctl.eval.report import Seen, add_model, add_prompt_baselines, baseline_table, compare, model_first
from pingctl.eval.run import check_options, check_out_dir, fit_calibration
from pingctl.histories import Addresses, History
from pingctl.infer import calibration as CAL
from pingctl.infer.hints import run_hints
from pingctl.infer.model import LoadedModel
from pingctl.prompt import Policy, PromptSpec, is_fair, regime_policies
from pingctl.synth.truth import load_truth

# The classical predictor each regime is judged against is fixed before any test packet is
# seen: the registry's candidates for the regime (eval.registry.candidates), in rank order; the
# first is taken unless val can choose (`choose_on_val`). Under the `probe` policy a prompt holds
# the queried pair's own earlier packets (drawn from the test set itself), which no coordinate
# system can match: outside the time regime the candidates are the ones with that information.
CHOSEN_ON_VAL = ("pair",)


# what eval reads of train, the baselines' and the prompts' columns: a day's train split is 64M
# rows, and each column left unread is 512 MB
TRAIN_COLUMNS = ("src_addr", "dst_addr", "ip_version", "rtt", "event_time", "prb_id")

MIN_VAL_HOSTS = 5  # held-out hosts (or pairs) below which a regime's recalibration map is flagged
RECALIBRATIONS = ("pooled", "own")
HELD_OUT_MAP = "calibration_held_out.json"
# what each held-out regime holds out, counted in its val set
_HELD_OUT_UNITS = {"pair": ("pairs", lambda v: set(zip(v["src"], v["dst"]))),
                   "probe": ("probes", lambda v: set(v["src"])), "target": ("destinations", lambda v: set(v["dst"]))}


def held_out_units(val: dict, regime: str) -> tuple[str, int] | None:
    """What `regime` holds out and how many of them `val` holds (None for the time regime,
    whose val set holds the test's own pairs)."""
    if regime not in _HELD_OUT_UNITS:
        return None
    what, distinct = _HELD_OUT_UNITS[regime]
    return what, len(distinct(val))


def narrow_val(val: dict, regime: str) -> str | None:
    """Why a held-out regime's val set is too narrow for a map that must transfer to other held-out
    hosts: fewer than MIN_VAL_HOSTS of the kind the regime holds out (None: wide enough, or the
    time regime)."""
    if (units := held_out_units(val, regime)) is None or units[1] >= MIN_VAL_HOSTS:
        return None
    what, n = units
    return (f"holds {_count(n, what)}: a map fitted on so few may not transfer to the "
            f"test's other {what} (compare the raw coverage)")


def map_groups(val_dirs: dict, specs: dict[str, PromptSpec], recalibration: str) -> list[list[str]]:
    """Which regimes share one recalibration map, in REGIMES order (`specs`: each one's prompt).
    `own`: the regimes asked on the same val set with the same prompts. `pooled` (the default): besides, the held-out regimes
    that have val sets of their own and the same prompts share one map fitted on all of them. A
    val set holds few of the hosts its regime holds out (a split's 5% of 30 destinations is 1 or
    2), and their quirks do not transfer to the test's other hosts; what the held-out regimes
    share, an unseen end, does (docs/eval.md, "One recalibration map for the held-out regimes")."""
    own_vals = [r for r in REGIMES if r != "time" and val_dirs[r] != val_dirs["time"]]
    pool = (recalibration == "pooled" and len(own_vals) > 1
            and all(specs[r] == specs[own_vals[0]] for r in own_vals))
    groups: dict = {}
    for r in REGIMES:
        key = "held_out" if pool and r in own_vals else (val_dirs[r], specs[r].policy)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def best_candidates(regime: str, policy: str) -> tuple[str, ...]:
    if not (found := candidates(regime, policy)):
        raise PingctlError(f"no registered baseline serves the {regime} regime (eval.registry)")
    return found


def _sample(n: int, queries: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(queries, n), replace=False))


def choose_on_val(fitted: dict, val: dict | None, queries: int, seed: int, policy: str = "cold") -> dict:
    """For each regime in CHOSEN_ON_VAL with more than one candidate (`best_candidates`), the
    one with the lowest median relative error on a seeded subset of val packets (the baselines
    fitted on train); otherwise, or without val packets, the first. `val`: one split for every
    regime, or {regime: its own val split}; `policy`: one for all, or `fair`. Returns {regime:
    {"best", "chosen_on", "val_median_rel_err"}}."""
    vals = val if val is None or "rtt" not in val else {r: val for r in REGIMES}
    out = {}
    for regime in REGIMES:
        cands = best_candidates(regime, regime_policies(policy, REGIMES)[regime])
        val = (vals or {}).get(regime)
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
        if key in ("crps", "median_crps"):
            return ((e.get("crps") or {}).get("all") or {}).get("mean_crps_ms" if key == "crps" else "median_crps_ms")
        if key in ("cov50", "cov90"):
            return (((e.get("calibration") or {}).get("coverage")) or {}).get(key)
        if key in ("ks", "ks_p", "ks_95"):
            return (((e.get("calibration") or {}).get("pit")) or {}).get(key)
        if key in ("auc", "brier", "log_score"):
            return (e.get("failure") or {}).get(key)
        return e["slices"]["all"].get(key) if e else None

    m, b = fig("model", "median_rel_err"), fig(best, "median_rel_err")
    baselines = [n for n in report["order"] if not n.startswith("model") and n != COMBINED]
    errs = {n: fig(n, "median_rel_err") for n in baselines}
    best_on_test = min((n for n in baselines if errs[n] is not None), key=errs.get, default=None)
    if best_on_test is not None and b is not None and not errs[best_on_test] < b:
        best_on_test = best  # no other baseline did strictly better
    return {
        "regime": regime, "packets": report["queries"], "pairs": comp["groups"], "compared": comp["n"],
        "model_median_rel_err": m, "model_p90_rel_err": fig("model", "p90_rel_err"), "model_crps_ms": fig("model", "crps"),
        "best": best, "best_median_rel_err": b, "best_p90_rel_err": fig(best, "p90_rel_err"),
        "best_crps_ms": fig(best, "crps"),
        "model_median_crps_ms": fig("model", "median_crps"), "best_median_crps_ms": fig(best, "median_crps"),
        "ratio": (m / b) if m is not None and b else None,
        "diff": comp["diff"], "ci_low": comp["ci_low"], "ci_high": comp["ci_high"], "level": comp["level"],
        "verdict": comp["verdict"],
        "crps_below_every_baseline": _crps_below_all(report, baselines),
        "cov50": fig("model", "cov50"), "cov90": fig("model", "cov90"),
        "cov50_calibrated": fig("model_calibrated", "cov50"), "cov90_calibrated": fig("model_calibrated", "cov90"),
        # PIT KS distance, and the chance of one at least as far from a calibrated model with these
        # many independent packets (metrics.pit_histogram)
        "pit_ks": fig("model", "ks"), "pit_ks_p": fig("model", "ks_p"),
        "pit_ks_calibrated": fig("model_calibrated", "ks"), "pit_ks_p_calibrated": fig("model_calibrated", "ks_p"),
        "pit_ks_95": fig("model", "ks_95"),
        "model_fail_auc": fig("model", "auc"),
        # every predictor that gives P(failure): proper scores beside the AUC
        "failure": {n: {k: fig(n, k) for k in ("brier", "log_score", "auc")}
                    for n in report["order"] if (p.get(n) or {}).get("failure")},
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
                     hardware: str | None = None, context_dst: int | None = None, recalibration: str = "pooled",
                     weights: str = "own", hints: bool | None = None, progress=lambda _step, _done=0, _total=None: None) -> dict:
    """The model and every baseline on `queries` packets of each regime's test set of
    `split_dir`; writes OUT/report.json (mode "regimes": the table and one full report per
    regime), OUT/predictions.parquet (every packet of every regime) and the recalibration maps,
    fitted on val sets asked with each regime's prompts (OUT/calibration.json for the time
    regime's val/; `recalibration` pooled: OUT/calibration_held_out.json on the held-out
    regimes' val_<regime>/ sets together, own: OUT/calibration_<regime>.json on each: map_groups).
    Options as `eval.run.evaluate`; `policy` may also be `fair` (FAIR_POLICIES: each regime the
    prompt with its baseline's information). `hints`: `both` prompts carry the embedding's
    estimate (None: as the run was trained, `prompt.carries_hint`). The model's passes are kept
    in OUT/.resume as they finish, and reused by a rerun after an interruption (report
    "resumed"); a finished eval removes it (artifacts.eval_output.Resume)."""
    if recalibration not in RECALIBRATIONS:
        raise UsageError(f"--recalibration {recalibration!r}: expected one of {', '.join(RECALIBRATIONS)}")
    if weights not in CMB.WEIGHT_FITS:
        raise UsageError(f"--weights {weights!r}: expected one of {', '.join(CMB.WEIGHT_FITS)}")
    policies = regime_policies(policy, REGIMES)
    for pol in dict.fromkeys(policies.values()):
        check_options(pol, hardware, per_pair, queries, context, context_dst, seed)
    out, split_dir = Path(out), Path(split_dir)
    tests, val_dirs = regime_test_dirs(split_dir), regime_val_dirs(split_dir)
    train_path, val_path = split_dir / "train", split_dir / "val"
    check_out_dir(out)
    trained = run_config(run)
    specs = {r: PromptSpec.from_run(trained, policy=pol, context=context, context_dst=context_dst, per_pair=per_pair,
                                    hints=hints) for r, pol in policies.items()}
    if truth is not None:
        load_truth(truth)
    t0 = time.perf_counter()
    progress("loading the train split")
    train = load_split(train_path, columns=list(TRAIN_COLUMNS), split_hint="train")
    if not len(train["rtt"]):
        raise PingctlError(f"{train_path}: no train rows (the baselines are fitted on them)")
    progress("fitting baselines on train")
    shared = SharedFits(train)
    fitted, fit_s = fit_baselines(train, seed, vivaldi_cycles, hints=run_hints(Path(run)), shared=shared)
    seen = Seen.of(train, shared)
    del shared  # its row-sized codes and ranks: what the fits and the slices needed of them is kept
    indexed = None
    if all(s.policy in (Policy.BOTH, Policy.PAIR) for s in specs.values()):
        # these prompts read train only through its index, which holds the addresses as codes:
        # the strings go (a day's train: 1.5 GB of its 3.6)
        progress("indexing the train split for the prompts")
        indexed = History.of(train, Addresses()).forget_strings()
        train = indexed.table
    progress(f"loading the model from {run}")
    resume = Resume(out)
    ev = _Regimes(LoadedModel.load(run, step, hardware), Path(run), train, fitted, specs, context, queries, seed,
                  str(truth) if truth else None, progress, seen=seen, indexed=indexed, resume=resume)
    out.mkdir(parents=True, exist_ok=True)
    calibrations, maps = ev.recalibrate(val_dirs, recalibration, out)
    choice = choose_on_val(fitted, {r: ev.val_split(val_dirs[r]) for r in REGIMES}, queries, seed, policy)
    described = {r: s.describe() for r, s in specs.items()}
    fits, combination = CMB.fit_and_write(ev.val_records, val_dirs, described, choice, out, run, ev.model.steps, seed,
                                          weights)
    has_val = {p: ev.has_split(p) for p in (val_path, *val_dirs.values())}
    ev.loaded.clear()  # what the val sets gave is kept (maps, choice, weights): at a day's size they are 15M rows
    table, regimes, columns = ev.ask_regimes(tests, maps, calibrations, choice, fits)
    prompt = {"context_policy": policy, "context_measurements": context, "per_regime": described}
    if not is_fair(policy):
        prompt.update(described["time"])
    result = {
        "mode": REGIMES_MODE, "table": table, "regimes": regimes, "choice": choice, "calibration": calibrations["time"],
        "calibrations": calibrations, "combination": combination,
        "inputs": {"run": str(run), "splits": str(split_dir), "train": str(train_path),
                   "val": str(val_path) if has_val[val_path] else None,
                   "vals": {r: str(p) for r, p in val_dirs.items() if has_val[p]},
                   "truth": str(truth) if truth else None},
        "prompt": prompt, "queries": queries, "seed": seed, "fit_s": fit_s, "resumed": ev.resumed,
        "baselines_info": {n: getattr(b, "fit_info", None) for n, b in fitted.items() if getattr(b, "fit_info", None)},
    }
    if columns:
        result["predictions"] = str(write_predictions(out, *_merged_columns(columns),
                                                      {"run": str(run), "splits": str(split_dir), **prompt}))
    result["elapsed_s"] = time.perf_counter() - t0
    write_json(report_path(out), result)
    resume.finish()
    return result


@dataclass
class _Regimes:
    """One `evaluate_regimes`: the loaded model, the train split and the baselines fitted on it,
    each regime's prompt, the val splits read so far (each read once) and what the combined
    answer's fit keeps of their predictions (`val_records`, eval.combine)."""

    model: LoadedModel
    run: Path
    train: dict
    fitted: dict
    specs: dict[str, PromptSpec]
    context: int
    queries: int
    seed: int
    truth: str | None
    progress: object
    loaded: dict = field(default_factory=dict)
    val_records: dict = field(default_factory=dict)  # (val path, policy) -> eval.combine.val_record
    indexed: History | None = None
    seen: Seen | None = None  # what train holds, for every regime's seen/unseen slices
    resume: Resume | None = None  # the model's passes kept for a rerun, and those an interrupted eval kept
    resumed: dict = field(default_factory=lambda: {"asks": 0, "packets": 0})  # what the latter saved

    def history(self) -> History:
        """Train indexed for the context rules, once for every ask (at a day's size the index is
        most of an ask's cost)."""
        if self.indexed is None:
            self.progress("indexing the train split for the prompts")
            self.indexed = History.of(self.train, Addresses())
        return self.indexed

    def has_split(self, path: Path) -> bool:
        """Whether `val_split(path)` is a split, without reading one not read yet."""
        return self.loaded[path] is not None if path in self.loaded else has_split(path)

    def val_split(self, path: Path) -> dict | None:
        if path not in self.loaded:
            self.loaded[path] = load_split_if_any(path)
        return self.loaded[path]

    def ask(self, split: dict, idx: np.ndarray, cal, what: str, spec: PromptSpec) -> dict:
        """The model's predictions of packets `idx` of `split` under prompts `spec`."""
        self.progress(f"model predictions ({what})", 0, len(idx))
        pred = predict(self.model, split, idx, context=self.context, train=self.history(), policy=spec.policy,
                       per_pair=spec.cap, calibration=cal, context_dst=spec.context_dst,
                       hints=prompt_hints(spec, self.fitted), resume=self.resume,
                       progress=lambda done, total: self.progress(f"model predictions ({what})", done, total))
        self.resumed["asks"] += bool(pred["resumed"])
        self.resumed["packets"] += pred["resumed"]
        pred["pair_history"] = CMB.history_of(run_hints(self.run), split, idx)
        return pred

    def recalibrate(self, val_dirs: dict, recalibration: str, out: Path) -> tuple[dict, dict]:
        """Each regime's val set (val/ for time, val_<regime>/ for the others where the split has
        them) asked with the regime's own prompts, and the recalibration maps fitted on them
        (map_groups): ({regime: what its map is}, {regime: the map, or None})."""
        pits: dict = {}  # (val path, policy) -> the PITs of its packets under that policy's prompts
        calibrations: dict = {}
        maps: dict = {}
        policies = {r: s.policy for r, s in self.specs.items()}
        groups = map_groups(val_dirs, self.specs, recalibration)
        last = {val_dirs[r]: i for i, group in enumerate(groups) for r in group}
        for i, group in enumerate(groups):
            asked: dict = {}  # (val path, policy) -> the first regime of the group asked that way
            for r in group:
                asked.setdefault((val_dirs[r], self.specs[r].policy), r)
            present = {k: r for k, r in asked.items() if (v := self.val_split(k[0])) is not None and len(v["rtt"])}
            for (path, pol), r in present.items():
                if (path, pol) not in pits:
                    val = self.val_split(path)
                    vidx = _sample(len(val["rtt"]), self.queries, self.seed)
                    pred = self.ask(val, vidx, None, f"{path.name} for {r}", self.specs[r])
                    pits[path, pol] = pred["pit"]
                    # the combined answer's fit needs the distributions only here: what it keeps is small
                    self.val_records[path, pol] = CMB.val_record(pred, val, vidx, self.fitted, policies, self.seed)
            if not present:
                info, cal = {"fitted": None, "reason": f"no val split {next(iter(asked))[0]}", "fitted_on": None}, None
            else:
                info = self._fit_map(group, present, pits, out, first=not calibrations)
                cal = CAL.load(Path(info["fitted"])) if info.get("fitted") else None
            for r in group:
                calibrations[r], maps[r] = info, cal
            for path in [p for p, j in last.items() if j == i]:
                self._keep_sample(path)
        return calibrations, maps

    def _keep_sample(self, path: Path) -> None:
        """Hold of val split `path`, once its last group is fitted, only the packets later read
        of it: the seeded sample `choose_on_val` takes, which is that sample again (`_sample` of
        at most `queries` packets is all of them). A day's val sets are 15M rows."""
        if (val := self.loaded.get(path)) is not None:
            self.loaded[path] = take(val, _sample(len(val["rtt"]), self.queries, self.seed))

    def _fit_map(self, group: list[str], present: dict, pits: dict, out: Path, first: bool) -> dict:
        """The map of one group of regimes, fitted on the PITs of its val packets."""
        paths = [str(path.resolve()) for path, _ in present]
        name = "calibration.json" if first else HELD_OUT_MAP if len(paths) > 1 else f"calibration_{group[0]}.json"
        info = fit_calibration(np.concatenate([pits[k] for k in present]), out, {
            "run": str(self.run.resolve()), "steps": list(self.model.steps),
            "fitted_on": paths if len(paths) > 1 else paths[0], "seed": self.seed, **self.specs[group[0]].describe()},
            name=name)
        info["fitted_on"] = "+".join(path.name for path, _ in present) if info.get("fitted") else None
        describe_val(info, {r: self.val_split(path) for (path, _), r in present.items()})
        return info

    def ask_regimes(self, tests: dict, maps: dict, calibrations: dict, choice: dict, fits: dict
                    ) -> tuple[list, dict, list]:
        """Every regime's test packets: (the table's rows, each regime's full report, each
        regime's prediction columns for predictions.parquet)."""
        regimes, table, columns = {}, [], []
        for regime in REGIMES:
            test = load_split(tests[regime])
            best = choice[regime]["best"]
            if not len(test["rtt"]):
                table.append({"regime": regime, "packets": 0, "best": best, "verdict": None,
                              "note": f"{tests[regime]}: no test rows"})
                continue
            report = self.regime_report(regime, test, tests[regime], maps[regime], choice[regime], fits.get(regime))
            table.append({**regime_row(regime, report, best, self.seed), **CMB.row_fields(report, best),
                          "prompt": self.specs[regime].describe(),
                          "calibrated_on": calibrations[regime].get("fitted_on")})
            regimes[regime] = dict(report)
            packets, preds = prediction_columns(report)
            columns.append(({**packets, "regime": np.full(report["queries"], regime, dtype=object)}, preds))
        return table, regimes, columns

    def regime_report(self, regime: str, test: dict, path: Path, cal, choice: dict, fit):
        """One regime's full report: every baseline, the model and the combined answer (`fit`,
        eval.combine) on its sampled test packets."""
        spec = self.specs[regime]
        idx = _sample(len(test["rtt"]), self.queries, self.seed)
        self.progress(f"{regime}: baselines")
        report = baseline_table(self.train, take(test, idx), truth=self.truth, baselines=dict(self.fitted),
                                fitted=True, seed=self.seed, seen=self.seen)
        t1 = time.perf_counter()
        pred = self.ask(test, idx, cal, regime, spec)
        add_model(report, pred, {"run": str(self.run), "steps": list(self.model.steps), **spec.describe(),
                                 "device": self.model.device, "context_sizes": pred["context_sizes"],
                                 "seconds": round(time.perf_counter() - t1, 2)},
                  None if cal is None else {"calibration": cal.path})
        self.progress(f"{regime}: baselines that read the prompt")
        add_prompt_baselines(report, pred["pool"], pred["contexts"], seed=self.seed, refit=True)
        model_first(report)
        CMB.add_combined(report, pred, fit, self.seed)
        report["comparisons"] = {"model": compare(report, "model", seed=self.seed)}
        CMB.compare_combined(report, self.seed)
        report["nll"] = pred["nll"]
        report["prompt"] = {**spec.describe(), **prompt_stats(pred["pool"], test, idx, pred["contexts"])}
        report["queries"] = int(len(idx))
        report["inputs"] = {"test": str(path)}
        report["rows"] = summary_rows(report)
        report["best"] = {"name": choice["best"], **choice}
        return report


def _merged_columns(columns: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """The regimes' prediction columns as one table's: packets concatenated, each predictor's
    figures NaN where a regime's report has no such predictor."""
    packets, preds = [c[0] for c in columns], [c[1] for c in columns]
    names = list(dict.fromkeys(n for pr in preds for n in pr))
    cols = {k: np.concatenate([p[k] for p in packets]) for k in packets[0]}
    merged = {n: {f: _concat([pr.get(n, {}).get(f) for pr in preds], [len(p["actual_rtt"]) for p in packets])
                  for f in ("median", "p05", "p25", "p75", "p95", "p_fail", "pit", "crps")} for n in names}
    return cols, merged


def describe_val(info: dict, vals: dict) -> None:
    """What a map's val packets hold out (`held_out`: per regime, its kind and count) and, where
    that is few, a warning the table prints."""
    units = {r: u for r, v in vals.items() if (u := held_out_units(v, r)) is not None}
    if not info.get("fitted") or not units:
        return
    info["held_out"] = {r: {"what": what, "count": n} for r, (what, n) in units.items()}
    if len(vals) == 1:
        (r, v), = vals.items()
        if narrow := narrow_val(v, r):
            info["warning"] = f"{info['fitted_on']} {narrow}"
    elif sum(n for _, n in units.values()) < MIN_VAL_HOSTS:
        held = ", ".join(_count(n, what) for what, n in units.values())
        info["warning"] = (f"{info['fitted_on']} hold {held} in all: a map fitted on so few may not transfer to "
                           "the test's other hosts (compare the raw coverage)")


def _count(n: int, what: str) -> str:
    return f"{n} {what if n != 1 else what[:-1]}"


def prompt_stats(pool: dict, test: dict, idx: np.ndarray, contexts: list[np.ndarray]) -> dict:
    """What the prompts held, for the report and its reader: their mean size, the share of
    their measurements that are of the queried pair itself, and the share strictly before the
    query's time (1.0: no prompt saw the future)."""
    n = sum(len(c) for c in contexts)
    if not n:
        return {"mean_measurements": 0.0, "of_the_pair": None, "before_query": None}
    psrc, pdst, pt = np.asarray(pool["src"]), np.asarray(pool["dst"]), np.asarray(pool["event_time"], np.int64)
    same = sum(int(((psrc[c] == test["src"][i]) & (pdst[c] == test["dst"][i])).sum()) for i, c in zip(idx, contexts))
    before = sum(int((pt[c] < int(test["event_time"][i])).sum()) for i, c in zip(idx, contexts))
    return {"mean_measurements": n / len(contexts), "of_the_pair": same / n, "before_query": before / n}


def _concat(parts: list, sizes: list[int]) -> np.ndarray | None:
    if all(p is None for p in parts):
        return None
    return np.concatenate([np.full(n, np.nan) if p is None else np.asarray(p, np.float64) for p, n in zip(parts, sizes)])
