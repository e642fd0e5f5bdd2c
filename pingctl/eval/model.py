"""The model's side of `pingctl eval`: per-packet predictive distributions and NLL.

For each evaluated test packet the prompt is some of the probe's preceding measurements
(the *context*, chosen by a policy below, at most `context` of them, every one timestamped,
as the loader's *full* mode), then the packet's timestamp, source and destination. A run
trained without timestamps (`loader.mode_weights` all on *none*) gets prompts without any. The
exact RTT-code distribution after that prompt gives the median, the central-interval
quantiles, the PIT value of the actual RTT and the failure probability. Teacher-forced
scoring of prompt + actual result gives NLL per token and bits per measurement.

Context policies:
- `probe`: the probe's preceding measurements in the test split, any destination — as in
  training. On a pair split these are mostly earlier packets of the very pair asked about,
  so `context_median` (the median of those same-pair packets in the prompt) is reported
  beside the model: it is the classical history median with exactly the model's information.
- `cold`: the probe's preceding measurements from the train and test splits *excluding the
  queried (src, dst) pair* — the model must predict a pair it has never seen, from its
  addresses and the probe's RTTs to other destinations.
- `none`: no context; the prompt is the packet alone.
- `both`: a triangulation context, as the loader builds them (`loader.triangulation_share`):
  the probe's last `context` measurements to destinations other than the queried one and
  the queried destination's last `context_dst` measurements from sources other than the
  queried one, all before the packet, merged in time order, drawn from the train split (the
  table the baselines are fitted on, so the model holds no evidence they lack). The pair
  itself is never in it, so it answers held-out pairs, probes and destinations alike.

`per_pair` caps the prompt at the most recent `per_pair` measurements of each (src, dst)
pair (0 = no cap), as `loader.max_per_pair` shapes training contexts (for `both`:
`loader.triangulation_per_pair`); `pingctl eval` takes the run's own setting unless told
otherwise.
"""

from __future__ import annotations

import numpy as np

from pingctl.artifacts.table import take
from pingctl.context import pool_and_contexts
from pingctl.histories import History
from pingctl.eval import metrics as M
from pingctl.infer import hints as H
from pingctl.infer import queries as Q
from pingctl.infer.score import prompts, teacher_forced, teacher_forced_kept  # noqa: F401 - one prompt builder for eval and score
from pingctl.tokenizer.spec import get_spec

QS = (0.05, 0.25, 0.75, 0.95)


def context_median(pool: dict, test: dict, idx: np.ndarray, contexts: list[np.ndarray]) -> dict:
    """The history-median baseline with the model's information: per packet, the median of
    the successful RTTs of the same (src, dst) pair among its context measurements and their
    failure share as P(failure); NaN where the context has none (`used` is False there)."""
    psrc, pdst = np.asarray(pool["src"]), np.asarray(pool["dst"])
    prtt = np.asarray(pool["rtt"], np.float64)
    median = np.full(len(idx), np.nan)
    p_fail = np.full(len(idx), np.nan)
    used = np.zeros(len(idx), bool)
    for k, (i, prev) in enumerate(zip(idx, contexts)):
        same = prev[(psrc[prev] == test["src"][i]) & (pdst[prev] == test["dst"][i])]
        if len(same) == 0:
            continue
        r = prtt[same]
        p_fail[k] = float((r < 0).mean())
        if (r >= 0).any():
            median[k] = float(np.median(r[r >= 0]))
            used[k] = True
    return {"median": median, "p_fail": p_fail, "used": used}


def predict(model, test: dict, idx: np.ndarray, context: int = 16, eps: float = 1e-3, *,
            train: dict | History | None = None, policy: str = "probe", per_pair: int = 0, chunk: int = 64,
            calibration=None, context_dst: int | None = None, hints=None,
            progress=lambda done, total: None) -> dict:
    """Median, quantiles, PIT, P(failure) and the context-median baseline for the packets
    `idx` of `test`; `progress(done, total)` after every `chunk` packets. With a
    `calibration` (pingctl/infer/calibration.py) also the same read from the recalibrated
    distributions, under "calibrated" (no extra model passes: only more refined reads).
    `context_dst`: the destination side of the `both` policy (None: `context`). `train`: the
    split contexts are also drawn from, or its `History` (built once for several calls). The
    prompts' context measurements are returned under "contexts" (indices into "pool": for the
    `both` and `pair` policies only the rows some prompt holds, `context.pool_and_contexts`). `hints(pool,
    queries, contexts)`: each packet's RTT estimate (NaN: none), given in its prompt as a hint
    measurement (a run trained with `loader.hints_file`); returned under "hints"."""
    levels = (0.5, *QS)
    reads = levels if calibration is None else (*levels, *calibration.raw_level(np.array(levels)))
    pool, contexts = pool_and_contexts(test, idx, context, policy, per_pair, context_dst, train)
    est = None if hints is None else np.asarray(hints(pool, take(test, idx), contexts), np.float64)
    # a run trained with loader.relative_target answers a hinted prompt relative to its hint
    scales = None if est is None else H.scales(model.run, est)
    ps, fulls = prompts(model, test, idx, pool, contexts, est, scales)
    actual = np.asarray(test["rtt"], np.float64)[idx]
    dists: list = [None] * len(ps)
    scores: list[np.ndarray] = [np.zeros(0)] * len(ps)
    progress(0, len(idx))
    # chunks of similar lengths: a pass pads its sequences to the longest (triangulation
    # prompts run from ~200 to ~480 tokens), and each packet's answer is its own
    by_length = np.argsort([len(f) for f in fulls], kind="stable")
    for a in range(0, len(ps), chunk):
        ks = by_length[a : a + chunk]
        cp, cf = [ps[k] for k in ks], [fulls[k] for k in ks]
        # the light engine keeps this pass's caches for the second-byte reads below
        first, known, sc, second = teacher_forced_kept(model, cp, cf)
        # exact where read: at the quantiles below and at the actual RTT (for the PIT)
        got = Q.rtt_distributions_at(model, cp, quantiles=reads, points=actual[ks], eps=eps, first=first,
                                     known=known, second_bytes=second, scales=None if scales is None else scales[ks])
        for k, s, d in zip(ks, sc, got):
            scores[k], dists[k] = s, d
        progress(min(a + chunk, len(ps)), len(idx))
    nll = nll_from_scores(fulls, scores, np.asarray(test["ip_version"])[idx])
    n_ctx = np.array([len(c) for c in contexts])
    out = {**_reads(dists, actual), "nll": nll, "context_median": context_median(pool, test, idx, contexts),
           "context_sizes": {"mean": float(n_ctx.mean()) if len(n_ctx) else 0.0,
                             "empty_share": float((n_ctx == 0).mean()) if len(n_ctx) else 0.0},
           "contexts": contexts, "pool": pool, "prompts": ps, "hints": est,
           # the distributions themselves, for the combined answer (eval.combine); callers drop them
           "dists": dists,
           "context_examples": context_examples(pool, test, idx, contexts)}
    if calibration is not None:
        out["calibrated"] = _reads([calibration.apply(d) for d in dists], actual)
    return out


