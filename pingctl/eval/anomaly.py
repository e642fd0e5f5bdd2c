"""Anomaly detection on a synthetic world: the model's scores (`pingctl score`) against a
classical detector, with labels from the world's truth (docs/eval.md, "Anomaly scores").

- `truth_labels`: per packet, whether it falls in the first hours after a route change of its
  stream (a detour starting or ending) or in an outage of its source or destination (same
  address family), from the `pingctl synth` truth sidecar (truth/routes.parquet,
  truth/outages.parquet; docs/synth.md).
- `rolling_mad`: the classical detector, per (src, dst) pair and causal: a successful packet's
  robust z-score against the median and MAD of the pair's previous `window` successful RTTs,
  turned into a two-sided normal tail probability; a failed packet's probability is the pair's
  failure share over its previous `window` packets, shrunk towards the table's failure rate
  (`prior` pseudo-packets). Vectorised with sliding windows, no loop over pairs or packets.
- `detection`: precision and recall of "tail_p < threshold", and ROC AUC of the ranking.
- `compare_detectors`: both detectors on the same packets of a score table, overall and per
  kind (route detours among successful packets, outages among failed ones).

    from pingctl.eval.anomaly import compare_detectors
    compare_detectors("scores.parquet", "runs/demo/synth")
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from pingctl.schema.arrow_strings import codes_in, vocabulary
from pingctl.errors import PingctlError
from pingctl.eval.metrics import roc_auc
from pingctl.schema.parquet import read_table
from pingctl.synth.truth import TRUTH_DIR, load_truth
from pingctl.tokenizer.measurements import event_seconds

WINDOW = 24  # a pair's previous packets the median and MAD are taken over (4 h at 10-minute steps)
MIN_HISTORY = 5  # fewer previous successes: no judgement (tail probability 1)
PRIOR = 10.0  # pseudo-packets of the table's failure rate in a pair's failure share
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data
FLOOR_MS, FLOOR_REL = 0.1, 0.01  # the scale never goes below 0.1 ms or 1% of the median
THRESHOLD = 0.01
ROUTE_WINDOW_S = 2 * 3600  # a route change's packets: those of the first two hours on the new route


# ----------------------------------------------------------------- labels


def truth_labels(truth_dir, src, dst, ip_version, time_s, min_shift_ms: float = 0.0,
                 route_window_s: int = ROUTE_WINDOW_S) -> dict[str, np.ndarray]:
    """bool arrays per packet (`time_s` in Unix seconds): "route" (within `route_window_s` of a
    route change of its stream that moved the base RTT by more than `min_shift_ms`, a detour
    starting or ending), "outage" (its source's or destination's address is in an outage) and
    "anomalous" (either). Packets of streams the truth does not know are labelled normal.

    A detour lasts days (docs/synth.md): labelling all of it would call a steady state an
    anomaly, which no detector that learns from recent packets should flag; the change itself
    and the hours after it are what an operator wants to hear about."""
    import pyarrow as pa

    truth = load_truth(truth_dir)
    t = np.asarray(time_s, np.int64)
    sid = truth.stream_index(src, dst, ip_version)
    s = np.maximum(sid, 0)
    rel = t - truth.start_s
    ridx = np.searchsorted(truth.route_key, (s << 40) | np.maximum(rel, 0), side="right") - 1
    r = np.maximum(ridx, 0)
    prev = np.maximum(r - 1, 0)
    changed = (r > 0) & ((truth.route_key[prev] >> 40) == (truth.route_key[r] >> 40))  # not the stream's first
    step = np.abs(truth.route_shift[r] - truth.route_shift[prev])
    since = rel - (truth.route_key[r] & ((1 << 40) - 1))
    route = (sid >= 0) & (ridx >= 0) & (rel >= 0) & changed & (step > min_shift_ms) & (since < route_window_s)

    o = read_table(Path(truth_dir) / TRUTH_DIR / "outages.parquet", columns=["addr", "start", "end"])
    addrs = vocabulary(o.column("addr"))
    oid = codes_in(o.column("addr"), addrs)
    start = event_seconds(o.column("start").combine_chunks())[0] - truth.start_s
    end = event_seconds(o.column("end").combine_chunks())[0] - truth.start_s
    order = np.lexsort((start, oid))
    key, o_end = (oid[order] << 40) | np.maximum(start[order], 0), end[order]

    def in_outage(addr) -> np.ndarray:
        a = codes_in(pa.array(np.asarray(addr, dtype=object), pa.string()), addrs)
        q = (np.maximum(a, 0) << 40) | np.maximum(rel, 0)
        j = np.searchsorted(key, q, side="right") - 1
        jj = np.maximum(j, 0)
        # outages of one (host, family) never overlap: the last one starting before t is the only candidate
        return (a >= 0) & (j >= 0) & ((key[jj] >> 40) == a) & (rel < o_end[jj]) if len(key) else np.zeros(len(t), bool)

    outage = in_outage(src) | in_outage(dst)
    return {"route": route, "outage": outage, "anomalous": route | outage}


# ----------------------------------------------------------------- the classical detector


def _pair_codes(src, dst) -> np.ndarray:
    s = codes_in(src, vocabulary(src))
    d = codes_in(dst, vocabulary(dst))
    return s * (int(d.max()) + 1 if len(d) else 1) + d


def _previous(values: np.ndarray, group: np.ndarray, window: int) -> np.ndarray:
    """[n, window]: each row's previous `window` values of its own group (sorted by group),
    NaN where there are fewer."""
    from numpy.lib.stride_tricks import sliding_window_view

    n = len(values)
    if n == 0:
        return np.zeros((0, window))
    pv = np.concatenate([np.full(window, np.nan), values.astype(np.float64)])
    pg = np.concatenate([np.full(window, -1, np.int64), group])
    win = sliding_window_view(pv, window)[:n]
    same = sliding_window_view(pg, window)[:n] == group[:, None]
    return np.where(same, win, np.nan)


def rolling_mad(src, dst, time_s, rtt, window: int = WINDOW, min_history: int = MIN_HISTORY,
                prior: float = PRIOR) -> dict[str, np.ndarray]:
    """The classical detector on packets in any order: per packet "tail_p" (small = surprising),
    "z" (robust z-score of a successful packet; NaN for failures and without enough history) and
    "history" (previous successful packets of the pair it was judged on, at most `window`)."""
    if window < 1 or min_history < 1:
        raise PingctlError(f"window and min_history must be >= 1 (got {window}, {min_history})")
    rtt = np.asarray(rtt, np.float64)
    n = len(rtt)
    pair = _pair_codes(src, dst)
    order = np.lexsort((np.asarray(time_s, np.int64), pair))
    ps, xs = pair[order], rtt[order]
    ok = xs >= 0
    tail, z, hist = np.ones(n), np.full(n, np.nan), np.zeros(n, np.int64)
    # successes: robust z against the pair's previous successful RTTs
    win = _previous(xs[ok], ps[ok], window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: a pair's first packets
        med = np.nanmedian(win, axis=1)
        mad = np.nanmedian(np.abs(win - med[:, None]), axis=1)
    count = np.isfinite(win).sum(axis=1)
    scale = np.maximum.reduce([MAD_SCALE * np.nan_to_num(mad), FLOOR_REL * np.nan_to_num(med),
                               np.full(len(med), FLOOR_MS)])
    zs = np.where(count >= min_history, (xs[ok] - med) / scale, np.nan)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    p_ok = np.where(np.isfinite(zs), erfc(np.abs(np.nan_to_num(zs)) / math.sqrt(2.0)), 1.0)
    # failures: the pair's recent failure share, shrunk towards the table's rate
    fails = _previous((~ok).astype(np.float64), ps, window)
    seen = np.isfinite(fails).sum(axis=1)
    rate = float((~ok).mean()) if n else 0.0
    p_fail = (np.nansum(fails, axis=1) + prior * rate) / (seen + prior)
    sorted_tail = np.ones(n)
    sorted_tail[ok] = p_ok
    sorted_tail[~ok] = p_fail[~ok]
    sorted_z = np.full(n, np.nan)
    sorted_z[ok] = zs
    sorted_hist = np.zeros(n, np.int64)
    sorted_hist[ok] = count
    tail[order], z[order], hist[order] = sorted_tail, sorted_z, sorted_hist
    return {"tail_p": tail, "z": z, "history": hist}


# ----------------------------------------------------------------- metrics


def detection(tail_p, label, threshold: float = THRESHOLD, mask=None, score=None) -> dict:
    """Precision and recall of flagging `tail_p < threshold` against `label`, and the ROC AUC of
    ranking by `score` (default −log tail_p: the smaller the tail probability, the higher)."""
    p = np.asarray(tail_p, np.float64)
    y = np.asarray(label, bool)
    m = np.ones(len(p), bool) if mask is None else np.asarray(mask, bool)
    s = -np.log(np.maximum(p, 1e-300)) if score is None else np.asarray(score, np.float64)
    flag = (p < threshold) & m
    tp = int((flag & y).sum())
    pos = int((y & m).sum())
    return {"packets": int(m.sum()), "anomalous": pos, "flagged": int(flag.sum()), "true_positives": tp,
            "precision": tp / int(flag.sum()) if flag.any() else None, "recall": tp / pos if pos else None,
            "auc": roc_auc(s, y, m)}


def compare_detectors(scores, truth_dir, threshold: float = THRESHOLD, window: int = WINDOW,
                      min_history: int = MIN_HISTORY, min_shift_ms: float = 0.0,
                      route_window_s: int = ROUTE_WINDOW_S) -> dict:
    """The model's tail_p (and its NLL as a ranking) against `rolling_mad` on the packets of a
    score table (`pingctl score` output, a path or Arrow table), labelled by the truth of the
    synthetic world it came from (`truth_labels`). Slices: "all" (route change or outage),
    "route" (successful packets: after a route change or not), "outage" (failed packets: in an
    outage or random loss)."""
    import pyarrow as pa

    t = scores if isinstance(scores, pa.Table) else read_table(scores)
    missing = [c for c in ("src_addr", "dst_addr", "ip_version", "event_time", "rtt", "tail_p", "nll")
               if c not in t.column_names]
    if missing:
        raise PingctlError(f"not a score table: no {', '.join(missing)} (write one with `pingctl score`)")
    src, dst = t.column("src_addr"), t.column("dst_addr")
    time_s = event_seconds(t.column("event_time").combine_chunks())[0]
    rtt = t.column("rtt").to_numpy()
    labels = truth_labels(truth_dir, src, dst, t.column("ip_version").to_numpy(), time_s, min_shift_ms, route_window_s)
    mad = rolling_mad(src, dst, time_s, rtt, window, min_history)
    model_p, nll = t.column("tail_p").to_numpy(), t.column("nll").to_numpy()
    ok = rtt >= 0
    slices = {"all": (labels["anomalous"], None), "route": (labels["route"], ok), "outage": (labels["outage"], ~ok)}
    out: dict = {"packets": int(len(rtt)), "threshold": threshold, "window": window, "min_history": min_history,
                 "min_shift_ms": min_shift_ms, "route_window_s": route_window_s, "labels": {k: int(v.sum()) for k, v in labels.items()}}
    for name, (y, m) in slices.items():
        out[name] = {"model": detection(model_p, y, threshold, m),
                     "model_nll": detection(model_p, y, threshold, m, score=nll),
                     "rolling_mad": detection(mad["tail_p"], y, threshold, m)}
    return out
