"""The eval report: fit and score every registered baseline on one split's packets, merge in
the model (the splits come read and checked from `artifacts.table.load_split`).

    report = baseline_table(train, test, truth="runs/demo/synth")     # truth optional
    add_predictor(report, "model", median, quantiles={0.05: .., 0.25: .., 0.75: .., 0.95: ..},
                  pit=pit, p_fail=p_fail)
    add_prompt_baselines(report, pool, contexts)   # the registry's predictors that read prompts
    json.dumps(report)                             # the report is a plain JSON-able dict

The report (a dict subclass) keeps the per-packet arrays it needs for `add_predictor` and
`eval.presentation` (rows, plots, predictions) in its `.ctx` attribute, which JSON
serialisation ignores. Which baselines: `eval.registry`. Layout: docs/eval-reference.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.schema.arrow_strings import codes_in, dict_encode, vocabulary
from pingctl.errors import PingctlError
from pingctl.eval import metrics as M
from pingctl.eval.baselines import Prediction, SharedFits, column, refit_prediction
from pingctl.eval.registry import default_baselines, fit_one, prompt_baselines
from pingctl.synth.truth import truth_median_ms


class Report(dict):
    """A JSON-able dict; `.ctx` holds test arrays, masks and predictions (not serialised)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: dict = {}


# ---------------------------------------------------------------- slices


@dataclass
class Seen:
    """What a train split holds, for the seen/unseen slices: its address vocabulary, its
    (source, destination) pairs and sources as codes into it, its probes' prb_ids (sorted,
    distinct). Taken once per split: at a day's size (64M rows) it is four sorts of every row."""

    vocab: object
    pairs: np.ndarray
    sources: np.ndarray
    probes: np.ndarray | None

    @classmethod
    def of(cls, train: dict, shared: SharedFits | None = None) -> "Seen":
        """`shared` (made for this `train`) lends its address codes, so they are not made again."""
        vocab, s, t = SharedFits.of(train, shared).codes()
        n = max(len(vocab), 1)
        probes = None
        if "prb_id" in train:
            probes = _distinct(np.asarray(train["prb_id"], np.int64))
        return cls(vocab, _distinct_pairs(s, t, n), _distinct(s), probes)

    def masks(self, test: dict) -> dict[str, np.ndarray]:
        """seen/unseen pair ((src, dst) has a training packet) and probe (its prb_id — or,
        without one, its source address — has a training packet) for each test packet."""
        test_pairs, test_src = _pair_keys(test, self.vocab)
        seen_pair = (test_pairs >= 0) & np.isin(test_pairs, self.pairs)
        seen_src = (test_src >= 0) & np.isin(test_src, self.sources)
        if self.probes is not None and "prb_id" in test:
            te = np.asarray(test["prb_id"], np.int64)
            seen_probe = np.where(te >= 0, np.isin(te, self.probes), seen_src)
        else:
            seen_probe = seen_src
        return {"seen_pair": seen_pair, "unseen_pair": ~seen_pair, "seen_probe": seen_probe,
                "unseen_probe": ~seen_probe}


_BITMAP = 1 << 28  # distinct values below this are found by marking them, not by sorting 64M rows
_BLOCK = 1 << 22


def _distinct(v: np.ndarray) -> np.ndarray:
    """The sorted distinct values >= 0 of `v`."""
    v = v[v >= 0] if len(v) and v.min() < 0 else v
    if not len(v) or int(v.max()) >= _BITMAP:
        return np.unique(v)
    return np.flatnonzero(np.bincount(v, minlength=int(v.max()) + 1))


def _distinct_pairs(s: np.ndarray, t: np.ndarray, n: int) -> np.ndarray:
    """The sorted distinct s * n + t of the rows with both codes >= 0, a block of rows at a time."""
    if n * n > _BITMAP:
        ok = (s >= 0) & (t >= 0)
        return np.unique(s[ok].astype(np.int64) * n + t[ok])
    marked = np.zeros(n * n, bool)
    for a in range(0, len(s), _BLOCK):
        sb, tb = s[a:a + _BLOCK].astype(np.int64), t[a:a + _BLOCK]
        ok = (sb >= 0) & (tb >= 0)
        marked[sb[ok] * n + tb[ok]] = True
    return np.flatnonzero(marked)


