"""The eval report: load splits, fit and score every baseline, merge in the model.

    train = load_split("runs/demo/shards/train")
    test = load_split("runs/demo/shards/test")
    report = baseline_table(train, test, truth="runs/demo/synth")     # truth optional
    add_predictor(report, "model", median, quantiles={0.05: .., 0.25: .., 0.75: .., 0.95: ..},
                  pit=pit, p_fail=p_fail)
    rows = summary_rows(report)            # one row per predictor (+ noise floor) for a table
    write_plots(report, out_dir)           # error CDF, calibration, scatter per predictor
    json.dumps(report)                     # the report is a plain JSON-able dict

The report (a dict subclass) keeps the per-packet arrays it needs for `add_predictor` and
`write_plots` in its `.ctx` attribute, which JSON serialisation ignores. Layout: docs/eval.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pingctl.artifacts.table import refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import inside_pingctl_output
from pingctl.context import codes_in, dict_encode, vocabulary
from pingctl.errors import PingctlError
from pingctl.eval import metrics as M, plots
from pingctl.eval.baselines import (GlobalMedian, PairMedian, Prediction, Prefix16Median, PrefixMedian, PromptMedian,
                                    column, refit_prediction)
from pingctl.eval.embedding import Embedding
from pingctl.eval.vivaldi import Vivaldi
from pingctl.schema.columns import COLUMNS
from pingctl.schema.duck import refuse_rejects
from pingctl.schema.parquet import check_parquet_columns, read_table
from pingctl.synth.truth import truth_median_ms
from pingctl.tokenizer.measurements import event_seconds, MeasurementError, parse_addresses

NOISE_FLOOR = "noise_floor"
QUANTILE_COLUMNS = {0.05: "p05", 0.25: "p25", 0.75: "p75", 0.95: "p95"}


def default_baselines(seed: int = 0, vivaldi_cycles: int = 1000) -> dict[str, object]:
    """The baselines of `baseline_table`, by report name (unfitted)."""
    return {
        "global_median": GlobalMedian(seed=seed),
        "prefix_median": PrefixMedian(seed=seed),
        "prefix16_median": Prefix16Median(seed=seed),
        "pair_median": PairMedian(seed=seed),
        "vivaldi": Vivaldi(cycles=vivaldi_cycles, seed=seed),
        "embedding": Embedding(seed=seed),
    }


class Report(dict):
    """A JSON-able dict; `.ctx` holds test arrays, masks and predictions (not serialised)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ctx: dict = {}


# ---------------------------------------------------------------- loading


