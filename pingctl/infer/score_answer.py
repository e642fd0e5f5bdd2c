"""`pingctl score` under the combined answer: each row's scores read from the distribution that
answers its question (docs/score.md, "Which predictor answers").

The model's scores of a packet are read at its observed value x: P(RTT < x), P(RTT = x) and the
code's own mass. A pool w * F_model + (1 - w) * G (`combine.pool`, G the log-normal around
the row's classical estimate on the same codes) is linear, so its reads are the same mixture of
the model's reads and G's at x, and the fit's recalibration map H moves both CDF levels read
there: no distribution of 65,536 codes is built per row. P(failure) stays the model's, so a
failed packet's scores do not change.

A row's classical estimate comes from its prompt's context rows, as a question's does
(`predictor`): the median of the pair's own packets there (the `time` regime), else the run's
hints' estimate for the pair.
"""

from __future__ import annotations

import numpy as np

from pingctl.context import context_indices, context_pool
from pingctl.infer import combine as CB
from pingctl.infer import predictor as PR
from pingctl.infer import queries as Q
from pingctl.prompt import Policy
from pingctl.tokenizer import Measurements
from pingctl.tokenizer.rtt_codec import decode_rtt, token_codes

_TINY = np.finfo(np.float64).tiny


def stream_contexts(rows: dict, context_measurements: np.ndarray) -> list[np.ndarray]:
    """Per row of a `stream` score, the rows before it in its window: its probe's rows (by
    prb_id, else source address) in time order, file order among equal times, the last
    `context_measurements` of them before it."""
    n = len(rows["rtt"])
    src_code = np.unique(np.asarray(rows["src"], object).astype(str), return_inverse=True)[1]
    prb = np.asarray(rows["prb_id"], np.int64)
    key = np.where(prb >= 0, prb, -1 - src_code.astype(np.int64))
    order = np.lexsort((np.arange(n), np.asarray(rows["event_time"], np.int64), key))
    at = np.empty(n, np.int64)
    at[order] = np.arange(n)
    cm = np.asarray(context_measurements, np.int64)
    return [order[at[k] - cm[k]: at[k]] for k in range(n)]


def answer_scores(cols: dict, rows: dict, contexts: list[np.ndarray], predictor: PR.Predictor, prompt: dict,
                  per_pair: int = 0) -> dict:
    """`cols` (the model's nll, pit, tail_p, p_fail) read from each row's answer instead, in
    place; returns {"answered_by": per row, "regime": per row, "why": {reason: rows}}."""
    n = len(rows["rtt"])
    src, dst = np.asarray(rows["src"], object), np.asarray(rows["dst"], object)
    rtt = np.asarray(rows["rtt"], np.float64)
    pair = [c[(src[c] == src[k]) & (dst[c] == dst[k])] for k, c in enumerate(contexts)]
    pair = [p[-per_pair:] if per_pair else p for p in pair]
    regime = _regimes(predictor, src, dst, np.array([len(p) for p in pair]))
    by = np.full(n, "model", object)
    why: dict = {}
    for r in dict.fromkeys(regime.tolist()):
        sel = np.flatnonzero(regime == r)
        decided = predictor.for_regime(r, prompt)
        if decided.predictor != "model":
            e = np.array([_estimate(predictor, r, rtt[pair[k]], src[k], dst[k], rows, contexts[k]) for k in sel])
            ok = np.isfinite(e) & (e > 0)
            if (~ok).any():
                why[PR.no_estimate(r)] = why.get(PR.no_estimate(r), 0) + int((~ok).sum())
            sel, by[sel[ok]] = sel[ok], decided.predictor
            fit = decided.fit.classical_alone() if decided.predictor == "classical" else decided.fit
            scored = rtt[sel] >= 0
            _pool_reads(cols, rtt, sel[scored], e[ok][scored], fit)
        why[decided.why] = why.get(decided.why, 0) + len(sel)
    return {"answered_by": by.tolist(), "regime": regime.tolist(), "why": {k: v for k, v in why.items() if v}}