def _pair_keys(d: dict, vocab) -> tuple[np.ndarray, np.ndarray]:
    n = max(len(vocab), 1)
    s, t = codes_in(column(d, "src"), vocab), codes_in(column(d, "dst"), vocab)
    return np.where((s >= 0) & (t >= 0), s * n + t, -1), s


def pair_groups(test: dict) -> np.ndarray:
    """An int64 id per test packet, equal for packets of the same (src, dst) pair."""
    src, dst = column(test, "src"), column(test, "dst")
    vocab = vocabulary(src, dst)
    return codes_in(src, vocab) * max(len(vocab), 1) + codes_in(dst, vocab)


def _slice_sizes(masks: dict, actual: np.ndarray) -> dict:
    ok = M.successful(actual)
    return {k: {"n": int(m.sum()), "n_ok": int((m & ok).sum())} for k, m in masks.items()}


# ---------------------------------------------------------------- scoring


def _entry(median, actual, masks, quantiles=None, pit=None, p_fail=None, crps=None) -> dict:
    failed = np.asarray(actual) < 0
    entry: dict = {
        "overall": M.error_summary(median, actual),
        "slices": M.sliced_summary(median, actual, masks),
        "crps": None if crps is None else {k: M.crps_summary(crps, actual, m) for k, m in masks.items()},
        "calibration": None,
        "failure": None,
    }
    if quantiles is not None or pit is not None:
        entry["calibration"] = {
            "pit": M.pit_histogram(pit) if pit is not None else None,
            "coverage": M.coverage(actual, quantiles) if quantiles is not None else None,
        }
    if p_fail is not None:
        entry["failure"] = M.failure_summary(p_fail, failed)
    return entry


def _prediction_arrays(median, quantiles=None, pit=None, p_fail=None, crps=None) -> dict:
    return {
        "crps": None if crps is None else np.asarray(crps, np.float64),
        "median": np.asarray(median, dtype=np.float64),
        "quantiles": None if quantiles is None else (
            {float(k): np.asarray(v, np.float64) for k, v in quantiles.items()} if isinstance(quantiles, dict)
            else np.asarray(quantiles, np.float64)
        ),
        "pit": None if pit is None else np.asarray(pit, np.float64),
        "p_fail": None if p_fail is None else np.asarray(p_fail, np.float64),
    }


def _truth_medians(truth, test: dict) -> np.ndarray:
    if isinstance(truth, (str, Path)) or type(truth).__name__ == "Truth":
        return truth_median_ms(truth, column(test, "src"), column(test, "dst"), column(test, "ip_version"),
                               np.asarray(column(test, "event_time")))
    return np.asarray(truth, dtype=np.float64)