def load_split(path, columns: list[str] | None = None, split_hint: str = "test") -> dict[str, np.ndarray]:
    """Canonical Parquet (a file, a directory such as `SHARDS/test`, or a glob) -> dict of arrays.

    Keys: src, dst (NumPy object arrays of str; equal strings share one object), ip_version
    (int64), rtt (float64 ms, -1.0 = failed), event_time (int64 Unix seconds), msm_id, size,
    packet_error_count (int64), prb_id (int64, -1 where null or absent). `columns` picks
    canonical column names (src_addr/dst_addr for the addresses).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    refuse_whole_shard_output([path], split=split_hint)
    files = resolve_inputs([path])
    check_parquet_columns(files)
    wanted = list(columns or COLUMNS)
    parts: dict[str, list[np.ndarray]] = {c: [] for c in wanted}
    for f in files:
        have = set(pq.read_schema(f).names)
        cols = [c for c in wanted if c in have]
        t = read_table(f, columns=cols, read_dictionary=[c for c in ("src_addr", "dst_addr") if c in cols])
        n = t.num_rows
        _check_no_nulls(f, t)
        for c in wanted:
            if c not in have:
                parts[c].append(np.full(n, -1, np.int64))
                continue
            col = t.column(c)
            if c in ("src_addr", "dst_addr"):
                parts[c].append(_strings(col))
            elif c == "event_time":
                try:
                    parts[c].append(event_seconds(col)[0])  # nulls were refused above
                except MeasurementError as e:
                    raise PingctlError(f"{f}: {e}") from None
            elif c == "rtt":
                parts[c].append(col.cast(pa.float64()).to_numpy())
            else:
                parts[c].append(pc.fill_null(col.cast(pa.int64()), -1).to_numpy())
    # a table pingctl did not write may hold rows its pipeline rejects (a -5 ms RTT read as a
    # failure, 1e300 ms as an RTT, an IPv4 pair labelled 6): named here, not scored
    if foreign := [f for f in files if not inside_pingctl_output(f)]:
        refuse_rejects(foreign, "eval scores canonical rows only: pass the table through `pingctl shard` "
                       "(which sets rejected rows aside in rejects.jsonl) and evaluate its splits")
    out = {}
    for c, chunks in parts.items():
        key = {"src_addr": "src", "dst_addr": "dst"}.get(c, c)
        if chunks:
            out[key] = np.concatenate(chunks)
        else:
            out[key] = np.empty(0, dtype=object if key in ("src", "dst") else np.float64 if c == "rtt" else np.int64)
    return out


def _check_no_nulls(path, t) -> None:
    """Nulls, a NaN RTT or an unparseable address would surface later (after the baselines and
    the model load) as a NaN metric or an error that names neither the file nor the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for c in ("src_addr", "dst_addr", "rtt", "event_time"):
        if c in t.column_names and t.column(c).null_count:
            first = int(pc.index(pc.is_null(t.column(c)), True).as_py())
            raise PingctlError(
                f"{path}: column {c} has {t.column(c).null_count:,} null value(s), the first in row {first}; "
                "a canonical table has none (a failed packet has rtt = -1): `pingctl ingest` it first"
            )
    if "rtt" in t.column_names and pa.types.is_floating(t.column("rtt").type):
        nan = pc.is_nan(t.column("rtt"))
        if count := int(pc.sum(nan).as_py() or 0):
            first = int(pc.index(nan, True).as_py())
            raise PingctlError(f"{path}: column rtt has {count:,} NaN value(s), the first in row {first}; "
                               "a canonical RTT is milliseconds, or -1 for a failed packet")
    for c in ("src_addr", "dst_addr"):
        if c in t.column_names:
            _check_addresses(path, c, t.column(c))