def _regimes(predictor: PR.Predictor, src: np.ndarray, dst: np.ndarray, pair_packets: np.ndarray) -> np.ndarray:
    hints = predictor.hints
    if hints is None:
        return np.where(pair_packets > 0, "time", None).astype(object)
    placed = hints.trained[hints.folds]

    def known(addr: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(addr.astype(str), return_inverse=True)
        codes = np.array([hints.key_code(a) for a in uniq], np.int64)
        return ((codes >= 0) & placed[np.maximum(codes, 0)])[inv]

    return np.array([CB.regime_of(int(p), bool(a), bool(b))
                     for p, a, b in zip(pair_packets, known(src), known(dst))], object)


def _estimate(predictor, regime, pair_rtt, src, dst, rows, ctx) -> float:
    context = None
    if regime != "time" and len(ctx):
        context = Measurements.from_fields([str(s) for s in rows["src"][ctx]], [str(d) for d in rows["dst"][ctx]],
                                           np.asarray(rows["rtt"])[ctx], None)
    est = PR.classical_estimate(regime, pair_rtt, predictor.hints, str(src), str(dst), context)
    return np.nan if est is None else est


def _pool_reads(cols: dict, rtt: np.ndarray, idx: np.ndarray, est: np.ndarray, fit: CB.RegimeFit) -> None:
    """The pooled (and mapped: `RegimeFit.recal`) PIT, tail probability and NLL of the
    successful rows `idx`, from the model's: G's mass below the observed code's value and up to
    it, on the sorted code grid as `pool`; the map moves both CDF levels and the code's mass is
    their difference."""
    w = float(fit.weight)
    if not len(idx) or (w >= 1.0 and fit.recal is None):
        return
    _, values, _, _ = Q.code_table()
    x = decode_rtt(token_codes(np.maximum(rtt[idx], 0.0)).astype(np.uint16)).astype(np.float64)
    j = np.searchsorted(values, x, side="left")  # the first code of x's value on the grid
    prev = values[np.maximum(j - 1, 0)]
    g_below = np.where(j > 0, CB.lognormal_cdf(prev, est, fit.log_sigma), 0.0)
    g_upto = np.where(j >= len(values) - 1, 1.0, CB.lognormal_cdf(x, est, fit.log_sigma))
    pf, pit_m, nll_m = cols["p_fail"][idx], cols["pit"][idx], cols["nll"][idx]
    lf = -np.log(np.maximum(1.0 - pf, _TINY))
    at_m = np.exp(-(nll_m - lf))  # the observed code's mass under the model, from its NLL
    upto = fit.recalibrated(np.minimum(w * pit_m + (1.0 - w) * g_upto, 1.0))
    below = fit.recalibrated(np.clip(w * (pit_m - at_m) + (1.0 - w) * g_below, 0.0, 1.0))
    cols["pit"][idx] = upto
    cols["tail_p"][idx] = np.minimum(1.0, 2.0 * np.minimum(upto, 1.0 - below))
    cols["nll"][idx] = lf - np.log(np.maximum(upto - below, _TINY))


def answer_rows(cols: dict, rows: dict, predictor: PR.Predictor, policy: str, context: int, per_pair: int) -> dict:
    """Which predictor answers each scored row (`answer_scores`, its scores read from that
    answer in place), its prompt's context picked as the scores' own were: by `policy`, or the
    `stream` window's rows before it (a probe's own past, matched against `probe` fits)."""
    n = len(rows["rtt"])
    if predictor.asked == "model" or predictor.combination is None:
        return {"answered_by": ["model"] * n, "regime": [None] * n,
                "why": {PR.MODEL.why if predictor.asked == "model" else predictor.unused: n}}
    if Policy(policy) is Policy.STREAM:
        contexts = stream_contexts(rows, cols["context_measurements"])
        return answer_scores(cols, rows, contexts, predictor, {"context_policy": Policy.PROBE.value, "hint": None})
    contexts = context_indices(context_pool(rows, None, policy), rows, np.arange(n), context, policy, per_pair)
    prompt = {"context_policy": str(policy), "context_measurements": context, "context_per_pair": per_pair,
              "hint": None}
    return answer_scores(cols, rows, contexts, predictor, prompt, 0)