def baseline_table(
    train: dict,
    test: dict,
    truth=None,
    *,
    baselines: dict | None = None,
    vivaldi_cycles: int = 1000,
    seed: int = 0,
    extra_masks: dict | None = None,
    rtt_buckets=M.RTT_BUCKETS,
    fitted: bool = False,
    seen: Seen | None = None,
) -> Report:
    """Fit every baseline on `train`, predict `test`, and score them overall and per slice.

    truth: per-test-packet true conditional medians (array), or a `pingctl synth` directory /
    `Truth` to compute them with `truth_median_ms`; adds the noise floor. `baselines` replaces
    the default set (name -> unfitted predictor; already fitted on `train` with `fitted=True`,
    e.g. to score one fit on several test sets; `seen`: `Seen.of(train)`, taken once for them).
    `extra_masks` adds caller slices.
    """
    if not fitted:  # encode the address columns once; every predictor's fit reuses the dictionaries
        train = dict(train, src=dict_encode(column(train, "src")), dst=dict_encode(column(train, "dst")))
    test_enc = dict(test, src=dict_encode(column(test, "src")), dst=dict_encode(column(test, "dst")))
    actual = np.asarray(column(test, "rtt"), dtype=np.float64)
    ipv = np.asarray(column(test, "ip_version"), dtype=np.int64)
    extra = (seen or Seen.of(train)).masks(test_enc)
    extra.update(extra_masks or {})
    masks = M.standard_masks(ipv, actual, extra, rtt_buckets)
    train_rtt = np.asarray(column(train, "rtt"), dtype=np.float64)
    report = Report(
        n_train=int(len(train_rtt)),
        n_train_ok=int((train_rtt >= 0).sum()),
        n_test=int(len(actual)),
        n_test_ok=int(M.successful(actual).sum()),
        test_failure_share=float((actual < 0).mean()) if len(actual) else None,
        rtt_buckets_ms=[float(x) for x in rtt_buckets],
        slices=_slice_sizes(masks, actual),
        order=[],
        predictors={},
        noise_floor=None,
    )
    report.ctx.update(actual=actual, ip_version=ipv, masks=masks, predictions={}, truth_median=None,
                      pair=pair_groups(test_enc), test=test)
    shared = None if fitted else SharedFits(train)  # the levels the baselines have in common, fitted once
    for name, pred in (baselines or default_baselines(seed=seed, vivaldi_cycles=vivaldi_cycles)).items():
        t0 = time.perf_counter()
        if not fitted:
            fit_one(pred, train, shared)
        t1 = time.perf_counter()
        p: Prediction = pred.predict(test_enc)
        t2 = time.perf_counter()
        entry = add_prediction(report, name, p)
        entry["time_s"] = {"fit": round(t1 - t0, 4), "predict": round(t2 - t1, 4)}
        report.ctx.setdefault("fitted", {})[name] = pred
        info = getattr(pred, "fit_info", None)
        if info:
            entry["info"] = dict(info)
    if truth is not None:
        tm = _truth_medians(truth, test)
        report.ctx["truth_median"] = tm
        ok = M.successful(actual)
        if isinstance(truth, (str, Path)) and ok.any() and not np.isfinite(tm[ok]).any():
            raise PingctlError(f"--truth {truth}: knows none of the {int(ok.sum()):,} test packets' pairs "
                               "(the sidecar of another `pingctl synth` world?)")
        report["noise_floor"] = {
            "overall": M.noise_floor(tm, actual),
            "slices": {k: M.noise_floor(tm, actual, m) for k, m in masks.items()},
            "n_unknown": int((ok & ~np.isfinite(tm)).sum()),
        }
    return report


def add_prediction(report: dict, name: str, p: Prediction, info: dict | None = None) -> dict:
    """`add_predictor` of a baseline's Prediction, with its fallback shares."""
    entry = add_predictor(report, name, p.median, quantiles=p.quantiles, pit=p.pit, p_fail=p.p_fail, crps=p.crps,
                          info=info)
    entry["fallback"] = p.level_shares()
    return entry


def add_predictor(report: dict, name: str, median, quantiles=None, pit=None, p_fail=None, *,
                  test: dict | None = None, info: dict | None = None, crps=None) -> dict:
    """Score another predictor (e.g. the model) on the report's test packets and add it.

    median: float[n_test] predicted median RTT (NaN = no prediction); quantiles: {0.05, 0.25,
    0.75, 0.95 -> float[n]} (extra keys ignored) or an (n, 4) array in that order; pit:
    float[n] predictive CDF at the actual RTT (NaN for failed packets); p_fail: float[n]
    failure probability; crps: float[n] CRPS (ms) of the actual RTT under the predictive
    distribution (None: for a point predictor, without quantiles, its absolute error; else
    not scored). `test` is needed only for a report without `.ctx` (e.g. re-read from JSON).
    Returns the new entry (report["predictors"][name]).
    """
    ctx = getattr(report, "ctx", None)
    if not ctx:
        if test is None:
            raise ValueError("this report has no per-packet context; pass test=<the test split dict>")
        actual = np.asarray(column(test, "rtt"), np.float64)
        ipv = np.asarray(column(test, "ip_version"), np.int64)
        masks = M.standard_masks(ipv, actual, None, tuple(report.get("rtt_buckets_ms") or M.RTT_BUCKETS))
        ctx = {"actual": actual, "ip_version": ipv, "masks": masks, "predictions": {}, "truth_median": None,
               "pair": pair_groups(test)}
        if isinstance(report, Report):
            report.ctx = ctx
    actual = ctx["actual"]
    n = len(actual)
    for label, arr in (("median", median), ("pit", pit), ("p_fail", p_fail), ("crps", crps)):
        if arr is not None and len(np.asarray(arr)) != n:
            raise ValueError(f"{name}: {label} has {len(np.asarray(arr))} values for {n} test packets")
    if crps is None and quantiles is None:
        crps = M.crps_point(median, actual)  # a point forecast: all its mass on the median
    arrays = _prediction_arrays(median, quantiles, pit, p_fail, crps)
    entry = _entry(arrays["median"], actual, ctx["masks"], arrays["quantiles"], arrays["pit"], arrays["p_fail"],
                   arrays["crps"])
    entry["fallback"] = None
    if info:
        entry["info"] = dict(info)
    ctx["predictions"][name] = arrays
    report.setdefault("predictors", {})[name] = entry
    order = report.setdefault("order", [])
    if name not in order:
        order.append(name)
    return entry