def context_examples(pool: dict, test: dict, idx: np.ndarray, contexts: list[np.ndarray], n: int = 3) -> list[dict]:
    """The first `n` prompts in words, for the report: the query packet and its context
    measurements (src, dst, time, rtt ms) in prompt order."""
    def row(d: dict, i) -> dict:
        return {"src": str(d["src"][i]), "dst": str(d["dst"][i]), "time": int(d["event_time"][i]),
                "rtt": float(d["rtt"][i])}

    return [{"query": row(test, i), "context": [row(pool, j) for j in c]} for i, c in zip(idx[:n], contexts[:n])]


def _reads(dists: list, actual: np.ndarray) -> dict:
    """What the report takes from each packet's distribution: median, the QS quantiles, the
    PIT of the actual RTT (NaN for a failed packet), P(failure) and the CRPS (ms) of the actual
    RTT under the RTT distribution (NaN for a failed packet)."""
    values = dists[0].values_ms if dists else np.zeros(0)
    same = all(d.values_ms is values or np.array_equal(d.values_ms, values) for d in dists)
    crps = (M.crps_distribution(actual, values, [d.probs for d in dists]) if same else
            np.array([M.crps_distribution([a], d.values_ms, [d.probs])[0] for d, a in zip(dists, actual)]))
    return {"median": np.array([d.quantile(0.5) for d in dists]),
            "quantiles": np.array([[d.quantile(q) for q in QS] for d in dists]).reshape(len(dists), len(QS)),
            "pit": np.array([d.cdf(a) if a >= 0 else np.nan for d, a in zip(dists, actual)]),
            "p_fail": np.array([d.p_fail for d in dists]),
            "crps": crps.reshape(len(dists))}


FIELDS = ("time", "src", "dst", "result")  # the query's block order; the names are compact.BLOCKS


def field_bits(f: np.ndarray, s: np.ndarray, start: int) -> dict[str, float]:
    """Bits spent on each block of the measurement starting at `start` of tokens `f`
    (s[t - 1] scores token t). A field that is already known costs ~0 bits: e.g. `src`
    when the model copies the probe's address from its context."""
    spec = get_spec("compact")  # the block tables the decoder and the grammar use
    out = dict.fromkeys(FIELDS, 0.0)
    t = start + 1
    while t < len(f):
        n = 1 + int(spec.role_payload[f[t]])
        out[spec.blocks[spec.role_block[f[t]]]] += float(-s[t - 1 : t - 1 + n].sum() / np.log(2))
        t += n
    return out


def nll_from_scores(fulls: list[np.ndarray], scores: list[np.ndarray], ipv: np.ndarray) -> dict:
    """NLL per token over whole sequences and bits for the query measurement itself (also
    per field), from teacher-forced scores (log P(token t | tokens < t), t >= 1)."""
    tok_nats = np.concatenate(scores)
    # the query measurement starts at its MeasurementStart (the last one in the sequence)
    meas_bits, by_field = [], []
    for f, s in zip(fulls, scores):
        start = int(np.flatnonzero(f == 0)[-1])
        meas_bits.append(-s[start:].sum() / np.log(2))  # predictions of tokens start+1 ..
        by_field.append(field_bits(f, s, start))
    meas_bits = np.array(meas_bits)
    out = {
        "nats_per_token": float(-tok_nats.mean()),
        "bits_per_token": float(-tok_nats.mean() / np.log(2)),
        "bits_per_measurement": float(meas_bits.mean()),
        "tokens": int(len(tok_nats)),
        "measurements": int(len(meas_bits)),
        "bits_per_field": {k: float(np.mean([b[k] for b in by_field])) for k in FIELDS} if by_field else {},
    }
    for fam in (4, 6):
        m = ipv == fam
        if m.any():
            out[f"bits_per_measurement_v{fam}"] = float(meas_bits[m].mean())
    return out