def _check_addresses(path, name: str, col) -> None:
    """Every address parses as the prompt builder will parse it; cheap on the dictionary-encoded
    columns load_split reads (each distinct string once per chunk)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        for chunk in col.chunks:
            parse_addresses(chunk, name)
    except PingctlError:
        # the error path only: find which strings fail and the first row holding one
        text = col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col
        bad = []
        for v in pc.unique(text).to_pylist():
            try:
                parse_addresses(pa.array([v], pa.string()), name)
            except PingctlError:
                bad.append(v)
        first = int(pc.index(pc.is_in(text, value_set=pa.array(bad, pa.string())), True).as_py())
        shown = ", ".join(repr(b) for b in bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise PingctlError(f"{path}: column {name} has {len(bad):,} invalid IP address(es) ({shown}), "
                           f"the first in row {first}") from None


def _strings(col) -> np.ndarray:
    chunks = []
    for ch in col.chunks:
        enc = dict_encode(ch)
        uniq = np.array(enc.dictionary.to_pylist() + [None], dtype=object)
        idx = enc.indices.fill_null(len(uniq) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        chunks.append(uniq[idx])
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=object)


def take(d: dict, index) -> dict:
    """Row subset (boolean mask or indices) of every array in a split dict."""
    return {k: np.asarray(v)[index] for k, v in d.items()}


# ---------------------------------------------------------------- slices


def seen_masks(train: dict, test: dict) -> dict[str, np.ndarray]:
    """seen/unseen pair ((src, dst) has a training packet) and probe (its prb_id — or, without
    one, its source address — has a training packet) for each test packet."""
    vocab = vocabulary(column(train, "src"), column(train, "dst"))
    n = max(len(vocab), 1)

    def pair_keys(d):
        s, t = codes_in(column(d, "src"), vocab), codes_in(column(d, "dst"), vocab)
        return np.where((s >= 0) & (t >= 0), s * n + t, -1), s

    train_pairs, train_src = pair_keys(train)
    test_pairs, test_src = pair_keys(test)
    seen_pair = (test_pairs >= 0) & np.isin(test_pairs, np.unique(train_pairs))
    seen_src = (test_src >= 0) & np.isin(test_src, np.unique(train_src))
    if "prb_id" in train and "prb_id" in test:
        tr = np.asarray(train["prb_id"], np.int64)
        te = np.asarray(test["prb_id"], np.int64)
        seen_probe = np.where(te >= 0, np.isin(te, np.unique(tr[tr >= 0])), seen_src)
    else:
        seen_probe = seen_src
    return {"seen_pair": seen_pair, "unseen_pair": ~seen_pair, "seen_probe": seen_probe, "unseen_probe": ~seen_probe}


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
) -> Report:
    """Fit every baseline on `train`, predict `test`, and score them overall and per slice.

    truth: per-test-packet true conditional medians (array), or a `pingctl synth` directory /
    `Truth` to compute them with `truth_median_ms`; adds the noise floor. `baselines` replaces
    the default set (name -> unfitted predictor; already fitted on `train` with `fitted=True`,
    e.g. to score one fit on several test sets). `extra_masks` adds caller slices.
    """
    # Encode the address columns once; every predictor reuses the Arrow dictionaries.
    train = dict(train, src=dict_encode(column(train, "src")), dst=dict_encode(column(train, "dst")))
    test_enc = dict(test, src=dict_encode(column(test, "src")), dst=dict_encode(column(test, "dst")))
    actual = np.asarray(column(test, "rtt"), dtype=np.float64)
    ipv = np.asarray(column(test, "ip_version"), dtype=np.int64)
    extra = seen_masks(train, test_enc)
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
    for name, pred in (baselines or default_baselines(seed=seed, vivaldi_cycles=vivaldi_cycles)).items():
        t0 = time.perf_counter()
        if not fitted:
            pred.fit(train)
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


# ---------------------------------------------------------------- presentation


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
                   + ("; a longer run or a larger preset is what closes that (docs/eval.md, \"What a CPU budget "
                      "buys\")."
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


# ---------------------------------------------------------------- baselines that read the prompt


def add_prompt_baselines(report: Report, pool: dict, contexts, seed: int = 0, refit: bool | None = None) -> list[str]:
    """Add the predictors that see what the model's prompts hold (`pool`, `contexts`: as
    `eval.model.predict` returns them) to a `baseline_table` report of the same packets:
    `prompt_median` (the prompt's measurements of the pair, else of its /24|/48, else /16|/32
    networks) and, where some query has an end the training split never saw (`refit` None: only
    then; True: always), `vivaldi_refit` and `embedding_refit` (that end placed from the
    prompt). Returns the names added."""
    ctx = report.ctx
    test = ctx["test"]
    fitted = ctx.get("fitted") or {}
    glob = fitted["global_median"].predict(test)
    names = []
    p = PromptMedian(seed=seed).predict(pool, test, contexts, glob)
    add_prediction(report, "prompt_median", p)
    names.append("prompt_median")
    for base in ("vivaldi", "embedding"):
        b = fitted.get(base)
        if b is None:
            continue
        if refit is None:
            s, d = b.codes(column(test, "src")), b.codes(column(test, "dst"))
            tr = b.trained
            ks = (s >= 0) & tr[np.maximum(s, 0)]
            kd = (d >= 0) & tr[np.maximum(d, 0)]
            if not (ks ^ kd).any():
                continue
        t0 = time.perf_counter()
        pr = refit_prediction(b, pool, test, contexts, glob)
        entry = add_prediction(report, f"{base}_refit", pr)
        entry["time_s"] = {"refit": round(time.perf_counter() - t0, 4)}
        names.append(f"{base}_refit")
    return names


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