def compare(report: Report, name: str = "model", n_boot: int = 2000, seed: int = 0) -> dict[str, dict]:
    """`name` against every other predictor of the report: the difference of their median relative
    errors on the packets both predict (negative: `name` is better), with a bootstrap interval
    over (src, dst) pairs (`metrics.median_difference`)."""
    ctx = report.ctx
    err = {k: M.relative_error(v["median"], ctx["actual"]) for k, v in ctx["predictions"].items()}
    return {other: M.median_difference(err[name], err[other], ctx["pair"], n_boot, seed=seed)
            for other in report["order"] if other != name}


# ---------------------------------------------------------------- baselines that read the prompt


def add_prompt_baselines(report: Report, pool: dict, contexts, seed: int = 0, refit: bool | None = None) -> list[str]:
    """Add the registry's predictors that see what the model's prompts hold (`pool`,
    `contexts`: as `eval.model.predict` returns them) to a `baseline_table` report of the same
    packets: those with a factory (`prompt_median`: the prompt's measurements of the pair, else
    of its /24|/48, else /16|/32 networks) and, where some query has an end the training split
    never saw (`refit` None: only then; True: always), the refits of the fitted coordinate
    baselines (`vivaldi_refit`, `embedding_refit`: that end placed from the prompt). Returns
    the names added."""
    ctx = report.ctx
    test = ctx["test"]
    fitted = ctx.get("fitted") or {}
    glob = fitted["global_median"].predict(test)
    names = []
    for spec in prompt_baselines():
        if spec.factory is not None:
            add_prediction(report, spec.name, spec.factory(seed, 0).predict(pool, test, contexts, glob))
            names.append(spec.name)
            continue
        b = fitted.get(spec.refit_of)
        if b is None or (refit is None and not _new_end(b, test)):
            continue
        t0 = time.perf_counter()
        pr = refit_prediction(b, pool, test, contexts, glob)
        entry = add_prediction(report, spec.name, pr)
        entry["time_s"] = {"refit": round(time.perf_counter() - t0, 4)}
        names.append(spec.name)
    return names


def _new_end(b, test: dict) -> bool:
    """Some query has exactly one end the fitted coordinate baseline `b` never placed."""
    s, d = b.codes(column(test, "src")), b.codes(column(test, "dst"))
    tr = b.trained
    ks = (s >= 0) & tr[np.maximum(s, 0)]
    kd = (d >= 0) & tr[np.maximum(d, 0)]
    return bool((ks ^ kd).any())


# ---------------------------------------------------------------- the model's rows


def quantile_dict(q: np.ndarray) -> dict:
    """`eval.model.predict`'s (n, 4) quantiles as add_predictor takes them."""
    return {0.05: q[:, 0], 0.25: q[:, 1], 0.75: q[:, 2], 0.95: q[:, 3]}


def add_model(report: Report, pred: dict, info: dict, calibrated_info: dict | None = None) -> None:
    """The model's predictions (`eval.model.predict`) as the predictor `model` and, where they
    were recalibrated (`calibrated_info` given), `model_calibrated`."""
    add_predictor(report, "model", pred["median"], quantiles=quantile_dict(pred["quantiles"]), pit=pred["pit"],
                  p_fail=pred["p_fail"], crps=pred["crps"], info=info)
    if calibrated_info is not None:
        c = pred["calibrated"]
        add_predictor(report, "model_calibrated", c["median"], quantiles=quantile_dict(c["quantiles"]), pit=c["pit"],
                      p_fail=c["p_fail"], crps=c["crps"], info=calibrated_info)


def model_first(report: Report) -> None:
    """The report's order with the model's predictors first, the rest as they were added."""
    first = ["model", "model_calibrated"]
    report["order"] = [n for n in first if n in report["order"]] + [n for n in report["order"] if n not in first]
